package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/aggregate"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/projector"
	"github.com/toolbatch/toolbatch/protocol"
)

// Projection: what a commit derives (its out messages, the run's open
// ticket in the tickets bucket, the committed state, ticket timers, cancels
// of delegated children) is published by the engine that appended the
// commit, in the run's shard, right after the append and before the run's
// next commit. So at most a run's last commit is not projected yet (its
// engine died, or could not publish), and whoever loads the run next
// projects that commit again before anything else (projectLoaded). Every
// part is idempotent: an out message carries its source and is skipped
// when its subject already holds it or a later one, a ticket is put or
// deleted, a state key carries its commands' stamps (state.go), a timer
// is a schedule of its own subject, a cancel carries a message id.
//
// A run is never released while its last commit is not projected, and
// its key's release marker names that commit, so a run whose owner key is
// free has every commit up to that one projected (a later one was
// appended late, by an engine whose run was taken over and released
// meanwhile); one taken from a dead engine, or from a previous process of
// this engine, may not.

// projection is a run's projection state in its runState.
type projection struct {
	model projector.Model // the run as of the last commit projected
	seq   uint64          // that commit's stream sequence
	// The run's last commit may be unprojected (pending) when it is kept
	// to be projected again (unprojected), its out messages are in flight
	// (acks), or an append that failed may have landed (unknown: a load
	// finds out).
	unprojected *commitToProject
	unknown     bool
	// quarantined is set when a commit could not be projected at all (the
	// projection refused its events: a defect, logged): the run gets no
	// more out messages from this engine (replay audit reports it).
	quarantined bool
	outs        outCursor
	// acks are the last commit's out messages sent and not yet known to
	// be in the out stream: the commit counts as projected once they are.
	acks *outAcks
}

// pending reports whether the run's last commit may be unprojected: the
// run is then not quiescent, so it is neither released nor its messages
// acknowledged.
func (p *projection) pending() bool { return p.unprojected != nil || p.acks != nil || p.unknown }

// outAcks are a commit's out messages sent without waiting for their
// acknowledgements: the shard goes on with its other runs while the
// server stores (and, with --sync-always, syncs) them. The shard's
// watcher (acksWatch) waits for them and hands them back (acksIn); the
// run's next commit, its release and a load wait for them first. When one
// is not acknowledged, the commit is projected again from before it (what
// did land is skipped).
type outAcks struct {
	runID     string
	futures   []*ackFuture
	deadline  time.Time       // one try (streamTry) from the send
	before    projector.Model // the projection before the commit
	beforeSeq uint64
	commit    commitToProject
	done      chan struct{} // closed once err is set
	err       error
}

// acksIn is the work item of a commit's out messages acknowledged (or not
// within a try).
type acksIn struct{ acks *outAcks }

// acksWatch is a shard's out messages in flight, in the order sent. One
// goroutine waits for them while there are any (not one per commit), and
// hands each commit back on a list the shard takes before its next item
// (acked, notify), never blocking on the shard. Posted to the shard's
// queue, an acksIn waited behind a burst of submissions, and a run
// waiting for its acksIn can be neither released nor evicted: 10,000 runs
// parking at once held about 90 MiB more.
type acksWatch struct {
	mu      sync.Mutex
	queue   []*outAcks
	running bool
	acked   []*outAcks    // waited for, for the shard to take
	notify  chan struct{} // 1-buffered: acked has some
}

// watchAcks queues a commit's out messages for the shard's watcher,
// starting it when none runs.
func (s *shard) watchAcks(a *outAcks) {
	w := &s.acks
	w.mu.Lock()
	w.queue = append(w.queue, a)
	start := !w.running
	w.running = true
	w.mu.Unlock()
	if start {
		s.e.wg.Add(1)
		go s.waitQueuedAcks()
	}
}

// waitQueuedAcks waits for the queued out messages, each at most until its
// deadline (also at shutdown: settleOuts waits for them), until none is
// left.
func (s *shard) waitQueuedAcks() {
	defer s.e.wg.Done()
	w := &s.acks
	for {
		w.mu.Lock()
		if len(w.queue) == 0 {
			w.running = false
			w.mu.Unlock()
			return
		}
		a := w.queue[0]
		w.queue[0] = nil
		w.queue = w.queue[1:]
		w.mu.Unlock()
		ctx, cancel := context.WithDeadline(context.Background(), a.deadline)
		a.err = s.e.outPub.waitAcks(ctx, a.futures)
		cancel()
		close(a.done)
		w.mu.Lock()
		w.acked = append(w.acked, a)
		w.mu.Unlock()
		select {
		case w.notify <- struct{}{}:
		default:
		}
	}
}

// takeAcked returns the commits whose out messages were waited for since
// the last call.
func (s *shard) takeAcked() []*outAcks {
	w := &s.acks
	w.mu.Lock()
	defer w.mu.Unlock()
	acked := w.acked
	w.acked = nil
	return acked
}

// outCursor knows the source of the last message on each out subject of a
// run: from its own publications, or read once from the out stream.
type outCursor struct {
	last map[string]aggregate.Stamp
	// known: every out message of the run's commits up to floor is
	// published (the run was loaded with every commit projected), so a
	// subject not in last holds nothing after floor.
	known bool
	floor uint64
}

// commitToProject is an appended commit: its sequence, its events and,
// when known, the run after it (the shard's own fold of it).
type commitToProject struct {
	seq   uint64
	evs   []events.Event
	after *aggregate.Run
}

// projectOrKeep projects a commit just appended, or keeps it to be
// projected again.
func (s *shard) projectOrKeep(ctx context.Context, rs *runState, c commitToProject) {
	if err := s.project(ctx, rs, c); err != nil {
		rs.projection.unprojected = &c
		s.e.log.Warn().Str(fieldRunID, rs.id).Uint64(fieldStreamSeq, c.seq).Err(err).Str(protocol.FieldMeaning, protocol.Meaning(err)).
			Msg("commit not projected yet; trying again before the run's next commit")
	}
}

// settleProjection waits for the out messages of the run's last commit,
// and projects the run's kept commit, if any. A commit it projects again
// has its sends in flight when it returns: that is an error (the run is
// not settled; its next commit waits), and the next settle, on their
// acksIn or the shard's tick, waits for them. The shard is never held
// longer than a try for one commit: a worker's heartbeats queue behind
// it.
func (s *shard) settleProjection(ctx context.Context, rs *runState) error {
	p := &rs.projection
	if a := p.acks; a != nil {
		select {
		case <-a.done:
		case <-ctx.Done():
			return fmt.Errorf("run %s: out messages of commit %d: %w", rs.id, a.commit.seq, ctx.Err())
		}
		p.acks = nil
		if a.err != nil {
			s.e.log.Warn().Str(fieldRunID, rs.id).Uint64(fieldStreamSeq, a.commit.seq).Err(a.err).Str(protocol.FieldMeaning, protocol.Meaning(a.err)).
				Msg("out messages not acknowledged; projecting the commit again")
			p.model, p.seq, p.outs = a.before, a.beforeSeq, outCursor{} // the cursor is not known any more: read again
			p.unprojected = &a.commit
		}
	}
	c := p.unprojected
	if c == nil {
		return nil
	}
	if err := s.project(ctx, rs, *c); err != nil {
		return fmt.Errorf("project commit %d of run %s: %w", c.seq, rs.id, err)
	}
	p.unprojected = nil
	if p.acks != nil {
		return fmt.Errorf("run %s: commit %d projected again: its out messages are not in yet", rs.id, c.seq)
	}
	return nil
}

// projectLoaded sets up the projection of a run just folded from its log:
// a log whose every commit is projected (this engine projected up to its
// tip, or took the key free and its marker names the tip) is taken as is;
// otherwise its last commit is projected again.
func (s *shard) projectLoaded(ctx context.Context, rs *runState, l loaded) error {
	p := &rs.projection
	if p.acks != nil {
		// The last commit's out messages are in, or it is projected again.
		if err := s.settleProjection(ctx, rs); err != nil {
			return err
		}
	}
	clean := l.at.seq == 0 || p.seq == l.at.seq || rs.keyProjected == anyProjected || rs.keyProjected == l.at.seq
	rs.keyProjected = 0
	if clean {
		*p = projection{model: projector.Model{Run: l.run.Clone()}, seq: l.at.seq, quarantined: p.quarantined,
			outs: outCursor{known: true, floor: l.at.seq}}
		return nil
	}
	// seq stays unknown until the projection goes through: a load after a
	// failure here projects again.
	*p = projection{model: projector.Model{Run: l.beforeIt}, quarantined: p.quarantined}
	c := commitToProject{seq: l.at.seq, evs: l.last, after: l.run}
	if err := s.project(ctx, rs, c); err != nil {
		p.unprojected = &c
		return fmt.Errorf("project the last commit of run %s again: %w", rs.id, err)
	}
	return nil
}

// project publishes what a commit derives (its out messages without
// waiting: outAcks). On failure the commit stays pending.
func (s *shard) project(ctx context.Context, rs *runState, c commitToProject) error {
	seq, evs, after := c.seq, c.evs, c.after
	p := &rs.projection
	if p.acks != nil {
		// A projection follows the one before it only once that one's
		// sends are in (settleProjection): its model is that one's result.
		return fmt.Errorf("engine: commit %d of run %s projected before commit %d's out messages are in", seq, rs.id, p.acks.commit.seq)
	}
	if p.quarantined {
		p.seq = seq
		return nil
	}
	if after != nil && derivesNothing(evs) && sameTicket(p.model.Run.Ticket(), after.Ticket()) {
		// Nothing to publish: the projection moves to the shard's fold
		// (aggregate.Decide never changes a run), not folded again.
		p.model, p.seq = projector.Model{Run: after, Applied: p.model.Applied + len(evs)}, seq
		return nil
	}
	// One try is short: the shard waits for it, and a try that fails is
	// made again later (a stream without a leader answers within one).
	ctx, cancel := context.WithTimeout(ctx, streamTry)
	defer cancel()
	model, futures, err := s.e.publishCommit(ctx, rs.id, p.model, seq, evs, &p.outs)
	var refused *projectionRefused
	if errors.As(err, &refused) {
		s.e.log.Error().Str(fieldRunID, rs.id).Uint64(fieldStreamSeq, seq).Err(err).
			Msg("projection: a commit that can never be projected: this run gets no more out messages (replay audit reports it)")
		p.quarantined, p.seq = true, seq
		return nil
	}
	if err != nil {
		p.outs = outCursor{} // what was sent is not known: read again
		return err
	}
	if len(futures) > 0 {
		p.acks = &outAcks{runID: rs.id, futures: futures, deadline: time.Now().Add(streamTry), before: p.model, beforeSeq: p.seq, commit: c,
			done: make(chan struct{})}
		s.watchAcks(p.acks)
	}
	p.model, p.seq = model, seq
	return nil
}

// projectionRefused is a commit whose events the projection refuses: it
// can never be projected.
type projectionRefused struct{ err error }

func (r *projectionRefused) Error() string { return r.err.Error() }
func (r *projectionRefused) Unwrap() error { return r.err }

// publishCommit folds the commit at seq into model (the run before it) and
// publishes what it derives: the run's ticket, the committed state (first,
// so that a client that has read a batch's results sees its state
// committed), the out messages, the ticket timers and the cancels of
// delegated children. It returns the run after the commit and the out
// messages' acknowledgements, not waited for; events the projection
// refuses are a *projectionRefused, and nothing is published.
func (e *Engine) publishCommit(ctx context.Context, runID string, model projector.Model, seq uint64, evs []events.Event, outs *outCursor) (projector.Model, []*ackFuture, error) {
	after := model
	var derived []projector.Output
	for _, ev := range evs {
		var o []projector.Output
		var err error
		if after, o, err = projector.Project(after, ev); err != nil {
			return model, nil, &projectionRefused{fmt.Errorf("commit %d: %w", seq, err)}
		}
		derived = append(derived, o...)
	}
	if err := e.syncTicket(ctx, runID, model.Run.Ticket(), after.Run.Ticket()); err != nil {
		return model, nil, fmt.Errorf("commit %d: ticket: %w", seq, err)
	}
	if err := applyState(ctx, e.state, runID, after.Run.ThreadID, seq, evs); err != nil {
		return model, nil, fmt.Errorf("commit %d: state: %w", seq, err)
	}
	futures, err := e.publishOuts(ctx, outs, runID, seq, derived)
	if err != nil {
		return model, nil, err
	}
	if err := e.scheduleTimers(ctx, runID, evs); err != nil {
		return model, nil, fmt.Errorf("commit %d: %w", seq, err)
	}
	if err := e.publishCancels(ctx, runID, aggregate.ChildrenToCancel(after.Run, evs)); err != nil {
		return model, nil, fmt.Errorf("commit %d: %w", seq, err)
	}
	return after, futures, nil
}

// derivesNothing reports whether no event of a commit derives an out
// message (projector.Quiet), committed state (BatchFinalized), a timer
// (CallAwaiting) or a cancel (aggregate.ChildrenToCancel: RunEnded,
// TicketResolved): what most commits of a batch in progress are (a gate
// decision, a call's entry, claim or completion).
func derivesNothing(evs []events.Event) bool {
	for _, ev := range evs {
		if _, resolved := ev.(*events.TicketResolved); resolved || !projector.Quiet(ev) {
			return false
		}
	}
	return true
}

func sameTicket(a, b *events.Ticket) bool {
	return (a == nil) == (b == nil) && (a == nil || a.CorrelationID == b.CorrelationID)
}

// publishOuts sends a commit's out messages, skipping those the out stream
// already holds, and returns their acknowledgements, not waited for: all
// of them at once, also several on one subject. The cursor counts them as
// in: a caller that does not get every acknowledgement resets it, and the
// projection made again reads what the stream holds (onSubject), each
// message, not only each subject's last.
func (e *Engine) publishOuts(ctx context.Context, c *outCursor, runID string, seq uint64, outs []projector.Output) ([]*ackFuture, error) {
	if len(outs) == 0 {
		return nil, nil
	}
	if c.last == nil {
		c.last = map[string]aggregate.Stamp{}
	}
	futures := make([]*ackFuture, 0, len(outs))
	var read map[string]held // subject -> what the stream holds of this commit on it, read here
	for i, o := range outs {
		subject := e.names.Out(runID, o.Subject())
		src := aggregate.Stamp{Seq: seq, Idx: i}
		if h, ok := read[subject]; ok {
			if h.has(src) {
				continue // published before
			}
		} else if last, ok := c.last[subject]; ok || c.known {
			if !ok {
				last = aggregate.Stamp{Seq: c.floor, Idx: math.MaxInt}
			}
			if !src.After(last) {
				continue // published before
			}
		} else {
			n := 0 // the commit's messages on the subject
			for _, later := range outs[i:] {
				if later.Subject() == o.Subject() {
					n++
				}
			}
			h, err := e.onSubject(ctx, subject, seq, n)
			if err != nil {
				return nil, err
			}
			if read == nil {
				read = map[string]held{}
			}
			read[subject], c.last[subject] = h, h.last
			if h.has(src) {
				continue // published before
			}
		}
		body, err := o.Encode()
		if err != nil {
			return nil, err
		}
		msg := nats.NewMsg(subject)
		msg.Data = body
		id := formatStamp(src)
		msg.Header.Set(protocol.HeaderSource, id)
		msg.Header.Set(jetstream.MsgIDHeader, "out/"+id)
		f, err := e.outPub.publish(msg)
		if err != nil {
			return nil, err
		}
		futures = append(futures, f)
		if src.After(c.last[subject]) {
			c.last[subject] = src
		}
	}
	return futures, nil
}

// held is what the out stream holds on one subject, as far as the
// messages of one commit go: the source of the subject's last message and,
// when that message is the commit's, which of the commit's messages are
// there (a commit's messages are sent without waiting for each other, so
// one may be missing while a later one is stored, and the one sent again
// comes after it).
type held struct {
	last aggregate.Stamp
	idx  map[int]bool // when last is the commit's: the indices of its messages stored
}

// has reports whether the stream holds the message src (of the commit
// the subject was read for).
func (h held) has(src aggregate.Stamp) bool {
	switch {
	case src.Seq < h.last.Seq:
		// A later commit's message: this commit's were all in before it
		// was projected (settleProjection).
		return true
	case src.Seq > h.last.Seq:
		return false
	case h.idx == nil:
		return !src.After(h.last)
	default:
		return h.idx[src.Idx]
	}
}

// onSubject reads what the out stream holds of commit seq's messages on
// subject, n of which the commit has. When the subject's last message is
// the commit's and the commit has others on it, each of them is looked
// for, through the stream leader, not inferred: the reads start after the
// run's last older message on the subject, found by probes (the first
// message on the subject at or after a sequence), stepping back from the
// last message by 64 sequences, then 256, ..., until a probe finds an
// older message, and then halving the interval between that probe and
// the one before it. A probe finds the commit's message exactly when it
// starts after that older message, so the reads are a few dozen at most
// however much the run published before, and the commit's own messages.
func (e *Engine) onSubject(ctx context.Context, subject string, seq uint64, n int) (held, error) {
	last, at, err := e.lastOn(ctx, subject)
	if err != nil || last.Seq != seq || n == 1 {
		return held{last: last}, err
	}
	h := held{last: last, idx: map[int]bool{last.Idx: true}}
	hi, lo := at, uint64(0) // a probe at hi finds the commit's message, at lo (when not 0) an older one
	probe := func(x uint64) error {
		src, _, err := e.nextOn(ctx, subject, x)
		switch {
		case err != nil:
		case src.Seq < seq:
			lo = x
		default:
			hi = x
		}
		return err
	}
	for width := uint64(64); lo == 0 && hi > 1 && err == nil; width = min(width*4, at) {
		err = probe(at - min(width, at-1))
	}
	for lo != 0 && hi-lo > 1 && err == nil {
		err = probe(lo + (hi-lo)/2)
	}
	if err != nil {
		return held{}, err
	}
	for from := hi; len(h.idx) < n; {
		src, s, err := e.nextOn(ctx, subject, from)
		if err != nil {
			return held{}, err
		}
		if s >= at {
			break
		}
		if src.Seq == seq {
			h.idx[src.Idx] = true
		}
		from = s + 1
	}
	return h, nil
}

// lastOn returns the source of the last message on an out subject (zero
// when there is none) and its stream sequence.
func (e *Engine) lastOn(ctx context.Context, subject string) (aggregate.Stamp, uint64, error) {
	last, err := e.outStream.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return aggregate.Stamp{}, 0, nil
	}
	if err != nil {
		return aggregate.Stamp{}, 0, err
	}
	src, err := sourceOf(subject, last)
	return src, last.Sequence, err
}

// nextOn returns the source and stream sequence of the first message on
// an out subject at or after stream sequence from. The caller knows one
// is there.
func (e *Engine) nextOn(ctx context.Context, subject string, from uint64) (aggregate.Stamp, uint64, error) {
	m, err := e.outStream.GetMsg(ctx, from, jetstream.WithGetMsgSubject(subject))
	if err != nil {
		return aggregate.Stamp{}, 0, err
	}
	src, err := sourceOf(subject, m)
	return src, m.Sequence, err
}

func sourceOf(subject string, m *jetstream.RawStreamMsg) (aggregate.Stamp, error) {
	h := m.Header.Get(protocol.HeaderSource)
	src, err := parseStamp(h)
	if err != nil || h == "" {
		return aggregate.Stamp{}, fmt.Errorf("out subject %s: message %d has no valid %s header", subject, m.Sequence, protocol.HeaderSource)
	}
	return src, nil
}

// syncTicket keeps the run's key of the tickets bucket its open ticket:
// put when one opens, deleted when it closes. Both are idempotent, so a
// commit projected again changes nothing.
func (e *Engine) syncTicket(ctx context.Context, runID string, before, after *events.Ticket) error {
	switch {
	case after == nil && before == nil:
		return nil
	case after == nil:
		return e.ticketsKV.Delete(ctx, protocol.TicketKey(runID))
	case before != nil && before.CorrelationID == after.CorrelationID:
		return nil
	}
	b, err := json.Marshal(protocol.Awaiting(*after))
	if err != nil {
		return err
	}
	_, err = e.ticketsKV.Put(ctx, protocol.TicketKey(runID), b)
	return err
}
