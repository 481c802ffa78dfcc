package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/toolbatch/toolbatch/internal/testproc"
	"github.com/toolbatch/toolbatch/tracing"
)

// Results is everything one benchmark run measured.
type Results struct {
	Machine  Machine   `json:"machine"`
	Command  string    `json:"command"`
	Started  time.Time `json:"started"`
	Seconds  Num       `json:"seconds"`
	Settings Settings  `json:"settings"`
	// Background is how busy the machine was without the benchmark, just
	// before it started and just after it ended: other programs running
	// meanwhile make every figure worse.
	Background Background      `json:"background"`
	Modes      []ModeResult    `json:"modes"`
	Parked     *ParkedResult   `json:"parked_runs,omitempty"`
	W3         *W3Result       `json:"w3_replay,omitempty"`
	W4         *W4Result       `json:"w4_sandbox,omitempty"`
	W5         *W5Result       `json:"w5_sandboxed_batch,omitempty"`
	MCP        *MCPResult      `json:"mcp_call,omitempty"`
	Failover   *FailoverResult `json:"failover,omitempty"`
	// Pairs compare a mode with the default mode run beside it (the runs
	// of --modes taken two by two), and PairMedians are their medians.
	Pairs       []PairResult   `json:"pairs,omitempty"`
	PairMedians []PairSummary  `json:"pair_medians,omitempty"`
	Targets     []TargetResult `json:"targets"`
}

// Background is the machine's load outside the benchmark.
type Background struct {
	BusyCoresBefore Num    `json:"busy_cores_before"`
	BusyCoresAfter  Num    `json:"busy_cores_after"`
	LoadAvgBefore   string `json:"loadavg_before"`
	LoadAvgAfter    string `json:"loadavg_after"`
}

// Machine describes where the benchmark ran.
type Machine struct {
	Cores       int    `json:"cores"`
	CPU         string `json:"cpu"`
	MemoryMiB   int    `json:"memory_mib"`
	Kernel      string `json:"kernel"`
	Go          string `json:"go"`
	NATSServer  string `json:"nats_server"`
	Bubblewrap  string `json:"bubblewrap,omitempty"`
	Hostname    string `json:"hostname"`
	Description string `json:"description"`
}

// Settings are the benchmark's parameters.
type Settings struct {
	Reps              int    `json:"reps"`
	W1Window          string `json:"w1_window"`
	W2Window          string `json:"w2_window"`
	W2Warmup          string `json:"w2_warmup"`
	W2Runs            int    `json:"w2_runs"`
	W2Workers         int    `json:"w2_workers"`
	WorkerConcurrency int    `json:"worker_concurrency"`
	StepsPerRun       int    `json:"steps_per_run"`
	ClientConns       int    `json:"client_connections"`
	CeilingWindow     string `json:"ceiling_window"`
	W3Events          int    `json:"w3_events"`
	ParkedRuns        int    `json:"parked_runs"`
	FailoverReps      int    `json:"failover_reps"`
	FailoverCluster   int    `json:"failover_cluster_reps"`
	// Interleave is --interleave's rounds (0: the modes ran one after
	// another).
	Interleave int `json:"interleaved_rounds,omitempty"`
	// W2Together says that --interleave's rounds ran the two modes' W2
	// at once (--w2-together).
	W2Together bool `json:"w2_together,omitempty"`
	// W1Slices is the number of windows in which --interleave's rounds
	// measured each mode's W1, in turns (--w1-slices).
	W1Slices int `json:"w1_slices,omitempty"`
	// Baseline is the checkout the baseline mode's engine and worker were
	// built from (--baseline), and its commit (git describe --always
	// --dirty: "-dirty" when it had uncommitted changes).
	Baseline       string `json:"baseline,omitempty"`
	BaselineCommit string `json:"baseline_commit,omitempty"`
}

// ModeResult is W1, W2 and the ceiling in one durability mode.
type ModeResult struct {
	Mode       string      `json:"mode"`
	EngineFlag string      `json:"engine_flags"`
	Engines    int         `json:"engines"`
	W1Noop     *W1Result   `json:"w1_noop,omitempty"`
	W1Echo     *W1Result   `json:"w1_echo,omitempty"`
	W2         *W2Result   `json:"w2,omitempty"`
	Ceiling    *Ceiling    `json:"ceiling,omitempty"`
	HandRolled *HandRolled `json:"hand_rolled_w1,omitempty"`
	Ratios     Ratios      `json:"ratios"`
}

// Ratios compare the engine with the ceiling.
type Ratios struct {
	W1P50OverHandRolled     Num `json:"w1_p50_over_hand_rolled_p50"`
	W1P50OverAwaitedPublish Num `json:"w1_p50_over_one_awaited_publish"`
	W2CommitsOverCeiling    Num `json:"w2_commits_over_expect_seq_ceiling"`
	// The hand-rolled minimum's commit rate under W2's load, over the same
	// ceiling: what an engine with no logic reaches with these messages.
	HandRolledW2OverCeiling Num `json:"hand_rolled_w2_commits_over_expect_seq_ceiling"`
	HandRolledOverPublish   Num `json:"hand_rolled_p50_over_one_awaited_publish"`
}

// TargetResult is one target of issue 7 (or of issue 16: failover).
type TargetResult struct {
	Target   string `json:"target"`
	Measured string `json:"measured"`
	Met      *bool  `json:"met"` // null: not measurable (not built)
}

type options struct {
	out           string
	reps          int
	w1            time.Duration
	w2            time.Duration
	w2warm        time.Duration
	w2runs        int
	w2workers     int
	concurrency   int
	steps         int
	clientConns   int
	ceilWindow    time.Duration
	w3events      int
	w3load        time.Duration
	parked        int
	w4calls       int
	w5pause       time.Duration
	mcpCalls      int
	modes         string
	skip          string
	goBin         string
	keep          bool
	pprofDir      string
	extraEng      int
	foReps        int
	foClusterReps int
	abba          int
	interleave    int
	w1slices      int
	w2together    bool
	baseline      string
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "ceiling-server" {
		if err := ceilingServer(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "ceiling-server:", err)
			os.Exit(2)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "profiled-engine" {
		if err := profiledEngine(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "engine:", err)
			os.Exit(2)
		}
		return
	}
	if err := run(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	var o options
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.StringVar(&o.out, "out", "bench/results.json", "where to write the results as JSON")
	fs.IntVar(&o.reps, "reps", 3, "repetitions of every measurement (the median is reported)")
	fs.DurationVar(&o.w1, "w1", 5*time.Second, "W1: length of one repetition")
	fs.DurationVar(&o.w2, "w2", 10*time.Second, "W2: length of one measured window")
	fs.DurationVar(&o.w2warm, "w2-warmup", 3*time.Second, "W2: warm-up before the first window")
	fs.IntVar(&o.w2runs, "w2-runs", 64, "W2: runs at once")
	fs.IntVar(&o.w2workers, "w2-workers", 2, "W2: sandbox worker processes")
	fs.IntVar(&o.concurrency, "worker-concurrency", 16, "--concurrency of each sandbox worker")
	fs.IntVar(&o.steps, "steps-per-run", 10, "batches (steps) of each run before the next run starts")
	fs.IntVar(&o.clientConns, "client-conns", 4, "NATS connections of the load generator (W2 spreads its runs over them)")
	fs.DurationVar(&o.ceilWindow, "ceiling-window", 3*time.Second, "length of one expected-sequence publish measurement")
	fs.IntVar(&o.w3events, "w3-events", 1_000_000, "W3: events in the recorded stream")
	fs.DurationVar(&o.w3load, "w3-load-limit", 90*time.Second, "W3: stop loading NATS after this long (the NATS figures then cover fewer events)")
	fs.IntVar(&o.parked, "parked", 10000, "runs to park for the memory figure (0: skip)")
	fs.IntVar(&o.w4calls, "w4-calls", 40, "W4: calls per repetition")
	fs.DurationVar(&o.w5pause, "w5-pause", 250*time.Millisecond, "W5: idle pause after each batch (the model's turn)")
	fs.IntVar(&o.mcpCalls, "mcp-calls", 10, "MCP: calls per repetition")
	fs.StringVar(&o.modes, "modes", "default,sync_always", "modes: default, sync_always, unsigned (the default mode with the engine's --unsigned: what signing costs), metrics (the default mode with --metrics-listen, scraped every second: what metrics cost), observed (metrics as in the metrics mode and OpenTelemetry traces exported to an OTLP receiver in the bench: what observability costs), baseline (the default mode with the engine and worker built from --baseline: what a change of the code does); a mode may be given more than once")
	fs.StringVar(&o.skip, "skip", "", "comma-separated parts to skip: w1, w2, census, ceiling, parked, w3, w4, w5, mcp, failover")
	fs.IntVar(&o.foReps, "failover-reps", 5, "failover: repetitions of restart, takeover and projection after a kill")
	fs.IntVar(&o.foClusterReps, "failover-cluster-reps", 3, "failover: repetitions of each fault of the 3-node cluster (0: skip the cluster)")
	fs.StringVar(&o.goBin, "go", "go", "the go command that builds the programs")
	fs.BoolVar(&o.keep, "keep", false, "keep the temporary directory (stores, logs, the recorded stream)")
	fs.IntVar(&o.extraEng, "extra-engines", 0, "start this many more engines on the first engine's server (a scale-out check; not part of make bench)")
	fs.StringVar(&o.pprofDir, "pprof-dir", "", "run the engine of the first of --modes with CPU profiling and write w1.pprof (W1 noop), w1echo.pprof and w2.pprof here")
	fs.IntVar(&o.abba, "abba", 0, "run the two --modes (the default mode and a variant) in this many pairs, ordered default-variant, variant-default, ..., and print the variant's ratios over the default's, pair by pair and their medians")
	fs.IntVar(&o.interleave, "interleave", 0, "run the two --modes (default,VARIANT) side by side and measure them in this many rounds of W1 and W2, one mode then the other (the order alternating), and print the variant's ratios over the default's, round by round, their medians and their balanced geometric means")
	fs.IntVar(&o.w1slices, "w1-slices", 8, "with --interleave: measure each round's W1 as this many windows of --w1/N on each mode, in turns (A B B A ...), and compare the p50s of all their batches")
	fs.StringVar(&o.baseline, "baseline", "", "a checkout of toolbatch (say a git worktree of an earlier commit) whose engine and worker the baseline mode runs: --interleave N --modes default,baseline compares this checkout with it")
	fs.BoolVar(&o.w2together, "w2-together", false, "with --interleave: run the two modes' W2 at once, sharing the machine, rather than one after the other; their ratio is then free of the machine's drift and of the order of measurement")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.abba > 0 && o.interleave > 0 {
		return errors.New("--abba and --interleave are two ways of pairing the modes: give one")
	}
	if o.abba > 0 {
		var err error
		if o.modes, err = abbaModes(o.modes, o.abba); err != nil {
			return err
		}
	}
	skip := map[string]bool{}
	for _, s := range strings.Split(o.skip, ",") {
		skip[strings.TrimSpace(s)] = true
	}
	withCensus = !skip["census"]
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	res := Results{Machine: machine(), Command: command(args), Started: time.Now().UTC(), Settings: Settings{
		Reps: o.reps, W1Window: o.w1.String(), W2Window: o.w2.String(), W2Warmup: o.w2warm.String(), W2Runs: o.w2runs,
		W2Workers: o.w2workers, WorkerConcurrency: o.concurrency, StepsPerRun: o.steps, ClientConns: o.clientConns,
		CeilingWindow: o.ceilWindow.String(), W3Events: o.w3events, ParkedRuns: o.parked, FailoverReps: o.foReps, FailoverCluster: o.foClusterReps,
		Interleave: o.interleave, W2Together: o.w2together}}
	if o.interleave > 0 {
		res.Settings.W1Slices = o.w1slices
	}
	if skip["parked"] {
		res.Settings.ParkedRuns = 0
	}
	if skip["failover"] {
		res.Settings.FailoverReps, res.Settings.FailoverCluster = 0, 0
	}
	res.Background.LoadAvgBefore = loadAvg()
	res.Background.BusyCoresBefore = Num(busyCores(2 * time.Second))
	start := time.Now()
	tmp, err := os.MkdirTemp("", "toolbatch-bench-")
	if err != nil {
		return err
	}
	if o.keep {
		fmt.Fprintln(os.Stderr, "bench: keeping", tmp)
	} else {
		defer os.RemoveAll(tmp)
	}
	root, err := moduleRoot(o.goBin)
	if err != nil {
		return err
	}
	modes := strings.Split(o.modes, ",")
	for i, mode := range modes {
		modes[i] = strings.TrimSpace(mode)
		if !knownModes[modes[i]] {
			return fmt.Errorf("--modes: unknown mode %q", modes[i])
		}
	}
	if slices.Contains(modes, "baseline") != (o.baseline != "") {
		return errors.New("--baseline DIR and the baseline mode go together")
	}
	if o.pprofDir != "" && modes[0] == "baseline" {
		return errors.New("--pprof-dir profiles the engine built from this checkout: the baseline mode cannot come first")
	}
	progress("building the engine, the sandbox worker and replay")
	bins, err := build(o.goBin, root, filepath.Join(tmp, "bin"))
	if err != nil {
		return err
	}
	if o.baseline != "" {
		if o.baseline, err = filepath.Abs(o.baseline); err != nil {
			return err
		}
		progress("building the baseline's engine and sandbox worker in " + o.baseline)
		base, err := build(o.goBin, o.baseline, filepath.Join(tmp, "bin-baseline"))
		if err != nil {
			return fmt.Errorf("--baseline: %w", err)
		}
		bins.baseline = &base
		res.Settings.Baseline = o.baseline
		if out, err := exec.Command("git", "-C", o.baseline, "describe", "--always", "--dirty").Output(); err == nil {
			res.Settings.BaselineCommit = strings.TrimSpace(string(out))
		}
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if o.pprofDir != "" {
		if o.pprofDir, err = filepath.Abs(o.pprofDir); err != nil {
			return err
		}
		if err := os.MkdirAll(o.pprofDir, 0o755); err != nil {
			return err
		}
	}

	if o.interleave > 0 && (!skip["w1"] || !skip["w2"]) {
		if res.Pairs, err = runInterleaved(ctx, o, skip, bins, tmp, o.interleave); err != nil {
			return fmt.Errorf("interleaved: %w", err)
		}
	}
	for i, mode := range modes {
		if o.interleave > 0 {
			break
		}
		if skip["w1"] && skip["w2"] && skip["ceiling"] {
			break
		}
		// a mode may be listed twice (interleaved pairs): each run its own store
		mr, err := runMode(ctx, o, skip, mode, bins, self, filepath.Join(tmp, fmt.Sprintf("%d-%s", i, mode)))
		if err != nil {
			return fmt.Errorf("mode %s: %w", mode, err)
		}
		res.Modes = append(res.Modes, mr)
	}
	if !skip["parked"] && o.parked > 0 {
		if res.Parked, err = runParkedMode(ctx, o, bins, filepath.Join(tmp, "parked")); err != nil {
			return err
		}
	}
	if !skip["w3"] {
		progress(fmt.Sprintf("W3: generating %d events and replaying them from a file and from NATS", o.w3events))
		w3, err := runW3(ctx, bins.replay, filepath.Join(tmp, "w3"), o.w3events, o.steps, o.reps, o.w3load)
		if err != nil {
			return fmt.Errorf("W3: %w", err)
		}
		progress(fmt.Sprintf("W3: auditing %d events, signed and unsigned", min(o.w3events, w3SignedEvents)))
		sg, err := runW3Signing(ctx, bins.replay, filepath.Join(tmp, "w3-signing"), min(o.w3events, w3SignedEvents), o.steps, o.reps)
		if err != nil {
			return fmt.Errorf("W3 signed: %w", err)
		}
		w3.Signing = &sg
		res.W3 = &w3
	}
	if !skip["w4"] {
		progress("W4: sandboxed /bin/true against a bare exec")
		w4, err := runW4(ctx, o.reps, o.w4calls)
		if err != nil {
			return fmt.Errorf("W4: %w", err)
		}
		res.W4 = &w4
	}
	if !skip["w5"] {
		progress("W5: batches of 4 sandboxed /bin/true calls after an idle pause")
		w5, err := runW5(ctx, bins, o.reps, o.w1, o.w5pause)
		if err != nil {
			return fmt.Errorf("W5: %w", err)
		}
		res.W5 = &w5
	}
	if !skip["mcp"] {
		progress("MCP: one call of an MCP tool per sandbox, against a bare client")
		m, err := runMCP(ctx, root, bins, o.reps, o.mcpCalls)
		if err != nil {
			return fmt.Errorf("MCP: %w", err)
		}
		res.MCP = &m
	}
	if !skip["failover"] {
		fo, err := runFailover(ctx, o, root, bins, filepath.Join(tmp, "failover"))
		if err != nil {
			return fmt.Errorf("failover: %w", err)
		}
		res.Failover = fo
	}
	res.Background.LoadAvgAfter = loadAvg()
	res.Background.BusyCoresAfter = Num(busyCores(2 * time.Second))
	res.Pairs = append(res.Pairs, pairs(res.Modes)...)
	res.PairMedians = summarize(res.Pairs)
	res.Targets = targets(&res)
	res.Seconds = Num(time.Since(start).Seconds())
	printTable(os.Stdout, &res)
	data, err := json.MarshalIndent(&res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(o.out, append(data, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Printf("\nresults written to %s\n", o.out)
	return nil
}

func progress(msg string) {
	fmt.Fprintf(os.Stderr, "bench %s: %s\n", time.Now().Format("15:04:05"), msg)
}

// knownModes are the modes --modes takes.
var knownModes = map[string]bool{"default": true, "sync_always": true, "unsigned": true, "metrics": true, "observed": true, "baseline": true}

// runMode runs W1, W2, the ceiling and (default mode) the parked runs
// against one engine.
func runMode(ctx context.Context, o options, skip map[string]bool, mode string, bins binaries, self, dir string) (ModeResult, error) {
	mr := ModeResult{Mode: mode, EngineFlag: "(none: the embedded server's default periodic flush)",
		Engines: 1 + o.extraEng, Ratios: Ratios{Num(nan()), Num(nan()), Num(nan()), Num(nan()), Num(nan())}}
	switch mode {
	case "sync_always":
		mr.EngineFlag = "--sync-always"
	case "unsigned":
		mr.EngineFlag = "--unsigned"
	case "metrics":
		mr.EngineFlag = "--metrics-listen (engine and workers), scraped every second"
	case "observed":
		mr.EngineFlag = "--metrics-listen (engine and workers), scraped every second, and OTLP traces (" + tracing.EnvEndpoint + ") to a receiver in the bench"
	case "baseline":
		mr.EngineFlag = "(none; the engine and worker built from " + o.baseline + ")"
	}
	copts := modeOptions(o, mode, bins)
	if o.extraEng > 0 {
		batchTimeout = 10 * time.Minute
	}
	profiling := o.pprofDir != "" && mode == strings.TrimSpace(strings.Split(o.modes, ",")[0])
	if profiling {
		copts.engineBin, copts.engineArgs = self, []string{"profiled-engine", "--pprof-dir", o.pprofDir}
	}
	progress(fmt.Sprintf("%s: starting the engine and one sandbox worker", mode))
	c, err := startCluster(dir, copts)
	if err != nil {
		return mr, err
	}
	defer c.stop()
	// profile starts (part: its name) or stops (part "") the engine's profile.
	profile := func(sig syscall.Signal, part string) {
		if !profiling {
			return
		}
		if part != "" {
			_ = os.WriteFile(filepath.Join(o.pprofDir, profileNext), []byte(part), 0o644)
		}
		_ = c.engine.cmd.Process.Signal(sig)
		time.Sleep(100 * time.Millisecond)
	}
	evFrom, _ := lastSeq(ctx, c.js, "TOOLBATCH_EVENTS")
	if !skip["w1"] {
		progress(fmt.Sprintf("%s: W1 noop (%d x %s)", mode, o.reps, o.w1))
		profile(syscall.SIGUSR1, "w1")
		r, err := runW1(ctx, c, "noop", o.reps, o.w1, o.steps)
		profile(syscall.SIGUSR2, "")
		if err != nil {
			return mr, fmt.Errorf("W1 noop: %w", err)
		}
		mr.W1Noop = &r
	}
	evTo, _ := lastSeq(ctx, c.js, "TOOLBATCH_EVENTS")
	if !skip["w1"] {
		progress(fmt.Sprintf("%s: W1 echo (%d x %s)", mode, o.reps, o.w1))
		profile(syscall.SIGUSR1, "w1echo")
		r, err := runW1(ctx, c, "echo", o.reps, o.w1, o.steps)
		profile(syscall.SIGUSR2, "")
		if err != nil {
			return mr, fmt.Errorf("W1 echo: %w", err)
		}
		mr.W1Echo = &r
	}
	if !skip["w2"] {
		for len(c.workers) < o.w2workers {
			if err := c.addWorker(); err != nil {
				return mr, err
			}
		}
		progress(fmt.Sprintf("%s: W2 %d runs at once, %d workers (%s warm-up, %d x %s)", mode, o.w2runs, len(c.workers), o.w2warm, o.reps, o.w2))
		profile(syscall.SIGUSR1, "w2")
		r, err := runW2(ctx, c, o.w2runs, o.reps, o.w2warm, o.w2, o.steps)
		profile(syscall.SIGUSR2, "")
		if err != nil {
			return mr, fmt.Errorf("W2: %w", err)
		}
		r.Concurrency = o.concurrency
		mr.W2 = &r
	}
	if c.otlp != nil && c.otlp.exports.Load() == 0 && (!skip["w1"] || !skip["w2"]) {
		return mr, errors.New("observed mode: the programs exported no trace")
	}
	if !skip["ceiling"] {
		payload := 400
		if evTo > evFrom {
			payload = commitPayload(ctx, c.js, evFrom+1, evTo)
		}
		// The ceiling has the machine to itself: the engine stops first.
		if err := c.checkAlive(); err != nil {
			return mr, err
		}
		c.stop()
		ceil, hr, err := runCeilingMode(ctx, o, mode, self, dir, payload, !skip["w2"])
		if err != nil {
			return mr, err
		}
		mr.Ceiling, mr.HandRolled = ceil, hr
	}
	if mr.W1Noop != nil && mr.HandRolled != nil {
		mr.Ratios.W1P50OverHandRolled = Num(ratio(float64(mr.W1Noop.P50ms), float64(mr.HandRolled.P50ms)))
	}
	if mr.W1Noop != nil && mr.Ceiling != nil {
		mr.Ratios.W1P50OverAwaitedPublish = Num(ratio(float64(mr.W1Noop.P50ms), float64(mr.Ceiling.SyncPubP50)))
	}
	if mr.HandRolled != nil && mr.Ceiling != nil {
		mr.Ratios.HandRolledOverPublish = Num(ratio(float64(mr.HandRolled.P50ms), float64(mr.Ceiling.SyncPubP50)))
	}
	if mr.W2 != nil && mr.Ceiling != nil {
		mr.Ratios.W2CommitsOverCeiling = Num(ratio(float64(mr.W2.CommitsPerSec), float64(mr.Ceiling.ExpectPubBest)))
	}
	if mr.HandRolled != nil && mr.HandRolled.W2 != nil && mr.Ceiling != nil {
		mr.Ratios.HandRolledW2OverCeiling = Num(ratio(float64(mr.HandRolled.W2.CommitsPerSec), float64(mr.Ceiling.ExpectPubBest)))
	}
	if skip["ceiling"] {
		return mr, c.checkAlive()
	}
	return mr, nil
}

// modeOptions are the cluster options of a mode: one sandbox worker (W2
// adds the others).
func modeOptions(o options, mode string, bins binaries) clusterOptions {
	if mode == "baseline" {
		bins = *bins.baseline
	}
	return clusterOptions{engineBin: bins.engine, workerBin: bins.worker, syncAlways: mode == "sync_always", unsigned: mode == "unsigned",
		metrics: mode == "metrics" || mode == "observed", tracing: mode == "observed",
		workers: 1, concurrency: o.concurrency, clientConns: o.clientConns, extraEngine: o.extraEng}
}

// runCeilingMode measures the ceiling in a process of its own that embeds
// a fresh server exactly as the engine does (same options, same sync
// mode), then the hand-rolled W1 minimum against it (and, with withW2,
// under W2's load): the minimal engine and projector in that process, the
// minimal workers and the client here.
func runCeilingMode(ctx context.Context, o options, mode, self, dir string, payload int, withW2 bool) (*Ceiling, *HandRolled, error) {
	port, err := testproc.Port()
	if err != nil {
		return nil, nil, err
	}
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	file := filepath.Join(dir, "ceiling.json")
	args := []string{"ceiling-server", "--store", filepath.Join(dir, "ceiling-store"), "--listen", fmt.Sprintf("127.0.0.1:%d", port),
		"--payload", fmt.Sprint(payload), "--reps", fmt.Sprint(o.reps), "--window", o.ceilWindow.String(), "--results", file}
	if mode == "sync_always" {
		args = append(args, "--sync-always")
	}
	progress(fmt.Sprintf("%s: ceiling: raw JetStream primitives inside a fresh embedded server's process", mode))
	p, err := startProcWait("ceiling-server", "ceiling-server ready", 10*time.Minute, self, args...)
	if err != nil {
		return nil, nil, err
	}
	defer p.stop()
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, nil, err
	}
	var ceil Ceiling
	if err := json.Unmarshal(data, &ceil); err != nil {
		return nil, nil, err
	}
	// The same latencies from another process: what workers and clients
	// see.
	body := make([]byte, payload)
	var p2c50, p2c99, pub50, req50 []float64
	for r := 0; r < o.reps; r++ {
		p2c, pub, req, err := latencies(ctx, endpoint{url: url}, 1000, body, 100+r)
		if err != nil {
			return nil, nil, fmt.Errorf("latencies from another process: %w", err)
		}
		p2c50, p2c99 = append(p2c50, percentile(p2c, 50)), append(p2c99, percentile(p2c, 99))
		pub50, req50 = append(pub50, percentile(pub, 50)), append(req50, percentile(req, 50))
	}
	ceil.Remote = &RemoteLatency{PubToConsumeP50: Num(median(p2c50)), PubToConsumeP99: Num(median(p2c99)),
		SyncPubP50: Num(median(pub50)), RequestP50: Num(median(req50))}
	progress(fmt.Sprintf("%s: ceiling: hand-rolled minimum (W1: %d x %s; then under W2's load)", mode, o.reps, o.w1))
	failed := func() error {
		if !p.alive() {
			return fmt.Errorf("the minimal engine's process died:\n%s", p.tail(4096))
		}
		return nil
	}
	var w2 HandRolledW2
	if withW2 {
		w2 = HandRolledW2{Runs: o.w2runs, Workers: o.w2workers, Concurrency: o.concurrency}
	}
	hr, err := runHandRolled(ctx, url, p.pid(), failed, o.reps, o.w1, o.steps, w2)
	if err != nil {
		return nil, nil, err
	}
	return &ceil, &hr, nil
}

// runParkedMode parks runs on a fresh engine of the default mode (no
// workers: the parked calls are brain calls stopped at the gate).
func runParkedMode(ctx context.Context, o options, bins binaries, dir string) (*ParkedResult, error) {
	progress(fmt.Sprintf("parked runs: a fresh engine (default mode) parks %d runs on a permission ticket", o.parked))
	c, err := startCluster(dir, clusterOptions{engineBin: bins.engine, workerBin: bins.worker, clientConns: o.clientConns})
	if err != nil {
		return nil, err
	}
	defer c.stop()
	p, err := runParked(ctx, c, o.parked)
	if err != nil {
		return nil, fmt.Errorf("parked runs: %w", err)
	}
	return &p, c.checkAlive()
}

func machine() Machine {
	m := Machine{Cores: runtime.NumCPU(), Go: runtime.Version(), NATSServer: server.VERSION}
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int
		if _, err := fmt.Sscanf(string(data), "MemTotal: %d kB", &kb); err == nil {
			m.MemoryMiB = kb / 1024
		}
	}
	if data, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(data))
	}
	m.Hostname, _ = os.Hostname()
	if out, err := execOutput("bwrap", "--version"); err == nil {
		m.Bubblewrap = strings.TrimSpace(out)
	}
	m.Description = fmt.Sprintf("%d cores, %s, %d MiB, Linux %s", m.Cores, m.CPU, m.MemoryMiB, m.Kernel)
	return m
}

// command is how the benchmark was started.
func command(args []string) string {
	c := "go run ./bench"
	if len(args) > 0 {
		c += " " + strings.Join(args, " ")
	}
	if os.Getenv("MAKELEVEL") != "" {
		c = "make bench  (" + c + ")"
	}
	return c
}

func boolp(b bool) *bool { return &b }

func fmtNum(n Num, unit string) string {
	f := float64(n)
	switch {
	case math.IsNaN(f):
		return "n/a"
	case math.Abs(f) >= 100:
		return fmt.Sprintf("%.0f%s", f, unit)
	case math.Abs(f) >= 10:
		return fmt.Sprintf("%.1f%s", f, unit)
	default:
		return fmt.Sprintf("%.2f%s", f, unit)
	}
}

// targets checks issue 7's targets on the default mode.
func targets(r *Results) []TargetResult {
	var out []TargetResult
	var def *ModeResult
	for i := range r.Modes {
		if r.Modes[i].Mode == "default" {
			def = &r.Modes[i]
		}
	}
	add := func(target, measured string, met *bool) {
		out = append(out, TargetResult{Target: target, Measured: measured, Met: met})
	}
	if def != nil && def.W2 != nil && def.Ceiling != nil {
		ratio := float64(def.Ratios.W2CommitsOverCeiling)
		add("W2 commit rate >= 50% of the raw async expected-sequence publish ceiling",
			fmt.Sprintf("%s commits/s of %s/s = %.0f%% (the hand-rolled minimum under W2's load: %.0f%%)", fmtNum(def.W2.CommitsPerSec, ""), fmtNum(def.Ceiling.ExpectPubBest, ""), 100*ratio,
				100*float64(def.Ratios.HandRolledW2OverCeiling)),
			boolp(ratio >= 0.5))
	}
	if def != nil && def.W1Noop != nil && def.HandRolled != nil {
		ratio := float64(def.Ratios.W1P50OverHandRolled)
		add("W1 p50 <= 2x the hand-rolled minimum",
			fmt.Sprintf("%s ms vs %s ms = %.1fx", fmtNum(def.W1Noop.P50ms, ""), fmtNum(def.HandRolled.P50ms, ""), ratio),
			boolp(ratio <= 2))
	}
	if r.W3 != nil {
		add("W3 >= 1,000,000 events/s from a file",
			fmt.Sprintf("%s events/s folding (%s events/s wall, with printing)", fmtNum(r.W3.FileFoldRate, ""), fmtNum(r.W3.FileWallRate, "")),
			boolp(float64(r.W3.FileFoldRate) >= 1e6))
		add("W3 >= 200,000 events/s from NATS",
			fmt.Sprintf("%s events/s folding (%s events/s wall, with printing)", fmtNum(r.W3.NATSFoldRate, ""), fmtNum(r.W3.NATSWallRate, "")),
			boolp(float64(r.W3.NATSFoldRate) >= 2e5))
	}
	if r.Parked != nil {
		add(fmt.Sprintf("engine RSS <= 150 MB holding %d parked runs", r.Parked.Runs),
			fmt.Sprintf("%s MiB (%d parked)", fmtNum(r.Parked.EngineRSSMiB, ""), r.Parked.Parked),
			boolp(float64(r.Parked.EngineRSSMiB)*1.048576 <= 150 && r.Parked.Parked >= r.Parked.Runs))
	}
	if r.W4 != nil {
		var met *bool
		if x := float64(r.W4.PrestartedOverBare); x == x {
			met = boolp(x <= 1.5)
		}
		add("W4 with pre-started sandboxes <= 1.5x a bare exec",
			fmt.Sprintf("%s ms vs bare %s ms = %.2fx (back to back %.2fx; without them %s ms = %.1fx)", fmtNum(r.W4.PrestartedP50ms, ""), fmtNum(r.W4.BareP50ms, ""),
				float64(r.W4.PrestartedOverBare), float64(r.W4.BackToBackPrestartedOverBare), fmtNum(r.W4.BwrapP50ms, ""), float64(r.W4.BwrapOverBare)),
			met)
	}
	if def != nil && def.W1Noop != nil && def.W1Noop.Census != nil {
		c := def.W1Noop.Census
		add("at most 50 NATS messages per W1 noop batch (4 worker calls)",
			fmt.Sprintf("%s messages a batch (%d batches counted)", fmtNum(c.Total, ""), c.Batches),
			boolp(float64(c.Total) <= 50))
	}
	if x := r.W5; x != nil && x.Skipped == "" && def != nil && def.W1Noop != nil {
		bound := float64(def.W1Noop.P50ms) + 4*1.5*float64(x.BareP50ms)
		add("W5 p50 <= W1 noop p50 + 4 x 1.5 x a bare exec",
			fmt.Sprintf("%s ms vs %.2f ms (W1 noop %s ms, bare exec %s ms; isolation none %s ms)", fmtNum(x.BwrapP50ms, ""), bound,
				fmtNum(def.W1Noop.P50ms, ""), fmtNum(x.BareP50ms, ""), fmtNum(x.NoneP50ms, "")),
			boolp(float64(x.BwrapP50ms) <= bound))
	}
	for _, p := range r.PairMedians {
		if p.Variant != "observed" {
			continue
		}
		// The balanced geometric mean when the pairs were taken in both
		// orders (PairSummary), else the median.
		m, how := p.Median, fmt.Sprintf("medians of %d pairs", p.Pairs)
		if p.Balanced != nil {
			m, how = *p.Balanced, fmt.Sprintf("balanced geometric means of %d pairs", p.Pairs)
		}
		add("observed (metrics and traces on): W1 and W2 within 3% of the default mode",
			fmt.Sprintf("%s: W1 noop p50 %.3fx, W1 echo p50 %.3fx, W2 batches/s %.3fx (engine CPU per call %.3fx)", how,
				float64(m.W1NoopP50), float64(m.W1EchoP50), float64(m.W2BatchesPerS), float64(m.W2EngineCPU)),
			boolp(float64(m.W1NoopP50) <= 1.03 && float64(m.W1EchoP50) <= 1.03 && float64(m.W2BatchesPerS) >= 0.97))
	}
	// The comparison with DBOS is measured in the same run by make
	// bench-peers (bench/peers), never against a figure from elsewhere.
	if f := r.Failover; f != nil {
		for _, x := range []struct {
			target string
			fig    *FailoverFigure
		}{
			{`failover restart: each run's first commit within 2 s of "engine ready"`, f.Restart},
			{"failover takeover: each run's first commit within 5 s of the kill", f.Takeover},
			{"failover projection: an out message of a later commit within 5 s of one engine's kill", f.Projection},
		} {
			if x.fig != nil {
				add(x.target, fmt.Sprintf("median %s, max %s (%d samples)", x.fig.Median, x.fig.Max, x.fig.Samples), x.fig.Met)
			}
		}
		for _, x := range []struct {
			target string
			fault  *ClusterFault
		}{
			{"failover, events leader paused: no owner change, no indeterminate", f.Paused},
			{"failover, events leader killed: no owner change, no indeterminate", f.Killed},
		} {
			if c := x.fault; c != nil {
				add(x.target, fmt.Sprintf("%d owner changes, %d took over, %d lost, %d indeterminate (%d faults)", c.OwnerChanges, c.TookOver, c.Lost, c.Indeterminate, len(c.Reps)), c.Met)
			}
		}
	}
	return out
}

func printTable(w io.Writer, r *Results) {
	fmt.Fprintf(w, "toolbatch benchmark — %s\n", r.Machine.Description)
	fmt.Fprintf(w, "command: %s\n", r.Command)
	every := fmt.Sprintf("every figure: median of %d repetitions", r.Settings.Reps)
	if n := r.Settings.Interleave; n > 0 {
		every = fmt.Sprintf("W1 and W2: %d interleaved rounds of one repetition per mode (W1 in %d windows per mode, in turns), each ratio the median of the rounds'", n, r.Settings.W1Slices)
	}
	fmt.Fprintf(w, "%s; W1 %s per repetition, W2 %s windows after %s warm-up, %d runs at once, %d workers (--concurrency %d); runs of %d batches\n\n",
		every, r.Settings.W1Window, r.Settings.W2Window, r.Settings.W2Warmup, r.Settings.W2Runs, r.Settings.W2Workers,
		r.Settings.WorkerConcurrency, r.Settings.StepsPerRun)
	fmt.Fprintf(w, "machine without the benchmark: %s cores busy before, %s after (load average %s before, %s after)\n\n",
		fmtNum(r.Background.BusyCoresBefore, ""), fmtNum(r.Background.BusyCoresAfter, ""), r.Background.LoadAvgBefore, r.Background.LoadAvgAfter)
	for _, m := range r.Modes {
		fmt.Fprintf(w, "== durability: %s %s\n", m.Mode, m.EngineFlag)
		if m.Engines > 1 {
			fmt.Fprintf(w, "   %d engines share the first one's embedded server (--extra-engines)\n", m.Engines)
		}
		fmt.Fprintf(w, "%-44s %10s %10s %12s %10s\n", "", "p50 ms", "p99 ms", "batches/s", "commits/b")
		for _, x := range []*W1Result{m.W1Noop, m.W1Echo} {
			if x != nil {
				fmt.Fprintf(w, "%-44s %10s %10s %12s %10s\n", "W1 4 x "+x.Tool+" ("+x.Where+")", fmtNum(x.P50ms, ""), fmtNum(x.P99ms, ""),
					fmtNum(x.BatchesPerSec, ""), fmtNum(x.Commits, ""))
			}
		}
		for _, x := range []*W1Result{m.W1Noop, m.W1Echo} {
			if x != nil {
				fmt.Fprintf(w, "    W1 %s CPU per batch: engine process %s ms (%s cores), worker %s ms, load generator %s ms; everything else on the machine %s cores\n",
					x.Tool, fmtNum(x.EngineCPUms, ""), fmtNum(x.EngineCPUCores, ""), fmtNum(x.WorkerCPUms, ""), fmtNum(x.ClientCPUms, ""), fmtNum(x.OtherCPUCores, ""))
			}
		}
		for _, x := range []*W1Result{m.W1Noop, m.W1Echo} {
			if x != nil && x.Census != nil {
				fmt.Fprintf(w, "    NATS messages per W1 %s batch: %s in all: %s\n", x.Tool, fmtNum(x.Census.Total, ""), censusLine(x.Census))
			}
		}
		if h := m.HandRolled; h != nil {
			fmt.Fprintf(w, "%-44s %10s %10s %12s %10s\n", "hand-rolled W1 minimum (no engine logic)", fmtNum(h.P50ms, ""), fmtNum(h.P99ms, ""),
				fmtNum(h.BatchesPerSec, ""), fmtNum(h.Commits, ""))
			fmt.Fprintf(w, "    hand-rolled CPU per batch: server + minimal engine + projector (one process) %s ms, minimal worker + client %s ms\n",
				fmtNum(h.ServerCPUms, ""), fmtNum(h.BenchCPUms, ""))
			if x := h.W2; x != nil {
				fmt.Fprintf(w, "    hand-rolled under W2's load (%d runs at once, %d workers of concurrency %d): %s batches/s, p50 %s ms, %s commits/s\n",
					x.Runs, x.Workers, x.Concurrency, fmtNum(x.BatchesPerSec, ""), fmtNum(x.P50ms, ""), fmtNum(x.CommitsPerSec, ""))
			}
		}
		if x := m.W2; x != nil {
			fmt.Fprintf(w, "%-44s %10s %10s %12s\n", fmt.Sprintf("W2 %d runs x 4 noop, %d workers", x.Runs, x.Workers), fmtNum(x.P50ms, ""), fmtNum(x.P99ms, ""),
				fmtNum(x.BatchesPerSec, ""))
			fmt.Fprintf(w, "    calls/s %s   commits/s %s   engine RSS %s MiB (peak %s)   engine CPU per call %s µs\n",
				fmtNum(x.CallsPerSec, ""), fmtNum(x.CommitsPerSec, ""), fmtNum(x.EngineRSSMiB, ""), fmtNum(x.EngineHWMMiB, ""), fmtNum(x.CPUPerCallUs, ""))
			fmt.Fprintf(w, "    CPU in cores: engine process %s, workers %s, load generator %s, everything else on the machine %s\n",
				fmtNum(x.EngineCPUCores, ""), fmtNum(x.WorkersCPU, ""), fmtNum(x.BenchCPU, ""), fmtNum(x.OtherCPU, ""))
		}
		if c := m.Ceiling; c != nil {
			fmt.Fprintf(w, "  ceiling (a fresh server embedded as the engine embeds it, measured from inside its process over in-process connections, as the engine connects; commit body %d bytes):\n", c.PayloadBytes)
			for _, cr := range c.ExpectPub {
				fmt.Fprintf(w, "    async publish, expected seq + msg id, %4d chains   %s msgs/s\n", cr.Chains, fmtNum(cr.MsgsPerSec, ""))
			}
			fmt.Fprintf(w, "    async publish, pipelined, no expectation           %s msgs/s\n", fmtNum(c.PlainAsyncPub, ""))
			fmt.Fprintf(w, "    work-queue fetch + ack (256 per pull)              %s msgs/s\n", fmtNum(c.WorkQueue, ""))
			fmt.Fprintf(w, "    publish -> consume latency                         p50 %s ms  p99 %s ms\n", fmtNum(c.PubToConsumeP50, ""), fmtNum(c.PubToConsumeP99, ""))
			fmt.Fprintf(w, "    one awaited publish (expected seq + msg id)        p50 %s ms\n", fmtNum(c.SyncPubP50, ""))
			fmt.Fprintf(w, "    core request/reply                                 p50 %s ms\n", fmtNum(c.RequestP50, ""))
			if r := c.Remote; r != nil {
				fmt.Fprintf(w, "    from another process (as workers and clients): awaited publish p50 %s ms, publish -> consume p50 %s ms (p99 %s), request/reply p50 %s ms\n",
					fmtNum(r.SyncPubP50, ""), fmtNum(r.PubToConsumeP50, ""), fmtNum(r.PubToConsumeP99, ""), fmtNum(r.RequestP50, ""))
			}
		}
		fmt.Fprintf(w, "  engine/ceiling: W1 p50 / hand-rolled p50 = %s   W2 commits / expected-seq ceiling = %s (hand-rolled under W2's load: %s)   W1 p50 / one awaited publish = %s\n\n",
			fmtNum(m.Ratios.W1P50OverHandRolled, "x"), fmtNum(m.Ratios.W2CommitsOverCeiling, ""), fmtNum(m.Ratios.HandRolledW2OverCeiling, ""), fmtNum(m.Ratios.W1P50OverAwaitedPublish, "x"))
	}
	if p := r.Parked; p != nil {
		fmt.Fprintf(w, "== parked runs (a fresh engine, default mode): %d runs parked in %s s (%s runs/s); engine RSS %s MiB before, %s MiB holding them (peak %s)\n\n",
			p.Parked, fmtNum(p.Seconds, ""), fmtNum(p.RunsPerSec, ""), fmtNum(p.EngineRSSStart, ""), fmtNum(p.EngineRSSMiB, ""), fmtNum(p.EngineHWMMiB, ""))
	}
	if x := r.W3; x != nil {
		fmt.Fprintf(w, "== W3 replay: %d events in %d commits, %d runs (file %s MiB)\n", x.Events, x.Commits, x.Runs, fmtNum(x.FileMiB, ""))
		fmt.Fprintf(w, "    from a file: %s events/s folding (replay's own rate), %s events/s for the whole process (%s s)\n",
			fmtNum(x.FileFoldRate, ""), fmtNum(x.FileWallRate, ""), fmtNum(x.FileWallSecs, ""))
		fmt.Fprintf(w, "    from NATS (%d events): %s events/s folding, %s events/s for the whole process (%s s)\n",
			x.NATSEvents, fmtNum(x.NATSFoldRate, ""), fmtNum(x.NATSWallRate, ""), fmtNum(x.NATSWallSecs, ""))
		if sg := x.Signing; sg != nil {
			fmt.Fprintf(w, "    audit of %d events (%d commits, each signed alone): unsigned %s events/s, signed with --keys %s events/s = %s\n",
				sg.Events, sg.Commits, fmtNum(sg.UnsignedAuditEPS, ""), fmtNum(sg.SignedAuditEPS, ""), fmtNum(sg.Ratio, "x"))
		}
		if x.Note != "" {
			fmt.Fprintf(w, "    note: %s\n", x.Note)
		}
		fmt.Fprintln(w)
	}
	if x := r.MCP; x != nil {
		fmt.Fprintf(w, "== MCP call (p50 of %d calls of the everything server's get-sum): one server per call: bare client (node, initialize, tools/call) %s ms; sandbox.Runner isolation none %s ms; bubblewrap %s ms; pre-started bubblewrap %s ms = %s the bare client\n",
			x.Calls, fmtNum(x.BareP50ms, ""), fmtNum(x.NoneP50ms, ""), fmtNum(x.FreshP50ms, ""), fmtNum(x.PrestartedP50ms, ""), fmtNum(x.PrestartedOverBare, "x"))
		fmt.Fprintf(w, "    a shared server (one long-lived bubblewrap sandbox): %s ms = %s a server per call (pre-started)\n",
			fmtNum(x.SharedP50ms, ""), fmtNum(x.SharedOverPrestarted, "x"))
		fmt.Fprintf(w, "    the whole path (a batch of one call: engine, worker process, sandbox, server; p50 of %d batches each): a server per call %s ms, a shared server %s ms\n",
			x.WholeSamples, fmtNum(x.WholePerCallP50ms, ""), fmtNum(x.WholeSharedP50ms, ""))
		if x.Skipped != "" {
			fmt.Fprintf(w, "    skipped: %s\n", x.Skipped)
		}
		fmt.Fprintln(w)
	}
	if x := r.W5; x != nil {
		fmt.Fprintf(w, "== W5 a sandboxed batch (%d x /bin/true on a worker, %s pause after each batch, prestart %d; %d batches): bubblewrap p50 %s ms (p99 %s); isolation none %s ms; the worker's builtin noop, no subprocess, %s ms; bare fork+exec %s ms\n",
			x.Calls, x.Pause, x.Prestart, x.Batches, fmtNum(x.BwrapP50ms, ""), fmtNum(x.BwrapP99ms, ""), fmtNum(x.NoneP50ms, ""), fmtNum(x.BuiltinP50ms, ""), fmtNum(x.BareP50ms, ""))
		if x.Skipped == "" {
			fmt.Fprintf(w, "    after the same pause: %d bare fork+execs %s ms; the builtin batch + 1.5 x those = %.2f ms, which bubblewrap's p50 is %.2fx (the target's bound takes W1 and the exec back to back)\n",
				x.Calls, fmtNum(x.BareBatchAfterPauseP50ms, ""), x.AfterPauseBound(), float64(x.BwrapP50ms)/x.AfterPauseBound())
		} else {
			fmt.Fprintf(w, "    %s\n", x.Skipped)
		}
		fmt.Fprintln(w)
	}
	if x := r.W4; x != nil {
		fmt.Fprintf(w, "== W4 sandbox cost (p50 of %d calls): bare fork+exec /bin/true %s ms; sandbox.Runner isolation none %s ms; bubblewrap %s ms (p99 %s) = %s a bare exec; pre-started bubblewrap %s ms (p99 %s) = %s a bare exec (%d calls in pre-started sandboxes, %d started their own)\n",
			x.Calls, fmtNum(x.BareP50ms, ""), fmtNum(x.NoneP50ms, ""), fmtNum(x.BwrapP50ms, ""), fmtNum(x.BwrapP99ms, ""), fmtNum(x.BwrapOverBare, "x"),
			fmtNum(x.PrestartedP50ms, ""), fmtNum(x.PrestartedP99ms, ""), fmtNum(x.PrestartedOverBare, "x"), x.PrestartedCalls, x.PrestartedFreshCalls)
		fmt.Fprintf(w, "    back to back (no pause between calls): bare %s ms, pre-started %s ms = %s a bare exec\n",
			fmtNum(x.BackToBackBareP50ms, ""), fmtNum(x.BackToBackPrestartedP50ms, ""), fmtNum(x.BackToBackPrestartedOverBare, "x"))
		if x.Skipped != "" {
			fmt.Fprintf(w, "    %s\n", x.Skipped)
		}
		fmt.Fprintln(w)
	}
	if f := r.Failover; f != nil {
		printFailover(w, f)
	}
	printPairs(w, r.Pairs, r.PairMedians)
	fmt.Fprintln(w, "== targets of issue 7 (default mode), of issue 16 (failover), of issue 17 (observability, from the pairs) and of issue 21 (messages, W5; W1 and W2 against DBOS: make bench-peers)")
	for _, t := range r.Targets {
		verdict := "not measurable"
		if t.Met != nil {
			verdict = map[bool]string{true: "MET", false: "NOT MET"}[*t.Met]
		}
		fmt.Fprintf(w, "  %-15s %-72s %s\n", verdict, t.Target, t.Measured)
	}
	fmt.Fprintf(w, "\ntotal %s s\n", fmtNum(r.Seconds, ""))
}

// errNoOutput is returned by execOutput for a command that printed nothing.
var errNoOutput = errors.New("no output")

func execOutput(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return "", err
	}
	if len(out) == 0 {
		return "", errNoOutput
	}
	return string(out), nil
}

// censusLine lists a census's kinds, most frequent first.
func censusLine(c *Census) string {
	type kv struct {
		k string
		v float64
	}
	var all []kv
	for k, v := range c.PerBatch {
		all = append(all, kv{k, float64(v)})
	}
	sort.Slice(all, func(i, j int) bool {
		if all[i].v != all[j].v {
			return all[i].v > all[j].v
		}
		return all[i].k < all[j].k
	})
	var parts []string
	for _, x := range all {
		if x.v < 0.5 || x.k == advisory {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %s", x.k, fmtNum(Num(x.v), "")))
	}
	return strings.Join(parts, ", ")
}
