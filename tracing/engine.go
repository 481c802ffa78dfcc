package tracing

import (
	"encoding/binary"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/internal/inorder"
)

// Span names. An attempt's span is named SpanAttempt, a space and the
// tool's id (the GenAI convention's "execute_tool {gen_ai.tool.name}"); a
// ticket's SpanTicket, a space and the wait's reason.
const (
	SpanBatch   = "toolbatch.batch"
	SpanAttempt = "execute_tool"
	SpanTicket  = "toolbatch.ticket"
	// EventGate is the span event of a call's gate decision, on the call's
	// first span.
	EventGate = "toolbatch.gate"
	// EventClaim is the span event of a sandbox worker's claim of an
	// attempt, on the attempt's span.
	EventClaim = "toolbatch.claim"
)

// Attribute keys: the GenAI semantic conventions' and toolbatch's own.
const (
	AttrOperationName = attribute.Key("gen_ai.operation.name") // execute_tool
	AttrToolName      = attribute.Key("gen_ai.tool.name")
	AttrToolCallID    = attribute.Key("gen_ai.tool.call.id")
	AttrToolType      = attribute.Key("gen_ai.tool.type") // function
	AttrErrorType     = attribute.Key("error.type")

	AttrRunID          = attribute.Key("toolbatch.run_id")
	AttrBatchID        = attribute.Key("toolbatch.batch_id")
	AttrStep           = attribute.Key("toolbatch.step")
	AttrCalls          = attribute.Key("toolbatch.calls")
	AttrAttempt        = attribute.Key("toolbatch.attempt") // 0: the call never entered executing
	AttrAttemptCause   = attribute.Key("toolbatch.attempt.cause")
	AttrTarget         = attribute.Key("toolbatch.tool.target")
	AttrGateOutcome    = attribute.Key("toolbatch.gate.outcome")
	AttrGateSource     = attribute.Key("toolbatch.gate.source")
	AttrGateRule       = attribute.Key("toolbatch.gate.rule")
	AttrOutcome        = attribute.Key("toolbatch.outcome")
	AttrRecoveryAction = attribute.Key("toolbatch.recovery.action")
	AttrReason         = attribute.Key("toolbatch.reason")
	AttrCorrelationID  = attribute.Key("toolbatch.ticket.correlation_id")
	AttrResolution     = attribute.Key("toolbatch.ticket.resolution")
	AttrPrincipal      = attribute.Key("toolbatch.ticket.principal")
	AttrPool           = attribute.Key("toolbatch.pool")
	AttrWorkerID       = attribute.Key("toolbatch.worker_id")
)

// Recovery actions (toolbatch.recovery.action), as the metrics name them.
const (
	RecoveryReplayed      = "replayed"
	RecoveryRedispatched  = "redispatched"
	RecoveryIndeterminate = "indeterminate"
)

// ToolType is every call's gen_ai.tool.type: the engine or its workers
// run the function the model named.
const ToolType = "function"

// Engine makes the engine's spans from its commits. A nil *Engine makes
// none.
type Engine struct {
	p *Provider

	mu   sync.Mutex
	runs map[string]*batchTrace // the latest batch of each run, until finalized
	// what a span is made of, reused (under mu: a span is encoded when it
	// is recorded)
	attrs, gateAttrs, claimAttrs []attribute.KeyValue
	events                       []spanEvent
}

type batchTrace struct {
	id     string
	runID  string
	step   int64
	parent trace.SpanContext // the submitter's (invalid: the batch is a root)
	self   trace.SpanContext
	start  time.Time
	calls  []callTrace // in the batch's order
	last   int         // the index of the call last looked up
}

type callTrace struct {
	id, tool, target string
	pool             string // a sandbox tool's
	history          events.CallHistory
	gate             *events.CallGated
	gateShown        bool
	attempt          int // the open attempt (0: none)
	start            time.Time
	cause            string
	recovery         string
	ticket           *events.CallAwaiting
	claim            *events.CallClaimed // the open attempt's
}

// maxRuns bounds the batches kept (parked batches may wait for days):
// beyond it they are forgotten, and their spans not made.
const maxRuns = 1 << 16

// NewEngine returns the engine's span maker (nil when p is nil).
func NewEngine(p *Provider) *Engine {
	if p == nil {
		return nil
	}
	return &Engine{p: p, runs: map[string]*batchTrace{}}
}

// Committed makes the spans that a commit's events end. traceparent is
// the commit's header (a BatchSubmitted commit's: the submitter's).
func (e *Engine) Committed(runID, traceparent string, evs []events.Event) {
	e.observe(runID, traceparent, evs, true)
}

// Loaded learns what a commit read back from the log says (a run loaded,
// recovered or taken over), without making spans: they were made by the
// engine that appended it.
func (e *Engine) Loaded(runID, traceparent string, evs []events.Event) {
	e.observe(runID, traceparent, evs, false)
}

// BatchSpan is the context of a batch's span, derived once per batch, as
// every engine derives it, from the run, the batch and the traceparent the
// batch was submitted with (its commit's header): what its attempts'
// contexts are derived from, before their spans exist and whichever
// engine makes them. The zero BatchSpan (traces off) derives nothing.
type BatchSpan struct{ sc trace.SpanContext }

// Batch returns a batch's span context (the zero BatchSpan when e is nil).
func (e *Engine) Batch(runID, batchID, submitted string) BatchSpan {
	if e == nil {
		return BatchSpan{}
	}
	return BatchSpan{batchContext(runID, batchID, Parse(submitted))}
}

// Attempt returns the traceparent of a call's attempt span, what a sandbox
// dispatch and its claim's grant carry to the worker and the tool ("" for
// the zero BatchSpan).
func (b BatchSpan) Attempt(callID string, attempt int) string {
	if !b.sc.IsValid() {
		return ""
	}
	return Format(childOf(b.sc, childAttempt, callID, attempt))
}

// Redispatched marks a call's open attempt as dispatched again by a
// recovery.
func (e *Engine) Redispatched(runID, callID string) {
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if b := e.runs[runID]; b != nil {
		if c := b.call(b.id, callID); c != nil {
			c.recovery = RecoveryRedispatched
		}
	}
}

func (e *Engine) observe(runID, traceparent string, evs []events.Event, emit bool) {
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	b := e.runs[runID]
	for _, ev := range evs {
		if s, ok := ev.(*events.BatchSubmitted); ok {
			if len(e.runs) >= maxRuns {
				clear(e.runs)
			}
			b = newBatch(runID, traceparent, s)
			e.runs[runID] = b
			continue
		}
		if b != nil && b.observe(e, ev, emit) { // done with
			delete(e.runs, runID)
			b = nil
		}
	}
}

func newBatch(runID, traceparent string, s *events.BatchSubmitted) *batchTrace {
	b := &batchTrace{id: s.BatchID, runID: runID, step: s.Step, parent: Parse(traceparent), start: s.At,
		calls: make([]callTrace, len(s.Calls))}
	b.self = batchContext(runID, s.BatchID, b.parent)
	for i, c := range s.Calls {
		target := string(c.Tool.Target)
		if c.Tool.Kind == events.KindUnknown {
			target = events.NoTarget
		}
		ct := &b.calls[i]
		ct.id, ct.tool, ct.target = c.CallID, c.ToolID, target
		if c.Tool.Target == events.TargetSandbox {
			if ct.pool = c.Tool.Pool; ct.pool == "" {
				ct.pool = events.DefaultPool
			}
		}
	}
	return b
}

// The kinds of a batch's child spans.
const (
	childAttempt = 'a'
	childTicket  = 't'
)

// batchContext is the context of a batch's span: a child of the
// submitter's span when the submission carried one, else the root of a
// trace of its own, derived from the run and the batch.
func batchContext(runID, batchID string, parent trace.SpanContext) trace.SpanContext {
	cfg := trace.SpanContextConfig{TraceFlags: trace.FlagsSampled}
	if parent.IsValid() {
		cfg.TraceID, cfg.TraceFlags, cfg.TraceState = parent.TraceID(), parent.TraceFlags(), parent.TraceState()
		cfg.SpanID = spanID("batch", parent.TraceID().String(), parent.SpanID().String(), batchID)
	} else {
		cfg.TraceID = traceID("toolbatch", runID, batchID)
		cfg.SpanID = spanID("batch", cfg.TraceID.String(), batchID)
	}
	return trace.NewSpanContext(cfg)
}

// childOf is the context of one of a batch's child spans: an attempt's
// (its call id and number) or a ticket's (its correlation id, n 0).
func childOf(batch trace.SpanContext, kind byte, id string, n int) trace.SpanContext {
	parent := batch.SpanID()
	d := xxhash.New()
	var head [9]byte
	copy(head[:8], parent[:])
	head[8] = kind
	_, _ = d.Write(head[:])
	_, _ = d.WriteString(id)
	var num [9]byte
	binary.BigEndian.PutUint64(num[1:], uint64(n))
	_, _ = d.Write(num[:])
	var s trace.SpanID
	binary.BigEndian.PutUint64(s[:], d.Sum64())
	if !s.IsValid() {
		s[7] = 1
	}
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: batch.TraceID(), TraceFlags: batch.TraceFlags(),
		TraceState: batch.TraceState(), SpanID: s})
}

// observe folds one event of the batch's run; it reports whether the
// batch is done with.
func (b *batchTrace) observe(e *Engine, ev events.Event, emit bool) bool {
	switch ev := ev.(type) {
	case *events.CallGated:
		if c := b.call(ev.BatchID, ev.CallID); c != nil {
			c.gate, c.gateShown, c.history.Gate = ev, false, ev.Outcome
		}
	case *events.CallExecuting:
		c := b.call(ev.BatchID, ev.CallID)
		if c == nil {
			return false
		}
		if c.attempt > 0 && emit {
			// the open attempt ended without an outcome: retried or recovered
			why := string(events.ErrorUnavailableBeforeDispatch)
			if ev.Cause == events.CauseRecovered {
				why = string(events.OutcomeInterrupted) // by a crash or a takeover
			}
			e.attempt(b, c, ev.At, "", why, AttrReason.String(trimmed(ev.Detail)))
		}
		c.attempt, c.start, c.cause, c.history.Executed, c.recovery, c.claim = ev.Attempt, ev.At, ev.Cause, true, "", nil
		if ev.Cause == events.CauseRecovered {
			c.recovery = RecoveryReplayed
		}
	case *events.CallClaimed:
		if c := b.call(ev.BatchID, ev.CallID); c != nil && ev.Attempt == c.attempt {
			c.claim = ev
		}
	case *events.CallAwaiting:
		if c := b.call(ev.BatchID, ev.CallID); c != nil {
			c.ticket = ev
		}
	case *events.TicketResolved:
		c := b.call(ev.BatchID, ev.CallID)
		if c == nil {
			return false
		}
		c.history.Resolution = ev.Resolution
		if c.ticket != nil && emit {
			e.ticket(b, c, ev.At, AttrResolution.String(string(ev.Resolution)), AttrPrincipal.String(ev.Principal))
		}
		c.ticket = nil
	case *events.CallCompleted:
		c := b.call(ev.BatchID, ev.CallID)
		if c == nil {
			return false
		}
		if emit {
			outcome := c.history.Completed(ev)
			errType := ""
			if outcome.Failed() {
				errType = string(outcome)
				if ev.ErrorKind != "" {
					errType = string(ev.ErrorKind)
				}
			}
			e.attempt(b, c, ev.At, outcome, errType)
		}
		c.attempt = 0
	case *events.CallIndeterminate:
		c := b.call(ev.BatchID, ev.CallID)
		if c == nil {
			return false
		}
		if emit {
			c.recovery = RecoveryIndeterminate
			e.attempt(b, c, ev.At, events.OutcomeIndeterminate, string(events.OutcomeIndeterminate), AttrReason.String(trimmed(ev.Reason)))
		}
		c.attempt = 0
	case *events.BatchFinalized:
		if ev.BatchID != b.id {
			return false
		}
		if emit {
			e.batch(b, ev.At, "", AttrReason.String(ev.Conflict))
		}
		return true
	case *events.RunEnded:
		if emit {
			// what was still open ends with the run
			for i := range b.calls {
				c := &b.calls[i]
				if c.ticket != nil {
					e.ticket(b, c, ev.At, AttrResolution.String(string(ev.Cause)))
				}
				if c.attempt > 0 {
					e.attempt(b, c, ev.At, events.OutcomeInterrupted, string(ev.Cause))
				}
			}
			e.batch(b, ev.At, string(ev.Cause), AttrReason.String(trimmed(ev.Reason)))
		}
		return true
	}
	return false
}

// call returns one of the batch's calls (nil: not one of its).
func (b *batchTrace) call(batchID, callID string) *callTrace {
	if batchID != b.id {
		return nil
	}
	return inorder.Find(b.calls, &b.last, callID, func(c *callTrace) string { return c.id })
}

func (e *Engine) batch(b *batchTrace, end time.Time, errType string, extra ...attribute.KeyValue) {
	e.attrs = append(e.attrs[:0], AttrRunID.String(b.runID), AttrBatchID.String(b.id), AttrStep.Int64(b.step), AttrCalls.Int(len(b.calls)))
	e.p.record(&span{parent: b.parent, self: b.self, name: SpanBatch, kind: trace.SpanKindConsumer, start: b.start, end: end, errType: errType,
		attrs: e.withExtra(extra)})
}

// withExtra appends to e.attrs the extra attributes that are not empty.
func (e *Engine) withExtra(extra []attribute.KeyValue) []attribute.KeyValue {
	for _, a := range extra {
		if a.Value.AsString() != "" {
			e.attrs = append(e.attrs, a)
		}
	}
	return e.attrs
}

// attempt records a call's span: its open attempt's, or, for a call that
// never entered executing (blocked, set, denied, answered by the client),
// the call's from the batch's acceptance (attempt 0).
func (e *Engine) attempt(b *batchTrace, c *callTrace, end time.Time, outcome events.CallOutcome, errType string, extra ...attribute.KeyValue) {
	start := c.start
	if c.attempt == 0 {
		start = b.start
	}
	attrs := append(e.attrs[:0],
		AttrOperationName.String(SpanAttempt), AttrToolName.String(c.tool), AttrToolCallID.String(c.id), AttrToolType.String(ToolType),
		AttrRunID.String(b.runID), AttrBatchID.String(b.id), AttrAttempt.Int(c.attempt), AttrTarget.String(c.target),
	)
	if c.gate != nil {
		attrs = append(attrs, AttrGateOutcome.String(string(c.gate.Outcome)))
	}
	if c.cause != "" && c.attempt > 0 {
		attrs = append(attrs, AttrAttemptCause.String(c.cause))
	}
	if outcome != "" {
		attrs = append(attrs, AttrOutcome.String(string(outcome)))
	}
	if c.recovery != "" {
		attrs = append(attrs, AttrRecoveryAction.String(c.recovery))
	}
	if c.pool != "" {
		attrs = append(attrs, AttrPool.String(c.pool))
	}
	if c.claim != nil && c.attempt > 0 {
		attrs = append(attrs, AttrWorkerID.String(c.claim.WorkerID))
	}
	e.attrs = attrs
	evs := e.events[:0]
	if g := c.gate; g != nil && !c.gateShown {
		c.gateShown = true
		e.gateAttrs = append(e.gateAttrs[:0], AttrGateOutcome.String(string(g.Outcome)),
			AttrGateSource.String(events.GateSource(g.Stage)), AttrGateRule.String(g.Rule), AttrReason.String(trimmed(g.Reason)))
		evs = append(evs, spanEvent{name: EventGate, at: g.At, attrs: e.gateAttrs})
	}
	if cl := c.claim; cl != nil && c.attempt > 0 {
		e.claimAttrs = append(e.claimAttrs[:0], AttrWorkerID.String(cl.WorkerID))
		evs = append(evs, spanEvent{name: EventClaim, at: cl.At, attrs: e.claimAttrs})
	}
	e.events = evs
	e.p.record(&span{parent: b.self, self: childOf(b.self, childAttempt, c.id, c.attempt), name: SpanAttempt, detail: c.tool, kind: trace.SpanKindInternal,
		start: start, end: end, errType: errType, attrs: e.withExtra(extra), events: evs})
}

// ticket records the wait of a call's ticket, from awaiting to resolved.
func (e *Engine) ticket(b *batchTrace, c *callTrace, end time.Time, extra ...attribute.KeyValue) {
	t := c.ticket
	e.attrs = append(e.attrs[:0], AttrRunID.String(b.runID), AttrBatchID.String(b.id), AttrToolName.String(c.tool), AttrToolCallID.String(c.id),
		AttrCorrelationID.String(t.Ticket.CorrelationID))
	e.p.record(&span{parent: b.self, self: childOf(b.self, childTicket, t.Ticket.CorrelationID, 0), name: SpanTicket, detail: string(t.Ticket.Reason),
		kind: trace.SpanKindInternal, start: t.At, end: end, attrs: e.withExtra(extra)})
}
