package sandbox

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/toolbatch/toolbatch/events"
)

// A pre-started sandbox is one call's sandbox, built before the call
// arrives: bubblewrap with the tool's namespaces, mounts and a fresh
// working directory, whose first process (the stage, see StageMain) waits
// for the call's environment and then execs exactly the command line a
// sandbox started for the call runs (prlimit, then the tool). It serves one
// call and is torn down after; the pool starts a replacement at once.
//
// The states of one pre-started sandbox:
//
//	starting ──(stage wrote 'R')──> ready ──(a call takes it)──> running the call ──(bubblewrap exits)──> gone
//	   │                              │                               │
//	   └─(died, or not ready in 10s)  └─(runner closed)               └─ the stage never wrote 'G': nothing of the
//	        gone; retried after           gone                           tool ran; the call takes another sandbox
//	        a backoff                                                    or starts its own

// Settings of pre-starting.
const (
	// prestartTimeout bounds one pre-start: bubblewrap's setup and the
	// stage's start. A sandbox not waiting by then is torn down.
	prestartTimeout = 10 * time.Second
	// prestartBackoffMin and prestartBackoffMax bound the wait before a
	// pre-start is retried after one failed: calls meanwhile start their
	// own sandboxes, which report the problem as their result.
	prestartBackoffMin = 100 * time.Millisecond
	prestartBackoffMax = 30 * time.Second
)

// Stats counts what a Runner did with its subprocess calls.
type Stats struct {
	// Prestarted is how many calls ran in a pre-started sandbox.
	Prestarted int64
	// Fresh is how many calls ran in a sandbox started for them.
	Fresh int64
	// DiedBeforeUse is how many pre-started sandboxes had ended when a
	// call took them; the call then took another one or started its own.
	DiedBeforeUse int64
	// PrestartFailures is how many pre-starts failed (bubblewrap or the
	// stage did not come up).
	PrestartFailures int64
	// StageLimits is how many pre-started calls had their rlimits set by
	// the stage itself, without prlimit's exec.
	StageLimits int64
	// StageChild is how many of those the stage ran as its child and
	// reported the exit of (the others it exec'd in place).
	StageChild int64
	// StageAlone is how many of the calls the stage ran as its child left
	// nothing running once the tool had exited: their results did not
	// wait for the sandbox's teardown.
	StageAlone int64
	// DirectLimits is how many calls without isolation had their rlimits
	// set by the runner on the tool, stopped at its exec, without
	// prlimit's exec.
	DirectLimits int64
}

// warm is a pre-started sandbox.
type warm struct {
	p       *proc
	workdir string
	prog    string   // the program its command line runs
	control *os.File // the worker's end of the control pipe
	status  *os.File // the worker's end of the status pipe
	// stdout and stderr are the worker's ends of the call's output pipes,
	// which only the tool holds in the sandbox (the stage's stdout and
	// stderr are bubblewrap's, in p).
	stdout, stderr *os.File
}

// teardown kills the sandbox, waits until it has exited, and removes its
// working directory.
func (w *warm) teardown() {
	_ = w.control.Close()
	w.p.stop()
	w.release()
	removeWorkdir(w.workdir)
}

// release closes the worker's ends of the sandbox's own pipes.
func (w *warm) release() {
	for _, f := range []*os.File{w.status, w.stdout, w.stderr} {
		_ = f.Close()
	}
}

// pool keeps up to want pre-started sandboxes of one tool. Calls take a
// ready one, or wait for one being started when there are more starts
// under way than calls waiting; otherwise they start their own.
type pool struct {
	r    *Runner
	t    ToolConfig
	want int

	mu       sync.Mutex
	ready    []*warm
	starting int
	waiters  []chan *warm // calls waiting for a start under way; nil: start your own
	closed   bool
	failures int           // consecutive failed pre-starts
	retry    *time.Timer   // a pending retry after a failure
	changed  chan struct{} // closed and replaced when ready or closed changes
	wg       sync.WaitGroup
}

func newPool(r *Runner, t ToolConfig, want int) *pool {
	return &pool{r: r, t: t, want: want, changed: make(chan struct{})}
}

// notify wakes WaitPrestarted; mu is held.
func (p *pool) notify() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// fill starts pre-starts until the ready sandboxes and the starts under
// way, less those promised to waiting calls, make want; mu is held. After
// a failure it waits for the retry timer.
func (p *pool) fill() {
	if p.closed || p.retry != nil {
		return
	}
	for len(p.ready)+p.starting-len(p.waiters) < p.want {
		p.starting++
		p.wg.Add(1)
		go p.prestart()
	}
}

// prestart builds one sandbox and hands it to a waiting call or the ready
// list.
func (p *pool) prestart() {
	defer p.wg.Done()
	began := time.Now()
	w, err := p.r.prestart(p.t)
	if err == nil && p.r.onPrestarted != nil {
		p.r.onPrestarted(time.Since(began))
	}
	if err != nil {
		p.r.stats.prestartFailures.Add(1)
		if p.r.onPrestartFailure != nil {
			p.r.onPrestartFailure(p.t.ID, err)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.starting--
	if err != nil {
		p.failures++
		p.notify()
		// A call waiting for a start that will not come starts its own.
		if len(p.waiters) > p.starting {
			p.waiters[0] <- nil
			p.waiters = p.waiters[1:]
		}
		if !p.closed && p.retry == nil {
			backoff := min(prestartBackoffMin<<min(p.failures-1, 16), prestartBackoffMax)
			p.retry = time.AfterFunc(backoff, func() {
				p.mu.Lock()
				defer p.mu.Unlock()
				p.retry = nil
				p.fill()
			})
		}
		return
	}
	p.failures = 0
	if p.closed {
		p.wg.Add(1)
		go func() { defer p.wg.Done(); w.teardown() }()
		return
	}
	if len(p.waiters) > 0 {
		p.waiters[0] <- w
		p.waiters = p.waiters[1:]
		return
	}
	p.ready = append(p.ready, w)
	p.notify()
}

// take returns a live pre-started sandbox, waiting for one under way if
// that is the case, or nil: the call starts its own. A call that finds
// none ready has the pool filled at once and waits for the first start;
// otherwise what calls take is replaced once the runner is quiet
// (Runner.callActivity), so that starting replacements, several milliseconds
// of CPU each, does not compete with the calls of a batch, which come one
// after another.
func (p *pool) take(ctx context.Context) *warm {
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil
		}
		var w *warm
		var wait chan *warm
		if len(p.ready) > 0 {
			w = p.ready[0]
			p.ready = p.ready[1:]
		} else {
			p.fill()
			if p.starting > len(p.waiters) {
				wait = make(chan *warm, 1)
				p.waiters = append(p.waiters, wait)
			}
		}
		p.mu.Unlock()
		if wait != nil {
			select {
			case w = <-wait:
			case <-ctx.Done():
				p.mu.Lock()
				for i, c := range p.waiters {
					if c == wait {
						p.waiters = append(p.waiters[:i], p.waiters[i+1:]...)
						break
					}
				}
				p.mu.Unlock()
				// A sandbox handed over meanwhile goes back to the pool.
				select {
				case w = <-wait:
				default:
				}
				if w != nil {
					p.putBack(w)
				}
				return nil
			}
		}
		if w == nil {
			return nil
		}
		if !w.p.exited() {
			return w
		}
		p.r.stats.diedBeforeUse.Add(1)
		p.discard(w)
	}
}

// putBack returns an unused sandbox to the ready list.
func (p *pool) putBack(w *warm) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		p.wg.Add(1)
		go func() { defer p.wg.Done(); w.teardown() }()
		return
	}
	p.ready = append(p.ready, w)
	p.notify()
}

// discard tears a sandbox down in the background.
func (p *pool) discard(w *warm) { p.background(w.teardown) }

// background runs f in the background, counted in wg, while the pool is
// open; once it is closed, here (close may be waiting for wg already).
func (p *pool) background(f func()) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		f()
		return
	}
	p.wg.Add(1)
	p.mu.Unlock()
	go func() {
		defer p.wg.Done()
		f()
	}()
}

// run runs the call in a pre-started sandbox. ok is false when there was
// none or it ended before it took the call: the caller then starts a
// sandbox for the call.
//
// The call does not wait for the stage's answer before it goes on: it
// sends the environment and the arguments and waits for the call's end.
// The stage normally starts the tool as its child and reports its exit
// (stageParent, stageExited): the call ends once that report and the end
// of the tool's output have come, and the sandbox is then killed and
// cleaned up in the background. Otherwise it ends when the sandbox does,
// as for a sandbox started for the call. If the stage said neither that it
// starts the tool nor that it execs it, nothing of the tool ran, and the
// call takes another sandbox (or starts its own) unless ctx ended.
func (p *pool) run(ctx context.Context, t ToolConfig, call Call, prog string, stdin []byte) (res Result, ok bool) {
	for {
		w := p.take(ctx)
		if w == nil {
			return Result{}, false
		}
		if w.prog != prog {
			// The program moved since the sandbox was started (PATH lookup).
			p.discard(w)
			continue
		}
		msg := encodeEnv(toolEnv(t, call, w.workdir))
		go func() {
			_, _ = w.control.Write(msg)
			_ = w.control.Close()
		}()
		st := w.watchStatus()
		o := p.r.finish(ctx, t, w.p, stdin, callIO{stdout: w.stdout, stderr: w.stderr, exited: st.exited, reported: st.done})
		// A reported exit says how the tool ran; otherwise the sandbox has
		// ended, and so has what the stage wrote.
		mode := stageParent
		if o.exit == nil {
			<-st.done
			mode = st.mode
		}
		if o.alone {
			p.r.stats.stageAlone.Add(1)
		}
		switch mode {
		case stageGoDirect:
			p.r.stats.stageLimits.Add(1)
		case stageParent:
			p.r.stats.stageLimits.Add(1)
			p.r.stats.stageChild.Add(1)
		}
		p.background(func() {
			w.p.reap() // the sandbox has exited, or been killed
			w.release()
			removeWorkdir(w.workdir)
		})
		if mode == stageParent && o.exit == nil && !o.timedOut && !o.stdoutOver && o.cancelled == nil {
			return failure(events.ErrorExecution, "the sandbox's stage ended without reporting the tool's exit (exit status %d)", exitCode(o.state)), true
		}
		if mode != 0 || o.cancelled != nil {
			return interpret(t, call, o), true
		}
		p.r.stats.diedBeforeUse.Add(1)
	}
}

// stageExit is the stage's report of the tool's exit: its wait status,
// and whether nothing else of the tool was left running (stageExitedAlone).
type stageExit struct {
	ws    syscall.WaitStatus
	alone bool
}

// stageReport is what a sandbox's stage says about a call, as read by
// watchStatus: exited delivers the tool's wait status when the stage ran it
// as its child; done is closed once the status pipe has ended (the stage
// has exited or exec'd), and mode is then the last of stageGo,
// stageGoDirect and stageParent it wrote (0: none, the tool did not run).
type stageReport struct {
	mode   byte
	exited chan stageExit
	done   chan struct{}
}

// watchStatus reads the stage's status pipe until it ends, in the
// background.
func (w *warm) watchStatus() *stageReport {
	st := &stageReport{exited: make(chan stageExit, 1), done: make(chan struct{})}
	go func() {
		defer close(st.done)
		r := bufio.NewReader(w.status)
		for {
			b, err := r.ReadByte()
			if err != nil {
				return
			}
			switch b {
			case stageGo, stageGoDirect, stageParent:
				st.mode = b
			case stageExited, stageExitedAlone:
				// The report ends what the stage says.
				var ws [4]byte
				if _, err := io.ReadFull(r, ws[:]); err == nil && st.mode == stageParent {
					st.exited <- stageExit{ws: syscall.WaitStatus(binary.LittleEndian.Uint32(ws[:])), alone: b == stageExitedAlone}
				}
				return
			}
		}
	}()
	return st
}

// prestart starts one sandbox of the tool and waits until its stage waits
// for a call.
func (r *Runner) prestart(t ToolConfig) (*warm, error) {
	prog, err := resolveProgram(t.Command[0])
	if err != nil {
		return nil, err
	}
	workdir, err := r.newWorkdir(t.ID)
	if err != nil {
		return nil, fmt.Errorf("cannot create the working directory: %w", err)
	}
	// The control and status pipes, and the call's stdout and stderr: the
	// sandbox's ends are its fds 4, 5, 7 and 8 (6 is the stage program).
	var ours, theirs []*os.File
	for i := 0; i < 4; i++ {
		r, w, err := os.Pipe()
		if err != nil {
			for _, f := range append(ours, theirs...) {
				_ = f.Close()
			}
			removeWorkdir(workdir)
			return nil, err
		}
		if i == 0 {
			ours, theirs = append(ours, w), append(theirs, r)
		} else {
			ours, theirs = append(ours, r), append(theirs, w)
		}
	}
	arg := stageArg
	if r.stageVariant != "" {
		arg = r.stageVariant
	}
	extra := []*os.File{theirs[0], theirs[1], r.stageExe, theirs[2], theirs[3]}
	argv := append(r.bwrapArgs(t, workdir, len(extra)), "/proc/self/fd/"+strconv.Itoa(stageExeFD), arg)
	argv = append(argv, r.limitArgs(t, prog)...)
	// bubblewrap gets no environment: the stage's own does not reach the
	// tool, which gets the one the call sends.
	pr, err := r.start(t.ID, argv, []string{}, workdir, extra)
	for _, f := range theirs {
		_ = f.Close()
	}
	if err != nil {
		for _, f := range ours {
			_ = f.Close()
		}
		removeWorkdir(workdir)
		return nil, fmt.Errorf("cannot start bubblewrap: %w", err)
	}
	w := &warm{p: pr, workdir: workdir, prog: prog, control: ours[0], status: ours[1], stdout: ours[2], stderr: ours[3]}
	stR := w.status
	said := make(chan byte, 1)
	go func() {
		b := make([]byte, 1)
		if n, _ := io.ReadFull(stR, b); n == 1 {
			said <- b[0]
		}
		close(said)
	}()
	timer := time.NewTimer(prestartTimeout)
	defer timer.Stop()
	select {
	case b, ok := <-said:
		switch {
		case ok && b == stageWaiting:
			return w, nil
		case ok:
			w.teardown()
			return nil, fmt.Errorf("the sandbox's first process wrote %q on the stage's status pipe: the program does not run sandbox.StageMain", b)
		}
		msg := describeExit(w)
		w.teardown()
		return nil, fmt.Errorf("the sandbox ended before it was ready: %s", msg)
	case <-timer.C:
		w.teardown()
		return nil, fmt.Errorf("the sandbox was not ready within %s", prestartTimeout)
	}
}

// describeExit says how a pre-started sandbox that never got ready ended,
// with what it wrote on stderr (bubblewrap's own error, or the program's
// when it does not run the stage).
func describeExit(w *warm) string {
	<-w.p.done
	stderr, _ := readTail(w.p.stderr, StderrTailBytes)
	msg := fmt.Sprintf("exit status %d", exitCode(w.p.cmd.ProcessState))
	if s := strings.TrimSpace(string(stderr)); s != "" {
		msg += "; stderr: " + s
	}
	return msg
}

// close tears every pre-started sandbox of the pool down and waits for
// starts under way to end (their sandboxes are torn down too). Calls
// waiting for a start start their own.
func (p *pool) close() {
	p.mu.Lock()
	p.closed = true
	if p.retry != nil {
		p.retry.Stop()
		p.retry = nil
	}
	ready := p.ready
	p.ready = nil
	for _, c := range p.waiters {
		c <- nil
	}
	p.waiters = nil
	p.notify()
	p.mu.Unlock()
	for _, w := range ready {
		w.teardown()
	}
	p.wg.Wait()
}

// state returns the number of ready sandboxes, a channel closed at the
// next change, whether the pool is closed, and whether its last pre-start
// failed.
func (p *pool) state() (ready int, changed <-chan struct{}, closed, failing bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.ready), p.changed, p.closed, p.failures > 0
}

// refillQuiet is how long no subprocess call of the runner must have
// begun or ended before the pools replace the sandboxes calls took. A
// batch's calls of one worker come one after another, a millisecond or two
// apart (the result recorded, the next call granted); the model's turn
// between two batches lasts far longer, and so does a long call.
const refillQuiet = 20 * time.Millisecond

// callActivity says a subprocess call begins or ends: the pools are
// refilled once refillQuiet passes without another.
func (r *Runner) callActivity() {
	if r.refill != nil {
		r.refill.Reset(r.refillAfter)
	}
}

// fillPools starts what every pool lacks.
func (r *Runner) fillPools() {
	for _, p := range r.pools {
		p.mu.Lock()
		p.fill()
		p.mu.Unlock()
	}
}
