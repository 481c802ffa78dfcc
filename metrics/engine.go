package metrics

import (
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/internal/inorder"
	"github.com/toolbatch/toolbatch/protocol"
)

// Labels' values.
const (
	// Stages of toolbatch_call_duration_seconds.
	StageGate      = "gate"
	StageQueue     = "queue"
	StageExecution = "execution"
	StageEndToEnd  = "end_to_end"

	// Recovery actions of toolbatch_recoveries_total.
	RecoveryReplayed      = "replayed"
	RecoveryRedispatched  = "redispatched"
	RecoveryIndeterminate = "indeterminate"

	// UnknownTool is the tool label of a call of a tool the catalog does
	// not have: a model may invent any name, and a label must stay bounded.
	UnknownTool = "_unknown"
)

// Engine is the engine's metrics. Its counters and histograms are fed by
// Committed with the events of every commit the engine appends, so that
// across engines each fact is counted once, by the engine that committed
// it. A nil *Engine counts nothing.
type Engine struct {
	batchesSubmitted prometheus.Counter
	batchesRejected  *prometheus.CounterVec
	batchesFinalized prometheus.Counter
	batchDuration    prometheus.Histogram
	calls            *prometheus.CounterVec
	callDuration     *prometheus.HistogramVec
	gateDecisions    *prometheus.CounterVec
	runsEnded        *prometheus.CounterVec
	recoveries       *prometheus.CounterVec
	timersOverdue    *prometheus.CounterVec
	resultsRefused   *prometheus.CounterVec
	commits          prometheus.Counter
	conflicts        prometheus.Counter

	mu      sync.Mutex
	batches map[string]*batchSeen // in-flight batches by batch id
	series  map[[2]string]*series // each tool's and target's series
}

// batchSeen is what the durations need of a batch in flight: when it and
// each call's stages began, as the events say.
type batchSeen struct {
	id        string
	submitted time.Time
	calls     []callSeen // in the batch's order
	last      int        // the index of the call last looked up
}

type callSeen struct {
	id        string
	series    *series
	history   events.CallHistory
	executing time.Time // the latest attempt's
	claimed   time.Time
}

// call returns one of the batch's calls (nil: none of that id).
func (b *batchSeen) call(id string) *callSeen {
	return inorder.Find(b.calls, &b.last, id, func(c *callSeen) string { return c.id })
}

// series are one tool's and target's series, each looked up in its vector
// once, at its first observation (a series exists only once observed;
// their labels are bounded by the catalog).
type series struct {
	m            *Engine
	tool, target string
	stages       [4]prometheus.Observer // by stageNames' index
	outcomes     map[events.CallOutcome]prometheus.Counter
	gates        map[[2]string]prometheus.Counter // by outcome and source
}

var stageNames = [4]string{StageGate, StageQueue, StageExecution, StageEndToEnd}

const (
	gate = iota
	queue
	execution
	endToEnd
)

func (s *series) observe(stage int, v float64) {
	if s.stages[stage] == nil {
		s.stages[stage] = s.m.callDuration.WithLabelValues(s.tool, s.target, stageNames[stage])
	}
	s.stages[stage].Observe(v)
}

func (s *series) ended(outcome events.CallOutcome) {
	c := s.outcomes[outcome]
	if c == nil {
		c = s.m.calls.WithLabelValues(s.tool, s.target, string(outcome))
		s.outcomes[outcome] = c
	}
	c.Inc()
}

func (s *series) gated(outcome, source string) {
	k := [2]string{outcome, source}
	c := s.gates[k]
	if c == nil {
		c = s.m.gateDecisions.WithLabelValues(s.tool, outcome, source)
		s.gates[k] = c
	}
	c.Inc()
}

func (m *Engine) seriesOf(tool, target string) *series {
	k := [2]string{tool, target}
	s := m.series[k]
	if s == nil {
		s = &series{m: m, tool: tool, target: target, outcomes: map[events.CallOutcome]prometheus.Counter{}, gates: map[[2]string]prometheus.Counter{}}
		m.series[k] = s
	}
	return s
}

// maxBatches bounds the batches whose times are kept: beyond it they are
// forgotten (their calls are still counted, without durations).
const maxBatches = 1 << 16

// The histograms' buckets, in seconds: from a fast brain call's
// milliseconds to a parked batch's hours.
var durationBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 14400}

// NewEngine registers the engine's metrics (and the Go and process
// collectors) with reg. Gauges whose value the engine reads when scraped
// are given as functions; a nil function leaves its gauge out.
func NewEngine(reg prometheus.Registerer, g EngineGauges) *Engine {
	f := factory{reg}
	m := &Engine{
		batchesSubmitted: f.counter("toolbatch_batches_submitted_total", "Batches accepted: committed as BatchSubmitted."),
		batchesRejected:  f.counterVec("toolbatch_batches_rejected_total", "Submissions rejected, by rejection code.", "code"),
		batchesFinalized: f.counter("toolbatch_batches_finalized_total", "Batches finalized: every call terminal, results published."),
		batchDuration: f.histogram("toolbatch_batch_duration_seconds",
			"From a batch's acceptance to its finalization (parked time included)."),
		calls: f.counterVec("toolbatch_calls_total",
			"Calls that reached a terminal phase, by tool, target and outcome.", "tool", "target", "outcome"),
		callDuration: f.histogramVec("toolbatch_call_duration_seconds",
			"Calls' stages: gate (accepted to decided), queue (executing committed to claim granted, sandbox tools), execution (entered to completed, the last attempt), end_to_end (accepted to terminal).",
			"tool", "target", "stage"),
		gateDecisions: f.counterVec("toolbatch_gate_decisions_total",
			"Gate decisions, by tool, outcome and the stage that made them.", "tool", "outcome", "source"),
		runsEnded:      f.counterVec("toolbatch_runs_ended_total", "Runs ended, by cause.", "cause"),
		recoveries:     f.counterVec("toolbatch_recoveries_total", "Recovery actions on calls found executing after a crash or takeover.", "action"),
		resultsRefused: f.counterVec("toolbatch_results_refused_total", "Executor results refused (stale attempt, bad token, ...), by reason.", "reason"),
		timersOverdue: f.counterVec("toolbatch_timers_overdue_total",
			"Ticket timers (action expire or perform) an engine found unfired well after their time and scheduled again: their stored schedule was lost or late. Each engine counts each such timer once.", "action"),
		commits:   f.counter("toolbatch_commits_total", "Commits appended to the events stream."),
		conflicts: f.counter("toolbatch_commit_conflicts_total", "Appends refused because the run was extended elsewhere (the key confirmed, then reloaded and decided again, or the run let go)."),
		batches:   map[string]*batchSeen{},
		series:    map[[2]string]*series{},
	}
	for _, action := range []string{protocol.TimerExpire, protocol.TimerPerform} {
		m.timersOverdue.WithLabelValues(action) // at 0 from the start, so that the first one is an increase
	}
	info := f.gaugeVec("toolbatch_build_info", "The engine's version and Go version (always 1).", "version", "go_version")
	info.WithLabelValues(version(), goVersion()).Set(1)
	f.gaugeFunc("toolbatch_runs_owned", "Runs this engine owns now.", g.RunsOwned)
	f.gaugeFunc("toolbatch_inbox_pending", "Inbox messages not yet taken or not yet acknowledged by the engines.", g.InboxPending)
	if g.TicketsOpen != nil {
		reg.MustRegister(&countsCollector{desc: prometheus.NewDesc("toolbatch_tickets_open",
			"Open tickets of every run, by wait reason (the same on every engine: aggregate with max, not sum).", []string{"reason"}, nil), read: g.TicketsOpen})
	}
	if g.PoolWorkers != nil {
		reg.MustRegister(&countsCollector{desc: prometheus.NewDesc("toolbatch_pool_workers",
			"Live sandbox workers advertising tools of each pool the catalog names (0: the pool's calls wait; aggregate with max).", []string{"pool"}, nil), read: g.PoolWorkers})
	}
	return m
}

// EngineGauges are the gauges read when scraped.
type EngineGauges struct {
	RunsOwned    func() float64
	InboxPending func() float64
	TicketsOpen  func() map[string]int
	PoolWorkers  func() map[string]int
}

// Commit counts an append; Conflict an append refused by a concurrent one.
func (m *Engine) Commit() {
	if m != nil {
		m.commits.Inc()
	}
}

func (m *Engine) Conflict() {
	if m != nil {
		m.conflicts.Inc()
	}
}

// TimerOverdue counts a ticket's timer fired by the sweep.
func (m *Engine) TimerOverdue(action string) {
	if m != nil {
		m.timersOverdue.WithLabelValues(action).Inc()
	}
}

// Redispatched counts a sandbox job published again for an attempt found
// executing without a claim.
func (m *Engine) Redispatched() {
	if m != nil {
		m.recoveries.WithLabelValues(RecoveryRedispatched).Inc()
	}
}

// Rejected counts a submission rejected before anything was committed
// (the rejection is published, not committed).
func (m *Engine) Rejected(code string) {
	if m != nil {
		m.batchesRejected.WithLabelValues(code).Inc()
	}
}

// Committed counts what a commit's events say, in order.
func (m *Engine) Committed(runID string, evs []events.Event) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var b *batchSeen // the batch of the event before: a commit's events are mostly of one
	for _, e := range evs {
		b = m.observe(b, e)
	}
}

// observe counts one event; b is the batch of the event before (nil: none
// known), and it returns the batch of this one.
func (m *Engine) observe(b *batchSeen, e events.Event) *batchSeen {
	switch ev := e.(type) {
	case *events.BatchSubmitted:
		m.batchesSubmitted.Inc()
		if len(m.batches) >= maxBatches {
			clear(m.batches)
		}
		b = &batchSeen{id: ev.BatchID, submitted: ev.At, calls: make([]callSeen, len(ev.Calls))}
		for i, c := range ev.Calls {
			tool, target := c.ToolID, string(c.Tool.Target)
			if c.Tool.Kind == events.KindUnknown {
				tool, target = UnknownTool, events.NoTarget
			}
			b.calls[i] = callSeen{id: c.CallID, series: m.seriesOf(tool, target)}
		}
		m.batches[ev.BatchID] = b
		return b
	case *events.BatchRejected:
		m.batchesRejected.WithLabelValues(string(ev.Code)).Inc()
	case *events.CallGated:
		if b, c := m.call(b, ev.BatchID, ev.CallID); c != nil {
			c.history.Gate = ev.Outcome
			c.series.gated(ev.Label, events.GateSource(ev.Stage))
			c.series.observe(gate, seconds(b.submitted, ev.At))
			return b
		}
	case *events.CallExecuting:
		if ev.Cause == events.CauseRecovered {
			m.recoveries.WithLabelValues(RecoveryReplayed).Inc()
		}
		if b, c := m.call(b, ev.BatchID, ev.CallID); c != nil {
			c.executing, c.claimed, c.history.Executed = ev.At, time.Time{}, true
			return b
		}
	case *events.CallClaimed:
		if b, c := m.call(b, ev.BatchID, ev.CallID); c != nil {
			c.claimed = ev.At
			if !c.executing.IsZero() {
				c.series.observe(queue, seconds(c.executing, ev.At))
			}
			return b
		}
	case *events.TicketResolved:
		if b, c := m.call(b, ev.BatchID, ev.CallID); c != nil {
			c.history.Resolution = ev.Resolution
			return b
		}
	case *events.CallCompleted:
		if b, c := m.call(b, ev.BatchID, ev.CallID); c != nil {
			c.series.ended(c.history.Completed(ev))
			m.terminal(b, c, ev.At)
			return b
		}
	case *events.CallIndeterminate:
		m.recoveries.WithLabelValues(RecoveryIndeterminate).Inc()
		if b, c := m.call(b, ev.BatchID, ev.CallID); c != nil {
			c.series.ended(events.OutcomeIndeterminate)
			m.terminal(b, c, ev.At)
			return b
		}
	case *events.BatchFinalized:
		m.batchesFinalized.Inc()
		if b := m.batches[ev.BatchID]; b != nil {
			m.batchDuration.Observe(seconds(b.submitted, ev.At))
			delete(m.batches, ev.BatchID)
		}
		return nil
	case *events.RunEnded:
		m.runsEnded.WithLabelValues(string(ev.Cause)).Inc()
	case *events.ResultRefused:
		m.resultsRefused.WithLabelValues(refusalReason(ev.Reason)).Inc()
	}
	return b
}

// call returns a batch in flight and one of its calls (nil, nil when the
// batch was accepted before this engine started or took the run over); b
// is the batch last seen, looked up again only if it is not batchID.
func (m *Engine) call(b *batchSeen, batchID, callID string) (*batchSeen, *callSeen) {
	if b == nil || b.id != batchID {
		if b = m.batches[batchID]; b == nil {
			return nil, nil
		}
	}
	return b, b.call(callID)
}

func (m *Engine) terminal(b *batchSeen, c *callSeen, at time.Time) {
	if !c.executing.IsZero() {
		from := c.executing
		if !c.claimed.IsZero() {
			from = c.claimed
		}
		c.series.observe(execution, seconds(from, at))
	}
	c.series.observe(endToEnd, seconds(b.submitted, at))
}

// refusalReason bounds a refusal's reason to its first words: the
// engine's reasons name the attempt or token after a colon.
func refusalReason(reason string) string {
	if i := strings.IndexAny(reason, ":("); i >= 0 {
		reason = reason[:i]
	}
	return strings.TrimSpace(reason)
}

func seconds(from, to time.Time) float64 {
	if from.IsZero() || to.Before(from) {
		return 0
	}
	return to.Sub(from).Seconds()
}

func goVersion() string { return runtime.Version() }

// version is the program's module version ("(devel)" when built from a
// checkout).
func version() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}

// countsCollector reports a gauge of one label read when scraped.
type countsCollector struct {
	desc *prometheus.Desc
	read func() map[string]int
}

func (c *countsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }
func (c *countsCollector) Collect(ch chan<- prometheus.Metric) {
	for reason, n := range c.read() {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), reason)
	}
}
