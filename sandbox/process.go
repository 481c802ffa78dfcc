package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/toolbatch/toolbatch/events"
	"golang.org/x/sys/unix"
)

// Grace periods of the kill path. They bound waits for the kernel, not for
// the tool: a killed sandbox is normally gone in microseconds.
const (
	// killGrace is how long the runner waits for bubblewrap to exit after
	// killing the sandbox's init process, before it kills bubblewrap too.
	killGrace = 2 * time.Second
	// pipeGrace is how long stdout and stderr may stay open after the tool
	// has exited (held by a process that escaped the kill, possible only
	// without bubblewrap) before the runner stops reading them.
	pipeGrace = 2 * time.Second
)

// Causes that end a call early.
var (
	errTimedOut       = errors.New("sandbox: timed out")
	errOutputExceeded = errors.New("sandbox: output exceeded")
)

// outcome is what one subprocess run left behind.
type outcome struct {
	startErr   error
	state      *os.ProcessState    // the process's exit, when the call ended with it
	exit       *syscall.WaitStatus // the tool's exit as its parent in the sandbox reported it
	alone      bool                // and nothing else of the tool ran on (stageExitedAlone)
	stdout     []byte
	stdoutOver bool
	stderr     []byte // the tail
	stderrCut  bool   // stderr was longer than the tail
	timedOut   bool
	cancelled  error // ctx ended first: its cause
}

// runProcess runs a subprocess tool: in a pre-started sandbox when one is
// ready (or being started) for the tool and still alive, else in a sandbox
// started for the call.
func (r *Runner) runProcess(ctx context.Context, t ToolConfig, call Call) Result {
	r.callActivity()
	defer r.callActivity()
	if t.MCP.shared() {
		return r.sharedFor(t).call(ctx, t, call)
	}
	prog, err := resolveProgram(t.Command[0])
	if err != nil {
		return failure(events.ErrorExecution, "%v", err)
	}
	stdin := call.Arguments
	if len(stdin) == 0 {
		stdin = []byte("{}")
	}
	if p := r.pools[t.ID]; p != nil {
		if res, ok := p.run(ctx, t, call, prog, stdin); ok {
			r.stats.prestarted.Add(1)
			return res
		}
	}
	r.stats.fresh.Add(1)
	workdir, err := r.newWorkdir(t.ID)
	if err != nil {
		return failure(events.ErrorExecution, "cannot create the working directory: %v", err)
	}
	defer removeWorkdir(workdir)

	env := toolEnv(t, call, workdir)
	p := r.startDirect(t, prog, env, workdir)
	if p == nil {
		if p, err = r.start(t.ID, r.argv(t, workdir, prog), env, workdir, nil); err != nil {
			return interpret(t, call, outcome{startErr: err})
		}
	}
	return interpret(t, call, r.finish(ctx, t, p, stdin, ioOf(p)))
}

// startDirect starts a call's process without isolation under the
// rlimits prlimit would set (the same command line, read back:
// parsePrlimit), set by the runner itself: the tool is started traced,
// stops at its exec before its first instruction, gets its limits with
// prlimit64 and is let go. That saves prlimit's exec on every call. It
// returns nil when that does not apply (bubblewrap, an MCP tool) or does
// not work: this machine does not let a process trace its child, or the
// limits could not be set (the tool is then killed before it ran). The
// call then execs prlimit in front of the tool, as without it.
func (r *Runner) startDirect(t ToolConfig, prog string, env []string, workdir string) *proc {
	if r.cfg.Isolation != IsolationNone || t.MCP != nil || r.noTrace.Load() {
		return nil
	}
	limits, argv, ok := parsePrlimit(r.limitArgs(t, prog))
	if !ok {
		return nil
	}
	// The tracer is this thread: start, wait and detach on it.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	p, err := r.startWith(t.ID, argv, env, workdir, nil, true)
	if err != nil {
		// PTRACE_TRACEME refused (EPERM), or the exec failed, which the
		// prlimit path reports.
		if errors.Is(err, syscall.EPERM) {
			r.noTrace.Store(true)
		}
		return nil
	}
	if err := stoppedAtExec(p.cmd.Process.Pid, false, func(pid int) error { return setRlimits(pid, limits) }); err != nil {
		_ = syscall.Kill(-p.pgid, syscall.SIGKILL)
		p.wait()
		p.reap()
		return nil
	}
	r.stats.directLimits.Add(1)
	p.wait()
	return p
}

// argv is the command line of a sandbox started for its process: bubblewrap
// with an empty environment (bubblewrap isolation), then the rlimits and
// the tool's program.
func (r *Runner) argv(t ToolConfig, workdir, prog string) []string {
	var argv []string
	if r.cfg.Isolation == IsolationBubblewrap {
		argv = append(r.bwrapArgs(t, workdir, 0), r.env, "-u", "PWD", "--")
	}
	return append(argv, r.limitArgs(t, prog)...)
}

// toolEnv returns the tool's whole environment: nothing of the worker's.
func toolEnv(t ToolConfig, call Call, workdir string) []string {
	env := []string{
		"PATH=" + ToolPATH,
		"HOME=" + workdir,
		"LANG=C.UTF-8",
		"TOOLBATCH_OPERATION_ID=" + call.OperationID,
		"TOOLBATCH_ATTEMPT=" + strconv.Itoa(call.Attempt),
		"TOOLBATCH_CALL_ID=" + call.CallID,
	}
	if call.TraceParent != "" {
		env = append(env, EnvTraceParent+"="+call.TraceParent)
	}
	for _, k := range sortedKeys(t.Env) {
		env = append(env, k+"="+t.Env[k])
	}
	return env
}

// checkPrograms refuses, before anything starts, a subprocess tool whose
// program does not exist here, and (isolation bubblewrap) a program or an
// argument naming an existing file that the sandbox hides: it replaces
// /tmp, /dev/shm and the work root with empty file systems, so such a file
// is seen only when it is one of the tool's mounts.
func (r *Runner) checkPrograms() error {
	for _, t := range r.cfg.Tools {
		if t.IsBuiltin() {
			continue
		}
		prog, err := resolveProgram(t.Command[0])
		if err != nil {
			return fmt.Errorf("sandbox: tool %q: %v", t.ID, err)
		}
		if r.cfg.Isolation != IsolationBubblewrap {
			continue
		}
		paths := []string{prog}
		for _, a := range t.Command[1:] {
			if filepath.IsAbs(a) {
				if _, err := os.Stat(a); err == nil {
					paths = append(paths, a)
				}
			}
		}
		for _, p := range paths {
			if hidden := r.hiddenBy(t, p); hidden != "" {
				return fmt.Errorf("sandbox: tool %q: %s is under %s, which the sandbox replaces with an empty directory: add it (or its directory) to the tool's mounts, or keep it elsewhere", t.ID, p, hidden)
			}
		}
	}
	return nil
}

// hiddenBy returns the directory of the sandbox that hides path from tool
// t ("" when the tool sees it).
func (r *Runner) hiddenBy(t ToolConfig, path string) string {
	for _, m := range t.Mounts {
		if under(path, m.Path) {
			return ""
		}
	}
	for _, dir := range []string{"/tmp", "/dev/shm", r.workRoot} {
		if under(path, dir) {
			return dir
		}
	}
	return ""
}

// resolveProgram returns the absolute path of a tool's program, looking a
// bare name up in ToolPATH.
func resolveProgram(p string) (string, error) {
	check := func(path string) error {
		fi, err := os.Stat(path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return fmt.Errorf("program %s does not exist", path)
		case err != nil:
			return fmt.Errorf("program %s: %v", path, errors.Unwrap(err))
		case !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0:
			return fmt.Errorf("program %s is not an executable file", path)
		}
		return nil
	}
	switch {
	case filepath.IsAbs(p):
		if err := check(p); err != nil {
			return "", err
		}
		return p, nil
	case strings.Contains(p, "/"):
		return "", fmt.Errorf("program %q is a relative path (LoadConfig resolves it against the config file's directory; a Config built in Go needs an absolute path)", p)
	}
	for _, dir := range filepath.SplitList(ToolPATH) {
		path := filepath.Join(dir, p)
		if check(path) == nil {
			return path, nil
		}
	}
	return "", fmt.Errorf("program %q not found in PATH %s", p, ToolPATH)
}

// newWorkdir creates a call's fresh, empty working directory, owned by the
// tool's user.
func (r *Runner) newWorkdir(toolID string) (string, error) {
	dir, err := os.MkdirTemp(r.workRoot, "toolbatch-call-")
	if err != nil {
		return "", err
	}
	if r.dropUser && r.cfg.Isolation == IsolationBubblewrap {
		uid, gid := r.userOf(toolID)
		if err := os.Chown(dir, uid, gid); err != nil {
			_ = os.Remove(dir)
			return "", err
		}
	}
	return dir, nil
}

// removeWorkdir removes a call's working directory, making the
// directories a tool locked (chmod 0) writable again first if it must.
func removeWorkdir(dir string) {
	if os.RemoveAll(dir) == nil {
		return
	}
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if d != nil && d.IsDir() {
			_ = os.Chmod(p, 0o700)
		}
		return nil
	})
	_ = os.RemoveAll(dir)
}

// under reports whether path is dir or inside it.
func under(path, dir string) bool {
	return path == dir || strings.HasPrefix(path, strings.TrimSuffix(dir, "/")+"/")
}

// limitArgs returns prlimit with the call's rlimits, then the tool: what
// runs inside the sandbox (or, with isolation none, alone).
func (r *Runner) limitArgs(t ToolConfig, prog string) []string {
	l := t.Limits
	mem := int64(l.MemoryMB) << 20
	fsize := max(int64(l.OutputKB)<<10, mem)
	cpu := fmt.Sprintf("--cpu=%d:%d", l.CPUSeconds, l.CPUSeconds+1)
	if t.MCP.shared() {
		// A long-lived server's CPU time adds up over every call: its
		// calls are bounded by their timeouts instead.
		cpu = "--cpu=unlimited"
	}
	a := []string{r.prlimit,
		"--as=" + strconv.FormatInt(mem, 10),
		cpu,
		"--nproc=" + strconv.Itoa(l.MaxProcs),
		"--fsize=" + strconv.FormatInt(fsize, 10),
		"--core=0",
		"--", prog}
	a = append(a, t.Command[1:]...)
	switch {
	case t.MCP.shared():
		// This program's MCP client of a shared server, serving calls.
		a = append([]string{r.shimPath(), mcpServeArg, fmt.Sprintf("--max-bytes=%d", t.Limits.OutputKB<<10), "--"}, a...)
	case t.MCP != nil:
		// The call is this program's MCP client (trusted, outside the
		// rlimits), which runs the server under them.
		a = append([]string{r.shimPath(), mcpCallArg, t.MCP.Tool, "--"}, a...)
	}
	return a
}

// bwrapArgs returns bubblewrap and its flags for one call; the command
// follows them. extra is how many files start passes bubblewrap after its
// info pipe; the seccomp filter's pipe comes after them, then the tool's
// pinned mounts (start passes them in that order).
func (r *Runner) bwrapArgs(t ToolConfig, workdir string, extra int) []string {
	a := []string{r.bwrap, "--unshare-user"}
	if r.disableUserns {
		a = append(a, "--disable-userns")
	}
	a = append(a, "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--hostname", "toolbatch-sandbox")
	if !t.Limits.Network {
		a = append(a, "--unshare-net")
	}
	a = append(a, "--die-with-parent", "--new-session",
		"--ro-bind", "/", "/",
		"--proc", "/proc",
		"--dev", "/dev")
	// The writable memory file systems, /tmp and /dev/shm, get half the
	// tool's memory limit each, so that together they hold no more than
	// the limit; /dev itself (a tmpfs without a size) is made read-only
	// (its device nodes stay usable).
	half := strconv.FormatInt(int64(t.Limits.MemoryMB)<<19, 10)
	if r.tmpfsSize {
		a = append(a, "--size", half)
	}
	a = append(a, "--tmpfs", "/dev/shm", "--remount-ro", "/dev")
	if r.tmpfsSize {
		a = append(a, "--size", half)
	}
	a = append(a, "--tmpfs", "/tmp")
	if !under(r.workRoot, "/tmp") {
		// Hide the other calls' working directories.
		a = append(a, "--tmpfs", r.workRoot)
	}
	fd := 4 + extra
	if seccompFilter != nil {
		fd++
	}
	for i, m := range t.Mounts {
		flag := "--ro-bind-fd"
		if m.Writable {
			flag = "--bind-fd"
		}
		a = append(a, flag, strconv.Itoa(fd+i), m.dest())
	}
	a = append(a,
		"--bind", workdir, workdir,
		"--chdir", workdir,
		"--info-fd", "3")
	if seccompFilter != nil {
		a = append(a, "--seccomp", strconv.Itoa(4+extra))
	}
	return append(a, "--")
}

// proc is a started sandbox (or, with isolation none, process group):
// bubblewrap or the command, the worker's ends of its pipes, and its exit.
type proc struct {
	cmd                   *exec.Cmd
	bwrap                 bool
	stdin, stdout, stderr *os.File
	files                 []*os.File // every pipe end of the worker's, closed by release
	// initFD is a pidfd of the sandbox's init process (the host pid
	// bubblewrap reports), -1 when there is none; known once info is
	// closed. A pidfd names that process only, even after it is reaped.
	initFD    int
	info      chan struct{}
	closeInit sync.Once
	released  atomic.Bool
	stopOnce  sync.Once     // stop is made once: a second would signal a closed pidfd's number
	done      chan struct{} // closed once the process has exited and been waited for
	pgid      int
}

// start starts argv (bubblewrap, or prlimit without isolation) for a call
// of toolID in its own process group with fresh pipes for stdin, stdout
// and stderr, and extra as file descriptors 4 and on, then (bubblewrap)
// the seccomp filter's pipe and the tool's pinned mounts (see bwrapArgs).
// It does not wait.
func (r *Runner) start(toolID string, argv, env []string, workdir string, extra []*os.File) (*proc, error) {
	p, err := r.startWith(toolID, argv, env, workdir, extra, false)
	if err == nil {
		p.wait()
	}
	return p, err
}

// startWith is start; traced (isolation none only) starts the process
// traced, stopped at its exec, and the caller, on the same locked thread,
// lets it go and then calls wait.
func (r *Runner) startWith(toolID string, argv, env []string, workdir string, extra []*os.File, traced bool) (*proc, error) {
	p := &proc{bwrap: r.cfg.Isolation == IsolationBubblewrap, done: make(chan struct{}), initFD: -1, info: make(chan struct{})}
	pipe := func() (*os.File, *os.File, error) {
		pr, pw, err := os.Pipe()
		if err == nil {
			p.files = append(p.files, pr, pw)
		}
		return pr, pw, err
	}
	inR, inW, err1 := pipe()
	outR, outW, err2 := pipe()
	errR, errW, err3 := pipe()
	infoR, infoW, err4 := pipe()
	var filterR *os.File
	if p.bwrap && seccompFilter != nil {
		// The seccomp filter, which bubblewrap reads to its end: small
		// enough for the pipe's buffer.
		var filterW *os.File
		var err error
		if filterR, filterW, err = pipe(); err == nil {
			_, err = filterW.Write(seccompFilter)
			_ = filterW.Close()
		}
		err4 = errors.Join(err4, err)
	}
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		p.release()
		return nil, err
	}
	p.stdin, p.stdout, p.stderr = inW, outR, errR

	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, errW
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Ptrace: traced && !p.bwrap}
	if p.bwrap {
		cmd.Dir = "/"
		cmd.ExtraFiles = append([]*os.File{infoW}, extra...)
		if filterR != nil {
			cmd.ExtraFiles = append(cmd.ExtraFiles, filterR)
		}
		cmd.ExtraFiles = append(cmd.ExtraFiles, r.pinned[toolID]...)
		if r.dropUser {
			uid, gid := r.userOf(toolID)
			cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}
		}
	} else {
		cmd.Dir = workdir
		cmd.ExtraFiles = extra
	}
	if err := cmd.Start(); err != nil {
		p.release()
		return nil, err
	}
	p.cmd, p.pgid = cmd, cmd.Process.Pid
	// The child holds its ends now.
	for _, f := range []*os.File{inR, outW, errW, infoW, filterR} {
		if f != nil {
			_ = f.Close()
		}
	}
	// bubblewrap reports the host pid of the sandbox's init process:
	// killing it tears down the whole PID namespace. Its pidfd is taken at
	// once, while bubblewrap, its parent, has not reaped it (it is checked
	// to be bubblewrap's child), so that a kill can never reach another
	// process, however late it comes.
	if p.bwrap {
		go func() {
			defer close(p.info)
			var info struct {
				ChildPID int `json:"child-pid"`
			}
			if json.NewDecoder(infoR).Decode(&info) != nil || info.ChildPID <= 0 {
				return
			}
			fd, err := unix.PidfdOpen(info.ChildPID, 0)
			if err != nil {
				return
			}
			if parentOf(info.ChildPID) != cmd.Process.Pid {
				_ = unix.Close(fd)
				return
			}
			p.initFD = fd
			if p.released.Load() {
				// released while bubblewrap was reporting: close it here
				p.closeInit.Do(func() { _ = unix.Close(fd) })
			}
		}()
	} else {
		close(p.info)
	}
	return p, nil
}

// wait reaps the started process in the background: p.done closes once it
// has exited.
func (p *proc) wait() {
	go func() {
		_ = p.cmd.Wait()
		close(p.done)
	}()
}

// exited reports whether the process has exited.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// release closes the worker's pipe ends (and the init's pidfd, once its
// report is in).
func (p *proc) release() {
	for _, f := range p.files {
		_ = f.Close()
	}
	p.released.Store(true)
	select {
	case <-p.info:
		p.closeInit.Do(func() {
			if p.initFD >= 0 {
				_ = unix.Close(p.initFD)
			}
		})
	default:
	}
}

// killInit kills the sandbox's init process and waits until it has exited:
// the kernel has then killed every process of its PID namespace, whatever
// the tool did (a daemon it left, an init it made outlive bubblewrap). It
// waits at most killGrace for bubblewrap's report of the init, and reports
// whether it signalled it.
func (p *proc) killInit() bool {
	if !p.signalInit() {
		return false
	}
	fds := []unix.PollFd{{Fd: int32(p.initFD), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, int(killGrace/time.Millisecond))
		if !errors.Is(err, unix.EINTR) {
			return err == nil && n > 0 // exited; not within killGrace: the caller goes on
		}
	}
}

// signalInit sends the sandbox's init SIGKILL, waiting at most killGrace
// for bubblewrap's report of it, and reports whether it did.
func (p *proc) signalInit() bool {
	t := time.NewTimer(killGrace)
	defer t.Stop()
	select {
	case <-p.info:
	case <-t.C:
		return false
	}
	if p.initFD < 0 {
		return false
	}
	return unix.PidfdSendSignal(p.initFD, unix.SIGKILL, nil, 0) == nil // else gone already
}

// parentOf returns the parent pid of pid (0 when unknown).
func parentOf(pid int) int {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// pid (comm) state ppid ...: comm may hold spaces and parentheses.
	rest := string(data[strings.LastIndexByte(string(data), ')')+1:])
	fields := strings.Fields(rest)
	if len(fields) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(fields[1])
	return ppid
}

// stop kills the sandbox (see kill), waits until it has exited and
// releases its pipes.
func (p *proc) stop() {
	p.stopOnce.Do(func() {
		p.kill()
		_ = syscall.Kill(-p.pgid, syscall.SIGKILL)
		p.release()
	})
}

// callIO is where a call's output comes from, and how its end is known
// besides the sandbox's (or process group's) exit.
type callIO struct {
	stdout, stderr *os.File
	// exited, when not nil, delivers the tool's wait status as its parent
	// in the sandbox reported it (a pre-started sandbox's stage), and
	// reported is closed once nothing more can come (the report's pipe
	// has ended).
	exited   <-chan stageExit
	reported <-chan struct{}
}

// ioOf is the output of a started process: its own stdout and stderr.
func ioOf(p *proc) callIO { return callIO{stdout: p.stdout, stderr: p.stderr} }

// reap waits until a process that has ended or been killed has exited,
// and releases its pipes. If it is still there after killGrace, its
// process group is killed: it cannot have been reaped, so its id is still
// its own. It signals nothing else: the sandbox's init may be gone, and
// its pid reused.
func (p *proc) reap() {
	t := time.NewTimer(killGrace)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		_ = syscall.Kill(-p.pgid, syscall.SIGKILL)
		<-p.done
	}
	p.release()
}

// finish writes stdin to a started process, waits for the call to end (or
// kills it on the timeout, ctx's end or too much stdout), collects what
// the tool wrote and releases the process's pipes. The call ends when the
// process exits, or when the tool's parent in the sandbox reports its exit
// (cio.exited): then the sandbox is killed at once, and its exit is not
// waited for. The timeout counts from here.
func (r *Runner) finish(ctx context.Context, t ToolConfig, p *proc, stdin []byte, cio callIO) (o outcome) {
	defer p.release()
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	timer := time.AfterFunc(t.Timeout, func() { cancel(errTimedOut) })
	defer timer.Stop()

	go func() {
		_, _ = p.stdin.Write(stdin)
		_ = p.stdin.Close()
	}()
	type captured struct {
		data []byte
		cut  bool
	}
	stdoutc := make(chan captured, 1)
	go func() {
		data, over := readCapped(cio.stdout, t.Limits.OutputKB<<10)
		if over {
			cancel(errOutputExceeded)
		}
		stdoutc <- captured{data, over}
	}()
	stderrc := make(chan captured, 1)
	go func() {
		data, cut := readTail(cio.stderr, StderrTailBytes)
		stderrc <- captured{data, cut}
	}()

	select {
	case <-p.done:
		o.state = p.cmd.ProcessState
		if cio.exited != nil {
			// The sandbox's exit status is its stage's: the tool's is the
			// one the stage reported, if it did (before it exited).
			grace := time.NewTimer(pipeGrace)
			select {
			case <-cio.reported:
			case <-grace.C:
			}
			grace.Stop()
			select {
			case e := <-cio.exited:
				o.exit = &e.ws
			default:
			}
		}
	case e := <-cio.exited:
		o.exit, o.alone = &e.ws, e.alone
		// Whatever the tool left running dies with the sandbox now:
		// bubblewrap's death kills its init (--die-with-parent), and so the
		// whole PID namespace. bubblewrap is signalled through os.Process,
		// which cannot hit another process once it has been reaped; the
		// init's pid could be reused as soon as it has.
		_ = p.cmd.Process.Kill()
	case <-runCtx.Done():
		switch cause := context.Cause(runCtx); {
		case errors.Is(cause, errTimedOut):
			o.timedOut = true
		case errors.Is(cause, errOutputExceeded):
		default:
			o.cancelled = cause
		}
		p.kill()
		o.state = p.cmd.ProcessState
	}
	// Whatever way the call ended, nothing of it runs on: its sandbox's
	// init, and so its PID namespace, is killed before its result is. When
	// the stage found nothing of the tool running after its exit, the init
	// is signalled and its teardown (the namespaces' mounts) not waited
	// for: what is left is the init and the stage, none of the tool's.
	if o.alone {
		p.signalInit()
	} else {
		p.killInit()
	}
	// Anything left in the process group (only possible without
	// bubblewrap): the group outlives its reaped leader only while it has
	// members, so its id cannot have been reused.
	_ = syscall.Kill(-p.pgid, syscall.SIGKILL)
	_ = p.stdin.Close()

	grace := time.NewTimer(pipeGrace)
	defer grace.Stop()
	var out, errs captured
	for got := 0; got < 2; {
		select {
		case out = <-stdoutc:
			got++
		case errs = <-stderrc:
			got++
		case <-grace.C:
			// A process that escaped the kill holds a pipe: stop reading.
			_ = cio.stdout.Close()
			_ = cio.stderr.Close()
		}
	}
	o.stdout, o.stdoutOver = out.data, out.cut
	o.stderr, o.stderrCut = errs.data, errs.cut
	return o
}

// kill ends a running sandbox and waits until its process has exited:
// SIGKILL to the sandbox's init process (the kernel then kills every
// process of its PID namespace and bubblewrap exits), and SIGKILL to the
// whole process group when that is not known or not enough.
func (p *proc) kill() {
	if p.killInit() {
		t := time.NewTimer(killGrace)
		defer t.Stop()
		select {
		case <-p.done:
			return
		case <-t.C:
		}
	}
	_ = syscall.Kill(-p.pgid, syscall.SIGKILL)
	<-p.done
}

// readCapped reads r to its end, keeping at most limit bytes; over reports
// that there was more, and then it stops reading at once.
func readCapped(r io.Reader, limit int) (data []byte, over bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if len(data)+n > limit {
			return append(data, buf[:limit-len(data)]...), true
		}
		data = append(data, buf[:n]...)
		if err != nil {
			return data, false
		}
	}
}

// readTail reads r to its end, keeping the last n bytes; cut reports that
// there were more.
func readTail(r io.Reader, n int) (tail []byte, cut bool) {
	buf := make([]byte, 32<<10)
	for {
		k, err := r.Read(buf)
		tail = append(tail, buf[:k]...)
		if len(tail) > n {
			tail = slices.Clone(tail[len(tail)-n:])
			cut = true
		}
		if err != nil {
			return tail, cut
		}
	}
}
