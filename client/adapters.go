package client

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/protocol"
)

// Adapters between the model providers' message formats and toolbatch's
// (docs/adapters.md says what each one keeps and what it loses). Each
// From* makes the submission of one model turn; each To* makes, from the
// batch's results, what the next request to that provider carries.

// Turn names the run, thread and step a model turn is submitted as.
type Turn struct {
	RunID, ThreadID string
	Step            int64
}

func (t Turn) submit(id string, content []events.ContentBlock) *protocol.Submit {
	return &protocol.Submit{RunID: t.RunID, ThreadID: t.ThreadID, Step: t.Step,
		Assistant: events.Message{ID: id, Content: content}}
}

// FromAnthropic makes the submission of an Anthropic Messages API response
// (the assistant message: {"id", "role", "content": [...], ...}). The
// content is kept as it is, every block and key (thinking and its
// signature, citations, cache_control, server tools); its tool_use blocks
// are the calls. The message's other keys (model, stop_reason, usage) are
// not the batch's and are left out.
func FromAnthropic(t Turn, message []byte) (*protocol.Submit, error) {
	var m struct {
		ID      string                `json:"id"`
		Role    string                `json:"role"`
		Content []events.ContentBlock `json:"content"`
	}
	if err := json.Unmarshal(message, &m); err != nil {
		return nil, fmt.Errorf("anthropic message: %w", err)
	}
	if m.Role != "" && m.Role != "assistant" {
		return nil, fmt.Errorf("anthropic message: role %q, want assistant", m.Role)
	}
	return t.submit(m.ID, m.Content), nil
}

// ToAnthropic makes the user message that answers the batch: one
// tool_result block per call, in model order, with is_error kept. Text and
// image blocks are passed as they are; a json block becomes a text block
// of its JSON, and a block of another type a text block of the whole
// block's JSON (the Messages API takes only text and images in a
// tool_result). Append any text of your own after the results.
func ToAnthropic(res *protocol.ResultsOut) ([]byte, error) {
	type block struct {
		Type      string           `json:"type"`
		ToolUseID string           `json:"tool_use_id"`
		Content   []map[string]any `json:"content"`
		IsError   bool             `json:"is_error,omitempty"`
	}
	out := struct {
		Role    string  `json:"role"`
		Content []block `json:"content"`
	}{Role: "user", Content: []block{}}
	for _, r := range res.Results {
		b := block{Type: "tool_result", ToolUseID: r.ToolUseID, Content: []map[string]any{}, IsError: r.IsError}
		for _, c := range r.Content {
			switch c.Type {
			case events.BlockText:
				b.Content = append(b.Content, map[string]any{"type": "text", "text": c.Text})
			case events.BlockImage:
				b.Content = append(b.Content, map[string]any{"type": "image", "source": c.Source})
			default:
				b.Content = append(b.Content, map[string]any{"type": "text", "text": renderBlock(c)})
			}
		}
		out.Content = append(out.Content, b)
	}
	return json.Marshal(out)
}

// FromOpenAIChat makes the submission of an OpenAI Chat Completions
// assistant message ({"role": "assistant", "content", "tool_calls": [...]}).
// Its text content becomes a text block, and each function tool call a
// tool_use block, in order: arguments that parse as JSON are the input as
// they are (an input that is not an object is then that call's
// invalid_arguments error), empty arguments are {}, and arguments that do
// not parse are passed as the string they are, so that the engine answers
// that call with invalid_arguments and the others run. Chat messages have
// no id: id is the completion's (or "").
func FromOpenAIChat(t Turn, id string, message []byte) (*protocol.Submit, error) {
	var m struct {
		Role      string          `json:"role"`
		Content   json.RawMessage `json:"content"`
		ToolCalls []struct {
			ID       string `json:"id"`
			Type     string `json:"type"`
			Function struct {
				Name      string `json:"name"`
				Arguments string `json:"arguments"`
			} `json:"function"`
		} `json:"tool_calls"`
	}
	if err := json.Unmarshal(message, &m); err != nil {
		return nil, fmt.Errorf("openai message: %w", err)
	}
	if m.Role != "" && m.Role != "assistant" {
		return nil, fmt.Errorf("openai message: role %q, want assistant", m.Role)
	}
	var content []events.ContentBlock
	text, err := chatText(m.Content)
	if err != nil {
		return nil, err
	}
	if text != "" {
		content = append(content, events.TextBlock(text))
	}
	for i, c := range m.ToolCalls {
		if c.Type != "" && c.Type != "function" {
			return nil, fmt.Errorf("openai message: tool_calls[%d]: type %q is not a function call", i, c.Type)
		}
		content = append(content, toolUse(c.ID, c.Function.Name, c.Function.Arguments))
	}
	return t.submit(id, content), nil
}

// chatText is a chat message's content: a string, an array of text parts,
// or null.
func chatText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", fmt.Errorf("openai message: content is neither a string nor an array of parts")
	}
	var texts []string
	for _, p := range parts {
		if p.Type == "text" || p.Type == "output_text" {
			texts = append(texts, p.Text)
		}
	}
	return strings.Join(texts, "\n"), nil
}

// toolUse is the tool_use block of a call whose arguments are a JSON text.
func toolUse(id, name, arguments string) events.ContentBlock {
	b := events.ContentBlock{Type: events.BlockToolUse, ID: id, Name: name}
	switch in, err := events.CanonicalJSON([]byte(arguments)); {
	case strings.TrimSpace(arguments) == "":
		b.Input = events.RawJSON("{}")
	case err == nil:
		b.Input = in
	default:
		s, _ := json.Marshal(arguments) // the engine answers a string input with invalid_arguments
		b.Input = events.RawJSON(s)
	}
	return b
}

// ToOpenAIChat makes the tool messages that answer the batch: one
// {"role": "tool", "tool_call_id", "content"} per call, in model order. A
// tool message carries text only: text blocks are joined by blank lines,
// a json block is its JSON, an image is "[image: <media type or URL>]",
// another block its JSON; an error output's text is prefixed "Error: "
// (the format has no is_error).
func ToOpenAIChat(res *protocol.ResultsOut) ([][]byte, error) {
	return textItems(res, func(id, text string) map[string]string {
		return map[string]string{"role": "tool", "tool_call_id": id, "content": text}
	})
}

// textItems is one JSON object per result, in model order, made by item
// from the call's id and its output rendered as text.
func textItems(res *protocol.ResultsOut, item func(id, text string) map[string]string) ([][]byte, error) {
	out := make([][]byte, 0, len(res.Results))
	for _, r := range res.Results {
		b, err := json.Marshal(item(r.ToolUseID, resultText(r)))
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

// FromOpenAIResponses makes the submission of an OpenAI Responses API
// turn from the response's id and its output items. Each function_call
// item becomes a tool_use block (its call_id is the call id; arguments as
// in FromOpenAIChat); every other item (message, reasoning with its
// encrypted content, web_search_call, ...) is kept as it is, as a block
// of its own type, so that the log holds the whole turn.
func FromOpenAIResponses(t Turn, id string, output []byte) (*protocol.Submit, error) {
	var items []json.RawMessage
	if err := json.Unmarshal(output, &items); err != nil {
		return nil, fmt.Errorf("openai response output: %w", err)
	}
	content := make([]events.ContentBlock, 0, len(items))
	for i, raw := range items {
		var head struct {
			Type      string `json:"type"`
			CallID    string `json:"call_id"`
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		}
		if err := json.Unmarshal(raw, &head); err != nil {
			return nil, fmt.Errorf("openai response output[%d]: %w", i, err)
		}
		if head.Type == "function_call" {
			content = append(content, toolUse(head.CallID, head.Name, head.Arguments))
			continue
		}
		var b events.ContentBlock
		if err := json.Unmarshal(raw, &b); err != nil {
			return nil, fmt.Errorf("openai response output[%d]: %w", i, err)
		}
		content = append(content, b)
	}
	return t.submit(id, content), nil
}

// ToOpenAIResponses makes the input items that answer the batch: one
// {"type": "function_call_output", "call_id", "output"} per call, in model
// order, the output rendered as ToOpenAIChat renders it.
func ToOpenAIResponses(res *protocol.ResultsOut) ([][]byte, error) {
	return textItems(res, func(id, text string) map[string]string {
		return map[string]string{"type": "function_call_output", "call_id": id, "output": text}
	})
}

// resultText renders a tool_result as text for a format that carries text
// only.
func resultText(r events.ContentBlock) string {
	parts := make([]string, 0, len(r.Content))
	for _, c := range r.Content {
		switch c.Type {
		case events.BlockText:
			parts = append(parts, c.Text)
		case events.BlockImage:
			where := ""
			if c.Source != nil {
				where = c.Source.MediaType + c.Source.URL
			}
			parts = append(parts, "[image: "+where+"]")
		default:
			parts = append(parts, renderBlock(c))
		}
	}
	text := strings.Join(parts, "\n\n")
	if r.IsError {
		return "Error: " + text
	}
	return text
}

// renderBlock is a block as text: a json block's value, or any other
// block's whole JSON.
func renderBlock(c events.ContentBlock) string {
	if c.Type == events.BlockJSON {
		if len(c.Value) == 0 {
			return "null"
		}
		return string(c.Value)
	}
	b, err := json.Marshal(c)
	if err != nil {
		return fmt.Sprintf("[%s block]", c.Type)
	}
	return string(bytes.TrimSpace(b))
}
