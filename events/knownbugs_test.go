package events_test

import (
	"bytes"
	"encoding/json"
	"os"
	"reflect"
	"testing"

	"github.com/toolbatch/toolbatch/events"
	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Known bugs in the non-test code of package events, found by the tests in
// this package. Each has a detector below. An input that fails a property
// only because of a known bug skips its test with a "KNOWN BUG" message, so
// that the suite stays green while the bug is open and the input stays in
// the corpus (testdata/fuzz) as a regression case.
//
// Run with EVENTS_KNOWN_BUGS=fail to make them fail instead (to check a fix).
// When a bug is fixed, delete its detector and its uses.
//
//   - bugHugeArray: events.Unmarshal (so DecodeCommit, DecodeEvent,
//     DecodeResult) allocates the full declared length of a msgpack array
//     before reading its elements when decoding into a Go slice. A 5-byte
//     body dd ff ff ff ff asks for 2^32-1 elements: DecodeCommit tries to
//     allocate 206 GB and the process dies with "fatal error: out of memory",
//     which recover() cannot catch. Cause: msgpack v5.4.1 decode_slice.go
//     computes noLimit as d.flags&disableAllocLimitFlag != 1, which is always
//     true. The input is refused without crashing only when the declared
//     length is at most the bytes left.
//   - bugNilBlock: a msgpack nil where a content block is expected decodes,
//     through Unmarshal, as a zero ContentBlock (the msgpack library handles
//     nil itself and never calls ContentBlock.DecodeMsgpack). The zero block
//     encodes as {"type":""}, which no decoder accepts. DecodeResult accepts
//     {"output":{"content":[nil]}}; the CallCompleted built from it encodes,
//     and DecodeCommit then refuses the committed event.
//   - bugRawJSONNotCanonical: RawJSON decoded from msgpack is not always in
//     canonical form: valueToJSON writes a float -0.0 as -0 (CanonicalJSON
//     gives 0) and invalid UTF-8 in strings or keys as \ufffd escapes
//     (CanonicalJSON writes the character), and two keys that differ only in
//     invalid bytes become duplicate keys. Decoding the re-encoded value then
//     gives a different RawJSON.
//   - bugPerformEmptyCorrelation: DecodeControl accepts perform with
//     "correlation_id": "" or null (it checks only that the key is present).
//     The decoded Control re-encodes without correlation_id (omitempty), and
//     DecodeControl refuses that.
//   - bugTrailingCloser: CanonicalJSON (and every JSON decode built on it,
//     DecodeSubmit/DecodeResume/DecodeControl with isJSON) accepts a value
//     followed by a stray ] or }, e.g. "1 ]" or `{"a":1}}`: jsonToValue
//     checks dec.More(), which is false before ] and }, and then treats
//     dec.Token()'s error as "no more data".

// knownBugsFail reports whether known bugs fail tests instead of skipping.
var knownBugsFail = os.Getenv("EVENTS_KNOWN_BUGS") == "fail"

// knownBug skips t, or fails it with EVENTS_KNOWN_BUGS=fail.
func knownBug(t testing.TB, bug, format string, args ...any) {
	t.Helper()
	format = "KNOWN BUG " + bug + " (see knownbugs_test.go): " + format
	if knownBugsFail {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}

// bugHugeArray reports whether b holds a msgpack array that declares more
// elements than there are bytes left: decoding it into a Go slice through
// Unmarshal would allocate the declared length.
func bugHugeArray(b []byte) bool {
	r := bytes.NewReader(b)
	dec := msgpack.NewDecoder(r)
	// Walk the values in order without recursion; each step reads at least
	// one byte, so the walk ends.
	for pending := 1; pending > 0; pending-- {
		c, err := dec.PeekCode()
		if err != nil {
			return false
		}
		switch {
		case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
			n, err := dec.DecodeArrayLen()
			if err != nil {
				return false
			}
			if n > r.Len() {
				return true
			}
			pending += n
		case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
			n, err := dec.DecodeMapLen()
			if err != nil {
				return false
			}
			pending += 2 * n
		default:
			if err := dec.Skip(); err != nil {
				return false
			}
		}
	}
	return false
}

var (
	contentBlockType = reflect.TypeOf(events.ContentBlock{})
	rawType          = reflect.TypeOf(events.RawJSON(nil))
)

// walk calls fn on every value reachable from v.
func walk(v reflect.Value, fn func(reflect.Value)) {
	if !v.IsValid() {
		return
	}
	fn(v)
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			walk(v.Elem(), fn)
		}
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			if v.Type().Field(i).IsExported() {
				walk(v.Field(i), fn)
			}
		}
	case reflect.Slice, reflect.Array:
		if v.Type() == rawType {
			return
		}
		for i := 0; i < v.Len(); i++ {
			walk(v.Index(i), fn)
		}
	case reflect.Map:
		iter := v.MapRange()
		for iter.Next() {
			walk(iter.Value(), fn)
		}
	}
}

// knownBugIn returns the known bug that explains a failed round trip of the
// decoded value v, or "".
func knownBugIn(v any) string {
	bug := ""
	walk(reflect.ValueOf(v), func(x reflect.Value) {
		if bug != "" {
			return
		}
		switch x.Type() {
		case contentBlockType:
			if x.Interface().(events.ContentBlock).Type == "" {
				bug = "bugNilBlock"
			}
		case rawType:
			r := x.Interface().(events.RawJSON)
			if len(r) == 0 {
				return
			}
			if c, err := events.CanonicalJSON(r); err != nil || !bytes.Equal(c, r) {
				bug = "bugRawJSONNotCanonical"
			}
		}
	})
	if bug != "" {
		return bug
	}
	if c, ok := v.(*events.Control); ok && c.Action == events.ControlPerform && c.CorrelationID == "" {
		return "bugPerformEmptyCorrelation"
	}
	return ""
}

// failUnlessKnown fails t, or skips it when a known bug in the decoded value
// v explains the failure.
func failUnlessKnown(t *testing.T, v any, format string, args ...any) {
	t.Helper()
	if bug := knownBugIn(v); bug != "" {
		knownBug(t, bug, format, args...)
	}
	t.Fatalf(format, args...)
}

// bugTrailingCloser reports whether b is one JSON value followed by a stray
// ] or } (and anything after it).
func bugTrailingCloser(b []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(b))
	var v any
	if err := dec.Decode(&v); err != nil {
		return false
	}
	rest := bytes.TrimLeft(b[dec.InputOffset():], " \t\r\n")
	return len(rest) > 0 && (rest[0] == ']' || rest[0] == '}')
}
