package chaos

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// restartBackoff is how long a keeper waits before it starts a program again
// after the program exited on its own (for example an engine that could not
// connect because the nats-server was down).
const restartBackoff = 250 * time.Millisecond

// proc is one program the driver keeps running. Its keeper starts it again
// whenever it exits on its own; after kill it stays down until release.
type proc struct {
	name  string
	kind  string // KindEngine, KindWorker or KindNATS
	bin   string
	args  []string
	ready string // a substring of the stderr line that says it is ready
	log   *os.File

	release chan struct{} // kill holds the program down until a send here

	mu       sync.Mutex
	cur      *generation
	held     bool // killed by the driver: not started again until release
	gens     int
	surprise []string // exits the driver did not cause, described
}

// generation is one process of a proc.
type generation struct {
	n      int
	cmd    *exec.Cmd
	ready  chan struct{} // closed when the ready line was seen
	exited chan struct{} // closed when the process has exited
	last   lastLine
}

// lastLine keeps the last line a process wrote, for describing an exit.
type lastLine struct {
	mu   sync.Mutex
	line string
}

func (l *lastLine) set(s string) { l.mu.Lock(); l.line = s; l.mu.Unlock() }
func (l *lastLine) get() string  { l.mu.Lock(); defer l.mu.Unlock(); return l.line }

func newProc(name, kind, logPath, bin, ready string, args ...string) (*proc, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &proc{name: name, kind: kind, bin: bin, args: args, ready: ready, log: f, release: make(chan struct{}, 1)}, nil
}

// keep runs the program until ctx is done, starting it again whenever it
// exits, except while it is held. When ctx is done it kills the process
// and returns.
func (p *proc) keep(ctx context.Context) {
	defer p.log.Close()
	for ctx.Err() == nil {
		if !p.waitReleased(ctx) {
			return
		}
		g, err := p.spawn()
		if err != nil {
			p.note(fmt.Sprintf("%s could not be started: %v", p.name, err))
			if !sleepCtx(ctx, restartBackoff) {
				return
			}
			continue
		}
		if g == nil {
			continue // held between waitReleased and spawn
		}
		select {
		case <-g.exited:
		case <-ctx.Done():
			_ = g.cmd.Process.Signal(syscall.SIGKILL)
			<-g.exited
			return
		}
		p.mu.Lock()
		held := p.held
		p.mu.Unlock()
		if held {
			continue // the driver killed it: wait for release
		}
		wasReady := false
		select {
		case <-g.ready:
			wasReady = true
		default:
		}
		state := g.cmd.ProcessState.String()
		if wasReady {
			p.note(fmt.Sprintf("%s (start %d) exited on its own after it was ready (%s); last line: %s", p.name, g.n, state, g.last.get()))
		} else {
			p.note(fmt.Sprintf("%s (start %d) exited before it was ready (%s); last line: %s", p.name, g.n, state, g.last.get()))
		}
		if !sleepCtx(ctx, restartBackoff) {
			return
		}
	}
}

// waitReleased waits while the program is held; false when ctx is done.
func (p *proc) waitReleased(ctx context.Context) bool {
	for {
		p.mu.Lock()
		held := p.held
		p.mu.Unlock()
		if !held {
			return true
		}
		select {
		case <-p.release:
		case <-ctx.Done():
			return false
		}
	}
}

// spawn starts a new process unless the program is held (then it returns
// nil, nil). The start happens under the lock, so that kill either sees the
// new process or prevents it.
func (p *proc) spawn() (*generation, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held {
		return nil, nil
	}
	p.gens++
	g := &generation{n: p.gens, ready: make(chan struct{}), exited: make(chan struct{})}
	g.cmd = exec.Command(p.bin, p.args...)
	// The program dies with the driver, even if the driver is killed.
	g.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	g.cmd.Stdout = p.log
	stderr, err := g.cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(p.log, "=== %s start %d at %s\n", p.name, g.n, time.Now().Format(time.RFC3339Nano))
	if err := g.cmd.Start(); err != nil {
		return nil, err
	}
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		var once sync.Once
		for sc.Scan() {
			line := sc.Text()
			_, _ = io.WriteString(p.log, line+"\n")
			g.last.set(line)
			if strings.Contains(line, p.ready) {
				once.Do(func() { close(g.ready) })
			}
		}
	}()
	go func() {
		<-scanned // Wait closes the pipe: read it to the end first
		_ = g.cmd.Wait()
		close(g.exited)
	}()
	p.cur = g
	return g, nil
}

// note records an exit the driver did not cause.
func (p *proc) note(s string) {
	p.mu.Lock()
	p.surprise = append(p.surprise, s)
	p.mu.Unlock()
	fmt.Fprintf(p.log, "=== %s\n", s)
}

// surprises returns the exits the driver did not cause, so far.
func (p *proc) surprises() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.surprise...)
}

// kill sends SIGKILL to the running process and waits until it has exited.
// The program stays down until release.
func (p *proc) kill() {
	p.mu.Lock()
	p.held = true
	g := p.cur
	p.mu.Unlock()
	if g == nil {
		return
	}
	fmt.Fprintf(p.log, "=== %s: kill -9 by the chaos driver at %s\n", p.name, time.Now().Format(time.RFC3339Nano))
	_ = g.cmd.Process.Signal(syscall.SIGKILL)
	<-g.exited
}

// terminate sends SIGTERM to the running process, as an operator's
// restart does, and waits until it has exited; a process still running
// after grace is killed -9. The program stays down until release.
func (p *proc) terminate(grace time.Duration) {
	p.mu.Lock()
	p.held = true
	g := p.cur
	p.mu.Unlock()
	if g == nil {
		return
	}
	fmt.Fprintf(p.log, "=== %s: SIGTERM by the chaos driver at %s\n", p.name, time.Now().Format(time.RFC3339Nano))
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-g.exited:
	case <-t.C:
		fmt.Fprintf(p.log, "=== %s: still running %s after SIGTERM: kill -9\n", p.name, grace)
		_ = g.cmd.Process.Signal(syscall.SIGKILL)
		<-g.exited
	}
}

// signal sends sig (SIGSTOP, SIGCONT) to the running process, and notes it
// in the log.
func (p *proc) signal(sig syscall.Signal) error {
	p.mu.Lock()
	g := p.cur
	p.mu.Unlock()
	if g == nil {
		return fmt.Errorf("%s: no process to signal", p.name)
	}
	fmt.Fprintf(p.log, "=== %s: %s by the chaos driver at %s\n", p.name, signalName(sig), time.Now().Format(time.RFC3339Nano))
	return g.cmd.Process.Signal(sig)
}

// signalName is the usual name of the signals the driver sends.
func signalName(sig syscall.Signal) string {
	switch sig {
	case syscall.SIGSTOP:
		return "SIGSTOP"
	case syscall.SIGCONT:
		return "SIGCONT"
	case syscall.SIGTERM:
		return "SIGTERM"
	}
	return sig.String()
}

// restart lets the keeper start the program again.
func (p *proc) restart() {
	p.mu.Lock()
	p.held = false
	p.mu.Unlock()
	select {
	case p.release <- struct{}{}:
	default:
	}
}

// waitReady waits until the current process has said it is ready. A process
// that exits before it is ready is followed to the next one the keeper
// starts.
func (p *proc) waitReady(ctx context.Context) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		p.mu.Lock()
		g := p.cur
		p.mu.Unlock()
		if g != nil {
			select {
			case <-g.ready:
				select {
				case <-g.exited:
				default:
					return nil
				}
			default:
			}
		}
		select {
		case <-ctx.Done():
			last := ""
			if g != nil {
				last = g.last.get()
			}
			return fmt.Errorf("%s not ready: %w (last line: %s)", p.name, context.Cause(ctx), last)
		case <-tick.C:
		}
	}
}

// sleepCtx waits d; false when ctx was done first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// errNotReady is the cause of a readiness wait that ran out of time.
var errNotReady = errors.New("chaos: program not ready in time")
