package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// What a mode costs against the default mode, measured interleaved: in
// each round the two modes' clusters run side by side (the one not
// measured is idle). W1 noop and W1 echo are measured in turns, in
// --w1-slices short windows on one then the other (A B B A ...), each
// mode's p50 over all its windows' batches; W2 on one then the other, or
// (with --w2-together) on both at the same time, each with about half the
// machine. The two figures of a round are a fraction of a second (W1) or
// seconds apart rather than minutes (as --abba's pairs are), so the
// machine's drift (other tenants, thermal state) reaches both alike; each
// round is one pair of the ratios. (W1 in one window per mode, as it was
// until 2026-12-05, made the mode measured second 1.16x slower in one run
// and 1.02x in another: the order dominated a 3% comparison.)
//
// Each round starts its two clusters afresh: a cluster has a speed of its
// own (two clusters of the default mode kept for 9 rounds differed by 11%
// in W2, docs/performance.md), which rounds on the same two clusters
// would never average out. The order in which the two start alternates
// from round to round, and the order in which they are measured every two
// rounds, so that neither the first started nor the first measured is
// always the same mode.

// runInterleaved runs --interleave's rounds for the two modes of --modes
// (the default mode first; default,default measures the noise floor) and
// returns one pair per round.
func runInterleaved(ctx context.Context, o options, skip map[string]bool, bins binaries, dir string, rounds int) ([]PairResult, error) {
	modes := strings.Split(o.modes, ",")
	if len(modes) != 2 || strings.TrimSpace(modes[0]) != "default" {
		return nil, fmt.Errorf("--interleave needs --modes default,VARIANT, got %q", o.modes)
	}
	if o.pprofDir != "" || o.extraEng > 0 {
		return nil, errors.New("--interleave takes neither --pprof-dir nor --extra-engines")
	}
	modes[0], modes[1] = strings.TrimSpace(modes[0]), strings.TrimSpace(modes[1])
	exported := false
	var out []PairResult
	for r := 0; r < rounds; r++ {
		p, traced, err := interleavedRound(ctx, o, skip, bins, filepath.Join(dir, fmt.Sprintf("round-%d", r)), modes, r)
		if err != nil {
			return out, fmt.Errorf("round %d: %w", r+1, err)
		}
		exported = exported || traced
		out = append(out, p)
	}
	if modes[1] == "observed" && !exported {
		return out, errors.New("observed mode: the programs exported no trace")
	}
	return out, nil
}

// interleavedRound is round r: modes[0]'s and modes[1]'s clusters started
// (in turns, the first started alternating with r), measured one then the
// other (the first measured alternating every two rounds), and stopped.
// traced says whether the variant's programs exported a trace.
func interleavedRound(ctx context.Context, o options, skip map[string]bool, bins binaries, dir string, modes []string, r int) (PairResult, bool, error) {
	p := PairResult{Variant: modes[1], VariantFirst: (r/2)%2 == 1, W1NoopP50: Num(nan()), W1EchoP50: Num(nan()), W2BatchesPerS: Num(nan()),
		W2EngineCPU: Num(nan()), W2AllCPU: Num(nan()), W2WorkersCPU: Num(nan())}
	starts, order := [2]int{0, 1}, [2]int{0, 1}
	if r%2 == 1 {
		starts = [2]int{1, 0}
	}
	if p.VariantFirst {
		order = [2]int{1, 0}
	}
	var cs [2]*cluster
	defer func() {
		for _, c := range cs {
			if c != nil {
				c.stop()
			}
		}
	}()
	for _, i := range starts {
		copts := modeOptions(o, modes[i], bins)
		if !skip["w2"] {
			copts.workers = o.w2workers // W1 runs beside W2's workers too, in both modes
		}
		c, err := startCluster(filepath.Join(dir, fmt.Sprintf("%d-%s", i, modes[i])), copts)
		if err != nil {
			return p, false, err
		}
		cs[i] = c
	}
	progress(fmt.Sprintf("interleaved: round %d (%s started first, %s measured first)", r+1, modes[starts[0]], modes[order[0]]))
	if !skip["w1"] {
		for _, tool := range []string{"noop", "echo"} {
			p50, err := runW1Sliced(ctx, cs, order, modes, tool, o.w1, o.w1slices, o.steps)
			if err != nil {
				return p, false, err
			}
			x := Num(ratio(p50[1], p50[0]))
			if tool == "noop" {
				p.W1NoopP50 = x
			} else {
				p.W1EchoP50 = x
			}
		}
	}
	if !skip["w2"] {
		var w2 [2]W2Result
		if o.w2together {
			// Both at once: each has about half the machine, in the
			// same seconds.
			settle(cs)
			var errs [2]error
			var wg sync.WaitGroup
			for i := range cs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					w2[i], errs[i] = runW2(ctx, cs[i], o.w2runs, 1, o.w2warm, o.w2, o.steps)
				}()
			}
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					return p, false, fmt.Errorf("%s: W2: %w", modes[i], err)
				}
			}
		} else {
			for _, i := range order {
				settle(cs)
				res, err := runW2(ctx, cs[i], o.w2runs, 1, o.w2warm, o.w2, o.steps)
				if err != nil {
					return p, false, fmt.Errorf("%s: W2: %w", modes[i], err)
				}
				w2[i] = res
			}
		}
		p.W2BatchesPerS = Num(ratio(float64(w2[1].BatchesPerSec), float64(w2[0].BatchesPerSec)))
		p.W2EngineCPU = Num(ratio(float64(w2[1].CPUPerCallUs), float64(w2[0].CPUPerCallUs)))
		p.W2WorkersCPU = Num(ratio(workersCPUPerCall(&w2[1]), workersCPUPerCall(&w2[0])))
		if !o.w2together { // together, the load generator's CPU is both modes' at once: no figure
			p.W2AllCPU = Num(ratio(allCPUPerCall(&w2[1]), allCPUPerCall(&w2[0])))
		}
	}
	return p, cs[1].otlp != nil && cs[1].otlp.exports.Load() > 0, nil
}

// runW1Sliced measures W1 of tool on the two clusters in turns: after a
// second's warm-up of each, slices windows of dur/slices on each, in the
// order order, reversed, order, ... (A B B A A B ...), so that a change of
// the machine's speed within the round reaches both alike. It returns each
// cluster's p50 over the batches of all its windows.
func runW1Sliced(ctx context.Context, cs [2]*cluster, order [2]int, modes []string, tool string, dur time.Duration, slices, stepsPerRun int) ([2]float64, error) {
	var lat [2][]time.Duration
	var p50 [2]float64
	slice := dur / time.Duration(max(slices, 1))
	for k := -1; k < max(slices, 1); k++ {
		turn := order
		if k%2 != 0 {
			turn = [2]int{order[1], order[0]}
		}
		for _, i := range turn {
			settle(cs)
			if k < 0 {
				if _, _, err := w1Loop(ctx, cs[i], tool, "w1"+tool+"-warm", time.Second, stepsPerRun); err != nil {
					return p50, fmt.Errorf("%s: W1 %s: %w", modes[i], tool, err)
				}
				continue
			}
			samples, _, err := w1Loop(ctx, cs[i], tool, fmt.Sprintf("w1%s-s%d", tool, k), slice, stepsPerRun)
			if err != nil {
				return p50, fmt.Errorf("%s: W1 %s: %w", modes[i], tool, err)
			}
			for _, s := range samples {
				lat[i] = append(lat[i], s.lat)
			}
		}
	}
	for i := range cs {
		p50[i] = percentile(lat[i], 50)
		if err := cs[i].checkAlive(); err != nil {
			return p50, fmt.Errorf("%s: %w", modes[i], err)
		}
	}
	return p50, nil
}

// Each measurement of a round starts once neither cluster is busy: not
// with the start of the clusters, nor with the tail of the measurement
// before (its projector catching up, the store's flushes: 0.25 to 0.5 s
// after W2, seen on our machines). This does not remove the factor by
// which the mode measured second runs slower (PairSummary): the other
// cluster is idle by then, so it seems to be the machine's state after a
// load; --w2-together has no second.
const (
	quietCores  = 0.05
	quietSample = 250 * time.Millisecond
	quietMax    = 15 * time.Second
)

// settle waits until the engines and workers of cs together use less than
// quietCores of CPU over quietSample, for at most quietMax.
func settle(cs [2]*cluster) {
	busy := func() float64 {
		var t float64
		for _, c := range cs {
			e, w, _ := c.programsCPU() // a program gone is found by checkAlive
			t += e + w
		}
		return t
	}
	start := time.Now()
	prev := busy()
	for time.Since(start) < quietMax {
		time.Sleep(quietSample)
		cur := busy()
		if (cur-prev)/quietSample.Seconds() < quietCores {
			return
		}
		prev = cur
	}
	progress(fmt.Sprintf("interleaved: the clusters were still busy after %s; measuring anyway", quietMax))
}
