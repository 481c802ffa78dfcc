package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
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
// that never fires. So every engine keeps the tickets bucket in memory
// (openTickets) and, every SweepEvery, schedules again each open ticket's
// timer more than OverdueAfter past its time, for that time
// (sweepOverdue): the server's clock still decides when it fires, and the
// aggregate decides the fire as any other (one that comes twice is
// refused, not_awaiting, and dropped).
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
	if now := e.cfg.Now(); !at.After(now) {
		at = now.Truncate(time.Second).Add(time.Second)
	}
	return e.scheduleAt(ctx, runID, f, at)
}

// scheduleAt publishes a schedule for at (rounded up to the second), even
// a time already past: the server then fires it at once. Options are the
// publish's (a message id).
func (e *Engine) scheduleAt(ctx context.Context, runID string, f protocol.TimerFire, at time.Time, opts ...jetstream.PublishOpt) error {
	body, err := events.Marshal(f)
	if err != nil {
		return err
	}
	if at.Truncate(time.Second) != at {
		at = at.Truncate(time.Second).Add(time.Second)
	}
	msg := nats.NewMsg(e.names.TimerAt(runID, f.Action, f.CorrelationID))
	msg.Data = body
	opts = append(opts, jetstream.WithScheduleAt(at), jetstream.WithScheduleTarget(e.names.TimerFire(runID)))
	if _, err := e.js.PublishMsg(ctx, msg, opts...); err != nil {
		return fmt.Errorf("schedule %s of %s at %s: %w", f.Action, f.CorrelationID, at.Format(time.RFC3339), err)
	}
	return nil
}

// openTickets mirrors the tickets bucket (every run's open ticket, the
// projection's): what the sweep looks at, and toolbatch_tickets_open.
// Every engine keeps it, from one watch of the bucket; a ticket's key
// changes only when a run parks or its ticket is resolved.
type openTickets struct {
	mu    sync.Mutex
	byKey map[string]ticketTimes
	watch jetstream.KeyWatcher
	// again is when this engine last scheduled each overdue timer again
	// (by dueTimer.key); an entry goes with its ticket.
	again map[string]time.Time
}

// ticketTimes is what the sweep and the gauge read of a ticket: the
// fields of protocol.AwaitingOut they need (its arguments are not read).
type ticketTimes struct {
	RunID         string `json:"run_id"`
	CorrelationID string `json:"correlation_id"`
	Reason        string `json:"reason"`
	Deadline      string `json:"deadline"`
	Due           string `json:"due"`
}

// timers returns the ticket's timers: expire at its deadline, perform at
// its due time, each when set (and readable).
func (t ticketTimes) timers() []dueTimer {
	var out []dueTimer
	for _, tm := range [...]struct{ action, at string }{{protocol.TimerExpire, t.Deadline}, {protocol.TimerPerform, t.Due}} {
		if at, err := time.Parse(time.RFC3339Nano, tm.at); err == nil {
			out = append(out, dueTimer{runID: t.RunID, action: tm.action, correlationID: t.CorrelationID, at: at})
		}
	}
	return out
}

// dueTimer is one timer of an open ticket.
type dueTimer struct {
	runID, action, correlationID string
	at                           time.Time
	// first: this engine had not found it overdue before.
	first bool
}

func (d dueTimer) key() string { return d.action + "/" + d.correlationID }

func (t *openTickets) start(ctx context.Context, kv jetstream.KeyValue) error {
	t.byKey, t.again = map[string]ticketTimes{}, map[string]time.Time{}
	var err error
	t.watch, err = mirror(ctx, kv, protocol.TicketKeyPrefix+">", t.apply)
	return err
}

func (t *openTickets) apply(up jetstream.KeyValueEntry) {
	var tt ticketTimes
	put := up.Operation() == jetstream.KeyValuePut && json.Unmarshal(up.Value(), &tt) == nil
	t.mu.Lock()
	defer t.mu.Unlock()
	if old, ok := t.byKey[up.Key()]; ok && old.CorrelationID != tt.CorrelationID {
		for _, d := range old.timers() {
			delete(t.again, d.key())
		}
	}
	if !put {
		delete(t.byKey, up.Key())
		return
	}
	t.byKey[up.Key()] = tt
}

func (t *openTickets) stop() {
	if t != nil && t.watch != nil {
		_ = t.watch.Stop()
	}
}

// counts returns the open tickets by wait reason.
func (t *openTickets) counts() map[string]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[string]int{}
	for _, tt := range t.byKey {
		out[tt.Reason]++
	}
	return out
}

// sweepAgain is how long an engine waits before it schedules an overdue
// timer again, once it has: a fire that waits for the run's engine (one
// that died, say) is not joined by a new one every sweep.
const sweepAgain = 5 * time.Minute

// overdue returns the timers due before cutoff that this engine has not
// scheduled again within sweepAgain of now, and marks them scheduled.
func (t *openTickets) overdue(cutoff, now time.Time) []dueTimer {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []dueTimer
	for _, tt := range t.byKey {
		for _, d := range tt.timers() {
			if !d.at.Before(cutoff) {
				continue
			}
			last, seen := t.again[d.key()]
			if seen && now.Sub(last) < sweepAgain {
				continue
			}
			d.first = !seen
			t.again[d.key()] = now
			out = append(out, d)
		}
	}
	return out
}

// unmark says that a timer's schedule did not go out (its publish
// failed): the next sweep tries again.
func (t *openTickets) unmark(d dueTimer) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.again[d.key()]; ok {
		t.again[d.key()] = time.Time{}
	}
}

// sweepOverdue schedules again every open ticket's timer that should have
// fired more than OverdueAfter ago, at its own time: the server fires it
// at once, by its own clock, so an engine whose clock runs ahead makes no
// timer fire early. The schedule replaces the one on its subject, if the
// server still holds it; its message id keeps the sweeps of several
// engines to one within the timers stream's duplicate window.
func (e *Engine) sweepOverdue(ctx context.Context) error {
	now := e.cfg.Now()
	var errs []error
	for _, d := range e.tickets.overdue(now.Add(-e.cfg.OverdueAfter), now) {
		if d.first {
			e.metrics.TimerOverdue(d.action)
			e.log.Warn().Str(fieldRunID, d.runID).Str("action", d.action).Str("correlation_id", d.correlationID).Time("at", d.at).
				Msg("a ticket's timer has not fired (its stored schedule lost or late): scheduled again")
		}
		f := protocol.TimerFire{Action: d.action, CorrelationID: d.correlationID}
		if err := e.scheduleAt(ctx, d.runID, f, d.at, jetstream.WithMsgID("overdue/"+d.key())); err != nil {
			e.tickets.unmark(d)
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
