package aggregate

import (
	"errors"
	"fmt"
	"time"

	"github.com/toolbatch/toolbatch/events"
)

// Decide returns the events that carry out cmd on the run, in the order they
// must be committed (one commit), and the run after them: the events are
// folded once, here, and the caller keeps the returned run. Decide never
// changes r. A refused or illegal command returns an error and no events; a
// command that is already done (a duplicate submission, a repeated cancel)
// returns no events and no error, and r itself.
//
// A refused submission is not an error: its answer is the BatchRejected
// event that records it (see Submit and Reject), and a worker's result that
// is not the current claim is recorded as ResultRefused (see Result).
//
// The returned events include every follow-up that needs no IO: calls of a
// tool the catalog lacks (or of a name that is no tool id) complete with
// "unknown tool", calls whose input is not a JSON object with
// invalid_arguments, a batch whose calls
// are all terminal is finalized (the barrier), and an indeterminate
// delegation ends the run. So a commit always leaves the run waiting for
// the engine (a gate, an executor, a ticket) or done.
func Decide(r *Run, cmd Command) (*Run, []events.Event, error) {
	d := &decider{run: r.Clone()}
	var err error
	switch c := cmd.(type) {
	case Submit:
		err = d.submit(c)
		if ref := refusal(err); ref != nil {
			d = &decider{run: r.Clone()}
			err = d.reject(Reject{Step: c.Submission.Step, HasStep: true, Refusal: ref,
				MsgID: c.MsgID, InboxSeq: c.InboxSeq, Digest: c.Submission.Digest, At: c.At})
		}
	case Reject:
		err = d.reject(c)
	case Gate:
		err = d.gate(c)
	case ParkClient:
		err = d.parkClient(c)
	case Claim:
		err = d.claim(c)
	case Complete:
		err = d.complete(c)
	case Result:
		err = d.result(c)
	case Resume:
		err = d.resume(c)
	case Perform:
		err = d.perform(c)
		if errors.Is(err, ErrRunEnded) || errors.Is(err, ErrNoBatch) {
			// Nothing awaits a perform in a run without an open batch.
			err = events.Refuse(events.CodeNotAwaiting, "%v", err)
		}
	case Expire:
		err = d.expire(c)
	case DelegationAwait:
		err = d.delegationAwait(c)
	case LeaseExpired:
		err = d.leaseExpired(c)
	case Recover:
		err = d.recover(c)
	case End:
		err = d.end(c.Cause, c.Reason, c.At)
	default:
		err = fmt.Errorf("%w: %T", ErrMalformedCommand, cmd)
	}
	if err != nil {
		return r, nil, err
	}
	if len(d.out) == 0 {
		return r, nil, nil
	}
	if err := d.advance(commandTime(cmd)); err != nil {
		return r, nil, err
	}
	return d.run, d.out, nil
}

func commandTime(cmd Command) time.Time {
	switch c := cmd.(type) {
	case Submit:
		return c.At
	case Reject:
		return c.At
	case Result:
		return c.At
	case Gate:
		return c.At
	case ParkClient:
		return c.At
	case Claim:
		return c.At
	case Complete:
		return c.At
	case Resume:
		return c.At
	case Perform:
		return c.At
	case Expire:
		return c.At
	case DelegationAwait:
		return c.At
	case LeaseExpired:
		return c.At
	case Recover:
		return c.At
	case End:
		return c.At
	}
	return time.Time{}
}

// decider applies each event it emits to its own copy of the run, so that
// later decisions in the same command see earlier ones.
type decider struct {
	run *Run
	out []events.Event
}

func (d *decider) emit(e events.Event) error {
	if err := d.run.Apply(e); err != nil {
		return err
	}
	d.out = append(d.out, e)
	return nil
}

// refusal returns err's *events.Refusal, or nil.
func refusal(err error) *events.Refusal {
	var ref *events.Refusal
	if errors.As(err, &ref) {
		return ref
	}
	return nil
}

// reject records a refused submission: the projector publishes it on
// .rejected.
func (d *decider) reject(c Reject) error {
	ref := c.Refusal
	if ref == nil {
		return fmt.Errorf("%w: a rejection without a refusal", ErrMalformedCommand)
	}
	ev := &events.BatchRejected{RunID: d.run.RunID, Code: ref.Code, Reason: ref.Reason,
		MsgID: c.MsgID, InboxSeq: c.InboxSeq, Digest: c.Digest, At: c.At}
	if c.HasStep {
		ev.BatchID = events.BatchID(d.run.RunID, c.Step)
		ev.Step = c.Step
	}
	return d.emit(ev)
}

func (d *decider) submit(c Submit) error {
	r, s := d.run, &c.Submission
	calls := s.Assistant.ToolUses()
	if len(c.Tools) != len(calls) {
		return fmt.Errorf("%w: %d descriptors for %d calls", ErrMalformedCommand, len(c.Tools), len(calls))
	}
	if r.RunID != "" && s.RunID != r.RunID {
		return events.Refuse(events.CodeInvalidID, "run_id %q is not this run (%q)", s.RunID, r.RunID)
	}
	digest := s.Digest
	if r.HasStep && r.Digests[s.Step] == digest {
		return nil // the identical batch again: harmless and silent
	}
	switch {
	case r.End != nil:
		return events.Refuse(events.CodeRunEnded, "run %s ended (%s)", r.RunID, r.End.Cause)
	case r.OpenBatch() != nil:
		return events.Refuse(events.CodeBatchOpen, "batch %s is not finalized yet", r.Batch.ID)
	case r.HasStep && s.Step <= r.LastStep:
		return events.Refuse(events.CodeStepNotAfterLast, "step %d is not after the last accepted step %d", s.Step, r.LastStep)
	case r.ThreadID != "" && s.ThreadID != r.ThreadID:
		return events.Refuse(events.CodeInvalidID, "thread_id %q is not the run's thread %q", s.ThreadID, r.ThreadID)
	}
	pinned := make([]events.Call, len(calls))
	for i, call := range calls {
		tool := c.Tools[i]
		if !events.ValidToolID(call.ToolID) {
			tool = events.Descriptor{Kind: events.KindUnknown} // no catalog can name it
		}
		pinned[i] = events.Call{CallID: call.CallID, ToolID: call.ToolID, Arguments: call.Arguments, Tool: Pin(tool)}
		if i < len(c.ArgumentProblems) && tool.Kind != events.KindUnknown {
			pinned[i].Invalid = c.ArgumentProblems[i]
		}
	}
	ev := &events.BatchSubmitted{
		RunID: s.RunID, ThreadID: s.ThreadID, BatchID: events.BatchID(s.RunID, s.Step), Step: s.Step,
		Assistant: s.Assistant, Calls: pinned, SnapshotID: c.SnapshotID, Narrowing: s.Narrowing,
		Digest: digest, MsgID: c.MsgID, InboxSeq: c.InboxSeq, At: c.At,
	}
	// A large batch may fit the limits but not one commit. (A smaller one
	// always fits: its event is at most about twice its submission.)
	if c.MaxPayload > 0 && c.SubmissionBytes > c.MaxPayload/4 {
		if body, _, err := events.EncodeCommit([]events.Event{ev}); err == nil && len(body)+CommitHeaderRoom > c.MaxPayload {
			return events.Refuse(events.CodeLimitExceeded,
				"the batch does not fit one message of the NATS server (max_payload %d bytes)", c.MaxPayload)
		}
	}
	return d.emit(ev)
}

// Pin returns the descriptor as it is pinned into a call: the default mode
// is never_replay, max_attempts is at least 1 (default 3), and a delegation
// is always durable_request.
func Pin(t events.Descriptor) events.Descriptor {
	if t.Policy.Mode == "" {
		t.Policy.Mode = events.ModeNeverReplay
	}
	if t.Policy.MaxAttempts <= 0 {
		t.Policy.MaxAttempts = events.DefaultMaxAttempts
	}
	if t.Kind == events.KindDelegation {
		t.Policy.Mode = events.ModeDurableRequest
	}
	if t.Kind != events.KindDelegation {
		t.ParallelCompletion = false
	}
	if t.Target == "" {
		t.Target = events.TargetBrain
	}
	return t
}

// openBatch returns the open batch or ErrNoBatch.
func (d *decider) openBatch() (*Batch, error) {
	if d.run.End != nil {
		return nil, ErrRunEnded
	}
	b := d.run.OpenBatch()
	if b == nil {
		return nil, ErrNoBatch
	}
	return b, nil
}

func (d *decider) gate(g Gate) error {
	b, err := d.openBatch()
	if err != nil {
		return err
	}
	want := Next(d.run)
	if want.Kind != NextGate {
		return fmt.Errorf("%w: the batch needs %s, not a gate decision", ErrBadDecision, want.Kind)
	}
	if len(g.Decisions) != len(want.CallIDs) {
		return fmt.Errorf("%w: %d decisions for calls %v", ErrBadDecision, len(g.Decisions), want.CallIDs)
	}
	for i, dec := range g.Decisions {
		if dec.CallID != want.CallIDs[i] {
			return fmt.Errorf("%w: decision %d is for %s, want %s", ErrBadDecision, i, dec.CallID, want.CallIDs[i])
		}
	}
	if len(g.Decisions) > 1 {
		allAllow := true
		for _, dec := range g.Decisions {
			allAllow = allAllow && dec.Outcome == events.GateAllow
		}
		if allAllow {
			return d.parallel(b, g)
		}
		g.Decisions = g.Decisions[:1] // go on one call at a time
	}
	return d.applyDecision(b, g.Decisions[0], g.At)
}

func gatedEvent(b *Batch, dec Decision, at time.Time) *events.CallGated {
	return &events.CallGated{
		BatchID: b.ID, CallID: dec.CallID, Outcome: dec.Outcome, Label: dec.Outcome.Label(),
		Stage: dec.Stage, Rule: dec.Rule, Reason: dec.Reason, Output: dec.Output, At: at,
	}
}

// parallel takes the parallel branch: every gate allowed; all calls enter
// executing in one commit.
func (d *decider) parallel(b *Batch, g Gate) error {
	for _, dec := range g.Decisions {
		if err := d.emit(gatedEvent(b, dec, g.At)); err != nil {
			return err
		}
	}
	for _, dec := range g.Decisions {
		if err := d.execute(b, dec.CallID, dec.Capability, events.CauseAllowed, "", true, g.At); err != nil {
			return err
		}
	}
	return nil
}

func (d *decider) applyDecision(b *Batch, dec Decision, at time.Time) error {
	c, _ := b.Call(dec.CallID)
	switch dec.Outcome {
	case events.GateAllow, events.GateBlock, events.GateSetResult, events.GateRequireConfirmation, events.GateSchedule:
	default:
		return fmt.Errorf("%w: unknown outcome %q", ErrBadDecision, dec.Outcome)
	}
	if err := d.emit(gatedEvent(b, dec, at)); err != nil {
		return err
	}
	switch dec.Outcome {
	case events.GateAllow:
		return d.execute(b, c.CallID, dec.Capability, events.CauseAllowed, "", false, at)
	case events.GateBlock:
		reason := dec.Reason
		if reason == "" {
			reason = "blocked by policy"
		}
		return d.emit(&events.CallCompleted{BatchID: b.ID, CallID: c.CallID, Attempt: c.Attempt,
			Output: events.ErrorOutput(c.CallID, "blocked: "+reason), At: at})
	case events.GateSetResult:
		out := events.Output{}
		if dec.Output != nil {
			out = *dec.Output
		}
		return d.emit(&events.CallCompleted{BatchID: b.ID, CallID: c.CallID, Attempt: c.Attempt,
			Output: out.Normalized(c.CallID), At: at})
	case events.GateRequireConfirmation:
		return d.park(b, c, events.WaitPermission, dec.CorrelationID, dec.Deadline, nil, "", at)
	default: // schedule
		return d.park(b, c, events.WaitScheduledAction, dec.CorrelationID, dec.Deadline, dec.Due, dec.ActionKind, at)
	}
}

// execute commits the next attempt of a call, after checking that its
// pinned mode is supported by the live capability; if it is not, the call
// completes with an error output and is not executed.
func (d *decider) execute(b *Batch, callID string, capability events.Capability, cause, detail string, parallel bool, at time.Time) error {
	c, _ := b.Call(callID)
	noWorker := capability == "" && c.Tool.Target == events.TargetSandbox
	if capability == "" {
		capability = events.CapNonRecoverable
	}
	if !c.Tool.Policy.Mode.SupportedBy(capability) {
		text := unsupportedText(c, capability)
		if noWorker {
			text = noWorkerText(c)
		}
		return d.emit(&events.CallCompleted{BatchID: b.ID, CallID: c.CallID, Attempt: c.Attempt, ErrorKind: events.ErrorExecution,
			Output: events.ErrorOutput(c.CallID, text), At: at})
	}
	return d.emit(&events.CallExecuting{
		BatchID: b.ID, CallID: c.CallID, Attempt: c.Attempt + 1, OperationID: b.OperationID(c.CallID),
		Cause: cause, Detail: detail, Capability: capability, Parallel: parallel, At: at,
	})
}

// noWorkerText is the error of a sandbox call whose mode needs a live
// worker's capability when no live worker serves its tool (a never_replay
// call is dispatched anyway: a worker may start before its dispatch
// deadline).
func noWorkerText(c *Call) string {
	pool := c.Tool.Pool
	if pool == "" {
		pool = events.DefaultPool
	}
	return fmt.Sprintf("no live worker serves tool %s in pool %s (its recovery mode %s needs a worker that advertises it)", c.ToolID, pool, c.Tool.Policy.Mode)
}

func unsupportedText(c *Call, capability events.Capability) string {
	return fmt.Sprintf("recovery mode %s is not supported by tool %s (capability %s)", c.Tool.Policy.Mode, c.ToolID, capability)
}

func (d *decider) park(b *Batch, c *Call, kind events.WaitKind, correlationID string, deadline, due *time.Time, actionKind string, at time.Time) error {
	if !events.ValidCallID(correlationID) {
		return fmt.Errorf("%w: correlation id %q", ErrMalformedCommand, correlationID)
	}
	return d.emit(&events.CallAwaiting{BatchID: b.ID, CallID: c.CallID, At: at, Ticket: events.Ticket{
		CorrelationID: correlationID, RunID: d.run.RunID, ThreadID: b.ThreadID, BatchID: b.ID,
		CallID: c.CallID, ToolID: c.ToolID, Arguments: c.Arguments, Reason: kind,
		SnapshotID: b.SnapshotID, Deadline: deadline, Due: due, ActionKind: actionKind,
	}})
}

func (d *decider) parkClient(p ParkClient) error {
	b, err := d.openBatch()
	if err != nil {
		return err
	}
	want := Next(d.run)
	if want.Kind != NextParkClient || want.CallIDs[0] != p.CallID {
		return fmt.Errorf("%w: the batch needs %s %v", ErrBadDecision, want.Kind, want.CallIDs)
	}
	c, _ := b.Call(p.CallID)
	return d.park(b, c, events.WaitExternalResult, p.CorrelationID, p.Deadline, nil, "", p.At)
}

// executingCall finds the call an executor reports on, checking its attempt.
func (d *decider) executingCall(callID string, attempt int) (*Batch, *Call, error) {
	b, err := d.openBatch()
	if err != nil {
		return nil, nil, err
	}
	c, _ := b.Call(callID)
	switch {
	case c == nil:
		return nil, nil, ErrUnknownCall
	case c.Phase.Terminal():
		return nil, nil, ErrCallTerminal
	case c.Phase != events.PhaseExecuting:
		return nil, nil, ErrNotExecuting
	case attempt != c.Attempt:
		return nil, nil, fmt.Errorf("%w: attempt %d, current %d", ErrStaleAttempt, attempt, c.Attempt)
	}
	return b, c, nil
}

func (d *decider) claim(cl Claim) error {
	b, c, err := d.executingCall(cl.CallID, cl.Attempt)
	if err != nil {
		return err
	}
	if c.Tool.Target != events.TargetSandbox {
		return ErrNotSandbox
	}
	if c.Claim != nil {
		if cl.Incarnation != "" && c.Claim.WorkerID == cl.WorkerID && c.Claim.Incarnation == cl.Incarnation {
			return nil // the same process asks again: its grant stands, unchanged
		}
		return ErrAlreadyClaimed
	}
	return d.emit(&events.CallClaimed{BatchID: b.ID, CallID: c.CallID, Attempt: c.Attempt,
		WorkerID: cl.WorkerID, Incarnation: cl.Incarnation, ClaimToken: cl.Token, LeaseMS: cl.LeaseMS, At: cl.At})
}

func (d *decider) complete(cp Complete) error { return d.completeAttempt(cp, false) }

// completeAttempt decides an outcome; fromWorker holds for a worker's
// result, which must name the current claim.
func (d *decider) completeAttempt(cp Complete, fromWorker bool) error {
	if (cp.Output == nil) == (cp.Error == nil) {
		return fmt.Errorf("%w: a completion carries exactly one of output and error", ErrMalformedCommand)
	}
	b, c, err := d.executingCall(cp.CallID, cp.Attempt)
	if err != nil {
		return err
	}
	unavailable := cp.Error != nil && cp.Error.Kind == events.ErrorUnavailableBeforeDispatch
	if fromWorker && c.Tool.Target != events.TargetSandbox {
		return ErrNotSandbox // a worker's result for a call no worker runs
	}
	if c.Tool.Target == events.TargetSandbox {
		switch {
		case c.Claim == nil && unavailable && cp.ClaimToken == "" && !fromWorker:
			// The engine's own verdict: nobody claimed it in time.
		case c.Claim == nil:
			return ErrNotClaimed
		case cp.ClaimToken != c.Claim.Token:
			return ErrStaleClaim
		}
	}
	if cp.Output != nil {
		cp.Output, cp.Error = withinLimits(b, *cp.Output, cp.Limits)
	}
	if unavailable {
		// Nothing ran: safe to retry whatever the mode, within the budget.
		if c.Attempt < c.Tool.Policy.MaxAttempts {
			return d.emit(&events.CallExecuting{
				BatchID: b.ID, CallID: c.CallID, Attempt: c.Attempt + 1, OperationID: b.OperationID(c.CallID),
				Cause: events.CauseRetry, Detail: cp.Error.Message, Capability: c.Capability, Parallel: b.Parallel, At: cp.At,
			})
		}
		return d.emit(&events.CallCompleted{BatchID: b.ID, CallID: c.CallID, Attempt: c.Attempt, ErrorKind: cp.Error.Kind,
			Output: events.ErrorOutput(c.CallID, errorText(cp.Error)), At: cp.At})
	}
	if cp.Error != nil {
		return d.emit(&events.CallCompleted{BatchID: b.ID, CallID: c.CallID, Attempt: c.Attempt, ErrorKind: cp.Error.Kind,
			Output: events.ErrorOutput(c.CallID, errorText(cp.Error)), At: cp.At})
	}
	out := cp.Output.Normalized(c.CallID)
	for i, cmd := range out.State {
		if err := cmd.Validate(); err != nil {
			return d.emit(&events.CallCompleted{BatchID: b.ID, CallID: c.CallID, Attempt: c.Attempt, ErrorKind: events.ErrorExecution,
				Output: events.ErrorOutput(c.CallID, fmt.Sprintf("invalid state command %d: %v", i, err)), At: cp.At})
		}
	}
	return d.emit(&events.CallCompleted{BatchID: b.ID, CallID: c.CallID, Attempt: c.Attempt, Output: out, At: cp.At})
}

// withinLimits returns the output, or the execution error that replaces an
// output over a limit.
func withinLimits(b *Batch, o events.Output, lim OutputLimits) (*events.Output, *events.ToolError) {
	size := 0
	if lim.MaxOutputBytes > 0 || lim.MaxBatchOutputBytes > 0 {
		size = events.OutputSize(o)
	}
	switch {
	case lim.MaxOutputBytes > 0 && size > lim.MaxOutputBytes:
		return nil, &events.ToolError{Kind: events.ErrorExecution, Message: fmt.Sprintf("output exceeds %d bytes", lim.MaxOutputBytes)}
	case lim.MaxBatchOutputBytes > 0 && b.outputBytes()+size > lim.MaxBatchOutputBytes:
		return nil, &events.ToolError{Kind: events.ErrorExecution,
			Message: fmt.Sprintf("output too large: the batch's outputs would exceed %d bytes", lim.MaxBatchOutputBytes)}
	}
	return &o, nil
}

// outputBytes is the size of the outputs the batch holds.
func (b *Batch) outputBytes() int {
	n := 0
	for _, c := range b.Calls {
		n += c.OutputBytes // 0 without an output
	}
	return n
}

// result decides a worker's result: completed when it is the current
// claim's, recorded as refused (fencing) otherwise.
func (d *decider) result(r Result) error {
	var err error
	if b, berr := d.openBatch(); berr != nil {
		err = berr
	} else if b.ID != r.BatchID {
		err = fmt.Errorf("%w: the result is for batch %s", ErrNoBatch, r.BatchID)
	} else {
		err = d.completeAttempt(r.Complete, true)
	}
	if err == nil || !IsDecision(err) {
		return err
	}
	if b := d.run.Batch; b != nil && b.ID == r.BatchID {
		return d.emit(&events.ResultRefused{BatchID: r.BatchID, CallID: r.CallID, Attempt: r.Attempt,
			ClaimToken: r.ClaimToken, Reason: err.Error(), At: r.At})
	}
	return err
}

// errorText is the model-visible text of a tool error.
func errorText(e *events.ToolError) string {
	msg := e.Message
	switch e.Kind {
	case events.ErrorUnavailableBeforeDispatch:
		if msg == "" {
			msg = "no executor took the call"
		}
		return "unavailable before dispatch: " + msg
	case events.ErrorInvalidArguments:
		return "invalid arguments: " + msg
	case events.ErrorUnknown:
		if msg == "" {
			return events.EmptyErrorText
		}
		return msg
	default:
		if msg == "" {
			return events.EmptyErrorText
		}
		return msg
	}
}

func (d *decider) delegationAwait(a DelegationAwait) error {
	b, c, err := d.executingCall(a.CallID, a.Attempt)
	if err != nil {
		return err
	}
	if c.Tool.Kind != events.KindDelegation {
		return fmt.Errorf("%w: call %s is not a delegation", ErrMalformedCommand, c.CallID)
	}
	if b.Parallel {
		// A child that waits inside the parallel branch cannot park the run.
		return d.emit(&events.CallIndeterminate{BatchID: b.ID, CallID: c.CallID, Attempt: c.Attempt,
			Reason: "a delegated child awaited input inside the parallel branch", At: a.At})
	}
	return d.park(b, c, events.WaitDelegation, a.CorrelationID, a.Deadline, nil, "", a.At)
}

func (d *decider) leaseExpired(l LeaseExpired) error {
	b, c, err := d.executingCall(l.CallID, l.Attempt)
	if err != nil {
		return err
	}
	if c.Tool.Target == events.TargetSandbox {
		if c.Claim == nil {
			return ErrNotClaimed
		}
		if l.ClaimToken != c.Claim.Token {
			return ErrStaleClaim
		}
	}
	lost := ReasonOwnerLost
	if c.Tool.Target == events.TargetSandbox {
		lost = ReasonWorkerLost
	}
	return d.emit(recoverCall(b, c, l.Capability, l.At, lost))
}

func (d *decider) recover(rc Recover) error {
	b, err := d.openBatch()
	if err != nil {
		if err == ErrNoBatch {
			return nil // nothing to take over
		}
		return err
	}
	for i := range b.Calls {
		c := &b.Calls[i]
		if c.Phase != events.PhaseExecuting || !c.Crossed || rc.Exclude[c.CallID] {
			continue // terminal, awaiting, requested, never dispatched, or still leased
		}
		capability := rc.Capabilities[c.ToolID]
		delegation := c.Tool.Kind == events.KindDelegation
		ev := recoverCall(b, c, capability, rc.At, ReasonOwnerLost)
		if err := d.emit(ev); err != nil {
			return err
		}
		if _, ok := ev.(*events.CallIndeterminate); ok && delegation {
			// An indeterminate delegation ends the run (advance decides
			// it): no later call is entered again first.
			break
		}
	}
	return nil
}

// Indeterminate reasons of the recovery table.
const (
	ReasonOwnerLost       = "owner lost after the executor was entered"
	ReasonWorkerLost      = "the worker running it was lost (no heartbeat before its lease ran out) after it claimed the call"
	ReasonBudgetExhausted = "recovery attempt budget exhausted"
)

// recoverCall is the recovery table of contract.md §4 for an executing call
// whose dispatch boundary was crossed. The live engine (lease expiry) and
// replay's audit use it alike. lost is the reason of a never_replay call:
// who was lost.
func recoverCall(b *Batch, c *Call, capability events.Capability, at time.Time, lost string) events.Event {
	if capability == "" {
		capability = events.CapNonRecoverable // unknown, or no live executor
	}
	mode := c.Tool.Policy.Mode
	indeterminate := func(reason string) events.Event {
		return &events.CallIndeterminate{BatchID: b.ID, CallID: c.CallID, Attempt: c.Attempt, Reason: reason, At: at}
	}
	switch {
	case mode == events.ModeNeverReplay:
		return indeterminate(lost)
	case !mode.SupportedBy(capability):
		return indeterminate(fmt.Sprintf("recovery mode %s is no longer supported (capability %s)", mode, capability))
	case c.Attempt >= c.Tool.Policy.MaxAttempts:
		return indeterminate(ReasonBudgetExhausted)
	default:
		return &events.CallExecuting{
			BatchID: b.ID, CallID: c.CallID, Attempt: c.Attempt + 1, OperationID: b.OperationID(c.CallID),
			Cause: events.CauseRecovered, Capability: capability, Parallel: b.Parallel, At: at,
		}
	}
}

// RecoveryAction names what the recovery table decides for a call, for
// audits and scenario output.
func RecoveryAction(r *Run, callID string, capability events.Capability) string {
	b := r.OpenBatch()
	if b == nil {
		return "none: no open batch"
	}
	c, _ := b.Call(callID)
	if c == nil {
		return "none: no such call"
	}
	switch {
	case c.Phase.Terminal():
		return "keep: terminal"
	case c.Phase == events.PhaseAwaiting:
		return "keep: awaiting its ticket"
	case c.Phase == events.PhaseRequested:
		return "gate again"
	case !c.Crossed:
		return "dispatch again: boundary not crossed"
	}
	switch e := recoverCall(b, c, capability, time.Time{}, ReasonOwnerLost).(type) {
	case *events.CallExecuting:
		return fmt.Sprintf("re-invoke attempt %d", e.Attempt)
	case *events.CallIndeterminate:
		return "indeterminate: " + e.Reason
	}
	return "unknown"
}

func (d *decider) end(cause events.EndCause, reason string, at time.Time) error {
	r := d.run
	if r.End != nil {
		return nil // ending an ended run again is harmless
	}
	switch cause {
	case events.EndCancelled, events.EndInterrupted, events.EndIndeterminate, events.EndStateConflict:
	default:
		return fmt.Errorf("%w: end cause %q", ErrMalformedCommand, cause)
	}
	if b := r.OpenBatch(); b != nil {
		for i := range b.Calls {
			c := &b.Calls[i]
			if c.Phase.Terminal() {
				continue
			}
			var e events.Event
			if cause == events.EndInterrupted {
				e = &events.CallCompleted{BatchID: b.ID, CallID: c.CallID, Attempt: c.Attempt,
					Output: events.ErrorOutput(c.CallID, events.InterruptedText), At: at}
			} else {
				why := "run " + string(cause)
				if c.Attempt == 0 {
					// nothing of it ran: say so (a call awaiting approval, say)
					why += " before the call ran (it was " + string(c.Phase) + ")"
				}
				e = &events.CallIndeterminate{BatchID: b.ID, CallID: c.CallID, Attempt: c.Attempt,
					Reason: why + endDetail(reason), At: at}
			}
			if err := d.emit(e); err != nil {
				return err
			}
		}
		if err := d.emit(finalizedEvent(b, at)); err != nil {
			return err
		}
	}
	return d.emit(&events.RunEnded{Cause: cause, Reason: reason, At: at})
}

func endDetail(reason string) string {
	if reason == "" {
		return ""
	}
	return ": " + reason
}

// advance appends the follow-ups that need no IO, until the run waits for
// the engine or is done.
func (d *decider) advance(at time.Time) error {
	for {
		r := d.run
		b := r.OpenBatch()
		if r.End != nil || b == nil {
			return nil
		}
		// An indeterminate delegation ends the run.
		for _, c := range b.Calls {
			if c.Phase == events.PhaseIndeterminate && c.Tool.Kind == events.KindDelegation {
				return d.end(events.EndIndeterminate, fmt.Sprintf("delegation %s is indeterminate: %s", c.CallID, c.Reason), at)
			}
		}
		if b.AllTerminal() {
			f := finalizedEvent(b, at)
			if err := d.emit(f); err != nil {
				return err
			}
			if f.Conflict != "" {
				return d.end(events.EndStateConflict, f.Conflict, at)
			}
			return nil
		}
		next := Next(r)
		if next.Kind != NextCompleteUnrunnable {
			return nil
		}
		c, _ := b.Call(next.CallIDs[0])
		done := &events.CallCompleted{BatchID: b.ID, CallID: c.CallID, ErrorKind: events.ErrorUnknown,
			Output: events.ErrorOutput(c.CallID, "unknown tool: "+c.ToolID), At: at}
		if c.Tool.Kind != events.KindUnknown {
			msg := c.Invalid
			if !c.Arguments.IsObjectOrNull() {
				msg = "the input must be a JSON object, got " + jsonKind(c.Arguments)
			}
			done.ErrorKind = events.ErrorInvalidArguments
			done.Output = events.ErrorOutput(c.CallID, errorText(&events.ToolError{Kind: events.ErrorInvalidArguments, Message: msg}))
		}
		if err := d.emit(done); err != nil {
			return err
		}
	}
}

// jsonKind names the kind of a JSON value for a model-visible error.
func jsonKind(r events.RawJSON) string {
	switch {
	case len(r) == 0:
		return "null"
	case r[0] == '"':
		return "a string"
	case r[0] == '[':
		return "an array"
	case r[0] == 't' || r[0] == 'f':
		return "a boolean"
	default:
		return "a number"
	}
}
