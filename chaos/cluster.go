package chaos

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/internal/testproc"
)

// Kinds of process, as crashes are counted.
const (
	KindEngine = "engine"
	KindWorker = "worker"
	KindNATS   = "nats"
)

// Ready lines: a substring of the stderr line each program writes once it
// serves.
const (
	readyNATS   = "Server is ready"
	readyEngine = `"engine ready"`
	readyWorker = `"message":"ready"`
)

// Tools of the workload. Every sandbox tool writes "<operation_id>
// <attempt>" to the effects file as its first statement, so that its entries
// can be counted by their own side effect.
const (
	toolEcho      = "echo"      // brain builtin echo, replay_safe
	toolSleep     = "sleep"     // brain builtin sleep, replay_safe
	toolSleepNR   = "sleep_nr"  // brain builtin sleep, never_replay
	toolConfirm   = "confirm"   // brain builtin echo, never_replay, asks for confirmation
	toolAsk       = "ask"       // client-executed
	toolSBNever   = "sb_never"  // sandbox, never_replay (the worker says non_recoverable)
	toolSBReplay  = "sb_replay" // sandbox, replay_safe (the worker says replay_safe)
	toolSBIdem    = "sb_idem"   // sandbox, idempotent (the worker says idempotent)
	toolLater     = "later"     // sandbox, idempotent, scheduled 1s after its gate decision
	effectsFile   = "effects.log"
	dispatchLimit = "3s" // dispatch_deadline of the sandbox tools (one server)
)

// catalogYAML is the engine's catalog, its sandbox tools with that
// dispatch_deadline.
func catalogYAML(dispatchLimit string) string {
	return `# the chaos driver's catalog
tools:
  - {id: echo, builtin: echo, recovery: {mode: replay_safe, max_attempts: 3}}
  - {id: sleep, builtin: sleep, recovery: {mode: replay_safe, max_attempts: 3}}
  - {id: sleep_nr, builtin: sleep, recovery: {mode: never_replay}}
  - {id: confirm, builtin: echo, recovery: {mode: never_replay}}
  - {id: ask, kind: client}
  - {id: sb_never, target: sandbox, recovery: {mode: never_replay, max_attempts: 3}, dispatch_deadline: ` + dispatchLimit + `}
  - {id: sb_replay, target: sandbox, recovery: {mode: replay_safe, max_attempts: 4}, dispatch_deadline: ` + dispatchLimit + `}
  - {id: sb_idem, target: sandbox, recovery: {mode: idempotent, max_attempts: 4}, dispatch_deadline: ` + dispatchLimit + `}
  - {id: later, target: sandbox, recovery: {mode: idempotent, max_attempts: 4}, dispatch_deadline: ` + dispatchLimit + `}
gate:
  rules:
    - {tools: [confirm], outcome: require_confirmation}
    - {tools: [later], outcome: schedule, after: 1s, action_kind: chaos}
`
}

// workerYAML is a sandbox worker's config: every tool records its entry in
// the effects directory, then sleeps for its "sleep" argument (seconds).
func workerYAML(effects string) string {
	script := fmt.Sprintf(`echo "$TOOLBATCH_OPERATION_ID $TOOLBATCH_ATTEMPT" >> %s/%s; `+
		`s=$(sed -n 's/.*"sleep": *"\([0-9.]*\)".*/\1/p'); `+
		`if [ -n "$s" ]; then sleep "$s"; fi; `+
		`echo "done $TOOLBATCH_OPERATION_ID attempt $TOOLBATCH_ATTEMPT"`, effects, effectsFile)
	tool := func(id, capability string) string {
		return fmt.Sprintf(`  - id: %s
    command: ["/bin/sh", "-c", %q]
    capability: %s
    timeout: 30s
    mounts: [{path: %s, writable: true}]
`, id, script, capability, effects)
	}
	return "pools: [default]\nisolation: bubblewrap\ntools:\n" +
		tool(toolSBNever, "non_recoverable") +
		tool(toolSBReplay, "replay_safe") +
		tool(toolSBIdem, "idempotent") +
		tool(toolLater, "idempotent")
}

// Binaries are the programs the driver runs.
type Binaries struct {
	NATS   string // nats-server, built from the module's requirement
	Engine string // cmd/engine
	Worker string // cmd/sandbox-worker
}

// cluster is one schedule's processes: a nats-server (or a cluster of
// three), one or two engines, two sandbox workers.
type cluster struct {
	dir     string // the schedule's directory: store, configs, logs
	effects string // the directory the tools write their effects to
	url     string // every server's client URL, comma-separated
	nats    []*proc
	nodes   []*natsNode // the servers of a 3-node cluster, as nats; nil with one server
	engines []*proc
	workers []*proc

	// obs is the driver's observer connection to a cluster (leaders,
	// health); nil with one server.
	obs   *nats.Conn
	obsJS jetstream.JetStream

	cancel  context.CancelFunc
	keepers sync.WaitGroup
}

// all returns every process.
func (c *cluster) all() []*proc {
	out := append([]*proc(nil), c.nats...)
	out = append(out, c.engines...)
	return append(out, c.workers...)
}

// startCluster writes the configs into dir and starts the processes: the
// nats-server (servers 1) or a 3-node cluster (servers 3, then it waits
// until the cluster is healthy), then the first engine (it creates the
// streams, with 3 replicas on a cluster), then the other engines and the
// workers. shared is a directory readable by the sandbox user, where the
// effects and the workers' work roots go.
func startCluster(ctx context.Context, bins Binaries, dir, shared string, servers, engines, workers int) (*cluster, error) {
	if servers != 1 && servers != clusterSize {
		return nil, fmt.Errorf("%d nats-servers: want 1 or %d", servers, clusterSize)
	}
	c := &cluster{dir: dir, effects: filepath.Join(shared, "effects")}
	for _, d := range []string{filepath.Join(dir, "logs"), filepath.Join(dir, "store")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	// Each tool runs as a user of its own: the effects directory must be
	// reachable by them, and the effects file, which every tool appends
	// to, writable by all (as an operator would share a file).
	if err := os.MkdirAll(c.effects, 0o777); err != nil {
		return nil, err
	}
	if err := os.Chmod(c.effects, 0o777); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(c.effects, effectsFile), nil, 0o666); err != nil {
		return nil, err
	}
	if err := os.Chmod(filepath.Join(c.effects, effectsFile), 0o666); err != nil {
		return nil, err
	}
	catPath := filepath.Join(dir, "catalog.yaml")
	deadline := dispatchLimit
	if servers > 1 {
		deadline = clusterDispatchLimit
	}
	if err := os.WriteFile(catPath, []byte(catalogYAML(deadline)), 0o644); err != nil {
		return nil, err
	}
	workerCfg := filepath.Join(dir, "worker.yaml")
	if err := os.WriteFile(workerCfg, []byte(workerYAML(c.effects)), 0o644); err != nil {
		return nil, err
	}
	logPath := func(name string) string { return filepath.Join(dir, "logs", name+".log") }

	engineArgs := []string{"--catalog", catPath, "--log-format", "json"}
	if servers == 1 {
		engineArgs = append(engineArgs, "--ack-wait", "1s", "--inbox-ack-wait", "1s", "--lease", "1s")
		port, err := testproc.Port()
		if err != nil {
			return nil, err
		}
		c.url = fmt.Sprintf("nats://127.0.0.1:%d", port)
		p, err := newProc("nats-server", KindNATS, logPath("nats-server"), bins.NATS, readyNATS,
			"-js", "-sd", filepath.Join(dir, "store"), "-a", "127.0.0.1", "-p", fmt.Sprint(port))
		if err != nil {
			return nil, err
		}
		c.nats = []*proc{p}
	} else {
		nodes, err := newNATSNodes(bins.NATS, dir, logPath)
		if err != nil {
			return nil, err
		}
		c.nodes = nodes
		var urls []string
		for _, n := range c.nodes {
			c.nats = append(c.nats, n.proc)
			urls = append(urls, n.url)
		}
		c.url = strings.Join(urls, ",")
		engineArgs = append(engineArgs, "--replicas", fmt.Sprint(clusterSize), "--ack-wait", clusterAckWait, "--lease", clusterLease)
	}
	for i := 1; i <= engines; i++ {
		name := fmt.Sprintf("engine-%d", i)
		p, err := newProc(name, KindEngine, logPath(name), bins.Engine, readyEngine,
			append([]string{"--nats-url", c.url}, engineArgs...)...)
		if err != nil {
			return nil, err
		}
		c.engines = append(c.engines, p)
	}
	for i := 1; i <= workers; i++ {
		name := fmt.Sprintf("worker-%d", i)
		root := filepath.Join(shared, "work-"+name)
		if err := os.MkdirAll(root, 0o755); err != nil {
			return nil, err
		}
		p, err := newProc(name, KindWorker, logPath(name), bins.Worker, readyWorker,
			"--nats-url", c.url, "--config", workerCfg, "--log-format", "json", "--concurrency", "4", "--work-root", root)
		if err != nil {
			return nil, err
		}
		c.workers = append(c.workers, p)
	}

	keepCtx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	start := func(ps ...*proc) error {
		for _, p := range ps {
			c.keepers.Add(1)
			go func() { defer c.keepers.Done(); p.keep(keepCtx) }()
		}
		wctx, stop := context.WithTimeoutCause(ctx, 60*time.Second, errNotReady)
		defer stop()
		for _, p := range ps {
			if err := p.waitReady(wctx); err != nil {
				return err
			}
		}
		return nil
	}
	if err := start(c.nats...); err != nil {
		c.stop()
		return nil, err
	}
	if c.nodes != nil {
		if err := c.observe(); err != nil {
			c.stop()
			return nil, err
		}
		hctx, stop := context.WithTimeoutCause(ctx, healTimeout, errNotHealthy)
		err := c.waitHealthy(hctx)
		stop()
		if err != nil {
			c.stop()
			return nil, err
		}
	}
	steps := [][]*proc{c.engines[:1], append(append([]*proc(nil), c.engines[1:]...), c.workers...)}
	for _, ps := range steps {
		if err := start(ps...); err != nil {
			c.stop()
			return nil, err
		}
	}
	return c, nil
}

// stop kills every process and waits for the keepers.
func (c *cluster) stop() {
	if c.obs != nil {
		c.obs.Close()
	}
	c.cancel()
	c.keepers.Wait()
}

// waitAllReady waits until every process is up, and a cluster healthy.
func (c *cluster) waitAllReady(ctx context.Context) error {
	for _, p := range c.all() {
		if err := p.waitReady(ctx); err != nil {
			return err
		}
	}
	if c.nodes != nil {
		return c.waitHealthy(ctx)
	}
	return nil
}

// surprises returns every exit the driver did not cause.
func (c *cluster) surprises() []string {
	var out []string
	for _, p := range c.all() {
		out = append(out, p.surprises()...)
	}
	return out
}
