// Package mcpcontent maps an MCP tool's result to toolbatch content blocks,
// one way for every executor of MCP tools (a sandbox worker's MCP client,
// the engine's MCP servers over HTTP): docs/mcp.md has the table.
//
// Imports: events, github.com/modelcontextprotocol/go-sdk.
package mcpcontent
