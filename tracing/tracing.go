package tracing

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolbatch/toolbatch/protocol"
)

// The environment FromEnv reads (the OpenTelemetry specification's names;
// export.go lists the exporter's others, and the resource reads
// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES).
const (
	EnvExporter       = "OTEL_TRACES_EXPORTER"
	EnvEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	EnvProtocol       = "OTEL_EXPORTER_OTLP_PROTOCOL"
	EnvTracesProtocol = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	EnvServiceName    = "OTEL_SERVICE_NAME"
)

// Provider exports spans. A nil *Provider exports nothing.
type Provider struct {
	x *exporter
}

// FromEnv returns the provider the environment asks for: nil (tracing off)
// unless OTEL_TRACES_EXPORTER is otlp, or it is unset and an OTLP endpoint
// is set. The exporter is OTLP over HTTP with protobuf; service names the
// service when OTEL_SERVICE_NAME does not. report hears of the exports
// that fail and the spans dropped (nil: nobody).
func FromEnv(service string, report func(error)) (*Provider, error) {
	switch exp := os.Getenv(EnvExporter); exp {
	case "none":
		return nil, nil
	case "":
		if os.Getenv(EnvEndpoint) == "" && os.Getenv(EnvTracesEndpoint) == "" {
			return nil, nil
		}
	case "otlp":
	default:
		return nil, fmt.Errorf("%s=%s: toolbatch exports traces with otlp only (or none)", EnvExporter, exp)
	}
	for _, k := range []string{EnvTracesProtocol, EnvProtocol} {
		if p := os.Getenv(k); p != "" {
			if p != "http/protobuf" {
				return nil, fmt.Errorf("%s=%s: toolbatch exports OTLP over http/protobuf only", k, p)
			}
			break
		}
	}
	cfg, err := configFromEnv()
	if err != nil {
		return nil, err
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName(service)))
	if err != nil {
		return nil, err
	}
	if os.Getenv(EnvServiceName) != "" {
		res = resource.Default() // its service name is the variable's
	}
	return newProvider(cfg, res, newHTTPSender(cfg).send, report), nil
}

// scope names the spans' instrumentation.
const scope = "github.com/toolbatch/toolbatch"

func newProvider(cfg exportConfig, res *resource.Resource, send func(context.Context, []byte) error, report func(error)) *Provider {
	return &Provider{x: newExporter(cfg, newBatchHead(res, scope), send, report)}
}

// record queues a finished span for its export, encoded at once: every
// span here is known whole when it ends, so none of the SDK's machinery
// for spans in progress (a sampler, a span taking attributes while it
// runs, a snapshot for the exporter to convert) is needed, and it cost a
// busy engine several per cent of its CPU. A span is recorded when its
// trace is sampled (the submitter's flag; a trace toolbatch starts is
// sampled).
func (p *Provider) record(s *span) {
	if !s.self.IsSampled() {
		return
	}
	p.x.add(s)
}

// Shutdown exports what is queued and stops.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil {
		return nil
	}
	return p.x.shutdown(ctx)
}

// Parse reads a traceparent header (an invalid context when it is empty
// or malformed: a trace is then started).
func Parse(traceparent string) trace.SpanContext {
	if traceparent == "" {
		return trace.SpanContext{}
	}
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{protocol.HeaderTraceParent: traceparent})
	return trace.SpanContextFromContext(ctx)
}

// Format writes a span context as a traceparent header, version 00 ("" when
// invalid).
func Format(sc trace.SpanContext) string {
	if !sc.IsValid() {
		return ""
	}
	t, s := sc.TraceID(), sc.SpanID()
	var b [55]byte
	copy(b[:], "00-")
	hex.Encode(b[3:35], t[:])
	b[35] = '-'
	hex.Encode(b[36:52], s[:])
	b[52] = '-'
	hex.Encode(b[53:55], []byte{byte(sc.TraceFlags() & trace.FlagsSampled)})
	return string(b[:])
}

// hash is a 64-bit hash of parts, each followed by a zero byte: xxhash,
// fast and the same in every process, so that every engine derives the
// same ids. salt tells the two halves of a trace id apart.
func hash(salt byte, parts ...string) uint64 {
	d := xxhash.New()
	_, _ = d.Write([]byte{salt})
	for _, p := range parts {
		_, _ = d.WriteString(p)
		_, _ = d.Write([]byte{0})
	}
	return d.Sum64()
}

func spanID(parts ...string) trace.SpanID {
	var s trace.SpanID
	binary.BigEndian.PutUint64(s[:], hash(0, parts...))
	if !s.IsValid() {
		s[7] = 1
	}
	return s
}

func traceID(parts ...string) trace.TraceID {
	var t trace.TraceID
	binary.BigEndian.PutUint64(t[:8], hash(1, parts...))
	binary.BigEndian.PutUint64(t[8:], hash(2, parts...))
	if !t.IsValid() {
		t[15] = 1
	}
	return t
}

// trimmed bounds an attribute value taken from a tool's output.
func trimmed(s string) string {
	const max = 256
	s = strings.TrimSpace(s)
	if len(s) > max {
		return s[:max] + "…"
	}
	return s
}

// shutdownTimeout bounds the export of what is buffered at exit.
const shutdownTimeout = 5 * time.Second

// Setup is FromEnv for a program: it also returns the function to defer,
// which exports what is buffered (within a few seconds) and stops.
func Setup(service string, report func(error)) (*Provider, func(), error) {
	p, err := FromEnv(service, report)
	if err != nil {
		return nil, nil, err
	}
	return p, func() {
		ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		_ = p.Shutdown(ctx)
	}, nil
}
