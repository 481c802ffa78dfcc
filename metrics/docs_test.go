package metrics_test

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	"github.com/toolbatch/toolbatch/metrics"
)

// recorder keeps the collectors registered with it.
type recorder struct{ cs []prometheus.Collector }

func (r *recorder) Register(c prometheus.Collector) error   { r.cs = append(r.cs, c); return nil }
func (r *recorder) MustRegister(cs ...prometheus.Collector) { r.cs = append(r.cs, cs...) }
func (r *recorder) Unregister(prometheus.Collector) bool    { return false }

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// names returns every metric the engine and the worker define.
func names(t *testing.T) map[string]bool {
	r := &recorder{}
	counts := func() map[string]int { return nil }
	gauge := func() float64 { return 0 }
	metrics.NewEngine(r, metrics.EngineGauges{RunsOwned: gauge, InboxPending: gauge, TicketsOpen: counts, PoolWorkers: counts})
	metrics.NewWorker(r, counts)
	out := map[string]bool{}
	for _, c := range r.cs {
		ch := make(chan *prometheus.Desc, 64)
		c.Describe(ch)
		close(ch)
		for d := range ch {
			m := fqName.FindStringSubmatch(d.String())
			if m == nil {
				t.Fatalf("no name in %s", d)
			}
			out[m[1]] = true
		}
	}
	if len(out) < 25 {
		t.Fatalf("only %d metrics found: %v", len(out), out)
	}
	return out
}

var metricToken = regexp.MustCompile(`\btoolbatch_[a-z_]+`)

// checkExpr: every toolbatch metric an expression names exists.
func checkExpr(t *testing.T, where, expr string, known map[string]bool) {
	t.Helper()
	if strings.Count(expr, "(") != strings.Count(expr, ")") || strings.Count(expr, "{") != strings.Count(expr, "}") {
		t.Errorf("%s: unbalanced expression %q", where, expr)
	}
	found := metricToken.FindAllString(expr, -1)
	if len(found) == 0 && !strings.Contains(expr, "up{") {
		t.Errorf("%s: %q names no toolbatch metric", where, expr)
	}
	for _, name := range found {
		base := name
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(name, suffix); ok && known[b] {
				base = b
			}
		}
		if !known[base] {
			t.Errorf("%s: %q names %s, which no program defines", where, expr, name)
		}
	}
}

// TestOperationsListsEveryMetric: docs/operations.md names every metric.
func TestOperationsListsEveryMetric(t *testing.T) {
	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	for name := range names(t) {
		if !strings.Contains(string(doc), "`"+name+"`") {
			t.Errorf("docs/operations.md does not list %s", name)
		}
	}
}

// TestDashboard: the Grafana dashboard is JSON whose every query names
// metrics the programs define.
func TestDashboard(t *testing.T) {
	known := names(t)
	data, err := os.ReadFile("../docs/monitoring/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string `json:"title"`
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	queries := 0
	for _, p := range dash.Panels {
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			queries++
			checkExpr(t, "panel "+p.Title, q.Expr, known)
			for _, n := range metricToken.FindAllString(q.Expr, -1) {
				used[strings.TrimSuffix(n, "_bucket")] = true
			}
		}
	}
	// what the issue asks the dashboard to show
	for _, n := range []string{"toolbatch_batches_submitted_total", "toolbatch_call_duration_seconds", "toolbatch_calls_total",
		"toolbatch_tickets_open", "toolbatch_recoveries_total", "toolbatch_worker_busy", "toolbatch_worker_slots"} {
		if !used[n] {
			t.Errorf("the dashboard does not show %s", n)
		}
	}
	if queries < 20 {
		t.Errorf("%d queries", queries)
	}
}

// TestAlertRules: the example rules are Prometheus rule groups whose every
// expression names metrics the programs define.
func TestAlertRules(t *testing.T) {
	known := names(t)
	data, err := os.ReadFile("../docs/monitoring/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Expr        string            `yaml:"expr"`
				For         string            `yaml:"for"`
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	dec.KnownFields(true)
	if err := dec.Decode(&rules); err != nil {
		t.Fatal(err)
	}
	alerts := map[string]bool{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			alerts[r.Alert] = true
			checkExpr(t, "alert "+r.Alert, r.Expr, known)
			if r.Annotations["summary"] == "" || r.Labels["severity"] == "" {
				t.Errorf("alert %s: no summary or severity", r.Alert)
			}
		}
	}
	// what the issue asks the rules to catch
	for _, a := range []string{"ToolbatchInboxStuck", "ToolbatchIndeterminateCalls", "ToolbatchResultsRefused", "ToolbatchNoWorkerForPool"} {
		if !alerts[a] {
			t.Errorf("no alert %s", a)
		}
	}
}
