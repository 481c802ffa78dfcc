package chaos

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand"
	"strings"
	"sync"
	"time"

	"github.com/toolbatch/toolbatch/client"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/protocol"
)

// Timing of the clients.
const (
	// retryWait is how long a client waits before it tries a command again
	// after NATS did not acknowledge it.
	retryWait = 200 * time.Millisecond
	// publishTimeout bounds one attempt to publish a command.
	publishTimeout = 3 * time.Second
	// idleWatch is how long a watch may stay silent before it is started
	// again (a watch cut by an outage may stay silent rather than fail).
	idleWatch = 5 * time.Second
)

// batchSpec is one batch of the workload.
type batchSpec struct {
	submit *protocol.Submit
}

// runSpec is one run of the workload: batches submitted one after another.
type runSpec struct {
	id      string
	batches []batchSpec
}

// toolWeights is how often each tool is picked for a call.
var toolWeights = []struct {
	tool   string
	weight int
}{
	{toolEcho, 2}, {toolSleep, 3}, {toolSleepNR, 3}, {toolConfirm, 2}, {toolAsk, 2},
	{toolSBNever, 4}, {toolSBReplay, 4}, {toolSBIdem, 4}, {toolLater, 2},
}

func pickTool(r *rand.Rand) string {
	total := 0
	for _, w := range toolWeights {
		total += w.weight
	}
	n := r.Intn(total)
	for _, w := range toolWeights {
		if n < w.weight {
			return w.tool
		}
		n -= w.weight
	}
	panic("unreachable")
}

// arguments returns a call's arguments: brain sleeps take a Go duration,
// sandbox tools a number of seconds to sleep after recording their entry.
func arguments(r *rand.Rand, tool string, i int) string {
	ms := 100 + r.Intn(1100)
	switch tool {
	case toolSleep, toolSleepNR:
		return fmt.Sprintf(`{"duration":"%dms","i":%d}`, ms, i)
	case toolSBNever, toolSBReplay, toolSBIdem, toolLater:
		return fmt.Sprintf(`{"i":%d,"sleep":"%d.%03d"}`, i, ms/1000, ms%1000)
	default:
		return fmt.Sprintf(`{"i":%d,"text":"call %d"}`, i, i)
	}
}

// workload returns the runs of a schedule, drawn from its seed. Each run has
// its own source, so that what a run submits does not depend on how the
// goroutines interleave.
func workload(seed int64, p Profile) []runSpec {
	runs := make([]runSpec, p.Runs)
	for i := range runs {
		r := rand.New(rand.NewSource(seed*1009 + int64(i)))
		id := fmt.Sprintf("run-%d", i+1)
		n := max(p.MinBatches, 1)
		if p.MaxBatches > n {
			n += r.Intn(p.MaxBatches - n + 1)
		}
		step := int64(0)
		for b := 0; b < n; b++ {
			step += 1 + int64(r.Intn(2)) // steps may skip
			s := &protocol.Submit{RunID: id, ThreadID: "thread-" + id, Step: step,
				Assistant: events.Message{ID: fmt.Sprintf("msg-%d", step)}}
			s.Assistant.Content = append(s.Assistant.Content, events.TextBlock(fmt.Sprintf("batch %d of %s", step, id)))
			calls := 1 + r.Intn(p.MaxCalls)
			for c := 1; c <= calls; c++ {
				tool := pickTool(r)
				s.Assistant.Content = append(s.Assistant.Content, events.ContentBlock{Type: events.BlockToolUse,
					ID: fmt.Sprintf("c%d", c), Name: tool, Input: events.MustJSON(arguments(r, tool, c))})
			}
			runs[i].batches = append(runs[i].batches, batchSpec{submit: s})
		}
		runs[i].id = id
	}
	return runs
}

// clientAnswer is what the client answers for a client-executed call.
func clientAnswer(batchID, callID string) string {
	return "client result for " + batchID + "/" + callID
}

// answerDelay is how long the client waits before answering a ticket: drawn
// from the seed and the call, not from a shared source, so that it does not
// depend on goroutine order.
func answerDelay(seed int64, batchID, callID string) time.Duration {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%s/%s", seed, batchID, callID)
	return time.Duration(h.Sum64()%400) * time.Millisecond
}

// runner drives one run: submit a batch, answer its tickets, wait for its
// results, then the next batch.
type runner struct {
	c       *client.Client
	seed    int64
	spec    runSpec
	timeout time.Duration // per batch
	// enough, when not nil, ends the run early: once it is closed the run
	// submits no batch after its first atLeast (a cluster schedule's runs
	// go on until its faults are done).
	enough   <-chan struct{}
	atLeast  int
	answered map[string]bool
	watch    *client.Watch

	// trail records the watch's life (starts, errors, messages), for the
	// report of a batch that never got its results.
	trail []string

	mu       sync.Mutex
	failures []string
	results  map[string]*protocol.ResultsOut // by batch id
	pending  string                          // the batch acknowledged and awaited
	resumes  int
}

// awaiting reports whether the run waits for a batch's results: NATS
// acknowledged the batch, and its results have not come.
func (r *runner) awaiting() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, done := r.results[r.pending]
	return r.pending != "" && !done
}

// note adds a line to the trail.
func (r *runner) note(format string, args ...any) {
	r.trail = append(r.trail, time.Now().Format("15:04:05.000")+" "+fmt.Sprintf(format, args...))
	if len(r.trail) > 200 {
		r.trail = r.trail[100:]
	}
}

func (r *runner) fail(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failures = append(r.failures, r.spec.id+": "+fmt.Sprintf(format, args...))
}

// run drives every batch of the run, and stops at the first that fails,
// or once enough is closed and atLeast batches are done.
func (r *runner) run(ctx context.Context) {
	defer func() {
		if r.watch != nil {
			r.watch.Stop()
		}
	}()
	for i, b := range r.spec.batches {
		if i >= r.atLeast && closed(r.enough) {
			return
		}
		if !r.submit(ctx, b.submit) {
			return
		}
		r.mu.Lock()
		r.pending = b.submit.BatchID()
		r.mu.Unlock()
		res, err := r.await(ctx, b)
		if err != nil {
			r.fail("batch %s: %v", b.submit.BatchID(), err)
			return
		}
		r.mu.Lock()
		r.results[b.submit.BatchID()] = res
		r.mu.Unlock()
		if !r.checkResults(b, res) {
			return
		}
	}
}

// submit publishes the batch until NATS acknowledges it (a retry carries the
// same Nats-Msg-Id; the engine also ignores an identical resubmission).
func (r *runner) submit(ctx context.Context, s *protocol.Submit) bool {
	for {
		pctx, cancel := context.WithTimeout(ctx, publishTimeout)
		err := r.c.Submit(pctx, s)
		cancel()
		if err == nil {
			return true
		}
		var ref *events.Refusal
		if errors.As(err, &ref) {
			r.fail("batch %s refused before publishing: %v", s.BatchID(), err)
			return false
		}
		if !sleepCtx(ctx, retryWait) {
			r.fail("batch %s: never acknowledged: %v", s.BatchID(), err)
			return false
		}
	}
}

// await watches the run until the batch's results, answering the batch's
// tickets on the way: approve confirmations, send the client's result. A
// scheduled action is left to the engine's timer. The watch is started
// again whenever it fails or stays silent.
func (r *runner) await(ctx context.Context, b batchSpec) (*protocol.ResultsOut, error) {
	batchID := b.submit.BatchID()
	dctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	var lastErr error
	for {
		if dctx.Err() != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("no results within %s (last watch error: %v); the watch's last moves:\n        %s",
				r.timeout, lastErr, strings.Join(r.trail[max(0, len(r.trail)-30):], "\n        "))
		}
		if r.watch == nil {
			// A bounded start: a consumer request lost with a killed
			// nats-server is never answered, and would hold the watch
			// until the batch's deadline.
			wctx, wcancel := context.WithTimeout(dctx, publishTimeout)
			w, err := r.c.Watch(wctx, r.spec.id)
			wcancel()
			if err != nil {
				lastErr = err
				r.note("watch failed to start: %v", err)
				sleepCtx(dctx, retryWait)
				continue
			}
			r.note("watch started")
			r.watch = w
		}
		nctx, ncancel := context.WithTimeout(dctx, idleWatch)
		m, err := r.watch.Next(nctx)
		ncancel()
		if err != nil {
			var de *client.DecodeError
			if errors.As(err, &de) {
				return nil, err
			}
			r.note("watch next: %v", err)
			lastErr = err
			r.watch.Stop()
			r.watch = nil
			continue
		}
		r.note("out seq %d %s (pending %d)", m.Seq, m.Kind, m.Pending)
		switch {
		case m.Results != nil && m.Results.BatchID == batchID:
			return m.Results, nil
		case m.Rejected != nil && m.Rejected.BatchID == batchID:
			return nil, fmt.Errorf("rejected: %s: %s", m.Rejected.Code, m.Rejected.Reason)
		case m.Ended != nil:
			return nil, fmt.Errorf("run ended: %s: %s", m.Ended.Cause, m.Ended.Reason)
		case m.Awaiting != nil && m.Awaiting.BatchID == batchID && !r.answered[m.Awaiting.CorrelationID]:
			if err := r.answer(dctx, *m.Awaiting); err != nil {
				return nil, err
			}
		}
	}
}

// answer resolves a ticket as a user would, after a short pause, and
// retries the resume until NATS acknowledges it.
func (r *runner) answer(ctx context.Context, t protocol.AwaitingOut) error {
	var send func(context.Context) error
	switch t.Reason {
	case events.WaitPermission:
		send = func(ctx context.Context) error { return r.c.Approve(ctx, t, "chaos", "approved by the chaos driver") }
	case events.WaitExternalResult:
		out := events.TextOutput(t.CallID, clientAnswer(t.BatchID, t.CallID))
		send = func(ctx context.Context) error { return r.c.ToolResult(ctx, t, out) }
	default:
		r.answered[t.CorrelationID] = true // scheduled: the engine performs it when due
		return nil
	}
	if !sleepCtx(ctx, answerDelay(r.seed, t.BatchID, t.CallID)) {
		return ctx.Err()
	}
	for {
		pctx, cancel := context.WithTimeout(ctx, publishTimeout)
		err := send(pctx)
		cancel()
		if err == nil {
			r.answered[t.CorrelationID] = true
			r.mu.Lock()
			r.resumes++
			r.mu.Unlock()
			return nil
		}
		var ref *events.Refusal
		if errors.As(err, &ref) {
			return fmt.Errorf("resume of ticket %s refused before publishing: %w", t.CorrelationID, err)
		}
		if !sleepCtx(ctx, retryWait) {
			return fmt.Errorf("resume of ticket %s never acknowledged: %w", t.CorrelationID, err)
		}
	}
}

// checkResults checks one results message as the client sees it: one
// tool_result per tool_use, in model order; the client's result verbatim;
// nothing blocked (the driver approves every confirmation).
func (r *runner) checkResults(b batchSpec, res *protocol.ResultsOut) bool {
	calls := b.submit.Calls()
	batchID := b.submit.BatchID()
	if len(res.Results) != len(calls) {
		r.fail("batch %s: %d results for %d tool_use blocks", batchID, len(res.Results), len(calls))
		return false
	}
	ok := true
	for i, blk := range res.Results {
		call := calls[i]
		text := events.DescribeOutput(events.Output{Content: blk.Content, IsError: blk.IsError})
		switch {
		case blk.Type != events.BlockToolResult || blk.ToolUseID != call.CallID:
			r.fail("batch %s: result %d is %s for %q, want the tool_result of %q", batchID, i, blk.Type, blk.ToolUseID, call.CallID)
			ok = false
		case strings.Contains(text, "blocked:"):
			r.fail("batch %s call %s (%s): blocked although nothing denies it: %s", batchID, call.CallID, call.ToolID, text)
			ok = false
		case call.ToolID == toolAsk:
			want := clientAnswer(batchID, call.CallID)
			if blk.IsError || len(blk.Content) != 1 || blk.Content[0].Text != want {
				r.fail("batch %s call %s: the client's result is %s, want %q", batchID, call.CallID, text, want)
				ok = false
			}
		}
	}
	return ok
}

// closed reports whether ch is closed (false for nil).
func closed(ch <-chan struct{}) bool {
	if ch == nil {
		return false
	}
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
