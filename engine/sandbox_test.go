package engine_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/toolbatch/toolbatch/catalog"
	"github.com/toolbatch/toolbatch/engine"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/internal/testnats"
	"github.com/toolbatch/toolbatch/internal/testproc"
	"github.com/toolbatch/toolbatch/internal/testwait"
	"github.com/toolbatch/toolbatch/protocol"
)

// TestClaimsAndFencing plays a sandbox worker over raw NATS: a claim is
// granted once per attempt; an attempt whose lease runs out is dispatched
// again; the stale worker's late result is refused, recorded as
// ResultRefused, and never applied.
func TestClaimsAndFencing(t *testing.T) {
	cat := mustCatalog(t, `
tools:
  - {id: build, target: sandbox, recovery: {mode: replay_safe, max_attempts: 3}, dispatch_deadline: 20s}
`)
	url := testnats.Start(t, t.TempDir())
	// Attempt 1's lease must run out (no heartbeat), and attempt 2's must
	// outlast the three results published after its grant, under the race
	// detector on a busy machine (300 ms did not, once).
	startEngine(t, url, engine.Config{Catalog: cat, Lease: 2 * time.Second})
	nc := testnats.Connect(t, url)
	js := testnats.JetStream(t, nc)
	c := newClient(t, url)
	ctx := ctxT(t, 30*time.Second)

	// Advertise the tool as a worker does.
	putKey(t, ctx, js, "TOOLBATCH_WORKERS", "sandbox.default.build.fake", "replay_safe")
	// The engine made the pool's consumer; a worker binds to it.
	cons, err := js.Consumer(ctx, "TOOLBATCH_DISPATCH", protocol.PoolConsumer("default", "build"))
	if err != nil {
		t.Fatal(err)
	}
	next := func() protocol.Dispatch {
		t.Helper()
		m, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			t.Fatalf("no dispatch: %v", err)
		}
		_ = m.Ack()
		var d protocol.Dispatch
		if err := events.Unmarshal(m.Data(), &d); err != nil {
			t.Fatal(err)
		}
		return d
	}
	request := func(subject string, v any) protocol.ClaimReply {
		t.Helper()
		body, _ := events.Marshal(v)
		m, err := nc.Request(subject, body, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var r protocol.ClaimReply
		if err := events.Unmarshal(m.Data, &r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	result := func(d protocol.Dispatch, token, text string) {
		t.Helper()
		o := events.TextOutput(d.CallID, text)
		body, _ := events.Marshal(protocol.Result{OperationID: d.OperationID, Attempt: d.Attempt, ClaimToken: token, Output: &o})
		m := nats.NewMsg("toolbatch.result.fence")
		m.Data = body
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}

	if err := c.Submit(ctx, submitOf("fence", 1, "build", `{"x":1}`)); err != nil {
		t.Fatal(err)
	}
	d1 := next()
	if d1.Attempt != 1 || d1.OperationID != "fence/1/c1" {
		t.Fatalf("dispatch %+v", d1)
	}
	g1 := request("toolbatch.api.claim", protocol.ClaimRequest{OperationID: d1.OperationID, Attempt: 1, WorkerID: "old", Incarnation: "p1"})
	if !g1.Granted || g1.ClaimToken == "" {
		t.Fatalf("first claim: %+v", g1)
	}
	// The same worker process asks again (as when the first answer was
	// lost): the same grant.
	if g := request("toolbatch.api.claim", protocol.ClaimRequest{OperationID: d1.OperationID, Attempt: 1, WorkerID: "old", Incarnation: "p1"}); !g.Granted || g.ClaimToken != g1.ClaimToken || g.Job == nil {
		t.Fatalf("the same process's claim again: %+v (first %+v)", g, g1)
	}
	// Another process of the same worker does not get it.
	if g := request("toolbatch.api.claim", protocol.ClaimRequest{OperationID: d1.OperationID, Attempt: 1, WorkerID: "old", Incarnation: "p2"}); g.Granted || g.Reason != protocol.ReasonClaimed {
		t.Fatalf("another process's claim: %+v", g)
	}
	// The notice carries no arguments; the grant carries the job as the
	// log has it.
	if d1.Arguments != nil {
		t.Fatalf("dispatch notice carries arguments %s", d1.Arguments)
	}
	if j := g1.Job; j == nil || j.ToolID != "build" || string(j.Arguments) != `{"x":1}` || j.OperationID != d1.OperationID || j.Attempt != 1 || j.RunID != "fence" {
		t.Fatalf("granted job: %+v", g1.Job)
	}
	// The same attempt again (a redelivered dispatch) is refused.
	if g := request("toolbatch.api.claim", protocol.ClaimRequest{OperationID: d1.OperationID, Attempt: 1, WorkerID: "other"}); g.Granted || g.Reason != protocol.ReasonClaimed {
		t.Fatalf("second claim of attempt 1 granted: %+v", g)
	}
	// No heartbeat: the lease runs out and attempt 2 is dispatched.
	d2 := next()
	if d2.Attempt != 2 {
		t.Fatalf("redispatch %+v", d2)
	}
	if hb := request("toolbatch.api.heartbeat", protocol.Heartbeat{OperationID: d1.OperationID, Attempt: 1, ClaimToken: g1.ClaimToken, WorkerID: "old"}); hb.Granted {
		t.Fatalf("heartbeat of a lost claim granted: %+v", hb)
	}
	g2 := request("toolbatch.api.claim", protocol.ClaimRequest{OperationID: d2.OperationID, Attempt: 2, WorkerID: "new"})
	if !g2.Granted {
		t.Fatalf("claim of attempt 2: %+v", g2)
	}
	// A result on this run's subject naming another run's operation,
	// with this run's current token, is terminated: it reaches no run.
	forged := d2
	forged.OperationID = "other/1/c1"
	result(forged, g2.ClaimToken, "forged")
	// The old worker's late result is refused; the current one applies.
	result(d1, g1.ClaimToken, "stale")
	result(d2, g2.ClaimToken, "fresh")
	res, err := c.WaitResults(ctx, "fence", "fence/1")
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(resultTexts(res)); got != `[c1=ok "fresh"]` {
		t.Fatalf("results: %s", got)
	}
	// The refusal is on the record.
	ord, err := js.OrderedConsumer(ctx, "TOOLBATCH_EVENTS", jetstream.OrderedConsumerConfig{FilterSubjects: []string{"toolbatch.events.fence"}})
	if err != nil {
		t.Fatal(err)
	}
	var log []string
	for {
		m, err := ord.Next(jetstream.FetchMaxWait(time.Second))
		if err != nil {
			break
		}
		evs, err := events.DecodeCommit(m.Data(), m.Headers().Values(protocol.HeaderEvent))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			log = append(log, string(e.EventType()))
		}
	}
	want := "[BatchSubmitted CallGated CallExecuting CallClaimed CallExecuting CallClaimed ResultRefused CallCompleted BatchFinalized]"
	if fmt.Sprint(log) != want {
		t.Fatalf("events\n got %v\nwant %s", log, want)
	}
}

// TestDispatchRetriesThroughAServerFailure: a dispatch publish that fails
// (here the dispatch stream is gone for a while, as it is unreachable
// during an election) spends no attempt: the engine publishes again until
// the stream takes it, a worker claims it, and the call completes with the
// worker's output, although its tool has a single attempt.
func TestDispatchRetriesThroughAServerFailure(t *testing.T) {
	cat := mustCatalog(t, `
tools:
  - {id: build, target: sandbox, recovery: {mode: replay_safe, max_attempts: 1}, dispatch_deadline: 20s}
`)
	url := testnats.Start(t, t.TempDir())
	nc := testnats.Connect(t, url)
	js := testnats.JetStream(t, nc)
	ctx := ctxT(t, 60*time.Second)
	eng, logs := runLogged(t, url, cat)
	putKey(t, ctx, js, "TOOLBATCH_WORKERS", "sandbox.default.build.w", "replay_safe")
	if err := js.DeleteStream(ctx, "TOOLBATCH_DISPATCH"); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, url)
	if err := c.Submit(ctx, submitOf("rd", 1, "build", `{"x":1}`)); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, ctx, "a dispatch failed", func() bool { return strings.Contains(logs.String(), "dispatch failed") })
	// The stream is back (the engine's own setup), with the pool's consumer.
	if err := engine.EnsureStreams(ctx, js, eng.Names(), engine.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "TOOLBATCH_DISPATCH", jetstream.ConsumerConfig{Durable: protocol.PoolConsumer("default", "build"),
		FilterSubject: "toolbatch.dispatch.default.build", AckPolicy: jetstream.AckExplicitPolicy, AckWait: engine.DefaultLease, MaxDeliver: -1})
	if err != nil {
		t.Fatal(err)
	}
	m, err := cons.Next(jetstream.FetchMaxWait(20 * time.Second))
	if err != nil {
		t.Fatalf("the retried dispatch: %v", err)
	}
	var d protocol.Dispatch
	if err := events.Unmarshal(m.Data(), &d); err != nil {
		t.Fatal(err)
	}
	body, _ := events.Marshal(protocol.ClaimRequest{OperationID: d.OperationID, Attempt: d.Attempt, WorkerID: "w"})
	reply, err := nc.Request("toolbatch.api.claim", body, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var g protocol.ClaimReply
	if err := events.Unmarshal(reply.Data, &g); err != nil || !g.Granted {
		t.Fatalf("claim: %+v %v", g, err)
	}
	o := events.TextOutput(d.CallID, "built")
	body, _ = events.Marshal(protocol.Result{OperationID: d.OperationID, Attempt: d.Attempt, ClaimToken: g.ClaimToken, Output: &o})
	if _, err := js.Publish(ctx, "toolbatch.result.rd", body); err != nil {
		t.Fatal(err)
	}
	res, err := c.WaitResults(ctx, "rd", "rd/1")
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(resultTexts(res)); got != `[c1=ok "built"]` {
		t.Fatalf("results: %s", got)
	}
}

// TestUnsupportedAdvertisementIsLogged: a worker that advertises a
// capability the catalog's recovery mode of the tool cannot use is named
// in a warning when it appears (not at each renewal).
func TestUnsupportedAdvertisementIsLogged(t *testing.T) {
	cat := mustCatalog(t, `
tools:
  - {id: build, target: sandbox, recovery: {mode: replay_safe}}
`)
	url := testnats.Start(t, t.TempDir())
	js := testnats.JetStream(t, testnats.Connect(t, url))
	ctx := ctxT(t, 30*time.Second)
	_, logs := runLogged(t, url, cat)
	warnings := func(worker string) int {
		return strings.Count(logs.String(), `"worker":"`+worker+`","pool":"default","tool":"build","capability":"non_recoverable","mode":"replay_safe"`)
	}
	putKey(t, ctx, js, "TOOLBATCH_WORKERS", "sandbox.default.build.w1", "non_recoverable")
	testwait.Until(t, ctx, "a warning naming w1", func() bool { return warnings("w1") == 1 })
	putKey(t, ctx, js, "TOOLBATCH_WORKERS", "sandbox.default.build.w1", "non_recoverable") // a renewal
	putKey(t, ctx, js, "TOOLBATCH_WORKERS", "sandbox.default.build.w2", "replay_safe")     // fits: nothing
	putKey(t, ctx, js, "TOOLBATCH_WORKERS", "sandbox.default.build.w3", "non_recoverable")
	// the watch delivers in order: once w3 is warned of, w1's renewal was seen
	testwait.Until(t, ctx, "a warning naming w3", func() bool { return warnings("w3") == 1 })
	if n, n2 := warnings("w1"), strings.Count(logs.String(), `"worker":"w2"`); n != 1 || n2 != 0 {
		t.Errorf("warnings: w1 %d (want 1: a renewal is not news), w2 %d (want 0)", n, n2)
	}
}

// runLogged runs an engine with cat on url, its logs (JSON) kept.
func runLogged(t *testing.T, url string, cat *catalog.Catalog) (*engine.Engine, *testproc.Buffer) {
	t.Helper()
	logs := &testproc.Buffer{}
	eng, err := engine.New(testnats.Connect(t, url), engine.Config{Catalog: cat, Logger: zerolog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- eng.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })
	<-eng.Ready()
	return eng, logs
}

// TestResultCarriesTheNextClaim plays a sandbox worker over raw NATS on
// <prefix>.api.result: a result that offers its slot to the run's next
// call of an offered tool is committed with the worker's claim of that
// call, and the reply grants it, so no dispatch notice is sent for it; the
// same request asked again (its answer lost) is answered with the same
// grant; a call of a tool the worker did not offer is dispatched as
// usual; and each call completes once.
func TestResultCarriesTheNextClaim(t *testing.T) {
	cat := mustCatalog(t, `
tools:
  - {id: build, target: sandbox, recovery: {mode: replay_safe, max_attempts: 3}, dispatch_deadline: 20s}
  - {id: lint, target: sandbox, recovery: {mode: replay_safe, max_attempts: 3}, dispatch_deadline: 20s}
`)
	url := testnats.Start(t, t.TempDir())
	startEngine(t, url, engine.Config{Catalog: cat})
	nc := testnats.Connect(t, url)
	js := testnats.JetStream(t, nc)
	c := newClient(t, url)
	ctx := ctxT(t, 30*time.Second)
	putKey(t, ctx, js, "TOOLBATCH_WORKERS", "sandbox.default.build.w", "replay_safe")
	putKey(t, ctx, js, "TOOLBATCH_WORKERS", "sandbox.default.lint.w", "replay_safe")
	notices := func() uint64 {
		t.Helper()
		s, err := js.Stream(ctx, "TOOLBATCH_DISPATCH")
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.LastSeq
	}
	next := func(tool string) protocol.Dispatch {
		t.Helper()
		cons, err := js.Consumer(ctx, "TOOLBATCH_DISPATCH", protocol.PoolConsumer("default", tool))
		if err != nil {
			t.Fatal(err)
		}
		m, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			t.Fatalf("no dispatch of %s: %v", tool, err)
		}
		_ = m.Ack()
		var d protocol.Dispatch
		if err := events.Unmarshal(m.Data(), &d); err != nil {
			t.Fatal(err)
		}
		return d
	}
	claim := func(d protocol.Dispatch) protocol.ClaimReply {
		t.Helper()
		body, _ := events.Marshal(protocol.ClaimRequest{OperationID: d.OperationID, Attempt: d.Attempt, WorkerID: "w", Incarnation: "p1"})
		m, err := nc.Request("toolbatch.api.claim", body, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var r protocol.ClaimReply
		if err := events.Unmarshal(m.Data, &r); err != nil || !r.Granted {
			t.Fatalf("claim of %s: %+v %v", d.OperationID, r, err)
		}
		return r
	}
	report := func(g protocol.ClaimReply, text string, offer ...string) protocol.ResultReply {
		t.Helper()
		o := events.TextOutput(g.Job.CallID, text)
		req := protocol.ResultRequest{Result: protocol.Result{OperationID: g.Job.OperationID, Attempt: g.Job.Attempt, ClaimToken: g.ClaimToken, Output: &o},
			WorkerID: "w", Incarnation: "p1"}
		if len(offer) > 0 {
			req.NextPool, req.NextTools = "default", offer
		}
		body, _ := events.Marshal(req)
		m, err := nc.Request("toolbatch.api.result", body, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var r protocol.ResultReply
		if err := events.Unmarshal(m.Data, &r); err != nil || !r.Recorded {
			t.Fatalf("result of %s: %+v %v", g.Job.OperationID, r, err)
		}
		return r
	}

	if err := c.Submit(ctx, submitOf("chain", 1, "build", `{"n":1}`, "build", `{"n":2}`, "lint", `{"n":3}`)); err != nil {
		t.Fatal(err)
	}
	g1 := claim(next("build"))
	r1 := report(g1, "built 1", "build", "lint")
	g2 := r1.Next
	if g2 == nil || !g2.Granted || g2.Job == nil || g2.Job.CallID != "c2" || string(g2.Job.Arguments) != `{"n":2}` || g2.ClaimToken == "" {
		t.Fatalf("the result's reply does not grant c2: %+v", r1)
	}
	if n := notices(); n != 1 {
		t.Fatalf("%d dispatch notices after c2 was granted with c1's result, want 1", n)
	}
	// Its answer lost, the worker asks again: recorded (not refused: the
	// same result), and the grant of c2 comes again.
	again := report(g1, "built 1")
	if again.Refused != "" || again.Next == nil || again.Next.ClaimToken != g2.ClaimToken || again.Next.Job.CallID != "c2" {
		t.Fatalf("asked again: %+v, want recorded with c2's grant %s", again, g2.ClaimToken)
	}
	// The same result published on the inbox after it (the worker heard
	// nothing) is not refused either; a forged token still is.
	o1 := events.TextOutput("c1", "built 1")
	for _, token := range []string{g1.ClaimToken, "forged"} {
		body, _ := events.Marshal(protocol.Result{OperationID: g1.Job.OperationID, Attempt: 1, ClaimToken: token, Output: &o1})
		m := nats.NewMsg("toolbatch.result.chain")
		m.Data = body
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	// Taken in order: once the forged one is refused, the other was taken.
	testwait.Until(t, ctx, "the forged result refused", func() bool {
		return slices.ContainsFunc(runCommits(t, ctx, js, "chain"), func(c []string) bool { return slices.Contains(c, "ResultRefused") })
	})
	// The worker offers build only: c3 (lint) is dispatched.
	if r := report(*g2, "built 2", "build"); r.Next != nil {
		t.Fatalf("c3 granted to a worker that offered build only: %+v", r.Next)
	}
	d3 := next("lint")
	if d3.CallID != "c3" || notices() != 2 {
		t.Fatalf("dispatch %+v, %d notices", d3, notices())
	}
	report(claim(d3), "linted")
	res, err := c.WaitResults(ctx, "chain", "chain/1")
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(resultTexts(res)); got != `[c1=ok "built 1" c2=ok "built 2" c3=ok "linted"]` {
		t.Fatalf("results: %s", got)
	}
	// c2's claim is in c1's completion commit; each call completes once.
	var commits []string
	for _, ev := range runCommits(t, ctx, js, "chain") {
		commits = append(commits, strings.Join(ev, " "))
	}
	want := []string{"BatchSubmitted CallGated CallExecuting", "CallClaimed", "CallCompleted CallGated CallExecuting CallClaimed",
		"ResultRefused", "CallCompleted CallGated CallExecuting", "CallClaimed", "CallCompleted BatchFinalized"}
	if strings.Join(commits, " | ") != strings.Join(want, " | ") {
		t.Fatalf("commits\n got %q\nwant %q", commits, want)
	}
}

// runCommits reads the event types of each commit of a run's log.
func runCommits(t *testing.T, ctx context.Context, js jetstream.JetStream, runID string) [][]string {
	t.Helper()
	last := lastCommit(t, ctx, js, runID)
	ord, err := js.OrderedConsumer(ctx, "TOOLBATCH_EVENTS", jetstream.OrderedConsumerConfig{FilterSubjects: []string{"toolbatch.events." + runID}})
	if err != nil {
		t.Fatal(err)
	}
	var out [][]string
	for {
		m, err := ord.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatalf("read the log of %s: %v", runID, err)
		}
		var types []string
		for _, v := range m.Headers().Values(protocol.HeaderEvent) {
			types = append(types, v)
		}
		out = append(out, types)
		if meta, err := m.Metadata(); err != nil || meta.Sequence.Stream >= last {
			return out
		}
	}
}
