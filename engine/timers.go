package engine

import (
	"context"
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
		msg := nats.NewMsg(e.names.TimerFire(runID))
		msg.Data = body
		id := fmt.Sprintf("cancel/%s/%d", c.OperationID, c.Attempt)
		if _, err := e.js.PublishMsg(ctx, msg, jetstream.WithMsgID(id)); err != nil {
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
