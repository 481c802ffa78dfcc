package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ceilingServer is `bench ceiling-server`: an embedded NATS server started
// as cmd/engine starts its own, with the ceiling measured from inside its
// process over in-process connections to itself (as the engine connects
// to its embedded server), written to --results; then the hand-rolled minimal
// engine and projector run there, on one such connection, until SIGTERM,
// while the benchmark drives the minimal worker and the client from its
// own process.
func ceilingServer(args []string) error {
	fs := flag.NewFlagSet("ceiling-server", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	store := fs.String("store", "", "")
	listen := fs.String("listen", "127.0.0.1:4222", "")
	syncAlways := fs.Bool("sync-always", false, "")
	payload := fs.Int("payload", 400, "")
	reps := fs.Int("reps", 3, "")
	window := fs.Duration("window", 3*time.Second, "")
	chains := fs.String("chains", "64,512", "")
	results := fs.String("results", "", "")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var chainCounts []int
	for _, c := range strings.Split(*chains, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(c))
		if err != nil {
			return fmt.Errorf("--chains: %w", err)
		}
		chainCounts = append(chainCounts, n)
	}
	srv, err := embeddedServer(*store, *listen, *syncAlways)
	if err != nil {
		return err
	}
	defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ceil, err := runCeiling(ctx, endpoint{srv: srv}, *payload, *reps, *window, chainCounts)
	if err != nil {
		return err
	}
	data, err := json.Marshal(ceil)
	if err != nil {
		return err
	}
	if err := os.WriteFile(*results, data, 0o644); err != nil {
		return err
	}
	stopMin, failed, err := startMinimalEngine(ctx, endpoint{srv: srv}, *payload)
	if err != nil {
		return err
	}
	defer stopMin()
	fmt.Fprintln(os.Stderr, "ceiling-server ready")
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(50 * time.Millisecond):
			if err := failed(); err != nil {
				return fmt.Errorf("minimal engine: %w", err)
			}
		}
	}
}
