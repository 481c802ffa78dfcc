package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.yaml.in/yaml/v3"

	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/internal/mcpcontent"
	"github.com/toolbatch/toolbatch/sandbox"
)

// cmdMCP: toolbatch mcp import ...
func cmdMCP(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "import" {
		return usageErrorf("mcp: want mcp import --server NAME [--trusted] [--pool P] --catalog FILE --worker FILE -- COMMAND [ARGS...]")
	}
	c := newCommon("mcp import")
	server := c.fs.String("server", "", "the server's name: tool ids are <server>_<tool>")
	trusted := c.fs.Bool("trusted", false, "take the server's annotations as hints for the gate and recovery (read docs/mcp.md first)")
	pool := c.fs.String("pool", "", "the sandbox pool of the tools (default: the catalog's default pool)")
	catalogOut := c.fs.String("catalog", "", "write the catalog entries (tools and gate rules) to this new file")
	workerOut := c.fs.String("worker", "", "write the worker config entries (tools) to this new file")
	asJSON := c.fs.Bool("json", false, "say what was done as one JSON object")
	flags, command := args[1:], []string(nil)
	if i := slices.Index(flags, "--"); i >= 0 {
		flags, command = flags[:i], flags[i+1:]
	}
	if _, err := c.parse(flags); err != nil {
		return err
	}
	switch {
	case !events.ValidToolID(*server):
		return usageErrorf("mcp import: --server NAME is required and must match ^[A-Za-z0-9_-]{1,64}$")
	case *catalogOut == "" || *workerOut == "":
		return usageErrorf("mcp import: --catalog FILE and --worker FILE are required (new files)")
	case len(command) == 0:
		return usageErrorf("mcp import: the server's command follows --")
	}
	for _, path := range []string{*catalogOut, *workerOut} {
		if _, err := os.Lstat(path); err == nil {
			return failf("mcp import: %s exists: it writes new files only (give another name, or remove it)", path)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(c.timeout, time.Second))
	defer cancel()
	tools, err := listTools(ctx, command, &prefixed{w: stderr, prefix: "mcp server: "})
	if err != nil {
		return failf("mcp import: %v", err)
	}
	cat, worker, skipped := importTools(*server, *pool, *trusted, command, tools)
	for _, s := range skipped {
		fmt.Fprintf(stderr, "toolbatch: mcp import: skipped %s\n", s)
	}
	if err := writeNewYAML(*catalogOut, cat); err != nil {
		return failf("mcp import: %v", err)
	}
	if err := writeNewYAML(*workerOut, worker); err != nil {
		_ = os.Remove(*catalogOut) // both files or neither
		return failf("mcp import: %v", err)
	}
	if *asJSON {
		return writeJSON(stdout, map[string]any{"done": "imported", "server": *server, "tools": len(worker.Tools), "trusted": *trusted,
			"catalog": *catalogOut, "worker": *workerOut})
	}
	fmt.Fprintf(stdout, "imported %d tools of MCP server %s into %s and %s (trusted: %t); read them, then add them to the catalog and the worker config\n",
		len(worker.Tools), *server, *catalogOut, *workerOut, *trusted)
	return nil
}

// listTools starts the server (unsandboxed, on this machine) and reads its
// tools/list, every page.
func listTools(ctx context.Context, command []string, stderr io.Writer) ([]*mcp.Tool, error) {
	session, err := mcpcontent.Stdio(ctx, "toolbatch-mcp-import", command, stderr, time.Second)
	if err != nil {
		return nil, err
	}
	defer session.Close()
	var tools []*mcp.Tool
	for t, err := range session.Tools(ctx, nil) {
		if err != nil {
			return nil, fmt.Errorf("tools/list: %v", err)
		}
		tools = append(tools, t)
	}
	return tools, nil
}

// The files mcp import writes: the parts of a catalog and a worker config
// (docs/catalog.md, docs/workers.md).
type (
	importedCatalog struct {
		Tools []importedCatalogTool `yaml:"tools"`
		Gate  *importedGate         `yaml:"gate,omitempty"`
	}
	importedCatalogTool struct {
		ID          string        `yaml:"id"`
		Target      events.Target `yaml:"target"`
		Pool        string        `yaml:"pool,omitempty"`
		Description string        `yaml:"description,omitempty"`
		Recovery    *importedMode `yaml:"recovery,omitempty"`
		InputSchema any           `yaml:"input_schema,omitempty"`
	}
	importedMode struct {
		Mode events.Mode `yaml:"mode"`
	}
	importedGate struct {
		Rules []importedRule `yaml:"rules"`
	}
	importedRule struct {
		Tools   []string `yaml:"tools"`
		Outcome string   `yaml:"outcome"`
	}
	importedWorker struct {
		Tools []importedWorkerTool `yaml:"tools"`
	}
	importedWorkerTool struct {
		ID         string            `yaml:"id"`
		Command    []string          `yaml:"command"`
		MCP        sandbox.MCPConfig `yaml:"mcp"`
		Capability events.Capability `yaml:"capability,omitempty"`
	}
)

// importTools makes the catalog and worker entries of a server's tools.
// The annotations are hints: of a trusted server, readOnlyHint makes a
// tool replay_safe and idempotentHint idempotent (the worker's capability
// and the catalog's recovery mode), and destructiveHint (true when absent,
// for a tool that is not read-only) puts the tool under a confirmation
// rule; of any other server they change nothing: never_replay,
// non_recoverable, no rule.
func importTools(server, pool string, trusted bool, command []string, tools []*mcp.Tool) (importedCatalog, importedWorker, []string) {
	var cat importedCatalog
	var worker importedWorker
	var confirm, skipped []string
	seen := map[string]string{}
	for _, t := range tools {
		id := sandbox.MCPToolID(server, t.Name)
		switch {
		case !events.ValidToolID(id):
			skipped = append(skipped, fmt.Sprintf("tool %q: its id %q does not fit ^[A-Za-z0-9_-]{1,64}$ (give it one in the worker config by hand)", t.Name, id))
			continue
		case seen[id] != "":
			skipped = append(skipped, fmt.Sprintf("tool %q: its id %q is the one of tool %q", t.Name, id, seen[id]))
			continue
		}
		seen[id] = t.Name
		ct := importedCatalogTool{ID: id, Target: events.TargetSandbox, Pool: pool, Description: t.Description, InputSchema: t.InputSchema}
		wt := importedWorkerTool{ID: id, Command: command, MCP: sandbox.MCPConfig{Server: server, Tool: t.Name}}
		if trusted {
			a := t.Annotations
			if a == nil {
				a = &mcp.ToolAnnotations{}
			}
			switch {
			case a.ReadOnlyHint:
				wt.Capability, ct.Recovery = events.CapReplaySafe, &importedMode{events.ModeReplaySafe}
			case a.IdempotentHint:
				wt.Capability, ct.Recovery = events.CapIdempotent, &importedMode{events.ModeIdempotent}
			}
			if !a.ReadOnlyHint && (a.DestructiveHint == nil || *a.DestructiveHint) {
				confirm = append(confirm, id)
			}
		}
		cat.Tools = append(cat.Tools, ct)
		worker.Tools = append(worker.Tools, wt)
	}
	if len(confirm) > 0 {
		cat.Gate = &importedGate{Rules: []importedRule{{Tools: confirm, Outcome: string(events.GateRequireConfirmation)}}}
	}
	return cat, worker, skipped
}

// prefixed writes each line with a prefix: the server's stderr, told
// apart from this command's own lines.
type prefixed struct {
	w       io.Writer
	prefix  string
	midLine bool
}

func (p *prefixed) Write(b []byte) (int, error) {
	for _, line := range strings.SplitAfter(string(b), "\n") {
		if line == "" {
			continue
		}
		if !p.midLine {
			line = p.prefix + line
		}
		p.midLine = !strings.HasSuffix(line, "\n")
		if _, err := io.WriteString(p.w, line); err != nil {
			return 0, err
		}
	}
	return len(b), nil
}

// writeNewYAML writes doc to a file that must not exist yet.
func writeNewYAML(path string, doc any) error {
	data, err := yaml.Marshal(doc)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
