package catalog

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"go.yaml.in/yaml/v3"

	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/internal/located"
)

// Catalog is a parsed, validated catalog: the operator's trusted tool
// descriptors and gate rules, pinned by its snapshot id. It is immutable and
// safe for concurrent use.
type Catalog struct {
	path     string // the file Load read it from; empty for Parse
	raw      []byte
	snapshot string
	tools    []Tool
	byID     map[string]int
	rules    []rule
	external *External
}

// Tool is one tool of a catalog with every default applied.
type Tool struct {
	ID      string
	Target  events.Target
	Kind    events.ToolKind
	Builtin string // a brain tool's built-in implementation; empty: served on <prefix>.brain.<id>
	Pool    string // sandbox tools; empty for others
	// Policy is the recovery policy pinned into each call: max_attempts at
	// least 1, durable_request for a delegation.
	Policy             events.Policy
	DispatchDeadline   time.Duration // sandbox tools; 0 for others
	ParallelCompletion bool          // delegation tools only
	WaitDeadline       time.Duration // client and delegation tools; 0: none
	Description        string
	// InputSchema is the JSON Schema of the arguments, as JSON (nil: none).
	InputSchema events.RawJSON
	schema      *jsonschema.Resolved
	// MCP is the MCP server of a brain tool served over streamable HTTP
	// (nil: none).
	MCP *MCPServer
}

// MCPServer is the MCP server behind a brain tool.
type MCPServer struct {
	URL        string
	Tool       string            // the server's name of the tool
	Capability events.Capability // the operator's declaration
}

// ArgumentProblem says why arguments (a JSON object, or null for {}) do
// not match the tool's input schema; "" when they do, or the tool has none.
func (t Tool) ArgumentProblem(args events.RawJSON) string {
	if t.schema == nil {
		return ""
	}
	var v any = map[string]any{}
	if len(args) > 0 && string(args) != "null" {
		if err := json.Unmarshal(args, &v); err != nil {
			return err.Error()
		}
	}
	if err := t.schema.Validate(v); err != nil {
		return "the arguments do not match the tool's input schema: " + strings.TrimPrefix(err.Error(), "validating root: ")
	}
	return ""
}

// Descriptor returns the descriptor pinned into each call of the tool.
func (t Tool) Descriptor() events.Descriptor {
	return events.Descriptor{
		Target:             t.Target,
		Kind:               t.Kind,
		Pool:               t.Pool,
		Policy:             t.Policy,
		ParallelCompletion: t.ParallelCompletion,
	}
}

// External is the external gate service's configuration.
type External struct {
	Timeout   time.Duration      // how long to wait for an answer
	OnTimeout events.GateOutcome // allow or block, when no answer came in time
}

// Parse decodes and validates a catalog. Decoding is strict: an unknown key
// is an error. Every problem is reported, joined with errors.Join; each is a
// *ProblemError naming where it is (errors.Is ErrInvalid).
func Parse(data []byte) (*Catalog, error) {
	raw := bytes.Clone(data)
	cfg, x, problems := decode(raw)
	if x == nil {
		return nil, joinProblems(problems)
	}
	c, more := build(cfg, x)
	problems = append(problems, more...)
	if len(problems) > 0 {
		return nil, joinProblems(problems)
	}
	c.raw = raw
	sum := sha256.Sum256(raw)
	c.snapshot = "cat-" + hex.EncodeToString(sum[:])[:16]
	return c, nil
}

// Load reads and parses the catalog file at path. Every error starts with
// the path (and the line, when known).
func Load(path string) (*Catalog, error) {
	data, err := located.ReadFile(path)
	if err != nil {
		return nil, err
	}
	c, err := Parse(data)
	if err != nil {
		for _, p := range located.Problems[*ProblemError](err) {
			p.Path = path
		}
		return nil, err
	}
	c.path = path
	return c, nil
}

// ToolProblem is a problem a program finds with one tool's field (a
// builtin it does not have, say), located in the catalog's text as the
// catalog's own problems are: file, line, tool.
func (c *Catalog) ToolProblem(id, field, msg string) *ProblemError {
	i := c.byID[id]
	p := &ProblemError{Path: c.path, Where: located.ToolWhere(i, id), Msg: msg}
	var doc yaml.Node
	if yaml.Unmarshal(c.raw, &doc) == nil {
		x := newIndex(&doc)
		if j, ok := x.byPath[fmt.Sprintf("tools[%d].%s", i, field)]; ok {
			p.Line = x.entries[j].keyLine
		}
	}
	return p
}

// DefaultYAML is the built-in catalog the engine uses without --catalog: the
// brain builtins echo, sleep and fail, each replay_safe with 3 attempts, and
// no gate rules. Changing it changes Default's snapshot id.
const DefaultYAML = `# toolbatch's built-in catalog (used when the engine runs without --catalog).
tools:
  - id: echo
    builtin: echo
    recovery: {mode: replay_safe, max_attempts: 3}
  - id: sleep
    builtin: sleep
    recovery: {mode: replay_safe, max_attempts: 3}
  - id: fail
    builtin: fail
    recovery: {mode: replay_safe, max_attempts: 3}
`

var defaultCatalog = sync.OnceValue(func() *Catalog {
	c, err := Parse([]byte(DefaultYAML))
	if err != nil {
		// DefaultYAML is a constant that a test parses: this cannot happen.
		panic("catalog: the built-in catalog is invalid: " + err.Error())
	}
	return c
})

// Default returns the built-in catalog parsed from DefaultYAML. Its snapshot
// id is stable as long as DefaultYAML does not change.
func Default() *Catalog { return defaultCatalog() }

// SnapshotID returns the catalog's content hash: "cat-" and the first 16 hex
// digits of the SHA-256 of the raw bytes. Equal bytes give equal ids; any
// edit of the file (even a comment) gives a new snapshot.
func (c *Catalog) SnapshotID() string { return c.snapshot }

// Raw returns a copy of the exact bytes the catalog was parsed from. Parsing
// them again gives the same catalog and snapshot id.
func (c *Catalog) Raw() []byte { return bytes.Clone(c.raw) }

// Tool returns the tool with the id, and whether the catalog has it.
func (c *Catalog) Tool(id string) (Tool, bool) {
	i, ok := c.byID[id]
	if !ok {
		return Tool{}, false
	}
	return c.tools[i], true
}

// Tools returns every tool, in the order of the file.
func (c *Catalog) Tools() []Tool { return append([]Tool(nil), c.tools...) }

// PoolTools lists the sandbox tools of each pool, in the order of the
// file: the dispatch consumers the engine creates, and what a worker of a
// pool may consume.
func (c *Catalog) PoolTools() map[string][]string {
	out := map[string][]string{}
	for _, t := range c.tools {
		if t.Target == events.TargetSandbox {
			out[t.Pool] = append(out[t.Pool], t.ID)
		}
	}
	return out
}

// Descriptor returns the descriptor of the tool with the id, and whether the
// catalog has it.
func (c *Catalog) Descriptor(id string) (events.Descriptor, bool) {
	t, ok := c.Tool(id)
	if !ok {
		return events.Descriptor{}, false
	}
	return t.Descriptor(), true
}

// External returns the external gate service's configuration, and whether
// the catalog enables it.
func (c *Catalog) External() (External, bool) {
	if c.external == nil {
		return External{}, false
	}
	return *c.external, true
}

// decode reads the document twice: as a node tree (syntax, lines) and
// strictly into a Config. The index is nil when the document could not be
// read at all, and then the problems say why.
func decode(data []byte) (*Config, *index, []*ProblemError) {
	var doc yaml.Node
	nd := yaml.NewDecoder(bytes.NewReader(data))
	if err := nd.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil, []*ProblemError{{Msg: "the catalog is empty (want a mapping with tools and gate)"}}
		}
		ps := yamlProblems(err, nil, nil)
		for _, p := range ps {
			p.Line = located.SyntaxLine(data, p.Line, p.Msg)
		}
		return nil, nil, ps
	}
	var next yaml.Node
	if err := nd.Decode(&next); !errors.Is(err, io.EOF) {
		line := next.Line
		if err != nil {
			return nil, nil, yamlProblems(err, nil, nil)
		}
		return nil, nil, []*ProblemError{{Line: line, Msg: "the file holds more than one YAML document"}}
	}
	if len(doc.Content) == 0 || (doc.Content[0].Kind == yaml.ScalarNode && doc.Content[0].Tag == "!!null") {
		return nil, nil, []*ProblemError{{Msg: "the catalog is empty (want a mapping with tools and gate)"}}
	}
	x := newIndex(&doc)
	cfg := new(Config)
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var problems []*ProblemError
	if err := dec.Decode(cfg); err != nil {
		var te *yaml.TypeError
		if !errors.As(err, &te) {
			return nil, nil, yamlProblems(err, nil, nil)
		}
		// Type errors leave the rest decoded: validate it too, so that every
		// problem is reported at once.
		problems = yamlProblems(err, x, cfg)
	}
	return cfg, x, problems
}

// checker collects the problems of a configuration.
type checker struct {
	x        *index
	problems []*ProblemError
}

// addf records a problem of the part where, at path (for the line). A
// problem about a value that did not decode is left out: its decode error
// is already reported.
// mcpServer checks the MCP server of a brain tool.
func (k *checker) mcpServer(where string, at func(string) string, tc ToolConfig, t Tool) *MCPServer {
	m := tc.MCP
	s := &MCPServer{URL: m.URL, Tool: m.Tool, Capability: m.Capability}
	if s.Tool == "" {
		s.Tool = tc.ID
	}
	if s.Capability == "" {
		s.Capability = events.CapNonRecoverable
	}
	u, err := url.Parse(m.URL)
	switch {
	case t.Target != events.TargetBrain || t.Kind != events.KindTool:
		k.addf(where, at("mcp"), "mcp is for brain tools of kind tool (a sandbox tool's MCP server is in the worker config)")
	case tc.Builtin != "":
		k.addf(where, at("mcp"), "mcp and builtin are two implementations: give one")
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		k.addf(where, at("mcp.url"), "mcp.url %q is not an http or https URL", m.URL)
	case !slices.Contains(events.Capabilities, s.Capability):
		k.addf(where, at("mcp.capability"), "mcp.capability %q is not non_recoverable, replay_safe, idempotent or durable_request", m.Capability)
	}
	return s
}

// inputSchema checks a tool's input schema and returns it as canonical
// JSON and resolved for validation (remote references are refused: the
// catalog reads nothing but itself).
func (k *checker) inputSchema(where, path string, m map[string]any) (events.RawJSON, *jsonschema.Resolved) {
	raw, err := json.Marshal(m)
	if err != nil {
		k.addf(where, path, "input_schema cannot be written as JSON: %v", err)
		return nil, nil
	}
	var sc jsonschema.Schema
	if err := json.Unmarshal(raw, &sc); err != nil {
		k.addf(where, path, "input_schema is not a JSON Schema: %v", err)
		return nil, nil
	}
	if sc.Type != "object" {
		k.addf(where, path, "input_schema must have type: object (a tool's arguments are an object)")
		return nil, nil
	}
	resolved, err := sc.Resolve(nil)
	if err != nil {
		k.addf(where, path, "input_schema: %v", err)
		return nil, nil
	}
	canon, err := events.CanonicalJSON(raw)
	if err != nil {
		k.addf(where, path, "input_schema: %v", err)
		return nil, nil
	}
	return canon, resolved
}

func (k *checker) addf(where, path, format string, args ...any) {
	if k.x.undecoded(path) {
		return
	}
	k.problems = append(k.problems, &ProblemError{Line: k.x.line(path), Where: where, Msg: fmt.Sprintf(format, args...)})
}

// build validates a configuration completely and, when it is valid, returns
// the catalog it describes (without raw bytes and snapshot id).
func build(cfg *Config, x *index) (*Catalog, []*ProblemError) {
	if x == nil {
		x = newIndex(nil)
	}
	k := &checker{x: x}
	c := &Catalog{byID: make(map[string]int, len(cfg.Tools))}
	first := map[string]int{}
	for i, tc := range cfg.Tools {
		t := k.tool(i, tc)
		if tc.ID != "" {
			if j, dup := first[tc.ID]; dup {
				k.addf(located.ToolWhere(i, tc.ID), fmt.Sprintf("tools[%d].id", i), "id %q is already used by tools[%d]", tc.ID, j)
			} else {
				first[tc.ID] = i
			}
		}
		c.byID[t.ID] = len(c.tools)
		c.tools = append(c.tools, t)
	}
	env, envErr := celEnv()
	if envErr != nil {
		k.addf("", "", "CEL environment: %v", envErr)
	}
	for i, rc := range cfg.Gate.Rules {
		r := k.rule(i, rc, env)
		c.rules = append(c.rules, r)
	}
	if cfg.Gate.External != nil {
		c.external = k.external(*cfg.Gate.External)
	}
	if len(k.problems) > 0 {
		return nil, k.problems
	}
	return c, nil
}

// tool checks one tool and applies its defaults.
func (k *checker) tool(i int, tc ToolConfig) Tool {
	where := located.ToolWhere(i, tc.ID)
	at := func(field string) string { return fmt.Sprintf("tools[%d].%s", i, field) }
	t := Tool{
		ID:      tc.ID,
		Target:  tc.Target,
		Kind:    tc.Kind,
		Builtin: tc.Builtin,
		Policy:  events.Policy{Mode: tc.Recovery.Mode, MaxAttempts: tc.Recovery.MaxAttempts},
	}
	switch {
	case tc.ID == "":
		k.addf(where, at("id"), "id is required")
	case !events.ValidToolID(tc.ID):
		k.addf(where, at("id"), "id %q does not match ^[A-Za-z0-9_-]{1,64}$", tc.ID)
	}

	if t.Target == "" {
		t.Target = DefaultTarget
	}
	targetOK := t.Target == events.TargetBrain || t.Target == events.TargetSandbox
	if !targetOK {
		k.addf(where, at("target"), "target %q is not brain or sandbox", tc.Target)
	}
	if t.Kind == "" {
		t.Kind = DefaultKind
	}
	kindOK := t.Kind == events.KindTool || t.Kind == events.KindClient || t.Kind == events.KindDelegation
	if !kindOK {
		k.addf(where, at("kind"), "kind %q is not tool, client or delegation", tc.Kind)
	}
	sandbox := t.Target == events.TargetSandbox
	if sandbox && kindOK && t.Kind != events.KindTool {
		k.addf(where, at("target"), "target sandbox is only for kind tool (kind is %s)", t.Kind)
	}

	if tc.Builtin != "" {
		switch {
		case targetOK && t.Target != events.TargetBrain:
			k.addf(where, at("builtin"), "builtin is only for target brain (target is %s)", t.Target)
		case kindOK && t.Kind != events.KindTool:
			k.addf(where, at("builtin"), "builtin is only for kind tool (kind is %s)", t.Kind)
		case !events.ValidToolID(tc.Builtin):
			k.addf(where, at("builtin"), "builtin %q does not match ^[A-Za-z0-9_-]{1,64}$", tc.Builtin)
		}
	}

	if sandbox {
		t.Pool = tc.Pool
		if t.Pool == "" {
			t.Pool = DefaultPool
		}
		if !events.ValidToolID(t.Pool) {
			k.addf(where, at("pool"), "pool %q does not match ^[A-Za-z0-9_-]{1,64}$", tc.Pool)
		}
		t.DispatchDeadline = time.Duration(tc.DispatchDeadline)
		switch {
		case t.DispatchDeadline == 0:
			t.DispatchDeadline = DefaultDispatchDeadline
		case t.DispatchDeadline < 0:
			k.addf(where, at("dispatch_deadline"), "dispatch_deadline %s is not positive", t.DispatchDeadline)
		}
	} else if targetOK {
		if tc.Pool != "" && tc.Pool != DefaultPool {
			k.addf(where, at("pool"), "pool is only for target sandbox (target is %s)", t.Target)
		}
		if d := time.Duration(tc.DispatchDeadline); d != 0 && d != DefaultDispatchDeadline {
			k.addf(where, at("dispatch_deadline"), "dispatch_deadline is only for target sandbox (target is %s)", t.Target)
		}
	}

	if tc.ParallelCompletion && kindOK && t.Kind != events.KindDelegation {
		k.addf(where, at("parallel_completion"), "parallel_completion is only for kind delegation (kind is %s)", t.Kind)
	}
	t.ParallelCompletion = tc.ParallelCompletion && t.Kind == events.KindDelegation

	t.Description = tc.Description
	if m := tc.MCP; m != nil {
		t.MCP = k.mcpServer(where, at, tc, t)
	}
	if tc.InputSchema != nil {
		t.InputSchema, t.schema = k.inputSchema(where, at("input_schema"), tc.InputSchema)
	}

	if d := time.Duration(tc.WaitDeadline); d != 0 {
		switch {
		case kindOK && t.Kind != events.KindClient && t.Kind != events.KindDelegation:
			k.addf(where, at("wait_deadline"), "wait_deadline is only for kind client or delegation (kind is %s)", t.Kind)
		case d < 0:
			k.addf(where, at("wait_deadline"), "wait_deadline %s is not positive", d)
		default:
			t.WaitDeadline = d
		}
	}

	modeOK := tc.Recovery.Mode == ""
	for _, m := range events.Modes {
		modeOK = modeOK || tc.Recovery.Mode == m
	}
	switch {
	case !modeOK:
		k.addf(where, at("recovery.mode"), "recovery.mode %q is not never_replay, replay_safe, idempotent or durable_request", tc.Recovery.Mode)
	case t.Kind == events.KindDelegation && tc.Recovery.Mode != "" && tc.Recovery.Mode != events.ModeDurableRequest:
		k.addf(where, at("recovery.mode"), "recovery.mode of a delegation is always durable_request (got %s)", tc.Recovery.Mode)
	case t.Kind == events.KindClient && tc.Recovery.Mode != "" && tc.Recovery.Mode != events.ModeNeverReplay:
		k.addf(where, at("recovery.mode"), "recovery.mode of a client tool can only be never_replay: the client executes it (got %s)", tc.Recovery.Mode)
	}
	switch {
	case t.Kind == events.KindDelegation:
		t.Policy.Mode = events.ModeDurableRequest
	case t.Policy.Mode == "":
		t.Policy.Mode = DefaultMode
	}
	switch {
	case tc.Recovery.MaxAttempts < 0:
		k.addf(where, at("recovery.max_attempts"), "recovery.max_attempts %d is negative (0 means the default, %d)", tc.Recovery.MaxAttempts, DefaultMaxAttempts)
	case tc.Recovery.MaxAttempts == 0:
		t.Policy.MaxAttempts = DefaultMaxAttempts
	}
	return t
}

// rule checks one gate rule and compiles it.
func (k *checker) rule(i int, rc RuleConfig, env celEnvT) rule {
	where := fmt.Sprintf("gate.rules[%d]", i)
	at := func(field string) string { return fmt.Sprintf("gate.rules[%d].%s", i, field) }
	r := rule{
		name:       where,
		globs:      rc.Tools,
		outcome:    rc.Outcome,
		reason:     rc.Reason,
		actionKind: rc.ActionKind,
	}
	if len(rc.Tools) == 0 {
		k.addf(where, at("tools"), "tools needs at least one glob")
	}
	for j, g := range rc.Tools {
		if g == "" {
			k.addf(where, at(fmt.Sprintf("tools[%d]", j)), "tools[%d] is an empty glob", j)
			continue
		}
		if _, err := path.Match(g, ""); err != nil {
			k.addf(where, at(fmt.Sprintf("tools[%d]", j)), "tools[%d]: %q is not a valid glob (path.Match syntax)", j, g)
		}
	}
	if strings.TrimSpace(rc.When) != "" && env != nil {
		prg, err := compileWhen(env, rc.When)
		if err != nil {
			k.addf(where, at("when"), "when: %v", err)
		}
		r.when, r.prg = rc.When, prg
	}

	// Each outcome's own fields, and no other outcome's.
	is := func(o events.GateOutcome) bool { return rc.Outcome == o }
	notFor := func(field string) {
		k.addf(where, at(field), "%s does not apply to outcome %s", field, rc.Outcome)
	}
	switch rc.Outcome {
	case "":
		k.addf(where, at("outcome"), "outcome is required (allow, block, set_result, require_confirmation or schedule)")
	case events.GateAllow, events.GateBlock, events.GateSetResult, events.GateRequireConfirmation, events.GateSchedule:
	default:
		k.addf(where, at("outcome"), "outcome %q is not allow, block, set_result, require_confirmation or schedule", rc.Outcome)
	}
	known := rc.Outcome != "" && (is(events.GateAllow) || is(events.GateBlock) || is(events.GateSetResult) ||
		is(events.GateRequireConfirmation) || is(events.GateSchedule))

	if is(events.GateBlock) && r.reason == "" {
		r.reason = DefaultBlockReason
	}
	if rc.Reason != "" && known && !is(events.GateBlock) {
		notFor("reason")
	}

	switch {
	case is(events.GateSetResult) && rc.Output == nil:
		k.addf(where, at("output"), "output is required for outcome set_result")
	case is(events.GateSetResult):
		out, err := outputOf(rc.Output)
		if err != nil {
			k.addf(where, at("output"), "output: %v", err)
		}
		r.output = out
	case rc.Output != nil && known:
		notFor("output")
	}

	if rc.Deadline != nil {
		switch {
		case known && !is(events.GateRequireConfirmation):
			notFor("deadline")
		case *rc.Deadline <= 0:
			k.addf(where, at("deadline"), "deadline %s is not positive", time.Duration(*rc.Deadline))
		default:
			r.deadline = time.Duration(*rc.Deadline)
		}
	}

	if is(events.GateSchedule) {
		switch {
		case rc.After != nil && rc.At != nil:
			k.addf(where, at("after"), "schedule takes exactly one of after and at, not both")
		case rc.After == nil && rc.At == nil:
			k.addf(where, where, "schedule needs one of after (a duration) or at (an RFC 3339 time)")
		case rc.After != nil && *rc.After < 0:
			k.addf(where, at("after"), "after %s is negative", time.Duration(*rc.After))
		case rc.After != nil:
			d := time.Duration(*rc.After)
			r.after = &d
		default:
			t := rc.At.Time
			r.at = &t
		}
	} else if known {
		if rc.After != nil {
			notFor("after")
		}
		if rc.At != nil {
			notFor("at")
		}
		if rc.ActionKind != "" {
			notFor("action_kind")
		}
	}
	return r
}

// outputOf turns a set_result output into the events type, strictly: the
// content blocks must be valid protocol blocks.
func outputOf(oc *OutputConfig) (*events.Output, error) {
	out := &events.Output{IsError: oc.IsError}
	for i, m := range oc.Content {
		name := fmt.Sprintf("content[%d]", i)
		js, err := json.Marshal(m)
		if err != nil {
			return nil, fmt.Errorf("%s cannot be written as JSON: %v", name, err)
		}
		var b events.ContentBlock
		if err := b.UnmarshalJSON(js); err != nil {
			msg := err.Error()
			var r *events.Refusal
			if errors.As(err, &r) {
				msg = r.Reason
			}
			if rest, ok := strings.CutPrefix(msg, "block"); ok {
				return nil, fmt.Errorf("%s%s", name, rest)
			}
			return nil, fmt.Errorf("%s: %s", name, msg)
		}
		out.Content = append(out.Content, b)
	}
	// The operator writes these: a type or key the engine does not
	// interpret is a mistake.
	if err := events.StrictBlocks(out.Content); err != nil {
		return nil, err
	}
	return out, nil
}

// external checks the external gate and applies its defaults.
func (k *checker) external(ec ExternalConfig) *External {
	e := &External{Timeout: time.Duration(ec.Timeout), OnTimeout: ec.OnTimeout}
	switch {
	case e.Timeout == 0:
		e.Timeout = DefaultExternalTimeout
	case e.Timeout < 0:
		k.addf("gate.external", "gate.external.timeout", "timeout %s is not positive", e.Timeout)
	}
	switch e.OnTimeout {
	case "":
		e.OnTimeout = DefaultExternalOnTimeout
	case events.GateAllow, events.GateBlock:
	default:
		k.addf("gate.external", "gate.external.on_timeout", "on_timeout %q is not allow or block", ec.OnTimeout)
	}
	return e
}
