package protocol

import "github.com/toolbatch/toolbatch/events"

// The services the engine calls (request/reply on core NATS) and its
// timers' messages.

// GateRequest is sent to the optional external gate service on
// <prefix>.gate.
type GateRequest struct {
	RunID      string         `msgpack:"run_id" json:"run_id"`
	BatchID    string         `msgpack:"batch_id" json:"batch_id"`
	CallID     string         `msgpack:"call_id" json:"call_id"`
	ToolID     string         `msgpack:"tool_id" json:"tool_id"`
	Arguments  events.RawJSON `msgpack:"arguments" json:"arguments"`
	SnapshotID string         `msgpack:"snapshot_id" json:"snapshot_id"`
}

// GateReply is the external gate's decision. It may only restrict: allow
// passes the call on.
type GateReply struct {
	Outcome events.GateOutcome `msgpack:"outcome" json:"outcome"`
	Reason  string             `msgpack:"reason,omitempty" json:"reason,omitempty"`
	Output  *events.Output     `msgpack:"output,omitempty" json:"output,omitempty"`
	// DeadlineMS bounds a require_confirmation ticket; DueMS delays a
	// schedule (milliseconds from now).
	DeadlineMS int64 `msgpack:"deadline_ms,omitempty" json:"deadline_ms,omitempty"`
	DueMS      int64 `msgpack:"due_ms,omitempty" json:"due_ms,omitempty"`
}

// BrainRequest is sent to a host brain service on <prefix>.brain.<tool_id>.
type BrainRequest struct {
	CallID      string         `msgpack:"call_id" json:"call_id"`
	ToolID      string         `msgpack:"tool_id" json:"tool_id"`
	Arguments   events.RawJSON `msgpack:"arguments" json:"arguments"`
	OperationID string         `msgpack:"operation_id" json:"operation_id"`
	Attempt     int            `msgpack:"attempt" json:"attempt"`
}

// BrainReply is a host brain service's answer: an output, or an error.
type BrainReply struct {
	Output *events.Output    `msgpack:"output,omitempty" json:"output,omitempty"`
	Error  *events.ToolError `msgpack:"error,omitempty" json:"error,omitempty"`
}

// Delegation operations on <prefix>.delegate.<tool_id>.
const (
	DelegateStart  = "start"
	DelegateResume = "resume"
	DelegateCancel = "cancel"
)

// DelegateRequest asks a delegation service to start, resume or cancel the
// child run of a call. DelegationID is the call's operation id: the same on
// every attempt, after a resume and on recovery, so that a repeated start
// addresses the same child. The engine's delegation protocol is
// durable_request by construction: a service must honour the delegation id.
type DelegateRequest struct {
	Op           string         `msgpack:"op" json:"op"`
	DelegationID string         `msgpack:"delegation_id" json:"delegation_id"`
	RunID        string         `msgpack:"run_id" json:"run_id"`
	CallID       string         `msgpack:"call_id" json:"call_id"`
	ToolID       string         `msgpack:"tool_id" json:"tool_id"`
	Arguments    events.RawJSON `msgpack:"arguments,omitempty" json:"arguments,omitempty"`
	Attempt      int            `msgpack:"attempt" json:"attempt"`
	Input        string         `msgpack:"input,omitempty" json:"input,omitempty"` // resume
}

// Delegation reply statuses.
const (
	DelegationEnded    = "ended"    // the child finished: Text is the call's output
	DelegationAwaiting = "awaiting" // the child waits for input: the parent parks
	DelegationError    = "error"    // Message; Retryable leaves the call to recovery
	DelegationCanceled = "cancelled"
)

// DelegateReply is a delegation service's answer.
type DelegateReply struct {
	Status    string `msgpack:"status" json:"status"`
	Text      string `msgpack:"text,omitempty" json:"text,omitempty"`
	Message   string `msgpack:"message,omitempty" json:"message,omitempty"`
	Retryable bool   `msgpack:"retryable,omitempty" json:"retryable,omitempty"`
}

// Timer actions: what a fired timer asks of its run.
const (
	TimerExpire      = "expire"       // a ticket's deadline passed
	TimerPerform     = "perform"      // a scheduled action is due
	TimerCancelChild = "cancel_child" // tell a delegated child of an ended run to stop
	// TimerDispatchDeadline was scheduled by engines before dispatch
	// deadlines were watched in memory; still honoured.
	TimerDispatchDeadline = "dispatch_deadline"
)

// TimerFire is the body of a schedule on <prefix>.timer.at.<run_id>.<action>.<correlation_id>
// and of the message it fires on <prefix>.timer.fire.<run_id> (engine
// internal).
type TimerFire struct {
	Action        string `msgpack:"action"`
	CorrelationID string `msgpack:"correlation_id"`
	CallID        string `msgpack:"call_id,omitempty"` // dispatch deadlines, children to cancel
	Attempt       int    `msgpack:"attempt,omitempty"`
	ToolID        string `msgpack:"tool_id,omitempty"`      // children to cancel
	OperationID   string `msgpack:"operation_id,omitempty"` // children to cancel: the delegation id
}
