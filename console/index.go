package console

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/aggregate"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/protocol"
)

// RunSummary is one run as the runs page lists it.
type RunSummary struct {
	ID, Thread string
	// Status is the aggregate's: running, awaiting (parked on a ticket)
	// or ended.
	Status aggregate.Status
	Wait   events.WaitKind // what an awaiting run waits on
	// Idle: a running run with no open batch (it waits for the client's
	// next one).
	Idle   bool
	Cause  events.EndCause // why an ended run ended
	Reason string          // its end's reason
	// Batches counts accepted batches; Step is the last one's step.
	Batches int
	Step    int64
	// First and Last are the store times of its first and last commits;
	// LastSeq is the last one's events stream sequence.
	First, Last time.Time
	LastSeq     uint64
	// Broken says why the run could not be folded (an undecodable commit,
	// a transition the aggregate refuses): replay audit explains it.
	Broken string
}

// State filters of the runs page.
const (
	StateAll     = "all"
	StateRunning = "running"
	StateParked  = "parked"
	StateEnded   = "ended"
)

// matches reports whether the run is in the state filter.
func (s *RunSummary) matches(state string) bool {
	switch state {
	case StateRunning:
		return s.Status == aggregate.StatusRunning
	case StateParked:
		return s.Status == aggregate.StatusAwaiting
	case StateEnded:
		return s.Status == aggregate.StatusEnded
	}
	return true
}

// index folds the events stream, run by run, with the engine's aggregate,
// and keeps each run's summary. An ended run keeps only its summary.
type index struct {
	mu     sync.RWMutex
	runs   map[string]*indexed
	order  []*indexed // by first commit
	caught bool       // read up to the stream's end once
	seq    uint64     // last sequence folded
	onRun  func(runID string)
}

type indexed struct {
	sum RunSummary
	run *aggregate.Run // nil once ended or broken
}

func newIndex(onRun func(string)) *index {
	return &index{runs: map[string]*indexed{}, onRun: onRun}
}

// follow folds the events stream from its first message, and then every
// commit as it is stored, until ctx ends.
func (ix *index) follow(ctx context.Context, js jetstream.JetStream, names protocol.Names) error {
	stream := names.EventsStream()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("events stream: %w", err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return fmt.Errorf("events stream: %w", err)
	}
	if info.State.Msgs == 0 {
		ix.setCaught()
	}
	return follow(ctx, js, stream, nil, func(m jetstream.Msg) bool {
		meta, err := m.Metadata()
		if err != nil {
			return false
		}
		if meta.NumPending == 0 {
			defer ix.setCaught() // once this message is folded
		}
		runID, ok := names.RunOf(protocol.EventsFamily, m.Subject())
		if !ok || runID == "" {
			return false
		}
		evs, derr := events.DecodeCommit(m.Data(), m.Headers().Values(protocol.HeaderEvent))
		ix.add(runID, meta.Sequence.Stream, meta.Timestamp, evs, derr)
		if ix.onRun != nil {
			ix.onRun(runID)
		}
		return false
	})
}

// ready reports whether the index has read the stream up to where it was
// when it started.
func (ix *index) ready() bool {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return ix.caught
}

func (ix *index) setCaught() {
	ix.mu.Lock()
	ix.caught = true
	ix.mu.Unlock()
}

// add folds one commit.
func (ix *index) add(runID string, seq uint64, at time.Time, evs []events.Event, decodeErr error) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.seq = seq
	x := ix.runs[runID]
	if x == nil {
		x = &indexed{sum: RunSummary{ID: runID, First: at, Status: aggregate.StatusRunning}, run: aggregate.New(runID)}
		ix.runs[runID] = x
		ix.order = append(ix.order, x)
	}
	x.sum.Last, x.sum.LastSeq = at, seq
	if x.run == nil {
		return
	}
	if decodeErr != nil {
		x.sum.Broken, x.run = fmt.Sprintf("commit %d does not decode: %v", seq, decodeErr), nil
		return
	}
	for _, e := range evs {
		if err := x.run.Apply(e); err != nil {
			x.sum.Broken, x.run = fmt.Sprintf("commit %d: not a legal transition: %v", seq, err), nil
			return
		}
		if _, ok := e.(*events.BatchSubmitted); ok {
			x.sum.Batches++
		}
	}
	r := x.run
	x.sum.Thread, x.sum.Status, x.sum.Step = r.ThreadID, r.Status(), r.LastStep
	x.sum.Wait, x.sum.Idle = "", r.Status() == aggregate.StatusRunning && r.OpenBatch() == nil
	if t := r.Ticket(); t != nil {
		x.sum.Wait = t.Reason
	}
	if r.End != nil {
		x.sum.Cause, x.sum.Reason = r.End.Cause, r.End.Reason
		x.run = nil // an ended run changes no more: its summary is enough
	}
}

// Page is one page of the runs list.
type Page struct {
	Runs        []RunSummary
	Total       int // runs that match
	Page, Pages int // 1-based
	CaughtUp    bool
}

// PageSize is how many runs a page lists.
const PageSize = 50

// query returns the runs in state whose id or thread id contains q (case
// sensitive: ids are), most recently active first, page by page.
func (ix *index) query(state, q string, page int) Page {
	ix.mu.RLock()
	match := make([]*indexed, 0, len(ix.order))
	for _, x := range ix.order {
		if x.sum.matches(state) && (q == "" || strings.Contains(x.sum.ID, q) || strings.Contains(x.sum.Thread, q)) {
			match = append(match, x)
		}
	}
	caught := ix.caught
	ix.mu.RUnlock()
	// Most recent first: the last commit's sequence orders them (store
	// times may repeat).
	slices.SortFunc(match, func(a, b *indexed) int { return compareDesc(a.sum.LastSeq, b.sum.LastSeq) })
	p := Page{Total: len(match), Pages: max(1, (len(match)+PageSize-1)/PageSize), CaughtUp: caught}
	p.Page = min(max(page, 1), p.Pages)
	lo := (p.Page - 1) * PageSize
	for _, x := range match[lo:min(lo+PageSize, len(match))] {
		p.Runs = append(p.Runs, x.sum)
	}
	return p
}

func compareDesc(a, b uint64) int {
	switch {
	case a > b:
		return -1
	case a < b:
		return 1
	}
	return 0
}

// summary returns one run's summary.
func (ix *index) summary(runID string) (RunSummary, bool) {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	x := ix.runs[runID]
	if x == nil {
		return RunSummary{}, false
	}
	return x.sum, true
}

// gate returns the gate decision that made a run's open ticket, when the
// index has folded it (nil otherwise).
func (ix *index) gate(runID, correlationID string) *events.CallGated {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	x := ix.runs[runID]
	if x == nil || x.run == nil {
		return nil
	}
	c := x.run.TicketCall(correlationID)
	if c == nil || c.Gate == nil {
		return nil
	}
	g := *c.Gate
	return &g
}

// counts returns how many runs are in each state filter.
func (ix *index) counts() map[string]int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	n := map[string]int{StateAll: len(ix.order)}
	for _, x := range ix.order {
		for _, s := range []string{StateRunning, StateParked, StateEnded} {
			if x.sum.matches(s) {
				n[s]++
			}
		}
	}
	return n
}
