package console

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/protocol"
)

// ticketSet is every run's open ticket, as the tickets bucket holds them
// (the projector writes a ticket there before it publishes the awaiting
// message, and deletes it in the commit that resolves it).
type ticketSet struct {
	mu     sync.RWMutex
	byRun  map[string]protocol.AwaitingOut
	caught bool
	bad    map[string]string // key -> why its value does not decode
}

func newTicketSet() *ticketSet {
	return &ticketSet{byRun: map[string]protocol.AwaitingOut{}, bad: map[string]string{}}
}

// follow keeps the set current until ctx ends; changed is called with the
// run of every change.
func (ts *ticketSet) follow(ctx context.Context, js jetstream.JetStream, names protocol.Names, changed func(runID string)) error {
	kv, err := js.KeyValue(ctx, names.TicketsBucket())
	if err != nil {
		return fmt.Errorf("tickets bucket: %w", err)
	}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("tickets bucket: %w", err)
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("tickets bucket: the watch ended")
			}
			if e == nil {
				ts.mu.Lock()
				ts.caught = true
				ts.mu.Unlock()
				changed("")
				continue
			}
			runID, _ := strings.CutPrefix(e.Key(), "run.")
			ts.mu.Lock()
			delete(ts.bad, e.Key())
			if e.Operation() != jetstream.KeyValuePut {
				delete(ts.byRun, runID)
			} else {
				var t protocol.AwaitingOut
				if err := json.Unmarshal(e.Value(), &t); err != nil {
					ts.bad[e.Key()] = err.Error()
					delete(ts.byRun, runID)
				} else {
					ts.byRun[runID] = t
				}
			}
			ts.mu.Unlock()
			changed(runID)
		}
	}
}

// list returns the open tickets whose reason is one of reasons (all when
// none), oldest deadline first, then by run.
func (ts *ticketSet) list(reasons ...string) []protocol.AwaitingOut {
	ts.mu.RLock()
	out := make([]protocol.AwaitingOut, 0, len(ts.byRun))
	for _, t := range ts.byRun {
		if len(reasons) == 0 || slices.Contains(reasons, string(t.Reason)) {
			out = append(out, t)
		}
	}
	ts.mu.RUnlock()
	slices.SortFunc(out, func(a, b protocol.AwaitingOut) int {
		da, db := deadlineOf(a), deadlineOf(b)
		switch {
		case !da.Equal(db) && da.IsZero():
			return 1
		case !da.Equal(db) && db.IsZero():
			return -1
		case !da.Equal(db):
			return da.Compare(db)
		}
		return strings.Compare(a.RunID, b.RunID)
	})
	return out
}

// deadlineOf is a ticket's deadline (zero when it has none).
func deadlineOf(t protocol.AwaitingOut) time.Time {
	d, _ := time.Parse(time.RFC3339Nano, t.Deadline)
	return d
}

// get returns a run's open ticket when its correlation id is corr.
func (ts *ticketSet) get(runID, corr string) (protocol.AwaitingOut, bool) {
	ts.mu.RLock()
	defer ts.mu.RUnlock()
	t, ok := ts.byRun[runID]
	return t, ok && t.CorrelationID == corr
}

// byRunID returns a run's open ticket.
func (ts *ticketSet) byRunID(runID string) (protocol.AwaitingOut, bool) {
	ts.mu.RLock()
	defer ts.mu.RUnlock()
	t, ok := ts.byRun[runID]
	return t, ok
}

func (ts *ticketSet) ready() bool {
	ts.mu.RLock()
	defer ts.mu.RUnlock()
	return ts.caught
}

// problems lists the keys whose values do not decode.
func (ts *ticketSet) problems() []string {
	ts.mu.RLock()
	defer ts.mu.RUnlock()
	var out []string
	for k, why := range ts.bad {
		out = append(out, k+": "+why)
	}
	slices.Sort(out)
	return out
}
