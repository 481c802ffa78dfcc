package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
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
)

// The failover part (issue 16): how long a run waits when its engine dies,
// and whether a fault of the NATS cluster makes any run change hands.
//
//  1. restart: an engine with a fixed --engine-id owns runs whose brain
//     calls are in progress; it is killed (SIGKILL) and started again with
//     the same id. Figure: from its "engine ready" line to each run's
//     first commit.
//  2. takeover: engine A owns such runs, engine B starts, A is killed.
//     Figure: from the kill to each run's first commit (by B).
//  3. projection after a kill: one of two engines is killed while runs
//     keep being submitted (each engine projects its own commits, so the
//     other's go on). Figure: from the kill to the first out message of a
//     commit made after it.
//  4. (failovercluster.go) a 3-node cluster, two engines with --replicas
//     3: the events stream's leader is paused, or killed and restarted,
//     while runs have calls in progress. Figures: runs that changed owner,
//     calls made indeterminate, how long commits stopped, how long new
//     runs waited, and the owner keys left once every run was done.
//
// 1 to 3 run against one nats-server process. Every engine runs with its
// default settings (ack wait 30 s, lease 10 s); only the per-client limits
// are lifted, as everywhere in the benchmark. Every figure is taken from
// the streams' own timestamps (the server's clock, this machine's), read
// after the fact through ordered consumers, so that polling adds nothing
// to it.

// failoverCatalog is the engines' catalog: the default catalog's brain
// builtins, and sleep_nr, a never_replay sleep, whose call is made
// indeterminate if any engine ever recovers it: the cluster faults'
// witness of a false takeover.
const failoverCatalog = `# toolbatch benchmark failover catalog (bench/failover.go)
tools:
  - {id: echo, builtin: echo, recovery: {mode: replay_safe, max_attempts: 3}}
  - {id: sleep, builtin: sleep, recovery: {mode: replay_safe, max_attempts: 3}}
  - {id: sleep_nr, builtin: sleep, recovery: {mode: never_replay}}
`

// The targets of issue 16: every sample within them.
const (
	restartTarget    = 2 * time.Second
	takeoverTarget   = 5 * time.Second
	projectionTarget = 5 * time.Second
)

// The failover workload.
const (
	restartRuns  = 4               // runs per repetition of restart and of takeover
	restartCall  = 2 * time.Second // their sleep: in progress at the kill
	takeoverCall = 3 * time.Second
	trickleEvery = 50 * time.Millisecond  // one echo run submitted this often (projection, cluster)
	peerSettle   = 500 * time.Millisecond // a new engine's watch learns the others' presence

	failoverWait  = time.Minute // bound of a wait for commits, results or a restart
	readyNATSLine = "Server is ready"
)

// The engine's log messages the part counts (engine/owner.go, shard.go,
// liveness.go, cache.go, engine.go), as they begin.
const (
	logReady      = "engine ready"
	logTookOver   = "took the run over from a dead engine"
	logLost       = "lost the run to another engine"
	logGone       = "engine gone (no connection answers its probes)"
	logFenced     = "this engine was declared dead"
	logTakingBack = "taking back the runs this engine owned before it restarted"
	logRecovered  = "run recovered" // the recovery table applied at a load (engine/cache.go)
)

var countedLogs = []string{logTookOver, logLost, logGone, logFenced, logTakingBack, logRecovered}

// FailoverResult is the failover part.
type FailoverResult struct {
	NATS        string          `json:"nats"`
	EngineFlags string          `json:"engine_flags"`
	Reps        int             `json:"reps"`
	ClusterReps int             `json:"cluster_reps"`
	Restart     *FailoverFigure `json:"restart,omitempty"`
	Takeover    *FailoverFigure `json:"takeover,omitempty"`
	Projection  *FailoverFigure `json:"projection_after_kill,omitempty"`
	Paused      *ClusterFault   `json:"events_leader_paused,omitempty"`
	Killed      *ClusterFault   `json:"events_leader_killed,omitempty"`
	// ClusterOwnerKeysLeft counts the owner keys left in the cluster's
	// owners bucket once every run of scenario 4 was done (and the linger
	// passed): a key whose release failed in a fault stays, naming its
	// engine.
	ClusterOwnerKeysLeft       *int           `json:"cluster_owner_keys_left,omitempty"`
	ClusterOwnerKeysLeftBy     map[string]int `json:"cluster_owner_keys_left_by_engine,omitempty"`
	ClusterOwnerKeysLeftSample []string       `json:"cluster_owner_keys_left_sample,omitempty"`
	Seconds                    Num            `json:"seconds"`
}

// FailoverFigure is one failover duration over every sample of its
// repetitions: one per run (restart, takeover), one per kill (projection).
type FailoverFigure struct {
	Measures string        `json:"measures"`
	Samples  int           `json:"samples"`
	Median   string        `json:"median"`
	Max      string        `json:"max"`
	MedianMs Num           `json:"median_ms"`
	MaxMs    Num           `json:"max_ms"`
	Target   string        `json:"target"`
	Met      *bool         `json:"met"`
	Reps     []FailoverRep `json:"reps"`
	Notes    []string      `json:"notes,omitempty"`
}

// FailoverRep is one repetition of a failover figure.
type FailoverRep struct {
	// Killed is the engine killed; Heir the one that took its work.
	Killed    string `json:"killed_engine"`
	Heir      string `json:"heir,omitempty"`
	SamplesMs []Num  `json:"samples_ms"`
	// ReadyAfterMs is how long the restarted engine took from its exec to
	// "engine ready" (restart only).
	ReadyAfterMs Num `json:"ready_after_exec_ms,omitempty"`
	// HeirLines counts the heir's log lines of the takeover (of this
	// repetition).
	HeirLines map[string]int `json:"heir_log_lines,omitempty"`
}

// summarize fills a figure's median and max from its repetitions.
func (f *FailoverFigure) summarize(target time.Duration) {
	var all []float64
	for _, r := range f.Reps {
		for _, s := range r.SamplesMs {
			all = append(all, float64(s))
		}
	}
	f.Samples = len(all)
	f.Target = "every sample within " + target.String()
	f.MedianMs, f.MaxMs = Num(median(all)), Num(nan())
	for _, v := range all {
		if !(float64(f.MaxMs) >= v) {
			f.MaxMs = Num(v)
		}
	}
	f.Median, f.Max = fmtDur(f.MedianMs), fmtDur(f.MaxMs)
	if len(all) > 0 {
		f.Met = boolp(float64(f.MaxMs) <= ms(target))
	}
}

// fmtDur writes milliseconds as a duration.
func fmtDur(msv Num) string {
	f := float64(msv)
	if f != f {
		return "n/a"
	}
	return time.Duration(f * float64(time.Millisecond)).Round(time.Millisecond).String()
}

// engineLog counts an engine's log lines of interest as they arrive.
type engineLog struct {
	mu     sync.Mutex
	ready  time.Time
	counts map[string]int
}

func (l *engineLog) line(at time.Time, b []byte) {
	i := bytes.Index(b, []byte(`"message":"`))
	if i < 0 {
		return
	}
	msg := b[i+len(`"message":"`):]
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ready.IsZero() && bytes.HasPrefix(msg, []byte(logReady)) {
		l.ready = at
	}
	for _, m := range countedLogs {
		if bytes.HasPrefix(msg, []byte(m)) {
			l.counts[m]++
		}
	}
}

func (l *engineLog) readyAt() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ready
}

func (l *engineLog) snapshot() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]int, len(l.counts))
	for k, v := range l.counts {
		out[k] = v
	}
	return out
}

// foEngine is an engine process of the failover part.
type foEngine struct {
	*proc
	id      string
	started time.Time
	log     *engineLog
}

// foEnv is one NATS deployment of the failover part (a server or a
// cluster) and the benchmark's handles on it.
type foEnv struct {
	dir, url, catalog, engineBin string
	replicas                     int
	nc                           *nats.Conn
	js                           jetstream.JetStream
	cl                           *client.Client
	owners                       jetstream.KeyValue
	events, out                  jetstream.Stream
	names                        protocol.Names
	// engines are every engine started, for their logs at the end.
	engines []*foEngine
}

// fastFailoverOptions are the benchmark's own connection options: find a
// stopped server in about 2 s and move to another at once.
func fastFailoverOptions(name string) []nats.Option {
	return []nats.Option{nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(100 * time.Millisecond),
		nats.RetryOnFailedConnect(true), nats.PingInterval(time.Second), nats.MaxPingsOutstanding(2)}
}

func newFoEnv(dir, url, engineBin string, replicas int) (*foEnv, error) {
	env := &foEnv{dir: dir, url: url, engineBin: engineBin, replicas: replicas, catalog: filepath.Join(dir, "catalog.yaml"),
		names: protocol.Names{Prefix: protocol.DefaultPrefix}}
	if err := os.WriteFile(env.catalog, []byte(failoverCatalog), 0o644); err != nil {
		return nil, err
	}
	nc, err := nats.Connect(url, fastFailoverOptions("toolbatch-bench-failover")...)
	if err != nil {
		return nil, err
	}
	env.nc = nc
	if env.js, err = jetstream.New(nc); err != nil {
		nc.Close()
		return nil, err
	}
	if env.cl, err = client.New(nc); err != nil {
		nc.Close()
		return nil, err
	}
	return env, nil
}

// bind finds the streams and the owners bucket, once the first engine
// created them.
func (env *foEnv) bind(ctx context.Context) error {
	var err error
	if env.events, err = env.js.Stream(ctx, env.names.EventsStream()); err != nil {
		return err
	}
	if env.out, err = env.js.Stream(ctx, env.names.OutStream()); err != nil {
		return err
	}
	env.owners, err = env.js.KeyValue(ctx, env.names.OwnersBucket())
	return err
}

// close closes the connection and writes the last 256 KiB of every
// engine's log into the directory (kept with --keep).
func (env *foEnv) close() {
	env.nc.Close()
	for _, e := range env.engines {
		_ = os.WriteFile(filepath.Join(env.dir, "engine-"+e.id+".log"), []byte(e.tail(keepLogs)), 0o644)
	}
}

// startEngine starts an engine with the given id and waits for its
// "engine ready".
func (env *foEnv) startEngine(id string) (*foEngine, error) {
	e := &foEngine{id: id, log: &engineLog{counts: map[string]int{}}}
	args := []string{"--nats-url", env.url, "--engine-id", id, "--catalog", env.catalog, "--log-format", "json"}
	if env.replicas > 1 {
		args = append(args, "--replicas", fmt.Sprint(env.replicas))
	}
	args = append(args, unlimitedClients...)
	e.started = time.Now()
	p, err := startProcLines("engine "+id, `"engine ready"`, failoverWait, e.log.line, env.engineBin, args...)
	if err != nil {
		return nil, err
	}
	e.proc = p
	env.engines = append(env.engines, e)
	return e, nil
}

// sleepBatch is a run's first batch: one call of tool sleeping d.
func sleepBatch(runID, tool string, d time.Duration) *protocol.Submit {
	return &protocol.Submit{RunID: runID, ThreadID: "t-" + runID, Step: 1, Assistant: events.Message{ID: "m1", Content: []events.ContentBlock{
		{Type: events.BlockToolUse, ID: "c1", Name: tool, Input: events.MustJSON(fmt.Sprintf(`{"duration":%q}`, d.String()))}}}}
}

// poll calls cond every 50 ms until it reports true, ctx ends or wait
// passes.
func poll(ctx context.Context, wait time.Duration, what string, cond func(context.Context) bool) error {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for {
		if cond(ctx) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: not within %s", what, wait)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// lastCommit is a run's last commit.
func (env *foEnv) lastCommit(ctx context.Context, runID string) (*jetstream.RawStreamMsg, error) {
	octx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return env.events.GetLastMsgForSubject(octx, env.names.Events(runID))
}

// submitAll submits each run's first batch, retrying for a while (a
// cluster may still be settling from the previous fault).
func (env *foEnv) submitAll(ctx context.Context, subs []*protocol.Submit) error {
	for _, s := range subs {
		err := poll(ctx, 30*time.Second, "submit "+s.RunID, func(ctx context.Context) bool {
			sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			return env.cl.Submit(sctx, s) == nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// waitExecuting waits until each run's last commit records its call
// executing.
func (env *foEnv) waitExecuting(ctx context.Context, runs []string) error {
	for _, run := range runs {
		err := poll(ctx, failoverWait, run+"'s call executing", func(ctx context.Context) bool {
			m, err := env.lastCommit(ctx, run)
			return err == nil && slices.Contains(m.Header.Values(protocol.HeaderEvent), string(events.TypeCallExecuting))
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// waitCommitsAfter waits until each run has a commit after stream
// sequence seq.
func (env *foEnv) waitCommitsAfter(ctx context.Context, runs []string, seq uint64, wait time.Duration) error {
	for _, run := range runs {
		err := poll(ctx, wait, run+"'s first commit after the fault", func(ctx context.Context) bool {
			m, err := env.lastCommit(ctx, run)
			return err == nil && m.Sequence > seq
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// waitResults waits for each run's first batch's results and checks that
// its call succeeded.
func (env *foEnv) waitResults(ctx context.Context, runs []string, wait time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for _, run := range runs {
		res, err := env.cl.WaitResults(ctx, run, events.BatchID(run, 1))
		if err != nil {
			return fmt.Errorf("%s's results: %w", run, err)
		}
		if len(res.Results) != 1 {
			return fmt.Errorf("%w: %s: %d results for 1 call", errBadResult, run, len(res.Results))
		}
		if b := res.Results[0]; b.IsError {
			return fmt.Errorf("%w: %s: %s", errBadResult, run, events.DescribeOutput(events.Output{Content: b.Content, IsError: true}))
		}
	}
	return nil
}

// streamMsg is one stored message, as the part reads it back.
type streamMsg struct {
	seq     uint64
	subject string
	at      time.Time
	events  []string // Toolbatch-Event (commits)
	source  uint64   // the commit of Toolbatch-Source (out messages)
}

// retried calls f until it succeeds, for up to 30 s: on a cluster a
// request may meet an election or a server still starting (no responders,
// 10008, timeouts).
func retried[T any](ctx context.Context, f func(context.Context) (T, error)) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		v, err := f(ctx)
		if err == nil || ctx.Err() != nil {
			return v, err
		}
		select {
		case <-ctx.Done():
			return v, err
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// lastSeq returns a stream's last sequence, retried.
func (env *foEnv) lastSeq(ctx context.Context, stream string) (uint64, error) {
	return retried(ctx, func(ctx context.Context) (uint64, error) { return lastSeq(ctx, env.js, stream) })
}

// readStream reads a stream's messages (headers only) from sequence from
// to its last one now, retried.
func readStream(ctx context.Context, s jetstream.Stream, from uint64) ([]streamMsg, error) {
	return retried(ctx, func(ctx context.Context) ([]streamMsg, error) { return readStreamOnce(ctx, s, from) })
}

func readStreamOnce(ctx context.Context, s jetstream.Stream, from uint64) ([]streamMsg, error) {
	ctx, cancel := context.WithTimeout(ctx, failoverWait)
	defer cancel()
	info, err := s.Info(ctx)
	if err != nil {
		return nil, err
	}
	last := info.State.LastSeq
	if from == 0 {
		from = 1
	}
	if last < from {
		return nil, nil
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverByStartSequencePolicy,
		OptStartSeq: from, HeadersOnly: true, InactiveThreshold: 5 * time.Second})
	if err != nil {
		return nil, err
	}
	var out []streamMsg
	for {
		batch, err := cons.Fetch(1024, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return out, err
		}
		n := 0
		for m := range batch.Messages() {
			n++
			meta, err := m.Metadata()
			if err != nil {
				return out, err
			}
			sm := streamMsg{seq: meta.Sequence.Stream, subject: m.Subject(), at: meta.Timestamp, events: m.Headers().Values(protocol.HeaderEvent)}
			if src, _, ok := strings.Cut(m.Headers().Get(protocol.HeaderSource), "/"); ok {
				sm.source, _ = strconv.ParseUint(src, 10, 64)
			}
			out = append(out, sm)
			if sm.seq >= last {
				return out, nil
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return out, err
		}
		if n == 0 && ctx.Err() != nil {
			return out, ctx.Err()
		}
	}
}

// firstCommits returns the time of each run's first commit after stream
// sequence seq.
func (env *foEnv) firstCommits(ctx context.Context, seq uint64) (map[string]time.Time, error) {
	msgs, err := readStream(ctx, env.events, seq+1)
	if err != nil {
		return nil, err
	}
	first := map[string]time.Time{}
	for _, m := range msgs {
		run, ok := env.names.RunOf(protocol.EventsFamily, m.subject)
		if _, seen := first[run]; ok && !seen {
			first[run] = m.at
		}
	}
	return first, nil
}

// trickle submits a one-call echo run every trickleEvery until stopped:
// commits that go on through a failover.
type trickle struct {
	stop              chan struct{}
	done              chan struct{}
	submitted, failed atomic.Int64
	mu                sync.Mutex
	at                map[string]time.Time // each run's accepted submission
}

func startTrickle(cl *client.Client, prefix string) *trickle {
	t := &trickle{stop: make(chan struct{}), done: make(chan struct{}), at: map[string]time.Time{}}
	go func() {
		defer close(t.done)
		tick := time.NewTicker(trickleEvery)
		defer tick.Stop()
		for n := 0; ; n++ {
			select {
			case <-t.stop:
				return
			case <-tick.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			run := fmt.Sprintf("%s-%d", prefix, n)
			if err := cl.Submit(ctx, batchOf(run, 1, "echo", 1)); err != nil {
				t.failed.Add(1)
			} else {
				t.submitted.Add(1)
				t.mu.Lock()
				t.at[run] = time.Now()
				t.mu.Unlock()
			}
			cancel()
		}
	}()
	return t
}

func (t *trickle) end() { close(t.stop); <-t.done }

// between returns the runs whose submission was accepted in [from, to),
// with when.
func (t *trickle) between(from, to time.Time) map[string]time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[string]time.Time{}
	for run, at := range t.at {
		if !at.Before(from) && at.Before(to) {
			out[run] = at
		}
	}
	return out
}

// runFailover runs the failover part: it builds nats-server from the
// module's requirement, then runs scenarios 1 to 3 on one server and 4 on
// a cluster of three.
func runFailover(ctx context.Context, o options, root string, bins binaries, dir string) (*FailoverResult, error) {
	started := time.Now()
	res := &FailoverResult{Reps: o.foReps, ClusterReps: o.foClusterReps,
		NATS:        "nats-server processes built from the module's requirement: one for restart and takeovers, a 3-node cluster for the server faults",
		EngineFlags: "--nats-url, --engine-id, --catalog (echo, sleep, sleep_nr), --replicas 3 on the cluster; ack wait, lease and every other setting at their defaults"}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	natsBin := filepath.Join(dir, "nats-server")
	progress("failover: building nats-server from the module's requirement")
	cmd := exec.Command(o.goBin, "build", "-o", natsBin, "github.com/nats-io/nats-server/v2")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build nats-server: %w\n%s", err, out)
	}
	if err := runSingleServer(ctx, o, res, natsBin, bins.engine, filepath.Join(dir, "single")); err != nil {
		return res, err
	}
	if o.foClusterReps > 0 {
		if err := runClusterFaults(ctx, o, res, natsBin, bins.engine, filepath.Join(dir, "cluster")); err != nil {
			return res, err
		}
	}
	res.Seconds = Num(time.Since(started).Seconds())
	return res, nil
}

// runSingleServer runs restart, takeover and projection after a kill on
// one nats-server.
func runSingleServer(ctx context.Context, o options, res *FailoverResult, natsBin, engineBin, dir string) error {
	if err := os.MkdirAll(filepath.Join(dir, "store"), 0o755); err != nil {
		return err
	}
	port, err := testproc.Port()
	if err != nil {
		return err
	}
	srv, err := startProc("nats-server", readyNATSLine, natsBin, "-js", "-sd", filepath.Join(dir, "store"), "-a", "127.0.0.1", "-p", fmt.Sprint(port))
	if err != nil {
		return err
	}
	defer srv.stop()
	env, err := newFoEnv(dir, fmt.Sprintf("nats://127.0.0.1:%d", port), engineBin, 1)
	if err != nil {
		return err
	}
	defer env.close()
	progress(fmt.Sprintf("failover: restart: kill -9 an engine owning %d runs with calls in progress, start it again with its id (%d x)", restartRuns, o.foReps))
	if res.Restart, err = runRestart(ctx, env, o.foReps); err != nil {
		return fmt.Errorf("restart: %w", err)
	}
	progress(fmt.Sprintf("failover: takeover: kill -9 the engine owning %d runs; another one takes them (%d x)", restartRuns, o.foReps))
	if res.Takeover, err = runTakeover(ctx, env, o.foReps); err != nil {
		return fmt.Errorf("takeover: %w", err)
	}
	progress(fmt.Sprintf("failover: projection after a kill: kill -9 one of two engines while runs are submitted (%d x)", o.foReps))
	if res.Projection, err = runProjectionAfterKill(ctx, env, o.foReps); err != nil {
		return fmt.Errorf("projection after a kill: %w", err)
	}
	return nil
}

func runRestart(ctx context.Context, env *foEnv, reps int) (*FailoverFigure, error) {
	fig := &FailoverFigure{Measures: `the restarted engine's "engine ready" log line -> each of its runs' first commit (negative: before the line; the engine takes its runs back just before it logs it)`}
	const id = "bench-restart"
	e, err := env.startEngine(id)
	if err != nil {
		return nil, err
	}
	defer func() { e.stop() }()
	if err := env.bind(ctx); err != nil {
		return nil, err
	}
	for r := 0; r < reps; r++ {
		var runs []string
		var subs []*protocol.Submit
		for i := 0; i < restartRuns; i++ {
			run := fmt.Sprintf("fo-restart-%d-%d", r, i)
			runs, subs = append(runs, run), append(subs, sleepBatch(run, "sleep", restartCall))
		}
		if err := env.submitAll(ctx, subs); err != nil {
			return nil, err
		}
		if err := env.waitExecuting(ctx, runs); err != nil {
			return nil, err
		}
		seq, err := env.lastSeq(ctx, env.names.EventsStream())
		if err != nil {
			return nil, err
		}
		e.kill()
		if e, err = env.startEngine(id); err != nil {
			return nil, err
		}
		ready := e.log.readyAt()
		if err := env.waitCommitsAfter(ctx, runs, seq, failoverWait); err != nil {
			return nil, fmt.Errorf("%w\n%s", err, e.tail(4096))
		}
		first, err := env.firstCommits(ctx, seq)
		if err != nil {
			return nil, err
		}
		rep := FailoverRep{Killed: id, Heir: id + " (restarted)", ReadyAfterMs: Num(ms(ready.Sub(e.started))), HeirLines: e.log.snapshot()}
		for _, run := range runs {
			rep.SamplesMs = append(rep.SamplesMs, Num(ms(first[run].Sub(ready))))
		}
		fig.Reps = append(fig.Reps, rep)
		if err := env.waitResults(ctx, runs, failoverWait); err != nil {
			return nil, err
		}
	}
	fig.summarize(restartTarget)
	return fig, nil
}

func runTakeover(ctx context.Context, env *foEnv, reps int) (*FailoverFigure, error) {
	fig := &FailoverFigure{Measures: "kill -9 of the engine owning the runs -> each run's first commit by the other engine"}
	a, err := env.startEngine("bench-takeover-0")
	if err != nil {
		return nil, err
	}
	defer func() { a.stop() }()
	for r := 0; r < reps; r++ {
		var runs []string
		var subs []*protocol.Submit
		for i := 0; i < restartRuns; i++ {
			run := fmt.Sprintf("fo-takeover-%d-%d", r, i)
			runs, subs = append(runs, run), append(subs, sleepBatch(run, "sleep", takeoverCall))
		}
		if err := env.submitAll(ctx, subs); err != nil {
			return nil, err
		}
		if err := env.waitExecuting(ctx, runs); err != nil {
			return nil, err
		}
		// The runs are the only engine's: started before the heir.
		for _, run := range runs {
			if owner := env.owner(ctx, run); owner != a.id {
				fig.Notes = append(fig.Notes, fmt.Sprintf("rep %d: %s owned by %q, not by the engine killed", r, run, owner))
			}
		}
		b, err := env.startEngine(fmt.Sprintf("bench-takeover-%d", r+1))
		if err != nil {
			return nil, err
		}
		time.Sleep(peerSettle) // b watches a's presence
		seq, err := env.lastSeq(ctx, env.names.EventsStream())
		if err != nil {
			return nil, err
		}
		killed := time.Now()
		a.kill()
		if err := env.waitCommitsAfter(ctx, runs, seq, failoverWait); err != nil {
			return nil, fmt.Errorf("%w\n%s", err, b.tail(4096))
		}
		first, err := env.firstCommits(ctx, seq)
		if err != nil {
			return nil, err
		}
		rep := FailoverRep{Killed: a.id, Heir: b.id, HeirLines: b.log.snapshot()}
		for _, run := range runs {
			rep.SamplesMs = append(rep.SamplesMs, Num(ms(first[run].Sub(killed))))
		}
		fig.Reps = append(fig.Reps, rep)
		a = b
		if err := env.waitResults(ctx, runs, failoverWait); err != nil {
			return nil, err
		}
	}
	fig.summarize(takeoverTarget)
	return fig, nil
}

// owner returns the engine a run's owner key names ("" if none, or
// unreadable). It asks the bucket's stream leader (a KV Get is a direct
// get, which any replica answers, a lagging one too).
func (env *foEnv) owner(ctx context.Context, run string) string {
	v, _ := env.ownerOK(ctx, run)
	return v
}

// ownerOK is owner, and whether the leader answered.
func (env *foEnv) ownerOK(ctx context.Context, run string) (string, bool) {
	v, ok, _ := env.leaderGet(ctx, env.names.KVStream(protocol.BucketOwners), env.names.KVSubject(protocol.BucketOwners, protocol.OwnerKey(run)))
	return v, ok
}

// directOwner is a run's owner as a KV Get reads it ("" for none or an
// error).
func (env *foEnv) directOwner(ctx context.Context, run string) string {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	entry, err := env.owners.Get(ctx, protocol.OwnerKey(run))
	if err != nil {
		return ""
	}
	return string(entry.Value())
}

// leaderGet reads a subject's last message from a stream's leader
// ($JS.API.STREAM.MSG.GET): its data ("" for a key-value delete marker or
// none), and whether the leader answered.
func (env *foEnv) leaderGet(ctx context.Context, stream, subject string) (string, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := json.Marshal(map[string]string{"last_by_subj": subject})
	if err != nil {
		return "", false, err
	}
	m, err := env.nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+stream, req)
	if err != nil {
		return "", false, err
	}
	var resp struct {
		Message *struct {
			Hdrs []byte `json:"hdrs"`
			Data []byte `json:"data"`
		} `json:"message"`
		Error *struct {
			Code    int `json:"code"`
			ErrCode int `json:"err_code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return "", false, err
	}
	switch {
	case resp.Error != nil && resp.Error.Code == 404:
		return "", true, nil
	case resp.Error != nil:
		return "", false, fmt.Errorf("stream msg get %s: %d %d", stream, resp.Error.Code, resp.Error.ErrCode)
	case resp.Message == nil:
		return "", false, errors.New("stream msg get: no message")
	}
	if bytes.Contains(resp.Message.Hdrs, []byte("KV-Operation: DEL")) || bytes.Contains(resp.Message.Hdrs, []byte("KV-Operation: PURGE")) {
		return "", true, nil
	}
	return string(resp.Message.Data), true, nil
}

func runProjectionAfterKill(ctx context.Context, env *foEnv, reps int) (*FailoverFigure, error) {
	fig := &FailoverFigure{Measures: "kill -9 of one of two engines -> the first out message published for a commit made after the kill"}
	var live []*foEngine
	defer func() {
		for _, e := range live {
			e.stop()
		}
	}()
	for i := 0; i < 2; i++ {
		e, err := env.startEngine(fmt.Sprintf("bench-projection-%d", i))
		if err != nil {
			return nil, err
		}
		live = append(live, e)
	}
	tr := startTrickle(env.cl, "fo-projection")
	defer tr.end()
	time.Sleep(time.Second)
	for r := 0; r < reps; r++ {
		doomed, heir := live[0], live[1] // the older one
		lines0 := heir.log.snapshot()
		killed := time.Now()
		doomed.kill()
		seq, err1 := env.lastSeq(ctx, env.names.EventsStream())
		outSeq, err2 := env.lastSeq(ctx, env.names.OutStream())
		if err := errors.Join(err1, err2); err != nil {
			return nil, err
		}
		var first time.Time
		from := outSeq + 1
		err := poll(ctx, failoverWait, "an out message of a commit made after the kill", func(ctx context.Context) bool {
			msgs, err := readStream(ctx, env.out, from)
			if err != nil {
				return false
			}
			for _, m := range msgs {
				from = m.seq + 1
				if m.source > seq {
					first = m.at
					return true
				}
			}
			return false
		})
		if err != nil {
			return nil, fmt.Errorf("%w (%d runs submitted, %d submissions failed)\n%s", err, tr.submitted.Load(), tr.failed.Load(), heir.tail(4096))
		}
		lines := heir.log.snapshot()
		for k, v := range lines0 {
			lines[k] -= v
		}
		fig.Reps = append(fig.Reps, FailoverRep{Killed: doomed.id, Heir: heir.id, SamplesMs: []Num{Num(ms(first.Sub(killed)))}, HeirLines: lines})
		next, err := env.startEngine(fmt.Sprintf("bench-projection-%d", r+2))
		if err != nil {
			return nil, err
		}
		live = []*foEngine{heir, next}
		time.Sleep(time.Second)
	}
	if n := tr.failed.Load(); n > 0 {
		fig.Notes = append(fig.Notes, fmt.Sprintf("%d of %d submissions failed", n, n+tr.submitted.Load()))
	}
	fig.summarize(projectionTarget)
	return fig, nil
}

// verdict is a target's word in the table.
func verdict(met *bool) string {
	if met == nil {
		return "not measurable"
	}
	return map[bool]string{true: "MET", false: "NOT MET"}[*met]
}

// printFailover writes the failover part's section of the table.
func printFailover(w io.Writer, f *FailoverResult) {
	fmt.Fprintf(w, "== failover (issue 16): %s\n   engines: %s\n", f.NATS, f.EngineFlags)
	fmt.Fprintf(w, "%-76s %9s %9s %8s  %-8s %s\n", "", "median", "max", "samples", "target", "")
	for _, x := range []struct {
		name string
		fig  *FailoverFigure
		tgt  time.Duration
	}{
		{fmt.Sprintf(`restart (kill -9, same id; %d runs): "engine ready" -> each run's 1st commit`, restartRuns), f.Restart, restartTarget},
		{fmt.Sprintf("takeover (kill -9, another engine; %d runs): kill -> each run's 1st commit", restartRuns), f.Takeover, takeoverTarget},
		{"projection after a kill (kill -9 of one of two engines): kill -> 1st out of a later commit", f.Projection, projectionTarget},
	} {
		if x.fig == nil {
			continue
		}
		fmt.Fprintf(w, "%-76s %9s %9s %8d  %-8s %s\n", x.name, x.fig.Median, x.fig.Max, x.fig.Samples, "<= "+x.tgt.String(), verdict(x.fig.Met))
		for _, n := range x.fig.Notes {
			fmt.Fprintf(w, "    note: %s\n", n)
		}
	}
	if r := f.Restart; r != nil {
		var ready []float64
		for _, rep := range r.Reps {
			ready = append(ready, float64(rep.ReadyAfterMs))
		}
		fmt.Fprintf(w, "    restart: the engine was ready %s after its exec (median of %d)\n", fmtDur(Num(median(ready))), len(ready))
	}
	for _, c := range []*ClusterFault{f.Paused, f.Killed} {
		if c == nil {
			continue
		}
		fmt.Fprintf(w, "  3-node cluster, 2 engines (--replicas 3), %d runs with a never_replay call in progress: %s (%d x)\n", clusterRuns, c.Fault, len(c.Reps))
		fmt.Fprintf(w, "    owner changes %d, \"took the run over\" %d, \"lost the run\" %d, engines declared dead %d, \"run recovered\" %d, indeterminate calls %d   target: %s   %s\n",
			c.OwnerChanges, c.TookOver, c.Lost, c.DeclaredDead, c.Recovered, c.Indeterminate, c.Target, verdict(c.Met))
		var per []string
		for _, r := range c.Reps {
			s := fmt.Sprintf("%s (leader %s -> %s; first commit %s after the fault began", fmtDur(r.LongestGapMs), r.Leader, r.NewLeader, fmtDur(r.ResumeMs))
			if r.ResumedAfterEnd {
				s += ", once it ended"
			}
			per = append(per, s+fmt.Sprintf("; healthy %s after its end)", fmtDur(r.HealthyAfterMs)))
		}
		fmt.Fprintf(w, "    commits stopped for (the longest time without one): median %s, max %s; each: %s\n", c.StallMedian, c.StallMax, strings.Join(per, "; "))
		var slow []string
		for _, r := range c.Reps {
			slow = append(slow, fmt.Sprintf("%s (%s; %d of %d over %s, %d never)", fmtDur(r.SlowestNewRunMs), r.SlowestNewRun, r.SlowNewRuns, r.NewRuns, slowNewRun, r.UnservedNewRuns))
		}
		fmt.Fprintf(w, "    new runs (submitted during the fault or %s after it), the slowest from submission to first commit: %s\n", newRunsAfter, strings.Join(slow, ", "))
		fmt.Fprintf(w, "    each fault's %d runs, from submission to their calls executing (before the fault): %s\n", clusterRuns, executingList(c))
		for _, r := range c.Reps {
			for _, ch := range r.Changed {
				fmt.Fprintf(w, "    owner changed: %s\n", ch)
			}
			for _, d := range r.DirectGets {
				fmt.Fprintf(w, "    owner read: %s\n", d)
			}
		}
		for _, n := range c.Notes {
			fmt.Fprintf(w, "    note: %s\n", n)
		}
	}
	if n := f.ClusterOwnerKeysLeft; n != nil {
		fmt.Fprintf(w, "  owner keys left in the cluster's owners bucket once every run was done: %d %v (e.g. %s)\n", *n, f.ClusterOwnerKeysLeftBy, strings.Join(f.ClusterOwnerKeysLeftSample, " "))
	}
	fmt.Fprintf(w, "  the failover part took %s s\n\n", fmtNum(f.Seconds, ""))
}

// executingList lists how long each repetition's runs took from their
// submission to their calls executing.
func executingList(c *ClusterFault) string {
	var out []string
	for _, r := range c.Reps {
		out = append(out, fmtDur(r.ExecutingMs))
	}
	return strings.Join(out, ", ")
}
