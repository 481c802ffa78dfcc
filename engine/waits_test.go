package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/catalog"
	"github.com/toolbatch/toolbatch/client"
	"github.com/toolbatch/toolbatch/engine"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/internal/testnats"
	"github.com/toolbatch/toolbatch/internal/testwait"
	"github.com/toolbatch/toolbatch/protocol"
)

// runWatch reads one run's out messages strictly in stream order: every
// helper says what it expects next and fails on anything else, so that a
// message published too early (results before the last wait resolved) or
// at all (a refusal that changed something) is caught.
type runWatch struct {
	t   *testing.T
	ctx context.Context
	w   *client.Watch
}

func watchRun(t *testing.T, ctx context.Context, c *client.Client, runID string) *runWatch {
	t.Helper()
	w, err := c.Watch(ctx, runID)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	return &runWatch{t: t, ctx: ctx, w: w}
}

func (rw *runWatch) next(what string) client.Message {
	rw.t.Helper()
	m, err := rw.w.Next(rw.ctx)
	if err != nil {
		rw.t.Fatalf("%s: %v", what, err)
	}
	return m
}

// until reads messages until found holds for one, and returns that one.
func (rw *runWatch) until(what string, found func(client.Message) bool) client.Message {
	rw.t.Helper()
	for {
		if m := rw.next(what); found(m) {
			return m
		}
	}
}

func dispositionText(d *protocol.DispositionOut) string {
	return fmt.Sprintf("%s:%s:%s", d.CallID, d.Disposition, d.Phase)
}

// park reads the messages of one park: a disposition per call, then the
// ticket.
func (rw *runWatch) park(what string) ([]string, protocol.AwaitingOut) {
	rw.t.Helper()
	disp, m := rw.dispositionsThen(what, func(m client.Message) bool { return m.Awaiting != nil })
	return disp, *m.Awaiting
}

// results reads the messages of a finalized batch: a disposition per call,
// then the results.
func (rw *runWatch) results(what string) ([]string, *protocol.ResultsOut) {
	rw.t.Helper()
	disp, m := rw.dispositionsThen(what, func(m client.Message) bool { return m.Results != nil })
	return disp, m.Results
}

// dispositionsThen reads dispositions until the message that last accepts,
// and returns the dispositions and that message; any other message fails.
func (rw *runWatch) dispositionsThen(what string, last func(client.Message) bool) ([]string, client.Message) {
	rw.t.Helper()
	var disp []string
	for {
		m := rw.next(what)
		switch {
		case m.Disposition != nil:
			disp = append(disp, dispositionText(m.Disposition))
		case last(m):
			return disp, m
		default:
			rw.t.Fatalf("%s: unexpected %s message %+v (refused: %+v)", what, m.Kind, m, m.Refused)
		}
	}
}

// refused reads the next message, which must be the refusal of the
// message naming correlationID, with code.
func (rw *runWatch) refused(what string, code events.Code, correlationID string) {
	rw.t.Helper()
	m := rw.next(what)
	switch {
	case m.Refused == nil:
		rw.t.Fatalf("%s: got a %s message %+v, want a refusal %s", what, m.Kind, m, code)
	case m.Refused.Code != code || m.Refused.CorrelationID != correlationID:
		rw.t.Fatalf("%s: refused %s for %q (%s), want %s for %q", what, m.Refused.Code, m.Refused.CorrelationID, m.Refused.Reason, code, correlationID)
	}
}

// lastCommit returns the stream sequence of the run's last commit.
func lastCommit(t *testing.T, ctx context.Context, js jetstream.JetStream, runID string) uint64 {
	t.Helper()
	s, err := js.Stream(ctx, "TOOLBATCH_EVENTS")
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(ctx, "toolbatch.events."+runID)
	if err != nil {
		t.Fatal(err)
	}
	return m.Sequence
}

// runEvents reads every event of the run's log.
func runEvents(t *testing.T, ctx context.Context, js jetstream.JetStream, runID string) []events.Event {
	t.Helper()
	last := lastCommit(t, ctx, js, runID)
	cons, err := js.OrderedConsumer(ctx, "TOOLBATCH_EVENTS", jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{"toolbatch.events." + runID}, DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		t.Fatal(err)
	}
	var out []events.Event
	for {
		m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatalf("read the log of %s: %v", runID, err)
		}
		evs, err := events.DecodeCommit(m.Data(), m.Headers().Values(protocol.HeaderEvent))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, evs...)
		meta, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		if meta.Sequence.Stream >= last {
			return out
		}
	}
}

// publishJSON stores a JSON command in the inbox without a message id, as
// a client in another language might.
func publishJSON(t *testing.T, ctx context.Context, js jetstream.JetStream, subject string, body any) {
	t.Helper()
	data, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(subject)
	m.Data = data
	m.Header.Set("Content-Type", "application/json")
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
}

func mustCatalog(t *testing.T, yaml string) *catalog.Catalog {
	t.Helper()
	cat, err := catalog.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return cat
}

func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestMixedBatchOfEveryWait: one batch of an allowed brain call, a
// confirmation, a client-executed call, a scheduled call and a blocked call.
// The run parks three times, once per wait, with the dispositions of
// contract.md §5; nothing reaches the results before the last wait is
// resolved; then one results message holds every call's result in model
// order, the client's output verbatim.
func TestMixedBatchOfEveryWait(t *testing.T) {
	cat := mustCatalog(t, `
tools:
  - {id: echo, builtin: echo, recovery: {mode: replay_safe}}
  - {id: send_mail, builtin: echo}
  - {id: ask_user, kind: client}
  - {id: report, builtin: echo}
  - {id: rm_file, builtin: echo}
gate:
  rules:
    - {tools: ["send_*"], outcome: require_confirmation, deadline: 10m}
    - {tools: ["report"], outcome: schedule, after: 1s, action_kind: weekly}
    - {tools: ["rm_*"], outcome: block, reason: destructive tools are disabled}
`)
	url := testnats.Start(t, t.TempDir())
	startEngine(t, url, engine.Config{Catalog: cat})
	c := newClient(t, url)
	js := testnats.JetStream(t, testnats.Connect(t, url))
	ctx := ctxT(t, 30*time.Second)

	if err := c.Submit(ctx, submitOf("mix", 1,
		"echo", `{"a":1}`,
		"send_mail", `{"to":"bob@example.org"}`,
		"ask_user", `{"question":"which colour?"}`,
		"report", `{"week":7}`,
		"rm_file", `{"path":"/etc/passwd"}`)); err != nil {
		t.Fatal(err)
	}
	w := watchRun(t, ctx, c, "mix")

	// 1. The confirmation.
	disp, tk := w.park("the confirmation")
	if got, want := fmt.Sprint(disp), "[c1:executed:completed c2:pending_builtin:awaiting c3:executed:requested c4:executed:requested c5:executed:requested]"; got != want {
		t.Fatalf("dispositions at the confirmation\n got %s\nwant %s", got, want)
	}
	if tk.Reason != events.WaitPermission || tk.CallID != "c2" || tk.ToolID != "send_mail" || tk.RunID != "mix" ||
		tk.ThreadID != "t1" || tk.BatchID != "mix/1" || tk.SnapshotID != cat.SnapshotID() || tk.Deadline == "" || tk.Due != "" ||
		string(tk.Arguments) != `{"to":"bob@example.org"}` {
		t.Fatalf("confirmation ticket: %+v", tk)
	}
	if err := c.Approve(ctx, tk, "alice", "fine"); err != nil {
		t.Fatal(err)
	}

	// 2. The client-executed call: parked on its own ticket, no deadline.
	disp, tk = w.park("the client call")
	if got, want := fmt.Sprint(disp), "[c1:executed:completed c2:executed:completed c3:pending_client:awaiting c4:executed:requested c5:executed:requested]"; got != want {
		t.Fatalf("dispositions at the client call\n got %s\nwant %s", got, want)
	}
	if tk.Reason != events.WaitExternalResult || tk.CallID != "c3" || tk.ToolID != "ask_user" || tk.Deadline != "" {
		t.Fatalf("client ticket: %+v", tk)
	}
	clientOut := events.Output{
		Content: []events.ContentBlock{
			events.TextBlock("the user closed the dialog"),
			{Type: events.BlockJSON, Value: events.MustJSON(`{"choice":null,"reason":"closed"}`)},
		},
		IsError: true,
		State: []events.Command{{Scope: events.ScopeRun, Key: "asked", Merge: events.MergeDisjoint,
			Action: events.ActionSet, Value: events.MustJSON(`true`)}},
	}
	if err := c.ToolResult(ctx, tk, clientOut); err != nil {
		t.Fatal(err)
	}

	// 3. The scheduled call: its disposition is executed.
	disp, tk = w.park("the scheduled call")
	if got, want := fmt.Sprint(disp), "[c1:executed:completed c2:executed:completed c3:executed:completed c4:executed:awaiting c5:executed:requested]"; got != want {
		t.Fatalf("dispositions at the scheduled call\n got %s\nwant %s", got, want)
	}
	if tk.Reason != events.WaitScheduledAction || tk.CallID != "c4" || tk.Due == "" || tk.ActionKind != "weekly" {
		t.Fatalf("scheduled ticket: %+v", tk)
	}
	due, err := time.Parse(time.RFC3339Nano, tk.Due)
	if err != nil {
		t.Fatal(err)
	}

	// 4. The schedule fires by itself; the blocked call completes; the
	// barrier publishes everything at once.
	disp, res := w.results("the results")
	if time.Now().Before(due) {
		t.Fatalf("results before the scheduled call was due (%s)", tk.Due)
	}
	if got, want := fmt.Sprint(disp), "[c1:executed:completed c2:executed:completed c3:executed:completed c4:executed:completed c5:executed:completed]"; got != want {
		t.Fatalf("dispositions at the barrier\n got %s\nwant %s", got, want)
	}
	want := fmt.Sprint([]string{
		`c1=ok "{\"a\":1}"`,
		`c2=ok "{\"to\":\"bob@example.org\"}"`,
		`c3=error "the user closed the dialog[json]"`,
		`c4=ok "{\"week\":7}"`,
		`c5=error "blocked: destructive tools are disabled"`,
	})
	if got := fmt.Sprint(resultTexts(res)); got != want {
		t.Fatalf("results\n got %s\nwant %s", got, want)
	}
	if got, want := jsonOf(t, res.Results[2].Content), jsonOf(t, clientOut.Content); got != want {
		t.Fatalf("the client's output is not verbatim\n got %s\nwant %s", got, want)
	}
	if got, want := jsonOf(t, res.State), jsonOf(t, clientOut.State); got != want {
		t.Fatalf("staged state\n got %s\nwant %s", got, want)
	}

	// Exactly one results message for the batch, and one outcome per call.
	counts := subjectCounts(t, ctx, js, "TOOLBATCH_OUT", "toolbatch.out.mix.>")
	if n := counts["toolbatch.out.mix.results"]; n != 1 {
		t.Fatalf("%d results messages, want 1", n)
	}
	if n := counts["toolbatch.out.mix.awaiting"]; n != 3 {
		t.Fatalf("%d tickets, want 3", n)
	}
	outcomes := map[string]int{}
	executing := map[string]int{}
	var approvedBy string
	for _, e := range runEvents(t, ctx, js, "mix") {
		switch ev := e.(type) {
		case *events.CallCompleted:
			outcomes[ev.CallID]++
		case *events.CallIndeterminate:
			outcomes[ev.CallID]++
		case *events.CallExecuting:
			executing[ev.CallID]++
		case *events.TicketResolved:
			if ev.CallID == "c2" {
				approvedBy = string(ev.Resolution) + " by " + ev.Principal
			}
		}
	}
	if fmt.Sprint(outcomes) != "map[c1:1 c2:1 c3:1 c4:1 c5:1]" {
		t.Fatalf("outcomes per call: %v", outcomes)
	}
	// The client call and the blocked call never entered an executor.
	if fmt.Sprint(executing) != "map[c1:1 c2:1 c4:1]" {
		t.Fatalf("attempts per call: %v", executing)
	}
	if approvedBy != "approved by alice" {
		t.Fatalf("the confirmation was %q, want approved by alice", approvedBy)
	}
}

// TestRefusalsOfResumesAndPerforms sends every kind of mismatched resume and
// perform to a parked run: each is refused on .refused with its code and the
// correlation id it named, and changes nothing (no commit, no other out
// message). The engine's clock is ours, so that a resume arrives after a
// ticket's deadline but before its timer fires.
func TestRefusalsOfResumesAndPerforms(t *testing.T) {
	cat := mustCatalog(t, `
tools:
  - {id: send_mail, builtin: echo}
  - {id: report, builtin: echo}
gate:
  rules:
    - {tools: ["send_*"], outcome: require_confirmation, deadline: 10m}
    - {tools: ["report"], outcome: schedule, after: 1h}
`)
	var skew atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	url := testnats.Start(t, t.TempDir())
	startEngine(t, url, engine.Config{Catalog: cat, Now: now})
	c := newClient(t, url)
	js := testnats.JetStream(t, testnats.Connect(t, url))
	ctx := ctxT(t, 30*time.Second)

	if err := c.Submit(ctx, submitOf("rf", 1, "send_mail", `{"to":"x"}`, "report", `{"week":1}`)); err != nil {
		t.Fatal(err)
	}
	w := watchRun(t, ctx, c, "rf")
	_, tk := w.park("the confirmation")
	before := lastCommit(t, ctx, js, "rf")

	resume := func(change func(r *protocol.Resume)) *protocol.Resume {
		r := &protocol.Resume{CorrelationID: tk.CorrelationID, RunID: tk.RunID, ThreadID: tk.ThreadID, CallID: tk.CallID,
			SnapshotID: tk.SnapshotID, Result: events.ResumeResult{Kind: events.ResultPermission, Allow: true}}
		change(r)
		return r
	}
	send := func(r *protocol.Resume, principal string) {
		t.Helper()
		if err := c.Resume(ctx, r, principal); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name string
		code events.Code
		cid  string
		send func()
	}{
		{"a correlation id never issued", events.CodeUnknownCorrelation, "never-issued", func() {
			send(resume(func(r *protocol.Resume) { r.CorrelationID = "never-issued" }), "")
		}},
		{"a body naming another run", events.CodeWrongRun, tk.CorrelationID, func() {
			// client.Resume derives the subject from the body's run_id, so a
			// body that differs from its subject is sent raw.
			publishJSON(t, ctx, js, "toolbatch.resume.rf", map[string]any{
				"correlation_id": tk.CorrelationID, "run_id": "another-run", "thread_id": tk.ThreadID,
				"result": map[string]any{"kind": "permission", "allow": true},
			})
		}},
		{"another thread", events.CodeWrongThread, tk.CorrelationID, func() {
			send(resume(func(r *protocol.Resume) { r.ThreadID = "t9" }), "")
		}},
		{"another snapshot", events.CodeWrongSnapshot, tk.CorrelationID, func() {
			send(resume(func(r *protocol.Resume) { r.SnapshotID = "cat-0000000000000000" }), "")
		}},
		{"another call", events.CodeWrongCall, tk.CorrelationID, func() {
			send(resume(func(r *protocol.Resume) { r.CallID = "c2" }), "")
		}},
		{"a tool_result for a permission ticket", events.CodeWrongResultKind, tk.CorrelationID, func() {
			if err := c.ToolResult(ctx, tk, events.TextOutput("", "done")); err != nil {
				t.Fatal(err)
			}
		}},
		{"input for a permission ticket", events.CodeWrongResultKind, tk.CorrelationID, func() {
			if err := c.Input(ctx, tk, "2025"); err != nil {
				t.Fatal(err)
			}
		}},
		{"perform of a permission ticket", events.CodeWrongResultKind, tk.CorrelationID, func() {
			if err := c.Perform(ctx, "rf", tk.CorrelationID); err != nil {
				t.Fatal(err)
			}
		}},
		{"perform of a correlation id never issued", events.CodeUnknownCorrelation, "never-issued-2", func() {
			if err := c.Perform(ctx, "rf", "never-issued-2"); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range cases {
		tc.send()
		w.refused(tc.name, tc.code, tc.cid)
	}
	if after := lastCommit(t, ctx, js, "rf"); after != before {
		t.Fatalf("refusals committed: last commit %d, was %d", after, before)
	}
	// refusedUnchanged sends what, reads its refusal and checks that it
	// committed nothing.
	refusedUnchanged := func(what string, code events.Code, cid string, send func()) {
		t.Helper()
		before := lastCommit(t, ctx, js, "rf")
		send()
		w.refused(what, code, cid)
		if after := lastCommit(t, ctx, js, "rf"); after != before {
			t.Fatalf("%s committed: last commit %d, was %d", what, after, before)
		}
	}

	// The ticket is still open: approve it. The second click (another
	// principal, so not a stream duplicate) is not_awaiting.
	if err := c.Approve(ctx, tk, "alice", ""); err != nil {
		t.Fatal(err)
	}
	_, sched := w.park("the scheduled call")
	if sched.Reason != events.WaitScheduledAction || sched.CallID != "c2" {
		t.Fatalf("scheduled ticket: %+v", sched)
	}
	refusedUnchanged("the double approve", events.CodeNotAwaiting, tk.CorrelationID, func() {
		if err := c.Approve(ctx, tk, "bob", ""); err != nil {
			t.Fatal(err)
		}
	})

	// Perform the scheduled call now; a second perform is refused. (The
	// client's Perform carries a deterministic message id, so a second one
	// within the duplicate window would be dropped by the stream: it is
	// sent raw.)
	if err := c.Perform(ctx, "rf", sched.CorrelationID); err != nil {
		t.Fatal(err)
	}
	_, res := w.results("the results of step 1")
	if got := fmt.Sprint(resultTexts(res)); got != `[c1=ok "{\"to\":\"x\"}" c2=ok "{\"week\":1}"]` {
		t.Fatalf("results: %s", got)
	}
	refusedUnchanged("the second perform", events.CodeNotAwaiting, sched.CorrelationID, func() {
		publishJSON(t, ctx, js, "toolbatch.control.rf", map[string]any{"action": "perform", "correlation_id": sched.CorrelationID})
	})

	// Expired: the engine's clock passes the deadline; the server's timer
	// (at the real deadline) has not fired yet.
	if err := c.Submit(ctx, submitOf("rf", 2, "send_mail", `{"to":"y"}`)); err != nil {
		t.Fatal(err)
	}
	_, tk2 := w.park("the second confirmation")
	deadline, err := time.Parse(time.RFC3339Nano, tk2.Deadline)
	if err != nil {
		t.Fatal(err)
	}
	skew.Store(int64(time.Until(deadline) + time.Minute))
	refusedUnchanged("the late approval", events.CodeExpired, tk2.CorrelationID, func() {
		if err := c.Approve(ctx, tk2, "alice", "late"); err != nil {
			t.Fatal(err)
		}
	})

	// Cancel ends the parked run: its open call is indeterminate, the
	// results and .ended are published once; repeating cancel and
	// interrupt publishes nothing (a later refusal proves they were read).
	if err := c.Cancel(ctx, "rf", "enough"); err != nil {
		t.Fatal(err)
	}
	_, res = w.results("the results of the cancelled batch")
	if got := fmt.Sprint(resultTexts(res)); got != `[c1=error "tool outcome is indeterminate: run cancelled before the call ran (it was awaiting): enough"]` {
		t.Fatalf("results: %s", got)
	}
	if m := w.next("the end"); m.Ended == nil || m.Ended.Cause != events.EndCancelled || m.Ended.Reason != "enough" {
		t.Fatalf("got %+v, want ended cancelled", m)
	}
	publishJSON(t, ctx, js, "toolbatch.control.rf", map[string]any{"action": "cancel", "reason": "again"})
	publishJSON(t, ctx, js, "toolbatch.control.rf", map[string]any{"action": "interrupt"})
	if err := c.Approve(ctx, tk2, "carol", ""); err != nil {
		t.Fatal(err)
	}
	w.refused("an approval of a ticket the cancel cleared", events.CodeNotAwaiting, tk2.CorrelationID)
}

// TestParkedRunAcrossRestarts: a confirmation issued by one engine is
// approved through the next one; a scheduled action whose due time passes
// while no engine runs is performed exactly once by the engine that starts
// after.
func TestParkedRunAcrossRestarts(t *testing.T) {
	cat := mustCatalog(t, `
tools:
  - {id: send_mail, builtin: echo}
  - {id: report, recovery: {mode: replay_safe}}
gate:
  rules:
    - {tools: ["send_*"], outcome: require_confirmation}
    - {tools: ["report"], outcome: schedule, after: 3s}
`)
	url := testnats.Start(t, t.TempDir())
	re := startEngine(t, url, engine.Config{Catalog: cat})
	nc := testnats.Connect(t, url)
	c := newClient(t, url)
	js := testnats.JetStream(t, nc)
	ctx := ctxT(t, 30*time.Second)

	// report is a host service that counts its executions.
	var reports atomic.Int32
	if _, err := nc.Subscribe("toolbatch.brain.report", func(m *nats.Msg) {
		var req protocol.BrainRequest
		if err := events.Unmarshal(m.Data, &req); err != nil {
			t.Errorf("brain request: %v", err)
			return
		}
		reports.Add(1)
		o := events.TextOutput(req.CallID, "report for "+string(req.Arguments))
		body, _ := events.Marshal(protocol.BrainReply{Output: &o})
		_ = m.Respond(body)
	}); err != nil {
		t.Fatal(err)
	}
	putKey(t, ctx, js, "TOOLBATCH_REGISTRY", "brain.report", "replay_safe")

	if err := c.Submit(ctx, submitOf("pr", 1, "send_mail", `{"to":"z"}`, "report", `{"week":2}`)); err != nil {
		t.Fatal(err)
	}
	w := watchRun(t, ctx, c, "pr")
	_, tk := w.park("the confirmation")
	re.shutdown(t)

	// A new engine: the ticket still resolves.
	re = startEngine(t, url, engine.Config{Catalog: cat})
	if err := c.Approve(ctx, tk, "alice", "after the restart"); err != nil {
		t.Fatal(err)
	}
	disp, sched := w.park("the scheduled call")
	if got, want := fmt.Sprint(disp), "[c1:executed:completed c2:executed:awaiting]"; got != want {
		t.Fatalf("dispositions\n got %s\nwant %s", got, want)
	}
	re.shutdown(t)
	due, err := time.Parse(time.RFC3339Nano, sched.Due)
	if err != nil {
		t.Fatal(err)
	}
	if !time.Now().Before(due) {
		t.Fatalf("the engine took until after the due time (%s) to stop", sched.Due)
	}
	fired := func() uint64 {
		return subjectCounts(t, ctx, js, "TOOLBATCH_TIMERS", "toolbatch.timer.fire.pr")["toolbatch.timer.fire.pr"]
	}
	testwait.Until(t, ctx, "the schedule fires while no engine runs", func() bool { return fired() == 1 })
	if n := reports.Load(); n != 0 {
		t.Fatalf("report ran %d times with no engine", n)
	}

	startEngine(t, url, engine.Config{Catalog: cat})
	_, res := w.results("the results")
	if got := fmt.Sprint(resultTexts(res)); got != `[c1=ok "{\"to\":\"z\"}" c2=ok "report for {\"week\":2}"]` {
		t.Fatalf("results: %s", got)
	}
	testwait.Until(t, ctx, "the fired timer is consumed", func() bool { return fired() == 0 })
	if n := reports.Load(); n != 1 {
		t.Fatalf("report ran %d times, want 1", n)
	}
	var trail []string
	for _, e := range runEvents(t, ctx, js, "pr") {
		switch ev := e.(type) {
		case *events.TicketResolved:
			trail = append(trail, fmt.Sprintf("%s:%s:%s:%s", ev.CallID, ev.Resolution, ev.Principal, ev.Note))
		case *events.CallExecuting:
			trail = append(trail, fmt.Sprintf("%s:executing %d %s", ev.CallID, ev.Attempt, ev.Cause))
		}
	}
	if got, want := fmt.Sprint(trail), "[c1:approved:alice:after the restart c1:executing 1 approved c2:performed::due c2:executing 1 performed]"; got != want {
		t.Fatalf("log\n got %s\nwant %s", got, want)
	}
}

// TestParkedClientCallAfterRestart: the engine stops while a host brain call
// is in flight and the client call after it is still requested. The next
// engine takes the run over (its submission is redelivered after the ack
// wait), re-invokes the replay-safe call, and parks the client call on its
// own external_result ticket exactly as on a first dispatch: one ticket.
func TestParkedClientCallAfterRestart(t *testing.T) {
	cat := mustCatalog(t, `
tools:
  - {id: lookup, recovery: {mode: replay_safe, max_attempts: 10}}
  - {id: ask_user, kind: client}
`)
	url := testnats.Start(t, t.TempDir())
	re := startEngine(t, url, engine.Config{Catalog: cat})
	nc := testnats.Connect(t, url)
	c := newClient(t, url)
	js := testnats.JetStream(t, nc)
	ctx := ctxT(t, 30*time.Second)
	putKey(t, ctx, js, "TOOLBATCH_REGISTRY", "brain.lookup", "replay_safe")

	// lookup holds its first attempt until the test ends (the engine that
	// sent it is gone by then) and answers every later one.
	var mu sync.Mutex
	var attempts []int
	entered := make(chan struct{})
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	if _, err := nc.Subscribe("toolbatch.brain.lookup", func(m *nats.Msg) {
		var req protocol.BrainRequest
		if err := events.Unmarshal(m.Data, &req); err != nil {
			t.Errorf("brain request: %v", err)
			return
		}
		mu.Lock()
		attempts = append(attempts, req.Attempt)
		mu.Unlock()
		go func() {
			if req.Attempt == 1 {
				close(entered)
				<-release
			}
			o := events.TextOutput(req.CallID, "found "+string(req.Arguments))
			body, _ := events.Marshal(protocol.BrainReply{Output: &o})
			_ = m.Respond(body)
		}()
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	if err := c.Submit(ctx, submitOf("pc", 1, "lookup", `{"q":"colour"}`, "ask_user", `{"question":"which?"}`)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-ctx.Done():
		t.Fatal("lookup was never entered")
	}
	re.shutdown(t)

	startEngine(t, url, engine.Config{Catalog: cat})
	w := watchRun(t, ctx, c, "pc")
	disp, tk := w.park("the client call after the restart")
	if got, want := fmt.Sprint(disp), "[c1:executed:completed c2:pending_client:awaiting]"; got != want {
		t.Fatalf("dispositions\n got %s\nwant %s", got, want)
	}
	if tk.Reason != events.WaitExternalResult || tk.CallID != "c2" || tk.ToolID != "ask_user" || tk.Deadline != "" ||
		string(tk.Arguments) != `{"question":"which?"}` {
		t.Fatalf("client ticket: %+v", tk)
	}
	if err := c.ToolResult(ctx, tk, events.TextOutput("c2", "blue")); err != nil {
		t.Fatal(err)
	}
	_, res := w.results("the results")
	if got := fmt.Sprint(resultTexts(res)); got != `[c1=ok "found {\"q\":\"colour\"}" c2=ok "blue"]` {
		t.Fatalf("results: %s", got)
	}
	tickets, completions := 0, 0
	var causes []string
	for _, e := range runEvents(t, ctx, js, "pc") {
		switch ev := e.(type) {
		case *events.CallAwaiting:
			tickets++
		case *events.CallCompleted:
			if ev.CallID == "c1" {
				completions++
			}
		case *events.CallExecuting:
			causes = append(causes, fmt.Sprintf("%d:%s", ev.Attempt, ev.Cause))
		}
	}
	if tickets != 1 || completions != 1 {
		t.Fatalf("%d tickets and %d completions of c1, want 1 and 1", tickets, completions)
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("lookup attempts entered: %v; attempts committed: %v", attempts, causes)
	if len(causes) < 2 || causes[0] != "1:allowed" || causes[len(causes)-1] != fmt.Sprintf("%d:recovered", len(causes)) {
		t.Fatalf("attempts of c1: %v, want 1:allowed, then recovered ones", causes)
	}
}
