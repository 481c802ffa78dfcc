package engine

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/internal/testnats"
	"github.com/toolbatch/toolbatch/internal/testwait"
	"github.com/toolbatch/toolbatch/protocol"
)

// presence writes another engine's presence key, as that engine would.
func presence(t *testing.T, ctx context.Context, e *Engine, id string) {
	t.Helper()
	m := nats.NewMsg(e.names.KVSubject(protocol.BucketOwners, protocol.PresenceKey(id)))
	m.Data = []byte(id)
	if _, err := e.js.PublishMsg(ctx, m, jetstream.WithMsgTTL(e.liveness.ttl)); err != nil {
		t.Fatal(err)
	}
}

// TestRunKeyIsTakenOnlyFromADeadEngine: a run whose key names another
// engine stays that engine's while its presence key exists, and is taken
// over, in one swap of the key, once the presence is gone.
func TestRunKeyIsTakenOnlyFromADeadEngine(t *testing.T) {
	e, ctx := setUpEngine(t)
	s := e.shards[0]
	presence(t, ctx, e, "other")
	if _, err := e.ownersKV.Create(ctx, protocol.OwnerKey("rn"), []byte("other")); err != nil {
		t.Fatal(err)
	}
	rs := s.state("rn")
	var elsewhere ownedElsewhere
	if err := s.acquire(ctx, rs); !errors.As(err, &elsewhere) || elsewhere.owner != "other" || rs.owned {
		t.Fatalf("acquire of a live engine's run: %v (owned %v)", err, rs.owned)
	}
	if err := e.ownersKV.Delete(ctx, protocol.PresenceKey("other")); err != nil {
		t.Fatal(err)
	}
	if err := s.acquire(ctx, rs); err != nil || !rs.owned {
		t.Fatalf("acquire of a dead engine's run: %v (owned %v)", err, rs.owned)
	}
	entry, err := e.ownersKV.Get(ctx, protocol.OwnerKey("rn"))
	if err != nil || string(entry.Value()) != e.id || entry.Revision() != rs.ownRev {
		t.Fatalf("the run's key after the takeover: %v %v", entry, err)
	}
}

// TestProbesDeclareOnlyAGoneEngineDead: of three other engines, the one
// whose ping subject nobody subscribes (its process is gone) is declared
// dead and its run taken over; the one that answers, and the one that is
// subscribed but never answers (paused: its probes time out), keep their
// presence and their runs although each was probed through more than a
// whole dead-after window.
func TestProbesDeclareOnlyAGoneEngineDead(t *testing.T) {
	e, ctx := setUpEngine(t)
	ctx, cancel := context.WithTimeout(ctx, 30*deadAfter)
	defer cancel()
	// first and last probe each received, in Unix nanoseconds
	var alive, paused [2]atomic.Int64
	for id, answer := range map[string]bool{"alive": true, "paused": false} {
		seen := &alive
		if !answer {
			seen = &paused
		}
		sub, err := e.nc.Subscribe(e.names.Ping(id), func(m *nats.Msg) {
			now := time.Now().UnixNano()
			seen[0].CompareAndSwap(0, now)
			seen[1].Store(now)
			if answer {
				_ = m.Respond(nil)
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
	}
	for _, id := range []string{"alive", "paused", "gone"} {
		presence(t, ctx, e, id)
		if _, err := e.ownersKV.Create(ctx, protocol.OwnerKey("run-of-"+id), []byte(id)); err != nil {
			t.Fatal(err)
		}
	}
	ping, err := e.liveness.subscribe()
	if err != nil {
		t.Fatal(err)
	}
	defer ping.Unsubscribe()
	if err := e.liveness.register(ctx); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	for _, s := range e.shards {
		go s.loop(runCtx)
	}
	go e.liveness.run(runCtx)

	owner := func(run string) string {
		entry, err := e.ownersKV.Get(ctx, protocol.OwnerKey(run))
		if err != nil {
			return err.Error()
		}
		return string(entry.Value())
	}
	testwait.Until(t, ctx, "the gone engine's run taken over", func() bool { return owner("run-of-gone") == e.id })
	if _, err := e.ownersKV.Get(ctx, protocol.PresenceKey("gone")); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("the gone engine's presence: %v", err)
	}
	probedFor := func(seen *[2]atomic.Int64) time.Duration { return time.Duration(seen[1].Load() - seen[0].Load()) }
	testwait.Until(t, ctx, "a whole window of probes", func() bool { return probedFor(&alive) > deadAfter && probedFor(&paused) > deadAfter })
	for _, id := range []string{"alive", "paused"} {
		if got := owner("run-of-" + id); got != id {
			t.Errorf("the %s engine's run is now %s's", id, got)
		}
		if _, err := e.ownersKV.Get(ctx, protocol.PresenceKey(id)); err != nil {
			t.Errorf("the %s engine's presence: %v", id, err)
		}
	}
}

// TestAnEngineDeclaredDeadFencesItself: an engine that finds its presence
// deleted (another engine found it silent) lets every run go, and the
// projector's lead, then registers again.
func TestAnEngineDeclaredDeadFencesItself(t *testing.T) {
	e, ctx := setUpEngine(t)
	ping, err := e.liveness.subscribe()
	if err != nil {
		t.Fatal(err)
	}
	defer ping.Unsubscribe()
	if err := e.liveness.register(ctx); err != nil {
		t.Fatal(err)
	}
	s := e.shardOf("rf")
	rev, err := e.ownersKV.Create(ctx, protocol.OwnerKey("rf"), []byte(e.id))
	if err != nil {
		t.Fatal(err)
	}
	rs := s.state("rf")
	rs.owned, rs.ownRev = true, rev
	lead := &leader{e: e, key: protocol.ProjectorLeaderKey}
	if !lead.hold(ctx) {
		t.Fatal("no lead on a free key")
	}
	first := e.liveness.rev
	if err := e.ownersKV.Delete(ctx, protocol.PresenceKey(e.id)); err != nil {
		t.Fatal(err)
	}
	e.liveness.renew()
	if e.liveness.epoch.Load() != 1 || e.liveness.rev == first {
		t.Fatalf("after the deletion: epoch %d, revision %d (was %d)", e.liveness.epoch.Load(), e.liveness.rev, first)
	}
	if _, err := e.ownersKV.Get(ctx, protocol.PresenceKey(e.id)); err != nil {
		t.Fatalf("not registered again: %v", err)
	}
	// The shard forgets its runs when it takes the fence.
	select {
	case <-s.fence:
	default:
		t.Fatal("the shard was not fenced")
	}
	// The lead taken in an earlier epoch is not held any more; the key
	// still names this engine, so it is taken again at once.
	if lead.epoch != 0 || !lead.hold(ctx) || lead.epoch != 1 {
		t.Fatalf("lead after the fence: epoch %d", lead.epoch)
	}
}

// TestOwnersBucketOfAnEarlierVersionIsUpdated: a store set up before
// presence keys (the owners bucket with a bucket-wide TTL, no per-message
// TTLs) is updated in place at start-up: its keys stop expiring and
// presence keys carry their own TTL.
func TestOwnersBucketOfAnEarlierVersionIsUpdated(t *testing.T) {
	nc := testnats.Connect(t, testnats.Start(t, t.TempDir()))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	js := testnats.JetStream(t, nc)
	n := protocol.Names{Prefix: protocol.DefaultPrefix}
	old, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: n.OwnersBucket(), TTL: 30 * time.Second, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := old.Put(ctx, protocol.OwnerKey("r0"), []byte("an-old-engine")); err != nil {
		t.Fatal(err)
	}
	e, err := New(nc, Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Setup(ctx); err != nil {
		t.Fatalf("set-up over an earlier owners bucket: %v", err)
	}
	s, err := js.Stream(ctx, "KV_"+n.OwnersBucket())
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	if cfg.MaxAge != 0 || !cfg.AllowMsgTTL {
		t.Fatalf("owners bucket after set-up: max age %v, message TTLs %v", cfg.MaxAge, cfg.AllowMsgTTL)
	}
	if err := e.liveness.register(ctx); err != nil {
		t.Fatalf("presence in the updated bucket: %v", err)
	}
	if entry, err := e.ownersKV.Get(ctx, protocol.OwnerKey("r0")); err != nil || string(entry.Value()) != "an-old-engine" {
		t.Fatalf("an earlier run key: %v %v", entry, err)
	}
}
