package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/protocol"
)

// Status is a deployment at a glance, as the streams and buckets say it
// now (toolbatch status). Its JSON is the output of status --json.
type Status struct {
	Engines []EngineStatus `json:"engines"` // live engines and engines that still own runs, by id
	Workers []WorkerStatus `json:"workers"` // by id
	// BrainTools are the brain tools whose services advertise a
	// capability in the registry bucket, by tool id.
	BrainTools map[string]events.Capability `json:"brain_tools"`
	Inbox      InboxStatus                  `json:"inbox"`
	// Tickets are the open tickets (each a parked run), by run id.
	Tickets []protocol.AwaitingOut `json:"tickets"`
	// TicketsByReason counts them by wait reason.
	TicketsByReason map[events.WaitKind]int `json:"tickets_by_reason"`
	Runs            RunsStatus              `json:"runs"`
	Log             LogStatus               `json:"log"`
	// Queues is what the inbox and dispatch streams store, in that order:
	// the engines trim what was acknowledged every few seconds, and
	// nothing behind a message still in progress (docs/operations.md).
	Queues []QueueStatus `json:"queues"`
}

// QueueStatus is what a queue stream stores.
type QueueStatus struct {
	Stream   string `json:"stream"`
	Messages uint64 `json:"messages"`
	Bytes    uint64 `json:"bytes"`
}

// EngineStatus is one engine: alive while its presence key lives.
type EngineStatus struct {
	ID    string   `json:"id"`
	Alive bool     `json:"alive"`
	Runs  []string `json:"runs"` // the runs whose owner key names it, sorted
}

// WorkerStatus is one sandbox worker and what it advertises.
type WorkerStatus struct {
	ID    string                 `json:"id"`
	Pools []string               `json:"pools"`
	Tools []WorkerToolAdvertised `json:"tools"`
}

// WorkerToolAdvertised is a tool a worker serves in a pool.
type WorkerToolAdvertised struct {
	Pool       string            `json:"pool"`
	Tool       string            `json:"tool"`
	Capability events.Capability `json:"capability"`
}

// InboxStatus is the engines' backlog: inbox messages not yet taken
// (pending) or taken and not yet acknowledged.
type InboxStatus struct {
	Pending        uint64 `json:"pending"`
	Unacknowledged int    `json:"unacknowledged"`
}

// RunsStatus counts runs: every run with a commit in the log, those parked
// on a ticket, and those whose ended message the out stream still holds
// (it keeps out messages for its max age).
type RunsStatus struct {
	Total  uint64 `json:"total"`
	Parked int    `json:"parked"`
	Ended  int    `json:"ended"`
}

// LogStatus is the events stream's size.
type LogStatus struct {
	Stream  string `json:"stream"`
	Commits uint64 `json:"commits"`
	Bytes   uint64 `json:"bytes"`
}

// Status reads the deployment's status. It reads the owners, workers,
// registry and tickets buckets and the streams' state: a user needs the
// admin role (docs/security.md).
func (c *Client) Status(ctx context.Context) (*Status, error) {
	n := c.names
	var err error
	st := &Status{BrainTools: map[string]events.Capability{}, TicketsByReason: map[events.WaitKind]int{}}

	engines := map[string]*EngineStatus{}
	engine := func(id string) *EngineStatus {
		if engines[id] == nil {
			engines[id] = &EngineStatus{ID: id, Runs: []string{}}
		}
		return engines[id]
	}
	if err := c.eachEntry(ctx, n.OwnersBucket(), func(key string, value []byte) error {
		switch {
		case strings.HasPrefix(key, protocol.PresenceKeyPrefix):
			engine(strings.TrimPrefix(key, protocol.PresenceKeyPrefix)).Alive = true
		case strings.HasPrefix(key, protocol.OwnerKey("")):
			e := engine(string(value))
			e.Runs = append(e.Runs, strings.TrimPrefix(key, protocol.OwnerKey("")))
		}
		return nil
	}); err != nil {
		return nil, err
	}
	for _, e := range engines {
		slices.Sort(e.Runs)
		st.Engines = append(st.Engines, *e)
	}
	sort.Slice(st.Engines, func(i, j int) bool { return st.Engines[i].ID < st.Engines[j].ID })

	workers := map[string]*WorkerStatus{}
	if err := c.eachEntry(ctx, n.WorkersBucket(), func(key string, value []byte) error {
		pool, tool, id, ok := protocol.ParseWorkerKey(key)
		if !ok {
			return nil // not an advertisement
		}
		w := workers[id]
		if w == nil {
			w = &WorkerStatus{ID: id}
			workers[id] = w
		}
		if !slices.Contains(w.Pools, pool) {
			w.Pools = append(w.Pools, pool)
		}
		w.Tools = append(w.Tools, WorkerToolAdvertised{Pool: pool, Tool: tool, Capability: events.Capability(value)})
		return nil
	}); err != nil {
		return nil, err
	}
	for _, w := range workers {
		slices.Sort(w.Pools)
		st.Workers = append(st.Workers, *w)
	}
	sort.Slice(st.Workers, func(i, j int) bool { return st.Workers[i].ID < st.Workers[j].ID })

	if err := c.eachEntry(ctx, n.RegistryBucket(), func(key string, value []byte) error {
		if tool, ok := strings.CutPrefix(key, protocol.RegistryKeyPrefix); ok {
			st.BrainTools[tool] = events.Capability(value)
		}
		return nil
	}); err != nil {
		return nil, err
	}

	if st.Tickets, err = c.Tickets(ctx); err != nil {
		return nil, err
	}
	for _, t := range st.Tickets {
		st.TicketsByReason[t.Reason]++
	}
	st.Runs.Parked = len(st.Tickets)

	intake, err := c.js.Consumer(ctx, n.InboxStream(), protocol.ConsumerEngine)
	if err != nil {
		return nil, fmt.Errorf("the engines' intake consumer %s: %w", protocol.ConsumerEngine, err)
	}
	info, err := intake.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("the engines' intake consumer %s: %w", protocol.ConsumerEngine, err)
	}
	st.Inbox = InboxStatus{Pending: info.NumPending, Unacknowledged: info.NumAckPending}

	evs, err := c.js.Stream(ctx, n.EventsStream())
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", n.EventsStream(), err)
	}
	si, err := evs.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", n.EventsStream(), err)
	}
	st.Log = LogStatus{Stream: n.EventsStream(), Commits: si.State.Msgs, Bytes: si.State.Bytes}
	for _, name := range []string{n.InboxStream(), n.DispatchStream()} {
		s, err := c.js.Stream(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("stream %s: %w", name, err)
		}
		st.Queues = append(st.Queues, QueueStatus{Stream: name, Messages: s.CachedInfo().State.Msgs, Bytes: s.CachedInfo().State.Bytes})
	}
	st.Runs.Total = si.State.NumSubjects

	out, err := c.js.Stream(ctx, n.OutStream())
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", n.OutStream(), err)
	}
	oi, err := out.Info(ctx, jetstream.WithSubjectFilter(n.Out("*", protocol.OutEnded)))
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", n.OutStream(), err)
	}
	st.Runs.Ended = len(oi.State.Subjects)
	return st, nil
}

// Tickets returns every run's open ticket (a run has one at most), by run
// id, from the tickets bucket: what the runs' awaiting messages say, without
// reading each run's out messages. The client, approver, auditor and admin
// roles may read it.
func (c *Client) Tickets(ctx context.Context) ([]protocol.AwaitingOut, error) {
	tickets := []protocol.AwaitingOut{}
	if err := c.eachEntry(ctx, c.names.TicketsBucket(), func(key string, value []byte) error {
		var t protocol.AwaitingOut
		if err := json.Unmarshal(value, &t); err != nil {
			return fmt.Errorf("ticket %s: %w", key, err)
		}
		tickets = append(tickets, t)
		return nil
	}); err != nil {
		return nil, err
	}
	sort.Slice(tickets, func(i, j int) bool { return tickets[i].RunID < tickets[j].RunID })
	return tickets, nil
}

// eachEntry calls fn with every live key of a bucket and its value.
func (c *Client) eachEntry(ctx context.Context, bucket string, fn func(key string, value []byte) error) error {
	kv, err := c.js.KeyValue(ctx, bucket)
	if err != nil {
		return fmt.Errorf("bucket %s: %w", bucket, err)
	}
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return fmt.Errorf("bucket %s: %w", bucket, err)
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("bucket %s: %w", bucket, ctx.Err())
		case entry, ok := <-w.Updates():
			if !ok {
				return fmt.Errorf("bucket %s: %w", bucket, errors.New("watch ended"))
			}
			if entry == nil {
				return nil // every current value seen
			}
			if err := fn(entry.Key(), entry.Value()); err != nil {
				return err
			}
		}
	}
}
