package events

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"unicode/utf8"

	"github.com/vmihailenco/msgpack/v5"
)

// BatchID returns the id of a run's batch at step.
func BatchID(runID string, step int64) string { return fmt.Sprintf("%s/%d", runID, step) }

// OperationID returns <run_id>/<step>/<call_id>, the idempotency key every
// executor of the call receives, identical on every attempt.
func OperationID(batchID, callID string) string { return batchID + "/" + callID }

// ValidRunID reports whether id is a valid run_id (also the rule for
// tool_id): 1 to 64 of A-Z, a-z, 0-9, _ and -.
func ValidRunID(id string) bool { return validID(id, 64) }

// ValidToolID reports whether id is a valid tool_id (also the rule for a
// catalog's builtin and pool names and a sandbox worker's tool, pool and
// MCP server ids).
func ValidToolID(id string) bool { return validID(id, 64) }

// ValidCallID reports whether id is a valid call_id (also the rule for
// thread_id, correlation_id and worker_id): 1 to 128 of the same.
func ValidCallID(id string) bool { return validID(id, 128) }

// validID reports whether id is 1 to limit characters of A-Z, a-z, 0-9, _
// and - (checked for every message: a loop, not a regexp).
func validID(id string, limit int) bool { return len(id) <= limit && IDToken(id) }

// IDToken reports whether s is one or more of A-Z, a-z, 0-9, _ and -: the
// characters of every id, and of each token of a subject prefix.
func IDToken(s string) bool {
	if len(s) == 0 {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

// decodeGeneric decodes a body into a generic value.
func decodeGeneric(body []byte, isJSON bool) (v any, err error) {
	if isJSON {
		v, err = jsonToValue(body)
		if err != nil {
			return nil, undecodablef("body is not valid JSON: %v", err)
		}
		return v, nil
	}
	defer func() {
		if r := recover(); r != nil {
			v, err = nil, undecodablef("body is not valid msgpack: %v", r)
		}
	}()
	if err := checkShape(body); err != nil {
		return nil, undecodablef("body is not valid msgpack: %v", err)
	}
	rd := bytes.NewReader(body)
	v, err = decodeValue(msgpack.NewDecoder(rd), 0)
	if err != nil {
		return nil, undecodablef("body is not valid msgpack: %v", err)
	}
	if rd.Len() != 0 {
		return nil, undecodablef("body has %d trailing bytes", rd.Len())
	}
	return v, nil
}

// ResultKind is the kind of a resume's result.
type ResultKind string

// Resume result kinds.
const (
	ResultPermission ResultKind = "permission" // permission and scheduled tickets
	ResultToolResult ResultKind = "tool_result"
	ResultInput      ResultKind = "input" // delegation only
)

// ResumeResult is what a resume answers: a permission, a client's tool
// result, or input for a delegated child.
type ResumeResult struct {
	Kind   ResultKind
	Allow  bool    // permission
	Note   string  // permission: a note on approval
	Reason string  // permission: a reason on denial
	Output *Output // tool_result
	Text   string  // input
}

func (r ResumeResult) fields() []field {
	switch r.Kind {
	case ResultPermission:
		fs := []field{{"kind", string(r.Kind)}, {"allow", r.Allow}}
		if r.Note != "" {
			fs = append(fs, field{"note", r.Note})
		}
		if r.Reason != "" {
			fs = append(fs, field{"reason", r.Reason})
		}
		return fs
	case ResultToolResult:
		return []field{{"kind", string(r.Kind)}, {"output", r.Output}}
	default:
		return []field{{"kind", string(r.Kind)}, {"text", r.Text}}
	}
}

// EncodeMsgpack implements msgpack.CustomEncoder.
func (r ResumeResult) EncodeMsgpack(enc *msgpack.Encoder) error { return encodeFields(enc, r.fields()) }

// DecodeMsgpack implements msgpack.CustomDecoder.
func (r *ResumeResult) DecodeMsgpack(dec *msgpack.Decoder) error {
	v, err := decodeValue(dec, 0)
	if err != nil {
		return err
	}
	res, err := parseResumeResult(v, "result")
	if err != nil {
		return err
	}
	*r = res
	return nil
}

// MarshalJSON implements json.Marshaler.
func (r ResumeResult) MarshalJSON() ([]byte, error) { return marshalFields(r.fields()) }

func parseResumeResult(v any, path string) (ResumeResult, error) {
	m, err := object(v, path)
	if err != nil {
		return ResumeResult{}, err
	}
	kind, err := str(m, "kind", path, true)
	if err != nil {
		return ResumeResult{}, err
	}
	r := ResumeResult{Kind: ResultKind(kind)}
	switch r.Kind {
	case ResultPermission:
		if err := only(m, path, "kind", "allow", "note", "reason"); err != nil {
			return r, err
		}
		if b, ok := m["allow"].(bool); !ok {
			return r, undecodablef("%s.allow: want true or false", path)
		} else {
			r.Allow = b
		}
		if r.Allow, err = boolean(m, "allow", path); err != nil {
			return r, err
		}
		if r.Note, err = str(m, "note", path, false); err != nil {
			return r, err
		}
		r.Reason, err = str(m, "reason", path, false)
	case ResultToolResult:
		if err := only(m, path, "kind", "output"); err != nil {
			return r, err
		}
		var o Output
		o, err = parseOutput(m["output"], path+".output")
		r.Output = &o
	case ResultInput:
		if err := only(m, path, "kind", "text"); err != nil {
			return r, err
		}
		r.Text, err = str(m, "text", path, true)
	default:
		return r, undecodablef("%s.kind: %q is not permission, tool_result or input", path, kind)
	}
	return r, err
}

func parseOutput(v any, path string) (Output, error) {
	m, err := object(v, path)
	if err != nil {
		return Output{}, err
	}
	if err := only(m, path, "call_id", "content", "is_error", "state"); err != nil {
		return Output{}, err
	}
	var o Output
	if o.CallID, err = str(m, "call_id", path, true); err != nil {
		return o, err
	}
	if o.Content, err = parseBlocks(m["content"], path+".content"); err != nil {
		return o, err
	}
	if o.IsError, err = boolean(m, "is_error", path); err != nil {
		return o, err
	}
	if st, ok := m["state"]; ok && st != nil {
		arr, ok := st.([]any)
		if !ok {
			return o, undecodablef("%s.state: want an array of commands, got %s", path, kindOf(st))
		}
		for i, e := range arr {
			c, err := parseCommand(e, fmt.Sprintf("%s.state[%d]", path, i))
			if err != nil {
				return o, err
			}
			o.State = append(o.State, c)
		}
	}
	return o, nil
}

func parseCommand(v any, path string) (Command, error) {
	m, err := object(v, path)
	if err != nil {
		return Command{}, err
	}
	if err := only(m, path, "scope", "key", "merge", "action", "value"); err != nil {
		return Command{}, err
	}
	var c Command
	var s string
	if s, err = str(m, "scope", path, true); err != nil {
		return c, err
	}
	c.Scope = Scope(s)
	if c.Key, err = str(m, "key", path, true); err != nil {
		return c, err
	}
	if s, err = str(m, "merge", path, true); err != nil {
		return c, err
	}
	c.Merge = Merge(s)
	if s, err = str(m, "action", path, true); err != nil {
		return c, err
	}
	c.Action = Action(s)
	if c.Action == ActionSet {
		if c.Value, err = valueToJSON(m["value"]); err != nil {
			return c, undecodablef("%s.value: %v", path, err)
		}
	}
	return c, c.Validate()
}

// Validate checks a staged command's enumerations and key.
func (c Command) Validate() error {
	switch c.Scope {
	case ScopeRun, ScopeThread, ScopeShared:
	default:
		return undecodablef("command scope %q is not run, thread or shared", c.Scope)
	}
	switch c.Merge {
	case MergeDisjoint, MergeCommutative, MergeExclusive:
	default:
		return undecodablef("command merge %q is not disjoint, commutative or exclusive", c.Merge)
	}
	switch c.Action {
	case ActionSet, ActionRemove:
	default:
		return undecodablef("command action %q is not set or remove", c.Action)
	}
	if c.Key == "" || len(c.Key) > 256 {
		return undecodablef("command key must be 1 to 256 bytes")
	}
	return nil
}

// OutputSize returns the size of an output as canonical JSON, the measure
// of the output limit.
func OutputSize(o Output) int {
	if n, ok := textOutputSize(o); ok {
		return n
	}
	return encodedOutputSize(o)
}

// encodedOutputSize is OutputSize measured by encoding the output.
func encodedOutputSize(o Output) int {
	var n byteCount
	enc := json.NewEncoder(&n)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(o); err != nil {
		return math.MaxInt // what cannot be measured does not fit
	}
	return int(n) - 1 // the encoder's newline
}

// textOutputSize is OutputSize counted without encoding, for the common
// output of text blocks only (no staged commands, no keys beside a
// block's type and text) whose strings are valid UTF-8 without a
// backspace or form feed (whose escapes have changed between Go
// releases); ok is false for any other output. Every output is measured
// when a run's state takes it (aggregate.Call.OutputBytes), and the
// replay audit folds every output of the log, so this is on the engine's
// and the audit's paths.
func textOutputSize(o Output) (n int, ok bool) {
	if len(o.State) > 0 {
		return 0, false
	}
	n = textLayout.head
	if n, ok = addJSONString(n, o.CallID); !ok {
		return 0, false
	}
	if o.IsError {
		n += len("true")
	} else {
		n += len("false")
	}
	if o.Content == nil {
		return n + textLayout.noContent, true
	}
	n += len("[]") + max(len(o.Content)-1, 0) // brackets and commas
	for _, b := range o.Content {
		if b.Type != BlockText || len(b.Extra) > 0 {
			return 0, false
		}
		if n, ok = addJSONString(n+textLayout.block, b.Text); !ok {
			return 0, false
		}
	}
	return n, true
}

// textLayout is the fixed part of a text output's JSON, measured once by
// encoding, so that textOutputSize follows how Output and a text block
// encode: the output's keys and punctuation (head), a text block's keys
// and punctuation (block), and an absent content (noContent).
var textLayout = func() (l struct{ head, block, noContent int }) {
	empty := encodedOutputSize(Output{Content: []ContentBlock{}}) // {"call_id":"","content":[],"is_error":false}
	l.head = empty - len(`""[]false`)
	l.block = encodedOutputSize(Output{Content: []ContentBlock{{Type: BlockText}}}) - empty - len(`""`)
	l.noContent = encodedOutputSize(Output{}) - l.head - len(`""false`)
	return l
}()

// addJSONString adds to n the length of s as a JSON string written by
// encoding/json without HTML escaping; ok is false when s holds invalid
// UTF-8, a backspace or a form feed.
func addJSONString(n int, s string) (int, bool) {
	n += 2 // the quotes
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\' || c == '\n' || c == '\r' || c == '\t':
				n += 2
			case c == '\b' || c == '\f':
				return 0, false
			case c < 0x20:
				n += len(`\u0000`)
			default:
				n++
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			return 0, false
		case r == '\u2028' || r == '\u2029':
			n += len(`\u2028`)
		default:
			n += size
		}
		i += size
	}
	return n, true
}

// byteCount is a writer that counts what it is given.
type byteCount int

func (c *byteCount) Write(p []byte) (int, error) {
	*c += byteCount(len(p))
	return len(p), nil
}

// CheckBlocks checks that every content block has a known type (the msgpack
// library decodes a nil block as a zero block without asking the block's own
// decoder) and every staged command is valid.
func (o Output) CheckBlocks() error {
	for i, c := range o.State {
		if err := c.Validate(); err != nil {
			return fmt.Errorf("state[%d]: %w", i, err)
		}
	}
	return CheckBlocks(o.Content)
}

// CheckBlocks checks that every block has a known type.
func CheckBlocks(bs []ContentBlock) error {
	for i, b := range bs {
		switch b.Type {
		case BlockText, BlockToolUse, BlockJSON:
		case BlockImage:
			if b.Source == nil {
				return fmt.Errorf("%w: content[%d]: image without a source", ErrMalformed, i)
			}
		case BlockToolResult:
			if err := CheckBlocks(b.Content); err != nil {
				return err
			}
		case "":
			return fmt.Errorf("%w: content[%d]: a block without a type", ErrMalformed, i)
		}
		if err := checkExtra(b); err != nil {
			return fmt.Errorf("%w: content[%d]: %v", ErrMalformed, i, err)
		}
	}
	return nil
}

// checkExtra checks that a block's uninterpreted keys are a JSON object
// whose keys are not the type's own or, in a call, forbidden.
func checkExtra(b ContentBlock) error {
	if len(b.Extra) == 0 {
		return nil
	}
	v, err := jsonToValue(b.Extra)
	if err != nil {
		return err
	}
	m, ok := v.(map[string]any)
	if !ok {
		return fmt.Errorf("extra keys must be a JSON object, got %s", kindOf(v))
	}
	for k := range m {
		if keyOf(b.Type, k) != keyFree {
			return fmt.Errorf("extra key %q is not free in a %s block", k, b.Type)
		}
	}
	return nil
}
