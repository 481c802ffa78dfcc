package engine

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/protocol"
)

// openBuckets opens the buckets the engine uses while it serves, once: a
// handle costs a STREAM.INFO round trip, which no decision should pay.
func (e *Engine) openBuckets(ctx context.Context) error {
	var err error
	open := func(name string) jetstream.KeyValue {
		if err != nil {
			return nil
		}
		var kv jetstream.KeyValue
		if kv, err = e.js.KeyValue(ctx, name); err != nil {
			err = fmt.Errorf("open bucket %s: %w", name, err)
		}
		return kv
	}
	e.ownersKV = open(e.names.OwnersBucket())
	e.catalogKV = open(e.names.CatalogBucket())
	e.state.kv = open(e.names.StateBucket())
	e.ticketsKV = open(e.names.TicketsBucket())
	e.state.js, e.state.names = e.js, e.names
	e.live = &liveCapabilities{workers: open(e.names.WorkersBucket()), registry: open(e.names.RegistryBucket()), noticed: e.checkAdvert}
	if e.cfg.Signer != nil {
		e.trust = &trust{e: e, kv: open(e.names.KeysBucket())}
		e.events.trust = e.trust
	}
	if err != nil {
		return err
	}
	e.events.stream, err = e.js.Stream(ctx, e.names.EventsStream())
	if err != nil {
		return fmt.Errorf("open stream %s: %w", e.names.EventsStream(), err)
	}
	if e.ownersStream, err = e.js.Stream(ctx, e.names.KVStream(protocol.BucketOwners)); err != nil {
		return fmt.Errorf("open the owners bucket's stream: %w", err)
	}
	if e.state.stream, err = e.js.Stream(ctx, e.names.KVStream(protocol.BucketState)); err != nil {
		return fmt.Errorf("open the state bucket's stream: %w", err)
	}
	if e.outStream, err = e.js.Stream(ctx, e.names.OutStream()); err != nil {
		return fmt.Errorf("open stream %s: %w", e.names.OutStream(), err)
	}
	if e.inbox, err = e.js.Stream(ctx, e.names.InboxStream()); err != nil {
		return fmt.Errorf("open stream %s: %w", e.names.InboxStream(), err)
	}
	return nil
}

// liveCapabilities mirrors what executors advertise, so that gating a call
// reads memory instead of the server: the workers bucket (key
// sandbox.<pool>.<tool_id>.<worker_id>, forgotten WorkerTTL after its
// last write) and the registry bucket (key brain.<tool_id>). Two watches
// keep the mirror current. A watch is told of puts and deletes but not of
// keys the bucket's age limit removes, so an advertisement counts only
// while it is younger than WorkerTTL, as in the bucket. What the mirror
// does not have (a worker that advertised a moment ago and whose put is
// still on its way to the watch) is read from the bucket itself.
type liveCapabilities struct {
	workers, registry jetstream.KeyValue

	// noticed, when set, is told of each advertisement new to the mirror
	// or changed.
	noticed func(pool, toolID, worker string, c events.Capability)

	mu       sync.Mutex
	adverts  map[string]map[string]advert // "<pool>.<tool_id>" -> worker id -> advertisement
	brain    map[string]events.Capability // tool id -> capability
	watchers []jetstream.KeyWatcher
}

type advert struct {
	capability events.Capability
	written    time.Time // the server's time of the put
}

// live reports whether the advertisement still counts: the bucket forgets
// a key WorkerTTL after its last write.
func (a advert) live() bool { return time.Since(a.written) < WorkerTTL }

// start watches both buckets and returns once the mirror holds their
// current contents.
func (l *liveCapabilities) start(ctx context.Context) error {
	l.adverts, l.brain = map[string]map[string]advert{}, map[string]events.Capability{}
	for _, w := range []struct {
		kv     jetstream.KeyValue
		filter string
	}{{l.workers, protocol.WorkerKeyPrefix + ">"}, {l.registry, protocol.RegistryKeyPrefix + ">"}} {
		kw, err := mirror(ctx, w.kv, w.filter, l.apply)
		if err != nil {
			l.stop()
			return err
		}
		l.watchers = append(l.watchers, kw)
	}
	return nil
}

// mirror watches the keys of kv that match filter and hands every entry
// to apply (puts and deletes, from the bucket's current contents on,
// until the watch is stopped); it returns once the current contents are
// applied.
func mirror(ctx context.Context, kv jetstream.KeyValue, filter string, apply func(jetstream.KeyValueEntry)) (jetstream.KeyWatcher, error) {
	kw, err := kv.Watch(context.Background(), filter)
	if err != nil {
		return nil, fmt.Errorf("watch %s: %w", kv.Bucket(), err)
	}
	initial := make(chan struct{})
	go func() {
		for entry := range kw.Updates() {
			if entry == nil {
				close(initial)
				continue
			}
			apply(entry)
		}
	}()
	select {
	case <-initial:
		return kw, nil
	case <-ctx.Done():
		_ = kw.Stop()
		return nil, fmt.Errorf("watch %s: %w", kv.Bucket(), ctx.Err())
	}
}

func (l *liveCapabilities) apply(entry jetstream.KeyValueEntry) {
	key := entry.Key()
	put := entry.Operation() == jetstream.KeyValuePut
	l.mu.Lock()
	defer l.mu.Unlock()
	if tool, ok := strings.CutPrefix(key, protocol.RegistryKeyPrefix); ok {
		if put {
			l.brain[tool] = events.Capability(entry.Value())
		} else {
			delete(l.brain, tool)
		}
		return
	}
	pool, toolID, worker, ok := protocol.ParseWorkerKey(key)
	if !ok {
		return
	}
	tool := pool + "." + toolID
	if !put {
		delete(l.adverts[tool], worker)
		return
	}
	if l.adverts[tool] == nil {
		l.adverts[tool] = map[string]advert{}
	}
	c := events.Capability(entry.Value())
	if old, had := l.adverts[tool][worker]; (!had || old.capability != c) && l.noticed != nil {
		l.noticed(pool, toolID, worker, c) // new or changed, not a renewal
	}
	l.adverts[tool][worker] = advert{capability: c, written: entry.Created()}
}

// checkAdvert warns when a worker advertises a catalog tool with a
// capability that does not support the tool's recovery mode: every call
// of it would complete with an error until the worker says otherwise.
func (e *Engine) checkAdvert(pool, toolID, worker string, c events.Capability) {
	t, ok := e.cfg.Catalog.Tool(toolID)
	if !ok || t.Target != events.TargetSandbox || t.Pool != pool || t.Policy.Mode.SupportedBy(c) {
		return
	}
	e.log.Warn().Str("worker", worker).Str("pool", pool).Str("tool", toolID).Str("capability", string(c)).Str("mode", string(t.Policy.Mode)).
		Msg("a worker advertises a capability that does not support the catalog's recovery mode of the tool: its calls complete with an error; set the worker's capability (docs/workers.md) or the catalog's recovery.mode")
}

func (l *liveCapabilities) stop() {
	for _, kw := range l.watchers {
		_ = kw.Stop()
	}
	l.watchers = nil
}

// sandbox is what the live workers advertise for a tool: their
// capability when they agree; when they disagree the most conservative,
// non_recoverable (a mode is supported by one capability only, so no
// other is safe for every worker that may run the call); "" when no live
// worker serves it (the aggregate says so to the model).
func (l *liveCapabilities) sandbox(ctx context.Context, pool, toolID string) events.Capability {
	l.mu.Lock()
	var live []events.Capability
	for _, a := range l.adverts[pool+"."+toolID] {
		if a.live() {
			live = append(live, a.capability)
		}
	}
	l.mu.Unlock()
	if len(live) > 0 {
		return agreed(live)
	}
	return l.sandboxFromBucket(ctx, pool, toolID)
}

// poolWorkers counts the live workers advertising tools of each pool of
// the catalog's sandbox tools (0 for a pool nobody serves).
func (e *Engine) poolWorkers() map[string]int {
	out := map[string]int{}
	for pool := range e.cfg.Catalog.PoolTools() {
		out[pool] = 0
	}
	if e.live == nil {
		return out
	}
	for pool, ids := range e.live.workersByPool() {
		if _, ok := out[pool]; ok {
			out[pool] = len(ids)
		}
	}
	return out
}

// workersByPool returns the ids of the workers whose advertisements live,
// by pool.
func (l *liveCapabilities) workersByPool() map[string]map[string]bool {
	seen := map[string]map[string]bool{}
	l.mu.Lock()
	defer l.mu.Unlock()
	for poolTool, workers := range l.adverts {
		pool, _, _ := strings.Cut(poolTool, ".")
		for id, a := range workers {
			if !a.live() {
				continue
			}
			if seen[pool] == nil {
				seen[pool] = map[string]bool{}
			}
			seen[pool][id] = true
		}
	}
	return seen
}

// agreed is the capability every advertisement gives, or non_recoverable.
func agreed(caps []events.Capability) events.Capability {
	for _, c := range caps {
		if c != caps[0] || !knownCapability(c) {
			return events.CapNonRecoverable
		}
	}
	return caps[0]
}

// sandboxFromBucket reads the workers bucket itself.
func (l *liveCapabilities) sandboxFromBucket(ctx context.Context, pool, toolID string) events.Capability {
	lister, err := l.workers.ListKeysFiltered(ctx, protocol.WorkerFilter(pool, toolID))
	if err != nil {
		return events.CapNonRecoverable // unknown: the safest
	}
	defer lister.Stop()
	var live []events.Capability
	for key := range lister.Keys() {
		entry, err := l.workers.Get(ctx, key)
		if err != nil {
			continue
		}
		live = append(live, events.Capability(entry.Value()))
	}
	if len(live) == 0 {
		return ""
	}
	return agreed(live)
}

// brainTool is what a brain tool's host service registered; none means
// non_recoverable.
func (l *liveCapabilities) brainTool(ctx context.Context, toolID string) events.Capability {
	l.mu.Lock()
	c, ok := l.brain[toolID]
	l.mu.Unlock()
	if !ok {
		entry, err := l.registry.Get(ctx, protocol.RegistryKey(toolID))
		if err != nil { // not registered (ErrKeyNotFound), or unreadable
			return events.CapNonRecoverable
		}
		c = events.Capability(entry.Value())
	}
	if knownCapability(c) {
		return c
	}
	return events.CapNonRecoverable
}

func knownCapability(c events.Capability) bool {
	switch c {
	case events.CapNonRecoverable, events.CapReplaySafe, events.CapIdempotent, events.CapDurableRequest:
		return true
	}
	return false
}
