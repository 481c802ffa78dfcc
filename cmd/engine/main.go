package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/toolbatch/toolbatch/access"
	"github.com/toolbatch/toolbatch/catalog"
	"github.com/toolbatch/toolbatch/embedded"
	"github.com/toolbatch/toolbatch/engine"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/internal/cli"
	"github.com/toolbatch/toolbatch/metrics"
	"github.com/toolbatch/toolbatch/proof"
	"github.com/toolbatch/toolbatch/protocol"
	"github.com/toolbatch/toolbatch/tracing"
)

type options struct {
	store, listen, natsURL, prefix, catalogPath              string
	auth, tlsCert, tlsKey, tlsClientCA                       string
	engineID                                                 string
	metricsListen                                            string
	conn                                                     access.Conn
	replicas, cacheRuns                                      int
	cacheBytes                                               int64
	clientMaxRuns, clientBurst                               int
	clientRate                                               float64
	limits                                                   events.Limits
	log                                                      cli.LogFlags
	outMaxAge, ackWait, inboxAckWait, lease, checkpointEvery time.Duration
	syncAlways, unsigned                                     bool
	signingKey                                               string
}

func main() {
	if err := run(os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "engine:", err)
		os.Exit(2)
	}
}

func run(args []string, stderr io.Writer) error {
	var o options
	fs := flag.NewFlagSet("engine", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // a bad flag is one line, from main
	fs.StringVar(&o.store, "store", "./toolbatch-data", "JetStream store directory of the embedded server")
	fs.StringVar(&o.listen, "listen", "127.0.0.1:4222", "address the embedded server listens on")
	fs.StringVar(&o.natsURL, "nats-url", "", "use this NATS server or cluster instead of the embedded one")
	fs.StringVar(&o.prefix, "prefix", protocol.DefaultPrefix, "subject prefix")
	fs.StringVar(&o.catalogPath, "catalog", "", "tool catalog and gate rules (YAML); default: the built-in catalog (echo, sleep, fail)")
	fs.IntVar(&o.replicas, "replicas", 1, "replicas of every stream (a clustered JetStream)")
	o.log.Flags(fs)
	fs.DurationVar(&o.outMaxAge, "out-max-age", engine.DefaultOutMaxAge, "how long out messages are kept")
	fs.DurationVar(&o.ackWait, "ack-wait", engine.DefaultAckWait, "how long an engine that answers nothing (paused, cut off) keeps its runs before it is declared dead; longer than a leader election")
	fs.DurationVar(&o.inboxAckWait, "inbox-ack-wait", engine.DefaultInboxAckWait, "how long an inbox message delivered to an engine may go unacknowledged before it is delivered again (a delivery lost with a server, a submission a killed engine had taken)")
	fs.DurationVar(&o.lease, "lease", engine.DefaultLease, "how long a sandbox worker's claim lasts without a heartbeat")
	fs.IntVar(&o.cacheRuns, "cache-runs", engine.DefaultCacheRuns, "runs whose folded state is kept in memory (the rest are folded from the log when touched)")
	o.limits = events.DefaultLimits()
	fs.IntVar(&o.limits.MaxCalls, "max-calls", o.limits.MaxCalls, "tool calls in one batch")
	fs.IntVar(&o.limits.MaxArgumentBytes, "max-argument-bytes", o.limits.MaxArgumentBytes, "bytes of one call's arguments (canonical JSON)")
	fs.IntVar(&o.limits.MaxOutputBytes, "max-output-bytes", o.limits.MaxOutputBytes, "bytes of one call's output (canonical JSON)")
	fs.IntVar(&o.limits.MaxSubmitBytes, "max-submit-bytes", o.limits.MaxSubmitBytes, "bytes of one submission as it arrives")
	fs.IntVar(&o.limits.MaxBlockBytes, "max-block-bytes", o.limits.MaxBlockBytes, "bytes of one content block of a submission (text included)")
	fs.IntVar(&o.clientMaxRuns, "client-max-runs", engine.DefaultClientMaxRuns, "runs one client may have in flight (-1: no limit)")
	fs.Float64Var(&o.clientRate, "client-submit-rate", engine.DefaultClientSubmitRate, "submissions per second one client may make (-1: no limit)")
	fs.IntVar(&o.clientBurst, "client-submit-burst", engine.DefaultClientSubmitBurst, "submissions one client may make at once, above its rate")
	fs.Int64Var(&o.cacheBytes, "cache-bytes", engine.DefaultCacheBytes, "bytes of runs' commits whose folded state is kept in memory (as --cache-runs, by size)")
	fs.BoolVar(&o.syncAlways, "sync-always", false, "embedded server: fsync every write (slower; survives power loss)")
	fs.StringVar(&o.auth, "auth", "", "embedded server: users and roles (toolbatch auth create); every connection authenticates (SIGHUP reloads it)")
	fs.StringVar(&o.tlsCert, "tls-cert", "", "embedded server: TLS certificate")
	fs.StringVar(&o.tlsKey, "tls-key", "", "embedded server: TLS certificate's key")
	fs.StringVar(&o.tlsClientCA, "tls-client-ca", "", "embedded server: require client certificates signed by this CA (mutual TLS)")
	o.conn.Flags(fs)
	fs.StringVar(&o.signingKey, "signing-key", "", "seed file of the key this engine signs its commits and checkpoints with (default: the --creds user's key; without --creds, <store>/signing.nk, made at the first start)")
	fs.DurationVar(&o.checkpointEvery, "checkpoint-every", engine.DefaultCheckpointEvery, "how often a signed checkpoint of the events stream is published when it grew (negative: never)")
	fs.BoolVar(&o.unsigned, "unsigned", false, "append unsigned commits, as engines did before signing (replay audit reports the log as unsigned); for measurements")
	fs.StringVar(&o.engineID, "engine-id", "", "this engine's id in the owners bucket, kept across restarts so that a restarted engine takes its runs back at once (default: kept in the embedded server's store; with --nats-url, a new one at each start)")
	metrics.FlagVar(fs, &o.metricsListen)
	if done, err := cli.Parse(fs, args, stderr); done {
		return err
	}
	if o.cacheRuns < 1 {
		return fmt.Errorf("--cache-runs %d: want at least 1", o.cacheRuns)
	}
	if o.cacheBytes < 1 {
		return fmt.Errorf("--cache-bytes %d: want at least 1", o.cacheBytes)
	}
	if err := o.limits.Validate(); err != nil {
		return fmt.Errorf("limits: %w", err)
	}
	log, err := o.log.Logger(stderr)
	if err != nil {
		return err
	}
	cat := catalog.Default()
	if o.catalogPath != "" {
		if cat, err = catalog.Load(o.catalogPath); err != nil {
			return err
		}
	}
	cfg := engine.Config{Prefix: o.prefix, Replicas: o.replicas, OutMaxAge: o.outMaxAge, AckWait: o.ackWait, InboxAckWait: o.inboxAckWait, Lease: o.lease, CacheRuns: o.cacheRuns, CacheBytes: o.cacheBytes, Limits: o.limits,
		ClientMaxRuns: o.clientMaxRuns, ClientSubmitRate: o.clientRate, ClientSubmitBurst: o.clientBurst, Catalog: cat, Logger: log, CheckpointEvery: o.checkpointEvery}
	// what the engine cannot serve, before anything starts
	if err := cfg.Validate(); err != nil {
		return err // a catalog's problem names its file and line
	}

	var reg *prometheus.Registry
	if o.metricsListen != "" {
		reg = metrics.NewRegistry()
		cfg.Metrics = reg
	}
	tp, stopTracing, err := tracing.Setup("toolbatch-engine", func(err error) { log.Warn().Err(err).Msg("trace export") })
	if err != nil {
		return err
	}
	defer stopTracing()
	if cfg.Tracing = tp; tp != nil {
		log.Info().Msg("exporting traces over OTLP (the OTEL_* environment)")
	}
	if o.natsURL == "" {
		// before anything touches the store
		unlock, err := lockStore(o.store)
		if err != nil {
			return err
		}
		defer unlock()
	}
	if o.engineID == "" && o.natsURL == "" {
		if cfg.ID, err = storedEngineID(o.store); err != nil {
			return err
		}
	} else {
		cfg.ID = o.engineID
	}
	if !o.unsigned {
		if cfg.Signer, err = signer(o); err != nil {
			return err
		}
	}
	var workers workerPools
	if o.auth != "" {
		if err := workers.load(o.auth); err != nil {
			return err
		}
		cfg.WorkerPools = workers.of
	}
	url := o.natsURL
	connOpts := access.ServiceOptions("toolbatch-engine")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if url == "" {
		if o.conn != (access.Conn{}) {
			return errors.New("--creds and --tls-ca are for --nats-url: the engine connects to its embedded server in process")
		}
		srv, err := embedded.Start(embedded.Config{Listen: o.listen, Store: o.store, SyncAlways: o.syncAlways, Auth: o.auth,
			Layout:  access.Layout{Names: protocol.Names{Prefix: o.prefix}, PoolTools: cat.PoolTools()},
			TLSCert: o.tlsCert, TLSKey: o.tlsKey, TLSClientCA: o.tlsClientCA})
		if err != nil {
			return err
		}
		defer srv.Stop()
		go reloadOnHangup(ctx, log, srv.Reload, func() error { return workers.load(o.auth) })
		log.Info().Str("url", srv.ClientURL()).Str("store", o.store).Bool("auth", o.auth != "").Bool("tls", o.tlsCert != "").Msg("embedded NATS server ready")
		// The engine itself talks to its server in process, without a
		// socket: about half the CPU per message of a loopback connection.
		url = "in-process"
		connOpts = append(connOpts, srv.EngineOptions()...)
	} else {
		if o.tlsCert != "" || o.tlsClientCA != "" {
			return errors.New("--tls-cert and --tls-client-ca configure the embedded server: with --nats-url, give --creds (and --tls-ca)")
		}
		if o.auth != "" {
			// Your server authenticates; the engine reads the file for the
			// workers' pools (claims), and again on SIGHUP.
			go reloadOnHangup(ctx, log, func() error { return workers.load(o.auth) })
		}
		opts, err := o.conn.Options()
		if err != nil {
			return err
		}
		connOpts = append(connOpts, opts...)
	}
	nc, err := nats.Connect(url, connOpts...)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", url, err)
	}
	defer nc.Close()
	eng, err := engine.New(nc, cfg)
	if err != nil {
		return err
	}
	if reg != nil {
		ms, err := metrics.Listen(o.metricsListen, reg, eng.Readiness, eng.Settle)
		if err != nil {
			return err
		}
		defer ms.Close()
		log.Info().Str("addr", ms.Addr()).Msg("serving " + metrics.PathMetrics + ", " + metrics.PathHealthz + " and " + metrics.PathReadyz)
	}
	if cfg.Signer != nil {
		log.Info().Str("key", cfg.Signer.Key()).Msg("signing commits (pin this key: replay audit --keys)")
	} else {
		log.Warn().Msg("--unsigned: commits are not signed; replay audit reports the log as unsigned")
	}
	return eng.Run(ctx)
}

// reloadOnHangup runs every reload on each SIGHUP: the embedded server's
// users (new users may connect, revoked users' connections are closed) and
// the workers' pools the engine checks claims against.
func reloadOnHangup(ctx context.Context, log zerolog.Logger, reloads ...func() error) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			var errs []error
			for _, r := range reloads {
				errs = append(errs, r())
			}
			if err := errors.Join(errs...); err != nil {
				log.Error().Err(err).Msg("auth file not reloaded: the previous users stay")
			} else {
				log.Info().Msg("auth file reloaded")
			}
		}
	}
}

// signer is the engine's signer: its --signing-key, its --creds' key, or
// the key kept in the store directory, made on the first start.
func signer(o options) (*proof.Signer, error) {
	path, create := o.signingKey, false
	switch {
	case path != "":
	case o.conn.Creds != "" && o.natsURL != "":
		path = o.conn.Creds
	default:
		if err := os.MkdirAll(o.store, 0o700); err != nil {
			return nil, fmt.Errorf("--store: %w", err)
		}
		path, create = filepath.Join(o.store, "signing.nk"), true
	}
	kp, err := access.SigningKey(path, create)
	if err != nil {
		return nil, err
	}
	return proof.NewSigner(kp)
}

// storedEngineID is the engine id kept in the store directory, made on
// the first start.
func storedEngineID(store string) (string, error) {
	path := filepath.Join(store, "engine-id")
	if data, err := os.ReadFile(path); err == nil {
		if id := strings.TrimSpace(string(data)); id != "" {
			return id, nil
		}
	}
	if err := os.MkdirAll(store, 0o700); err != nil {
		return "", fmt.Errorf("--store: %w", err)
	}
	id := nuid.Next()
	if err := os.WriteFile(path, []byte(id+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("--store: %w", err)
	}
	return id, nil
}

// workerPools are the pools of each worker user of the auth file.
type workerPools struct {
	m atomic.Pointer[map[string][]string]
}

func (w *workerPools) load(path string) error {
	f, err := access.LoadFile(path)
	if err != nil {
		return err
	}
	m := f.WorkerPools()
	w.m.Store(&m)
	return nil
}

func (w *workerPools) of(nkey string) []string {
	if m := w.m.Load(); m != nil {
		return (*m)[nkey]
	}
	return nil
}
