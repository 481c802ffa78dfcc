package main_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/toolbatch/toolbatch/catalog"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/sandbox"
)

// TestMCPImport: the npm filesystem server's tools/list becomes a catalog
// and a worker config that load as they are; the annotations of a trusted
// server set recovery modes, capabilities and a confirmation rule, those
// of an untrusted one change nothing.
func TestMCPImport(t *testing.T) {
	server, err := filepath.Abs("../../testdata/mcp/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(server); err != nil {
		t.Fatalf("the MCP servers are not installed (make mcp-deps): %v", err)
	}
	ctx := ctxT(t, 60*time.Second)
	dir := t.TempDir()
	load := func(trusted bool) (*catalog.Catalog, sandbox.Config) {
		t.Helper()
		name := map[bool]string{true: "trusted", false: "untrusted"}[trusted]
		cat, worker := filepath.Join(dir, name+"-catalog.yaml"), filepath.Join(dir, name+"-worker.yaml")
		args := []string{"mcp", "import", "--server", "fs", "--catalog", cat, "--worker", worker}
		if trusted {
			args = append(args, "--trusted")
		}
		stdout, stderr, code := cli(t, ctx, "", append(args, "--", "node", server, dir)...)
		if code != 0 || !strings.HasPrefix(stdout, "imported 14 tools of MCP server fs") {
			t.Fatalf("mcp import: exit %d, %s %s", code, stdout, stderr)
		}
		c, err := catalog.Load(cat)
		if err != nil {
			t.Fatalf("the catalog it wrote: %v", err)
		}
		w, err := sandbox.LoadConfig(worker)
		if err != nil {
			t.Fatalf("the worker config it wrote: %v", err)
		}
		return c, w
	}
	c, w := load(true)
	for id, want := range map[string]events.Capability{
		"fs_read_text_file": events.CapReplaySafe, "fs_write_file": events.CapIdempotent,
		"fs_create_directory": events.CapIdempotent, "fs_edit_file": events.CapNonRecoverable,
	} {
		wt, ok := w.Tool(id)
		ct, cok := c.Tool(id)
		if !ok || !cok || wt.Capability != want || wt.MCP == nil || wt.MCP.Server != "fs" {
			t.Fatalf("%s: worker %+v (%t), catalog %t", id, wt, ok, cok)
		}
		if mode := ct.Policy.Mode; (want == events.CapNonRecoverable) != (mode == events.ModeNeverReplay) {
			t.Fatalf("%s: recovery mode %s for capability %s", id, mode, want)
		}
		if ct.Description == "" || len(ct.InputSchema) == 0 || ct.Target != events.TargetSandbox {
			t.Fatalf("%s: catalog entry %+v", id, ct)
		}
	}
	ask := func(c *catalog.Catalog, id string) events.GateOutcome {
		return c.Evaluate(id, events.RawJSON(`{"path":"/x"}`), nil, time.Now()).Outcome
	}
	for _, id := range []string{"fs_write_file", "fs_edit_file", "fs_move_file"} {
		if got := ask(c, id); got != events.GateRequireConfirmation {
			t.Fatalf("%s (destructive): %s", id, got)
		}
	}
	for _, id := range []string{"fs_read_text_file", "fs_create_directory"} {
		if got := ask(c, id); got == events.GateRequireConfirmation {
			t.Fatalf("%s: asks for a confirmation", id)
		}
	}

	c, w = load(false)
	for _, wt := range w.Tools {
		if wt.Capability != sandbox.DefaultCapability {
			t.Fatalf("untrusted %s: capability %s", wt.ID, wt.Capability)
		}
		if ct, _ := c.Tool(wt.ID); ct.Policy.Mode != events.ModeNeverReplay || ask(c, wt.ID) == events.GateRequireConfirmation {
			t.Fatalf("untrusted %s: mode %s", wt.ID, ct.Policy.Mode)
		}
	}
	if !slices.ContainsFunc(w.Tools, func(t sandbox.ToolConfig) bool { return t.ID == "fs_write_file" }) {
		t.Fatal("fs_write_file missing")
	}
	// It writes new files only.
	_, stderr, code := cli(t, ctx, "", "mcp", "import", "--server", "fs", "--catalog", filepath.Join(dir, "trusted-catalog.yaml"),
		"--worker", filepath.Join(dir, "w.yaml"), "--", "node", server, dir)
	if code != 1 || !strings.Contains(stderr, "trusted-catalog.yaml exists: it writes new files only") {
		t.Fatalf("over an existing file: exit %d, %q", code, stderr)
	}
	// A server that does not start: one line.
	if _, stderr, code := cli(t, ctx, "", "mcp", "import", "--server", "x", "--catalog", filepath.Join(dir, "c2.yaml"),
		"--worker", filepath.Join(dir, "w2.yaml"), "--", "/nonexistent"); code != 1 || !strings.Contains(stderr, "did not start a session") {
		t.Fatalf("a server that does not start: exit %d, %q", code, stderr)
	}
}
