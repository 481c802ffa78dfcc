package events

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// Submit is a batch submission on toolbatch.submit.<run_id>: the model's
// assistant message, whose tool_use blocks in order are the calls.
type Submit struct {
	RunID     string  `msgpack:"run_id" json:"run_id"`
	ThreadID  string  `msgpack:"thread_id" json:"thread_id"`
	Step      int64   `msgpack:"step" json:"step"`
	Assistant Message `msgpack:"assistant" json:"assistant"`
	Narrowing string  `msgpack:"narrowing,omitempty" json:"narrowing,omitempty"`
}

// SubmitCall is one call of a submission, read from a tool_use block.
type SubmitCall struct {
	CallID    string
	ToolID    string
	Arguments RawJSON
}

// Calls returns the submission's calls: its tool_use blocks, in order.
func (s *Submit) Calls() []SubmitCall {
	var out []SubmitCall
	for _, b := range s.Assistant.Content {
		if b.Type == BlockToolUse {
			out = append(out, SubmitCall{CallID: b.ID, ToolID: b.Name, Arguments: b.Input})
		}
	}
	return out
}

// BatchID returns <run_id>/<step>.
func (s *Submit) BatchID() string { return BatchID(s.RunID, s.Step) }

// BatchID returns the id of a run's batch at step.
func BatchID(runID string, step int64) string { return fmt.Sprintf("%s/%d", runID, step) }

// OperationID returns <run_id>/<step>/<call_id>, the idempotency key every
// executor of the call receives, identical on every attempt.
func OperationID(batchID, callID string) string { return batchID + "/" + callID }

// Digest returns a content hash of the submission; an identical resubmission
// has the same digest.
func (s *Submit) Digest() string {
	b, err := Marshal(s)
	if err != nil {
		// A decoded submission always encodes; this is a programming error.
		panic(fmt.Sprintf("events: encode submit for digest: %v", err))
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// Fields a submission may never carry, at any level: placement and recovery
// are the operator's, not the model's.
var forbiddenFields = []string{"target", "kind", "pool", "recovery", "capability"}

// DecodeSubmit decodes a submission from msgpack, or JSON when isJSON, and
// validates it against the limits. Every failure is a *Refusal with its
// protocol code; when the body decoded but is not valid, the submission is
// returned with the refusal, so that the refusal can name its batch.
func DecodeSubmit(body []byte, isJSON bool, lim Limits) (*Submit, error) {
	v, err := decodeGeneric(body, isJSON)
	if err != nil {
		return nil, err
	}
	m, err := object(v, "submit")
	if err != nil {
		return nil, err
	}
	for _, f := range forbiddenFields {
		if _, ok := m[f]; ok {
			return nil, Refuse(CodeForbiddenField, "submit.%s: a submission cannot choose placement or recovery", f)
		}
	}
	if err := only(m, "submit", "run_id", "thread_id", "step", "assistant", "narrowing"); err != nil {
		return nil, err
	}
	s := &Submit{}
	if s.RunID, err = str(m, "run_id", "submit", true); err != nil {
		return nil, err
	}
	if s.ThreadID, err = str(m, "thread_id", "submit", true); err != nil {
		return nil, err
	}
	if s.Step, err = integer(m, "step", "submit", true); err != nil {
		return nil, err
	}
	if s.Narrowing, err = str(m, "narrowing", "submit", false); err != nil {
		return nil, err
	}
	am, err := object(m["assistant"], "submit.assistant")
	if err != nil {
		return nil, err
	}
	if err := only(am, "submit.assistant", "id", "content"); err != nil {
		return nil, err
	}
	if s.Assistant.ID, err = str(am, "id", "submit.assistant", false); err != nil {
		return nil, err
	}
	if s.Assistant.Content, err = parseBlocks(am["content"], "submit.assistant.content"); err != nil {
		return nil, err
	}
	if err := s.Validate(lim); err != nil {
		return s, err // decoded but not acceptable: the caller may still name its batch
	}
	return s, nil
}

var (
	idPattern     = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	callIDPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)
)

// ValidRunID reports whether id is a valid run_id (also the rule for tool_id).
func ValidRunID(id string) bool { return idPattern.MatchString(id) }

// ValidToolID reports whether id is a valid tool_id.
func ValidToolID(id string) bool { return idPattern.MatchString(id) }

// ValidCallID reports whether id is a valid call_id (also the rule for
// thread_id, correlation_id and worker_id).
func ValidCallID(id string) bool { return callIDPattern.MatchString(id) }

// Validate checks ids, limits, call id uniqueness and arguments. It returns
// the first problem as a *Refusal.
func (s *Submit) Validate(lim Limits) error {
	if !ValidRunID(s.RunID) {
		return Refuse(CodeInvalidID, "run_id %q must match [A-Za-z0-9_-]{1,64}", s.RunID)
	}
	if !ValidCallID(s.ThreadID) {
		return Refuse(CodeInvalidID, "thread_id %q must match [A-Za-z0-9_-]{1,128}", s.ThreadID)
	}
	if s.Step < 0 {
		return Refuse(CodeUndecodable, "step %d must not be negative", s.Step)
	}
	switch s.Narrowing {
	case "", NarrowingConfigured, NarrowingDenyAll:
	default:
		return Refuse(CodeUndecodable, "narrowing %q must be configured or deny_all", s.Narrowing)
	}
	calls := s.Calls()
	if len(calls) > lim.MaxCalls {
		return Refuse(CodeLimitExceeded, "%d calls in one batch, at most %d", len(calls), lim.MaxCalls)
	}
	seen := make(map[string]bool, len(calls))
	for i, c := range calls {
		if !ValidCallID(c.CallID) {
			return Refuse(CodeInvalidID, "call %d: call_id %q must match [A-Za-z0-9_-]{1,128}", i, c.CallID)
		}
		if !ValidToolID(c.ToolID) {
			return Refuse(CodeInvalidID, "call %s: tool name %q must match [A-Za-z0-9_-]{1,64}", c.CallID, c.ToolID)
		}
		if seen[c.CallID] {
			return Refuse(CodeDuplicateCallID, "call_id %q appears twice", c.CallID)
		}
		seen[c.CallID] = true
		if len(c.Arguments) > lim.MaxArgumentBytes {
			return Refuse(CodeLimitExceeded, "call %s: arguments are %d bytes, at most %d", c.CallID, len(c.Arguments), lim.MaxArgumentBytes)
		}
		if !c.Arguments.IsObjectOrNull() {
			return Refuse(CodeUndecodable, "call %s: input must be a JSON object or null", c.CallID)
		}
	}
	return nil
}

// decodeGeneric decodes a body into a generic value.
func decodeGeneric(body []byte, isJSON bool) (v any, err error) {
	if isJSON {
		v, err = jsonToValue(body)
		if err != nil {
			return nil, undecodablef("body is not valid JSON: %v", err)
		}
		return v, nil
	}
	defer func() {
		if r := recover(); r != nil {
			v, err = nil, undecodablef("body is not valid msgpack: %v", r)
		}
	}()
	if err := checkShape(body); err != nil {
		return nil, undecodablef("body is not valid msgpack: %v", err)
	}
	rd := bytes.NewReader(body)
	v, err = decodeValue(msgpack.NewDecoder(rd), 0)
	if err != nil {
		return nil, undecodablef("body is not valid msgpack: %v", err)
	}
	if rd.Len() != 0 {
		return nil, undecodablef("body has %d trailing bytes", rd.Len())
	}
	return v, nil
}

// ResultKind is the kind of a resume's result.
type ResultKind string

// Resume result kinds.
const (
	ResultPermission ResultKind = "permission" // permission and scheduled tickets
	ResultToolResult ResultKind = "tool_result"
	ResultInput      ResultKind = "input" // delegation only
)

// ResumeResult is what a resume answers: a permission, a client's tool
// result, or input for a delegated child.
type ResumeResult struct {
	Kind   ResultKind
	Allow  bool    // permission
	Note   string  // permission: a note on approval
	Reason string  // permission: a reason on denial
	Output *Output // tool_result
	Text   string  // input
}

func (r ResumeResult) fields() []field {
	switch r.Kind {
	case ResultPermission:
		fs := []field{{"kind", string(r.Kind)}, {"allow", r.Allow}}
		if r.Note != "" {
			fs = append(fs, field{"note", r.Note})
		}
		if r.Reason != "" {
			fs = append(fs, field{"reason", r.Reason})
		}
		return fs
	case ResultToolResult:
		return []field{{"kind", string(r.Kind)}, {"output", r.Output}}
	default:
		return []field{{"kind", string(r.Kind)}, {"text", r.Text}}
	}
}

// EncodeMsgpack implements msgpack.CustomEncoder.
func (r ResumeResult) EncodeMsgpack(enc *msgpack.Encoder) error { return encodeFields(enc, r.fields()) }

// DecodeMsgpack implements msgpack.CustomDecoder.
func (r *ResumeResult) DecodeMsgpack(dec *msgpack.Decoder) error {
	v, err := decodeValue(dec, 0)
	if err != nil {
		return err
	}
	res, err := parseResumeResult(v, "result")
	if err != nil {
		return err
	}
	*r = res
	return nil
}

// MarshalJSON implements json.Marshaler.
func (r ResumeResult) MarshalJSON() ([]byte, error) { return marshalFields(r.fields()) }

func parseResumeResult(v any, path string) (ResumeResult, error) {
	m, err := object(v, path)
	if err != nil {
		return ResumeResult{}, err
	}
	kind, err := str(m, "kind", path, true)
	if err != nil {
		return ResumeResult{}, err
	}
	r := ResumeResult{Kind: ResultKind(kind)}
	switch r.Kind {
	case ResultPermission:
		if err := only(m, path, "kind", "allow", "note", "reason"); err != nil {
			return r, err
		}
		if b, ok := m["allow"].(bool); !ok {
			return r, undecodablef("%s.allow: want true or false", path)
		} else {
			r.Allow = b
		}
		if r.Allow, err = boolean(m, "allow", path); err != nil {
			return r, err
		}
		if r.Note, err = str(m, "note", path, false); err != nil {
			return r, err
		}
		r.Reason, err = str(m, "reason", path, false)
	case ResultToolResult:
		if err := only(m, path, "kind", "output"); err != nil {
			return r, err
		}
		var o Output
		o, err = parseOutput(m["output"], path+".output")
		r.Output = &o
	case ResultInput:
		if err := only(m, path, "kind", "text"); err != nil {
			return r, err
		}
		r.Text, err = str(m, "text", path, true)
	default:
		return r, undecodablef("%s.kind: %q is not permission, tool_result or input", path, kind)
	}
	return r, err
}

func parseOutput(v any, path string) (Output, error) {
	m, err := object(v, path)
	if err != nil {
		return Output{}, err
	}
	if err := only(m, path, "call_id", "content", "is_error", "state"); err != nil {
		return Output{}, err
	}
	var o Output
	if o.CallID, err = str(m, "call_id", path, true); err != nil {
		return o, err
	}
	if o.Content, err = parseBlocks(m["content"], path+".content"); err != nil {
		return o, err
	}
	if o.IsError, err = boolean(m, "is_error", path); err != nil {
		return o, err
	}
	if st, ok := m["state"]; ok && st != nil {
		arr, ok := st.([]any)
		if !ok {
			return o, undecodablef("%s.state: want an array of commands, got %s", path, kindOf(st))
		}
		for i, e := range arr {
			c, err := parseCommand(e, fmt.Sprintf("%s.state[%d]", path, i))
			if err != nil {
				return o, err
			}
			o.State = append(o.State, c)
		}
	}
	return o, nil
}

func parseCommand(v any, path string) (Command, error) {
	m, err := object(v, path)
	if err != nil {
		return Command{}, err
	}
	if err := only(m, path, "scope", "key", "merge", "action", "value"); err != nil {
		return Command{}, err
	}
	var c Command
	var s string
	if s, err = str(m, "scope", path, true); err != nil {
		return c, err
	}
	c.Scope = Scope(s)
	if c.Key, err = str(m, "key", path, true); err != nil {
		return c, err
	}
	if s, err = str(m, "merge", path, true); err != nil {
		return c, err
	}
	c.Merge = Merge(s)
	if s, err = str(m, "action", path, true); err != nil {
		return c, err
	}
	c.Action = Action(s)
	if c.Action == ActionSet {
		if c.Value, err = valueToJSON(m["value"]); err != nil {
			return c, undecodablef("%s.value: %v", path, err)
		}
	}
	return c, c.Validate()
}

// Validate checks a staged command's enumerations and key.
func (c Command) Validate() error {
	switch c.Scope {
	case ScopeRun, ScopeThread, ScopeShared:
	default:
		return undecodablef("command scope %q is not run, thread or shared", c.Scope)
	}
	switch c.Merge {
	case MergeDisjoint, MergeCommutative, MergeExclusive:
	default:
		return undecodablef("command merge %q is not disjoint, commutative or exclusive", c.Merge)
	}
	switch c.Action {
	case ActionSet, ActionRemove:
	default:
		return undecodablef("command action %q is not set or remove", c.Action)
	}
	if c.Key == "" || len(c.Key) > 256 {
		return undecodablef("command key must be 1 to 256 bytes")
	}
	return nil
}

// Resume answers a run's ticket, on toolbatch.resume.<run_id>[.<principal>].
type Resume struct {
	CorrelationID string       `msgpack:"correlation_id" json:"correlation_id"`
	RunID         string       `msgpack:"run_id" json:"run_id"`
	ThreadID      string       `msgpack:"thread_id" json:"thread_id"`
	CallID        string       `msgpack:"call_id,omitempty" json:"call_id,omitempty"`
	SnapshotID    string       `msgpack:"snapshot_id,omitempty" json:"snapshot_id,omitempty"`
	Result        ResumeResult `msgpack:"result" json:"result"`
}

// DecodeResume decodes a resume from msgpack, or JSON when isJSON.
func DecodeResume(body []byte, isJSON bool, lim Limits) (*Resume, error) {
	v, err := decodeGeneric(body, isJSON)
	if err != nil {
		return nil, err
	}
	m, err := object(v, "resume")
	if err != nil {
		return nil, err
	}
	if err := only(m, "resume", "correlation_id", "run_id", "thread_id", "call_id", "snapshot_id", "result"); err != nil {
		return nil, err
	}
	r := &Resume{}
	if r.CorrelationID, err = str(m, "correlation_id", "resume", true); err != nil {
		return nil, err
	}
	if r.RunID, err = str(m, "run_id", "resume", true); err != nil {
		return nil, err
	}
	if r.ThreadID, err = str(m, "thread_id", "resume", true); err != nil {
		return nil, err
	}
	if r.CallID, err = str(m, "call_id", "resume", false); err != nil {
		return nil, err
	}
	if r.SnapshotID, err = str(m, "snapshot_id", "resume", false); err != nil {
		return nil, err
	}
	if r.Result, err = parseResumeResult(m["result"], "resume.result"); err != nil {
		return nil, err
	}
	switch {
	case !ValidCallID(r.CorrelationID):
		return nil, Refuse(CodeInvalidID, "correlation_id %q must match [A-Za-z0-9_-]{1,128}", r.CorrelationID)
	case !ValidRunID(r.RunID):
		return nil, Refuse(CodeInvalidID, "run_id %q must match [A-Za-z0-9_-]{1,64}", r.RunID)
	case !ValidCallID(r.ThreadID):
		return nil, Refuse(CodeInvalidID, "thread_id %q must match [A-Za-z0-9_-]{1,128}", r.ThreadID)
	case r.CallID != "" && !ValidCallID(r.CallID):
		return nil, Refuse(CodeInvalidID, "call_id %q must match [A-Za-z0-9_-]{1,128}", r.CallID)
	}
	if r.Result.Output != nil {
		if n := OutputSize(*r.Result.Output); n > lim.MaxOutputBytes {
			return nil, Refuse(CodeLimitExceeded, "output is %d bytes, at most %d", n, lim.MaxOutputBytes)
		}
	}
	return r, nil
}

// OutputSize returns the size of an output as canonical JSON, the measure
// of the output limit.
func OutputSize(o Output) int {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(o); err != nil {
		return math.MaxInt // what cannot be measured does not fit
	}
	return buf.Len() - 1 // the encoder's newline
}

// ControlAction is what a control message asks.
type ControlAction string

// Control actions.
const (
	ControlCancel    ControlAction = "cancel"
	ControlInterrupt ControlAction = "interrupt"
	ControlPerform   ControlAction = "perform"
)

// Control is a run control message on toolbatch.control.<run_id>.
type Control struct {
	Action        ControlAction `msgpack:"action" json:"action"`
	CorrelationID string        `msgpack:"correlation_id,omitempty" json:"correlation_id,omitempty"`
	Reason        string        `msgpack:"reason,omitempty" json:"reason,omitempty"`
}

// DecodeControl decodes a control message from msgpack, or JSON when isJSON.
func DecodeControl(body []byte, isJSON bool) (*Control, error) {
	v, err := decodeGeneric(body, isJSON)
	if err != nil {
		return nil, err
	}
	m, err := object(v, "control")
	if err != nil {
		return nil, err
	}
	if err := only(m, "control", "action", "correlation_id", "reason"); err != nil {
		return nil, err
	}
	c := &Control{}
	var a string
	if a, err = str(m, "action", "control", true); err != nil {
		return nil, err
	}
	c.Action = ControlAction(a)
	switch c.Action {
	case ControlCancel, ControlInterrupt:
	case ControlPerform:
		if id, _ := m["correlation_id"].(string); !ValidCallID(id) {
			return nil, undecodablef("control.correlation_id: perform needs the scheduled ticket's correlation_id ([A-Za-z0-9_-]{1,128})")
		}
	default:
		return nil, undecodablef("control.action: %q is not cancel, interrupt or perform", a)
	}
	if c.CorrelationID, err = str(m, "correlation_id", "control", false); err != nil {
		return nil, err
	}
	if c.Reason, err = str(m, "reason", "control", false); err != nil {
		return nil, err
	}
	return c, nil
}

// Dispatch is a sandbox job on toolbatch.dispatch.<pool>.<tool_id>, with
// Nats-Msg-Id <operation_id>/<attempt>.
type Dispatch struct {
	BatchID     string  `msgpack:"batch_id" json:"batch_id"`
	RunID       string  `msgpack:"run_id" json:"run_id"`
	CallID      string  `msgpack:"call_id" json:"call_id"`
	ToolID      string  `msgpack:"tool_id" json:"tool_id"`
	Arguments   RawJSON `msgpack:"arguments" json:"arguments"`
	Attempt     int     `msgpack:"attempt" json:"attempt"`
	OperationID string  `msgpack:"operation_id" json:"operation_id"`
}

// ClaimRequest asks for an attempt on toolbatch.api.claim.
type ClaimRequest struct {
	OperationID string `msgpack:"operation_id" json:"operation_id"`
	Attempt     int    `msgpack:"attempt" json:"attempt"`
	WorkerID    string `msgpack:"worker_id" json:"worker_id"`
}

// ClaimReply answers a claim: granted with a token and a lease, or refused
// with a reason.
type ClaimReply struct {
	Granted    bool   `msgpack:"granted" json:"granted"`
	ClaimToken string `msgpack:"claim_token,omitempty" json:"claim_token,omitempty"`
	LeaseMS    int64  `msgpack:"lease_ms,omitempty" json:"lease_ms,omitempty"`
	Reason     string `msgpack:"reason,omitempty" json:"reason,omitempty"`
}

// ReasonBusy in a refused ClaimReply means the engine could not decide
// now: give the job back and try again later (nothing was granted).
const ReasonBusy = "engine busy, try again"

// Heartbeat extends a claim's lease on toolbatch.api.heartbeat; the reply is
// a ClaimReply (granted false when the claim is no longer current).
type Heartbeat struct {
	OperationID string `msgpack:"operation_id" json:"operation_id"`
	Attempt     int    `msgpack:"attempt" json:"attempt"`
	ClaimToken  string `msgpack:"claim_token" json:"claim_token"`
	WorkerID    string `msgpack:"worker_id" json:"worker_id"`
}

// Result reports an attempt's outcome on toolbatch.result.<run_id>: an
// output or an error, fenced by the claim token.
type Result struct {
	OperationID string     `msgpack:"operation_id" json:"operation_id"`
	Attempt     int        `msgpack:"attempt" json:"attempt"`
	ClaimToken  string     `msgpack:"claim_token" json:"claim_token"`
	Output      *Output    `msgpack:"output,omitempty" json:"output,omitempty"`
	Error       *ToolError `msgpack:"error,omitempty" json:"error,omitempty"`
}

// ErrResultShape is returned for a result with both or neither of output and
// error.
var ErrResultShape = errors.New("events: a result carries exactly one of output and error")

// DecodeResult decodes and checks a result message.
func DecodeResult(body []byte, lim Limits) (*Result, error) {
	var r Result
	if err := Unmarshal(body, &r); err != nil {
		return nil, err
	}
	if (r.Output == nil) == (r.Error == nil) {
		return nil, ErrResultShape
	}
	if r.Output != nil {
		if err := r.Output.validBlocks(); err != nil {
			return nil, err
		}
		if n := OutputSize(*r.Output); n > lim.MaxOutputBytes {
			return nil, Refuse(CodeLimitExceeded, "output is %d bytes, at most %d", n, lim.MaxOutputBytes)
		}
	}
	return &r, nil
}

// DispositionOut is published on toolbatch.out.<run_id>.disposition.
type DispositionOut struct {
	BatchID     string      `msgpack:"batch_id" json:"batch_id"`
	CallID      string      `msgpack:"call_id" json:"call_id"`
	ToolID      string      `msgpack:"tool_id" json:"tool_id"`
	Disposition Disposition `msgpack:"disposition" json:"disposition"`
	Phase       Phase       `msgpack:"phase" json:"phase"`
	Attempt     int         `msgpack:"attempt" json:"attempt"`
}

// ResultsOut is published on toolbatch.out.<run_id>.results, exactly once
// per batch.
type ResultsOut struct {
	BatchID string         `msgpack:"batch_id" json:"batch_id"`
	Step    int64          `msgpack:"step" json:"step"`
	Results []ContentBlock `msgpack:"results" json:"results"`
	State   []Command      `msgpack:"state" json:"state"`
}

// AwaitingOut is published on toolbatch.out.<run_id>.awaiting: the ticket,
// with deadline and due as RFC 3339 UTC.
type AwaitingOut struct {
	CorrelationID string   `msgpack:"correlation_id" json:"correlation_id"`
	RunID         string   `msgpack:"run_id" json:"run_id"`
	ThreadID      string   `msgpack:"thread_id" json:"thread_id"`
	BatchID       string   `msgpack:"batch_id" json:"batch_id"`
	CallID        string   `msgpack:"call_id" json:"call_id"`
	ToolID        string   `msgpack:"tool_id" json:"tool_id"`
	Arguments     RawJSON  `msgpack:"arguments" json:"arguments"`
	Reason        WaitKind `msgpack:"reason" json:"reason"`
	SnapshotID    string   `msgpack:"snapshot_id" json:"snapshot_id"`
	Deadline      string   `msgpack:"deadline,omitempty" json:"deadline,omitempty"`
	Due           string   `msgpack:"due,omitempty" json:"due,omitempty"`
	ActionKind    string   `msgpack:"action_kind,omitempty" json:"action_kind,omitempty"`
}

// RejectedOut is published on toolbatch.out.<run_id>.rejected.
type RejectedOut struct {
	BatchID string `msgpack:"batch_id,omitempty" json:"batch_id,omitempty"`
	Code    Code   `msgpack:"code" json:"code"`
	Reason  string `msgpack:"reason" json:"reason"`
}

// RefusedOut is published on toolbatch.out.<run_id>.refused.
type RefusedOut struct {
	CorrelationID string `msgpack:"correlation_id,omitempty" json:"correlation_id,omitempty"`
	Code          Code   `msgpack:"code" json:"code"`
	Reason        string `msgpack:"reason" json:"reason"`
}

// EndedOut is published on toolbatch.out.<run_id>.ended.
type EndedOut struct {
	Cause  EndCause `msgpack:"cause" json:"cause"`
	Reason string   `msgpack:"reason,omitempty" json:"reason,omitempty"`
}

// validBlocks checks that every content block has a known type: the msgpack
// library decodes a nil block as a zero block without asking the block's own
// decoder.
func (o Output) validBlocks() error {
	for i, c := range o.State {
		if err := c.Validate(); err != nil {
			return fmt.Errorf("state[%d]: %w", i, err)
		}
	}
	return checkBlocks(o.Content)
}

func checkBlocks(bs []ContentBlock) error {
	for i, b := range bs {
		switch b.Type {
		case BlockText, BlockToolUse, BlockJSON:
		case BlockImage:
			if b.Source == nil {
				return fmt.Errorf("%w: content[%d]: image without a source", ErrMalformed, i)
			}
		case BlockToolResult:
			if err := checkBlocks(b.Content); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%w: content[%d]: block type %q", ErrMalformed, i, b.Type)
		}
	}
	return nil
}

func (o *ResultsOut) validBlocks() error { return checkBlocks(o.Results) }

// Out returns the ticket as published on .awaiting.
func (t Ticket) Out() AwaitingOut {
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
