package engine

import (
	"sync"

	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/metrics"
	"github.com/toolbatch/toolbatch/tracing"
)

// observer gives the metrics and the tracer what each commit says, on a
// goroutine of its own, off the commit's path: their work is then no part
// of a batch's latency while the engine has a core to spare (a batch
// alone on an engine, W1 in docs/performance.md, "Interleaved rounds").
// It keeps the order of what it is given, and what needs their result
// waits for it: an attempt's traceparent (a dispatch, a grant) and a
// scrape (Sync). Without metrics and traces there is no observer (nil),
// and nothing to do.
type observer struct {
	metrics *metrics.Engine
	tracer  *tracing.Engine

	mu       sync.Mutex
	changed  *sync.Cond // something queued, something done, or closed
	queue    []func()
	queued   uint64 // given so far
	done     uint64 // done so far
	running  bool   // the goroutine runs: otherwise add does it at once
	draining bool   // somebody does what was queued (drainLocked)
}

func newObserver(m *metrics.Engine, t *tracing.Engine) *observer {
	if m == nil && t == nil {
		return nil
	}
	o := &observer{metrics: m, tracer: t}
	o.changed = sync.NewCond(&o.mu)
	return o
}

// start runs the goroutine until stop.
func (o *observer) start() {
	if o == nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.running {
		return
	}
	o.running = true
	go o.run()
}

// stop does what is queued and ends the goroutine; what is added later
// is done at once.
func (o *observer) stop() {
	if o == nil {
		return
	}
	o.mu.Lock()
	o.running = false
	o.changed.Broadcast()
	for o.done < o.queued {
		o.changed.Wait()
	}
	o.mu.Unlock()
}

func (o *observer) run() {
	o.mu.Lock()
	defer o.mu.Unlock()
	for {
		for len(o.queue) == 0 && o.running {
			o.changed.Wait()
		}
		if len(o.queue) == 0 {
			return // stopped, nothing left
		}
		o.drainLocked()
	}
}

// drainLocked does what is queued, with o.mu held (and released while it
// works): one drainer at a time, so that the order holds.
func (o *observer) drainLocked() {
	for o.draining {
		o.changed.Wait()
	}
	if len(o.queue) == 0 {
		return
	}
	q := o.queue
	o.queue, o.draining = nil, true
	o.mu.Unlock()
	for _, f := range q {
		f()
	}
	o.mu.Lock()
	o.draining = false
	o.done += uint64(len(q))
	o.changed.Broadcast()
}

// maxObserving bounds what waits to be observed: an engine whose
// observer falls that far behind has its commits wait for it rather than
// queue without bound.
const maxObserving = 4096

// add queues f, or does it at once when the goroutine does not run.
func (o *observer) add(f func()) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for o.running && len(o.queue) >= maxObserving {
		o.changed.Wait() // behind by that much: the commits wait for it
	}
	if !o.running {
		// In order: after whatever is still queued.
		for o.done < o.queued {
			o.changed.Wait()
		}
		f()
		return
	}
	o.queue = append(o.queue, f)
	o.queued++
	o.changed.Broadcast()
}

// Sync returns once everything given before it is done. It does what is
// still queued itself rather than wait for the goroutine to wake: a
// dispatch waiting for its attempt's traceparent is on a batch's path.
func (o *observer) Sync() {
	if o == nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for target := o.queued; o.done < target; {
		if len(o.queue) > 0 && !o.draining {
			o.drainLocked()
			continue
		}
		o.changed.Wait()
	}
}

// committed observes a commit this engine appended.
func (o *observer) committed(runID, traceparent string, evs []events.Event) {
	if o == nil {
		return
	}
	o.add(func() {
		o.metrics.Committed(runID, evs)
		o.tracer.Committed(runID, traceparent, evs)
	})
}

// loaded observes a commit read back from the log.
func (o *observer) loaded(runID, traceparent string, evs []events.Event) {
	if o == nil || o.tracer == nil {
		return
	}
	o.add(func() { o.tracer.Loaded(runID, traceparent, evs) })
}

// redispatched observes a call's attempt dispatched again by a recovery.
func (o *observer) redispatched(runID, callID string) {
	if o == nil || o.tracer == nil {
		return
	}
	o.add(func() { o.tracer.Redispatched(runID, callID) })
}

// attempt is the traceparent of a call's attempt span, once what was
// committed before is observed ("" without traces).
func (o *observer) attempt(runID, callID string, attempt int) string {
	if o == nil || o.tracer == nil {
		return ""
	}
	o.Sync()
	return o.tracer.Attempt(runID, callID, attempt)
}
