package aggregate

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/toolbatch/toolbatch/events"
)

// NextKind names what a run needs from the engine.
type NextKind string

// What a run can need.
const (
	NextNone               NextKind = "none"                // no open batch, or the run ended
	NextGate               NextKind = "gate"                // run the gate chain for CallIDs (all of them: the parallel branch)
	NextParkClient         NextKind = "park_client"         // park the client-executed call on an external_result ticket
	NextExecuting          NextKind = "executing"           // CallIDs are executing: their executors report
	NextAwaiting           NextKind = "awaiting"            // parked on Ticket
	NextCompleteUnrunnable NextKind = "complete_unrunnable" // an unknown tool or input that is not an object: Decide completes it with an error on its own; the engine never sees it
)

// Work is what a run needs next.
type Work struct {
	Kind    NextKind
	CallIDs []string
	Ticket  *events.Ticket
}

func (w Work) String() string {
	if len(w.CallIDs) == 0 {
		return string(w.Kind)
	}
	return fmt.Sprintf("%s %s", w.Kind, strings.Join(w.CallIDs, ","))
}

// Next reports what the run needs from the engine now. Calls are taken
// strictly in model order: call k+1 is not gated before call k is terminal,
// except in the parallel branch (contract.md §3.2).
func Next(r *Run) Work {
	b := r.OpenBatch()
	if r.End != nil || b == nil {
		return Work{Kind: NextNone}
	}
	if b.Ticket != nil {
		return Work{Kind: NextAwaiting, CallIDs: []string{b.Ticket.CallID}, Ticket: b.Ticket}
	}
	var executing []string
	for _, c := range b.Calls {
		if c.Phase == events.PhaseExecuting {
			executing = append(executing, c.CallID)
		}
	}
	if len(executing) > 0 {
		return Work{Kind: NextExecuting, CallIDs: executing}
	}
	for i, c := range b.Calls {
		if c.Phase.Terminal() {
			continue
		}
		switch {
		case c.Tool.Kind == events.KindUnknown || !c.Arguments.IsObjectOrNull() || c.Invalid != "":
			return Work{Kind: NextCompleteUnrunnable, CallIDs: []string{c.CallID}}
		case c.Tool.Kind == events.KindClient:
			return Work{Kind: NextParkClient, CallIDs: []string{c.CallID}}
		case i == 0 && b.ParallelEligible() && allRequested(b):
			ids := make([]string, len(b.Calls))
			for j, cc := range b.Calls {
				ids[j] = cc.CallID
			}
			return Work{Kind: NextGate, CallIDs: ids}
		default:
			return Work{Kind: NextGate, CallIDs: []string{c.CallID}}
		}
	}
	return Work{Kind: NextNone}
}

func allRequested(b *Batch) bool {
	for _, c := range b.Calls {
		if c.Phase != events.PhaseRequested {
			return false
		}
	}
	return true
}

// IndeterminatePrefix starts the error output published for an
// indeterminate call.
const IndeterminatePrefix = "tool outcome is indeterminate: "

// Final is what the barrier publishes for a batch whose calls are all
// terminal.
type Final struct {
	Results  []events.ContentBlock // one tool_result per tool_use, model order
	State    []events.Command      // staged commands in model order; none on a conflict
	Conflict string                // the exclusive conflict, if any
}

// Finalization computes the barrier's publication for a batch: results in
// model order, and the staged state validated together.
func Finalization(b *Batch) Final {
	var f Final
	f.Results = make([]events.ContentBlock, 0, len(b.Calls))
	for _, c := range b.Calls {
		switch {
		case c.Phase == events.PhaseCompleted && c.Output != nil:
			f.Results = append(f.Results, c.Output.ToolResultBlock())
			f.State = append(f.State, c.Output.State...)
		default:
			f.Results = append(f.Results, events.ErrorOutput(c.CallID, IndeterminatePrefix+c.Reason).ToolResultBlock())
		}
	}
	if conflict := exclusiveConflict(b); conflict != "" {
		f.Conflict = conflict
		f.State = nil
	}
	return f
}

// exclusiveConflict finds a scope+key set more than once in the batch where
// one of the sets is exclusive.
func exclusiveConflict(b *Batch) string {
	type setter struct {
		calls     []string
		exclusive bool
	}
	keys := map[string]*setter{}
	var order []string
	for _, c := range b.Calls {
		if c.Phase != events.PhaseCompleted || c.Output == nil {
			continue
		}
		for _, cmd := range c.Output.State {
			if cmd.Action != events.ActionSet {
				continue
			}
			k := string(cmd.Scope) + ":" + cmd.Key
			s := keys[k]
			if s == nil {
				s = &setter{}
				keys[k] = s
				order = append(order, k)
			}
			s.calls = append(s.calls, c.CallID)
			s.exclusive = s.exclusive || cmd.Merge == events.MergeExclusive
		}
	}
	sort.Strings(order)
	for _, k := range order {
		if s := keys[k]; s.exclusive && len(s.calls) > 1 {
			return fmt.Sprintf("exclusive state key %s set by calls %s", k, strings.Join(s.calls, ", "))
		}
	}
	return ""
}

func finalizedEvent(b *Batch, at time.Time) *events.BatchFinalized {
	f := Finalization(b)
	return &events.BatchFinalized{BatchID: b.ID, Step: b.Step, Results: f.Results, State: f.State, Conflict: f.Conflict, At: at}
}

// Narrowed returns the decision of the batch's narrowing for a call, the
// first stage of the gate chain, and whether it decides: a batch submitted
// with narrowing deny_all blocks every call before any rule or external
// gate is asked.
func Narrowed(b *Batch, callID string) (Decision, bool) {
	if b.Narrowing != events.NarrowingDenyAll {
		return Decision{}, false
	}
	return Decision{CallID: callID, Outcome: events.GateBlock, Stage: events.StageNarrowing, Reason: "run narrowed: deny_all"}, true
}
