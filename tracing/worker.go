package tracing

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Sandbox is a worker's span of one attempt it claimed, from the claim to
// the result's publication, the child of the attempt's span (the
// dispatch's traceparent).
type Sandbox struct {
	span trace.Span // nil: tracing off
	tool string     // the traceparent the tool is given
}

// Sandbox starts a worker's span under a dispatch's traceparent. With
// tracing off (a nil provider) nothing is recorded, and the tool is given
// the dispatch's own traceparent, so that a tool that traces still hangs
// its spans from the attempt.
func (p *Provider) Sandbox(traceparent, pool, tool, callID, workerID string, attempt int) *Sandbox {
	if p == nil {
		return &Sandbox{tool: traceparent}
	}
	ctx := context.Background()
	if parent := Parse(traceparent); parent.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, parent)
	}
	_, s := p.tracer.Start(ctx, SpanSandbox+" "+tool, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(
		AttrToolName.String(tool), AttrToolCallID.String(callID), AttrAttempt.Int(attempt), AttrPool.String(pool), AttrWorkerID.String(workerID)))
	return &Sandbox{span: s, tool: Format(s.SpanContext())}
}

// ToolParent is the TRACEPARENT of the tool's environment ("" for none).
func (s *Sandbox) ToolParent() string { return s.tool }

// End ends the span with how the tool ended (exit) and, for a failure,
// its error type.
func (s *Sandbox) End(exit, errType string) {
	if s.span == nil {
		return
	}
	s.span.SetAttributes(AttrExit.String(exit))
	if errType != "" {
		s.span.SetAttributes(AttrErrorType.String(errType))
		s.span.SetStatus(codes.Error, errType)
	}
	s.span.End(trace.WithTimestamp(time.Now()))
}
