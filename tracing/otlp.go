package tracing

import (
	"math"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/resource"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/encoding/protowire"
)

// The OTLP protobuf encoding of spans, appended field by field into a
// reused buffer: the OpenTelemetry SDK's exporter converts each span into
// a tree of generated structs and marshals those, which cost a busy
// engine more CPU than making the spans (docs/performance.md, "Metrics
// and traces together").
//
// Field numbers of opentelemetry-proto (collector/trace/v1,
// trace/v1, common/v1, resource/v1).
const (
	fRequestResourceSpans = 1 // ExportTraceServiceRequest

	fResourceSpansResource   = 1 // ResourceSpans
	fResourceSpansScopeSpans = 2
	fResourceSpansSchemaURL  = 3

	fResourceAttributes = 1 // Resource

	fScopeSpansScope     = 1 // ScopeSpans
	fScopeSpansSpans     = 2
	fScopeSpansSchemaURL = 3

	fScopeName = 1 // InstrumentationScope

	fSpanTraceID      = 1 // Span
	fSpanSpanID       = 2
	fSpanTraceState   = 3
	fSpanParentSpanID = 4
	fSpanName         = 5
	fSpanKind         = 6
	fSpanStart        = 7
	fSpanEnd          = 8
	fSpanAttributes   = 9
	fSpanEvents       = 11
	fSpanStatus       = 15
	fSpanFlags        = 16

	fEventTime       = 1 // Span.Event
	fEventName       = 2
	fEventAttributes = 3

	fStatusMessage = 2 // Status
	fStatusCode    = 3

	fKeyValueKey   = 1 // KeyValue
	fKeyValueValue = 2

	fAnyString = 1 // AnyValue
	fAnyBool   = 2
	fAnyInt    = 3
	fAnyDouble = 4

	fResponsePartialSuccess = 1 // ExportTraceServiceResponse
	fPartialRejectedSpans   = 1 // ExportTracePartialSuccess
	fPartialErrorMessage    = 2
)

const (
	statusCodeError = 2 // Status.StatusCode STATUS_CODE_ERROR
	// Span.flags: the low 8 bits are the W3C trace flags; these say
	// whether the parent is remote.
	flagHasIsRemote = 0x100
	flagIsRemote    = 0x200
)

// spanEvent is an event on a span.
type spanEvent struct {
	name  string
	at    time.Time
	attrs []attribute.KeyValue
}

// span is what record encodes: a whole span, known once it has ended.
type span struct {
	parent, self trace.SpanContext
	// name, and detail after a space when not empty ("execute_tool echo")
	name, detail string
	kind         trace.SpanKind
	start, end   time.Time
	errType      string // not empty: the span failed, with this error.type
	attrs        []attribute.KeyValue
	events       []spanEvent
}

// appendSpan appends s as field num of its message.
func appendSpan(b []byte, num protowire.Number, s *span) []byte {
	b, at := beginMessage(b, num)
	t, id := s.self.TraceID(), s.self.SpanID()
	b = appendBytesField(b, fSpanTraceID, t[:])
	b = appendBytesField(b, fSpanSpanID, id[:])
	if ts := s.self.TraceState(); ts.Len() > 0 {
		b = appendStringField(b, fSpanTraceState, ts.String())
	}
	if s.parent.IsValid() {
		p := s.parent.SpanID()
		b = appendBytesField(b, fSpanParentSpanID, p[:])
	}
	b = protowire.AppendTag(b, fSpanName, protowire.BytesType)
	if s.detail == "" {
		b = protowire.AppendString(b, s.name)
	} else {
		b = protowire.AppendVarint(b, uint64(len(s.name)+1+len(s.detail)))
		b = append(append(append(b, s.name...), ' '), s.detail...)
	}
	b = protowire.AppendTag(b, fSpanKind, protowire.VarintType)
	b = protowire.AppendVarint(b, uint64(s.kind)) // OTLP's SpanKind numbers are the API's
	b = appendTime(b, fSpanStart, s.start)
	b = appendTime(b, fSpanEnd, s.end)
	for _, kv := range s.attrs {
		b = appendKeyValue(b, fSpanAttributes, kv)
	}
	if s.errType != "" {
		b = appendKeyValue(b, fSpanAttributes, AttrErrorType.String(s.errType))
	}
	for i := range s.events {
		ev := &s.events[i]
		var eat int
		b, eat = beginMessage(b, fSpanEvents)
		b = appendTime(b, fEventTime, ev.at)
		b = appendStringField(b, fEventName, ev.name)
		for _, kv := range ev.attrs {
			b = appendKeyValue(b, fEventAttributes, kv)
		}
		b = endMessage(b, eat)
	}
	if s.errType != "" {
		size := protowire.SizeTag(fStatusMessage) + protowire.SizeBytes(len(s.errType)) + protowire.SizeTag(fStatusCode) + protowire.SizeVarint(statusCodeError)
		b = protowire.AppendTag(b, fSpanStatus, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(size))
		b = appendStringField(b, fStatusMessage, s.errType)
		b = protowire.AppendTag(b, fStatusCode, protowire.VarintType)
		b = protowire.AppendVarint(b, statusCodeError)
	}
	flags := uint32(s.self.TraceFlags()) | flagHasIsRemote
	if s.parent.IsRemote() {
		flags |= flagIsRemote
	}
	b = protowire.AppendTag(b, fSpanFlags, protowire.Fixed32Type)
	b = protowire.AppendFixed32(b, flags)
	return endMessage(b, at)
}

// lengthRoom is the room beginMessage leaves for a message's length: a
// varint of up to 4 bytes, 256 MiB, far more than any span.
const lengthRoom = 4

// beginMessage appends the tag of a length-delimited field num and room
// for its length; endMessage, given the returned offset, writes the
// length of what was appended since and closes the room left over.
func beginMessage(b []byte, num protowire.Number) ([]byte, int) {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return append(b, make([]byte, lengthRoom)...), len(b)
}

func endMessage(b []byte, at int) []byte {
	n := uint64(len(b) - at - lengthRoom)
	size := protowire.SizeVarint(n)
	if size > lengthRoom {
		panic("tracing: a span of more than 256 MiB")
	}
	copy(b[at+size:], b[at+lengthRoom:])
	b = b[:len(b)-(lengthRoom-size)]
	protowire.AppendVarint(b[at:at], n)
	return b
}

func appendBytesField(b []byte, num protowire.Number, v []byte) []byte {
	return protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), v)
}

func appendStringField(b []byte, num protowire.Number, v string) []byte {
	return protowire.AppendString(protowire.AppendTag(b, num, protowire.BytesType), v)
}

func appendTime(b []byte, num protowire.Number, t time.Time) []byte {
	return protowire.AppendFixed64(protowire.AppendTag(b, num, protowire.Fixed64Type), uint64(t.UnixNano()))
}

// appendKeyValue appends kv as field num (a KeyValue). A value of a kind
// OTLP's AnyValue holds as a list (the slices) is written as its string.
func appendKeyValue(b []byte, num protowire.Number, kv attribute.KeyValue) []byte {
	var av int // the AnyValue's size
	switch kv.Value.Type() {
	case attribute.BOOL:
		av = protowire.SizeTag(fAnyBool) + 1
	case attribute.INT64:
		av = protowire.SizeTag(fAnyInt) + protowire.SizeVarint(uint64(kv.Value.AsInt64()))
	case attribute.FLOAT64:
		av = protowire.SizeTag(fAnyDouble) + protowire.SizeFixed64()
	case attribute.STRING:
		av = protowire.SizeTag(fAnyString) + protowire.SizeBytes(len(kv.Value.AsString()))
	default:
		kv = kv.Key.String(kv.Value.Emit())
		av = protowire.SizeTag(fAnyString) + protowire.SizeBytes(len(kv.Value.AsString()))
	}
	size := protowire.SizeTag(fKeyValueKey) + protowire.SizeBytes(len(kv.Key)) + protowire.SizeTag(fKeyValueValue) + protowire.SizeBytes(av)
	b = protowire.AppendTag(b, num, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(size))
	b = appendStringField(b, fKeyValueKey, string(kv.Key))
	b = protowire.AppendTag(b, fKeyValueValue, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(av))
	switch kv.Value.Type() {
	case attribute.BOOL:
		b = protowire.AppendTag(b, fAnyBool, protowire.VarintType)
		b = protowire.AppendVarint(b, protowire.EncodeBool(kv.Value.AsBool()))
	case attribute.INT64:
		b = protowire.AppendTag(b, fAnyInt, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(kv.Value.AsInt64()))
	case attribute.FLOAT64:
		b = protowire.AppendTag(b, fAnyDouble, protowire.Fixed64Type)
		b = protowire.AppendFixed64(b, math.Float64bits(kv.Value.AsFloat64()))
	default:
		b = appendStringField(b, fAnyString, kv.Value.AsString())
	}
	return b
}

// batchHead is what every export request repeats around its spans: the
// resource and the instrumentation scope, encoded once.
type batchHead struct {
	resource []byte // ResourceSpans.resource and .schema_url
	scope    []byte // ScopeSpans.scope
}

func newBatchHead(res *resource.Resource, scopeName string) batchHead {
	var h batchHead
	var at int
	h.resource, at = beginMessage(nil, fResourceSpansResource)
	for _, kv := range res.Attributes() {
		h.resource = appendKeyValue(h.resource, fResourceAttributes, kv)
	}
	h.resource = endMessage(h.resource, at)
	if u := res.SchemaURL(); u != "" {
		h.resource = appendStringField(h.resource, fResourceSpansSchemaURL, u)
	}
	h.scope, at = beginMessage(nil, fScopeSpansScope)
	h.scope = appendStringField(h.scope, fScopeName, scopeName)
	h.scope = endMessage(h.scope, at)
	return h
}

// request appends an ExportTraceServiceRequest of spans (ScopeSpans.spans
// fields, as appendSpan wrote them) to b.
func (h batchHead) request(b, spans []byte) []byte {
	ss := len(h.scope) + len(spans)
	rs := len(h.resource) + protowire.SizeTag(fResourceSpansScopeSpans) + protowire.SizeBytes(ss)
	b = protowire.AppendTag(b, fRequestResourceSpans, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(rs))
	b = append(b, h.resource...)
	b = protowire.AppendTag(b, fResourceSpansScopeSpans, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(ss))
	b = append(b, h.scope...)
	return append(b, spans...)
}

// rejected reads an ExportTraceServiceResponse's partial success: the
// spans the receiver rejected and why (0 and "" when it accepted all, or
// when the body is not one).
func rejected(body []byte) (int64, string) {
	partial := field(body, fResponsePartialSuccess, protowire.BytesType)
	if partial == nil {
		return 0, ""
	}
	var n int64
	if v := field(partial, fPartialRejectedSpans, protowire.VarintType); v != nil {
		u, _ := protowire.ConsumeVarint(v)
		n = int64(u)
	}
	msg := field(partial, fPartialErrorMessage, protowire.BytesType)
	return n, string(msg)
}

// field returns the last field num of type typ in message b: a bytes
// field's contents, a varint's encoding (nil: none, or b is malformed).
func field(b []byte, num protowire.Number, typ protowire.Type) []byte {
	var found []byte
	for len(b) > 0 {
		n, t, l := protowire.ConsumeTag(b)
		if l < 0 {
			return nil
		}
		b = b[l:]
		vl := protowire.ConsumeFieldValue(n, t, b)
		if vl < 0 {
			return nil
		}
		if n == num && t == typ {
			found = b[:vl]
			if t == protowire.BytesType {
				found, _ = protowire.ConsumeBytes(b)
			}
		}
		b = b[vl:]
	}
	return found
}
