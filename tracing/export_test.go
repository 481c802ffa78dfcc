package tracing

import (
	"compress/gzip"
	"context"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/resource"
	"go.opentelemetry.io/otel/trace"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// exportVars are every variable the exporter reads, cleared for each case.
var exportVars = []string{EnvExporter, EnvEndpoint, EnvTracesEndpoint, EnvProtocol, EnvTracesProtocol,
	envOTLP + envHeaders, envOTLPTraces + envHeaders, envOTLP + envTimeout, envOTLPTraces + envTimeout,
	envOTLP + envCompression, envOTLPTraces + envCompression, envOTLP + envCertificate, envOTLPTraces + envCertificate,
	envOTLP + envClientCert, envOTLPTraces + envClientCert, envOTLP + envClientKey, envOTLPTraces + envClientKey,
	EnvBSPScheduleDelay, EnvBSPExportTimeout, EnvBSPMaxQueue, EnvBSPMaxBatch}

func TestConfigFromEnv(t *testing.T) {
	for _, c := range []struct {
		env   map[string]string
		check func(exportConfig) bool
		fail  string
	}{
		{env: map[string]string{}, check: func(c exportConfig) bool {
			return c.url == "http://localhost:4318/v1/traces" && c.timeout == 10*time.Second && c.delay == 5*time.Second &&
				c.maxQueue == 2048 && c.maxBatch == 512 && !c.gzip && c.tls == nil
		}},
		// the base URL gets the signal's path; a signal's URL is used as it is
		{env: map[string]string{EnvEndpoint: "https://collector:4318/otlp"}, check: func(c exportConfig) bool { return c.url == "https://collector:4318/otlp/v1/traces" }},
		{env: map[string]string{EnvEndpoint: "http://a:1", EnvTracesEndpoint: "http://b:2/custom"}, check: func(c exportConfig) bool { return c.url == "http://b:2/custom" }},
		{env: map[string]string{EnvTracesEndpoint: "http://b:2"}, check: func(c exportConfig) bool { return c.url == "http://b:2/" }},
		{env: map[string]string{envOTLP + envHeaders: "api-key=a%20b, x-team = core", envOTLPTraces + envHeaders: "x-only=traces"},
			check: func(c exportConfig) bool {
				return c.headers.Get("X-Only") == "traces" && c.headers.Get("Api-Key") == ""
			}},
		{env: map[string]string{envOTLP + envHeaders: "api-key=a%20b, x-team = core"},
			check: func(c exportConfig) bool {
				return c.headers.Get("Api-Key") == "a b" && c.headers.Get("X-Team") == "core"
			}},
		{env: map[string]string{envOTLP + envTimeout: "2500", envOTLPTraces + envCompression: "gzip", EnvBSPScheduleDelay: "0", EnvBSPMaxQueue: "100", EnvBSPMaxBatch: "500"},
			check: func(c exportConfig) bool {
				return c.timeout == 2500*time.Millisecond && c.gzip && c.delay == 0 && c.maxQueue == 100 && c.maxBatch == 100
			}},
		{env: map[string]string{EnvEndpoint: "collector:4318"}, fail: "OTEL_EXPORTER_OTLP_ENDPOINT=collector:4318: not an http:// or https:// URL"},
		{env: map[string]string{EnvTracesEndpoint: "grpc://c:4317"}, fail: "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=grpc://c:4317: not an http:// or https:// URL"},
		{env: map[string]string{envOTLP + envHeaders: "novalue"}, fail: `OTEL_EXPORTER_OTLP_HEADERS: "novalue" is not key=value (values percent-encoded)`},
		{env: map[string]string{envOTLPTraces + envTimeout: "10s"}, fail: "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT=10s: not a number of milliseconds"},
		{env: map[string]string{EnvBSPExportTimeout: "0"}, fail: "OTEL_BSP_EXPORT_TIMEOUT=0: not a number of milliseconds"},
		{env: map[string]string{EnvBSPMaxBatch: "-1"}, fail: "OTEL_BSP_MAX_EXPORT_BATCH_SIZE=-1: not a positive number"},
		{env: map[string]string{envOTLP + envCompression: "zstd"}, fail: "OTEL_EXPORTER_OTLP_COMPRESSION=zstd: gzip or none"},
		{env: map[string]string{envOTLP + envClientCert: "/c.pem"}, fail: "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and OTEL_EXPORTER_OTLP_CLIENT_KEY: set both or neither"},
		{env: map[string]string{envOTLP + envCertificate: "/nonexistent/ca.pem"}, fail: "OTEL_EXPORTER_OTLP_CERTIFICATE: open /nonexistent/ca.pem: no such file or directory"},
	} {
		for _, k := range exportVars {
			t.Setenv(k, c.env[k])
		}
		cfg, err := configFromEnv()
		switch {
		case c.fail != "" && (err == nil || err.Error() != c.fail):
			t.Errorf("%v: error %v, want %q", c.env, err, c.fail)
		case c.fail == "" && err != nil:
			t.Errorf("%v: %v", c.env, err)
		case c.fail == "" && !c.check(cfg):
			t.Errorf("%v: %+v", c.env, cfg)
		}
	}
}

// collector is an OTLP/HTTP receiver: it decodes what it is sent and
// answers as answer says (nil: 200 and an empty response).
type collector struct {
	mu       sync.Mutex
	requests []*collectortrace.ExportTraceServiceRequest
	headers  []http.Header
	answer   func(n int, w http.ResponseWriter) bool // true: answered
}

func (c *collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.headers = append(c.headers, r.Header.Clone())
	if c.answer != nil && c.answer(len(c.headers), w) {
		return
	}
	body := io.Reader(r.Body)
	if r.Header.Get("Content-Encoding") == "gzip" {
		z, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = z
	}
	b, _ := io.ReadAll(body)
	var req collectortrace.ExportTraceServiceRequest
	if r.Header.Get("Content-Type") != "application/x-protobuf" || proto.Unmarshal(b, &req) != nil {
		http.Error(w, "not OTLP protobuf", http.StatusBadRequest)
		return
	}
	c.requests = append(c.requests, &req)
}

func (c *collector) spans() (n int, per []int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range c.requests {
		k := 0
		for _, rs := range r.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				k += len(ss.Spans)
			}
		}
		n += k
		per = append(per, k)
	}
	return n, per
}

// errs collects what an exporter reports.
type errs struct {
	mu   sync.Mutex
	list []string
}

func (e *errs) report(err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.list = append(e.list, err.Error())
}

func (e *errs) all() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.list...)
}

func testSpan(i int) *span {
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: traceID("t"), SpanID: spanID("s", string(rune('a'+i))), TraceFlags: trace.FlagsSampled})
	return &span{self: sc, name: SpanBatch, kind: trace.SpanKindConsumer, start: at(0), end: at(1)}
}

// exporterTo returns an exporter to the collector at url, configured by
// the environment the test set, that exports when asked.
func exporterTo(t *testing.T, url string, e *errs, tune func(*exportConfig)) *exporter {
	t.Helper()
	t.Setenv(EnvEndpoint, url)
	cfg, err := configFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	cfg.delay = time.Hour
	if tune != nil {
		tune(&cfg)
	}
	x := newExporter(cfg, newBatchHead(resource.Empty(), scope), newHTTPSender(cfg).send, e.report)
	t.Cleanup(func() { _ = x.shutdown(context.Background()) })
	return x
}

// TestExportOverHTTP: the headers and compression the environment asks
// for, requests of at most a batch's size, and a receiver's 503 retried
// once it says when.
func TestExportOverHTTP(t *testing.T) {
	col := &collector{answer: func(n int, w http.ResponseWriter) bool {
		if n == 1 {
			w.Header().Set("Retry-After", "0")
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return true
		}
		return false
	}}
	srv := httptest.NewServer(col)
	defer srv.Close()
	t.Setenv(envOTLP+envHeaders, "authorization=Bearer%20k1")
	t.Setenv(envOTLP+envCompression, "gzip")
	var e errs
	x := exporterTo(t, srv.URL, &e, func(c *exportConfig) { c.maxBatch = 2 })
	for i := range 5 {
		x.add(testSpan(i))
	}
	if err := x.flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	n, per := col.spans()
	if n != 5 || len(per) < 3 {
		t.Errorf("%d spans in requests of %v, want 5 in at least 3", n, per)
	}
	for _, k := range per {
		if k > 2 {
			t.Errorf("a request of %d spans, more than the batch size 2", k)
		}
	}
	for _, h := range col.headers {
		if h.Get("Authorization") != "Bearer k1" || h.Get("Content-Encoding") != "gzip" {
			t.Errorf("headers %v", h)
		}
	}
	if got := e.all(); len(got) != 0 {
		t.Errorf("reported %v", got)
	}
}

// TestExportFailuresAreReported: a receiver's refusal, its partial
// success, and spans beyond the queue are each reported in one line.
func TestExportFailuresAreReported(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	col := &collector{answer: func(n int, w http.ResponseWriter) bool {
		switch n {
		case 1: // holds the export while spans queue behind it
			close(entered)
			<-release
			http.Error(w, "bad tenant", http.StatusBadRequest)
			return true
		case 2:
			out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{PartialSuccess: &collectortrace.ExportTracePartialSuccess{RejectedSpans: 1, ErrorMessage: "too old"}})
			_, _ = w.Write(out)
			return true
		}
		return false
	}}
	srv := httptest.NewServer(col)
	defer srv.Close()
	var e errs
	x := exporterTo(t, srv.URL, &e, func(c *exportConfig) { c.maxQueue, c.maxBatch = 2, 2 })
	x.add(testSpan(0))
	x.add(testSpan(1)) // a batch's worth: exported at once
	<-entered
	for i := range 3 {
		x.add(testSpan(2 + i)) // the third is beyond the queue
	}
	close(release)
	if err := x.flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"not exported (2 spans): " + srv.URL + "/v1/traces: 400 Bad Request: bad tenant",
		"dropped (1 spans): more than OTEL_BSP_MAX_QUEUE_SIZE=2 were waiting for their export",
		srv.URL + "/v1/traces rejected spans (1): too old",
	}
	if got := e.all(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("reported:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestExportOverTLS: a receiver whose certificate the system does not
// trust is reached with OTEL_EXPORTER_OTLP_CERTIFICATE, and refused
// without it.
func TestExportOverTLS(t *testing.T) {
	col := &collector{}
	srv := httptest.NewTLSServer(col)
	defer srv.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	var untrusted errs
	x := exporterTo(t, srv.URL, &untrusted, nil)
	x.add(testSpan(0))
	if err := x.flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := untrusted.all(); len(got) != 1 || !strings.Contains(got[0], "certificate signed by unknown authority") {
		t.Errorf("without the CA: %v", got)
	}
	t.Setenv(envOTLP+envCertificate, ca)
	var trusted errs
	x = exporterTo(t, srv.URL, &trusted, nil)
	x.add(testSpan(1))
	if err := x.flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n, _ := col.spans(); n != 1 || len(trusted.all()) != 0 {
		t.Errorf("with the CA: %d spans, reported %v", n, trusted.all())
	}
}

// TestShutdownExportsWhatIsQueued: what was recorded before Shutdown
// reaches the receiver; what is recorded after is dropped.
func TestShutdownExportsWhatIsQueued(t *testing.T) {
	col := &collector{}
	srv := httptest.NewServer(col)
	defer srv.Close()
	var e errs
	x := exporterTo(t, srv.URL, &e, nil)
	x.add(testSpan(0))
	x.add(testSpan(1))
	if err := x.shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	x.add(testSpan(2))
	if n, _ := col.spans(); n != 2 {
		t.Errorf("%d spans exported at shutdown, want 2", n)
	}
}
