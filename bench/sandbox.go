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
// bubblewrap, env, prlimit, the tool, the output read and the sandbox
// torn down) against a bare fork and exec of /bin/true, in the same run.
// The same Runner with isolation none (prlimit and env, no bubblewrap)
// shows what bubblewrap itself costs. Pre-started sandboxes do not exist
// in the worker, so there is no figure for them.

// W4Result is the sandbox cost.
type W4Result struct {
	Calls          int    `json:"calls_per_rep"`
	BareP50ms      Num    `json:"bare_exec_p50_ms"`
	NoneP50ms      Num    `json:"runner_isolation_none_p50_ms"`
	BwrapP50ms     Num    `json:"runner_bubblewrap_p50_ms"`
	BwrapP99ms     Num    `json:"runner_bubblewrap_p99_ms"`
	BwrapOverBare  Num    `json:"bubblewrap_over_bare"`
	PrestartedP50  Num    `json:"prestarted_p50_ms"`
	PrestartedNote string `json:"prestarted_note"`
	Skipped        string `json:"skipped,omitempty"`
}

func w4Config(isolation string) string {
	return fmt.Sprintf(`pools: [default]
isolation: %s
tools:
  - id: "true"
    command: ["/bin/true"]
    capability: replay_safe
`, isolation)
}

func runW4(ctx context.Context, reps, calls int) (W4Result, error) {
	res := W4Result{Calls: calls, PrestartedP50: Num(nan()),
		PrestartedNote: "not built: the worker has no pre-started sandboxes, so every call starts bubblewrap on its critical path"}
	// The sandbox user (nobody, when we are root) must reach the work
	// root, so it is a directory of its own under the system temp dir
	// (the benchmark's temporary directory is private).
	root, err := os.MkdirTemp("", "toolbatch-bench-w4-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(root)
	if err := os.Chmod(root, 0o755); err != nil {
		return res, err
	}
	runners := map[string]*sandbox.Runner{}
	for _, iso := range []string{"none", "bubblewrap"} {
		cfg, err := sandbox.ParseConfig([]byte(w4Config(iso)))
		if err != nil {
			return res, err
		}
		r, err := sandbox.NewRunner(cfg, sandbox.WithWorkRoot(root))
		if err != nil {
			if iso == "bubblewrap" {
				res.Skipped = "bubblewrap cannot run here: " + err.Error()
				break
			}
			return res, err
		}
		runners[iso] = r
	}
	call := func(r *sandbox.Runner, i int) error {
		out := r.Run(ctx, sandbox.Call{ToolID: "true", CallID: "c1", OperationID: fmt.Sprintf("w4/%d/c1", i), Attempt: 1})
		if out.Err != nil {
			return fmt.Errorf("sandboxed /bin/true: %s", out.Err.Message)
		}
		return nil
	}
	bare := func() error { return exec.Command("/bin/true").Run() }
	var bareP, noneP, bwP, bwP99 []float64
	for rep := 0; rep < reps; rep++ {
		var b, n, w []time.Duration
		// Interleave the three so that they see the same machine.
		for i := -3; i < calls; i++ {
			t := time.Now()
			if err := bare(); err != nil {
				return res, err
			}
			d := time.Since(t)
			if i >= 0 {
				b = append(b, d)
			}
			t = time.Now()
			if err := call(runners["none"], i); err != nil {
				return res, err
			}
			d = time.Since(t)
			if i >= 0 {
				n = append(n, d)
			}
			if r := runners["bubblewrap"]; r != nil {
				t = time.Now()
				if err := call(r, i); err != nil {
					return res, err
				}
				d = time.Since(t)
				if i >= 0 {
					w = append(w, d)
				}
			}
		}
		bareP, noneP = append(bareP, percentile(b, 50)), append(noneP, percentile(n, 50))
		bwP, bwP99 = append(bwP, percentile(w, 50)), append(bwP99, percentile(w, 99))
	}
	res.BareP50ms, res.NoneP50ms = Num(median(bareP)), Num(median(noneP))
	res.BwrapP50ms, res.BwrapP99ms = Num(median(bwP)), Num(median(bwP99))
	res.BwrapOverBare = Num(ratio(float64(res.BwrapP50ms), float64(res.BareP50ms)))
	return res, nil
}
