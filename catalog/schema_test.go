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
