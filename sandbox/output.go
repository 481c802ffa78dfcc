package sandbox

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"

	"github.com/toolbatch/toolbatch/events"
)

// interpret turns what a subprocess run left behind into the call's
// result. The order matters: a tool killed for its output, its timeout or
// the caller's cancellation is reported as such, whatever its exit status.
func interpret(t ToolConfig, call Call, o outcome) Result {
	switch {
	case o.startErr != nil:
		return failure(events.ErrorExecution, "cannot start the tool: %v", o.startErr)
	case o.stdoutOver:
		return failure(events.ErrorExecution, "output exceeded %d KiB (limits.output_kb); the tool was killed", t.Limits.OutputKB).as(ExitLimit)
	case o.timedOut:
		return failure(events.ErrorExecution, "timed out after %s", t.Timeout).as(ExitTimeout)
	case o.cancelled != nil:
		return failure(events.ErrorExecution, "interrupted: %v", o.cancelled).as(ExitKilled)
	}
	code := exitCode(o.state)
	if o.exit != nil {
		code = waitCode(*o.exit)
	}
	if code == mcpNotDispatched && t.MCP != nil {
		// Nothing reached the server's tool: the attempt may be made again.
		return failure(events.ErrorUnavailableBeforeDispatch, "%s", exitMessage(t, code, o.stderr, o.stderrCut))
	}
	if code != 0 {
		return failure(events.ErrorExecution, "%s", exitMessage(t, code, o.stderr, o.stderrCut)).as(exitClass(code))
	}
	if t.MCP != nil {
		out, err := decodeOutput(o.stdout, false)
		if err != nil {
			return failure(events.ErrorExecution, "the MCP result could not be read: %v", err)
		}
		out.CallID = call.CallID
		return success(out)
	}
	if t.Output == OutputJSON {
		out, err := decodeToolOutput(o.stdout)
		if err != nil {
			return failure(events.ErrorExecution, "malformed JSON output: %v (stdout must be one ToolOutput object {\"content\": [...], \"is_error\": false, \"state\": [...]})", err)
		}
		out.CallID = call.CallID
		return success(out)
	}
	if len(o.stdout) == 0 {
		return success(events.Output{CallID: call.CallID})
	}
	return success(events.TextOutput(call.CallID, strings.ToValidUTF8(string(o.stdout), "\uFFFD")))
}

// exitCode returns the exit status, with 128+N for a process killed by
// signal N (as a shell and bubblewrap report it).
func exitCode(st *os.ProcessState) int {
	if st == nil {
		return -1
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok {
		return waitCode(ws)
	}
	return st.ExitCode()
}

// waitCode is exitCode for a wait status.
func waitCode(ws syscall.WaitStatus) int {
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// exitMessage says how a tool failed, with the tail of its stderr.
func exitMessage(t ToolConfig, code int, stderr []byte, cut bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "exit status %d", code)
	if code > 128 && code <= 128+64 {
		sig := syscall.Signal(code - 128)
		fmt.Fprintf(&b, " (signal %d: %s", int(sig), sig)
		switch sig {
		case syscall.SIGXCPU:
			fmt.Fprintf(&b, "; limits.cpu_seconds is %d", t.Limits.CPUSeconds)
		case syscall.SIGXFSZ:
			fmt.Fprintf(&b, "; no file may exceed %d bytes", max(int64(t.Limits.OutputKB)<<10, int64(t.Limits.MemoryMB)<<20))
		}
		b.WriteString(")")
	}
	tail := strings.TrimSpace(strings.ToValidUTF8(string(stderr), "\uFFFD"))
	switch {
	case tail == "":
		b.WriteString("; stderr is empty")
	case cut:
		fmt.Fprintf(&b, "; the last %d bytes of stderr:\n...%s", StderrTailBytes, tail)
	default:
		fmt.Fprintf(&b, "; stderr:\n%s", tail)
	}
	return b.String()
}

// toolOutput is the JSON object a tool with output json writes: a
// ToolOutput without its call id, which the worker sets.
type toolOutput struct {
	Content []events.ContentBlock `json:"content"`
	IsError bool                  `json:"is_error"`
	State   []events.Command      `json:"state"`
}

// decodeToolOutput decodes stdout strictly as one ToolOutput object.
func decodeToolOutput(stdout []byte) (events.Output, error) { return decodeOutput(stdout, true) }

// decodeOutput decodes stdout as one ToolOutput object; strict holds its
// blocks to the types the engine interprets (an MCP result's other kinds,
// audio or resource links, are kept as they are).
func decodeOutput(stdout []byte, strict bool) (events.Output, error) {
	trimmed := bytes.TrimSpace(stdout)
	switch {
	case len(trimmed) == 0:
		return events.Output{}, errors.New("stdout is empty")
	case trimmed[0] != '{':
		return events.Output{}, errors.New("stdout is not a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	dec.DisallowUnknownFields()
	var to toolOutput
	if err := dec.Decode(&to); err != nil {
		return events.Output{}, cleanJSONError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return events.Output{}, errors.New("more than one JSON value on stdout")
	}
	if strict {
		if err := events.StrictBlocks(to.Content); err != nil {
			return events.Output{}, err
		}
	}
	for i, c := range to.State {
		if err := c.Validate(); err != nil {
			return events.Output{}, fmt.Errorf("state[%d]: %v", i, cleanJSONError(err))
		}
	}
	return events.Output{Content: to.Content, IsError: to.IsError, State: to.State}, nil
}

// cleanJSONError drops the prefixes of the decoders' messages.
func cleanJSONError(err error) error {
	var r *events.Refusal
	if errors.As(err, &r) {
		return errors.New(r.Reason)
	}
	return errors.New(strings.TrimPrefix(err.Error(), "json: "))
}

// exitClass says what a non-zero exit status means: a signal the rlimits
// send (CPU time, file size) is a limit, another signal a kill.
func exitClass(code int) string {
	if code <= 128 || code > 128+64 {
		return ExitError
	}
	switch syscall.Signal(code - 128) {
	case syscall.SIGXCPU, syscall.SIGXFSZ:
		return ExitLimit
	}
	return ExitKilled
}
