package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/catalog"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/protocol"
)

// invocation is one attempt handed to an executor.
type invocation struct {
	runID, batchID, callID, toolID string
	arguments                      events.RawJSON
	attempt                        int
	operationID                    string
	traceparent                    string // the attempt's trace context (sandbox calls; "": traces off)
	tool                           events.Descriptor
	input                          string // delegation: resume the child with it
	hasInput                       bool
}

// Builtin is a brain tool built into the engine.
type Builtin struct {
	// Capability is the recovery capability the implementation declares.
	Capability events.Capability
	// Run executes one attempt.
	Run func(ctx context.Context, args events.RawJSON) (events.Output, *events.ToolError)
}

// Builtins are the engine's built-in brain tools, by name.
var Builtins = map[string]Builtin{
	"echo": {Capability: events.CapReplaySafe, Run: func(_ context.Context, args events.RawJSON) (events.Output, *events.ToolError) {
		text := string(args)
		if len(args) == 0 {
			text = "{}"
		}
		return events.TextOutput("", text), nil
	}},
	"sleep": {Capability: events.CapReplaySafe, Run: func(ctx context.Context, args events.RawJSON) (events.Output, *events.ToolError) {
		var a struct {
			Duration string `json:"duration"`
		}
		if len(args) > 0 {
			if err := json.Unmarshal(args, &a); err != nil {
				return events.Output{}, &events.ToolError{Kind: events.ErrorInvalidArguments, Message: err.Error()}
			}
		}
		d, err := time.ParseDuration(a.Duration)
		if err != nil || d < 0 {
			return events.Output{}, &events.ToolError{Kind: events.ErrorInvalidArguments, Message: fmt.Sprintf("duration %q is not a Go duration", a.Duration)}
		}
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return events.TextOutput("", "slept "+d.String()), nil
		case <-ctx.Done():
			return events.Output{}, &events.ToolError{Kind: events.ErrorExecution, Message: "interrupted"}
		}
	}},
	"fail": {Capability: events.CapReplaySafe, Run: func(_ context.Context, args events.RawJSON) (events.Output, *events.ToolError) {
		var a struct {
			Message string `json:"message"`
		}
		if len(args) > 0 {
			_ = json.Unmarshal(args, &a)
		}
		return events.ErrorOutput("", a.Message), nil
	}},
}

// DefaultBrainTimeout bounds a host brain service call.
const DefaultBrainTimeout = 60 * time.Second

type brainExecutor struct {
	nc    *nats.Conn
	js    jetstream.JetStream
	names protocol.Names
}

// invoke runs one attempt of a brain tool: a builtin in-process, or a host
// service by request/reply. "No responders" proves nothing was dispatched
// (unavailable_before_dispatch); a timeout after the request left means the
// owner was lost, and the recovery table decides.
func (b *brainExecutor) invoke(ctx context.Context, cat *catalog.Catalog, inv invocation) outcome {
	if inv.tool.Kind == events.KindDelegation {
		return b.delegate(ctx, inv)
	}
	o := outcome{callID: inv.callID, attempt: inv.attempt}
	tool, _ := cat.Tool(inv.toolID)
	if tool.MCP != nil {
		return b.invokeMCP(ctx, tool.MCP, inv)
	}
	if bt, ok := Builtins[tool.Builtin]; ok && tool.Builtin != "" {
		out, terr := bt.Run(ctx, inv.arguments)
		if terr != nil {
			o.err = terr
		} else {
			o.output = &out
		}
		return o
	}
	body, err := events.Marshal(protocol.BrainRequest{CallID: inv.callID, ToolID: inv.toolID, Arguments: inv.arguments,
		OperationID: inv.operationID, Attempt: inv.attempt})
	if err != nil {
		o.err = &events.ToolError{Kind: events.ErrorExecution, Message: err.Error()}
		return o
	}
	rctx, cancel := context.WithTimeout(ctx, DefaultBrainTimeout)
	defer cancel()
	reply, err := b.nc.RequestWithContext(rctx, b.names.Brain(inv.toolID), body)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		o.err = &events.ToolError{Kind: events.ErrorUnavailableBeforeDispatch, Message: "no brain service answers " + b.names.Brain(inv.toolID)}
		return o
	case err != nil:
		o.lost = true
		return o
	}
	var r protocol.BrainReply
	if err := events.Unmarshal(reply.Data, &r); err != nil || (r.Output == nil) == (r.Error == nil) {
		o.err = &events.ToolError{Kind: events.ErrorExecution, Message: "malformed reply from the brain service"}
		return o
	}
	o.output, o.err = r.Output, r.Error
	return o
}
