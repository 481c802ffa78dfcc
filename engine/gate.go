package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbatch/toolbatch/aggregate"
	"github.com/toolbatch/toolbatch/catalog"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/protocol"
)

type gateChain struct {
	nc    *nats.Conn
	names protocol.Names
}

// gateDecisions runs the gate chain of contract.md §3.3 for each call: the
// run's narrowing, the operator's rules of the batch's pinned catalog, the
// external gate service, then allow. The first non-allow outcome wins.
func (e *Engine) gateDecisions(ctx context.Context, run *aggregate.Run, callIDs []string) ([]aggregate.Decision, error) {
	b := run.OpenBatch()
	cat, err := e.catalogFor(ctx, b.SnapshotID)
	if err != nil {
		return nil, err
	}
	var state map[string]any
	if cat.UsesState() {
		if state, err = e.state.visible(ctx, run.RunID, run.ThreadID); err != nil {
			return nil, fmt.Errorf("read committed state: %w", err)
		}
	}
	now := e.cfg.Now()
	out := make([]aggregate.Decision, 0, len(callIDs))
	for _, id := range callIDs {
		c, _ := b.Call(id)
		d := aggregate.Decision{CallID: id, Outcome: events.GateAllow, Stage: events.StageDefault}
		if narrowed, ok := aggregate.Narrowed(b, id); ok {
			d = narrowed
		} else {
			pd := cat.Evaluate(c.ToolID, c.Arguments, state, now)
			if pd.Matched && pd.Outcome != events.GateAllow {
				d = fromPolicy(id, pd)
			} else if ext, ok := cat.External(); ok {
				d = e.gate.external(ctx, run, b, c, ext, now)
			}
		}
		if d.Outcome == events.GateRequireConfirmation || d.Outcome == events.GateSchedule {
			d.CorrelationID = newID()
		}
		if d.Outcome == events.GateAllow {
			d.Capability = e.capability(ctx, c.ToolID, c.Tool)
		}
		out = append(out, d)
	}
	return out, nil
}

// gateAsksOutside reports whether gating the run's open batch may ask the
// external gate service (or cannot tell, its catalog being unreadable).
func (e *Engine) gateAsksOutside(ctx context.Context, run *aggregate.Run) bool {
	b := run.OpenBatch()
	if b == nil {
		return false
	}
	cat, err := e.catalogFor(ctx, b.SnapshotID)
	if err != nil {
		return true
	}
	_, ok := cat.External()
	return ok
}

func fromPolicy(callID string, pd catalog.Decision) aggregate.Decision {
	return aggregate.Decision{CallID: callID, Outcome: pd.Outcome, Stage: events.StagePolicy, Rule: pd.Rule,
		Reason: pd.Reason, Output: pd.Output, Deadline: pd.Deadline, Due: pd.Due, ActionKind: pd.ActionKind}
}

// external asks the gate service. A timeout or an unreachable service
// decides the catalog's on_timeout outcome.
func (g *gateChain) external(ctx context.Context, run *aggregate.Run, b *aggregate.Batch, c *aggregate.Call, ext catalog.External, now time.Time) aggregate.Decision {
	d := aggregate.Decision{CallID: c.CallID, Outcome: events.GateAllow, Stage: events.StageExternal, Rule: "external"}
	body, err := events.Marshal(protocol.GateRequest{RunID: run.RunID, BatchID: b.ID, CallID: c.CallID, ToolID: c.ToolID,
		Arguments: c.Arguments, SnapshotID: b.SnapshotID})
	if err != nil {
		d.Outcome, d.Reason = events.GateBlock, "gate request: "+err.Error()
		return d
	}
	rctx, cancel := context.WithTimeout(ctx, ext.Timeout)
	defer cancel()
	msg, err := g.nc.RequestWithContext(rctx, g.names.Gate(), body)
	if err != nil {
		d.Outcome = ext.OnTimeout
		if d.Outcome == events.GateBlock {
			reason := "external gate timed out"
			if errors.Is(err, nats.ErrNoResponders) {
				reason = "external gate unavailable"
			}
			d.Reason = reason
		}
		return d
	}
	var r protocol.GateReply
	if err := events.Unmarshal(msg.Data, &r); err != nil {
		d.Outcome, d.Reason = events.GateBlock, "external gate: malformed reply"
		return d
	}
	d.Outcome, d.Reason, d.Output = r.Outcome, r.Reason, r.Output
	switch r.Outcome {
	case events.GateAllow, events.GateBlock:
	case events.GateSetResult:
		if r.Output == nil {
			d.Outcome, d.Reason = events.GateBlock, "external gate: set_result without an output"
		}
	case events.GateRequireConfirmation:
		if r.DeadlineMS > 0 {
			t := now.Add(time.Duration(r.DeadlineMS) * time.Millisecond)
			d.Deadline = &t
		}
	case events.GateSchedule:
		t := now.Add(time.Duration(r.DueMS) * time.Millisecond)
		d.Due = &t
	default:
		d.Outcome, d.Reason = events.GateBlock, "external gate: unknown outcome "+string(r.Outcome)
	}
	return d
}

// capability is the live recovery capability of a tool's executor: a
// builtin's declared one, or what its host service or worker advertises in
// the registry bucket (key brain.<tool_id>); unknown means non_recoverable.
func (e *Engine) capability(ctx context.Context, toolID string, d events.Descriptor) events.Capability {
	if tool, ok := e.cfg.Catalog.Tool(toolID); ok && tool.Builtin != "" {
		if bt, ok := Builtins[tool.Builtin]; ok {
			return bt.Capability
		}
	} else if ok && tool.MCP != nil {
		return tool.MCP.Capability // the operator's declaration in the catalog
	}
	if d.Kind == events.KindDelegation {
		return events.CapDurableRequest // the delegation protocol: a stable delegation id
	}
	if d.Target == events.TargetSandbox {
		return e.live.sandbox(ctx, poolOf(d), toolID)
	}
	if d.Target != events.TargetBrain || d.Kind != events.KindTool {
		return events.CapNonRecoverable
	}
	return e.live.brainTool(ctx, toolID)
}

// supported reports catalog features this engine cannot serve yet, so that
// it refuses to start rather than accept calls it would strand.
func supported(c *catalog.Catalog) error {
	var errs []error
	for _, t := range c.Tools() {
		if _, ok := Builtins[t.Builtin]; t.Builtin != "" && !ok {
			errs = append(errs, c.ToolProblem(t.ID, "builtin", "unknown builtin "+t.Builtin+" (the engine has echo, sleep and fail)"))
		}
	}
	return errors.Join(errs...)
}
