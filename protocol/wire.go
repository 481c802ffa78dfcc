package protocol

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/toolbatch/toolbatch/events"
)

// Wire messages are msgpack maps with snake_case keys (events.Marshal and
// events.Unmarshal); submit, resume and control also decode from JSON.
// Decoding what a client sends is strict: unknown fields and fields that
// try to choose placement or recovery are refused with a protocol code
// (events.Code), and every input limit is checked (events.Limits). The
// refusal codes are events' because the log records them (BatchRejected).

// Submit is a batch submission on <prefix>.submit.<run_id>: the model's
// assistant message, whose tool_use blocks in order are the calls.
type Submit struct {
	RunID     string         `msgpack:"run_id" json:"run_id"`
	ThreadID  string         `msgpack:"thread_id" json:"thread_id"`
	Step      int64          `msgpack:"step" json:"step"`
	Assistant events.Message `msgpack:"assistant" json:"assistant"`
	Narrowing string         `msgpack:"narrowing,omitempty" json:"narrowing,omitempty"`
}

// Submission returns the submission as the aggregate reads it.
func (s *Submit) Submission() events.Submission {
	return events.Submission{RunID: s.RunID, ThreadID: s.ThreadID, Step: s.Step, Assistant: s.Assistant,
		Narrowing: s.Narrowing, Digest: s.Digest()}
}

// Calls returns the submission's calls: its tool_use blocks, in order.
func (s *Submit) Calls() []events.ToolUse { return s.Assistant.ToolUses() }

// BatchID returns <run_id>/<step>.
func (s *Submit) BatchID() string { return events.BatchID(s.RunID, s.Step) }

// Digest returns a content hash of the submission; an identical resubmission
// has the same digest.
func (s *Submit) Digest() string {
	b, err := events.Marshal(s)
	if err != nil {
		// A decoded submission always encodes; this is a programming error.
		panic(fmt.Sprintf("protocol: encode submit for digest: %v", err))
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// DecodeSubmit decodes a submission from msgpack, or JSON when isJSON, and
// validates it against the limits. Every failure is a *events.Refusal with
// its protocol code; when the body decoded but is not valid, the
// submission is returned with the refusal, so that the refusal can name its
// batch.
func DecodeSubmit(body []byte, isJSON bool, lim events.Limits) (*Submit, error) {
	m, err := events.DecodeObject(body, isJSON, "submit")
	if err != nil {
		return nil, err
	}
	for _, f := range events.ForbiddenCallFields {
		if m.Has(f) {
			return nil, events.Refuse(events.CodeForbiddenField, "submit.%s: a submission cannot choose placement or recovery", f)
		}
	}
	if err := m.Only("run_id", "thread_id", "step", "assistant", "narrowing"); err != nil {
		return nil, err
	}
	s := &Submit{}
	if s.RunID, err = m.String("run_id", true); err != nil {
		return nil, err
	}
	if s.ThreadID, err = m.String("thread_id", true); err != nil {
		return nil, err
	}
	if s.Step, err = m.Int("step", true); err != nil {
		return nil, err
	}
	if s.Narrowing, err = m.String("narrowing", false); err != nil {
		return nil, err
	}
	am, err := m.Object("assistant")
	if err != nil {
		return nil, err
	}
	if err := am.Only("id", "content"); err != nil {
		return nil, err
	}
	if s.Assistant.ID, err = am.String("id", false); err != nil {
		return nil, err
	}
	if s.Assistant.Content, err = am.Blocks("content"); err != nil {
		return nil, err
	}
	if err := s.Validate(lim); err != nil {
		return s, err // decoded but not acceptable: the caller may still name its batch
	}
	if len(body) > lim.MaxSubmitBytes {
		return s, events.Refuse(events.CodeLimitExceeded, "the submission is %d bytes, at most %d", len(body), lim.MaxSubmitBytes)
	}
	return s, nil
}

// Validate checks what is wrong with the batch itself: ids, limits and call
// id uniqueness. It returns the first problem as a *events.Refusal. A call
// whose tool name is not a tool id, or whose input is not an object, is
// not the batch's problem: the aggregate completes that call with an error
// and the others run.
func (s *Submit) Validate(lim events.Limits) error {
	if !events.ValidRunID(s.RunID) {
		return events.Refuse(events.CodeInvalidID, "run_id %q must match [A-Za-z0-9_-]{1,64}", s.RunID)
	}
	if !events.ValidCallID(s.ThreadID) {
		return events.Refuse(events.CodeInvalidID, "thread_id %q must match [A-Za-z0-9_-]{1,128}", s.ThreadID)
	}
	if s.Step < 0 {
		return events.Refuse(events.CodeUndecodable, "step %d must not be negative", s.Step)
	}
	switch s.Narrowing {
	case "", events.NarrowingConfigured, events.NarrowingDenyAll:
	default:
		return events.Refuse(events.CodeUndecodable, "narrowing %q must be configured or deny_all", s.Narrowing)
	}
	for i, b := range s.Assistant.Content {
		if n := b.Bytes(); n > lim.MaxBlockBytes {
			return events.Refuse(events.CodeLimitExceeded, "assistant.content[%d]: a %s block of %d bytes, at most %d", i, b.Type, n, lim.MaxBlockBytes)
		}
	}
	calls := s.Calls()
	if len(calls) > lim.MaxCalls {
		return events.Refuse(events.CodeLimitExceeded, "%d calls in one batch, at most %d", len(calls), lim.MaxCalls)
	}
	seen := make(map[string]bool, len(calls))
	for i, c := range calls {
		if !events.ValidCallID(c.CallID) {
			return events.Refuse(events.CodeInvalidID, "call %d: call_id %q must match [A-Za-z0-9_-]{1,128}", i, c.CallID)
		}
		if seen[c.CallID] {
			return events.Refuse(events.CodeDuplicateCallID, "call_id %q appears twice", c.CallID)
		}
		seen[c.CallID] = true
		if len(c.Arguments) > lim.MaxArgumentBytes {
			return events.Refuse(events.CodeLimitExceeded, "call %s: arguments are %d bytes, at most %d", c.CallID, len(c.Arguments), lim.MaxArgumentBytes)
		}
	}
	return nil
}

// Resume answers a run's ticket, on <prefix>.resume.<run_id>[.<principal>].
type Resume struct {
	CorrelationID string              `msgpack:"correlation_id" json:"correlation_id"`
	RunID         string              `msgpack:"run_id" json:"run_id"`
	ThreadID      string              `msgpack:"thread_id" json:"thread_id"`
	CallID        string              `msgpack:"call_id,omitempty" json:"call_id,omitempty"`
	SnapshotID    string              `msgpack:"snapshot_id,omitempty" json:"snapshot_id,omitempty"`
	Result        events.ResumeResult `msgpack:"result" json:"result"`
}

// Answer returns the resume as the aggregate reads it.
func (r *Resume) Answer() events.Answer {
	return events.Answer{CorrelationID: r.CorrelationID, RunID: r.RunID, ThreadID: r.ThreadID,
		CallID: r.CallID, SnapshotID: r.SnapshotID, Result: r.Result}
}

// DecodeResume decodes a resume from msgpack, or JSON when isJSON.
func DecodeResume(body []byte, isJSON bool, lim events.Limits) (*Resume, error) {
	m, err := events.DecodeObject(body, isJSON, "resume")
	if err != nil {
		return nil, err
	}
	if err := m.Only("correlation_id", "run_id", "thread_id", "call_id", "snapshot_id", "result"); err != nil {
		return nil, err
	}
	r := &Resume{}
	if r.CorrelationID, err = m.String("correlation_id", true); err != nil {
		return nil, err
	}
	if r.RunID, err = m.String("run_id", true); err != nil {
		return nil, err
	}
	if r.ThreadID, err = m.String("thread_id", true); err != nil {
		return nil, err
	}
	if r.CallID, err = m.String("call_id", false); err != nil {
		return nil, err
	}
	if r.SnapshotID, err = m.String("snapshot_id", false); err != nil {
		return nil, err
	}
	if r.Result, err = m.ResumeResult("result"); err != nil {
		return nil, err
	}
	switch {
	case !events.ValidCallID(r.CorrelationID):
		return nil, events.Refuse(events.CodeInvalidID, "correlation_id %q must match [A-Za-z0-9_-]{1,128}", r.CorrelationID)
	case !events.ValidRunID(r.RunID):
		return nil, events.Refuse(events.CodeInvalidID, "run_id %q must match [A-Za-z0-9_-]{1,64}", r.RunID)
	case !events.ValidCallID(r.ThreadID):
		return nil, events.Refuse(events.CodeInvalidID, "thread_id %q must match [A-Za-z0-9_-]{1,128}", r.ThreadID)
	case r.CallID != "" && !events.ValidCallID(r.CallID):
		return nil, events.Refuse(events.CodeInvalidID, "call_id %q must match [A-Za-z0-9_-]{1,128}", r.CallID)
	}
	if r.Result.Output != nil {
		if n := events.OutputSize(*r.Result.Output); n > lim.MaxOutputBytes {
			return nil, events.Refuse(events.CodeLimitExceeded, "output is %d bytes, at most %d", n, lim.MaxOutputBytes)
		}
	}
	return r, nil
}

// ControlAction is what a control message asks.
type ControlAction string

// Control actions.
const (
	ControlCancel    ControlAction = "cancel"
	ControlInterrupt ControlAction = "interrupt"
	ControlPerform   ControlAction = "perform"
)

// Control is a run control message on <prefix>.control.<run_id>.
type Control struct {
	Action        ControlAction `msgpack:"action" json:"action"`
	CorrelationID string        `msgpack:"correlation_id,omitempty" json:"correlation_id,omitempty"`
	Reason        string        `msgpack:"reason,omitempty" json:"reason,omitempty"`
}

// DecodeControl decodes a control message from msgpack, or JSON when isJSON.
func DecodeControl(body []byte, isJSON bool) (*Control, error) {
	m, err := events.DecodeObject(body, isJSON, "control")
	if err != nil {
		return nil, err
	}
	if err := m.Only("action", "correlation_id", "reason"); err != nil {
		return nil, err
	}
	c := &Control{}
	var a string
	if a, err = m.String("action", true); err != nil {
		return nil, err
	}
	c.Action = ControlAction(a)
	switch c.Action {
	case ControlCancel, ControlInterrupt:
	case ControlPerform:
		if id, _ := m.String("correlation_id", false); !events.ValidCallID(id) {
			return nil, events.Undecodablef("control.correlation_id: perform needs the scheduled ticket's correlation_id ([A-Za-z0-9_-]{1,128})")
		}
	default:
		return nil, events.Undecodablef("control.action: %q is not cancel, interrupt or perform", a)
	}
	if c.CorrelationID, err = m.String("correlation_id", false); err != nil {
		return nil, err
	}
	if c.Reason, err = m.String("reason", false); err != nil {
		return nil, err
	}
	return c, nil
}

// Dispatch is a sandbox job. On <prefix>.dispatch.<pool>.<tool_id> (with
// Nats-Msg-Id <operation_id>/<attempt>) it is a notice without arguments:
// a worker claims the attempt it names and runs the job of the engine's
// claim reply, never the notice itself, so that only what an engine
// granted runs.
type Dispatch struct {
	BatchID     string         `msgpack:"batch_id" json:"batch_id"`
	RunID       string         `msgpack:"run_id" json:"run_id"`
	CallID      string         `msgpack:"call_id" json:"call_id"`
	ToolID      string         `msgpack:"tool_id" json:"tool_id"`
	Arguments   events.RawJSON `msgpack:"arguments,omitempty" json:"arguments,omitempty"`
	Attempt     int            `msgpack:"attempt" json:"attempt"`
	OperationID string         `msgpack:"operation_id" json:"operation_id"`
}

// ClaimRequest asks for an attempt on <prefix>.api.claim. Incarnation is
// the worker process's own id, new at each start: a claim of an attempt
// already granted to the same worker and incarnation (its answer was lost,
// say in a leader election) is granted again with the same token, so a
// worker asks again rather than losing the job; a worker runs an attempt
// once however many times it is granted.
type ClaimRequest struct {
	OperationID string `msgpack:"operation_id" json:"operation_id"`
	Attempt     int    `msgpack:"attempt" json:"attempt"`
	WorkerID    string `msgpack:"worker_id" json:"worker_id"`
	Incarnation string `msgpack:"incarnation,omitempty" json:"incarnation,omitempty"`
}

// ClaimReply answers a claim: granted with a token, a lease and the job as
// the engine's log holds it (tool and arguments), or refused with a
// reason. It reaches only the claiming worker's own inbox. A heartbeat is
// answered the same way, without a job.
type ClaimReply struct {
	Granted    bool      `msgpack:"granted" json:"granted"`
	ClaimToken string    `msgpack:"claim_token,omitempty" json:"claim_token,omitempty"`
	LeaseMS    int64     `msgpack:"lease_ms,omitempty" json:"lease_ms,omitempty"`
	Reason     string    `msgpack:"reason,omitempty" json:"reason,omitempty"`
	Job        *Dispatch `msgpack:"job,omitempty" json:"job,omitempty"`
	// TraceParent is the attempt's trace context, in a grant that no
	// dispatch notice announced (ResultReply.Next): a notice carries it as
	// its traceparent header.
	TraceParent string `msgpack:"traceparent,omitempty" json:"traceparent,omitempty"`
}

// ReasonBusy in a refused ClaimReply means the engine could not decide
// now: give the job back and try again later (nothing was granted).
const ReasonBusy = "engine busy, try again"

// ReasonClaimed in a refused ClaimReply means another worker (or another
// process of this one) holds the attempt's claim: give the job back
// without running it. Its holder may not have had the grant's answer; the
// job reaches it again, or the lease runs out and the engine decides.
const ReasonClaimed = "claimed by another worker"

// Heartbeat extends a claim's lease on <prefix>.api.heartbeat; the reply is
// a ClaimReply (granted false when the claim is no longer current).
type Heartbeat struct {
	OperationID string `msgpack:"operation_id" json:"operation_id"`
	Attempt     int    `msgpack:"attempt" json:"attempt"`
	ClaimToken  string `msgpack:"claim_token" json:"claim_token"`
	WorkerID    string `msgpack:"worker_id" json:"worker_id"`
}

// Result reports an attempt's outcome on <prefix>.result.<run_id>: an
// output or an error, fenced by the claim token.
type Result struct {
	OperationID string            `msgpack:"operation_id" json:"operation_id"`
	Attempt     int               `msgpack:"attempt" json:"attempt"`
	ClaimToken  string            `msgpack:"claim_token" json:"claim_token"`
	Output      *events.Output    `msgpack:"output,omitempty" json:"output,omitempty"`
	Error       *events.ToolError `msgpack:"error,omitempty" json:"error,omitempty"`
}

// ResultRequest reports an attempt's outcome on <prefix>.api.result and
// asks the engine that owns the run to record it: the fields of a Result,
// the reporting worker, and optionally an offer to take the run's next
// call. With NextPool and NextTools the worker says it will run, in the
// slot the attempt frees, the run's next call if that call runs in
// NextPool on one of NextTools: the engine then claims it for the worker
// in the same commit as the result (a claim carried by the result, decided
// as any claim) and grants it in the reply, and no dispatch notice or claim
// request is sent for it.
type ResultRequest struct {
	Result      `msgpack:",inline"`
	WorkerID    string   `msgpack:"worker_id" json:"worker_id"`
	Incarnation string   `msgpack:"incarnation,omitempty" json:"incarnation,omitempty"`
	NextPool    string   `msgpack:"next_pool,omitempty" json:"next_pool,omitempty"`
	NextTools   []string `msgpack:"next_tools,omitempty" json:"next_tools,omitempty"`
}

// ResultReply answers a ResultRequest. Recorded means the engine decided
// the result and its decision is in the log: applied, or refused (Refused
// says why: a stale claim, a call that moved on); the worker is done with
// it either way. Not recorded (Reason, protocol.ReasonBusy say) means
// nothing was decided: ask again, or publish the result on the inbox. Next
// is a grant of the run's next call to this worker, as a claim's reply.
type ResultReply struct {
	Recorded bool        `msgpack:"recorded" json:"recorded"`
	Refused  string      `msgpack:"refused,omitempty" json:"refused,omitempty"`
	Reason   string      `msgpack:"reason,omitempty" json:"reason,omitempty"`
	Next     *ClaimReply `msgpack:"next,omitempty" json:"next,omitempty"`
}

// ErrResultShape is returned for a result with both or neither of output and
// error.
var ErrResultShape = errors.New("protocol: a result carries exactly one of output and error")

// DecodeResult decodes and checks a result message.
func DecodeResult(body []byte, lim events.Limits) (*Result, error) {
	var r Result
	if err := events.Unmarshal(body, &r); err != nil {
		return nil, err
	}
	if (r.Output == nil) == (r.Error == nil) {
		return nil, ErrResultShape
	}
	if r.Output != nil {
		if err := r.Output.CheckBlocks(); err != nil {
			return nil, err
		}
		if n := events.OutputSize(*r.Output); n > lim.MaxOutputBytes {
			return nil, events.Refuse(events.CodeLimitExceeded, "output is %d bytes, at most %d", n, lim.MaxOutputBytes)
		}
	}
	return &r, nil
}

// DispositionOut is published on <prefix>.out.<run_id>.disposition.
type DispositionOut struct {
	BatchID     string             `msgpack:"batch_id" json:"batch_id"`
	CallID      string             `msgpack:"call_id" json:"call_id"`
	ToolID      string             `msgpack:"tool_id" json:"tool_id"`
	Disposition events.Disposition `msgpack:"disposition" json:"disposition"`
	Phase       events.Phase       `msgpack:"phase" json:"phase"`
	Attempt     int                `msgpack:"attempt" json:"attempt"`
}

// ResultsOut is published on <prefix>.out.<run_id>.results, exactly once
// per batch.
type ResultsOut struct {
	BatchID string                `msgpack:"batch_id" json:"batch_id"`
	Step    int64                 `msgpack:"step" json:"step"`
	Results []events.ContentBlock `msgpack:"results" json:"results"`
	State   []events.Command      `msgpack:"state" json:"state"`
	// Submission is the submission accepted as the batch (absent for a
	// batch recorded before submissions were named).
	Submission *SubmissionOut `msgpack:"submission,omitempty" json:"submission,omitempty"`
}

// SubmissionOut names a submission in its answer (.results, .rejected):
// the Nats-Msg-Id it was published with, its sequence in the inbox stream
// (what the stream's acknowledgement of the publish said), and the
// engine's digest of it (Submit.Digest; absent when the body did not
// decode). A client matches an answer to what it sent by the message id
// or the sequence (docs/protocol.md, "Waiting for the answer").
type SubmissionOut struct {
	MsgID    string `msgpack:"msg_id,omitempty" json:"msg_id,omitempty"`
	InboxSeq uint64 `msgpack:"inbox_seq,omitempty" json:"inbox_seq,omitempty"`
	Digest   string `msgpack:"digest,omitempty" json:"digest,omitempty"`
}

// Names reports whether the answer names the submission published with
// msgID (when not empty) or stored at inboxSeq (when not 0).
func (s *SubmissionOut) Names(msgID string, inboxSeq uint64) bool {
	return s != nil && ((msgID != "" && s.MsgID == msgID) || (inboxSeq != 0 && s.InboxSeq == inboxSeq))
}

// CheckBlocks checks that every result block has a known type
// (events.Unmarshal calls it).
func (o *ResultsOut) CheckBlocks() error { return events.CheckBlocks(o.Results) }

// AwaitingOut is published on <prefix>.out.<run_id>.awaiting: the ticket,
// with deadline and due as RFC 3339 UTC.
type AwaitingOut struct {
	CorrelationID string          `msgpack:"correlation_id" json:"correlation_id"`
	RunID         string          `msgpack:"run_id" json:"run_id"`
	ThreadID      string          `msgpack:"thread_id" json:"thread_id"`
	BatchID       string          `msgpack:"batch_id" json:"batch_id"`
	CallID        string          `msgpack:"call_id" json:"call_id"`
	ToolID        string          `msgpack:"tool_id" json:"tool_id"`
	Arguments     events.RawJSON  `msgpack:"arguments" json:"arguments"`
	Reason        events.WaitKind `msgpack:"reason" json:"reason"`
	SnapshotID    string          `msgpack:"snapshot_id" json:"snapshot_id"`
	Deadline      string          `msgpack:"deadline,omitempty" json:"deadline,omitempty"`
	Due           string          `msgpack:"due,omitempty" json:"due,omitempty"`
	ActionKind    string          `msgpack:"action_kind,omitempty" json:"action_kind,omitempty"`
}

// Awaiting returns the ticket as published on .awaiting.
func Awaiting(t events.Ticket) AwaitingOut {
	return AwaitingOut{
		CorrelationID: t.CorrelationID, RunID: t.RunID, ThreadID: t.ThreadID, BatchID: t.BatchID,
		CallID: t.CallID, ToolID: t.ToolID, Arguments: t.Arguments, Reason: t.Reason,
		SnapshotID: t.SnapshotID, Deadline: rfc3339(t.Deadline), Due: rfc3339(t.Due), ActionKind: t.ActionKind,
	}
}

func rfc3339(t *time.Time) string {
	if t == nil {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// RejectedOut is published on <prefix>.out.<run_id>.rejected.
type RejectedOut struct {
	BatchID string      `msgpack:"batch_id,omitempty" json:"batch_id,omitempty"`
	Code    events.Code `msgpack:"code" json:"code"`
	Reason  string      `msgpack:"reason" json:"reason"`
	// Submission is the refused submission (absent in a log written before
	// submissions were named).
	Submission *SubmissionOut `msgpack:"submission,omitempty" json:"submission,omitempty"`
}

// RefusedMsgID is the Nats-Msg-Id of the refusal of the command stored
// at inboxSeq in the inbox stream: how a client finds the engine's answer
// to exactly the command it published.
func RefusedMsgID(inboxSeq uint64) string { return "refused/" + strconv.FormatUint(inboxSeq, 10) }

// RefusedOut is published on <prefix>.out.<run_id>.refused.
type RefusedOut struct {
	CorrelationID string      `msgpack:"correlation_id,omitempty" json:"correlation_id,omitempty"`
	Code          events.Code `msgpack:"code" json:"code"`
	Reason        string      `msgpack:"reason" json:"reason"`
}

// EndedOut is published on <prefix>.out.<run_id>.ended.
type EndedOut struct {
	Cause  events.EndCause `msgpack:"cause" json:"cause"`
	Reason string          `msgpack:"reason,omitempty" json:"reason,omitempty"`
}
