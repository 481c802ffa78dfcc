package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// binaries are this module's programs, built once per benchmark.
type binaries struct {
	engine, worker, replay string
	// baseline is the programs built from --baseline (nil: none).
	baseline *binaries
}

// moduleRoot is the directory of go.mod, so that the programs build from
// wherever the benchmark was started.
func moduleRoot(goBin string) (string, error) {
	out, err := exec.Command(goBin, "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("not inside the toolbatch module (go env GOMOD is empty)")
	}
	return filepath.Dir(mod), nil
}

// build compiles the engine, the sandbox worker and replay into dir.
func build(goBin, root, dir string) (binaries, error) {
	var b binaries
	for _, t := range []struct {
		pkg string
		dst *string
	}{{"./cmd/engine", &b.engine}, {"./cmd/sandbox-worker", &b.worker}, {"./cmd/replay", &b.replay}} {
		*t.dst = filepath.Join(dir, filepath.Base(t.pkg))
		cmd := exec.Command(goBin, "build", "-o", *t.dst, t.pkg)
		cmd.Dir = root
		cmd.Stderr = os.Stderr
		if err := cmd.Run(); err != nil {
			return b, fmt.Errorf("build %s: %w", t.pkg, err)
		}
	}
	return b, nil
}

// proc is a program started by the benchmark. Its stderr is kept (the
// last 256 KiB) for when something goes wrong.
type proc struct {
	name   string
	cmd    *exec.Cmd
	mu     sync.Mutex
	logs   []byte
	ready  chan struct{}
	exited chan struct{}
}

const keepLogs = 256 << 10

// startProc runs bin and waits until a line of its stderr contains ready.
func startProc(name, ready, bin string, args ...string) (*proc, error) {
	return startProcWait(name, ready, time.Minute, bin, args...)
}

// startProcWait is startProc with a longer or shorter wait for ready.
func startProcWait(name, ready string, wait time.Duration, bin string, args ...string) (*proc, error) {
	return startProcLines(name, ready, wait, nil, bin, args...)
}

// startProcLines is startProcWait that also hands every line of the
// program's stderr to onLine (when not nil), with the time it was read.
func startProcLines(name, ready string, wait time.Duration, onLine func(time.Time, []byte), bin string, args ...string) (*proc, error) {
	return launch(name, ready, wait, onLine, nil, bin, args...)
}

// launch is startProcLines with env added to the bench's environment.
func launch(name, ready string, wait time.Duration, onLine func(time.Time, []byte), env []string, bin string, args ...string) (*proc, error) {
	p := &proc{name: name, ready: make(chan struct{}), exited: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	if len(env) > 0 {
		p.cmd.Env = append(os.Environ(), env...)
	}
	pipe, err := p.cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		sc := bufio.NewScanner(pipe)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		var once sync.Once
		for sc.Scan() {
			line := sc.Bytes()
			if onLine != nil {
				onLine(time.Now(), line)
			}
			p.mu.Lock()
			p.logs = append(p.logs, line...)
			p.logs = append(p.logs, '\n')
			if len(p.logs) > 2*keepLogs {
				p.logs = append([]byte(nil), p.logs[len(p.logs)-keepLogs:]...)
			}
			p.mu.Unlock()
			if bytes.Contains(line, []byte(ready)) {
				once.Do(func() { close(p.ready) })
			}
		}
	}()
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	select {
	case <-p.ready:
		return p, nil
	case <-p.exited:
		return nil, fmt.Errorf("%s exited before it was ready:\n%s", name, p.tail(4096))
	case <-time.After(wait):
		p.kill()
		return nil, fmt.Errorf("%s not ready after %s:\n%s", name, wait, p.tail(4096))
	}
}

// tail returns the last n bytes of the program's stderr.
func (p *proc) tail(n int) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.logs) > n {
		return string(p.logs[len(p.logs)-n:])
	}
	return string(p.logs)
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// stop sends SIGTERM and waits up to 20 s for the exit, then SIGKILL.
func (p *proc) stop() {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(20 * time.Second):
		p.kill()
	}
}

// kill sends SIGKILL (unless the process exited) and waits for the exit.
func (p *proc) kill() {
	select {
	case <-p.exited:
	default:
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.exited
	}
}

// alive reports whether the process still runs.
func (p *proc) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat:
// 100 on every Linux architecture Go supports.
const clockTicks = 100

// cpuSeconds returns the user+system CPU time of a process so far, from
// /proc/<pid>/stat (utime and stime, fields 14 and 15).
func cpuSeconds(pid int) (float64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state): utime is field 14, stime field 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: bad utime/stime", pid)
	}
	return float64(ut+st) / clockTicks, nil
}

// memStatus returns VmRSS and VmHWM (peak RSS) of a process in MiB, from
// /proc/<pid>/status.
func memStatus(pid int) (rss, hwm float64, err error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || (k != "VmRSS" && k != "VmHWM") {
			continue
		}
		f := strings.Fields(v)
		if len(f) < 1 {
			continue
		}
		kb, perr := strconv.ParseFloat(f[0], 64)
		if perr != nil {
			continue
		}
		if k == "VmRSS" {
			rss = kb / 1024
		} else {
			hwm = kb / 1024
		}
	}
	return rss, hwm, nil
}

// machineCPU returns the machine's busy and total CPU time so far, in
// seconds, from the first line of /proc/stat (busy: everything but idle
// and iowait).
func machineCPU() (busy, total float64, err error) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := strings.Cut(string(data), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	for i, v := range f[1:] {
		n, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, 0, err
		}
		if i >= 7 { // guest time is already counted in user
			break
		}
		total += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy / clockTicks, total / clockTicks, nil
}

// loadAvg returns the first three fields of /proc/loadavg.
func loadAvg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// busyCores measures how many cores the whole machine keeps busy over d.
func busyCores(d time.Duration) float64 {
	b0, _, err := machineCPU()
	if err != nil {
		return nan()
	}
	start := time.Now()
	time.Sleep(d)
	b1, _, err := machineCPU()
	if err != nil {
		return nan()
	}
	return (b1 - b0) / time.Since(start).Seconds()
}
