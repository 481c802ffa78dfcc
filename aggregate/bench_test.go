package aggregate_test

import (
	"fmt"
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
