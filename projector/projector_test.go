package projector_test

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/toolbatch/toolbatch/aggregate"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/projector"
	"github.com/toolbatch/toolbatch/protocol"
)

const (
	runID    = "run-1"
	threadID = "thread-1"
)

var t0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

// Descriptors of the catalog used by the tests.
var (
	brainTool = events.Descriptor{Target: events.TargetBrain, Kind: events.KindTool,
		Policy: events.Policy{Mode: events.ModeReplaySafe, MaxAttempts: 3}}
	clientTool = events.Descriptor{Target: events.TargetBrain, Kind: events.KindClient,
		Policy: events.Policy{Mode: events.ModeReplaySafe, MaxAttempts: 3}}
	delegationTool = events.Descriptor{Target: events.TargetBrain, Kind: events.KindDelegation,
		Policy: events.Policy{Mode: events.ModeDurableRequest, MaxAttempts: 3}}
)

// harness drives one run: the engine's aggregate (run) decides and folds,
// and the projector folds the same events into its own model.
type harness struct {
	t     *testing.T
	run   *aggregate.Run
	model projector.Model
	now   time.Time
	evs   []events.Event     // every event, in log order
	outs  []projector.Output // every output, in publication order
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	return &harness{t: t, run: aggregate.New(runID), model: projector.NewModel(runID), now: t0}
}

func (h *harness) tick() time.Time {
	h.now = h.now.Add(time.Second)
	return h.now
}

// do decides cmd, folds its events into the run, projects them one by one
// and returns the outputs they caused.
func (h *harness) do(cmd aggregate.Command) []projector.Output {
	h.t.Helper()
	_, evs, err := aggregate.Decide(h.run, cmd)
	if err != nil {
		h.t.Fatalf("decide %T: %v", cmd, err)
	}
	return h.commit(evs)
}

// commit folds and projects events that were decided elsewhere.
func (h *harness) commit(evs []events.Event) []projector.Output {
	h.t.Helper()
	if err := h.run.ApplyAll(evs); err != nil {
		h.t.Fatalf("apply: %v", err)
	}
	var out []projector.Output
	for _, e := range evs {
		m, o, err := projector.Project(h.model, e)
		if err != nil {
			h.t.Fatalf("project %s: %v", e.EventType(), err)
		}
		if len(o) > 0 && projector.Quiet(e) {
			h.t.Fatalf("%s derived %d outputs, and Quiet says it derives none", e.EventType(), len(o))
		}
		h.model = m
		out = append(out, o...)
	}
	h.evs = append(h.evs, evs...)
	h.outs = append(h.outs, out...)
	if h.model.Applied != len(h.evs) {
		h.t.Fatalf("model applied %d events, log has %d", h.model.Applied, len(h.evs))
	}
	if h.model.Run.Version != h.run.Version {
		h.t.Fatalf("projector's run is at version %d, the engine's at %d", h.model.Run.Version, h.run.Version)
	}
	return out
}

// next asserts what the run needs now.
func (h *harness) next(want string) {
	h.t.Helper()
	if got := aggregate.Next(h.run).String(); got != want {
		h.t.Fatalf("next: got %q, want %q", got, want)
	}
}

func (h *harness) submit(step int64, tools ...events.Descriptor) []projector.Output {
	h.t.Helper()
	return h.do(aggregate.Submit{Submission: submission(step, len(tools)).Submission(), Tools: tools, SnapshotID: "snap-1", At: h.tick()})
}

func (h *harness) gate(callID string, dec aggregate.Decision) []projector.Output {
	h.t.Helper()
	dec.CallID = callID
	if dec.Stage == "" {
		dec.Stage = events.StageDefault
	}
	return h.do(aggregate.Gate{Decisions: []aggregate.Decision{dec}, At: h.tick()})
}

func (h *harness) allow(callID string, capability events.Capability) []projector.Output {
	h.t.Helper()
	return h.gate(callID, aggregate.Decision{Outcome: events.GateAllow, Capability: capability})
}

func (h *harness) complete(callID string, attempt int, text string) []projector.Output {
	h.t.Helper()
	out := events.TextOutput(callID, text)
	return h.do(aggregate.Complete{CallID: callID, Attempt: attempt, Output: &out, At: h.tick()})
}

func (h *harness) resume(correlationID string, res events.ResumeResult, capability events.Capability) []projector.Output {
	h.t.Helper()
	return h.do(aggregate.Resume{Answer: events.Answer{CorrelationID: correlationID, RunID: runID, ThreadID: threadID, Result: res},
		Principal: "alice", Capability: capability, At: h.tick()})
}

// submission returns a submission at step with n tool_use blocks c1..cn
// naming tools t1..tn, after a text block.
func submission(step int64, n int) *protocol.Submit {
	content := []events.ContentBlock{events.TextBlock("let me do that")}
	for i := 1; i <= n; i++ {
		content = append(content, events.ContentBlock{Type: events.BlockToolUse, ID: fmt.Sprintf("c%d", i),
			Name: fmt.Sprintf("t%d", i), Input: events.MustJSON(fmt.Sprintf(`{"n":%d}`, i))})
	}
	return &protocol.Submit{RunID: runID, ThreadID: threadID, Step: step,
		Assistant: events.Message{ID: fmt.Sprintf("msg-%d", step), Content: content}}
}

// disp is an expected disposition.
type disp struct {
	call    string
	d       events.Disposition
	phase   events.Phase
	attempt int
}

// kinds returns the kinds of outputs, for messages.
func kinds(outs []projector.Output) string {
	ks := make([]string, len(outs))
	for i, o := range outs {
		ks[i] = o.Kind
	}
	return strings.Join(ks, ",")
}

func countKind(outs []projector.Output, kind string) int {
	n := 0
	for _, o := range outs {
		if o.Kind == kind {
			n++
		}
	}
	return n
}

// wantKinds checks the sequence of output kinds.
func wantKinds(t *testing.T, outs []projector.Output, want ...string) {
	t.Helper()
	if got := kinds(outs); got != strings.Join(want, ",") {
		t.Fatalf("outputs: got [%s], want [%s]", got, strings.Join(want, ","))
	}
}

// wantDispositions checks the leading disposition outputs of a batch.
func wantDispositions(t *testing.T, outs []projector.Output, batchID string, want ...disp) {
	t.Helper()
	if len(outs) < len(want) {
		t.Fatalf("outputs: got [%s], want %d dispositions first", kinds(outs), len(want))
	}
	for i, w := range want {
		o := outs[i]
		if o.Kind != projector.KindDisposition || o.Disposition == nil {
			t.Fatalf("output %d: got kind %q, want a disposition", i, o.Kind)
		}
		d := *o.Disposition
		wantTool := "t" + strings.TrimPrefix(w.call, "c")
		if d.BatchID != batchID || d.CallID != w.call || d.ToolID != wantTool ||
			d.Disposition != w.d || d.Phase != w.phase || d.Attempt != w.attempt {
			t.Fatalf("disposition %d: got %+v, want batch %s call %s tool %s %s phase %s attempt %d",
				i, d, batchID, w.call, wantTool, w.d, w.phase, w.attempt)
		}
	}
}

// wantResults checks a results output: one tool_result per call in model
// order, with the given texts and error flags.
func wantResults(t *testing.T, o projector.Output, batchID string, step int64, texts []string, isErr []bool) {
	t.Helper()
	if o.Kind != projector.KindResults || o.Results == nil {
		t.Fatalf("got kind %q, want results", o.Kind)
	}
	r := o.Results
	if r.BatchID != batchID || r.Step != step {
		t.Fatalf("results of batch %s step %d, want %s step %d", r.BatchID, r.Step, batchID, step)
	}
	if len(r.Results) != len(texts) {
		t.Fatalf("got %d result blocks, want %d", len(r.Results), len(texts))
	}
	for i, b := range r.Results {
		id := fmt.Sprintf("c%d", i+1)
		if b.Type != events.BlockToolResult || b.ToolUseID != id {
			t.Fatalf("result %d: got %s for %q, want tool_result for %s", i, b.Type, b.ToolUseID, id)
		}
		got := events.Output{Content: b.Content}.Text()
		if got != texts[i] || b.IsError != isErr[i] {
			t.Fatalf("result %d: got %q (is_error %v), want %q (is_error %v)", i, got, b.IsError, texts[i], isErr[i])
		}
	}
}

// TestParkThenBarrier is the contract's main scenario: three brain calls,
// the second requires confirmation. The park publishes dispositions and the
// ticket, nothing of the results; after approval and completion the barrier
// publishes dispositions and exactly one results message in model order.
func TestParkThenBarrier(t *testing.T) {
	h := newHarness(t)
	batch := events.BatchID(runID, 7)

	if out := h.submit(7, brainTool, brainTool, brainTool); len(out) != 0 {
		t.Fatalf("submit published [%s], want nothing", kinds(out))
	}
	h.next("gate c1")
	if out := h.allow("c1", events.CapReplaySafe); len(out) != 0 {
		t.Fatalf("allow published [%s], want nothing", kinds(out))
	}
	h.next("executing c1")
	if out := h.complete("c1", 1, "one"); len(out) != 0 {
		t.Fatalf("completing c1 published [%s], want nothing", kinds(out))
	}
	h.next("gate c2")

	park := h.gate("c2", aggregate.Decision{Outcome: events.GateRequireConfirmation, Stage: events.StagePolicy,
		Rule: "ask-t2", CorrelationID: "ask-1"})
	wantKinds(t, park, "disposition", "disposition", "disposition", "awaiting")
	wantDispositions(t, park, batch,
		disp{"c1", events.DispositionExecuted, events.PhaseCompleted, 1},
		disp{"c2", events.DispositionPendingBuiltin, events.PhaseAwaiting, 0},
		disp{"c3", events.DispositionExecuted, events.PhaseRequested, 0},
	)
	a := park[3].Awaiting
	if a == nil || a.CorrelationID != "ask-1" || a.Reason != events.WaitPermission || a.CallID != "c2" ||
		a.ToolID != "t2" || a.BatchID != batch || a.RunID != runID || a.ThreadID != threadID || a.SnapshotID != "snap-1" ||
		string(a.Arguments) != `{"n":2}` {
		t.Fatalf("awaiting: got %+v", a)
	}
	if n := countKind(h.outs, projector.KindResults); n != 0 {
		t.Fatalf("%d results published before the barrier", n)
	}

	h.next("awaiting c2")
	if out := h.resume("ask-1", events.ResumeResult{Kind: events.ResultPermission, Allow: true}, events.CapReplaySafe); len(out) != 0 {
		t.Fatalf("approval published [%s], want nothing", kinds(out))
	}
	h.next("executing c2")
	if out := h.complete("c2", 1, "two"); len(out) != 0 {
		t.Fatalf("completing c2 published [%s], want nothing", kinds(out))
	}
	h.next("gate c3")
	if out := h.allow("c3", events.CapReplaySafe); len(out) != 0 {
		t.Fatalf("allow published [%s], want nothing", kinds(out))
	}
	if n := countKind(h.outs, projector.KindResults); n != 0 {
		t.Fatalf("%d results published before the barrier", n)
	}

	final := h.complete("c3", 1, "three")
	wantKinds(t, final, "disposition", "disposition", "disposition", "results")
	wantDispositions(t, final, batch,
		disp{"c1", events.DispositionExecuted, events.PhaseCompleted, 1},
		disp{"c2", events.DispositionExecuted, events.PhaseCompleted, 1},
		disp{"c3", events.DispositionExecuted, events.PhaseCompleted, 1},
	)
	wantResults(t, final[3], batch, 7, []string{"one", "two", "three"}, []bool{false, false, false})
	if n := countKind(h.outs, projector.KindResults); n != 1 {
		t.Fatalf("%d results published for one batch, want 1", n)
	}
	h.next("none")
}

// TestClientCall: a client-executed call parks on an external_result
// ticket and is pending_client; the client's result clears the barrier.
func TestClientCall(t *testing.T) {
	h := newHarness(t)
	batch := events.BatchID(runID, 1)
	h.submit(1, brainTool, clientTool)
	h.allow("c1", events.CapReplaySafe)
	h.complete("c1", 1, "one")
	h.next("park_client c2")

	park := h.do(aggregate.ParkClient{CallID: "c2", CorrelationID: "client-1", At: h.tick()})
	wantKinds(t, park, "disposition", "disposition", "awaiting")
	wantDispositions(t, park, batch,
		disp{"c1", events.DispositionExecuted, events.PhaseCompleted, 1},
		disp{"c2", events.DispositionPendingClient, events.PhaseAwaiting, 0},
	)
	if a := park[2].Awaiting; a.Reason != events.WaitExternalResult || a.CorrelationID != "client-1" || a.CallID != "c2" {
		t.Fatalf("awaiting: got %+v", a)
	}

	out := events.TextOutput("c2", "from the client")
	final := h.resume("client-1", events.ResumeResult{Kind: events.ResultToolResult, Output: &out}, "")
	wantKinds(t, final, "disposition", "disposition", "results")
	wantDispositions(t, final, batch,
		disp{"c1", events.DispositionExecuted, events.PhaseCompleted, 1},
		disp{"c2", events.DispositionExecuted, events.PhaseCompleted, 0},
	)
	wantResults(t, final[2], batch, 1, []string{"one", "from the client"}, []bool{false, false})
}

// TestWaitsThatAreExecuted: scheduled and delegation waits park the run but
// their calls are executed, not pending.
func TestWaitsThatAreExecuted(t *testing.T) {
	t.Run("scheduled", func(t *testing.T) {
		h := newHarness(t)
		batch := events.BatchID(runID, 3)
		due := t0.Add(time.Hour)
		h.submit(3, brainTool, brainTool)
		park := h.gate("c1", aggregate.Decision{Outcome: events.GateSchedule, Stage: events.StagePolicy,
			CorrelationID: "sched-1", Due: &due, ActionKind: "nightly"})
		wantKinds(t, park, "disposition", "disposition", "awaiting")
		wantDispositions(t, park, batch,
			disp{"c1", events.DispositionExecuted, events.PhaseAwaiting, 0},
			disp{"c2", events.DispositionExecuted, events.PhaseRequested, 0},
		)
		a := park[2].Awaiting
		if a.Reason != events.WaitScheduledAction || a.CorrelationID != "sched-1" || a.ActionKind != "nightly" ||
			a.Due != "2025-01-02T04:04:05Z" || a.Deadline != "" {
			t.Fatalf("awaiting: got %+v", a)
		}
		if out := h.do(aggregate.Perform{CorrelationID: "sched-1", Timer: true, Capability: events.CapReplaySafe, At: due}); len(out) != 0 {
			t.Fatalf("perform published [%s], want nothing", kinds(out))
		}
		h.complete("c1", 1, "one")
		h.allow("c2", events.CapReplaySafe)
		final := h.complete("c2", 1, "two")
		wantKinds(t, final, "disposition", "disposition", "results")
		wantResults(t, final[2], batch, 3, []string{"one", "two"}, []bool{false, false})
	})
	t.Run("delegation", func(t *testing.T) {
		h := newHarness(t)
		batch := events.BatchID(runID, 4)
		h.submit(4, delegationTool, brainTool)
		h.allow("c1", events.CapDurableRequest)
		park := h.do(aggregate.DelegationAwait{CallID: "c1", Attempt: 1, CorrelationID: "child-1", At: h.tick()})
		wantKinds(t, park, "disposition", "disposition", "awaiting")
		wantDispositions(t, park, batch,
			disp{"c1", events.DispositionExecuted, events.PhaseAwaiting, 1},
			disp{"c2", events.DispositionExecuted, events.PhaseRequested, 0},
		)
		if a := park[2].Awaiting; a.Reason != events.WaitDelegation {
			t.Fatalf("awaiting: got %+v", a)
		}
	})
}

// twoBatches records a run with two batches, the first parked once.
func twoBatches(t *testing.T) *harness {
	t.Helper()
	h := newHarness(t)
	h.submit(1, brainTool, brainTool)
	h.allow("c1", events.CapReplaySafe)
	h.complete("c1", 1, "one")
	h.gate("c2", aggregate.Decision{Outcome: events.GateRequireConfirmation, CorrelationID: "ask-1"})
	h.resume("ask-1", events.ResumeResult{Kind: events.ResultPermission, Allow: false, Reason: "not today"}, "")
	h.submit(5, brainTool)
	h.gate("c1", aggregate.Decision{Outcome: events.GateBlock, Reason: "no"})
	return h
}

// TestReplayPublishesResultsOnce: projecting the same stream again gives
// identical outputs, one results message per batch; the live projection,
// a re-projection from zero and a projection of the encoded log agree byte
// for byte (invariant 8); and a redelivered barrier is refused, not
// published twice.
func TestReplayPublishesResultsOnce(t *testing.T) {
	h := twoBatches(t)
	if n := countKind(h.outs, projector.KindResults); n != 2 {
		t.Fatalf("%d results for two batches, want 2 (outputs [%s])", n, kinds(h.outs))
	}
	first, err := projector.ProjectAll(runID, h.evs)
	if err != nil {
		t.Fatalf("project all: %v", err)
	}
	second, err := projector.ProjectAll(runID, h.evs)
	if err != nil {
		t.Fatalf("project all again: %v", err)
	}
	if !reflect.DeepEqual(first, second) {
		t.Fatalf("projecting the same events twice differs:\n%s\n%s", kinds(first), kinds(second))
	}
	if !reflect.DeepEqual(first, h.outs) {
		t.Fatalf("re-derived outputs differ from the live ones:\n%s\n%s", kinds(first), kinds(h.outs))
	}
	wantResults(t, first[len(first)-1], events.BatchID(runID, 5), 5, []string{"blocked: no"}, []bool{true})

	// The log as stored: one encoded commit per event, decoded again.
	var decoded []events.Event
	for _, e := range h.evs {
		body, types, err := events.EncodeCommit([]events.Event{e})
		if err != nil {
			t.Fatalf("encode %s: %v", e.EventType(), err)
		}
		evs, err := events.DecodeCommit(body, types)
		if err != nil {
			t.Fatalf("decode %s: %v", e.EventType(), err)
		}
		decoded = append(decoded, evs...)
	}
	fromLog, err := projector.ProjectAll(runID, decoded)
	if err != nil {
		t.Fatalf("project the decoded log: %v", err)
	}
	if len(fromLog) != len(h.outs) {
		t.Fatalf("decoded log gives [%s], live [%s]", kinds(fromLog), kinds(h.outs))
	}
	for i := range fromLog {
		a, err := fromLog[i].Encode()
		if err != nil {
			t.Fatalf("encode output %d: %v", i, err)
		}
		b, err := h.outs[i].Encode()
		if err != nil {
			t.Fatalf("encode output %d: %v", i, err)
		}
		if fromLog[i].Subject() != h.outs[i].Subject() || !bytes.Equal(a, b) {
			t.Fatalf("output %d (%s) differs between the decoded log and the live projection", i, h.outs[i].Kind)
		}
	}

	// A redelivered barrier cannot publish the results again.
	var fin events.Event
	for _, e := range h.evs {
		if e.EventType() == events.TypeBatchFinalized {
			fin = e
		}
	}
	m, out, err := projector.Project(h.model, fin)
	var te *aggregate.TransitionError
	if err == nil || !errors.As(err, &te) || len(out) != 0 {
		t.Fatalf("redelivered BatchFinalized: outputs [%s], err %v; want a transition error and nothing", kinds(out), err)
	}
	if !reflect.DeepEqual(m, h.model) {
		t.Fatalf("a refused event changed the model")
	}
}

// TestRejectedSubmission: a refused submission is recorded and published
// on .rejected; it publishes nothing else and does not use up its step.
func TestRejectedSubmission(t *testing.T) {
	h := newHarness(t)
	h.submit(2, brainTool)

	s := submission(3, 1)
	_, evs, err := aggregate.Decide(h.run, aggregate.Submit{Submission: s.Submission(), Tools: []events.Descriptor{brainTool}, At: h.tick()})
	if err != nil || len(evs) != 1 {
		t.Fatalf("submit while a batch is open: got %v %v, want its rejection", evs, err)
	}
	rej, ok := evs[0].(*events.BatchRejected)
	if !ok || rej.Code != events.CodeBatchOpen {
		t.Fatalf("submit while a batch is open: got %v, want a batch_open rejection", evs[0])
	}
	out := h.commit(evs)
	wantKinds(t, out, "rejected")
	r := out[0].Rejected
	if r.BatchID != events.BatchID(runID, 3) || r.Code != events.CodeBatchOpen || r.Reason == "" || r.Reason != rej.Reason {
		t.Fatalf("rejected: got %+v", r)
	}

	// A submission that never decoded has no batch id.
	_, evs, err = aggregate.Decide(h.run, aggregate.Reject{Refusal: events.Refuse(events.CodeUndecodable, "body is not valid msgpack"), At: h.tick()})
	if err != nil {
		t.Fatal(err)
	}
	out = h.commit(evs)
	wantKinds(t, out, "rejected")
	if r := out[0].Rejected; r.BatchID != "" || r.Code != events.CodeUndecodable {
		t.Fatalf("rejected: got %+v", r)
	}
}

// TestCancel: cancelling a run with an executing call publishes the
// dispositions, the results (the unfinished calls as indeterminate error
// outputs), then ended.
func TestCancel(t *testing.T) {
	h := newHarness(t)
	batch := events.BatchID(runID, 9)
	h.submit(9, brainTool, brainTool, brainTool)
	h.allow("c1", events.CapReplaySafe)
	h.complete("c1", 1, "one")
	h.allow("c2", events.CapReplaySafe)

	out := h.do(aggregate.End{Cause: events.EndCancelled, Reason: "user pressed stop", At: h.tick()})
	wantKinds(t, out, "disposition", "disposition", "disposition", "results", "ended")
	wantDispositions(t, out, batch,
		disp{"c1", events.DispositionExecuted, events.PhaseCompleted, 1},
		disp{"c2", events.DispositionExecuted, events.PhaseIndeterminate, 1},
		disp{"c3", events.DispositionExecuted, events.PhaseIndeterminate, 0},
	)
	lost := aggregate.IndeterminatePrefix + "run cancelled: user pressed stop"
	if !strings.HasPrefix(lost, "tool outcome is indeterminate: ") {
		t.Fatalf("indeterminate text %q", lost)
	}
	never := aggregate.IndeterminatePrefix + "run cancelled before the call ran (it was requested): user pressed stop"
	wantResults(t, out[3], batch, 9, []string{"one", lost, never}, []bool{false, true, true})
	if e := out[4].Ended; e.Cause != events.EndCancelled || e.Reason != "user pressed stop" {
		t.Fatalf("ended: got %+v", e)
	}
	if n := countKind(h.outs, projector.KindResults); n != 1 {
		t.Fatalf("%d results, want 1", n)
	}
}

// TestCancelWhileParked: the parked call is pending_builtin until the run
// ends, then executed (indeterminate) like every call of a finalized batch.
func TestCancelWhileParked(t *testing.T) {
	h := newHarness(t)
	batch := events.BatchID(runID, 1)
	h.submit(1, brainTool)
	park := h.gate("c1", aggregate.Decision{Outcome: events.GateRequireConfirmation, CorrelationID: "ask-1"})
	wantDispositions(t, park, batch, disp{"c1", events.DispositionPendingBuiltin, events.PhaseAwaiting, 0})

	out := h.do(aggregate.End{Cause: events.EndCancelled, At: h.tick()})
	wantKinds(t, out, "disposition", "results", "ended")
	wantDispositions(t, out, batch, disp{"c1", events.DispositionExecuted, events.PhaseIndeterminate, 0})
	wantResults(t, out[1], batch, 1, []string{aggregate.IndeterminatePrefix + "run cancelled before the call ran (it was awaiting)"}, []bool{true})
}

// TestProjectIsPure: Project never changes the model it is given, and an
// event it cannot apply leaves the model as it was.
func TestProjectIsPure(t *testing.T) {
	h := newHarness(t)
	h.submit(1, brainTool, brainTool)
	before, err := h.model.Run.Snapshot()
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	_, evs, err := aggregate.Decide(h.run, aggregate.Gate{Decisions: []aggregate.Decision{{CallID: "c1",
		Outcome: events.GateRequireConfirmation, CorrelationID: "ask-1"}}, At: h.tick()})
	if err != nil {
		t.Fatalf("decide: %v", err)
	}
	m := h.model
	for _, e := range evs {
		if m, _, err = projector.Project(m, e); err != nil {
			t.Fatalf("project: %v", err)
		}
	}
	after, err := h.model.Run.Snapshot()
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	if !bytes.Equal(before, after) || h.model.Applied != 1 {
		t.Fatalf("Project changed the model it was given")
	}
	if m.Applied != 3 || m.Run.Status() != aggregate.StatusAwaiting {
		t.Fatalf("projected model: applied %d, status %s", m.Applied, m.Run.Status())
	}

	// An out-of-order event is refused with the model unchanged.
	bad := &events.CallExecuting{BatchID: events.BatchID(runID, 1), CallID: "c2", Attempt: 1,
		OperationID: events.OperationID(events.BatchID(runID, 1), "c2"), Cause: events.CauseAllowed, At: h.tick()}
	got, out, err := projector.Project(m, bad)
	var te *aggregate.TransitionError
	if !errors.As(err, &te) || len(out) != 0 || !reflect.DeepEqual(got, m) {
		t.Fatalf("illegal event: err %v, outputs [%s], model changed %v", err, kinds(out), !reflect.DeepEqual(got, m))
	}

	// Nil events are refused, not panicked on.
	for _, e := range []events.Event{nil, (*events.BatchFinalized)(nil)} {
		if _, _, err := projector.Project(m, e); !errors.Is(err, projector.ErrNilEvent) {
			t.Fatalf("nil event %T: got %v, want ErrNilEvent", e, err)
		}
	}
}

// TestProjectAllOtherRun: a stream of another run is refused, with the
// outputs of the events before the failure.
func TestProjectAllOtherRun(t *testing.T) {
	h := twoBatches(t)
	outs, err := projector.ProjectAll("run-2", h.evs)
	if err == nil || len(outs) != 0 {
		t.Fatalf("another run's stream: outputs [%s], err %v", kinds(outs), err)
	}
	// The zero model adopts the first batch's run.
	m := projector.Model{}
	for _, e := range h.evs {
		if m, _, err = projector.Project(m, e); err != nil {
			t.Fatalf("zero model: %v", err)
		}
	}
	if m.Run.RunID != runID || m.Applied != len(h.evs) {
		t.Fatalf("zero model: run %q applied %d", m.Run.RunID, m.Applied)
	}
}

// TestDispositionsWithoutBatch: no batch, no dispositions.
func TestDispositionsWithoutBatch(t *testing.T) {
	if d := projector.Dispositions(aggregate.New(runID)); d != nil {
		t.Fatalf("got %+v, want nil", d)
	}
	if d := projector.Dispositions(nil); d != nil {
		t.Fatalf("got %+v, want nil", d)
	}
}

// TestOutputSubjectAndEncode: each kind names its subject and encodes its
// own payload; a missing payload is an error, not an empty message.
func TestOutputSubjectAndEncode(t *testing.T) {
	outs := []projector.Output{
		{Kind: projector.KindDisposition, Disposition: &protocol.DispositionOut{CallID: "c1"}},
		{Kind: projector.KindResults, Results: &protocol.ResultsOut{BatchID: "b"}},
		{Kind: projector.KindAwaiting, Awaiting: &protocol.AwaitingOut{CorrelationID: "x"}},
		{Kind: projector.KindEnded, Ended: &protocol.EndedOut{Cause: events.EndInterrupted}},
		{Kind: projector.KindRejected, Rejected: &protocol.RejectedOut{Code: events.CodeRunEnded}},
	}
	for _, o := range outs {
		if o.Subject() != o.Kind {
			t.Fatalf("subject %q for kind %q", o.Subject(), o.Kind)
		}
		b, err := o.Encode()
		if err != nil || len(b) == 0 {
			t.Fatalf("encode %s: %v", o.Kind, err)
		}
	}
	for _, o := range []projector.Output{{Kind: projector.KindResults}, {Kind: "refused"}, {}} {
		if _, err := o.Encode(); !errors.Is(err, projector.ErrNoPayload) {
			t.Fatalf("encode %q without payload: got %v, want ErrNoPayload", o.Kind, err)
		}
	}
}
