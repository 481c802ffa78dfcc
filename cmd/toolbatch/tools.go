package main

import (
	"encoding/json"
	"io"

	"github.com/toolbatch/toolbatch/catalog"
	"github.com/toolbatch/toolbatch/events"
)

// Formats of toolbatch tools: the tool definitions each provider's API
// takes in a request.
const (
	formatAnthropic       = "anthropic"        // Messages API: tools[]
	formatOpenAI          = "openai"           // Chat Completions: tools[] of type function
	formatOpenAIResponses = "openai-responses" // Responses API: tools[] of type function
)

// cmdTools: toolbatch tools [--catalog FILE] [--format F]
func cmdTools(args []string, stdout io.Writer) error {
	c := newCommon("tools")
	path := c.fs.String("catalog", "", "the catalog file (default: the engine's built-in catalog)")
	format := c.fs.String("format", formatAnthropic, "anthropic, openai or openai-responses")
	if _, err := c.parse(args); err != nil {
		return err
	}
	cat := catalog.Default()
	if *path != "" {
		var err error
		if cat, err = catalog.Load(*path); err != nil {
			return failf("%v", err)
		}
	}
	defs, err := toolDefinitions(cat.Tools(), *format)
	if err != nil {
		return err
	}
	return writeJSON(stdout, defs)
}

// toolDefinitions are the catalog's tools as a provider's tool
// definitions, in the catalog's order: name, description, and the input
// schema (any object when the catalog has none).
func toolDefinitions(tools []catalog.Tool, format string) ([]any, error) {
	defs := make([]any, 0, len(tools))
	for _, t := range tools {
		schema := t.InputSchema
		if len(schema) == 0 {
			schema = events.RawJSON(`{"type":"object"}`)
		}
		var d map[string]any
		switch format {
		case formatAnthropic:
			d = map[string]any{"name": t.ID, "input_schema": json.RawMessage(schema)}
		case formatOpenAI:
			fn := map[string]any{"name": t.ID, "parameters": json.RawMessage(schema)}
			if t.Description != "" {
				fn["description"] = t.Description
			}
			defs = append(defs, map[string]any{"type": "function", "function": fn})
			continue
		case formatOpenAIResponses:
			d = map[string]any{"type": "function", "name": t.ID, "parameters": json.RawMessage(schema)}
		default:
			return nil, usageErrorf("tools: --format %q is not anthropic, openai or openai-responses", format)
		}
		if t.Description != "" {
			d["description"] = t.Description
		}
		defs = append(defs, d)
	}
	return defs, nil
}
