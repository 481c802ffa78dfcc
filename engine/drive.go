package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/toolbatch/toolbatch/aggregate"
	"github.com/toolbatch/toolbatch/events"
)

// Driving a run: after every item the run goes on from where it is, by
// what aggregate.Next says it needs, up to the executors.

// drive does what the run needs until it waits for an executor, a ticket
// or a new batch.
func (s *shard) drive(ctx, runCtx context.Context, rs *runState) error {
	for {
		w := aggregate.Next(rs.run)
		switch w.Kind {
		case aggregate.NextGate:
			if s.e.gateAsksOutside(ctx, rs.run) {
				// The external gate may take its time: record what is
				// decided before asking it.
				if err := s.flush(ctx, rs); err != nil {
					return err
				}
				s.answerNow(rs)
			}
			decisions, err := s.e.gateDecisions(ctx, rs.run, w.CallIDs)
			if err != nil {
				return err
			}
			if _, err := s.decide(ctx, rs, aggregate.Gate{Decisions: decisions, At: s.e.cfg.Now()}); err != nil {
				return err
			}
		case aggregate.NextParkClient:
			now := s.e.cfg.Now()
			park := aggregate.ParkClient{CallID: w.CallIDs[0], CorrelationID: newID(), At: now}
			if c, _ := rs.run.Batch.Call(w.CallIDs[0]); c != nil {
				park.Deadline = s.e.waitDeadline(ctx, rs.run.Batch.SnapshotID, c.ToolID, now)
			}
			if _, err := s.decide(ctx, rs, park); err != nil {
				return err
			}
		case aggregate.NextExecuting:
			// A worker's result may bring its claim of the next call
			// (sandbox.go): staged now, committed with what is staged.
			chained, err := s.chain(ctx, rs, w.CallIDs)
			if err != nil {
				return err
			}
			if err := s.flush(ctx, rs); err != nil {
				return err
			}
			if chained != nil {
				s.granted(rs, chained)
			}
			s.startExecutors(runCtx, rs, w.CallIDs)
			return nil
		default: // parked, finalized, ended or idle: quiescent
			if err := s.flush(ctx, rs); err != nil {
				return err
			}
			if rs.projection.pending() {
				// The held messages are acknowledged once the last
				// commit is projected (its sends in: acksIn drives again),
				// so that a crash before then brings an engine back.
				return nil
			}
			s.ackHeld(rs)
			return nil
		}
	}
}

// startExecutors enters the executor of each executing call not already in
// flight here. Their CallExecuting is committed.
func (s *shard) startExecutors(runCtx context.Context, rs *runState, callIDs []string) {
	b := rs.run.OpenBatch()
	for _, id := range callIDs {
		c, _ := b.Call(id)
		key := fmt.Sprintf("%s/%d", id, c.Attempt)
		if rs.inflight[key] {
			continue
		}
		rs.inflight[key] = true
		var tp string
		if c.Tool.Target == events.TargetSandbox {
			rs.unclaimed[id] = lease{attempt: c.Attempt, deadline: time.Now().Add(s.e.dispatchDeadline(c.ToolID))}
			tp = rs.batchSpan.Attempt(id, c.Attempt)
		}
		inv := invocation{runID: rs.id, batchID: b.ID, callID: id, toolID: c.ToolID, arguments: c.Arguments,
			attempt: c.Attempt, operationID: b.OperationID(id), tool: c.Tool, input: c.Input, hasInput: c.HasInput, traceparent: tp}
		s.e.wg.Add(1)
		go func() {
			defer s.e.wg.Done()
			if inv.tool.Target == events.TargetSandbox {
				s.e.dispatchUntil(runCtx, inv, s.e.dispatchDeadline(inv.toolID))
				return
			}
			s.e.running.Add(1)
			o := s.e.brain.invoke(runCtx, s.e.cfg.Catalog, inv)
			o.counted = true // the shard counts it done once it is recorded
			if !s.postCtx(runCtx, item{runID: inv.runID, work: &o}) {
				s.e.running.Add(-1)
			}
		}()
	}
}

// ackHeld acknowledges the run's held messages: what they asked for is in
// the log, and the run waits for nothing of this engine's.
func (s *shard) ackHeld(rs *runState) {
	for _, m := range rs.held {
		if err := m.Ack(); err != nil {
			s.e.log.Warn().Str(fieldRunID, rs.id).Err(err).Msg("ack failed; the message will be redelivered and is harmless")
		}
	}
	rs.held, rs.durableHeld = nil, 0
}
