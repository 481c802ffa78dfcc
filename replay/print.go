package replay

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/toolbatch/toolbatch/events"
)

// timeLayout is how times are printed in tables: UTC, milliseconds.
const timeLayout = "2006-01-02T15:04:05.000Z"

// row is one printed line of a history table.
type row struct {
	call, what, text string
}

// rows describes an event as table rows: one per event, except the
// barrier, which adds one row per published result and staged command.
func rows(e events.Event) []row {
	switch ev := e.(type) {
	case *events.BatchSubmitted:
		s := fmt.Sprintf("step %d, %d call%s, assistant message %s, snapshot %s", ev.Step, len(ev.Calls), plural(len(ev.Calls)), ev.Assistant.ID, ev.SnapshotID)
		if ev.Narrowing != "" {
			s += ", narrowing " + ev.Narrowing
		}
		return []row{{"", "submitted", s}}
	case *events.BatchRejected:
		return []row{{"", "rejected", fmt.Sprintf("batch %s step %d: %s: %s", orDash(ev.BatchID), ev.Step, ev.Code, ev.Reason)}}
	case *events.CallGated:
		s := fmt.Sprintf("%s by %s", label(ev), ev.Stage)
		if ev.Rule != "" {
			s += " rule " + ev.Rule
		}
		if ev.Reason != "" {
			s += fmt.Sprintf(" reason %q", ev.Reason)
		}
		if ev.Output != nil {
			s += " output " + events.DescribeOutput(*ev.Output)
		}
		return []row{{ev.CallID, "gate", s}}
	case *events.CallExecuting:
		s := fmt.Sprintf("attempt %d cause %s capability %s", ev.Attempt, ev.Cause, ev.Capability)
		if ev.Detail != "" {
			s += fmt.Sprintf(" detail %q", ev.Detail)
		}
		if ev.Parallel {
			s += " parallel"
		}
		return []row{{ev.CallID, "executing", s}}
	case *events.CallClaimed:
		return []row{{ev.CallID, "claimed", fmt.Sprintf("attempt %d by worker %s token %s lease %dms", ev.Attempt, ev.WorkerID, ev.ClaimToken, ev.LeaseMS)}}
	case *events.CallCompleted:
		s := fmt.Sprintf("attempt %d %s", ev.Attempt, events.DescribeOutput(ev.Output))
		if ev.ErrorKind != "" {
			s += " error_kind " + string(ev.ErrorKind)
		}
		for _, c := range ev.Output.State {
			s += " stage " + events.DescribeCommand(c)
		}
		return []row{{ev.CallID, "completed", s}}
	case *events.CallIndeterminate:
		return []row{{ev.CallID, "indeterminate", fmt.Sprintf("attempt %d reason %q", ev.Attempt, ev.Reason)}}
	case *events.CallAwaiting:
		t := ev.Ticket
		s := fmt.Sprintf("ticket %s %s", t.CorrelationID, t.Reason)
		if t.Deadline != nil {
			s += " deadline " + t.Deadline.UTC().Format(time.RFC3339)
		}
		if t.Due != nil {
			s += " due " + t.Due.UTC().Format(time.RFC3339)
		}
		if t.ActionKind != "" {
			s += " action " + t.ActionKind
		}
		return []row{{ev.CallID, "awaiting", s}}
	case *events.TicketResolved:
		s := fmt.Sprintf("ticket %s %s by %s", ev.CorrelationID, ev.Resolution, orDash(ev.Principal))
		if ev.Note != "" {
			s += fmt.Sprintf(" note %q", ev.Note)
		}
		if ev.Input != "" {
			s += fmt.Sprintf(" input %q", ev.Input)
		}
		return []row{{ev.CallID, "resolved", s}}
	case *events.ResultRefused:
		return []row{{ev.CallID, "refused", fmt.Sprintf("attempt %d token %s: %s", ev.Attempt, ev.ClaimToken, ev.Reason)}}
	case *events.BatchFinalized:
		s := fmt.Sprintf("barrier: %d result%s in model order", len(ev.Results), plural(len(ev.Results)))
		if len(ev.State) > 0 {
			s += fmt.Sprintf(", %d state command%s", len(ev.State), plural(len(ev.State)))
		}
		if ev.Conflict != "" {
			s += fmt.Sprintf(", state not committed: %q", ev.Conflict)
		}
		out := []row{{"", "finalized", s}}
		for _, b := range ev.Results {
			out = append(out, row{b.ToolUseID, "published", events.DescribeOutput(events.Output{Content: b.Content, IsError: b.IsError})})
		}
		for _, c := range ev.State {
			out = append(out, row{"", "state", events.DescribeCommand(c)})
		}
		return out
	case *events.RunEnded:
		s := string(ev.Cause)
		if ev.Reason != "" {
			s += fmt.Sprintf(" %q", ev.Reason)
		}
		return []row{{"", "ended", s}}
	}
	return []row{{"", "?", fmt.Sprintf("%T", e)}}
}

// label is a gate decision's audit label.
func label(g *events.CallGated) string {
	if g.Label != "" {
		return g.Label
	}
	return g.Outcome.Label()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// cell makes text safe for a tabwriter cell.
func cell(s string) string {
	if s == "" {
		return "-"
	}
	return cellReplacer.Replace(s)
}

var cellReplacer = strings.NewReplacer("\t", " ", "\n", " ", "\r", " ")

// WriteText writes the history as aligned tables (docs/replay.md, section 3).
func (h *History) WriteText(w io.Writer) error {
	bw := bufio.NewWriter(w)
	if len(h.order) == 0 && len(h.strays) == 0 {
		fmt.Fprintln(bw, "no events")
	}
	for i, rh := range h.order {
		if i > 0 {
			fmt.Fprintln(bw)
		}
		fmt.Fprintf(bw, "run %s  thread %s  %s  %d commits (seq %d..%d)\n", rh.id, orDash(rh.thread), rh.status(), rh.commits, rh.first, rh.last)
		for _, b := range rh.batches {
			head := fmt.Sprintf("  batch %s  step %d", b.id, b.step)
			if b.subSeq != 0 {
				head += fmt.Sprintf("  submitted at seq %d", b.subSeq)
			} else {
				head += "  submission not read"
			}
			if b.finalSeq != 0 {
				head += fmt.Sprintf("  finalized at seq %d", b.finalSeq)
			} else {
				head += "  open"
			}
			fmt.Fprintln(bw, head)
			if len(b.calls) > 0 {
				tw := tabwriter.NewWriter(bw, 0, 0, 2, ' ', 0)
				fmt.Fprintln(tw, "    CALL\tTOOL\tTARGET\tKIND\tMODE\tMAX\tPHASE\tATTEMPT\tENTRIES\tWORKER")
				for _, c := range b.calls {
					entries := strconv.Itoa(c.Entries)
					if c.Entries < 0 {
						entries = "?"
					}
					phase := c.Phase
					if phase == "" {
						phase = "?"
					}
					fmt.Fprintf(tw, "    %s\t%s\t%s\t%s\t%s\t%d\t%s\t%d\t%s\t%s\n", cell(c.CallID), cell(c.ToolID), cell(c.Target),
						cell(c.Kind), cell(c.Mode), c.MaxAttempts, phase, c.Attempt, entries, cell(c.Worker))
				}
				tw.Flush()
			}
			printItems(bw, b.items)
		}
		if len(rh.items) > 0 {
			fmt.Fprintln(bw, "  run")
			printItems(bw, rh.items)
		}
	}
	if len(h.strays) > 0 {
		fmt.Fprintln(bw, "other messages")
		printItems(bw, h.strays)
	}
	return bw.Flush()
}

// printItems writes one history table.
func printItems(w io.Writer, items []item) {
	if len(items) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "    SEQ\tAT\tCALL\tWHAT\tDETAIL")
	for _, it := range items {
		if it.ev == nil {
			fmt.Fprintf(tw, "    %d\t%s\t-\t!\t%s\n", it.seq, it.note.time.UTC().Format(timeLayout), cell(it.note.text))
			continue
		}
		at := eventTime(it.ev).UTC().Format(timeLayout)
		for _, r := range rows(it.ev) {
			fmt.Fprintf(tw, "    %d\t%s\t%s\t%s\t%s\n", it.seq, at, cell(r.call), r.what, cell(r.text))
		}
	}
	tw.Flush()
}

// eventTime is an event's at.
func eventTime(e events.Event) time.Time {
	switch ev := e.(type) {
	case *events.BatchSubmitted:
		return ev.At
	case *events.BatchRejected:
		return ev.At
	case *events.CallGated:
		return ev.At
	case *events.CallExecuting:
		return ev.At
	case *events.CallClaimed:
		return ev.At
	case *events.CallCompleted:
		return ev.At
	case *events.CallIndeterminate:
		return ev.At
	case *events.CallAwaiting:
		return ev.At
	case *events.TicketResolved:
		return ev.At
	case *events.ResultRefused:
		return ev.At
	case *events.BatchFinalized:
		return ev.At
	case *events.RunEnded:
		return ev.At
	}
	return time.Time{}
}

// JSON lines of the history (docs/replay.md).
type (
	// RunLine opens a run's lines.
	RunLine struct {
		Type      string `json:"type"` // "run"
		Run       string `json:"run"`
		Thread    string `json:"thread,omitempty"`
		Status    string `json:"status"`
		EndCause  string `json:"end_cause,omitempty"`
		EndReason string `json:"end_reason,omitempty"`
		Commits   int    `json:"commits"`
		FirstSeq  uint64 `json:"first_seq"`
		LastSeq   uint64 `json:"last_seq"`
		Batches   int    `json:"batches"`
		Folded    bool   `json:"folded"`
		FoldStop  string `json:"fold_stop,omitempty"`
	}
	// BatchLine opens a batch's lines: its calls' states.
	BatchLine struct {
		Type         string      `json:"type"` // "batch"
		Run          string      `json:"run"`
		Batch        string      `json:"batch"`
		Step         int64       `json:"step"`
		SnapshotID   string      `json:"snapshot_id,omitempty"`
		Narrowing    string      `json:"narrowing,omitempty"`
		SubmittedSeq uint64      `json:"submitted_seq,omitempty"`
		FinalizedSeq uint64      `json:"finalized_seq,omitempty"`
		Calls        []CallState `json:"calls"`
	}
	// EventLine is one event, with the commit's stream sequence.
	EventLine struct {
		Type      string       `json:"type"` // "event"
		Run       string       `json:"run"`
		Batch     string       `json:"batch,omitempty"`
		Call      string       `json:"call,omitempty"`
		Seq       uint64       `json:"seq"`
		At        time.Time    `json:"at"`
		EventType events.Type  `json:"event_type"`
		What      string       `json:"what"`
		Text      string       `json:"text"`
		Event     events.Event `json:"event"`
	}
	// NoteLine is something the fold noticed (a missing commit, say).
	NoteLine struct {
		Type  string    `json:"type"` // "note"
		Run   string    `json:"run,omitempty"`
		Batch string    `json:"batch,omitempty"`
		Seq   uint64    `json:"seq"`
		Time  time.Time `json:"time"`
		Text  string    `json:"text"`
	}
)

// WriteJSON writes the history as JSON lines: per run a run line, then per
// batch a batch line and its event and note lines, then the run's own.
func (h *History) WriteJSON(w io.Writer) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false)
	var err error
	h.Lines(func(v any) {
		if err == nil {
			err = enc.Encode(v)
		}
	})
	if err != nil {
		return err
	}
	return bw.Flush()
}

// Lines gives the history's lines to put, in WriteJSON's order: a
// RunLine, BatchLine, EventLine or NoteLine each.
func (h *History) Lines(put func(line any)) {
	items := func(run, batch string, its []item) {
		for _, it := range its {
			if it.ev == nil {
				put(NoteLine{Type: "note", Run: run, Batch: batch, Seq: it.seq, Time: it.note.time.UTC(), Text: it.note.text})
				continue
			}
			rs := rows(it.ev)
			texts := make([]string, len(rs))
			for i, r := range rs {
				texts[i] = r.text
				if i > 0 {
					texts[i] = cell(r.call) + " " + r.what + " " + r.text
				}
			}
			put(EventLine{Type: "event", Run: run, Batch: batch, Call: rs[0].call, Seq: it.seq, At: eventTime(it.ev).UTC(),
				EventType: it.ev.EventType(), What: rs[0].what, Text: strings.Join(texts, "; "), Event: it.ev})
		}
	}
	for _, rh := range h.order {
		l := RunLine{Type: "run", Run: rh.id, Thread: rh.thread, Status: rh.status(), Commits: rh.commits,
			FirstSeq: rh.first, LastSeq: rh.last, Batches: len(rh.batches), Folded: rh.run != nil, FoldStop: rh.foldStop}
		if rh.end != nil {
			l.Status, l.EndCause, l.EndReason = "ended", string(rh.end.Cause), rh.end.Reason
		}
		put(l)
		for _, b := range rh.batches {
			bl := BatchLine{Type: "batch", Run: rh.id, Batch: b.id, Step: b.step, SubmittedSeq: b.subSeq, FinalizedSeq: b.finalSeq, Calls: b.calls}
			if b.submitted != nil {
				bl.SnapshotID, bl.Narrowing = b.submitted.SnapshotID, b.submitted.Narrowing
			}
			if bl.Calls == nil {
				bl.Calls = []CallState{}
			}
			put(bl)
			items(rh.id, b.id, b.items)
		}
		items(rh.id, "", rh.items)
	}
	items("", "", h.strays)
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
