package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/toolbatch/toolbatch/events"
	"golang.org/x/sys/unix"
)

// ToolPATH is the PATH of every subprocess tool, and where a bare
// command[0] is looked up.
const ToolPATH = "/usr/local/bin:/usr/bin:/bin"

// The users tools run as when the worker runs as root: each subprocess
// tool its own, uid and gid SandboxUIDBase plus a slot derived from the
// tool's id (stable across restarts and config edits; two tools whose ids
// fall on one slot take the next free ones, in config order), so that file
// modes separate tools: what one tool leaves in a shared mount, another
// cannot read unless the file's mode lets everyone. Runner.Users lists
// them; the worker logs them at start.
const (
	SandboxUIDBase  = 1_000_000_000
	sandboxUIDSlots = 1_000_000
	// DefaultSandboxUID and DefaultSandboxGID stand for "any tool's user"
	// where no tool is known (which directory a work root goes to).
	DefaultSandboxUID = SandboxUIDBase
	DefaultSandboxGID = SandboxUIDBase
)

// toolSlot is the uid slot a tool id falls on.
func toolSlot(id string) int {
	h := fnv.New32a()
	h.Write([]byte(id))
	return int(h.Sum32() % sandboxUIDSlots)
}

// StderrTailBytes is how much of the end of a tool's stderr is kept for
// the error output of a failed call.
const StderrTailBytes = 4 << 10

// Errors of NewRunner: the worker cannot serve its config on this machine.
var (
	// ErrNoBubblewrap: the config asks for bubblewrap and bwrap is not on
	// PATH.
	ErrNoBubblewrap = errors.New("sandbox: isolation is bubblewrap but bwrap is not on PATH (install the bubblewrap package, or set isolation: none to run tools unisolated)")
	// ErrBubblewrapBroken: bwrap is installed but cannot build a sandbox
	// here (user namespaces disabled, the work root not reachable, ...).
	ErrBubblewrapBroken = errors.New("sandbox: bubblewrap cannot create a sandbox on this machine")
	// ErrNoPrlimit: prlimit (util-linux), which sets every tool's rlimits,
	// is not on PATH.
	ErrNoPrlimit = errors.New("sandbox: prlimit is not on PATH (install util-linux)")
	// ErrPrestartBroken: the config pre-starts sandboxes and a trial
	// pre-started sandbox did not run /bin/true (most often: the program
	// does not call StageMain first thing in main).
	ErrPrestartBroken = errors.New("sandbox: pre-started sandboxes do not work in this program (set prestart: 0 to run without them)")
)

// Call is one attempt of one call, as a worker received it.
type Call struct {
	ToolID      string
	CallID      string
	OperationID string // <run_id>/<step>/<call_id>: the idempotency key
	Attempt     int
	Arguments   []byte // JSON; empty is sent as {}
	// TraceParent is the W3C trace context the tool is given in
	// EnvTraceParent ("": none).
	TraceParent string
}

// EnvTraceParent is the variable of a tool's environment that carries its
// call's trace context (the worker's span of the attempt), for a tool that
// traces what it does.
const EnvTraceParent = "TRACEPARENT"

// Result is a call's outcome: exactly one of Output (what the tool
// produced, possibly an error output of its own) and Err (the call failed:
// the tool could not be started, exited non-zero, timed out, wrote too
// much or malformed output). Every Err becomes an error output.
type Result struct {
	Output *events.Output
	Err    *events.ToolError
	// Exit says how the tool ended: ExitOK, or for an error one of
	// ExitTimeout, ExitLimit, ExitKilled and ExitError (see Class).
	Exit string
}

// How a tool ended (the result label of toolbatch_worker_tool_exits_total).
const (
	ExitOK      = "ok"
	ExitError   = "error"   // non-zero exit, bad output, could not start, a builtin's failure
	ExitTimeout = "timeout" // killed at its timeout
	ExitLimit   = "limit"   // killed for its output, CPU time or file size
	ExitKilled  = "killed"  // a signal, or stopped by the worker (claim lost, abort)
)

// Class is how the tool ended, ExitOK or ExitError when Exit is not set.
func (r Result) Class() string {
	switch {
	case r.Exit != "":
		return r.Exit
	case r.Err != nil:
		return ExitError
	}
	return ExitOK
}

// as sets how a failed tool ended.
func (r Result) as(exit string) Result { r.Exit = exit; return r }

// Option changes how a Runner runs tools.
type Option func(*Runner)

// WithWorkRoot sets the directory under which each call's working
// directory is created (default os.TempDir()). It must exist and be
// reachable by the sandbox user.
func WithWorkRoot(dir string) Option { return func(r *Runner) { r.workRoot = dir } }

// WithSandboxUser makes every tool run as uid:gid when the worker runs as
// root, instead of a user of its own (tests count one user's processes).
// It is ignored when the worker is not root: tools then run as the
// worker's user.
func WithSandboxUser(uid, gid int) Option {
	return func(r *Runner) { r.uid, r.gid, r.oneUser = uid, gid, true }
}

// Users returns the uid each subprocess tool runs as (gid the same), when
// the worker runs as root.
func (r *Runner) Users() map[string]int {
	out := map[string]int{}
	for _, t := range r.cfg.Tools {
		if !t.IsBuiltin() {
			out[t.ID], _ = r.userOf(t.ID)
		}
	}
	return out
}

// assignUsers gives every subprocess tool its own user (the tools of one
// MCP server share theirs).
func (r *Runner) assignUsers() {
	r.users = map[string]int{}
	taken := map[int]bool{}
	servers := map[string]int{} // MCP server -> the uid of its tools
	for _, t := range r.cfg.Tools {
		if t.IsBuiltin() {
			continue
		}
		// The tools of one MCP server are one user: what one of them
		// writes (a file of write_file), the others may change.
		if t.MCP != nil && t.MCP.Server != "" {
			if u, ok := servers[t.MCP.Server]; ok {
				r.users[t.ID] = u
				continue
			}
		}
		slot := toolSlot(t.ID)
		for taken[slot] {
			slot = (slot + 1) % sandboxUIDSlots
		}
		taken[slot] = true
		r.users[t.ID] = SandboxUIDBase + slot
		if t.MCP != nil && t.MCP.Server != "" {
			servers[t.MCP.Server] = r.users[t.ID]
		}
	}
}

// userOf is the uid and gid a tool's sandbox runs as (when the worker is
// root).
func (r *Runner) userOf(toolID string) (uid, gid int) {
	if r.oneUser {
		return r.uid, r.gid
	}
	if u, ok := r.users[toolID]; ok {
		return u, u
	}
	u := SandboxUIDBase + toolSlot(toolID) // a tool the config does not list: the trial
	return u, u
}

// WithPrestartFailureHandler sets a function called (from a goroutine of
// the Runner) each time a pre-start fails, with the tool and why. Calls
// are not affected: they start their own sandbox meanwhile.
func WithPrestartFailureHandler(f func(toolID string, err error)) Option {
	return func(r *Runner) { r.onPrestartFailure = f }
}

// WithPrestartObserver hears how long each pre-started sandbox took to
// become ready.
func WithPrestartObserver(f func(took time.Duration)) Option {
	return func(r *Runner) { r.onPrestarted = f }
}

// Ready returns each pre-starting tool's sandboxes ready now.
func (r *Runner) Ready() map[string]int {
	out := make(map[string]int, len(r.pools))
	for id, p := range r.pools {
		n, _, _, _ := p.state()
		out[id] = n
	}
	return out
}

// Runner runs calls of the tools of one worker config. It is safe for
// concurrent use; each call has its own sandbox. A Runner whose config
// pre-starts sandboxes keeps them running until Close.
type Runner struct {
	cfg      Config
	workRoot string
	uid, gid int // every tool's user with oneUser (WithSandboxUser)
	oneUser  bool
	users    map[string]int // each subprocess tool's uid (and gid)
	dropUser bool           // the worker is root: run bwrap as the tool's user

	bwrap   string // absolute path of bwrap (bubblewrap only)
	prlimit string // absolute path of prlimit
	env     string // absolute path of env (bubblewrap only)
	// Optional bwrap flags, when this bwrap has them.
	disableUserns bool
	tmpfsSize     bool

	warning string

	// pinned holds each subprocess tool's mounts, opened once at start
	// (O_PATH, no symlink at any level): a sandbox binds the file or
	// directory opened then, by descriptor, whatever a tool has since
	// made of the path (a symlink to elsewhere, say). They stay open for
	// the Runner's life: a call after Close starts a fresh sandbox.
	pinned map[string][]*os.File

	// Pre-started sandboxes (see prestart.go): a pool per tool that has
	// them, and the stage program, opened once.
	pools     map[string]*pool
	stagePath string // the stage program; default os.Executable()
	// mcpShim is the program that makes an MCP tool's call inside its
	// sandbox (MCPCallMain): this program, mounted read-only into the
	// sandboxes of MCP tools.
	mcpShim           string
	shimCopy          string      // the copy of it in the work root, removed by Close
	closed            atomic.Bool // Close was called: no shared server starts again
	sharedMu          sync.Mutex
	shared            map[string]*sharedServer // the shared MCP servers, by mcp.server
	stageExe          *os.File
	stageVariant      string // the stage's argv[1] when not stageArg (tests)
	onPrestartFailure func(toolID string, err error)
	onPrestarted      func(took time.Duration)
	closeOnce         sync.Once
	stats             struct {
		prestarted, fresh, diedBeforeUse, prestartFailures, stageLimits, stageChild, stageAlone, directLimits atomic.Int64
	}

	// refill fills the pools once the calls have been quiet for a while
	// (callActivity); nil without pools.
	refill      *time.Timer
	refillAfter time.Duration // refillQuiet, but in tests

	// noTrace is set once a tool could not be started traced (isolation
	// none, direct limits): this machine forbids it (Yama's ptrace_scope,
	// a seccomp profile), and later calls exec prlimit. Tests set it to
	// take that path.
	noTrace atomic.Bool
}

// NewRunner checks the config and this machine and returns a Runner. It
// refuses isolation bubblewrap when bwrap is not on PATH (ErrNoBubblewrap)
// or cannot build a sandbox here (ErrBubblewrapBroken, after a trial run of
// at most 10 s), and any config whose mounts do not exist.
//
// It marks every file descriptor of the process above 2 close-on-exec:
// one the program inherited open across exec (from its parent) would
// otherwise reach every sandbox and every tool.
func NewRunner(cfg Config, opts ...Option) (_ *Runner, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var shimCopy *string
	defer func() {
		if err != nil && shimCopy != nil && *shimCopy != "" {
			_ = os.Remove(*shimCopy) // a Runner that could not start leaves nothing
		}
	}()
	if err := closeInheritedOnExec(); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	r := &Runner{cfg: cfg.WithDefaults(), refillAfter: refillQuiet}
	shimCopy = &r.shimCopy
	for _, o := range opts {
		o(r)
	}
	r.assignUsers()
	if r.workRoot == "" {
		r.workRoot = os.TempDir()
	}
	root, err := filepath.Abs(r.workRoot)
	if err == nil {
		root, err = filepath.EvalSymlinks(root)
	}
	if err != nil {
		return nil, fmt.Errorf("sandbox: work root: %w", err)
	}
	if fi, err := os.Stat(root); err != nil {
		return nil, fmt.Errorf("sandbox: work root: %w", err)
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("sandbox: work root %s is not a directory", root)
	}
	r.workRoot = root
	r.dropUser = os.Geteuid() == 0
	for _, t := range r.cfg.Tools {
		if !t.IsBuiltin() && !filepath.IsAbs(t.Command[0]) && strings.Contains(t.Command[0], "/") {
			return nil, fmt.Errorf("sandbox: tool %q: program %q is a relative path (LoadConfig resolves it against the config file's directory; a Config built in Go needs an absolute path)", t.ID, t.Command[0])
		}
		for _, m := range t.Mounts {
			if _, err := os.Stat(m.Path); err != nil {
				return nil, fmt.Errorf("sandbox: tool %q: mount %s: %w", t.ID, m.Path, errors.Unwrap(err))
			}
			if real, err := filepath.EvalSymlinks(m.Path); err == nil && under(root, real) || under(root, m.Path) {
				return nil, fmt.Errorf("sandbox: tool %q: mount %s holds the work root %s: it would show the tool every call's working directory", t.ID, m.Path, root)
			}
		}
	}
	if err := r.checkPrograms(); err != nil {
		return nil, err
	}
	if err := r.checkNesting(); err != nil {
		return nil, err
	}
	if r.dropUser && r.cfg.Isolation == IsolationBubblewrap && r.hasSubprocessTools() {
		if err := r.checkReach(); err != nil {
			return nil, err
		}
	}
	if err := r.mountShim(); err != nil {
		return nil, err
	}
	if r.cfg.Isolation == IsolationBubblewrap {
		if err := r.pinMounts(); err != nil {
			r.closePinned()
			return nil, err
		}
	}
	if !r.hasSubprocessTools() {
		if r.cfg.Isolation == IsolationNone {
			r.warning = "isolation: none (every tool of this worker is a builtin, so no subprocess runs)"
		}
		return r, nil
	}
	if r.cfg.Isolation == IsolationNone {
		if err := r.findPrlimit(); err != nil {
			return nil, err
		}
		r.warning = noneWarning(r.dropUser)
		return r, nil
	}
	if err := r.findBubblewrap(); err != nil {
		r.closePinned()
		return nil, err
	}
	if err := r.startPools(); err != nil {
		r.closePinned()
		return nil, err
	}
	// Stats counts the calls of Run, not the trials.
	r.stats.fresh.Store(0)
	r.stats.diedBeforeUse.Store(0)
	return r, nil
}

// checkNesting refuses a mount that another tool can change: one strictly
// inside another tool's writable mount (that tool could replace it), or
// inside the work root (the calls' working directories). Two tools may
// share one writable mount (a workspace): each is its own user there.
func (r *Runner) checkNesting() error {
	for _, t := range r.cfg.Tools {
		for _, m := range t.Mounts {
			if under(m.Path, r.workRoot) {
				return fmt.Errorf("sandbox: tool %q: mount %s is inside the work root %s, where calls' working directories are made", t.ID, m.Path, r.workRoot)
			}
			for _, o := range r.cfg.Tools {
				if o.ID == t.ID {
					continue
				}
				for _, w := range o.Mounts {
					if w.Writable && m.Path != w.Path && under(m.Path, w.Path) {
						return fmt.Errorf("sandbox: tool %q: mount %s is inside tool %q's writable mount %s: that tool could replace it; mount %s itself, or a path of its own", t.ID, m.Path, o.ID, w.Path, w.Path)
					}
				}
			}
		}
	}
	return nil
}

// pinMounts opens every subprocess tool's mounts, refusing a path with a
// symlink anywhere in it.
func (r *Runner) pinMounts() error {
	r.pinned = map[string][]*os.File{}
	for _, t := range r.cfg.Tools {
		if t.IsBuiltin() {
			continue
		}
		for _, m := range t.Mounts {
			fd, err := unix.Openat2(unix.AT_FDCWD, m.Path, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS})
			if err != nil {
				if errors.Is(err, unix.ELOOP) {
					return fmt.Errorf("sandbox: tool %q: mount %s: a symlink is in its path; give the path it leads to", t.ID, m.Path)
				}
				return fmt.Errorf("sandbox: tool %q: mount %s: %w", t.ID, m.Path, err)
			}
			r.pinned[t.ID] = append(r.pinned[t.ID], os.NewFile(uintptr(fd), m.Path))
		}
	}
	return nil
}

// closePinned closes the pinned mounts (a Runner that could not start).
func (r *Runner) closePinned() {
	for _, files := range r.pinned {
		for _, f := range files {
			_ = f.Close()
		}
	}
}

// checkReach refuses a work root or a mount the sandbox's user cannot
// reach, in one line that says what to change.
func (r *Runner) checkReach() error {
	anyUID, anyGID := r.userOf("")
	if err := reach(r.workRoot, anyUID, anyGID, mayEnter); err != nil {
		return fmt.Errorf("sandbox: work root %s: %v; give --work-root a directory it can enter (under /var/tmp, say)", r.workRoot, err)
	}
	for _, t := range r.cfg.Tools {
		if t.IsBuiltin() {
			continue
		}
		for _, m := range t.Mounts {
			want := uint32(mayRead)
			if fi, err := os.Stat(m.Path); err == nil && fi.IsDir() {
				want |= mayEnter
			}
			if m.Writable {
				want |= mayWrite
			}
			uid, gid := r.userOf(t.ID)
			if err := reach(m.Path, uid, gid, want); err != nil {
				return fmt.Errorf("sandbox: tool %q: mount %s: %v; change its mode, or mount a path it can reach", t.ID, m.Path, err)
			}
		}
	}
	return nil
}

// startPools checks pre-starting with a trial sandbox and starts filling
// the pool of every subprocess tool whose prestart is above 0.
func (r *Runner) startPools() error {
	var tools []ToolConfig
	for _, t := range r.cfg.Tools {
		if !t.IsBuiltin() && t.Prestart != nil && *t.Prestart > 0 {
			tools = append(tools, t)
		}
	}
	if len(tools) == 0 {
		return nil
	}
	exe, err := r.stagePath, error(nil)
	if exe == "" {
		exe, err = os.Executable()
	}
	if err == nil {
		r.stageExe, err = os.Open(exe)
	}
	if err != nil {
		return fmt.Errorf("%w: cannot open this program for the stage: %v", ErrPrestartBroken, err)
	}
	trial := ToolConfig{ID: "trial", Command: []string{"/bin/true"}, Timeout: 10 * time.Second}.withDefaults()
	w, err := r.prestart(trial)
	if err != nil {
		_ = r.stageExe.Close()
		return fmt.Errorf("%w: a trial pre-started sandbox: %v", ErrPrestartBroken, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	trialPool := &pool{r: r, t: trial, changed: make(chan struct{}), ready: []*warm{w}}
	res, _ := trialPool.run(ctx, trial, Call{ToolID: "trial", CallID: "trial", OperationID: "trial/0/trial", Attempt: 1}, w.prog, []byte("{}"))
	trialPool.close()
	if !res.ok() {
		_ = r.stageExe.Close()
		msg := "it ended before it took the call"
		if res.Err != nil {
			msg = res.Err.Message
		}
		return fmt.Errorf("%w: a trial pre-started sandbox did not run /bin/true: %s", ErrPrestartBroken, msg)
	}
	r.pools = map[string]*pool{}
	for _, t := range tools {
		p := newPool(r, t.withDefaults(), *t.Prestart)
		r.pools[t.ID] = p
		p.mu.Lock()
		p.fill()
		p.mu.Unlock()
	}
	// Re-armed by every call's beginning and end (callActivity); its
	// first firing finds the pools filling already.
	r.refill = time.AfterFunc(r.refillAfter, r.fillPools)
	return nil
}

// ok reports whether the result is a successful output.
func (res Result) ok() bool { return res.Err == nil && res.Output != nil && !res.Output.IsError }

// Close tears down every pre-started sandbox (each is killed, waited for,
// and its working directory removed) and waits for pre-starts under way.
// Calls running meanwhile or later start their own sandboxes. Close is
// safe to call more than once; it returns nil.
func (r *Runner) Close() error {
	r.closeOnce.Do(func() {
		if r.refill != nil {
			r.refill.Stop()
		}
		var wg sync.WaitGroup
		for _, p := range r.pools {
			wg.Add(1)
			go func() { defer wg.Done(); p.close() }()
		}
		wg.Wait()
		if r.stageExe != nil {
			_ = r.stageExe.Close()
		}
		r.closed.Store(true)
		r.closeShared()
		if r.shimCopy != "" {
			_ = os.Remove(r.shimCopy)
		}
	})
	return nil
}

// WaitPrestarted waits until every tool with pre-started sandboxes has as
// many ready as its config says, or its last pre-start failed (a tool
// whose program is missing never has any; Stats counts the failures). It
// returns ctx's error when ctx ends first, and an error once the Runner is
// closed.
func (r *Runner) WaitPrestarted(ctx context.Context) error {
	for id, p := range r.pools {
		for {
			n, changed, closed, failing := p.state()
			if closed {
				return errors.New("sandbox: the runner is closed")
			}
			if n >= p.want || failing {
				break
			}
			select {
			case <-changed:
			case <-ctx.Done():
				return fmt.Errorf("tool %q: %d of %d pre-started sandboxes ready: %w", id, n, p.want, ctx.Err())
			}
		}
	}
	return nil
}

// Stats returns what the runner did with its subprocess calls so far.
func (r *Runner) Stats() Stats {
	return Stats{
		Prestarted:       r.stats.prestarted.Load(),
		Fresh:            r.stats.fresh.Load(),
		DiedBeforeUse:    r.stats.diedBeforeUse.Load(),
		PrestartFailures: r.stats.prestartFailures.Load(),
		StageLimits:      r.stats.stageLimits.Load(),
		StageChild:       r.stats.stageChild.Load(),
		StageAlone:       r.stats.stageAlone.Load(),
		DirectLimits:     r.stats.directLimits.Load(),
	}
}

func (r *Runner) findPrlimit() error {
	p, err := exec.LookPath("prlimit")
	if err != nil {
		return ErrNoPrlimit
	}
	if r.prlimit, err = filepath.Abs(p); err != nil {
		return fmt.Errorf("%w: %v", ErrNoPrlimit, err)
	}
	return nil
}

// Config returns the runner's config, with every default applied.
func (r *Runner) Config() Config { return r.cfg.WithDefaults() }

// Warning returns what a worker must say loudly at start, or "" when its
// tools are isolated: with isolation none, everything that is not.
func (r *Runner) Warning() string { return r.warning }

func (r *Runner) hasSubprocessTools() bool {
	for _, t := range r.cfg.Tools {
		if !t.IsBuiltin() {
			return true
		}
	}
	return false
}

// findBubblewrap locates bwrap, learns which optional flags it has and
// runs one trial sandbox.
func (r *Runner) findBubblewrap() error {
	p, err := exec.LookPath("bwrap")
	if err != nil {
		return ErrNoBubblewrap
	}
	if r.bwrap, err = filepath.Abs(p); err != nil {
		return fmt.Errorf("%w: %v", ErrNoBubblewrap, err)
	}
	if err := r.findPrlimit(); err != nil {
		return err
	}
	// bwrap sets PWD; env (coreutils) takes it out again.
	if p, err = exec.LookPath("env"); err == nil {
		r.env, err = filepath.Abs(p)
	}
	if err != nil {
		return fmt.Errorf("%w: env (coreutils) is not on PATH", ErrBubblewrapBroken)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	help, _ := exec.CommandContext(ctx, r.bwrap, "--help").CombinedOutput()
	r.disableUserns = strings.Contains(string(help), "--disable-userns")
	r.tmpfsSize = strings.Contains(string(help), "--size")
	trial := ToolConfig{ID: "trial", Command: []string{"/bin/true"}, Timeout: 10 * time.Second}
	res := r.runProcess(ctx, trial.withDefaults(), Call{ToolID: "trial", CallID: "trial", OperationID: "trial/0/trial", Attempt: 1})
	if res.Err != nil {
		return fmt.Errorf("%w: a trial run of /bin/true failed: %s", ErrBubblewrapBroken, res.Err.Message)
	}
	return nil
}

// withDefaults applies the tool defaults to one tool.
func (t ToolConfig) withDefaults() ToolConfig {
	return Config{Tools: []ToolConfig{t}}.WithDefaults().Tools[0]
}

func noneWarning(root bool) string {
	var b strings.Builder
	b.WriteString("isolation: none: subprocess tools run WITHOUT a sandbox, as plain child processes of this worker. NOT isolated: ")
	b.WriteString("the filesystem (a tool reads and writes whatever this worker's user can; its working directory is only a starting point), ")
	b.WriteString("the network (tools reach everything this machine reaches, whatever limits.network says), ")
	b.WriteString("processes (tools see and can signal this worker's processes, and a process that leaves its process group survives the call), ")
	b.WriteString("IPC and mounts (limits.mounts are not needed and not enforced)")
	if root {
		b.WriteString("; and this worker runs as ROOT, so tools run as root: max_procs is not enforced and a tool can raise or drop every limit")
	}
	b.WriteString(". Still applied: the scrubbed environment, the timeout with the process-group kill, the output caps, and the rlimits. Use isolation: bubblewrap for untrusted tools.")
	return b.String()
}

// Run runs one call and returns its result. It never panics and never
// returns a Go error: every failure is a Result with Err. The steps:
//
//  1. Find the tool; a tool this worker does not serve is an error.
//  2. A builtin runs in-process under the tool's timeout.
//  3. A subprocess tool: resolve its program (a missing program is an
//     error, nothing runs), create a fresh working directory, start the
//     sandbox with the arguments on stdin and the exact environment, read
//     stdout (capped) and the tail of stderr.
//  4. On the timeout, ctx's end or too much stdout, kill the whole sandbox
//     (its PID namespace, or its process group without bubblewrap).
//  5. Wait until it has exited, remove the working directory, and turn the
//     exit status and stdout into the result.
func (r *Runner) Run(ctx context.Context, call Call) (res Result) {
	defer func() {
		if p := recover(); p != nil {
			res = failure(events.ErrorExecution, "internal error in the sandbox runner: %v", p)
		}
	}()
	t, ok := r.cfg.Tool(call.ToolID)
	if !ok {
		return failure(events.ErrorExecution, "tool %q is not served by this worker", call.ToolID)
	}
	t = t.withDefaults()
	if t.IsBuiltin() {
		return r.runBuiltin(ctx, t, call)
	}
	return r.runProcess(ctx, t, call)
}

// failure returns a Result holding a tool error.
func failure(kind events.ErrorKind, format string, args ...any) Result {
	return Result{Err: &events.ToolError{Kind: kind, Message: fmt.Sprintf(format, args...)}}
}

// success returns a Result holding an output.
func success(o events.Output) Result { return Result{Output: &o} }

// runBuiltin runs a trusted in-process tool under the tool's timeout.
func (r *Runner) runBuiltin(ctx context.Context, t ToolConfig, call Call) Result {
	switch t.Builtin {
	case BuiltinNoop:
		return success(events.Output{CallID: call.CallID})
	case BuiltinEcho:
		text := string(call.Arguments)
		if len(call.Arguments) == 0 {
			text = "{}"
		}
		return success(events.TextOutput(call.CallID, text))
	case BuiltinSleep:
		var a struct {
			Duration string `json:"duration"`
		}
		if len(call.Arguments) > 0 {
			if err := json.Unmarshal(call.Arguments, &a); err != nil {
				return failure(events.ErrorInvalidArguments, "%v", err)
			}
		}
		d, err := time.ParseDuration(a.Duration)
		if err != nil || d < 0 {
			return failure(events.ErrorInvalidArguments, "duration %q is not a Go duration", a.Duration)
		}
		timer := time.NewTimer(d)
		defer timer.Stop()
		deadline := time.NewTimer(t.Timeout)
		defer deadline.Stop()
		select {
		case <-timer.C:
			return success(events.TextOutput(call.CallID, "slept "+d.String()))
		case <-deadline.C:
			return failure(events.ErrorExecution, "timed out after %s", t.Timeout).as(ExitTimeout)
		case <-ctx.Done():
			return failure(events.ErrorExecution, "interrupted: %v", context.Cause(ctx)).as(ExitKilled)
		}
	default:
		return failure(events.ErrorExecution, "builtin %q does not exist", t.Builtin)
	}
}

// closeInheritedOnExec marks every open file descriptor above 2
// close-on-exec.
func closeInheritedOnExec() error {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return fmt.Errorf("cannot list this process's open files: %w", err)
	}
	for _, e := range entries {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			syscall.CloseOnExec(fd)
		}
	}
	return nil
}
