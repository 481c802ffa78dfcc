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
// that start processes outside a test.
func Port() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
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
