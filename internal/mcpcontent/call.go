package mcpcontent

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Stdio starts the stdio MCP server argv as a child (its stderr to stderr)
// and initializes a session with it, as client name; terminate is how long
// closing the session waits for the server to exit (0: the SDK's 5 s). An
// error means no request reached the server.
func Stdio(ctx context.Context, name string, argv []string, stderr io.Writer, terminate time.Duration) (*mcp.ClientSession, error) {
	cl := mcp.NewClient(&mcp.Implementation{Name: name, Version: "1"}, nil)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stderr = stderr
	session, err := cl.Connect(ctx, &mcp.CommandTransport{Command: cmd, TerminateDuration: terminate}, nil)
	if err != nil {
		return nil, fmt.Errorf("the MCP server %s did not start a session: %w", argv[0], err)
	}
	return session, nil
}

// Call makes one tools/call of tool with args (a JSON object; empty or
// null: no arguments) and the call's operation id in _meta, and returns
// the result as ToolOutput JSON (Output). An error came after the request
// was sent.
func Call(ctx context.Context, session *mcp.ClientSession, tool string, args []byte, operationID string) ([]byte, error) {
	var arguments any // absent for none
	if a := strings.TrimSpace(string(args)); a != "" && a != "null" {
		arguments = json.RawMessage(args)
	}
	res, err := session.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: arguments,
		Meta: mcp.Meta{MetaOperationID: operationID}})
	if err != nil {
		return nil, fmt.Errorf("tools/call %s: %w", tool, err)
	}
	out, err := json.Marshal(Output(res))
	if err != nil {
		return nil, fmt.Errorf("tools/call %s: the result cannot be written: %w", tool, err)
	}
	return out, nil
}
