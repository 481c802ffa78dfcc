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
	Servers  int // nats-servers: 1, or 3 for a cluster schedule
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
	// Unavailable lists the calls completed unavailable_before_dispatch
	// (the model sees that error).
	Unavailable []string
	Effects     int // sandbox tool entries recorded by the tools
	// Faults counts a cluster schedule's faults by kind (Fault*);
	// ServerOnly says its plan hit only the nats-servers, so that the
	// server-only checks applied; Failovers are its failover figures.
	Faults     map[string]int
	ServerOnly bool
	Failovers  []Failover
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
	if r.Servers > 1 {
		class := "mixed faults"
		if r.ServerOnly {
			class = "server-only faults"
		}
		return fmt.Sprintf("seed %d: %d servers, %d engine(s), %d runs, %d batches, %d calls, %d resumes; %s %s; indeterminate %d, replayed %d, retried %d, unavailable %d; %d effects; failover %s; %d exits not caused by the driver; %s: %s",
			r.Seed, r.Servers, r.Engines, r.Runs, r.Batches, r.Calls, r.Resumes, class, faultCounts(r.Faults), len(r.Indeterminate), len(r.Replayed), r.Retries,
			len(r.Unavailable), r.Effects, FailoverFigures(r.Failovers), len(r.Surprises), r.Duration.Round(100*time.Millisecond), verdict)
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
	crashes, faults := map[string]int{}, map[string]int{}
	var indet, replayed, failed int
	var seeds []string
	var fos []Failover
	cluster := false
	for _, r := range rs {
		for k, n := range r.Crashes {
			crashes[k] += n
		}
		for k, n := range r.Faults {
			faults[k] += n
		}
		fos = append(fos, r.Failovers...)
		cluster = cluster || r.Servers > 1
		indet += len(r.Indeterminate)
		replayed += len(r.Replayed)
		if len(r.Failures) > 0 {
			failed++
		}
		seeds = append(seeds, fmt.Sprint(r.Seed))
	}
	if cluster {
		return fmt.Sprintf("chaos cluster summary: %d schedules run (seeds %s), %d failed; faults injected %s; calls made indeterminate %d; calls replayed %d; failover %s",
			len(rs), strings.Join(seeds, ", "), failed, faultCounts(faults), indet, replayed, FailoverFigures(fos))
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
	res := &Result{Seed: seed, Servers: 1, Engines: 1 + rng.Intn(2), Runs: p.Runs, Crashes: map[string]int{}, Dir: dir}
	logf := progressf(progress, seed, started)
	c, err := startCluster(ctx, bins, dir, shared, 1, res.Engines, 2)
	if err != nil {
		return nil, fmt.Errorf("start the processes: %w", err)
	}
	defer c.stop()
	logf("started nats-server, %d engine(s), 2 workers on %s", res.Engines, c.url)
	d := drive{specs: workload(seed, p), timeout: p.BatchTimeout,
		faults: func(done <-chan struct{}, _ func() []string) error { return crash(ctx, c, seed, p, done, res, logf) }}
	_, err = execute(ctx, c, d, res, started, logf)
	return res, err
}

// progressf returns the printf of a schedule's progress lines.
func progressf(progress io.Writer, seed int64, started time.Time) func(string, ...any) {
	return func(format string, args ...any) {
		if progress != nil {
			fmt.Fprintf(progress, "chaos: seed %d: +%5.1fs "+format+"\n", append([]any{seed, time.Since(started).Seconds()}, args...)...)
		}
	}
}

// drive is how a schedule drives its workload.
type drive struct {
	specs   []runSpec
	timeout time.Duration // per batch
	// enough, when not nil, is closed by faults when its plan is done:
	// then each run stops after its first atLeast batches.
	enough  <-chan struct{}
	atLeast int
	// faults injects the schedule's faults until done is closed (the
	// workload is done); awaiting returns the runs waiting for a batch's
	// results now. An error means a process did not come back.
	faults func(done <-chan struct{}, awaiting func() []string) error
	// clientOpts are added to the driver's client connection.
	clientOpts []nats.Option
}

// outcome is what a schedule's streams and effects held at its end, for
// the checks of a mode.
type outcome struct {
	rec     *recorded
	f       *fold
	effects map[string][]int
}

// execute drives the workload against the processes while faults runs,
// then reads the streams and runs the checks of every schedule into res.
// The outcome is nil when the streams could not be read (a failure says
// why).
func execute(ctx context.Context, c *cluster, d drive, res *Result, started time.Time, logf func(string, ...any)) (*outcome, error) {
	nc, err := nats.Connect(c.url, append([]nats.Option{nats.Name("toolbatch-chaos-client"), nats.MaxReconnects(-1),
		nats.ReconnectWait(100 * time.Millisecond), nats.RetryOnFailedConnect(true)}, d.clientOpts...)...)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	cl, err := client.New(nc)
	if err != nil {
		return nil, err
	}

	// The workload, one goroutine per run.
	runners := make([]*runner, len(d.specs))
	var wg sync.WaitGroup
	workCtx, stopWork := context.WithCancel(ctx)
	defer stopWork()
	for i, s := range d.specs {
		runners[i] = &runner{c: cl, seed: res.Seed, spec: s, timeout: d.timeout, enough: d.enough, atLeast: d.atLeast,
			answered: map[string]bool{}, results: map[string]*protocol.ResultsOut{}}
		wg.Add(1)
		go func() { defer wg.Done(); runners[i].run(workCtx) }()
	}
	workDone := make(chan struct{})
	go func() { wg.Wait(); close(workDone) }()

	// The faults, until the workload is done.
	awaiting := func() []string {
		var out []string
		for _, r := range runners {
			if r.awaiting() {
				out = append(out, r.spec.id)
			}
		}
		return out
	}
	faultErr := d.faults(workDone, awaiting)
	if faultErr != nil {
		stopWork()
	}
	<-workDone
	logf("workload done")

	for _, r := range runners {
		res.Failures = append(res.Failures, r.failures...)
		res.Resumes += r.resumes
	}
	if faultErr != nil {
		res.Failures = append(res.Failures, faultErr.Error())
	}
	submitted := submittedBatches(runners)

	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := c.waitAllReady(rctx); err != nil {
		res.Failures = append(res.Failures, "after the workload: "+err.Error())
	}
	res.Surprises = c.surprises()
	res.Duration = time.Since(started)
	// The reads are tried again until they go through: on a loaded
	// machine (make test) a stream's leader just back from a pause of
	// seconds took more than 20 s to answer a consumer's creation.
	rec, vs, err := settle(rctx, c.url, time.Minute)
	if err != nil {
		res.Failures = append(res.Failures, "after the workload: "+err.Error())
		return nil, nil
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
	res.Unavailable = f.unavailable
	for _, as := range effects {
		res.Effects += len(as)
	}
	res.Duration = time.Since(started)
	return &outcome{rec: rec, f: f, effects: effects}, nil
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
			target = c.nats[0]
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
	what := "crashes"
	if r.Servers > 1 {
		what = "faults"
	}
	fmt.Fprintf(w, "  %s: %s\n", what, strings.Join(r.CrashLog, "; "))
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
