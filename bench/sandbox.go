package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"time"

	"github.com/toolbatch/toolbatch/sandbox"
)

// W4: one sandboxed no-op subprocess call (/bin/true through
// sandbox.Runner, as a worker runs it: a fresh working directory,
// bubblewrap, prlimit, the tool, the output read and the sandbox torn
// down) against a bare fork and exec of /bin/true, in the same run,
// interleaved: bubblewrap started for the call (prestart: 0), and a
// pre-started sandbox (prestart: 2, the worker's default), which takes
// bubblewrap's start off the call's path. The same Runner with isolation
// none (prlimit, no bubblewrap) shows what bubblewrap itself costs.

// The benchmark program is the stage of its pre-started sandboxes: it is
// re-executed inside each one (sandbox.StageMain).
func init() { sandbox.StageMain() }

// W4Result is the sandbox cost.
type W4Result struct {
	Calls         int `json:"calls_per_rep"`
	BareP50ms     Num `json:"bare_exec_p50_ms"`
	NoneP50ms     Num `json:"runner_isolation_none_p50_ms"`
	BwrapP50ms    Num `json:"runner_bubblewrap_p50_ms"`
	BwrapP99ms    Num `json:"runner_bubblewrap_p99_ms"`
	BwrapOverBare Num `json:"bubblewrap_over_bare"`
	// Pre-started: the same Runner with prestart 2.
	PrestartedP50ms      Num   `json:"prestarted_p50_ms"`
	PrestartedP99ms      Num   `json:"prestarted_p99_ms"`
	PrestartedOverBare   Num   `json:"prestarted_over_bare"`
	PrestartedCalls      int64 `json:"prestarted_calls_in_prestarted_sandboxes"`
	PrestartedFreshCalls int64 `json:"prestarted_calls_that_started_their_own"`
	// Back to back: the same calls with no pause between them, so that
	// each competes with what the previous one left running (its
	// sandbox's teardown, its replacement's start) for the cores.
	BackToBackBareP50ms          Num    `json:"back_to_back_bare_exec_p50_ms"`
	BackToBackPrestartedP50ms    Num    `json:"back_to_back_prestarted_p50_ms"`
	BackToBackPrestartedOverBare Num    `json:"back_to_back_prestarted_over_bare"`
	Skipped                      string `json:"skipped,omitempty"`
}

// w4Config is the worker config of W4's runners and of W5's workers: one
// tool, /bin/true.
func w4Config(isolation string, prestart int) string {
	return fmt.Sprintf(`pools: [default]
isolation: %s
prestart: %d
tools:
  - id: "true"
    command: ["/bin/true"]
    capability: replay_safe
`, isolation, prestart)
}

// w4Gap is the pause before a paced call, after settle's condition: the
// teardown of the previous call's sandbox runs in the background, and
// nothing says when it is done.
const w4Gap = 10 * time.Millisecond

func runW4(ctx context.Context, reps, calls int) (W4Result, error) {
	res := W4Result{Calls: calls, PrestartedP50ms: Num(nan()), PrestartedP99ms: Num(nan()), PrestartedOverBare: Num(nan()),
		BackToBackPrestartedP50ms: Num(nan()), BackToBackPrestartedOverBare: Num(nan())}
	// The sandbox user (nobody, when we are root) must reach the work
	// root, so it is a directory of its own under the system temp dir
	// (the benchmark's temporary directory is private).
	root, err := reachableDir("toolbatch-bench-w4-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(root)
	runners := map[string]*sandbox.Runner{}
	defer func() {
		for _, r := range runners {
			_ = r.Close()
		}
	}()
	for _, v := range []struct {
		name, isolation string
		prestart        int
	}{{"none", "none", 0}, {"bubblewrap", "bubblewrap", 0}, {"prestarted", "bubblewrap", 2}} {
		cfg, err := sandbox.ParseConfig([]byte(w4Config(v.isolation, v.prestart)))
		if err != nil {
			return res, err
		}
		r, err := sandbox.NewRunner(cfg, sandbox.WithWorkRoot(root))
		if err != nil {
			if v.isolation == "bubblewrap" {
				res.Skipped = "bubblewrap cannot run here: " + err.Error()
				break
			}
			return res, err
		}
		runners[v.name] = r
	}
	if r := runners["prestarted"]; r != nil {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := r.WaitPrestarted(wctx)
		cancel()
		if err != nil {
			return res, fmt.Errorf("pre-started sandboxes: %w", err)
		}
	}
	call := func(r *sandbox.Runner, i int) error {
		out := r.Run(ctx, sandbox.Call{ToolID: "true", CallID: "c1", OperationID: fmt.Sprintf("w4/%d/c1", i), Attempt: 1})
		if out.Err != nil {
			return fmt.Errorf("sandboxed /bin/true: %s", out.Err.Message)
		}
		return nil
	}
	bare := func() error { return exec.Command("/bin/true").Run() }
	// timed runs f and appends its duration after the warm-up.
	timed := func(f func() error, i int, to *[]time.Duration) error {
		t := time.Now()
		if err := f(); err != nil {
			return err
		}
		if d := time.Since(t); i >= 0 {
			*to = append(*to, d)
		}
		return nil
	}
	// settle lets what the previous call left running in the background
	// finish (a sandbox's teardown, a replacement's start), so that a
	// paced call is timed on an idle machine, as the bare exec is.
	settle := func() error {
		if r := runners["prestarted"]; r != nil {
			wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err := r.WaitPrestarted(wctx)
			cancel()
			if err != nil {
				return fmt.Errorf("pre-started sandboxes: %w", err)
			}
		}
		time.Sleep(w4Gap)
		return nil
	}
	// loop times every variant, interleaved so that they see the same
	// machine; paced, each call comes after settle.
	type p50s struct{ bare, none, bw, bw99, pre, pre99 float64 }
	loop := func(paced bool) (p50s, error) {
		var b, n, w, p []time.Duration
		one := func(f func() error, i int, to *[]time.Duration) error {
			if paced {
				if err := settle(); err != nil {
					return err
				}
			}
			return timed(f, i, to)
		}
		for i := -3; i < calls; i++ {
			if err := one(bare, i, &b); err != nil {
				return p50s{}, err
			}
			if err := one(func() error { return call(runners["none"], i) }, i, &n); err != nil {
				return p50s{}, err
			}
			if r := runners["bubblewrap"]; r != nil {
				if err := one(func() error { return call(r, i) }, i, &w); err != nil {
					return p50s{}, err
				}
			}
			if r := runners["prestarted"]; r != nil {
				if err := one(func() error { return call(r, i) }, i, &p); err != nil {
					return p50s{}, err
				}
			}
		}
		return p50s{percentile(b, 50), percentile(n, 50), percentile(w, 50), percentile(w, 99), percentile(p, 50), percentile(p, 99)}, nil
	}
	var bareP, noneP, bwP, bwP99, preP, preP99, b2bBare, b2bPre []float64
	for rep := 0; rep < reps; rep++ {
		x, err := loop(true)
		if err != nil {
			return res, err
		}
		bareP, noneP = append(bareP, x.bare), append(noneP, x.none)
		bwP, bwP99 = append(bwP, x.bw), append(bwP99, x.bw99)
		preP, preP99 = append(preP, x.pre), append(preP99, x.pre99)
		y, err := loop(false)
		if err != nil {
			return res, err
		}
		b2bBare, b2bPre = append(b2bBare, y.bare), append(b2bPre, y.pre)
	}
	res.BareP50ms, res.NoneP50ms = Num(median(bareP)), Num(median(noneP))
	res.BwrapP50ms, res.BwrapP99ms = Num(median(bwP)), Num(median(bwP99))
	res.BwrapOverBare = Num(ratio(float64(res.BwrapP50ms), float64(res.BareP50ms)))
	res.BackToBackBareP50ms = Num(median(b2bBare))
	if r := runners["prestarted"]; r != nil {
		res.PrestartedP50ms, res.PrestartedP99ms = Num(median(preP)), Num(median(preP99))
		res.PrestartedOverBare = Num(ratio(float64(res.PrestartedP50ms), float64(res.BareP50ms)))
		res.BackToBackPrestartedP50ms = Num(median(b2bPre))
		res.BackToBackPrestartedOverBare = Num(ratio(float64(res.BackToBackPrestartedP50ms), float64(res.BackToBackBareP50ms)))
		st := r.Stats()
		res.PrestartedCalls, res.PrestartedFreshCalls = st.Prestarted, st.Fresh
	}
	return res, nil
}

// reachableDir makes a directory of mode 0755 under the system temp dir,
// which the sandbox's user (not the benchmark's private temporary
// directory) can enter.
func reachableDir(pattern string) (string, error) {
	dir, err := os.MkdirTemp("", pattern)
	if err == nil {
		err = os.Chmod(dir, 0o755)
	}
	return dir, err
}
