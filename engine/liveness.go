package engine

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/protocol"
)

// Liveness: which engines are alive, decided off the commit path, so that
// a dead engine's runs are taken over in seconds and a live one never loses
// a run to a slow server.
//
// A run's owner key (owner.go) names its engine and has no TTL: it is
// never renewed, and never expires under a live owner, however long a
// commit or a leader election takes. What expires is the engine's
// presence key, engine.<id> in the same bucket, which a goroutine of its
// own renews every second (a compare-and-set on its last revision, with a
// per-message TTL of the ack wait). Each engine watches the others'
// presence keys and probes each of them twice a second with a core
// request on <prefix>.engine.<id>.ping. An engine is declared dead only on
// definite answers:
//
//   - its probes have met "no responders" (no connection subscribes its
//     ping subject: the process is gone) for deadAfter without a break,
//     and its presence key was not renewed meanwhile: the prober deletes
//     the key with a compare-and-set on the revision it saw when the
//     silence began, so a renewal in between, from an engine that was only
//     reconnecting, wins; or
//   - its presence key is gone: deleted at its shutdown, or expired after
//     the ack wait (a process paused or cut off, whose probes time out:
//     a timeout is never taken as death).
//
// Every engine that sees a presence key deleted takes over the runs it
// owned (sweep): it asks for each at once, and the run's key goes to the
// first engine to swap it (acquire). An engine that finds its own presence
// gone, or taken, was declared dead while it could not renew: it fences
// itself (forgets every run, whose keys others may hold by now) and
// registers again.

// Liveness timings.
const (
	presenceEvery = time.Second            // renewal of an engine's presence key
	probeEvery    = 500 * time.Millisecond // probe of every other engine
	// probeTimeout is a probe's wait for an answer: one probe period, so
	// that a probe in flight when its engine dies (it times out, which
	// says nothing) delays the first definite "no responders" by a period
	// at most.
	probeTimeout = probeEvery
	// deadAfter is how long an engine's probes must meet no responders
	// before it is declared dead: longer than a client's reconnection to
	// another server, during which its subscriptions are briefly gone.
	deadAfter = 3 * time.Second
	// heardWithin is how recent the last answer to this engine's probe of
	// itself must be for its connection to count as working: two probes
	// missed, and the wait of a third.
	heardWithin = 2*probeEvery + probeTimeout
)

// liveness tracks this engine's presence and the others'.
type liveness struct {
	e     *Engine
	ttl   time.Duration // of a presence key
	rev   uint64        // this engine's presence revision (its goroutine only)
	epoch atomic.Uint64 // bumped each time this engine is fenced

	mu    sync.Mutex
	peers map[string]*peer // the other engines whose presence is known
	// heard is when this engine's probe of itself was last answered, back
	// is when the last break in those answers ended: what a lease watch
	// needs to tell a silent worker from a connection that carried
	// nothing (connected).
	heard, back time.Time
	selfProbing bool
}

// peer is another engine, as probes see it.
type peer struct {
	rev     uint64    // its presence key's revision, as last watched
	probing bool      // a probe is in flight
	silent  time.Time // first no-responders answer of the current silence (zero: none)
	silRev  uint64    // the presence revision when the silence began
}

func newLiveness(e *Engine) *liveness {
	return &liveness{e: e, ttl: max(e.cfg.AckWait, 2*time.Second), peers: map[string]*peer{}}
}

// subscribe answers the other engines' probes.
func (l *liveness) subscribe() (*nats.Subscription, error) {
	return l.e.nc.Subscribe(l.e.names.Ping(l.e.id), func(m *nats.Msg) { _ = m.Respond(nil) })
}

// register writes this engine's presence (unconditionally: a previous
// process of the same id may have left its key).
func (l *liveness) register(ctx context.Context) error {
	ack, err := l.publish(ctx, nil)
	if err != nil {
		return err
	}
	l.rev = ack.Sequence
	return nil
}

// publish writes this engine's presence key; after, when not nil, is the
// revision it must follow.
func (l *liveness) publish(ctx context.Context, after *uint64) (*jetstream.PubAck, error) {
	m := nats.NewMsg(l.e.names.KVSubject(protocol.BucketOwners, protocol.PresenceKey(l.e.id)))
	m.Data = []byte(l.e.id)
	opts := []jetstream.PublishOpt{jetstream.WithMsgTTL(l.ttl)}
	if after != nil {
		opts = append(opts, jetstream.WithExpectLastSequencePerSubject(*after))
	}
	return l.e.js.PublishMsg(ctx, m, opts...)
}

// run renews the presence, watches and probes the others until ctx ends;
// then it deletes the presence, so that the others take over at once the
// runs still owned here.
func (l *liveness) run(ctx context.Context) {
	watch, err := l.e.ownersKV.WatchFiltered(ctx, []string{protocol.PresenceKey("*")})
	if err != nil {
		l.e.log.Error().Err(err).Msg("cannot watch the engines' presence: a dead engine's runs wait for its messages' ack wait")
	} else {
		defer watch.Stop()
	}
	var updates <-chan jetstream.KeyValueEntry
	if watch != nil {
		updates = watch.Updates()
	}
	renew := time.NewTicker(presenceEvery)
	defer renew.Stop()
	probe := time.NewTicker(probeEvery)
	defer probe.Stop()
	for {
		select {
		case <-ctx.Done():
			dctx, cancel := opCtx()
			_ = l.e.ownersKV.Delete(dctx, protocol.PresenceKey(l.e.id), jetstream.LastRevision(l.rev))
			cancel()
			return
		case <-renew.C:
			l.renew()
		case <-probe.C:
			l.probeAll()
		case entry, ok := <-updates:
			if !ok {
				updates = nil
				continue
			}
			if entry != nil {
				l.watched(entry)
			}
		}
	}
}

// renew renews this engine's presence. A definite refusal (its revision
// moved on: another engine deleted it, or it expired) means this engine
// was declared dead: it fences itself and registers again. Any other
// failure (a timeout, an election) is tried again at the next tick.
func (l *liveness) renew() {
	ctx, cancel := context.WithTimeout(context.Background(), presenceEvery)
	defer cancel()
	ack, err := l.publish(ctx, &l.rev)
	switch {
	case err == nil:
		l.rev = ack.Sequence
		return
	case !isWrongLastSequence(err):
		l.e.log.Warn().Err(err).Str(protocol.FieldMeaning, protocol.Meaning(err)).Msg("could not renew this engine's presence; trying again")
		return
	}
	l.e.log.Warn().Msg("this engine was declared dead while it could not renew its presence: letting every run go, then registering again")
	l.fence()
	if ack, err := l.publish(ctx, nil); err == nil {
		l.rev = ack.Sequence
		// The runs whose keys still name this engine nobody else takes
		// now: take them back, projecting their last commits again.
		go func() {
			ctx, cancel := opCtx()
			defer cancel()
			l.e.reclaim(ctx)
		}()
	} // else the next tick fails the same way and tries again
}

// fence forgets every run this engine owned (and the lead of an earlier
// version's projector consumer, while it drains it).
func (l *liveness) fence() {
	l.epoch.Add(1)
	for _, s := range l.e.shards {
		select {
		case s.fence <- struct{}{}:
		default: // one is pending already
		}
	}
}

// watched takes a presence key's change: a new or renewed engine is
// probed; a deleted one is dead, and its runs are taken over.
func (l *liveness) watched(entry jetstream.KeyValueEntry) {
	id := strings.TrimPrefix(entry.Key(), protocol.PresenceKeyPrefix)
	if id == l.e.id {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if entry.Operation() != jetstream.KeyValuePut {
		if _, known := l.peers[id]; known {
			delete(l.peers, id)
			go l.e.sweep(id)
		}
		return
	}
	p := l.peers[id]
	if p == nil {
		p = &peer{}
		l.peers[id] = p
	}
	p.rev = entry.Revision()
}

// probeAll probes every other engine, and this one, without waiting for
// the answers.
func (l *liveness) probeAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.selfProbing {
		l.selfProbing = true
		go l.probeSelf()
	}
	for id, p := range l.peers {
		if p.probing {
			continue
		}
		p.probing = true
		go l.probe(id, p)
	}
}

// probe asks one engine whether it is there, and declares it dead after
// deadAfter of definite silence.
func (l *liveness) probe(id string, p *peer) {
	_, err := l.e.nc.Request(l.e.names.Ping(id), nil, probeTimeout)
	l.mu.Lock()
	p.probing = false
	if !errors.Is(err, nats.ErrNoResponders) {
		// An answer, or no definite one (a timeout): not silent.
		p.silent, p.silRev = time.Time{}, 0
		l.mu.Unlock()
		return
	}
	now := time.Now()
	if p.silent.IsZero() {
		p.silent, p.silRev = now, p.rev
	}
	if now.Sub(p.silent) < deadAfter || l.peers[id] != p {
		l.mu.Unlock()
		return
	}
	rev := p.silRev
	l.mu.Unlock()
	ctx, cancel := opCtx()
	defer cancel()
	// Only if nothing renewed it since the silence began.
	if err := l.e.ownersKV.Delete(ctx, protocol.PresenceKey(id), jetstream.LastRevision(rev)); err != nil {
		if !isWrongLastSequence(err) {
			l.e.log.Warn().Str("engine", id).Err(err).Msg("could not declare a silent engine dead; probing on")
		}
		return
	}
	l.e.log.Warn().Str("engine", id).Dur("silent", now.Sub(p.silent)).Msg("engine gone (no connection answers its probes): taking its runs over")
	// The watch delivers the deletion: every engine sweeps then.
}

// probeSelf asks this engine's own ping subject through the server: an
// answer proves the connection carries messages both ways now.
func (l *liveness) probeSelf() {
	_, err := l.e.nc.Request(l.e.names.Ping(l.e.id), nil, probeTimeout)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.selfProbing = false
	if err != nil {
		return
	}
	now := time.Now()
	if now.Sub(l.heard) > heardWithin {
		l.back = now // the first answer after a break (or ever)
	}
	l.heard = now
}

// connected reports whether this engine's connection carries messages now,
// and since when without a break. A lease or a dispatch deadline watched
// here runs out only while it does, and no sooner than one lease after a
// break ended: a worker's heartbeats and claims could not reach an engine
// whose server stalled or failed over, and must not be held against the
// worker.
func (l *liveness) connected() (bool, time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.heard.IsZero() && time.Since(l.heard) <= heardWithin, l.back
}

// alive reports whether an engine may still be alive: known by the watch,
// or with a presence key. Only a definite answer (no key) says no.
func (l *liveness) alive(ctx context.Context, id string) bool {
	if id == l.e.id {
		return true
	}
	l.mu.Lock()
	_, known := l.peers[id]
	l.mu.Unlock()
	if known {
		return true
	}
	_, err := l.e.ownersKV.Get(ctx, protocol.PresenceKey(id))
	return !errors.Is(err, jetstream.ErrKeyNotFound) && !errors.Is(err, jetstream.ErrKeyDeleted)
}

// ownedBy returns the runs whose owner key names an engine.
func (e *Engine) ownedBy(ctx context.Context, id string) ([]string, error) {
	w, err := e.ownersKV.WatchFiltered(ctx, []string{protocol.OwnerKey("*")}, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	var runs []string
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case entry := <-w.Updates():
			if entry == nil {
				return runs, nil // every current key was delivered
			}
			if string(entry.Value()) == id {
				runs = append(runs, strings.TrimPrefix(entry.Key(), protocol.OwnerKey("")))
			}
		}
	}
}

// sweep takes over the runs a dead engine owned: each is asked for at once
// (acquire swaps its key from a dead owner), recovered from the log and
// driven on. Every live engine sweeps; each run goes to one of them.
func (e *Engine) sweep(dead string) {
	ctx, cancel := opCtx()
	defer cancel()
	n, err := e.recoverRunsOf(ctx, dead)
	if err != nil {
		e.log.Warn().Str("engine", dead).Err(err).Msg("could not list a dead engine's runs: they wait for their messages")
		return
	}
	if n > 0 {
		e.log.Info().Str("engine", dead).Int("runs", n).Msg("taking over a dead engine's runs")
	}
}

// recoverRunsOf asks at once for every run whose owner key names an
// engine (this one's previous process, or a dead one), and returns how
// many: each is owned, folded from the log, recovered and driven on.
func (e *Engine) recoverRunsOf(ctx context.Context, id string) (int, error) {
	runs, err := e.ownedBy(ctx, id)
	if err != nil {
		return 0, err
	}
	for _, runID := range runs {
		e.shardOf(runID).post(item{runID: runID, work: &reclaimRun{}})
	}
	return len(runs), nil
}
