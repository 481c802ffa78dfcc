package embedded

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/toolbatch/toolbatch/access"
)

// MaxPayload is the embedded server's largest message: a commit holds a
// whole batch, up to 128 calls' arguments.
const MaxPayload = 8 << 20

// Config configures the embedded server.
type Config struct {
	Listen     string // host:port; without Auth the host must be a loopback address
	Store      string // JetStream store directory
	SyncAlways bool   // fsync every write
	// Auth is an auth file (access.File): every connection authenticates
	// as one of its users, with the permissions of the user's role. Empty:
	// no authentication, loopback only.
	Auth string
	// Layout computes each user's permissions.
	Layout access.Layout
	// TLSCert and TLSKey are the server's certificate; TLSClientCA, when
	// set, makes the server require client certificates it signed
	// (mutual TLS).
	TLSCert, TLSKey, TLSClientCA string
}

// Server is a running embedded server and the identity the engine beside
// it connects as.
type Server struct {
	*server.Server
	cfg    Config
	opts   *server.Options
	engine *access.Identity // nil without Auth
	mu     sync.Mutex       // serializes reloads
}

// ErrOpenListen is the refusal of a non-loopback listen address without an
// auth file.
var ErrOpenListen = errors.New("without --auth the embedded server listens on loopback only")

// Start starts the server and waits until it accepts connections.
func Start(cfg Config) (*Server, error) {
	host, portStr, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("--listen %q: %w", cfg.Listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("--listen %q: port: %w", cfg.Listen, err)
	}
	if cfg.Auth == "" && !loopback(host) {
		return nil, fmt.Errorf("--listen %s: %w: anyone who reaches it could write the log and run tools; "+
			"create users with toolbatch auth and give --auth FILE (docs/security.md), or listen on 127.0.0.1", cfg.Listen, ErrOpenListen)
	}
	opts := &server.Options{
		ServerName: "toolbatch", Host: host, Port: port, JetStream: true, StoreDir: cfg.Store,
		MaxPayload: MaxPayload, SyncAlways: cfg.SyncAlways, NoSigs: true, NoLog: true,
	}
	if (cfg.TLSCert == "") != (cfg.TLSKey == "") {
		return nil, errors.New("--tls-cert and --tls-key go together")
	}
	if cfg.TLSClientCA != "" && cfg.TLSCert == "" {
		return nil, errors.New("--tls-client-ca needs --tls-cert and --tls-key")
	}
	if cfg.TLSCert != "" {
		tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: cfg.TLSCert, KeyFile: cfg.TLSKey, CaFile: cfg.TLSClientCA, Verify: cfg.TLSClientCA != ""})
		if err != nil {
			return nil, fmt.Errorf("embedded server TLS: %w", err)
		}
		opts.TLSConfig, opts.TLS, opts.TLSVerify, opts.TLSTimeout = tc, true, cfg.TLSClientCA != "", 5
	}
	s := &Server{cfg: cfg, opts: opts}
	if cfg.Auth != "" {
		if s.engine, err = access.NewIdentity(); err != nil {
			return nil, err
		}
		if opts.Nkeys, err = s.users(); err != nil {
			return nil, err
		}
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded NATS server: %w", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return nil, fmt.Errorf("embedded NATS server did not start on %s (is the port in use?)", cfg.Listen)
	}
	s.Server = srv
	return s, nil
}

// users reads the auth file into the server's users, with the engine's
// own identity first.
func (s *Server) users() ([]*server.NkeyUser, error) {
	f, err := access.LoadFile(s.cfg.Auth)
	if err != nil {
		return nil, err
	}
	all := append([]access.User{{Name: "engine-embedded", Role: access.RoleEngine, NKey: s.engine.Pub}}, f.Users...)
	out := make([]*server.NkeyUser, 0, len(all))
	for _, u := range all {
		p, err := s.cfg.Layout.Permissions(u)
		if err != nil {
			return nil, err
		}
		out = append(out, &server.NkeyUser{Nkey: u.NKey, Permissions: ServerPermissions(p)})
	}
	return out, nil
}

// Reload re-reads the auth file: added users may connect, and the
// connections of removed (revoked) users are closed.
func (s *Server) Reload() error {
	if s.cfg.Auth == "" {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	users, err := s.users()
	if err != nil {
		return err
	}
	opts := s.opts.Clone()
	opts.Nkeys = users
	if err := s.ReloadOptions(opts); err != nil {
		return fmt.Errorf("reload the auth file: %w", err)
	}
	s.opts = opts
	return nil
}

// EngineOptions are the options of the engine's in-process connection.
func (s *Server) EngineOptions() []nats.Option {
	opts := []nats.Option{nats.InProcessServer(s.Server)}
	if s.engine != nil {
		opts = append(opts, s.engine.Options()...)
	}
	return opts
}

// Stop shuts the server down and waits.
func (s *Server) Stop() {
	s.Shutdown()
	s.WaitForShutdown()
}

// ServerPermissions is p in nats-server's terms.
func ServerPermissions(p access.Permissions) *server.Permissions {
	sp := &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: p.Publish.Allow, Deny: p.Publish.Deny},
		Subscribe: &server.SubjectPermission{Allow: p.Subscribe.Allow, Deny: p.Subscribe.Deny},
	}
	if p.AllowResponses {
		sp.Response = &server.ResponsePermission{MaxMsgs: server.DEFAULT_ALLOW_RESPONSE_MAX_MSGS, Expires: server.DEFAULT_ALLOW_RESPONSE_EXPIRATION}
	}
	return sp
}

func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
