package engine_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/toolbatch/toolbatch/catalog"
	"github.com/toolbatch/toolbatch/client"
	"github.com/toolbatch/toolbatch/engine"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/internal/testnats"
	"github.com/toolbatch/toolbatch/internal/testwait"
	"github.com/toolbatch/toolbatch/protocol"
)

// runningEngine is an engine serving in the background.
type runningEngine struct {
	stop func()
	done chan error
	once sync.Once
}

func startEngine(t *testing.T, url string, cfg engine.Config) *runningEngine {
	t.Helper()
	nc := testnats.Connect(t, url)
	if cfg.AckWait == 0 {
		cfg.AckWait = 2 * time.Second
	}
	if cfg.InboxAckWait == 0 {
		cfg.InboxAckWait = cfg.AckWait
	}
	if testing.Verbose() {
		cfg.Logger = zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.DebugLevel)
	}
	e, err := engine.New(nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	re := &runningEngine{stop: cancel, done: make(chan error, 1)}
	go func() { re.done <- e.Run(ctx) }()
	t.Cleanup(func() { re.shutdown(t) })
	select {
	case <-e.Ready():
	case err := <-re.done:
		t.Fatalf("engine stopped before it was ready: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("engine not ready")
	}
	return re
}

func (re *runningEngine) shutdown(t *testing.T) {
	re.once.Do(func() {
		re.stop()
		select {
		case err := <-re.done:
			if err != nil {
				t.Errorf("engine: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Error("engine did not stop")
		}
	})
}

func newClient(t *testing.T, url string) *client.Client {
	t.Helper()
	c, err := client.New(testnats.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func submitOf(runID string, step int64, calls ...string) *protocol.Submit {
	s := &protocol.Submit{RunID: runID, ThreadID: "t1", Step: step, Assistant: events.Message{ID: "m", Content: []events.ContentBlock{events.TextBlock("let me check")}}}
	for i := 0; i+1 < len(calls); i += 2 {
		in, err := events.CanonicalJSON([]byte(calls[i+1]))
		if err != nil {
			panic(err)
		}
		s.Assistant.Content = append(s.Assistant.Content, events.ContentBlock{Type: events.BlockToolUse,
			ID: fmt.Sprintf("c%d", i/2+1), Name: calls[i], Input: in})
	}
	return s
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func resultTexts(r *protocol.ResultsOut) []string {
	var out []string
	for _, b := range r.Results {
		o := events.Output{Content: b.Content, IsError: b.IsError}
		out = append(out, b.ToolUseID+"="+events.DescribeOutput(o))
	}
	return out
}

func TestBatchOfThreeBrainCalls(t *testing.T) {
	url := testnats.Start(t, t.TempDir())
	startEngine(t, url, engine.Config{})
	c := newClient(t, url)
	ctx := ctxT(t, 30*time.Second)

	s := submitOf("run1", 1, "echo", `{"text":"one"}`, "sleep", `{"duration":"20ms"}`, "fail", `{"message":"nope"}`)
	if err := c.Submit(ctx, s); err != nil {
		t.Fatal(err)
	}
	res, err := c.WaitResults(ctx, "run1", "run1/1")
	if err != nil {
		t.Fatal(err)
	}
	got := fmt.Sprint(resultTexts(res))
	want := fmt.Sprint([]string{`c1=ok "{\"text\":\"one\"}"`, `c2=ok "slept 20ms"`, `c3=error "nope"`})
	if got != want {
		t.Fatalf("results\n got %s\nwant %s", got, want)
	}
}

func TestRefusalsWhileServingOtherRuns(t *testing.T) {
	url := testnats.Start(t, t.TempDir())
	startEngine(t, url, engine.Config{})
	c := newClient(t, url)
	nc := testnats.Connect(t, url)
	js := testnats.JetStream(t, nc)
	ctx := ctxT(t, 60*time.Second)

	// A healthy run goes on while refusals happen.
	if err := c.Submit(ctx, submitOf("good", 1, "sleep", `{"duration":"200ms"}`)); err != nil {
		t.Fatal(err)
	}

	raw := func(subject, body string) {
		t.Helper()
		m := nats.NewMsg(subject)
		m.Data = []byte(body)
		m.Header.Set("Content-Type", "application/json")
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	batch := func(run string, step int, extra string, calls string) string {
		return fmt.Sprintf(`{"run_id":%q,"thread_id":"t1","step":%d,"assistant":{"id":"m","content":[%s]}%s}`, run, step, calls, extra)
	}
	echo := `{"type":"tool_use","id":"c1","name":"echo","input":{}}`
	cases := []struct {
		run, body string
		code      events.Code
	}{
		{"r_undecodable", `{"run_id":`, events.CodeUndecodable},
		{"r_badid", batch("r_other", 1, "", echo), events.CodeInvalidID},
		{"r_limit", batch("r_limit", 1, "", echo+strings129()), events.CodeLimitExceeded},
		{"r_dup", batch("r_dup", 1, "", echo+","+echo), events.CodeDuplicateCallID},
		{"r_forbidden", batch("r_forbidden", 1, `,"pool":"gpu"`, echo), events.CodeForbiddenField},
		{"r_unknown", batch("r_unknown", 1, `,"temperature":1`, echo), events.CodeForbiddenField},
	}
	for _, tc := range cases {
		raw("toolbatch.submit."+tc.run, tc.body)
	}
	for _, tc := range cases {
		w, err := c.Watch(ctx, tc.run)
		if err != nil {
			t.Fatal(err)
		}
		m, err := w.Next(ctx)
		w.Stop()
		if err != nil {
			t.Fatalf("%s: %v", tc.run, err)
		}
		if m.Rejected == nil || m.Rejected.Code != tc.code {
			t.Fatalf("%s: got %+v, want a rejection %s", tc.run, m, tc.code)
		}
	}

	// Step, open batch and ended run refusals.
	if err := c.Submit(ctx, submitOf("seq", 5, "sleep", `{"duration":"300ms"}`)); err != nil {
		t.Fatal(err)
	}
	if err := c.Submit(ctx, submitOf("seq", 6, "echo", `{}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitResults(ctx, "seq", "seq/6"); !isRefusal(err, events.CodeBatchOpen) {
		t.Fatalf("batch while open: %v", err)
	}
	if _, err := c.WaitResults(ctx, "seq", "seq/5"); err != nil {
		t.Fatal(err)
	}
	if err := c.Submit(ctx, submitOf("seq", 4, "echo", `{}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitResults(ctx, "seq", "seq/4"); !isRefusal(err, events.CodeStepNotAfterLast) {
		t.Fatalf("old step: %v", err)
	}
	// The rejected step 6 was not used up.
	if err := c.Submit(ctx, submitOf("seq", 6, "echo", `{"again":true}`)); err != nil {
		t.Fatal(err)
	}
	// Its results arrive after the one earlier rejection of the same step.
	w, err := c.Watch(ctx, "seq")
	if err != nil {
		t.Fatal(err)
	}
	rejections := 0
	for done := false; !done; {
		m, err := w.Next(ctx)
		if err != nil {
			t.Fatalf("step 6 after its rejection: %v", err)
		}
		switch {
		case m.Rejected != nil && m.Rejected.BatchID == "seq/6":
			rejections++
		case m.Results != nil && m.Results.BatchID == "seq/6":
			done = true
		}
	}
	w.Stop()
	if rejections != 1 {
		t.Fatalf("step 6: %d rejections before its results, want 1", rejections)
	}
	if err := c.Cancel(ctx, "seq", "done"); err != nil {
		t.Fatal(err)
	}
	waitEnded(t, ctx, c, "seq")
	if err := c.Submit(ctx, submitOf("seq", 9, "echo", `{}`)); err != nil {
		t.Fatal(err)
	}
	if code := waitRejected(t, ctx, c, "seq", "seq/9"); code != events.CodeRunEnded {
		t.Fatalf("after the end: %s", code)
	}
	if _, err := c.WaitResults(ctx, "good", "good/1"); err != nil {
		t.Fatalf("the healthy run: %v", err)
	}
}

func strings129() string {
	s := ""
	for i := 2; i <= 129; i++ {
		s += fmt.Sprintf(`,{"type":"tool_use","id":"c%d","name":"echo","input":{}}`, i)
	}
	return s
}

// waitRejected reads the run's out messages until the rejection of batchID.
func waitRejected(t *testing.T, ctx context.Context, c *client.Client, runID, batchID string) events.Code {
	t.Helper()
	m := watchRun(t, ctx, c, runID).until("waiting for the rejection of "+batchID, func(m client.Message) bool {
		if m.Results != nil && m.Results.BatchID == batchID {
			t.Fatalf("%s was accepted", batchID)
		}
		return m.Rejected != nil && m.Rejected.BatchID == batchID
	})
	return m.Rejected.Code
}

func isRefusal(err error, code events.Code) bool {
	var r *events.Refusal
	return errors.As(err, &r) && r.Code == code
}

func waitEnded(t *testing.T, ctx context.Context, c *client.Client, runID string) {
	t.Helper()
	watchRun(t, ctx, c, runID).until("waiting for the end of "+runID, func(m client.Message) bool { return m.Ended != nil })
}

// TestConfirmationThroughTheClient parks a batch on a confirmation and
// approves it; nothing is published before the approval.
func TestConfirmationThroughTheClient(t *testing.T) {
	cat := mustCatalog(t, `
tools:
  - {id: echo, builtin: echo, recovery: {mode: replay_safe}}
  - {id: send_mail, builtin: echo}
gate:
  rules:
    - tools: ["send_*"]
      outcome: require_confirmation
      deadline: 10m
`)
	url := testnats.Start(t, t.TempDir())
	startEngine(t, url, engine.Config{Catalog: cat})
	c := newClient(t, url)
	ctx := ctxT(t, 30*time.Second)

	if err := c.Submit(ctx, submitOf("conf", 1, "echo", `{"a":1}`, "send_mail", `{"to":"x@example.com"}`, "echo", `{"b":2}`)); err != nil {
		t.Fatal(err)
	}
	w, err := c.Watch(ctx, "conf")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var ticket *protocol.AwaitingOut
	var disp []string
	for ticket == nil {
		m, err := w.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case m.Results != nil:
			t.Fatal("results published before the confirmation")
		case m.Disposition != nil:
			disp = append(disp, fmt.Sprintf("%s:%s:%s", m.Disposition.CallID, m.Disposition.Disposition, m.Disposition.Phase))
		case m.Awaiting != nil:
			ticket = m.Awaiting
		}
	}
	if want := "[c1:executed:completed c2:pending_builtin:awaiting c3:executed:requested]"; fmt.Sprint(disp) != want {
		t.Fatalf("dispositions at the park: %v, want %s", disp, want)
	}
	if err := c.Approve(ctx, *ticket, "alice", "ok"); err != nil {
		t.Fatal(err)
	}
	// A second click is refused as not_awaiting.
	if err := c.Approve(ctx, *ticket, "bob", "again"); err != nil {
		t.Fatal(err)
	}
	var results *protocol.ResultsOut
	refused := false
	for results == nil || !refused {
		m, err := w.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if m.Results != nil {
			results = m.Results
		}
		if m.Refused != nil {
			if m.Refused.Code != events.CodeNotAwaiting {
				t.Fatalf("second approval refused with %s", m.Refused.Code)
			}
			refused = true
		}
	}
	if got := fmt.Sprint(resultTexts(results)); got != `[c1=ok "{\"a\":1}" c2=ok "{\"to\":\"x@example.com\"}" c3=ok "{\"b\":2}"]` {
		t.Fatalf("results: %s", got)
	}
}

// TestUpgradeDrainsTheEarlierProjector starts an engine over a log that
// an earlier version left: its durable projector consumer holds every
// commit (as if its progress were lost, long after the duplicate window),
// and the last commit, of run r7, was never projected. The engine projects
// what the consumer holds before it serves, publishing nothing twice, and
// deletes the consumer.
func TestUpgradeDrainsTheEarlierProjector(t *testing.T) {
	dir := t.TempDir()
	url := testnats.Start(t, dir)
	re := startEngine(t, url, engine.Config{})
	c := newClient(t, url)
	ctx := ctxT(t, 60*time.Second)
	for i := 1; i <= 5; i++ {
		if err := c.Submit(ctx, submitOf(fmt.Sprintf("r%d", i), 1, "echo", `{}`, "echo", `{"x":1}`)); err != nil {
			t.Fatal(err)
		}
	}
	for i := 1; i <= 5; i++ {
		if _, err := c.WaitResults(ctx, fmt.Sprintf("r%d", i), fmt.Sprintf("r%d/1", i)); err != nil {
			t.Fatal(err)
		}
	}
	re.shutdown(t)
	js := testnats.JetStream(t, testnats.Connect(t, url))
	if _, err := js.CreateOrUpdateConsumer(ctx, "TOOLBATCH_EVENTS", jetstream.ConsumerConfig{Durable: protocol.ConsumerProjector,
		AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverAllPolicy}); err != nil {
		t.Fatal(err)
	}
	engine.AppendUnprojected(t, ctx, js, "r7")

	events, err := js.Stream(ctx, "TOOLBATCH_EVENTS")
	if err != nil {
		t.Fatal(err)
	}
	info, err := events.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	startEngine(t, url, engine.Config{})
	if _, err := js.Consumer(ctx, "TOOLBATCH_EVENTS", protocol.ConsumerProjector); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Fatalf("the earlier projector's consumer after the start: %v", err)
	}
	// The state keys the earlier version wrote are as of the drain.
	state, err := js.KeyValue(ctx, "TOOLBATCH_STATE")
	if err != nil {
		t.Fatal(err)
	}
	if e, err := state.Get(ctx, protocol.StateUnstampedUntilKey); err != nil || string(e.Value()) != fmt.Sprint(info.State.LastSeq) {
		t.Fatalf("%s after the drain: %v (want %d)", protocol.StateUnstampedUntilKey, err, info.State.LastSeq)
	}
	if n := subjectCounts(t, ctx, js, "TOOLBATCH_OUT", "toolbatch.out.r7.rejected")["toolbatch.out.r7.rejected"]; n != 1 {
		t.Fatalf("run r7's rejection published %d times, want 1", n)
	}
	if err := c.Submit(ctx, submitOf("r6", 1, "echo", `{}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitResults(ctx, "r6", "r6/1"); err != nil {
		t.Fatal(err)
	}
	oneResultsEach(t, ctx, js, 6)
}

// TestTheLastCommitOfADeadEngineIsProjected: an engine appended a run's
// first commit (a rejection) and died before it published anything of
// it; its owner key still names it. The engine that takes the run (here
// the same engine started again) projects that commit before anything
// else.
func TestTheLastCommitOfADeadEngineIsProjected(t *testing.T) {
	url, ctx, js, owners := streamsOnly(t)
	engine.AppendUnprojected(t, ctx, js, "r9")
	if _, err := owners.Create(ctx, protocol.OwnerKey("r9"), []byte("e1")); err != nil {
		t.Fatal(err)
	}
	startEngine(t, url, engine.Config{ID: "e1"})
	firstOutIsTheUnprojected(t, ctx, newClient(t, url), nil)
}

// streamsOnly starts a server with the engine's streams and buckets and no
// engine, and returns its URL, a context, JetStream and the owners bucket.
func streamsOnly(t *testing.T) (string, context.Context, jetstream.JetStream, jetstream.KeyValue) {
	t.Helper()
	url := testnats.Start(t, t.TempDir())
	startEngine(t, url, engine.Config{ID: "e1"}).shutdown(t)
	ctx := ctxT(t, 30*time.Second)
	js := testnats.JetStream(t, testnats.Connect(t, url))
	owners, err := js.KeyValue(ctx, "TOOLBATCH_OWNERS")
	if err != nil {
		t.Fatal(err)
	}
	return url, ctx, js, owners
}

// firstOutIsTheUnprojected checks that run r9's first out message is the
// rejection appendUnprojected left unprojected, once then (when not nil)
// has made an engine take the run.
func firstOutIsTheUnprojected(t *testing.T, ctx context.Context, c *client.Client, then func()) {
	t.Helper()
	w, err := c.Watch(ctx, "r9")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if then != nil {
		then()
	}
	m, err := w.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if m.Rejected == nil || m.Rejected.Reason != "left unprojected" {
		t.Fatalf("run r9's first out message: %+v", m)
	}
}

// TestACommitAppendedAfterARelease: an engine paused in the middle of an
// append, whose run another engine took over and released meanwhile,
// appends late and dies before it projects. The engine that takes the
// key next finds it free, and its release marker names an earlier commit
// than the log's last: it projects that commit.
func TestACommitAppendedAfterARelease(t *testing.T) {
	url, ctx, js, owners := streamsOnly(t)
	// Another engine held the run and released it with nothing in its log
	// projected to do, as an engine releases it (a delete marker naming
	// the log's last commit then).
	rev, err := owners.Create(ctx, protocol.OwnerKey("r9"), []byte("e0"))
	if err != nil {
		t.Fatal(err)
	}
	release := nats.NewMsg("$KV.TOOLBATCH_OWNERS." + protocol.OwnerKey("r9"))
	release.Header.Set("KV-Operation", "DEL")
	release.Header.Set(protocol.HeaderProjected, "0")
	if _, err := js.PublishMsg(ctx, release, jetstream.WithExpectLastSequencePerSubject(rev)); err != nil {
		t.Fatal(err)
	}
	engine.AppendUnprojected(t, ctx, js, "r9") // the late append
	startEngine(t, url, engine.Config{ID: "e1"})
	c := newClient(t, url)
	firstOutIsTheUnprojected(t, ctx, c, func() {
		// The run's next message makes an engine take its key.
		if err := c.Submit(ctx, submitOf("r9", 2, "echo", `{}`)); err != nil {
			t.Fatal(err)
		}
	})
}

// oneResultsEach checks that runs r1 to rn each have one results message.
func oneResultsEach(t *testing.T, ctx context.Context, js jetstream.JetStream, n int) {
	t.Helper()
	for i := 1; i <= n; i++ {
		var got uint64
		for _, c := range subjectCounts(t, ctx, js, "TOOLBATCH_OUT", fmt.Sprintf("toolbatch.out.r%d.results", i)) {
			got += c
		}
		if got != 1 {
			t.Fatalf("run r%d: %d results messages, want 1", i, got)
		}
	}
}

// TestTwoEnginesShareTheRuns runs two engines against one NATS: they may
// waste work, never do wrong work: every batch gets exactly one results
// message with every call's result.
func TestTwoEnginesShareTheRuns(t *testing.T) {
	url := testnats.Start(t, t.TempDir())
	startEngine(t, url, engine.Config{})
	startEngine(t, url, engine.Config{})
	c := newClient(t, url)
	ctx := ctxT(t, 90*time.Second)
	const runs, steps = 8, 3
	var wg sync.WaitGroup
	errs := make(chan error, runs)
	for r := 0; r < runs; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			run := fmt.Sprintf("shared%d", r)
			for s := int64(1); s <= steps; s++ {
				if err := c.Submit(ctx, submitOf(run, s, "echo", fmt.Sprintf(`{"s":%d}`, s), "sleep", `{"duration":"5ms"}`, "echo", `{}`)); err != nil {
					errs <- err
					return
				}
				res, err := c.WaitResults(ctx, run, events.BatchID(run, s))
				if err != nil {
					errs <- fmt.Errorf("%s step %d: %w", run, s, err)
					return
				}
				if len(res.Results) != 3 || res.Results[0].ToolUseID != "c1" || res.Results[2].ToolUseID != "c3" {
					errs <- fmt.Errorf("%s step %d: results %v", run, s, resultTexts(res))
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	js := testnats.JetStream(t, testnats.Connect(t, url))
	results := subjectCounts(t, ctx, js, "TOOLBATCH_OUT", "toolbatch.out.*.results")
	for subj, n := range results {
		if n != steps {
			t.Fatalf("%s: %d results messages, want %d", subj, n, steps)
		}
	}
	if len(results) != runs {
		t.Fatalf("%d runs with results, want %d", len(results), runs)
	}
}

// TestHostBrainServices serves a brain tool from a host process over NATS:
// its capability comes from the registry, never from the catalog; without a
// responder nothing was dispatched and the attempt is retried, then
// completes with unavailable_before_dispatch.
func TestHostBrainServices(t *testing.T) {
	cat := mustCatalog(t, `
tools:
  - {id: lookup, recovery: {mode: replay_safe, max_attempts: 2}}
  - {id: absent, recovery: {mode: never_replay, max_attempts: 2}}
  - {id: counter, recovery: {mode: never_replay}}
gate:
  rules:
    - tools: ["lookup"]
      when: '"run.hb.count" in state && state["run.hb.count"] >= 2'
      outcome: block
      reason: enough lookups
`)
	url := testnats.Start(t, t.TempDir())
	startEngine(t, url, engine.Config{Catalog: cat})
	nc := testnats.Connect(t, url)
	c := newClient(t, url)
	ctx := ctxT(t, 30*time.Second)

	// lookup answers with its arguments; counter stages state.
	var mu sync.Mutex
	calls := map[string]int{}
	serve := func(tool string, reply func(req protocol.BrainRequest) protocol.BrainReply) {
		_, err := nc.Subscribe("toolbatch.brain."+tool, func(m *nats.Msg) {
			var req protocol.BrainRequest
			if err := events.Unmarshal(m.Data, &req); err != nil {
				t.Errorf("brain request: %v", err)
				return
			}
			mu.Lock()
			calls[tool+"/"+req.OperationID]++
			mu.Unlock()
			body, _ := events.Marshal(reply(req))
			_ = m.Respond(body)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	serve("lookup", func(req protocol.BrainRequest) protocol.BrainReply {
		o := events.TextOutput(req.CallID, "found "+string(req.Arguments))
		return protocol.BrainReply{Output: &o}
	})
	serve("counter", func(req protocol.BrainRequest) protocol.BrainReply {
		o := events.TextOutput(req.CallID, "counted")
		o.State = []events.Command{{Scope: events.ScopeRun, Key: "count", Merge: events.MergeDisjoint, Action: events.ActionSet,
			Value: events.MustJSON(fmt.Sprint(req.Attempt + 1))}}
		return protocol.BrainReply{Output: &o}
	})
	js := testnats.JetStream(t, nc)

	// Without a registry entry, lookup's capability is non_recoverable:
	// its replay_safe mode is not supported, so it is not executed.
	if err := c.Submit(ctx, submitOf("hb", 1, "lookup", `{"q":1}`, "absent", `{}`)); err != nil {
		t.Fatal(err)
	}
	res, err := c.WaitResults(ctx, "hb", "hb/1")
	if err != nil {
		t.Fatal(err)
	}
	want := `[c1=error "recovery mode replay_safe is not supported by tool lookup (capability non_recoverable)" c2=error "unavailable before dispatch: no brain service answers toolbatch.brain.absent"]`
	if got := fmt.Sprint(resultTexts(res)); got != want {
		t.Fatalf("results\n got %s\nwant %s", got, want)
	}
	// The service declares its capability in the registry.
	putKey(t, ctx, js, "TOOLBATCH_REGISTRY", "brain.lookup", "replay_safe")
	if err := c.Submit(ctx, submitOf("hb", 2, "lookup", `{"q":2}`, "counter", `{}`)); err != nil {
		t.Fatal(err)
	}
	if res, err = c.WaitResults(ctx, "hb", "hb/2"); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(resultTexts(res)); got != `[c1=ok "found {\"q\":2}" c2=ok "counted"]` {
		t.Fatalf("results: %s", got)
	}
	if fmt.Sprint(res.State) == "[]" {
		t.Fatal("no staged state published")
	}
	// The committed state (count = 2) now blocks lookup through the rule.
	if err := c.Submit(ctx, submitOf("hb", 3, "lookup", `{"q":3}`)); err != nil {
		t.Fatal(err)
	}
	if res, err = c.WaitResults(ctx, "hb", "hb/3"); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(resultTexts(res)); got != `[c1=error "blocked: enough lookups"]` {
		t.Fatalf("results: %s", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if calls["lookup/hb/1/c1"] != 0 || calls["lookup/hb/2/c1"] != 1 || calls["counter/hb/2/c2"] != 1 || calls["lookup/hb/3/c1"] != 0 {
		t.Fatalf("executor entries: %v", calls)
	}
}

// timersCatalog: send_mail asks for a confirmation with a deadline of
// wait, report is scheduled wait after its gate.
func timersCatalog(t *testing.T, wait string) *catalog.Catalog {
	t.Helper()
	return mustCatalog(t, fmt.Sprintf(`
tools:
  - {id: send_mail, builtin: echo}
  - {id: report, builtin: echo, recovery: {mode: replay_safe}}
gate:
  rules:
    - {tools: ["send_*"], outcome: require_confirmation, deadline: %s}
    - {tools: ["report"], outcome: schedule, after: %s}
`, wait, wait))
}

// TestTimersFireAlsoWhileTheEngineIsDown: a confirmation deadline and a
// scheduled action fire on their own; a deadline that passes while no
// engine runs fires when one starts again.
func TestTimersFireAlsoWhileTheEngineIsDown(t *testing.T) {
	cat := timersCatalog(t, "1s")
	url := testnats.Start(t, t.TempDir())
	re := startEngine(t, url, engine.Config{Catalog: cat})
	c := newClient(t, url)
	ctx := ctxT(t, 60*time.Second)

	if err := c.Submit(ctx, submitOf("tm", 1, "send_mail", `{}`, "report", `{"week":1}`)); err != nil {
		t.Fatal(err)
	}
	res, err := c.WaitResults(ctx, "tm", "tm/1")
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(resultTexts(res)); got != `[c1=error "blocked: confirmation timed out" c2=ok "{\"week\":1}"]` {
		t.Fatalf("results: %s", got)
	}

	// Park on a confirmation, stop the engine, let the deadline pass.
	if err := c.Submit(ctx, submitOf("tm", 2, "send_mail", `{}`)); err != nil {
		t.Fatal(err)
	}
	w, err := c.Watch(ctx, "tm")
	if err != nil {
		t.Fatal(err)
	}
	for parked := false; !parked; {
		m, err := w.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		parked = m.Awaiting != nil && m.Awaiting.BatchID == "tm/2"
	}
	w.Stop()
	re.shutdown(t)
	js := testnats.JetStream(t, testnats.Connect(t, url))
	testwait.Until(t, ctx, "the deadline fires while no engine runs", func() bool {
		// Fired timers of batch 1 were consumed; the one of batch 2 waits.
		return subjectCounts(t, ctx, js, "TOOLBATCH_TIMERS", "toolbatch.timer.fire.tm")["toolbatch.timer.fire.tm"] == 1
	})
	startEngine(t, url, engine.Config{Catalog: cat})
	if res, err = c.WaitResults(ctx, "tm", "tm/2"); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(resultTexts(res)); got != `[c1=error "blocked: confirmation timed out"]` {
		t.Fatalf("results: %s", got)
	}
}

// TestALostScheduleIsScheduledAgain: a ticket whose stored schedule is
// gone (here purged from the timers stream, as a server that lost it
// would leave it) is resolved all the same: the sweep finds its timer
// overdue and schedules it again, and counts it once.
func TestALostScheduleIsScheduledAgain(t *testing.T) {
	cat := timersCatalog(t, "3s")
	reg := prometheus.NewRegistry()
	url := testnats.Start(t, t.TempDir())
	startEngine(t, url, engine.Config{Catalog: cat, SweepEvery: 50 * time.Millisecond, OverdueAfter: 2 * time.Second, Metrics: reg})
	c := newClient(t, url)
	ctx := ctxT(t, 60*time.Second)
	js := testnats.JetStream(t, testnats.Connect(t, url))
	timers, err := js.Stream(ctx, "TOOLBATCH_TIMERS")
	if err != nil {
		t.Fatal(err)
	}

	runs := map[string]struct{ tool, want string }{
		"ls-perform": {"report", `[c1=ok "{}"]`},
		"ls-expire":  {"send_mail", `[c1=error "blocked: confirmation timed out"]`},
	}
	for run, tc := range runs {
		if err := c.Submit(ctx, submitOf(run, 1, tc.tool, `{}`)); err != nil {
			t.Fatal(err)
		}
	}
	for run := range runs {
		waitTicket(t, ctx, c, run, run+"/1")
		scheduled(t, ctx, js, run)
		// The schedule is due in 3 s: it is purged long before.
		if err := timers.Purge(ctx, jetstream.WithPurgeSubject("toolbatch.timer.at."+run+".>")); err != nil {
			t.Fatal(err)
		}
	}
	for run, tc := range runs {
		res, err := c.WaitResults(ctx, run, run+"/1")
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprint(resultTexts(res)); got != tc.want {
			t.Fatalf("%s: results %s, want %s", run, got, tc.want)
		}
	}
	if got := overdueCounts(t, reg); got != "expire=1 perform=1" {
		t.Fatalf("toolbatch_timers_overdue_total: %s, want expire=1 perform=1", got)
	}
}

// TestAFastClockFiresNoTimerEarly: an engine whose clock runs two hours
// ahead finds a timer due in an hour overdue, and schedules it again at
// its own time: the server's clock decides when it fires.
func TestAFastClockFiresNoTimerEarly(t *testing.T) {
	cat := mustCatalog(t, `
tools:
  - {id: report, builtin: echo, recovery: {mode: replay_safe}}
gate:
  rules:
    - {tools: ["report"], outcome: schedule, after: 1h}
`)
	var ahead atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) }
	reg := prometheus.NewRegistry()
	url := testnats.Start(t, t.TempDir())
	startEngine(t, url, engine.Config{Catalog: cat, Now: now, SweepEvery: 50 * time.Millisecond, Metrics: reg})
	c := newClient(t, url)
	ctx := ctxT(t, 60*time.Second)
	js := testnats.JetStream(t, testnats.Connect(t, url))

	if err := c.Submit(ctx, submitOf("fc", 1, "report", `{}`)); err != nil {
		t.Fatal(err)
	}
	ticket := waitTicket(t, ctx, c, "fc", "fc/1")
	scheduled(t, ctx, js, "fc")
	ahead.Store(int64(2 * time.Hour))
	timers, err := js.Stream(ctx, "TOOLBATCH_TIMERS")
	if err != nil {
		t.Fatal(err)
	}
	subject := "toolbatch.timer.at.fc.perform." + ticket.CorrelationID
	var sched *jetstream.RawStreamMsg
	testwait.Until(t, ctx, "the sweep schedules the timer again", func() bool {
		m, err := timers.GetLastMsgForSubject(ctx, subject)
		if err == nil && m.Header.Get(jetstream.MsgIDHeader) == "overdue/perform/"+ticket.CorrelationID {
			sched = m
		}
		return sched != nil
	})
	due, err := time.Parse(time.RFC3339Nano, ticket.Due)
	if err != nil {
		t.Fatal(err)
	}
	if want := "@at " + due.Truncate(time.Second).Add(time.Second).UTC().Format(time.RFC3339); sched.Header.Get("Nats-Schedule") != want {
		t.Fatalf("scheduled again with %q, want %q (the ticket's own time)", sched.Header.Get("Nats-Schedule"), want)
	}
	if got := overdueCounts(t, reg); got != "expire=0 perform=1" {
		t.Fatalf("toolbatch_timers_overdue_total: %s, want expire=0 perform=1", got)
	}
	kv, err := js.KeyValue(ctx, "TOOLBATCH_TICKETS")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(ctx, protocol.TicketKey("fc")); err != nil {
		t.Fatalf("the ticket is not open any more: %v", err)
	}
}

// scheduled waits until the run's ticket's schedule is stored: the
// projection sends the awaiting message before it.
func scheduled(t *testing.T, ctx context.Context, js jetstream.JetStream, runID string) {
	t.Helper()
	filter := "toolbatch.timer.at." + runID + ".>"
	testwait.Until(t, ctx, "the schedule of "+runID+"'s ticket is stored", func() bool {
		return len(subjectCounts(t, ctx, js, "TOOLBATCH_TIMERS", filter)) > 0
	})
}

// overdueCounts reads toolbatch_timers_overdue_total by action.
func overdueCounts(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		if mf.GetName() != "toolbatch_timers_overdue_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			out = append(out, fmt.Sprintf("%s=%g", m.GetLabel()[0].GetValue(), m.GetCounter().GetValue()))
		}
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

// subjectCounts returns the number of messages of each subject that
// matches filter in the stream.
func subjectCounts(t *testing.T, ctx context.Context, js jetstream.JetStream, stream, filter string) map[string]uint64 {
	t.Helper()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Subjects
}

// putKey puts value under key in the bucket.
func putKey(t *testing.T, ctx context.Context, js jetstream.JetStream, bucket, key, value string) {
	t.Helper()
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, key, []byte(value)); err != nil {
		t.Fatal(err)
	}
}

// TestDelegation: a parallel delegation batch runs its children at once and
// publishes in model order; a mixed batch runs one by one; a child that
// awaits input parks the run on a delegation ticket, input resumes it; a
// cancel delivers cancellation to the open child after the run ends.
func TestDelegation(t *testing.T) {
	cat := mustCatalog(t, `
tools:
  - {id: research, kind: delegation, parallel_completion: true}
  - {id: interview, kind: delegation}
  - {id: echo, builtin: echo, recovery: {mode: replay_safe}}
`)
	url := testnats.Start(t, t.TempDir())
	startEngine(t, url, engine.Config{Catalog: cat})
	nc := testnats.Connect(t, url)
	c := newClient(t, url)
	ctx := ctxT(t, 60*time.Second)

	var mu sync.Mutex
	inFlight, maxInFlight := 0, 0
	started := make(chan struct{}, 16)
	release := make(chan struct{})
	var cancels []string
	reply := func(m *nats.Msg, r protocol.DelegateReply) {
		body, _ := events.Marshal(r)
		_ = m.Respond(body)
	}
	// research children block until released; each request is served on
	// its own goroutine (a subscription delivers one message at a time), so
	// children can overlap.
	if _, err := nc.Subscribe("toolbatch.delegate.research", func(m *nats.Msg) {
		go func() {
			var req protocol.DelegateRequest
			if err := events.Unmarshal(m.Data, &req); err != nil {
				t.Errorf("delegate request: %v", err)
				return
			}
			mu.Lock()
			inFlight++
			maxInFlight = max(maxInFlight, inFlight)
			mu.Unlock()
			started <- struct{}{}
			<-release
			mu.Lock()
			inFlight--
			mu.Unlock()
			reply(m, protocol.DelegateReply{Status: protocol.DelegationEnded, Text: "report on " + string(req.Arguments)})
		}()
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := nc.Subscribe("toolbatch.delegate.interview", func(m *nats.Msg) {
		var req protocol.DelegateRequest
		if err := events.Unmarshal(m.Data, &req); err != nil {
			t.Errorf("delegate request: %v", err)
			return
		}
		switch req.Op {
		case protocol.DelegateStart:
			reply(m, protocol.DelegateReply{Status: protocol.DelegationAwaiting, Text: "which year?"})
		case protocol.DelegateResume:
			reply(m, protocol.DelegateReply{Status: protocol.DelegationEnded, Text: "answered with " + req.Input})
		case protocol.DelegateCancel:
			mu.Lock()
			cancels = append(cancels, req.DelegationID)
			mu.Unlock()
			reply(m, protocol.DelegateReply{Status: protocol.DelegationCanceled})
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	// Parallel: all three children start before any finishes.
	if err := c.Submit(ctx, submitOf("dp", 1, "research", `{"t":"a"}`, "research", `{"t":"b"}`, "research", `{"t":"c"}`)); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		select {
		case <-started:
		case <-ctx.Done():
			t.Fatalf("only %d children started concurrently", i)
		}
	}
	close(release)
	res, err := c.WaitResults(ctx, "dp", "dp/1")
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(resultTexts(res)); got != `[c1=ok "report on {\"t\":\"a\"}" c2=ok "report on {\"t\":\"b\"}" c3=ok "report on {\"t\":\"c\"}"]` {
		t.Fatalf("results: %s", got)
	}
	mu.Lock()
	if maxInFlight != 3 {
		t.Fatalf("parallel batch: %d children at once, want 3", maxInFlight)
	}
	maxInFlight = 0
	mu.Unlock()

	// Mixed: one by one.
	if err := c.Submit(ctx, submitOf("dm", 1, "research", `{"t":"x"}`, "echo", `{}`, "research", `{"t":"y"}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitResults(ctx, "dm", "dm/1"); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if maxInFlight != 1 {
		t.Fatalf("mixed batch: %d children at once, want 1", maxInFlight)
	}
	mu.Unlock()

	// A child awaiting input parks the parent; input resumes it.
	if err := c.Submit(ctx, submitOf("di", 1, "interview", `{}`)); err != nil {
		t.Fatal(err)
	}
	ticket := waitTicket(t, ctx, c, "di", "di/1")
	if ticket.Reason != events.WaitDelegation {
		t.Fatalf("ticket reason %s", ticket.Reason)
	}
	if err := c.Input(ctx, ticket, "2025"); err != nil {
		t.Fatal(err)
	}
	if res, err = c.WaitResults(ctx, "di", "di/1"); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(resultTexts(res)); got != `[c1=ok "answered with 2025"]` {
		t.Fatalf("results: %s", got)
	}

	// Cancel while a child waits: the run ends, then the child is cancelled.
	cancelDelegating(t, ctx, c, "dc")
	testwait.Until(t, ctx, "the child is cancelled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(cancels) == 1 && cancels[0] == "dc/1/c1"
	})
}

// cancelDelegating submits step 1 of runID, a call of the delegation tool
// interview, waits for the run to park on the child, cancels the run and
// waits for its end.
func cancelDelegating(t *testing.T, ctx context.Context, c *client.Client, runID string) {
	t.Helper()
	if err := c.Submit(ctx, submitOf(runID, 1, "interview", `{}`)); err != nil {
		t.Fatal(err)
	}
	waitTicket(t, ctx, c, runID, runID+"/1")
	if err := c.Cancel(ctx, runID, "stop"); err != nil {
		t.Fatal(err)
	}
	waitEnded(t, ctx, c, runID)
}

// TestChildCancelSurvivesRestart: the cancel of a delegated child a run
// end stopped is a stored message, not a retry loop in one engine's memory.
// The child's service refuses it while the engine that ended the run is
// up; that engine stops; another engine delivers it.
func TestChildCancelSurvivesRestart(t *testing.T) {
	cat := mustCatalog(t, `
tools:
  - {id: interview, kind: delegation}
`)
	url := testnats.Start(t, t.TempDir())
	first := startEngine(t, url, engine.Config{Catalog: cat})
	nc := testnats.Connect(t, url)
	c := newClient(t, url)
	ctx := ctxT(t, 60*time.Second)

	var mu sync.Mutex
	accept := false
	refused := 0
	var cancelled []string
	if _, err := nc.Subscribe("toolbatch.delegate.interview", func(m *nats.Msg) {
		var req protocol.DelegateRequest
		if err := events.Unmarshal(m.Data, &req); err != nil {
			t.Errorf("delegate request: %v", err)
			return
		}
		r := protocol.DelegateReply{Status: protocol.DelegationAwaiting, Text: "which year?"}
		if req.Op == protocol.DelegateCancel {
			mu.Lock()
			if accept {
				cancelled = append(cancelled, fmt.Sprintf("%s attempt %d of %s/%s", req.DelegationID, req.Attempt, req.RunID, req.CallID))
				r = protocol.DelegateReply{Status: protocol.DelegationCanceled}
			} else {
				refused++
				r = protocol.DelegateReply{Status: protocol.DelegationError, Message: "not now"}
			}
			mu.Unlock()
		}
		body, _ := events.Marshal(r)
		_ = m.Respond(body)
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	cancelDelegating(t, ctx, c, "dr")
	testwait.Until(t, ctx, "the first engine tries the cancel", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return refused > 0
	})
	first.shutdown(t)
	mu.Lock()
	accept = true
	mu.Unlock()
	startEngine(t, url, engine.Config{Catalog: cat})
	testwait.Until(t, ctx, "the second engine delivers the cancel", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(cancelled) > 0
	})
	mu.Lock()
	defer mu.Unlock()
	if cancelled[0] != "dr/1/c1 attempt 1 of dr/c1" {
		t.Fatalf("cancel: %s", cancelled[0])
	}
}

func waitTicket(t *testing.T, ctx context.Context, c *client.Client, runID, batchID string) protocol.AwaitingOut {
	t.Helper()
	m := watchRun(t, ctx, c, runID).until("waiting for a ticket of "+batchID, func(m client.Message) bool {
		return m.Awaiting != nil && m.Awaiting.BatchID == batchID
	})
	return *m.Awaiting
}

// TestClientWaitDeadline: a client tool's ticket expires after the
// catalog's wait_deadline, completing the call with "client result timed
// out".
func TestClientWaitDeadline(t *testing.T) {
	cat := mustCatalog(t, `
tools:
  - {id: ask_user, kind: client, wait_deadline: 1s}
`)
	url := testnats.Start(t, t.TempDir())
	startEngine(t, url, engine.Config{Catalog: cat})
	c := newClient(t, url)
	ctx := ctxT(t, 30*time.Second)
	if err := c.Submit(ctx, submitOf("cw", 1, "ask_user", `{"q":"?"}`)); err != nil {
		t.Fatal(err)
	}
	if ticket := waitTicket(t, ctx, c, "cw", "cw/1"); ticket.Deadline == "" {
		t.Fatal("the client ticket has no deadline")
	}
	res, err := c.WaitResults(ctx, "cw", "cw/1")
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(resultTexts(res)); got != `[c1=error "client result timed out"]` {
		t.Fatalf("results: %s", got)
	}
}

// TestPoisonCommitIsQuarantined: a commit the projector can never read
// (bytes without headers on a run's events subject) is skipped, with its
// run; every other run, before and after it in the stream, gets its
// results.
func TestPoisonCommitIsQuarantined(t *testing.T) {
	url := testnats.Start(t, t.TempDir())
	startEngine(t, url, engine.Config{})
	js := testnats.JetStream(t, testnats.Connect(t, url))
	c := newClient(t, url)
	ctx := ctxT(t, 30*time.Second)

	if err := c.Submit(ctx, submitOf("before", 1, "echo", `{"x":1}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitResults(ctx, "before", "before/1"); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "toolbatch.events.wedge", []byte("not a commit")); err != nil {
		t.Fatal(err)
	}
	for _, run := range []string{"after1", "after2"} {
		if err := c.Submit(ctx, submitOf(run, 1, "echo", `{"x":2}`)); err != nil {
			t.Fatal(err)
		}
		res, err := c.WaitResults(ctx, run, run+"/1")
		if err != nil {
			t.Fatalf("%s behind a poison commit: %v", run, err)
		}
		if got := fmt.Sprint(resultTexts(res)); got != `[c1=ok "{\"x\":2}"]` {
			t.Fatalf("%s: %s", run, got)
		}
	}
}

// TestSubmitSizeLimits: a content block (a text block too) or a whole
// submission beyond the engine's limits is rejected as limit_exceeded,
// naming the batch; within them it is accepted.
func TestSubmitSizeLimits(t *testing.T) {
	url := testnats.Start(t, t.TempDir())
	lim := events.DefaultLimits()
	lim.MaxBlockBytes, lim.MaxSubmitBytes = 1000, 4000
	startEngine(t, url, engine.Config{Limits: lim})
	c := newClient(t, url)
	ctx := ctxT(t, 30*time.Second)
	big := submitOf("big-block", 1, "echo", `{}`)
	big.Assistant.Content[0] = events.TextBlock(strings.Repeat("x", 1001))
	many := submitOf("big-submit", 1, "echo", `{}`)
	for range 5 {
		many.Assistant.Content = append(many.Assistant.Content, events.TextBlock(strings.Repeat("y", 900)))
	}
	fits := submitOf("fits", 1, "echo", `{}`)
	fits.Assistant.Content[0] = events.TextBlock(strings.Repeat("z", 1000))
	for _, s := range []*protocol.Submit{big, many} {
		if err := c.Submit(ctx, s); err != nil {
			t.Fatal(err)
		}
		_, err := c.WaitResults(ctx, s.RunID, s.RunID+"/1")
		var ref *events.Refusal
		if !errors.As(err, &ref) || ref.Code != events.CodeLimitExceeded {
			t.Fatalf("%s: %v, want limit_exceeded", s.RunID, err)
		}
	}
	if err := c.Submit(ctx, fits); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitResults(ctx, "fits", "fits/1"); err != nil {
		t.Fatal(err)
	}
}

// TestClientLimits: a client over its limit of runs in flight is refused
// throttled, with nothing recorded, while another client's runs go on; a
// run that ends leaves flight, and the refused batch then goes through
// when resubmitted.
func TestClientLimits(t *testing.T) {
	url := testnats.Start(t, t.TempDir())
	startEngine(t, url, engine.Config{ClientMaxRuns: 3, ClientSubmitRate: -1})
	c := newClient(t, url)
	ctx := ctxT(t, 60*time.Second)
	// Client "a" (run ids a-...): three runs busy with a long call.
	for i := 1; i <= 3; i++ {
		if err := c.Submit(ctx, submitOf(fmt.Sprintf("a-%d", i), 1, "sleep", `{"duration":"30s"}`)); err != nil {
			t.Fatal(err)
		}
	}
	over := submitOf("a-4", 1, "echo", `{"i":4}`)
	if err := c.Submit(ctx, over); err != nil {
		t.Fatal(err)
	}
	_, err := c.WaitResults(ctx, "a-4", "a-4/1")
	var ref *events.Refusal
	if !errors.As(err, &ref) || ref.Code != events.CodeThrottled {
		t.Fatalf("a-4: %v, want throttled", err)
	}
	// Client "b" is not held by a's runs.
	if err := c.Submit(ctx, submitOf("b-1", 1, "echo", `{"i":5}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitResults(ctx, "b-1", "b-1/1"); err != nil {
		t.Fatalf("b-1: %v", err)
	}
	// One of a's runs ends: a-4 goes through when resubmitted.
	if err := c.Cancel(ctx, "a-1", "enough"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitResults(ctx, "a-1", "a-1/1"); err != nil && !errors.Is(err, client.ErrRunEnded) {
		t.Fatalf("a-1 cancelled: %v", err) // its batch finalized, or its end: out of flight either way
	}
	w, err := c.Watch(ctx, "a-4")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if err := c.Resubmit(ctx, over, 1); err != nil {
		t.Fatal(err)
	}
	for {
		m, err := w.Next(ctx)
		if err != nil {
			t.Fatalf("a-4 resubmitted: %v", err)
		}
		if m.Results != nil && m.Results.BatchID == "a-4/1" {
			break
		}
	}
}

// TestClientSubmitRate: a client past its burst, at a rate that refills
// nothing within the test, is refused throttled; another client is not.
func TestClientSubmitRate(t *testing.T) {
	url := testnats.Start(t, t.TempDir())
	startEngine(t, url, engine.Config{ClientSubmitRate: 0.0001, ClientSubmitBurst: 2})
	c := newClient(t, url)
	ctx := ctxT(t, 30*time.Second)
	for i, want := range []events.Code{"", "", events.CodeThrottled} {
		run := fmt.Sprintf("r-%d", i)
		if err := c.Submit(ctx, submitOf(run, 1, "echo", `{}`)); err != nil {
			t.Fatal(err)
		}
		_, err := c.WaitResults(ctx, run, run+"/1")
		var ref *events.Refusal
		switch {
		case want == "" && err != nil:
			t.Fatalf("%s: %v", run, err)
		case want != "" && (!errors.As(err, &ref) || ref.Code != want):
			t.Fatalf("%s: %v, want %s", run, err, want)
		}
	}
	if err := c.Submit(ctx, submitOf("other-1", 1, "echo", `{}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitResults(ctx, "other-1", "other-1/1"); err != nil {
		t.Fatalf("another client: %v", err)
	}
}

// TestFloodIsThrottled: a client that floods the inbox gets its burst
// accepted and the rest refused throttled (nothing recorded for them), and
// another client's batch, published behind the flood, completes.
func TestFloodIsThrottled(t *testing.T) {
	url := testnats.Start(t, t.TempDir())
	const burst, flood = 20, 1000
	startEngine(t, url, engine.Config{ClientSubmitRate: 0.0001, ClientSubmitBurst: burst})
	nc := testnats.Connect(t, url)
	js := testnats.JetStream(t, nc)
	ctx := ctxT(t, 120*time.Second)
	var futures []jetstream.PubAckFuture
	for i := range flood {
		body, err := events.Marshal(submitOf(fmt.Sprintf("flood-%d", i), 1, "echo", `{}`))
		if err != nil {
			t.Fatal(err)
		}
		f, err := js.PublishAsync(fmt.Sprintf("toolbatch.submit.flood-%d", i), body)
		if err != nil {
			t.Fatal(err)
		}
		futures = append(futures, f)
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			t.Fatal(err)
		case <-ctx.Done():
			t.Fatal("flood not stored")
		}
	}
	c := newClient(t, url)
	if err := c.Submit(ctx, submitOf("calm-1", 1, "echo", `{"x":1}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitResults(ctx, "calm-1", "calm-1/1"); err != nil {
		t.Fatalf("a client behind the flood: %v", err)
	}
	// The flood: its burst recorded, the rest refused, each on its run's
	// throttled subject (none on the projection's rejected subject) and
	// without an event.
	out, err := js.Stream(ctx, "TOOLBATCH_OUT")
	if err != nil {
		t.Fatal(err)
	}
	var accepted, refused, rejected int
	testwait.Until(t, ctx, "every flood submission answered", func() bool {
		info, err := out.Info(ctx, jetstream.WithSubjectFilter("toolbatch.out.*.*"))
		if err != nil {
			t.Fatal(err)
		}
		accepted, refused, rejected = 0, 0, 0
		for subj := range info.State.Subjects {
			if !strings.HasPrefix(subj, "toolbatch.out.flood-") {
				continue
			}
			switch {
			case strings.HasSuffix(subj, ".results"):
				accepted++
			case strings.HasSuffix(subj, ".throttled"):
				refused++
			case strings.HasSuffix(subj, ".rejected"):
				rejected++
			}
		}
		return accepted+refused+rejected >= flood
	})
	if rejected != 0 {
		t.Fatalf("%d flood runs have rejected messages, want none: throttle refusals have a subject of their own", rejected)
	}
	ev, err := js.Stream(ctx, "TOOLBATCH_EVENTS")
	if err != nil {
		t.Fatal(err)
	}
	info, err := ev.Info(ctx, jetstream.WithSubjectFilter("toolbatch.events.*"))
	if err != nil {
		t.Fatal(err)
	}
	recorded := 0
	for subj := range info.State.Subjects {
		if strings.HasPrefix(subj, "toolbatch.events.flood-") {
			recorded++
		}
	}
	if recorded != burst {
		t.Fatalf("%d flood runs have events, want the burst's %d", recorded, burst)
	}
	m, err := out.GetLastMsgForSubject(ctx, "toolbatch.out.flood-999.throttled")
	if err != nil {
		t.Fatal(err)
	}
	var rej protocol.RejectedOut
	if err := events.Unmarshal(m.Data, &rej); err != nil || rej.Code != events.CodeThrottled || rej.BatchID != "flood-999/1" {
		t.Fatalf("the last flood submission's rejection: %+v %v", rej, err)
	}
	if src := m.Header.Get(protocol.HeaderSource); src != "" {
		t.Fatalf("a throttle refusal carries %s %q: it is derived from no commit", protocol.HeaderSource, src)
	}
	if accepted != burst || refused != flood-burst {
		t.Fatalf("%d accepted and %d throttled, want %d and %d", accepted, refused, burst, flood-burst)
	}
}

// TestAGoneOwnersRunIsTakenOver: a run whose owner key names an engine
// that is gone without a word (its presence key still there, nothing
// subscribed to its subjects: a process killed a moment ago) is taken over
// once the engine is found gone, and the submission forwarded to the gone
// engine in between comes back at once (the forward meets no responders)
// instead of after the ack wait, 10 minutes here: the batch's results
// arrive well within the test's minute.
func TestAGoneOwnersRunIsTakenOver(t *testing.T) {
	url := testnats.Start(t, t.TempDir())
	startEngine(t, url, engine.Config{AckWait: 10 * time.Minute, InboxAckWait: 10 * time.Minute})
	nc := testnats.Connect(t, url)
	js := testnats.JetStream(t, nc)
	ctx := ctxT(t, time.Minute)
	n := protocol.Names{Prefix: protocol.DefaultPrefix}
	ghost := nats.NewMsg(n.KVSubject(protocol.BucketOwners, protocol.PresenceKey("ghost")))
	ghost.Data = []byte("ghost")
	if _, err := js.PublishMsg(ctx, ghost, jetstream.WithMsgTTL(10*time.Minute)); err != nil {
		t.Fatal(err)
	}
	owners, err := js.KeyValue(ctx, n.OwnersBucket())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := owners.Create(ctx, protocol.OwnerKey("rg"), []byte("ghost")); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, url)
	if err := c.Submit(ctx, submitOf("rg", 1, "echo", `{"text":"hi"}`)); err != nil {
		t.Fatal(err)
	}
	res, err := c.WaitResults(ctx, "rg", "rg/1")
	if err != nil {
		t.Fatal(err)
	}
	if got := resultTexts(res); len(got) != 1 || !strings.Contains(got[0], "hi") {
		t.Fatalf("results %v", got)
	}
	if _, err := owners.Get(ctx, protocol.PresenceKey("ghost")); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("the gone engine's presence: %v", err)
	}
}

// TestEnginesStartTogetherOnAFreshCluster: two engines started at once
// with three replicas on a cluster that has just started (no meta leader
// yet, every stream to be created and placed) wait for it and both come
// up, then serve a batch.
func TestEnginesStartTogetherOnAFreshCluster(t *testing.T) {
	urls := testnats.StartCluster(t, t.TempDir(), 3)
	ctx := ctxT(t, 2*time.Minute)
	var engines []*engine.Engine
	for i := range 2 {
		cfg := engine.Config{Replicas: 3}
		if testing.Verbose() {
			cfg.Logger = zerolog.New(zerolog.NewTestWriter(t)).With().Int("engine", i+1).Logger().Level(zerolog.InfoLevel)
		}
		e, err := engine.New(testnats.Connect(t, urls), cfg)
		if err != nil {
			t.Fatal(err)
		}
		engines = append(engines, e)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, len(engines))
	for _, e := range engines {
		go func() { done <- e.Run(runCtx) }()
	}
	running := len(engines)
	defer func() {
		stop()
		for range running {
			if err := <-done; err != nil {
				t.Errorf("engine: %v", err)
			}
		}
	}()
	for _, e := range engines {
		select {
		case <-e.Ready():
		case err := <-done:
			running--
			t.Fatalf("an engine stopped before it was ready: %v", err)
		case <-ctx.Done():
			t.Fatal("an engine not ready within the test's time")
		}
	}
	c := newClient(t, urls)
	if err := c.Submit(ctx, submitOf("rc", 1, "echo", `{"text":"hi"}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitResults(ctx, "rc", "rc/1"); err != nil {
		t.Fatal(err)
	}
}

// TestTraceParentKeptInTheLog: a submit's well-formed traceparent is kept
// in the headers of its BatchSubmitted commit (whichever engine ends the
// batch traces it under its parent), even with tracing off here; a
// malformed one is not written into the log.
func TestTraceParentKeptInTheLog(t *testing.T) {
	url := testnats.Start(t, t.TempDir())
	startEngine(t, url, engine.Config{})
	c := newClient(t, url)
	ctx := ctxT(t, 30*time.Second)
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for run, sent := range map[string]string{"tp-ok": tp, "tp-bad": "00-" + strings.Repeat("z", 4000)} {
		if err := c.Submit(client.WithTraceParent(ctx, sent), submitOf(run, 1, "echo", `{}`)); err != nil {
			t.Fatal(err)
		}
		if _, err := c.WaitResults(ctx, run, run+"/1"); err != nil {
			t.Fatal(err)
		}
	}
	js, err := jetstream.New(testnats.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, "TOOLBATCH_EVENTS")
	if err != nil {
		t.Fatal(err)
	}
	for run, want := range map[string]string{"tp-ok": tp, "tp-bad": ""} {
		first, err := stream.GetMsg(ctx, 1, jetstream.WithGetMsgSubject("toolbatch.events."+run))
		if err != nil {
			t.Fatal(err)
		}
		if types := first.Header.Values(protocol.HeaderEvent); len(types) == 0 || types[0] != string(events.TypeBatchSubmitted) {
			t.Fatalf("%s: first commit holds %v", run, types)
		}
		if got := first.Header.Get(protocol.HeaderTraceParent); got != want {
			t.Errorf("%s: the commit's traceparent is %q, want %q", run, got, want)
		}
	}
}

// TestAnOutcomeNotRecordedIsRecordedLater: a brain call's outcome that
// arrives while the log refuses appends (here the events stream takes no
// message of a commit's size for a while) is kept and recorded once the
// log takes it: the results come, and the tool, a never_replay host
// service, was entered once.
func TestAnOutcomeNotRecordedIsRecordedLater(t *testing.T) {
	cat := mustCatalog(t, `
tools:
  - {id: charge, recovery: {mode: never_replay}}
`)
	url := testnats.Start(t, t.TempDir())
	nc := testnats.Connect(t, url)
	js := testnats.JetStream(t, nc)
	ctx := ctxT(t, 60*time.Second)
	_, logs := runLogged(t, url, cat)
	c := newClient(t, url)
	entered := make(chan *nats.Msg, 4)
	if _, err := nc.Subscribe("toolbatch.brain.charge", func(m *nats.Msg) { entered <- m }); err != nil {
		t.Fatal(err)
	}
	log, err := js.Stream(ctx, "TOOLBATCH_EVENTS")
	if err != nil {
		t.Fatal(err)
	}
	cfg := log.CachedInfo().Config
	if err := c.Submit(ctx, submitOf("oc", 1, "charge", `{"cents":5}`)); err != nil {
		t.Fatal(err)
	}
	var req *nats.Msg
	select {
	case req = <-entered:
	case <-ctx.Done():
		t.Fatal("the tool was never entered")
	}
	// The log refuses every commit now; the tool answers.
	small := cfg
	small.MaxMsgSize = 16
	if _, err := js.UpdateStream(ctx, small); err != nil {
		t.Fatal(err)
	}
	var brq protocol.BrainRequest
	if err := events.Unmarshal(req.Data, &brq); err != nil {
		t.Fatal(err)
	}
	o := events.TextOutput(brq.CallID, "charged")
	body, _ := events.Marshal(protocol.BrainReply{Output: &o})
	if err := req.Respond(body); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, ctx, "the outcome's commit refused", func() bool { return strings.Contains(logs.String(), "work failed; will retry") })
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	res, err := c.WaitResults(ctx, "oc", "oc/1")
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(resultTexts(res)); got != `[c1=ok "charged"]` {
		t.Fatalf("results: %s", got)
	}
	select {
	case again := <-entered:
		t.Fatalf("the never_replay tool was entered again: %s", again.Data)
	default:
	}
}
