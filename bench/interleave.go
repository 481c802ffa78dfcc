package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
)

// What a mode costs against the default mode, measured interleaved: the
// two modes' clusters run side by side (the one not measured is idle),
// and each round measures W1 noop, W1 echo and W2 on one, then at once on
// the other, the order alternating from round to round. The two figures
// of a round are seconds apart rather than minutes (as --abba's pairs
// are), so the machine's drift (other tenants, thermal state) reaches
// both alike; each round is one pair of the ratios.

// runInterleaved runs --interleave's rounds for the two modes of --modes
// (the default mode first) and returns one pair per round.
func runInterleaved(ctx context.Context, o options, skip map[string]bool, bins binaries, dir string, rounds int) ([]PairResult, error) {
	modes := strings.Split(o.modes, ",")
	// default,default measures the noise floor: two clusters alike.
	if len(modes) != 2 || strings.TrimSpace(modes[0]) != "default" {
		return nil, fmt.Errorf("--interleave needs --modes default,VARIANT, got %q", o.modes)
	}
	if o.pprofDir != "" || o.extraEng > 0 {
		return nil, errors.New("--interleave takes neither --pprof-dir nor --extra-engines")
	}
	var cs [2]*cluster
	for i, mode := range modes {
		mode = strings.TrimSpace(mode)
		copts := modeOptions(o, mode, bins)
		if !skip["w2"] {
			copts.workers = o.w2workers // W1 runs beside W2's workers too, in both modes
		}
		progress(fmt.Sprintf("interleaved: starting the %s mode's engine and %d sandbox workers", mode, copts.workers))
		c, err := startCluster(filepath.Join(dir, fmt.Sprintf("interleaved-%d-%s", i, mode)), copts)
		if err != nil {
			return nil, err
		}
		defer c.stop()
		cs[i] = c
	}
	variant := cs[1].mode
	var out []PairResult
	for r := 0; r < rounds; r++ {
		order := [2]int{0, 1}
		if r%2 == 1 {
			order = [2]int{1, 0}
		}
		p := PairResult{Variant: variant, VariantFirst: r%2 == 1, W1NoopP50: Num(nan()), W1EchoP50: Num(nan()), W2BatchesPerS: Num(nan()),
			W2EngineCPU: Num(nan()), W2AllCPU: Num(nan())}
		progress(fmt.Sprintf("interleaved: round %d of %d (%s first)", r+1, rounds, cs[order[0]].mode))
		if !skip["w1"] {
			for _, tool := range []string{"noop", "echo"} {
				var w1 [2]W1Result
				for _, i := range order {
					res, err := runW1(ctx, cs[i], tool, 1, o.w1, o.steps)
					if err != nil {
						return out, fmt.Errorf("%s: W1 %s: %w", cs[i].mode, tool, err)
					}
					w1[i] = res
				}
				x := Num(ratio(float64(w1[1].P50ms), float64(w1[0].P50ms)))
				if tool == "noop" {
					p.W1NoopP50 = x
				} else {
					p.W1EchoP50 = x
				}
			}
		}
		if !skip["w2"] {
			var w2 [2]W2Result
			for _, i := range order {
				res, err := runW2(ctx, cs[i], o.w2runs, 1, o.w2warm, o.w2, o.steps)
				if err != nil {
					return out, fmt.Errorf("%s: W2: %w", cs[i].mode, err)
				}
				w2[i] = res
			}
			p.W2BatchesPerS = Num(ratio(float64(w2[1].BatchesPerSec), float64(w2[0].BatchesPerSec)))
			p.W2EngineCPU = Num(ratio(float64(w2[1].CPUPerCallUs), float64(w2[0].CPUPerCallUs)))
			p.W2AllCPU = Num(ratio(allCPUPerCall(&w2[1]), allCPUPerCall(&w2[0])))
		}
		out = append(out, p)
	}
	if c := cs[1]; c.otlp != nil && c.otlp.exports.Load() == 0 {
		return out, errors.New("observed mode: the programs exported no trace")
	}
	return out, nil
}
