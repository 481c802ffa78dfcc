package catalog

import (
	"fmt"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/toolbatch/toolbatch/events"
)

// Defaults of the catalog file. A field left out (or written as its zero
// value) takes the default named here.
const (
	// DefaultTarget is where a tool runs when the catalog does not say.
	DefaultTarget = events.TargetBrain
	// DefaultKind is how a tool is carried out when the catalog does not say.
	DefaultKind = events.KindTool
	// DefaultPool is the sandbox pool of a sandbox tool that names none.
	DefaultPool = events.DefaultPool
	// DefaultMode is the recovery mode of a tool that names none. A
	// delegation tool is always durable_request.
	DefaultMode = events.ModeNeverReplay
	// DefaultMaxAttempts is the attempt budget of a tool that names none (or
	// writes 0).
	DefaultMaxAttempts = events.DefaultMaxAttempts
	// DefaultDispatchDeadline is how long a sandbox call may wait for a
	// worker's claim before it is unavailable_before_dispatch.
	DefaultDispatchDeadline = 30 * time.Second
	// DefaultBlockReason is the reason of a block rule that names none.
	DefaultBlockReason = "blocked by policy"
	// DefaultExternalTimeout is how long the engine waits for the external
	// gate service when gate.external names no timeout.
	DefaultExternalTimeout = 2 * time.Second
	// DefaultExternalOnTimeout is the outcome when the external gate service
	// does not answer in time and gate.external names none: fail closed.
	DefaultExternalOnTimeout = events.GateBlock
	// CELCostLimit bounds the work of one evaluation of a rule's when
	// expression, in CEL cost units. An evaluation that exceeds it is a
	// policy error: the call is blocked.
	CELCostLimit = 1_000_000
)

// Config is a catalog file as written: the YAML document an operator edits.
// Parse decodes it strictly (an unknown key is an error) and validates all of
// it. A field left out takes the default documented on it.
type Config struct {
	// Tools are the tools the engine knows, in any order. A call naming a
	// tool not listed here completes with the error output
	// "unknown tool: <id>"; the rest of its batch runs.
	Tools []ToolConfig `yaml:"tools"`
	// Gate holds the policy rules and the optional external gate service.
	// Without it every call is allowed (after the run's narrowing).
	Gate GateConfig `yaml:"gate"`
}

// ToolConfig is one entry of tools. A field that does not apply to the tool
// (pool on a brain tool, say) is an error unless it holds its default value,
// so that a fully spelled-out template stays valid.
type ToolConfig struct {
	// ID is the tool's name as the model calls it. Required; it matches
	// ^[A-Za-z0-9_-]{1,64}$ and is unique in the catalog.
	ID string `yaml:"id"`
	// Target is where the implementation runs: brain (beside the engine) or
	// sandbox (on a sandbox worker). Default brain. Only kind tool may run
	// in a sandbox.
	Target events.Target `yaml:"target"`
	// Builtin names the built-in Go tool that implements a brain tool of
	// kind tool (echo, sleep, fail, ...). Empty (the default): the tool is
	// served by a host service on <prefix>.brain.<id>. The engine checks
	// that the name exists when it starts.
	Builtin string `yaml:"builtin"`
	// Kind is how a call is carried out: tool (executed by the engine or a
	// worker), client (executed by the client: the call parks on an
	// external_result ticket and skips the gate) or delegation (a child
	// run). Default tool.
	Kind events.ToolKind `yaml:"kind"`
	// Pool is the sandbox pool whose workers may claim the tool's calls.
	// Sandbox tools only; default "default". It matches the tool id rule.
	Pool string `yaml:"pool"`
	// Recovery is the recovery policy pinned into each call at submit.
	Recovery RecoveryConfig `yaml:"recovery"`
	// DispatchDeadline is how long a sandbox call may wait for a worker to
	// claim it; when it passes unclaimed, the attempt is
	// unavailable_before_dispatch (nothing ran). Sandbox tools only; a Go
	// duration such as 30s; default 30s; must be positive.
	DispatchDeadline Duration `yaml:"dispatch_deadline"`
	// ParallelCompletion says that a delegation supports parallel
	// completion: a batch made only of such calls may run them concurrently
	// when every gate allows. Delegation tools only; default false.
	ParallelCompletion bool `yaml:"parallel_completion"`
	// WaitDeadline bounds a wait on the client: how long a client tool's
	// external_result ticket, or a delegation's input ticket, stays open;
	// when it passes, the call completes with "client result timed out"
	// (or "delegation input timed out"). Client and delegation tools only;
	// a Go duration; default none (the ticket waits until resolved or the
	// run ends).
	WaitDeadline Duration `yaml:"wait_deadline"`
	// Description says what the tool does, for the model (toolbatch tools
	// prints it in the providers' tool definitions).
	Description string `yaml:"description"`
	// InputSchema is the JSON Schema (draft 2020-12 or draft-07) of the
	// tool's arguments, written as YAML; a call whose arguments do not
	// match it completes with an invalid_arguments error output and never
	// runs. Default none: any object.
	InputSchema map[string]any `yaml:"input_schema"`
	// MCP makes a brain tool a tool of an MCP server the operator runs,
	// reached over streamable HTTP (docs/mcp.md).
	MCP *MCPConfig `yaml:"mcp"`
}

// MCPConfig is the MCP server behind a brain tool.
type MCPConfig struct {
	// URL is the server's streamable HTTP endpoint (http or https).
	URL string `yaml:"url"`
	// Tool is the server's name of the tool; default the tool's id.
	Tool string `yaml:"tool"`
	// Capability is what the tool can survive, as the operator knows it
	// (the server declares nothing the engine trusts); default
	// non_recoverable.
	Capability events.Capability `yaml:"capability"`
}

// RecoveryConfig is a tool's recovery policy: what the engine may do with a
// call whose executor was entered when its owner was lost.
type RecoveryConfig struct {
	// Mode is never_replay, replay_safe, idempotent or durable_request.
	// Default never_replay. A mode other than never_replay is only honoured
	// when it equals the executor's live capability. A delegation tool is
	// always durable_request (the only mode it accepts); a client tool
	// accepts only never_replay (the client executes it).
	Mode events.Mode `yaml:"mode"`
	// MaxAttempts bounds the attempts of one call, the first included.
	// Default 3 (also when written as 0); negative is an error.
	MaxAttempts int `yaml:"max_attempts"`
}

// GateConfig holds the operator's gate: the policy rules (stage b of the
// gate chain) and the optional external gate service (stage c).
type GateConfig struct {
	// Rules are tried in order; the first rule that matches decides. No
	// match: the policy stage allows.
	Rules []RuleConfig `yaml:"rules"`
	// External, when present, enables the external gate service on
	// <prefix>.gate, asked after the rules allowed.
	External *ExternalConfig `yaml:"external"`
}

// RuleConfig is one policy rule. A field that does not belong to the rule's
// outcome is an error.
type RuleConfig struct {
	// Tools are globs on the tool id (path.Match syntax: *, ?, [a-z], \
	// escapes). At least one; the rule matches a call whose tool id
	// matches any of them.
	Tools []string `yaml:"tools"`
	// When is an optional CEL expression that must also be true for the
	// rule to match. Variables: tool_id (string), args (map: the call's
	// arguments), state (map: the committed state visible to the run). It
	// must compile and have type bool (or dyn, checked when evaluated).
	// An evaluation error decides block with "policy error: ..." (fail
	// closed).
	When string `yaml:"when"`
	// Outcome is what the rule decides: allow, block, set_result,
	// require_confirmation or schedule. Required.
	Outcome events.GateOutcome `yaml:"outcome"`
	// Reason is the block reason (block only); the call completes with
	// "blocked: <reason>". Default "blocked by policy".
	Reason string `yaml:"reason"`
	// Output is the output the call completes with (set_result only, and
	// required there).
	Output *OutputConfig `yaml:"output"`
	// Deadline is how long the confirmation ticket stays open
	// (require_confirmation only; optional; a positive Go duration). When
	// it passes unanswered the call completes with
	// "blocked: confirmation timed out". Without it the ticket never
	// expires.
	Deadline *Duration `yaml:"deadline"`
	// After schedules the call this long after the gate decided (schedule
	// only; a Go duration, not negative). Exactly one of After and At.
	After *Duration `yaml:"after"`
	// At schedules the call at a fixed time (schedule only; RFC 3339, such
	// as 2030-01-02T15:04:05Z). Exactly one of After and At. A time already
	// past is performed as soon as the engine sees it.
	At *Timestamp `yaml:"at"`
	// ActionKind labels the scheduled action on its ticket (schedule only;
	// optional, free text).
	ActionKind string `yaml:"action_kind"`
}

// OutputConfig is a set_result rule's output: a ToolOutput without call id
// (the engine fills it in) and without staged state (a gate may only
// restrict: it never writes state).
type OutputConfig struct {
	// Content is the output's content blocks, as in the protocol: for
	// example [{type: text, text: sunny}]. Empty: the contract's text for an
	// empty output is used.
	Content []map[string]any `yaml:"content"`
	// IsError marks the output as an error. Default false.
	IsError bool `yaml:"is_error"`
}

// ExternalConfig enables the external gate service.
type ExternalConfig struct {
	// Timeout is how long the engine waits for the service's answer. A
	// positive Go duration; default 2s.
	Timeout Duration `yaml:"timeout"`
	// OnTimeout is the outcome when the service does not answer in time (or
	// cannot be reached): allow or block. Default block (fail closed).
	OnTimeout events.GateOutcome `yaml:"on_timeout"`
}

// Validate reports every problem of the configuration, joined with
// errors.Join; each problem is a *ProblemError (errors.Is ErrInvalid) that
// names where it is. It compiles every CEL expression. Parse runs it.
func (c *Config) Validate() error {
	_, problems := build(c, nil)
	return joinProblems(problems)
}

// Duration is a Go duration written as a string in the catalog: "30s",
// "10m", "1h30m".
type Duration time.Duration

// UnmarshalYAML implements yaml.Unmarshaler.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return nodeError(n, "want a duration such as 30s, 10m or 1h")
	}
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return nodeError(n, fmt.Sprintf("%q is not a duration (want one such as 30s, 10m or 1h)", n.Value))
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML implements yaml.Marshaler.
func (d Duration) MarshalYAML() (any, error) { return time.Duration(d).String(), nil }

// Timestamp is an RFC 3339 time in the catalog, such as
// 2030-01-02T15:04:05Z.
type Timestamp struct{ time.Time }

// UnmarshalYAML implements yaml.Unmarshaler.
func (t *Timestamp) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return nodeError(n, "want an RFC 3339 time such as 2030-01-02T15:04:05Z")
	}
	v, err := time.Parse(time.RFC3339, n.Value)
	if err != nil {
		return nodeError(n, fmt.Sprintf("%q is not an RFC 3339 time (want one such as 2030-01-02T15:04:05Z)", n.Value))
	}
	t.Time = v
	return nil
}

// MarshalYAML implements yaml.Marshaler.
func (t Timestamp) MarshalYAML() (any, error) { return t.Format(time.RFC3339Nano), nil }

// nodeError is a decode error at a node. It is a *yaml.TypeError so that the
// decoder records it and goes on (reporting every problem); the column lets
// the error be placed exactly even in a flow mapping.
func nodeError(n *yaml.Node, msg string) error {
	return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: column %d: %s", n.Line, n.Column, msg)}}
}
