package events

// CallOutcome is how a call ended, classified by what led to its terminal
// event: the outcome label of toolbatch_calls_total and the
// toolbatch.outcome attribute of its trace span.
type CallOutcome string

// Call outcomes.
const (
	OutcomeOK            CallOutcome = "ok"
	OutcomeError         CallOutcome = "error"
	OutcomeBlocked       CallOutcome = "blocked"
	OutcomeDenied        CallOutcome = "denied"
	OutcomeSetResult     CallOutcome = "set_result"
	OutcomeTimedOut      CallOutcome = "timed_out"
	OutcomeUnknown       CallOutcome = "unknown"
	OutcomeIndeterminate CallOutcome = "indeterminate"
	OutcomeInterrupted   CallOutcome = "interrupted"
)

// CallHistory is what a call's outcome is classified from besides its
// completion: whether an attempt ever entered executing, the latest gate
// decision and the resolution of its latest ticket (each empty when none).
type CallHistory struct {
	Executed   bool
	Gate       GateOutcome
	Resolution Resolution
}

// Completed classifies a completion.
func (h CallHistory) Completed(ev *CallCompleted) CallOutcome {
	switch {
	case ev.ErrorKind == ErrorUnknown:
		return OutcomeUnknown
	case !h.Executed && h.Gate == GateBlock:
		return OutcomeBlocked
	case !h.Executed && h.Gate == GateSetResult:
		return OutcomeSetResult
	case h.Resolution == ResolutionDenied:
		return OutcomeDenied
	case h.Resolution == ResolutionExpired:
		return OutcomeTimedOut
	case ev.Output.IsError && len(ev.Output.Content) == 1 && ev.Output.Content[0].Text == InterruptedText:
		return OutcomeInterrupted
	case ev.Output.IsError:
		return OutcomeError
	}
	return OutcomeOK
}

// Failed reports whether an outcome is a failure of the call (what a trace
// marks as an error): a blocked, denied or set result is the gate's
// decision, not a failure.
func (o CallOutcome) Failed() bool {
	switch o {
	case OutcomeError, OutcomeTimedOut, OutcomeUnknown, OutcomeIndeterminate, OutcomeInterrupted:
		return true
	}
	return false
}

// GateSource names the stage that made a gate decision as the metrics'
// source label and the traces' toolbatch.gate.source attribute report it:
// narrowing, rule (a catalog rule), service (an external gate service) or
// default.
func GateSource(stage string) string {
	switch stage {
	case StagePolicy:
		return "rule"
	case StageExternal:
		return "service"
	}
	return stage
}
