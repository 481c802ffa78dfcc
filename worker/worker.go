package worker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/rs/zerolog"

	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/metrics"
	"github.com/toolbatch/toolbatch/protocol"
	"github.com/toolbatch/toolbatch/sandbox"
)

// Runner runs one call; *sandbox.Runner is the implementation.
type Runner interface {
	Run(ctx context.Context, call sandbox.Call) sandbox.Result
}

// Defaults.
const (
	DefaultConcurrency = 4
	DefaultGrace       = 30 * time.Second
	advertiseEvery     = 10 * time.Second
	// claimTimeout bounds a claim's round trip: an engine answers within
	// milliseconds, so a claim unanswered this long is given back (its
	// run's owner may be gone, and another engine takes the run over in
	// seconds) rather than holding a slot. Asked again, an attempt already
	// granted to this process is granted again (ClaimRequest.Incarnation).
	claimTimeout = 2 * time.Second
)

// Config configures a worker.
type Config struct {
	// Prefix is the subject prefix (default "toolbatch").
	Prefix string
	// WorkerID names the worker in claims and in the registry (default
	// <hostname>-<pid>).
	WorkerID string
	// Pools restricts the pools served (default: the sandbox config's).
	Pools []string
	// Concurrency is how many calls run at once (default 4).
	Concurrency int
	// Grace is how long a drain waits for running calls (default 30s).
	Grace time.Duration
	// Logger receives the logs.
	Logger zerolog.Logger
	// Metrics counts claims, calls and heartbeats (nil: nothing).
	Metrics *metrics.Worker
}

// Worker serves sandbox jobs.
type Worker struct {
	cfg    Config
	tools  []sandbox.ToolConfig
	runner Runner
	nc     *nats.Conn
	js     jetstream.JetStream
	log    zerolog.Logger
	// incarnation names this process in its claims.
	incarnation string
	// toolIDs are the tools it serves (in each of its pools).
	toolIDs []string

	mu sync.Mutex
	// jobs are the attempts this process is claiming or running, by
	// operation id and attempt, with every delivery of each: a job
	// delivered again meanwhile (its acknowledgement lost in a leader
	// election, say) joins the one in hand and is never run twice.
	jobs map[string]*job
	// consumers are the dispatch consumers bound (nil until Run binds them).
	consumers []jetstream.Consumer
	// ran are the attempts this process ran and reported: one delivered
	// again later is acknowledged, never run again (the claim it would be
	// granted again is this process's own).
	ran recent
}

// ranMemory is how long a reported attempt is remembered.
const ranMemory = 10 * time.Minute

// recent is a set of keys, each remembered for ranMemory after it was
// added. The keys are also kept in the order they were added, so that
// forgetting the old ones costs each addition only the keys it forgets
// (a worker adds one per call, and remembers ten minutes of them).
type recent struct {
	set   map[string]struct{}
	order []remembered // oldest first
}

type remembered struct {
	key string
	at  time.Time
}

func (r *recent) has(key string) bool {
	_, ok := r.set[key]
	return ok
}

// add remembers key from now on, and forgets the keys added more than
// ranMemory before now.
func (r *recent) add(key string, now time.Time) {
	for len(r.order) > 0 && now.Sub(r.order[0].at) > ranMemory {
		delete(r.set, r.order[0].key)
		r.order[0] = remembered{}
		r.order = r.order[1:]
	}
	if r.has(key) {
		return
	}
	if r.set == nil {
		r.set = map[string]struct{}{}
	}
	r.set[key] = struct{}{}
	r.order = append(r.order, remembered{key, now})
}

// job is an attempt in hand, with its deliveries.
type job struct {
	mu   sync.Mutex
	msgs []jetstream.Msg
}

// each applies f to every delivery of the job.
func (j *job) each(f func(jetstream.Msg) error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, m := range j.msgs {
		_ = f(m)
	}
}

// take registers a delivery: the job it starts, or nil when it joined an
// attempt already in hand or was acknowledged as one already run.
func (w *Worker) take(key string, m jetstream.Msg) *job {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ran.has(key) {
		_ = m.Ack()
		return nil
	}
	if j, ok := w.jobs[key]; ok {
		j.mu.Lock()
		j.msgs = append(j.msgs, m)
		j.mu.Unlock()
		return nil
	}
	j := &job{msgs: []jetstream.Msg{m}}
	w.jobs[key] = j
	return j
}

// done lets an attempt go; ran says its tool ran and its result was
// published.
func (w *Worker) done(key string, ran bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.jobs, key)
	if !ran {
		return
	}
	w.ran.add(key, time.Now())
}

// New returns a worker for the tools of a sandbox config.
func New(nc *nats.Conn, sc sandbox.Config, runner Runner, cfg Config) (*Worker, error) {
	if cfg.Prefix == "" {
		cfg.Prefix = protocol.DefaultPrefix
	}
	if cfg.WorkerID == "" {
		host, _ := os.Hostname()
		cfg.WorkerID = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if !events.ValidRunID(cfg.WorkerID) {
		return nil, fmt.Errorf("worker id %q must match [A-Za-z0-9_-]{1,64}", cfg.WorkerID)
	}
	if len(cfg.Pools) == 0 {
		cfg.Pools = sc.Pools
	}
	if len(cfg.Pools) == 0 {
		cfg.Pools = []string{"default"}
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = DefaultConcurrency
	}
	if cfg.Grace <= 0 {
		cfg.Grace = DefaultGrace
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(sc.Tools))
	for i, t := range sc.Tools {
		ids[i] = t.ID
	}
	return &Worker{cfg: cfg, tools: sc.Tools, toolIDs: ids, runner: runner, nc: nc, js: js, log: cfg.Logger,
		incarnation: nuid.Next(), jobs: map[string]*job{}}, nil
}

func (w *Worker) names() protocol.Names { return protocol.Names{Prefix: w.cfg.Prefix} }

// Run serves until drain is done: it then stops taking jobs, lets running
// calls finish for the grace period, publishes their results, and returns
// nil. When abort is done as well, running calls are stopped at once.
func (w *Worker) Run(drain, abort context.Context) error {
	setup, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := w.js.KeyValue(setup, w.names().WorkersBucket())
	if err != nil {
		return fmt.Errorf("workers bucket (is the engine running?): %w", err)
	}
	var consumers []jetstream.Consumer
	for _, pool := range w.cfg.Pools {
		for _, t := range w.tools {
			// The engine creates each catalog tool's consumer; a worker binds.
			c, err := w.js.Consumer(setup, w.names().DispatchStream(), protocol.PoolConsumer(pool, t.ID))
			if errors.Is(err, jetstream.ErrConsumerNotFound) {
				return fmt.Errorf("pool %s tool %s: no dispatch consumer: the engine's catalog has no sandbox tool %s in pool %s", pool, t.ID, t.ID, pool)
			}
			if err != nil {
				return fmt.Errorf("dispatch consumer of pool %s tool %s: %w", pool, t.ID, err)
			}
			consumers = append(consumers, c)
		}
	}
	advertise := func(ctx context.Context) error {
		var errs []error
		for _, pool := range w.cfg.Pools {
			for _, t := range w.tools {
				capability := t.Capability
				if capability == "" {
					capability = events.CapNonRecoverable
				}
				if _, err := kv.Put(ctx, protocol.WorkerKey(pool, t.ID, w.cfg.WorkerID), []byte(capability)); err != nil {
					errs = append(errs, fmt.Errorf("advertise pool %s tool %s as %s: %w", pool, t.ID, w.cfg.WorkerID, err))
				}
			}
		}
		return errors.Join(errs...)
	}
	// The first advertisement must work: a worker may advertise only its
	// own pools under its own user's name, and one that cannot would never
	// be counted on.
	first, cancelFirst := context.WithTimeout(setup, 5*time.Second)
	err = advertise(first)
	cancelFirst()
	if err != nil {
		return fmt.Errorf("%w (with credentials, --worker-id must be the user's name and the pools its own)", err)
	}

	runCtx, stopRuns := context.WithCancel(context.Background())
	defer stopRuns()
	go func() {
		<-abort.Done()
		stopRuns()
	}()
	slots := make(chan struct{}, w.cfg.Concurrency)
	w.cfg.Metrics.Slots(w.cfg.Concurrency)
	var running sync.WaitGroup
	var iters []jetstream.MessagesContext
	var fetchers sync.WaitGroup
	for _, c := range consumers {
		it, err := c.Messages(jetstream.PullMaxMessages(w.cfg.Concurrency),
			jetstream.PullExpiry(protocol.ServicePullExpiry), jetstream.PullHeartbeat(protocol.ServicePullHeartbeat))
		if err != nil {
			return err
		}
		iters = append(iters, it)
		fetchers.Add(1)
		go func() {
			defer fetchers.Done()
			for {
				// Wait for a job holding no slot: a tool with nothing to do
				// must not keep another tool's job from running.
				m, err := it.Next()
				if err != nil {
					if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
						return
					}
					continue
				}
				if !takeSlot(slots, drain, m) {
					_ = m.Nak() // the drain began: give it back
					return
				}
				if drain.Err() != nil {
					_ = m.Nak() // taken after the drain began: give it back
					<-slots
					return
				}
				running.Add(1)
				w.cfg.Metrics.Busy(1)
				go func() {
					defer running.Done()
					defer func() { <-slots; w.cfg.Metrics.Busy(-1) }()
					w.handle(runCtx, drain, m)
				}()
			}
		}()
	}
	w.mu.Lock()
	w.consumers = consumers
	w.mu.Unlock()
	w.log.Info().Str("worker_id", w.cfg.WorkerID).Strs("pools", w.cfg.Pools).Int("concurrency", w.cfg.Concurrency).Msg("ready")

	tick := time.NewTicker(advertiseEvery)
	defer tick.Stop()
loop:
	for {
		select {
		case <-drain.Done():
			break loop
		case <-tick.C:
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := advertise(ctx); err != nil {
				w.log.Warn().Err(err).Msg("advertise failed")
			}
			cancel()
		}
	}
	w.log.Info().Msg("draining")
	for _, it := range iters {
		it.Stop()
	}
	fetchers.Wait()
	done := make(chan struct{})
	go func() { running.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(w.cfg.Grace):
		w.log.Warn().Msg("grace period over: stopping running calls")
		stopRuns()
		<-done
	case <-abort.Done():
		<-done
	}
	// Leave the registry: the engine stops counting on this worker at once.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, pool := range w.cfg.Pools {
		for _, t := range w.tools {
			_ = kv.Delete(ctx, protocol.WorkerKey(pool, t.ID, w.cfg.WorkerID))
		}
	}
	w.log.Info().Msg("stopped")
	return nil
}

// takeSlot waits for an execution slot while it keeps the job m in
// progress (so that its redelivery does not start while it waits); false
// when the drain begins first.
func takeSlot(slots chan struct{}, drain context.Context, m jetstream.Msg) bool {
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	for {
		select {
		case slots <- struct{}{}:
			return true
		case <-drain.Done():
			return false
		case <-tick.C:
			_ = m.InProgress()
		}
	}
}

// handle claims, runs and reports one job, and then, in the same slot,
// every call of its run the engine grants with the result (chain).
func (w *Worker) handle(runCtx, drain context.Context, m jetstream.Msg) {
	var d protocol.Dispatch
	if err := events.Unmarshal(m.Data(), &d); err != nil {
		w.log.Warn().Err(err).Str("subject", m.Subject()).Msg("undecodable dispatch: terminated")
		_ = m.TermWithReason("undecodable dispatch: " + err.Error())
		return
	}
	log := w.log.With().Str("run_id", d.RunID).Str("call_id", d.CallID).Int("attempt", d.Attempt).Logger()
	key := fmt.Sprintf("%s/%d", d.OperationID, d.Attempt)
	j := w.take(key, m)
	if j == nil {
		log.Debug().Msg("delivered again while in hand: joined")
		return
	}
	where, _ := w.names().Match(protocol.DispatchFamily, m.Subject()) // pool, tool
	if len(where) != 2 {
		log.Warn().Str("subject", m.Subject()).Msg("a job on a subject of no pool and tool: terminated")
		j.each(func(m jetstream.Msg) error { return m.TermWithReason("not a dispatch subject: " + m.Subject()) })
		w.done(key, false)
		return
	}
	pool, tool := where[0], where[1]
	reply, err := w.request(w.names().Claim(), protocol.ClaimRequest{OperationID: d.OperationID, Attempt: d.Attempt,
		WorkerID: w.cfg.WorkerID, Incarnation: w.incarnation})
	if err == nil {
		w.cfg.Metrics.Claim(pool, tool, reply.Granted)
	}
	switch {
	case err != nil:
		log.Warn().Err(err).Str(protocol.FieldMeaning, protocol.Meaning(err)).Msg("claim unanswered: job given back")
		j.each(func(m jetstream.Msg) error { return m.NakWithDelay(time.Second) })
	case !reply.Granted && (reply.Reason == protocol.ReasonBusy || reply.Reason == protocol.ReasonClaimed):
		// Busy, or another worker holds the claim and may not have had its
		// answer: give the job back for its holder (or the lease's end).
		j.each(func(m jetstream.Msg) error { return m.NakWithDelay(time.Second) })
	case !reply.Granted:
		log.Info().Str("reason", reply.Reason).Msg("claim refused: job dropped")
		j.each(jetstream.Msg.Ack)
	// Run what the engine granted, not what the notice said: the job of
	// the claim reply, which only an engine can send to this worker's
	// inbox. It must be the attempt claimed, of a tool of this subject.
	case reply.Job == nil || reply.Job.OperationID != d.OperationID || reply.Job.Attempt != d.Attempt || tool != reply.Job.ToolID:
		log.Warn().Str("subject", m.Subject()).Msg("claim granted without this job: not run; the lease runs out and the engine decides")
		j.each(jetstream.Msg.Ack)
	default:
		if reply.TraceParent == "" {
			reply.TraceParent = m.Headers().Get(protocol.HeaderTraceParent)
		}
		for key != "" {
			next := w.runGranted(runCtx, drain, j, pool, key, reply)
			key, j = "", nil
			if next != nil {
				key, j = w.adopt(pool, *next)
				reply = *next
			}
		}
		return
	}
	w.done(key, false)
}

// adopt takes a call the engine granted with a result: its key and job, or
// "" when it is not one to run here (already in hand or run, or not of a
// tool of the pool; then its lease runs out and the engine decides).
func (w *Worker) adopt(pool string, g protocol.ClaimReply) (string, *job) {
	if !g.Granted || g.Job == nil || !w.serves(pool, g.Job.ToolID) {
		w.log.Warn().Str("pool", pool).Msg("a grant with a result that is no job of this worker's: not run; its lease runs out and the engine decides")
		return "", nil
	}
	key := fmt.Sprintf("%s/%d", g.Job.OperationID, g.Job.Attempt)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ran.has(key) {
		return "", nil
	}
	if _, ok := w.jobs[key]; ok {
		return "", nil
	}
	j := &job{}
	w.jobs[key] = j
	w.cfg.Metrics.Claim(pool, g.Job.ToolID, true)
	return key, j
}

// serves reports whether the worker serves tool in pool.
func (w *Worker) serves(pool, tool string) bool {
	if !slices.Contains(w.cfg.Pools, pool) {
		return false
	}
	return slices.Contains(w.toolIDs, tool)
}

// runGranted runs a granted attempt, heartbeating its lease, reports its
// result and acknowledges its deliveries; it returns the run's next call
// when the engine granted it with the result.
func (w *Worker) runGranted(runCtx, drain context.Context, j *job, pool, key string, reply protocol.ClaimReply) *protocol.ClaimReply {
	granted := *reply.Job
	tool := granted.ToolID
	log := w.log.With().Str("run_id", granted.RunID).Str("call_id", granted.CallID).Int("attempt", granted.Attempt).Logger()
	ran := false
	defer func() { w.done(key, ran) }()
	lease := time.Duration(reply.LeaseMS) * time.Millisecond
	if lease <= 0 {
		lease = 10 * time.Second
	}
	toolCtx, stopTool := context.WithCancel(runCtx)
	defer stopTool()
	beatDone := make(chan struct{})
	go func() {
		defer close(beatDone)
		tick := time.NewTicker(lease / 3)
		defer tick.Stop()
		for {
			select {
			case <-toolCtx.Done():
				return
			case <-tick.C:
				j.each(jetstream.Msg.InProgress)
				r, err := w.request(w.names().Heartbeat(), protocol.Heartbeat{OperationID: granted.OperationID, Attempt: granted.Attempt, ClaimToken: reply.ClaimToken, WorkerID: w.cfg.WorkerID})
				switch {
				case err != nil:
					w.cfg.Metrics.Heartbeat(metrics.HeartbeatFailed)
				case !r.Granted && r.Reason != protocol.ReasonBusy:
					w.cfg.Metrics.Heartbeat(metrics.HeartbeatLost)
				default:
					w.cfg.Metrics.Heartbeat(metrics.HeartbeatOK)
				}
				if err == nil && !r.Granted && r.Reason != protocol.ReasonBusy {
					log.Warn().Str("reason", r.Reason).Msg("claim lost: stopping the tool")
					stopTool()
					return
				}
			}
		}
	}()
	began := time.Now()
	// the tool's spans hang from the attempt's (the engine's span, made
	// from the log, with this worker's claim on it)
	res := w.runner.Run(toolCtx, sandbox.Call{ToolID: granted.ToolID, CallID: granted.CallID, OperationID: granted.OperationID, Attempt: granted.Attempt,
		Arguments: granted.Arguments, TraceParent: reply.TraceParent})
	w.cfg.Metrics.Ran(pool, tool, res.Class(), time.Since(began))
	if res.Err != nil {
		log.Warn().Str("tool", tool).Str("exit", res.Class()).Str("kind", string(res.Err.Kind)).Str("error", res.Err.Message).Msg("tool failed")
	}
	stopTool()
	<-beatDone
	result := protocol.Result{OperationID: granted.OperationID, Attempt: granted.Attempt, ClaimToken: reply.ClaimToken, Output: res.Output, Error: res.Err}
	if result.Output == nil && result.Error == nil {
		result.Error = &events.ToolError{Kind: events.ErrorExecution, Message: "the tool reported nothing"}
	}
	req := protocol.ResultRequest{Result: result, WorkerID: w.cfg.WorkerID, Incarnation: w.incarnation}
	if drain.Err() == nil {
		// The slot this attempt frees may take the run's next call.
		req.NextPool = pool
		req.NextTools = w.toolIDs
	}
	next, ok := w.report(runCtx, log, granted.RunID, req, lease)
	if !ok {
		return nil // aborted: the lease runs out and the engine decides
	}
	ran = true
	j.each(jetstream.Msg.Ack)
	log.Debug().Msg("done")
	return next
}

// report hands a result to the engine. It asks on <prefix>.api.result
// until an engine records it, for at most the lease (an engine answers
// within milliseconds; one that does not may be taken over, and a request
// asked again is answered again, with the same grant); when no engine
// answers in that time, or none listens, it publishes the result on the
// run's inbox subject, where it waits for whichever engine owns the run.
// It returns the grant of the run's next call the engine answered with,
// and false only when the worker was aborted first.
func (w *Worker) report(runCtx context.Context, log zerolog.Logger, runID string, req protocol.ResultRequest, lease time.Duration) (*protocol.ClaimReply, bool) {
	body, err := events.Marshal(req)
	if err != nil {
		log.Error().Err(err).Msg("encode result")
		return nil, false
	}
	why := "no engine listens on " + w.names().ResultRequest()
	for until := time.Now().Add(lease); time.Now().Before(until); {
		var r protocol.ResultReply
		msg, err := w.nc.Request(w.names().ResultRequest(), body, claimTimeout)
		if err == nil {
			err = events.Unmarshal(msg.Data, &r)
		}
		if err == nil && r.Recorded {
			if r.Refused != "" {
				log.Info().Str("reason", r.Refused).Msg("result refused by the engine")
			}
			return r.Next, true
		}
		if errors.Is(err, nats.ErrNoResponders) {
			why = "no engine listens on " + w.names().ResultRequest()
			break
		}
		if err == nil {
			err = errors.New(r.Reason)
		}
		why = fmt.Sprintf("no engine recorded it on %s within the lease (%v; a worker permission set made before that subject existed lacks it: print the permissions again, toolbatch auth permissions)", w.names().ResultRequest(), err)
		log.Debug().Err(err).Msg("result not recorded yet; asking again")
		select {
		case <-runCtx.Done():
			return nil, false
		case <-time.After(100 * time.Millisecond):
		}
	}
	log.Warn().Str("why", why).Msg("result published on the inbox, where the run's owner takes it")
	msg := nats.NewMsg(w.names().Result(runID))
	msg.Data, _ = events.Marshal(req.Result)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := w.js.PublishMsg(ctx, msg, jetstream.WithMsgID(fmt.Sprintf("result/%s/%d/%s", req.OperationID, req.Attempt, req.ClaimToken)))
		cancel()
		if err == nil {
			return nil, true
		}
		log.Warn().Err(err).Str(protocol.FieldMeaning, protocol.Meaning(err)).Msg("publish result failed; retrying")
		select {
		case <-runCtx.Done():
			return nil, false
		case <-time.After(time.Second):
		}
	}
}

func (w *Worker) request(subject string, v any) (protocol.ClaimReply, error) {
	var r protocol.ClaimReply
	body, err := events.Marshal(v)
	if err != nil {
		return r, err
	}
	msg, err := w.nc.Request(subject, body, claimTimeout)
	if err != nil {
		return r, err
	}
	if err := events.Unmarshal(msg.Data, &r); err != nil {
		return r, err
	}
	return r, nil
}

// Readiness reports what keeps the worker from serving: not yet started,
// not connected to NATS, a dispatch consumer of its pools gone. (Its
// sandbox trial passed before it was made: sandbox.NewRunner.) Nil means
// ready.
func (w *Worker) Readiness(ctx context.Context) error {
	w.mu.Lock()
	consumers := w.consumers
	w.mu.Unlock()
	if consumers == nil {
		return errors.New("starting: its pools' dispatch consumers are not bound yet")
	}
	if st := w.nc.Status(); st != nats.CONNECTED {
		return fmt.Errorf("NATS connection %s", st)
	}
	var errs []error
	for _, c := range consumers {
		name := c.CachedInfo().Name
		if _, err := w.js.Consumer(ctx, w.names().DispatchStream(), name); err != nil {
			errs = append(errs, fmt.Errorf("dispatch consumer %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}
