package engine

import (
	"context"
	"encoding/json"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolbatch/toolbatch/catalog"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/internal/mcpcontent"
)

// invokeMCP runs one attempt of a brain tool served by an MCP server over
// streamable HTTP: initialize, one tools/call with the operation id in
// _meta, the result as content blocks. A session that never came up means
// the request was never written (unavailable_before_dispatch); a failure
// after it is an execution error: the server may have made the call.
func (b *brainExecutor) invokeMCP(ctx context.Context, s *catalog.MCPServer, inv invocation) outcome {
	o := outcome{callID: inv.callID, attempt: inv.attempt}
	rctx, cancel := context.WithTimeout(ctx, DefaultBrainTimeout)
	defer cancel()
	cl := mcp.NewClient(&mcp.Implementation{Name: "toolbatch-engine", Version: "1"}, nil)
	session, err := cl.Connect(rctx, &mcp.StreamableClientTransport{Endpoint: s.URL, MaxRetries: -1, DisableStandaloneSSE: true}, nil)
	if err != nil {
		o.err = &events.ToolError{Kind: events.ErrorUnavailableBeforeDispatch, Message: "the MCP server at " + s.URL + " did not start a session: " + err.Error()}
		return o
	}
	defer session.Close()
	raw, err := mcpcontent.Call(rctx, session, s.Tool, inv.arguments, inv.operationID)
	if err != nil {
		o.err = &events.ToolError{Kind: events.ErrorExecution, Message: err.Error()}
		return o
	}
	var out events.Output
	if err := json.Unmarshal(raw, &out); err != nil {
		o.err = &events.ToolError{Kind: events.ErrorExecution, Message: "the MCP result could not be read: " + err.Error()}
		return o
	}
	out.CallID = inv.callID
	o.output = &out
	return o
}
