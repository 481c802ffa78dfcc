package main_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/toolbatch/toolbatch/client"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/internal/testnats"
	"github.com/toolbatch/toolbatch/internal/testproc"
	"github.com/toolbatch/toolbatch/internal/testwait"
	"github.com/toolbatch/toolbatch/protocol"
)

const mcpCatalogYAML = `
tools:
  - {id: sum, target: sandbox, recovery: {mode: replay_safe}, dispatch_deadline: 20s}
  - {id: read, target: sandbox, recovery: {mode: replay_safe}, dispatch_deadline: 20s}
  - {id: long_nr, target: sandbox, recovery: {mode: never_replay}, dispatch_deadline: 20s}
  - {id: long_ro, target: sandbox, recovery: {mode: replay_safe, max_attempts: 3}, dispatch_deadline: 20s}
  - {id: write, target: sandbox, recovery: {mode: idempotent}, dispatch_deadline: 20s}
gate:
  rules:
    - {tools: [write], outcome: require_confirmation}
`

// mcpWorkerYAML: the reference MCP servers from npm (copied to servers)
// behind four tools; files is the filesystem server's only directory.
func mcpWorkerYAML(servers, files string) string {
	everything := filepath.Join(servers, "node_modules/@modelcontextprotocol/server-everything/dist/index.js")
	filesystem := filepath.Join(servers, "node_modules/@modelcontextprotocol/server-filesystem/dist/index.js")
	return fmt.Sprintf(`
pools: [default]
isolation: bubblewrap
tools:
  - id: sum
    command: [node, %[1]s, stdio]
    mcp: {server: everything, tool: get-sum}
    capability: replay_safe
    limits: &node {memory_mb: 8192, max_procs: 256}
    mounts: [{path: %[3]s}]
  - id: long_nr
    command: [node, %[1]s, stdio]
    mcp: {server: everything, tool: trigger-long-running-operation}
    timeout: 60s
    limits: *node
    mounts: [{path: %[3]s}]
  - id: long_ro
    command: [node, %[1]s, stdio]
    mcp: {server: everything, tool: trigger-long-running-operation}
    capability: replay_safe
    timeout: 60s
    limits: *node
    mounts: [{path: %[3]s}]
  - id: read
    command: [node, %[2]s, %[4]s]
    mcp: {server: fs, tool: read_text_file}
    capability: replay_safe
    limits: *node
    mounts: [{path: %[3]s}, {path: %[4]s}]
  - id: write
    command: [node, %[2]s, %[4]s]
    mcp: {server: fs, tool: write_file}
    capability: idempotent
    limits: *node
    mounts: [{path: %[3]s}, {path: %[4]s, writable: true}]
`, everything, filesystem, servers, files)
}

// mcpServersDir copies testdata/mcp's servers where the sandbox's users
// can read them.
func mcpServersDir(t *testing.T) string {
	t.Helper()
	src, err := filepath.Abs("../../testdata/mcp/node_modules")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(src); err != nil {
		t.Fatalf("the MCP servers are not installed (make mcp-deps): %v", err)
	}
	dir := reachableDir(t, "toolbatch-mcp", 0o755)
	if out, err := exec.Command("cp", "-r", src, dir).CombinedOutput(); err != nil {
		t.Fatalf("copy the MCP servers: %v: %s", err, out)
	}
	return dir
}

// serverProcs returns the pids of the running processes of the everything
// MCP server under servers (one per call in progress).
func serverProcs(servers string) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		if len(args) > 1 && strings.HasSuffix(args[0], "node") && strings.HasPrefix(args[1], servers) && strings.Contains(args[1], "server-everything") {
			pids = append(pids, pid)
		}
	}
	return pids
}

// ancestorOf reports whether pid descends from ancestor.
func ancestorOf(ancestor, pid int) bool {
	for pid > 1 {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return false
		}
		// pid (comm) state ppid ...: comm may hold spaces, not ")".
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(fields) < 2 {
			return false
		}
		if pid, err = strconv.Atoi(fields[1]); err != nil {
			return false
		}
		if pid == ancestor {
			return true
		}
	}
	return false
}

// TestMCPToolsThroughWorkers: MCP tools of servers from npm, on real
// workers in bubblewrap behind a real engine: a batch mixing them gets its
// results in model order; a destructive one parks on a confirmation and
// runs once approved; killing the worker inside a call of a
// never_replay MCP tool makes it indeterminate (the server saw it once),
// and inside a call of a replay_safe one the other worker completes it.
func TestMCPToolsThroughWorkers(t *testing.T) {
	servers := mcpServersDir(t)
	files := reachableDir(t, "toolbatch-mcp-files", 0o777) // the write tool's user writes there
	if err := os.WriteFile(filepath.Join(files, "a.txt"), []byte("alpha"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cat := filepath.Join(dir, "catalog.yaml")
	if err := os.WriteFile(cat, []byte(mcpCatalogYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	port := testproc.FreePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	testproc.Start(t, "engine", `"engine ready"`, engineBin, "--store", filepath.Join(dir, "store"), "--listen", fmt.Sprintf("127.0.0.1:%d", port),
		"--catalog", cat, "--log-format", "json", "--lease", "1s", "--ack-wait", "2s", "--inbox-ack-wait", "2s")
	cfg := filepath.Join(dir, "worker.yaml")
	if err := os.WriteFile(cfg, []byte(mcpWorkerYAML(servers, files)), 0o644); err != nil {
		t.Fatal(err)
	}
	workers := map[string]*testproc.Proc{}
	for _, name := range []string{"w1", "w2"} {
		workers[name] = testproc.Start(t, name, `"ready"`, workerBin, "--nats-url", url, "--config", cfg,
			"--worker-id", name, "--log-format", "json", "--concurrency", "4")
	}
	c, err := client.New(testnats.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 120*time.Second)
	call := func(id, tool, input string) events.ContentBlock {
		return events.ContentBlock{Type: events.BlockToolUse, ID: id, Name: tool, Input: events.MustJSON(input)}
	}
	submit := func(run string, calls ...events.ContentBlock) *protocol.Submit {
		return &protocol.Submit{RunID: run, ThreadID: "t", Step: 1, Assistant: events.Message{ID: "m", Content: calls}}
	}

	res, err := c.SubmitAndWait(ctx, submit("mix",
		call("c1", "sum", `{"a":1,"b":2}`),
		call("c2", "read", fmt.Sprintf(`{"path":%q}`, filepath.Join(files, "a.txt"))),
		call("c3", "read", `{"path":"/etc/passwd"}`),
		call("c4", "sum", `{"a":20,"b":22}`)))
	if err != nil {
		t.Fatal(err)
	}
	got := texts(res)
	// read_text_file answers with text and structuredContent (a json block).
	if len(got) != 4 || got[0] != `ok "The sum of 1 and 2 is 3."` || got[1] != `ok "alpha[json]"` ||
		!strings.HasPrefix(got[2], `error "Access denied - path outside allowed directories`) || got[3] != `ok "The sum of 20 and 22 is 42."` {
		t.Fatalf("results: %v", got)
	}

	// A destructive MCP tool (the catalog's rule, as mcp import writes it
	// for a trusted server) parks on a confirmation; approved, it runs.
	out := filepath.Join(files, "out.txt")
	sent, err := c.Send(ctx, submit("write", call("c1", "write", fmt.Sprintf(`{"path":%q,"content":"approved"}`, out))))
	if err != nil {
		t.Fatal(err)
	}
	w, err := c.Watch(ctx, "write")
	if err != nil {
		t.Fatal(err)
	}
	ticket := nextTicket(t, ctx, w, "")
	w.Stop()
	if ticket.Reason != events.WaitPermission || ticket.ToolID != "write" {
		t.Fatalf("ticket %+v", ticket)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Fatalf("the write ran before its approval: %v", err)
	}
	if err := c.Approve(ctx, *ticket, "alice", "ok"); err != nil {
		t.Fatal(err)
	}
	if res, err := c.Answer(ctx, sent); err != nil || res.Results[0].IsError {
		t.Fatalf("the approved write: %+v, %v", res, err)
	}
	if data, err := os.ReadFile(out); err != nil || string(data) != "approved" {
		t.Fatalf("the file the approved write made: %q, %v", data, err)
	}

	// Kill the worker running a call: which one it is, the servers'
	// processes say (the sandbox binds the servers' directory by path).
	killInside := func(run, tool string) {
		t.Helper()
		if _, err := c.Send(ctx, submit(run, call("c1", tool, `{"duration":10,"steps":10}`))); err != nil {
			t.Fatal(err)
		}
		var server []int
		testwait.Until(t, ctx, "the MCP server of "+run+" running", func() bool { server = serverProcs(servers); return len(server) == 1 })
		for name, w := range workers {
			if ancestorOf(w.Cmd.Process.Pid, server[0]) {
				w.Kill()
				delete(workers, name)
				return
			}
		}
		t.Fatalf("no worker runs the call's server (pid %d)", server[0])
	}
	killInside("nr", "long_nr")
	res, err = c.WaitResults(ctx, "nr", "nr/1")
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(texts(res)); !strings.HasPrefix(got, `[error "tool outcome is indeterminate: the worker running it was lost`) {
		t.Fatalf("never_replay MCP call after its worker was killed: %s", got)
	}

	// The replayable one: killed inside it too, the call is made again by
	// another worker.
	killInside("ro", "long_ro")
	testproc.Start(t, "w3", `"ready"`, workerBin, "--nats-url", url, "--config", cfg, "--worker-id", "w3", "--log-format", "json")
	res, err = c.WaitResults(ctx, "ro", "ro/1")
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(texts(res)); !strings.Contains(got, "Long running operation completed") {
		t.Fatalf("replay_safe MCP call after its worker was killed: %s", got)
	}
}
