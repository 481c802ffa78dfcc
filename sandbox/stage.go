package sandbox

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"runtime"
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
	// byte once the sandbox is up, one stageGo byte once the environment
	// has been read, just before the exec.
	stageStatusFD = 5
	// stageExeFD is the stage program itself, opened by the worker.
	stageExeFD = 6
)

// stageArg, as argv[1], marks a process as a stage.
const stageArg = "toolbatch-sandbox-stage"

// Status bytes of the stage.
const (
	stageWaiting byte = 'R'
	stageGo      byte = 'G'
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
	if len(os.Args) >= 3 && os.Args[1] == stageArg {
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
	if len(os.Args) < 3 || os.Args[1] != stageArg {
		return
	}
	os.Exit(runStage(os.Args[2:]))
}

// runStage waits for the call's environment and execs argv with it; it
// returns only when that fails.
func runStage(argv []string) int {
	for _, fd := range []int{stageControlFD, stageStatusFD, stageExeFD} {
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
	if err := writeStatus(stageGo); err != nil {
		return stageExitBroken
	}
	// The exec happens on this thread: give it the mask the stage started
	// with.
	runtime.LockOSThread()
	if _, _, e := syscall.RawSyscall6(syscall.SYS_RT_SIGPROCMASK, 2 /* SIG_SETMASK */, uintptr(unsafe.Pointer(&stageSigmask)), 0, 8, 0, 0); e != 0 {
		fmt.Fprintf(os.Stderr, "toolbatch sandbox stage: cannot set the signal mask: %v\n", e)
		return stageExitExec
	}
	err = syscall.Exec(argv[0], argv, env)
	fmt.Fprintf(os.Stderr, "toolbatch sandbox stage: cannot exec %s: %v\n", argv[0], err)
	return stageExitExec
}

// writeStatus writes one status byte to the worker.
func writeStatus(b byte) error {
	for {
		n, err := syscall.Write(stageStatusFD, []byte{b})
		switch {
		case errors.Is(err, syscall.EINTR):
			continue
		case err != nil:
			return err
		case n != 1:
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
