package aggregate

import (
	"bytes"
	"fmt"
	"reflect"

	"github.com/toolbatch/toolbatch/events"
)

// TransitionError reports an event that cannot be applied to the state.
type TransitionError struct {
	Event events.Type
	Call  string
	Err   error
}

func (e *TransitionError) Error() string {
	if e.Call != "" {
		return fmt.Sprintf("apply %s to call %s: %v", e.Event, e.Call, e.Err)
	}
	return fmt.Sprintf("apply %s: %v", e.Event, e.Err)
}

func (e *TransitionError) Unwrap() error { return e.Err }

// Apply folds one event into the state. An event that is not a legal
// transition returns a *TransitionError and leaves the state unchanged:
// every check runs before any field is written.
func (r *Run) Apply(e events.Event) error {
	if e == nil || reflect.ValueOf(e).IsNil() {
		return &TransitionError{Event: "nil", Err: ErrMalformedCommand}
	}
	if err := r.apply(e); err != nil {
		return err
	}
	r.Version++
	return nil
}

// ApplyAll folds events in order; it stops at the first error, with the
// events before it applied.
func (r *Run) ApplyAll(evs []events.Event) error {
	for _, e := range evs {
		if err := r.Apply(e); err != nil {
			return err
		}
	}
	return nil
}

func fail(e events.Event, call string, err error) error {
	return &TransitionError{Event: e.EventType(), Call: call, Err: err}
}

// callOf finds a non-terminal call of the open batch for a call-level event.
func (r *Run) callOf(e events.Event, batchID, callID string, allowTerminal bool) (*Call, int, error) {
	b := r.OpenBatch()
	if b == nil || b.ID != batchID {
		return nil, -1, fail(e, callID, fmt.Errorf("%w (batch %s)", ErrNoBatch, batchID))
	}
	c, i := b.Call(callID)
	if c == nil {
		return nil, -1, fail(e, callID, ErrUnknownCall)
	}
	if !allowTerminal && c.Phase.Terminal() {
		return nil, -1, fail(e, callID, ErrCallTerminal)
	}
	return c, i, nil
}

// earlierOpen reports whether a call before index i is not terminal.
func (b *Batch) earlierOpen(i int) bool {
	for j := 0; j < i; j++ {
		if !b.Calls[j].Phase.Terminal() {
			return true
		}
	}
	return false
}

func (r *Run) apply(e events.Event) error {
	switch ev := e.(type) {
	case *events.BatchSubmitted:
		return r.applySubmitted(ev)
	case *events.BatchRejected:
		return nil // a rejected batch changes nothing and does not use up its step
	case *events.CallGated:
		c, i, err := r.callOf(e, ev.BatchID, ev.CallID, false)
		if err != nil {
			return err
		}
		if c.Phase != events.PhaseRequested {
			return fail(e, ev.CallID, ErrNotRequested)
		}
		if r.Batch.Ticket != nil {
			return fail(e, ev.CallID, ErrParked)
		}
		if r.Batch.earlierOpen(i) && !r.Batch.pendingParallel(i) {
			return fail(e, ev.CallID, ErrOutOfOrder)
		}
		g := *ev
		c.Gate = &g
		return nil
	case *events.CallExecuting:
		return r.applyExecuting(ev)
	case *events.CallClaimed:
		c, _, err := r.callOf(e, ev.BatchID, ev.CallID, false)
		if err != nil {
			return err
		}
		switch {
		case c.Phase != events.PhaseExecuting:
			return fail(e, ev.CallID, ErrNotExecuting)
		case c.Tool.Target != events.TargetSandbox:
			return fail(e, ev.CallID, ErrNotSandbox)
		case ev.Attempt != c.Attempt:
			return fail(e, ev.CallID, ErrStaleAttempt)
		case c.Claim != nil:
			return fail(e, ev.CallID, ErrAlreadyClaimed)
		}
		c.Claim = &Grant{Attempt: ev.Attempt, WorkerID: ev.WorkerID, Incarnation: ev.Incarnation, Token: ev.ClaimToken, LeaseMS: ev.LeaseMS, At: ev.At}
		c.Crossed = true
		c.Entries++
		return nil
	case *events.CallCompleted:
		c, i, err := r.callOf(e, ev.BatchID, ev.CallID, false)
		if err != nil {
			return err
		}
		switch c.Phase {
		case events.PhaseRequested:
			if ev.Attempt != c.Attempt {
				return fail(e, ev.CallID, ErrStaleAttempt)
			}
			if r.Batch.earlierOpen(i) && !r.Batch.Parallel && !r.Batch.pendingParallel(i) {
				return fail(e, ev.CallID, ErrOutOfOrder)
			}
		case events.PhaseExecuting:
			if ev.Attempt != c.Attempt {
				return fail(e, ev.CallID, ErrStaleAttempt)
			}
		case events.PhaseAwaiting:
			// Only a run end completes an awaiting call directly (interrupt);
			// a resume resolves the ticket first.
			if t := r.Batch.Ticket; t != nil && t.CallID == c.CallID {
				r.Correlations = with(r.Correlations, t.CorrelationID, true)
				r.Batch.Ticket = nil
			}
		default:
			return fail(e, ev.CallID, fmt.Errorf("cannot complete a call in phase %s", c.Phase))
		}
		out := ev.Output
		if ev.ErrorKind == events.ErrorUnavailableBeforeDispatch {
			c.undoEntry()
		}
		c.Phase = events.PhaseCompleted
		c.Output, c.OutputBytes = &out, events.OutputSize(out)
		c.ErrorKind = ev.ErrorKind
		return nil
	case *events.CallIndeterminate:
		c, _, err := r.callOf(e, ev.BatchID, ev.CallID, false)
		if err != nil {
			return err
		}
		if t := r.Batch.Ticket; t != nil && t.CallID == c.CallID {
			r.Correlations = with(r.Correlations, t.CorrelationID, true)
			r.Batch.Ticket = nil
		}
		c.Phase = events.PhaseIndeterminate
		c.Reason = ev.Reason
		return nil
	case *events.CallAwaiting:
		c, i, err := r.callOf(e, ev.BatchID, ev.CallID, false)
		if err != nil {
			return err
		}
		t := ev.Ticket
		switch {
		case r.Batch.Ticket != nil:
			return fail(e, ev.CallID, ErrParked)
		case t.CallID != c.CallID || t.BatchID != r.Batch.ID || t.RunID != r.RunID:
			return fail(e, ev.CallID, fmt.Errorf("ticket names call %s of batch %s of run %s", t.CallID, t.BatchID, t.RunID))
		case t.Reason == events.WaitDelegation && c.Phase != events.PhaseExecuting:
			return fail(e, ev.CallID, ErrNotExecuting)
		case t.Reason != events.WaitDelegation && c.Phase != events.PhaseRequested:
			return fail(e, ev.CallID, ErrNotRequested)
		case t.Reason != events.WaitDelegation && r.Batch.earlierOpen(i):
			return fail(e, ev.CallID, ErrOutOfOrder)
		case r.hasCorrelation(t.CorrelationID):
			return fail(e, ev.CallID, ErrCorrelationUsed)
		}
		c.Phase = events.PhaseAwaiting
		r.Batch.Ticket = &t
		r.Correlations = with(r.Correlations, t.CorrelationID, false)
		return nil
	case *events.TicketResolved:
		c, _, err := r.callOf(e, ev.BatchID, ev.CallID, false)
		if err != nil {
			return err
		}
		t := r.Batch.Ticket
		if t == nil || t.CorrelationID != ev.CorrelationID || t.CallID != c.CallID {
			return fail(e, ev.CallID, fmt.Errorf("no ticket %s for the call", ev.CorrelationID))
		}
		if ev.Resolution == events.ResolutionInput {
			c.Phase = events.PhaseExecuting // the delegated child goes on with the same attempt
			c.Input = ev.Input
			c.HasInput = true
		} else {
			c.Phase = events.PhaseRequested // its consequence follows in the same commit
		}
		r.Correlations = with(r.Correlations, t.CorrelationID, true)
		r.Batch.Ticket = nil
		return nil
	case *events.ResultRefused:
		if r.Batch == nil {
			return fail(e, ev.CallID, ErrNoBatch)
		}
		return nil // recorded for audit; it changes nothing
	case *events.BatchFinalized:
		b := r.OpenBatch()
		if b == nil || b.ID != ev.BatchID {
			return fail(e, "", fmt.Errorf("%w (batch %s)", ErrNoBatch, ev.BatchID))
		}
		if !b.AllTerminal() {
			return fail(e, "", fmt.Errorf("%w: not every call is terminal", ErrOutOfOrder))
		}
		want := Finalization(b)
		if !resultsEqual(want.Results, ev.Results) || !commandsEqual(want.State, ev.State) || want.Conflict != ev.Conflict {
			return fail(e, "", ErrResultsDiffer)
		}
		b.Finalized = true
		b.Results = ev.Results
		b.State = ev.State
		b.Conflict = ev.Conflict
		return nil
	case *events.RunEnded:
		if r.End != nil {
			return fail(e, "", ErrRunEnded)
		}
		if r.OpenBatch() != nil {
			return fail(e, "", fmt.Errorf("%w: the open batch must be finalized first", ErrOutOfOrder))
		}
		r.End = &Ended{Cause: ev.Cause, Reason: ev.Reason, At: ev.At}
		return nil
	default:
		return fail(e, "", fmt.Errorf("%w: %T", events.ErrUnknownEventType, e))
	}
}

func (r *Run) hasCorrelation(id string) bool {
	_, ok := r.Correlations[id]
	return ok
}

func (r *Run) applySubmitted(ev *events.BatchSubmitted) error {
	switch {
	case r.End != nil:
		return fail(ev, "", ErrRunEnded)
	case r.OpenBatch() != nil:
		return fail(ev, "", fmt.Errorf("%w: batch %s is open", ErrOutOfOrder, r.Batch.ID))
	case r.RunID != "" && ev.RunID != r.RunID:
		return fail(ev, "", fmt.Errorf("batch of run %s folded into run %s", ev.RunID, r.RunID))
	case r.HasStep && ev.Step <= r.LastStep:
		return fail(ev, "", fmt.Errorf("step %d is not after %d", ev.Step, r.LastStep))
	case ev.BatchID != events.BatchID(ev.RunID, ev.Step):
		return fail(ev, "", fmt.Errorf("batch id %s does not match run and step", ev.BatchID))
	}
	calls := make([]Call, len(ev.Calls))
	for i, c := range ev.Calls {
		calls[i] = Call{Call: c, Phase: events.PhaseRequested}
	}
	r.RunID = ev.RunID
	r.ThreadID = ev.ThreadID
	r.HasStep = true
	r.LastStep = ev.Step
	r.Digests = with(r.Digests, ev.Step, ev.Digest)
	r.Batch = &Batch{
		ID: ev.BatchID, Step: ev.Step, ThreadID: ev.ThreadID, SnapshotID: ev.SnapshotID,
		Narrowing: ev.Narrowing, Assistant: ev.Assistant, Calls: calls,
		Digest: ev.Digest, MsgID: ev.MsgID, InboxSeq: ev.InboxSeq,
	}
	return nil
}

func (r *Run) applyExecuting(ev *events.CallExecuting) error {
	c, i, err := r.callOf(ev, ev.BatchID, ev.CallID, false)
	if err != nil {
		return err
	}
	b := r.Batch
	switch {
	case c.Phase != events.PhaseRequested && c.Phase != events.PhaseExecuting:
		return fail(ev, ev.CallID, fmt.Errorf("cannot execute a call in phase %s", c.Phase))
	case ev.Attempt != c.Attempt+1:
		return fail(ev, ev.CallID, fmt.Errorf("%w: attempt %d after %d", ErrStaleAttempt, ev.Attempt, c.Attempt))
	case ev.Attempt > c.Tool.Policy.MaxAttempts:
		return fail(ev, ev.CallID, fmt.Errorf("attempt %d exceeds max_attempts %d", ev.Attempt, c.Tool.Policy.MaxAttempts))
	case ev.OperationID != b.OperationID(c.CallID):
		return fail(ev, ev.CallID, fmt.Errorf("operation id %s is not %s", ev.OperationID, b.OperationID(c.CallID)))
	case b.Ticket != nil && c.Phase == events.PhaseRequested:
		return fail(ev, ev.CallID, ErrParked)
	case ev.Parallel != b.Parallel && c.Phase == events.PhaseExecuting:
		return fail(ev, ev.CallID, fmt.Errorf("parallel flag changed within the batch"))
	case ev.Parallel && !b.ParallelEligible():
		return fail(ev, ev.CallID, fmt.Errorf("the batch is not eligible for the parallel branch"))
	case !ev.Parallel && b.earlierOpen(i):
		return fail(ev, ev.CallID, ErrOutOfOrder)
	case c.Tool.Kind == events.KindClient || c.Tool.Kind == events.KindUnknown:
		return fail(ev, ev.CallID, fmt.Errorf("a %s call is never executed by the engine", c.Tool.Kind))
	}
	if ev.Cause == events.CauseRetry {
		c.undoEntry() // the previous attempt never crossed its boundary
	}
	if ev.Parallel {
		b.Parallel = true
	}
	c.Phase = events.PhaseExecuting
	c.Attempt = ev.Attempt
	if ev.Cause != events.CauseRecovered {
		// A recovered attempt resumes the child with the input it was
		// last given; any other attempt starts it.
		c.Input, c.HasInput = "", false
	}
	c.Capability = ev.Capability
	c.Claim = nil
	c.Crossed = c.Tool.Target != events.TargetSandbox
	if c.Crossed {
		c.Entries++
	}
	return nil
}

// resultsEqual and commandsEqual compare a finalization's lists as
// reflect.DeepEqual does, except that a nil list and an empty one are
// alike (at the top only), without reflection: this check runs for every
// batch folded. equal_test.go holds them to reflect.DeepEqual, and fails
// when a field is added to the types they compare.
func resultsEqual(a, b []events.ContentBlock) bool {
	if len(a) == 0 && len(b) == 0 {
		return true
	}
	return blocksEqual(a, b)
}

func commandsEqual(a, b []events.Command) bool {
	if len(a) == 0 && len(b) == 0 {
		return true
	}
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := &a[i], &b[i]
		if x.Scope != y.Scope || x.Key != y.Key || x.Merge != y.Merge || x.Action != y.Action || !rawEqual(x.Value, y.Value) {
			return false
		}
	}
	return true
}

// blocksEqual is reflect.DeepEqual on block lists: nil differs from empty.
func blocksEqual(a, b []events.ContentBlock) bool {
	if (a == nil) != (b == nil) || len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := &a[i], &b[i]
		if x.Type != y.Type || x.Text != y.Text || x.ID != y.ID || x.Name != y.Name || x.ToolUseID != y.ToolUseID ||
			x.IsError != y.IsError || !rawEqual(x.Input, y.Input) || !rawEqual(x.Value, y.Value) ||
			!rawEqual(x.Extra, y.Extra) || !sourceEqual(x.Source, y.Source) || !blocksEqual(x.Content, y.Content) {
			return false
		}
	}
	return true
}

func sourceEqual(a, b *events.ImageSource) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// rawEqual is reflect.DeepEqual on JSON texts: nil differs from empty.
func rawEqual(a, b events.RawJSON) bool {
	return (a == nil) == (b == nil) && bytes.Equal(a, b)
}

// undoEntry takes back the entry counted when a brain or delegation attempt
// entered executing, once its executor proved it was never reached
// (unavailable_before_dispatch). Sandbox entries are counted at the claim,
// which such an attempt never had.
func (c *Call) undoEntry() {
	if c.Crossed && c.Tool.Target != events.TargetSandbox && c.Entries > 0 {
		c.Entries--
	}
	c.Crossed = false
}

// pendingParallel reports whether the calls before index i are all still
// requested with an allowing gate decision in a batch eligible for the
// parallel branch: the gates of the parallel branch are committed together,
// before any call starts.
func (b *Batch) pendingParallel(i int) bool {
	if !b.ParallelEligible() {
		return false
	}
	for j := 0; j < i; j++ {
		c := b.Calls[j]
		if c.Phase.Terminal() {
			continue
		}
		if c.Phase != events.PhaseRequested || c.Gate == nil || c.Gate.Outcome != events.GateAllow {
			return false
		}
	}
	return true
}
