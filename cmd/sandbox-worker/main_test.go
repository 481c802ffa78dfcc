package main_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/toolbatch/toolbatch/client"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/internal/testnats"
	"github.com/toolbatch/toolbatch/internal/testproc"
	"github.com/toolbatch/toolbatch/internal/testwait"
	"github.com/toolbatch/toolbatch/protocol"
)

// These tests run the engine and several sandbox-worker processes, built
// from this module, against the engine's embedded JetStream, and talk to
// them only over NATS.

var engineBin, workerBin, toolbatchBin, natsBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "toolbatch-worker-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bins, err := testproc.Build(dir, "../engine", ".", "../toolbatch", "github.com/nats-io/nats-server/v2")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	engineBin, workerBin, toolbatchBin, natsBin = bins[0], bins[1], bins[2], bins[3]
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// cluster is an engine and its workers.
type cluster struct {
	url     string
	effects string // the mounted directory where tools record side effects
	workers map[string]*testproc.Proc
	client  *client.Client
}

const catalogYAML = `
tools:
  - {id: append, target: sandbox, recovery: {mode: replay_safe}, dispatch_deadline: 20s}
  - {id: slow_nr, target: sandbox, recovery: {mode: never_replay}, dispatch_deadline: 20s}
  - {id: slow_rs, target: sandbox, recovery: {mode: replay_safe, max_attempts: 3}, dispatch_deadline: 20s}
  - {id: nothing_serves_it, target: sandbox, recovery: {max_attempts: 1}, dispatch_deadline: 1s}
  - {id: nothing_serves_it_rs, target: sandbox, recovery: {mode: replay_safe}}
  - {id: failing, target: sandbox, dispatch_deadline: 20s}
`

// workerYAML: every tool records "<worker> <operation id>" in the effects
// directory before it does anything else.
func workerYAML(name, effects string) string {
	rec := fmt.Sprintf(`echo "$WORKER $TOOLBATCH_OPERATION_ID" >> %s/effects.log`, effects)
	// tool is a shell tool that records its effect, then runs script.
	tool := func(id, capability, timeout, script string) string {
		return fmt.Sprintf(`
  - id: %s
    command: ["/bin/sh", "-c", %q]
    capability: %s
    timeout: %s
    env: {WORKER: %s}
    mounts: [{path: %s, writable: true}]`, id, rec+"; "+script, capability, timeout, name, effects)
	}
	return `
pools: [default]
isolation: bubblewrap
tools:` +
		tool("append", "replay_safe", "20s", "echo ok") +
		tool("slow_nr", "non_recoverable", "60s", "sleep 30; echo late") +
		tool("slow_rs", "replay_safe", "60s", `if [ "$TOOLBATCH_ATTEMPT" = 1 ]; then sleep 30; fi; echo "done by $WORKER"`) + `
  - id: failing
    command: ["/bin/sh", "-c", "echo no >&2; exit 3"]
`
}

// reachableDir makes a directory with mode below the system temp dir,
// where the sandbox's user can reach it (it cannot reach t.TempDir), and
// removes it at cleanup.
func reachableDir(t *testing.T, pattern string, mode os.FileMode) string {
	t.Helper()
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, mode); err != nil {
		t.Fatal(err)
	}
	return dir
}

func startCluster(t *testing.T, workers ...string) *cluster {
	t.Helper()
	return startClusterLease(t, time.Second, workers...)
}

// startClusterLease is startCluster with the engine's --lease: a lease of
// a second makes the lease tests quick, and a test of calls without faults
// takes one that a loaded machine's late heartbeat does not end.
func startClusterLease(t *testing.T, lease time.Duration, workers ...string) *cluster {
	t.Helper()
	dir := t.TempDir()
	port := testproc.FreePort(t)
	cat := filepath.Join(dir, "catalog.yaml")
	if err := os.WriteFile(cat, []byte(catalogYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	// The tools run as an unprivileged user in the sandbox: the effects
	// directory must be reachable and writable by it (t.TempDir is not).
	effects := reachableDir(t, "toolbatch-effects", 0o777)
	// Every tool appends to one file, and each tool is a user of its own:
	// the file is shared as an operator would share it.
	shared := filepath.Join(effects, "effects.log")
	if err := os.WriteFile(shared, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(shared, 0o666); err != nil {
		t.Fatal(err)
	}
	c := &cluster{url: fmt.Sprintf("nats://127.0.0.1:%d", port), effects: effects, workers: map[string]*testproc.Proc{}}
	testproc.Start(t, "engine", `"engine ready"`, engineBin, "--store", filepath.Join(dir, "store"), "--listen", fmt.Sprintf("127.0.0.1:%d", port),
		"--catalog", cat, "--log-format", "json", "--lease", lease.String(), "--ack-wait", "2s", "--inbox-ack-wait", "2s")
	for _, name := range workers {
		cfg := filepath.Join(dir, name+".yaml")
		if err := os.WriteFile(cfg, []byte(workerYAML(name, c.effects)), 0o644); err != nil {
			t.Fatal(err)
		}
		c.workers[name] = testproc.Start(t, name, `"ready"`, workerBin, "--nats-url", c.url, "--config", cfg,
			"--worker-id", name, "--log-format", "json", "--concurrency", "8")
	}
	cl, err := client.New(testnats.Connect(t, c.url))
	if err != nil {
		t.Fatal(err)
	}
	c.client = cl
	return c
}

// effects returns the recorded side effects: operation id -> workers.
func (c *cluster) effectLines(t *testing.T) map[string][]string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(c.effects, "effects.log"))
	if os.IsNotExist(err) {
		return map[string][]string{}
	}
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		worker, op, ok := strings.Cut(line, " ")
		if ok {
			out[op] = append(out[op], worker)
		}
	}
	return out
}

// nextTicket reads the watch until a ticket of batchID (of any batch when
// batchID is empty) is awaited, and returns it.
func nextTicket(t *testing.T, ctx context.Context, w *client.Watch, batchID string) *protocol.AwaitingOut {
	t.Helper()
	for {
		m, err := w.Next(ctx)
		if err != nil {
			t.Fatalf("waiting for a ticket: %v", err)
		}
		if m.Awaiting != nil && (batchID == "" || m.Awaiting.BatchID == batchID) {
			return m.Awaiting
		}
	}
}

func batch(run string, step int64, tools ...string) *protocol.Submit {
	s := &protocol.Submit{RunID: run, ThreadID: "t", Step: step, Assistant: events.Message{ID: "m"}}
	for i, tool := range tools {
		s.Assistant.Content = append(s.Assistant.Content, events.ContentBlock{Type: events.BlockToolUse,
			ID: fmt.Sprintf("c%d", i+1), Name: tool, Input: events.MustJSON(fmt.Sprintf(`{"i":%d}`, i))})
	}
	return s
}

func texts(r *protocol.ResultsOut) []string {
	var out []string
	for _, b := range r.Results {
		out = append(out, events.DescribeOutput(events.Output{Content: b.Content, IsError: b.IsError}))
	}
	return out
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestThreeHundredCallsExactlyOnce: three workers run 300 sandbox calls
// across 30 runs; each call's side effect happens exactly once. (No fault:
// the lease is long enough that a heartbeat late on a loaded machine does
// not end it, which would let the replay_safe tool run again, as the
// contract allows.)
func TestThreeHundredCallsExactlyOnce(t *testing.T) {
	c := startClusterLease(t, 10*time.Second, "w1", "w2", "w3")
	ctx := ctxT(t, 240*time.Second)
	const runs, calls = 30, 10
	tools := make([]string, calls)
	for i := range tools {
		tools[i] = "append"
	}
	var wg sync.WaitGroup
	errs := make(chan error, runs)
	for r := 0; r < runs; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			run := fmt.Sprintf("many%d", r)
			if err := c.client.Submit(ctx, batch(run, 1, tools...)); err != nil {
				errs <- err
				return
			}
			res, err := c.client.WaitResults(ctx, run, run+"/1")
			if err != nil {
				errs <- fmt.Errorf("%s: %w", run, err)
				return
			}
			for i, txt := range texts(res) {
				if txt != `ok "ok\n"` {
					errs <- fmt.Errorf("%s call %d: %s", run, i+1, txt)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	lines := c.effectLines(t)
	if len(lines) != runs*calls {
		t.Fatalf("%d distinct side effects, want %d", len(lines), runs*calls)
	}
	workersUsed := map[string]bool{}
	for op, ws := range lines {
		if len(ws) != 1 {
			t.Fatalf("%s: side effect happened %d times (%v)", op, len(ws), ws)
		}
		workersUsed[ws[0]] = true
	}
	if len(workersUsed) < 2 {
		t.Fatalf("only workers %v took work", workersUsed)
	}
	// Once the work is done, the engine trims what the workers and itself
	// acknowledged (every 5 s): the inbox and the dispatch stream empty.
	js := testnats.JetStream(t, testnats.Connect(t, c.url))
	n := protocol.Names{Prefix: protocol.DefaultPrefix}
	for _, name := range []string{n.InboxStream(), n.DispatchStream()} {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		testwait.Until(t, ctx, name+" trimmed", func() bool {
			info, err := s.Info(ctx)
			return err == nil && info.State.Msgs == 0 && info.State.LastSeq > 0
		})
	}
}

// TestKilledWorker: a worker killed with SIGKILL inside a never_replay
// call leaves it indeterminate with its effect counted once; inside a
// replay_safe call, the call completes on another worker. Missing binaries
// and tools no worker serves are reported as results, and the workers keep
// serving.
func TestKilledWorker(t *testing.T) {
	c := startCluster(t, "w1", "w2")
	ctx := ctxT(t, 120*time.Second)
	waitEffect := func(op string) string {
		t.Helper()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			if ws := c.effectLines(t)[op]; len(ws) > 0 {
				return ws[0]
			}
			select {
			case <-ctx.Done():
				t.Fatalf("%s never started", op)
			case <-tick.C:
			}
		}
	}

	if err := c.client.Submit(ctx, batch("nr", 1, "slow_nr")); err != nil {
		t.Fatal(err)
	}
	victim := waitEffect("nr/1/c1")
	c.workers[victim].Kill()
	res, err := c.client.WaitResults(ctx, "nr", "nr/1")
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(texts(res)); got != `[error "tool outcome is indeterminate: the worker running it was lost (no heartbeat before its lease ran out) after it claimed the call"]` {
		t.Fatalf("never_replay after the kill: %s", got)
	}
	if n := len(c.effectLines(t)["nr/1/c1"]); n != 1 {
		t.Fatalf("never_replay call entered %d times", n)
	}

	// The surviving worker takes the replayable call's second attempt.
	survivor := "w1"
	if victim == "w1" {
		survivor = "w2"
	}
	if err := c.client.Submit(ctx, batch("rs", 1, "slow_rs")); err != nil {
		t.Fatal(err)
	}
	if who := waitEffect("rs/1/c1"); who != survivor {
		t.Fatalf("replay_safe ran first on %s, not on the surviving %s", who, survivor)
	}
	// Kill the survivor inside attempt 1 too; a fresh worker takes
	// attempt 2 once the lease runs out.
	c.workers[survivor].Kill()
	cfg := filepath.Join(t.TempDir(), "w3.yaml")
	if err := os.WriteFile(cfg, []byte(workerYAML("w3", c.effects)), 0o644); err != nil {
		t.Fatal(err)
	}
	testproc.Start(t, "w3", `"ready"`, workerBin, "--nats-url", c.url, "--config", cfg, "--worker-id", "w3", "--log-format", "json")
	if res, err = c.client.WaitResults(ctx, "rs", "rs/1"); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(texts(res)); got != `[ok "done by w3\n"]` {
		t.Fatalf("replay_safe after the kill: %s", got)
	}

	// A failing tool is an error output; a tool no worker serves is
	// unavailable before dispatch; the worker still serves.
	if err := c.client.Submit(ctx, batch("misc", 1, "failing", "nothing_serves_it", "append", "nothing_serves_it_rs")); err != nil {
		t.Fatal(err)
	}
	if res, err = c.client.WaitResults(ctx, "misc", "misc/1"); err != nil {
		t.Fatal(err)
	}
	got := texts(res)
	if len(got) != 4 || !strings.HasPrefix(got[0], "error ") ||
		got[1] != `error "unavailable before dispatch: no worker of pool default claimed it within its dispatch deadline (1s): is a worker serving tool nothing_serves_it running?"` ||
		got[2] != `ok "ok\n"` || got[3] != `error "no live worker serves tool nothing_serves_it_rs in pool default (its recovery mode replay_safe needs a worker that advertises it)"` {
		t.Fatalf("results: %v", got)
	}
}

// sandboxesUnder counts the live processes whose command line names dir
// (bubblewrap binds each working directory by its path), and the
// working directories in it.
func sandboxesUnder(t *testing.T, dir string) (procs, workdirs int) {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cmdline), dir+"/toolbatch-call-") {
			procs++
		}
	}
	left, err := filepath.Glob(filepath.Join(dir, "toolbatch-call-*"))
	if err != nil {
		t.Fatal(err)
	}
	return procs, len(left)
}

// TestDrainTearsDownPrestartedSandboxes: a worker keeps pre-started
// sandboxes by default (two per subprocess tool whose program exists);
// after SIGTERM it exits 0 and leaves neither a sandbox process nor a
// working directory. With --prestart 0 it keeps none.
func TestDrainTearsDownPrestartedSandboxes(t *testing.T) {
	c := startCluster(t)
	ctx := ctxT(t, 60*time.Second)
	newRoot := func() string { return reachableDir(t, "toolbatch-worker-root", 0o755) }
	cfg := filepath.Join(t.TempDir(), "dr.yaml")
	if err := os.WriteFile(cfg, []byte(workerYAML("dr", c.effects)), 0o644); err != nil {
		t.Fatal(err)
	}
	root := newRoot()
	w := testproc.Start(t, "dr", `"ready"`, workerBin, "--nats-url", c.url, "--config", cfg, "--worker-id", "dr", "--log-format", "json", "--work-root", root)
	if err := c.client.Submit(ctx, batch("pre", 1, "append")); err != nil {
		t.Fatal(err)
	}
	res, err := c.client.WaitResults(ctx, "pre", "pre/1")
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(texts(res)); got != `[ok "ok\n"]` {
		t.Fatalf("results: %s", got)
	}
	// append, slow_nr, slow_rs and failing: 2 each.
	const want = 4 * 2
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		procs, dirs := sandboxesUnder(t, root)
		if procs >= want && dirs >= want {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d sandbox processes and %d working directories, want %d pre-started sandboxes", procs, dirs, want)
		case <-tick.C:
		}
	}
	if err := w.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-w.Exited()
	if code := w.Cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("the worker exited %d after SIGTERM:\n%s", code, w.Logs())
	}
	if procs, dirs := sandboxesUnder(t, root); procs != 0 || dirs != 0 {
		t.Fatalf("after the drain: %d sandbox processes, %d working directories left", procs, dirs)
	}

	// Off: no sandbox before a call comes.
	root0 := newRoot()
	testproc.Start(t, "dr0", `"ready"`, workerBin, "--nats-url", c.url, "--config", cfg, "--worker-id", "dr0", "--log-format", "json",
		"--work-root", root0, "--prestart", "0")
	if procs, dirs := sandboxesUnder(t, root0); procs != 0 || dirs != 0 {
		t.Fatalf("--prestart 0: %d sandbox processes, %d working directories", procs, dirs)
	}
}

// TestManyToolsNeverStarve: a worker serving more tools than it runs calls
// at once keeps every tool served: a tool with nothing to do holds no
// slot, so each call of each tool runs well within its dispatch deadline.
func TestManyToolsNeverStarve(t *testing.T) {
	dir := t.TempDir()
	const tools = 6
	var cat, wcfg strings.Builder
	cat.WriteString("tools:\n")
	wcfg.WriteString("pools: [default]\nisolation: none\ntools:\n")
	var ids []string
	for i := range tools {
		id := fmt.Sprintf("t%d", i)
		ids = append(ids, id)
		fmt.Fprintf(&cat, "  - {id: %s, target: sandbox, recovery: {mode: replay_safe, max_attempts: 1}, dispatch_deadline: 10s}\n", id)
		fmt.Fprintf(&wcfg, "  - {id: %s, builtin: noop, capability: replay_safe}\n", id)
	}
	catPath, cfgPath := filepath.Join(dir, "catalog.yaml"), filepath.Join(dir, "worker.yaml")
	if err := os.WriteFile(catPath, []byte(cat.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfgPath, []byte(wcfg.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	port := testproc.FreePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	testproc.Start(t, "engine", `"engine ready"`, engineBin, "--store", filepath.Join(dir, "store"), "--listen", fmt.Sprintf("127.0.0.1:%d", port),
		"--catalog", catPath, "--log-format", "json")
	testproc.Start(t, "w", `"ready"`, workerBin, "--nats-url", url, "--config", cfgPath, "--worker-id", "w", "--log-format", "json", "--concurrency", "2")
	cl, err := client.New(testnats.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 120*time.Second)
	// Two rounds of every tool, the last tool first: each call must be
	// claimed by the one worker.
	for round := 1; round <= 2; round++ {
		run := fmt.Sprintf("starve%d", round)
		order := slices.Clone(ids)
		slices.Reverse(order)
		if err := cl.Submit(ctx, batch(run, 1, order...)); err != nil {
			t.Fatal(err)
		}
		res, err := cl.WaitResults(ctx, run, run+"/1")
		if err != nil {
			t.Fatal(err)
		}
		for i, text := range texts(res) {
			if !strings.HasPrefix(text, "ok") {
				t.Fatalf("round %d: call of %s: %s", round, order[i], text)
			}
		}
	}
}

// TestPrivateTMPDIR: a worker whose TMPDIR is private (mode 0700, as
// mktemp -d makes it) still serves its sandboxed tools: its default work
// root is placed where the sandbox's user can enter. A work root the
// sandbox's user cannot reach is refused at start in one line.
func TestPrivateTMPDIR(t *testing.T) {
	dir := t.TempDir()
	private, err := os.MkdirTemp("", "toolbatch-private-tmp-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(private) })
	if err := os.Chmod(private, 0o700); err != nil {
		t.Fatal(err)
	}
	cat, cfg := filepath.Join(dir, "catalog.yaml"), filepath.Join(dir, "worker.yaml")
	if err := os.WriteFile(cat, []byte("tools:\n  - {id: cat, target: sandbox, recovery: {mode: replay_safe}, dispatch_deadline: 20s}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, []byte("pools: [default]\nisolation: bubblewrap\ntools:\n  - {id: cat, command: [/bin/cat], capability: replay_safe, prestart: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	port := testproc.FreePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	testproc.Start(t, "engine", `"engine ready"`, engineBin, "--store", filepath.Join(dir, "store"), "--listen", fmt.Sprintf("127.0.0.1:%d", port),
		"--catalog", cat, "--log-format", "json")

	out, err := exec.Command("/usr/bin/env", "TMPDIR="+private, workerBin, "--nats-url", url, "--config", cfg, "--worker-id", "wp",
		"--work-root", filepath.Join(private, "root")).CombinedOutput()
	if lines := strings.Split(strings.TrimSpace(string(out)), "\n"); err == nil || len(lines) != 1 || !strings.Contains(lines[0], "cannot enter it") {
		t.Fatalf("a work root under a private directory: %v:\n%s", err, out)
	}
	if err := os.MkdirAll(filepath.Join(private, "root"), 0o755); err != nil {
		t.Fatal(err)
	}
	out, err = exec.Command("/usr/bin/env", "TMPDIR="+private, workerBin, "--nats-url", url, "--config", cfg, "--worker-id", "wp",
		"--work-root", filepath.Join(private, "root")).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "mode 0700") {
		t.Fatalf("a work root under a private directory (the root itself open): %v:\n%s", err, out)
	}

	testproc.Start(t, "wp", `"ready"`, "/usr/bin/env", "TMPDIR="+private, workerBin, "--nats-url", url, "--config", cfg,
		"--worker-id", "wp", "--log-format", "json")
	cl, err := client.New(testnats.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 60*time.Second)
	s := batch("private", 1, "cat")
	if err := cl.Submit(ctx, s); err != nil {
		t.Fatal(err)
	}
	res, err := cl.WaitResults(ctx, "private", "private/1")
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(texts(res)); got != `[ok "{\"i\":0}"]` {
		t.Fatalf("results %s", got)
	}
}

// TestMissingProgramRefusedAtStart: a worker whose config names a program
// that does not exist does not start (before it connects anywhere): one
// line names the tool and the program.
func TestMissingProgramRefusedAtStart(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "worker.yaml")
	if err := os.WriteFile(cfg, []byte("pools: [default]\nisolation: bubblewrap\ntools:\n  - {id: gone, command: [/nonexistent/tool]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(workerBin, "--nats-url", "nats://127.0.0.1:1", "--config", cfg).CombinedOutput()
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if err == nil || len(lines) != 1 || !strings.Contains(lines[0], `tool "gone": program /nonexistent/tool does not exist`) {
		t.Fatalf("a missing program: %v:\n%s", err, out)
	}
}

// TestGoneWorkersRootsAreRemoved: workers started without --work-root get
// a root named by their id; a killed worker's root is removed by the next
// worker on the machine, a drained worker removes its own, and a start
// that fails leaves none.
func TestGoneWorkersRootsAreRemoved(t *testing.T) {
	dir := t.TempDir()
	tmp := reachableDir(t, "toolbatch-tmpdir-", 0o755) // the workers' TMPDIR
	cfg, cat := filepath.Join(dir, "worker.yaml"), filepath.Join(dir, "catalog.yaml")
	if err := os.WriteFile(cfg, []byte(metricsWorker), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cat, []byte(metricsCatalog), 0o644); err != nil {
		t.Fatal(err)
	}
	port := testproc.FreePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	testproc.Start(t, "engine", `"engine ready"`, engineBin, "--store", filepath.Join(dir, "store"), "--listen", fmt.Sprintf("127.0.0.1:%d", port),
		"--catalog", cat, "--log-format", "json")
	worker := func(id string) *testproc.Proc {
		return testproc.Start(t, id, `"ready"`, "/usr/bin/env", "TMPDIR="+tmp, workerBin, "--nats-url", url, "--config", cfg,
			"--worker-id", id, "--log-format", "json")
	}
	exists := func(id string) bool {
		_, err := os.Stat(filepath.Join(tmp, "toolbatch-worker-"+id))
		return err == nil
	}
	a := worker("a")
	if !exists("a") {
		t.Fatal("worker a has no root")
	}
	a.Kill()
	if !exists("a") {
		t.Fatal("a killed worker's root went by itself")
	}
	// What a sandbox being made when its worker was killed can leave: a
	// process of bubblewrap, naming a call's directory under the root,
	// waiting for a parent that is gone (here: a shell named bwrap,
	// blocked on a read).
	hold, _, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Close()
	left := &exec.Cmd{Path: "/bin/sh", Args: []string{"bwrap", "-c", "read x", filepath.Join(tmp, "toolbatch-worker-a", "toolbatch-call-1")}, Stdin: hold}
	if err := left.Start(); err != nil {
		t.Fatal(err)
	}
	leftDone := make(chan error, 1)
	go func() { leftDone <- left.Wait() }()
	t.Cleanup(func() { _ = left.Process.Kill() })
	b := worker("b")
	if exists("a") || !exists("b") {
		t.Fatalf("after b started: a's root exists %v, b's %v", exists("a"), exists("b"))
	}
	select {
	case <-leftDone:
	case <-time.After(10 * time.Second): // not a timing: the sweep ran before b was ready
		t.Fatal("what was left of a's sandbox still runs after b swept a's root")
	}
	// a second worker on b's root is refused, and b's root stays
	out, err := exec.Command("/usr/bin/env", "TMPDIR="+tmp, workerBin, "--nats-url", url, "--config", cfg, "--worker-id", "b").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "is in use by another worker") || !exists("b") {
		t.Fatalf("a second worker on b's root: %v:\n%s", err, out)
	}
	if err := b.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-b.Exited()
	if exists("b") {
		t.Error("a drained worker left its root")
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("pools: [default]\nisolation: none\ntools:\n  - {id: gone, command: [/nonexistent/tool]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("/usr/bin/env", "TMPDIR="+tmp, workerBin, "--nats-url", url, "--config", bad, "--worker-id", "c").CombinedOutput(); err == nil {
		t.Fatalf("a worker with a missing program started:\n%s", out)
	}
	if exists("c") {
		t.Error("a failed start left its root")
	}
}
