package client_test

import (
	"encoding/json"
	"testing"

	"github.com/toolbatch/toolbatch/client"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/internal/testjson"
	"github.com/toolbatch/toolbatch/protocol"
)

var turn = client.Turn{RunID: "r", ThreadID: "t", Step: 2}

func inputs(t *testing.T, s *protocol.Submit) []string {
	t.Helper()
	var out []string
	for _, c := range s.Calls() {
		out = append(out, c.CallID+" "+c.ToolID+" "+string(c.Arguments))
	}
	return out
}

func equalStrings(t *testing.T, got, want []string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %q\nwant %q", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("got %q\nwant %q", got, want)
		}
	}
}

func TestFromAnthropicKeepsTheContent(t *testing.T) {
	content := `[{"type":"thinking","thinking":"t","signature":"sig"},{"type":"text","text":"x","citations":null,"cache_control":{"type":"ephemeral"}},` +
		`{"type":"tool_use","id":"toolu_1","name":"read","input":{"p":1}},{"type":"tool_use","id":"toolu_2","name":"write","input":{}}]`
	msg := `{"id":"msg_1","type":"message","role":"assistant","model":"claude","stop_reason":"tool_use","usage":{"input_tokens":3},"content":` + content + `}`
	s, err := client.FromAnthropic(turn, []byte(msg))
	if err != nil {
		t.Fatal(err)
	}
	if s.RunID != "r" || s.ThreadID != "t" || s.Step != 2 || s.Assistant.ID != "msg_1" {
		t.Fatalf("submission %+v", s)
	}
	got, err := json.Marshal(s.Assistant.Content)
	if err != nil {
		t.Fatal(err)
	}
	testjson.Same(t, got, []byte(content))
	equalStrings(t, inputs(t, s), []string{`toolu_1 read {"p":1}`, `toolu_2 write {}`})
	if err := s.Validate(events.DefaultLimits()); err != nil {
		t.Fatal(err)
	}
	if _, err := client.FromAnthropic(turn, []byte(`{"role":"user","content":[]}`)); err == nil {
		t.Fatal("a user message was taken")
	}
}

// results are the results of a batch of four calls, of every kind of
// output.
var results = &protocol.ResultsOut{BatchID: "r/2", Step: 2, Results: []events.ContentBlock{
	{Type: events.BlockToolResult, ToolUseID: "c1", Content: []events.ContentBlock{events.TextBlock("one"), events.TextBlock("two")}},
	{Type: events.BlockToolResult, ToolUseID: "c2", IsError: true, Content: []events.ContentBlock{events.TextBlock("invalid arguments: x")}},
	{Type: events.BlockToolResult, ToolUseID: "c3", Content: []events.ContentBlock{{Type: events.BlockJSON, Value: events.MustJSON(`{"n":1}`)}}},
	{Type: events.BlockToolResult, ToolUseID: "c4", Content: []events.ContentBlock{{Type: events.BlockImage, Source: &events.ImageSource{Type: "base64", MediaType: "image/png", Data: "AA=="}}}},
}}

func TestToAnthropic(t *testing.T) {
	got, err := client.ToAnthropic(results)
	if err != nil {
		t.Fatal(err)
	}
	testjson.Same(t, got, []byte(`{"role":"user","content":[
		{"type":"tool_result","tool_use_id":"c1","content":[{"type":"text","text":"one"},{"type":"text","text":"two"}]},
		{"type":"tool_result","tool_use_id":"c2","is_error":true,"content":[{"type":"text","text":"invalid arguments: x"}]},
		{"type":"tool_result","tool_use_id":"c3","content":[{"type":"text","text":"{\"n\":1}"}]},
		{"type":"tool_result","tool_use_id":"c4","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AA=="}}]}]}`))
}

func TestFromOpenAIChatMakesMalformedCallsTheirOwn(t *testing.T) {
	msg := `{"role":"assistant","content":"Let me look.","refusal":null,"tool_calls":[
		{"id":"call_1","type":"function","function":{"name":"read","arguments":"{\"p\": 1}"}},
		{"id":"call_2","type":"function","function":{"name":"read","arguments":"{\"p\": "}},
		{"id":"call_3","type":"function","function":{"name":"list","arguments":""}},
		{"id":"call_4","type":"function","function":{"name":"read","arguments":"[1]"}},
		{"id":"call_5","type":"function","function":{"name":"fs.read","arguments":"{}"}}]}`
	s, err := client.FromOpenAIChat(turn, "chatcmpl-1", []byte(msg))
	if err != nil {
		t.Fatal(err)
	}
	if s.Assistant.ID != "chatcmpl-1" || s.Assistant.Content[0].Text != "Let me look." {
		t.Fatalf("assistant %+v", s.Assistant)
	}
	equalStrings(t, inputs(t, s), []string{
		`call_1 read {"p":1}`, `call_2 read "{\"p\": "`, `call_3 list {}`, `call_4 read [1]`, `call_5 fs.read {}`,
	})
	// Nothing of it is the batch's problem: the engine decides each call.
	if err := s.Validate(events.DefaultLimits()); err != nil {
		t.Fatal(err)
	}
}

func TestToOpenAIChat(t *testing.T) {
	msgs, err := client.ToOpenAIChat(results)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		`{"role":"tool","tool_call_id":"c1","content":"one\n\ntwo"}`,
		`{"role":"tool","tool_call_id":"c2","content":"Error: invalid arguments: x"}`,
		`{"role":"tool","tool_call_id":"c3","content":"{\"n\":1}"}`,
		`{"role":"tool","tool_call_id":"c4","content":"[image: image/png]"}`,
	}
	if len(msgs) != len(want) {
		t.Fatalf("%d messages", len(msgs))
	}
	for i := range want {
		testjson.Same(t, msgs[i], []byte(want[i]))
	}
}

func TestOpenAIResponses(t *testing.T) {
	output := `[{"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"gAAA"},
		{"type":"message","id":"msg_1","role":"assistant","content":[{"type":"output_text","text":"ok","annotations":[]}]},
		{"type":"function_call","id":"fc_1","call_id":"call_1","name":"read","arguments":"{\"p\":1}"},
		{"type":"function_call","id":"fc_2","call_id":"call_2","name":"read","arguments":"{"}]`
	s, err := client.FromOpenAIResponses(turn, "resp_1", []byte(output))
	if err != nil {
		t.Fatal(err)
	}
	equalStrings(t, inputs(t, s), []string{`call_1 read {"p":1}`, `call_2 read "{"`})
	reasoning, err := json.Marshal(s.Assistant.Content[0])
	if err != nil {
		t.Fatal(err)
	}
	testjson.Same(t, reasoning, []byte(`{"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"gAAA"}`))
	items, err := client.ToOpenAIResponses(results)
	if err != nil {
		t.Fatal(err)
	}
	testjson.Same(t, items[1], []byte(`{"type":"function_call_output","call_id":"c2","output":"Error: invalid arguments: x"}`))
}
