package testproc

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Build compiles each package (a path relative to the caller's directory)
// into dir, and returns the binaries in order.
func Build(dir string, pkgs ...string) ([]string, error) {
	var bins []string
	for _, pkg := range pkgs {
		bin := filepath.Join(dir, filepath.Base(filepath.Clean(pkg)))
		if filepath.Base(filepath.Clean(pkg)) == "." {
			wd, err := os.Getwd()
			if err != nil {
				return nil, err
			}
			bin = filepath.Join(dir, filepath.Base(wd))
		}
		cmd := exec.Command("go", "build", "-o", bin, pkg)
		cmd.Stderr = os.Stderr
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("build %s: %w", pkg, err)
		}
		bins = append(bins, bin)
	}
	return bins, nil
}

// FreePort returns a TCP port free on 127.0.0.1 now.
func FreePort(t *testing.T) int {
	t.Helper()
	port, err := Port()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// Port returns a TCP port that is free on 127.0.0.1 now, for programs
// that start processes outside a test. The port is below the kernel's
// ephemeral range (ip_local_port_range), which outgoing connections and
// listeners on port 0 draw from: a port from that range could be taken by
// any connection between this call and the program's bind, and again while
// a killed server is down before it restarts on the same port.
func Port() (int, error) {
	low := ephemeralLow()
	const first = 10000
	span := low - first
	if span < 1000 {
		return anyPort()
	}
	// Each call starts where the last one stopped, so that ports returned
	// one after another differ before any is bound; processes start apart.
	portsMu.Lock()
	defer portsMu.Unlock()
	if portsNext == 0 {
		portsNext = int(time.Now().UnixNano()/1000+int64(os.Getpid())*7919)%span + 1
	}
	for i := 0; i < span; i++ {
		p := first + (portsNext+i)%span
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue
		}
		l.Close()
		portsNext += i + 1
		return p, nil
	}
	return anyPort()
}

var (
	portsMu   sync.Mutex
	portsNext int // where the next Port call starts; 0 before the first
)

// anyPort is a port the kernel picks, for a machine whose ephemeral range
// leaves no room below it.
func anyPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// ephemeralLow is the first port of the kernel's ephemeral range (32768,
// Linux's default, when it can't be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	var low, high int
	if _, err := fmt.Sscan(string(b), &low, &high); err != nil || low <= 0 {
		return 32768
	}
	return low
}

// Proc is a running program.
type Proc struct {
	Name   string
	Cmd    *exec.Cmd
	mu     sync.Mutex
	logs   bytes.Buffer
	ready  chan struct{}
	exited chan struct{}
}

// Start runs bin and waits until a line of its stderr contains ready. The
// process is killed at cleanup.
func Start(t *testing.T, name, ready, bin string, args ...string) *Proc {
	t.Helper()
	p := &Proc{Name: name, ready: make(chan struct{}), exited: make(chan struct{})}
	p.Cmd = exec.Command(bin, args...)
	pipe, err := p.Cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(pipe)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		var once sync.Once
		for sc.Scan() {
			p.mu.Lock()
			p.logs.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
			if strings.Contains(sc.Text(), ready) {
				once.Do(func() { close(p.ready) })
			}
		}
	}()
	go func() { _ = p.Cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("--- %s logs:\n%s", p.Name, p.Logs())
		}
	})
	select {
	case <-p.ready:
	case <-p.exited:
		t.Fatalf("%s exited before it was ready:\n%s", name, p.Logs())
	case <-time.After(30 * time.Second):
		t.Fatalf("%s not ready:\n%s", name, p.Logs())
	}
	return p
}

// Logs returns what the program wrote on stderr so far.
func (p *Proc) Logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.String()
}

// Exited is closed when the process has exited.
func (p *Proc) Exited() <-chan struct{} { return p.exited }

// Kill sends SIGKILL (unless the process exited) and waits for the exit.
func (p *Proc) Kill() {
	select {
	case <-p.exited:
	default:
		_ = p.Cmd.Process.Signal(syscall.SIGKILL)
		<-p.exited
	}
}

// Buffer collects what a process (or an engine's logger) writes while a
// test reads it.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
