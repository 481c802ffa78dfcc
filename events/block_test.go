package events_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/internal/testjson"
)

// anthropicMessage is the content of an assistant message as the Anthropic
// Messages API returns it, with extended thinking, a citation-bearing text
// block, a server tool's use and result, cache_control, and two calls.
const anthropicMessage = `[
 {"type":"thinking","thinking":"The user wants two files.","signature":"EqQBCkYIBxgCKkA="},
 {"type":"redacted_thinking","data":"EmwKAhgBEgy3va3pzix/LafPsn4aDFIT"},
 {"type":"text","text":"I will read both.","citations":null},
 {"type":"text","text":"Per the docs,","citations":[{"type":"char_location","cited_text":"x","document_index":0,"document_title":null,"start_char_index":0,"end_char_index":1}],"cache_control":{"type":"ephemeral"}},
 {"type":"server_tool_use","id":"srvtoolu_01","name":"web_search","input":{"query":"toolbatch"}},
 {"type":"web_search_tool_result","tool_use_id":"srvtoolu_01","content":[{"type":"web_search_result","url":"https://example.com","title":"t","encrypted_content":"abc","page_age":null}]},
 {"type":"tool_use","id":"toolu_01","name":"read_file","input":{"path":"a"}},
 {"type":"tool_use","id":"toolu_02","name":"read_file","input":{"path":"b"},"cache_control":{"type":"ephemeral"}}
]`

// TestProviderBlocksKeptVerbatim: a real assistant message goes in and
// comes back out unchanged, through JSON and through msgpack (the log's
// encoding), and only its tool_use blocks are calls.
func TestProviderBlocksKeptVerbatim(t *testing.T) {
	var content []events.ContentBlock
	if err := json.Unmarshal([]byte(anthropicMessage), &content); err != nil {
		t.Fatalf("decode: %v", err)
	}
	if err := events.CheckBlocks(content); err != nil {
		t.Fatalf("CheckBlocks: %v", err)
	}
	out, err := json.Marshal(content)
	if err != nil {
		t.Fatal(err)
	}
	testjson.Same(t, out, []byte(anthropicMessage)) // the JSON round trip changes nothing
	packed, err := msgpack.Marshal(content)
	if err != nil {
		t.Fatal(err)
	}
	var back []events.ContentBlock
	if err := msgpack.Unmarshal(packed, &back); err != nil {
		t.Fatalf("msgpack decode: %v", err)
	}
	again, err := json.Marshal(back)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again, out) {
		t.Fatalf("msgpack round trip changed the message:\n got %s\nwant %s", again, out)
	}
	repacked, err := msgpack.Marshal(back)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(repacked, packed) {
		t.Fatal("the msgpack encoding is not stable: a digest of it would change")
	}
	calls := events.Message{Content: content}.ToolUses()
	if len(calls) != 2 || calls[0].CallID != "toolu_01" || calls[1].CallID != "toolu_02" {
		t.Fatalf("calls %+v, want toolu_01 and toolu_02 only", calls)
	}
	if content[2].Type != events.BlockText || content[2].Text != "I will read both." || string(content[2].Extra) != `{"citations":null}` {
		t.Fatalf("text block %+v", content[2])
	}
}

// TestBlockExtraChecked: keys kept uninterpreted cannot shadow the type's
// own or carry placement into a call, however a block is made.
func TestBlockExtraChecked(t *testing.T) {
	for _, tt := range []struct {
		name string
		b    events.ContentBlock
	}{
		{"a key of the type", events.ContentBlock{Type: events.BlockText, Text: "x", Extra: events.RawJSON(`{"text":"y"}`)}},
		{"the type", events.ContentBlock{Type: "thinking", Extra: events.RawJSON(`{"type":"text"}`)}},
		{"placement in a call", events.ContentBlock{Type: events.BlockToolUse, ID: "c", Name: "t", Extra: events.RawJSON(`{"target":"sandbox"}`)}},
		{"not an object", events.ContentBlock{Type: "thinking", Extra: events.RawJSON(`[1]`)}},
		{"no type", events.ContentBlock{Extra: events.RawJSON(`{"a":1}`)}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if err := events.CheckBlocks([]events.ContentBlock{tt.b}); !errors.Is(err, events.ErrMalformed) {
				t.Fatalf("CheckBlocks = %v, want ErrMalformed", err)
			}
			if _, err := msgpack.Marshal(tt.b); err == nil {
				t.Fatal("encoded")
			}
		})
	}
	var b events.ContentBlock
	err := json.Unmarshal([]byte(`{"type":"tool_use","id":"c","name":"t","input":{},"pool":"gpu"}`), &b)
	var ref *events.Refusal
	if !errors.As(err, &ref) || ref.Code != events.CodeForbiddenField {
		t.Fatalf("a call naming its pool: %v, want forbidden_field", err)
	}
}
