package engine

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/toolbatch/toolbatch/aggregate"
	"github.com/toolbatch/toolbatch/events"
)

// Commit staging and flush: a decision's events are staged on the cached
// run and appended to the log, several decisions as one commit, before the
// engine acts on the outside world.

// decide runs a command and stages its events: they are applied to the
// cached run at once and appended to the log by the next flush, together
// with whatever else was staged since the last one. Every path that acts
// on the outside world (entering an executor, answering a claim,
// acknowledging a message) flushes first, so nothing is ever acted on
// before its events are durable; what is staged between two such actions
// (a call's completion and the next call's gate decision, say) becomes one
// commit instead of several.
func (s *shard) decide(ctx context.Context, rs *runState, cmd aggregate.Command) ([]events.Event, error) {
	run, evs, err := aggregate.Decide(rs.run, cmd)
	if err != nil || len(evs) == 0 {
		return nil, err
	}
	s.stage(rs, run, evs)
	return evs, nil
}

// decideNow decides and flushes at once.
func (s *shard) decideNow(ctx context.Context, rs *runState, cmd aggregate.Command) ([]events.Event, error) {
	evs, err := s.decide(ctx, rs, cmd)
	if err != nil {
		return nil, err
	}
	return evs, s.flush(ctx, rs)
}

// stage takes one decision: the run after its events becomes the cached
// run, and the events are kept for the next flush.
func (s *shard) stage(rs *runState, run *aggregate.Run, evs []events.Event) {
	rs.run = run
	rs.pending = append(rs.pending, evs)
}

// flush appends the staged decisions as one commit (several when together
// they exceed the server's message size; a decision is never split). A
// failed append abandons the staged decisions: the run is folded again
// from the log, and the messages held since the last flush are given back
// to be decided again.
func (s *shard) flush(ctx context.Context, rs *runState) error {
	for len(rs.pending) > 0 {
		// The run's last commit is projected before the next one is
		// appended (project.go).
		if err := s.settleProjection(ctx, rs); err != nil {
			s.abandon(rs)
			return err
		}
		n := len(rs.pending)
		var at tip
		var size int
		var evs []events.Event
		var submitted *events.BatchSubmitted
		var err error
		for {
			evs = slices.Concat(rs.pending[:n]...)
			tp := ""
			if submitted = submittedBatch(evs); submitted != nil {
				tp = rs.traceparent
			}
			at, size, err = s.e.events.append(ctx, rs.id, rs.tip, evs, tp)
			if n == 1 || !errors.Is(err, nats.ErrMaxPayload) {
				break
			}
			n = (n + 1) / 2 // nothing was sent: try fewer decisions
		}
		if err != nil {
			// It may have landed all the same (a timeout): the run is
			// not quiescent until a load says whether its log's last
			// commit is projected.
			rs.projection.unknown, rs.projection.unprojected = true, nil
			if errors.Is(err, ErrConflict) {
				// Extended elsewhere: by an engine that took the run (this
				// one thought dead), or by a commit of this engine's whose
				// answer was lost. Only a write conditional on the key's
				// revision held tells which, before the run is used again
				// (confirmKey): a read of the key may come from a replica
				// that is behind.
				rs.keyUnsure = true
			}
			s.abandon(rs)
			return err
		}
		if s.e.log.GetLevel() <= zerolog.DebugLevel {
			for _, e := range evs {
				ev := s.e.log.Debug().Str(fieldRunID, rs.id).Uint64(fieldStreamSeq, at.seq)
				if b := rs.run.Batch; b != nil {
					ev = ev.Str(fieldBatchID, b.ID)
				}
				ev.Msg(events.Describe(e))
			}
		}
		rs.tip, rs.bytes = at, rs.bytes+int64(size)
		if submitted != nil { // with the traceparent the commit carried
			rs.batchSpan = s.e.events.tracer.Batch(rs.id, submitted.BatchID, rs.traceparent)
		}
		s.e.clients.committed(rs.id, rs.client, evs)
		var after *aggregate.Run // the run after this commit, when it is all that was staged
		if n == len(rs.pending) {
			after = rs.run
		}
		rs.pending = rs.pending[n:]
		// What the commit decided stands whether or not its projection
		// goes through now: one that fails is kept and tried again
		// before the run's next commit and on the shard's tick.
		s.projectOrKeep(ctx, rs, commitToProject{seq: at.seq, evs: evs, after: after})
	}
	rs.pending = nil
	rs.durableHeld = len(rs.held)
	return nil
}

// submittedBatch is the batch a commit's events submit (nil: none): such
// a commit carries the submitter's traceparent.
func submittedBatch(evs []events.Event) *events.BatchSubmitted {
	for _, e := range evs {
		if s, ok := e.(*events.BatchSubmitted); ok {
			return s
		}
	}
	return nil
}

// abandon forgets what is staged: the cached run is folded again from the
// log, and the messages held since the last flush, whose decisions were
// never recorded, come back to be decided again.
func (s *shard) abandon(rs *runState) {
	rs.pending = nil
	rs.loaded = false
	for _, m := range rs.held[rs.durableHeld:] {
		_ = m.NakWithDelay(100 * time.Millisecond)
	}
	rs.held = rs.held[:rs.durableHeld]
}

// settle is done with a message that changed nothing: it is acknowledged
// when the run is quiescent here, and otherwise held with the run's other
// messages. So whenever a run has work in progress on this engine (a
// commit not projected yet among it), one of its messages is
// unacknowledged, and a crash redelivers it to whichever engine takes the
// run over (a recovery at load, say, starts work that a
// refused message alone would not keep alive).
func (s *shard) settle(rs *runState, m jetstream.Msg) error {
	if rs.settled() {
		return m.Ack()
	}
	rs.held = append(rs.held, m)
	return nil
}

// settled reports whether the run waits for nothing of this engine's:
// everything decided is committed and projected, and the run is parked,
// finalized or ended.
func (rs *runState) settled() bool {
	if !rs.loaded || len(rs.pending) > 0 || len(rs.inflight) > 0 || len(rs.leases) > 0 || rs.projection.pending() {
		return false
	}
	switch aggregate.Next(rs.run).Kind {
	case aggregate.NextNone, aggregate.NextAwaiting:
		return true
	}
	return false
}

// sole returns a decision's event when it is the only one and of type T:
// a decision that records a refusal (BatchRejected, ResultRefused) is that
// event alone.
func sole[T events.Event](evs []events.Event) (T, bool) {
	var zero T
	if len(evs) != 1 {
		return zero, false
	}
	ev, ok := evs[0].(T)
	return ev, ok
}
