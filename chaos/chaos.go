package chaos

import (
	"context"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbatch/toolbatch/client"
	"github.com/toolbatch/toolbatch/protocol"
)

// Profile is the size of a schedule's workload and crashes.
type Profile struct {
	// Runs run concurrently; each submits MinBatches..MaxBatches batches
	// one after another, each of 1..MaxCalls calls.
	Runs, MinBatches, MaxBatches, MaxCalls int
	// MaxCrashes bounds the crashes of one schedule (0: no bound).
	MaxCrashes int
	// Pause is the range of the random pause between two crashes; Down the
	// range of how long a killed process stays down.
	PauseMin, PauseMax time.Duration
	DownMin, DownMax   time.Duration
	// BatchTimeout is how long a client waits for one batch's results,
	// outages included, before the schedule fails.
	BatchTimeout time.Duration
}

// Short is the profile of the short schedules inside `make test`.
var Short = Profile{Runs: 4, MinBatches: 2, MaxBatches: 3, MaxCalls: 4, MaxCrashes: 5,
	PauseMin: 500 * time.Millisecond, PauseMax: 2500 * time.Millisecond,
	DownMin: 0, DownMax: 1500 * time.Millisecond, BatchTimeout: 90 * time.Second}

// Long is the profile of `make chaos`: each schedule takes about 20-40 s.
var Long = Profile{Runs: 8, MinBatches: 4, MaxBatches: 7, MaxCalls: 6, MaxCrashes: 0,
	PauseMin: 500 * time.Millisecond, PauseMax: 3 * time.Second,
	DownMin: 0, DownMax: 2 * time.Second, BatchTimeout: 120 * time.Second}

// Result is what one schedule did and found.
type Result struct {
	Seed     int64
	Engines  int
	Duration time.Duration
	Runs     int
	Batches  int // accepted
	Calls    int
	Resumes  int // confirmations approved and client results sent
	Crashes  map[string]int
	// CrashLog lists each crash: when, what, how long it stayed down.
	CrashLog []string
	// Indeterminate lists the calls made indeterminate, with the reason;
	// Replayed the attempts recovery invoked again (CallExecuting, cause
	// recovered).
	Indeterminate []string
	Replayed      []string
	Retries       int // attempts after unavailable_before_dispatch
	Effects       int // sandbox tool entries recorded by the tools
	// Surprises lists the exits the driver did not cause (for example an
	// engine that could not connect while the nats-server was down).
	Surprises []string
	// Failures lists every check that did not hold; empty when the schedule
	// passed.
	Failures []string
	// Dir holds the schedule's store, configs and process logs.
	Dir string
}

// Line is the result in one line.
func (r *Result) Line() string {
	verdict := "ok"
	if len(r.Failures) > 0 {
		verdict = fmt.Sprintf("FAILED (%d problems)", len(r.Failures))
	}
	return fmt.Sprintf("seed %d: %d engine(s), %d runs, %d batches, %d calls, %d resumes; crashes %s; indeterminate %d, replayed %d, retried %d; %d effects; %d exits not caused by the driver; %s: %s",
		r.Seed, r.Engines, r.Runs, r.Batches, r.Calls, r.Resumes, crashCounts(r.Crashes), len(r.Indeterminate), len(r.Replayed), r.Retries,
		r.Effects, len(r.Surprises), r.Duration.Round(100*time.Millisecond), verdict)
}

func crashCounts(m map[string]int) string {
	total := 0
	for _, n := range m {
		total += n
	}
	return fmt.Sprintf("%d (engine %d, worker %d, nats %d)", total, m[KindEngine], m[KindWorker], m[KindNATS])
}

// Summary is the totals of several schedules.
func Summary(rs []*Result) string {
	crashes := map[string]int{}
	var indet, replayed, failed int
	var seeds []string
	for _, r := range rs {
		for k, n := range r.Crashes {
			crashes[k] += n
		}
		indet += len(r.Indeterminate)
		replayed += len(r.Replayed)
		if len(r.Failures) > 0 {
			failed++
		}
		seeds = append(seeds, fmt.Sprint(r.Seed))
	}
	return fmt.Sprintf("chaos summary: %d schedules run (seeds %s), %d failed; crashes injected %s; calls made indeterminate %d; calls replayed %d",
		len(rs), strings.Join(seeds, ", "), failed, crashCounts(crashes), indet, replayed)
}

// Build compiles the nats-server (from the module's requirement), the
// engine and the sandbox worker into dir. root is the module's directory.
func Build(root, dir string) (Binaries, error) {
	b := Binaries{NATS: filepath.Join(dir, "nats-server"), Engine: filepath.Join(dir, "engine"), Worker: filepath.Join(dir, "sandbox-worker")}
	for bin, pkg := range map[string]string{b.NATS: "github.com/nats-io/nats-server/v2", b.Engine: "./cmd/engine", b.Worker: "./cmd/sandbox-worker"} {
		cmd := exec.Command("go", "build", "-o", bin, pkg)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return Binaries{}, fmt.Errorf("build %s: %w\n%s", pkg, err, out)
		}
	}
	return b, nil
}

// Run runs one schedule: it starts a nats-server, one or two engines and two
// sandbox workers, drives the seed's workload against them while it kills
// and restarts them at the seed's moments, then checks what the streams and
// the tools' effects say. dir is the schedule's directory (store, configs,
// logs); shared a directory the sandbox user can reach (effects, work
// roots). An error means the schedule could not be run; what it found is in
// the Result's Failures.
func Run(ctx context.Context, bins Binaries, p Profile, seed int64, dir, shared string, progress io.Writer) (*Result, error) {
	started := time.Now()
	rng := rand.New(rand.NewSource(seed))
	res := &Result{Seed: seed, Engines: 1 + rng.Intn(2), Runs: p.Runs, Crashes: map[string]int{}, Dir: dir}
	logf := func(format string, args ...any) {
		if progress != nil {
			fmt.Fprintf(progress, "chaos: seed %d: +%5.1fs "+format+"\n", append([]any{seed, time.Since(started).Seconds()}, args...)...)
		}
	}
	c, err := startCluster(ctx, bins, dir, shared, res.Engines, 2)
	if err != nil {
		return nil, fmt.Errorf("start the processes: %w", err)
	}
	defer c.stop()
	logf("started nats-server, %d engine(s), 2 workers on %s", res.Engines, c.url)

	nc, err := nats.Connect(c.url, nats.Name("toolbatch-chaos-client"), nats.MaxReconnects(-1),
		nats.ReconnectWait(100*time.Millisecond), nats.RetryOnFailedConnect(true))
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	cl, err := client.New(nc)
	if err != nil {
		return nil, err
	}

	// The workload, one goroutine per run.
	specs := workload(seed, p)
	runners := make([]*runner, len(specs))
	var wg sync.WaitGroup
	workCtx, stopWork := context.WithCancel(ctx)
	defer stopWork()
	for i, s := range specs {
		runners[i] = &runner{c: cl, seed: seed, spec: s, timeout: p.BatchTimeout, answered: map[string]bool{}, results: map[string]*protocol.ResultsOut{}}
		wg.Add(1)
		go func() { defer wg.Done(); runners[i].run(workCtx) }()
	}
	workDone := make(chan struct{})
	go func() { wg.Wait(); close(workDone) }()

	// The crashes, until the workload is done.
	crashErr := crash(ctx, c, seed, p, workDone, res, logf)
	if crashErr != nil {
		stopWork()
	}
	<-workDone
	logf("workload done")

	for _, r := range runners {
		res.Failures = append(res.Failures, r.failures...)
		res.Resumes += r.resumes
	}
	if crashErr != nil {
		res.Failures = append(res.Failures, crashErr.Error())
	}
	submitted := submittedBatches(runners)

	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := c.waitAllReady(rctx); err != nil {
		res.Failures = append(res.Failures, "after the workload: "+err.Error())
	}
	res.Surprises = c.surprises()
	res.Duration = time.Since(started)
	rec, vs, err := settle(rctx, c.url, 20*time.Second)
	if err != nil {
		res.Failures = append(res.Failures, "after the workload: "+err.Error())
		return res, nil
	}
	f := foldEvents(rec)
	effects, bad, err := readEffects(filepath.Join(c.effects, effectsFile))
	if err != nil {
		return nil, err
	}
	res.Failures = append(res.Failures, bad...)
	res.Failures = append(res.Failures, checkSchedule(rec, vs, f, effects, submitted)...)
	res.Batches = len(f.batches)
	res.Calls = len(f.calls)
	res.Indeterminate = f.indeterminate
	res.Replayed = f.replayed
	res.Retries = f.retries
	for _, as := range effects {
		res.Effects += len(as)
	}
	res.Duration = time.Since(started)
	return res, nil
}

// submittedBatches returns the batches the runners had acknowledged by NATS:
// every batch with results, and the one a runner was waiting for when it
// stopped.
func submittedBatches(runners []*runner) []batchSpec {
	var out []batchSpec
	for _, r := range runners {
		for _, b := range r.spec.batches {
			_, done := r.results[b.submit.BatchID()]
			if done || r.pending == b.submit.BatchID() {
				out = append(out, b)
			}
			if !done {
				break
			}
		}
	}
	return out
}

// crashStep is one crash of a schedule's plan.
type crashStep struct {
	pause time.Duration // after the previous step
	kind  string        // KindEngine, KindWorker or KindNATS
	pick  int           // which engine or worker
	down  time.Duration // how long the process stays down
}

// crashPlan returns the first n crashes a seed's schedule injects (fewer when the
// workload ends first): every choice is drawn from the seed alone.
func crashPlan(seed int64, p Profile, n int) []crashStep {
	rng := rand.New(rand.NewSource(seed ^ 0x5eed))
	between := func(lo, hi time.Duration) time.Duration {
		if hi <= lo {
			return lo
		}
		return lo + time.Duration(rng.Int63n(int64(hi-lo)))
	}
	steps := make([]crashStep, n)
	for i := range steps {
		st := crashStep{pause: between(p.PauseMin, p.PauseMax)}
		kindRoll := rng.Intn(100)
		st.pick = rng.Intn(1 << 16)
		st.down = between(p.DownMin, p.DownMax)
		switch {
		case kindRoll < 40:
			st.kind = KindEngine
		case kindRoll < 75:
			st.kind = KindWorker
		default:
			st.kind = KindNATS
		}
		steps[i] = st
	}
	return steps
}

// crash kills -9 a process (an engine, a worker or the nats-server) at the
// plan's moments, keeps it down for the plan's time and restarts it, until
// the workload is done. It returns an error when a restarted process does
// not come back.
func crash(ctx context.Context, c *cluster, seed int64, p Profile, done <-chan struct{}, res *Result, logf func(string, ...any)) error {
	started := time.Now()
	var plan []crashStep
	for n := 0; p.MaxCrashes == 0 || n < p.MaxCrashes; n++ {
		if n == len(plan) {
			plan = crashPlan(seed, p, 2*n+16) // the same prefix, longer
		}
		st := plan[n]
		t := time.NewTimer(st.pause)
		select {
		case <-done:
			t.Stop()
			return nil
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		var target *proc
		switch st.kind {
		case KindEngine:
			target = c.engines[st.pick%len(c.engines)]
		case KindWorker:
			target = c.workers[st.pick%len(c.workers)]
		default:
			target = c.nats
		}
		at := time.Since(started)
		target.kill()
		res.Crashes[target.kind]++
		logf("kill -9 %s, down for %s", target.name, st.down.Round(time.Millisecond))
		sleepCtx(ctx, st.down)
		target.restart()
		rctx, cancel := context.WithTimeoutCause(ctx, 60*time.Second, errNotReady)
		err := target.waitReady(rctx)
		cancel()
		res.CrashLog = append(res.CrashLog, fmt.Sprintf("+%.1fs kill -9 %s, down %s", at.Seconds(), target.name, st.down.Round(time.Millisecond)))
		if err != nil {
			return fmt.Errorf("restart after crash: %w", err)
		}
		logf("%s is back", target.name)
	}
	<-done
	return nil
}

// Report writes a failed schedule's failures, how to reproduce it, and
// where its logs are.
func Report(w io.Writer, r *Result, reproduce string) {
	fmt.Fprintf(w, "chaos: seed %d FAILED; reproduce with: %s\n", r.Seed, reproduce)
	fmt.Fprintf(w, "  crashes: %s\n", strings.Join(r.CrashLog, "; "))
	for _, f := range r.Failures {
		fmt.Fprintf(w, "  - %s\n", f)
	}
	for _, s := range r.Surprises {
		fmt.Fprintf(w, "  (exit not caused by the driver) %s\n", s)
	}
	fmt.Fprintf(w, "  logs: %s\n", filepath.Join(r.Dir, "logs"))
}

// LogTails returns the last lines of each process log of a schedule.
func LogTails(r *Result, lines int) string {
	paths, _ := filepath.Glob(filepath.Join(r.Dir, "logs", "*.log"))
	sort.Strings(paths)
	var b strings.Builder
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		if len(all) > lines {
			all = all[len(all)-lines:]
		}
		fmt.Fprintf(&b, "--- %s (last %d lines)\n%s\n", filepath.Base(p), len(all), strings.Join(all, "\n"))
	}
	return b.String()
}
