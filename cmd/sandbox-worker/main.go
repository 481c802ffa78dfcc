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
	"syscall"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/toolbatch/toolbatch/access"
	"github.com/toolbatch/toolbatch/internal/cli"
	"github.com/toolbatch/toolbatch/metrics"
	"github.com/toolbatch/toolbatch/protocol"
	"github.com/toolbatch/toolbatch/sandbox"
	"github.com/toolbatch/toolbatch/worker"
)

func main() {
	sandbox.StageMain()
	sandbox.MCPCallMain()
	if err := run(os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "sandbox-worker:", err)
		os.Exit(2)
	}
}

func run(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("sandbox-worker", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	natsURL := fs.String("nats-url", "nats://127.0.0.1:4222", "NATS server or cluster")
	var conn access.Conn
	conn.Flags(fs)
	configPath := fs.String("config", "", "worker config (YAML): pools, isolation, tools (required)")
	pools := fs.String("pools", "", "comma-separated pools to serve (default: the config's)")
	concurrency := fs.Int("concurrency", worker.DefaultConcurrency, "calls run at once")
	workerID := fs.String("worker-id", "", "this worker's id (default <hostname>-<pid>)")
	prefix := fs.String("prefix", protocol.DefaultPrefix, "subject prefix")
	grace := fs.Duration("grace", worker.DefaultGrace, "how long a drain waits for running calls")
	var logFlags cli.LogFlags
	logFlags.Flags(fs)
	prestart := fs.Int("prestart", -1, "pre-started sandboxes kept for each subprocess tool (isolation bubblewrap only): -1 takes the config's prestart (default 2), 0 turns them off, N overrides the config for every tool")
	workRoot := fs.String("work-root", "", "where the calls' working directories are made (default: a directory of this worker under the system temp dir); working directories left there by a killed worker are removed at start")
	var metricsListen string
	metrics.FlagVar(fs, &metricsListen)
	if done, err := cli.Parse(fs, args, stderr); done {
		return err
	}
	if *configPath == "" {
		return errors.New("--config is required")
	}
	if *prestart < -1 || *prestart > sandbox.MaxPrestart {
		return fmt.Errorf("--prestart %d: want -1 (the config's), 0 (off) or up to %d", *prestart, sandbox.MaxPrestart)
	}
	log, err := logFlags.Logger(stderr)
	if err != nil {
		return err
	}
	sc, err := sandbox.LoadConfig(*configPath)
	if err != nil {
		return err
	}
	if n := *prestart; n >= 0 {
		if n > 0 && sc.Isolation == sandbox.IsolationNone {
			return fmt.Errorf("--prestart %d: pre-started sandboxes need isolation bubblewrap, and %s says isolation: none", n, *configPath)
		}
		sc.Prestart = &n
		for i := range sc.Tools {
			if !sc.Tools[i].IsBuiltin() {
				sc.Tools[i].Prestart = &n
			}
		}
	}
	if *workerID == "" {
		host, _ := os.Hostname()
		*workerID = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	defaultRoot := *workRoot == ""
	if defaultRoot {
		*workRoot = filepath.Join(sandbox.DefaultWorkParent(), defaultRootPrefix+*workerID)
	}
	_, statErr := os.Stat(*workRoot)
	if err := os.MkdirAll(*workRoot, 0o755); err != nil {
		return fmt.Errorf("--work-root %s: %w", *workRoot, err)
	}
	// A root this worker made goes when it exits: always a default one
	// (named by its worker id, no later worker reuses it), and any when its
	// start failed (a start that fails leaves nothing behind).
	started, created := false, errors.Is(statErr, os.ErrNotExist)
	defer func() {
		if created && (!started || defaultRoot) {
			os.RemoveAll(*workRoot)
		}
	}()
	release, err := holdRoot(*workRoot)
	if err != nil {
		return err
	}
	defer release()
	// Working directories left by a worker that was killed are removed here
	// (only the sandbox's own, never anything else in the directory).
	left, _ := filepath.Glob(filepath.Join(*workRoot, "toolbatch-call-*"))
	for _, dir := range left {
		if err := os.RemoveAll(dir); err != nil {
			return fmt.Errorf("--work-root: remove %s: %w", dir, err)
		}
	}
	var reg *prometheus.Registry
	var wm *metrics.Worker
	var runner *sandbox.Runner
	if metricsListen != "" {
		reg = metrics.NewRegistry()
		wm = metrics.NewWorker(reg, func() map[string]int { return runner.Ready() })
	}
	runner, err = sandbox.NewRunner(sc, sandbox.WithWorkRoot(*workRoot),
		sandbox.WithPrestartFailureHandler(func(toolID string, err error) {
			log.Warn().Str("tool_id", toolID).Err(err).Msg("pre-starting a sandbox failed; calls start their own until it works again")
		}), sandbox.WithPrestartObserver(wm.SandboxStarted))
	if err != nil {
		return err
	}
	// Pre-started sandboxes are killed and their working directories
	// removed on every way out of here, after the worker has drained.
	defer runner.Close()
	if w := runner.Warning(); w != "" {
		log.Warn().Msg(w)
	}
	if defaultRoot { // once this worker's own start has passed its checks
		if n := sweepGoneRoots(filepath.Dir(*workRoot), *workRoot); n > 0 {
			log.Info().Int("removed", n).Msg("removed the work roots of workers that are gone")
		}
	}
	if os.Geteuid() == 0 && sc.Isolation == sandbox.IsolationBubblewrap {
		// What a writable mount's files must let in.
		log.Info().Interface("tool_uids", runner.Users()).Msg("each subprocess tool runs as its own user (uid = gid)")
	}
	var poolList []string
	if *pools != "" {
		poolList = strings.Split(*pools, ",")
	}
	connOpts, err := conn.Options()
	if err != nil {
		return err
	}
	nc, err := nats.Connect(*natsURL, append(connOpts, access.ServiceOptions("toolbatch-sandbox-worker")...)...)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", *natsURL, err)
	}
	defer nc.Close()
	w, err := worker.New(nc, sc, runner, worker.Config{Prefix: *prefix, WorkerID: *workerID, Pools: poolList,
		Concurrency: *concurrency, Grace: *grace, Logger: log, Metrics: wm})
	if err != nil {
		return err
	}
	if reg != nil {
		ms, err := metrics.Listen(metricsListen, reg, w.Readiness, nil)
		if err != nil {
			return err
		}
		defer ms.Close()
		log.Info().Str("addr", ms.Addr()).Msg("serving " + metrics.PathMetrics + ", " + metrics.PathHealthz + " and " + metrics.PathReadyz)
	}
	drain, stopDrain := context.WithCancel(context.Background())
	abort, stopAbort := context.WithCancel(context.Background())
	defer stopDrain()
	defer stopAbort()
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sigs
		stopDrain()
		<-sigs
		stopAbort()
	}()
	started = true
	return w.Run(drain, abort)
}
