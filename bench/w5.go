package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/toolbatch/toolbatch/protocol"
)

// W5Result is a sandboxed batch: W1's shape with 4 calls of /bin/true in
// bubblewrap on a sandbox worker, each batch after an idle pause (a
// model's turn), against the same calls with isolation none, the same
// batches of the worker's builtin noop (no subprocess: what the pause
// and the hops cost without any exec) and bare fork+execs of the same
// binary (back to back, and in batches after the same pause), measured in
// the same run.
type W5Result struct {
	Calls      int    `json:"calls_per_batch"`
	Pause      string `json:"pause_between_batches"`
	Prestart   int    `json:"prestart"`
	Batches    int    `json:"batches"`
	BwrapP50ms Num    `json:"bubblewrap_p50_ms"`
	BwrapP99ms Num    `json:"bubblewrap_p99_ms"`
	NoneP50ms  Num    `json:"isolation_none_p50_ms"`
	// BuiltinP50ms is W1 noop's batch after W5's pause, on the worker
	// with isolation none.
	BuiltinP50ms Num `json:"builtin_after_pause_p50_ms"`
	BareP50ms    Num `json:"bare_exec_p50_ms"`
	// BareBatchAfterPauseP50ms is Calls bare fork+execs of /bin/true one
	// after another, each time after W5's pause: what the batch's execs
	// cost without the engine, the worker or a sandbox, on cores that
	// slept through the pause as the batch's did.
	BareBatchAfterPauseP50ms Num    `json:"bare_batch_after_pause_p50_ms"`
	Skipped                  string `json:"skipped,omitempty"`
}

// AfterPauseBound is W5's bound made of figures measured after the same
// pause: the builtin batch after it plus 1.5 times the bare execs after
// it. The target's bound (W1 noop + 4 x 1.5 x a bare exec) takes W1 and
// the exec back to back, so the pause's cost counts against W5 alone.
func (x *W5Result) AfterPauseBound() float64 {
	return float64(x.BuiltinP50ms) + 1.5*float64(x.BareBatchAfterPauseP50ms)
}

const w5Catalog = `# toolbatch benchmark W5 catalog (bench/w5.go)
tools:
  - id: "true"
    target: sandbox
    recovery: {mode: replay_safe, max_attempts: 3}
  - id: noop
    target: sandbox
    recovery: {mode: replay_safe, max_attempts: 3}
`

// w5Worker is W4's worker config with the builtin noop beside /bin/true.
func w5Worker(isolation string, prestart int) string {
	return w4Config(isolation, prestart) + `  - id: noop
    builtin: noop
    capability: replay_safe
`
}

// w5Prestart is the worker's pre-started sandboxes: one per call of a
// batch.
const w5Prestart = 4

func runW5(ctx context.Context, bins binaries, reps int, dur, pause time.Duration) (W5Result, error) {
	res := W5Result{Calls: 4, Pause: pause.String(), Prestart: w5Prestart}
	if _, err := exec.LookPath("bwrap"); err != nil {
		res.Skipped = "bubblewrap is not installed (make sandbox-deps)"
		return res, nil
	}
	// The sandbox user must reach the workers' work roots.
	dir, err := reachableDir("toolbatch-bench-w5-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	clusters := map[string]*cluster{}
	defer func() {
		for _, c := range clusters {
			c.stop()
		}
	}()
	for _, v := range []struct {
		name     string
		prestart int
	}{{"bubblewrap", w5Prestart}, {"none", 0}} {
		c, err := startCluster(filepath.Join(dir, v.name), clusterOptions{engineBin: bins.engine, workerBin: bins.worker,
			workers: 1, concurrency: 4, clientConns: 1, catalog: w5Catalog, worker: w5Worker(v.name, v.prestart)})
		if err != nil {
			return res, fmt.Errorf("%s: %w", v.name, err)
		}
		clusters[v.name] = c
	}
	loops := 0
	loop := func(name, tool string, d time.Duration, to *[]time.Duration) error {
		c := clusters[name]
		loops++ // each loop its own runs: a run's batch submitted again is answered from the log
		stop := make(chan struct{})
		timer := time.AfterFunc(d, func() { close(stop) })
		defer timer.Stop()
		return clientLoop(ctx, loopConfig{client: c.clients[0], js: c.jss[0], prefix: protocol.DefaultPrefix, runPrefix: fmt.Sprintf("w5-%s-%d", name, loops),
			tool: tool, calls: res.Calls, stepsPerRun: 10, pause: pause}, stop, func(s sample) {
			if to != nil {
				*to = append(*to, s.lat)
			}
		})
	}
	bare := func(n int, to *[]time.Duration) error {
		for range n {
			t := time.Now()
			if err := exec.Command("/bin/true").Run(); err != nil {
				return err
			}
			*to = append(*to, time.Since(t))
		}
		return nil
	}
	// bareBatches times batches of res.Calls bare execs, each after the
	// pause, for about d.
	bareBatches := func(d time.Duration, to *[]time.Duration) error {
		for until := time.Now().Add(d); time.Now().Before(until); {
			time.Sleep(pause) // the pause is a length of time, not a condition
			t := time.Now()
			if err := bare(res.Calls, new([]time.Duration)); err != nil {
				return err
			}
			*to = append(*to, time.Since(t))
		}
		return nil
	}
	for _, name := range []string{"bubblewrap", "none"} { // warm-up
		if err := loop(name, "true", time.Second, nil); err != nil {
			return res, fmt.Errorf("W5 %s: %w", name, err)
		}
	}
	// The variants alternate, so that each sees the machine the others do.
	var bw, bw99, none, builtin, bareP, bareAfter []float64
	for range reps {
		var b, n, nb, e, ea []time.Duration
		if err := loop("bubblewrap", "true", dur, &b); err != nil {
			return res, fmt.Errorf("W5 bubblewrap: %w", err)
		}
		if err := loop("none", "true", dur, &n); err != nil {
			return res, fmt.Errorf("W5 none: %w", err)
		}
		if err := loop("none", "noop", dur, &nb); err != nil {
			return res, fmt.Errorf("W5 builtin noop: %w", err)
		}
		if err := bare(200, &e); err != nil {
			return res, fmt.Errorf("W5 bare exec: %w", err)
		}
		if err := bareBatches(dur, &ea); err != nil {
			return res, fmt.Errorf("W5 bare execs after the pause: %w", err)
		}
		res.Batches += len(b)
		bw, bw99 = append(bw, percentile(b, 50)), append(bw99, percentile(b, 99))
		none, bareP = append(none, percentile(n, 50)), append(bareP, percentile(e, 50))
		builtin, bareAfter = append(builtin, percentile(nb, 50)), append(bareAfter, percentile(ea, 50))
	}
	res.BwrapP50ms, res.BwrapP99ms = Num(median(bw)), Num(median(bw99))
	res.NoneP50ms, res.BareP50ms = Num(median(none)), Num(median(bareP))
	res.BuiltinP50ms, res.BareBatchAfterPauseP50ms = Num(median(builtin)), Num(median(bareAfter))
	for _, c := range clusters {
		if err := c.checkAlive(); err != nil {
			return res, err
		}
	}
	return res, nil
}
