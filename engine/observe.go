package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/metrics"
	"github.com/toolbatch/toolbatch/protocol"
	"github.com/toolbatch/toolbatch/tracing"
)

// What the engine shows outside (package metrics): the gauges read when
// scraped, and its readiness.

// inboxPending is the inbox messages the engines have not taken or not
// acknowledged (the intake consumer's pending and unacknowledged).
func (e *Engine) inboxPending() float64 {
	c := e.intake.Load()
	if c == nil {
		return 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	info, err := (*c).Info(ctx)
	if err != nil {
		return 0
	}
	return float64(info.NumPending) + float64(info.NumAckPending)
}

// Readiness reports what keeps the engine from serving: not yet started,
// not connected to NATS, a stream missing, its intake consumer not bound.
// Nil means ready.
func (e *Engine) Readiness(ctx context.Context) error {
	select {
	case <-e.ready:
	default:
		return errors.New("starting: not consuming its inbox yet")
	}
	if st := e.nc.Status(); st != nats.CONNECTED {
		return fmt.Errorf("NATS connection %s", strings.ToLower(st.String()))
	}
	var missing []string
	for _, s := range []string{e.names.EventsStream(), e.names.InboxStream(), e.names.OutStream(), e.names.DispatchStream(), e.names.TimersStream()} {
		if _, err := e.js.Stream(ctx, s); err != nil {
			missing = append(missing, fmt.Sprintf("stream %s: %v", s, err))
		}
	}
	if _, err := e.js.Consumer(ctx, e.names.InboxStream(), protocol.ConsumerEngine); err != nil {
		missing = append(missing, fmt.Sprintf("intake consumer %s: %v", protocol.ConsumerEngine, err))
	}
	if len(missing) > 0 {
		return errors.New(strings.Join(missing, "; "))
	}
	return nil
}

// observer hands what the engine commits, and what a load reads back, to
// the metrics and the spans (packages metrics and tracing) off the
// commit's path: a commit queues its events, and a goroutine of the
// observer's own folds what is queued observeDelay after the first of
// it, all at once. A scrape and the engine's stop fold what is queued
// first (settle), so that what they show is up to the last commit. A nil
// *observer (neither metrics nor traces) queues nothing.
type observer struct {
	metrics *metrics.Engine
	tracer  *tracing.Engine

	mu    sync.Mutex
	queue []observation
	kick  chan struct{}

	fold  sync.Mutex    // one fold at a time, in the queue's order
	spare []observation // the fold's, under fold
}

// observeDelay is how long a commit's events may wait to be folded into
// the metrics and spans (a scrape does not wait for it): the commits of
// that time are folded together, and the engine's goroutine is woken
// once for them, not once per commit.
const observeDelay = 10 * time.Millisecond

// observation is a commit's events, appended (loaded false) or read back
// by a load, or a call of a recovered run dispatched again (evs nil).
type observation struct {
	runID       string
	traceparent string // the commit's header
	evs         []events.Event
	loaded      bool
	redispatch  string // the call dispatched again
}

func newObserver(m *metrics.Engine, t *tracing.Engine) *observer {
	if m == nil && t == nil {
		return nil
	}
	return &observer{metrics: m, tracer: t, kick: make(chan struct{}, 1)}
}

func (o *observer) committed(runID, traceparent string, evs []events.Event) {
	o.add(observation{runID: runID, traceparent: traceparent, evs: evs})
}

// loaded and redispatched feed the spans alone.
func (o *observer) loaded(runID, traceparent string, evs []events.Event) {
	if o != nil && o.tracer != nil {
		o.add(observation{runID: runID, traceparent: traceparent, evs: evs, loaded: true})
	}
}

func (o *observer) redispatched(runID, callID string) {
	if o != nil && o.tracer != nil {
		o.add(observation{runID: runID, redispatch: callID})
	}
}

func (o *observer) add(ob observation) {
	if o == nil {
		return
	}
	o.mu.Lock()
	first := len(o.queue) == 0
	o.queue = append(o.queue, ob)
	o.mu.Unlock()
	if first {
		select {
		case o.kick <- struct{}{}:
		default:
		}
	}
}

// run folds what is queued observeDelay after it is kicked, until ctx
// ends.
func (o *observer) run(ctx context.Context) {
	if o == nil {
		return
	}
	wait := time.NewTimer(observeDelay)
	defer wait.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-o.kick:
		}
		wait.Reset(observeDelay)
		select {
		case <-ctx.Done():
			return
		case <-wait.C:
		}
		o.settle()
	}
}

// settle folds what is queued now.
func (o *observer) settle() {
	if o == nil {
		return
	}
	o.fold.Lock()
	defer o.fold.Unlock()
	o.mu.Lock()
	q := o.queue
	o.queue, o.spare = o.spare[:0], nil
	o.mu.Unlock()
	for _, ob := range q {
		switch {
		case ob.redispatch != "":
			o.tracer.Redispatched(ob.runID, ob.redispatch)
		case ob.loaded:
			o.tracer.Loaded(ob.runID, ob.traceparent, ob.evs)
		default:
			o.metrics.Committed(ob.runID, ob.evs)
			o.tracer.Committed(ob.runID, ob.traceparent, ob.evs)
		}
	}
	clear(q)
	o.spare = q
}

// Settle folds the commits not yet folded into the metrics and spans:
// what a scrape of the engine's metrics calls first, so that it shows
// everything committed before it.
func (e *Engine) Settle() { e.events.observer.settle() }
