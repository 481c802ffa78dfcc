package tracing

import (
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/resource"
	"go.opentelemetry.io/otel/trace"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
)

func str(k, v string) *commonpb.KeyValue {
	return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v}}}
}

// TestEncodingIsOTLP: what appendSpan and request write decodes, with the
// generated OTLP types, into the request the SDK's exporter would send:
// every field toolbatch's spans use, values of each kind, and strings
// whose lengths take one, two and three bytes.
func TestEncodingIsOTLP(t *testing.T) {
	long, longer := strings.Repeat("x", 200), strings.Repeat("y", 20000)
	ts, err := trace.ParseTraceState("vendor=abc")
	if err != nil {
		t.Fatal(err)
	}
	parent := trace.NewSpanContext(trace.SpanContextConfig{TraceID: traceID("t"), SpanID: spanID("p"), TraceFlags: trace.FlagsSampled, Remote: true})
	self := trace.NewSpanContext(trace.SpanContextConfig{TraceID: traceID("t"), SpanID: spanID("s"), TraceFlags: trace.FlagsSampled, TraceState: ts})
	root := trace.NewSpanContext(trace.SpanContextConfig{TraceID: traceID("u"), SpanID: spanID("r"), TraceFlags: trace.FlagsSampled})
	spans := []span{
		{parent: parent, self: self, name: SpanAttempt, detail: "echo", kind: trace.SpanKindInternal, start: at(1), end: at(2), errType: "timed_out",
			attrs: []attribute.KeyValue{AttrToolName.String("echo"), AttrAttempt.Int(2), attribute.Int64("neg", -5), attribute.Bool("b", true),
				attribute.Float64("f", 1.5), attribute.StringSlice("list", []string{"a", "b"}), attribute.String("long", long), attribute.String("longer", longer)},
			events: []spanEvent{{name: EventGate, at: at(1), attrs: []attribute.KeyValue{AttrGateOutcome.String("allow")}}, {name: EventClaim, at: at(2)}}},
		{self: root, name: SpanBatch, kind: trace.SpanKindConsumer, start: at(0), end: at(3)},
	}
	res := resource.NewWithAttributes("https://opentelemetry.io/schemas/1.26.0", attribute.String("service.name", "engine"), attribute.Int("pid", 7))
	head := newBatchHead(res, scope)
	var encoded []byte
	for i := range spans {
		encoded = appendSpan(encoded, fScopeSpansSpans, &spans[i])
	}
	var got collectortrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(head.request(nil, encoded), &got); err != nil {
		t.Fatal(err)
	}

	id := func(b [8]byte) []byte { return b[:] }
	tid, uid := traceID("t"), traceID("u")
	want := &collectortrace.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{{
		Resource: &resourcepb.Resource{Attributes: []*commonpb.KeyValue{
			{Key: "pid", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: 7}}}, str("service.name", "engine")}},
		SchemaUrl: "https://opentelemetry.io/schemas/1.26.0",
		ScopeSpans: []*tracepb.ScopeSpans{{Scope: &commonpb.InstrumentationScope{Name: scope}, Spans: []*tracepb.Span{
			{TraceId: tid[:], SpanId: id(spanID("s")), TraceState: "vendor=abc", ParentSpanId: id(spanID("p")), Name: "execute_tool echo",
				Kind: tracepb.Span_SPAN_KIND_INTERNAL, StartTimeUnixNano: nanos(at(1)), EndTimeUnixNano: nanos(at(2)),
				Attributes: []*commonpb.KeyValue{str("gen_ai.tool.name", "echo"),
					{Key: "toolbatch.attempt", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: 2}}},
					{Key: "neg", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: -5}}},
					{Key: "b", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_BoolValue{BoolValue: true}}},
					{Key: "f", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_DoubleValue{DoubleValue: 1.5}}},
					str("list", `["a","b"]`), str("long", long), str("longer", longer), str("error.type", "timed_out")},
				Events: []*tracepb.Span_Event{
					{TimeUnixNano: nanos(at(1)), Name: EventGate, Attributes: []*commonpb.KeyValue{str("toolbatch.gate.outcome", "allow")}},
					{TimeUnixNano: nanos(at(2)), Name: EventClaim}},
				Status: &tracepb.Status{Code: tracepb.Status_STATUS_CODE_ERROR, Message: "timed_out"},
				Flags:  0x301},
			{TraceId: uid[:], SpanId: id(spanID("r")), Name: SpanBatch, Kind: tracepb.Span_SPAN_KIND_CONSUMER,
				StartTimeUnixNano: nanos(at(0)), EndTimeUnixNano: nanos(at(3)), Flags: 0x101},
		}}},
	}}}
	if !proto.Equal(want, &got) {
		t.Errorf("decoded request:\n%s\nwant:\n%s", prototext.Format(&got), prototext.Format(want))
	}
}

func TestRejected(t *testing.T) {
	body, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{PartialSuccess: &collectortrace.ExportTracePartialSuccess{RejectedSpans: 3, ErrorMessage: "too old"}})
	if n, msg := rejected(body); n != 3 || msg != "too old" {
		t.Errorf("rejected: %d %q", n, msg)
	}
	for _, b := range [][]byte{nil, {}, {0xff}} {
		if n, msg := rejected(b); n != 0 || msg != "" {
			t.Errorf("rejected(%x): %d %q", b, n, msg)
		}
	}
}
