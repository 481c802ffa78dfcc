package events

import (
	"strings"
)

// Target says where a tool's implementation runs. It is fixed by the
// operator's catalog; a submission can never choose it.
type Target string

// DefaultPool is the sandbox pool of a sandbox tool that names none.
const DefaultPool = "default"

// Targets.
const (
	TargetBrain   Target = "brain"   // beside the engine, in-process or as a host service
	TargetSandbox Target = "sandbox" // on a sandbox worker
)

// NoTarget is how metrics and traces name the target of a call of a tool
// the catalog lacks (never a descriptor's: not a Target).
const NoTarget = "none"

// ToolKind says how a call is carried out.
type ToolKind string

// Tool kinds.
const (
	KindTool       ToolKind = "tool"       // executed by the engine or a worker
	KindClient     ToolKind = "client"     // executed by the client; parks on an external_result ticket
	KindDelegation ToolKind = "delegation" // executed by a delegation service as a child run
	// KindUnknown is pinned for a call naming a tool the catalog lacks: the
	// call completes with "unknown tool: <id>" when its turn comes.
	KindUnknown ToolKind = "unknown"
)

// Capability is what a tool implementation can safely survive. It is
// trusted, and recomputed from the live executor at every entry.
type Capability string

// Recovery capabilities.
const (
	CapNonRecoverable Capability = "non_recoverable"
	CapReplaySafe     Capability = "replay_safe"
	CapIdempotent     Capability = "idempotent"
	CapDurableRequest Capability = "durable_request"
)

// Capabilities lists every capability, in the contract's order.
var Capabilities = []Capability{CapNonRecoverable, CapReplaySafe, CapIdempotent, CapDurableRequest}

// Mode is the recovery mode an operator chose for a tool; it is pinned into
// each call when its batch is persisted.
type Mode string

// Recovery modes.
const (
	ModeNeverReplay    Mode = "never_replay"
	ModeReplaySafe     Mode = "replay_safe"
	ModeIdempotent     Mode = "idempotent"
	ModeDurableRequest Mode = "durable_request"
)

// Modes lists every mode, in the contract's order.
var Modes = []Mode{ModeNeverReplay, ModeReplaySafe, ModeIdempotent, ModeDurableRequest}

// SupportedBy reports whether the mode is supported by a capability: a mode
// is supported iff it is never_replay or equals the capability exactly.
func (m Mode) SupportedBy(c Capability) bool {
	return m == ModeNeverReplay || string(m) == string(c)
}

// DefaultMaxAttempts is the attempt budget when a policy names none.
const DefaultMaxAttempts = 3

// Policy is a call's pinned recovery policy.
type Policy struct {
	Mode        Mode `msgpack:"mode" json:"mode"`
	MaxAttempts int  `msgpack:"max_attempts" json:"max_attempts"`
}

// Descriptor is the operator's trusted description of a tool, pinned into
// each call at submit. It is never taken from the model or the submission.
type Descriptor struct {
	Target             Target   `msgpack:"target" json:"target"`
	Kind               ToolKind `msgpack:"kind" json:"kind"`
	Pool               string   `msgpack:"pool,omitempty" json:"pool,omitempty"` // sandbox tools; "" (pinned before pools): DefaultPool
	Policy             Policy   `msgpack:"policy" json:"policy"`
	ParallelCompletion bool     `msgpack:"parallel_completion,omitempty" json:"parallel_completion,omitempty"`
}

// Phase is a call's durable phase.
type Phase string

// Call phases. Completed and indeterminate are terminal.
const (
	PhaseRequested     Phase = "requested"
	PhaseExecuting     Phase = "executing"
	PhaseAwaiting      Phase = "awaiting"
	PhaseCompleted     Phase = "completed"
	PhaseIndeterminate Phase = "indeterminate"
)

// Terminal reports whether the phase is completed or indeterminate.
func (p Phase) Terminal() bool { return p == PhaseCompleted || p == PhaseIndeterminate }

// WaitKind is why a ticket parks a run.
type WaitKind string

// Wait kinds.
const (
	WaitPermission      WaitKind = "permission"       // a gate asked for confirmation
	WaitExternalResult  WaitKind = "external_result"  // a client-executed tool
	WaitScheduledAction WaitKind = "scheduled_action" // a gate scheduled the call
	WaitDelegation      WaitKind = "delegation"       // a delegated child awaits input
)

// GateOutcome is what the gate chain decided for one call.
type GateOutcome string

// Gate outcomes.
const (
	GateAllow               GateOutcome = "allow"
	GateBlock               GateOutcome = "block"
	GateSetResult           GateOutcome = "set_result"
	GateRequireConfirmation GateOutcome = "require_confirmation"
	GateSchedule            GateOutcome = "schedule"
)

// Label is the audit label of a gate outcome: allow, deny, set_result, ask,
// schedule.
func (o GateOutcome) Label() string {
	switch o {
	case GateBlock:
		return "deny"
	case GateRequireConfirmation:
		return "ask"
	default:
		return string(o)
	}
}

// Disposition is the read projection of a call for protocol consumers.
type Disposition string

// Dispositions.
const (
	DispositionExecuted       Disposition = "executed"
	DispositionPendingClient  Disposition = "pending_client"
	DispositionPendingBuiltin Disposition = "pending_builtin"
)

// ErrorKind classifies a tool error. Every kind becomes an error output.
type ErrorKind string

// Error kinds.
const (
	ErrorUnknown                   ErrorKind = "unknown"
	ErrorInvalidArguments          ErrorKind = "invalid_arguments"
	ErrorUnavailableBeforeDispatch ErrorKind = "unavailable_before_dispatch"
	ErrorExecution                 ErrorKind = "execution"
)

// ToolError is an executor's failure report.
type ToolError struct {
	Kind    ErrorKind `msgpack:"kind" json:"kind"`
	Message string    `msgpack:"message" json:"message"`
}

// BlockType tags a content block.
type BlockType string

// Content block types.
const (
	BlockText       BlockType = "text"
	BlockImage      BlockType = "image"
	BlockToolUse    BlockType = "tool_use"
	BlockToolResult BlockType = "tool_result"
	BlockJSON       BlockType = "json"
)

// ImageSource is an image block's source: base64 data or a URL.
type ImageSource struct {
	Type      string // "base64" or "url"
	MediaType string // base64
	Data      string // base64
	URL       string // url
}

// ContentBlock is one block of a message or a tool output, tagged by Type.
// Only the fields of its type are set and encoded, and Extra.
//
// The engine interprets the types above and, of each, the keys its fields
// name; every other key of a block (a provider's citations or
// cache_control) and every block of another type (thinking,
// redacted_thinking, server_tool_use, ...) is kept as it came, in Extra,
// and written back after the interpreted keys: a provider's message is
// stored verbatim. Only tool_use blocks are calls.
type ContentBlock struct {
	Type      BlockType
	Text      string         // text
	Source    *ImageSource   // image
	ID        string         // tool_use
	Name      string         // tool_use
	Input     RawJSON        // tool_use
	ToolUseID string         // tool_result
	Content   []ContentBlock // tool_result
	IsError   bool           // tool_result
	Value     RawJSON        // json
	// Extra is a JSON object of the block's keys the engine does not
	// interpret (empty: none); never "type" or a key of the type's fields.
	Extra RawJSON
}

// Bytes is the size of what the block carries: its text, image data or
// URL, ids, name, arguments, JSON value, the keys it keeps uninterpreted
// and nested blocks. A submission's blocks are bounded by
// Limits.MaxBlockBytes.
func (b ContentBlock) Bytes() int {
	n := len(b.Text) + len(b.ID) + len(b.Name) + len(b.Input) + len(b.ToolUseID) + len(b.Value) + len(b.Extra)
	if b.Source != nil {
		n += len(b.Source.Data) + len(b.Source.URL) + len(b.Source.MediaType)
	}
	for _, c := range b.Content {
		n += c.Bytes()
	}
	return n
}

// TextBlock returns a text block.
func TextBlock(s string) ContentBlock { return ContentBlock{Type: BlockText, Text: s} }

// Message is an assistant message: its tool_use blocks, in order, are the
// calls of a batch.
type Message struct {
	ID      string         `msgpack:"id" json:"id"`
	Content []ContentBlock `msgpack:"content" json:"content"`
}

// Scope is where a staged state command applies.
type Scope string

// Scopes.
const (
	ScopeRun    Scope = "run"
	ScopeThread Scope = "thread"
	ScopeShared Scope = "shared"
)

// Merge is how a staged write combines with others of the same key.
type Merge string

// Merge strategies.
const (
	MergeDisjoint    Merge = "disjoint"    // a later write replaces
	MergeCommutative Merge = "commutative" // objects shallow-merge, anything else replaces
	MergeExclusive   Merge = "exclusive"   // a second set of the same scope+key in one batch conflicts
)

// Action is what a staged command does.
type Action string

// Actions.
const (
	ActionSet    Action = "set"
	ActionRemove Action = "remove"
)

// Command is a staged state change. Tools never write committed state: the
// commands are committed at the publication barrier.
type Command struct {
	Scope  Scope   `msgpack:"scope" json:"scope"`
	Key    string  `msgpack:"key" json:"key"`
	Merge  Merge   `msgpack:"merge" json:"merge"`
	Action Action  `msgpack:"action" json:"action"`
	Value  RawJSON `msgpack:"value,omitempty" json:"value,omitempty"`
}

// Output is a ToolOutput: what a call produced.
type Output struct {
	CallID  string         `msgpack:"call_id" json:"call_id"`
	Content []ContentBlock `msgpack:"content" json:"content"`
	IsError bool           `msgpack:"is_error" json:"is_error"`
	State   []Command      `msgpack:"state,omitempty" json:"state,omitempty"`
}

// Texts the contract gives to empty outputs.
const (
	EmptySuccessText = "Tool completed successfully without output."
	EmptyErrorText   = "Tool failed without an error message."
	InterruptedText  = "Tool execution was interrupted before completion. Please retry."
)

// Text returns the concatenated text blocks of the output.
func (o Output) Text() string {
	var b strings.Builder
	for _, c := range o.Content {
		if c.Type == BlockText {
			b.WriteString(c.Text)
		}
	}
	return b.String()
}

// Normalized returns the output for call with the contract's texts for empty
// outputs: an output with no content, or only empty text blocks, gets one
// text block.
func (o Output) Normalized(callID string) Output {
	o.CallID = callID
	empty := true
	for _, c := range o.Content {
		if c.Type != BlockText || c.Text != "" {
			empty = false
			break
		}
	}
	if empty {
		if o.IsError {
			o.Content = []ContentBlock{TextBlock(EmptyErrorText)}
		} else {
			o.Content = []ContentBlock{TextBlock(EmptySuccessText)}
		}
	}
	return o
}

// ErrorOutput returns an error output holding one text block.
func ErrorOutput(callID, text string) Output {
	return Output{CallID: callID, Content: []ContentBlock{TextBlock(text)}, IsError: true}
}

// TextOutput returns a successful output holding one text block.
func TextOutput(callID, text string) Output {
	return Output{CallID: callID, Content: []ContentBlock{TextBlock(text)}}
}

// ToolResultBlock returns the tool_result block that publishes the output.
func (o Output) ToolResultBlock() ContentBlock {
	return ContentBlock{Type: BlockToolResult, ToolUseID: o.CallID, Content: o.Content, IsError: o.IsError}
}

// ToolUse is one call of an assistant message, read from a tool_use block.
type ToolUse struct {
	CallID    string
	ToolID    string
	Arguments RawJSON
}

// ToolUses returns the message's calls: its tool_use blocks, in order.
func (m Message) ToolUses() []ToolUse {
	var out []ToolUse
	for _, b := range m.Content {
		if b.Type == BlockToolUse {
			out = append(out, ToolUse{CallID: b.ID, ToolID: b.Name, Arguments: b.Input})
		}
	}
	return out
}

// Submission is a batch as a client submitted it (package protocol decodes
// the submit message): what BatchSubmitted records of it before the calls'
// descriptors are pinned, and the content digest that recognises an
// identical resubmission.
type Submission struct {
	RunID     string
	ThreadID  string
	Step      int64
	Assistant Message
	Narrowing string
	Digest    string
}

// Answer is a resume as a client sent it (package protocol decodes the
// resume message): the ticket it names and its result. CallID and
// SnapshotID are checked when not empty.
type Answer struct {
	CorrelationID string
	RunID         string
	ThreadID      string
	CallID        string
	SnapshotID    string
	Result        ResumeResult
}
