package projector

import (
	"errors"
	"fmt"
	"reflect"

	"github.com/toolbatch/toolbatch/aggregate"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/protocol"
)

// Errors of the projection.
var (
	// ErrNilEvent is returned for a nil event (or a nil event pointer).
	ErrNilEvent = errors.New("projector: nil event")
	// ErrNoPayload is returned when encoding an Output whose payload for
	// its kind is missing, or whose kind is not one of the Kind constants.
	ErrNoPayload = errors.New("projector: output has no payload for its kind")
)

// Output kinds: the last token of the subject <prefix>.out.<run_id>.<kind>
// (protocol's out kinds; refusals of resumes and controls are published
// by the engine, not derived here).
const (
	KindDisposition = protocol.OutDisposition
	KindResults     = protocol.OutResults
	KindAwaiting    = protocol.OutAwaiting
	KindEnded       = protocol.OutEnded
	KindRejected    = protocol.OutRejected
)

// Output is one message to publish on toolbatch.out.<run_id>.<kind>. Exactly
// one payload is set: the one of its Kind.
type Output struct {
	Kind        string
	Disposition *protocol.DispositionOut
	Results     *protocol.ResultsOut
	Awaiting    *protocol.AwaitingOut
	Ended       *protocol.EndedOut
	Rejected    *protocol.RejectedOut
}

// Subject returns the subject suffix of the output (its kind): the last
// token of <prefix>.out.<run_id>.<kind>.
func (o Output) Subject() string { return o.Kind }

// Body returns the payload of the output's kind, or nil when it is missing.
func (o Output) Body() any {
	switch o.Kind {
	case KindDisposition:
		if o.Disposition != nil {
			return o.Disposition
		}
	case KindResults:
		if o.Results != nil {
			return o.Results
		}
	case KindAwaiting:
		if o.Awaiting != nil {
			return o.Awaiting
		}
	case KindEnded:
		if o.Ended != nil {
			return o.Ended
		}
	case KindRejected:
		if o.Rejected != nil {
			return o.Rejected
		}
	}
	return nil
}

// Encode returns the msgpack body to publish. Equal outputs give equal
// bytes, so an audit can compare published bodies with re-derived ones.
func (o Output) Encode() ([]byte, error) {
	body := o.Body()
	if body == nil {
		return nil, fmt.Errorf("%w: kind %q", ErrNoPayload, o.Kind)
	}
	b, err := events.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("encode %s output: %w", o.Kind, err)
	}
	return b, nil
}

// Model is the projection state of one run: the folded aggregate and the
// number of events applied to it. The zero Model is a run with no events;
// Project adopts the run id of its first batch.
type Model struct {
	Run     *aggregate.Run
	Applied int
}

// NewModel returns the empty model of a run: events of another run are
// refused.
func NewModel(runID string) Model { return Model{Run: aggregate.New(runID)} }

// Project folds e into a copy of m and returns the new model and what to
// publish because of e, in publication order. It never changes m. An event
// the aggregate cannot apply returns the error (wrapping the aggregate's
// *aggregate.TransitionError), m unchanged and no outputs.
func Project(m Model, e events.Event) (Model, []Output, error) {
	if isNil(e) {
		return m, nil, fmt.Errorf("project event %d: %w", m.Applied+1, ErrNilEvent)
	}
	var next *aggregate.Run
	if m.Run == nil {
		next = aggregate.New("")
	} else {
		next = m.Run.Clone()
	}
	if err := next.Apply(e); err != nil {
		return m, nil, fmt.Errorf("project event %d (%s): %w", m.Applied+1, e.EventType(), err)
	}
	out := outputs(next, e)
	return Model{Run: next, Applied: m.Applied + 1}, out, nil
}

// Quiet reports whether e derives no output whatever the run: Project
// returns none for it.
func Quiet(e events.Event) bool {
	switch e.(type) {
	case *events.CallAwaiting, *events.BatchFinalized, *events.RunEnded, *events.BatchRejected:
		return false
	}
	return true
}

// outputs returns what e causes to be published, given the state after it
// (nothing for an event Quiet reports).
func outputs(r *aggregate.Run, e events.Event) []Output {
	switch ev := e.(type) {
	case *events.CallAwaiting:
		out := dispositionOutputs(r)
		if t := r.Ticket(); t != nil {
			a := protocol.Awaiting(*t)
			out = append(out, Output{Kind: KindAwaiting, Awaiting: &a})
		}
		return out
	case *events.BatchFinalized:
		out := dispositionOutputs(r)
		res := &protocol.ResultsOut{
			BatchID: ev.BatchID,
			Step:    ev.Step,
			Results: append([]events.ContentBlock{}, ev.Results...),
			State:   append([]events.Command{}, ev.State...),
		}
		if b := r.Batch; b != nil && b.ID == ev.BatchID {
			res.Submission = submissionOut(b.MsgID, b.InboxSeq, b.Digest)
		}
		return append(out, Output{Kind: KindResults, Results: res})
	case *events.RunEnded:
		return []Output{{Kind: KindEnded, Ended: &protocol.EndedOut{Cause: ev.Cause, Reason: ev.Reason}}}
	case *events.BatchRejected:
		return []Output{{Kind: KindRejected, Rejected: &protocol.RejectedOut{BatchID: ev.BatchID, Code: ev.Code, Reason: ev.Reason,
			Submission: submissionOut(ev.MsgID, ev.InboxSeq, ev.Digest)}}}
	default:
		return nil
	}
}

// submissionOut names a submission; nil when the log did not record where
// it came from (written before submissions were named: what the engine
// published for it then named none, and the projection must derive the
// same).
func submissionOut(msgID string, inboxSeq uint64, digest string) *protocol.SubmissionOut {
	if msgID == "" && inboxSeq == 0 {
		return nil
	}
	return &protocol.SubmissionOut{MsgID: msgID, InboxSeq: inboxSeq, Digest: digest}
}

func dispositionOutputs(r *aggregate.Run) []Output {
	ds := Dispositions(r)
	out := make([]Output, 0, len(ds)+1)
	for i := range ds {
		out = append(out, Output{Kind: KindDisposition, Disposition: &ds[i]})
	}
	return out
}

// Dispositions returns the disposition of every call of the run's current
// batch (open or finalized), in model order, by the rule of contract.md §5:
// derived from the committed ticket, not from call phases. It returns nil
// when the run has no batch.
func Dispositions(r *aggregate.Run) []protocol.DispositionOut {
	if r == nil || r.Batch == nil {
		return nil
	}
	b := r.Batch
	out := make([]protocol.DispositionOut, len(b.Calls))
	for i, c := range b.Calls {
		out[i] = protocol.DispositionOut{
			BatchID:     b.ID,
			CallID:      c.CallID,
			ToolID:      c.ToolID,
			Disposition: disposition(b.Ticket, c.CallID),
			Phase:       c.Phase,
			Attempt:     c.Attempt,
		}
	}
	return out
}

// disposition is the §5 rule for one call given the batch's ticket.
func disposition(t *events.Ticket, callID string) events.Disposition {
	if t == nil || t.CallID != callID {
		return events.DispositionExecuted
	}
	switch t.Reason {
	case events.WaitPermission:
		return events.DispositionPendingBuiltin
	case events.WaitExternalResult:
		return events.DispositionPendingClient
	default: // scheduled_action, delegation
		return events.DispositionExecuted
	}
}

// ProjectAll folds a run's events from zero and returns every output in
// publication order. It is what an audit compares with what was published
// (invariant 8); the same events always give identical outputs. On an event
// that cannot be applied it returns the outputs of the events before it and
// the error.
func ProjectAll(runID string, evs []events.Event) ([]Output, error) {
	m := NewModel(runID)
	var all []Output
	for _, e := range evs {
		next, out, err := Project(m, e)
		if err != nil {
			return all, err
		}
		m = next
		all = append(all, out...)
	}
	return all, nil
}

// isNil reports whether e is nil or a nil pointer: the aggregate would
// panic on either.
func isNil(e events.Event) bool {
	if e == nil {
		return true
	}
	v := reflect.ValueOf(e)
	return v.Kind() == reflect.Pointer && v.IsNil()
}
