package sandbox

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"
)

// The stage is the first process of a pre-started sandbox: the program
// that built the Runner, re-executed inside bubblewrap (as
// /proc/self/fd/<stageExeFD>, so that it needs no path the sandbox user can
// reach). It tells the worker it is waiting, reads the call's environment
// from the control pipe, says it goes on, and execs the same prlimit
// command line a sandbox started for the call would run. Its file
// descriptors, as the worker passes them to bubblewrap:
const (
	// stageControlFD is the read end of the control pipe: the call's whole
	// environment, NUL-separated KEY=VALUE entries, then end of file.
	stageControlFD = 4
	// stageStatusFD is the write end of the status pipe: one stageWaiting
	// byte once the sandbox is up, one stageGo (or stageGoDirect) byte once
	// the environment has been read, just before the exec.
	stageStatusFD = 5
	// stageExeFD is the stage program itself, opened by the worker.
	stageExeFD = 6
	// stageStdoutFD and stageStderrFD are the write ends of the call's
	// stdout and stderr pipes: the tool's fds 1 and 2. Only the tool (and
	// what it starts) holds them, so that their end of file comes when it
	// exits, not when bubblewrap's init (which holds the stage's own stdio)
	// does.
	stageStdoutFD = 7
	stageStderrFD = 8
)

// stageArg, as argv[1], marks a process as a stage. Tests use two more,
// to run the paths of a stage that cannot start the tool as its child:
// stageArgInPlace always execs it in place; stageArgChildFails starts it,
// then takes it for a child it could not set the limits of (it kills it,
// stopped at its exec, and execs the tool in place).
const (
	stageArg           = "toolbatch-sandbox-stage"
	stageArgInPlace    = "toolbatch-sandbox-stage-in-place"
	stageArgChildFails = "toolbatch-sandbox-stage-child-fails"
)

// isStage reports whether args are a stage's.
func isStage(args []string) bool {
	return len(args) >= 3 && (args[1] == stageArg || args[1] == stageArgInPlace || args[1] == stageArgChildFails)
}

// Status bytes of the stage. After stageParent come a stageGoDirect or a
// stageGo (the stage could not start the tool as its child and execs it
// in place, nothing of it having run), or, once the tool has exited,
// stageExited and its wait status (4 bytes, little endian).
const (
	stageWaiting  byte = 'R'
	stageGo       byte = 'G' // execs the command line as given (prlimit)
	stageGoDirect byte = 'D' // sets the rlimits itself and execs the tool
	stageParent   byte = 'P' // starts the tool as its child, sets its rlimits while it is stopped at its exec, and reports its exit
	stageExited   byte = 'X'
	// stageExitedAlone is stageExited when, once the tool had exited, the
	// sandbox's PID namespace held no process but its init and the stage:
	// nothing the tool started runs on.
	stageExitedAlone byte = 'A'
)

// stageExitNoCall is the stage's exit status when the worker closed the
// control pipe without a call (a pre-started sandbox torn down unused);
// stageExitBroken when it could not talk to the worker; stageExitExec when
// the exec of the tool's command line failed.
const (
	stageExitNoCall = 0
	stageExitBroken = 125
	stageExitExec   = 127
)

// stageSigmask is the signal mask the stage was started with (what
// bubblewrap gives its command), read while package initialisation runs
// on the main thread. The Go runtime blocks signals on some of its
// threads; the tool gets this mask back, as it would without the stage.
var stageSigmask uint64

func init() {
	if isStage(os.Args) {
		_, _, _ = syscall.RawSyscall6(syscall.SYS_RT_SIGPROCMASK, 0 /* SIG_BLOCK */, 0, uintptr(unsafe.Pointer(&stageSigmask)), 8, 0, 0)
	}
}

// StageMain runs the pre-started sandbox stage and does not return when the
// process was started as one (by a Runner with pre-started sandboxes); it
// returns at once otherwise. Every program that builds a Runner whose config
// pre-starts sandboxes (the default with isolation bubblewrap) calls it
// first thing in main, or in TestMain for tests: the stage is that program
// re-executed. NewRunner checks it with a trial sandbox and returns
// ErrPrestartBroken when the program does not.
func StageMain() {
	if !isStage(os.Args) {
		return
	}
	os.Exit(runStage(os.Args[2:], os.Args[1]))
}

// runStage waits for the call's environment, then runs argv with it: as
// its child when it can (runChild), else by exec'ing it in place. variant
// is the stage's argv[1]. It returns the stage's exit status.
func runStage(argv []string, variant string) int {
	// Not dumpable: the tool (same user) can neither read the stage's
	// /proc files (its fds, among them the worker's program) nor ptrace
	// it. The tool is dumpable again from its own exec.
	if _, _, e := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_DUMPABLE, 0, 0); e != 0 {
		return stageExitBroken
	}
	for _, fd := range []int{stageControlFD, stageStatusFD, stageExeFD, stageStdoutFD, stageStderrFD} {
		syscall.CloseOnExec(fd)
	}
	if err := writeStatus(stageWaiting); err != nil {
		return stageExitBroken
	}
	msg, err := readControl()
	if err != nil {
		return stageExitBroken
	}
	if len(msg) == 0 {
		return stageExitNoCall
	}
	env := decodeEnv(msg)
	// Setting prlimit's rlimits here saves its exec on the call's path.
	d, direct := planDirectExec(argv, env)
	if direct && variant != stageArgInPlace {
		if code, ran := runChild(d, env, variant == stageArgChildFails); ran {
			return code
		}
	}
	// In place: the tool's stdout and stderr are the call's pipes.
	for to, from := range map[int]int{1: stageStdoutFD, 2: stageStderrFD} {
		if err := syscall.Dup3(from, to, 0); err != nil {
			fmt.Fprintf(os.Stderr, "toolbatch sandbox stage: cannot hand the tool the call's output: %v\n", err)
			return stageExitBroken
		}
	}
	status := stageGo
	if direct {
		status = stageGoDirect
	}
	if err := writeStatus(status); err != nil {
		return stageExitBroken
	}
	// The exec happens on this thread: give it the mask the stage started
	// with.
	runtime.LockOSThread()
	if _, _, e := syscall.RawSyscall6(syscall.SYS_RT_SIGPROCMASK, 2 /* SIG_SETMASK */, uintptr(unsafe.Pointer(&stageSigmask)), 0, 8, 0, 0); e != 0 {
		fmt.Fprintf(os.Stderr, "toolbatch sandbox stage: cannot set the signal mask: %v\n", e)
		return stageExitExec
	}
	if direct {
		err = d.exec()
		fmt.Fprintf(os.Stderr, "toolbatch sandbox stage: cannot exec %s: %v\n", d.argv[0], err)
		return stageExitExec
	}
	err = syscall.Exec(argv[0], argv, env)
	fmt.Fprintf(os.Stderr, "toolbatch sandbox stage: cannot exec %s: %v\n", argv[0], err)
	return stageExitExec
}

// runChild starts the tool as the stage's child, with the call's stdout
// and stderr, stopped at its exec (ptrace) until its rlimits are set, and
// writes its wait status on the status pipe once it has exited: the worker
// then has the call's end without waiting for the stage, bubblewrap's init
// and bubblewrap to exit in turn, and the exec is a vfork's, without
// ending the stage's threads and dropping its address space. ran is false
// when the tool could not be started so (no ptrace here, say): nothing of
// it ran, and the stage execs it in place.
func runChild(d directExec, env []string, failLimits bool) (code int, ran bool) {
	if err := writeStatus(stageParent); err != nil {
		return stageExitBroken, true
	}
	// The tracer is this thread: fork, wait and detach on it.
	runtime.LockOSThread()
	// The tool leads a session of its own, as it does when it is
	// bubblewrap's first process: a signal to its process group (kill 0)
	// does not reach the stage.
	pid, err := syscall.ForkExec(d.argv[0], d.argv, &syscall.ProcAttr{Env: env,
		Files: []uintptr{0, stageStdoutFD, stageStderrFD}, Sys: &syscall.SysProcAttr{Setsid: true, Ptrace: true}})
	if err != nil {
		return 0, false
	}
	if err := d.limitChild(pid, failLimits); err != nil {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		_, _ = wait(pid)
		return 0, false
	}
	// The tool holds the call's output now; end of file comes with it.
	_ = syscall.Close(stageStdoutFD)
	_ = syscall.Close(stageStderrFD)
	ws, err := wait(pid)
	if err != nil {
		return stageExitBroken, true
	}
	b := []byte{stageExited, 0, 0, 0, 0}
	if alone() {
		b[0] = stageExitedAlone
	}
	binary.LittleEndian.PutUint32(b[1:], uint32(ws))
	if err := writeStatus(b...); err != nil {
		return stageExitBroken, true
	}
	return 0, true
}

// alone reports whether the stage's PID namespace (the sandbox's /proc)
// holds no process but its init (pid 1) and the stage. It is asked once
// the tool has exited and been reaped: a process the tool started is then
// in the namespace (a nested one's processes too), so none was left
// running. Anything it cannot read counts as not alone.
func alone() bool {
	f, err := os.Open("/proc")
	if err != nil {
		return false
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return false
	}
	self := syscall.Getpid()
	for _, n := range names {
		if pid, err := strconv.Atoi(n); err == nil && pid != 1 && pid != self {
			return false
		}
	}
	return true
}

// limitChild sets the rlimits on the child stopped at its exec (the new
// program loaded, not one instruction of it run), then lets it go. fail
// makes it fail there instead (tests).
func (d *directExec) limitChild(pid int, fail bool) error {
	return stoppedAtExec(pid, fail, d.setLimits)
}

// stoppedAtExec waits for a traced child to stop at its exec, has limit
// set its rlimits, then detaches from it, which lets it run. fail makes it
// fail there instead (tests). It runs on the thread that started the
// child (its tracer).
func stoppedAtExec(pid int, fail bool, limit func(pid int) error) error {
	ws, err := wait(pid)
	switch {
	case err != nil:
		return err
	case !ws.Stopped() || ws.StopSignal() != syscall.SIGTRAP:
		return fmt.Errorf("the tool did not stop at its exec (status %#x)", uint32(ws))
	case fail:
		return errors.New("failing as asked (tests)")
	}
	if err := limit(pid); err != nil {
		return err
	}
	return syscall.PtraceDetach(pid)
}

// wait waits for a change of the child's state.
func wait(pid int) (syscall.WaitStatus, error) {
	var ws syscall.WaitStatus
	for {
		_, err := syscall.Wait4(pid, &ws, 0, nil)
		if !errors.Is(err, syscall.EINTR) {
			return ws, err
		}
	}
}

// directExec is the stage's own rendering of the prlimit command line the
// worker sends (Runner.limitArgs): the same rlimits, set with prlimit64 on
// the stage itself, then the tool exec'd in place, as prlimit does, with the
// open-files limit bubblewrap gave (the Go runtime raised the stage's own).
// Everything that allocates is done before the first limit is set: once
// the address-space limit is in place the stage only makes raw system
// calls.
type directExec struct {
	argv   []string
	limits []stageLimit
	nofile syscall.Rlimit
	argv0p *byte
	argvp  []*byte
	envp   []*byte
}

type stageLimit struct {
	resource int
	value    syscall.Rlimit
}

// Resources prlimit's flags name (linux, every architecture Go supports
// here).
var prlimitFlags = map[string]int{"--as": 9, "--cpu": 0, "--nproc": 6, "--fsize": 1, "--core": 4}

// parsePrlimit reads "prlimit --X=soft[:hard]... -- /prog args..." (the
// flags Runner.limitArgs writes); ok is false for anything else.
func parsePrlimit(argv []string) (limits []stageLimit, tool []string, ok bool) {
	if len(argv) < 3 || !strings.HasSuffix(argv[0], "/prlimit") {
		return nil, nil, false
	}
	i := 1
	for ; i < len(argv) && argv[i] != "--"; i++ {
		name, val, found := strings.Cut(argv[i], "=")
		res, known := prlimitFlags[name]
		if !found || !known {
			return nil, nil, false
		}
		softS, hardS, two := strings.Cut(val, ":")
		if !two {
			hardS = softS
		}
		soft, err1 := strconv.ParseUint(softS, 10, 64)
		hard, err2 := strconv.ParseUint(hardS, 10, 64)
		if err1 != nil || err2 != nil || soft > hard {
			return nil, nil, false
		}
		limits = append(limits, stageLimit{res, syscall.Rlimit{Cur: soft, Max: hard}})
	}
	if i+1 >= len(argv) || !strings.HasPrefix(argv[i+1], "/") {
		return nil, nil, false
	}
	return limits, argv[i+1:], true
}

// planDirectExec prepares the exec of a prlimit command line by the stage
// itself; ok is false when it cannot (the stage then execs prlimit).
func planDirectExec(argv, env []string) (d directExec, ok bool) {
	if d.limits, d.argv, ok = parsePrlimit(argv); !ok {
		return d, false
	}
	// bubblewrap's init (pid 1 here) has the open-files limit the tool
	// gets without a stage.
	if _, _, e := syscall.RawSyscall6(syscall.SYS_PRLIMIT64, 1, syscall.RLIMIT_NOFILE, 0, uintptr(unsafe.Pointer(&d.nofile)), 0, 0); e != 0 {
		return d, false
	}
	var err error
	if d.argv0p, err = syscall.BytePtrFromString(d.argv[0]); err != nil {
		return d, false
	}
	if d.argvp, err = syscall.SlicePtrFromStrings(d.argv); err != nil {
		return d, false
	}
	if d.envp, err = syscall.SlicePtrFromStrings(env); err != nil {
		return d, false
	}
	return d, true
}

// setLimits sets the open-files limit and the command line's rlimits on
// process pid (0: the stage itself), with raw system calls only.
func (d *directExec) setLimits(pid int) error {
	if err := setRlimit(pid, syscall.RLIMIT_NOFILE, &d.nofile); err != nil {
		return err
	}
	return setRlimits(pid, d.limits)
}

// setRlimits sets limits on process pid (0: this one), with raw system
// calls only.
func setRlimits(pid int, limits []stageLimit) error {
	for i := range limits {
		if err := setRlimit(pid, limits[i].resource, &limits[i].value); err != nil {
			return err
		}
	}
	return nil
}

func setRlimit(pid, res int, l *syscall.Rlimit) error {
	if _, _, e := syscall.RawSyscall6(syscall.SYS_PRLIMIT64, uintptr(pid), uintptr(res), uintptr(unsafe.Pointer(l)), 0, 0, 0); e != 0 {
		return e
	}
	return nil
}

// exec sets the limits on the stage and execs the tool; it returns only on
// failure.
func (d *directExec) exec() error {
	if err := d.setLimits(0); err != nil {
		return err
	}
	_, _, e := syscall.RawSyscall(syscall.SYS_EXECVE, uintptr(unsafe.Pointer(d.argv0p)),
		uintptr(unsafe.Pointer(&d.argvp[0])), uintptr(unsafe.Pointer(&d.envp[0])))
	return e
}

// writeStatus writes status bytes to the worker, at once (a pipe takes
// a write of this size whole).
func writeStatus(b ...byte) error {
	for {
		n, err := syscall.Write(stageStatusFD, b)
		switch {
		case errors.Is(err, syscall.EINTR):
			continue
		case err != nil:
			return err
		case n != len(b):
			return errors.New("short write")
		}
		return nil
	}
}

// readControl reads the control pipe to its end. Raw reads keep the pipe
// out of the Go runtime's poller.
func readControl() ([]byte, error) {
	var msg []byte
	buf := make([]byte, 16<<10)
	for {
		n, err := syscall.Read(stageControlFD, buf)
		switch {
		case errors.Is(err, syscall.EINTR):
			continue
		case err != nil:
			return nil, err
		case n == 0:
			return msg, nil
		}
		msg = append(msg, buf[:n]...)
	}
}

// encodeEnv and decodeEnv are the control message: the environment's
// entries, each followed by a NUL (an entry cannot hold one).
func encodeEnv(env []string) []byte {
	var b bytes.Buffer
	for _, e := range env {
		b.WriteString(e)
		b.WriteByte(0)
	}
	return b.Bytes()
}

func decodeEnv(msg []byte) []string {
	var env []string
	for len(msg) > 0 {
		i := bytes.IndexByte(msg, 0)
		if i < 0 {
			i = len(msg)
		}
		env = append(env, string(msg[:i]))
		msg = msg[min(i+1, len(msg)):]
	}
	return env
}
