// Package tracing exports OpenTelemetry traces of batches and their calls
// (the span names and attribute keys are part of the public interface;
// docs/operations.md lists each). It is configured by the standard OTEL_*
// environment variables and is off unless they name an OTLP endpoint or
// exporter (FromEnv).
//
// The engine's spans are made from the events of each commit it appends
// (Engine.Committed), with the events' own times, when what they describe
// has ended: a batch's span at its finalization, an attempt's at its end.
// Their span ids are derived from the trace, the batch and the call, not
// drawn at random, so that whichever engine ends a span, a recovered or
// taken-over run's spans still hang from the same batch span, and the
// traceparent of an attempt's dispatch is known before its span exists,
// from the run, the batch and the submitter's traceparent alone
// (Engine.Batch, once per batch, then BatchSpan.Attempt): the engine
// hands its commits to Committed off the commit's path, a few
// milliseconds later. The traceparent a client sent with its submission
// is carried in the BatchSubmitted commit's headers (outside what the
// commit hash covers) and read again when a run is loaded
// (Engine.Loaded).
//
// A span is encoded as OTLP protobuf when it is recorded, field by field
// into the export queue's buffer (otlp.go), and exported over OTLP/HTTP by
// a goroutine of the package's own (export.go) configured by the standard
// variables: the SDK's exporter turned each span into generated structs
// and marshalled them, at six times the CPU (BenchmarkEngineBatch).
//
// Imports: events, internal/inorder, protocol, github.com/cespare/xxhash/v2, go.opentelemetry.io/otel, google.golang.org/protobuf.
package tracing
