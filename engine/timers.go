package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/aggregate"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/protocol"
)

// Timers are JetStream message schedules, not goroutines: when a ticket
// with a deadline or a due time is committed, the projector runner (which
// sees every commit exactly once, durably) publishes a schedule on
// <prefix>.timer.at.<run_id>.<correlation_id> in the timers stream; at that
// time the server publishes its body on <prefix>.timer.fire.<run_id>, and
// the engine that consumes it resolves the ticket: expiry for a deadline,
// perform for a due scheduled action. A timer survives engine restarts and
// server restarts because it is a stored message, and it needs no scan of
// the runs at start. A fire for a ticket already resolved is refused by the
// aggregate (not_awaiting) and dropped; one that arrives early (clocks) is
// scheduled again.
//
// A stored schedule can still be lost: a cluster's timers stream losing
// its leader as the schedule is written has been seen to leave a ticket
// that never fires. So every engine also sweeps the tickets bucket every
// SweepEvery (sweepOverdue) and fires itself each timer more than
// overdueAfter past its time. The fire is the one the server would have
// published, under a message id, and the aggregate decides it as it does
// any fire: one that comes twice is refused (not_awaiting) and dropped.
//
// The projector runner also publishes, with no schedule, one fire per
// delegated child a commit stopped (aggregate.ChildrenToCancel): the
// engine that consumes it sends the child's delegation service a cancel,
// and acknowledges the fire only once the service has answered. So a
// cancel is delivered even when the engine that ended the run dies right
// after its commit.

// scheduleTimers publishes the schedules of the tickets a commit created.
func (e *Engine) scheduleTimers(ctx context.Context, runID string, evs []events.Event) error {
	for _, ev := range evs {
		a, ok := ev.(*events.CallAwaiting)
		if !ok {
			continue
		}
		t := a.Ticket
		if t.Deadline != nil {
			if err := e.schedule(ctx, runID, protocol.TimerFire{Action: protocol.TimerExpire, CorrelationID: t.CorrelationID}, *t.Deadline); err != nil {
				return err
			}
		}
		if t.Due != nil {
			if err := e.schedule(ctx, runID, protocol.TimerFire{Action: protocol.TimerPerform, CorrelationID: t.CorrelationID}, *t.Due); err != nil {
				return err
			}
		}
	}
	return nil
}

// publishCancels publishes a fire for each delegated child a commit of the
// run stopped. The message id makes a repeat (the projector handling the
// commit again after a crash) a duplicate the stream drops.
func (e *Engine) publishCancels(ctx context.Context, runID string, children []aggregate.ChildCancel) error {
	for _, c := range children {
		body, err := events.Marshal(protocol.TimerFire{Action: protocol.TimerCancelChild, CallID: c.CallID, Attempt: c.Attempt, ToolID: c.ToolID, OperationID: c.OperationID})
		if err != nil {
			return err
		}
		id := fmt.Sprintf("cancel/%s/%d", c.OperationID, c.Attempt)
		if _, err := e.fire(ctx, runID, body, id); err != nil {
			return fmt.Errorf("cancel of child %s: %w", id, err)
		}
	}
	return nil
}

// schedule publishes one schedule. Schedules have a one-second resolution:
// the time is rounded up, so a timer never fires before its time.
func (e *Engine) schedule(ctx context.Context, runID string, f protocol.TimerFire, at time.Time) error {
	body, err := events.Marshal(f)
	if err != nil {
		return err
	}
	if at.Truncate(time.Second) != at {
		at = at.Truncate(time.Second).Add(time.Second)
	}
	if now := e.cfg.Now(); !at.After(now) {
		at = now.Truncate(time.Second).Add(time.Second)
	}
	msg := nats.NewMsg(e.names.TimerAt(runID, f.Action, f.CorrelationID))
	msg.Data = body
	_, err = e.js.PublishMsg(ctx, msg, jetstream.WithScheduleAt(at), jetstream.WithScheduleTarget(e.names.TimerFire(runID)))
	if err != nil {
		return fmt.Errorf("schedule %s of %s at %s: %w", f.Action, f.CorrelationID, at.Format(time.RFC3339), err)
	}
	return nil
}

// fire publishes a fire of the run now, under a message id: a repeat
// within the timers stream's duplicate window is dropped (dup).
func (e *Engine) fire(ctx context.Context, runID string, body []byte, id string) (dup bool, err error) {
	msg := nats.NewMsg(e.names.TimerFire(runID))
	msg.Data = body
	ack, err := e.js.PublishMsg(ctx, msg, jetstream.WithMsgID(id))
	if err != nil {
		return false, err
	}
	return ack.Duplicate, nil
}

// overdueAfter is how long past its time a ticket's timer may be before
// the sweep fires it: a schedule fires within a second of its time (their
// resolution), and the run's engine resolves the ticket at once, or within
// a failover when its engine died.
const overdueAfter = 10 * time.Second

// sweepOverdue reads every open ticket and fires each timer that should
// have fired more than overdueAfter ago.
func (e *Engine) sweepOverdue(ctx context.Context) error {
	w, err := e.ticketsKV.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return fmt.Errorf("tickets bucket: %w", err)
	}
	defer func() { _ = w.Stop() }()
	cutoff := e.cfg.Now().Add(-overdueAfter)
	for {
		var entry jetstream.KeyValueEntry
		select {
		case <-ctx.Done():
			return fmt.Errorf("tickets bucket: %w", ctx.Err())
		case entry = <-w.Updates():
		}
		if entry == nil {
			return nil // every open ticket read
		}
		var t protocol.AwaitingOut
		if err := json.Unmarshal(entry.Value(), &t); err != nil {
			e.log.Warn().Str("key", entry.Key()).Err(err).Msg("ticket undecodable in the tickets bucket: not swept")
			continue
		}
		for _, tm := range [...]struct{ action, at string }{{protocol.TimerExpire, t.Deadline}, {protocol.TimerPerform, t.Due}} {
			if err := e.fireOverdue(ctx, t, tm.action, tm.at, cutoff); err != nil {
				return err
			}
		}
	}
}

// fireOverdue fires a ticket's timer (its action, due at at) when at is
// before cutoff.
func (e *Engine) fireOverdue(ctx context.Context, t protocol.AwaitingOut, action, at string, cutoff time.Time) error {
	if at == "" {
		return nil
	}
	due, err := time.Parse(time.RFC3339Nano, at)
	if err != nil {
		e.log.Warn().Str(fieldRunID, t.RunID).Err(err).Msg("ticket with an undecodable time in the tickets bucket: not swept")
		return nil
	}
	if !due.Before(cutoff) {
		return nil
	}
	body, err := events.Marshal(protocol.TimerFire{Action: action, CorrelationID: t.CorrelationID})
	if err != nil {
		return err
	}
	dup, err := e.fire(ctx, t.RunID, body, "overdue/"+action+"/"+t.CorrelationID)
	if err != nil || dup {
		return err // dup: fired by an earlier sweep, here or elsewhere
	}
	e.metrics.TimerOverdue(action)
	e.log.Warn().Str(fieldRunID, t.RunID).Str("action", action).Str("correlation_id", t.CorrelationID).Time("at", due).
		Msg("a ticket's timer did not fire in time (its stored schedule lost or late): fired by the sweep")
	return nil
}
