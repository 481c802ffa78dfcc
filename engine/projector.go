package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/aggregate"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/projector"
	"github.com/toolbatch/toolbatch/proof"
	"github.com/toolbatch/toolbatch/protocol"
)

// projectorRunner folds every commit of the events stream, in stream order,
// through the projector and publishes what it derives on the out stream. Its
// progress is the durable consumer's acknowledgement floor. Every out
// message carries its source (commit and index); the first time the runner
// publishes on a subject it reads that subject's last message, and it skips
// what is already there. So a commit delivered again after a crash, or the
// whole stream delivered again to a new consumer, however long after the
// duplicate window, publishes nothing twice.
type projectorRunner struct {
	e       *Engine
	state   *stateStore
	cons    jetstream.Consumer
	out     jetstream.Stream
	tickets jetstream.KeyValue
	models  map[string]*projected
	// quarantined are the runs with a poison commit: projected no
	// further, by this engine (another that leads later finds the same
	// commit and quarantines it too).
	quarantined map[string]bool
}

type projected struct {
	model projector.Model
	seq   uint64     // last commit folded
	hash  proof.Hash // its hash, when the engine verifies (trust.check)
	bytes int64      // bytes of the commits folded: what the cache counts it as
	used  int64      // the stream sequence of the commit that last used it
	// last is the source of the last message known on each out subject of
	// the run: read once from the out stream, then kept as it publishes.
	last map[string]source
}

// source names an out message's origin: a commit and an index in it.
type source struct {
	seq uint64
	idx int
}

func (a source) after(b source) bool { return a.seq > b.seq || (a.seq == b.seq && a.idx > b.idx) }

func newProjectorRunner(ctx context.Context, e *Engine) (*projectorRunner, error) {
	cons, err := e.js.CreateOrUpdateConsumer(ctx, e.names.EventsStream(), jetstream.ConsumerConfig{
		Durable: protocol.ConsumerProjector, AckPolicy: jetstream.AckExplicitPolicy, AckWait: min(e.cfg.AckWait, projectorAckWait),
		MaxAckPending: 1024, MaxDeliver: -1, DeliverPolicy: jetstream.DeliverAllPolicy,
		Description: "toolbatch projector: publishes out messages",
	})
	if err != nil {
		return nil, fmt.Errorf("projector consumer: %w", err)
	}
	out, err := e.js.Stream(ctx, e.names.OutStream())
	if err != nil {
		return nil, err
	}
	tickets, err := e.js.KeyValue(ctx, e.names.TicketsBucket())
	if err != nil {
		return nil, err
	}
	return &projectorRunner{e: e, state: e.state, cons: cons, out: out, tickets: tickets, models: map[string]*projected{}, quarantined: map[string]bool{}}, nil
}

// projectorAckWait is the projector consumer's ack wait. Each commit is
// acknowledged on its own (AckExplicit), not many at once (AckAll): a new
// leader may be delivered commits after those a leader it replaced had
// fetched and not acknowledged, and acknowledging them all at once would
// acknowledge those too, never projected (the chaos cluster suite found a
// batch whose results were never published that way). The leader
// acknowledges each commit within milliseconds (a commit retried in place
// is kept in progress), so what a dead leader had fetched comes back to the
// next leader soon after it takes the lead, before what follows.
const projectorAckWait = 3 * time.Second

// run projects while this engine leads the projection: one engine at a
// time (the key "projector" in the owners bucket), so that commits are
// projected in stream order and the committed state has one writer. A
// commit that fails for a passing reason (NATS) is retried in place until
// it succeeds, and nothing after it is projected before it. A commit that
// can never be projected (a poison commit: undecodable, without a valid
// Toolbatch-Prev, events the projection refuses, or, when the engine
// signs, a commit that does not verify: trust.go) is logged and skipped
// with every later commit of its run: that run gets no more out messages,
// every other run goes on. replay audit reports the same commit.
func (p *projectorRunner) run(ctx context.Context) error {
	lead := &leader{e: p.e, key: protocol.ProjectorLeaderKey}
	defer lead.resign()
	for ctx.Err() == nil {
		if !lead.hold(ctx) {
			clear(p.models) // another engine projects meanwhile
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(probeEvery):
			}
			continue
		}
		batch, err := p.cons.Fetch(256, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			p.e.log.Warn().Err(err).Msg("projector fetch failed")
			continue
		}
		for m := range batch.Messages() {
			for {
				err := p.handle(m)
				if err == nil {
					break
				}
				var poison *poisonError
				if errors.As(err, &poison) {
					p.quarantine(m, poison)
					break
				}
				p.e.log.Error().Err(err).Str(protocol.FieldMeaning, protocol.Meaning(err)).Str(fieldSubject, m.Subject()).Msg("projector: commit not projected; retrying")
				if meta, merr := m.Metadata(); merr == nil {
					p.e.log.Debug().Uint64(fieldStreamSeq, meta.Sequence.Stream).Msg("projector: stuck at this commit")
				}
				clear(p.models)
				_ = m.InProgress()
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(time.Second):
				}
				if !lead.hold(ctx) {
					break // the lead moved on: the message comes back to the new leader
				}
			}
		}
		// Once per fetch, not per commit: the bound's check reads every
		// model (it cost W2 6% of the engine's CPU per commit).
		trimOldest(p.models, bound{max: p.e.cfg.CacheRuns, maxBytes: p.e.cfg.CacheBytes}, func(pm *projected) int64 { return pm.used },
			func(pm *projected) int64 { return pm.bytes }, func(*projected) bool { return true })
	}
	return nil
}

// leader holds a key of the owners bucket for as long as this engine is
// alive: like a run's key it has no TTL, and another engine takes it only
// from a dead engine (liveness.go). An engine fenced since it took the key
// holds it no more.
type leader struct {
	e     *Engine
	key   string
	rev   uint64
	epoch uint64 // the liveness epoch the key was taken in
}

// hold reports whether this engine holds the key, taking it when it is
// free, left by a previous process of this engine, or held by a dead one.
func (l *leader) hold(ctx context.Context) bool {
	if l.rev != 0 && l.epoch == l.e.liveness.epoch.Load() {
		return true
	}
	l.rev = 0
	epoch := l.e.liveness.epoch.Load()
	rev, from, err := l.e.takeKey(ctx, l.key)
	if err != nil {
		return false
	}
	if from != "" {
		l.e.log.Info().Str("engine", from).Msg("took the projector's lead over from a dead engine")
	}
	l.rev, l.epoch = rev, epoch
	return true
}

func (l *leader) resign() {
	if l.rev == 0 {
		return
	}
	ctx, cancel := opCtx()
	defer cancel()
	_ = l.e.ownersKV.Delete(ctx, l.key, jetstream.LastRevision(l.rev))
}

func (p *projectorRunner) handle(m jetstream.Msg) error {
	ctx, cancel := opCtx()
	defer cancel()
	meta, err := m.Metadata()
	if err != nil {
		return err
	}
	seq := meta.Sequence.Stream
	runID, ok := p.e.names.RunOf(protocol.EventsFamily, m.Subject())
	if !ok {
		p.e.log.Warn().Str(fieldSubject, m.Subject()).Msg("projector: a commit on a subject that names no run: terminated")
		return m.TermWithReason("not a run's events subject: " + m.Subject())
	}
	if p.quarantined[runID] {
		return poisoned(runID, "commit %d: the run has a commit that can never be projected before it", meta.Sequence.Stream)
	}
	pm := p.models[runID]
	// Fold again unless the cached model holds exactly the commits before
	// this one (several engines share the projector consumer, so another
	// may have projected the run's last commits).
	prev, perr := strconv.ParseUint(m.Headers().Get(protocol.HeaderPrev), 10, 64)
	if perr != nil {
		return poisoned(runID, "commit %d: header %s: %w", seq, protocol.HeaderPrev, perr)
	}
	if pm == nil || pm.seq != prev {
		pm, err = p.loadUpTo(ctx, runID, prev)
		if err != nil {
			return err
		}
		p.models[runID] = pm
	}
	hash, err := p.e.trust.check(ctx, m, seq, pm.hash)
	if err != nil {
		return untrusted(runID, err)
	}
	evs, err := events.DecodeCommit(m.Data(), m.Headers().Values(protocol.HeaderEvent))
	if err != nil {
		return poisoned(runID, "commit %d: %w", seq, err)
	}
	model := pm.model
	var outs []projector.Output
	for _, e := range evs {
		var o []projector.Output
		model, o, err = projector.Project(model, e)
		if err != nil {
			return poisoned(runID, "commit %d: %w", seq, err)
		}
		outs = append(outs, o...)
	}
	if err := p.syncTicket(ctx, runID, pm.model.Run.Ticket(), model.Run.Ticket()); err != nil {
		return fmt.Errorf("commit %d: ticket: %w", seq, err)
	}
	// State first, so that a client that has read a batch's results sees
	// its state committed.
	for _, e := range evs {
		if f, ok := e.(*events.BatchFinalized); ok && f.Conflict == "" {
			if err := p.state.apply(ctx, runID, model.Run.ThreadID, seq, f.State); err != nil {
				return fmt.Errorf("commit %d: state: %w", seq, err)
			}
		}
	}
	if err := p.publish(ctx, pm, runID, seq, outs); err != nil {
		return err
	}
	if err := p.e.scheduleTimers(ctx, runID, evs); err != nil {
		return fmt.Errorf("commit %d: %w", seq, err)
	}
	if err := p.e.publishCancels(ctx, runID, aggregate.ChildrenToCancel(model.Run, evs)); err != nil {
		return fmt.Errorf("commit %d: %w", seq, err)
	}
	pm.model, pm.seq, pm.hash, pm.used, pm.bytes = model, seq, hash, int64(seq), pm.bytes+int64(len(m.Data()))
	return m.Ack()
}

// poisonError is a commit the projector can never project.
type poisonError struct {
	runID string
	err   error
}

func (e *poisonError) Error() string { return e.err.Error() }
func (e *poisonError) Unwrap() error { return e.err }

func poisoned(runID string, format string, args ...any) error {
	return &poisonError{runID: runID, err: fmt.Errorf(format, args...)}
}

// untrusted makes a commit that does not verify a poison commit; another
// error of trust.check (the keys bucket unreachable) passes.
func untrusted(runID string, err error) error {
	if errors.Is(err, errUntrusted) {
		return &poisonError{runID: runID, err: err}
	}
	return err
}

// quarantine skips a poison commit: its run is projected no further (a
// later commit of it cannot be folded either), and the projector goes on
// with the other runs.
func (p *projectorRunner) quarantine(m jetstream.Msg, poison *poisonError) {
	var seq uint64
	if meta, err := m.Metadata(); err == nil {
		seq = meta.Sequence.Stream
	}
	delete(p.models, poison.runID)
	p.quarantined[poison.runID] = true
	p.e.log.Error().Str(fieldRunID, poison.runID).Uint64(fieldStreamSeq, seq).Err(poison).
		Msg("projector: a commit that can never be projected: skipped; this run gets no more out messages (replay audit reports it)")
	_ = m.Ack()
}

// loadUpTo folds a run's commits up to and including seq (none for 0).
func (p *projectorRunner) loadUpTo(ctx context.Context, runID string, seq uint64) (*projected, error) {
	pm := &projected{model: projector.NewModel(runID), last: map[string]source{}}
	if seq == 0 {
		return pm, nil
	}
	err := protocol.ReadOrdered(ctx, p.e.js, p.e.names.EventsStream(), protocol.ReadOptions{Subjects: []string{p.e.names.Events(runID)}, UpTo: seq}, func(m jetstream.Msg, meta *jetstream.MsgMetadata) error {
		s := meta.Sequence.Stream
		hash, err := p.e.trust.check(ctx, m, s, pm.hash)
		if err != nil {
			return untrusted(runID, err)
		}
		evs, err := events.DecodeCommit(m.Data(), m.Headers().Values(protocol.HeaderEvent))
		if err != nil {
			return poisoned(runID, "commit %d: %w", s, err)
		}
		for _, e := range evs {
			if pm.model, _, err = projector.Project(pm.model, e); err != nil {
				return poisoned(runID, "commit %d: %w", s, err)
			}
		}
		pm.seq, pm.hash, pm.bytes = s, hash, pm.bytes+int64(len(m.Data()))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("projector: load run %s: %w", runID, err)
	}
	if pm.seq != seq {
		return nil, poisoned(runID, "projector: run %s has no commit at %d (a Toolbatch-Prev that names no commit of it)", runID, seq)
	}
	return pm, nil
}

// publish sends a commit's outputs, skipping those the out stream already
// holds.
func (p *projectorRunner) publish(ctx context.Context, pm *projected, runID string, seq uint64, outs []projector.Output) error {
	futures := make([]jetstream.PubAckFuture, 0, len(outs))
	for i, o := range outs {
		subject := p.e.names.Out(runID, o.Subject())
		last, known := pm.last[subject]
		if !known {
			var err error
			if last, err = p.lastOn(ctx, subject); err != nil {
				return err
			}
			pm.last[subject] = last
		}
		src := source{seq: seq, idx: i}
		if !src.after(last) {
			continue // published before
		}
		body, err := o.Encode()
		if err != nil {
			return err
		}
		msg := nats.NewMsg(subject)
		msg.Data = body
		id := fmt.Sprintf("%d/%d", seq, i)
		msg.Header.Set(protocol.HeaderSource, id)
		f, err := p.e.js.PublishMsgAsync(msg, jetstream.WithMsgID("out/"+id))
		if err != nil {
			return err
		}
		futures = append(futures, f)
		pm.last[subject] = src
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			clear(pm.last) // not known any more: read again
			return fmt.Errorf("publish %s: %w", f.Msg().Subject, err)
		case <-ctx.Done():
			clear(pm.last)
			return ctx.Err()
		}
	}
	return nil
}

// lastOn returns the source of the last message on an out subject (zero
// when there is none).
func (p *projectorRunner) lastOn(ctx context.Context, subject string) (source, error) {
	last, err := p.out.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return source{}, nil
	}
	if err != nil {
		return source{}, err
	}
	a, b, ok := strings.Cut(last.Header.Get(protocol.HeaderSource), "/")
	s, err1 := strconv.ParseUint(a, 10, 64)
	i, err2 := strconv.Atoi(b)
	if !ok || err1 != nil || err2 != nil {
		return source{}, fmt.Errorf("out subject %s: last message has no valid %s header", subject, protocol.HeaderSource)
	}
	return source{seq: s, idx: i}, nil
}

// syncTicket keeps the run's key of the tickets bucket its open ticket:
// put when one opens, deleted when it closes. Both are idempotent, so a
// commit projected again changes nothing.
func (p *projectorRunner) syncTicket(ctx context.Context, runID string, before, after *events.Ticket) error {
	switch {
	case after == nil && before == nil:
		return nil
	case after == nil:
		return p.tickets.Delete(ctx, protocol.TicketKey(runID))
	case before != nil && before.CorrelationID == after.CorrelationID:
		return nil
	}
	b, err := json.Marshal(protocol.Awaiting(*after))
	if err != nil {
		return err
	}
	_, err = p.tickets.Put(ctx, protocol.TicketKey(runID), b)
	return err
}
