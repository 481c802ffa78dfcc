package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/internal/mcpcontent"
	"github.com/toolbatch/toolbatch/internal/testwait"
)

// The MCP servers of these tests are the reference servers from npm
// (testdata/mcp, installed by make mcp-deps), run by Debian's node.

var (
	mcpOnce sync.Once
	mcpDir  string
	mcpErr  error
)

// mcpServers copies testdata/mcp to a directory the sandbox's users can
// read (once per test binary), and returns it.
func mcpServers(t *testing.T) string {
	t.Helper()
	mcpOnce.Do(func() {
		src, err := filepath.Abs(filepath.Join("..", "testdata", "mcp", "node_modules"))
		if err == nil {
			_, err = os.Stat(src)
		}
		if err != nil {
			mcpErr = fmt.Errorf("the MCP servers are not installed (make mcp-deps): %v", err)
			return
		}
		dir, err := os.MkdirTemp("", "toolbatch-mcp-servers-")
		if err == nil {
			err = os.Chmod(dir, 0o755)
		}
		if err == nil {
			var out []byte
			out, err = exec.Command("cp", "-r", src, dir).CombinedOutput()
			if err != nil {
				err = fmt.Errorf("%v: %s", err, out)
			}
		}
		mcpDir, mcpErr = dir, err
	})
	if mcpErr != nil {
		t.Fatal(mcpErr)
	}
	return mcpDir
}

// removeMCPServers removes the copy (TestMain, at the end).
func removeMCPServers() {
	if mcpDir != "" {
		_ = os.RemoveAll(mcpDir)
	}
}

// mcpRunner is a Runner of MCP tools of the everything and filesystem
// servers, and of a server that dies at start.
func mcpRunner(t *testing.T, m mode, files string) *Runner {
	t.Helper()
	dir := mcpServers(t)
	everything := filepath.Join(dir, "node_modules/@modelcontextprotocol/server-everything/dist/index.js")
	filesystem := filepath.Join(dir, "node_modules/@modelcontextprotocol/server-filesystem/dist/index.js")
	yaml := fmt.Sprintf(`isolation: bubblewrap
tools:
  - id: sum
    command: [node, %[1]s, stdio]
    mcp: {server: everything, tool: get-sum}
    limits: &node {memory_mb: 8192, max_procs: 256}
    mounts: [{path: %[3]s}]
    capability: replay_safe
  - command: [node, %[1]s, stdio]
    mcp: {server: everything, tool: get-tiny-image}
    limits: *node
    mounts: [{path: %[3]s}]
  - id: structured
    command: [node, %[1]s, stdio]
    mcp: {server: everything, tool: get-structured-content}
    limits: *node
    mounts: [{path: %[3]s}]
  - id: links
    command: [node, %[1]s, stdio]
    mcp: {server: everything, tool: get-resource-links}
    limits: *node
    mounts: [{path: %[3]s}]
  - id: env
    command: [node, %[1]s, stdio]
    mcp: {server: everything, tool: get-env}
    limits: *node
    mounts: [{path: %[3]s}]
  - id: nosuch
    command: [node, %[1]s, stdio]
    mcp: {server: everything, tool: no-such-tool}
    limits: *node
    mounts: [{path: %[3]s}]
  - id: read
    command: [node, %[2]s, %[4]s]
    mcp: {server: fs, tool: read_text_file}
    limits: *node
    mounts: [{path: %[3]s}, {path: %[4]s}]
  - id: broken
    command: [/bin/sh, -c, "echo no server here >&2; exit 3"]
    mcp: {tool: anything}
`, everything, filesystem, dir, files)
	cfg, err := ParseConfig([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	if m == fresh {
		for i := range cfg.Tools {
			cfg.Tools[i].Prestart = new(int)
		}
	}
	workRoot := worldDir(t, false)
	r, err := NewRunner(cfg, WithWorkRoot(workRoot), withStage(m))
	if err != nil {
		t.Fatalf("NewRunner: %v", err)
	}
	t.Cleanup(func() {
		if st := r.Stats(); (m == fresh) != (st.Prestarted == 0) || (m != fresh && st.Fresh > 0) {
			t.Errorf("mode %s: %d calls in pre-started sandboxes, %d in their own", m, st.Prestarted, st.Fresh)
		}
		wantCleanedUp(t, r, workRoot) // the copy of the MCP call program too
	})
	if m != fresh {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		if err := r.WaitPrestarted(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

func blockJSON(t *testing.T, bs []events.ContentBlock) string {
	t.Helper()
	b, err := json.Marshal(bs)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestMCPTools: each call of an MCP tool starts the server inside the
// tool's sandbox, calls the tool with the call's arguments and its
// operation id, and maps the result's content to blocks.
func TestMCPTools(t *testing.T) {
	for _, m := range []mode{fresh, prestarted} {
		t.Run(string(m), func(t *testing.T) {
			files := worldDir(t, false)
			if err := os.WriteFile(filepath.Join(files, "note.txt"), []byte("inside the mount"), 0o644); err != nil {
				t.Fatal(err)
			}
			r := mcpRunner(t, m, files)
			if a, b := r.userOf("sum"); a != b || a != func() int { u, _ := r.userOf("env"); return u }() {
				t.Fatalf("the tools of one MCP server run as different users")
			}
			if a, _ := r.userOf("sum"); a == func() int { u, _ := r.userOf("read"); return u }() {
				t.Fatalf("the tools of two MCP servers run as one user")
			}

			if o := wantOutput(t, run(t, r, "sum", `{"a":2,"b":40}`)); o.Text() != "The sum of 2 and 40 is 42." || o.IsError {
				t.Fatalf("get-sum: %+v", o)
			}
			// The id derived from the server's and the tool's names.
			img := wantOutput(t, run(t, r, "everything_get-tiny-image", `{}`))
			var image *events.ContentBlock
			for i, b := range img.Content {
				if b.Type == events.BlockImage {
					image = &img.Content[i]
				}
			}
			if image == nil || image.Source == nil || image.Source.MediaType != "image/png" || image.Source.Data == "" {
				t.Fatalf("get-tiny-image: no image block in %s", blockJSON(t, img.Content))
			}
			st := wantOutput(t, run(t, r, "structured", `{"location":"New York"}`))
			if last := st.Content[len(st.Content)-1]; last.Type != events.BlockJSON || !strings.Contains(string(last.Value), "temperature") {
				t.Fatalf("get-structured-content: want its structuredContent as the last, json, block: %s", blockJSON(t, st.Content))
			}
			links := wantOutput(t, run(t, r, "links", `{"count":2}`))
			if n := strings.Count(blockJSON(t, links.Content), `"type":"resource_link"`); n != 2 {
				t.Fatalf("get-resource-links: %d resource_link blocks in %s", n, blockJSON(t, links.Content))
			}
			// The server runs with the sandbox's environment only.
			env := wantOutput(t, run(t, r, "env", `{}`)).Text()
			if !strings.Contains(env, `"TOOLBATCH_OPERATION_ID": "run-1/1/call-env"`) && !strings.Contains(env, `"TOOLBATCH_OPERATION_ID":"run-1/1/call-env"`) {
				t.Fatalf("get-env: the server did not get the call's environment: %s", env)
			}

			// The filesystem server sees its mount, and nothing else.
			if o := wantOutput(t, run(t, r, "read", fmt.Sprintf(`{"path":%q}`, filepath.Join(files, "note.txt")))); o.Text() != "inside the mount" {
				t.Fatalf("read_text_file: %+v", o)
			}
			if o := wantOutput(t, run(t, r, "read", `{"path":"/etc/hostname"}`)); !o.IsError {
				t.Fatalf("read_text_file outside its directory: %+v", o)
			}

			// A tool the server lacks: the request reached it, and the
			// server answers with an error result.
			if o := wantOutput(t, run(t, r, "nosuch", `{}`)); !o.IsError || !strings.Contains(o.Text(), "no-such-tool") {
				t.Fatalf("a tool the server lacks: %+v", o)
			}
			// A server that dies at start: nothing reached it.
			res := run(t, r, "broken", `{}`)
			if res.Err == nil || res.Err.Kind != events.ErrorUnavailableBeforeDispatch || !strings.Contains(res.Err.Message, "no server here") {
				t.Fatalf("a server that dies at start: %+v", res.Err)
			}
		})
	}
}

// TestMCPConfig: an MCP tool's id, tool and output are checked with the
// rest of the config.
func TestMCPConfig(t *testing.T) {
	for _, c := range []struct{ yaml, want string }{
		{"tools:\n  - command: [x]\n    mcp: {tool: t}\n", "id is required (or mcp.server"},
		{"tools:\n  - id: a\n    command: [x]\n    mcp: {server: s}\n", "mcp.tool, the name of the server's tool, is required"},
		{"tools:\n  - id: a\n    command: [x]\n    output: json\n    mcp: {tool: t}\n", "output does not apply to an MCP tool"},
		{"tools:\n  - command: [x]\n    mcp: {server: s, tool: " + strings.Repeat("t", 64) + "}\n", "does not match"},
		{"tools:\n  - id: s_t\n    command: [x]\n  - command: [x]\n    mcp: {server: s, tool: t}\n", `id "s_t" is already used by tools[0]`},
		{"tools:\n  - id: a\n    builtin: echo\n    mcp: {tool: t}\n", "mcp does not apply to a builtin tool"},
		{"tools:\n  - id: a\n    command: [x]\n    mcp: {tool: t, lifecycle: forever}\n", `mcp.lifecycle "forever" is not per_call or shared`},
		{"tools:\n  - id: a\n    command: [x]\n    mcp: {tool: t, lifecycle: shared}\n", "mcp.server is required with lifecycle shared"},
		{"tools:\n  - id: a\n    command: [x]\n    prestart: 1\n    mcp: {server: s, tool: t, lifecycle: shared}\n", "prestart does not apply to a shared MCP server"},
		{"tools:\n  - id: a\n    command: [x]\n    mcp: {server: s, tool: t, lifecycle: shared}\n  - id: b\n    command: [y]\n    mcp: {server: s, tool: u, lifecycle: shared}\n", "tools[0] differs"},
	} {
		_, err := ParseConfig([]byte(c.yaml))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want %q", c.yaml, err, c.want)
		}
	}
	cfg, err := ParseConfig([]byte("tools:\n  - command: [x]\n    mcp: {server: fs, tool: read.file}\n"))
	if err != nil || cfg.Tools[0].ID != "fs_read_file" {
		t.Fatalf("derived id: %+v, %v", cfg.Tools, err)
	}
}

// envTestMCPServer makes the test binary an MCP server (the SDK's own) on
// stdio, for the unit tests of the MCP call.
const envTestMCPServer = "TOOLBATCH_SANDBOX_TEST_MCP_SERVER"

// testMCPServer serves: meta (answers the request's operation id and
// arguments), media (one content of each kind and structured content),
// fail (an error result), and crash (dies inside the call).
func testMCPServer() int {
	s := mcp.NewServer(&mcp.Implementation{Name: "toolbatch-test", Version: "1"}, nil)
	object := &jsonschema.Schema{Type: "object"}
	s.AddTool(&mcp.Tool{Name: "meta", InputSchema: object}, func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{
			Text: fmt.Sprintf("%v %s", req.Params.Meta[mcpcontent.MetaOperationID], req.Params.Arguments)}}}, nil
	})
	size := int64(3)
	s.AddTool(&mcp.Tool{Name: "media", InputSchema: object}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{
			&mcp.TextContent{Text: "t"},
			&mcp.ImageContent{Data: []byte("png"), MIMEType: "image/png"},
			&mcp.AudioContent{Data: []byte("wav"), MIMEType: "audio/wav"},
			&mcp.ResourceLink{URI: "file:///a", Name: "a", MIMEType: "text/plain", Size: &size},
			&mcp.EmbeddedResource{Resource: &mcp.ResourceContents{URI: "file:///b", MIMEType: "text/plain", Text: "bee"}},
		}, StructuredContent: map[string]any{"n": 1}}, nil
	})
	s.AddTool(&mcp.Tool{Name: "fail", InputSchema: object}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "no"}}}, nil
	})
	s.AddTool(&mcp.Tool{Name: "crash", InputSchema: object}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		os.Exit(9)
		return nil, nil
	})
	if err := s.Run(context.Background(), &mcp.StdioTransport{}); err != nil {
		return 1
	}
	return 0
}

// TestMCPCall: one call through the SDK's own server: the operation id in
// _meta, the arguments, every kind of content, errors, and a server that
// dies before or during the call.
func TestMCPCall(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(envTestMCPServer, "1")
	t.Setenv("TOOLBATCH_OPERATION_ID", "r/1/c1")
	call := func(tool, in string, server ...string) (int, string, string) {
		var out, errOut strings.Builder
		code := mcpCall(append([]string{tool, "--"}, server...), strings.NewReader(in), &out, &errOut)
		return code, out.String(), errOut.String()
	}
	if code, out, _ := call("meta", `{"x":1}`, self); code != 0 || out != `{"content":[{"text":"r/1/c1 {\"x\":1}","type":"text"}],"is_error":false}` {
		t.Fatalf("meta: %d %s", code, out)
	}
	code, out, _ := call("media", ``, self)
	want := `{"content":[{"text":"t","type":"text"},` +
		`{"source":{"data":"cG5n","media_type":"image/png","type":"base64"},"type":"image"},` +
		`{"source":{"data":"d2F2","media_type":"audio/wav","type":"base64"},"type":"audio"},` +
		`{"mime_type":"text/plain","name":"a","size":3,"type":"resource_link","uri":"file:///a"},` +
		`{"resource":{"mime_type":"text/plain","text":"bee","uri":"file:///b"},"type":"resource"},` +
		`{"type":"json","value":{"n":1}}],"is_error":false}`
	if code != 0 || out != want {
		t.Fatalf("media: %d\n got %s\nwant %s", code, out, want)
	}
	// The worker reads it as the engine will: every block kept.
	o, err := decodeOutput([]byte(out), false)
	if err != nil || len(o.Content) != 6 || o.Content[2].Type != "audio" || o.Content[5].Type != events.BlockJSON {
		t.Fatalf("decoded %+v, %v", o, err)
	}
	if code, out, _ := call("fail", `{}`, self); code != 0 || !strings.Contains(out, `"is_error":true`) {
		t.Fatalf("fail: %d %s", code, out)
	}
	if code, _, errOut := call("crash", `{}`, self); code != 1 || !strings.Contains(errOut, "tools/call crash") {
		t.Fatalf("a server that dies inside the call: %d %q (want an execution error)", code, errOut)
	}
	if code, _, errOut := call("meta", `{}`, "/nonexistent/server"); code != mcpNotDispatched || !strings.Contains(errOut, "did not start a session") {
		t.Fatalf("a server that cannot start: %d %q (want not dispatched)", code, errOut)
	}
}

// TestSharedMCPServer: the shared tools of one server use one long-lived
// sandboxed server: concurrent calls, state kept between calls, a call's
// timeout takes the server down and the next call starts it again, and a
// server that cannot start is unavailable_before_dispatch.
func TestSharedMCPServer(t *testing.T) {
	dir := mcpServers(t)
	everything := filepath.Join(dir, "node_modules/@modelcontextprotocol/server-everything/dist/index.js")
	r := sharedRunner(t, fmt.Sprintf(`isolation: bubblewrap
tools:
  - id: sum
    command: &cmd [node, %[1]s, stdio]
    mcp: {server: ev, tool: get-sum, lifecycle: shared}
    limits: &node {memory_mb: 8192, max_procs: 256}
    mounts: &m [{path: %[2]s}]
  - id: toggle
    command: *cmd
    mcp: {server: ev, tool: toggle-simulated-logging, lifecycle: shared}
    limits: *node
    mounts: *m
  - id: long
    command: *cmd
    mcp: {server: ev, tool: trigger-long-running-operation, lifecycle: shared}
    limits: *node
    mounts: *m
    timeout: 1s
  - id: broken
    command: [/bin/sh, -c, "echo no server here >&2; exit 3"]
    mcp: {server: broken, tool: x, lifecycle: shared}
`, everything, dir))
	servers := func() int { return len(serverPids(everything)) }
	var wg sync.WaitGroup
	results := make([]Result, 8)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = run(t, r, "sum", fmt.Sprintf(`{"a":%d,"b":1}`, i))
		}()
	}
	wg.Wait()
	for i, res := range results {
		if o := wantOutput(t, res); o.Text() != fmt.Sprintf("The sum of %d and 1 is %d.", i, i+1) {
			t.Fatalf("call %d: %+v", i, o)
		}
	}
	if n := servers(); n != 1 {
		t.Fatalf("%d servers run for 8 calls of one shared server, want 1", n)
	}
	// The server keeps what a call changed: the second toggle undoes the first.
	first, second := wantOutput(t, run(t, r, "toggle", `{}`)).Text(), wantOutput(t, run(t, r, "toggle", `{}`)).Text()
	if first == second || !strings.Contains(strings.ToLower(first+second), "stop") {
		t.Fatalf("toggles: %q then %q", first, second)
	}
	// A call past its timeout stops the server; the next call starts it again.
	if res := run(t, r, "long", `{"duration":5,"steps":5}`); res.Err == nil || res.Class() != ExitTimeout {
		t.Fatalf("a call past its timeout: %+v", res.Err)
	}
	if o := wantOutput(t, run(t, r, "sum", `{"a":2,"b":2}`)); o.Text() != "The sum of 2 and 2 is 4." {
		t.Fatalf("after the restart: %+v", o)
	}
	if res := run(t, r, "broken", `{}`); res.Err == nil || res.Err.Kind != events.ErrorUnavailableBeforeDispatch || !strings.Contains(res.Err.Message, "no server here") {
		t.Fatalf("a shared server that cannot start: %+v", res.Err)
	}
}

// TestSharedMCPServerLimits: a shared server's result over limits.output_kb
// fails that call alone (the server goes on); an interrupted call (its
// claim lost) stops the server, so that nothing of it runs on.
func TestSharedMCPServerLimits(t *testing.T) {
	dir := mcpServers(t)
	everything := filepath.Join(dir, "node_modules/@modelcontextprotocol/server-everything/dist/index.js")
	r := sharedRunner(t, fmt.Sprintf(`isolation: bubblewrap
tools:
  - id: image
    command: &cmd [node, %[1]s, stdio]
    mcp: {server: small, tool: get-tiny-image, lifecycle: shared}
    limits: &node {memory_mb: 8192, max_procs: 256, output_kb: 1}
    mounts: &m [{path: %[2]s}]
  - id: sum
    command: *cmd
    mcp: {server: small, tool: get-sum, lifecycle: shared}
    limits: *node
    mounts: *m
  - id: long
    command: *cmd
    mcp: {server: small, tool: trigger-long-running-operation, lifecycle: shared}
    limits: *node
    mounts: *m
`, everything, dir))
	pid := func() int {
		if pids := serverPids(everything); len(pids) > 0 {
			return pids[0]
		}
		return 0
	}
	if res := run(t, r, "image", `{}`); res.Err == nil || !strings.Contains(res.Err.Message, "more than limits.output_kb") {
		t.Fatalf("a result over the limit: %+v", res.Err)
	}
	server := pid()
	if o := wantOutput(t, run(t, r, "sum", `{"a":1,"b":1}`)); o.Text() != "The sum of 1 and 1 is 2." || pid() != server || server == 0 {
		t.Fatalf("after the refused result: %+v, server %d then %d", o, server, pid())
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	done := make(chan Result, 1)
	go func() {
		done <- r.Run(ctx, Call{ToolID: "long", CallID: "c", OperationID: "r/1/c", Attempt: 1, Arguments: []byte(`{"duration":30,"steps":30}`)})
	}()
	wctx, wcancel := context.WithTimeout(context.Background(), callTimeout)
	defer wcancel()
	testwait.Until(t, wctx, "the long call sent", func() bool {
		r.sharedMu.Lock()
		s := r.shared["small"]
		r.sharedMu.Unlock()
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.live != nil && len(s.live.pending) == 1
	})
	cancel(errors.New("claim lost"))
	if res := <-done; res.Err == nil || res.Class() != ExitKilled || !strings.Contains(res.Err.Message, "claim lost") {
		t.Fatalf("the interrupted call: %+v", res.Err)
	}
	if pid() != 0 {
		t.Fatal("the server still runs after its call was interrupted")
	}
}

// sharedRunner is a Runner of the shared MCP tools in yaml (isolation
// bubblewrap), closed at the end of the test.
func sharedRunner(t *testing.T, yaml string) *Runner {
	t.Helper()
	cfg, err := ParseConfig([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewRunner(cfg, WithWorkRoot(worldDir(t, false)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// serverPids are the running processes of the node server script.
func serverPids(script string) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if args := strings.Split(string(b), "\x00"); err == nil && len(args) > 1 && strings.HasSuffix(args[0], "node") && args[1] == script {
			if n, err := strconv.Atoi(e.Name()); err == nil {
				pids = append(pids, n)
			}
		}
	}
	return pids
}
