package tracing

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The OTLP exporter's variables (the OpenTelemetry specification's
// names; each OTEL_EXPORTER_OTLP_X has an OTEL_EXPORTER_OTLP_TRACES_X
// that wins over it) and the batch span processor's.
const (
	envOTLP       = "OTEL_EXPORTER_OTLP_"
	envOTLPTraces = "OTEL_EXPORTER_OTLP_TRACES_"

	envHeaders     = "HEADERS"
	envTimeout     = "TIMEOUT"
	envCompression = "COMPRESSION"
	envCertificate = "CERTIFICATE"
	envClientCert  = "CLIENT_CERTIFICATE"
	envClientKey   = "CLIENT_KEY"

	EnvBSPScheduleDelay = "OTEL_BSP_SCHEDULE_DELAY"
	EnvBSPExportTimeout = "OTEL_BSP_EXPORT_TIMEOUT"
	EnvBSPMaxQueue      = "OTEL_BSP_MAX_QUEUE_SIZE"
	EnvBSPMaxBatch      = "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"
)

// tracesPath is where an OTLP/HTTP receiver takes traces, under the base
// URL of OTEL_EXPORTER_OTLP_ENDPOINT.
const tracesPath = "/v1/traces"

// defaultEndpoint is the specification's default for OTLP/HTTP.
const defaultEndpoint = "http://localhost:4318"

// exportConfig is the exporter's configuration, read from the
// environment with the specification's defaults.
type exportConfig struct {
	url         string
	headers     http.Header
	timeout     time.Duration // of one export, its retries included
	gzip        bool
	tls         *tls.Config // nil: the system's roots, no client certificate
	delay       time.Duration
	bspTimeout  time.Duration
	maxQueue    int
	maxBatch    int
	retryFirst  time.Duration // the first wait before a retry
	retryMaxGap time.Duration
}

// defaultConfig is the specification's defaults (the URL aside).
func defaultConfig() exportConfig {
	return exportConfig{timeout: 10 * time.Second, delay: 5 * time.Second, bspTimeout: 30 * time.Second,
		maxQueue: 2048, maxBatch: 512, retryFirst: 5 * time.Second, retryMaxGap: 30 * time.Second, headers: http.Header{}}
}

// otlpEnv returns OTEL_EXPORTER_OTLP_TRACES_<name>, or when it is unset
// OTEL_EXPORTER_OTLP_<name>, and the variable's name.
func otlpEnv(name string) (string, string) {
	if v := os.Getenv(envOTLPTraces + name); v != "" {
		return v, envOTLPTraces + name
	}
	return os.Getenv(envOTLP + name), envOTLP + name
}

// configFromEnv reads the exporter's configuration. A value it cannot
// use is an error naming the variable (the SDK would log and ignore it).
func configFromEnv() (exportConfig, error) {
	c := defaultConfig()
	endpoint, name := os.Getenv(EnvTracesEndpoint), EnvTracesEndpoint
	if endpoint == "" {
		endpoint, name = os.Getenv(EnvEndpoint), EnvEndpoint
	}
	if endpoint == "" {
		endpoint = defaultEndpoint
	}
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return c, fmt.Errorf("%s=%s: not an http:// or https:// URL", name, endpoint)
	}
	switch {
	case name == EnvTracesEndpoint && u.Path == "":
		u.Path = "/" // a signal's own URL is used as it is
	case name != EnvTracesEndpoint:
		u.Path = path.Join("/", u.Path, tracesPath)
	}
	c.url = u.String()

	if v, name := otlpEnv(envHeaders); v != "" {
		for _, kv := range strings.Split(v, ",") {
			k, val, ok := strings.Cut(kv, "=")
			k = strings.TrimSpace(k)
			dec, err := url.PathUnescape(strings.TrimSpace(val))
			if !ok || k == "" || err != nil {
				return c, fmt.Errorf("%s: %q is not key=value (values percent-encoded)", name, strings.TrimSpace(kv))
			}
			c.headers.Set(k, dec)
		}
	}
	for _, d := range []struct {
		name string
		into *time.Duration
		zero bool // 0 may be given
	}{{envOTLPTraces + envTimeout, &c.timeout, false}, {EnvBSPScheduleDelay, &c.delay, true}, {EnvBSPExportTimeout, &c.bspTimeout, false}} {
		v, name := os.Getenv(d.name), d.name
		if d.into == &c.timeout {
			v, name = otlpEnv(envTimeout)
		}
		if v == "" {
			continue
		}
		ms, err := strconv.Atoi(v)
		if err != nil || ms < 0 || (ms == 0 && !d.zero) {
			return c, fmt.Errorf("%s=%s: not a number of milliseconds", name, v)
		}
		*d.into = time.Duration(ms) * time.Millisecond
	}
	for _, n := range []struct {
		name string
		into *int
	}{{EnvBSPMaxQueue, &c.maxQueue}, {EnvBSPMaxBatch, &c.maxBatch}} {
		if v := os.Getenv(n.name); v != "" {
			i, err := strconv.Atoi(v)
			if err != nil || i <= 0 {
				return c, fmt.Errorf("%s=%s: not a positive number", n.name, v)
			}
			*n.into = i
		}
	}
	c.maxBatch = min(c.maxBatch, c.maxQueue)

	switch v, name := otlpEnv(envCompression); v {
	case "", "none":
	case "gzip":
		c.gzip = true
	default:
		return c, fmt.Errorf("%s=%s: gzip or none", name, v)
	}

	ca, caName := otlpEnv(envCertificate)
	cert, certName := otlpEnv(envClientCert)
	key, keyName := otlpEnv(envClientKey)
	if ca != "" || cert != "" || key != "" {
		c.tls = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return c, fmt.Errorf("%s: %w", caName, err)
		}
		c.tls.RootCAs = x509.NewCertPool()
		if !c.tls.RootCAs.AppendCertsFromPEM(pem) {
			return c, fmt.Errorf("%s=%s: no PEM certificate in it", caName, ca)
		}
	}
	if (cert == "") != (key == "") {
		return c, fmt.Errorf("%s and %s: set both or neither", certName, keyName)
	}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return c, fmt.Errorf("%s, %s: %w", certName, keyName, err)
		}
		c.tls.Certificates = []tls.Certificate{pair}
	}
	return c, nil
}

// exporter keeps the spans recorded since its last export, encoded, and
// exports them from a goroutine of its own: every schedule delay, or as
// soon as a batch's worth is waiting. Beyond the queue's size, spans are
// dropped (and the drop reported), as the SDK's batch span processor
// does.
type exporter struct {
	cfg    exportConfig
	head   batchHead
	send   func(ctx context.Context, body []byte) error
	report func(error)

	mu      sync.Mutex
	pending []byte // ScopeSpans.spans fields
	ends    []int  // where each pending span ends in pending
	dropped int
	closed  bool

	kick    chan struct{}
	flushes chan chan struct{}
	quit    chan context.Context
	done    chan struct{}

	// the export goroutine's own
	spare     []byte
	spareEnds []int
	body      []byte
	zipped    bytes.Buffer
	zipper    *gzip.Writer
}

func newExporter(cfg exportConfig, head batchHead, send func(context.Context, []byte) error, report func(error)) *exporter {
	if report == nil {
		report = func(error) {}
	}
	x := &exporter{cfg: cfg, head: head, send: send, report: report,
		kick: make(chan struct{}, 1), flushes: make(chan chan struct{}), quit: make(chan context.Context), done: make(chan struct{})}
	go x.loop()
	return x
}

// add encodes a span into the queue.
func (x *exporter) add(s *span) {
	x.mu.Lock()
	if x.closed || len(x.ends) >= x.cfg.maxQueue {
		x.dropped++
		x.mu.Unlock()
		return
	}
	x.pending = appendSpan(x.pending, fScopeSpansSpans, s)
	x.ends = append(x.ends, len(x.pending))
	full := len(x.ends) == x.cfg.maxBatch
	x.mu.Unlock()
	if full {
		select {
		case x.kick <- struct{}{}:
		default:
		}
	}
}

func (x *exporter) loop() {
	defer close(x.done)
	tick := time.NewTicker(max(x.cfg.delay, time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			x.export(context.Background())
		case <-x.kick:
			x.export(context.Background())
		case ch := <-x.flushes:
			x.export(context.Background())
			close(ch)
		case ctx := <-x.quit:
			x.export(ctx)
			return
		}
	}
}

// flush exports what is queued now and returns when it is done (or ctx
// is).
func (x *exporter) flush(ctx context.Context) error {
	ch := make(chan struct{})
	select {
	case x.flushes <- ch:
	case <-x.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// shutdown exports what is queued, within ctx, and stops: spans recorded
// after it are dropped.
func (x *exporter) shutdown(ctx context.Context) error {
	x.mu.Lock()
	if x.closed {
		x.mu.Unlock()
		return nil
	}
	x.closed = true
	x.mu.Unlock()
	select {
	case x.quit <- ctx:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-x.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// export sends what is queued, in requests of at most a batch's size.
func (x *exporter) export(ctx context.Context) {
	x.mu.Lock()
	spans, ends, dropped := x.pending, x.ends, x.dropped
	x.pending, x.ends, x.dropped = x.spare[:0], x.spareEnds[:0], 0
	x.mu.Unlock()
	defer func() { x.spare, x.spareEnds = spans, ends }()
	if dropped > 0 {
		x.report(fmt.Errorf("dropped (%d spans): more than %s=%d were waiting for their export", dropped, EnvBSPMaxQueue, x.cfg.maxQueue))
	}
	from, n := 0, 0
	for i, end := range ends {
		n++
		if n < x.cfg.maxBatch && i < len(ends)-1 {
			continue
		}
		x.body = x.head.request(x.body[:0], spans[from:end])
		body := x.body
		if x.cfg.gzip {
			body = x.compress(body)
		}
		ectx, cancel := context.WithTimeout(ctx, min(x.cfg.timeout, x.cfg.bspTimeout))
		if err := x.send(ectx, body); errors.As(err, new(rejectedError)) {
			x.report(err)
		} else if err != nil {
			x.report(fmt.Errorf("not exported (%d spans): %w", n, err))
		}
		cancel()
		from, n = end, 0
	}
}

func (x *exporter) compress(body []byte) []byte {
	x.zipped.Reset()
	if x.zipper == nil {
		x.zipper = gzip.NewWriter(&x.zipped)
	} else {
		x.zipper.Reset(&x.zipped)
	}
	_, _ = x.zipper.Write(body)
	_ = x.zipper.Close()
	return x.zipped.Bytes()
}

// httpSender posts export requests to an OTLP/HTTP receiver.
type httpSender struct {
	cfg    exportConfig
	client *http.Client
}

func newHTTPSender(cfg exportConfig) *httpSender {
	t := http.DefaultTransport.(*http.Transport).Clone() // proxies from the environment, keep-alive
	if cfg.tls != nil {
		t.TLSClientConfig = cfg.tls
	}
	return &httpSender{cfg: cfg, client: &http.Client{Transport: t}}
}

// rejectedError is a receiver's partial success: it took the request
// and rejected some of its spans.
type rejectedError string

func (e rejectedError) Error() string { return string(e) }

// errBody bounds what an error quotes of a receiver's answer.
const errBody = 256

// send posts body, again after a wait when the receiver says it is busy
// or unavailable (429, 502, 503, 504: after its Retry-After, or a wait
// that grows), until ctx ends.
func (h *httpSender) send(ctx context.Context, body []byte) error {
	wait := h.cfg.retryFirst
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.cfg.url, bytes.NewReader(body))
		if err != nil {
			return err
		}
		for k, v := range h.cfg.headers {
			req.Header[k] = v
		}
		req.Header.Set("Content-Type", "application/x-protobuf")
		if h.cfg.gzip {
			req.Header.Set("Content-Encoding", "gzip")
		}
		resp, err := h.client.Do(req)
		if err != nil {
			return err
		}
		answer, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		switch code := resp.StatusCode; {
		case code >= 200 && code < 300:
			if n, msg := rejected(answer); n > 0 || msg != "" {
				return rejectedError(fmt.Sprintf("%s rejected spans (%d): %s", h.cfg.url, n, msg))
			}
			return nil
		case code == http.StatusTooManyRequests || code == http.StatusBadGateway || code == http.StatusServiceUnavailable || code == http.StatusGatewayTimeout:
			gap := wait
			if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s >= 0 {
				gap = time.Duration(s) * time.Second
			} else {
				wait = min(2*wait, h.cfg.retryMaxGap)
			}
			if d, ok := ctx.Deadline(); ok && time.Until(d) < gap {
				return fmt.Errorf("%s: %s, and no time left to try again", h.cfg.url, resp.Status)
			}
			t := time.NewTimer(gap)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			}
		default:
			if len(answer) > errBody {
				answer = answer[:errBody]
			}
			return fmt.Errorf("%s: %s: %s", h.cfg.url, resp.Status, bytes.TrimSpace(answer))
		}
	}
}
