package replay

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/protocol"
)

// Policy is the gate policy what-if re-evaluates the recorded calls with:
// the policy stage of another catalog (cmd/replay adapts a
// *catalog.Catalog).
type Policy interface {
	// Evaluate decides a call of a tool with its arguments at a time, with
	// an empty state (catalog.Catalog.Evaluate).
	Evaluate(toolID string, args events.RawJSON, at time.Time) PolicyDecision
	// HasExternal reports whether the policy asks an external gate service
	// after its rules (catalog.Catalog.External).
	HasExternal() bool
}

// PolicyDecision is what a Policy's rules decide for a call.
type PolicyDecision struct {
	Matched bool   // a rule decided; false: none matched (allow)
	Rule    string // the rule that decided, such as "gate.rules[1]"
	Outcome events.GateOutcome
	Reason  string // the block reason
}

// WhatIf holds the recorded gate decisions and what another policy
// decides for them: Add each commit of the events stream, in order, then
// WriteText or WriteJSON.
type WhatIf struct {
	policy  Policy
	prefix  string
	batches map[string]*events.BatchSubmitted // by batch id: the calls' tools and arguments
	rows    []WhatIfRow
	skipped []string // commits that could not be read
}

// NewWhatIf returns an empty what-if of the runs of a subject prefix,
// re-evaluated with policy.
func NewWhatIf(policy Policy, prefix string) *WhatIf {
	return &WhatIf{policy: policy, prefix: prefix, batches: map[string]*events.BatchSubmitted{}}
}

// WhatIfRow is one recorded gate decision, re-evaluated: a JSON line of
// WriteJSON.
type WhatIfRow struct {
	Type    string    `json:"type"` // "call"
	Run     string    `json:"run"`
	Batch   string    `json:"batch"`
	Call    string    `json:"call"`
	Tool    string    `json:"tool"`
	Seq     uint64    `json:"seq"`
	At      time.Time `json:"at"`
	Old     Decision  `json:"old"`
	New     Decision  `json:"new"`
	Changed bool      `json:"changed"`
}

// Decision is one gate decision: its audit label (allow, deny,
// set_result, ask, schedule), the stage and rule that made it.
type Decision struct {
	Label  string `json:"label"`
	Stage  string `json:"stage"`
	Rule   string `json:"rule,omitempty"`
	Reason string `json:"reason,omitempty"`
	Note   string `json:"note,omitempty"`
}

// String is the decision as the what-if table prints it: label (stage
// rule, note).
func (d Decision) String() string {
	s := d.Label + " (" + d.Stage
	if d.Rule != "" {
		s += " " + d.Rule
	}
	if d.Reason != "" {
		s += ": " + strconv.Quote(d.Reason)
	}
	if d.Note != "" {
		s += ", " + d.Note
	}
	return s + ")"
}

// Add reads one commit: submissions are kept for their calls, and every
// CallGated is re-evaluated.
func (w *WhatIf) Add(m *Message) {
	r := m.Record
	runID, _ := protocol.Names{Prefix: w.prefix}.RunOf(protocol.EventsFamily, r.Subject)
	evs, err := m.Commit()
	if err != nil {
		w.skipped = append(w.skipped, fmt.Sprintf("seq %d: %v", r.Seq, err))
		return
	}
	for _, e := range evs {
		switch ev := e.(type) {
		case *events.BatchSubmitted:
			w.batches[ev.BatchID] = ev
		case *events.CallGated:
			row := WhatIfRow{Type: "call", Run: runID, Batch: ev.BatchID, Call: ev.CallID, Seq: r.Seq, At: ev.At.UTC(),
				Old: Decision{Label: label(ev), Stage: ev.Stage, Rule: ev.Rule, Reason: ev.Reason}}
			b := w.batches[ev.BatchID]
			var call *events.Call
			if b != nil {
				for i := range b.Calls {
					if b.Calls[i].CallID == ev.CallID {
						call = &b.Calls[i]
					}
				}
			}
			if call == nil {
				row.New = Decision{Label: "?", Stage: "-", Note: "the batch's submission was not read"}
				row.Tool = "?"
			} else {
				row.Tool = call.ToolID
				row.New = w.reevaluate(b, call, ev)
			}
			row.Changed = row.New.Label != "?" && row.New.Label != row.Old.Label
			w.rows = append(w.rows, row)
		}
	}
}

// reevaluate runs the gate chain of contract.md §3.3 with the other
// policy: the narrowing, then the policy rules (Policy.Evaluate at the
// recorded decision's time, with an empty state), then the external
// gate, which replay cannot ask: a decision it recorded is kept, and
// without one the call is taken as allowed (with a note).
func (w *WhatIf) reevaluate(b *events.BatchSubmitted, c *events.Call, g *events.CallGated) Decision {
	if b.Narrowing == events.NarrowingDenyAll {
		return Decision{Label: events.GateBlock.Label(), Stage: events.StageNarrowing, Reason: "run narrowed: deny_all"}
	}
	pd := w.policy.Evaluate(c.ToolID, c.Arguments, g.At)
	if pd.Matched && pd.Outcome != events.GateAllow {
		return Decision{Label: pd.Outcome.Label(), Stage: events.StagePolicy, Rule: pd.Rule, Reason: pd.Reason}
	}
	if w.policy.HasExternal() {
		if g.Stage == events.StageExternal {
			return Decision{Label: label(g), Stage: events.StageExternal, Rule: g.Rule, Reason: g.Reason, Note: "recorded answer"}
		}
		return Decision{Label: events.GateAllow.Label(), Stage: events.StageExternal, Note: "not asked; taken as allow"}
	}
	return Decision{Label: events.GateAllow.Label(), Stage: events.StageDefault}
}

// counts returns how many decisions changed, by "old -> new", sorted.
func (w *WhatIf) counts() (changed int, byKind []string) {
	m := map[string]int{}
	for _, r := range w.rows {
		if r.Changed {
			changed++
			m[r.Old.Label+" -> "+r.New.Label]++
		}
	}
	for k, n := range m {
		byKind = append(byKind, fmt.Sprintf("%s: %d", k, n))
	}
	sort.Strings(byKind)
	return changed, byKind
}

// WriteText writes the re-evaluated decisions as a table, old -> new (only
// those that change with onlyChanged), then a summary line.
func (w *WhatIf) WriteText(out io.Writer, onlyChanged bool) error {
	bw := bufio.NewWriter(out)
	tw := tabwriter.NewWriter(bw, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tBATCH\tCALL\tTOOL\tSEQ\tOLD\t\tNEW")
	for _, r := range w.rows {
		if onlyChanged && !r.Changed {
			continue
		}
		mark := "="
		if r.Changed {
			mark = "->"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", cell(r.Run), cell(r.Batch), cell(r.Call), cell(r.Tool), r.Seq,
			cell(r.Old.String()), mark, cell(r.New.String()))
	}
	tw.Flush()
	changed, byKind := w.counts()
	line := fmt.Sprintf("what-if: %d gate decisions, %d would change", len(w.rows), changed)
	if len(byKind) > 0 {
		line += " (" + strings.Join(byKind, ", ") + ")"
	}
	fmt.Fprintln(bw, line)
	for _, s := range w.skipped {
		fmt.Fprintln(bw, "what-if: skipped undecodable commit at "+s)
	}
	return bw.Flush()
}

// WriteJSON writes the re-evaluated decisions as JSON lines (WhatIfRow;
// only those that change with onlyChanged), then a summary line.
func (w *WhatIf) WriteJSON(out io.Writer, onlyChanged bool) error {
	bw := bufio.NewWriter(out)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false)
	for _, r := range w.rows {
		if onlyChanged && !r.Changed {
			continue
		}
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	changed, _ := w.counts()
	if err := enc.Encode(struct {
		Type      string   `json:"type"`
		Decisions int      `json:"decisions"`
		Changed   int      `json:"changed"`
		Skipped   []string `json:"skipped,omitempty"`
	}{"summary", len(w.rows), changed, w.skipped}); err != nil {
		return err
	}
	return bw.Flush()
}
