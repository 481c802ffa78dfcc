package sandbox

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/internal/located"
)

// Defaults of the worker config. A field left out, or written as its zero
// value, takes its default. Limits cannot be switched off: an operator who
// wants more sets a larger value.
const (
	// DefaultPool is the pool a worker serves when the config names none;
	// it is the catalog's default pool.
	DefaultPool = "default"
	// DefaultIsolation is the isolation of a config that names none.
	DefaultIsolation = IsolationBubblewrap
	// DefaultCapability is the recovery capability of a tool that names
	// none: the tool cannot survive being run twice.
	DefaultCapability = events.CapNonRecoverable
	// DefaultTimeout bounds one call of a tool, in wall-clock time.
	DefaultTimeout = 30 * time.Second
	// DefaultOutput is how a tool's stdout is read.
	DefaultOutput = OutputText
	// DefaultMemoryMB is the address-space limit of each tool process, in
	// MiB (RLIMIT_AS), and the size of its private /tmp.
	DefaultMemoryMB = 256
	// DefaultCPUSeconds is the CPU time limit of each tool process, in
	// seconds (RLIMIT_CPU).
	DefaultCPUSeconds = 10
	// DefaultOutputKB caps a tool's stdout, in KiB.
	DefaultOutputKB = 256
	// DefaultMaxProcs caps the processes and threads of one call
	// (RLIMIT_NPROC inside the call's own user namespace).
	DefaultMaxProcs = 64
	// DefaultPrestart is how many pre-started sandboxes a worker with
	// isolation bubblewrap keeps ready for each subprocess tool. With
	// isolation none the default is 0: nothing is pre-started.
	DefaultPrestart = 2
)

// Upper bounds of the limits: sanity checks against typing mistakes.
const (
	MaxTimeout    = 24 * time.Hour
	MaxMemoryMB   = 1 << 20 // 1 TiB
	MaxCPUSeconds = 24 * 60 * 60
	MaxOutputKB   = 64 << 10 // 64 MiB, buffered in the worker's memory
	MaxProcs      = 1 << 16
	MaxPrestart   = 64
)

// Isolation is how a worker isolates its subprocess tools.
type Isolation string

// Isolations.
const (
	// IsolationBubblewrap runs every subprocess tool in a bubblewrap
	// sandbox (see the package doc).
	IsolationBubblewrap Isolation = "bubblewrap"
	// IsolationNone runs subprocess tools as plain child processes of the
	// worker. Runner.Warning says what is then not isolated.
	IsolationNone Isolation = "none"
)

// OutputFormat is how a subprocess tool's stdout becomes its output.
type OutputFormat string

// Output formats.
const (
	// OutputText: stdout is one text block.
	OutputText OutputFormat = "text"
	// OutputJSON: stdout is a ToolOutput object {content, is_error, state}.
	OutputJSON OutputFormat = "json"
)

// Builtin names: trusted in-process tools of the worker, no subprocess.
const (
	BuiltinNoop  = "noop"  // an empty successful output
	BuiltinEcho  = "echo"  // one text block holding the arguments JSON
	BuiltinSleep = "sleep" // waits {"duration": "50ms"}, then "slept 50ms"
)

// Builtins lists the builtin names.
var Builtins = []string{BuiltinNoop, BuiltinEcho, BuiltinSleep}

// Config is a worker config: the pools a worker serves, how it isolates
// tools, and the tools themselves. docs/workers.md describes it for
// operators.
type Config struct {
	// Pools are the sandbox pools whose calls the worker takes. Default
	// [default]. Each matches ^[A-Za-z0-9_-]{1,64}$.
	Pools []string `yaml:"pools"`
	// Isolation is bubblewrap (default) or none.
	Isolation Isolation `yaml:"isolation"`
	// Prestart is how many sandboxes are kept started, for each subprocess
	// tool, waiting for a call (see docs/workers.md): nil means
	// DefaultPrestart with isolation bubblewrap, 0 with none; 0 turns
	// pre-starting off. It applies to isolation bubblewrap only, at most
	// MaxPrestart. A tool's own Prestart overrides it.
	Prestart *int `yaml:"prestart"`
	// Tools are the tools the worker serves; at least one.
	Tools []ToolConfig `yaml:"tools"`
}

// ToolConfig is one tool of a worker: a builtin, or a command run as a
// subprocess.
type ToolConfig struct {
	// ID is the tool's id in the catalog: ^[A-Za-z0-9_-]{1,64}$, unique.
	ID string `yaml:"id"`
	// Builtin names a builtin (noop, echo, sleep). A builtin tool has no
	// command, output, limits, mounts or env.
	Builtin string `yaml:"builtin"`
	// Command is the argv of a subprocess tool. Command[0] is an absolute
	// path, a path relative to the config file's directory (when it holds a
	// slash), or a name looked up in PATH=/usr/local/bin:/usr/bin:/bin.
	Command []string `yaml:"command"`
	// Capability is what the tool can safely survive; default
	// non_recoverable. The worker advertises it to the engine.
	Capability events.Capability `yaml:"capability"`
	// Timeout bounds one call in wall-clock time; default 30s.
	Timeout time.Duration `yaml:"timeout"`
	// Output is text (default) or json.
	Output OutputFormat `yaml:"output"`
	// Limits are the resource limits of one call.
	Limits Limits `yaml:"limits"`
	// Mounts are extra host paths the tool sees at the same path.
	Mounts []Mount `yaml:"mounts"`
	// Env is added to the tool's environment. PATH, HOME, LANG,
	// TRACEPARENT and TOOLBATCH_* are reserved.
	Env map[string]string `yaml:"env"`
	// Prestart overrides the config's Prestart for this tool; nil means
	// the config's.
	Prestart *int `yaml:"prestart"`
	// MCP makes the tool a call of a stdio MCP server's tool: Command is
	// the server's, which runs for one call inside the tool's sandbox
	// (mcp.go). Its output is the MCP result; Output is not set.
	MCP *MCPConfig `yaml:"mcp"`
}

// Limits are the resource limits of one call of a subprocess tool. Zero
// means the default; no limit can be switched off.
type Limits struct {
	// MemoryMB is each process's address-space limit (RLIMIT_AS) and the
	// size of the private /tmp, in MiB; default 256.
	MemoryMB int `yaml:"memory_mb"`
	// CPUSeconds is each process's CPU time limit (RLIMIT_CPU), in
	// seconds; default 10.
	CPUSeconds int `yaml:"cpu_seconds"`
	// OutputKB caps stdout, in KiB; default 256. More kills the tool.
	OutputKB int `yaml:"output_kb"`
	// MaxProcs caps the processes and threads of the call; default 64.
	MaxProcs int `yaml:"max_procs"`
	// Network gives the tool the host's network; default false (a network
	// namespace with only a loopback device of its own).
	Network bool `yaml:"network"`
}

// Mount is a host path a tool sees at the same path.
type Mount struct {
	// Path is absolute and clean.
	Path string `yaml:"path"`
	// Writable mounts it read-write; default read-only.
	Writable bool `yaml:"writable"`

	// at is where the sandbox shows it when not at Path: the worker's own
	// mounts (the MCP call program), bound by descriptor at a fixed place.
	at string
}

// dest is where the sandbox shows the mount.
func (m Mount) dest() string {
	if m.at != "" {
		return m.at
	}
	return m.Path
}

// IsBuiltin reports whether the tool is a builtin.
func (t ToolConfig) IsBuiltin() bool { return t.Builtin != "" }

// ErrInvalidConfig is matched (errors.Is) by every problem of a worker
// config that does not parse or validate.
var ErrInvalidConfig = errors.New("sandbox: invalid worker config")

// ConfigError is one problem of a worker config. ParseConfig, LoadConfig
// and Config.Validate report every problem, joined with errors.Join.
type ConfigError struct {
	// Path is the config file (set by LoadConfig), or empty.
	Path string
	// Line is the 1-based line in the file, or 0 when not known.
	Line int
	// Where names the part of the config: `tools[2] (id "wc")`, `pools`;
	// empty for the document as a whole.
	Where string
	// Msg says what is wrong, starting with the field.
	Msg string

	field string // tools[2].timeout: where the line is looked up
}

// Error returns "path:line: where: msg", leaving out what is not known.
func (e *ConfigError) Error() string { return located.Format(e.Path, e.Line, e.Where, e.Msg) }

// Unwrap returns ErrInvalidConfig.
func (e *ConfigError) Unwrap() error { return ErrInvalidConfig }

var envPattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// reservedEnv are the variables the sandbox sets itself.
var reservedEnv = []string{"PATH", "HOME", "LANG", EnvTraceParent}

// ParseConfig decodes and validates a worker config. Decoding is strict: an
// unknown key is an error. Every problem is reported, each a *ConfigError
// (errors.Is ErrInvalidConfig) with its line. The config returned has every
// default applied. Paths are left as written: LoadConfig resolves relative
// ones against the file's directory.
func ParseConfig(data []byte) (Config, error) {
	var doc yaml.Node
	nd := yaml.NewDecoder(bytes.NewReader(data))
	if err := nd.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return Config{}, &ConfigError{Msg: "the config is empty (want a mapping with pools, isolation and tools)"}
		}
		ps := decodeProblems(err, nil, nil)
		for _, p := range ps {
			p.Line = located.SyntaxLine(data, p.Line, p.Msg)
		}
		return Config{}, joinProblems(ps)
	}
	var next yaml.Node
	if err := nd.Decode(&next); !errors.Is(err, io.EOF) {
		return Config{}, &ConfigError{Line: next.Line, Msg: "the file holds more than one YAML document"}
	}
	if len(doc.Content) == 0 || (doc.Content[0].Kind == yaml.ScalarNode && doc.Content[0].Tag == "!!null") {
		return Config{}, &ConfigError{Msg: "the config is empty (want a mapping with pools, isolation and tools)"}
	}
	lines := map[string]int{}
	indexLines(doc.Content[0], "", lines)

	var cfg Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var problems []*ConfigError
	if err := dec.Decode(&cfg); err != nil {
		var te *yaml.TypeError
		if !errors.As(err, &te) {
			return Config{}, joinProblems(decodeProblems(err, nil, nil))
		}
		// The rest decoded: validate it too, so that every problem is
		// reported at once.
		problems = decodeProblems(err, lines, &cfg)
	}
	cfg = cfg.withDerivedIDs()
	for _, p := range cfg.problems() {
		p.Line = lineOf(lines, p.field)
		problems = append(problems, p)
	}
	if len(problems) > 0 {
		return Config{}, joinProblems(problems)
	}
	return cfg.WithDefaults(), nil
}

// LoadConfig reads and parses the worker config at path, and resolves its
// relative paths against the file's directory (see Config.ResolvePaths).
// Every problem names the file.
func LoadConfig(path string) (Config, error) {
	data, err := located.ReadFile(path)
	if err != nil {
		return Config{}, err
	}
	cfg, err := ParseConfig(data)
	if err != nil {
		for _, p := range located.Problems[*ConfigError](err) {
			p.Path = path
		}
		return Config{}, err
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return cfg.ResolvePaths(filepath.Dir(abs)), nil
}

// ResolvePaths returns the config with relative paths of commands made
// absolute against dir:
//
//   - command[0] when it is relative and holds a slash ("tools/wc", "./wc");
//     a bare name ("python3") is looked up in the tool's PATH at each call;
//   - a later argument when it is relative, holds a slash, does not start
//     with "-", and names a file or directory that exists under dir
//     ("tools/word_count.py"). Any other argument is passed as written.
func (c Config) ResolvePaths(dir string) Config {
	c.Tools = slices.Clone(c.Tools)
	for i := range c.Tools {
		cmd := slices.Clone(c.Tools[i].Command)
		for j, a := range cmd {
			if filepath.IsAbs(a) || !strings.Contains(a, "/") {
				continue
			}
			p := filepath.Join(dir, a)
			if j == 0 {
				cmd[j] = p
				continue
			}
			if strings.HasPrefix(a, "-") {
				continue
			}
			if _, err := os.Stat(p); err == nil {
				cmd[j] = p
			}
		}
		c.Tools[i].Command = cmd
	}
	return c
}

// withDerivedIDs gives an MCP tool without an id the one derived from its
// server and tool names (checked like any other id).
func (c Config) withDerivedIDs() Config {
	c.Tools = slices.Clone(c.Tools)
	for i := range c.Tools {
		if t := &c.Tools[i]; t.ID == "" && t.MCP != nil && t.MCP.Server != "" && t.MCP.Tool != "" {
			t.ID = MCPToolID(t.MCP.Server, t.MCP.Tool)
		}
	}
	return c
}

// WithDefaults returns the config with every default applied. Builtin tools
// get a capability and a timeout only.
func (c Config) WithDefaults() Config {
	if len(c.Pools) == 0 {
		c.Pools = []string{DefaultPool}
	} else {
		c.Pools = slices.Clone(c.Pools)
	}
	if c.Isolation == "" {
		c.Isolation = DefaultIsolation
	}
	if c.Prestart == nil {
		n := 0
		if c.Isolation == IsolationBubblewrap {
			n = DefaultPrestart
		}
		c.Prestart = &n
	}
	c.Tools = slices.Clone(c.Tools)
	for i := range c.Tools {
		t := &c.Tools[i]
		if t.Capability == "" {
			t.Capability = DefaultCapability
		}
		if t.Timeout == 0 {
			t.Timeout = DefaultTimeout
		}
		if t.IsBuiltin() {
			continue
		}
		if t.Prestart == nil {
			t.Prestart = c.Prestart
		}
		if t.MCP.shared() {
			t.Prestart = new(int) // its server is the long-lived sandbox
		}
		if t.Output == "" && t.MCP == nil {
			t.Output = DefaultOutput
		}
		l := &t.Limits
		if l.MemoryMB == 0 {
			l.MemoryMB = DefaultMemoryMB
		}
		if l.CPUSeconds == 0 {
			l.CPUSeconds = DefaultCPUSeconds
		}
		if l.OutputKB == 0 {
			l.OutputKB = DefaultOutputKB
		}
		if l.MaxProcs == 0 {
			l.MaxProcs = DefaultMaxProcs
		}
	}
	return c
}

// Tool returns the tool with the id, and whether the config has it.
func (c Config) Tool(id string) (ToolConfig, bool) {
	for _, t := range c.Tools {
		if t.ID == id {
			return t, true
		}
	}
	return ToolConfig{}, false
}

// Validate reports every problem of the config, joined with errors.Join;
// each is a *ConfigError naming the tool. Zero values are accepted as their
// defaults.
func (c Config) Validate() error { return joinProblems(c.problems()) }

// problems checks the whole config.
func (c Config) problems() []*ConfigError {
	var ps []*ConfigError
	add := func(where, field, format string, args ...any) {
		ps = append(ps, &ConfigError{Where: where, Msg: fmt.Sprintf(format, args...), field: field})
	}
	seenPool := map[string]int{}
	for i, p := range c.Pools {
		field := fmt.Sprintf("pools[%d]", i)
		if !events.ValidToolID(p) {
			add("pools", field, "pool %q does not match ^[A-Za-z0-9_-]{1,64}$", p)
		} else if j, dup := seenPool[p]; dup {
			add("pools", field, "pool %q is already listed at pools[%d]", p, j)
		} else {
			seenPool[p] = i
		}
	}
	switch c.Isolation {
	case "", IsolationBubblewrap, IsolationNone:
	default:
		add("", "isolation", "isolation %q is not bubblewrap or none", c.Isolation)
	}
	// prestart checks a prestart setting; field is where its line is.
	prestart := func(where, field string, n *int) {
		switch {
		case n == nil:
		case *n < 0:
			add(where, field, "prestart %d must be 0 (off) or more", *n)
		case *n > MaxPrestart:
			add(where, field, "prestart %d is more than %d", *n, MaxPrestart)
		case *n > 0 && c.Isolation == IsolationNone:
			add(where, field, "prestart %d: pre-started sandboxes need isolation bubblewrap (set prestart: 0, or leave it out)", *n)
		}
	}
	prestart("", "prestart", c.Prestart)
	if len(c.Tools) == 0 {
		add("", "tools", "tools: at least one tool is required")
	}
	seenTool := map[string]int{}
	sharedBy := map[string]int{} // shared MCP server -> its first tool
	for i, t := range c.Tools {
		where := located.ToolWhere(i, t.ID)
		at := func(f string) string { return fmt.Sprintf("tools[%d].%s", i, f) }
		addf := func(f, format string, args ...any) { add(where, at(f), format, args...) }
		switch {
		case t.ID == "" && t.MCP != nil:
			addf("id", "id is required (or mcp.server, to derive it as <server>_<tool>)")
		case t.ID == "":
			addf("id", "id is required")
		case !events.ValidToolID(t.ID):
			addf("id", "id %q does not match ^[A-Za-z0-9_-]{1,64}$", t.ID)
		default:
			if j, dup := seenTool[t.ID]; dup {
				addf("id", "id %q is already used by tools[%d]", t.ID, j)
			} else {
				seenTool[t.ID] = i
			}
		}
		if t.Capability != "" && !slices.Contains(events.Capabilities, t.Capability) {
			addf("capability", "capability %q is not non_recoverable, replay_safe, idempotent or durable_request", t.Capability)
		}
		switch {
		case t.Timeout < 0:
			addf("timeout", "timeout %s must be positive (0 means the default %s)", t.Timeout, DefaultTimeout)
		case t.Timeout > MaxTimeout:
			addf("timeout", "timeout %s is more than %s", t.Timeout, MaxTimeout)
		}
		if t.IsBuiltin() {
			if !slices.Contains(Builtins, t.Builtin) {
				addf("builtin", "builtin %q is not noop, echo or sleep", t.Builtin)
			}
			for _, f := range t.subprocessFields() {
				addf(f, "%s does not apply to a builtin tool", f)
			}
			continue
		}
		switch {
		case len(t.Command) == 0:
			addf("command", "command is required (or builtin: noop, echo or sleep)")
		case t.Command[0] == "":
			addf("command", "command[0], the program, is empty")
		}
		prestart(where, at("prestart"), t.Prestart)
		for j, a := range t.Command {
			if strings.ContainsRune(a, 0) {
				addf(fmt.Sprintf("command[%d]", j), "command[%d] holds a NUL byte", j)
			}
		}
		switch {
		case t.MCP != nil && t.Output != "":
			addf("output", "output does not apply to an MCP tool: its output is the MCP result")
		case t.MCP != nil:
		case t.Output == "", t.Output == OutputText, t.Output == OutputJSON:
		default:
			addf("output", "output %q is not text or json", t.Output)
		}
		if m := t.MCP; m != nil {
			if m.Tool == "" {
				addf("mcp.tool", "mcp.tool, the name of the server's tool, is required")
			}
			if m.Server != "" && !events.ValidToolID(m.Server) {
				addf("mcp.server", "mcp.server %q does not match ^[A-Za-z0-9_-]{1,64}$", m.Server)
			}
			switch {
			case m.Lifecycle != "" && m.Lifecycle != LifecyclePerCall && m.Lifecycle != LifecycleShared:
				addf("mcp.lifecycle", "mcp.lifecycle %q is not per_call or shared", m.Lifecycle)
			case m.shared() && m.Server == "":
				addf("mcp.server", "mcp.server is required with lifecycle shared: the tools of one server share it")
			case m.shared() && t.Prestart != nil && *t.Prestart > 0:
				addf("prestart", "prestart does not apply to a shared MCP server (it is one long-lived sandbox)")
			case m.shared():
				if j, ok := sharedBy[m.Server]; ok && !sameServer(c.Tools[j].withDefaults(), t.withDefaults()) {
					addf("mcp.server", "the tools of shared MCP server %q must have the same command, limits, mounts and env (tools[%d] differs)", m.Server, j)
				} else if !ok {
					sharedBy[m.Server] = i
				}
			}
		}
		for _, l := range []struct {
			name     string
			val, max int
			unit     string
		}{
			{"memory_mb", t.Limits.MemoryMB, MaxMemoryMB, "MiB"},
			{"cpu_seconds", t.Limits.CPUSeconds, MaxCPUSeconds, "s"},
			{"output_kb", t.Limits.OutputKB, MaxOutputKB, "KiB"},
			{"max_procs", t.Limits.MaxProcs, MaxProcs, "processes"},
		} {
			switch {
			case l.val < 0:
				addf("limits."+l.name, "limits.%s %d must be positive (0 means the default)", l.name, l.val)
			case l.val > l.max:
				addf("limits."+l.name, "limits.%s %d is more than %d %s", l.name, l.val, l.max, l.unit)
			}
		}
		seenMount := map[string]int{}
		for j, m := range t.Mounts {
			f := fmt.Sprintf("mounts[%d].path", j)
			switch {
			case m.Path == "":
				addf(f, "mounts[%d].path is required", j)
			case !filepath.IsAbs(m.Path):
				addf(f, "mounts[%d].path %q must be absolute", j, m.Path)
			case filepath.Clean(m.Path) != m.Path:
				addf(f, "mounts[%d].path %q must be clean (write %q)", j, m.Path, filepath.Clean(m.Path))
			case m.Path == "/":
				addf(f, "mounts[%d].path cannot be /", j)
			default:
				if k, dup := seenMount[m.Path]; dup {
					addf(f, "mounts[%d].path %q is already mounted by mounts[%d]", j, m.Path, k)
				} else {
					seenMount[m.Path] = j
				}
			}
		}
		for _, k := range sortedKeys(t.Env) {
			f := "env." + k
			switch {
			case !envPattern.MatchString(k):
				addf(f, "env: %q is not a variable name ([A-Za-z_][A-Za-z0-9_]*)", k)
			case slices.Contains(reservedEnv, k) || strings.HasPrefix(k, "TOOLBATCH_"):
				addf(f, "env: %s is set by the sandbox (PATH, HOME, LANG, TRACEPARENT and TOOLBATCH_* are reserved)", k)
			}
			if strings.ContainsRune(t.Env[k], 0) {
				addf(f, "env: the value of %s holds a NUL byte", k)
			}
		}
	}
	return ps
}

// sameServer reports whether two tools describe one MCP server's sandbox.
func sameServer(a, b ToolConfig) bool {
	return slices.Equal(a.Command, b.Command) && a.Limits == b.Limits && slices.Equal(a.Mounts, b.Mounts) && maps.Equal(a.Env, b.Env)
}

// subprocessFields names the subprocess-only fields a tool sets.
func (t ToolConfig) subprocessFields() []string {
	var fs []string
	if len(t.Command) > 0 {
		fs = append(fs, "command")
	}
	if t.Output != "" {
		fs = append(fs, "output")
	}
	if t.Limits != (Limits{}) {
		fs = append(fs, "limits")
	}
	if len(t.Mounts) > 0 {
		fs = append(fs, "mounts")
	}
	if len(t.Env) > 0 {
		fs = append(fs, "env")
	}
	if t.Prestart != nil {
		fs = append(fs, "prestart")
	}
	if t.MCP != nil {
		fs = append(fs, "mcp")
	}
	return fs
}

func sortedKeys(m map[string]string) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// joinProblems orders the problems by line (those without one last, in the
// order found) and joins them; nil when there are none.
func joinProblems(ps []*ConfigError) error {
	return located.Join(ps, func(p *ConfigError) int { return p.Line })
}

// indexLines records the line of every mapping key and sequence item under
// n, by path (tools[1].limits.memory_mb).
func indexLines(n *yaml.Node, path string, lines map[string]int) {
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := k.Value
			if path != "" {
				p = path + "." + k.Value
			}
			if _, ok := lines[p]; !ok {
				lines[p] = k.Line
			}
			indexLines(v, p, lines)
		}
	case yaml.SequenceNode:
		for i, v := range n.Content {
			p := path + "[" + strconv.Itoa(i) + "]"
			lines[p] = v.Line
			indexLines(v, p, lines)
		}
	}
}

// lineOf returns the line of the field, or of the nearest enclosing one
// that is known; 0 when none is.
func lineOf(lines map[string]int, field string) int {
	for field != "" {
		if l, ok := lines[field]; ok {
			return l
		}
		i := strings.LastIndexAny(field, ".[")
		if i < 0 {
			break
		}
		field = field[:i]
	}
	return 0
}

// decodeProblems turns the YAML decoder's errors into problems, naming the
// tool a line belongs to when the line index is known.
func decodeProblems(err error, lines map[string]int, cfg *Config) []*ConfigError {
	msgs, _ := located.Messages(err)
	out := make([]*ConfigError, 0, len(msgs))
	for _, msg := range msgs {
		if msg.Line == 0 {
			out = append(out, &ConfigError{Msg: msg.Text})
			continue
		}
		line, text := msg.Line, msg.Text
		if key, ok := located.UnknownKey(text); ok {
			text = fmt.Sprintf("unknown key %q", key)
		} else if words, _, _, ok := located.Mismatch(text); ok {
			text = words
		}
		where := ""
		if i := toolAtLine(lines, line); i >= 0 {
			id := ""
			if cfg != nil && i < len(cfg.Tools) {
				id = cfg.Tools[i].ID
			}
			where = located.ToolWhere(i, id)
		}
		out = append(out, &ConfigError{Line: line, Where: where, Msg: text})
	}
	return out
}

// toolAtLine returns the index of the tool whose entry holds the line, or
// -1.
func toolAtLine(lines map[string]int, line int) int {
	for i := 0; ; i++ {
		prefix := fmt.Sprintf("tools[%d]", i)
		start, ok := lines[prefix]
		if !ok || start > line {
			return -1
		}
		end := start
		for p, l := range lines {
			if p == prefix || strings.HasPrefix(p, prefix+".") || strings.HasPrefix(p, prefix+"[") {
				end = max(end, l)
			}
		}
		if line <= end {
			return i
		}
	}
}
