package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/client"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/internal/testproc"
	"github.com/toolbatch/toolbatch/protocol"
	"github.com/toolbatch/toolbatch/tracing"
)

// The engine's catalog for W1, W2 and the parked runs: noop runs on the
// sandbox workers (their builtin, no subprocess), echo is the engine's own
// brain builtin, confirm parks every call on a permission ticket. Every
// tool has the default dispatch deadline (30 s).
const benchCatalog = `# toolbatch benchmark catalog (bench/engine.go)
tools:
  - id: noop
    target: sandbox
    recovery: {mode: replay_safe, max_attempts: 3}
  - id: echo
    builtin: echo
    recovery: {mode: replay_safe, max_attempts: 3}
  - id: confirm
    builtin: echo
    recovery: {mode: replay_safe, max_attempts: 3}
gate:
  rules:
    - tools: ["confirm"]
      outcome: require_confirmation
`

// benchWorker is the sandbox workers' config: the builtin noop, which runs
// in the worker with no subprocess, so isolation none changes nothing for
// it (and needs no bubblewrap).
const benchWorker = `# toolbatch benchmark worker (bench/engine.go)
pools: [default]
isolation: none
tools:
  - id: noop
    builtin: noop
    capability: replay_safe
`

// unlimitedClients turns the engine's per-client limits off: a benchmark's
// one client is the whole load, and it measures the engine, not a
// client's quota.
var unlimitedClients = []string{"--client-max-runs", "-1", "--client-submit-rate", "-1"}

// cluster is one engine process (with its embedded JetStream) and its
// sandbox workers.
type cluster struct {
	mode    string // "default" or "sync_always"
	dir     string
	url     string
	engine  *proc
	extra   []*proc // more engines sharing the first one's server
	workers []*proc
	conns   []*nats.Conn
	clients []*client.Client
	jss     []jetstream.JetStream // one per connection
	js      jetstream.JetStream
	// stopScrapes ends the scrapes of the metrics mode.
	stopScrapes context.CancelFunc
	// otlp receives the traces of the observed mode (nil: none).
	otlp *otlpSink
	// env is added to the environment of the cluster's programs (the
	// observed mode's OTLP endpoint).
	env []string
	// workerCfg and concurrency start the sandbox workers.
	workerBin, workerCfg string
	concurrency          int
	// measures counts runW1's and runW2's measurements: their runs' ids
	// are new in each.
	measures int
}

// clusterOptions say how to start a cluster.
type clusterOptions struct {
	engineBin   string
	engineArgs  []string // before the common flags (e.g. a subcommand)
	extraEngine int      // more engines on the first one's server (--nats-url)
	workerBin   string
	syncAlways  bool
	unsigned    bool // the engine appends unsigned commits (--unsigned)
	metrics     bool // the engine and workers serve metrics, scraped every second
	tracing     bool // the engine and workers export traces to a receiver in the bench
	workers     int
	concurrency int
	clientConns int
	// catalog and worker replace benchCatalog and benchWorker when set.
	catalog, worker string
}

func startCluster(dir string, o clusterOptions) (*cluster, error) {
	c := &cluster{mode: "default", dir: dir}
	if o.syncAlways {
		c.mode = "sync_always"
	}
	if o.unsigned {
		c.mode = "unsigned"
	}
	if o.metrics {
		c.mode = "metrics"
	}
	if o.tracing {
		c.mode = "observed"
		var err error
		if c.otlp, err = startOTLPSink(); err != nil {
			return nil, err
		}
		c.env = []string{tracing.EnvEndpoint + "=" + c.otlp.url}
	}
	var scrape []string // the metrics addresses
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	cat := filepath.Join(dir, "catalog.yaml")
	wcfg := filepath.Join(dir, "worker.yaml")
	catYAML, workerYAML := benchCatalog, benchWorker
	if o.catalog != "" {
		catYAML, workerYAML = o.catalog, o.worker
	}
	if err := os.WriteFile(cat, []byte(catYAML), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(wcfg, []byte(workerYAML), 0o644); err != nil {
		return nil, err
	}
	port, err := testproc.Port()
	if err != nil {
		return nil, err
	}
	c.url = fmt.Sprintf("nats://127.0.0.1:%d", port)
	args := append([]string{}, o.engineArgs...)
	args = append(args, "--store", filepath.Join(dir, "store"), "--listen", fmt.Sprintf("127.0.0.1:%d", port),
		"--catalog", cat, "--log-format", "json")
	args = append(args, unlimitedClients...)
	if o.syncAlways {
		args = append(args, "--sync-always")
	}
	if o.unsigned {
		args = append(args, "--unsigned")
	}
	metricsArgs := func() ([]string, error) {
		if !o.metrics {
			return nil, nil
		}
		p, err := testproc.Port()
		if err != nil {
			return nil, err
		}
		addr := fmt.Sprintf("127.0.0.1:%d", p)
		scrape = append(scrape, addr)
		return []string{"--metrics-listen", addr}, nil
	}
	ma, err := metricsArgs()
	if err != nil {
		return nil, err
	}
	args = append(args, ma...)
	if c.engine, err = c.start("engine", `"engine ready"`, o.engineBin, args...); err != nil {
		return nil, err
	}
	for i := 0; i < o.extraEngine; i++ {
		e, err := c.start(fmt.Sprintf("engine%d", i+2), `"engine ready"`, o.engineBin, append([]string{"--nats-url", c.url,
			"--catalog", cat, "--log-format", "json"}, unlimitedClients...)...)
		if err != nil {
			c.stop()
			return nil, err
		}
		c.extra = append(c.extra, e)
	}
	c.workerBin, c.workerCfg, c.concurrency = o.workerBin, wcfg, o.concurrency
	for i := 0; i < o.workers; i++ {
		ma, err := metricsArgs()
		if err != nil {
			c.stop()
			return nil, err
		}
		if err := c.addWorker(ma...); err != nil {
			c.stop()
			return nil, err
		}
	}
	for i := 0; i < max(1, o.clientConns); i++ {
		nc, err := nats.Connect(c.url, nats.Name(fmt.Sprintf("toolbatch-bench-client-%d", i)))
		if err != nil {
			c.stop()
			return nil, err
		}
		cl, err := client.New(nc)
		if err != nil {
			c.stop()
			return nil, err
		}
		js, err := jetstream.New(nc)
		if err != nil {
			c.stop()
			return nil, err
		}
		c.conns = append(c.conns, nc)
		c.clients = append(c.clients, cl)
		c.jss = append(c.jss, js)
	}
	c.js = c.jss[0]
	if len(scrape) > 0 {
		var sctx context.Context
		sctx, c.stopScrapes = context.WithCancel(context.Background())
		go scrapeEverySecond(sctx, scrape)
	}
	// The engine reads the tool's capability from the workers bucket at
	// every entry: wait until the workers advertised theirs.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for o.workers > 0 {
		kv, err := c.js.KeyValue(ctx, "TOOLBATCH_WORKERS")
		if err == nil {
			if keys, err := kv.Keys(ctx); err == nil && len(keys) >= o.workers {
				break
			}
		}
		select {
		case <-ctx.Done():
			c.stop()
			return nil, errors.New("the workers never advertised their tools")
		case <-time.After(50 * time.Millisecond):
		}
	}
	return c, nil
}

// start starts one of the cluster's programs.
func (c *cluster) start(name, ready, bin string, args ...string) (*proc, error) {
	return launch(name, ready, time.Minute, nil, c.env, bin, args...)
}

// addWorker starts one more sandbox worker.
func (c *cluster) addWorker(args ...string) error {
	name := fmt.Sprintf("worker%d", len(c.workers)+1)
	w, err := c.start(name, `"message":"ready"`, c.workerBin, append([]string{"--nats-url", c.url, "--config", c.workerCfg,
		"--worker-id", name, "--log-format", "json", "--concurrency", fmt.Sprint(c.concurrency),
		"--work-root", filepath.Join(c.dir, name)}, args...)...)
	if err != nil {
		return err
	}
	c.workers = append(c.workers, w)
	return nil
}

func (c *cluster) stop() {
	if c.stopScrapes != nil {
		c.stopScrapes()
	}
	for _, nc := range c.conns {
		nc.Close()
	}
	for _, w := range c.workers {
		w.stop()
	}
	for _, e := range c.extra {
		e.stop()
	}
	if c.engine != nil {
		c.engine.stop()
	}
	if c.otlp != nil {
		c.otlp.srv.Close()
	}
}

// otlpSink is an OTLP/HTTP receiver that reads and drops what it is sent,
// counting the exports.
type otlpSink struct {
	srv     *http.Server
	url     string
	exports atomic.Int64
}

func startOTLPSink() (*otlpSink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &otlpSink{url: "http://" + ln.Addr().String()}
	s.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		s.exports.Add(1)
		w.Header().Set("Content-Type", "application/x-protobuf")
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// checkAlive fails when a process of the cluster died.
func (c *cluster) checkAlive() error {
	if !c.engine.alive() {
		return fmt.Errorf("the engine died:\n%s", c.engine.tail(4096))
	}
	for _, w := range c.workers {
		if !w.alive() {
			return fmt.Errorf("%s died:\n%s", w.name, w.tail(4096))
		}
	}
	return nil
}

// lastSeq returns the last sequence of a stream.
func lastSeq(ctx context.Context, js jetstream.JetStream, stream string) (uint64, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return 0, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.State.LastSeq, nil
}

// batchOf returns the submission of a batch of n calls of tool.
func batchOf(runID string, step int64, tool string, n int) *protocol.Submit {
	s := &protocol.Submit{RunID: runID, ThreadID: "t-" + runID, Step: step, Assistant: events.Message{ID: fmt.Sprintf("m%d", step)}}
	for i := 0; i < n; i++ {
		s.Assistant.Content = append(s.Assistant.Content, events.ContentBlock{Type: events.BlockToolUse,
			ID: fmt.Sprintf("c%d", i+1), Name: tool, Input: events.MustJSON(fmt.Sprintf(`{"i":%d}`, i))})
	}
	return s
}

// sample is one batch: when its results arrived and how long after the
// submission began.
type sample struct {
	end time.Time
	lat time.Duration
}

// loopConfig is what one client loop does.
type loopConfig struct {
	client      *client.Client      // submits
	js          jetstream.JetStream // reads the out stream
	prefix      string              // the client's subject prefix
	runPrefix   string
	tool        string
	calls       int
	stepsPerRun int
	// pause is an idle time after each batch (W5's model turn).
	pause time.Duration
}

// batchTimeout bounds one batch of a client loop.
var batchTimeout = time.Minute

// withCensus makes W1 count the messages of 20 more batches.
var withCensus = true

// errBadResult is a batch whose results are not what the tool gives.
var errBadResult = errors.New("unexpected results")

// clientLoop runs batches one after another until stop is closed: runs of
// stepsPerRun batches, each run read through one watch started before its
// first submission. Every batch's latency is from just before Submit to
// the arrival of its .results message.
func clientLoop(ctx context.Context, lc loopConfig, stop <-chan struct{}, record func(sample)) error {
	for r := 0; ; r++ {
		runID := fmt.Sprintf("%s-%d", lc.runPrefix, r)
		w, err := watchRun(ctx, lc.js, lc.prefix, runID)
		if err != nil {
			return err
		}
		for step := int64(1); step <= int64(lc.stepsPerRun); step++ {
			select {
			case <-stop:
				w.stop()
				return nil
			default:
			}
			s := batchOf(runID, step, lc.tool, lc.calls)
			// No batch may take that long: the engine would be stuck.
			bctx, cancel := context.WithTimeout(ctx, batchTimeout)
			start := time.Now()
			err := lc.client.Submit(bctx, s)
			if err != nil {
				err = fmt.Errorf("submit %s: %w", s.BatchID(), err)
			} else {
				err = w.awaitResults(bctx, s.BatchID(), lc.calls)
			}
			cancel()
			if err != nil {
				w.stop()
				return err
			}
			record(sample{end: time.Now(), lat: time.Since(start)})
			if lc.pause > 0 {
				select {
				case <-stop:
				case <-time.After(lc.pause): // the pause is a length of time, not a condition
				}
			}
		}
		w.stop()
	}
}

// runWatch reads one run's out messages as client.Watch does (an ordered
// consumer on the out stream filtered to <prefix>.out.<run_id>.>, from the
// first message), except that its consumer is deleted when the watch
// stops: the server allows 1,000 consumers per stream, which W2 would
// exceed within seconds if they waited for an inactivity threshold (see
// docs/performance.md).
type runWatch struct {
	base   string // <prefix>.out.<run_id>.
	iter   jetstream.MessagesContext
	js     jetstream.JetStream
	stream string
	cons   jetstream.Consumer
}

func watchRun(ctx context.Context, js jetstream.JetStream, prefix, runID string) (*runWatch, error) {
	stream := protocol.Names{Prefix: prefix}.OutStream()
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{protocol.Names{Prefix: prefix}.RunOut(runID)}, DeliverPolicy: jetstream.DeliverAllPolicy,
		InactiveThreshold: 5 * time.Second,
	})
	if err != nil {
		return nil, fmt.Errorf("watch run %s: %w", runID, err)
	}
	iter, err := cons.Messages()
	if err != nil {
		return nil, fmt.Errorf("watch run %s: %w", runID, err)
	}
	return &runWatch{base: protocol.Names{Prefix: prefix}.Out(runID, ""), iter: iter, js: js, stream: stream, cons: cons}, nil
}

// stop ends the watch and deletes its consumer: at W2's rate of runs,
// consumers left to the inactivity threshold reach the server's default
// of 1,000 per stream (nats-server 2.15) within seconds.
func (w *runWatch) stop() {
	w.iter.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if info := w.cons.CachedInfo(); info != nil {
		_ = w.js.DeleteConsumer(ctx, w.stream, info.Name)
	}
}

// awaitResults reads the watch until the batch's results, and checks that
// every call succeeded.
func (w *runWatch) awaitResults(ctx context.Context, batchID string, calls int) error {
	for {
		m, err := w.iter.Next(jetstream.NextContext(ctx))
		if err != nil {
			return fmt.Errorf("batch %s: %w", batchID, err)
		}
		switch kind := strings.TrimPrefix(m.Subject(), w.base); kind {
		case client.KindResults:
			var res protocol.ResultsOut
			if err := events.Unmarshal(m.Data(), &res); err != nil {
				return fmt.Errorf("batch %s: results: %w", batchID, err)
			}
			if res.BatchID != batchID {
				continue
			}
			if len(res.Results) != calls {
				return fmt.Errorf("%w: batch %s: %d results for %d calls", errBadResult, batchID, len(res.Results), calls)
			}
			for _, b := range res.Results {
				if b.IsError {
					return fmt.Errorf("%w: batch %s: %s", errBadResult, batchID,
						events.DescribeOutput(events.Output{Content: b.Content, IsError: b.IsError}))
				}
			}
			return nil
		case client.KindRejected, client.KindThrottled:
			var rej protocol.RejectedOut
			_ = events.Unmarshal(m.Data(), &rej)
			return fmt.Errorf("batch %s rejected: %s: %s", batchID, rej.Code, rej.Reason)
		case client.KindEnded:
			var end protocol.EndedOut
			_ = events.Unmarshal(m.Data(), &end)
			return fmt.Errorf("run of batch %s ended: %s", batchID, end.Cause)
		}
	}
}

// LatencyRep is one repetition of a latency measurement.
type LatencyRep struct {
	Batches       int `json:"batches"`
	Seconds       Num `json:"seconds"`
	P50ms         Num `json:"p50_ms"`
	P99ms         Num `json:"p99_ms"`
	BatchesPerSec Num `json:"batches_per_s"`
}

// W1Result is W1 for one tool: the median of the repetitions.
type W1Result struct {
	Tool          string       `json:"tool"`
	Where         string       `json:"where"`
	Calls         int          `json:"calls_per_batch"`
	P50ms         Num          `json:"p50_ms"`
	P99ms         Num          `json:"p99_ms"`
	BatchesPerSec Num          `json:"batches_per_s"`
	Commits       Num          `json:"commits_per_batch"`
	OutMsgs       Num          `json:"out_messages_per_batch"`
	Reps          []LatencyRep `json:"reps"`
	Census        *Census      `json:"message_census,omitempty"`
	// CPU over the repetitions: the engine process (engine and embedded
	// JetStream) and the worker, per batch and in cores.
	EngineCPUms    Num `json:"engine_cpu_ms_per_batch"`
	EngineCPUCores Num `json:"engine_cpu_cores"`
	WorkerCPUms    Num `json:"worker_cpu_ms_per_batch"`
	ClientCPUms    Num `json:"load_generator_cpu_ms_per_batch"`
	OtherCPUCores  Num `json:"other_cpu_cores"`
}

func latencyRep(samples []sample, secs float64) LatencyRep {
	lat := make([]time.Duration, len(samples))
	for i, s := range samples {
		lat[i] = s.lat
	}
	return LatencyRep{Batches: len(samples), Seconds: Num(secs), P50ms: Num(percentile(lat, 50)), P99ms: Num(percentile(lat, 99)),
		BatchesPerSec: Num(ratio(float64(len(samples)), secs))}
}

func medianOf(reps []LatencyRep, f func(LatencyRep) Num) Num {
	v := make([]float64, len(reps))
	for i, r := range reps {
		v[i] = float64(f(r))
	}
	return Num(median(v))
}

// w1Loop runs W1 batches of tool, one at a time, for d.
func w1Loop(ctx context.Context, c *cluster, tool, prefix string, d time.Duration, stepsPerRun int) ([]sample, float64, error) {
	c.measures++
	prefix = fmt.Sprintf("m%d-%s", c.measures, prefix)
	var samples []sample
	stop := make(chan struct{})
	timer := time.AfterFunc(d, func() { close(stop) })
	defer timer.Stop()
	start := time.Now()
	err := clientLoop(ctx, loopConfig{client: c.clients[0], js: c.jss[0], prefix: protocol.DefaultPrefix, runPrefix: prefix, tool: tool, calls: 4, stepsPerRun: stepsPerRun},
		stop, func(s sample) { samples = append(samples, s) })
	return samples, time.Since(start).Seconds(), err
}

// runW1 measures one run at a time: reps windows of dur each, after a
// warm-up of one second.
func runW1(ctx context.Context, c *cluster, tool string, reps int, dur time.Duration, stepsPerRun int) (W1Result, error) {
	res := W1Result{Tool: tool, Calls: 4, Where: "sandbox worker builtin (1 worker process)"}
	if tool == "echo" {
		res.Where = "engine brain builtin"
	}
	loop := func(prefix string, d time.Duration) ([]sample, float64, error) {
		return w1Loop(ctx, c, tool, prefix, d, stepsPerRun)
	}
	if _, _, err := loop("w1"+tool+"-warm", time.Second); err != nil {
		return res, err
	}
	before, err0 := c.snap(ctx)
	evBefore, err1 := lastSeq(ctx, c.js, "TOOLBATCH_EVENTS")
	outBefore, err2 := lastSeq(ctx, c.js, "TOOLBATCH_OUT")
	total := 0
	for r := 0; r < reps; r++ {
		samples, secs, err := loop(fmt.Sprintf("w1%s-r%d", tool, r), dur)
		if err != nil {
			return res, err
		}
		total += len(samples)
		res.Reps = append(res.Reps, latencyRep(samples, secs))
	}
	after, err5 := c.snap(ctx)
	evAfter, err3 := lastSeq(ctx, c.js, "TOOLBATCH_EVENTS")
	outAfter, err4 := lastSeq(ctx, c.js, "TOOLBATCH_OUT")
	if err := errors.Join(err0, err1, err2, err3, err4, err5); err != nil {
		return res, err
	}
	secs := after.at.Sub(before.at).Seconds()
	res.EngineCPUms = Num(ratio((after.engine-before.engine)*1000, float64(total)))
	res.EngineCPUCores = Num((after.engine - before.engine) / secs)
	res.WorkerCPUms = Num(ratio((after.workers-before.workers)*1000, float64(total)))
	res.ClientCPUms = Num(ratio((after.self-before.self)*1000, float64(total)))
	res.OtherCPUCores = Num(((after.machine - before.machine) - (after.engine - before.engine) - (after.workers - before.workers) - (after.self - before.self)) / secs)
	// Let the projector finish the last batch's commit before counting.
	res.Commits = Num(ratio(float64(evAfter-evBefore), float64(total)))
	res.OutMsgs = Num(ratio(float64(outAfter-outBefore), float64(total)))
	res.P50ms = medianOf(res.Reps, func(r LatencyRep) Num { return r.P50ms })
	res.P99ms = medianOf(res.Reps, func(r LatencyRep) Num { return r.P99ms })
	res.BatchesPerSec = medianOf(res.Reps, func(r LatencyRep) Num { return r.BatchesPerSec })
	if !withCensus {
		return res, c.checkAlive()
	}
	// Not timed: every message of 20 more batches, by kind.
	cs, err := runCensus(ctx, c, tool, 20, stepsPerRun)
	if err != nil {
		return res, fmt.Errorf("census: %w", err)
	}
	res.Census = cs
	return res, c.checkAlive()
}

// W2Rep is one window of W2.
type W2Rep struct {
	LatencyRep
	CallsPerSec      Num `json:"calls_per_s"`
	CommitsPerSec    Num `json:"commits_per_s"` // messages appended to TOOLBATCH_EVENTS
	EngineRSSMiB     Num `json:"engine_rss_mib"`
	EngineCPUCores   Num `json:"engine_cpu_cores"`  // CPU seconds per second
	WorkersCPUCores  Num `json:"workers_cpu_cores"` // both workers together
	BenchCPUCores    Num `json:"bench_cpu_cores"`   // the load generator (this process)
	EngineCPUPerCall Num `json:"engine_cpu_us_per_call"`
	// OtherCPUCores is the machine's busy CPU in the window beyond the
	// engine, the workers and this process: other programs (and the
	// kernel's own threads) competing for the cores.
	OtherCPUCores Num `json:"other_cpu_cores"`
}

// W2Result is W2: the median of the windows.
type W2Result struct {
	Runs           int     `json:"concurrent_runs"`
	Workers        int     `json:"worker_processes"`
	Concurrency    int     `json:"worker_concurrency"`
	Window         string  `json:"window"`
	BatchesPerSec  Num     `json:"batches_per_s"`
	CallsPerSec    Num     `json:"calls_per_s"`
	CommitsPerSec  Num     `json:"commits_per_s"`
	P50ms          Num     `json:"p50_ms"`
	P99ms          Num     `json:"p99_ms"`
	EngineRSSMiB   Num     `json:"engine_rss_mib"`
	EngineHWMMiB   Num     `json:"engine_peak_rss_mib"`
	EngineCPUCores Num     `json:"engine_cpu_cores"`
	WorkersCPU     Num     `json:"workers_cpu_cores"`
	BenchCPU       Num     `json:"bench_cpu_cores"`
	OtherCPU       Num     `json:"other_cpu_cores"`
	CPUPerCallUs   Num     `json:"engine_cpu_us_per_call"`
	Reps           []W2Rep `json:"reps"`
}

type cpuSnap struct {
	at      time.Time
	engine  float64
	workers float64
	self    float64
	machine float64
	events  uint64
}

// programsCPU is the CPU time so far of the cluster's engine and of its
// workers together.
func (c *cluster) programsCPU() (engine, workers float64, err error) {
	if engine, err = cpuSeconds(c.engine.pid()); err != nil {
		return 0, 0, err
	}
	for _, w := range c.workers {
		v, err := cpuSeconds(w.pid())
		if err != nil {
			return 0, 0, err
		}
		workers += v
	}
	return engine, workers, nil
}

func (c *cluster) snap(ctx context.Context) (cpuSnap, error) {
	s := cpuSnap{at: time.Now()}
	var err error
	if s.engine, s.workers, err = c.programsCPU(); err != nil {
		return s, err
	}
	if s.self, err = cpuSeconds(os.Getpid()); err != nil {
		return s, err
	}
	if s.machine, _, err = machineCPU(); err != nil {
		return s, err
	}
	s.events, err = lastSeq(ctx, c.js, "TOOLBATCH_EVENTS")
	return s, err
}

// runW2 runs `runs` client loops at once for a warm-up, then measures reps
// consecutive windows of dur each.
// loads are client loops running at once (W2's load), each recording its
// batches' samples until finish.
type loads struct {
	mu      sync.Mutex
	samples []sample
	wg      sync.WaitGroup
	failed  atomic.Pointer[error]
	stop    chan struct{}
	cancel  context.CancelFunc
}

// startLoads starts n client loops, the i-th with config lc(i).
func startLoads(ctx context.Context, n int, lc func(i int) loopConfig) *loads {
	ctx, cancel := context.WithCancel(ctx)
	l := &loads{stop: make(chan struct{}), cancel: cancel}
	for i := 0; i < n; i++ {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			err := clientLoop(ctx, lc(i), l.stop, func(s sample) {
				l.mu.Lock()
				l.samples = append(l.samples, s)
				l.mu.Unlock()
			})
			if err != nil && ctx.Err() == nil { // not finish's doing
				l.failed.CompareAndSwap(nil, &err)
			}
		}()
	}
	return l
}

// err returns the first error of a loop, if one failed.
func (l *loads) err() error {
	if p := l.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// window returns the samples of the batches that ended in [from, to).
func (l *loads) window(from, to time.Time) []sample {
	l.mu.Lock()
	defer l.mu.Unlock()
	var win []sample
	for _, s := range l.samples {
		if !s.end.Before(from) && s.end.Before(to) {
			win = append(win, s)
		}
	}
	return win
}

// finish stops the loops (a batch under way is given up), waits for them
// and returns the first error of one.
func (l *loads) finish() error {
	close(l.stop)
	l.cancel()
	l.wg.Wait()
	return l.err()
}

func runW2(ctx context.Context, c *cluster, runs, reps int, warm, dur time.Duration, stepsPerRun int) (W2Result, error) {
	res := W2Result{Runs: runs, Workers: len(c.workers), Window: dur.String()}
	c.measures++
	l := startLoads(ctx, runs, func(i int) loopConfig {
		return loopConfig{client: c.clients[i%len(c.clients)], js: c.jss[i%len(c.jss)], prefix: protocol.DefaultPrefix, runPrefix: fmt.Sprintf("m%d-w2-%d", c.measures, i), tool: "noop", calls: 4, stepsPerRun: stepsPerRun}
	})
	finish := func() error {
		if err := l.finish(); err != nil {
			return err
		}
		return c.checkAlive()
	}
	time.Sleep(warm)
	prev, err := c.snap(ctx)
	if err != nil {
		finish()
		return res, err
	}
	for r := 0; r < reps; r++ {
		time.Sleep(dur)
		if err := l.err(); err != nil {
			finish()
			return res, err
		}
		cur, err := c.snap(ctx)
		if err != nil {
			finish()
			return res, err
		}
		rss, _, _ := memStatus(c.engine.pid())
		secs := cur.at.Sub(prev.at).Seconds()
		win := l.window(prev.at, cur.at)
		rep := W2Rep{LatencyRep: latencyRep(win, secs)}
		rep.CallsPerSec = Num(4 * float64(rep.BatchesPerSec))
		rep.CommitsPerSec = Num(float64(cur.events-prev.events) / secs)
		rep.EngineRSSMiB = Num(rss)
		rep.EngineCPUCores = Num((cur.engine - prev.engine) / secs)
		rep.WorkersCPUCores = Num((cur.workers - prev.workers) / secs)
		rep.BenchCPUCores = Num((cur.self - prev.self) / secs)
		rep.EngineCPUPerCall = Num(ratio((cur.engine-prev.engine)*1e6, 4*float64(len(win))))
		rep.OtherCPUCores = Num(((cur.machine - prev.machine) - (cur.engine - prev.engine) - (cur.workers - prev.workers) - (cur.self - prev.self)) / secs)
		res.Reps = append(res.Reps, rep)
		prev = cur
	}
	_, hwm, _ := memStatus(c.engine.pid())
	if err := finish(); err != nil {
		return res, err
	}
	m := func(f func(W2Rep) Num) Num {
		v := make([]float64, len(res.Reps))
		for i, r := range res.Reps {
			v[i] = float64(f(r))
		}
		return Num(median(v))
	}
	res.BatchesPerSec = m(func(r W2Rep) Num { return r.BatchesPerSec })
	res.CallsPerSec = m(func(r W2Rep) Num { return r.CallsPerSec })
	res.CommitsPerSec = m(func(r W2Rep) Num { return r.CommitsPerSec })
	res.P50ms = m(func(r W2Rep) Num { return r.P50ms })
	res.P99ms = m(func(r W2Rep) Num { return r.P99ms })
	res.EngineRSSMiB = m(func(r W2Rep) Num { return r.EngineRSSMiB })
	res.EngineHWMMiB = Num(hwm)
	res.EngineCPUCores = m(func(r W2Rep) Num { return r.EngineCPUCores })
	res.WorkersCPU = m(func(r W2Rep) Num { return r.WorkersCPUCores })
	res.BenchCPU = m(func(r W2Rep) Num { return r.BenchCPUCores })
	res.OtherCPU = m(func(r W2Rep) Num { return r.OtherCPUCores })
	res.CPUPerCallUs = m(func(r W2Rep) Num { return r.EngineCPUPerCall })
	return res, nil
}

// ParkedResult is the engine's memory while it holds many runs parked on
// a permission ticket.
type ParkedResult struct {
	Runs           int    `json:"runs"`
	Parked         int    `json:"parked"`
	Seconds        Num    `json:"seconds_to_park"`
	RunsPerSec     Num    `json:"parked_runs_per_s"`
	EngineRSSStart Num    `json:"engine_rss_before_mib"`
	EngineRSSMiB   Num    `json:"engine_rss_mib"`
	EngineHWMMiB   Num    `json:"engine_peak_rss_mib"`
	Note           string `json:"note,omitempty"`
}

// runParked submits n runs of one call to confirm (which the gate parks on
// a permission ticket) and reads the engine's RSS once every run is
// parked (its awaiting message published).
func runParked(ctx context.Context, c *cluster, n int) (ParkedResult, error) {
	res := ParkedResult{Runs: n}
	rss0, _, _ := memStatus(c.engine.pid())
	res.EngineRSSStart = Num(rss0)
	// Count the awaiting messages with a consumer that never pulls: its
	// pending count is how many there are.
	cons, err := c.js.CreateOrUpdateConsumer(ctx, "TOOLBATCH_OUT", jetstream.ConsumerConfig{
		FilterSubject: protocol.Names{Prefix: protocol.DefaultPrefix}.Out("*", protocol.OutAwaiting), AckPolicy: jetstream.AckNonePolicy, DeliverPolicy: jetstream.DeliverAllPolicy,
		InactiveThreshold: 10 * time.Minute,
	})
	if err != nil {
		return res, err
	}
	defer func() { _ = c.js.DeleteConsumer(context.Background(), "TOOLBATCH_OUT", cons.CachedInfo().Name) }()
	info, err := cons.Info(ctx)
	if err != nil {
		return res, err
	}
	base := int(info.NumPending)
	start := time.Now()
	next := atomic.Int64{}
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	for g := 0; g < 32; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := c.clients[g%len(c.clients)]
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				if err := cl.Submit(ctx, batchOf(fmt.Sprintf("parked-%d", i), 1, "confirm", 1)); err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if p := failed.Load(); p != nil {
		return res, *p
	}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		info, err := cons.Info(ctx)
		if err != nil {
			return res, err
		}
		res.Parked = int(info.NumPending) - base
		if res.Parked >= n {
			break
		}
		if time.Now().After(deadline) {
			res.Note = "not every run parked within 5 minutes"
			break
		}
		if err := c.checkAlive(); err != nil {
			return res, err
		}
		time.Sleep(100 * time.Millisecond)
	}
	secs := time.Since(start).Seconds()
	res.Seconds = Num(secs)
	res.RunsPerSec = Num(float64(res.Parked) / secs)
	// Let the engine settle (acks, releases of the owner keys) before
	// reading its memory.
	time.Sleep(2 * time.Second)
	rss, hwm, err := memStatus(c.engine.pid())
	res.EngineRSSMiB, res.EngineHWMMiB = Num(rss), Num(hwm)
	return res, err
}

// Census is every NATS message of a W1 batch, by kind: what a ">"
// subscription on the engine's server sees while batches run one at a
// time (so a few background messages, such as the projector's pull
// requests, are counted too).
type Census struct {
	Batches  int            `json:"batches"`
	PerBatch map[string]Num `json:"per_batch"`
	Total    Num            `json:"total_per_batch"`
}

// category names the kind of a message by its subject (and, for a
// JetStream delivery, its reply subject). Advisories are counted apart:
// the server only publishes them because the census listens.
func category(subject, reply string) string {
	toks := strings.Split(subject, ".")
	if r := strings.Split(reply, "."); strings.HasPrefix(reply, "$JS.ACK.") && len(r) > 2 {
		return "deliver " + r[2]
	}
	switch {
	case strings.HasPrefix(subject, "$JS.EVENT."):
		return advisory
	case strings.HasPrefix(subject, "$JS.API.DIRECT.GET.") && len(toks) > 4:
		return "js api DIRECT.GET " + toks[4]
	case strings.HasPrefix(subject, "$JS.API.") && len(toks) > 5 && toks[3] == "MSG":
		return "js api " + toks[2] + ".MSG." + toks[4] + " " + toks[5]
	case strings.HasPrefix(subject, "$JS.API.") && len(toks) > 4:
		return "js api " + toks[2] + "." + toks[3] + " " + toks[4]
	case strings.HasPrefix(subject, "$JS.API."):
		return "js api " + strings.Join(toks[2:], ".")
	case strings.HasPrefix(subject, "$JS.ACK.") && len(toks) > 2:
		return "ack " + toks[2]
	case strings.HasPrefix(subject, "$KV.") && len(toks) > 1:
		return "kv write " + toks[1]
	case strings.HasPrefix(subject, "$JS.") && len(toks) > 2:
		return "other " + strings.Join(toks[:3], ".")
	case strings.HasPrefix(subject, "_INBOX."):
		return "_INBOX (replies, acks of publishes, deliveries)"
	case strings.HasPrefix(subject, "toolbatch.api.") && len(toks) > 2:
		return "request toolbatch.api." + toks[2]
	case strings.HasPrefix(subject, "toolbatch.") && len(toks) > 1:
		return "publish toolbatch." + toks[1]
	}
	return "other " + toks[0]
}

// advisory is the census kind of JetStream advisories.
const advisory = "advisory (published only because the census listens; not in the total)"

// runCensus counts the messages of n batches of tool, one at a time.
func runCensus(ctx context.Context, c *cluster, tool string, n, stepsPerRun int) (*Census, error) {
	nc, err := nats.Connect(c.url, nats.Name("toolbatch-bench-census"))
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	var mu sync.Mutex
	counts := map[string]int{}
	sub, err := nc.Subscribe(">", func(m *nats.Msg) {
		k := category(m.Subject, m.Reply)
		mu.Lock()
		counts[k]++
		mu.Unlock()
	})
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe()
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		return nil, err
	}
	if err := nc.Flush(); err != nil {
		return nil, err
	}
	done := 0
	stop := make(chan struct{})
	err = clientLoop(ctx, loopConfig{client: c.clients[0], js: c.jss[0], prefix: protocol.DefaultPrefix, runPrefix: "census-" + tool, tool: tool, calls: 4, stepsPerRun: stepsPerRun},
		stop, func(sample) {
			done++
			if done == n {
				close(stop)
			}
		})
	if err != nil {
		return nil, err
	}
	// Let the tail of the last batch (acks, releases) arrive.
	time.Sleep(300 * time.Millisecond)
	if err := nc.Flush(); err != nil {
		return nil, err
	}
	mu.Lock()
	defer mu.Unlock()
	cs := &Census{Batches: done, PerBatch: map[string]Num{}}
	total := 0
	for k, v := range counts {
		cs.PerBatch[k] = Num(float64(v) / float64(done))
		if k != advisory {
			total += v
		}
	}
	cs.Total = Num(float64(total) / float64(done))
	return cs, nil
}

// scrapeEverySecond reads every /metrics page once a second, as a
// demanding Prometheus would (its default is every 15 s), until ctx ends.
func scrapeEverySecond(ctx context.Context, addrs []string) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for _, a := range addrs {
			if resp, err := http.Get("http://" + a + "/metrics"); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}
	}
}
