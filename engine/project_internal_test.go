package engine

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/aggregate"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/internal/testwait"
	"github.com/toolbatch/toolbatch/projector"
	"github.com/toolbatch/toolbatch/protocol"
)

// The projection's out messages are sent without the shard waiting
// (outAcks). These tests make the out stream refuse them for a while (a
// maximum message size no out message fits), as a stream without a leader
// would, and check that no commit's out message is left unsent.

// TestASecondProjectionIsWaitedFor: a commit whose out message was refused
// is projected again by settleProjection, which says the run is settled
// only once that second send is in.
func TestASecondProjectionIsWaitedFor(t *testing.T) {
	e, s, ctx, rs, l := refusedSend(t, "ra")
	a := rs.projection.acks
	if a == nil {
		t.Fatal("the out message's send is not kept")
	}
	<-a.done // refused
	if a.err == nil {
		t.Fatal("the out stream took a message larger than its maximum")
	}
	refuseOuts(t, ctx, e, false)
	if err := s.settleProjection(ctx, rs); err == nil {
		t.Fatal("settled while the commit projected again has its out message in flight")
	}
	if err := s.settleProjection(ctx, rs); err != nil { // its acksIn, or the shard's tick
		t.Fatal(err)
	}
	if rs.projection.acks != nil || rs.projection.pending() || rs.projection.seq != l.at.seq {
		t.Fatalf("settled with sends in flight %v, pending %v, projected up to %d (want %d)", rs.projection.acks != nil, rs.projection.pending(), rs.projection.seq, l.at.seq)
	}
	if n := outCount(t, ctx, e, "ra"); n != 1 {
		t.Fatalf("%d out messages of run ra, want 1", n)
	}
}

// TestAForgottenRunIsProjectedAgain: an engine that lets a run go (fenced)
// while its last commit's out message is in flight projects that commit
// again when it takes the run back (its key still naming it).
func TestAForgottenRunIsProjectedAgain(t *testing.T) {
	e, s, ctx, rs, _ := refusedSend(t, "rb")
	a := rs.projection.acks
	s.forget(rs) // the fence
	<-a.done
	refuseOuts(t, ctx, e, false)
	e.setOwned(rs, true) // taken back: the key names this engine
	loadedOnce(t, ctx, e, s, rs)
}

// TestAFreeKeyOfACachedRunVouchesForNothing: a run still cached here whose
// key is found free keeps its own account of what it projected: an
// append of unknown outcome (it landed) is projected at the next load.
func TestAFreeKeyOfACachedRunVouchesForNothing(t *testing.T) {
	e, s, ctx := projectionShard(t)
	rs := s.state("rc")
	rs.run, rs.loaded = aggregate.New("rc"), true // cached, its log empty, its key never made
	if err := s.acquire(ctx, rs); err != nil {
		t.Fatal(err)
	}
	appendUnprojected(t, ctx, e.js, "rc")                        // an append that timed out here, and landed
	rs.projection.unknown, rs.projection.unprojected = true, nil // as flush leaves it
	s.abandon(rs)
	loadedOnce(t, ctx, e, s, rs)
}

// loadedOnce loads the run and settles its projection, and checks that
// the out stream holds the run's one out message.
func loadedOnce(t *testing.T, ctx context.Context, e *Engine, s *shard, rs *runState) {
	t.Helper()
	if err := s.load(ctx, rs); err != nil {
		t.Fatal(err)
	}
	if err := s.settleProjection(ctx, rs); err != nil {
		t.Fatal(err)
	}
	if n := outCount(t, ctx, e, rs.id); n != 1 {
		t.Fatalf("%d out messages of run %s, want 1", n, rs.id)
	}
}

func projectionShard(t *testing.T) (*Engine, *shard, context.Context) {
	t.Helper()
	e, ctx := setUpEngine(t)
	s := e.shards[0]
	s.runCtx = ctx
	t.Cleanup(e.wg.Wait) // the watchers
	return e, s, ctx
}

// refusedSend appends a run's first commit, a rejection (one out
// message), as the run's owner, and projects it while the out stream
// refuses every message: its send is in flight, to be refused.
func refusedSend(t *testing.T, run string) (*Engine, *shard, context.Context, *runState, loaded) {
	t.Helper()
	e, s, ctx := projectionShard(t)
	appendUnprojected(t, ctx, e.js, run)
	l, err := e.events.load(ctx, run)
	if err != nil {
		t.Fatal(err)
	}
	rs := s.state(run)
	e.setOwned(rs, true)
	rs.run, rs.tip, rs.loaded = l.run, l.at, true
	rs.projection = projection{model: projector.Model{Run: l.beforeIt}}
	refuseOuts(t, ctx, e, true)
	if err := s.project(ctx, rs, commitToProject{seq: l.at.seq, evs: l.last, after: l.run}); err != nil {
		t.Fatal(err)
	}
	return e, s, ctx, rs, l
}

// appendUnprojected appends a run's first commit, a rejection (one out
// message), as an engine would, and projects nothing of it.
func appendUnprojected(t *testing.T, ctx context.Context, js jetstream.JetStream, run string) {
	t.Helper()
	appendFirst(t, ctx, js, run, &events.BatchRejected{RunID: run, BatchID: run + "/1", Step: 1,
		Code: events.CodeUndecodable, Reason: "left unprojected", At: time.Now().UTC()})
}

// appendFirst appends a run's first commit, as an engine would, and
// projects nothing of it.
func appendFirst(t *testing.T, ctx context.Context, js jetstream.JetStream, run string, evs ...events.Event) {
	t.Helper()
	appendAfter(t, ctx, js, run, 0, evs...)
}

// appendAfter appends a commit of evs to a run whose last commit is at
// stream sequence prev (0: none), as an engine appends.
func appendAfter(t *testing.T, ctx context.Context, js jetstream.JetStream, run string, prev uint64, evs ...events.Event) {
	t.Helper()
	body, types, err := events.EncodeCommit(evs)
	if err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(protocol.Names{Prefix: protocol.DefaultPrefix}.Events(run))
	m.Data = body
	for _, ty := range types {
		m.Header.Add(protocol.HeaderEvent, ty)
	}
	m.Header.Set(protocol.HeaderPrev, strconv.FormatUint(prev, 10))
	if _, err := js.PublishMsg(ctx, m, jetstream.WithExpectLastSequencePerSubject(prev)); err != nil {
		t.Fatal(err)
	}
}

// outCount returns how many out messages of a run the out stream holds.
func outCount(t *testing.T, ctx context.Context, e *Engine, run string) int {
	t.Helper()
	info, err := e.outStream.Info(ctx, jetstream.WithSubjectFilter(e.names.Out(run, ">")))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range info.State.Subjects {
		n += int(c)
	}
	return n
}

// refuseOuts makes the out stream refuse every message (none fits its
// maximum size), or take them again.
func refuseOuts(t *testing.T, ctx context.Context, e *Engine, refuse bool) {
	t.Helper()
	info, err := e.outStream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfg := info.Config
	cfg.MaxMsgSize = -1
	if refuse {
		cfg.MaxMsgSize = 8
	}
	if _, err := e.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
}

// TestTwoOutMessagesOnOneSubjectBothCount: a commit's two messages on a
// subject are sent at once. Here the first is refused (over the stream's
// maximum size) and the second is stored: the refusal is reported, and
// the projection made again sends the first, and not the second again
// (the subject's last message is the commit's second: the messages
// before it are each looked for).
func TestTwoOutMessagesOnOneSubjectBothCount(t *testing.T) {
	e, _, ctx := projectionShard(t)
	const run = "two-on-one"
	reason := func(n int) string { return strings.Repeat("x", n) }
	outs := []projector.Output{
		{Kind: "rejected", Rejected: &protocol.RejectedOut{BatchID: run + "/1", Code: events.CodeUndecodable, Reason: reason(2000)}},
		{Kind: "rejected", Rejected: &protocol.RejectedOut{BatchID: run + "/2", Code: events.CodeUndecodable, Reason: reason(10)}},
	}
	info, err := e.outStream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfg := info.Config
	cfg.MaxMsgSize = 1000 // the first does not fit, the second does
	if _, err := e.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	var cur outCursor
	futures, err := e.publishOuts(ctx, &cur, run, 7, outs)
	if err == nil {
		err = e.outPub.waitAcks(ctx, futures)
	}
	if err == nil {
		t.Fatal("the first message's refusal was not reported")
	}
	refuseOuts(t, ctx, e, false)
	cur = outCursor{} // what was sent is not known: read again (as project does)
	futures, err = e.publishOuts(ctx, &cur, run, 7, outs)
	if err == nil {
		err = e.outPub.waitAcks(ctx, futures)
	}
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	cons, err := e.outStream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{e.names.Out(run, ">")}})
	if err != nil {
		t.Fatal(err)
	}
	for range outCount(t, ctx, e, run) {
		m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var r protocol.RejectedOut
		if err := events.Unmarshal(m.Data(), &r); err != nil {
			t.Fatal(err)
		}
		got = append(got, r.BatchID)
	}
	if want := []string{run + "/2", run + "/1"}; !slices.Equal(got, want) {
		t.Fatalf("out messages %v, want %v", got, want)
	}
}

// TestEachOfACommitsMessagesIsLookedFor: projected again with nothing
// known, a commit whose messages on a subject were sent at once and
// stored with one missing (the stream holds its first and third, far
// apart among another run's messages, after an older commit's) sends the
// missing one only, and nothing once all are there; an older commit sends
// nothing (a later commit's message is there); a commit whose first
// message only is stored sends the other two.
func TestEachOfACommitsMessagesIsLookedFor(t *testing.T) {
	e, _, ctx := projectionShard(t)
	const run, other = "looked-for", "filler"
	subject := e.names.Out(run, "rejected")
	put := func(subject string, src aggregate.Stamp) { putStamped(t, ctx, e, subject, src) }
	fill := func(n int) {
		for i := range n {
			put(e.names.Out(other, "rejected"), aggregate.Stamp{Seq: uint64(i + 1)})
		}
	}
	fill(3)
	put(subject, aggregate.Stamp{Seq: 5, Idx: 0}) // an older commit's
	fill(150)
	put(subject, aggregate.Stamp{Seq: 7, Idx: 0})
	fill(300) // more than the first step back
	put(subject, aggregate.Stamp{Seq: 7, Idx: 2})

	outs := make([]projector.Output, 3)
	for i := range outs {
		outs[i] = projector.Output{Kind: "rejected", Rejected: &protocol.RejectedOut{BatchID: fmt.Sprintf("%s/%d", run, i), Code: events.CodeUndecodable, Reason: "r"}}
	}
	sent := func(seq uint64, outs []projector.Output) []string {
		t.Helper()
		var cur outCursor // nothing known: read from the stream
		futures, err := e.publishOuts(ctx, &cur, run, seq, outs)
		if err == nil {
			err = e.outPub.waitAcks(ctx, futures)
		}
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, f := range futures {
			got = append(got, f.subject)
		}
		return got
	}
	before := outCount(t, ctx, e, run)
	if got := sent(7, outs); len(got) != 1 {
		t.Fatalf("sent %d messages, want 1 (the missing one)", len(got))
	}
	last, err := e.outStream.GetLastMsgForSubject(ctx, subject)
	if err != nil {
		t.Fatal(err)
	}
	if src := last.Header.Get(protocol.HeaderSource); src != formatStamp(aggregate.Stamp{Seq: 7, Idx: 1}) || outCount(t, ctx, e, run) != before+1 {
		t.Fatalf("after the projection: last message %s, %d messages (want 7/1, %d)", src, outCount(t, ctx, e, run), before+1)
	}
	// Every one of them is there now: a projection made again sends
	// nothing, read from the subject's last message (now the commit's
	// second) and the ones before it.
	if got := sent(7, outs); len(got) != 0 {
		t.Fatalf("sent %v again", got)
	}
	// The older commit's message is followed by later ones: sent before.
	if got := sent(5, outs[:1]); len(got) != 0 {
		t.Fatalf("sent %v of an older commit again", got)
	}
	// A commit whose first message only is stored sends the rest.
	put(subject, aggregate.Stamp{Seq: 9, Idx: 0})
	if got := sent(9, outs); len(got) != 2 {
		t.Fatalf("sent %d messages of a commit whose first is stored, want 2", len(got))
	}
}

// TestLookingForACommitsMessagesReadsLittle: a run that published a
// thousand messages on a subject long before the commit projected again
// costs a few dozen reads, not one per message: the reads start after
// its last older message, found by probing.
func TestLookingForACommitsMessagesReadsLittle(t *testing.T) {
	e, _, ctx := projectionShard(t)
	const run = "busy-then-quiet"
	subject := e.names.Out(run, "rejected")
	put := func(subject string, src aggregate.Stamp) { putStamped(t, ctx, e, subject, src) }
	for i := range 1000 { // the run's busy past
		put(subject, aggregate.Stamp{Seq: uint64(i + 1)})
	}
	for i := range 1500 { // other runs, while this one waited
		put(e.names.Out("other", "rejected"), aggregate.Stamp{Seq: uint64(i + 1)})
	}
	put(subject, aggregate.Stamp{Seq: 5000, Idx: 0})
	put(subject, aggregate.Stamp{Seq: 5000, Idx: 2}) // its second lost
	counted := &countingStream{Stream: e.outStream}
	e.outStream = counted
	outs := make([]projector.Output, 3)
	for i := range outs {
		outs[i] = projector.Output{Kind: "rejected", Rejected: &protocol.RejectedOut{BatchID: fmt.Sprintf("%s/%d", run, i), Code: events.CodeUndecodable, Reason: "r"}}
	}
	var cur outCursor
	futures, err := e.publishOuts(ctx, &cur, run, 5000, outs)
	if err == nil {
		err = e.outPub.waitAcks(ctx, futures)
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(futures) != 1 {
		t.Fatalf("sent %d messages, want 1 (the lost one)", len(futures))
	}
	if counted.gets > 40 {
		t.Fatalf("%d reads of the out stream to find a commit's 2 messages", counted.gets)
	}
	t.Logf("%d reads", counted.gets)
}

// putStamped stores a message on an out subject as a projection would
// have, with src as its source.
func putStamped(t *testing.T, ctx context.Context, e *Engine, subject string, src aggregate.Stamp) {
	t.Helper()
	m := nats.NewMsg(subject)
	m.Data = []byte("x")
	m.Header.Set(protocol.HeaderSource, formatStamp(src))
	if _, err := e.js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
}

// countingStream counts the messages read from a stream one by one.
type countingStream struct {
	jetstream.Stream
	gets int
}

func (c *countingStream) GetMsg(ctx context.Context, seq uint64, opts ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error) {
	c.gets++
	return c.Stream.GetMsg(ctx, seq, opts...)
}

func (c *countingStream) GetLastMsgForSubject(ctx context.Context, subject string) (*jetstream.RawStreamMsg, error) {
	c.gets++
	return c.Stream.GetLastMsgForSubject(ctx, subject)
}

// TestShutdownAcknowledgesWhatASettledRunHolds: a run whose last commit's
// out messages are still in flight when the engine stops holds the inbox
// message that led to it (an approval, say). The shutdown waits for those
// out messages and then acknowledges that message, as the run's acksIn
// would have: left unacknowledged, it would be delivered again to the
// next engine and refused as already done.
func TestShutdownAcknowledgesWhatASettledRunHolds(t *testing.T) {
	e, s, ctx := projectionShard(t)
	const run = "settled-at-shutdown"
	appendUnprojected(t, ctx, e.js, run) // a rejection: the run waits for nothing
	l, err := e.events.load(ctx, run)
	if err != nil {
		t.Fatal(err)
	}
	rs := s.state(run)
	if err := s.acquire(ctx, rs); err != nil {
		t.Fatal(err)
	}
	rs.run, rs.tip, rs.loaded = l.run, l.at, true
	rs.projection = projection{model: projector.Model{Run: l.beforeIt}}
	if err := s.project(ctx, rs, commitToProject{seq: l.at.seq, evs: l.last, after: l.run}); err != nil {
		t.Fatal(err)
	}
	if rs.projection.acks == nil {
		t.Fatal("the out message's send is not kept")
	}

	// The held message: one delivered from a stream of the test's own.
	if _, err := e.js.CreateStream(ctx, jetstream.StreamConfig{Name: "HELD", Subjects: []string{"held"}}); err != nil {
		t.Fatal(err)
	}
	cons, err := e.js.CreateConsumer(ctx, "HELD", jetstream.ConsumerConfig{Durable: "held", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.js.Publish(ctx, "held", []byte("approve")); err != nil {
		t.Fatal(err)
	}
	m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	rs.held = append(rs.held, m)

	s.settleOuts() // what the shard's loop does when the engine stops
	s.releaseIdle(true)
	if len(rs.held) != 0 || rs.owned {
		t.Fatalf("after the shutdown: %d messages held, owned %v", len(rs.held), rs.owned)
	}
	testwait.Until(t, ctx, "the held message acknowledged", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 0
	})
	if n := outCount(t, ctx, e, run); n != 1 {
		t.Fatalf("%d out messages of run %s, want 1", n, run)
	}
}
