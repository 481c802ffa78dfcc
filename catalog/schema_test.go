package catalog_test

import (
	"strings"
	"testing"

	"github.com/toolbatch/toolbatch/catalog"
	"github.com/toolbatch/toolbatch/events"
)

const schemaCatalog = `
tools:
  - id: echo
    builtin: echo
    description: Echoes its text.
    input_schema:
      type: object
      properties: {text: {type: string}, n: {type: integer, minimum: 1}}
      required: [text]
`

// TestInputSchema: arguments are checked against the tool's schema; the
// problem names what is wrong.
func TestInputSchema(t *testing.T) {
	c, err := catalog.Parse([]byte(schemaCatalog))
	if err != nil {
		t.Fatal(err)
	}
	tool, _ := c.Tool("echo")
	if tool.Description != "Echoes its text." || !strings.Contains(string(tool.InputSchema), `"required":["text"]`) {
		t.Fatalf("tool %+v", tool)
	}
	for _, tc := range []struct{ args, want string }{
		{`{"text":"a"}`, ""},
		{`{"text":"a","n":2}`, ""},
		{`{"text":5}`, "text"},
		{`{}`, "text"},
		{`null`, "text"},
		{`{"text":"a","n":0}`, "minimum"},
	} {
		got := tool.ArgumentProblem(events.RawJSON(tc.args))
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%s: %q, want one naming %q", tc.args, got, tc.want)
		}
		t.Logf("%s: %s", tc.args, got)
	}
	for _, bad := range []struct{ schema, want string }{
		{"input_schema: {type: string}", "must have type: object"},
		{"input_schema: {type: object, properties: {a: {$ref: 'https://example.com/s.json'}}}", "input_schema"},
		{"input_schema: {type: object, properties: {a: {type: string, pattern: '('}}}", "input_schema"},
	} {
		_, err := catalog.Parse([]byte("tools:\n  - id: t\n    builtin: echo\n    " + bad.schema + "\n"))
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s: %v, want %q", bad.schema, err, bad.want)
		}
	}
}

// TestMCPServerConfig: a brain tool's MCP server is checked with the rest
// of the catalog.
func TestMCPServerConfig(t *testing.T) {
	c, err := catalog.Parse([]byte("tools:\n  - id: sum\n    mcp: {url: 'http://127.0.0.1:9/mcp'}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if tool, _ := c.Tool("sum"); tool.MCP == nil || tool.MCP.Tool != "sum" || tool.MCP.Capability != events.CapNonRecoverable {
		t.Fatalf("defaults: %+v", tool.MCP)
	}
	for _, bad := range []struct{ yaml, want string }{
		{"  - id: a\n    target: sandbox\n    mcp: {url: 'http://h/mcp'}\n", "mcp is for brain tools"},
		{"  - id: a\n    builtin: echo\n    mcp: {url: 'http://h/mcp'}\n", "mcp and builtin"},
		{"  - id: a\n    mcp: {url: 'ftp://h/mcp'}\n", `mcp.url "ftp://h/mcp" is not an http or https URL`},
		{"  - id: a\n    mcp: {url: 'http://h/mcp', capability: sturdy}\n", `mcp.capability "sturdy"`},
	} {
		_, err := catalog.Parse([]byte("tools:\n" + bad.yaml))
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s: %v, want %q", bad.yaml, err, bad.want)
		}
	}
}
