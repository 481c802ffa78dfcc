package console

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/toolbatch/toolbatch/client"
	"github.com/toolbatch/toolbatch/proof"
	"github.com/toolbatch/toolbatch/protocol"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Config is what a console serves, and with what.
type Config struct {
	// NC is the console's NATS connection (role console). Its error
	// handler is set by New.
	NC     *nats.Conn
	Prefix string
	Users  *Users
	// Keys, when set, are the pinned engine keys an audit checks the
	// log's signatures with (replay audit --keys).
	Keys *proof.Keyring
	// Secure marks the session cookie Secure: the console is served over
	// TLS (or behind a TLS proxy).
	Secure bool
	Log    zerolog.Logger
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// Server is the console: its HTTP handler and what feeds its pages.
type Server struct {
	cfg        Config
	names      protocol.Names
	js         jetstream.JetStream
	client     *client.Client
	index      *index
	tickets    *ticketSet
	hub        *hub
	sessions   *sessions
	violations *violations
	pages      map[string]*template.Template
	log        zerolog.Logger
}

// New makes a console. Run feeds it.
func New(cfg Config) (*Server, error) {
	if cfg.Users == nil || len(cfg.Users.Users) == 0 {
		return nil, errors.New("console: no users: add one with toolbatch console user")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Prefix == "" {
		cfg.Prefix = protocol.DefaultPrefix
	}
	js, err := jetstream.New(cfg.NC)
	if err != nil {
		return nil, err
	}
	cl, err := client.New(cfg.NC, client.WithPrefix(cfg.Prefix))
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, names: protocol.Names{Prefix: cfg.Prefix}, js: js, client: cl, tickets: newTicketSet(),
		hub: newHub(), sessions: newSessions(), violations: &violations{}, log: cfg.Log}
	s.index = newIndex(func(runID string) { s.hub.notify(topicRun + runID) })
	cfg.NC.SetErrorHandler(s.violations.handler)
	if s.pages, err = parsePages(); err != nil {
		return nil, err
	}
	return s, nil
}

// Run reads the events stream and the tickets bucket into the console
// until ctx ends; an error ends it.
func (s *Server) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, 2)
	go func() { errs <- s.index.follow(ctx, s.js, s.names) }()
	go func() {
		errs <- s.tickets.follow(ctx, s.js, s.names, func(runID string) {
			s.hub.notify(topicTickets)
			if runID != "" {
				s.hub.notify(topicRun + runID)
			}
		})
	}()
	for range 2 {
		if err := <-errs; err != nil {
			return err
		}
	}
	return nil
}

// Ready reports whether the console has read the events stream and the
// tickets bucket up to where they were when it started.
func (s *Server) Ready() bool { return s.index.ready() && s.tickets.ready() }

// Handler serves the console's pages.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(staticFS, "static")
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", s.readyz)
	mux.HandleFunc("GET /signin", s.signInPage)
	mux.HandleFunc("POST /signin", s.signIn)
	mux.HandleFunc("POST /signout", s.authed(s.signOut))
	mux.HandleFunc("GET /{$}", s.authed(func(w http.ResponseWriter, r *http.Request, _ *session) {
		http.Redirect(w, r, "/approvals", http.StatusSeeOther)
	}))
	mux.HandleFunc("GET /runs", s.authed(s.runsPage))
	mux.HandleFunc("GET /runs/{run}", s.authed(s.runPage))
	mux.HandleFunc("POST /runs/{run}/control", s.authed(s.postControl))
	mux.HandleFunc("GET /approvals", s.authed(s.approvalsPage))
	mux.HandleFunc("POST /approvals", s.authed(s.postAnswers))
	mux.HandleFunc("GET /waits", s.authed(s.waitsPage))
	mux.HandleFunc("POST /waits/perform", s.authed(s.postPerform))
	mux.HandleFunc("GET /audit", s.authed(s.auditPage))
	mux.HandleFunc("GET /events", s.authed(s.events))
	return securityHeaders(mux)
}

// securityHeaders: no inline script or style, no framing, no sniffing.
func securityHeaders(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("Referrer-Policy", "same-origin")
		hd.Set("X-Frame-Options", "DENY")
		h.ServeHTTP(w, r)
	})
}

// authed serves a page to a signed-in user only, and a POST only with the
// session's CSRF token from the console's own origin.
func (s *Server) authed(h func(http.ResponseWriter, *http.Request, *session)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var x *session
		if c, err := r.Cookie(cookieName); err == nil {
			x = s.sessions.get(c.Value, s.cfg.Now())
		}
		if x == nil {
			if r.Method == http.MethodGet && r.URL.Path != "/events" {
				http.Redirect(w, r, "/signin?next="+urlQueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
				return
			}
			http.Error(w, "sign in first", http.StatusUnauthorized)
			return
		}
		// The notices the page's data may miss are those after this.
		r = r.WithContext(context.WithValue(r.Context(), generationKey{}, s.hub.generation()))
		if r.Method == http.MethodPost {
			if !sameOrigin(r) {
				http.Error(w, "refused: a cross-site request", http.StatusForbidden)
				return
			}
			r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
			if err := r.ParseForm(); err != nil || !validCSRF(x, r.PostFormValue(csrfField)) {
				http.Error(w, "refused: the form's token is missing or stale: reload the page", http.StatusForbidden)
				return
			}
		}
		h(w, r, x)
	}
}

func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	var not []string
	if !s.cfg.NC.IsConnected() {
		not = append(not, "not connected to NATS")
	}
	if !s.index.ready() {
		not = append(not, "still reading the events stream")
	}
	if !s.tickets.ready() {
		not = append(not, "still reading the tickets bucket")
	}
	if len(not) > 0 {
		http.Error(w, "not ready: "+strings.Join(not, "; "), http.StatusServiceUnavailable)
		return
	}
	_, _ = w.Write([]byte("ready\n"))
}

// generationKey holds in a request's context the hub's generation when the
// request came in.
type generationKey struct{}

// events streams change notices to a page (server-sent events): one
// "change" event per topic, and a comment every 15 s to keep proxies from
// closing the stream.
func (s *Server) events(w http.ResponseWriter, r *http.Request, _ *session) {
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming is not supported here", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	// Seen so far: the generation the page was rendered at, or on a
	// reconnection the last notice the browser took (its Last-Event-ID).
	since, err := strconv.ParseUint(r.Header.Get("Last-Event-ID"), 10, 64)
	if err != nil {
		if since, err = strconv.ParseUint(r.URL.Query().Get("since"), 10, 64); err != nil {
			since = 0 // unknown: reload the page once
		}
	}
	l := s.hub.listen(since)
	defer s.hub.leave(l)
	fmt.Fprint(w, "retry: 2000\n\n")
	fl.Flush()
	keep := time.NewTicker(15 * time.Second)
	defer keep.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-keep.C:
			fmt.Fprint(w, ": keep-alive\n\n")
		case <-l.wake:
			topics, gen := l.take()
			for _, t := range topics {
				fmt.Fprintf(w, "id: %d\nevent: change\ndata: %s\n\n", gen, t)
			}
		}
		fl.Flush()
	}
}
