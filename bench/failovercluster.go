package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/internal/testproc"
	"github.com/toolbatch/toolbatch/protocol"
)

// Scenario 4 of the failover part: a fault of the NATS cluster under two
// live engines must not move a single run. A 3-node cluster (nats-server
// processes), two engines with --replicas 3, a trickle of one-call echo
// runs, and at each repetition clusterRuns runs whose never_replay sleep
// is in progress when the events stream's leader is
//
//   - paused: SIGSTOP for pauseFor, then SIGCONT; or
//   - killed: SIGKILL, down for downFor, then started again on its store.
//
// Recorded: the owner keys of those runs just before the fault and once
// the cluster answers again, the engines' log lines of a takeover, the
// CallIndeterminate events of the whole scenario (a never_replay call
// recovered by anyone becomes one), and how long after the fault began
// the events stream stored its next commit.

const (
	clusterNodes = 3
	clusterRuns  = 6 // runs with a call in progress at each fault
	pauseFor     = 10 * time.Second
	downFor      = 15 * time.Second
	// callSlack is how much longer than the fault the calls sleep: their
	// owner keys are read again after the fault, while the calls still
	// run (a run gives its key up once it is done).
	callSlack   = 15 * time.Second
	healthyWait = 2 * time.Minute
	// newRunsAfter and slowNewRun: see ClusterFaultRep.NewRuns.
	newRunsAfter = 5 * time.Second
	slowNewRun   = 5 * time.Second
)

// ClusterFault is one kind of server fault, repeated.
type ClusterFault struct {
	Fault         string            `json:"fault"`
	Reps          []ClusterFaultRep `json:"reps"`
	OwnerChanges  int               `json:"owner_changes"`
	TookOver      int               `json:"took_over_lines"`
	Lost          int               `json:"lost_lines"`
	DeclaredDead  int               `json:"engine_gone_or_fenced_lines"`
	Recovered     int               `json:"run_recovered_lines"`
	Indeterminate int               `json:"indeterminate_calls"`
	// Stall is the time until commits resumed: each fault's longest time
	// without a commit in the events stream, from the fault's start until
	// the cluster was healthy again.
	StallMedian   string `json:"commits_stopped_median"`
	StallMax      string `json:"commits_stopped_max"`
	StallMedianMs Num    `json:"commits_stopped_median_ms"`
	StallMaxMs    Num    `json:"commits_stopped_max_ms"`
	// SlowestNewRun is the longest wait of a run submitted during a fault
	// (or within 5 s after it) for its first commit; UnservedNewRuns counts
	// those that never got one.
	SlowestNewRun   string   `json:"slowest_new_run"`
	SlowestNewRunMs Num      `json:"slowest_new_run_ms"`
	UnservedNewRuns int      `json:"new_runs_never_committed"`
	Target          string   `json:"target"`
	Met             *bool    `json:"met"`
	Notes           []string `json:"notes,omitempty"`
}

// ClusterFaultRep is one fault.
type ClusterFaultRep struct {
	Leader    string `json:"events_leader"`
	NewLeader string `json:"events_leader_after"`
	Runs      int    `json:"runs_with_a_call_in_progress"`
	// Owners counts the runs' owner keys by engine, before the fault.
	Owners map[string]int `json:"owners_before"`
	// Changed lists the runs whose owner key differs after the fault:
	// "run: before -> after".
	Changed []string `json:"owner_changes"`
	// DirectGets lists the runs whose owner key a direct get (what a KV
	// Get does: any replica answers) read otherwise than the leader, just
	// after the fault.
	DirectGets    []string       `json:"direct_get_differs,omitempty"`
	Lines         map[string]int `json:"engine_log_lines"`
	Indeterminate int            `json:"indeterminate_calls"`
	ResumeMs      Num            `json:"commits_resumed_after_ms"`
	// LongestGapMs is the longest time without a commit from the fault's
	// start until the cluster was healthy again.
	LongestGapMs Num `json:"longest_without_commits_ms"`
	// ResumedAfterEnd says commits resumed only once the fault ended (the
	// server continued or was back).
	ResumedAfterEnd bool `json:"resumed_after_the_fault_ended"`
	HealthyAfterMs  Num  `json:"healthy_after_the_fault_ended_ms"`
	// NewRuns are the trickle's runs submitted from the fault's start to
	// newRunsAfter after its end; SlowestNewRunMs the longest of them
	// waited from its accepted submission to its first commit, SlowNewRuns
	// how many waited over slowNewRun, UnservedNewRuns how many never got
	// one.
	NewRuns         int    `json:"new_runs"`
	SlowestNewRunMs Num    `json:"slowest_new_run_ms"`
	SlowestNewRun   string `json:"slowest_new_run"`
	SlowNewRuns     int    `json:"new_runs_slower_than_5s"`
	UnservedNewRuns int    `json:"new_runs_never_committed"`
	began, ended    time.Time
	// ExecutingMs is how long the runs took from their submission to their
	// calls executing; RestartMs how long the killed server took from its
	// start to "Server is ready".
	ExecutingMs Num `json:"submitted_to_executing_ms"`
	RestartMs   Num `json:"server_restart_ms,omitempty"`
}

// natsNode is one server of the benchmark's cluster.
type natsNode struct {
	name, conf, url, monitor string
	p                        *proc
	paused                   bool
}

// natsCluster is a 3-node cluster of nats-server processes.
type natsCluster struct {
	bin   string
	nodes []*natsNode
}

// nodeConf is a server's config: its own store, routes to every node,
// JetStream, the monitoring endpoint (for /healthz).
func nodeConf(name string, port, routePort, httpPort int, store string, routes []string) string {
	return fmt.Sprintf(`# toolbatch benchmark cluster node (bench/failovercluster.go)
server_name: %s
host: 127.0.0.1
port: %d
http: "127.0.0.1:%d"
jetstream { store_dir: %q }
cluster {
  name: toolbatch-bench
  listen: "127.0.0.1:%d"
  routes: [%s]
}
`, name, port, httpPort, store, routePort, strings.Join(routes, ", "))
}

func startNATSCluster(bin, dir string) (*natsCluster, error) {
	c := &natsCluster{bin: bin}
	type ports struct{ client, route, http int }
	var ps []ports
	var routes []string
	for i := 0; i < clusterNodes; i++ {
		var p ports
		for _, dst := range []*int{&p.client, &p.route, &p.http} {
			n, err := testproc.Port()
			if err != nil {
				return nil, err
			}
			*dst = n
		}
		ps = append(ps, p)
		routes = append(routes, fmt.Sprintf("%q", fmt.Sprintf("nats-route://127.0.0.1:%d", p.route)))
	}
	for i, p := range ps {
		n := &natsNode{name: fmt.Sprintf("n%d", i+1), url: fmt.Sprintf("nats://127.0.0.1:%d", p.client),
			monitor: fmt.Sprintf("http://127.0.0.1:%d", p.http), conf: filepath.Join(dir, fmt.Sprintf("n%d.conf", i+1))}
		store := filepath.Join(dir, "store", n.name)
		if err := os.MkdirAll(store, 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(n.conf, []byte(nodeConf(n.name, p.client, p.route, p.http, store, routes)), 0o644); err != nil {
			return nil, err
		}
		if err := n.start(bin); err != nil {
			c.stop()
			return nil, err
		}
		c.nodes = append(c.nodes, n)
	}
	return c, nil
}

func (n *natsNode) start(bin string) error {
	p, err := startProc("nats-server "+n.name, readyNATSLine, bin, "-c", n.conf)
	if err != nil {
		return err
	}
	n.p = p
	return nil
}

// healthy reports whether the server answers its /healthz with 200: its
// JetStream meta group and every stream and consumer it holds current.
func (n *natsNode) healthy(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, n.monitor+"/healthz", nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode == http.StatusOK
}

// waitHealthy waits until every node is healthy.
func (c *natsCluster) waitHealthy(ctx context.Context, wait time.Duration) error {
	return poll(ctx, wait, "the nats cluster healthy", func(ctx context.Context) bool {
		for _, n := range c.nodes {
			if !n.healthy(ctx) {
				return false
			}
		}
		return true
	})
}

func (c *natsCluster) url() string {
	var urls []string
	for _, n := range c.nodes {
		urls = append(urls, n.url)
	}
	return strings.Join(urls, ",")
}

// stop stops every server and writes the end of its log into dir.
func (c *natsCluster) stop() {
	for _, n := range c.nodes {
		if n.paused {
			_ = n.p.cmd.Process.Signal(syscall.SIGCONT)
		}
		n.p.stop()
		_ = os.WriteFile(strings.TrimSuffix(n.conf, ".conf")+".log", []byte(n.p.tail(keepLogs)), 0o644)
	}
}

// eventsLeader is the server that leads the events stream ("" unknown).
func (env *foEnv) eventsLeader(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	info, err := env.events.Info(ctx)
	if err != nil || info.Cluster == nil {
		return ""
	}
	return info.Cluster.Leader
}

func runClusterFaults(ctx context.Context, o options, res *FailoverResult, natsBin, engineBin, dir string) error {
	progress("failover: starting a 3-node nats cluster and two engines with --replicas 3")
	cl, err := startNATSCluster(natsBin, dir)
	if err != nil {
		return err
	}
	defer cl.stop()
	if err := cl.waitHealthy(ctx, healthyWait); err != nil {
		return err
	}
	env, err := newFoEnv(dir, cl.url(), engineBin, clusterNodes)
	if err != nil {
		return err
	}
	defer env.close()
	var engines []*foEngine
	defer func() {
		for _, e := range engines {
			e.stop()
		}
	}()
	for i := 0; i < 2; i++ {
		e, err := env.startEngine(fmt.Sprintf("bench-cluster-%d", i))
		if err != nil {
			return err
		}
		engines = append(engines, e)
	}
	if err := env.bind(ctx); err != nil {
		return err
	}
	if err := cl.waitHealthy(ctx, healthyWait); err != nil {
		return err
	}
	from, err := env.lastSeq(ctx, env.names.EventsStream())
	if err != nil {
		return err
	}
	tr := startTrickle(env.cl, "fo-cluster")
	time.Sleep(2 * time.Second)
	var long []string            // every run with a never_replay call
	repOf := map[string][2]int{} // a run's fault and repetition
	var faults []*ClusterFault
	for _, kind := range []string{"pause", "kill"} {
		f := &ClusterFault{Target: "0 owner changes, 0 takeover log lines, 0 indeterminate calls"}
		d := pauseFor
		if kind == "pause" {
			f.Fault = fmt.Sprintf("SIGSTOP of the events stream's leader for %s, then SIGCONT", pauseFor)
		} else {
			d = downFor
			f.Fault = fmt.Sprintf("kill -9 of the events stream's leader, down %s, then started again on its store", downFor)
		}
		progress(fmt.Sprintf("failover: cluster: %s (%d x)", f.Fault, o.foClusterReps))
		for r := 0; r < o.foClusterReps; r++ {
			rep, runs, err := clusterFault(ctx, env, cl, engines, kind, d, r)
			if err != nil {
				tr.end()
				return fmt.Errorf("%s %d: %w", kind, r, err)
			}
			f.Reps = append(f.Reps, *rep)
			for _, run := range runs {
				repOf[run] = [2]int{len(faults), len(f.Reps) - 1}
			}
			long = append(long, runs...)
		}
		faults = append(faults, f)
	}
	tr.end()
	// Every call must end well (a never_replay call made indeterminate
	// shows up below, not here).
	var notes []string
	if err := env.waitResults(ctx, long, pauseFor+downFor+callSlack+failoverWait); err != nil {
		notes = append(notes, "not every run with a call in progress at a fault got its result: "+err.Error())
	}
	if n := tr.failed.Load(); n > 0 {
		notes = append(notes, fmt.Sprintf("%d of %d trickle submissions failed (during the faults)", n, n+tr.submitted.Load()))
	}
	for _, e := range engines {
		if !e.alive() {
			notes = append(notes, fmt.Sprintf("engine %s died:\n%s", e.id, e.tail(4096)))
		}
	}
	msgs, err := readStream(ctx, env.events, from+1)
	if err != nil {
		return fmt.Errorf("read the events: %w", err)
	}
	first := map[string]time.Time{}
	for _, m := range msgs {
		if run, ok := env.names.RunOf(protocol.EventsFamily, m.subject); ok {
			if _, seen := first[run]; !seen {
				first[run] = m.at
			}
		}
	}
	var reps []*ClusterFaultRep // in the order they ran
	for _, f := range faults {
		for i := range f.Reps {
			reps = append(reps, &f.Reps[i])
		}
	}
	for i, r := range reps {
		r.SlowestNewRunMs = Num(nan())
		until := r.ended.Add(newRunsAfter)
		if i+1 < len(reps) && reps[i+1].began.Before(until) {
			until = reps[i+1].began // a run belongs to one fault
		}
		for run, at := range tr.between(r.began, until) {
			r.NewRuns++
			c, ok := first[run]
			if !ok {
				r.UnservedNewRuns++
				continue
			}
			wait := c.Sub(at)
			if wait > slowNewRun {
				r.SlowNewRuns++
			}
			if !(float64(r.SlowestNewRunMs) >= ms(wait)) {
				r.SlowestNewRunMs, r.SlowestNewRun = Num(ms(wait)), run
			}
		}
	}
	// Every run is done: no owner key should name an engine once the
	// linger passed.
	time.Sleep(2 * ownerLingerBench)
	left, err := retried(ctx, func(ctx context.Context) (map[string][]string, error) { return ownerKeysLeft(ctx, env) })
	if err != nil {
		notes = append(notes, "could not list the owner keys left: "+err.Error())
	} else {
		n := 0
		res.ClusterOwnerKeysLeftBy = map[string]int{}
		for engine, runs := range left {
			n += len(runs)
			res.ClusterOwnerKeysLeftBy[engine] = len(runs)
			slices.Sort(runs)
			res.ClusterOwnerKeysLeftSample = append(res.ClusterOwnerKeysLeftSample, runs[:min(len(runs), 5)]...)
		}
		res.ClusterOwnerKeysLeft = &n
	}
	indeterminate := 0
	for _, m := range msgs {
		n := 0
		for _, t := range m.events {
			if t == string(events.TypeCallIndeterminate) {
				n++
			}
		}
		if n == 0 {
			continue
		}
		indeterminate += n
		run, _ := env.names.RunOf(protocol.EventsFamily, m.subject)
		if at, ok := repOf[run]; ok {
			faults[at[0]].Reps[at[1]].Indeterminate += n
		} else {
			notes = append(notes, fmt.Sprintf("%d indeterminate call(s) in run %s (not a run of a fault)", n, run))
		}
	}
	for _, f := range faults {
		var stall []float64
		f.SlowestNewRunMs = Num(nan())
		for _, r := range f.Reps {
			if !(float64(f.SlowestNewRunMs) >= float64(r.SlowestNewRunMs)) {
				f.SlowestNewRunMs = r.SlowestNewRunMs
			}
			f.UnservedNewRuns += r.UnservedNewRuns
			f.OwnerChanges += len(r.Changed)
			f.TookOver += r.Lines[logTookOver]
			f.Lost += r.Lines[logLost]
			f.DeclaredDead += r.Lines[logGone] + r.Lines[logFenced]
			f.Recovered += r.Lines[logRecovered]
			f.Indeterminate += r.Indeterminate
			stall = append(stall, float64(r.LongestGapMs))
		}
		f.StallMedianMs, f.StallMaxMs = Num(median(stall)), Num(nan())
		for _, v := range stall {
			if !(float64(f.StallMaxMs) >= v) {
				f.StallMaxMs = Num(v)
			}
		}
		f.StallMedian, f.StallMax, f.SlowestNewRun = fmtDur(f.StallMedianMs), fmtDur(f.StallMaxMs), fmtDur(f.SlowestNewRunMs)
		f.Notes = notes
		f.Met = boolp(f.OwnerChanges == 0 && f.TookOver == 0 && f.Lost == 0 && f.Indeterminate == 0 && len(f.Reps) > 0)
	}
	if indeterminate > 0 && len(faults) > 0 {
		for _, f := range faults {
			f.Notes = append(f.Notes, fmt.Sprintf("%d indeterminate calls in the whole scenario", indeterminate))
		}
	}
	res.Paused, res.Killed = faults[0], faults[1]
	return nil
}

// ownerLingerBench is the engine's linger of a run between batches
// (engine/owner.go's ownerLinger).
const ownerLingerBench = 2 * time.Second

// ownerKeysLeft returns the runs whose owner key is in the owners bucket,
// by the engine it names.
func ownerKeysLeft(ctx context.Context, env *foEnv) (map[string][]string, error) {
	ctx, cancel := context.WithTimeout(ctx, failoverWait)
	defer cancel()
	w, err := env.owners.WatchFiltered(ctx, []string{protocol.OwnerKey("*")}, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	out := map[string][]string{}
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case entry := <-w.Updates():
			if entry == nil {
				return out, nil // every current key was delivered
			}
			engine := string(entry.Value())
			out[engine] = append(out[engine], strings.TrimPrefix(entry.Key(), protocol.OwnerKey("")))
		}
	}
}

// logTotals sums the engines' counted log lines.
func logTotals(engines []*foEngine) map[string]int {
	out := map[string]int{}
	for _, e := range engines {
		for k, v := range e.log.snapshot() {
			out[k] += v
		}
	}
	return out
}

// clusterFault runs one fault: it submits clusterRuns runs whose call
// sleeps through it, reads their owners, stops (or kills) the events
// stream's leader for d, and reads the owners again.
func clusterFault(ctx context.Context, env *foEnv, cl *natsCluster, engines []*foEngine, kind string, d time.Duration, r int) (*ClusterFaultRep, []string, error) {
	start := time.Now()
	var runs []string
	var subs []*protocol.Submit
	for i := 0; i < clusterRuns; i++ {
		run := fmt.Sprintf("fo-%s-%d-%d", kind, r, i)
		runs, subs = append(runs, run), append(subs, sleepBatch(run, "sleep_nr", d+callSlack))
	}
	if err := env.submitAll(ctx, subs); err != nil {
		return nil, nil, err
	}
	if err := env.waitExecuting(ctx, runs); err != nil {
		return nil, nil, err
	}
	rep := &ClusterFaultRep{Runs: len(runs), Owners: map[string]int{}, Lines: map[string]int{}, ExecutingMs: Num(ms(time.Since(start)))}
	time.Sleep(time.Second)
	before := map[string]string{}
	for _, run := range runs {
		before[run] = env.owner(ctx, run)
		rep.Owners[before[run]]++
	}
	var node *natsNode
	err := poll(ctx, 30*time.Second, "the events stream's leader", func(ctx context.Context) bool {
		rep.Leader = env.eventsLeader(ctx)
		i := slices.IndexFunc(cl.nodes, func(n *natsNode) bool { return n.name == rep.Leader })
		if i >= 0 {
			node = cl.nodes[i]
		}
		return node != nil
	})
	if err != nil {
		return nil, nil, err
	}
	lines0 := logTotals(engines)
	seq, err := env.lastSeq(ctx, env.names.EventsStream())
	if err != nil {
		return nil, nil, err
	}
	began := time.Now()
	rep.began = began
	if kind == "pause" {
		node.paused = true
		if err := node.p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			return nil, nil, err
		}
		time.Sleep(d)
		if err := node.p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			return nil, nil, err
		}
		node.paused = false
	} else {
		node.p.kill()
		time.Sleep(d)
		restart := time.Now()
		if err := node.start(cl.bin); err != nil {
			return nil, nil, err
		}
		rep.RestartMs = Num(ms(time.Since(restart)))
	}
	ended := time.Now()
	rep.ended = ended
	// The owners once the bucket answers again; the calls still run.
	for _, run := range runs {
		var after string
		err := poll(ctx, callSlack-2*time.Second-time.Since(ended), "the owner of "+run, func(ctx context.Context) bool {
			var ok bool
			after, ok = env.ownerOK(ctx, run)
			return ok
		})
		switch {
		case err != nil:
			rep.Changed = append(rep.Changed, fmt.Sprintf("%s: %q -> (the owners stream's leader did not answer)", run, before[run]))
		case after != before[run]:
			rep.Changed = append(rep.Changed, fmt.Sprintf("%s: %q -> %q", run, before[run], after))
		}
		if direct := env.directOwner(ctx, run); direct != after {
			rep.DirectGets = append(rep.DirectGets, fmt.Sprintf("%s: the leader says %q, a direct get %q", run, after, direct))
		}
	}
	if err := cl.waitHealthy(ctx, healthyWait); err != nil {
		return nil, nil, err
	}
	rep.HealthyAfterMs = Num(ms(time.Since(ended)))
	rep.NewLeader = env.eventsLeader(ctx)
	// The first commit stored after the fault began.
	msgs, err := readStream(ctx, env.events, seq+1)
	if err != nil {
		return nil, nil, err
	}
	rep.ResumeMs, rep.LongestGapMs = Num(nan()), Num(nan())
	prev := began
	for _, m := range msgs {
		if !m.at.After(began) {
			continue
		}
		if rep.ResumeMs != rep.ResumeMs { // the first after the fault began
			rep.ResumeMs = Num(ms(m.at.Sub(began)))
			rep.ResumedAfterEnd = m.at.After(ended)
		}
		if gap := ms(m.at.Sub(prev)); !(float64(rep.LongestGapMs) >= gap) {
			rep.LongestGapMs = Num(gap)
		}
		prev = m.at
	}
	lines1 := logTotals(engines)
	for _, k := range countedLogs {
		if n := lines1[k] - lines0[k]; n > 0 {
			rep.Lines[k] = n
		}
	}
	progress(fmt.Sprintf("failover: cluster: %s %d: leader %s -> %s; runs executing %s after their submission; first commit %s after the fault began, longest without commits %s; %d owner changes; healthy %s after the fault",
		kind, r+1, rep.Leader, rep.NewLeader, fmtDur(rep.ExecutingMs), fmtDur(rep.ResumeMs), fmtDur(rep.LongestGapMs), len(rep.Changed), fmtDur(rep.HealthyAfterMs)))
	return rep, runs, nil
}
