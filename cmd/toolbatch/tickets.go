package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/toolbatch/toolbatch/client"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/protocol"
)

// Tickets from the shell: list them, and answer each kind.

// answerHint is the command that answers a ticket, for a person to type;
// flags are the connection flags it needs (connFlags).
func answerHint(t protocol.AwaitingOut, flags string) string {
	r, c := t.RunID, t.CorrelationID+flags
	switch t.Reason {
	case events.WaitPermission:
		return fmt.Sprintf("toolbatch approve %s %s   or   toolbatch deny %s %s --reason TEXT", r, c, r, c)
	case events.WaitScheduledAction:
		return fmt.Sprintf("toolbatch perform %s %s (now), or toolbatch approve|deny %s %s", r, c, r, c)
	case events.WaitExternalResult:
		return fmt.Sprintf("toolbatch result %s %s < output.txt   (or --blocks < output.json)", r, c)
	case events.WaitDelegation:
		return fmt.Sprintf("toolbatch input %s %s 'TEXT'", r, c)
	}
	return fmt.Sprintf("(a %s ticket)", t.Reason)
}

// ticketLine describes an open ticket in one line.
func ticketLine(t protocol.AwaitingOut, flags string) string {
	s := fmt.Sprintf("ticket %s of run %s: %s for call %s (tool %s)", t.CorrelationID, t.RunID, t.Reason, t.CallID, t.ToolID)
	if t.Deadline != "" {
		s += ", deadline " + t.Deadline
	}
	if t.Due != "" {
		s += ", due " + t.Due
	}
	return s + "; answer: " + answerHint(t, flags)
}

// cmdTickets: toolbatch tickets [--run RUN_ID] [--reason R] [--json]
func cmdTickets(args []string, stdout io.Writer) error {
	c := newCommon("tickets")
	run := c.fs.String("run", "", "only this run's ticket")
	reason := c.fs.String("reason", "", "only tickets of this reason: permission, scheduled_action, external_result or delegation")
	asJSON := c.fs.Bool("json", false, "print one JSON array")
	if _, err := c.parse(args); err != nil {
		return err
	}
	if *run != "" {
		if err := validRun("tickets", *run); err != nil {
			return err
		}
	}
	switch events.WaitKind(*reason) {
	case "", events.WaitPermission, events.WaitScheduledAction, events.WaitExternalResult, events.WaitDelegation:
	default:
		return usageErrorf("tickets: --reason %q is none of permission, scheduled_action, external_result, delegation", *reason)
	}
	return c.withClient(func(ctx context.Context, _ *nats.Conn, cl *client.Client) error {
		all, err := cl.Tickets(ctx)
		if err != nil {
			return explain(ctx, err, "reading the open tickets")
		}
		shown := []protocol.AwaitingOut{}
		for _, t := range all {
			if (*run == "" || t.RunID == *run) && (*reason == "" || string(t.Reason) == *reason) {
				shown = append(shown, t)
			}
		}
		if *asJSON {
			return writeJSON(stdout, shown)
		}
		if len(shown) == 0 {
			fmt.Fprintln(stdout, "no open ticket")
		}
		for _, t := range shown {
			fmt.Fprintln(stdout, ticketLine(t, c.connFlags()))
		}
		return nil
	})
}

// maxAnswer bounds what result and input read.
const maxAnswer = 8 << 20

// readAnswer reads a file ("-" or "": stdin).
func readAnswer(path string, stdin io.Reader) ([]byte, error) {
	r := stdin
	if path != "" && path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, usageErrorf("%v", err)
		}
		defer f.Close()
		r = f
	}
	data, err := io.ReadAll(io.LimitReader(r, maxAnswer+1))
	if err != nil {
		return nil, failf("read: %v", err)
	}
	if len(data) > maxAnswer {
		return nil, failf("rejected %s: the answer is larger than %d bytes", events.CodeLimitExceeded, maxAnswer)
	}
	return data, nil
}

// outputOf reads a client tool's output: text (one text block), or with
// blocks JSON (an array of content blocks, or an output object with
// content and is_error), checked by the engine's own decoder and held to
// the block types the engine interprets.
func outputOf(t protocol.AwaitingOut, data []byte, blocks, isError bool, lim events.Limits) (events.Output, error) {
	if !blocks {
		out := events.TextOutput(t.CallID, string(data))
		out.IsError = isError
		return out, nil
	}
	data = bytes.TrimSpace(data)
	output := map[string]json.RawMessage{}
	switch {
	case len(data) > 0 && data[0] == '[':
		output["content"], output["is_error"] = data, json.RawMessage(fmt.Sprint(isError))
	case len(data) > 0 && data[0] == '{':
		if isError {
			return events.Output{}, usageErrorf("result: --error with an output object: say \"is_error\": true in the object")
		}
		if err := json.Unmarshal(data, &output); err != nil {
			return events.Output{}, failf("rejected %s: %v", events.CodeUndecodable, err)
		}
	default:
		return events.Output{}, failf("rejected %s: --blocks wants a JSON array of content blocks or an output object {\"content\": [...], \"is_error\": false}", events.CodeUndecodable)
	}
	if _, ok := output["call_id"]; !ok {
		output["call_id"], _ = json.Marshal(t.CallID)
	}
	body, err := json.Marshal(map[string]any{"correlation_id": t.CorrelationID, "run_id": t.RunID, "thread_id": t.ThreadID,
		"result": map[string]any{"kind": events.ResultToolResult, "output": output}})
	if err != nil {
		return events.Output{}, failf("rejected %s: %v", events.CodeUndecodable, err)
	}
	r, err := protocol.DecodeResume(body, true, lim)
	if err != nil {
		return events.Output{}, rejected(err)
	}
	// A person types these: a block type or key the engine does not
	// interpret is a typo to report, not a provider's content to keep.
	if err := events.StrictBlocks(r.Result.Output.Content); err != nil {
		return events.Output{}, failf("rejected %s: %v", events.CodeUndecodable, err)
	}
	return *r.Result.Output, nil
}

// cmdResult: toolbatch result RUN_ID CORRELATION_ID [--file F] [--blocks] [--error]
func cmdResult(args []string, stdin io.Reader, stdout io.Writer) error {
	c := newCommon("result")
	file := c.fs.String("file", "-", "read the output from this file (default stdin)")
	blocks := c.fs.Bool("blocks", false, "the output is JSON: an array of content blocks, or an object {content, is_error}")
	isError := c.fs.Bool("error", false, "the output is the tool's error (is_error)")
	asJSON := c.fs.Bool("json", false, "say what was done as one JSON object")
	runID, corr, err := c.parseTicket(args)
	if err != nil {
		return err
	}
	data, err := readAnswer(*file, stdin)
	if err != nil {
		return err
	}
	return c.withClient(func(ctx context.Context, nc *nats.Conn, cl *client.Client) error {
		t, err := findTicket(ctx, nc, cl, runID, corr)
		if err != nil {
			return err
		}
		if t.Reason != events.WaitExternalResult {
			return wrongKind(*t, "a client tool's result", c.connFlags())
		}
		out, err := outputOf(*t, data, *blocks, *isError, cl.Limits())
		if err != nil {
			return err
		}
		if err := cl.ToolResult(ctx, *t, out); err != nil {
			return explain(ctx, err, "answering ticket "+corr)
		}
		return report(stdout, *asJSON, done{Done: "result", RunID: runID, CorrelationID: corr, CallID: t.CallID, ToolID: t.ToolID},
			"sent the result of call %s (tool %s) for ticket %s of run %s", t.CallID, t.ToolID, corr, runID)
	})
}

// cmdInput: toolbatch input RUN_ID CORRELATION_ID [TEXT] (stdin without TEXT)
func cmdInput(args []string, stdin io.Reader, stdout io.Writer) error {
	c := newCommon("input")
	asJSON := c.fs.Bool("json", false, "say what was done as one JSON object")
	pos, err := c.parse(args, "RUN_ID", "CORRELATION_ID", "[TEXT]")
	if err != nil {
		return err
	}
	runID, corr := pos[0], pos[1]
	if err := validRun("input", runID); err != nil {
		return err
	}
	if err := validCorrelation("input", corr); err != nil {
		return err
	}
	var text string
	if len(pos) == 3 {
		text = pos[2]
	} else {
		data, err := readAnswer("-", stdin)
		if err != nil {
			return err
		}
		text = string(data)
	}
	return c.withClient(func(ctx context.Context, nc *nats.Conn, cl *client.Client) error {
		t, err := findTicket(ctx, nc, cl, runID, corr)
		if err != nil {
			return err
		}
		if t.Reason != events.WaitDelegation {
			return wrongKind(*t, "a delegated agent's input", c.connFlags())
		}
		if err := cl.Input(ctx, *t, text); err != nil {
			return explain(ctx, err, "answering ticket "+corr)
		}
		return report(stdout, *asJSON, done{Done: "input", RunID: runID, CorrelationID: corr, CallID: t.CallID, ToolID: t.ToolID},
			"sent input to the delegated call %s (tool %s) for ticket %s of run %s", t.CallID, t.ToolID, corr, runID)
	})
}

// wrongKind is the error for a ticket answered with the wrong command: it
// names the command that answers it.
func wrongKind(t protocol.AwaitingOut, want, flags string) error {
	return failf("ticket %s of run %s waits for a %s, not for %s: answer it with %s", t.CorrelationID, t.RunID, t.Reason, want, answerHint(t, flags))
}

// done is what a command did, as --json prints it.
type done struct {
	Done          string `json:"done"`
	RunID         string `json:"run_id"`
	BatchID       string `json:"batch_id,omitempty"`
	CorrelationID string `json:"correlation_id,omitempty"`
	CallID        string `json:"call_id,omitempty"`
	ToolID        string `json:"tool_id,omitempty"`
}

// report says what a command did: one line, or one JSON object.
func report(stdout io.Writer, asJSON bool, d done, format string, args ...any) error {
	if asJSON {
		return writeJSON(stdout, d)
	}
	if _, err := fmt.Fprintln(stdout, strings.TrimSpace(fmt.Sprintf(format, args...))); err != nil {
		return failf("write output: %v", err)
	}
	return nil
}
