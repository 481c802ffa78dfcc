package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/toolbatch/toolbatch/catalog"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/protocol"
)

// cmdWhatIf re-gates every recorded gate decision with another catalog.
func cmdWhatIf(ctx context.Context, o *options, stdout, stderr io.Writer) error {
	cat, err := catalog.Load(o.catalog)
	if err != nil {
		return usageErrorf("%v", err)
	}
	if cat.UsesState() {
		fmt.Fprintf(stderr, "replay: what-if: rules of %s read state; they are evaluated with an empty state\n", o.catalog)
	}
	src, err := openSource(o, "")
	if err != nil {
		return err
	}
	defer src.close()
	w := &whatIf{cat: cat, prefix: o.prefix, batches: map[string]*events.BatchSubmitted{}}
	prog := newProgress(stderr)
	err = src.read(ctx, eventsStream, o.sel, true, func(m *message) error {
		prog.add(m)
		w.add(m)
		return nil
	})
	if err != nil {
		return err
	}
	prog.done()
	if o.json {
		return w.printJSON(stdout, o.changed)
	}
	return w.printText(stdout, o.changed)
}

// whatIf holds the recorded gate decisions and what the other catalog
// decides for them.
type whatIf struct {
	cat     *catalog.Catalog
	prefix  string
	batches map[string]*events.BatchSubmitted // by batch id: the calls' tools and arguments
	rows    []whatIfRow
	skipped []string // commits that could not be read
}

// whatIfRow is one recorded gate decision, re-evaluated.
type whatIfRow struct {
	Type    string    `json:"type"` // "call"
	Run     string    `json:"run"`
	Batch   string    `json:"batch"`
	Call    string    `json:"call"`
	Tool    string    `json:"tool"`
	Seq     uint64    `json:"seq"`
	At      time.Time `json:"at"`
	Old     decision  `json:"old"`
	New     decision  `json:"new"`
	Changed bool      `json:"changed"`
}

// decision is one gate decision: its audit label (allow, deny,
// set_result, ask, schedule), the stage and rule that made it.
type decision struct {
	Label  string `json:"label"`
	Stage  string `json:"stage"`
	Rule   string `json:"rule,omitempty"`
	Reason string `json:"reason,omitempty"`
	Note   string `json:"note,omitempty"`
}

func (d decision) String() string {
	s := d.Label + " (" + d.Stage
	if d.Rule != "" {
		s += " " + d.Rule
	}
	if d.Note != "" {
		s += ", " + d.Note
	}
	return s + ")"
}

// add reads one commit: submissions are kept for their calls, and every
// CallGated is re-evaluated.
func (w *whatIf) add(m *message) {
	r := m.Record
	runID, _ := protocol.Names{Prefix: w.prefix}.RunOf(protocol.Events, r.Subject)
	evs, err := m.commit()
	if err != nil {
		w.skipped = append(w.skipped, fmt.Sprintf("seq %d: %v", r.Seq, err))
		return
	}
	for _, e := range evs {
		switch ev := e.(type) {
		case *events.BatchSubmitted:
			w.batches[ev.BatchID] = ev
		case *events.CallGated:
			row := whatIfRow{Type: "call", Run: runID, Batch: ev.BatchID, Call: ev.CallID, Seq: r.Seq, At: ev.At.UTC(),
				Old: decision{Label: label(ev), Stage: ev.Stage, Rule: ev.Rule, Reason: ev.Reason}}
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
				row.New = decision{Label: "?", Stage: "-", Note: "the batch's submission was not read"}
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
// catalog's rules: the narrowing, then the policy rules (catalog.Evaluate
// at the recorded decision's time, with an empty state), then the external
// gate, which replay cannot ask: a decision it recorded is kept, and
// without one the call is taken as allowed (with a note).
func (w *whatIf) reevaluate(b *events.BatchSubmitted, c *events.Call, g *events.CallGated) decision {
	if b.Narrowing == events.NarrowingDenyAll {
		return decision{Label: events.GateBlock.Label(), Stage: events.StageNarrowing, Reason: "run narrowed: deny_all"}
	}
	pd := w.cat.Evaluate(c.ToolID, c.Arguments, nil, g.At)
	if pd.Matched && pd.Outcome != events.GateAllow {
		return decision{Label: pd.Outcome.Label(), Stage: events.StagePolicy, Rule: pd.Rule, Reason: pd.Reason}
	}
	if _, ok := w.cat.External(); ok {
		if g.Stage == events.StageExternal {
			return decision{Label: label(g), Stage: events.StageExternal, Rule: g.Rule, Reason: g.Reason, Note: "recorded answer"}
		}
		return decision{Label: events.GateAllow.Label(), Stage: events.StageExternal, Note: "not asked; taken as allow"}
	}
	return decision{Label: events.GateAllow.Label(), Stage: events.StageDefault}
}

// counts returns how many decisions changed, by "old -> new", sorted.
func (w *whatIf) counts() (changed int, byKind []string) {
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

func (w *whatIf) printText(out io.Writer, onlyChanged bool) error {
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

func (w *whatIf) printJSON(out io.Writer, onlyChanged bool) error {
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
