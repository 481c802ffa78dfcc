package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/toolbatch/toolbatch/protocol"
	"github.com/toolbatch/toolbatch/sandbox"
)

// MCP: one call of an MCP tool (the npm everything server's get-sum, under
// Debian's node) through sandbox.Runner as a worker makes it: the worker
// program started in the call's sandbox as the MCP client, the server
// started by it, initialize, tools/call, the result read, the sandbox torn
// down. In the same run, interleaved: one server per call with isolation
// none (no bubblewrap: what the sandbox adds), in a fresh and in a
// pre-started bubblewrap sandbox; a shared server (one long-lived
// sandboxed server, started by the warm-up calls); and the server's own
// start and one call made by a bare client with no toolbatch (node,
// initialize, tools/call: the floor of a server per call).

// The benchmark program is the MCP client of its sandboxes.
func init() { sandbox.MCPCallMain() }

// MCPResult is the cost of one MCP call.
type MCPResult struct {
	Calls                int `json:"calls_per_rep"`
	BareP50ms            Num `json:"bare_client_p50_ms"`
	NoneP50ms            Num `json:"runner_isolation_none_p50_ms"`
	FreshP50ms           Num `json:"runner_bubblewrap_p50_ms"`
	PrestartedP50ms      Num `json:"prestarted_p50_ms"`
	PrestartedOverBare   Num `json:"prestarted_over_bare"`
	SharedP50ms          Num `json:"shared_server_p50_ms"`
	SharedOverPrestarted Num `json:"shared_over_prestarted"`
	// The whole path: a batch of one MCP call submitted to an engine,
	// claimed by a worker process, run and published (p50, submission to
	// results), for each lifecycle.
	WholePerCallP50ms Num    `json:"whole_path_per_call_p50_ms"`
	WholeSharedP50ms  Num    `json:"whole_path_shared_p50_ms"`
	WholeSamples      int    `json:"whole_path_samples"`
	Skipped           string `json:"skipped,omitempty"`
}

func mcpBenchConfig(isolation string, prestart int, lifecycle, server, mount string) string {
	return fmt.Sprintf(`pools: [default]
isolation: %s
prestart: %d
tools:
  - id: sum
    command: [node, %s, stdio]
    mcp: {server: everything, tool: get-sum, lifecycle: %s}
    capability: replay_safe
    limits: {memory_mb: 8192, max_procs: 256}
    mounts: [{path: %s}]
`, isolation, prestart, server, lifecycle, mount)
}

// mcpWholeCatalog and mcpWholeWorker: the two lifecycles of one tool, for
// the whole path (get-tiny-image: the benchmark's batches send {"i": n},
// which it takes).
const mcpWholeCatalog = `
tools:
  - {id: sum, target: sandbox, recovery: {mode: replay_safe}}
  - {id: sum_shared, target: sandbox, recovery: {mode: replay_safe}}
`

func mcpWholeWorker(server, mount string) string {
	return fmt.Sprintf(`pools: [default]
isolation: bubblewrap
tools:
  - id: sum
    command: [node, %[1]s, stdio]
    mcp: {server: everything, tool: get-tiny-image}
    capability: replay_safe
    limits: {memory_mb: 8192, max_procs: 256}
    mounts: [{path: %[2]s}]
  - id: sum_shared
    command: [node, %[1]s, stdio]
    mcp: {server: everything_shared, tool: get-tiny-image, lifecycle: shared}
    capability: replay_safe
    limits: {memory_mb: 8192, max_procs: 256}
    mounts: [{path: %[2]s}]
`, server, mount)
}

// runMCPWhole measures a batch of one MCP call through an engine and a
// worker process, for each lifecycle, one after the other for dur each.
func runMCPWhole(ctx context.Context, bins binaries, dir, server, mount string, dur time.Duration) (perCall, shared float64, samples int, err error) {
	c, err := startCluster(filepath.Join(dir, "mcp-cluster"), clusterOptions{engineBin: bins.engine, workerBin: bins.worker,
		workers: 1, concurrency: 4, clientConns: 1, catalog: mcpWholeCatalog, worker: mcpWholeWorker(server, mount)})
	if err != nil {
		return 0, 0, 0, err
	}
	defer c.stop()
	p50 := func(tool string, d time.Duration) (float64, int, error) {
		var ds []time.Duration
		stop := make(chan struct{})
		timer := time.AfterFunc(d, func() { close(stop) })
		defer timer.Stop()
		err := clientLoop(ctx, loopConfig{client: c.clients[0], js: c.jss[0], prefix: protocol.DefaultPrefix, runPrefix: "mcp-" + tool, tool: tool, calls: 1, stepsPerRun: 10},
			stop, func(s sample) { ds = append(ds, s.lat) })
		return percentile(ds, 50), len(ds), err
	}
	// Warm-up: the shared server's start, the first sandboxes.
	for _, tool := range []string{"sum", "sum_shared"} {
		if _, _, err := p50(tool, time.Second); err != nil {
			return 0, 0, 0, err
		}
	}
	perCall, n1, err := p50("sum", dur)
	if err != nil {
		return 0, 0, 0, err
	}
	shared, n2, err := p50("sum_shared", dur)
	return perCall, shared, min(n1, n2), err
}

func runMCP(ctx context.Context, root string, bins binaries, reps, calls int) (MCPResult, error) {
	res := MCPResult{Calls: calls}
	src := filepath.Join(root, "testdata", "mcp", "node_modules")
	if _, err := os.Stat(src); err != nil {
		res.Skipped = "the MCP servers are not installed (make mcp-deps)"
		return res, nil
	}
	if _, err := exec.LookPath("node"); err != nil {
		res.Skipped = "node is not installed"
		return res, nil
	}
	dir, err := reachableDir("toolbatch-bench-mcp-")
	defer os.RemoveAll(dir)
	if err != nil {
		return res, err
	}
	if out, err := exec.Command("cp", "-r", src, dir).CombinedOutput(); err != nil {
		return res, fmt.Errorf("copy the MCP servers: %v: %s", err, out)
	}
	server := filepath.Join(dir, "node_modules/@modelcontextprotocol/server-everything/dist/index.js")
	work, err := reachableDir("toolbatch-bench-mcp-work-")
	defer os.RemoveAll(work)
	if err != nil {
		return res, err
	}
	runners := map[string]*sandbox.Runner{}
	defer func() {
		for _, r := range runners {
			_ = r.Close()
		}
	}()
	for _, v := range []struct {
		name, isolation, lifecycle string
		prestart                   int
	}{{"none", "none", "per_call", 0}, {"fresh", "bubblewrap", "per_call", 0}, {"prestarted", "bubblewrap", "per_call", 2},
		{"shared", "bubblewrap", "shared", 0}} {
		cfg, err := sandbox.ParseConfig([]byte(mcpBenchConfig(v.isolation, v.prestart, v.lifecycle, server, dir)))
		if err != nil {
			return res, err
		}
		r, err := sandbox.NewRunner(cfg, sandbox.WithWorkRoot(work))
		if err != nil {
			return res, fmt.Errorf("%s: %w", v.name, err)
		}
		runners[v.name] = r
	}
	waitReady := func() error {
		wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		return runners["prestarted"].WaitPrestarted(wctx)
	}
	call := func(name string, i int) error {
		out := runners[name].Run(ctx, sandbox.Call{ToolID: "sum", CallID: "c1", OperationID: fmt.Sprintf("mcp/%d/c1", i), Attempt: 1,
			Arguments: []byte(`{"a":1,"b":2}`)})
		switch {
		case out.Err != nil:
			return fmt.Errorf("%s: %s", name, out.Err.Message)
		case out.Output == nil || !strings.Contains(out.Output.Text(), "is 3"):
			return fmt.Errorf("%s: unexpected output %+v", name, out.Output)
		}
		return nil
	}
	// bare: node started by a client that writes the three messages and
	// waits for the call's answer, with no toolbatch in between.
	bare := func() error {
		cmd := exec.CommandContext(ctx, "node", server, "stdio")
		cmd.Stdin = strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"bench","version":"0"}}}
{"jsonrpc":"2.0","method":"notifications/initialized"}
{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"get-sum","arguments":{"a":1,"b":2}}}
`)
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		if err := cmd.Start(); err != nil {
			return err
		}
		defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
		buf := make([]byte, 0, 4096)
		tmp := make([]byte, 4096)
		for !strings.Contains(string(buf), `"id":2`) {
			n, err := stdout.Read(tmp)
			if err != nil {
				return fmt.Errorf("bare client: %v (read %q)", err, buf)
			}
			buf = append(buf, tmp[:n]...)
		}
		return nil
	}
	var bareP, noneP, freshP, preP, sharedP []float64
	for rep := 0; rep < reps; rep++ {
		var b, n, f, p, sh []time.Duration
		for i := -2; i < calls; i++ {
			for _, m := range []struct {
				to *[]time.Duration
				f  func() error
			}{{&b, bare}, {&n, func() error { return call("none", i) }}, {&f, func() error { return call("fresh", i) }},
				{&p, func() error { return call("prestarted", i) }}, {&sh, func() error { return call("shared", i) }}} {
				if err := waitReady(); err != nil {
					return res, err
				}
				t := time.Now()
				if err := m.f(); err != nil {
					return res, err
				}
				if i >= 0 {
					*m.to = append(*m.to, time.Since(t))
				}
			}
		}
		bareP, noneP = append(bareP, percentile(b, 50)), append(noneP, percentile(n, 50))
		freshP, preP = append(freshP, percentile(f, 50)), append(preP, percentile(p, 50))
		sharedP = append(sharedP, percentile(sh, 50))
	}
	res.BareP50ms, res.NoneP50ms = Num(median(bareP)), Num(median(noneP))
	res.FreshP50ms, res.PrestartedP50ms = Num(median(freshP)), Num(median(preP))
	res.PrestartedOverBare = Num(ratio(float64(res.PrestartedP50ms), float64(res.BareP50ms)))
	res.SharedP50ms = Num(median(sharedP))
	res.SharedOverPrestarted = Num(ratio(float64(res.SharedP50ms), float64(res.PrestartedP50ms)))
	for name, r := range runners {
		_ = r.Close()
		delete(runners, name)
	}
	// The workers' roots must be reachable by the sandboxes' users: not
	// under the benchmark's private temporary directory.
	cdir, err := reachableDir("toolbatch-bench-mcp-cluster-")
	defer os.RemoveAll(cdir)
	if err != nil {
		return res, err
	}
	perCall, shared, n, err := runMCPWhole(ctx, bins, cdir, server, dir, 5*time.Second)
	if err != nil {
		return res, fmt.Errorf("the whole path: %w", err)
	}
	res.WholePerCallP50ms, res.WholeSharedP50ms, res.WholeSamples = Num(perCall), Num(shared), n
	return res, nil
}
