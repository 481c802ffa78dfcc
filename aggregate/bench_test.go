package aggregate_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/toolbatch/toolbatch/aggregate"
	"github.com/toolbatch/toolbatch/events"
)

// BenchmarkStepOfALongRun: what one step of a run costs to decide (a
// batch of one brain call: submitted, gated, executing, completed,
// finalized) after n steps, as a run grows: go test -run '^$' -bench
// StepOfALongRun -benchmem ./aggregate
func BenchmarkStepOfALongRun(b *testing.B) {
	out := events.TextOutput("c1", "ok")
	step := func(b *testing.B, run *aggregate.Run, s int64) *aggregate.Run {
		for _, cmd := range []aggregate.Command{
			aggregate.Submit{Submission: submitOf(s, "c1", "echo").Submission(), Tools: []events.Descriptor{brainNR}, At: decT0},
			aggregate.Gate{Decisions: []aggregate.Decision{{CallID: "c1", Outcome: events.GateAllow, Stage: events.StageDefault,
				Capability: events.CapNonRecoverable}}, At: decT0},
			aggregate.Complete{CallID: "c1", Attempt: 1, Output: &out, At: decT0},
		} {
			next, evs, err := aggregate.Decide(run, cmd)
			if err != nil || len(evs) == 0 {
				b.Fatalf("step %d: %T: %d events, %v", s, cmd, len(evs), err)
			}
			run = next
		}
		return run
	}
	for _, n := range []int{10, 1000} {
		b.Run(fmt.Sprint("after_", n), func(b *testing.B) {
			run := aggregate.New("r1")
			for s := int64(1); s <= int64(n); s++ {
				run = step(b, run, s)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				step(b, run, int64(n+1)) // Decide never changes run
			}
		})
	}
}

// BenchmarkBatchOfLargeOutputs: what a batch of n brain calls, each with
// an output of 16 KiB, costs to decide from its submission to its
// finalization, under the engine's output limits (each output and the
// batch's outputs together are measured): go test -run '^$' -bench
// BatchOfLargeOutputs -benchmem ./aggregate
func BenchmarkBatchOfLargeOutputs(b *testing.B) {
	lim := aggregate.OutputLimits{MaxOutputBytes: events.DefaultMaxOutputBytes, MaxBatchOutputBytes: 4 << 20}
	for _, n := range []int{4, 32, 128} {
		b.Run(fmt.Sprint("calls_", n), func(b *testing.B) {
			var calls []string
			tools := make([]events.Descriptor, n)
			outs := make([]events.Output, n)
			for i := range n {
				calls = append(calls, fmt.Sprint("c", i), "echo")
				tools[i] = brainNR
				outs[i] = events.TextOutput(fmt.Sprint("c", i), strings.Repeat("y", 16<<10))
			}
			submit := aggregate.Submit{Submission: submitOf(1, calls...).Submission(), Tools: tools, At: decT0}
			b.ReportAllocs()
			for range b.N {
				run, evs, err := aggregate.Decide(aggregate.New("r1"), submit)
				for i := 0; i < n && err == nil; i++ {
					id := fmt.Sprint("c", i)
					if run, _, err = aggregate.Decide(run, aggregate.Gate{Decisions: []aggregate.Decision{{CallID: id, Outcome: events.GateAllow,
						Stage: events.StageDefault, Capability: events.CapNonRecoverable}}, At: decT0}); err == nil {
						run, evs, err = aggregate.Decide(run, aggregate.Complete{CallID: id, Attempt: 1, Output: &outs[i], Limits: lim, At: decT0})
					}
				}
				if err != nil || len(evs) == 0 {
					b.Fatalf("%d events, %v", len(evs), err)
				}
				if _, ok := evs[len(evs)-1].(*events.BatchFinalized); !ok {
					b.Fatalf("the batch of %d calls is not finalized: %s", n, events.Describe(evs[len(evs)-1]))
				}
			}
		})
	}
}
