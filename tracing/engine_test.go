package tracing

import (
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/toolbatch/toolbatch/events"
)

func recorder() (*tracetest.SpanRecorder, *Engine) {
	rec := tracetest.NewSpanRecorder()
	return rec, NewEngine(newProvider(rec, resource.Empty()))
}

func attrOf(s sdktrace.ReadOnlySpan, key attribute.Key) string {
	for _, kv := range s.Attributes() {
		if kv.Key == key {
			return kv.Value.Emit()
		}
	}
	return ""
}

var t0 = time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

// TestTakeoverKeepsTheSpans: an engine commits a batch's first events and
// dies; another loads them and commits the rest. The second's spans hang
// from the same batch span the first gave the dispatch, with the attempts
// that a recovery, a retry and an indeterminate ended told apart.
func TestTakeoverKeepsTheSpans(t *testing.T) {
	const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	sub := &events.BatchSubmitted{RunID: "r", BatchID: "r/1", Step: 1, At: at(0), Calls: []events.Call{
		{CallID: "a", ToolID: "brainy", Tool: events.Descriptor{Target: events.TargetBrain}},
		{CallID: "b", ToolID: "boxed", Tool: events.Descriptor{Target: events.TargetSandbox}},
	}}
	first := []events.Event{sub,
		&events.CallGated{BatchID: "r/1", CallID: "a", Outcome: events.GateAllow, Stage: events.StageDefault, At: at(1)},
		&events.CallExecuting{BatchID: "r/1", CallID: "a", Attempt: 1, Cause: events.CauseAllowed, At: at(2)},
	}
	rec1, e1 := recorder()
	e1.Committed("r", parent, first)
	if n := len(rec1.Ended()); n != 0 {
		t.Fatalf("%d spans before anything ended", n)
	}
	dispatched := e1.Attempt("r", "b", 2)

	rec2, e2 := recorder()
	e2.Loaded("r", parent, first)
	if n := len(rec2.Ended()); n != 0 {
		t.Fatalf("loading made %d spans", n)
	}
	e2.Committed("r", "", []events.Event{
		&events.CallExecuting{BatchID: "r/1", CallID: "a", Attempt: 2, Cause: events.CauseRecovered, At: at(10)},
		&events.CallCompleted{BatchID: "r/1", CallID: "a", Attempt: 2, Output: events.TextOutput("a", "ok"), At: at(20)},
		&events.CallGated{BatchID: "r/1", CallID: "b", Outcome: events.GateAllow, Stage: events.StagePolicy, Rule: "r1", At: at(21)},
		&events.CallExecuting{BatchID: "r/1", CallID: "b", Attempt: 1, Cause: events.CauseAllowed, At: at(22)},
		&events.CallExecuting{BatchID: "r/1", CallID: "b", Attempt: 2, Cause: events.CauseRetry, Detail: "nobody claimed", At: at(30)},
	})
	e2.Redispatched("r", "b")
	e2.Committed("r", "", []events.Event{&events.CallClaimed{BatchID: "r/1", CallID: "b", Attempt: 2, WorkerID: "w2", At: at(31)}})
	e2.Committed("r", "", []events.Event{
		&events.CallIndeterminate{BatchID: "r/1", CallID: "b", Attempt: 2, Reason: "lease expired", At: at(40)},
		&events.BatchFinalized{BatchID: "r/1", Step: 1, At: at(50)},
	})

	spans := rec2.Ended()
	byName := map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		byName[s.Name()] = append(byName[s.Name()], s)
	}
	if len(spans) != 5 || len(byName["toolbatch.batch"]) != 1 || len(byName["execute_tool brainy"]) != 2 || len(byName["execute_tool boxed"]) != 2 {
		t.Fatalf("spans: %v", byName)
	}
	b := byName["toolbatch.batch"][0]
	if b.Parent().SpanID().String() != "00f067aa0ba902b7" || b.SpanContext().TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" ||
		!b.StartTime().Equal(at(0)) || !b.EndTime().Equal(at(50)) {
		t.Errorf("batch span: parent %s trace %s [%v, %v]", b.Parent().SpanID(), b.SpanContext().TraceID(), b.StartTime(), b.EndTime())
	}
	type want struct {
		start, end                      time.Time
		outcome, errType, recovery, key string
	}
	for name, ws := range map[string][]want{
		"execute_tool brainy": {
			{at(2), at(10), "", "interrupted", "", "1"},
			{at(10), at(20), "ok", "", RecoveryReplayed, "2"},
		},
		"execute_tool boxed": {
			{at(22), at(30), "", "unavailable_before_dispatch", "", "1"},
			{at(30), at(40), "indeterminate", "indeterminate", RecoveryIndeterminate, "2"},
		},
	} {
		for i, w := range ws {
			s := byName[name][i]
			if s.Parent().SpanID() != b.SpanContext().SpanID() || !s.StartTime().Equal(w.start) || !s.EndTime().Equal(w.end) ||
				attrOf(s, AttrAttempt) != w.key || attrOf(s, AttrOutcome) != w.outcome || attrOf(s, AttrErrorType) != w.errType ||
				attrOf(s, AttrRecoveryAction) != w.recovery {
				t.Errorf("%s #%d: parent %s [%v, %v] %v", name, i, s.Parent().SpanID(), s.StartTime(), s.EndTime(), s.Attributes())
			}
			if failed := s.Status().Code == codes.Error; failed != (w.errType != "") {
				t.Errorf("%s #%d: status %v", name, i, s.Status())
			}
			if gate := len(s.Events()) == 1 && s.Events()[0].Name == EventGate; gate != (i == 0) {
				t.Errorf("%s #%d: events %v (the gate decision belongs to the first span only)", name, i, s.Events())
			}
		}
	}
	if got := Format(byName["execute_tool boxed"][1].SpanContext()); got != dispatched {
		t.Errorf("the second engine's attempt span is %s, the first dispatched %s", got, dispatched)
	}
	if g := byName["execute_tool boxed"][0].Events(); len(g) != 1 || g[0].Name != EventGate || !g[0].Time.Equal(at(21)) {
		t.Errorf("boxed's gate event: %v", g)
	}
	// the worker's claim is on the attempt it claimed, not on the one
	// nobody claimed, and no brain call has one
	unclaimed, claimed := byName["execute_tool boxed"][0], byName["execute_tool boxed"][1]
	if attrOf(unclaimed, AttrWorkerID) != "" || attrOf(unclaimed, AttrPool) != events.DefaultPool {
		t.Errorf("boxed #0: %v", unclaimed.Attributes())
	}
	if c := claimed.Events(); attrOf(claimed, AttrWorkerID) != "w2" || attrOf(claimed, AttrPool) != events.DefaultPool ||
		len(c) != 1 || c[0].Name != EventClaim || !c[0].Time.Equal(at(31)) {
		t.Errorf("boxed #1: attributes %v, events %v, want w2's claim at 31 ms", claimed.Attributes(), c)
	}
	for _, s := range byName["execute_tool brainy"] {
		if attrOf(s, AttrPool) != "" || attrOf(s, AttrWorkerID) != "" {
			t.Errorf("brainy: %v", s.Attributes())
		}
	}
}

// TestUntracedSubmissionIsARoot: without a traceparent the batch span is
// a root whose trace id is derived from the run and batch (the same on
// any engine); a run that ends ends what was open.
func TestUntracedSubmissionIsARoot(t *testing.T) {
	rec, e := recorder()
	sub := &events.BatchSubmitted{RunID: "r", BatchID: "r/1", Step: 1, At: at(0), Calls: []events.Call{{CallID: "a", ToolID: "ask"}}}
	e.Committed("r", "", []events.Event{sub,
		&events.CallGated{BatchID: "r/1", CallID: "a", Outcome: events.GateRequireConfirmation, Stage: events.StagePolicy, At: at(1)},
		&events.CallAwaiting{BatchID: "r/1", CallID: "a", Ticket: events.Ticket{CorrelationID: "k", Reason: events.WaitPermission}, At: at(1)},
	})
	e.Committed("r", "", []events.Event{&events.RunEnded{Cause: events.EndCancelled, Reason: "user", At: at(9)}})
	spans := rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans", len(spans))
	}
	ticket, batch := spans[0], spans[1]
	if ticket.Name() != "toolbatch.ticket permission" || attrOf(ticket, AttrResolution) != "cancelled" || !ticket.EndTime().Equal(at(9)) {
		t.Errorf("ticket span %s %v", ticket.Name(), ticket.Attributes())
	}
	if batch.Parent().IsValid() || batch.SpanContext().TraceID() != traceID("toolbatch", "r", "r/1") || batch.Status().Code != codes.Error ||
		attrOf(batch, AttrErrorType) != "cancelled" {
		t.Errorf("batch span: parent %v trace %s status %v", batch.Parent(), batch.SpanContext().TraceID(), batch.Status())
	}
	// the run's next batch is a trace of its own
	e.Committed("r", "", []events.Event{&events.BatchSubmitted{RunID: "r", BatchID: "r/2", Step: 2, At: at(10)}, &events.BatchFinalized{BatchID: "r/2", At: at(11)}})
	if s := rec.Ended(); len(s) != 3 || s[2].SpanContext().TraceID() == batch.SpanContext().TraceID() {
		t.Errorf("second batch: %d spans", len(s))
	}
}

func TestParseAndFormat(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if got := Format(Parse(tp)); got != tp {
		t.Errorf("round trip: %q", got)
	}
	for _, bad := range []string{"", "nonsense", "00-00000000000000000000000000000000-00f067aa0ba902b7-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"} {
		if Parse(bad).IsValid() || Format(Parse(bad)) != "" {
			t.Errorf("%q parsed as valid", bad)
		}
	}
}

func TestFromEnv(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		on   bool
		fail string
	}{
		{env: map[string]string{}, on: false},
		{env: map[string]string{EnvEndpoint: "http://127.0.0.1:4318"}, on: true},
		{env: map[string]string{EnvTracesEndpoint: "http://127.0.0.1:4318/v1/traces"}, on: true},
		{env: map[string]string{EnvExporter: "otlp"}, on: true},
		{env: map[string]string{EnvExporter: "none", EnvEndpoint: "http://127.0.0.1:4318"}, on: false},
		{env: map[string]string{EnvExporter: "console"}, fail: "OTEL_TRACES_EXPORTER=console: toolbatch exports traces with otlp only (or none)"},
		{env: map[string]string{EnvEndpoint: "http://127.0.0.1:4318", EnvProtocol: "grpc"}, fail: "OTEL_EXPORTER_OTLP_PROTOCOL=grpc: toolbatch exports OTLP over http/protobuf only"},
		{env: map[string]string{EnvEndpoint: "http://127.0.0.1:4318", EnvProtocol: "grpc", EnvTracesProtocol: "http/protobuf"}, on: true},
	} {
		for _, k := range []string{EnvExporter, EnvEndpoint, EnvTracesEndpoint, EnvProtocol, EnvTracesProtocol} {
			t.Setenv(k, c.env[k])
		}
		p, err := FromEnv(t.Context(), "test")
		switch {
		case c.fail != "" && (err == nil || err.Error() != c.fail):
			t.Errorf("%v: error %v, want %q", c.env, err, c.fail)
		case c.fail == "" && err != nil:
			t.Errorf("%v: %v", c.env, err)
		case (p != nil) != c.on:
			t.Errorf("%v: on = %v, want %v", c.env, p != nil, c.on)
		}
		_ = p.Shutdown(t.Context())
	}
}
