package engine

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/catalog"
	"github.com/toolbatch/toolbatch/client"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/internal/testnats"
	"github.com/toolbatch/toolbatch/internal/testwait"
	"github.com/toolbatch/toolbatch/protocol"
)

// setUpTrims returns an engine, not running, whose streams, pool
// consumers and intake consumer are set up on a fresh server, with two
// sandbox tools, build and lint.
func setUpTrims(t *testing.T, setUp func(context.Context, jetstream.JetStream)) (*Engine, context.Context) {
	t.Helper()
	nc := testnats.Connect(t, testnats.Start(t, t.TempDir()))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	if setUp != nil {
		setUp(ctx, testnats.JetStream(t, nc))
	}
	cat, err := catalog.Parse([]byte(`
tools:
  - {id: build, target: sandbox, recovery: {mode: replay_safe}}
  - {id: lint, target: sandbox, recovery: {mode: replay_safe}}
`))
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(nc, Config{Catalog: cat})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Setup(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.js.CreateOrUpdateConsumer(ctx, e.names.InboxStream(), jetstream.ConsumerConfig{
		Durable: protocol.ConsumerEngine, AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	return e, ctx
}

// take fetches n messages from a consumer and acknowledges those whose
// position (0 for the first) ack says.
func take(t *testing.T, ctx context.Context, js jetstream.JetStream, stream, consumer string, n int, ack func(int) bool) []uint64 {
	t.Helper()
	c, err := js.Consumer(ctx, stream, consumer)
	if err != nil {
		t.Fatal(err)
	}
	batch, err := c.Fetch(n, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for m := range batch.Messages() {
		meta, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		if ack(len(seqs)) {
			if err := m.DoubleAck(ctx); err != nil {
				t.Fatal(err)
			}
		}
		seqs = append(seqs, meta.Sequence.Stream)
	}
	if len(seqs) != n {
		t.Fatalf("%s: took %d messages, want %d", consumer, len(seqs), n)
	}
	return seqs
}

// subjects counts a stream's messages by subject.
func subjects(t *testing.T, ctx context.Context, js jetstream.JetStream, stream string) map[string]uint64 {
	t.Helper()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(">"))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Subjects
}

// TestTrimRemovesOnlyWhatWasAcknowledged: a trim removes the inbox and
// dispatch messages at or below their consumers' acknowledgement floors
// and nothing else: not a message taken and not acknowledged, nor any
// after it, nor a dispatch of a tool no consumer takes. The consumers
// then go on from where they were.
func TestTrimRemovesOnlyWhatWasAcknowledged(t *testing.T) {
	e, ctx := setUpTrims(t, nil)
	js, n := e.js, e.names
	job := func(tool string) string { return n.Dispatch(events.DefaultPool, tool) }
	for range 4 {
		if _, err := js.Publish(ctx, n.Result("r1"), []byte("result")); err != nil {
			t.Fatal(err)
		}
	}
	for _, subject := range []string{job("build"), job("lint"),
		job("build"), job("gone"), job("build"),
		job("lint")} {
		if _, err := js.Publish(ctx, subject, []byte("job")); err != nil {
			t.Fatal(err)
		}
	}
	// the inbox: the first and third taken and acknowledged, the second
	// taken only, the fourth not taken; every build job done
	inbox := take(t, ctx, js, n.InboxStream(), protocol.ConsumerEngine, 3, func(i int) bool { return i != 1 })
	take(t, ctx, js, n.DispatchStream(), protocol.PoolConsumer(events.DefaultPool, "build"), 3, func(int) bool { return true })

	tr := e.newTrimmer()
	if err := tr.trim(ctx); err != nil {
		t.Fatal(err)
	}
	if got := subjects(t, ctx, js, n.InboxStream())[n.Result("r1")]; got != 3 {
		t.Errorf("inbox after the trim: %d messages, want 3 (all but the first)", got)
	}
	want := map[string]uint64{job("lint"): 2, job("gone"): 1}
	if got := subjects(t, ctx, js, n.DispatchStream()); len(got) != len(want) ||
		got[job("lint")] != 2 || got[job("gone")] != 1 {
		t.Errorf("dispatch after the trim: %v, want %v", got, want)
	}

	// The intake consumer goes on with the fourth (the second is still in
	// progress: its ack wait is JetStream's default 30 s), and
	// acknowledging it leaves the floor below the second.
	if next := take(t, ctx, js, n.InboxStream(), protocol.ConsumerEngine, 1, func(int) bool { return true }); next[0] != inbox[2]+1 {
		t.Errorf("the intake consumer took %d after the trim, want %d", next[0], inbox[2]+1)
	}
	if err := tr.trim(ctx); err != nil {
		t.Fatal(err)
	}
	if got := subjects(t, ctx, js, n.InboxStream())[n.Result("r1")]; got != 3 {
		t.Errorf("inbox with the second message unacknowledged: %d messages, want 3", got)
	}
	if lint := take(t, ctx, js, n.DispatchStream(), protocol.PoolConsumer(events.DefaultPool, "lint"), 2, func(int) bool { return true }); len(lint) != 2 {
		t.Errorf("lint jobs after the trim: %v", lint)
	}
	if err := tr.trim(ctx); err != nil {
		t.Fatal(err)
	}
	if got := subjects(t, ctx, js, n.DispatchStream()); len(got) != 1 || got[job("gone")] != 1 {
		t.Errorf("dispatch once lint's jobs are done: %v, want only the job of the tool no consumer takes", got)
	}
}

// TestWorkQueuesOfAnEarlierVersionStay: an inbox and a dispatch stream
// made as work queues (by an earlier version) are kept as they are, since
// JetStream changes no stream to or from a work queue, and trimming them
// is harmless.
func TestWorkQueuesOfAnEarlierVersionStay(t *testing.T) {
	n := protocol.Names{Prefix: protocol.DefaultPrefix}
	e, ctx := setUpTrims(t, func(ctx context.Context, js jetstream.JetStream) {
		for _, cfg := range []jetstream.StreamConfig{
			{Name: n.InboxStream(), Subjects: n.StreamSubjects(protocol.StreamInbox)},
			{Name: n.DispatchStream(), Subjects: n.StreamSubjects(protocol.StreamDispatch)},
		} {
			cfg.Retention, cfg.Storage = jetstream.WorkQueuePolicy, jetstream.FileStorage
			if _, err := js.CreateStream(ctx, cfg); err != nil {
				t.Fatal(err)
			}
		}
	})
	for _, name := range []string{n.InboxStream(), n.DispatchStream()} {
		s, err := e.js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if r := s.CachedInfo().Config.Retention; r != jetstream.WorkQueuePolicy {
			t.Errorf("%s after set-up: retention %v, want the work queue it was", name, r)
		}
	}
	if _, err := e.js.Publish(ctx, n.Result("r1"), []byte("result")); err != nil {
		t.Fatal(err)
	}
	take(t, ctx, e.js, n.InboxStream(), protocol.ConsumerEngine, 1, func(int) bool { return true })
	if err := e.newTrimmer().trim(ctx); err != nil {
		t.Fatalf("trimming work queues: %v", err)
	}
	if got := subjects(t, ctx, e.js, n.InboxStream()); len(got) != 0 {
		t.Errorf("inbox: %v, want empty", got)
	}
}

// TestARunningEngineTrims: a running engine trims its inbox every
// TrimEvery once the messages are acknowledged.
func TestARunningEngineTrims(t *testing.T) {
	url := testnats.Start(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e, err := New(testnats.Connect(t, url), Config{TrimEvery: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("engine: %v", err)
		}
	}()
	nc := testnats.Connect(t, url)
	c, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s := &protocol.Submit{RunID: "tr1", ThreadID: "t1", Step: 1, Assistant: events.Message{ID: "m",
		Content: []events.ContentBlock{{Type: events.BlockToolUse, ID: "c1", Name: "echo", Input: events.MustJSON(`{"text":"hi"}`)}}}}
	if err := c.Submit(ctx, s); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitResults(ctx, "tr1", events.BatchID("tr1", 1)); err != nil {
		t.Fatal(err)
	}
	inbox, err := e.js.Stream(ctx, e.names.InboxStream())
	if err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, ctx, "the inbox trimmed", func() bool {
		info, err := inbox.Info(ctx)
		return err == nil && info.State.Msgs == 0 && info.State.LastSeq > 0
	})
}
