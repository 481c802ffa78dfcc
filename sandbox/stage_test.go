package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"syscall"
	"testing"
	"time"
)

// TestStageReadsTheRunnersPrlimitLine: the stage applies exactly the
// rlimits of the prlimit command line the Runner writes (each flag's soft
// and hard values) and execs the tool with its own arguments; any other
// line is left to prlimit.
func TestStageReadsTheRunnersPrlimitLine(t *testing.T) {
	r := &Runner{prlimit: "/usr/bin/prlimit"}
	tool := ToolConfig{Command: []string{"/bin/tool", "-x", "--", "y"},
		Limits: Limits{MemoryMB: 128, CPUSeconds: 7, OutputKB: 64, MaxProcs: 40}}
	limits, argv, ok := parsePrlimit(r.limitArgs(tool, "/bin/tool"))
	if !ok {
		t.Fatalf("the Runner's own line is not read: %q", r.limitArgs(tool, "/bin/tool"))
	}
	want := []stageLimit{
		{9, syscall.Rlimit{Cur: 128 << 20, Max: 128 << 20}}, // address space
		{0, syscall.Rlimit{Cur: 7, Max: 8}},                 // CPU seconds
		{6, syscall.Rlimit{Cur: 40, Max: 40}},               // processes
		{1, syscall.Rlimit{Cur: 128 << 20, Max: 128 << 20}}, // file size: the larger of output and memory
		{4, syscall.Rlimit{Cur: 0, Max: 0}},                 // core dumps
	}
	if !reflect.DeepEqual(limits, want) {
		t.Fatalf("limits %+v, want %+v", limits, want)
	}
	if !reflect.DeepEqual(argv, []string{"/bin/tool", "-x", "--", "y"}) {
		t.Fatalf("tool argv %q", argv)
	}
	for _, bad := range [][]string{
		{"/usr/bin/env", "--as=1", "--", "/bin/tool"},
		{"/usr/bin/prlimit", "--nofile=5", "--", "/bin/tool"},
		{"/usr/bin/prlimit", "--as", "--", "/bin/tool"},
		{"/usr/bin/prlimit", "--as=x", "--", "/bin/tool"},
		{"/usr/bin/prlimit", "--cpu=9:8", "--", "/bin/tool"},
		{"/usr/bin/prlimit", "--as=1", "/bin/tool"},
		{"/usr/bin/prlimit", "--as=1", "--", "tool"},
		{"/usr/bin/prlimit", "--as=1", "--"},
	} {
		if _, _, ok := parsePrlimit(bad); ok {
			t.Errorf("%q read as a prlimit line the stage applies", bad)
		}
	}
}

// TestPrestartedStageSetsLimitsItself: in a pre-started sandbox the stage
// sets the rlimits of the Runner's prlimit line itself and execs the tool
// (prlimit's exec is off the call's path), and the tool has those limits.
func TestPrestartedStageSetsLimitsItself(t *testing.T) {
	t.Parallel()
	r, _ := newRunner(t, prestarted, `
tools:
  - id: limits
    command: [/bin/sh, -c, 'ulimit -v; ulimit -t; ulimit -c']
    limits: {memory_mb: 96, cpu_seconds: 5, max_procs: 30}
`)
	const calls = 3
	before := r.Stats().StageLimits // NewRunner's trial of the stage
	for i := 0; i < calls; i++ {
		res := r.Run(context.Background(), Call{ToolID: "limits", CallID: "c1", OperationID: fmt.Sprintf("r/%d/c1", i), Attempt: 1})
		if got := wantOutput(t, res).Text(); got != "98304\n5\n0\n" {
			t.Fatalf("call %d: output %q, want the address-space, CPU and core limits", i, got)
		}
	}
	if st := r.Stats(); st.StageLimits-before != calls || st.StageChild-before != calls {
		t.Fatalf("%d of %d calls had their limits set by the stage, %d as its child (stats %+v)", st.StageLimits-before, calls, st.StageChild-before, st)
	}
}

// TestPrestartedReplacementWaitsForTheCall: while another sandbox of the
// tool is ready, a taken sandbox's replacement does not start when the call
// takes it, nor while the call runs, nor when it ends; it starts once the
// runner is quiet. (The quiet's length is held off here: a call longer
// than it, on a busy machine even this one, lets the pools refill;
// TestRefillWaitsForQuiet checks the quiet between a batch's calls.)
func TestPrestartedReplacementWaitsForTheCall(t *testing.T) {
	t.Parallel()
	gateDir := worldDir(t, false)
	gate := filepath.Join(gateDir, "gate")
	if err := syscall.Mkfifo(gate, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(gate, 0o666); err != nil {
		t.Fatal(err)
	}
	r, _ := newRunner(t, prestarted, fmt.Sprintf(`
tools:
  - id: wait
    command: [/bin/sh, -c, 'read x < %s; echo "$x"']
    mounts: [{path: %s}]
`, gate, gateDir), func(r *Runner) { r.refillAfter = time.Hour })
	p := r.pools["wait"]
	state := func() (ready, starting int) {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.ready), p.starting
	}
	if ready, starting := state(); ready != 2 || starting != 0 {
		t.Fatalf("before the call: %d ready, %d starting", ready, starting)
	}
	done := make(chan Result, 1)
	go func() {
		done <- r.Run(context.Background(), Call{ToolID: "wait", CallID: "c1", OperationID: "r/1/c1", Attempt: 1})
	}()
	// Opening the gate for writing returns once the tool opened it for
	// reading: the call is running.
	w, err := os.OpenFile(gate, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	ready, starting := state()
	if _, err := w.WriteString("open\n"); err != nil {
		t.Fatal(err)
	}
	_ = w.Close()
	if got := wantOutput(t, <-done).Text(); got != "open\n" {
		t.Fatalf("output %q", got)
	}
	if ready != 1 || starting != 0 {
		t.Fatalf("while the call ran: %d ready, %d starting; want 1 and 0", ready, starting)
	}
	if ready, starting := state(); ready != 1 || starting != 0 {
		t.Fatalf("after the call: %d ready, %d starting; want 1 and 0 until the runner is quiet", ready, starting)
	}
	r.refillAfter = time.Millisecond
	r.callActivity() // quiet from now on
	eventually(t, 20*time.Second, "the replacement is ready", func() bool { ready, _ := state(); return ready == 2 })
}

// TestFinishTakesTheReportedExit: when the stage reports the tool's exit,
// the call's exit status is the tool's, even when the sandbox's own exit
// (the stage's status) is seen first.
func TestFinishTakesTheReportedExit(t *testing.T) {
	t.Parallel()
	r, _ := newRunner(t, fresh, `
isolation: none
tools:
  - id: stage
    command: [/bin/sh, -c, 'exit 0']
`)
	tool := r.cfg.Tools[0].withDefaults()
	for i := 0; i < 20; i++ {
		p, err := r.start(tool.ID, []string{"/bin/sh", "-c", "exit 0"}, nil, t.TempDir(), nil)
		if err != nil {
			t.Fatal(err)
		}
		<-p.done // the sandbox has exited, with status 0
		exited := make(chan stageExit, 1)
		exited <- stageExit{ws: syscall.WaitStatus(3 << 8)} // the tool exited with status 3
		reported := make(chan struct{})
		close(reported)
		o := r.finish(context.Background(), tool, p, nil, callIO{stdout: p.stdout, stderr: p.stderr, exited: exited, reported: reported})
		if o.exit == nil || waitCode(*o.exit) != 3 {
			t.Fatalf("try %d: the call's exit is %v (process state %v), want the reported status 3", i, o.exit, o.state)
		}
	}
}
