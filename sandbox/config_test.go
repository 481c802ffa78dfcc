package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/toolbatch/toolbatch/events"
)

// issueYAML is the example of the issue and of docs/workers.md.
const issueYAML = `
pools: [default]
isolation: bubblewrap          # or none (then the worker says loudly at start what is not isolated)
tools:
  - id: noop
    builtin: noop                # trusted in-process Go tools of the worker (noop, echo, sleep): no subprocess
  - id: word_count
    command: ["python3", "tools/word_count.py"]
    capability: replay_safe      # non_recoverable | replay_safe | idempotent | durable_request
    timeout: 30s
    output: text                 # text: stdout is one text block; json: stdout is a ToolOutput
    limits: {memory_mb: 256, cpu_seconds: 10, output_kb: 256, max_procs: 64, network: false}
    mounts: [{path: /srv/shared-out, writable: true}]   # optional extra paths the tool may see
`

func TestParseConfigExample(t *testing.T) {
	cfg, err := ParseConfig([]byte(issueYAML))
	if err != nil {
		t.Fatalf("ParseConfig: %v", err)
	}
	want := Config{
		Pools:     []string{"default"},
		Isolation: IsolationBubblewrap,
		Prestart:  intp(DefaultPrestart),
		Tools: []ToolConfig{
			{ID: "noop", Builtin: BuiltinNoop, Capability: events.CapNonRecoverable, Timeout: 30 * time.Second},
			{
				ID:         "word_count",
				Prestart:   intp(DefaultPrestart),
				Command:    []string{"python3", "tools/word_count.py"},
				Capability: events.CapReplaySafe,
				Timeout:    30 * time.Second,
				Output:     OutputText,
				Limits:     Limits{MemoryMB: 256, CPUSeconds: 10, OutputKB: 256, MaxProcs: 64},
				Mounts:     []Mount{{Path: "/srv/shared-out", Writable: true}},
			},
		},
	}
	if !reflect.DeepEqual(cfg, want) {
		t.Fatalf("ParseConfig:\n got %+v\nwant %+v", cfg, want)
	}
}

func TestParseConfigDefaults(t *testing.T) {
	cfg, err := ParseConfig([]byte(`
tools:
  - id: t
    command: [/bin/true]
  - id: s
    builtin: sleep
`))
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		Pools:     []string{DefaultPool},
		Isolation: DefaultIsolation,
		Prestart:  intp(DefaultPrestart),
		Tools: []ToolConfig{
			{ID: "t", Command: []string{"/bin/true"}, Capability: DefaultCapability, Timeout: DefaultTimeout, Output: DefaultOutput, Prestart: intp(DefaultPrestart),
				Limits: Limits{MemoryMB: DefaultMemoryMB, CPUSeconds: DefaultCPUSeconds, OutputKB: DefaultOutputKB, MaxProcs: DefaultMaxProcs}},
			{ID: "s", Builtin: BuiltinSleep, Capability: DefaultCapability, Timeout: DefaultTimeout},
		},
	}
	if !reflect.DeepEqual(cfg, want) {
		t.Fatalf("defaults:\n got %+v\nwant %+v", cfg, want)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("a defaulted config does not validate: %v", err)
	}
}

func intp(n int) *int { return &n }

func TestParseConfigPrestart(t *testing.T) {
	prestarts := func(yaml string) []int {
		t.Helper()
		cfg, err := ParseConfig([]byte(yaml))
		if err != nil {
			t.Fatalf("ParseConfig:\n%v", err)
		}
		got := []int{*cfg.Prestart}
		for _, tool := range cfg.Tools {
			if tool.IsBuiltin() {
				if tool.Prestart != nil {
					t.Fatalf("builtin %s got a prestart", tool.ID)
				}
				continue
			}
			got = append(got, *tool.Prestart)
		}
		return got
	}
	for _, c := range []struct {
		yaml string
		want []int // the config's, then each subprocess tool's
	}{
		{"tools: [{id: a, command: [/bin/true]}, {id: n, builtin: noop}]", []int{DefaultPrestart, DefaultPrestart}},
		{"isolation: none\ntools: [{id: a, command: [/bin/true]}]", []int{0, 0}},
		{"prestart: 0\ntools: [{id: a, command: [/bin/true]}, {id: b, command: [/bin/true], prestart: 3}]", []int{0, 0, 3}},
		{"prestart: 5\ntools: [{id: a, command: [/bin/true]}, {id: b, command: [/bin/true], prestart: 0}]", []int{5, 5, 0}},
		{"isolation: none\nprestart: 0\ntools: [{id: a, command: [/bin/true], prestart: 0}]", []int{0, 0}},
	} {
		if got := prestarts(c.yaml); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%q: prestart %v, want %v", c.yaml, got, c.want)
		}
	}

	_, err := ParseConfig([]byte(`isolation: none
prestart: 2
tools:
  - id: a
    command: [/bin/true]
    prestart: -1
  - id: b
    command: [/bin/true]
    prestart: 65
  - id: n
    builtin: noop
    prestart: 1
  - id: c
    command: [/bin/true]
    prestart: 1
`))
	want := []string{
		`line 2: prestart 2: pre-started sandboxes need isolation bubblewrap (set prestart: 0, or leave it out)`,
		`line 6: tools[0] (id "a"): prestart -1 must be 0 (off) or more`,
		`line 9: tools[1] (id "b"): prestart 65 is more than 64`,
		`line 12: tools[2] (id "n"): prestart does not apply to a builtin tool`,
		`line 15: tools[3] (id "c"): prestart 1: pre-started sandboxes need isolation bubblewrap (set prestart: 0, or leave it out)`,
	}
	if got := problems(err); !reflect.DeepEqual(got, want) {
		t.Fatalf("problems:\n got %s\nwant %s", strings.Join(got, "\n     "), strings.Join(want, "\n     "))
	}
}

// problems returns the lines of a config error.
func problems(err error) []string {
	if err == nil {
		return nil
	}
	return strings.Split(err.Error(), "\n")
}

func TestParseConfigReportsEveryProblem(t *testing.T) {
	_, err := ParseConfig([]byte(`pools: [default, "bad pool", default]
isolation: firejail
tools:
  - id: wc
    command: [python3, wc.py]
    colour: blue
    timeout: 30
    limits: {memory_mb: -1, cpu_seconds: 100000, output_kb: 0, max_procs: 70000, netwrk: true}
  - id: wc
    builtin: echo
    output: json
    env: {A: b}
  - id: "has space"
    builtin: rm
  - id: x
    capability: forever
    output: yaml
    timeout: -5s
    mounts: [{path: rel/dir}, {path: /srv/}, {path: /}, {path: /srv/a}, {path: /srv/a, writable: true}]
    env: {PATH: /x, TOOLBATCH_CALL_ID: y, "1BAD": z, GOOD: "a\0b"}
  - id: y
    command: ["", "a"]
`))
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("want ErrInvalidConfig, got %v", err)
	}
	want := []string{
		`line 1: pools: pool "bad pool" does not match ^[A-Za-z0-9_-]{1,64}$`,
		`line 1: pools: pool "default" is already listed at pools[0]`,
		`line 2: isolation "firejail" is not bubblewrap or none`,
		`line 6: tools[0] (id "wc"): unknown key "colour"`,
		"line 7: tools[0] (id \"wc\"): want a duration such as 30s, 10m or 1h, got int 30",
		`line 8: tools[0] (id "wc"): unknown key "netwrk"`,
		`line 8: tools[0] (id "wc"): limits.memory_mb -1 must be positive (0 means the default)`,
		`line 8: tools[0] (id "wc"): limits.cpu_seconds 100000 is more than 86400 s`,
		`line 8: tools[0] (id "wc"): limits.max_procs 70000 is more than 65536 processes`,
		`line 9: tools[1] (id "wc"): id "wc" is already used by tools[0]`,
		`line 11: tools[1] (id "wc"): output does not apply to a builtin tool`,
		`line 12: tools[1] (id "wc"): env does not apply to a builtin tool`,
		`line 13: tools[2] (id "has space"): id "has space" does not match ^[A-Za-z0-9_-]{1,64}$`,
		`line 14: tools[2] (id "has space"): builtin "rm" is not noop, echo or sleep`,
		`line 15: tools[3] (id "x"): command is required (or builtin: noop, echo or sleep)`,
		`line 16: tools[3] (id "x"): capability "forever" is not non_recoverable, replay_safe, idempotent or durable_request`,
		`line 17: tools[3] (id "x"): output "yaml" is not text or json`,
		`line 18: tools[3] (id "x"): timeout -5s must be positive (0 means the default 30s)`,
		`line 19: tools[3] (id "x"): mounts[0].path "rel/dir" must be absolute`,
		`line 19: tools[3] (id "x"): mounts[1].path "/srv/" must be clean (write "/srv")`,
		`line 19: tools[3] (id "x"): mounts[2].path cannot be /`,
		`line 19: tools[3] (id "x"): mounts[4].path "/srv/a" is already mounted by mounts[3]`,
		`line 20: tools[3] (id "x"): env: "1BAD" is not a variable name ([A-Za-z_][A-Za-z0-9_]*)`,
		`line 20: tools[3] (id "x"): env: the value of GOOD holds a NUL byte`,
		`line 20: tools[3] (id "x"): env: PATH is set by the sandbox (PATH, HOME, LANG, TRACEPARENT and TOOLBATCH_* are reserved)`,
		`line 20: tools[3] (id "x"): env: TOOLBATCH_CALL_ID is set by the sandbox (PATH, HOME, LANG, TRACEPARENT and TOOLBATCH_* are reserved)`,
		`line 22: tools[4] (id "y"): command[0], the program, is empty`,
	}
	got := problems(err)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("problems:\n got %s\nwant %s", strings.Join(got, "\n     "), strings.Join(want, "\n     "))
	}
}

func TestParseConfigRefusesDocuments(t *testing.T) {
	for _, c := range []struct{ yaml, want string }{
		{"", "the config is empty"},
		{"# only a comment\n", "the config is empty"},
		{"~", "the config is empty"},
		{"tools: []\n", "tools: at least one tool is required"},
		{"tools: [{id: a, builtin: noop}]\n---\ntools: []\n", "line 2: the file holds more than one YAML document"},
		{"tools: [\n", "line 1: did not find expected node content"},
		{"[1, 2]", "line 1: want a mapping, got a list"},
		{"tools: [{id: a, builtin: noop, timeout: 30}]", "want a duration such as 30s, 10m or 1h, got int 30"},
		{"tools: [{id: a, builtin: noop, id: b}]", `mapping key "id" already defined`},
	} {
		_, err := ParseConfig([]byte(c.yaml))
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseConfig(%q): %v, want %q", c.yaml, err, c.want)
		}
	}
}

func TestLoadConfigResolvesRelativePaths(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "tools"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tools", "word_count.py"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "worker.yaml")
	if err := os.WriteFile(path, []byte(`
tools:
  - id: a
    command: [python3, tools/word_count.py, tools/absent.txt, -x/y, "a b", /abs/path]
  - id: b
    command: [./bin/tool, "--flag"]
  - id: c
    builtin: echo
`), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{
		{"python3", filepath.Join(dir, "tools/word_count.py"), "tools/absent.txt", "-x/y", "a b", "/abs/path"},
		{filepath.Join(dir, "bin/tool"), "--flag"},
		nil,
	}
	for i, w := range want {
		if !reflect.DeepEqual(cfg.Tools[i].Command, w) {
			t.Errorf("tools[%d].command = %q, want %q", i, cfg.Tools[i].Command, w)
		}
	}
}

func TestLoadConfigNamesTheFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "worker.yaml")
	if err := os.WriteFile(path, []byte("tools:\n  - id: a\n    command: [x]\n    bogus: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := LoadConfig(path)
	if want := path + `:4: tools[0] (id "a"): unknown key "bogus"`; err == nil || err.Error() != want {
		t.Fatalf("LoadConfig: %v, want %s", err, want)
	}
	_, err = LoadConfig(filepath.Join(dir, "absent.yaml"))
	if err == nil || !strings.Contains(err.Error(), "absent.yaml: no such file or directory") {
		t.Fatalf("LoadConfig of a missing file: %v", err)
	}
}

func TestValidateBuiltConfig(t *testing.T) {
	err := Config{Tools: []ToolConfig{{ID: "a", Builtin: BuiltinEcho, Limits: Limits{Network: true}}, {ID: "b", Command: []string{"/bin/true"}}}}.Validate()
	if got := problems(err); !reflect.DeepEqual(got, []string{`tools[0] (id "a"): limits does not apply to a builtin tool`}) {
		t.Fatalf("Validate: %q", got)
	}
}
