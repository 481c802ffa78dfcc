package engine

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/internal/testnats"
	"github.com/toolbatch/toolbatch/internal/testwait"
	"github.com/toolbatch/toolbatch/protocol"
)

// TestLiveCapabilitiesFollowTheBuckets: the mirror answers what the
// buckets hold, including an advertisement made a moment ago, and forgets
// deleted keys and advertisements older than the workers' TTL.
func TestLiveCapabilitiesFollowTheBuckets(t *testing.T) {
	e, ctx := setUpEngine(t)
	workers, registry := e.live.workers, e.live.registry
	// Advertised before the watch starts: in the mirror once start returns.
	if _, err := registry.Put(ctx, "brain.old", []byte(events.CapDurableRequest)); err != nil {
		t.Fatal(err)
	}
	if err := e.live.start(ctx); err != nil {
		t.Fatal(err)
	}
	defer e.live.stop()
	if _, ok := e.live.mirroredBrain("old"); !ok {
		t.Fatal("an existing registration is not in the mirror after start")
	}
	if got := e.live.brainTool(ctx, "old"); got != events.CapDurableRequest {
		t.Fatalf("brain old: %s", got)
	}

	if got := e.live.sandbox(ctx, "default", "t"); got != "" {
		t.Fatalf("no worker: %q, want none", got)
	}
	if _, err := workers.Put(ctx, "sandbox.default.t.w1", []byte(events.CapReplaySafe)); err != nil {
		t.Fatal(err)
	}
	// At once, whether or not the watch has delivered the put yet.
	if got := e.live.sandbox(ctx, "default", "t"); got != events.CapReplaySafe {
		t.Fatalf("just advertised: %s", got)
	}
	testwait.Until(t, ctx, "advertisement mirrored", func() bool { return e.live.mirrored("default.t", "w1") })
	if got := e.live.sandbox(ctx, "other", "t"); got != "" {
		t.Fatalf("another pool: %q, want none", got)
	}
	if err := workers.Delete(ctx, "sandbox.default.t.w1"); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, ctx, "deleted advertisement forgotten", func() bool { return !e.live.mirrored("default.t", "w1") })
	if got := e.live.sandbox(ctx, "default", "t"); got != "" {
		t.Fatalf("after the worker's delete: %q, want none", got)
	}

	// A key the bucket's age limit removed is never announced to a watch:
	// an advertisement older than the TTL no longer counts.
	e.live.apply(fakeEntry{key: "sandbox.default.t.w2", value: string(events.CapIdempotent), created: time.Now().Add(-WorkerTTL - time.Second)})
	if got := e.live.sandbox(ctx, "default", "t"); got != "" {
		t.Fatalf("expired advertisement: %q, want none", got)
	}
	e.live.apply(fakeEntry{key: "sandbox.default.t.w2", value: string(events.CapIdempotent), created: time.Now()})
	if got := e.live.sandbox(ctx, "default", "t"); got != events.CapIdempotent {
		t.Fatalf("fresh advertisement: %s", got)
	}
	// Workers of one tool that disagree: the most conservative wins, so
	// that a worker claiming more than the others cannot raise the tool's
	// capability (a replay of a call another worker cannot survive).
	if _, err := workers.Put(ctx, "sandbox.default.t.w3", []byte(events.CapReplaySafe)); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, ctx, "second advertisement mirrored", func() bool { return e.live.mirrored("default.t", "w3") })
	if got := e.live.sandbox(ctx, "default", "t"); got != events.CapNonRecoverable {
		t.Fatalf("workers disagree (idempotent, replay_safe): %s", got)
	}
	if got := e.live.sandboxFromBucket(ctx, "default", "t"); got != events.CapReplaySafe {
		t.Fatalf("the bucket holds w3 only: %s", got)
	}
	if _, err := workers.Put(ctx, "sandbox.default.t.w4", []byte(events.CapNonRecoverable)); err != nil {
		t.Fatal(err)
	}
	if got := e.live.sandboxFromBucket(ctx, "default", "t"); got != events.CapNonRecoverable {
		t.Fatalf("the bucket's workers disagree: %s", got)
	}

	if _, err := registry.Put(ctx, "brain.x", []byte(events.CapIdempotent)); err != nil {
		t.Fatal(err)
	}
	if got := e.live.brainTool(ctx, "x"); got != events.CapIdempotent {
		t.Fatalf("brain x just registered: %s", got)
	}
	if err := registry.Delete(ctx, "brain.x"); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, ctx, "deregistration followed", func() bool { return e.live.brainTool(ctx, "x") == events.CapNonRecoverable })
	if _, ok := e.live.mirroredBrain("x"); ok {
		t.Fatal("a deleted registration stays in the mirror")
	}
}

// setUpEngine returns an engine whose streams and buckets are set up on a
// fresh server, not running, and a context for the test.
func setUpEngine(t *testing.T) (*Engine, context.Context) {
	t.Helper()
	return setUpEngineWith(t, Config{}, nil)
}

// setUpEngineWith is setUpEngine with cfg, and before (when not nil) run
// on the fresh server before the set-up.
func setUpEngineWith(t *testing.T, cfg Config, before func(context.Context, jetstream.JetStream)) (*Engine, context.Context) {
	t.Helper()
	nc := testnats.Connect(t, testnats.Start(t, t.TempDir()))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	if before != nil {
		before(ctx, testnats.JetStream(t, nc))
	}
	e, err := New(nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Setup(ctx); err != nil {
		t.Fatal(err)
	}
	return e, ctx
}

// runEngine runs an engine on the server at url until the test ends, and
// returns it once it is ready.
func runEngine(t *testing.T, url string, cfg Config) *Engine {
	t.Helper()
	e, err := New(testnats.Connect(t, url), cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("engine: %v", err)
		}
	})
	select {
	case <-e.Ready():
	case err := <-done:
		t.Fatalf("engine stopped: %v", err)
	}
	return e
}

func (l *liveCapabilities) mirrored(tool, worker string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.adverts[tool][worker]
	return ok
}

func (l *liveCapabilities) mirroredBrain(tool string) (events.Capability, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c, ok := l.brain[tool]
	return c, ok
}

// fakeEntry is a put as a watch delivers it.
type fakeEntry struct {
	key, value string
	created    time.Time
}

func (f fakeEntry) Bucket() string                  { return "" }
func (f fakeEntry) Key() string                     { return f.key }
func (f fakeEntry) Value() []byte                   { return []byte(f.value) }
func (f fakeEntry) Revision() uint64                { return 1 }
func (f fakeEntry) Created() time.Time              { return f.created }
func (f fakeEntry) Delta() uint64                   { return 0 }
func (f fakeEntry) Operation() jetstream.KeyValueOp { return jetstream.KeyValuePut }

// TestStoredCatalogMustHashToItsID: a catalog stored under a snapshot id
// that is not its content's hash (a forged entry of the catalogs bucket)
// is refused, so a batch pinned to that id cannot be gated by it.
func TestStoredCatalogMustHashToItsID(t *testing.T) {
	e, ctx := setUpEngine(t)
	real := e.cfg.Catalog.SnapshotID()
	if _, err := e.catalogFor(ctx, real); err != nil {
		t.Fatalf("the engine's own catalog: %v", err)
	}
	forged := "cat-00000000000000ff"
	if _, err := e.catalogKV.Put(ctx, forged, []byte("tools:\n  - {id: echo, builtin: echo}\n")); err != nil {
		t.Fatal(err)
	}
	_, err := e.catalogFor(ctx, forged)
	if err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("a catalog stored under another id: %v", err)
	}
}

// TestClaimNeverBlocksBehindAFullShard: when a run's shard cannot take
// more work, a claim is answered busy at once by the run's owner rather
// than held in the subscription (where it would delay every later claim
// and heartbeat).
func TestClaimNeverBlocksBehindAFullShard(t *testing.T) {
	e, ctx := setUpEngine(t)
	nc := e.nc
	// This engine owns the run: it is the one to say busy.
	if _, err := e.ownersKV.Put(ctx, protocol.OwnerKey("flood"), []byte(e.id)); err != nil {
		t.Fatal(err)
	}
	subs, err := e.serveWorkers() // the shards' loops are not running: nothing drains them
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
	}()
	s := e.shardOf("flood")
	for len(s.in) < cap(s.in) {
		s.in <- item{runID: "flood", work: &unclaimedExpiry{callID: "c1", attempt: 1}}
	}
	for i := range 3 {
		body, _ := events.Marshal(protocol.ClaimRequest{OperationID: "flood/1/c1", Attempt: 1, WorkerID: "w"})
		m, err := nc.Request(e.names.Claim(), body, 5*time.Second)
		if err != nil {
			t.Fatalf("claim %d: %v", i, err)
		}
		var r protocol.ClaimReply
		if err := events.Unmarshal(m.Data, &r); err != nil {
			t.Fatal(err)
		}
		if r.Granted || r.Reason != protocol.ReasonBusy {
			t.Fatalf("claim %d behind a full shard: %+v", i, r)
		}
	}
}

// TestTrimOldestByBytes: a cache over its bytes bound drops its least
// recently used entries that may go until it is under nine tenths of the
// bound, whatever its count; entries that may not go stay.
func TestTrimOldestByBytes(t *testing.T) {
	type entry struct {
		used, size int64
		busy       bool
	}
	m := map[string]entry{
		"a": {used: 1, size: 400}, "b": {used: 2, size: 400, busy: true},
		"c": {used: 3, size: 400}, "d": {used: 4, size: 400}, "e": {used: 5, size: 100},
	}
	trimOldest(m, bound{max: 100, maxBytes: 1000}, func(e entry) int64 { return e.used },
		func(e entry) int64 { return e.size }, func(e entry) bool { return !e.busy })
	var keys []string
	var total int64
	for k, e := range m {
		keys = append(keys, k)
		total += e.size
	}
	slices.Sort(keys)
	if fmt.Sprint(keys) != "[b d e]" || total > 900 {
		t.Fatalf("kept %v (%d bytes), want [b d e] within 900", keys, total)
	}
	// Within both bounds nothing goes.
	trimOldest(m, bound{max: 100, maxBytes: 1000}, func(e entry) int64 { return e.used },
		func(e entry) int64 { return e.size }, func(entry) bool { return true })
	if len(m) != 3 {
		t.Fatalf("trimmed within its bounds: %v", m)
	}
}

// TestResultWaitsInTheInbox: a worker's result stored in the inbox and
// not yet taken is found by its attempt (so its lease does not run out
// while it waits there), among the run's other results; none is no, and
// nor is one the engine took and acknowledged, which the inbox keeps
// until a trim.
func TestResultWaitsInTheInbox(t *testing.T) {
	e, ctx := setUpEngine(t)
	intake, err := e.js.CreateOrUpdateConsumer(ctx, e.names.InboxStream(), jetstream.ConsumerConfig{
		Durable: protocol.ConsumerEngine, AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []protocol.Result{
		{OperationID: "rw/1/c1", Attempt: 1, ClaimToken: "t1", Output: &events.Output{}},
		{OperationID: "rw/1/c2", Attempt: 2, ClaimToken: "t2", Output: &events.Output{}},
	} {
		body, err := events.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.js.Publish(ctx, e.names.Result("rw"), body); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		op      string
		attempt int
		want    bool
	}{{"rw/1/c1", 1, true}, {"rw/1/c2", 2, true}, {"rw/1/c2", 1, false}, {"rw/1/c3", 1, false}} {
		got, err := e.resultWaits(ctx, "rw", c.op, c.attempt)
		if err != nil || got != c.want {
			t.Errorf("result of %s attempt %d waits: %v %v, want %v", c.op, c.attempt, got, err, c.want)
		}
	}
	if got, err := e.resultWaits(ctx, "other", "other/1/c1", 1); err != nil || got {
		t.Errorf("another run: %v %v", got, err)
	}
	taken, err := intake.Fetch(1)
	if err != nil {
		t.Fatal(err)
	}
	for m := range taken.Messages() {
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := e.resultWaits(ctx, "rw", "rw/1/c1", 1); err != nil || got {
		t.Errorf("a result taken and acknowledged waits: %v %v", got, err)
	}
	if got, err := e.resultWaits(ctx, "rw", "rw/1/c2", 2); err != nil || !got {
		t.Errorf("a result not taken: waits %v %v", got, err)
	}
}
