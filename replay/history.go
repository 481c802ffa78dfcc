package replay

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/toolbatch/toolbatch/aggregate"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/protocol"
)

// History folds an events stream, run by run, with the engine's aggregate,
// and keeps every event of every batch for printing (WriteText, WriteJSON). The aggregate keeps a
// run's latest batch only, so each batch's final call states are copied
// when it is finalized (or at the end of the stream for an open batch).
type History struct {
	prefix string
	// startsLate is set when the selection may begin after a run's first
	// commit: such a run is shown but not folded.
	startsLate bool
	runs       map[string]*runHistory
	order      []*runHistory
	strays     []item // messages that are no run's events
}

// runHistory is one run as read.
type runHistory struct {
	id      string
	run     *aggregate.Run // nil when the run is not folded (see foldStop)
	thread  string
	commits int
	first   uint64
	last    uint64
	// foldStop says why the run is not (or no longer) folded.
	foldStop  string
	batches   []*batchHistory
	byID      map[string]*batchHistory
	lastBatch *batchHistory // the batch of the event placed last: byID[lastBatch.id]
	items     []item        // rejections, the run's end, notes outside any batch
	end       *events.RunEnded
}

// batchHistory is one batch of a run.
type batchHistory struct {
	id        string
	step      int64
	submitted *events.BatchSubmitted // nil when the submission is outside the selection
	subSeq    uint64
	finalSeq  uint64
	calls     []CallState
	items     []item
}

// CallState is a call's state when its batch was finalized (or when the
// stream ended), from the fold.
type CallState struct {
	CallID      string `json:"call"`
	ToolID      string `json:"tool"`
	Target      string `json:"target"`
	Kind        string `json:"kind"`
	Mode        string `json:"mode"`
	MaxAttempts int    `json:"max_attempts"`
	Phase       string `json:"phase"`             // "" when the run was not folded
	Attempt     int    `json:"attempt"`           // the latest attempt
	Entries     int    `json:"entries"`           // executor entries (-1: not folded)
	Worker      string `json:"worker,omitempty"`  // the latest claim's worker
	Reason      string `json:"reason,omitempty"`  // indeterminate
	Outcome     string `json:"outcome,omitempty"` // events.DescribeOutput of a completed call
	// output is what Outcome describes: Finish writes the description,
	// for printing.
	output *events.Output
}

// item is one event (or a note) of a batch or a run, with the commit it
// came in. There is one per event read: it holds an event's time in the
// event, and the rest of a note apart, to stay small.
type item struct {
	seq  uint64
	ev   events.Event // nil for a note
	note *note
}

// note is what replay says about a commit, at the commit's stream time.
type note struct {
	time time.Time
	text string
}

// noteItem is a note about the commit seq stored at t.
func noteItem(seq uint64, t time.Time, text string) item {
	return item{seq: seq, note: &note{time: t, text: text}}
}

// NewHistory returns an empty history of the runs of a subject prefix;
// startsLate (Selection.StartsLate) says that the read may begin after a
// run's first commit, so that such a run is shown but not folded.
func NewHistory(prefix string, startsLate bool) *History {
	return &History{prefix: prefix, startsLate: startsLate, runs: map[string]*runHistory{}}
}

// Add folds one commit, a message of the events stream, in stream order.
func (h *History) Add(m *Message) {
	r := m.Record
	runID, ok := protocol.Names{Prefix: h.prefix}.RunOf(protocol.EventsFamily, r.Subject)
	if !ok || runID == "" {
		h.strays = append(h.strays, noteItem(r.Seq, r.Time, fmt.Sprintf("subject %q is not a run's events subject", r.Subject)))
		return
	}
	rh := h.runs[runID]
	if rh == nil {
		rh = &runHistory{id: runID, run: aggregate.New(runID), byID: map[string]*batchHistory{}, first: r.Seq}
		h.runs[runID] = rh
		h.order = append(h.order, rh)
	}
	var notes []string
	prevText := ""
	if vs := m.Header(headerPrev); len(vs) > 0 {
		prevText = vs[0]
	}
	prev, perr := strconv.ParseUint(prevText, 10, 64)
	switch {
	case perr != nil:
		notes = append(notes, fmt.Sprintf("the commit has no valid %s header (%q)", headerPrev, prevText))
	case rh.commits == 0 && prev != 0 && h.startsLate:
		rh.stopFold(fmt.Sprintf("the selection starts after the run's first commit (this one follows seq %d): not folded", prev))
		notes = append(notes, rh.foldStop)
	case prev != rh.last:
		if prev > rh.last {
			notes = append(notes, fmt.Sprintf("a commit is missing: this one follows seq %d, the run's last commit read is %d", prev, rh.last))
		} else {
			notes = append(notes, fmt.Sprintf("commit out of order: it follows seq %d, the run's last commit read is %d", prev, rh.last))
		}
	}
	rh.commits++
	rh.last = r.Seq
	evs, err := m.Commit()
	if err != nil {
		notes = append(notes, "undecodable commit: "+err.Error())
		if rh.run != nil {
			rh.stopFold("folding stopped at seq " + strconv.FormatUint(r.Seq, 10) + ": undecodable commit")
		}
		for _, n := range notes {
			rh.items = append(rh.items, noteItem(r.Seq, r.Time, n))
		}
		return
	}
	// Notes about the commit go where its first event goes.
	target := rh.place(evs[0], r.Seq)
	for _, n := range notes {
		*target = append(*target, noteItem(r.Seq, r.Time, n))
	}
	for _, e := range evs {
		if rh.run != nil {
			if err := rh.run.Apply(e); err != nil {
				rh.stopFold(fmt.Sprintf("folding stopped at seq %d: not a legal transition: %v", r.Seq, err))
				*target = append(*target, noteItem(r.Seq, r.Time, rh.foldStop))
			}
		}
		list := rh.place(e, r.Seq)
		*list = append(*list, item{seq: r.Seq, ev: e})
		rh.after(e, r.Seq)
	}
}

// stopFold stops folding the run, for a reason shown with it.
func (rh *runHistory) stopFold(reason string) {
	if rh.run == nil {
		return
	}
	rh.run = nil
	rh.foldStop = reason
}

// place returns the list an event belongs to: its batch's, or the run's.
// A BatchSubmitted opens its batch here.
func (rh *runHistory) place(e events.Event, seq uint64) *[]item {
	switch ev := e.(type) {
	case *events.BatchSubmitted:
		if b := rh.byID[ev.BatchID]; b != nil && b.submitted == ev {
			return &b.items
		}
		// A call's history is four events (gate, executing, claim,
		// completed) in the common case; then the barrier.
		b := &batchHistory{id: ev.BatchID, step: ev.Step, submitted: ev, subSeq: seq,
			items: make([]item, 0, 2+4*len(ev.Calls))}
		rh.batches = append(rh.batches, b)
		rh.byID[ev.BatchID] = b
		rh.lastBatch = b
		if rh.thread == "" {
			rh.thread = ev.ThreadID
		}
		return &b.items
	case *events.BatchRejected, *events.RunEnded:
		return &rh.items
	}
	id := batchOf(e)
	if id == "" {
		return &rh.items
	}
	if b := rh.lastBatch; b != nil && b.id == id {
		return &b.items
	}
	b := rh.byID[id]
	if b == nil {
		// Its submission is outside the selection (or missing).
		b = &batchHistory{id: id}
		if _, step, ok := strings.Cut(id, "/"); ok {
			b.step, _ = strconv.ParseInt(step, 10, 64)
		}
		rh.batches = append(rh.batches, b)
		rh.byID[id] = b
	}
	rh.lastBatch = b
	return &b.items
}

// after records what an event closes: a finalized batch's call states, the
// run's end.
func (rh *runHistory) after(e events.Event, seq uint64) {
	switch ev := e.(type) {
	case *events.BatchFinalized:
		b := rh.byID[ev.BatchID]
		b.finalSeq = seq
		if rh.run != nil && rh.run.Batch != nil && rh.run.Batch.ID == ev.BatchID {
			b.calls = callStates(rh.run.Batch)
		}
	case *events.RunEnded:
		rh.end = ev
	}
}

// Finish ends the fold once the read is done: it copies the states of
// batches still open at the end of the stream, and describes the calls of
// batches that were not folded from their submission.
func (h *History) Finish() {
	for _, rh := range h.order {
		if rh.run != nil && rh.run.Batch != nil {
			if b := rh.byID[rh.run.Batch.ID]; b != nil && b.calls == nil {
				b.calls = callStates(rh.run.Batch)
			}
		}
		for _, b := range rh.batches {
			for i, c := range b.calls {
				if c.output != nil {
					b.calls[i].Outcome = events.DescribeOutput(*c.output)
				}
			}
			if b.calls != nil || b.submitted == nil {
				continue
			}
			for _, c := range b.submitted.Calls {
				b.calls = append(b.calls, CallState{CallID: c.CallID, ToolID: c.ToolID, Target: string(c.Tool.Target),
					Kind: string(c.Tool.Kind), Mode: string(c.Tool.Policy.Mode), MaxAttempts: c.Tool.Policy.MaxAttempts, Entries: -1})
			}
		}
	}
}

// callStates copies the folded calls of a batch.
func callStates(b *aggregate.Batch) []CallState {
	out := make([]CallState, len(b.Calls))
	for i, c := range b.Calls {
		s := CallState{CallID: c.CallID, ToolID: c.ToolID, Target: string(c.Tool.Target), Kind: string(c.Tool.Kind),
			Mode: string(c.Tool.Policy.Mode), MaxAttempts: c.Tool.Policy.MaxAttempts, Phase: string(c.Phase),
			Attempt: c.Attempt, Entries: c.Entries, Reason: c.Reason}
		if c.Claim != nil {
			s.Worker = c.Claim.WorkerID
		}
		s.output = c.Output
		out[i] = s
	}
	return out
}

// status is the run's state for its header line.
func (rh *runHistory) status() string {
	switch {
	case rh.end != nil:
		s := "ended (" + string(rh.end.Cause)
		if rh.end.Reason != "" {
			s += ": " + rh.end.Reason
		}
		return s + ")"
	case rh.run == nil:
		return "unknown (not folded)"
	default:
		return string(rh.run.Status())
	}
}

// batchOf returns the batch id a call-level event names.
func batchOf(e events.Event) string {
	switch ev := e.(type) {
	case *events.CallGated:
		return ev.BatchID
	case *events.CallExecuting:
		return ev.BatchID
	case *events.CallClaimed:
		return ev.BatchID
	case *events.CallCompleted:
		return ev.BatchID
	case *events.CallIndeterminate:
		return ev.BatchID
	case *events.CallAwaiting:
		return ev.BatchID
	case *events.TicketResolved:
		return ev.BatchID
	case *events.ResultRefused:
		return ev.BatchID
	case *events.BatchFinalized:
		return ev.BatchID
	case *events.BatchSubmitted:
		return ev.BatchID
	}
	return ""
}
