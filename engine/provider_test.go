package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/catalog"
	"github.com/toolbatch/toolbatch/client"
	"github.com/toolbatch/toolbatch/engine"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/internal/testjson"
	"github.com/toolbatch/toolbatch/internal/testnats"
	"github.com/toolbatch/toolbatch/internal/testproc"
	"github.com/toolbatch/toolbatch/protocol"
)

// anthropicTurn is a submission whose assistant message is as the
// Anthropic Messages API returns it (extended thinking, citations,
// cache_control, a server tool), with four calls: two good ones, one
// whose input is a string (an adapter's arguments that did not parse) and
// one whose name is no tool id.
const anthropicTurn = `{"run_id":"prov","thread_id":"t1","step":1,"assistant":{"id":"msg_01","content":[
 {"type":"thinking","thinking":"Echo twice.","signature":"EqQBCkYIBxgCKkA="},
 {"type":"redacted_thinking","data":"EmwKAhgBEgy3va3p"},
 {"type":"text","text":"Sure.","citations":null},
 {"type":"text","text":"Per the page,","citations":[{"type":"web_search_result_location","url":"https://example.com","title":"t","encrypted_index":"x","cited_text":"y"}],"cache_control":{"type":"ephemeral"}},
 {"type":"server_tool_use","id":"srvtoolu_01","name":"web_search","input":{"query":"q"}},
 {"type":"web_search_tool_result","tool_use_id":"srvtoolu_01","content":[{"type":"web_search_result","url":"https://example.com","title":"t","encrypted_content":"e","page_age":null}]},
 {"type":"tool_use","id":"toolu_01","name":"echo","input":{"text":"one"}},
 {"type":"tool_use","id":"toolu_02","name":"echo","input":"{\"text\": \"tw","cache_control":{"type":"ephemeral"}},
 {"type":"tool_use","id":"toolu_03","name":"fs.read","input":{"path":"a"}},
 {"type":"tool_use","id":"toolu_04","name":"echo","input":{"text":"four"}}
]}}`

// TestProviderMessageAsItIs: a real provider message goes through the
// engine unchanged (the assistant message in the log is the one sent), and
// gets one result per call in model order, the malformed calls' errors
// among them, while the others ran.
func TestProviderMessageAsItIs(t *testing.T) {
	url := testnats.Start(t, t.TempDir())
	startEngine(t, url, engine.Config{})
	c := newClient(t, url)
	ctx := ctxT(t, 30*time.Second)

	sub, err := protocol.DecodeSubmit([]byte(anthropicTurn), true, c.Limits())
	if err != nil {
		t.Fatalf("the provider's message is refused: %v", err)
	}
	res, err := c.SubmitAndWait(ctx, sub)
	if err != nil {
		t.Fatal(err)
	}
	got := resultTexts(res)
	want := []string{
		`toolu_01=ok "{\"text\":\"one\"}"`,
		`toolu_02=error "invalid arguments: the input must be a JSON object, got a string"`,
		`toolu_03=error "unknown tool: fs.read"`,
		`toolu_04=ok "{\"text\":\"four\"}"`,
	}
	if len(got) != len(want) {
		t.Fatalf("results %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("results %v, want %v", got, want)
		}
	}

	// The log holds the message as it was sent.
	js := testnats.JetStream(t, testnats.Connect(t, url))
	ev, err := js.Stream(ctx, protocol.Names{Prefix: protocol.DefaultPrefix}.EventsStream())
	if err != nil {
		t.Fatal(err)
	}
	m, err := ev.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	evs, err := events.DecodeCommit(m.Data, m.Header.Values(protocol.HeaderEvent))
	if err != nil {
		t.Fatal(err)
	}
	submitted, ok := evs[0].(*events.BatchSubmitted)
	if !ok {
		t.Fatalf("first commit %T", evs[0])
	}
	stored, err := json.Marshal(submitted.Assistant.Content)
	if err != nil {
		t.Fatal(err)
	}
	var sent struct {
		Assistant struct {
			Content json.RawMessage `json:"content"`
		} `json:"assistant"`
	}
	if err := json.Unmarshal([]byte(anthropicTurn), &sent); err != nil {
		t.Fatal(err)
	}
	testjson.Same(t, stored, sent.Assistant.Content) // the log's assistant message is the one sent
}

// TestAnswerNamesTheSubmission: every answer names the submission it
// answers, so that a client finds the answer to what it sent: a different
// batch at an accepted step gets its own refusal (not the old results), and
// an identical one, under its own message id, finds the results it
// duplicates.
func TestAnswerNamesTheSubmission(t *testing.T) {
	url := testnats.Start(t, t.TempDir())
	startEngine(t, url, engine.Config{})
	c := newClient(t, url)
	ctx := ctxT(t, 30*time.Second)

	first := submitOf("ans", 1, "echo", `{"text":"one"}`)
	sent, err := c.Send(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	if sent.InboxSeq == 0 || sent.MsgID == "" || sent.Duplicate {
		t.Fatalf("sent %+v", sent)
	}
	res, err := c.Answer(ctx, sent)
	if err != nil {
		t.Fatal(err)
	}
	if s := res.Submission; s == nil || s.MsgID != sent.MsgID || s.InboxSeq != sent.InboxSeq || s.Digest != first.Digest() {
		t.Fatalf("results name %+v, want %+v", res.Submission, sent)
	}

	// A different batch for step 1: its answer is its own refusal, although
	// results of step 1 are in the stream.
	other := submitOf("ans", 1, "echo", `{"text":"other"}`)
	osent, err := c.Send(ctx, other)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Answer(ctx, osent)
	var ref *events.Refusal
	if !errors.Is(err, client.ErrRejected) || !errors.As(err, &ref) || ref.Code != events.CodeStepNotAfterLast {
		t.Fatalf("answer to a different batch at step 1: %v, want step_not_after_last", err)
	}

	// The same submission again within the duplicate window: the stream
	// says so, and the answer is the first's results.
	again, err := c.Send(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Duplicate || again.InboxSeq != sent.InboxSeq {
		t.Fatalf("a repeat: %+v, want the first's sequence %d as a duplicate", again, sent.InboxSeq)
	}
	if r, err := c.Answer(ctx, again); err != nil || r.Submission.InboxSeq != sent.InboxSeq {
		t.Fatalf("answer to a repeat: %+v, %v", r, err)
	}

	// The same body under another message id (a client that chose its own
	// ids): the engine changes nothing and publishes nothing; its answer is
	// the results of the identical batch, found by the digest.
	body, err := events.Marshal(first)
	if err != nil {
		t.Fatal(err)
	}
	js := testnats.JetStream(t, testnats.Connect(t, url))
	msg := nats.NewMsg(protocol.Names{Prefix: protocol.DefaultPrefix}.Submit("ans"))
	msg.Data = body
	ack, err := js.PublishMsg(ctx, msg, jetstream.WithMsgID("my-own-id"))
	if err != nil {
		t.Fatal(err)
	}
	own := client.Sent{RunID: "ans", BatchID: first.BatchID(), MsgID: "my-own-id", InboxSeq: ack.Sequence, Digest: first.Digest()}
	if r, err := c.Answer(ctx, own); err != nil || r.Submission.MsgID != sent.MsgID {
		t.Fatalf("answer to an identical body: %+v, %v", r, err)
	}

	// After the run's end, a submission's answer is its own refusal, not
	// the end published before it.
	if err := c.Cancel(ctx, "ans", "done"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitResults(ctx, "ans", "ans/9"); !errors.Is(err, client.ErrRunEnded) {
		t.Fatalf("waiting for a batch of an ended run: %v", err)
	}
	late, err := c.Send(ctx, submitOf("ans", 2, "echo", `{}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err = c.Answer(ctx, late); !errors.As(err, &ref) || ref.Code != events.CodeRunEnded {
		t.Fatalf("answer to a submission after the run's end: %v, want run_ended", err)
	}
}

// TestInputSchema: a call whose arguments do not match its tool's input
// schema (the catalog's) completes with invalid_arguments and never runs;
// the batch's other calls run.
func TestInputSchema(t *testing.T) {
	cat, err := catalog.Parse([]byte(`
tools:
  - id: echo
    builtin: echo
    description: Echoes its text.
    input_schema:
      type: object
      properties: {text: {type: string}}
      required: [text]
      additionalProperties: false
`))
	if err != nil {
		t.Fatal(err)
	}
	url := testnats.Start(t, t.TempDir())
	startEngine(t, url, engine.Config{Catalog: cat})
	c := newClient(t, url)
	ctx := ctxT(t, 30*time.Second)
	res, err := c.SubmitAndWait(ctx, submitOf("schema", 1,
		"echo", `{"text":"fine"}`, "echo", `{"text":5}`, "echo", `{}`, "echo", `{"text":"x","more":1}`))
	if err != nil {
		t.Fatal(err)
	}
	got := resultTexts(res)
	if len(got) != 4 || got[0] != `c1=ok "{\"text\":\"fine\"}"` {
		t.Fatalf("results %q", got)
	}
	for _, r := range got[1:] {
		if !strings.Contains(r, `=error "invalid arguments: the arguments do not match the tool's input schema: `) {
			t.Fatalf("results %q", got)
		}
	}
}

// TestMCPServerOverHTTP: brain tools served by an MCP server over
// streamable HTTP (the SDK's own, in process): the arguments and the
// operation id reach it, its result is the call's output, an error result
// is an error output, and a server that is not there is
// unavailable_before_dispatch.
func TestMCPServerOverHTTP(t *testing.T) {
	s := mcp.NewServer(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	object := &jsonschema.Schema{Type: "object"}
	s.AddTool(&mcp.Tool{Name: "add", InputSchema: object}, func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		var in struct{ A, B int }
		if err := json.Unmarshal(req.Params.Arguments, &in); err != nil {
			return nil, err
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{
			Text: fmt.Sprintf("%d (op %v)", in.A+in.B, req.Params.Meta["io.toolbatch/operation_id"])}},
			StructuredContent: map[string]any{"sum": in.A + in.B}}, nil
	})
	s.AddTool(&mcp.Tool{Name: "boom", InputSchema: object}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "it broke"}}}, nil
	})
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil))
	t.Cleanup(srv.Close)
	cat, err := catalog.Parse([]byte(fmt.Sprintf(`
tools:
  - id: add
    mcp: {url: %[1]q, capability: replay_safe}
    recovery: {mode: replay_safe}
  - id: boom
    mcp: {url: %[1]q}
  - id: down
    mcp: {url: "http://127.0.0.1:1/mcp", tool: anything}
    recovery: {max_attempts: 1}
`, srv.URL)))
	if err != nil {
		t.Fatal(err)
	}
	url := testnats.Start(t, t.TempDir())
	startEngine(t, url, engine.Config{Catalog: cat})
	c := newClient(t, url)
	ctx := ctxT(t, 30*time.Second)
	res, err := c.SubmitAndWait(ctx, submitOf("mcphttp", 1, "add", `{"a":2,"b":3}`, "boom", `{}`, "down", `{}`))
	if err != nil {
		t.Fatal(err)
	}
	got := resultTexts(res)
	if len(got) != 3 || got[0] != `c1=ok "5 (op mcphttp/1/c1)[json]"` || got[1] != `c2=error "it broke"` ||
		!strings.HasPrefix(got[2], `c3=error "unavailable before dispatch: the MCP server at http://127.0.0.1:1/mcp did not start a session`) {
		t.Fatalf("results %q", got)
	}
}

// TestNPMServerOverHTTP: a brain tool of the npm everything server run in
// its streamable HTTP mode.
func TestNPMServerOverHTTP(t *testing.T) {
	server, err := filepath.Abs("../testdata/mcp/node_modules/@modelcontextprotocol/server-everything/dist/index.js")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(server); err != nil {
		t.Fatalf("the MCP servers are not installed (make mcp-deps): %v", err)
	}
	port := testproc.FreePort(t)
	t.Setenv("PORT", strconv.Itoa(port))
	testproc.Start(t, "everything", "listening on port", "node", server, "streamableHttp")
	cat, err := catalog.Parse([]byte(fmt.Sprintf(`
tools:
  - id: sum
    mcp: {url: "http://127.0.0.1:%d/mcp", tool: get-sum, capability: replay_safe}
    recovery: {mode: replay_safe}
`, port)))
	if err != nil {
		t.Fatal(err)
	}
	url := testnats.Start(t, t.TempDir())
	startEngine(t, url, engine.Config{Catalog: cat})
	c := newClient(t, url)
	res, err := c.SubmitAndWait(ctxT(t, 30*time.Second), submitOf("npmhttp", 1, "sum", `{"a":20,"b":22}`, "sum", `{"a":1,"b":1}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := resultTexts(res); len(got) != 2 || got[0] != `c1=ok "The sum of 20 and 22 is 42."` || got[1] != `c2=ok "The sum of 1 and 1 is 2."` {
		t.Fatalf("results %q", got)
	}
}
