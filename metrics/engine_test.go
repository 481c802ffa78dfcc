package metrics

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/toolbatch/toolbatch/events"
)

// TestOutcomesAndDurations: each way a call ends is counted under its
// outcome, with the durations its events' times give.
func TestOutcomesAndDurations(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewEngine(reg, EngineGauges{})
	t0 := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	brain := events.Descriptor{Target: events.TargetBrain, Kind: events.KindTool}
	var calls []events.Call
	for _, id := range []string{"denied", "expired", "interrupted", "lost", "ok"} {
		calls = append(calls, events.Call{CallID: id, ToolID: "t", Tool: brain})
	}
	m.Committed("r", []events.Event{&events.BatchSubmitted{BatchID: "r/1", Calls: calls, At: at(0)}})
	for _, id := range []string{"denied", "expired"} {
		m.Committed("r", []events.Event{
			&events.CallGated{BatchID: "r/1", CallID: id, Outcome: events.GateRequireConfirmation, Label: "ask", Stage: "policy", At: at(10)},
		})
	}
	m.Committed("r", []events.Event{
		&events.TicketResolved{BatchID: "r/1", CallID: "denied", Resolution: events.ResolutionDenied, At: at(20)},
		&events.CallCompleted{BatchID: "r/1", CallID: "denied", Output: events.ErrorOutput("denied", "denied"), At: at(20)},
		&events.TicketResolved{BatchID: "r/1", CallID: "expired", Resolution: events.ResolutionExpired, At: at(30)},
		&events.CallCompleted{BatchID: "r/1", CallID: "expired", Output: events.ErrorOutput("expired", "expired"), At: at(30)},
	})
	for _, id := range []string{"interrupted", "lost", "ok"} {
		m.Committed("r", []events.Event{
			&events.CallGated{BatchID: "r/1", CallID: id, Outcome: events.GateAllow, Label: "allow", Stage: "default", At: at(5)},
			&events.CallExecuting{BatchID: "r/1", CallID: id, Attempt: 1, Cause: events.CauseAllowed, At: at(100)},
		})
	}
	m.Committed("r", []events.Event{
		&events.CallCompleted{BatchID: "r/1", CallID: "ok", Attempt: 1, Output: events.TextOutput("ok", "fine"), At: at(350)},
		&events.CallExecuting{BatchID: "r/1", CallID: "lost", Attempt: 2, Cause: events.CauseRecovered, At: at(400)},
		&events.CallIndeterminate{BatchID: "r/1", CallID: "lost", Attempt: 2, Reason: "owner lost", At: at(500)},
		&events.ResultRefused{BatchID: "r/1", CallID: "lost", Attempt: 1, Reason: "stale attempt: 1 is not the current attempt 2", At: at(510)},
		&events.CallCompleted{BatchID: "r/1", CallID: "interrupted", Attempt: 1, Output: events.ErrorOutput("interrupted", events.InterruptedText), At: at(600)},
		&events.BatchFinalized{BatchID: "r/1", At: at(1000)},
		&events.RunEnded{Cause: events.EndInterrupted, At: at(1000)},
	})
	for outcome, want := range map[events.CallOutcome]float64{events.OutcomeDenied: 1, events.OutcomeTimedOut: 1, events.OutcomeInterrupted: 1, events.OutcomeIndeterminate: 1, events.OutcomeOK: 1, events.OutcomeError: 0} {
		if got := testutil.ToFloat64(m.calls.WithLabelValues("t", "brain", string(outcome))); got != want {
			t.Errorf("calls{outcome=%s} = %v, want %v", outcome, got, want)
		}
	}
	if got := testutil.ToFloat64(m.gateDecisions.WithLabelValues("t", "ask", "rule")); got != 2 {
		t.Errorf("gate decisions ask by rule = %v", got)
	}
	for action, want := range map[string]float64{RecoveryReplayed: 1, RecoveryIndeterminate: 1, RecoveryRedispatched: 0} {
		if got := testutil.ToFloat64(m.recoveries.WithLabelValues(action)); got != want {
			t.Errorf("recoveries{%s} = %v, want %v", action, got, want)
		}
	}
	if got := testutil.ToFloat64(m.resultsRefused.WithLabelValues("stale attempt")); got != 1 {
		t.Errorf("results refused{stale attempt} = %v", got)
	}
	if got := testutil.ToFloat64(m.runsEnded.WithLabelValues("interrupted")); got != 1 {
		t.Errorf("runs ended = %v", got)
	}
	// ok: executing at 100 ms, completed at 350 ms, accepted at 0.
	exec := m.callDuration.WithLabelValues("t", "brain", StageExecution).(prometheus.Histogram)
	if n := testutil.CollectAndCount(m.callDuration); n == 0 {
		t.Fatal("no durations")
	}
	var metric dto.Metric
	if err := exec.Write(&metric); err != nil {
		t.Fatal(err)
	}
	sum := metric.Histogram.GetSampleSum()
	// interrupted 0.5 s, lost 0.1 s (its second attempt), ok 0.25 s
	if count := metric.Histogram.GetSampleCount(); count != 3 || sum < 0.849 || sum > 0.851 {
		t.Errorf("execution durations: %d samples, sum %v; want 3, 0.85", count, sum)
	}
	if len(m.batches) != 0 {
		t.Errorf("%d batches still held after finalization", len(m.batches))
	}
}
