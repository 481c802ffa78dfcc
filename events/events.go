package events

import (
	"time"
)

// Type is an event's stable, registered, past-tense type name. It is carried
// in the Toolbatch-Event header and in the commit body, and is never derived
// from the Go type.
type Type string

// Event types. Names are part of the log format: never rename one.
const (
	TypeBatchSubmitted    Type = "BatchSubmitted"
	TypeBatchRejected     Type = "BatchRejected"
	TypeCallGated         Type = "CallGated"
	TypeCallExecuting     Type = "CallExecuting"
	TypeCallClaimed       Type = "CallClaimed"
	TypeCallCompleted     Type = "CallCompleted"
	TypeCallIndeterminate Type = "CallIndeterminate"
	TypeCallAwaiting      Type = "CallAwaiting"
	TypeTicketResolved    Type = "TicketResolved"
	TypeResultRefused     Type = "ResultRefused"
	TypeBatchFinalized    Type = "BatchFinalized"
	TypeRunEnded          Type = "RunEnded"
)

// Event is one fact in the log.
type Event interface {
	// EventType returns the registered type name.
	EventType() Type
}

// Call is one call of a batch as persisted: the model's tool_use with the
// operator's descriptor (and recovery policy) pinned at submit.
type Call struct {
	CallID    string     `msgpack:"call_id" json:"call_id"`
	ToolID    string     `msgpack:"tool_id" json:"tool_id"`
	Arguments RawJSON    `msgpack:"arguments" json:"arguments"`
	Tool      Descriptor `msgpack:"tool" json:"tool"`
	// Invalid says why the arguments do not match the tool's input schema
	// (the catalog's, when the batch was accepted); such a call completes
	// with invalid_arguments and never runs. Empty: they match.
	Invalid string `msgpack:"invalid,omitempty" json:"invalid,omitempty"`
}

// Narrowing values of a submission.
const (
	NarrowingConfigured = "configured"
	NarrowingDenyAll    = "deny_all"
)

// BatchSubmitted persists a whole batch, every call requested, with the
// assistant message verbatim. Nothing runs before it is committed.
type BatchSubmitted struct {
	RunID      string  `msgpack:"run_id" json:"run_id"`
	ThreadID   string  `msgpack:"thread_id" json:"thread_id"`
	BatchID    string  `msgpack:"batch_id" json:"batch_id"`
	Step       int64   `msgpack:"step" json:"step"`
	Assistant  Message `msgpack:"assistant" json:"assistant"`
	Calls      []Call  `msgpack:"calls" json:"calls"`
	SnapshotID string  `msgpack:"snapshot_id" json:"snapshot_id"`
	Narrowing  string  `msgpack:"narrowing,omitempty" json:"narrowing,omitempty"`
	Digest     string  `msgpack:"digest" json:"digest"` // Submit.Digest: recognises an identical resubmission
	// MsgID and InboxSeq name the inbox message the batch came in (its
	// Nats-Msg-Id and its inbox stream sequence; empty and 0 in a log
	// written before they were recorded): the answer to a submission names
	// them, so that a client matches it to what it sent.
	MsgID    string    `msgpack:"msg_id,omitempty" json:"msg_id,omitempty"`
	InboxSeq uint64    `msgpack:"inbox_seq,omitempty" json:"inbox_seq,omitempty"`
	At       time.Time `msgpack:"at" json:"at"`
}

// BatchRejected records a refused submission. It does not use up the step.
type BatchRejected struct {
	RunID   string `msgpack:"run_id" json:"run_id"`
	BatchID string `msgpack:"batch_id,omitempty" json:"batch_id,omitempty"`
	Step    int64  `msgpack:"step,omitempty" json:"step,omitempty"`
	Code    Code   `msgpack:"code" json:"code"`
	Reason  string `msgpack:"reason" json:"reason"`
	// MsgID, InboxSeq and Digest name the refused submission as
	// BatchSubmitted's do (Digest: when its body decoded).
	MsgID    string    `msgpack:"msg_id,omitempty" json:"msg_id,omitempty"`
	InboxSeq uint64    `msgpack:"inbox_seq,omitempty" json:"inbox_seq,omitempty"`
	Digest   string    `msgpack:"digest,omitempty" json:"digest,omitempty"`
	At       time.Time `msgpack:"at" json:"at"`
}

// Gate stages, in the order the chain runs them.
const (
	StageNarrowing = "narrowing"
	StagePolicy    = "policy"
	StageExternal  = "external"
	StageDefault   = "default"
)

// CallGated records one gate decision and what made it. Its consequence
// (executing, completed or awaiting) follows in the same commit.
type CallGated struct {
	BatchID string      `msgpack:"batch_id" json:"batch_id"`
	CallID  string      `msgpack:"call_id" json:"call_id"`
	Outcome GateOutcome `msgpack:"outcome" json:"outcome"`
	Label   string      `msgpack:"label" json:"label"`                       // audit label
	Stage   string      `msgpack:"stage" json:"stage"`                       // narrowing, policy, external, default
	Rule    string      `msgpack:"rule,omitempty" json:"rule,omitempty"`     // the rule that decided
	Reason  string      `msgpack:"reason,omitempty" json:"reason,omitempty"` // block reason
	Output  *Output     `msgpack:"output,omitempty" json:"output,omitempty"` // set_result
	At      time.Time   `msgpack:"at" json:"at"`
}

// Causes of entering executing.
const (
	CauseAllowed   = "allowed"   // the gate allowed
	CauseApproved  = "approved"  // a confirmation was approved
	CausePerformed = "performed" // a scheduled action was performed
	CauseRetry     = "retry"     // the previous attempt was unavailable before dispatch
	CauseRecovered = "recovered" // recovery re-invokes a replayable call
)

// CallExecuting commits an attempt before its executor is entered.
type CallExecuting struct {
	BatchID     string     `msgpack:"batch_id" json:"batch_id"`
	CallID      string     `msgpack:"call_id" json:"call_id"`
	Attempt     int        `msgpack:"attempt" json:"attempt"`
	OperationID string     `msgpack:"operation_id" json:"operation_id"`
	Cause       string     `msgpack:"cause" json:"cause"`
	Detail      string     `msgpack:"detail,omitempty" json:"detail,omitempty"`
	Capability  Capability `msgpack:"capability" json:"capability"` // live capability at entry
	Parallel    bool       `msgpack:"parallel,omitempty" json:"parallel,omitempty"`
	At          time.Time  `msgpack:"at" json:"at"`
}

// CallClaimed records that a sandbox worker was granted an attempt: the
// dispatch boundary. It is committed before the claim is answered.
type CallClaimed struct {
	BatchID  string `msgpack:"batch_id" json:"batch_id"`
	CallID   string `msgpack:"call_id" json:"call_id"`
	Attempt  int    `msgpack:"attempt" json:"attempt"`
	WorkerID string `msgpack:"worker_id" json:"worker_id"`
	// Incarnation is the claiming worker process's id (absent before it
	// was recorded): the same process's claim again is granted again.
	Incarnation string    `msgpack:"incarnation,omitempty" json:"incarnation,omitempty"`
	ClaimToken  string    `msgpack:"claim_token" json:"claim_token"`
	LeaseMS     int64     `msgpack:"lease_ms" json:"lease_ms"`
	At          time.Time `msgpack:"at" json:"at"`
}

// CallCompleted records a call's determinate outcome, with its staged state.
type CallCompleted struct {
	BatchID   string    `msgpack:"batch_id" json:"batch_id"`
	CallID    string    `msgpack:"call_id" json:"call_id"`
	Attempt   int       `msgpack:"attempt" json:"attempt"`
	Output    Output    `msgpack:"output" json:"output"`
	ErrorKind ErrorKind `msgpack:"error_kind,omitempty" json:"error_kind,omitempty"`
	At        time.Time `msgpack:"at" json:"at"`
}

// CallIndeterminate records that a call's outcome cannot be known.
type CallIndeterminate struct {
	BatchID string    `msgpack:"batch_id" json:"batch_id"`
	CallID  string    `msgpack:"call_id" json:"call_id"`
	Attempt int       `msgpack:"attempt" json:"attempt"`
	Reason  string    `msgpack:"reason" json:"reason"`
	At      time.Time `msgpack:"at" json:"at"`
}

// Ticket is a ResumeTicket: the one durable wait that parks a run.
type Ticket struct {
	CorrelationID string     `msgpack:"correlation_id" json:"correlation_id"`
	RunID         string     `msgpack:"run_id" json:"run_id"`
	ThreadID      string     `msgpack:"thread_id" json:"thread_id"`
	BatchID       string     `msgpack:"batch_id" json:"batch_id"`
	CallID        string     `msgpack:"call_id" json:"call_id"`
	ToolID        string     `msgpack:"tool_id" json:"tool_id"`
	Arguments     RawJSON    `msgpack:"arguments" json:"arguments"`
	Reason        WaitKind   `msgpack:"reason" json:"reason"`
	SnapshotID    string     `msgpack:"snapshot_id" json:"snapshot_id"`
	Deadline      *time.Time `msgpack:"deadline,omitempty" json:"deadline,omitempty"`
	Due           *time.Time `msgpack:"due,omitempty" json:"due,omitempty"`
	ActionKind    string     `msgpack:"action_kind,omitempty" json:"action_kind,omitempty"` // scheduled actions
}

// CallAwaiting commits the awaiting phase and its ticket as one event.
type CallAwaiting struct {
	BatchID string    `msgpack:"batch_id" json:"batch_id"`
	CallID  string    `msgpack:"call_id" json:"call_id"`
	Ticket  Ticket    `msgpack:"ticket" json:"ticket"`
	At      time.Time `msgpack:"at" json:"at"`
}

// Resolution is how a ticket was resolved.
type Resolution string

// Resolutions.
const (
	ResolutionApproved   Resolution = "approved"    // permission granted: executing follows
	ResolutionDenied     Resolution = "denied"      // permission refused: blocked output follows
	ResolutionToolResult Resolution = "tool_result" // a client result: completed follows
	ResolutionInput      Resolution = "input"       // delegation input: the call executes again
	ResolutionPerformed  Resolution = "performed"   // a scheduled action was performed: executing follows
	ResolutionExpired    Resolution = "expired"     // the deadline passed: an error output follows
)

// TicketResolved records who resolved a ticket, and how. Its consequence
// follows in the same commit.
type TicketResolved struct {
	BatchID       string     `msgpack:"batch_id" json:"batch_id"`
	CallID        string     `msgpack:"call_id" json:"call_id"`
	CorrelationID string     `msgpack:"correlation_id" json:"correlation_id"`
	Resolution    Resolution `msgpack:"resolution" json:"resolution"`
	Principal     string     `msgpack:"principal,omitempty" json:"principal,omitempty"`
	Note          string     `msgpack:"note,omitempty" json:"note,omitempty"`
	Input         string     `msgpack:"input,omitempty" json:"input,omitempty"` // delegation input text
	At            time.Time  `msgpack:"at" json:"at"`
}

// ResultRefused records a result that was not applied (fencing: its claim
// token was not the call's current claim).
type ResultRefused struct {
	BatchID    string    `msgpack:"batch_id" json:"batch_id"`
	CallID     string    `msgpack:"call_id" json:"call_id"`
	Attempt    int       `msgpack:"attempt" json:"attempt"`
	ClaimToken string    `msgpack:"claim_token" json:"claim_token"`
	Reason     string    `msgpack:"reason" json:"reason"`
	At         time.Time `msgpack:"at" json:"at"`
}

// BatchFinalized is the barrier: every call terminal, results and staged
// state published in model order, in this one commit.
type BatchFinalized struct {
	BatchID  string         `msgpack:"batch_id" json:"batch_id"`
	Step     int64          `msgpack:"step" json:"step"`
	Results  []ContentBlock `msgpack:"results" json:"results"`                       // tool_result blocks, model order
	State    []Command      `msgpack:"state" json:"state"`                           // staged commands, model order
	Conflict string         `msgpack:"conflict,omitempty" json:"conflict,omitempty"` // set when state was not committed
	At       time.Time      `msgpack:"at" json:"at"`
}

// EndCause is why a run ended.
type EndCause string

// End causes.
const (
	EndCancelled     EndCause = "cancelled"
	EndInterrupted   EndCause = "interrupted"
	EndStateConflict EndCause = "state_conflict"
	EndIndeterminate EndCause = "indeterminate"
)

// RunEnded seals a run: later submissions are refused.
type RunEnded struct {
	Cause  EndCause  `msgpack:"cause" json:"cause"`
	Reason string    `msgpack:"reason,omitempty" json:"reason,omitempty"`
	At     time.Time `msgpack:"at" json:"at"`
}

// EventType implementations.
func (*BatchSubmitted) EventType() Type    { return TypeBatchSubmitted }
func (*BatchRejected) EventType() Type     { return TypeBatchRejected }
func (*CallGated) EventType() Type         { return TypeCallGated }
func (*CallExecuting) EventType() Type     { return TypeCallExecuting }
func (*CallClaimed) EventType() Type       { return TypeCallClaimed }
func (*CallCompleted) EventType() Type     { return TypeCallCompleted }
func (*CallIndeterminate) EventType() Type { return TypeCallIndeterminate }
func (*CallAwaiting) EventType() Type      { return TypeCallAwaiting }
func (*TicketResolved) EventType() Type    { return TypeTicketResolved }
func (*ResultRefused) EventType() Type     { return TypeResultRefused }
func (*BatchFinalized) EventType() Type    { return TypeBatchFinalized }
func (*RunEnded) EventType() Type          { return TypeRunEnded }

// registry maps each type and schema version to a constructor. Older
// versions stay registered (with an upgrade in their decoder) forever.
var registry = map[Type]map[int]func() Event{
	TypeBatchSubmitted:    {1: func() Event { return new(BatchSubmitted) }},
	TypeBatchRejected:     {1: func() Event { return new(BatchRejected) }},
	TypeCallGated:         {1: func() Event { return new(CallGated) }},
	TypeCallExecuting:     {1: func() Event { return new(CallExecuting) }},
	TypeCallClaimed:       {1: func() Event { return new(CallClaimed) }},
	TypeCallCompleted:     {1: func() Event { return new(CallCompleted) }},
	TypeCallIndeterminate: {1: func() Event { return new(CallIndeterminate) }},
	TypeCallAwaiting:      {1: func() Event { return new(CallAwaiting) }},
	TypeTicketResolved:    {1: func() Event { return new(TicketResolved) }},
	TypeResultRefused:     {1: func() Event { return new(ResultRefused) }},
	TypeBatchFinalized:    {1: func() Event { return new(BatchFinalized) }},
	TypeRunEnded:          {1: func() Event { return new(RunEnded) }},
}

// SchemaVersion is the version every event is written with today.
const SchemaVersion = 1

// Types returns every registered event type.
func Types() []Type {
	return []Type{
		TypeBatchSubmitted, TypeBatchRejected, TypeCallGated, TypeCallExecuting,
		TypeCallClaimed, TypeCallCompleted, TypeCallIndeterminate, TypeCallAwaiting,
		TypeTicketResolved, TypeResultRefused, TypeBatchFinalized, TypeRunEnded,
	}
}
