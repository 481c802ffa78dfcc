package sandbox

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"

	"github.com/toolbatch/toolbatch/internal/mcpcontent"
)

// MCP tools: a tool whose command is a stdio MCP server. Each call runs,
// inside the tool's sandbox, the worker program itself as a small MCP
// client (MCPCallMain): it starts the server as its child, initializes a
// session, sends one tools/call with the call's arguments and its
// operation id in _meta, prints the result as a ToolOutput and exits, so
// that the server lives exactly as long as the call, under the call's
// limits, mounts, network setting and timeout, and nothing passes from
// one call to the next.

// MCPConfig makes a subprocess tool an MCP tool: its command is a stdio
// MCP server and Tool the server's tool that a call calls.
type MCPConfig struct {
	// Server names the server (^[A-Za-z0-9_-]{1,64}$), to derive the tool's
	// id when it has none: <server>_<tool>, every character outside
	// [A-Za-z0-9_-] made "_".
	Server string `yaml:"server,omitempty"`
	// Tool is the name of the server's tool, as its tools/list says.
	Tool string `yaml:"tool"`
	// Lifecycle is per_call (default: a server started for each call,
	// inside the call's sandbox) or shared (one long-lived sandboxed
	// server per worker that the calls of every shared tool of the same
	// server use; mcpshared.go).
	Lifecycle string `yaml:"lifecycle,omitempty"`
}

// Lifecycles of an MCP server.
const (
	LifecyclePerCall = "per_call"
	LifecycleShared  = "shared"
)

// shared reports whether the tool's calls go to a long-lived server.
func (m *MCPConfig) shared() bool { return m != nil && m.Lifecycle == LifecycleShared }

// The worker program's argv[1] that runs one MCP call, or serves the calls
// of a shared server (mcpshared.go).
const (
	mcpCallArg  = "__toolbatch_mcp_call__"
	mcpServeArg = "__toolbatch_mcp_serve__"
)

// mcpClientName is the worker's name as an MCP client.
const mcpClientName = "toolbatch-sandbox-worker"

// mcpNotDispatched is the exit status of an MCP call whose request was
// never written to the server (it did not start, or died before the
// session was up): the call's attempt is unavailable_before_dispatch.
const mcpNotDispatched = 75

var notToolID = regexp.MustCompile(`[^A-Za-z0-9_-]`)

// MCPToolID is the id of an MCP tool that has none: <server>_<tool>, every
// character outside [A-Za-z0-9_-] made "_" (it may still be too long).
func MCPToolID(server, tool string) string {
	return notToolID.ReplaceAllString(server+"_"+tool, "_")
}

// MCPCallMain runs one MCP call and exits when the program was started to
// make one (by a Runner, inside a sandbox); otherwise it returns at once.
// A worker program calls it first thing in main, with StageMain.
func MCPCallMain() {
	switch {
	case len(os.Args) < 2:
	case os.Args[1] == mcpCallArg:
		os.Exit(mcpCall(os.Args[2:], os.Stdin, os.Stdout, os.Stderr))
	case os.Args[1] == mcpServeArg:
		os.Exit(mcpServe(os.Args[2:], os.Stdin, os.Stdout, os.Stderr))
	}
}

// mcpCall is one call: args are <tool> -- <server argv...>, the call's
// arguments come on stdin, the ToolOutput goes to stdout.
func mcpCall(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) < 3 || args[1] != "--" {
		fmt.Fprintln(stderr, "mcp call: want <tool> -- <server command>")
		return 2
	}
	tool, server := args[0], args[2:]
	in, err := io.ReadAll(stdin)
	if err != nil {
		fmt.Fprintf(stderr, "mcp call: read the arguments: %v\n", err)
		return mcpNotDispatched
	}
	ctx := context.Background() // the sandbox's timeout bounds the call
	session, err := mcpcontent.Stdio(ctx, mcpClientName, server, stderr, 0)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return mcpNotDispatched
	}
	// The session is not closed: closing waits for the server to exit on
	// its own (up to 5 s), and the call's end kills the sandbox, the
	// server with it.
	out, err := mcpcontent.Call(ctx, session, tool, in, os.Getenv("TOOLBATCH_OPERATION_ID"))
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if _, err := stdout.Write(out); err != nil {
		return 1
	}
	return 0
}

// WithMCPShim sets the program that makes the calls of MCP tools inside
// their sandboxes (it must call MCPCallMain first thing); default this
// program.
func WithMCPShim(path string) Option { return func(r *Runner) { r.mcpShim = path } }

// mountShim finds the MCP call program and, with isolation bubblewrap,
// mounts it read-only into the sandbox of every MCP tool.
func (r *Runner) mountShim() error {
	var mcpTools []int
	for i, t := range r.cfg.Tools {
		if t.MCP != nil {
			mcpTools = append(mcpTools, i)
		}
	}
	if len(mcpTools) == 0 {
		return nil
	}
	if r.mcpShim == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("sandbox: MCP tools need this program inside their sandboxes: %w", err)
		}
		r.mcpShim = exe
	}
	shim, err := filepath.EvalSymlinks(r.mcpShim)
	if err != nil {
		return fmt.Errorf("sandbox: MCP tools: the MCP call program: %w", err)
	}
	r.mcpShim = shim
	if r.cfg.Isolation != IsolationBubblewrap {
		return nil // run from where it is
	}
	// bubblewrap, as the tool's user, must reach what it binds: a copy in
	// the work root (which that user can enter) serves wherever the
	// program lies, however private its directory.
	copied, err := copyExecutable(shim, r.workRoot)
	if err != nil {
		return fmt.Errorf("sandbox: MCP tools: copy the MCP call program into the work root: %w", err)
	}
	r.shimCopy = copied
	r.cfg.Tools = slices.Clone(r.cfg.Tools)
	for _, i := range mcpTools {
		t := &r.cfg.Tools[i]
		t.Mounts = append(slices.Clone(t.Mounts), Mount{Path: r.shimCopy, at: mcpShimInSandbox})
	}
	return nil
}

// copyExecutable copies the program at src to a new file of its own in dir
// (created exclusively: nothing there beforehand is followed or reused),
// mode 0755, and returns its path.
func copyExecutable(src, dir string) (string, error) {
	in, err := os.Open(src)
	if err != nil {
		return "", err
	}
	defer in.Close()
	out, err := os.CreateTemp(dir, ".toolbatch-mcp-call-")
	if err != nil {
		return "", err
	}
	_, err = io.Copy(out, in)
	if err == nil {
		err = out.Chmod(0o755)
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(out.Name())
		return "", err
	}
	return out.Name(), nil
}

// mcpShimInSandbox is where a sandbox shows the MCP call program: bound by
// descriptor onto its private /tmp, so that the tool's user needs no path
// to where the program lies on the host.
const mcpShimInSandbox = "/tmp/.toolbatch-mcp-call"

// shimPath is the MCP call program as a tool's command names it.
func (r *Runner) shimPath() string {
	if r.cfg.Isolation == IsolationBubblewrap {
		return mcpShimInSandbox
	}
	return r.mcpShim
}
