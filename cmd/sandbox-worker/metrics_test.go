package main_test

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/toolbatch/toolbatch/client"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/internal/testnats"
	"github.com/toolbatch/toolbatch/internal/testproc"
	"github.com/toolbatch/toolbatch/internal/testwait"
)

const metricsCatalog = `
tools:
  - {id: echo, builtin: echo}
  - {id: fail, builtin: fail}
  - {id: dangerous, builtin: echo}
  - {id: canned, builtin: echo}
  - {id: send, builtin: echo}
  - {id: sb_ok, target: sandbox, dispatch_deadline: 20s}
  - {id: sb_fail, target: sandbox, dispatch_deadline: 20s}
  - {id: sb_slow, target: sandbox, dispatch_deadline: 20s}
gate:
  rules:
    - {tools: [dangerous], outcome: block, reason: not here}
    - {tools: [canned], outcome: set_result, output: {content: [{type: text, text: canned}]}}
    - {tools: [send], outcome: require_confirmation, deadline: 10m}
`

const metricsWorker = `
pools: [default]
isolation: none
tools:
  - {id: sb_ok, command: ["/bin/echo", "ok"]}
  - {id: sb_fail, command: ["/bin/sh", "-c", "exit 3"]}
  - {id: sb_slow, command: ["/bin/sleep", "5"], timeout: 1s}
`

// scrape reads a /metrics page.
func scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// sample returns the value of the sample of name with exactly labels
// (a histogram's: its count), and whether there is one.
func sample(fams map[string]*dto.MetricFamily, name string, labels ...string) (float64, bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
next:
	for _, m := range f.Metric {
		if len(m.Label) != len(labels)/2 {
			continue
		}
		for i := 0; i < len(labels); i += 2 {
			found := false
			for _, l := range m.Label {
				if l.GetName() == labels[i] && l.GetValue() == labels[i+1] {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		}
	}
	return 0, false
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestMetricsOfAKnownWorkload: a batch of calls of every outcome, and a
// ticket opened and answered; the engine's and the worker's /metrics,
// scraped over HTTP, count exactly that.
func TestMetricsOfAKnownWorkload(t *testing.T) {
	dir := t.TempDir()
	cat := filepath.Join(dir, "catalog.yaml")
	wcfg := filepath.Join(dir, "worker.yaml")
	if err := os.WriteFile(cat, []byte(metricsCatalog), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(wcfg, []byte(metricsWorker), 0o644); err != nil {
		t.Fatal(err)
	}
	port, em, wm := testproc.FreePort(t), testproc.FreePort(t), testproc.FreePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	engineAddr, workerAddr := fmt.Sprintf("127.0.0.1:%d", em), fmt.Sprintf("127.0.0.1:%d", wm)
	testproc.Start(t, "engine", `"engine ready"`, engineBin, "--store", filepath.Join(dir, "store"), "--listen", fmt.Sprintf("127.0.0.1:%d", port),
		"--catalog", cat, "--log-format", "json", "--metrics-listen", engineAddr)
	testproc.Start(t, "worker", `"ready"`, workerBin, "--nats-url", url, "--config", wcfg, "--worker-id", "mw",
		"--log-format", "json", "--metrics-listen", workerAddr, "--work-root", filepath.Join(dir, "work"))
	for _, addr := range []string{engineAddr, workerAddr} {
		if code, body := get(t, "http://"+addr+"/healthz"); code != 200 || body != "ok\n" {
			t.Errorf("%s /healthz: %d %q", addr, code, body)
		}
		testwait.Until(t, ctxT(t, 20*time.Second), addr+" ready", func() bool { code, _ := get(t, "http://"+addr+"/readyz"); return code == 200 })
	}
	cl, err := client.New(testnats.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 60*time.Second)
	tools := []string{"echo", "fail", "invented", "dangerous", "canned", "sb_ok", "sb_fail", "sb_slow"}
	if err := cl.Submit(ctx, batch("m", 1, tools...)); err != nil {
		t.Fatal(err)
	}
	res, err := cl.WaitResults(ctx, "m", "m/1")
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(texts(res)); !strings.Contains(got, "timed out after 1s") || !strings.Contains(got, "unknown tool: invented") {
		t.Fatalf("results: %s", got)
	}

	e := scrape(t, engineAddr)
	want := []struct {
		name   string
		labels []string
		value  float64
	}{
		{"toolbatch_batches_submitted_total", nil, 1},
		{"toolbatch_batches_finalized_total", nil, 1},
		{"toolbatch_batch_duration_seconds", nil, 1},
		{"toolbatch_calls_total", []string{"tool", "echo", "target", "brain", "outcome", "ok"}, 1},
		{"toolbatch_calls_total", []string{"tool", "fail", "target", "brain", "outcome", "error"}, 1},
		{"toolbatch_calls_total", []string{"tool", "_unknown", "target", "none", "outcome", "unknown"}, 1},
		{"toolbatch_calls_total", []string{"tool", "dangerous", "target", "brain", "outcome", "blocked"}, 1},
		{"toolbatch_calls_total", []string{"tool", "canned", "target", "brain", "outcome", "set_result"}, 1},
		{"toolbatch_calls_total", []string{"tool", "sb_ok", "target", "sandbox", "outcome", "ok"}, 1},
		{"toolbatch_calls_total", []string{"tool", "sb_fail", "target", "sandbox", "outcome", "error"}, 1},
		{"toolbatch_calls_total", []string{"tool", "sb_slow", "target", "sandbox", "outcome", "error"}, 1},
		{"toolbatch_gate_decisions_total", []string{"tool", "dangerous", "outcome", "deny", "source", "rule"}, 1},
		{"toolbatch_gate_decisions_total", []string{"tool", "canned", "outcome", "set_result", "source", "rule"}, 1},
		{"toolbatch_gate_decisions_total", []string{"tool", "echo", "outcome", "allow", "source", "default"}, 1},
		{"toolbatch_call_duration_seconds", []string{"tool", "sb_ok", "target", "sandbox", "stage", "gate"}, 1},
		{"toolbatch_call_duration_seconds", []string{"tool", "sb_ok", "target", "sandbox", "stage", "queue"}, 1},
		{"toolbatch_call_duration_seconds", []string{"tool", "sb_ok", "target", "sandbox", "stage", "execution"}, 1},
		{"toolbatch_call_duration_seconds", []string{"tool", "sb_ok", "target", "sandbox", "stage", "end_to_end"}, 1},
		{"toolbatch_call_duration_seconds", []string{"tool", "echo", "target", "brain", "stage", "execution"}, 1},
	}
	for _, w := range want {
		if got, ok := sample(e, w.name, w.labels...); !ok || got != w.value {
			t.Errorf("engine %s%v = %v (present %v), want %v", w.name, w.labels, got, ok, w.value)
		}
	}
	// the blocked call never ran: no execution stage
	if _, ok := sample(e, "toolbatch_call_duration_seconds", "tool", "dangerous", "target", "brain", "stage", "execution"); ok {
		t.Error("a blocked call has an execution duration")
	}
	if n, _ := sample(e, "toolbatch_commits_total"); n < 2 {
		t.Errorf("toolbatch_commits_total = %v", n)
	}
	for _, name := range []string{"toolbatch_build_info", "toolbatch_runs_owned", "toolbatch_inbox_pending", "go_goroutines", "process_cpu_seconds_total"} {
		if e[name] == nil {
			t.Errorf("engine: no %s", name)
		}
	}

	w := scrape(t, workerAddr)
	for _, c := range []struct {
		tool, result string
	}{{"sb_ok", "ok"}, {"sb_fail", "error"}, {"sb_slow", "timeout"}} {
		if got, ok := sample(w, "toolbatch_worker_claims_total", "pool", "default", "tool", c.tool, "granted", "true"); !ok || got != 1 {
			t.Errorf("worker claims of %s: %v", c.tool, got)
		}
		if got, ok := sample(w, "toolbatch_worker_tool_exits_total", "pool", "default", "tool", c.tool, "result", c.result); !ok || got != 1 {
			t.Errorf("worker exits of %s as %s: %v", c.tool, c.result, got)
		}
		if got, ok := sample(w, "toolbatch_worker_tool_duration_seconds", "pool", "default", "tool", c.tool); !ok || got != 1 {
			t.Errorf("worker durations of %s: %v", c.tool, got)
		}
	}
	if got, ok := sample(w, "toolbatch_worker_busy"); !ok || got != 0 {
		t.Errorf("toolbatch_worker_busy = %v after every call", got)
	}
	if got, ok := sample(w, "toolbatch_worker_slots"); !ok || got != 4 {
		t.Errorf("toolbatch_worker_slots = %v, want the default concurrency 4", got)
	}
	if got, ok := sample(e, "toolbatch_pool_workers", "pool", "default"); !ok || got != 1 {
		t.Errorf("toolbatch_pool_workers{pool=default} = %v (present %v), want the one worker", got, ok)
	}

	// A ticket: open while it waits, gone once answered.
	watch, err := cl.Watch(ctx, "m")
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Stop()
	if err := cl.Submit(ctx, batch("m", 2, "send")); err != nil {
		t.Fatal(err)
	}
	ticket := nextTicket(t, ctx, watch, "m/2")
	open := func(want float64) func() bool {
		return func() bool {
			got, ok := sample(scrape(t, engineAddr), "toolbatch_tickets_open", "reason", string(events.WaitPermission))
			return got == want && (ok || want == 0)
		}
	}
	testwait.Until(t, ctx, "one open permission ticket", open(1))
	if err := cl.Approve(ctx, *ticket, "alice", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.WaitResults(ctx, "m", "m/2"); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, ctx, "no open ticket", open(0))

	// toolbatch status sees the worker with its pool and tools
	st, err := cl.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Workers) != 1 || st.Workers[0].ID != "mw" || fmt.Sprint(st.Workers[0].Pools) != "[default]" || len(st.Workers[0].Tools) != 3 {
		t.Fatalf("status workers: %+v", st.Workers)
	}
	for _, tool := range st.Workers[0].Tools {
		if tool.Pool != "default" || !strings.HasPrefix(tool.Tool, "sb_") || tool.Capability == "" {
			t.Errorf("status worker tool: %+v", tool)
		}
	}
}

// TestReadyzFollowsNATS: the engine's and the worker's /readyz fail,
// saying why, while their NATS server is down, and pass once it is back.
func TestReadyzFollowsNATS(t *testing.T) {
	dir := t.TempDir()
	wcfg := filepath.Join(dir, "worker.yaml")
	cat := filepath.Join(dir, "catalog.yaml")
	if err := os.WriteFile(wcfg, []byte(metricsWorker), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cat, []byte(metricsCatalog), 0o644); err != nil {
		t.Fatal(err)
	}
	port, em, wm := testproc.FreePort(t), testproc.FreePort(t), testproc.FreePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	server := func() *testproc.Proc {
		return testproc.Start(t, "nats-server", "Server is ready", natsBin, "-js", "-sd", filepath.Join(dir, "nats"), "-a", "127.0.0.1", "-p", fmt.Sprint(port))
	}
	srv := server()
	testproc.Start(t, "engine", `"engine ready"`, engineBin, "--nats-url", url, "--store", filepath.Join(dir, "store"),
		"--catalog", cat, "--log-format", "json", "--metrics-listen", fmt.Sprintf("127.0.0.1:%d", em))
	testproc.Start(t, "worker", `"ready"`, workerBin, "--nats-url", url, "--config", wcfg, "--worker-id", "rw",
		"--log-format", "json", "--metrics-listen", fmt.Sprintf("127.0.0.1:%d", wm), "--work-root", filepath.Join(dir, "work"))
	ready := func(want int, body string) func() bool {
		return func() bool {
			for _, p := range []int{em, wm} {
				code, got := get(t, fmt.Sprintf("http://127.0.0.1:%d/readyz", p))
				if code != want || !strings.Contains(got, body) {
					return false
				}
			}
			return true
		}
	}
	ctx := ctxT(t, 60*time.Second)
	testwait.Until(t, ctx, "both ready", ready(200, "ready"))
	srv.Kill()
	testwait.Until(t, ctx, "both not ready: NATS down", ready(503, "not ready: NATS connection"))
	server()
	testwait.Until(t, ctx, "both ready again", ready(200, "ready"))
}
