package tracing

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/resource"
	"go.opentelemetry.io/otel/trace"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/toolbatch/toolbatch/events"
)

// recorder returns an engine whose spans are exported to the returned
// function's list, decoded from the OTLP protobuf the exporter sent.
func recorder(t *testing.T) (func() []*tracepb.Span, *Engine) {
	var mu sync.Mutex
	var spans []*tracepb.Span
	send := func(_ context.Context, body []byte) error {
		var req collectortrace.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &req); err != nil {
			t.Errorf("the exporter sent what does not decode: %v", err)
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				if ss.Scope.GetName() != scope {
					t.Errorf("scope %q", ss.Scope.GetName())
				}
				spans = append(spans, ss.Spans...)
			}
		}
		return nil
	}
	cfg := defaultConfig()
	cfg.delay = time.Hour // exported when the test asks
	p := newProvider(cfg, resource.Empty(), send, func(err error) { t.Errorf("export: %v", err) })
	t.Cleanup(func() { _ = p.Shutdown(context.Background()) })
	return func() []*tracepb.Span {
		if err := p.x.flush(t.Context()); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(spans)
	}, NewEngine(p)
}

// attrOf is a span's attribute as a string ("": none).
func attrOf(s *tracepb.Span, key attribute.Key) string {
	return kvOf(s.Attributes, key)
}

func kvOf(kvs []*commonpb.KeyValue, key attribute.Key) string {
	for _, kv := range kvs {
		if kv.Key == string(key) {
			if i, ok := kv.Value.Value.(*commonpb.AnyValue_IntValue); ok {
				return strconv.FormatInt(i.IntValue, 10)
			}
			return kv.Value.GetStringValue()
		}
	}
	return ""
}

func nanos(t time.Time) uint64 { return uint64(t.UnixNano()) }

func failed(s *tracepb.Span) bool { return s.Status.GetCode() == tracepb.Status_STATUS_CODE_ERROR }

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
	rec1, e1 := recorder(t)
	e1.Committed("r", parent, first)
	if n := len(rec1()); n != 0 {
		t.Fatalf("%d spans before anything ended", n)
	}
	dispatched := e1.Batch("r", "r/1", parent).Attempt("b", 2)
	if _, fresh := recorder(t); fresh.Batch("r", "r/1", parent).Attempt("b", 2) != dispatched {
		t.Fatalf("an engine that never saw the batch derives another attempt context than %s", dispatched)
	}

	rec2, e2 := recorder(t)
	e2.Loaded("r", parent, first)
	if n := len(rec2()); n != 0 {
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

	spans := rec2()
	byName := map[string][]*tracepb.Span{}
	for _, s := range spans {
		byName[s.Name] = append(byName[s.Name], s)
	}
	if len(spans) != 5 || len(byName["toolbatch.batch"]) != 1 || len(byName["execute_tool brainy"]) != 2 || len(byName["execute_tool boxed"]) != 2 {
		t.Fatalf("spans: %v", byName)
	}
	b := byName["toolbatch.batch"][0]
	if hex.EncodeToString(b.ParentSpanId) != "00f067aa0ba902b7" || hex.EncodeToString(b.TraceId) != "4bf92f3577b34da6a3ce929d0e0e4736" ||
		b.StartTimeUnixNano != nanos(at(0)) || b.EndTimeUnixNano != nanos(at(50)) || b.Kind != tracepb.Span_SPAN_KIND_CONSUMER ||
		b.Flags != 0x301 { // sampled, and a parent known to be remote
		t.Errorf("batch span: parent %x trace %x [%d, %d] kind %v flags %#x", b.ParentSpanId, b.TraceId, b.StartTimeUnixNano, b.EndTimeUnixNano, b.Kind, b.Flags)
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
			if !bytes.Equal(s.ParentSpanId, b.SpanId) || s.StartTimeUnixNano != nanos(w.start) || s.EndTimeUnixNano != nanos(w.end) ||
				s.Flags != 0x101 || s.Kind != tracepb.Span_SPAN_KIND_INTERNAL ||
				attrOf(s, AttrAttempt) != w.key || attrOf(s, AttrOutcome) != w.outcome || attrOf(s, AttrErrorType) != w.errType ||
				attrOf(s, AttrRecoveryAction) != w.recovery {
				t.Errorf("%s #%d: parent %x [%d, %d] flags %#x %v", name, i, s.ParentSpanId, s.StartTimeUnixNano, s.EndTimeUnixNano, s.Flags, s.Attributes)
			}
			if failed(s) != (w.errType != "") || s.Status.GetMessage() != w.errType {
				t.Errorf("%s #%d: status %v", name, i, s.Status)
			}
			if gate := len(s.Events) == 1 && s.Events[0].Name == EventGate; gate != (i == 0) {
				t.Errorf("%s #%d: events %v (the gate decision belongs to the first span only)", name, i, s.Events)
			}
		}
	}
	if s := byName["execute_tool boxed"][1]; fmt.Sprintf("00-%x-%x-01", s.TraceId, s.SpanId) != dispatched {
		got := fmt.Sprintf("00-%x-%x-01", s.TraceId, s.SpanId)
		t.Errorf("the second engine's attempt span is %s, the first dispatched %s", got, dispatched)
	}
	if g := byName["execute_tool boxed"][0].Events; len(g) != 1 || g[0].Name != EventGate || g[0].TimeUnixNano != nanos(at(21)) ||
		kvOf(g[0].Attributes, AttrGateSource) != "rule" || kvOf(g[0].Attributes, AttrGateRule) != "r1" {
		t.Errorf("boxed's gate event: %v", g)
	}
	// the worker's claim is on the attempt it claimed, not on the one
	// nobody claimed, and no brain call has one
	unclaimed, claimed := byName["execute_tool boxed"][0], byName["execute_tool boxed"][1]
	if attrOf(unclaimed, AttrWorkerID) != "" || attrOf(unclaimed, AttrPool) != events.DefaultPool {
		t.Errorf("boxed #0: %v", unclaimed.Attributes)
	}
	if c := claimed.Events; attrOf(claimed, AttrWorkerID) != "w2" || attrOf(claimed, AttrPool) != events.DefaultPool ||
		len(c) != 1 || c[0].Name != EventClaim || c[0].TimeUnixNano != nanos(at(31)) || kvOf(c[0].Attributes, AttrWorkerID) != "w2" {
		t.Errorf("boxed #1: attributes %v, events %v, want w2's claim at 31 ms", claimed.Attributes, c)
	}
	for _, s := range byName["execute_tool brainy"] {
		if attrOf(s, AttrPool) != "" || attrOf(s, AttrWorkerID) != "" {
			t.Errorf("brainy: %v", s.Attributes)
		}
	}
}

// TestUntracedSubmissionIsARoot: without a traceparent the batch span is
// a root whose trace id is derived from the run and batch (the same on
// any engine); a run that ends ends what was open.
func TestUntracedSubmissionIsARoot(t *testing.T) {
	rec, e := recorder(t)
	sub := &events.BatchSubmitted{RunID: "r", BatchID: "r/1", Step: 1, At: at(0), Calls: []events.Call{{CallID: "a", ToolID: "ask"}}}
	e.Committed("r", "", []events.Event{sub,
		&events.CallGated{BatchID: "r/1", CallID: "a", Outcome: events.GateRequireConfirmation, Stage: events.StagePolicy, At: at(1)},
		&events.CallAwaiting{BatchID: "r/1", CallID: "a", Ticket: events.Ticket{CorrelationID: "k", Reason: events.WaitPermission}, At: at(1)},
	})
	e.Committed("r", "", []events.Event{&events.RunEnded{Cause: events.EndCancelled, Reason: "user", At: at(9)}})
	spans := rec()
	if len(spans) != 2 {
		t.Fatalf("%d spans", len(spans))
	}
	ticket, batch := spans[0], spans[1]
	if ticket.Name != "toolbatch.ticket permission" || attrOf(ticket, AttrResolution) != "cancelled" || ticket.EndTimeUnixNano != nanos(at(9)) {
		t.Errorf("ticket span %s %v", ticket.Name, ticket.Attributes)
	}
	if len(batch.ParentSpanId) != 0 || trace.TraceID(batch.TraceId) != traceID("toolbatch", "r", "r/1") || !failed(batch) ||
		attrOf(batch, AttrErrorType) != "cancelled" || attrOf(batch, AttrReason) != "user" || batch.Flags != 0x101 {
		t.Errorf("batch span: parent %x trace %x status %v flags %#x", batch.ParentSpanId, batch.TraceId, batch.Status, batch.Flags)
	}
	// the run's next batch is a trace of its own
	e.Committed("r", "", []events.Event{&events.BatchSubmitted{RunID: "r", BatchID: "r/2", Step: 2, At: at(10)}, &events.BatchFinalized{BatchID: "r/2", At: at(11)}})
	if s := rec(); len(s) != 3 || bytes.Equal(s[2].TraceId, batch.TraceId) {
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
		p, err := FromEnv("test", nil)
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
