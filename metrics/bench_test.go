package metrics

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/toolbatch/toolbatch/events"
)

// BenchmarkEngineBatch: one op is a batch of 4 calls of a worker tool,
// committed as W1's 6 commits: what the metrics cost per W1 batch
// (go test -bench . -benchmem ./metrics).
func BenchmarkEngineBatch(b *testing.B) {
	m := NewEngine(prometheus.NewRegistry(), EngineGauges{})
	t0 := time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	calls := make([]events.Call, 4)
	for c := range calls {
		calls[c] = events.Call{CallID: fmt.Sprint("c", c), ToolID: "noop", Tool: events.Descriptor{Target: events.TargetSandbox}}
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		run := fmt.Sprintf("run-%d", i)
		batch := run + "/1"
		first := []events.Event{&events.BatchSubmitted{RunID: run, BatchID: batch, Step: 1, At: at(0), Calls: calls}}
		for _, c := range calls {
			first = append(first, &events.CallGated{BatchID: batch, CallID: c.CallID, Outcome: events.GateAllow, Stage: events.StageDefault, At: at(0)})
		}
		first = append(first, &events.CallExecuting{BatchID: batch, CallID: "c0", Attempt: 1, Cause: events.CauseAllowed, At: at(1)})
		m.Committed(run, first)
		m.Committed(run, []events.Event{&events.CallClaimed{BatchID: batch, CallID: "c0", Attempt: 1, WorkerID: "w1", At: at(1)}})
		for c := range calls {
			evs := []events.Event{&events.CallCompleted{BatchID: batch, CallID: calls[c].CallID, Attempt: 1, Output: events.TextOutput(calls[c].CallID, "ok"), At: at(2 + c)}}
			if c+1 < len(calls) {
				evs = append(evs, &events.CallExecuting{BatchID: batch, CallID: calls[c+1].CallID, Attempt: 1, Cause: events.CauseAllowed, At: at(2 + c)},
					&events.CallClaimed{BatchID: batch, CallID: calls[c+1].CallID, Attempt: 1, WorkerID: "w1", At: at(2 + c)})
			} else {
				evs = append(evs, &events.BatchFinalized{BatchID: batch, At: at(6)})
			}
			m.Committed(run, evs)
		}
	}
}
