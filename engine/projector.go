package engine

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/projector"
	"github.com/toolbatch/toolbatch/proof"
	"github.com/toolbatch/toolbatch/protocol"
)

// projectorRunner is the projector of earlier versions: one engine at a
// time folded every commit of the events stream, in stream order, from the
// durable consumer "projector", and published what it derived. Engines of
// this version project their own commits (project.go); one that starts
// while that consumer exists projects what the consumer still holds (the
// commits the earlier version had not projected), then deletes it, before
// it serves anything (drainEarlierProjector). Every out message carries its
// source (commit and index); the first time the runner publishes on a
// subject it reads that subject's last message, and it skips what is
// already there, so nothing is published twice.
type projectorRunner struct {
	e      *Engine
	cons   jetstream.Consumer
	models map[string]*projected
	// quarantined are the runs with a poison commit: projected no
	// further.
	quarantined map[string]bool
}

type projected struct {
	model projector.Model
	seq   uint64     // last commit folded
	hash  proof.Hash // its hash, when the engine verifies (trust.check)
	outs  outCursor
}

// drainEarlierProjector projects what an earlier version's projector
// consumer still holds and deletes the consumer. One engine at a time
// does it (the key "projector" of the owners bucket); the others wait
// until the consumer is gone. The commits it holds are older than any this
// engine could make, and it runs before this engine serves: no run goes on
// before what its earlier commits derive is out.
func (e *Engine) drainEarlierProjector(ctx context.Context) error {
	cons, err := e.js.Consumer(ctx, e.names.EventsStream(), protocol.ConsumerProjector)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("the earlier projector's consumer: %w", err)
	}
	e.log.Info().Msg("projecting what the projector consumer of an earlier version still holds")
	p := &projectorRunner{e: e, cons: cons, models: map[string]*projected{}, quarantined: map[string]bool{}}
	lead := &leader{e: e, key: protocol.ProjectorLeaderKey}
	defer lead.resign()
	waited, renewed := time.Now(), time.Now()
	for ctx.Err() == nil {
		if time.Since(renewed) >= presenceEvery {
			// the engine serves nothing yet, and must not look dead
			e.liveness.renew()
			renewed = time.Now()
		}
		if !lead.hold(ctx) {
			// another engine drains it (or an engine of the earlier
			// version still runs: it must be stopped)
			if _, err := e.js.Consumer(ctx, e.names.EventsStream(), protocol.ConsumerProjector); errors.Is(err, jetstream.ErrConsumerNotFound) {
				return nil
			}
			if time.Since(waited) > 10*time.Second {
				e.log.Warn().Msg("waiting for the engine that leads the projection of an earlier version: stop every engine of the earlier version to finish the upgrade")
				waited = time.Now()
			}
			select {
			case <-ctx.Done():
			case <-time.After(probeEvery):
			}
			continue
		}
		info, err := cons.Info(ctx)
		if err != nil {
			return fmt.Errorf("the earlier projector's consumer: %w", err)
		}
		if info.NumPending == 0 && info.NumAckPending == 0 {
			// Every commit so far had its state applied once: state keys
			// without stamps are as of here.
			si, err := e.events.stream.Info(ctx)
			if err != nil {
				return fmt.Errorf("events stream: %w", err)
			}
			_, err = e.state.kv.Create(ctx, protocol.StateUnstampedUntilKey, []byte(strconv.FormatUint(si.State.LastSeq, 10)))
			if err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
				return fmt.Errorf("state bucket: %w", err)
			}
			if err := e.js.DeleteConsumer(ctx, e.names.EventsStream(), protocol.ConsumerProjector); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
				return fmt.Errorf("delete the earlier projector's consumer: %w", err)
			}
			e.log.Info().Msg("the earlier version's projector consumer is drained and deleted")
			return nil
		}
		p.fetch(ctx, lead)
	}
	return ctx.Err()
}

// fetch projects the next commits the consumer holds, each in stream
// order. A commit that fails for a passing reason (NATS) is retried in
// place until it succeeds; a commit that can never be projected (a poison
// commit: undecodable, without a valid Toolbatch-Prev, events the
// projection refuses, or, when the engine signs, a commit that does not
// verify: trust.go) is logged and skipped with every later commit of its
// run. replay audit reports the same commit.
func (p *projectorRunner) fetch(ctx context.Context, lead *leader) {
	batch, err := p.cons.Fetch(256, jetstream.FetchMaxWait(time.Second))
	if err != nil {
		p.e.log.Warn().Err(err).Msg("projector fetch failed")
		return
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
			clear(p.models)
			_ = m.InProgress()
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
			if !lead.hold(ctx) {
				return // the lead moved on: the message comes back to the new leader
			}
		}
	}
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
	rev, from, _, err := l.e.takeKey(ctx, l.key)
	if err != nil {
		return false
	}
	if from != "" && from != l.e.id {
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
	model, futures, err := p.e.publishCommit(ctx, runID, pm.model, seq, evs, &pm.outs)
	var refused *projectionRefused
	if errors.As(err, &refused) {
		return poisoned(runID, "%w", err)
	}
	if err == nil {
		err = p.e.outPub.waitAcks(ctx, futures)
	}
	if err != nil {
		pm.outs = outCursor{} // what was sent is not known: read again
		return err
	}
	pm.model, pm.seq, pm.hash = model, seq, hash
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
	pm := &projected{model: projector.NewModel(runID)}
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
		pm.seq, pm.hash = s, hash
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
