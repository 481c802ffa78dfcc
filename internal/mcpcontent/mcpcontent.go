package mcpcontent

import (
	"encoding/base64"
	"encoding/json"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolbatch/toolbatch/events"
)

// MetaOperationID is the _meta key of a tools/call that carries the call's
// operation id (<run_id>/<step>/<call_id>), which a server may use to
// recognise a call it has already made.
const MetaOperationID = "io.toolbatch/operation_id"

// block is a content block as the worker's JSON output carries it.
type block = map[string]any

// Output maps a CallToolResult to a ToolOutput: text and images become
// the engine's text and image blocks, structuredContent a json block, and
// the other kinds (audio, resource_link, resource) blocks of their own
// type, kept as they are; isError is is_error.
func Output(res *mcp.CallToolResult) map[string]any {
	content := make([]block, 0, len(res.Content)+1)
	for _, c := range res.Content {
		content = append(content, contentBlock(c))
	}
	if res.StructuredContent != nil {
		content = append(content, block{"type": string(events.BlockJSON), "value": res.StructuredContent})
	}
	return map[string]any{"content": content, "is_error": res.IsError}
}

func contentBlock(c mcp.Content) block {
	switch c := c.(type) {
	case *mcp.TextContent:
		return block{"type": string(events.BlockText), "text": c.Text}
	case *mcp.ImageContent:
		return block{"type": string(events.BlockImage), "source": block{"type": "base64", "media_type": c.MIMEType,
			"data": base64.StdEncoding.EncodeToString(c.Data)}}
	case *mcp.AudioContent:
		return block{"type": "audio", "source": block{"type": "base64", "media_type": c.MIMEType,
			"data": base64.StdEncoding.EncodeToString(c.Data)}}
	case *mcp.ResourceLink:
		b := block{"type": "resource_link", "uri": c.URI, "name": c.Name}
		for k, v := range map[string]string{"title": c.Title, "description": c.Description, "mime_type": c.MIMEType} {
			if v != "" {
				b[k] = v
			}
		}
		if c.Size != nil {
			b["size"] = *c.Size
		}
		return b
	case *mcp.EmbeddedResource:
		r := block{}
		if c.Resource != nil {
			r["uri"] = c.Resource.URI
			if c.Resource.MIMEType != "" {
				r["mime_type"] = c.Resource.MIMEType
			}
			if c.Resource.Blob != nil {
				r["blob"] = base64.StdEncoding.EncodeToString(c.Resource.Blob)
			} else {
				r["text"] = c.Resource.Text
			}
		}
		return block{"type": "resource", "resource": r}
	default:
		// A kind this worker does not know: its own wire form, as it is.
		var b block
		if raw, err := json.Marshal(c); err == nil && json.Unmarshal(raw, &b) == nil && b["type"] != nil {
			return b
		}
		return block{"type": string(events.BlockText), "text": fmt.Sprintf("[MCP content of type %T]", c)}
	}
}
