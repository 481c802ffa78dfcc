package chaos

import (
	"context"
	"fmt"
	"io"
	"math/rand"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/protocol"
)

// Fault kinds of the cluster schedules.
const (
	// FaultKillFollower kills -9 a server that leads neither the events
	// stream nor the meta group, and restarts it on its store.
	FaultKillFollower = "kill-follower"
	// FaultKillStreamLeader kills -9 the events stream's leader (its
	// StreamInfo's Cluster.Leader), and restarts it on its store.
	FaultKillStreamLeader = "kill-stream-leader"
	// FaultKillMetaLeader kills -9 the JetStream meta leader (named by a
	// majority of the servers' /jsz meta_cluster.leader), and restarts it
	// on its store.
	FaultKillMetaLeader = "kill-meta-leader"
	// FaultStop SIGSTOPs a server (the events leader, the meta leader or a
	// follower, by the seed) for longer than an election, then SIGCONTs it.
	FaultStop = "sigstop"
	// FaultRolling restarts each server in turn (SIGTERM, start again on
	// its store), waiting for the cluster to be healthy before the next.
	FaultRolling = "rolling-restart"
	// FaultKillEngine kills -9 one engine while the other lives, and
	// restarts it.
	FaultKillEngine = "kill-engine"
	// FaultKillEngines kills -9 both engines, restarts one, then the other.
	FaultKillEngines = "kill-engines"
)

// ServerFaults are the fault kinds that hit only the nats-servers; a plan
// of these alone is checked by the server-only checks too.
var ServerFaults = []string{FaultKillFollower, FaultKillStreamLeader, FaultKillMetaLeader, FaultStop, FaultRolling}

// AllFaults are every fault kind of the cluster schedules.
var AllFaults = append(append([]string(nil), ServerFaults...), FaultKillEngine, FaultKillEngines)

// ClusterProfile is the size of a cluster schedule's workload and faults.
type ClusterProfile struct {
	// Runs run concurrently, each a series of batches of 1..MaxCalls
	// calls. A run submits at least MinBatches batches and goes on until
	// the fault plan is done, up to MaxBatches.
	Runs, MinBatches, MaxBatches, MaxCalls int
	// Kinds are the fault kinds of the plan, each injected Rounds times
	// (at least once), in an order drawn from the seed. Nil: by the seed's
	// class, ServerFaults for an even seed, AllFaults for an odd one.
	Kinds  []string
	Rounds int
	// Pause is the range of the pause before each fault (the cluster
	// healthy again after the previous one); Down the range of how long a
	// killed server or engine stays down; Stop the range of how long a
	// stopped server stays stopped (longer than an election: 4-9 s).
	PauseMin, PauseMax time.Duration
	DownMin, DownMax   time.Duration
	StopMin, StopMax   time.Duration
	// BatchTimeout is how long a client waits for one batch's results,
	// faults included, before the schedule fails.
	BatchTimeout time.Duration
}

// ClusterShort is the profile of the short cluster schedule inside `make
// test`: a kill -9 of the events leader and a SIGSTOP, a small workload.
var ClusterShort = ClusterProfile{Runs: 3, MinBatches: 2, MaxBatches: 40, MaxCalls: 3,
	Kinds: []string{FaultKillStreamLeader, FaultStop}, Rounds: 1,
	PauseMin: 500 * time.Millisecond, PauseMax: 1500 * time.Millisecond,
	DownMin: 500 * time.Millisecond, DownMax: 1500 * time.Millisecond,
	StopMin: 8 * time.Second, StopMax: 9 * time.Second, BatchTimeout: 90 * time.Second}

// ClusterLong is the profile of `make chaos-cluster`: each fault kind of
// the seed's class once; a schedule takes about one to three minutes.
var ClusterLong = ClusterProfile{Runs: 6, MinBatches: 3, MaxBatches: 200, MaxCalls: 5, Rounds: 1,
	PauseMin: time.Second, PauseMax: 3 * time.Second,
	DownMin: time.Second, DownMax: 4 * time.Second,
	StopMin: 8 * time.Second, StopMax: 12 * time.Second, BatchTimeout: 180 * time.Second}

// faultStep is one fault of a cluster schedule's plan.
type faultStep struct {
	pause time.Duration // before the fault, after the previous one healed
	kind  string        // Fault*
	pick  int           // which server (role) or engine
	down  time.Duration // how long the process stays killed or stopped
	later time.Duration // FaultKillEngines: from the first engine's restart to the second's
}

// faultPlan returns a seed's fault kinds and plan: every choice is drawn
// from the seed alone.
func faultPlan(seed int64, p ClusterProfile) ([]string, []faultStep) {
	rng := rand.New(rand.NewSource(seed ^ 0xc105))
	kinds := p.Kinds
	if kinds == nil {
		kinds = ServerFaults
		if seed%2 != 0 {
			kinds = AllFaults
		}
	}
	between := func(lo, hi time.Duration) time.Duration {
		if hi <= lo {
			return lo
		}
		return lo + time.Duration(rng.Int63n(int64(hi-lo)))
	}
	var steps []faultStep
	for range max(p.Rounds, 1) {
		for _, i := range rng.Perm(len(kinds)) {
			st := faultStep{kind: kinds[i], pause: between(p.PauseMin, p.PauseMax), pick: rng.Intn(1 << 16)}
			down, stop, later := between(p.DownMin, p.DownMax), between(p.StopMin, p.StopMax), between(p.DownMin, p.DownMax)
			switch st.kind {
			case FaultStop:
				st.down = stop
			case FaultRolling:
			default:
				st.down, st.later = down, later
			}
			steps = append(steps, st)
		}
	}
	return kinds, steps
}

// serverOnly reports whether kinds hit only the nats-servers.
func serverOnly(kinds []string) bool {
	for _, k := range kinds {
		if k == FaultKillEngine || k == FaultKillEngines {
			return false
		}
	}
	return true
}

// RunCluster runs one cluster schedule: it starts a 3-node nats-server
// cluster, two engines (--replicas 3) and two sandbox workers, drives the
// seed's workload while it injects the seed's fault plan, then runs every
// check of Run, the server-only checks when the plan hit only the servers,
// and measures the failover of each fault. Arguments and error as Run's.
func RunCluster(ctx context.Context, bins Binaries, p ClusterProfile, seed int64, dir, shared string, progress io.Writer) (*Result, error) {
	started := time.Now()
	kinds, plan := faultPlan(seed, p)
	res := &Result{Seed: seed, Servers: clusterSize, Engines: 2, Runs: p.Runs, Crashes: map[string]int{}, Faults: map[string]int{},
		ServerOnly: serverOnly(kinds), Dir: dir}
	logf := progressf(progress, seed, started)
	c, err := startCluster(ctx, bins, dir, shared, clusterSize, res.Engines, 2)
	if err != nil {
		return nil, fmt.Errorf("start the processes: %w", err)
	}
	defer c.stop()
	var planned []string
	for _, st := range plan {
		planned = append(planned, st.kind)
	}
	logf("started a %d-node nats cluster, %d engines (--replicas %d), 2 workers on %s; plan: %s", clusterSize, res.Engines, clusterSize,
		c.url, strings.Join(planned, ", "))

	enough := make(chan struct{})
	var moments []faultMoment
	d := drive{specs: workload(seed, Profile{Runs: p.Runs, MinBatches: p.MaxBatches, MaxBatches: p.MaxBatches, MaxCalls: p.MaxCalls}),
		timeout: p.BatchTimeout, enough: enough, atLeast: p.MinBatches, clientOpts: fastFailover(),
		faults: func(done <-chan struct{}, awaiting func() []string) error {
			defer close(enough)
			var err error
			moments, err = c.faults(ctx, plan, done, awaiting, res, logf)
			return err
		}}
	out, err := execute(ctx, c, d, res, started, logf)
	if err != nil || out == nil {
		return res, err
	}
	if res.ServerOnly {
		res.Failures = append(res.Failures, checkServerOnly(out.f, out.effects)...)
	}
	res.Failovers = failovers(out.rec, moments, started)
	for _, fo := range res.Failovers {
		logf("failover after %s (+%.1fs): %s", fo.What, fo.At.Seconds(), fo.figure())
	}
	return res, nil
}

// faultMoment is when a fault struck: its failover is measured from there.
type faultMoment struct {
	kind, what string
	at         time.Time
}

// faults injects the plan's faults, each after its pause, once the cluster
// is healthy after the previous one and every run that awaited results
// then has committed since (so that one fault's failover figure does not
// include the next fault), until the plan or the workload is done. It
// returns the moments of the faults, and an error when a process did not
// come back or the cluster did not heal.
func (c *cluster) faults(ctx context.Context, plan []faultStep, done <-chan struct{}, awaiting func() []string, res *Result, logf func(string, ...any)) ([]faultMoment, error) {
	started := time.Now()
	var moments []faultMoment
	mark := func(kind, what string) {
		moments = append(moments, faultMoment{kind: kind, what: what, at: time.Now()})
		logf("%s", what)
	}
	for i, st := range plan {
		t := time.NewTimer(st.pause)
		select {
		case <-done:
			t.Stop()
			logf("the workload ended before the plan did: %d of %d faults injected", i, len(plan))
			return moments, nil
		case <-ctx.Done():
			t.Stop()
			return moments, ctx.Err()
		case <-t.C:
		}
		at := time.Since(started)
		waiting, struck := awaiting(), time.Now()
		desc, err := c.inject(ctx, st, mark)
		res.Faults[st.kind]++
		res.CrashLog = append(res.CrashLog, fmt.Sprintf("+%.1fs %s: %s", at.Seconds(), st.kind, desc))
		if err != nil {
			return moments, fmt.Errorf("fault %s (%s): %w", st.kind, desc, err)
		}
		healed := time.Now()
		hctx, cancel := context.WithTimeoutCause(ctx, healTimeout, errNotHealthy)
		err = c.waitHealthy(hctx)
		cancel()
		if err != nil {
			return moments, fmt.Errorf("after fault %s (%s): %w", st.kind, desc, err)
		}
		logf("%s done; the cluster is healthy (%.1fs after the fault ended)", st.kind, time.Since(healed).Seconds())
		pctx, cancel := context.WithTimeout(ctx, healTimeout)
		stuck := c.waitCommits(pctx, waiting, struck, done)
		cancel()
		if len(stuck) > 0 {
			logf("runs %s made no commit within %s of the fault; the plan goes on", strings.Join(stuck, ", "), healTimeout)
		}
	}
	logf("fault plan done: %d faults", len(plan))
	return moments, nil
}

// inject performs one fault and brings the processes back: it returns what
// it did. mark records the moment a process was hit.
func (c *cluster) inject(ctx context.Context, st faultStep, mark func(kind, what string)) (string, error) {
	lctx, cancel := context.WithTimeoutCause(ctx, healTimeout, errNotHealthy)
	defer cancel()
	leaders := func() (stream, meta string, err error) {
		if stream, err = c.waitStreamLeader(lctx); err != nil {
			return "", "", err
		}
		meta, err = c.waitMetaLeader(lctx)
		return stream, meta, err
	}
	// role names a server by what it leads.
	role := func(name, stream, meta string) string {
		var rs []string
		if name == stream {
			rs = append(rs, "events leader")
		}
		if name == meta {
			rs = append(rs, "meta leader")
		}
		if len(rs) == 0 {
			rs = append(rs, "follower")
		}
		return name + " (" + strings.Join(rs, ", ") + ")"
	}
	follower := func(stream, meta string) *natsNode {
		var fs []*natsNode
		for _, n := range c.nodes {
			if n.name != stream && n.name != meta {
				fs = append(fs, n)
			}
		}
		return fs[st.pick%len(fs)] // three servers, at most two leaders
	}
	killFor := func(p *proc, what string) error {
		mark(st.kind, what)
		p.kill()
		sleepCtx(ctx, st.down)
		p.restart()
		rctx, cancel := context.WithTimeoutCause(ctx, 60*time.Second, errNotReady)
		defer cancel()
		return p.waitReady(rctx)
	}

	switch st.kind {
	case FaultKillFollower, FaultKillStreamLeader, FaultKillMetaLeader:
		stream, meta, err := leaders()
		if err != nil {
			return "no leaders to aim at", err
		}
		var n *natsNode
		switch st.kind {
		case FaultKillFollower:
			n = follower(stream, meta)
		case FaultKillStreamLeader:
			n = c.node(stream)
		default:
			n = c.node(meta)
		}
		what := fmt.Sprintf("kill -9 %s, down %s", role(n.name, stream, meta), st.down.Round(time.Millisecond))
		return what, killFor(n.proc, what)

	case FaultStop:
		stream, meta, err := leaders()
		if err != nil {
			return "no leaders to aim at", err
		}
		var n *natsNode
		switch st.pick % 3 {
		case 0:
			n = c.node(stream)
		case 1:
			n = c.node(meta)
		default:
			n = follower(stream, meta)
		}
		what := fmt.Sprintf("SIGSTOP %s for %s", role(n.name, stream, meta), st.down.Round(time.Millisecond))
		mark(st.kind, what)
		if err := n.signal(syscall.SIGSTOP); err != nil {
			return what, err
		}
		sleepCtx(ctx, st.down)
		if err := n.signal(syscall.SIGCONT); err != nil {
			return what, err
		}
		return what + ", then SIGCONT", nil

	case FaultRolling:
		var order []string
		for i := range c.nodes {
			n := c.nodes[(st.pick+i)%len(c.nodes)]
			stream, meta, err := leaders()
			if err != nil {
				return "rolling restart " + strings.Join(order, ", "), err
			}
			what := "rolling restart: SIGTERM " + role(n.name, stream, meta)
			order = append(order, n.name)
			mark(st.kind, what)
			n.terminate(30 * time.Second)
			n.restart()
			rctx, rcancel := context.WithTimeoutCause(ctx, 60*time.Second, errNotReady)
			err = n.waitReady(rctx)
			rcancel()
			if err != nil {
				return "rolling restart " + strings.Join(order, ", "), err
			}
			hctx, hcancel := context.WithTimeoutCause(ctx, healTimeout, errNotHealthy)
			err = c.waitHealthy(hctx)
			hcancel()
			if err != nil {
				return "rolling restart " + strings.Join(order, ", "), fmt.Errorf("after the restart of %s: %w", n.name, err)
			}
		}
		return "rolling restart " + strings.Join(order, ", "), nil

	case FaultKillEngine:
		e := c.engines[st.pick%len(c.engines)]
		what := fmt.Sprintf("kill -9 %s (the other lives), down %s", e.name, st.down.Round(time.Millisecond))
		return what, killFor(e, what)

	case FaultKillEngines:
		if len(c.engines) < 2 {
			return "kill the engines", fmt.Errorf("%d engine(s): want two", len(c.engines))
		}
		first, second := c.engines[st.pick%2], c.engines[(st.pick+1)%2]
		what := fmt.Sprintf("kill -9 both engines; %s back after %s, %s %s later", first.name, st.down.Round(time.Millisecond),
			second.name, st.later.Round(time.Millisecond))
		mark(st.kind, what)
		first.kill()
		second.kill()
		for _, step := range []struct {
			p    *proc
			wait time.Duration
		}{{first, st.down}, {second, st.later}} {
			sleepCtx(ctx, step.wait)
			step.p.restart()
			rctx, cancel := context.WithTimeoutCause(ctx, 60*time.Second, errNotReady)
			err := step.p.waitReady(rctx)
			cancel()
			if err != nil {
				return what, err
			}
		}
		return what, nil
	}
	return st.kind, fmt.Errorf("unknown fault kind %q", st.kind)
}

// Failover is one fault's failover figure: for each run that had an
// unfinished batch when the fault struck, the time from the fault to the
// run's first commit after it (the events stream's message timestamps).
// These are figures, not pass/fail assertions.
type Failover struct {
	Kind  string
	What  string
	At    time.Duration // since the schedule's start
	Waits []time.Duration
}

// figure is the failover of one fault in words.
func (f Failover) figure() string {
	if len(f.Waits) == 0 {
		return "no run had an unfinished batch"
	}
	med, mx := medianMax(f.Waits)
	return fmt.Sprintf("%d runs with an unfinished batch, first commit after median %s, max %s", len(f.Waits), round(med), round(mx))
}

// failovers measures each fault moment against the events stream.
func failovers(rec *recorded, moments []faultMoment, started time.Time) []Failover {
	type commit struct {
		at                  time.Time
		submitted, finished []string // batch ids
	}
	byRun := map[string][]commit{}
	for _, r := range rec.events {
		runID, ok := names.RunOf(protocol.EventsFamily, r.Subject)
		if !ok {
			continue
		}
		cm := commit{at: r.Time}
		if evs, err := events.DecodeCommit(r.Data, r.Headers[protocol.HeaderEvent]); err == nil {
			for _, e := range evs {
				switch ev := e.(type) {
				case *events.BatchSubmitted:
					cm.submitted = append(cm.submitted, ev.BatchID)
				case *events.BatchFinalized:
					cm.finished = append(cm.finished, ev.BatchID)
				}
			}
		}
		byRun[runID] = append(byRun[runID], cm)
	}
	runs := make([]string, 0, len(byRun))
	for r := range byRun {
		runs = append(runs, r)
	}
	sort.Strings(runs)
	var out []Failover
	for _, m := range moments {
		fo := Failover{Kind: m.kind, What: m.what, At: m.at.Sub(started)}
		for _, run := range runs {
			open := map[string]bool{}
			var next time.Time
			for _, cm := range byRun[run] {
				if !cm.at.Before(m.at) {
					if next.IsZero() || cm.at.Before(next) {
						next = cm.at
					}
					continue
				}
				for _, b := range cm.submitted {
					open[b] = true
				}
				for _, b := range cm.finished {
					delete(open, b)
				}
			}
			if len(open) > 0 && !next.IsZero() {
				fo.Waits = append(fo.Waits, next.Sub(m.at))
			}
		}
		out = append(out, fo)
	}
	return out
}

// FailoverFigures is the median and maximum failover per fault kind, over
// every run of every fault of that kind.
func FailoverFigures(fos []Failover) string {
	waits := map[string][]time.Duration{}
	faults := map[string]int{}
	for _, f := range fos {
		waits[f.Kind] = append(waits[f.Kind], f.Waits...)
		faults[f.Kind]++
	}
	var parts []string
	for _, k := range AllFaults {
		if faults[k] == 0 {
			continue
		}
		if len(waits[k]) == 0 {
			parts = append(parts, fmt.Sprintf("%s: no unfinished batch (%d faults)", k, faults[k]))
			continue
		}
		med, mx := medianMax(waits[k])
		parts = append(parts, fmt.Sprintf("%s: median %s, max %s (%d faults, %d runs)", k, round(med), round(mx), faults[k], len(waits[k])))
	}
	if len(parts) == 0 {
		return "none measured"
	}
	return strings.Join(parts, "; ")
}

// medianMax returns the median and the maximum of ds (not empty).
func medianMax(ds []time.Duration) (time.Duration, time.Duration) {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	n := len(s)
	med := s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return med, s[n-1]
}

// round rounds a figure for people: milliseconds.
func round(d time.Duration) time.Duration { return d.Round(time.Millisecond) }

// faultCounts is a cluster schedule's faults by kind, in words.
func faultCounts(m map[string]int) string {
	total := 0
	var parts []string
	for _, k := range AllFaults {
		if m[k] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
		}
		total += m[k]
	}
	return fmt.Sprintf("%d (%s)", total, strings.Join(parts, ", "))
}
