package tracing

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"

	"github.com/toolbatch/toolbatch/events"
)

// What the spans cost per call, through the real exporter (OTLP/HTTP to
// a receiver that reads and drops): go test -bench . -benchmem ./tracing

func exporting(b *testing.B) *Provider {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	b.Cleanup(srv.Close)
	b.Setenv(EnvEndpoint, srv.URL)
	p, shutdown, err := Setup("bench", func(err error) { b.Errorf("export: %v", err) })
	if err != nil || p == nil {
		b.Fatalf("tracing: %v", err)
	}
	b.Cleanup(shutdown)
	return p
}

// cpu measures the process's CPU time per op (the exporter's goroutines'
// included) and exports every span: it flushes every 64 ops, before the
// batch processor's queue (2048) could drop one.
func cpu(b *testing.B, p *Provider, op func(i int)) {
	b.ReportAllocs()
	before := cpuTime()
	b.ResetTimer()
	for i := range b.N {
		op(i)
		if i%64 == 63 {
			_ = p.x.flush(context.Background())
		}
	}
	_ = p.x.flush(context.Background())
	b.StopTimer()
	b.ReportMetric(float64(cpuTime()-before)/float64(b.N), "cpu-ns/op")
}

func cpuTime() int64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// BenchmarkEngineBatch: one op is a batch of 4 calls of a worker tool,
// committed as W1's 6 commits (5 spans), each next call claimed with the
// result before it.
func BenchmarkEngineBatch(b *testing.B) {
	p := exporting(b)
	e := NewEngine(p)
	cpu(b, p, func(i int) {
		run := fmt.Sprintf("run-%d", i)
		batch := run + "/1"
		calls := make([]events.Call, 4)
		for c := range calls {
			calls[c] = events.Call{CallID: fmt.Sprint("c", c), ToolID: "noop", Tool: events.Descriptor{Target: events.TargetSandbox}}
		}
		first := []events.Event{&events.BatchSubmitted{RunID: run, BatchID: batch, Step: 1, At: at(0), Calls: calls}}
		for _, c := range calls {
			first = append(first, &events.CallGated{BatchID: batch, CallID: c.CallID, Outcome: events.GateAllow, Stage: events.StageDefault, At: at(0)})
		}
		first = append(first, &events.CallExecuting{BatchID: batch, CallID: "c0", Attempt: 1, Cause: events.CauseAllowed, At: at(1)})
		e.Committed(run, "", first)
		span := e.Batch(run, batch, "") // the engine derives it once per batch
		e.Committed(run, "", []events.Event{&events.CallClaimed{BatchID: batch, CallID: "c0", Attempt: 1, WorkerID: "w1", At: at(1)}})
		_ = span.Attempt("c0", 1)
		for c := range calls {
			evs := []events.Event{&events.CallCompleted{BatchID: batch, CallID: calls[c].CallID, At: at(2 + c)}}
			if c+1 < len(calls) {
				evs = append(evs, &events.CallExecuting{BatchID: batch, CallID: calls[c+1].CallID, Attempt: 1, Cause: events.CauseAllowed, At: at(2 + c)},
					&events.CallClaimed{BatchID: batch, CallID: calls[c+1].CallID, Attempt: 1, WorkerID: "w1", At: at(2 + c)})
			} else {
				evs = append(evs, &events.BatchFinalized{BatchID: batch, At: at(6)})
			}
			e.Committed(run, "", evs)
			if c+1 < len(calls) {
				_ = span.Attempt(calls[c+1].CallID, 1)
			}
		}
	})
}
