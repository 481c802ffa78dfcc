package main_test

import (
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/toolbatch/toolbatch/client"
	"github.com/toolbatch/toolbatch/internal/testnats"
	"github.com/toolbatch/toolbatch/internal/testproc"
	"github.com/toolbatch/toolbatch/internal/testwait"
)

// receiver is an OTLP/HTTP trace receiver: it keeps every span exported to
// it, with its service's name.
type receiver struct {
	mu    sync.Mutex
	spans []gotSpan
}

type gotSpan struct {
	service string
	*tracepb.Span
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.URL.Path != "/v1/traces" || req.Header.Get("Content-Type") != "application/x-protobuf" {
		http.Error(w, "not an OTLP/HTTP protobuf trace export", http.StatusBadRequest)
		return
	}
	body, err := io.ReadAll(req.Body)
	var export collectortrace.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(body, &export)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	for _, rs := range export.ResourceSpans {
		service := attr(rs.GetResource().GetAttributes(), "service.name")
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				r.spans = append(r.spans, gotSpan{service, s})
			}
		}
	}
	r.mu.Unlock()
	out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// all returns every span received.
func (r *receiver) all() []gotSpan {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]gotSpan(nil), r.spans...)
}

// named returns the spans named name.
func (r *receiver) named(name string) []gotSpan {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []gotSpan
	for _, s := range r.spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

func attr(kvs []*commonpb.KeyValue, key string) string {
	for _, kv := range kvs {
		if kv.Key == key {
			switch v := kv.Value.Value.(type) {
			case *commonpb.AnyValue_StringValue:
				return v.StringValue
			case *commonpb.AnyValue_IntValue:
				return fmt.Sprint(v.IntValue)
			}
			return kv.Value.String()
		}
	}
	return ""
}

const traceCatalog = `
tools:
  - {id: echo, builtin: echo}
  - {id: fail, builtin: fail}
  - {id: dangerous, builtin: echo}
  - {id: send, builtin: echo}
  - {id: sb_env, target: sandbox, dispatch_deadline: 20s}
  - {id: sb_after, target: sandbox, dispatch_deadline: 20s}
gate:
  rules:
    - {tools: [dangerous], outcome: block, reason: not here}
    - {tools: [send], outcome: require_confirmation, deadline: 10m}
`

const traceWorker = `
pools: [default]
isolation: none
tools:
  - {id: sb_env, command: ["/bin/sh", "-c", "printf '%s' \"$TRACEPARENT\""]}
  - {id: sb_after, command: ["/bin/sh", "-c", "printf '%s' \"$TRACEPARENT\""]}
`

// TestTraceThroughEngineWorkerAndTool: a submission with a traceparent
// becomes a batch span under it, an execute_tool span per call under the
// batch (the gate decision as an event, a failure as an error status), a
// ticket span for the wait; the sandbox call's attempt span carries the
// worker's claim (its id, its pool, the claim's time as an event), and the
// tool finds that attempt's span in TRACEPARENT. The engine
// is killed while the batch waits on its ticket: the engine that takes the
// run back ends the batch under the same parent (the traceparent kept in
// the commit's headers), and the sandbox call it dispatches after the
// ticket (sb_after) gives its tool the context of its attempt's span.
func TestTraceThroughEngineWorkerAndTool(t *testing.T) {
	recv := &receiver{}
	otlp := httptest.NewServer(recv)
	defer otlp.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.URL)
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "20") // export within 20 ms

	dir := t.TempDir()
	cat, wcfg := filepath.Join(dir, "catalog.yaml"), filepath.Join(dir, "worker.yaml")
	if err := os.WriteFile(cat, []byte(traceCatalog), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(wcfg, []byte(traceWorker), 0o644); err != nil {
		t.Fatal(err)
	}
	port := testproc.FreePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	engineArgs := []string{"--store", filepath.Join(dir, "store"), "--listen", fmt.Sprintf("127.0.0.1:%d", port), "--catalog", cat, "--log-format", "json"}
	eng := testproc.Start(t, "engine", `"engine ready"`, engineBin, engineArgs...)
	testproc.Start(t, "worker", `"ready"`, workerBin, "--nats-url", url, "--config", wcfg, "--worker-id", "tw",
		"--log-format", "json", "--work-root", filepath.Join(dir, "work"))
	cl, err := client.New(testnats.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 90*time.Second)
	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	watch, err := cl.Watch(ctx, "tr")
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Stop()
	if err := cl.Submit(client.WithTraceParent(ctx, "00-"+traceID+"-"+parentID+"-01"), batch("tr", 1, "echo", "fail", "dangerous", "sb_env", "send", "sb_after")); err != nil {
		t.Fatal(err)
	}
	ticket := nextTicket(t, ctx, watch, "")
	// the four calls before the ticket are exported
	testwait.Until(t, ctx, "the spans of the calls before the ticket", func() bool {
		return len(recv.named("execute_tool sb_env")) == 1 &&
			len(recv.named("execute_tool echo")) == 1 && len(recv.named("execute_tool fail")) == 1 && len(recv.named("execute_tool dangerous")) == 1
	})
	if n := len(recv.named("toolbatch.batch")); n != 0 {
		t.Fatalf("%d batch spans before the batch ended", n)
	}

	eng.Kill()
	testproc.Start(t, "engine again", `"engine ready"`, engineBin, engineArgs...)
	if err := cl.Approve(ctx, *ticket, "alice", "ok"); err != nil {
		t.Fatal(err)
	}
	res, err := cl.WaitResults(ctx, "tr", "tr/1")
	if err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, ctx, "the batch's span", func() bool {
		return len(recv.named("toolbatch.batch")) == 1 && len(recv.named("execute_tool send")) == 1 && len(recv.named("toolbatch.ticket permission")) == 1 &&
			len(recv.named("execute_tool sb_after")) == 1
	})

	id := func(b []byte) string { return hex.EncodeToString(b) }
	batchSpan := recv.named("toolbatch.batch")[0]
	if id(batchSpan.TraceId) != traceID || id(batchSpan.ParentSpanId) != parentID {
		t.Errorf("batch span: trace %s parent %s, want %s %s", id(batchSpan.TraceId), id(batchSpan.ParentSpanId), traceID, parentID)
	}
	if batchSpan.service != "toolbatch-engine" || attr(batchSpan.Attributes, "toolbatch.run_id") != "tr" || attr(batchSpan.Attributes, "toolbatch.batch_id") != "tr/1" {
		t.Errorf("batch span: service %q, attributes %v", batchSpan.service, batchSpan.Attributes)
	}
	want := map[string]struct {
		attempt, outcome, gate string
		failed                 bool
	}{
		"echo":      {"1", "ok", "allow", false},
		"fail":      {"1", "error", "allow", true},
		"dangerous": {"0", "blocked", "block", false},
		"sb_env":    {"1", "ok", "allow", false},
		"send":      {"1", "ok", "require_confirmation", false},
		"sb_after":  {"1", "ok", "allow", false},
	}
	attempts := map[string]gotSpan{}
	for tool, w := range want {
		s := recv.named("execute_tool " + tool)[0]
		attempts[tool] = s
		if id(s.TraceId) != traceID || id(s.ParentSpanId) != id(batchSpan.SpanId) {
			t.Errorf("%s: trace %s parent %s, want the batch span %s", tool, id(s.TraceId), id(s.ParentSpanId), id(batchSpan.SpanId))
		}
		for k, v := range map[string]string{"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool, "gen_ai.tool.type": "function",
			"toolbatch.run_id": "tr", "toolbatch.batch_id": "tr/1", "toolbatch.attempt": w.attempt, "toolbatch.outcome": w.outcome, "toolbatch.gate.outcome": w.gate} {
			if got := attr(s.Attributes, k); got != v {
				t.Errorf("%s: %s = %q, want %q", tool, k, got, v)
			}
		}
		if attr(s.Attributes, "gen_ai.tool.call.id") == "" {
			t.Errorf("%s: no gen_ai.tool.call.id", tool)
		}
		if failed := s.Status.GetCode() == tracepb.Status_STATUS_CODE_ERROR; failed != w.failed || failed && attr(s.Attributes, "error.type") == "" {
			t.Errorf("%s: status %v, error.type %q", tool, s.Status, attr(s.Attributes, "error.type"))
		}
		if len(s.Events) == 0 || s.Events[0].Name != "toolbatch.gate" || attr(s.Events[0].Attributes, "toolbatch.gate.outcome") != w.gate {
			t.Errorf("%s: events %v, want toolbatch.gate first", tool, s.Events)
		}
		sandboxed := tool == "sb_env" || tool == "sb_after"
		if got := attr(s.Attributes, "toolbatch.tool.target"); got != map[bool]string{true: "sandbox", false: "brain"}[sandboxed] {
			t.Errorf("%s: target %q", tool, got)
		}
		if !sandboxed && (len(s.Events) != 1 || attr(s.Attributes, "toolbatch.worker_id") != "" || attr(s.Attributes, "toolbatch.pool") != "") {
			t.Errorf("%s (beside the engine): events %v, attributes %v: no worker's claim expected", tool, s.Events, s.Attributes)
		}
	}
	ticketSpan := recv.named("toolbatch.ticket permission")[0]
	if id(ticketSpan.ParentSpanId) != id(batchSpan.SpanId) || attr(ticketSpan.Attributes, "toolbatch.ticket.resolution") != "approved" ||
		attr(ticketSpan.Attributes, "toolbatch.ticket.principal") != "alice" {
		t.Errorf("ticket span: parent %s, attributes %v", id(ticketSpan.ParentSpanId), ticketSpan.Attributes)
	}
	if !(ticketSpan.StartTimeUnixNano < ticketSpan.EndTimeUnixNano && ticketSpan.EndTimeUnixNano <= attempts["send"].StartTimeUnixNano) {
		t.Errorf("the ticket's wait [%d, %d] does not precede the send attempt at %d", ticketSpan.StartTimeUnixNano, ticketSpan.EndTimeUnixNano, attempts["send"].StartTimeUnixNano)
	}
	// sb_env ran on the first engine, sb_after on the one that took the run
	for i, tool := range map[int]string{3: "sb_env", 5: "sb_after"} {
		sb := attempts[tool]
		if attr(sb.Attributes, "toolbatch.worker_id") != "tw" || attr(sb.Attributes, "toolbatch.pool") != "default" {
			t.Errorf("%s: attributes %v, want the worker tw of the pool default", tool, sb.Attributes)
		}
		if len(sb.Events) != 2 || sb.Events[1].Name != "toolbatch.claim" || attr(sb.Events[1].Attributes, "toolbatch.worker_id") != "tw" ||
			!(sb.StartTimeUnixNano <= sb.Events[1].TimeUnixNano && sb.Events[1].TimeUnixNano <= sb.EndTimeUnixNano) {
			t.Errorf("%s: events %v, want the gate's, then tw's claim within the attempt [%d, %d]", tool, sb.Events, sb.StartTimeUnixNano, sb.EndTimeUnixNano)
		}
		if got, want := res.Results[i].Content[0].Text, "00-"+traceID+"-"+id(sb.SpanId)+"-01"; got != want {
			t.Errorf("%s: the tool's TRACEPARENT = %q, want %q (the attempt's span)", tool, got, want)
		}
	}
	for _, s := range recv.all() {
		if s.service != "toolbatch-engine" {
			t.Errorf("span %q exported by %q: only the engine exports spans", s.Name, s.service)
		}
	}
	if !strings.Contains(texts(res)[2], "not here") {
		t.Errorf("dangerous: %q", texts(res)[2])
	}
}
