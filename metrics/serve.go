package metrics

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// The endpoints of the metrics listener.
const (
	PathMetrics = "/metrics"
	PathHealthz = "/healthz"
	PathReadyz  = "/readyz"
)

// NewRegistry is a registry with the Go and process collectors.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Server serves /metrics, /healthz (the process runs) and /readyz (ready
// says what is not ready, nil when everything is).
type Server struct {
	ln  net.Listener
	srv *http.Server
}

// readyTimeout bounds one readiness check.
const readyTimeout = 3 * time.Second

// Listen opens addr and serves in the background until Close. settle,
// when set, runs before each scrape: it brings the counters up to what
// the program has done (the engine folds its last commits into its
// metrics, and its spans).
func Listen(addr string, reg *prometheus.Registry, ready func(context.Context) error, settle func()) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-listen %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	scrape := promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})
	if settle != nil {
		gather := scrape
		scrape = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			settle()
			gather.ServeHTTP(w, r)
		})
	}
	mux.Handle(PathMetrics, scrape)
	mux.HandleFunc(PathHealthz, func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc(PathReadyz, func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
		defer cancel()
		if err := ready(ctx); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "not ready: %v\n", err)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	s := &Server{ln: ln, srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}}
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			_ = ln.Close()
		}
	}()
	return s, nil
}

// Addr is the address served (the port chosen for ":0").
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops serving.
func (s *Server) Close() error { return s.srv.Close() }

// ListenFlag is the flag of the engine and the sandbox worker that serves
// the metrics and health endpoints.
const ListenFlag = "metrics-listen"

// FlagVar defines --metrics-listen on fs.
func FlagVar(fs *flag.FlagSet, addr *string) {
	fs.StringVar(addr, ListenFlag, "", "serve "+PathMetrics+", "+PathHealthz+" and "+PathReadyz+" on this address (host:port; off by default; keep it on loopback or a private network)")
}
