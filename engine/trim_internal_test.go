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
func setUpTrims(t *testing.T, before func(context.Context, jetstream.JetStream)) (*Engine, context.Context) {
	t.Helper()
	cat, err := catalog.Parse([]byte(`
tools:
  - {id: build, target: sandbox, recovery: {mode: replay_safe}}
  - {id: lint, target: sandbox, recovery: {mode: replay_safe}}
`))
	if err != nil {
		t.Fatal(err)
	}
	e, ctx := setUpEngineWith(t, Config{Catalog: cat}, before)
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
// after it, nor a dispatch of a tool no consumer takes. It trims the pool
// consumers there are, not only those of its engine's catalog. The
// consumers then go on from where they were.
func TestTrimRemovesOnlyWhatWasAcknowledged(t *testing.T) {
	e, ctx := setUpTrims(t, nil)
	js, n := e.js, e.names
	job := func(tool string) string { return n.Dispatch(events.DefaultPool, tool) }
	for range 4 {
		if _, err := js.Publish(ctx, n.Result("r1"), []byte("result")); err != nil {
			t.Fatal(err)
		}
	}
	// a consumer another engine's catalog made
	if _, err := js.CreateOrUpdateConsumer(ctx, n.DispatchStream(), jetstream.ConsumerConfig{
		Durable: protocol.PoolConsumer(events.DefaultPool, "extra"), FilterSubject: job("extra"), AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	for _, subject := range []string{job("build"), job("extra"), job("build"), job("gone"), job("build")} {
		if _, err := js.Publish(ctx, subject, []byte("job")); err != nil {
			t.Fatal(err)
		}
	}
	// the inbox: the first and third taken and acknowledged, the second
	// taken only, the fourth not taken; every build and extra job done
	inbox := take(t, ctx, js, n.InboxStream(), protocol.ConsumerEngine, 3, func(i int) bool { return i != 1 })
	take(t, ctx, js, n.DispatchStream(), protocol.PoolConsumer(events.DefaultPool, "build"), 3, func(int) bool { return true })
	take(t, ctx, js, n.DispatchStream(), protocol.PoolConsumer(events.DefaultPool, "extra"), 1, func(int) bool { return true })

	tr := e.newTrimmer()
	if err := tr.trim(ctx); err != nil {
		t.Fatal(err)
	}
	if got := subjects(t, ctx, js, n.DispatchStream()); len(got) != 1 || got[job("gone")] != 1 {
		t.Errorf("dispatch after the trim: %v, want only the job of the tool no consumer takes", got)
	}
	// The intake consumer has a message pending and no pull request
	// waiting: it is not trimmed (see TestTrimKeepsQueuedRedeliveries).
	if got := subjects(t, ctx, js, n.InboxStream())[n.Result("r1")]; got != 4 {
		t.Errorf("inbox with a message pending and nobody pulling: %d messages, want 4", got)
	}
	// With a pull request waiting (as the engine keeps one), it is: the
	// intake consumer then takes the fourth (the second is still in
	// progress: its ack wait is JetStream's default 30 s).
	intake, err := js.Consumer(ctx, n.InboxStream(), protocol.ConsumerEngine)
	if err != nil {
		t.Fatal(err)
	}
	next := make(chan uint64, 4)
	cc, err := intake.Consume(func(m jetstream.Msg) {
		if meta, err := m.Metadata(); err == nil {
			next <- meta.Sequence.Stream
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	testwait.Until(t, ctx, "a pull request waiting", func() bool {
		info, err := intake.Info(ctx)
		return err == nil && info.NumWaiting > 0 && info.NumAckPending == 2
	})
	if got := <-next; got != inbox[2]+1 {
		t.Errorf("the intake consumer took %d after the trim, want %d", got, inbox[2]+1)
	}
	if err := tr.trim(ctx); err != nil {
		t.Fatal(err)
	}
	if got := subjects(t, ctx, js, n.InboxStream())[n.Result("r1")]; got != 3 {
		t.Errorf("inbox after the trim: %d messages, want 3 (all but the first)", got)
	}
}

// TestTrimKeepsQueuedRedeliveries: a job given back (a negative
// acknowledgement) while no worker pulls waits in its consumer's
// redelivery queue, which a purge would empty (the job would then wait out
// its ack wait); the trim leaves such a consumer alone, and the job is the
// next one taken.
func TestTrimKeepsQueuedRedeliveries(t *testing.T) {
	e, ctx := setUpTrims(t, nil)
	js, n := e.js, e.names
	for range 3 {
		if _, err := js.Publish(ctx, n.Dispatch(events.DefaultPool, "lint"), []byte("job")); err != nil {
			t.Fatal(err)
		}
	}
	lint := protocol.PoolConsumer(events.DefaultPool, "lint")
	c, err := js.Consumer(ctx, n.DispatchStream(), lint)
	if err != nil {
		t.Fatal(err)
	}
	batch, err := c.Fetch(2, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var nacked uint64
	for m := range batch.Messages() {
		meta, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		if nacked == 0 && meta.Sequence.Stream > 1 {
			nacked = meta.Sequence.Stream
			if err := m.Nak(); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if nacked == 0 {
		t.Fatal("no job given back")
	}
	testwait.Until(t, ctx, "the negative acknowledgement", func() bool {
		info, err := c.Info(ctx)
		return err == nil && info.NumAckPending == 1 && info.AckFloor.Stream == 1
	})
	if err := e.newTrimmer().trim(ctx); err != nil {
		t.Fatal(err)
	}
	if got := subjects(t, ctx, js, n.DispatchStream())[n.Dispatch(events.DefaultPool, "lint")]; got != 3 {
		t.Errorf("lint jobs after the trim: %d, want 3 (the consumer has a redelivery queued)", got)
	}
	again, err := c.FetchNoWait(1)
	if err != nil {
		t.Fatal(err)
	}
	var got []uint64
	for m := range again.Messages() {
		meta, _ := m.Metadata()
		got = append(got, meta.Sequence.Stream)
	}
	if len(got) != 1 || got[0] != nacked {
		t.Errorf("taken after the trim: %v, want the job given back (%d) at once", got, nacked)
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
}

// TestARunningEngineTrims: a running engine trims its inbox every
// TrimEvery once the messages are acknowledged.
func TestARunningEngineTrims(t *testing.T) {
	url := testnats.Start(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e := runEngine(t, url, Config{TrimEvery: 20 * time.Millisecond})
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
