package protocol_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/protocol"
)

// Documents for the decoder tables: generic maps that each case changes and
// then encodes as JSON or msgpack.

type doc = map[string]any

func toolUse(id, name string, input any) doc {
	return doc{"type": "tool_use", "id": id, "name": name, "input": input}
}

// submitDoc returns a valid submission with one call.
func submitDoc() doc {
	return doc{
		"run_id": "run_1", "thread_id": "thread_1", "step": 1,
		"assistant": doc{"id": "msg_1", "content": []any{
			doc{"type": "text", "text": "reading"},
			toolUse("call_1", "read_file", doc{"path": "/tmp/x"}),
		}},
	}
}

// blocks returns the assistant content of a submission document.
func blocks(d doc) []any { return d["assistant"].(doc)["content"].([]any) }

func setBlocks(d doc, bs []any) { d["assistant"].(doc)["content"] = bs }

func resumeDoc(result doc) doc {
	return doc{"correlation_id": "corr_1", "run_id": "run_1", "thread_id": "thread_1",
		"call_id": "call_1", "snapshot_id": "snap_1", "result": result}
}

func outputDoc() doc {
	return doc{"call_id": "call_1", "content": []any{doc{"type": "text", "text": "done"}}, "is_error": false,
		"state": []any{doc{"scope": "run", "key": "k", "merge": "disjoint", "action": "set", "value": doc{"a": 1}}}}
}

func toolResultDoc(change func(o doc)) doc {
	o := outputDoc()
	if change != nil {
		change(o)
	}
	return resumeDoc(doc{"kind": "tool_result", "output": o})
}

func commandDoc(change func(c doc)) doc {
	return toolResultDoc(func(o doc) {
		c := o["state"].([]any)[0].(doc)
		change(c)
	})
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("json.Marshal: %v", err)
	}
	return b
}

func mustMsgpack(t *testing.T, v any) []byte {
	t.Helper()
	b, err := events.Marshal(v)
	if err != nil {
		t.Fatalf("events.Marshal: %v", err)
	}
	return b
}

// body is a test input: a document to encode, or raw bytes.
type body struct {
	doc any    // encoded as JSON or msgpack, when raw is nil
	raw []byte // used as is
}

func (b body) encode(t *testing.T, isJSON bool) []byte {
	t.Helper()
	if b.raw != nil {
		return b.raw
	}
	if isJSON {
		return mustJSON(t, b.doc)
	}
	return mustMsgpack(t, b.doc)
}

// checkCode fails unless err is a refusal with code want, or nil when want
// is empty.
func checkCode(t *testing.T, err error, want events.Code) {
	t.Helper()
	if want == "" {
		if err != nil {
			t.Fatalf("refused: %v", err)
		}
		return
	}
	if err == nil {
		t.Fatalf("accepted, want a %s refusal", want)
	}
	got, ok := events.CodeOf(err)
	if !ok {
		t.Fatalf("error is not a *events.Refusal: %T %v", err, err)
	}
	if got != want {
		t.Fatalf("refusal code = %s, want %s (%v)", got, want, err)
	}
	if !errors.Is(err, &events.Refusal{Code: want}) {
		t.Fatalf("errors.Is(err, Refusal{%s}) is false", want)
	}
}

// both runs f on a document encoded as JSON and as msgpack, or once on raw
// bytes.
func both(t *testing.T, b body, isJSON bool, f func(t *testing.T, body []byte, isJSON bool)) {
	t.Helper()
	if b.raw != nil {
		f(t, b.raw, isJSON)
		return
	}
	for _, j := range []bool{true, false} {
		name := "msgpack"
		if j {
			name = "json"
		}
		t.Run(name, func(t *testing.T) { f(t, b.encode(t, j), j) })
	}
}

func TestDecodeSubmit(t *testing.T) {
	with := func(change func(d doc)) body {
		d := submitDoc()
		change(d)
		return body{doc: d}
	}
	withBlock := func(b doc) body {
		return with(func(d doc) { setBlocks(d, append(blocks(d), b)) })
	}
	calls := func(n int) body {
		return with(func(d doc) {
			bs := []any{}
			for i := range n {
				bs = append(bs, toolUse(fmt.Sprintf("call_%d", i), "read_file", doc{}))
			}
			setBlocks(d, bs)
		})
	}
	args := events.MustJSON(`{"path":"/tmp/x"}`)
	small := events.Limits{MaxCalls: events.DefaultMaxCalls, MaxArgumentBytes: len(args) - 1, MaxOutputBytes: events.DefaultMaxOutputBytes, MaxSubmitBytes: events.DefaultMaxSubmitBytes, MaxBlockBytes: events.DefaultMaxBlockBytes}
	exact := small
	exact.MaxArgumentBytes = len(args)
	long := func(n int) string { return strings.Repeat("a", n) }

	tests := []struct {
		name   string
		body   body
		isJSON bool // for raw bodies
		lim    events.Limits
		want   events.Code // "" when the submission is valid
	}{
		{name: "valid", body: body{doc: submitDoc()}},
		{name: "valid without calls", body: with(func(d doc) { setBlocks(d, []any{}) })},
		{name: "valid without content", body: with(func(d doc) { delete(d["assistant"].(doc), "content") })},
		{name: "valid with narrowing", body: with(func(d doc) { d["narrowing"] = "configured" })},
		{name: "valid null input", body: withBlock(toolUse("call_2", "t", nil))},
		{name: "valid missing input", body: withBlock(doc{"type": "tool_use", "id": "call_2", "name": "t"})},
		{name: "valid 64-char run id", body: with(func(d doc) { d["run_id"] = long(64) })},
		{name: "valid 128-char call id", body: withBlock(toolUse(long(128), "t", doc{}))},
		{name: "valid 128 calls", body: calls(128)},
		{name: "valid arguments at the limit", body: body{doc: submitDoc()}, lim: exact},
		{name: "valid step 0", body: with(func(d doc) { d["step"] = 0 })},
		// What the engine does not interpret is kept, and a malformed call
		// is that call's error (the aggregate's), not the batch's.
		{name: "valid block of another type", body: withBlock(doc{"type": "thinking", "thinking": "x", "signature": "s"})},
		{name: "valid text with citations and cache_control", body: withBlock(doc{"type": "text", "text": "x", "citations": nil, "cache_control": doc{"type": "ephemeral"}})},
		{name: "valid tool_use with cache_control", body: withBlock(doc{"type": "tool_use", "id": "call_2", "name": "t", "input": doc{}, "cache_control": "x"})},
		{name: "valid input that is an array", body: withBlock(toolUse("call_2", "t", []any{1, 2}))},
		{name: "valid input that is a string", body: withBlock(toolUse("call_2", "t", "x"))},
		{name: "valid tool name with a space", body: withBlock(toolUse("call_2", "read file", doc{}))},
		{name: "valid tool name of 65 chars", body: withBlock(toolUse("call_2", long(65), doc{}))},
		{name: "valid tool name with a dot", body: withBlock(toolUse("call_2", "fs.read", doc{}))},

		// undecodable
		{name: "bad msgpack bytes", body: body{raw: []byte{0xc1}}, want: events.CodeUndecodable},
		{name: "truncated msgpack", body: body{raw: mustMsgpack(t, submitDoc())[:20]}, want: events.CodeUndecodable},
		{name: "msgpack trailing byte", body: body{raw: append(mustMsgpack(t, submitDoc()), 0x00)}, want: events.CodeUndecodable},
		{name: "msgpack integer map key", body: body{raw: []byte{0x81, 0x01, 0x02}}, want: events.CodeUndecodable},
		{name: "msgpack array32 of 2^32-1", body: body{raw: []byte{0xdd, 0xff, 0xff, 0xff, 0xff}}, want: events.CodeUndecodable},
		{name: "bad JSON", body: body{raw: []byte(`{"run_id":`)}, isJSON: true, want: events.CodeUndecodable},
		{name: "JSON trailing data", body: body{raw: append(mustJSON(t, submitDoc()), '}')}, isJSON: true, want: events.CodeUndecodable},
		{name: "empty body", body: body{raw: []byte{}}, isJSON: true, want: events.CodeUndecodable},
		{name: "body is an array", body: body{doc: []any{submitDoc()}}, want: events.CodeUndecodable},
		{name: "body is null", body: body{raw: []byte("null")}, isJSON: true, want: events.CodeUndecodable},
		{name: "run_id is a number", body: with(func(d doc) { d["run_id"] = 5 }), want: events.CodeUndecodable},
		{name: "run_id missing", body: with(func(d doc) { delete(d, "run_id") }), want: events.CodeUndecodable},
		{name: "step is a string", body: with(func(d doc) { d["step"] = "1" }), want: events.CodeUndecodable},
		{name: "step is a fraction", body: with(func(d doc) { d["step"] = 1.5 }), want: events.CodeUndecodable},
		{name: "step is negative", body: with(func(d doc) { d["step"] = -1 }), want: events.CodeUndecodable},
		{name: "step missing", body: with(func(d doc) { delete(d, "step") }), want: events.CodeUndecodable},
		{name: "narrowing unknown", body: with(func(d doc) { d["narrowing"] = "some" }), want: events.CodeUndecodable},
		{name: "assistant is an array", body: with(func(d doc) { d["assistant"] = []any{} }), want: events.CodeUndecodable},
		{name: "assistant missing", body: with(func(d doc) { delete(d, "assistant") }), want: events.CodeUndecodable},
		{name: "content is an object", body: with(func(d doc) { d["assistant"].(doc)["content"] = doc{} }), want: events.CodeUndecodable},
		{name: "block is a string", body: with(func(d doc) { setBlocks(d, []any{"text"}) }), want: events.CodeUndecodable},
		{name: "block is null", body: with(func(d doc) { setBlocks(d, []any{nil}) }), want: events.CodeUndecodable},
		{name: "block without type", body: withBlock(doc{"text": "x"}), want: events.CodeUndecodable},
		{name: "block type empty", body: withBlock(doc{"type": ""}), want: events.CodeUndecodable},
		{name: "block type a number", body: withBlock(doc{"type": 3}), want: events.CodeUndecodable},
		{name: "text is a number", body: withBlock(doc{"type": "text", "text": 1}), want: events.CodeUndecodable},
		{name: "image without source", body: withBlock(doc{"type": "image"}), want: events.CodeUndecodable},
		{name: "image source of unknown type", body: withBlock(doc{"type": "image", "source": doc{"type": "file"}}), want: events.CodeUndecodable},
		{name: "tool_use id is a number", body: withBlock(doc{"type": "tool_use", "id": 1, "name": "t"}), want: events.CodeUndecodable},
		{name: "is_error is a string", body: withBlock(doc{"type": "tool_result", "tool_use_id": "x", "is_error": "yes"}), want: events.CodeUndecodable},

		// forbidden_field
		{name: "target", body: with(func(d doc) { d["target"] = "sandbox" }), want: events.CodeForbiddenField},
		{name: "kind", body: with(func(d doc) { d["kind"] = "client" }), want: events.CodeForbiddenField},
		{name: "pool", body: with(func(d doc) { d["pool"] = "gpu" }), want: events.CodeForbiddenField},
		{name: "recovery", body: with(func(d doc) { d["recovery"] = "replay_safe" }), want: events.CodeForbiddenField},
		{name: "capability", body: with(func(d doc) { d["capability"] = "idempotent" }), want: events.CodeForbiddenField},
		{name: "unknown top-level field", body: with(func(d doc) { d["priority"] = 1 }), want: events.CodeForbiddenField},
		{name: "unknown assistant field", body: with(func(d doc) { d["assistant"].(doc)["role"] = "assistant" }), want: events.CodeForbiddenField},
		{name: "target in a tool_use block", body: withBlock(doc{"type": "tool_use", "id": "call_2", "name": "t", "target": "brain"}), want: events.CodeForbiddenField},
		{name: "capability in a tool_use block", body: withBlock(doc{"type": "tool_use", "id": "call_2", "name": "t", "capability": "replay_safe"}), want: events.CodeForbiddenField},

		// invalid_id
		{name: "run_id with a slash", body: with(func(d doc) { d["run_id"] = "run/1" }), want: events.CodeInvalidID},
		{name: "run_id empty", body: with(func(d doc) { d["run_id"] = "" }), want: events.CodeInvalidID},
		{name: "run_id of 65 chars", body: with(func(d doc) { d["run_id"] = long(65) }), want: events.CodeInvalidID},
		{name: "thread_id with a space", body: with(func(d doc) { d["thread_id"] = "thread 1" }), want: events.CodeInvalidID},
		{name: "thread_id of 129 chars", body: with(func(d doc) { d["thread_id"] = long(129) }), want: events.CodeInvalidID},
		{name: "call id with a space", body: withBlock(toolUse("call 2", "t", doc{})), want: events.CodeInvalidID},
		{name: "call id empty", body: withBlock(toolUse("", "t", doc{})), want: events.CodeInvalidID},
		{name: "call id of 129 chars", body: withBlock(toolUse(long(129), "t", doc{})), want: events.CodeInvalidID},

		// limit_exceeded
		{name: "129 calls", body: calls(129), want: events.CodeLimitExceeded},
		{name: "arguments over a small limit", body: body{doc: submitDoc()}, lim: small, want: events.CodeLimitExceeded},

		// duplicate_call_id
		{name: "duplicate call id", body: withBlock(toolUse("call_1", "other", doc{})), want: events.CodeDuplicateCallID},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lim := orDefault(tt.lim)
			both(t, tt.body, tt.isJSON, func(t *testing.T, b []byte, isJSON bool) {
				s, err := protocol.DecodeSubmit(b, isJSON, lim)
				checkCode(t, err, tt.want)
				// A submission returned with a refusal is the one that failed
				// validation, so that the refusal can name its batch.
				if err != nil && s != nil && s.Validate(lim) == nil {
					t.Fatalf("a refusal returned a valid submission")
				}
			})
		})
	}
}

// orDefault is lim, or the default limits for a case that sets none.
func orDefault(lim events.Limits) events.Limits {
	if lim == (events.Limits{}) {
		return events.DefaultLimits()
	}
	return lim
}

// decodeBoth decodes d with decode from JSON and from msgpack.
func decodeBoth[T any](t *testing.T, d any, decode func([]byte, bool, events.Limits) (T, error)) (fromJSON, fromMsgpack T) {
	t.Helper()
	fromJSON, err := decode(mustJSON(t, d), true, events.DefaultLimits())
	if err != nil {
		t.Fatalf("decode JSON: %v", err)
	}
	fromMsgpack, err = decode(mustMsgpack(t, d), false, events.DefaultLimits())
	if err != nil {
		t.Fatalf("decode msgpack: %v", err)
	}
	return fromJSON, fromMsgpack
}

// TestDecodeSubmitJSONEqualsMsgpack decodes one submission, with blocks of
// every kind, from JSON and from msgpack.
func TestDecodeSubmitJSONEqualsMsgpack(t *testing.T) {
	d := submitDoc()
	d["narrowing"] = "deny_all"
	setBlocks(d, append(blocks(d),
		doc{"type": "image", "source": doc{"type": "base64", "media_type": "image/png", "data": "AAAA"}},
		doc{"type": "image", "source": doc{"type": "url", "url": "https://example.com/a.png"}},
		doc{"type": "tool_result", "tool_use_id": "call_0", "is_error": true, "content": []any{doc{"type": "text", "text": "no"}}},
		doc{"type": "json", "value": doc{"b": 1.0, "a": []any{1.5, "x", nil}}},
		toolUse("call_2", "write_file", doc{"path": "/tmp/y", "n": 2}),
	))
	want := &protocol.Submit{
		RunID: "run_1", ThreadID: "thread_1", Step: 1, Narrowing: events.NarrowingDenyAll,
		Assistant: events.Message{ID: "msg_1", Content: []events.ContentBlock{
			events.TextBlock("reading"),
			{Type: events.BlockToolUse, ID: "call_1", Name: "read_file", Input: events.MustJSON(`{"path":"/tmp/x"}`)},
			{Type: events.BlockImage, Source: &events.ImageSource{Type: "base64", MediaType: "image/png", Data: "AAAA"}},
			{Type: events.BlockImage, Source: &events.ImageSource{Type: "url", URL: "https://example.com/a.png"}},
			{Type: events.BlockToolResult, ToolUseID: "call_0", IsError: true, Content: []events.ContentBlock{events.TextBlock("no")}},
			{Type: events.BlockJSON, Value: events.MustJSON(`{"a":[1.5,"x",null],"b":1}`)},
			{Type: events.BlockToolUse, ID: "call_2", Name: "write_file", Input: events.MustJSON(`{"n":2,"path":"/tmp/y"}`)},
		}},
	}
	fromJSON, fromMsgpack := decodeBoth(t, d, protocol.DecodeSubmit)
	if !reflect.DeepEqual(fromJSON, want) {
		t.Fatalf("from JSON:\n  got:  %s\n  want: %s", show(fromJSON), show(want))
	}
	if !reflect.DeepEqual(fromMsgpack, fromJSON) {
		t.Fatalf("msgpack and JSON differ:\n  msgpack: %s\n  json:    %s", show(fromMsgpack), show(fromJSON))
	}
	if fromJSON.Digest() != fromMsgpack.Digest() {
		t.Fatalf("digests differ")
	}
	gotCalls := fromJSON.Calls()
	if len(gotCalls) != 2 || gotCalls[0].CallID != "call_1" || gotCalls[1].ToolID != "write_file" {
		t.Fatalf("Calls() = %+v", gotCalls)
	}
}

func TestDecodeResume(t *testing.T) {
	perm := func(change func(r doc)) body {
		r := doc{"kind": "permission", "allow": true}
		if change != nil {
			change(r)
		}
		return body{doc: resumeDoc(r)}
	}
	top := func(change func(d doc)) body {
		d := resumeDoc(doc{"kind": "input", "text": "yes"})
		change(d)
		return body{doc: d}
	}
	out := func(change func(o doc)) body { return body{doc: toolResultDoc(change)} }
	cmd := func(change func(c doc)) body { return body{doc: commandDoc(change)} }
	size := events.OutputSize(events.Output{CallID: "call_1", Content: []events.ContentBlock{events.TextBlock("done")},
		State: []events.Command{{Scope: events.ScopeRun, Key: "k", Merge: events.MergeDisjoint, Action: events.ActionSet, Value: events.MustJSON(`{"a":1}`)}}})
	atLimit := events.Limits{MaxCalls: 1, MaxArgumentBytes: 1, MaxOutputBytes: size, MaxSubmitBytes: 1 << 20, MaxBlockBytes: 1 << 20}
	underLimit := atLimit
	underLimit.MaxOutputBytes = size - 1

	tests := []struct {
		name   string
		body   body
		isJSON bool
		lim    events.Limits
		want   events.Code
	}{
		{name: "valid permission", body: perm(nil)},
		{name: "valid denial with reason", body: perm(func(r doc) { r["allow"] = false; r["reason"] = "no" })},
		{name: "valid approval with note", body: perm(func(r doc) { r["note"] = "ok" })},
		{name: "valid tool_result", body: out(nil)},
		{name: "valid tool_result at the output limit", body: out(nil), lim: atLimit},
		{name: "valid remove command", body: cmd(func(c doc) { c["action"] = "remove"; delete(c, "value") })},
		{name: "valid input", body: top(func(d doc) {})},
		{name: "valid without call_id and snapshot_id", body: top(func(d doc) { delete(d, "call_id"); delete(d, "snapshot_id") })},

		// undecodable
		{name: "bad msgpack bytes", body: body{raw: []byte{0xc1}}, want: events.CodeUndecodable},
		{name: "bad JSON", body: body{raw: []byte(`{`)}, isJSON: true, want: events.CodeUndecodable},
		{name: "body is an array", body: body{doc: []any{}}, want: events.CodeUndecodable},
		{name: "correlation_id missing", body: top(func(d doc) { delete(d, "correlation_id") }), want: events.CodeUndecodable},
		{name: "run_id is a number", body: top(func(d doc) { d["run_id"] = 1 }), want: events.CodeUndecodable},
		{name: "result missing", body: top(func(d doc) { delete(d, "result") }), want: events.CodeUndecodable},
		{name: "result is a string", body: top(func(d doc) { d["result"] = "allow" }), want: events.CodeUndecodable},
		{name: "kind missing", body: top(func(d doc) { d["result"] = doc{"text": "x"} }), want: events.CodeUndecodable},
		{name: "kind unknown", body: top(func(d doc) { d["result"] = doc{"kind": "maybe"} }), want: events.CodeUndecodable},
		{name: "permission without allow", body: perm(func(r doc) { delete(r, "allow") }), want: events.CodeUndecodable},
		{name: "allow is a string", body: perm(func(r doc) { r["allow"] = "yes" }), want: events.CodeUndecodable},
		{name: "note is a number", body: perm(func(r doc) { r["note"] = 1 }), want: events.CodeUndecodable},
		{name: "input without text", body: top(func(d doc) { d["result"] = doc{"kind": "input"} }), want: events.CodeUndecodable},
		{name: "tool_result without output", body: top(func(d doc) { d["result"] = doc{"kind": "tool_result"} }), want: events.CodeUndecodable},
		{name: "output without call_id", body: out(func(o doc) { delete(o, "call_id") }), want: events.CodeUndecodable},
		{name: "output content is an object", body: out(func(o doc) { o["content"] = doc{} }), want: events.CodeUndecodable},
		{name: "output block of another type, kept", body: out(func(o doc) { o["content"] = []any{doc{"type": "video", "url": "u"}} })},
		{name: "output block without a type", body: out(func(o doc) { o["content"] = []any{doc{"url": "u"}} }), want: events.CodeUndecodable},
		{name: "output block null", body: out(func(o doc) { o["content"] = []any{nil} }), want: events.CodeUndecodable},
		{name: "state is an object", body: out(func(o doc) { o["state"] = doc{} }), want: events.CodeUndecodable},
		{name: "command scope unknown", body: cmd(func(c doc) { c["scope"] = "global" }), want: events.CodeUndecodable},
		{name: "command merge unknown", body: cmd(func(c doc) { c["merge"] = "append" }), want: events.CodeUndecodable},
		{name: "command action unknown", body: cmd(func(c doc) { c["action"] = "delete" }), want: events.CodeUndecodable},
		{name: "command key empty", body: cmd(func(c doc) { c["key"] = "" }), want: events.CodeUndecodable},
		{name: "command key of 257 bytes", body: cmd(func(c doc) { c["key"] = strings.Repeat("k", 257) }), want: events.CodeUndecodable},

		// forbidden_field
		{name: "unknown top-level field", body: top(func(d doc) { d["step"] = 1 }), want: events.CodeForbiddenField},
		{name: "allow on an input", body: top(func(d doc) { d["result"] = doc{"kind": "input", "text": "x", "allow": true} }), want: events.CodeForbiddenField},
		{name: "text on a permission", body: perm(func(r doc) { r["text"] = "x" }), want: events.CodeForbiddenField},
		{name: "unknown output field", body: out(func(o doc) { o["extra"] = 1 }), want: events.CodeForbiddenField},
		{name: "unknown command field", body: cmd(func(c doc) { c["ttl"] = 5 }), want: events.CodeForbiddenField},

		// limit_exceeded
		{name: "output over the limit", body: out(nil), lim: underLimit, want: events.CodeLimitExceeded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lim := orDefault(tt.lim)
			both(t, tt.body, tt.isJSON, func(t *testing.T, b []byte, isJSON bool) {
				r, err := protocol.DecodeResume(b, isJSON, lim)
				checkCode(t, err, tt.want)
				if err != nil && r != nil {
					t.Fatalf("a refusal also returned a resume")
				}
			})
		})
	}
}

func TestDecodeResumeJSONEqualsMsgpack(t *testing.T) {
	d := toolResultDoc(func(o doc) {
		o["is_error"] = true
		o["state"] = append(o["state"].([]any), doc{"scope": "shared", "key": "lock", "merge": "exclusive", "action": "remove"})
	})
	want := &protocol.Resume{CorrelationID: "corr_1", RunID: "run_1", ThreadID: "thread_1", CallID: "call_1", SnapshotID: "snap_1",
		Result: events.ResumeResult{Kind: events.ResultToolResult, Output: &events.Output{
			CallID: "call_1", Content: []events.ContentBlock{events.TextBlock("done")}, IsError: true,
			State: []events.Command{
				{Scope: events.ScopeRun, Key: "k", Merge: events.MergeDisjoint, Action: events.ActionSet, Value: events.MustJSON(`{"a":1}`)},
				{Scope: events.ScopeShared, Key: "lock", Merge: events.MergeExclusive, Action: events.ActionRemove},
			},
		}}}
	fromJSON, fromMsgpack := decodeBoth(t, d, protocol.DecodeResume)
	if !reflect.DeepEqual(fromJSON, want) {
		t.Fatalf("from JSON:\n  got:  %s\n  want: %s", show(fromJSON), show(want))
	}
	if !reflect.DeepEqual(fromMsgpack, want) {
		t.Fatalf("from msgpack:\n  got:  %s\n  want: %s", show(fromMsgpack), show(want))
	}
}

func TestDecodeControl(t *testing.T) {
	tests := []struct {
		name   string
		body   body
		isJSON bool
		want   events.Code
		result protocol.Control // when valid
	}{
		{name: "cancel", body: body{doc: doc{"action": "cancel"}}, result: protocol.Control{Action: protocol.ControlCancel}},
		{name: "interrupt with reason", body: body{doc: doc{"action": "interrupt", "reason": "user"}},
			result: protocol.Control{Action: protocol.ControlInterrupt, Reason: "user"}},
		{name: "perform", body: body{doc: doc{"action": "perform", "correlation_id": "corr_1"}},
			result: protocol.Control{Action: protocol.ControlPerform, CorrelationID: "corr_1"}},

		{name: "perform without correlation_id", body: body{doc: doc{"action": "perform"}}, want: events.CodeUndecodable},
		{name: "perform with an empty correlation_id", body: body{doc: doc{"action": "perform", "correlation_id": ""}}, want: events.CodeUndecodable},
		{name: "perform with a null correlation_id", body: body{doc: doc{"action": "perform", "correlation_id": nil}}, want: events.CodeUndecodable},
		{name: "perform with a numeric correlation_id", body: body{doc: doc{"action": "perform", "correlation_id": 7}}, want: events.CodeUndecodable},
		{name: "unknown action", body: body{doc: doc{"action": "pause"}}, want: events.CodeUndecodable},
		{name: "action missing", body: body{doc: doc{"reason": "x"}}, want: events.CodeUndecodable},
		{name: "action is a number", body: body{doc: doc{"action": 1}}, want: events.CodeUndecodable},
		{name: "reason is a number", body: body{doc: doc{"action": "cancel", "reason": 1}}, want: events.CodeUndecodable},
		{name: "body is an array", body: body{doc: []any{"cancel"}}, want: events.CodeUndecodable},
		{name: "bad msgpack bytes", body: body{raw: []byte{0xc1}}, want: events.CodeUndecodable},
		{name: "bad JSON", body: body{raw: []byte(`{"action":"cancel"`)}, isJSON: true, want: events.CodeUndecodable},
		{name: "unknown field", body: body{doc: doc{"action": "cancel", "run_id": "run_1"}}, want: events.CodeForbiddenField},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			both(t, tt.body, tt.isJSON, func(t *testing.T, b []byte, isJSON bool) {
				c, err := protocol.DecodeControl(b, isJSON)
				checkCode(t, err, tt.want)
				if err != nil {
					if c != nil {
						t.Fatalf("a refusal also returned a control")
					}
					return
				}
				if *c != tt.result {
					t.Fatalf("got %+v, want %+v", *c, tt.result)
				}
			})
		})
	}
}

func TestDecodeResult(t *testing.T) {
	base := func(change func(d doc)) []byte {
		d := doc{"operation_id": "run_1/1/call_1", "attempt": 1, "claim_token": "tok"}
		change(d)
		return mustMsgpack(t, d)
	}
	small := events.Limits{MaxCalls: 1, MaxArgumentBytes: 1, MaxOutputBytes: 10, MaxSubmitBytes: 1 << 20, MaxBlockBytes: 1 << 20}
	tests := []struct {
		name    string
		body    []byte
		lim     events.Limits
		wantErr error // nil when valid
	}{
		{name: "output", body: base(func(d doc) { d["output"] = outputDoc() })},
		{name: "error", body: base(func(d doc) { d["error"] = doc{"kind": "execution", "message": "boom"} })},
		{name: "both", body: base(func(d doc) { d["output"] = outputDoc(); d["error"] = doc{"kind": "execution"} }), wantErr: protocol.ErrResultShape},
		{name: "neither", body: base(func(d doc) {}), wantErr: protocol.ErrResultShape},
		{name: "garbage", body: []byte{0xc1}, wantErr: events.ErrMalformed},
		{name: "array32 of 2^32-1", body: []byte{0xdd, 0xff, 0xff, 0xff, 0xff}, wantErr: events.ErrMalformed},
		{name: "trailing byte", body: append(base(func(d doc) { d["error"] = doc{"kind": "execution"} }), 0), wantErr: events.ErrMalformed},
		{name: "attempt is a string", body: base(func(d doc) { d["attempt"] = "1"; d["error"] = doc{} }), wantErr: events.ErrMalformed},
		{name: "null content block", body: base(func(d doc) { o := outputDoc(); o["content"] = []any{nil}; d["output"] = o }), wantErr: events.ErrMalformed},
		{name: "content block of another type, kept", body: base(func(d doc) { o := outputDoc(); o["content"] = []any{doc{"type": "video"}}; d["output"] = o })},
		{name: "content block without a type", body: base(func(d doc) { o := outputDoc(); o["content"] = []any{doc{"text": "x"}}; d["output"] = o }), wantErr: events.ErrMalformed},
		{name: "output over the limit", body: base(func(d doc) { d["output"] = outputDoc() }), lim: small, wantErr: &events.Refusal{Code: events.CodeLimitExceeded}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lim := orDefault(tt.lim)
			r, err := protocol.DecodeResult(tt.body, lim)
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("DecodeResult: %v", err)
				}
				return
			}
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("DecodeResult error = %v, want %v", err, tt.wantErr)
			}
			if r != nil {
				t.Fatalf("an error also returned a result")
			}
		})
	}
}

// TestDecodeResultChecksCommands checks that a result's staged commands are
// checked as a resume's are.
func TestDecodeResultChecksCommands(t *testing.T) {
	bad := []doc{
		{"scope": "global", "key": "k", "merge": "disjoint", "action": "set", "value": 1},
		{"scope": "run", "key": "", "merge": "disjoint", "action": "set", "value": 1},
		{"scope": "run", "key": "k", "merge": "append", "action": "set", "value": 1},
		{"scope": "run", "key": "k", "merge": "disjoint", "action": "delete"},
	}
	for _, c := range bad {
		t.Run(fmt.Sprint(c), func(t *testing.T) {
			o := outputDoc()
			o["state"] = []any{c}
			if _, err := protocol.DecodeResume(mustMsgpack(t, toolResultDoc(func(out doc) { out["state"] = []any{c} })), false, events.DefaultLimits()); err == nil {
				t.Fatalf("DecodeResume accepted command %v", c)
			}
			body := mustMsgpack(t, doc{"operation_id": "run_1/1/call_1", "attempt": 1, "claim_token": "tok", "output": o})
			if _, err := protocol.DecodeResult(body, events.DefaultLimits()); err == nil {
				t.Fatalf("DecodeResult accepted command %v", c)
			}
		})
	}
}

// TestOutputSizeIsCanonical checks that OutputSize does not count HTML
// escaping, which canonical JSON does not have.
func TestOutputSizeIsCanonical(t *testing.T) {
	plain := events.TextOutput("call_1", strings.Repeat("a", 100))
	html := events.TextOutput("call_1", strings.Repeat("<", 100))
	if p, h := events.OutputSize(plain), events.OutputSize(html); p != h {
		t.Fatalf("OutputSize of 100 'a' is %d, of 100 '<' is %d", p, h)
	}
}

func show(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%#v", v)
	}
	return string(b)
}
