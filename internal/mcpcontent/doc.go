// Package mcpcontent is an MCP tool call as every executor of MCP tools
// makes it (a sandbox worker's MCP client, per call or shared; the
// engine's MCP servers over HTTP; mcp import's session): the session with
// a stdio server, one tools/call with the operation id in _meta, and the
// result mapped to toolbatch content blocks (docs/mcp.md has the table).
//
// Imports: events, github.com/modelcontextprotocol/go-sdk.
package mcpcontent
