package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/toolbatch/toolbatch/catalog"
	"github.com/toolbatch/toolbatch/engine"
	"github.com/toolbatch/toolbatch/metrics"
	"github.com/toolbatch/toolbatch/proof"
	"github.com/toolbatch/toolbatch/tracing"
)

// embeddedServer starts a NATS server with JetStream exactly as
// cmd/engine starts its embedded one.
func embeddedServer(store, listen string, syncAlways bool) (*server.Server, error) {
	host, portStr, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, err
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, err
	}
	srv, err := server.NewServer(&server.Options{
		ServerName: "toolbatch", Host: host, Port: port, JetStream: true, StoreDir: store,
		MaxPayload: 8 << 20, SyncAlways: syncAlways, NoSigs: true, NoLog: true,
	})
	if err != nil {
		return nil, err
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return nil, fmt.Errorf("embedded NATS server did not start on %s", listen)
	}
	return srv, nil
}

// profileNext is the file in the profile directory that names the next
// profile.
const profileNext = "next"

// profiledEngine is `bench profiled-engine`: the engine as cmd/engine runs
// it with its embedded server (the same server options), with a CPU
// profile: SIGUSR1 starts one, named as <pprof-dir>/next says (the bench
// writes the part's name there first: w1, w1echo, w2), SIGUSR2 stops and
// writes it, <name>.pprof and the heap as <name>.heap.pprof. Only `bench
// --pprof-dir` uses it.
func profiledEngine(args []string) error {
	fs := flag.NewFlagSet("profiled-engine", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	store := fs.String("store", "./toolbatch-data", "")
	listen := fs.String("listen", "127.0.0.1:4222", "")
	catPath := fs.String("catalog", "", "")
	fs.String("log-format", "json", "")
	fs.String("client-max-runs", "", "")
	fs.String("client-submit-rate", "", "")
	syncAlways := fs.Bool("sync-always", false, "")
	dir := fs.String("pprof-dir", ".", "")
	metricsListen := fs.String("metrics-listen", "", "")
	if err := fs.Parse(args); err != nil {
		return err
	}
	log := zerolog.New(os.Stderr).Level(zerolog.InfoLevel).With().Timestamp().Logger() // cmd/engine's default level
	cat := catalog.Default()
	if *catPath != "" {
		var err error
		if cat, err = catalog.Load(*catPath); err != nil {
			return err
		}
	}
	srv, err := embeddedServer(*store, *listen, *syncAlways)
	if err != nil {
		return err
	}
	defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
	nc, err := nats.Connect("in-process", nats.InProcessServer(srv), nats.Name("toolbatch-engine"), nats.MaxReconnects(-1))
	if err != nil {
		return err
	}
	defer nc.Close()
	kp, err := nkeys.CreateUser()
	if err != nil {
		return err
	}
	signer, err := proof.NewSigner(kp) // as cmd/engine signs by default
	if err != nil {
		return err
	}
	cfg := engine.Config{Catalog: cat, Logger: log, ClientMaxRuns: -1, ClientSubmitRate: -1, Signer: signer} // as unlimitedClients
	var reg *prometheus.Registry
	if *metricsListen != "" {
		reg = metrics.NewRegistry()
		cfg.Metrics = reg
	}
	tp, stopTracing, err := tracing.Setup("toolbatch-engine", func(err error) { log.Warn().Err(err).Msg("trace export") }) // the OTEL_* environment, as cmd/engine
	if err != nil {
		return err
	}
	defer stopTracing()
	cfg.Tracing = tp
	eng, err := engine.New(nc, cfg)
	if err != nil {
		return err
	}
	if reg != nil {
		ms, err := metrics.Listen(*metricsListen, reg, eng.Readiness, eng.Settle)
		if err != nil {
			return err
		}
		defer ms.Close()
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGUSR1, syscall.SIGUSR2)
	go func() {
		n := 0
		var f *os.File
		for sig := range sigs {
			switch {
			case sig == syscall.SIGUSR1 && f == nil:
				n++
				name := fmt.Sprintf("profile%d", n)
				if next, err := os.ReadFile(filepath.Join(*dir, profileNext)); err == nil && len(next) > 0 {
					name = string(next)
				}
				if f, err = os.Create(filepath.Join(*dir, name+".pprof")); err != nil {
					log.Error().Err(err).Msg("profile")
					f = nil
					continue
				}
				if err := pprof.StartCPUProfile(f); err != nil {
					log.Error().Err(err).Msg("profile")
				}
			case sig == syscall.SIGUSR2 && f != nil:
				pprof.StopCPUProfile()
				f.Close()
				// And the heap as it is at the end: <name>.heap.
				if h, err := os.Create(strings.TrimSuffix(f.Name(), ".pprof") + ".heap.pprof"); err == nil {
					_ = pprof.Lookup("heap").WriteTo(h, 0)
					h.Close()
				}
				f = nil
			}
		}
	}()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return eng.Run(ctx)
}
