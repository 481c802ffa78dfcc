package engine

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/toolbatch/toolbatch/catalog"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/metrics"
	"github.com/toolbatch/toolbatch/proof"
	"github.com/toolbatch/toolbatch/protocol"
	"github.com/toolbatch/toolbatch/tracing"
)

// Defaults.
const (
	DefaultOutMaxAge = 168 * time.Hour
	DefaultAckWait   = 30 * time.Second
	// DefaultInboxAckWait is Config.InboxAckWait's default.
	DefaultInboxAckWait = 5 * time.Second
	// minInboxAckWait is the least InboxAckWait the engine takes.
	minInboxAckWait = 300 * time.Millisecond
	DefaultShards   = 64
	// DefaultCheckpointEvery is Config.CheckpointEvery's default.
	DefaultCheckpointEvery = time.Minute
	// DefaultTrimEvery is Config.TrimEvery's default.
	DefaultTrimEvery = 5 * time.Second
	// DefaultSweepEvery and DefaultOverdueAfter are Config.SweepEvery's
	// and Config.OverdueAfter's defaults.
	DefaultSweepEvery   = 30 * time.Second
	DefaultOverdueAfter = 10 * time.Second
	DefaultMaxPending   = 10000
	DefaultCacheRuns    = 1024
	DefaultCacheBytes   = 256 << 20
)

// Config configures an engine. The zero value of each field means its
// default.
type Config struct {
	// Prefix is the subject prefix (default "toolbatch").
	Prefix string
	// Replicas of every stream (default 1).
	Replicas int
	// OutMaxAge is how long out messages are kept (default 168h).
	OutMaxAge time.Duration
	// AckWait is how long an engine's presence lives unrenewed: a process
	// paused or cut off, which answers no probe, is declared dead after it
	// (default 30s; longer than a leader election, during which no
	// presence can be renewed). A killed engine is declared dead in
	// seconds (liveness.go).
	AckWait time.Duration
	// InboxAckWait is how long an inbox or timer message delivered to an
	// engine may go without an acknowledgement or progress before
	// JetStream delivers it again (default 5s): a delivery lost with a
	// server or a connection, or taken by an engine that died before
	// committing it, comes back after it. The engine keeps the messages it
	// works on in progress more often than that.
	InboxAckWait time.Duration
	// Shards is how many runs are worked on at once at most (default 64);
	// the work of one run is always serialized.
	Shards int
	// MaxPending bounds the inbox messages in progress (default 10000).
	MaxPending int
	// CacheRuns bounds the runs whose folded state is kept in memory, by
	// the engine, with what it projected of each (default 1024); the least
	// recently used go first, and a run not cached is folded again from
	// the log when it is next touched. A parked run needs no memory.
	CacheRuns int
	// CacheBytes bounds the same caches by the bytes of the runs' commits
	// (default 256 MiB each): a few large runs cannot hold the engine's
	// memory, whatever CacheRuns allows.
	CacheBytes int64
	// ClientMaxRuns, ClientSubmitRate and ClientSubmitBurst are the
	// per-client limits (clients.go; defaults DefaultClientMaxRuns,
	// DefaultClientSubmitRate per second, DefaultClientSubmitBurst); a
	// negative value turns a limit off.
	ClientMaxRuns     int
	ClientSubmitRate  float64
	ClientSubmitBurst int
	// ID names this engine in the owners bucket (default: a new id at each
	// start). An engine restarted with its former id takes its runs back
	// at once: it recovers every run whose owner key still names it,
	// instead of waiting for another engine to find it dead. Two live
	// engines must never share an id.
	ID string
	// WorkerPools, when not nil, gives the pools of a worker user by its
	// public nkey (from the auth file): a claim is granted only when its
	// reply inbox is a worker's of the call's pool.
	WorkerPools func(nkey string) []string
	// Catalog is the operator's catalog (default catalog.Default()).
	Catalog *catalog.Catalog
	// Limits bound submissions and outputs (default events.DefaultLimits()).
	Limits events.Limits
	// Logger receives the engine's logs (default: none).
	Logger zerolog.Logger
	// Lease is how long a sandbox worker's claim lasts without a heartbeat
	// (default 10s).
	Lease time.Duration
	// Grace is how long a shutdown waits for the brain and delegation
	// calls in progress to finish and be recorded (default 10s); calls
	// still running then are left to the recovery of the next owner.
	Grace time.Duration
	// Signer signs every commit (proof.Signer; the engine runs it). Nil
	// appends unsigned commits, as engines did before issue 15: replay
	// audit reports such a log as unsigned.
	Signer *proof.Signer
	// CheckpointEvery is how often the engine that leads the checkpoints
	// publishes a signed checkpoint of the events stream when it grew
	// (default 1m; negative: never, nor on request). Needs a Signer.
	CheckpointEvery time.Duration
	// TrimEvery is how often the engine removes the inbox and dispatch
	// messages their consumers have acknowledged (default 5s; trim.go).
	TrimEvery time.Duration
	// SweepEvery is how often the engine looks for open tickets whose
	// timer should have fired and did not, and schedules them again
	// (default 30s; timers.go); OverdueAfter is how long past its time a
	// timer may be unfired before that (default 10s).
	SweepEvery, OverdueAfter time.Duration
	// Metrics, when set, is where the engine registers its metrics
	// (package metrics; nil: none). The events of a commit are counted
	// within a few milliseconds of it; a scrape that calls Settle first
	// sees every commit made before it.
	Metrics prometheus.Registerer
	// Tracing, when set, is where the engine exports the spans of its
	// batches and calls (package tracing; nil: none).
	Tracing *tracing.Provider
	// Now is the engine's clock (default time.Now): the time of every
	// event and of every ticket's deadline and due time. The engine's
	// in-memory watches (leases, dispatch deadlines, idle runs) use the
	// monotonic clock instead, so that a clock step never fires them.
	Now func() time.Time
}

func (c *Config) defaults() {
	if c.Prefix == "" {
		c.Prefix = protocol.DefaultPrefix
	}
	if c.Replicas <= 0 {
		c.Replicas = 1
	}
	if c.CheckpointEvery == 0 {
		c.CheckpointEvery = DefaultCheckpointEvery
	}
	if c.TrimEvery <= 0 {
		c.TrimEvery = DefaultTrimEvery
	}
	if c.SweepEvery <= 0 {
		c.SweepEvery = DefaultSweepEvery
	}
	if c.OverdueAfter <= 0 {
		c.OverdueAfter = DefaultOverdueAfter
	}
	if c.OutMaxAge <= 0 {
		c.OutMaxAge = DefaultOutMaxAge
	}
	if c.AckWait <= 0 {
		c.AckWait = DefaultAckWait
	}
	switch {
	case c.InboxAckWait <= 0:
		c.InboxAckWait = DefaultInboxAckWait
	case c.InboxAckWait < minInboxAckWait:
		c.InboxAckWait = minInboxAckWait // messages are kept in progress every third of it
	}
	if c.Shards <= 0 {
		c.Shards = DefaultShards
	}
	if c.MaxPending <= 0 {
		c.MaxPending = DefaultMaxPending
	}
	if c.CacheRuns <= 0 {
		c.CacheRuns = DefaultCacheRuns
	}
	if c.CacheBytes <= 0 {
		c.CacheBytes = DefaultCacheBytes
	}
	if c.ClientMaxRuns == 0 {
		c.ClientMaxRuns = DefaultClientMaxRuns
	}
	if c.ClientSubmitRate == 0 {
		c.ClientSubmitRate = DefaultClientSubmitRate
	}
	if c.ClientSubmitBurst <= 0 {
		c.ClientSubmitBurst = DefaultClientSubmitBurst
	}
	if c.Catalog == nil {
		c.Catalog = catalog.Default()
	}
	if c.Limits == (events.Limits{}) {
		c.Limits = events.DefaultLimits()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Lease <= 0 {
		c.Lease = DefaultLease
	}
	if c.Grace <= 0 {
		c.Grace = 10 * time.Second
	}
}

// Validate reports every problem of the configuration.
func (c Config) Validate() error {
	var errs []error
	if !protocol.ValidPrefix(c.Prefix) {
		errs = append(errs, fmt.Errorf("prefix %q must be one or more NATS tokens of [A-Za-z0-9_-]", c.Prefix))
	}
	if err := c.Limits.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Catalog != nil {
		if err := supported(c.Catalog); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Engine serves runs. Create it with New and run it with Run.
type Engine struct {
	cfg     Config
	nc      *nats.Conn
	js      jetstream.JetStream
	outPub  *outPublisher // the out messages, and their acknowledgements
	names   protocol.Names
	log     zerolog.Logger
	events  *eventLog
	brain   *brainExecutor
	gate    *gateChain
	state   *stateStore
	clients *clientLimits
	shards  []*shard
	// Buckets, opened once by Setup.
	ownersKV, catalogKV jetstream.KeyValue
	ownersStream        jetstream.Stream   // the owners bucket's: a key's last message, headers and all
	ticketsKV           jetstream.KeyValue // every run's open ticket, kept by the projection
	outStream           jetstream.Stream   // the out stream: a subject's last message
	live                *liveCapabilities
	liveness            *liveness        // of the engines (liveness.go)
	inbox               jetstream.Stream // the inbox stream, opened by Setup
	fwd                 forwards         // messages forwarded to other engines
	trust               *trust           // what this engine verifies; nil: it does not sign
	metrics             *metrics.Engine  // nil: none
	ownedRuns           atomic.Int64     // runs whose owner key this engine holds
	tickets             *openTickets     // the tickets bucket, mirrored (timers.go)
	intake              atomic.Pointer[jetstream.Consumer]

	catMu    sync.Mutex
	catalogs map[string]*catalog.Catalog // by snapshot id

	wg      sync.WaitGroup // shards and executors
	running atomic.Int64   // brain and delegation calls in progress
	ready   chan struct{}
	id      string // this engine's identity in the owners bucket
}

// Ready is closed once the engine consumes its inbox.
func (e *Engine) Ready() <-chan struct{} { return e.ready }

// New returns an engine on an existing connection.
func New(nc *nats.Conn, cfg Config) (*Engine, error) {
	cfg.defaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("engine config: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	n := protocol.Names{Prefix: cfg.Prefix}
	e := &Engine{
		cfg: cfg, nc: nc, js: js, names: n, log: cfg.Logger, outPub: newOutPublisher(nc),
		events:   &eventLog{js: js, names: n, signer: cfg.Signer, tracer: tracing.NewEngine(cfg.Tracing)},
		catalogs: map[string]*catalog.Catalog{cfg.Catalog.SnapshotID(): cfg.Catalog},
		ready:    make(chan struct{}),
		id:       cfg.ID,
		fwd:      forwards{sent: map[string]sentForward{}},
	}
	if e.id == "" {
		e.id = nuid.Next()
	}
	e.tickets = &openTickets{}
	if cfg.Metrics != nil {
		e.metrics = metrics.NewEngine(cfg.Metrics, metrics.EngineGauges{
			RunsOwned:    func() float64 { return float64(e.ownedRuns.Load()) },
			InboxPending: e.inboxPending,
			TicketsOpen:  e.tickets.counts,
			PoolWorkers:  e.poolWorkers,
		})
		e.events.metrics = e.metrics
	}
	e.events.observer = newObserver(e.metrics, e.events.tracer)
	e.liveness = newLiveness(e)
	e.brain = &brainExecutor{nc: nc, js: js, names: n}
	e.gate = &gateChain{nc: nc, names: n}
	e.state = &stateStore{}
	e.clients = newClientLimits(max(cfg.ClientMaxRuns, 0), max(cfg.ClientSubmitRate, 0), cfg.ClientSubmitBurst)
	e.shards = make([]*shard, cfg.Shards)
	perShard := bound{max: cfg.CacheRuns/cfg.Shards + 1, maxBytes: cfg.CacheBytes/int64(cfg.Shards) + 1}
	for i := range e.shards {
		e.shards[i] = newShard(e, perShard)
	}
	return e, nil
}

// Names returns the engine's stream and subject names.
func (e *Engine) Names() protocol.Names { return e.names }

// Setup creates or updates the streams and stores the catalog under its
// snapshot id, so that batches pinned to it keep their rules when the file
// changes later.
func (e *Engine) Setup(ctx context.Context) error {
	if err := EnsureStreams(ctx, e.js, e.names, StreamConfig{Replicas: e.cfg.Replicas, OutMaxAge: e.cfg.OutMaxAge}); err != nil {
		return err
	}
	if err := e.openBuckets(ctx); err != nil {
		return err
	}
	if _, err := e.catalogKV.Put(ctx, e.cfg.Catalog.SnapshotID(), e.cfg.Catalog.Raw()); err != nil {
		return fmt.Errorf("store catalog %s: %w", e.cfg.Catalog.SnapshotID(), err)
	}
	return e.ensurePoolConsumers(ctx)
}

// intakeBytes bounds the inbox messages the engine has fetched and not yet
// handed to a run.
const intakeBytes = 64 << 20

// ensurePoolConsumers creates the dispatch consumer of every sandbox tool
// of the catalog, one per pool and tool, that the pool's workers share.
// The engine creates them, not the workers: a worker may only bind to its
// pools' consumers (docs/security.md). Their ack wait is the lease: a
// worker keeps a job it runs in progress at each heartbeat, and a job
// lost on its way to a worker (a server failure) comes back within a
// lease, not after a fixed half minute.
func (e *Engine) ensurePoolConsumers(ctx context.Context) error {
	names := map[string]string{} // consumer -> pool/tool
	for pool, tools := range e.cfg.Catalog.PoolTools() {
		for _, tool := range tools {
			name := protocol.PoolConsumer(pool, tool)
			if other, ok := names[name]; ok {
				return fmt.Errorf("pool %s tool %s and %s share the dispatch consumer %s: rename a pool or a tool", pool, tool, other, name)
			}
			names[name] = pool + "/" + tool
			_, err := e.js.CreateOrUpdateConsumer(ctx, e.names.DispatchStream(), jetstream.ConsumerConfig{
				Durable: protocol.PoolConsumer(pool, tool), FilterSubject: e.names.Dispatch(pool, tool),
				AckPolicy: jetstream.AckExplicitPolicy, AckWait: e.cfg.Lease, MaxDeliver: -1,
				Description: "toolbatch sandbox workers of pool " + pool + ", tool " + tool,
			})
			if err != nil {
				return fmt.Errorf("dispatch consumer of pool %s tool %s: %w", pool, tool, err)
			}
		}
	}
	return nil
}

// Run serves until ctx is done, then drains: it stops taking messages,
// finishes the commit in progress and returns.
func (e *Engine) Run(ctx context.Context) error {
	defer e.outPub.close() // last: the shards' out messages are settled first
	if err := e.untilDone(ctx, "create the streams, buckets and consumers", e.Setup); err != nil {
		return err
	}
	if s := e.cfg.Signer; s != nil {
		if err := e.untilDone(ctx, "register the signing key", func(ctx context.Context) error { return e.trust.register(ctx) }); err != nil {
			return err
		}
		defer e.trust.stop()
		sctx, stop := context.WithCancel(context.WithoutCancel(ctx))
		defer stop() // after the shards: a commit in flight at shutdown is still signed
		go s.Run(sctx)
	}
	ping, err := e.liveness.subscribe()
	if err != nil {
		return err
	}
	defer func() { _ = ping.Unsubscribe() }()
	if err := e.untilDone(ctx, "register this engine's presence", e.liveness.register); err != nil {
		return fmt.Errorf("register this engine's presence: %w", err)
	}
	if err := e.untilDone(ctx, "watch the executors' buckets", e.live.start); err != nil {
		return err
	}
	defer e.live.stop()
	if err := e.untilDone(ctx, "watch the tickets bucket", func(ctx context.Context) error { return e.tickets.start(ctx, e.ticketsKV) }); err != nil {
		return err
	}
	defer e.tickets.stop()
	var intake, timers jetstream.Consumer
	err = e.untilDone(ctx, "create the engine's consumers", func(ctx context.Context) error {
		var err error
		intake, err = e.js.CreateOrUpdateConsumer(ctx, e.names.InboxStream(), jetstream.ConsumerConfig{
			Durable: protocol.ConsumerEngine, AckPolicy: jetstream.AckExplicitPolicy, AckWait: e.cfg.InboxAckWait,
			MaxAckPending: e.cfg.MaxPending, MaxDeliver: -1, Description: "toolbatch engine intake",
		})
		if err != nil {
			return fmt.Errorf("intake consumer: %w", err)
		}
		e.intake.Store(&intake)
		timers, err = e.js.CreateOrUpdateConsumer(ctx, e.names.TimersStream(), jetstream.ConsumerConfig{
			Durable: protocol.ConsumerEngine, AckPolicy: jetstream.AckExplicitPolicy, AckWait: e.cfg.InboxAckWait,
			MaxAckPending: e.cfg.MaxPending, MaxDeliver: -1, FilterSubjects: []string{e.names.TimerFire("*")},
			Description: "toolbatch engine: fired ticket timers",
		})
		if err != nil {
			return fmt.Errorf("timer consumer: %w", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := e.untilDone(ctx, "project what an earlier version had not", e.drainEarlierProjector); err != nil {
		return err
	}
	if err := e.untilDone(ctx, "read the state bucket", e.state.loadUnstampedUntil); err != nil {
		return err
	}
	runCtx, stop := context.WithCancel(context.Background())
	defer stop()
	// The observer outlives the shards: their last commits are folded.
	obsCtx, stopObserver := context.WithCancel(context.Background())
	defer stopObserver()
	obsDone := make(chan struct{})
	go func() { defer close(obsDone); e.events.observer.run(obsCtx) }()
	for _, s := range e.shards {
		e.wg.Add(1)
		go func() { defer e.wg.Done(); s.loop(runCtx) }()
	}
	cpDone := make(chan error, 1)
	go func() {
		err := e.runCheckpoints(runCtx)
		if err != nil {
			e.log.Error().Err(err).Msg("checkpoints stopped")
		}
		cpDone <- err
	}()
	trimDone := make(chan struct{})
	go func() { defer close(trimDone); e.runTrims(runCtx) }()
	sweepDone := make(chan struct{})
	go func() {
		defer close(sweepDone)
		e.every(runCtx, e.cfg.SweepEvery, "looking for overdue ticket timers", e.sweepOverdue)
	}()
	// Liveness outlives the shards: its presence goes last, once the runs
	// that could be released were.
	liveCtx, stopLive := context.WithCancel(context.Background())
	defer stopLive()
	liveDone := make(chan struct{})
	go func() { defer close(liveDone); e.liveness.run(liveCtx) }()

	// Bounded by bytes too: 256 submissions near the NATS limit would
	// otherwise sit in memory at once.
	cc, err := intake.Consume(e.route, jetstream.PullMaxMessagesWithBytesLimit(256, intakeBytes),
		jetstream.PullExpiry(protocol.ServicePullExpiry), jetstream.PullHeartbeat(protocol.ServicePullHeartbeat))
	if err != nil {
		return fmt.Errorf("consume intake: %w", err)
	}
	tc, err := timers.Consume(e.route, jetstream.PullMaxMessages(64),
		jetstream.PullExpiry(protocol.ServicePullExpiry), jetstream.PullHeartbeat(protocol.ServicePullHeartbeat))
	if err != nil {
		return fmt.Errorf("consume timers: %w", err)
	}
	subs, err := e.serveWorkers()
	if err != nil {
		return fmt.Errorf("serve workers: %w", err)
	}
	fwd, err := e.serveForwards()
	if err != nil {
		return fmt.Errorf("serve forwards: %w", err)
	}
	fwdReplies, err := e.serveForwardReplies()
	if err != nil {
		return fmt.Errorf("serve forwards: %w", err)
	}
	subs = append(subs, fwd, fwdReplies)
	e.reclaim(ctx)
	close(e.ready)
	e.log.Info().Str("prefix", e.cfg.Prefix).Str("catalog", e.cfg.Catalog.SnapshotID()).Msg("engine ready")
	<-ctx.Done()
	e.log.Info().Msg("engine draining")
	for _, sub := range subs {
		_ = sub.Drain()
	}
	cc.Drain()
	tc.Drain()
	<-cc.Closed()
	<-tc.Closed()
	// Let the calls in progress finish and their outcomes be recorded.
	deadline := time.Now().Add(e.cfg.Grace)
	for e.running.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	e.wg.Wait()
	stopObserver()
	<-obsDone
	e.events.observer.settle() // what the last commits end, before the spans' exporter stops
	<-cpDone
	<-trimDone
	<-sweepDone
	stopLive()
	<-liveDone
	e.log.Info().Msg("engine stopped")
	return nil
}

// reclaim recovers at once the runs whose owner key names this engine: a
// previous process of it (same ID) left them, and nothing else would touch
// them before another engine found that process dead.
func (e *Engine) reclaim(ctx context.Context) {
	n, err := e.recoverRunsOf(ctx, e.id)
	if err != nil {
		return // the bucket unreachable: the runs' messages bring them back
	}
	if n > 0 {
		e.log.Info().Int("runs", n).Msg("taking back the runs this engine owned before it restarted")
	}
}

// route hands an inbox message to its run's shard.
func (e *Engine) route(m jetstream.Msg) {
	kind, runID, principal, ok := e.names.InboxKind(m.Subject())
	if !ok || !events.ValidRunID(runID) {
		e.log.Warn().Str(fieldSubject, m.Subject()).Msg("inbox message cannot be attributed to a run: terminated")
		_ = m.TermWithReason("cannot be attributed to a run: subject " + m.Subject())
		return
	}
	if kind == protocol.KindSubmit && e.throttle(m, runID, principal) {
		return
	}
	e.shardOf(runID).post(item{runID: runID, work: &inboxMsg{msg: m, kind: kind, principal: principal}})
}

func (e *Engine) shardOf(runID string) *shard {
	h := fnv.New32a()
	h.Write([]byte(runID))
	return e.shards[h.Sum32()%uint32(len(e.shards))]
}

// catalogFor returns the catalog a batch was pinned to.
func (e *Engine) catalogFor(ctx context.Context, snapshotID string) (*catalog.Catalog, error) {
	e.catMu.Lock()
	c, ok := e.catalogs[snapshotID]
	e.catMu.Unlock()
	if ok {
		return c, nil
	}
	entry, err := e.catalogKV.Get(ctx, snapshotID)
	if err != nil {
		return nil, fmt.Errorf("catalog snapshot %s: %w", snapshotID, err)
	}
	c, err = catalog.Parse(entry.Value())
	if err != nil {
		return nil, fmt.Errorf("catalog snapshot %s: %w", snapshotID, err)
	}
	if c.SnapshotID() != snapshotID { // the id is the content's hash
		return nil, fmt.Errorf("catalog snapshot %s: the stored catalog's content is snapshot %s: refused", snapshotID, c.SnapshotID())
	}
	e.catMu.Lock()
	e.catalogs[snapshotID] = c
	e.catMu.Unlock()
	return c, nil
}

func newID() string { return nuid.Next() }

// waitDeadline is when a client or delegation ticket of a tool expires,
// from the catalog its batch was pinned to (nil: none).
func (e *Engine) waitDeadline(ctx context.Context, snapshotID, toolID string, now time.Time) *time.Time {
	cat, err := e.catalogFor(ctx, snapshotID)
	if err != nil {
		return nil
	}
	t, ok := cat.Tool(toolID)
	if !ok || t.WaitDeadline <= 0 {
		return nil
	}
	d := now.Add(t.WaitDeadline)
	return &d
}
