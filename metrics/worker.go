package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Exit results of toolbatch_worker_tool_exits_total (sandbox.Result.Exit).
const (
	ExitOK      = "ok"
	ExitError   = "error"
	ExitTimeout = "timeout"
	ExitLimit   = "limit"
	ExitKilled  = "killed"
)

// Heartbeat results of toolbatch_worker_heartbeats_total.
const (
	HeartbeatOK     = "ok"
	HeartbeatLost   = "lost"   // the engine answered that the claim is gone
	HeartbeatFailed = "failed" // no answer
)

// Worker is a sandbox worker's metrics. A nil *Worker counts nothing.
type Worker struct {
	claims       *prometheus.CounterVec
	toolDuration *prometheus.HistogramVec
	toolExits    *prometheus.CounterVec
	sandboxStart prometheus.Histogram
	busy         prometheus.Gauge
	slots        prometheus.Gauge
	heartbeats   *prometheus.CounterVec
}

// NewWorker registers a worker's metrics with reg. ready, when not nil,
// reports each tool's pre-started sandboxes ready now.
func NewWorker(reg prometheus.Registerer, ready func() map[string]int) *Worker {
	f := factory{reg}
	w := &Worker{
		claims: f.counterVec("toolbatch_worker_claims_total", "Claims asked of the engines, by pool, tool and whether they were granted; a call granted with a result (api.result) counts as a granted claim.", "pool", "tool", "granted"),
		toolDuration: f.histogramVec("toolbatch_worker_tool_duration_seconds",
			"How long granted calls ran, from the grant to the tool's result.", "pool", "tool"),
		toolExits: f.counterVec("toolbatch_worker_tool_exits_total",
			"How granted calls ended: ok, error (non-zero exit, bad output, could not start), timeout, limit (output, CPU or file size), killed (a signal, or stopped: claim lost or worker aborted).",
			"pool", "tool", "result"),
		sandboxStart: f.histogram("toolbatch_worker_sandbox_start_seconds", "How long a pre-started sandbox took to become ready."),
		busy:         f.gauge("toolbatch_worker_busy", "Calls this worker holds a slot for now (claiming or running)."),
		slots:        f.gauge("toolbatch_worker_slots", "The calls this worker runs at once (its --concurrency): toolbatch_worker_busy's ceiling."),
		heartbeats:   f.counterVec("toolbatch_worker_heartbeats_total", "Heartbeats of running calls, by result.", "result"),
	}
	info := f.gaugeVec("toolbatch_build_info", "The program's version and Go version (always 1).", "version", "go_version")
	info.WithLabelValues(version(), goVersion()).Set(1)
	if ready != nil {
		reg.MustRegister(&countsCollector{desc: prometheus.NewDesc("toolbatch_worker_sandboxes_ready",
			"Pre-started sandboxes ready for a call now, by tool.", []string{"tool"}, nil), read: ready})
	}
	return w
}

// Claim counts a claim's answer.
func (w *Worker) Claim(pool, tool string, granted bool) {
	if w != nil {
		g := "false"
		if granted {
			g = "true"
		}
		w.claims.WithLabelValues(pool, tool, g).Inc()
	}
}

// Ran counts a granted call's end.
func (w *Worker) Ran(pool, tool, result string, took time.Duration) {
	if w != nil {
		w.toolDuration.WithLabelValues(pool, tool).Observe(took.Seconds())
		w.toolExits.WithLabelValues(pool, tool, result).Inc()
	}
}

// SandboxStarted observes a pre-started sandbox's start.
func (w *Worker) SandboxStarted(took time.Duration) {
	if w != nil {
		w.sandboxStart.Observe(took.Seconds())
	}
}

// Busy adds to the calls holding a slot.
func (w *Worker) Busy(delta float64) {
	if w != nil {
		w.busy.Add(delta)
	}
}

// Slots sets the number of calls the worker runs at once.
func (w *Worker) Slots(n int) {
	if w != nil {
		w.slots.Set(float64(n))
	}
}

// Heartbeat counts a heartbeat's result.
func (w *Worker) Heartbeat(result string) {
	if w != nil {
		w.heartbeats.WithLabelValues(result).Inc()
	}
}
