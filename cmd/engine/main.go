package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/toolbatch/toolbatch/catalog"
	"github.com/toolbatch/toolbatch/engine"
	"github.com/toolbatch/toolbatch/internal/cli"
	"github.com/toolbatch/toolbatch/protocol"
)

type options struct {
	store, listen, natsURL, prefix, catalogPath string
	replicas, cacheRuns                         int
	logFormat, logLevel                         string
	outMaxAge, ackWait, lease                   time.Duration
	syncAlways                                  bool
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
	fs.StringVar(&o.logFormat, "log-format", "console", "console or json")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.DurationVar(&o.outMaxAge, "out-max-age", engine.DefaultOutMaxAge, "how long out messages are kept")
	fs.DurationVar(&o.ackWait, "ack-wait", engine.DefaultAckWait, "how long a crashed engine's runs wait before they are taken over")
	fs.DurationVar(&o.lease, "lease", engine.DefaultLease, "how long a sandbox worker's claim lasts without a heartbeat")
	fs.IntVar(&o.cacheRuns, "cache-runs", engine.DefaultCacheRuns, "runs whose folded state is kept in memory (the rest are folded from the log when touched)")
	fs.BoolVar(&o.syncAlways, "sync-always", false, "embedded server: fsync every write (slower; survives power loss)")
	if done, err := cli.Parse(fs, args, stderr); done {
		return err
	}
	if o.cacheRuns < 1 {
		return fmt.Errorf("--cache-runs %d: want at least 1", o.cacheRuns)
	}
	log, err := logger(o.logFormat, o.logLevel, stderr)
	if err != nil {
		return err
	}
	cat := catalog.Default()
	if o.catalogPath != "" {
		if cat, err = catalog.Load(o.catalogPath); err != nil {
			return err
		}
	}
	cfg := engine.Config{Prefix: o.prefix, Replicas: o.replicas, OutMaxAge: o.outMaxAge, AckWait: o.ackWait, Lease: o.lease, CacheRuns: o.cacheRuns, Catalog: cat, Logger: log}

	url := o.natsURL
	connOpts := []nats.Option{nats.Name("toolbatch-engine"), nats.MaxReconnects(-1)}
	if url == "" {
		srv, err := embedded(o)
		if err != nil {
			return err
		}
		defer func() {
			srv.Shutdown()
			srv.WaitForShutdown()
		}()
		log.Info().Str("url", srv.ClientURL()).Str("store", o.store).Msg("embedded NATS server ready")
		// The engine itself talks to its server in process, without a
		// socket: about half the CPU per message of a loopback connection.
		url = "in-process"
		connOpts = append(connOpts, nats.InProcessServer(srv))
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
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return eng.Run(ctx)
}

func embedded(o options) (*server.Server, error) {
	host, portStr, err := net.SplitHostPort(o.listen)
	if err != nil {
		return nil, fmt.Errorf("--listen %q: %w", o.listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("--listen %q: port: %w", o.listen, err)
	}
	srv, err := server.NewServer(&server.Options{
		ServerName: "toolbatch", Host: host, Port: port, JetStream: true, StoreDir: o.store,
		MaxPayload: 8 << 20, // a commit holds a whole batch: up to 128 calls' arguments
		SyncAlways: o.syncAlways, NoSigs: true, NoLog: true,
	})
	if err != nil {
		return nil, fmt.Errorf("embedded NATS server: %w", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return nil, fmt.Errorf("embedded NATS server did not start on %s (is the port in use?)", o.listen)
	}
	return srv, nil
}

func logger(format, level string, w io.Writer) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil || level == "" {
		return zerolog.Nop(), fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	switch format {
	case "json":
		return zerolog.New(w).Level(lvl).With().Timestamp().Logger(), nil
	case "console":
		return zerolog.New(zerolog.ConsoleWriter{Out: w, TimeFormat: time.RFC3339}).Level(lvl).With().Timestamp().Logger(), nil
	default:
		return zerolog.Nop(), fmt.Errorf("--log-format %q: want console or json", format)
	}
}
