package aggregate

import (
	"github.com/toolbatch/toolbatch/events"
)

// Texts of resolved tickets.
const (
	TextConfirmationTimedOut = "blocked: confirmation timed out"
	TextClientTimedOut       = "client result timed out"
	TextDelegationTimedOut   = "delegation input timed out"
)

// ticketFor finds the run's ticket for a correlation id, or the refusal
// that says why there is none: a correlation id never issued in this run is
// unknown; one already resolved (a double click, a stale resume) is
// not_awaiting.
func (d *decider) ticketFor(correlationID string) (*Batch, *events.Ticket, error) {
	r := d.run
	if t := r.Ticket(); t != nil && t.CorrelationID == correlationID {
		return r.Batch, t, nil
	}
	if _, issued := r.Correlations[correlationID]; issued {
		return nil, nil, events.Refuse(events.CodeNotAwaiting, "ticket %s was already resolved", correlationID)
	}
	return nil, nil, events.Refuse(events.CodeUnknownCorrelation, "no ticket %s in run %s", correlationID, r.RunID)
}

func (d *decider) resume(rs Resume) error {
	m := &rs.Answer
	if m.RunID != d.run.RunID {
		return events.Refuse(events.CodeWrongRun, "resume names run %q, this is run %q", m.RunID, d.run.RunID)
	}
	b, t, err := d.ticketFor(m.CorrelationID)
	if err != nil {
		return err
	}
	res := m.Result
	switch {
	case m.ThreadID != t.ThreadID:
		return events.Refuse(events.CodeWrongThread, "resume names thread %q, the ticket's is %q", m.ThreadID, t.ThreadID)
	case m.SnapshotID != "" && m.SnapshotID != t.SnapshotID:
		return events.Refuse(events.CodeWrongSnapshot, "resume names snapshot %q, the ticket's is %q", m.SnapshotID, t.SnapshotID)
	case m.CallID != "" && m.CallID != t.CallID:
		return events.Refuse(events.CodeWrongCall, "resume names call %q, the ticket's is %q", m.CallID, t.CallID)
	case !resultFits(t.Reason, res.Kind):
		return events.Refuse(events.CodeWrongResultKind, "%s tickets take %s results, not %s", t.Reason, fittingKind(t.Reason), res.Kind)
	case res.Kind == events.ResultToolResult && (res.Output == nil || res.Output.CallID != t.CallID):
		got := ""
		if res.Output != nil {
			got = res.Output.CallID
		}
		return events.Refuse(events.CodeWrongCall, "the output is for call %q, the ticket's is %q", got, t.CallID)
	case t.Deadline != nil && !rs.At.Before(*t.Deadline):
		return events.Refuse(events.CodeExpired, "ticket %s expired at %s", t.CorrelationID, t.Deadline.UTC().Format("2006-01-02T15:04:05Z07:00"))
	}
	c, _ := b.Call(t.CallID)
	resolved := &events.TicketResolved{BatchID: b.ID, CallID: c.CallID, CorrelationID: t.CorrelationID, Principal: rs.Principal, At: rs.At}
	switch res.Kind {
	case events.ResultPermission:
		if !res.Allow {
			resolved.Resolution = events.ResolutionDenied
			resolved.Note = res.Reason
			reason := res.Reason
			if reason == "" {
				reason = "denied"
			}
			return d.emitAll(resolved, &events.CallCompleted{BatchID: b.ID, CallID: c.CallID, Attempt: c.Attempt,
				Output: events.ErrorOutput(c.CallID, "blocked: "+reason), At: rs.At})
		}
		resolved.Resolution = events.ResolutionApproved
		resolved.Note = res.Note
		if err := d.emit(resolved); err != nil {
			return err
		}
		return d.execute(b, c.CallID, rs.Capability, events.CauseApproved, rs.Principal, false, rs.At)
	case events.ResultToolResult:
		resolved.Resolution = events.ResolutionToolResult
		return d.emitAll(resolved, &events.CallCompleted{BatchID: b.ID, CallID: c.CallID, Attempt: c.Attempt,
			Output: res.Output.Normalized(c.CallID), At: rs.At})
	default: // input
		resolved.Resolution = events.ResolutionInput
		resolved.Input = res.Text
		return d.emit(resolved)
	}
}

func resultFits(w events.WaitKind, k events.ResultKind) bool {
	return k == fittingKind(w)
}

func fittingKind(w events.WaitKind) events.ResultKind {
	switch w {
	case events.WaitExternalResult:
		return events.ResultToolResult
	case events.WaitDelegation:
		return events.ResultInput
	default: // permission, scheduled_action
		return events.ResultPermission
	}
}

func (d *decider) emitAll(evs ...events.Event) error {
	for _, e := range evs {
		if err := d.emit(e); err != nil {
			return err
		}
	}
	return nil
}

func (d *decider) perform(p Perform) error {
	b, t, err := d.ticketFor(p.CorrelationID)
	if err != nil {
		return err
	}
	if t.Reason != events.WaitScheduledAction {
		return events.Refuse(events.CodeWrongResultKind, "ticket %s is a %s ticket; only scheduled actions are performed", t.CorrelationID, t.Reason)
	}
	if p.Timer && (t.Due == nil || p.At.Before(*t.Due)) {
		return ErrNotDue
	}
	resolved := &events.TicketResolved{BatchID: b.ID, CallID: t.CallID, CorrelationID: t.CorrelationID,
		Resolution: events.ResolutionPerformed, Principal: p.Principal, At: p.At}
	if p.Timer {
		resolved.Note = "due"
	}
	if err := d.emit(resolved); err != nil {
		return err
	}
	return d.execute(b, t.CallID, p.Capability, events.CausePerformed, resolved.Note, false, p.At)
}

func (d *decider) expire(x Expire) error {
	b, t, err := d.ticketFor(x.CorrelationID)
	if err != nil {
		return err
	}
	if t.Deadline == nil || x.At.Before(*t.Deadline) {
		return ErrNotDue
	}
	c, _ := b.Call(t.CallID)
	resolved := &events.TicketResolved{BatchID: b.ID, CallID: c.CallID, CorrelationID: t.CorrelationID,
		Resolution: events.ResolutionExpired, At: x.At}
	var text string
	switch t.Reason {
	case events.WaitExternalResult:
		text = TextClientTimedOut
	case events.WaitDelegation:
		text = TextDelegationTimedOut
	default: // permission, and a scheduled action that was never performed
		text = TextConfirmationTimedOut
	}
	return d.emitAll(resolved, &events.CallCompleted{BatchID: b.ID, CallID: c.CallID, Attempt: c.Attempt,
		Output: events.ErrorOutput(c.CallID, text), At: x.At})
}
