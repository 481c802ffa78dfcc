package catalog

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolbatch/toolbatch/events"
)

// exampleYAML is the example of docs/catalog.md and of the issue: every
// field spelled out.
const exampleYAML = `
tools:
  - id: echo
    target: brain            # brain | sandbox (default brain)
    builtin: echo            # brain only
    kind: tool               # tool | client | delegation (default tool)
    pool: default            # sandbox pool (sandbox tools; default "default")
    recovery: {mode: replay_safe, max_attempts: 3}
    dispatch_deadline: 30s   # sandbox: default 30s
    parallel_completion: false
  - id: send_mail
  - id: rm_file
    target: sandbox
    pool: gpu
  - id: ask_user
    kind: client
  - id: research
    kind: delegation
    parallel_completion: true
gate:
  rules:
    - tools: ["send_*"]
      when: 'args.to.endsWith("@example.com")'
      outcome: require_confirmation
      deadline: 10m
    - tools: ["rm_*"]
      outcome: block
      reason: destructive tools are disabled
    - tools: ["weather"]
      outcome: set_result
      output: {content: [{type: text, text: sunny}], is_error: false}
    - tools: ["report"]
      outcome: schedule
      after: 1h
      action_kind: report
  external: {timeout: 2s, on_timeout: block}
`

var t0 = time.Date(2030, 1, 2, 15, 4, 5, 0, time.UTC)

func mustParse(t *testing.T, y string) *Catalog {
	t.Helper()
	c, err := Parse([]byte(y))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return c
}

func TestParseExample(t *testing.T) {
	c := mustParse(t, exampleYAML)

	want := map[string]events.Descriptor{
		"echo":      {Target: events.TargetBrain, Kind: events.KindTool, Policy: events.Policy{Mode: events.ModeReplaySafe, MaxAttempts: 3}},
		"send_mail": {Target: events.TargetBrain, Kind: events.KindTool, Policy: events.Policy{Mode: events.ModeNeverReplay, MaxAttempts: 3}},
		"rm_file":   {Target: events.TargetSandbox, Kind: events.KindTool, Pool: "gpu", Policy: events.Policy{Mode: events.ModeNeverReplay, MaxAttempts: 3}},
		"ask_user":  {Target: events.TargetBrain, Kind: events.KindClient, Policy: events.Policy{Mode: events.ModeNeverReplay, MaxAttempts: 3}},
		"research":  {Target: events.TargetBrain, Kind: events.KindDelegation, Policy: events.Policy{Mode: events.ModeDurableRequest, MaxAttempts: 3}, ParallelCompletion: true},
	}
	for id, w := range want {
		d, ok := c.Descriptor(id)
		if !ok {
			t.Fatalf("Descriptor(%q) missing", id)
		}
		if d != w {
			t.Fatalf("Descriptor(%q) = %+v, want %+v", id, d, w)
		}
	}
	if _, ok := c.Descriptor("nope"); ok {
		t.Fatalf("Descriptor(nope) found")
	}
	echo, _ := c.Tool("echo")
	if echo.Builtin != "echo" || echo.DispatchDeadline != 0 {
		t.Fatalf("echo = %+v", echo)
	}
	rm, _ := c.Tool("rm_file")
	if rm.DispatchDeadline != DefaultDispatchDeadline {
		t.Fatalf("rm_file dispatch deadline = %v, want the default", rm.DispatchDeadline)
	}
	if got := len(c.Tools()); got != 5 {
		t.Fatalf("Tools() has %d tools, want 5", got)
	}
	ext, ok := c.External()
	if !ok || ext.Timeout != 2*time.Second || ext.OnTimeout != events.GateBlock {
		t.Fatalf("External() = %+v, %v", ext, ok)
	}
	if !regexp.MustCompile(`^cat-[0-9a-f]{16}$`).MatchString(c.SnapshotID()) {
		t.Fatalf("SnapshotID() = %q", c.SnapshotID())
	}
	if string(c.Raw()) != exampleYAML {
		t.Fatalf("Raw() is not the parsed bytes")
	}
}

func TestDefaults(t *testing.T) {
	c := mustParse(t, `
tools:
  - id: a
  - id: b
    target: sandbox
    recovery: {max_attempts: 0}
  - id: c
    kind: delegation
gate:
  rules:
    - tools: ["a"]
      outcome: block
  external: {}
`)
	a, _ := c.Tool("a")
	if a.Target != events.TargetBrain || a.Kind != events.KindTool || a.Pool != "" ||
		a.Policy != (events.Policy{Mode: events.ModeNeverReplay, MaxAttempts: 3}) {
		t.Fatalf("a = %+v", a)
	}
	b, _ := c.Tool("b")
	if b.Pool != DefaultPool || b.DispatchDeadline != 30*time.Second || b.Policy.MaxAttempts != 3 {
		t.Fatalf("b = %+v", b)
	}
	cd, _ := c.Descriptor("c")
	if cd.Policy.Mode != events.ModeDurableRequest {
		t.Fatalf("a delegation's mode = %s, want durable_request", cd.Policy.Mode)
	}
	d := c.Evaluate("a", nil, nil, t0)
	if d.Outcome != events.GateBlock || d.Reason != DefaultBlockReason {
		t.Fatalf("block without reason = %+v", d)
	}
	ext, ok := c.External()
	if !ok || ext.Timeout != DefaultExternalTimeout || ext.OnTimeout != events.GateBlock {
		t.Fatalf("External() = %+v, %v", ext, ok)
	}
	if _, ok := mustParse(t, "tools: []\n").External(); ok {
		t.Fatalf("External() enabled without gate.external")
	}
}

// TestParseErrors: each bad catalog is refused with a problem that names
// where it is.
func TestParseErrors(t *testing.T) {
	cases := []struct {
		name string
		yaml string
		want string // a substring of the error
	}{
		{"unknown top-level key", "tools: []\nextra: 1\n", `line 2: unknown key "extra"`},
		{"unknown tool key", "tools:\n  - id: a\n    cloud: x\n", `line 3: tools[0] (id "a"): unknown key "cloud"`},
		{"unknown recovery key", "tools:\n  - id: a\n    recovery: {mode: replay_safe, retries: 2}\n", `tools[0] (id "a"): recovery: unknown key "retries"`},
		{"unknown rule key", "gate:\n  rules:\n    - tools: [a]\n      outcome: allow\n      unless: x\n", `gate.rules[0]: unknown key "unless"`},
		{"unknown output key", "gate:\n  rules:\n    - tools: [a]\n      outcome: set_result\n      output: {content: [], state: []}\n", `gate.rules[0]: output: unknown key "state"`},
		{"wrong type", "tools: 5\n", `tools: want a list, got int 5`},
		{"wrong type in tool", "tools:\n  - id: a\n    parallel_completion: maybe\n", `tools[0] (id "a"): parallel_completion: want true or false, got the string "maybe"`},
		{"wrong type max_attempts", "tools:\n  - id: a\n    recovery: {mode: replay_safe, max_attempts: lots}\n", `tools[0] (id "a"): recovery.max_attempts: want an integer`},
		{"repeated key", "tools:\n  - id: a\n    id: b\n", `key "id" is written twice (first at line 2)`},
		{"syntax error", "tools:\n  - id: a\n   kind: [\n", `line `},
		{"empty", "", "the catalog is empty"},
		{"comments only", "# nothing\n", "the catalog is empty"},
		{"two documents", "tools: []\n---\ntools: []\n", "more than one YAML document"},
		{"missing id", "tools:\n  - target: brain\n", `tools[0]: id is required`},
		{"bad id", "tools:\n  - id: a.b\n", `tools[0] (id "a.b"): id "a.b" does not match`},
		{"long id", "tools:\n  - id: " + strings.Repeat("x", 65) + "\n", `does not match ^[A-Za-z0-9_-]{1,64}$`},
		{"duplicate id", "tools:\n  - id: a\n  - id: b\n  - id: a\n", `line 4: tools[2] (id "a"): id "a" is already used by tools[0]`},
		{"bad target", "tools:\n  - id: rm\n    target: cloud\n", `tools[0] (id "rm"): target "cloud" is not brain or sandbox`},
		{"bad kind", "tools:\n  - id: a\n    kind: unknown\n", `kind "unknown" is not tool, client or delegation`},
		{"builtin on sandbox", "tools:\n  - id: a\n    target: sandbox\n    builtin: echo\n", `line 4: tools[0] (id "a"): builtin is only for target brain (target is sandbox)`},
		{"builtin on client", "tools:\n  - id: a\n    kind: client\n    builtin: echo\n", `builtin is only for kind tool (kind is client)`},
		{"pool on brain", "tools:\n  - id: a\n    pool: gpu\n", `tools[0] (id "a"): pool is only for target sandbox (target is brain)`},
		{"bad pool", "tools:\n  - id: a\n    target: sandbox\n    pool: g.p.u\n", `pool "g.p.u" does not match`},
		{"sandbox client", "tools:\n  - id: a\n    target: sandbox\n    kind: client\n", `target sandbox is only for kind tool (kind is client)`},
		{"dispatch deadline on brain", "tools:\n  - id: a\n    dispatch_deadline: 5s\n", `dispatch_deadline is only for target sandbox`},
		{"negative dispatch deadline", "tools:\n  - id: a\n    target: sandbox\n    dispatch_deadline: -5s\n", `dispatch_deadline -5s is not positive`},
		{"bad duration", "tools:\n  - id: a\n    target: sandbox\n    dispatch_deadline: 30\n", `line 4: tools[0] (id "a"): dispatch_deadline: "30" is not a duration`},
		{"bad mode", "tools:\n  - id: a\n    recovery: {mode: sometimes}\n", `tools[0] (id "a"): recovery.mode "sometimes" is not never_replay, replay_safe, idempotent or durable_request`},
		{"delegation mode", "tools:\n  - id: a\n    kind: delegation\n    recovery: {mode: replay_safe}\n", `recovery.mode of a delegation is always durable_request`},
		{"client mode", "tools:\n  - id: a\n    kind: client\n    recovery: {mode: idempotent}\n", `recovery.mode of a client tool can only be never_replay`},
		{"negative max_attempts", "tools:\n  - id: a\n    recovery: {max_attempts: -1}\n", `tools[0] (id "a"): recovery.max_attempts -1 is negative`},
		{"parallel_completion on tool", "tools:\n  - id: a\n    parallel_completion: true\n", `tools[0] (id "a"): parallel_completion is only for kind delegation (kind is tool)`},
		{"rule without tools", "gate:\n  rules:\n    - outcome: allow\n", `gate.rules[0]: tools needs at least one glob`},
		{"bad glob", "gate:\n  rules:\n    - tools: [ok, \"[a-\"]\n      outcome: block\n", `gate.rules[0]: tools[1]: "[a-" is not a valid glob`},
		{"empty glob", "gate:\n  rules:\n    - tools: [\"\"]\n      outcome: block\n", `gate.rules[0]: tools[0] is an empty glob`},
		{"bad CEL", "gate:\n  rules:\n    - tools: [a]\n      outcome: allow\n    - tools: [a]\n      when: 'args.to.endsWith('\n      outcome: block\n", `line 6: gate.rules[1]: when: CEL does not compile: 1:`},
		{"CEL unknown variable", "gate:\n  rules:\n    - tools: [a]\n      when: 'user == \"x\"'\n      outcome: block\n", `gate.rules[0]: when: CEL does not compile: 1:1: undeclared reference to 'user'`},
		{"CEL not bool", "gate:\n  rules:\n    - tools: [a]\n      when: 'size(tool_id)'\n      outcome: block\n", `gate.rules[0]: when: CEL expression has type int, want bool`},
		{"CEL map", "gate:\n  rules:\n    - tools: [a]\n      when: 'args'\n      outcome: block\n", `CEL expression has type map(string, dyn), want bool`},
		{"missing outcome", "gate:\n  rules:\n    - tools: [a]\n", `gate.rules[0]: outcome is required`},
		{"bad outcome", "gate:\n  rules:\n    - tools: [a]\n      outcome: deny\n", `gate.rules[0]: outcome "deny" is not allow, block, set_result, require_confirmation or schedule`},
		{"set_result without output", "gate:\n  rules:\n    - tools: [weather]\n      outcome: set_result\n", `gate.rules[0]: output is required for outcome set_result`},
		{"set_result bad block", "gate:\n  rules:\n    - tools: [w]\n      outcome: set_result\n      output: {content: [{type: txt, text: a}]}\n", `gate.rules[0]: output: content[0].type: unknown content block type "txt"`},
		{"set_result block key", "gate:\n  rules:\n    - tools: [w]\n      outcome: set_result\n      output: {content: [{type: text, text: a, extra: 1}]}\n", `gate.rules[0]: output: content[0]`},
		{"output on block", "gate:\n  rules:\n    - tools: [w]\n      outcome: block\n      output: {content: []}\n", `gate.rules[0]: output does not apply to outcome block`},
		{"reason on allow", "gate:\n  rules:\n    - tools: [w]\n      outcome: allow\n      reason: why\n", `gate.rules[0]: reason does not apply to outcome allow`},
		{"deadline on block", "gate:\n  rules:\n    - tools: [w]\n      outcome: block\n      deadline: 1m\n", `deadline does not apply to outcome block`},
		{"zero deadline", "gate:\n  rules:\n    - tools: [w]\n      outcome: require_confirmation\n      deadline: 0s\n", `deadline 0s is not positive`},
		{"schedule after and at", "gate:\n  rules:\n    - tools: [report]\n      outcome: schedule\n      after: 1h\n      at: 2030-01-01T00:00:00Z\n", `gate.rules[0]: schedule takes exactly one of after and at, not both`},
		{"schedule neither", "gate:\n  rules:\n    - tools: [report]\n      outcome: schedule\n", `gate.rules[0]: schedule needs one of after`},
		{"schedule negative after", "gate:\n  rules:\n    - tools: [report]\n      outcome: schedule\n      after: -1h\n", `after -1h0m0s is negative`},
		{"bad at", "gate:\n  rules:\n    - tools: [report]\n      outcome: schedule\n      at: tomorrow\n", `gate.rules[0]: at: "tomorrow" is not an RFC 3339 time`},
		{"after on allow", "gate:\n  rules:\n    - tools: [report]\n      outcome: allow\n      after: 1h\n", `after does not apply to outcome allow`},
		{"action_kind on block", "gate:\n  rules:\n    - tools: [report]\n      outcome: block\n      action_kind: x\n", `action_kind does not apply to outcome block`},
		{"bad on_timeout", "gate:\n  external: {timeout: 2s, on_timeout: ask}\n", `gate.external: on_timeout "ask" is not allow or block`},
		{"bad external timeout", "gate:\n  external: {timeout: 2x, on_timeout: block}\n", `gate.external: timeout: "2x" is not a duration`},
		{"negative external timeout", "gate:\n  external: {timeout: -2s}\n", `gate.external: timeout -2s is not positive`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.yaml))
			if err == nil {
				t.Fatalf("Parse accepted:\n%s", tc.yaml)
			}
			if c != nil {
				t.Fatalf("Parse returned a catalog with its error")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error:\n%v\nwant it to contain:\n%s", err, tc.want)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v is not ErrInvalid", err)
			}
			var p *ProblemError
			if !errors.As(err, &p) {
				t.Fatalf("error %v holds no *ProblemError", err)
			}
		})
	}
}

// TestSeveralProblems: every problem is reported at once, in line order.
func TestSeveralProblems(t *testing.T) {
	y := `tools:
  - id: rm
    target: cloud
  - id: ok
    color: blue
  - id: rm
gate:
  rules:
    - tools: ["send_*"]
      when: 'args.to.'
      outcome: require_confirmation
    - tools: [weather]
      outcome: set_result
  external: {on_timeout: maybe}
`
	_, err := Parse([]byte(y))
	if err == nil {
		t.Fatalf("Parse accepted a catalog with five problems")
	}
	want := []string{
		`line 3: tools[0] (id "rm"): target "cloud" is not brain or sandbox`,
		`line 5: tools[1] (id "ok"): unknown key "color"`,
		`line 6: tools[2] (id "rm"): id "rm" is already used by tools[0]`,
		`line 10: gate.rules[0]: when: CEL does not compile`,
		`line 12: gate.rules[1]: output is required for outcome set_result`,
		`line 14: gate.external: on_timeout "maybe" is not allow or block`,
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != len(want) {
		t.Fatalf("got %d problems, want %d:\n%v", len(lines), len(want), err)
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Fatalf("problem %d = %q, want it to start with %q\nall:\n%v", i, lines[i], w, err)
		}
	}
	u, ok := err.(interface{ Unwrap() []error })
	if !ok || len(u.Unwrap()) != len(want) {
		t.Fatalf("error does not unwrap into %d problems", len(want))
	}
}

// TestDecodeErrorsNotRepeated: a value that does not decode is reported
// once, by the decoder, not again as missing by validation; the whole value
// is quoted, and a problem inside a flow mapping names its key.
func TestDecodeErrorsNotRepeated(t *testing.T) {
	y := `tools:
  - id: echo
    target: [brain]
    recovery: {mode: replay_safe, max_attempts: "many many times"}
  - "just a string"
gate:
  rules:
    - tools: send_*
      outcome: [block]
`
	_, err := Parse([]byte(y))
	if err == nil {
		t.Fatalf("Parse accepted a bad catalog")
	}
	want := "line 3: tools[0] (id \"echo\"): target: want a string, got a list\n" +
		"line 4: tools[0] (id \"echo\"): recovery.max_attempts: want an integer, got the string \"many many times\"\n" +
		"line 5: tools[1]: want a mapping, got the string \"just a string\"\n" +
		"line 8: gate.rules[0]: tools: want a list of strings, got the string \"send_*\"\n" +
		"line 9: gate.rules[0]: outcome: want a string, got a list"
	if err.Error() != want {
		t.Fatalf("Parse error =\n%v\nwant\n%s", err, want)
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(good, []byte(exampleYAML), 0o600); err != nil {
		t.Fatalf("write: %v", err)
	}
	c, err := Load(good)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if c.SnapshotID() != mustParse(t, exampleYAML).SnapshotID() {
		t.Fatalf("Load and Parse give different snapshot ids")
	}

	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("tools:\n  - id: a\n    target: cloud\n  - id: a\n"), 0o600); err != nil {
		t.Fatalf("write: %v", err)
	}
	_, err = Load(bad)
	if err == nil {
		t.Fatalf("Load accepted a bad catalog")
	}
	for _, line := range strings.Split(err.Error(), "\n") {
		if !strings.HasPrefix(line, bad+":") {
			t.Fatalf("problem %q does not start with the path", line)
		}
	}
	if !strings.Contains(err.Error(), bad+`:3: tools[0] (id "a"): target "cloud"`) {
		t.Fatalf("error does not name file, line and tool:\n%v", err)
	}

	missing := filepath.Join(dir, "missing.yaml")
	_, err = Load(missing)
	if err == nil || !strings.HasPrefix(err.Error(), missing+": ") || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Load(missing) = %v", err)
	}
}

func TestDefault(t *testing.T) {
	c := Default()
	for _, id := range []string{"echo", "sleep", "fail"} {
		tool, ok := c.Tool(id)
		if !ok {
			t.Fatalf("Default() lacks %s", id)
		}
		want := Tool{ID: id, Target: events.TargetBrain, Kind: events.KindTool, Builtin: id,
			Policy: events.Policy{Mode: events.ModeReplaySafe, MaxAttempts: 3}}
		if !reflect.DeepEqual(tool, want) {
			t.Fatalf("Default() %s = %+v, want %+v", id, tool, want)
		}
	}
	if len(c.Tools()) != 3 {
		t.Fatalf("Default() has %d tools, want 3", len(c.Tools()))
	}
	if _, ok := c.External(); ok {
		t.Fatalf("Default() enables the external gate")
	}
	if d := c.Evaluate("echo", events.MustJSON(`{"a":1}`), nil, t0); d.Matched || d.Outcome != events.GateAllow {
		t.Fatalf("Default() has rules: %+v", d)
	}
	// The snapshot id is part of every batch submitted without --catalog:
	// changing DefaultYAML must be a conscious decision.
	const wantID = "cat-6dbe59769b87296b"
	if got := c.SnapshotID(); got != wantID {
		t.Fatalf("Default().SnapshotID() = %q, want %q", got, wantID)
	}
	if Default() != c || mustParse(t, DefaultYAML).SnapshotID() != wantID {
		t.Fatalf("Default() is not stable")
	}
}

func TestSnapshot(t *testing.T) {
	a := mustParse(t, "tools: [{id: a}]\n")
	b := mustParse(t, "tools: [{id: a}]\n")
	c := mustParse(t, "tools: [{id: a}] # edited\n")
	if a.SnapshotID() != b.SnapshotID() {
		t.Fatalf("equal bytes give different snapshot ids")
	}
	if a.SnapshotID() == c.SnapshotID() {
		t.Fatalf("different bytes give the same snapshot id")
	}
	again := mustParse(t, string(a.Raw()))
	if again.SnapshotID() != a.SnapshotID() {
		t.Fatalf("parsing Raw() gives another snapshot id")
	}
	raw := a.Raw()
	raw[0] = 'X'
	if a.Raw()[0] == 'X' {
		t.Fatalf("Raw() returns the catalog's own bytes")
	}
}

const gateYAML = `
gate:
  rules:
    - tools: ["send_*", "mail"]
      when: 'args.to.endsWith("@example.com")'
      outcome: require_confirmation
      deadline: 10m
    - tools: ["send_*"]
      outcome: block
      reason: outside mail is disabled
    - tools: ["rm_?"]
      outcome: block
    - tools: ["weather"]
      outcome: set_result
      output: {content: [{type: text, text: sunny}], is_error: false}
    - tools: ["report"]
      outcome: schedule
      after: 1h
      action_kind: report
    - tools: ["nightly"]
      outcome: schedule
      at: 2030-06-01T02:00:00Z
    - tools: ["quota"]
      when: 'state["shared.budget"].left < args.cost'
      outcome: block
      reason: over budget
    - tools: ["typed"]
      when: 'args.flag'
      outcome: block
      reason: flagged
    - tools: ["opt"]
      when: 'has(args.to) && args.to == "root"'
      outcome: block
    - tools: ["*"]
      when: 'tool_id.startsWith("admin_")'
      outcome: require_confirmation
`

func TestEvaluate(t *testing.T) {
	c := mustParse(t, gateYAML)
	deadline := t0.Add(10 * time.Minute)

	cases := []struct {
		name  string
		tool  string
		args  string
		state map[string]any
		want  Decision
	}{
		{"when true", "send_mail", `{"to":"bob@example.com"}`, nil,
			Decision{Matched: true, Rule: "gate.rules[0]", Outcome: events.GateRequireConfirmation, Deadline: &deadline}},
		{"second glob of a rule", "mail", `{"to":"bob@example.com"}`, nil,
			Decision{Matched: true, Rule: "gate.rules[0]", Outcome: events.GateRequireConfirmation, Deadline: &deadline}},
		{"when false: the next rule", "send_mail", `{"to":"eve@elsewhere.org"}`, nil,
			Decision{Matched: true, Rule: "gate.rules[1]", Outcome: events.GateBlock, Reason: "outside mail is disabled"}},
		{"missing key fails closed", "send_mail", `{}`, nil,
			Decision{Matched: true, Rule: "gate.rules[0]", Outcome: events.GateBlock, Reason: "policy error: no such key: to"}},
		{"null arguments are {}", "send_sms", `null`, nil,
			Decision{Matched: true, Rule: "gate.rules[0]", Outcome: events.GateBlock, Reason: "policy error: no such key: to"}},
		{"wrong argument type fails closed", "send_mail", `{"to":5}`, nil,
			Decision{Matched: true, Rule: "gate.rules[0]", Outcome: events.GateBlock, Reason: "policy error: no such overload"}},
		{"non-object arguments fail closed", "send_mail", `[1]`, nil,
			Decision{Matched: true, Rule: "gate.rules[0]", Outcome: events.GateBlock, Reason: "policy error: arguments are not a JSON object"}},
		{"glob ?", "rm_x", `{}`, nil,
			Decision{Matched: true, Rule: "gate.rules[2]", Outcome: events.GateBlock, Reason: DefaultBlockReason}},
		{"glob ? matches one character", "rm_xy", `{}`, nil,
			Decision{Outcome: events.GateAllow}},
		{"schedule after", "report", `{}`, nil,
			Decision{Matched: true, Rule: "gate.rules[4]", Outcome: events.GateSchedule, Due: ptr(t0.Add(time.Hour)), ActionKind: "report"}},
		{"schedule at", "nightly", `{}`, nil,
			Decision{Matched: true, Rule: "gate.rules[5]", Outcome: events.GateSchedule, Due: ptr(time.Date(2030, 6, 1, 2, 0, 0, 0, time.UTC))}},
		{"state visible: over", "quota", `{"cost":5}`, map[string]any{"shared.budget": map[string]any{"left": int64(3)}},
			Decision{Matched: true, Rule: "gate.rules[6]", Outcome: events.GateBlock, Reason: "over budget"}},
		{"state visible: under", "quota", `{"cost":5}`, map[string]any{"shared.budget": events.MustJSON(`{"left":10}`)},
			Decision{Outcome: events.GateAllow}},
		{"state missing fails closed", "quota", `{"cost":5}`, nil,
			Decision{Matched: true, Rule: "gate.rules[6]", Outcome: events.GateBlock, Reason: "policy error: no such key: shared.budget"}},
		{"dyn result not bool fails closed", "typed", `{"flag":"yes"}`, nil,
			Decision{Matched: true, Rule: "gate.rules[7]", Outcome: events.GateBlock, Reason: "policy error: when evaluated to string, not bool"}},
		{"dyn result bool", "typed", `{"flag":true}`, nil,
			Decision{Matched: true, Rule: "gate.rules[7]", Outcome: events.GateBlock, Reason: "flagged"}},
		{"has() guards a missing key", "opt", `{}`, nil,
			Decision{Outcome: events.GateAllow}},
		{"has() with the key", "opt", `{"to":"root"}`, nil,
			Decision{Matched: true, Rule: "gate.rules[8]", Outcome: events.GateBlock, Reason: DefaultBlockReason}},
		{"tool_id in CEL", "admin_reset", `{}`, nil,
			Decision{Matched: true, Rule: "gate.rules[9]", Outcome: events.GateRequireConfirmation}},
		{"no match allows", "echo", `{"to":"x"}`, nil,
			Decision{Outcome: events.GateAllow}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := c.Evaluate(tc.tool, events.MustJSON(tc.args), tc.state, t0)
			if !sameDecision(got, tc.want) {
				t.Fatalf("Evaluate(%s, %s) =\n%s\nwant\n%s", tc.tool, tc.args, show(got), show(tc.want))
			}
		})
	}
}

func TestEvaluateSetResult(t *testing.T) {
	c := mustParse(t, gateYAML)
	d := c.Evaluate("weather", nil, nil, t0)
	if !d.Matched || d.Rule != "gate.rules[3]" || d.Outcome != events.GateSetResult || d.Output == nil {
		t.Fatalf("Evaluate(weather) = %s", show(d))
	}
	if d.Output.IsError || d.Output.Text() != "sunny" || d.Output.CallID != "" || len(d.Output.State) != 0 {
		t.Fatalf("output = %+v", *d.Output)
	}
	// The output is the caller's to change: the catalog keeps its own.
	d.Output.Content[0].Text = "rain"
	if again := c.Evaluate("weather", nil, nil, t0); again.Output.Text() != "sunny" {
		t.Fatalf("changing a decision's output changed the catalog")
	}
}

// TestEvaluateFirstMatchWins: an earlier rule decides even when a later one
// is more specific.
func TestEvaluateFirstMatchWins(t *testing.T) {
	c := mustParse(t, `
gate:
  rules:
    - tools: ["*"]
      outcome: allow
    - tools: ["rm_all"]
      outcome: block
`)
	d := c.Evaluate("rm_all", nil, nil, t0)
	if !d.Matched || d.Rule != "gate.rules[0]" || d.Outcome != events.GateAllow {
		t.Fatalf("Evaluate = %s", show(d))
	}
}

// TestEvaluateConcurrent: a catalog is shared by every run of the engine.
func TestEvaluateConcurrent(t *testing.T) {
	c := mustParse(t, gateYAML)
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 200; j++ {
				d := c.Evaluate("send_mail", events.MustJSON(`{"to":"a@example.com"}`), nil, t0)
				if d.Outcome != events.GateRequireConfirmation {
					t.Errorf("Evaluate = %s", show(d))
					return
				}
				c.Evaluate("weather", nil, nil, t0).Output.Content[0].Text = "x"
			}
		}()
	}
	wg.Wait()
}

// TestConfigValidate: a Config built in Go validates like a parsed one,
// without lines.
func TestConfigValidate(t *testing.T) {
	cfg := &Config{
		Tools: []ToolConfig{{ID: "a"}, {ID: "b", Target: "cloud"}},
		Gate:  GateConfig{Rules: []RuleConfig{{Tools: []string{"a"}, Outcome: events.GateSchedule}}},
	}
	err := cfg.Validate()
	if err == nil {
		t.Fatalf("Validate accepted a bad config")
	}
	want := "tools[1] (id \"b\"): target \"cloud\" is not brain or sandbox\n" +
		"gate.rules[0]: schedule needs one of after (a duration) or at (an RFC 3339 time)"
	if err.Error() != want {
		t.Fatalf("Validate() =\n%v\nwant\n%s", err, want)
	}
	if err := (&Config{Tools: []ToolConfig{{ID: "a"}}}).Validate(); err != nil {
		t.Fatalf("Validate() = %v", err)
	}
}

func ptr[T any](v T) *T { return &v }

func sameTime(a, b *time.Time) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Equal(*b)
}

func sameDecision(a, b Decision) bool {
	return a.Matched == b.Matched && a.Rule == b.Rule && a.Outcome == b.Outcome && a.Reason == b.Reason &&
		(a.Output == nil) == (b.Output == nil) && sameTime(a.Deadline, b.Deadline) && sameTime(a.Due, b.Due) &&
		a.ActionKind == b.ActionKind
}

func show(d Decision) string {
	var b strings.Builder
	b.WriteString("{matched=" + map[bool]string{true: "true", false: "false"}[d.Matched])
	b.WriteString(" rule=" + d.Rule + " outcome=" + string(d.Outcome) + " reason=" + d.Reason)
	if d.Deadline != nil {
		b.WriteString(" deadline=" + d.Deadline.Format(time.RFC3339))
	}
	if d.Due != nil {
		b.WriteString(" due=" + d.Due.Format(time.RFC3339))
	}
	if d.ActionKind != "" {
		b.WriteString(" action_kind=" + d.ActionKind)
	}
	if d.Output != nil {
		b.WriteString(" output=" + d.Output.Text())
	}
	return b.String() + "}"
}

// FuzzParse: Parse never panics, and a catalog it accepts parses again from
// Raw to the same snapshot.
func FuzzParse(f *testing.F) {
	f.Add([]byte(exampleYAML))
	f.Add([]byte(gateYAML))
	f.Add([]byte(DefaultYAML))
	f.Add([]byte("tools:\n  - id: a\n    recovery: {mode: x, max_attempts: [1]}\ngate: {rules: [{tools: ['[']}]}\n"))
	f.Add([]byte("a: &x [*x]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v is not ErrInvalid", err)
			}
			return
		}
		again, err := Parse(c.Raw())
		if err != nil || again.SnapshotID() != c.SnapshotID() {
			t.Fatalf("Raw() does not parse to the same snapshot: %v", err)
		}
		c.Evaluate("a", events.MustJSON(`{"to":"x"}`), nil, t0)
	})
}

// TestDocs: every catalog and every when expression in docs/catalog.md is
// valid, and the built-in catalog shown there is DefaultYAML.
func TestDocs(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "docs", "catalog.md"))
	if err != nil {
		t.Fatalf("read docs: %v", err)
	}
	blocks := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(string(doc), -1)
	if len(blocks) < 4 {
		t.Fatalf("found %d yaml blocks in docs/catalog.md", len(blocks))
	}
	sawDefault := false
	for _, b := range blocks {
		y := b[1]
		switch {
		case strings.HasPrefix(y, "when:"):
			for _, line := range strings.Split(strings.TrimSpace(y), "\n") {
				rule := "gate:\n  rules:\n    - tools: [\"*\"]\n      " + line + "\n      outcome: block\n"
				if _, err := Parse([]byte(rule)); err != nil {
					t.Fatalf("docs: %s: %v", line, err)
				}
			}
		default:
			if _, err := Parse([]byte(y)); err != nil {
				t.Fatalf("docs: block does not parse:\n%s\n%v", y, err)
			}
			if y == DefaultYAML[strings.Index(DefaultYAML, "\n")+1:] {
				sawDefault = true
			}
		}
	}
	if !sawDefault {
		t.Fatalf("docs/catalog.md does not show DefaultYAML")
	}
}
