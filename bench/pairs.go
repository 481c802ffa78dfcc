package main

import (
	"fmt"
	"io"
	"math"
	"strings"
)

// What a mode costs against the default mode, measured in pairs: the
// runs of --modes are taken two by two, and a pair of the default mode and
// another gives that mode's ratios. The machine drifts over minutes; a
// pair's two runs are adjacent, so the drift between them is small, and
// --abba N orders the pairs default-variant, variant-default, ... so that
// a steady drift favours neither side.

// PairResult is the ratios of one pair: the variant's figure over the
// default's (for latency and CPU, above 1 is worse; for throughput,
// below 1 is worse).
type PairResult struct {
	Variant       string `json:"variant"`
	VariantFirst  bool   `json:"variant_first"`
	W1NoopP50     Num    `json:"w1_noop_p50"`
	W1EchoP50     Num    `json:"w1_echo_p50"`
	W2BatchesPerS Num    `json:"w2_batches_per_s"`
	W2EngineCPU   Num    `json:"w2_engine_cpu_per_call"`
	// W2AllCPU is the CPU of the engine, the workers and the load
	// generator (which holds the OTLP receiver and the scraper) per call.
	W2AllCPU Num `json:"w2_all_cpu_per_call"`
	// W2WorkersCPU is the CPU of the sandbox workers per call: what a mode
	// or a change costs on the workers' side.
	W2WorkersCPU Num `json:"w2_workers_cpu_per_call"`
}

// PairSummary is the median of a variant's pairs and, when its pairs were
// taken in both orders, their balanced geometric mean.
type PairSummary struct {
	Variant string     `json:"variant"`
	Pairs   int        `json:"pairs"`
	Median  PairResult `json:"median"`
	// DefaultFirst and VariantFirst are the geometric means of the pairs
	// of each order, and Balanced the geometric mean of the two: a mode
	// measured second in a pair runs slower by a factor of its own (4 to
	// 6% in W2 on our machines, docs/performance.md), which is in
	// DefaultFirst as a cost and in VariantFirst as a gain, and cancels
	// in Balanced. With that factor the pairs fall in two groups, and
	// their median is whichever group's edge it lands on. Nil when one
	// order has no pair.
	DefaultFirst *PairResult `json:"default_first,omitempty"`
	VariantFirst *PairResult `json:"variant_first,omitempty"`
	Balanced     *PairResult `json:"balanced,omitempty"`
}

// abbaModes expands --abba n with --modes "a,b" to n pairs in the order
// a b, b a, a b, ...
func abbaModes(modes string, n int) (string, error) {
	ms := strings.Split(modes, ",")
	if len(ms) != 2 {
		return "", fmt.Errorf("--abba needs exactly two --modes (the default mode and a variant), got %q", modes)
	}
	var out []string
	for i := range n {
		if i%2 == 0 {
			out = append(out, ms[0], ms[1])
		} else {
			out = append(out, ms[1], ms[0])
		}
	}
	return strings.Join(out, ","), nil
}

// pairs takes the runs two by two and keeps the pairs of the default mode
// and another.
func pairs(runs []ModeResult) []PairResult {
	var out []PairResult
	for i := 0; i+1 < len(runs); i += 2 {
		a, b, variantFirst := runs[i], runs[i+1], false
		if a.Mode != "default" {
			a, b, variantFirst = b, a, true
		}
		if a.Mode != "default" || b.Mode == "default" {
			continue
		}
		p := PairResult{Variant: b.Mode, VariantFirst: variantFirst, W1NoopP50: Num(nan()), W1EchoP50: Num(nan()), W2BatchesPerS: Num(nan()),
			W2EngineCPU: Num(nan()), W2AllCPU: Num(nan()), W2WorkersCPU: Num(nan())}
		if a.W1Noop != nil && b.W1Noop != nil {
			p.W1NoopP50 = Num(ratio(float64(b.W1Noop.P50ms), float64(a.W1Noop.P50ms)))
		}
		if a.W1Echo != nil && b.W1Echo != nil {
			p.W1EchoP50 = Num(ratio(float64(b.W1Echo.P50ms), float64(a.W1Echo.P50ms)))
		}
		if a.W2 != nil && b.W2 != nil {
			p.W2BatchesPerS = Num(ratio(float64(b.W2.BatchesPerSec), float64(a.W2.BatchesPerSec)))
			p.W2EngineCPU = Num(ratio(float64(b.W2.CPUPerCallUs), float64(a.W2.CPUPerCallUs)))
			p.W2AllCPU = Num(ratio(allCPUPerCall(b.W2), allCPUPerCall(a.W2)))
			p.W2WorkersCPU = Num(ratio(workersCPUPerCall(b.W2), workersCPUPerCall(a.W2)))
		}
		out = append(out, p)
	}
	return out
}

// allCPUPerCall is the cores of the engine, the workers and the load
// generator over the calls per second.
func allCPUPerCall(w *W2Result) float64 {
	return ratio(float64(w.EngineCPUCores+w.WorkersCPU+w.BenchCPU), float64(w.CallsPerSec))
}

// workersCPUPerCall is the sandbox workers' cores over the calls per
// second.
func workersCPUPerCall(w *W2Result) float64 {
	return ratio(float64(w.WorkersCPU), float64(w.CallsPerSec))
}

// summarize gives each variant's medians and, when its pairs were taken
// in both orders, their balanced geometric mean, in the order the
// variants first appear.
func summarize(ps []PairResult) []PairSummary {
	var out []PairSummary
	seen := map[string]bool{}
	for _, p := range ps {
		if seen[p.Variant] {
			continue
		}
		seen[p.Variant] = true
		ofVariant := func(q PairResult) bool { return q.Variant == p.Variant }
		med, n := combine(ps, p.Variant, ofVariant, median)
		sum := PairSummary{Variant: p.Variant, Pairs: n, Median: med}
		df, ndf := combine(ps, p.Variant, func(q PairResult) bool { return ofVariant(q) && !q.VariantFirst }, geoMean)
		vf, nvf := combine(ps, p.Variant, func(q PairResult) bool { return ofVariant(q) && q.VariantFirst }, geoMean)
		if ndf > 0 && nvf > 0 {
			vf.VariantFirst = true
			b := PairResult{Variant: p.Variant}
			for _, f := range pairFields {
				*f(&b) = Num(math.Sqrt(float64(*f(&df)) * float64(*f(&vf))))
			}
			sum.DefaultFirst, sum.VariantFirst, sum.Balanced = &df, &vf, &b
		}
		out = append(out, sum)
	}
	return out
}

// pairFields are the ratios of a PairResult.
var pairFields = []func(*PairResult) *Num{
	func(p *PairResult) *Num { return &p.W1NoopP50 },
	func(p *PairResult) *Num { return &p.W1EchoP50 },
	func(p *PairResult) *Num { return &p.W2BatchesPerS },
	func(p *PairResult) *Num { return &p.W2EngineCPU },
	func(p *PairResult) *Num { return &p.W2AllCPU },
	func(p *PairResult) *Num { return &p.W2WorkersCPU },
}

// combine reduces each ratio of the pairs keep takes with by, and says
// how many pairs it took.
func combine(ps []PairResult, variant string, keep func(PairResult) bool, by func([]float64) float64) (PairResult, int) {
	out, n := PairResult{Variant: variant}, 0
	for _, f := range pairFields {
		var v []float64
		for i := range ps {
			if keep(ps[i]) {
				v = append(v, float64(*f(&ps[i])))
			}
		}
		*f(&out), n = Num(by(v)), len(v)
	}
	return out, n
}

// geoMean is the geometric mean of values (NaN and non-positive ones left
// out); NaN when none is left.
func geoMean(values []float64) float64 {
	var sum float64
	n := 0
	for _, x := range values {
		if !math.IsNaN(x) && x > 0 {
			sum += math.Log(x)
			n++
		}
	}
	if n == 0 {
		return math.NaN()
	}
	return math.Exp(sum / float64(n))
}

func printPairs(w io.Writer, ps []PairResult, sums []PairSummary) {
	if len(ps) == 0 {
		return
	}
	fmt.Fprintf(w, "\n== pairs: each mode's figure over the default mode's measured beside it\n")
	fmt.Fprintf(w, "%-12s %-14s %12s %12s %14s %14s %14s %14s\n", "variant", "order", "W1 noop p50", "W1 echo p50", "W2 batches/s", "W2 engine CPU", "W2 workers CPU", "W2 all CPU")
	row := func(name, order string, p PairResult) {
		fmt.Fprintf(w, "%-12s %-14s %12s %12s %14s %14s %14s %14s\n", name, order, fmtNum(p.W1NoopP50, ""), fmtNum(p.W1EchoP50, ""),
			fmtNum(p.W2BatchesPerS, ""), fmtNum(p.W2EngineCPU, ""), fmtNum(p.W2WorkersCPU, ""), fmtNum(p.W2AllCPU, ""))
	}
	for _, p := range ps {
		order := "default first"
		if p.VariantFirst {
			order = "variant first"
		}
		row(p.Variant, order, p)
	}
	for _, s := range sums {
		row(s.Variant, fmt.Sprintf("median of %d", s.Pairs), s.Median)
		if s.Balanced != nil {
			row(s.Variant, "geo. default 1st", *s.DefaultFirst)
			row(s.Variant, "geo. variant 1st", *s.VariantFirst)
			row(s.Variant, "balanced", *s.Balanced)
		}
	}
}
