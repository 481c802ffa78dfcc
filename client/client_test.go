package client_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/client"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/internal/testnats"
	"github.com/toolbatch/toolbatch/protocol"
)

// env is an embedded JetStream server with the two streams the engine would
// create, and a client on it.
type env struct {
	js    jetstream.JetStream
	inbox jetstream.Stream
	out   jetstream.Stream
	c     *client.Client
}

// newEnv starts a server storing in t.TempDir(), creates TOOLBATCH_INBOX
// and TOOLBATCH_OUT for prefix as the engine does, and returns a client.
func newEnv(t *testing.T, ctx context.Context, prefix string, opts ...client.Option) *env {
	t.Helper()
	url := testnats.Start(t, t.TempDir())
	nc := testnats.Connect(t, url)
	js := testnats.JetStream(t, nc)
	inbox, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: streamName(prefix, "INBOX"),
		Subjects: []string{
			prefix + ".submit.>", prefix + ".resume.>", prefix + ".control.>", prefix + ".result.>",
		},
		Retention:  jetstream.LimitsPolicy,
		Storage:    jetstream.FileStorage,
		Duplicates: 2 * time.Minute,
	})
	if err != nil {
		t.Fatalf("create inbox stream: %v", err)
	}
	out, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:      streamName(prefix, "OUT"),
		Subjects:  []string{prefix + ".out.>"},
		Retention: jetstream.LimitsPolicy,
		Storage:   jetstream.FileStorage,
		MaxAge:    time.Hour,
	})
	if err != nil {
		t.Fatalf("create out stream: %v", err)
	}
	if prefix != client.DefaultPrefix {
		opts = append(opts, client.WithPrefix(prefix))
	}
	c, err := client.New(nc, opts...)
	if err != nil {
		t.Fatalf("new client: %v", err)
	}
	return &env{js: js, inbox: inbox, out: out, c: c}
}

// streamName names a stream as the engine does: the prefix upper-cased with
// dots as underscores, then the kind (TOOLBATCH_OUT for the default prefix).
func streamName(prefix, kind string) string {
	return strings.ToUpper(strings.ReplaceAll(prefix, ".", "_")) + "_" + kind
}

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// last returns the last message on subject in the inbox.
func (e *env) last(t *testing.T, ctx context.Context, subject string) *jetstream.RawStreamMsg {
	t.Helper()
	m, err := e.inbox.GetLastMsgForSubject(ctx, subject)
	if err != nil {
		t.Fatalf("last message on %s: %v", subject, err)
	}
	return m
}

// inboxMsgs returns how many messages the inbox holds.
func (e *env) inboxMsgs(t *testing.T, ctx context.Context) uint64 {
	t.Helper()
	info, err := e.inbox.Info(ctx)
	if err != nil {
		t.Fatalf("inbox info: %v", err)
	}
	return info.State.Msgs
}

// publishOut publishes v as the engine would on subject.
func (e *env) publishOut(t *testing.T, ctx context.Context, subject string, v any) uint64 {
	t.Helper()
	body, err := events.Marshal(v)
	if err != nil {
		t.Fatalf("encode %T: %v", v, err)
	}
	return e.publishRaw(t, ctx, subject, body)
}

func (e *env) publishRaw(t *testing.T, ctx context.Context, subject string, body []byte) uint64 {
	t.Helper()
	ack, err := e.js.Publish(ctx, subject, body)
	if err != nil {
		t.Fatalf("publish %s: %v", subject, err)
	}
	return ack.Sequence
}

// submission returns a batch of echo calls with the given call ids.
func submission(runID string, step int64, callIDs ...string) *protocol.Submit {
	s := &protocol.Submit{RunID: runID, ThreadID: "thread-1", Step: step,
		Assistant: events.Message{ID: "msg-1", Content: []events.ContentBlock{events.TextBlock("calling tools")}}}
	for _, id := range callIDs {
		s.Assistant.Content = append(s.Assistant.Content, events.ContentBlock{
			Type: events.BlockToolUse, ID: id, Name: "echo", Input: events.MustJSON(`{"text":"` + id + `"}`),
		})
	}
	return s
}

func ticket(reason events.WaitKind) protocol.AwaitingOut {
	return protocol.AwaitingOut{
		CorrelationID: "corr-1", RunID: "run-1", ThreadID: "thread-1", BatchID: "run-1/0",
		CallID: "call-1", ToolID: "send_mail", Arguments: events.MustJSON(`{"to":"a@example.com"}`),
		Reason: reason, SnapshotID: "snap-1", Deadline: "2030-01-01T00:00:00Z",
	}
}

func wantRefusal(t *testing.T, err error, code events.Code) {
	t.Helper()
	var r *events.Refusal
	if !errors.As(err, &r) {
		t.Fatalf("error %v: want a *events.Refusal with code %s", err, code)
	}
	if r.Code != code {
		t.Fatalf("refusal code %s (%v), want %s", r.Code, r, code)
	}
}

func TestSubmitPublishesAndDeduplicates(t *testing.T) {
	ctx := testContext(t)
	e := newEnv(t, ctx, client.DefaultPrefix)
	lim := events.DefaultLimits()

	s := submission("run-1", 3, "call-1", "call-2")
	if err := e.c.Submit(ctx, s); err != nil {
		t.Fatalf("submit: %v", err)
	}
	m := e.last(t, ctx, "toolbatch.submit.run-1")
	wantID := "run-1/3/" + s.Digest()[:16]
	if got := m.Header.Get(jetstream.MsgIDHeader); got != wantID {
		t.Fatalf("Nats-Msg-Id %q, want %q", got, wantID)
	}
	got, err := protocol.DecodeSubmit(m.Data, false, lim)
	if err != nil {
		t.Fatalf("decode published submit: %v", err)
	}
	if !reflect.DeepEqual(got, s) {
		t.Fatalf("published submit %+v, want %+v", got, s)
	}
	if got.Digest() != s.Digest() {
		t.Fatalf("published digest %s, want %s", got.Digest(), s.Digest())
	}

	// A retry of the identical submission is deduplicated, and not an error.
	if err := e.c.Submit(ctx, submission("run-1", 3, "call-1", "call-2")); err != nil {
		t.Fatalf("retried submit: %v", err)
	}
	if n := e.inboxMsgs(t, ctx); n != 1 {
		t.Fatalf("inbox holds %d messages after a retry, want 1", n)
	}
	if m2 := e.last(t, ctx, "toolbatch.submit.run-1"); m2.Sequence != m.Sequence {
		t.Fatalf("retry stored at seq %d, want the original %d", m2.Sequence, m.Sequence)
	}

	// A corrected submission of the same step is a new message.
	fixed := submission("run-1", 3, "call-1", "call-3")
	if err := e.c.Submit(ctx, fixed); err != nil {
		t.Fatalf("corrected submit: %v", err)
	}
	if n := e.inboxMsgs(t, ctx); n != 2 {
		t.Fatalf("inbox holds %d messages after a corrected submission, want 2", n)
	}
	m3 := e.last(t, ctx, "toolbatch.submit.run-1")
	if got := m3.Header.Get(jetstream.MsgIDHeader); got != "run-1/3/"+fixed.Digest()[:16] || got == wantID {
		t.Fatalf("corrected Nats-Msg-Id %q", got)
	}
}

func TestSubmitRefusedLocally(t *testing.T) {
	ctx := testContext(t)
	e := newEnv(t, ctx, client.DefaultPrefix)
	small, err := client.New(mustConn(t, e), client.WithLimits(events.Limits{MaxCalls: 1, MaxArgumentBytes: 1024, MaxOutputBytes: 1024, MaxSubmitBytes: 1 << 20, MaxBlockBytes: 1 << 20}))
	if err != nil {
		t.Fatalf("new client: %v", err)
	}

	badNarrowing := submission("run-1", 0, "call-1")
	badNarrowing.Narrowing = "everything"
	// within the client's limits, beyond what the server takes
	nc := mustConn(t, e)
	roomy, err := client.New(nc, client.WithLimits(events.Limits{MaxCalls: 8, MaxArgumentBytes: 1024, MaxOutputBytes: 1024, MaxSubmitBytes: 64 << 20, MaxBlockBytes: 64 << 20}))
	if err != nil {
		t.Fatalf("new client: %v", err)
	}
	huge := submission("run-1", 0, "call-1")
	huge.Assistant.Content = append(huge.Assistant.Content, events.TextBlock(strings.Repeat("x", int(nc.MaxPayload())+1)))
	err = roomy.Submit(ctx, huge)
	if want := fmt.Sprintf("and the NATS server takes at most %d (its max_payload)", nc.MaxPayload()); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("a submission over the server's max_payload: %v, want it to say %q", err, want)
	}

	cases := []struct {
		name string
		c    *client.Client
		s    *protocol.Submit
		code events.Code
	}{
		{"duplicate call id", e.c, submission("run-1", 0, "call-1", "call-1"), events.CodeDuplicateCallID},
		{"bad run id", e.c, submission("run.1", 0, "call-1"), events.CodeInvalidID},
		{"bad call id", e.c, submission("run-1", 0, "call/1"), events.CodeInvalidID},
		{"too many calls", small, submission("run-1", 0, "call-1", "call-2"), events.CodeLimitExceeded},
		{"bad narrowing", e.c, badNarrowing, events.CodeUndecodable},
		{"over the server's max_payload", roomy, huge, events.CodeLimitExceeded},
		{"nil", e.c, nil, events.CodeUndecodable},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			wantRefusal(t, tc.c.Submit(ctx, tc.s), tc.code)
		})
	}
	if n := e.inboxMsgs(t, ctx); n != 0 {
		t.Fatalf("inbox holds %d messages after refused submissions, want 0", n)
	}
}

// mustConn returns a second connection to e's server.
func mustConn(t *testing.T, e *env) *nats.Conn {
	t.Helper()
	return testnats.Connect(t, e.js.Conn().ConnectedUrl())
}

func TestResumePublishes(t *testing.T) {
	ctx := testContext(t)
	e := newEnv(t, ctx, client.DefaultPrefix)
	lim := events.DefaultLimits()
	perm := ticket(events.WaitPermission)

	decode := func(t *testing.T, subject string) (*protocol.Resume, string) {
		t.Helper()
		m := e.last(t, ctx, subject)
		r, err := protocol.DecodeResume(m.Data, false, lim)
		if err != nil {
			t.Fatalf("decode resume on %s: %v", subject, err)
		}
		if r.CorrelationID != perm.CorrelationID || r.RunID != perm.RunID || r.ThreadID != perm.ThreadID ||
			r.CallID != perm.CallID || r.SnapshotID != perm.SnapshotID {
			t.Fatalf("resume ids %+v do not match the ticket %+v", r, perm)
		}
		return r, m.Header.Get(jetstream.MsgIDHeader)
	}

	// Approve, attributed to a principal.
	if err := e.c.Approve(ctx, perm, "alice", "looks fine"); err != nil {
		t.Fatalf("approve: %v", err)
	}
	r, id := decode(t, "toolbatch.resume.run-1.alice")
	want := events.ResumeResult{Kind: events.ResultPermission, Allow: true, Note: "looks fine"}
	if !reflect.DeepEqual(r.Result, want) {
		t.Fatalf("approve result %+v, want %+v", r.Result, want)
	}
	if !strings.HasPrefix(id, "resume/run-1/corr-1/permission/true/") {
		t.Fatalf("approve Nats-Msg-Id %q", id)
	}
	// A retried click is deduplicated.
	before := e.inboxMsgs(t, ctx)
	if err := e.c.Approve(ctx, perm, "alice", "looks fine"); err != nil {
		t.Fatalf("retried approve: %v", err)
	}
	if n := e.inboxMsgs(t, ctx); n != before {
		t.Fatalf("inbox holds %d messages after a retried approve, want %d", n, before)
	}

	// Deny, without a principal.
	if err := e.c.Deny(ctx, perm, "", "not today"); err != nil {
		t.Fatalf("deny: %v", err)
	}
	r, id = decode(t, "toolbatch.resume.run-1")
	want = events.ResumeResult{Kind: events.ResultPermission, Allow: false, Reason: "not today"}
	if !reflect.DeepEqual(r.Result, want) {
		t.Fatalf("deny result %+v, want %+v", r.Result, want)
	}
	if !strings.HasPrefix(id, "resume/run-1/corr-1/permission/false/") {
		t.Fatalf("deny Nats-Msg-Id %q", id)
	}

	// A client tool's result; the ticket's call id fills an empty one.
	ext := ticket(events.WaitExternalResult)
	if err := e.c.ToolResult(ctx, ext, events.Output{Content: []events.ContentBlock{events.TextBlock("sent")}}); err != nil {
		t.Fatalf("tool result: %v", err)
	}
	r, id = decode(t, "toolbatch.resume.run-1")
	if r.Result.Kind != events.ResultToolResult || r.Result.Output == nil ||
		r.Result.Output.CallID != "call-1" || r.Result.Output.Text() != "sent" || r.Result.Output.IsError {
		t.Fatalf("tool result %+v", r.Result)
	}
	if !strings.HasPrefix(id, "resume/run-1/corr-1/tool_result/false/") {
		t.Fatalf("tool result Nats-Msg-Id %q", id)
	}

	// Delegation input.
	if err := e.c.Input(ctx, ticket(events.WaitDelegation), "more please"); err != nil {
		t.Fatalf("input: %v", err)
	}
	r, _ = decode(t, "toolbatch.resume.run-1")
	if r.Result.Kind != events.ResultInput || r.Result.Text != "more please" {
		t.Fatalf("input result %+v", r.Result)
	}

	// The general form, with another principal.
	res := &protocol.Resume{CorrelationID: "corr-1", RunID: "run-1", ThreadID: "thread-1", CallID: "call-1", SnapshotID: "snap-1",
		Result: events.ResumeResult{Kind: events.ResultPermission, Allow: true}}
	if err := e.c.Resume(ctx, res, "bob_2"); err != nil {
		t.Fatalf("resume: %v", err)
	}
	decode(t, "toolbatch.resume.run-1.bob_2")

	// Refused locally, nothing published.
	before = e.inboxMsgs(t, ctx)
	wantRefusal(t, e.c.Approve(ctx, perm, "alice.admin", ""), events.CodeInvalidID)
	wantRefusal(t, e.c.Approve(ctx, perm, "*", ""), events.CodeInvalidID)
	badRun := perm
	badRun.RunID = "run>"
	wantRefusal(t, e.c.Approve(ctx, badRun, "", ""), events.CodeInvalidID)
	wantRefusal(t, e.c.Resume(ctx, &protocol.Resume{CorrelationID: "c", RunID: "run-1", ThreadID: "t"}, ""), events.CodeUndecodable)
	big := events.TextOutput("call-1", strings.Repeat("x", events.DefaultMaxOutputBytes))
	wantRefusal(t, e.c.ToolResult(ctx, ext, big), events.CodeLimitExceeded)
	if n := e.inboxMsgs(t, ctx); n != before {
		t.Fatalf("inbox holds %d messages after refused resumes, want %d", n, before)
	}
}

func TestControlPublishes(t *testing.T) {
	ctx := testContext(t)
	e := newEnv(t, ctx, client.DefaultPrefix)

	check := func(t *testing.T, want protocol.Control, wantID string) {
		t.Helper()
		m := e.last(t, ctx, "toolbatch.control.run-1")
		got, err := protocol.DecodeControl(m.Data, false)
		if err != nil {
			t.Fatalf("decode control: %v", err)
		}
		if *got != want {
			t.Fatalf("control %+v, want %+v", *got, want)
		}
		if id := m.Header.Get(jetstream.MsgIDHeader); id != wantID {
			t.Fatalf("control Nats-Msg-Id %q, want %q", id, wantID)
		}
	}

	if err := e.c.Perform(ctx, "run-1", "corr-7"); err != nil {
		t.Fatalf("perform: %v", err)
	}
	check(t, protocol.Control{Action: protocol.ControlPerform, CorrelationID: "corr-7"}, "control/run-1/perform/corr-7")

	if err := e.c.Interrupt(ctx, "run-1", "user pressed stop"); err != nil {
		t.Fatalf("interrupt: %v", err)
	}
	check(t, protocol.Control{Action: protocol.ControlInterrupt, Reason: "user pressed stop"}, "control/run-1/interrupt/")

	if err := e.c.Cancel(ctx, "run-1", "no longer needed"); err != nil {
		t.Fatalf("cancel: %v", err)
	}
	check(t, protocol.Control{Action: protocol.ControlCancel, Reason: "no longer needed"}, "control/run-1/cancel/")

	// A retried cancel is deduplicated.
	before := e.inboxMsgs(t, ctx)
	if err := e.c.Cancel(ctx, "run-1", "no longer needed"); err != nil {
		t.Fatalf("retried cancel: %v", err)
	}
	if n := e.inboxMsgs(t, ctx); n != before {
		t.Fatalf("inbox holds %d messages after a retried cancel, want %d", n, before)
	}

	// Refused locally, nothing published.
	wantRefusal(t, e.c.Perform(ctx, "run-1", ""), events.CodeUndecodable)
	wantRefusal(t, e.c.Cancel(ctx, "run 1", ""), events.CodeInvalidID)
	if n := e.inboxMsgs(t, ctx); n != before {
		t.Fatalf("inbox holds %d messages after refused controls, want %d", n, before)
	}
}

func TestStreamNamesForDefaultPrefix(t *testing.T) {
	if got := streamName(client.DefaultPrefix, "INBOX"); got != client.StreamInbox {
		t.Fatalf("inbox stream %s, want %s", got, client.StreamInbox)
	}
	if got := streamName(client.DefaultPrefix, "OUT"); got != client.StreamOut {
		t.Fatalf("out stream %s, want %s", got, client.StreamOut)
	}
}

func TestPrefix(t *testing.T) {
	ctx := testContext(t)
	e := newEnv(t, ctx, "acme.tb") // streams ACME_TB_INBOX and ACME_TB_OUT
	if err := e.c.Submit(ctx, submission("run-1", 0, "call-1")); err != nil {
		t.Fatalf("submit: %v", err)
	}
	e.last(t, ctx, "acme.tb.submit.run-1")
	if err := e.c.Cancel(ctx, "run-1", ""); err != nil {
		t.Fatalf("cancel: %v", err)
	}
	e.last(t, ctx, "acme.tb.control.run-1")
	if err := e.c.Approve(ctx, ticket(events.WaitPermission), "alice", ""); err != nil {
		t.Fatalf("approve: %v", err)
	}
	e.last(t, ctx, "acme.tb.resume.run-1.alice")

	e.publishOut(t, ctx, "acme.tb.out.run-1.results", &protocol.ResultsOut{BatchID: "run-1/0"})
	res, err := e.c.WaitResults(ctx, "run-1", "run-1/0")
	if err != nil || res.BatchID != "run-1/0" {
		t.Fatalf("wait results with a prefix: %+v, %v", res, err)
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	ctx := testContext(t)
	e := newEnv(t, ctx, client.DefaultPrefix)
	nc := e.js.Conn()
	cases := []struct {
		name string
		nc   *nats.Conn
		opts []client.Option
	}{
		{"nil connection", nil, nil},
		{"empty prefix", nc, []client.Option{client.WithPrefix("")}},
		{"wildcard prefix", nc, []client.Option{client.WithPrefix("toolbatch.>")}},
		{"empty token", nc, []client.Option{client.WithPrefix("a..b")}},
		{"zero limits", nc, []client.Option{client.WithLimits(events.Limits{})}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := client.New(tc.nc, tc.opts...)
			if !errors.Is(err, client.ErrConfig) || c != nil {
				t.Fatalf("New: %v, %v; want ErrConfig", c, err)
			}
		})
	}
}

func TestWatchDecodesEveryKind(t *testing.T) {
	ctx := testContext(t)
	e := newEnv(t, ctx, client.DefaultPrefix)

	disp := &protocol.DispositionOut{BatchID: "run-1/0", CallID: "call-1", ToolID: "echo",
		Disposition: events.DispositionExecuted, Phase: events.PhaseCompleted, Attempt: 1}
	await := func() *protocol.AwaitingOut { a := ticket(events.WaitPermission); return &a }()
	results := &protocol.ResultsOut{BatchID: "run-1/0", Step: 0,
		Results: []events.ContentBlock{events.TextOutput("call-1", `{"text":"hi"}`).ToolResultBlock()},
		State: []events.Command{{Scope: events.ScopeRun, Key: "k", Merge: events.MergeDisjoint,
			Action: events.ActionSet, Value: events.MustJSON(`{"a":1}`)}}}
	rejected := &protocol.RejectedOut{BatchID: "run-1/1", Code: events.CodeBatchOpen, Reason: "batch run-1/0 is open"}
	refused := &protocol.RefusedOut{CorrelationID: "corr-1", Code: events.CodeExpired, Reason: "too late"}
	ended := &protocol.EndedOut{Cause: events.EndCancelled, Reason: "bye"}

	// Before the watch starts: these must not be missed.
	e.publishOut(t, ctx, "toolbatch.out.run-1.disposition", disp)
	e.publishOut(t, ctx, "toolbatch.out.run-2.results", &protocol.ResultsOut{BatchID: "run-2/0"}) // another run
	e.publishOut(t, ctx, "toolbatch.out.run-1.awaiting", await)

	w, err := e.c.Watch(ctx, "run-1")
	if err != nil {
		t.Fatalf("watch: %v", err)
	}
	defer w.Stop()

	// After it started.
	e.publishOut(t, ctx, "toolbatch.out.run-1.results", results)
	e.publishOut(t, ctx, "toolbatch.out.run-1.rejected", rejected)
	e.publishOut(t, ctx, "toolbatch.out.run-1.refused", refused)
	last := e.publishOut(t, ctx, "toolbatch.out.run-1.ended", ended)

	want := []client.Message{
		{Kind: client.KindDisposition, Subject: "toolbatch.out.run-1.disposition", Disposition: disp},
		{Kind: client.KindAwaiting, Subject: "toolbatch.out.run-1.awaiting", Awaiting: await},
		{Kind: client.KindResults, Subject: "toolbatch.out.run-1.results", Results: results},
		{Kind: client.KindRejected, Subject: "toolbatch.out.run-1.rejected", Rejected: rejected},
		{Kind: client.KindRefused, Subject: "toolbatch.out.run-1.refused", Refused: refused},
		{Kind: client.KindEnded, Subject: "toolbatch.out.run-1.ended", Ended: ended},
	}
	var prev uint64
	for i, wm := range want {
		got, err := w.Next(ctx)
		if err != nil {
			t.Fatalf("next %d: %v", i, err)
		}
		if got.Seq <= prev {
			t.Fatalf("message %d: seq %d not after %d", i, got.Seq, prev)
		}
		prev = got.Seq
		wm.Seq, wm.Pending = got.Seq, got.Pending
		if !reflect.DeepEqual(got, wm) {
			t.Fatalf("message %d:\n got %+v\nwant %+v", i, got, wm)
		}
	}
	if prev != last {
		t.Fatalf("last seq %d, want %d", prev, last)
	}

	// Nothing more: Next waits until its context is done.
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if m, err := w.Next(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("next with nothing left: %+v, %v; want deadline exceeded", m, err)
	}

	w.Stop()
	if _, err := w.Next(ctx); !errors.Is(err, client.ErrWatchStopped) {
		t.Fatalf("next after stop: %v, want ErrWatchStopped", err)
	}
}

func TestWatchReportsUndecodable(t *testing.T) {
	ctx := testContext(t)
	e := newEnv(t, ctx, client.DefaultPrefix)

	bad := []struct{ subject, body string }{
		{"toolbatch.out.run-1.results", "not msgpack at all"},
		{"toolbatch.out.run-1.disposition", "\xc1"}, // never-used msgpack byte
		{"toolbatch.out.run-1.ended", "\x80"},       // an empty map: no cause
		{"toolbatch.out.run-1.mystery", "\x80"},     // unknown kind
		{"toolbatch.out.run-1.results.extra", "\x80"},
	}
	for _, b := range bad {
		e.publishRaw(t, ctx, b.subject, []byte(b.body))
	}
	good := &protocol.ResultsOut{BatchID: "run-1/0"}
	e.publishOut(t, ctx, "toolbatch.out.run-1.results", good)

	w, err := e.c.Watch(ctx, "run-1")
	if err != nil {
		t.Fatalf("watch: %v", err)
	}
	defer w.Stop()
	for _, b := range bad {
		m, err := w.Next(ctx)
		if !errors.Is(err, client.ErrUndecodable) {
			t.Fatalf("next on %s: %+v, %v; want ErrUndecodable", b.subject, m, err)
		}
		var de *client.DecodeError
		if !errors.As(err, &de) || de.Subject != b.subject || de.Seq == 0 {
			t.Fatalf("error %v: want a *DecodeError for %s with its seq", err, b.subject)
		}
		if !strings.Contains(err.Error(), b.subject) {
			t.Fatalf("error %q does not name the subject %s", err, b.subject)
		}
	}
	// The watch goes on.
	m, err := w.Next(ctx)
	if err != nil || m.Results == nil || m.Results.BatchID != "run-1/0" {
		t.Fatalf("next after undecodable messages: %+v, %v", m, err)
	}

	// WaitResults does not skip an undecodable message either.
	if _, err := e.c.WaitResults(ctx, "run-1", "run-1/9"); !errors.Is(err, client.ErrUndecodable) {
		t.Fatalf("wait results over an undecodable message: %v, want ErrUndecodable", err)
	}
}

func TestWaitResults(t *testing.T) {
	ctx := testContext(t)
	e := newEnv(t, ctx, client.DefaultPrefix)

	e.publishOut(t, ctx, "toolbatch.out.run-1.results", &protocol.ResultsOut{BatchID: "run-1/0", Step: 0})
	e.publishOut(t, ctx, "toolbatch.out.run-1.disposition", &protocol.DispositionOut{BatchID: "run-1/1", CallID: "c"})
	e.publishOut(t, ctx, "toolbatch.out.run-1.rejected", &protocol.RejectedOut{BatchID: "run-1/2", Code: events.CodeBatchOpen})
	e.publishOut(t, ctx, "toolbatch.out.run-1.rejected", &protocol.RejectedOut{Code: events.CodeUndecodable}) // names no batch
	want := &protocol.ResultsOut{BatchID: "run-1/1", Step: 1,
		Results: []events.ContentBlock{events.TextOutput("call-1", "one").ToolResultBlock()}}
	e.publishOut(t, ctx, "toolbatch.out.run-1.results", want)

	got, err := e.c.WaitResults(ctx, "run-1", "run-1/1")
	if err != nil {
		t.Fatalf("wait results: %v", err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("results %+v, want %+v", got, want)
	}

	// Waiting before the results exist.
	type answer struct {
		res *protocol.ResultsOut
		err error
	}
	done := make(chan answer, 1)
	go func() {
		res, err := e.c.WaitResults(ctx, "run-1", "run-1/3")
		done <- answer{res, err}
	}()
	e.publishOut(t, ctx, "toolbatch.out.run-1.results", &protocol.ResultsOut{BatchID: "run-1/3", Step: 3})
	a := <-done
	if a.err != nil || a.res.BatchID != "run-1/3" || a.res.Step != 3 {
		t.Fatalf("wait results published later: %+v, %v", a.res, a.err)
	}
}

func TestWaitResultsRejected(t *testing.T) {
	ctx := testContext(t)
	e := newEnv(t, ctx, client.DefaultPrefix)

	e.publishOut(t, ctx, "toolbatch.out.run-1.results", &protocol.ResultsOut{BatchID: "run-1/0"})
	e.publishOut(t, ctx, "toolbatch.out.run-1.rejected",
		&protocol.RejectedOut{BatchID: "run-1/1", Code: events.CodeStepNotAfterLast, Reason: "step 1 is not after 4"})

	res, err := e.c.WaitResults(ctx, "run-1", "run-1/1")
	if res != nil || !errors.Is(err, client.ErrRejected) {
		t.Fatalf("wait results of a rejected batch: %+v, %v; want ErrRejected", res, err)
	}
	var r *events.Refusal
	if !errors.As(err, &r) || r.Code != events.CodeStepNotAfterLast || r.Reason != "step 1 is not after 4" {
		t.Fatalf("error %v: want the refusal step_not_after_last with its reason", err)
	}

	// A step rejected once and accepted later: the results win.
	e.publishOut(t, ctx, "toolbatch.out.run-1.rejected", &protocol.RejectedOut{BatchID: "run-1/2", Code: events.CodeBatchOpen})
	e.publishOut(t, ctx, "toolbatch.out.run-1.results", &protocol.ResultsOut{BatchID: "run-1/2", Step: 2})
	res, err = e.c.WaitResults(ctx, "run-1", "run-1/2")
	if err != nil || res.BatchID != "run-1/2" {
		t.Fatalf("wait results of a resubmitted step: %+v, %v", res, err)
	}
}

func TestWaitResultsRunEnded(t *testing.T) {
	ctx := testContext(t)
	e := newEnv(t, ctx, client.DefaultPrefix)

	e.publishOut(t, ctx, "toolbatch.out.run-1.results", &protocol.ResultsOut{BatchID: "run-1/0"})
	e.publishOut(t, ctx, "toolbatch.out.run-1.ended", &protocol.EndedOut{Cause: events.EndInterrupted, Reason: "stop"})

	res, err := e.c.WaitResults(ctx, "run-1", "run-1/1")
	if res != nil || !errors.Is(err, client.ErrRunEnded) {
		t.Fatalf("wait results of an ended run: %+v, %v; want ErrRunEnded", res, err)
	}
	var ee *client.EndedError
	if !errors.As(err, &ee) || ee.Ended.Cause != events.EndInterrupted || ee.RunID != "run-1" {
		t.Fatalf("error %v: want an *EndedError with cause interrupted", err)
	}

	// Results published before the end are still found.
	res, err = e.c.WaitResults(ctx, "run-1", "run-1/0")
	if err != nil || res.BatchID != "run-1/0" {
		t.Fatalf("wait results before the end: %+v, %v", res, err)
	}
}

func TestInfrastructureFailures(t *testing.T) {
	ctx := testContext(t)
	e := newEnv(t, ctx, client.DefaultPrefix)
	for _, name := range []string{client.StreamInbox, client.StreamOut} {
		if err := e.js.DeleteStream(ctx, name); err != nil {
			t.Fatalf("delete stream %s: %v", name, err)
		}
	}
	// A client never creates the engine's streams: without them, commands
	// and watches fail with an infrastructure error, not a refusal.
	err := e.c.Submit(ctx, submission("run-1", 0, "call-1"))
	if !errors.Is(err, client.ErrPublish) || !strings.Contains(err.Error(), "toolbatch.submit.run-1") {
		t.Fatalf("submit without an inbox stream: %v, want ErrPublish naming the subject", err)
	}
	if _, ok := events.CodeOf(err); ok {
		t.Fatalf("submit without an inbox stream: %v is a refusal", err)
	}
	if _, err := e.c.Watch(ctx, "run-1"); !errors.Is(err, client.ErrWatch) {
		t.Fatalf("watch without an out stream: %v, want ErrWatch", err)
	}
	_, err = e.c.Watch(ctx, "run.1")
	wantRefusal(t, err, events.CodeInvalidID)
}
