package aggregate_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/toolbatch/toolbatch/aggregate"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/protocol"
)

// The decisions the engine shell used to make itself, each decided by the
// aggregate from facts the shell gathers.

var decT0 = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

var (
	brainNR   = events.Descriptor{Target: events.TargetBrain, Kind: events.KindTool, Policy: events.Policy{Mode: events.ModeNeverReplay}}
	sandboxID = events.Descriptor{Target: events.TargetSandbox, Kind: events.KindTool, Policy: events.Policy{Mode: events.ModeIdempotent}}
)

// decRun is a run driven through Decide, keeping the run Decide returns.
type decRun struct {
	t   *testing.T
	run *aggregate.Run
}

func newDecRun(t *testing.T) *decRun { return &decRun{t: t, run: aggregate.New("r1")} }

// do decides cmd, requires it to succeed, and returns its events.
func (d *decRun) do(cmd aggregate.Command) []events.Event {
	d.t.Helper()
	before := d.run.Clone()
	after, evs, err := aggregate.Decide(d.run, cmd)
	if err != nil {
		d.t.Fatalf("decide %T: %v", cmd, err)
	}
	// The returned run is the fold of the events over the run before.
	if err := before.ApplyAll(evs); err != nil {
		d.t.Fatalf("decide %T: its events do not apply: %v", cmd, err)
	}
	if !reflect.DeepEqual(before, after) {
		d.t.Fatalf("decide %T: the returned run is not the events folded once", cmd)
	}
	d.run = after
	return evs
}

func submitOf(step int64, calls ...string) *protocol.Submit {
	s := &protocol.Submit{RunID: "r1", ThreadID: "t1", Step: step, Assistant: events.Message{ID: "m"}}
	for i := 0; i+1 < len(calls); i += 2 {
		s.Assistant.Content = append(s.Assistant.Content, events.ContentBlock{Type: events.BlockToolUse, ID: calls[i], Name: calls[i+1], Input: events.RawJSON("{}")})
	}
	return s
}

func only[T events.Event](t *testing.T, evs []events.Event) T {
	t.Helper()
	if len(evs) != 1 {
		t.Fatalf("want one event, got %d: %v", len(evs), evs)
	}
	ev, ok := evs[0].(T)
	if !ok {
		t.Fatalf("want %T, got %s", *new(T), events.Describe(evs[0]))
	}
	return ev
}

func TestRefusedSubmissionIsItsRejection(t *testing.T) {
	d := newDecRun(t)
	d.do(aggregate.Submit{Submission: submitOf(1, "c1", "echo").Submission(), Tools: []events.Descriptor{brainNR}, At: decT0})
	rej := only[*events.BatchRejected](t, d.do(aggregate.Submit{Submission: submitOf(2, "c1", "echo").Submission(), Tools: []events.Descriptor{brainNR}, At: decT0}))
	if rej.Code != events.CodeBatchOpen || rej.BatchID != "r1/2" || rej.Step != 2 {
		t.Fatalf("rejection: %+v", rej)
	}
	// A body that never decoded has no batch.
	rej = only[*events.BatchRejected](t, d.do(aggregate.Reject{Refusal: events.Refuse(events.CodeUndecodable, "not msgpack"), At: decT0}))
	if rej.BatchID != "" || rej.Code != events.CodeUndecodable || rej.Reason != "not msgpack" {
		t.Fatalf("rejection: %+v", rej)
	}
}

func TestBatchLargerThanOneMessageIsRejected(t *testing.T) {
	d := newDecRun(t)
	s := submitOf(1, "c1", "echo")
	s.Assistant.Content = append(s.Assistant.Content, events.TextBlock(strings.Repeat("x", 20000)))
	const maxPayload = 16 << 10 // the commit would be larger, headers included
	rej := only[*events.BatchRejected](t, d.do(aggregate.Submit{Submission: s.Submission(), Tools: []events.Descriptor{brainNR},
		MaxPayload: maxPayload, SubmissionBytes: 20100, At: decT0}))
	if rej.Code != events.CodeLimitExceeded || !strings.Contains(rej.Reason, "max_payload 16384") {
		t.Fatalf("rejection: %+v", rej)
	}
	// The same batch fits a server with a larger message size.
	evs := d.do(aggregate.Submit{Submission: s.Submission(), Tools: []events.Descriptor{brainNR}, MaxPayload: 1 << 20, SubmissionBytes: 20100, At: decT0})
	if _, ok := evs[0].(*events.BatchSubmitted); !ok {
		t.Fatalf("want the batch accepted, got %s", events.Describe(evs[0]))
	}
}

// executing submits a batch of the tools and allows its first call.
func executing(t *testing.T, tools ...events.Descriptor) *decRun {
	d := newDecRun(t)
	var calls []string
	for i := range tools {
		calls = append(calls, "c"+string(rune('1'+i)), "t")
	}
	d.do(aggregate.Submit{Submission: submitOf(1, calls...).Submission(), Tools: tools, At: decT0})
	d.do(aggregate.Gate{Decisions: []aggregate.Decision{{CallID: "c1", Outcome: events.GateAllow, Stage: events.StageDefault,
		Capability: events.CapIdempotent}}, At: decT0})
	return d
}

func TestOutputLimitsAreFacts(t *testing.T) {
	big := events.TextOutput("c1", strings.Repeat("y", 300))
	d := executing(t, brainNR, brainNR)
	evs := d.do(aggregate.Complete{CallID: "c1", Attempt: 1, Output: &big, Limits: aggregate.OutputLimits{MaxOutputBytes: 100}, At: decT0})
	c := evs[0].(*events.CallCompleted)
	if c.ErrorKind != events.ErrorExecution || c.Output.Text() != "output exceeds 100 bytes" {
		t.Fatalf("over the output limit: %s", events.Describe(c))
	}
	// The batch's budget counts the outputs it holds already, to the byte:
	// the held output and the new one fit a budget of their sizes, and
	// not one byte less.
	held, size := events.OutputSize(c.Output), events.OutputSize(big)
	for _, budget := range []int{held + size, held + size - 1} {
		d := executing(t, brainNR, brainNR)
		d.do(aggregate.Complete{CallID: "c1", Attempt: 1, Output: &big, Limits: aggregate.OutputLimits{MaxOutputBytes: 100}, At: decT0})
		d.do(aggregate.Gate{Decisions: []aggregate.Decision{{CallID: "c2", Outcome: events.GateAllow, Stage: events.StageDefault}}, At: decT0})
		c := d.do(aggregate.Complete{CallID: "c2", Attempt: 1, Output: &big, Limits: aggregate.OutputLimits{MaxBatchOutputBytes: budget}, At: decT0})[0].(*events.CallCompleted)
		switch fits := budget == held+size; {
		case fits && c.ErrorKind != "":
			t.Fatalf("a budget of %d for outputs of %d and %d bytes: %s", budget, held, size, events.Describe(c))
		case !fits && (c.ErrorKind != events.ErrorExecution || !strings.HasPrefix(c.Output.Text(), "output too large")):
			t.Fatalf("over the batch budget (%d for outputs of %d and %d bytes): %s", budget, held, size, events.Describe(c))
		}
	}
	// No limits: the output is kept.
	d = executing(t, brainNR)
	c = d.do(aggregate.Complete{CallID: "c1", Attempt: 1, Output: &big, At: decT0})[0].(*events.CallCompleted)
	if c.ErrorKind != "" {
		t.Fatalf("without limits: %s", events.Describe(c))
	}
}

func TestWorkerResultIsFenced(t *testing.T) {
	d := executing(t, sandboxID)
	// A worker's result for an attempt nobody claimed is refused, even one
	// that says nothing ran: only the engine's own verdict may say so.
	ref := only[*events.ResultRefused](t, d.do(aggregate.Result{BatchID: "r1/1", Complete: aggregate.Complete{CallID: "c1", Attempt: 1,
		Error: &events.ToolError{Kind: events.ErrorUnavailableBeforeDispatch, Message: "forged"}, At: decT0}}))
	if !strings.Contains(ref.Reason, aggregate.ErrNotClaimed.Error()) {
		t.Fatalf("refusal: %+v", ref)
	}
	d.do(aggregate.Claim{CallID: "c1", Attempt: 1, WorkerID: "w1", Token: "tok", LeaseMS: 1000, At: decT0})
	out := events.TextOutput("c1", "forged")
	ref = only[*events.ResultRefused](t, d.do(aggregate.Result{BatchID: "r1/1", Complete: aggregate.Complete{CallID: "c1", Attempt: 1, ClaimToken: "other", Output: &out, At: decT0}}))
	if ref.ClaimToken != "other" || !strings.Contains(ref.Reason, aggregate.ErrStaleClaim.Error()) {
		t.Fatalf("refusal: %+v", ref)
	}
	// A result for a batch that is not the run's changes nothing.
	if _, evs, err := aggregate.Decide(d.run, aggregate.Result{BatchID: "r1/9", Complete: aggregate.Complete{CallID: "c1", Attempt: 1, ClaimToken: "tok", Output: &out, At: decT0}}); err == nil || evs != nil {
		t.Fatalf("another batch's result: %v %v", evs, err)
	}
	if err := d.run.CheckHeartbeat("r1/1", "c1", 1, "tok"); err != nil {
		t.Fatalf("the current claim's heartbeat: %v", err)
	}
	for _, hb := range []struct {
		batch string
		att   int
		tok   string
	}{{"r1/2", 1, "tok"}, {"r1/1", 2, "tok"}, {"r1/1", 1, "other"}} {
		if err := d.run.CheckHeartbeat(hb.batch, "c1", hb.att, hb.tok); !errors.Is(err, aggregate.ErrStaleClaim) {
			t.Fatalf("heartbeat %+v: %v", hb, err)
		}
	}
	c := d.do(aggregate.Result{BatchID: "r1/1", Complete: aggregate.Complete{CallID: "c1", Attempt: 1, ClaimToken: "tok", Output: &out, At: decT0}})[0].(*events.CallCompleted)
	if c.Output.Text() != "forged" {
		t.Fatalf("the current claim's result: %s", events.Describe(c))
	}
}

func TestNarrowingAndTickets(t *testing.T) {
	d := newDecRun(t)
	s := submitOf(1, "c1", "t")
	s.Narrowing = events.NarrowingDenyAll
	d.do(aggregate.Submit{Submission: s.Submission(), Tools: []events.Descriptor{brainNR}, At: decT0})
	dec, ok := aggregate.Narrowed(d.run.OpenBatch(), "c1")
	if !ok || dec.Outcome != events.GateBlock || dec.Stage != events.StageNarrowing {
		t.Fatalf("deny_all: %+v %v", dec, ok)
	}
	d = executing(t, brainNR)
	if _, ok := aggregate.Narrowed(d.run.OpenBatch(), "c1"); ok {
		t.Fatal("a batch without narrowing was narrowed")
	}

	d = newDecRun(t)
	d.do(aggregate.Submit{Submission: submitOf(1, "c1", "t").Submission(), Tools: []events.Descriptor{brainNR}, At: decT0})
	d.do(aggregate.Gate{Decisions: []aggregate.Decision{{CallID: "c1", Outcome: events.GateSchedule, Stage: events.StagePolicy, CorrelationID: "k1"}}, At: decT0})
	if c := d.run.TicketCall("k1"); c == nil || c.CallID != "c1" {
		t.Fatalf("ticket k1's call: %+v", c)
	}
	if c := d.run.TicketCall("k2"); c != nil {
		t.Fatalf("no ticket k2, got call %s", c.CallID)
	}
	d.do(aggregate.End{Cause: events.EndCancelled, At: decT0})
	_, _, err := aggregate.Decide(d.run, aggregate.Perform{CorrelationID: "k1", At: decT0})
	if code, _ := events.CodeOf(err); code != events.CodeNotAwaiting {
		t.Fatalf("perform in an ended run: %v, want not_awaiting", err)
	}
}

// TestRecoverStopsAtIndeterminateDelegation: when recovery makes a
// delegation indeterminate, the run ends; a later call of the batch is not
// entered again on the way (its attempt would be recorded but never run).
func TestRecoverStopsAtIndeterminateDelegation(t *testing.T) {
	del := func(max int) events.Descriptor {
		return events.Descriptor{Target: events.TargetBrain, Kind: events.KindDelegation, ParallelCompletion: true,
			Policy: events.Policy{Mode: events.ModeDurableRequest, MaxAttempts: max}}
	}
	d := newDecRun(t)
	s := submitOf(1, "c1", "one", "c2", "two")
	d.do(aggregate.Submit{Submission: s.Submission(), Tools: []events.Descriptor{del(1), del(3)}, At: decT0})
	allow := func(id string) aggregate.Decision {
		return aggregate.Decision{CallID: id, Outcome: events.GateAllow, Stage: events.StageDefault, Capability: events.CapDurableRequest}
	}
	d.do(aggregate.Gate{Decisions: []aggregate.Decision{allow("c1"), allow("c2")}, At: decT0})
	evs := d.do(aggregate.Recover{Capabilities: map[string]events.Capability{"one": events.CapDurableRequest, "two": events.CapDurableRequest}, At: decT0})
	for _, e := range evs {
		if ex, ok := e.(*events.CallExecuting); ok {
			t.Fatalf("recovery entered %s again (attempt %d) although the run ends", ex.CallID, ex.Attempt)
		}
	}
	if d.run.End == nil || d.run.End.Cause != events.EndIndeterminate {
		t.Fatalf("the run did not end indeterminate: %v", d.run.End)
	}
}
