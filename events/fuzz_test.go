package events_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/protocol"
)

// Fuzz targets for every decoder. Each is seeded with the golden fixtures
// and hostile edge cases; plain `go test` runs the seeds (and any corpus
// entries under testdata/fuzz). The properties: no input panics, and a
// value that decodes re-encodes to something that decodes to an equal value.
//
// Run one for real with:
//
//	go test ./events -run '^$' -fuzz '^FuzzDecodeCommit$' -fuzztime 20s

// goldenSeeds returns the golden fixtures in testdata/golden/<sub> whose
// names have the given suffix.
func goldenSeeds(f *testing.F, sub, suffix string) [][]byte {
	f.Helper()
	dir := filepath.Join(goldenDir, sub)
	entries, err := os.ReadDir(dir)
	if err != nil {
		f.Fatalf("read golden fixtures: %v", err)
	}
	var out [][]byte
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), suffix) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			f.Fatalf("read golden fixture: %v", err)
		}
		out = append(out, b)
	}
	if len(out) == 0 {
		f.Fatalf("no golden fixtures %s*%s: run go test ./events -run '^TestGolden' -update", dir, suffix)
	}
	return out
}

// hostileMsgpack returns edge cases around a valid msgpack encoding.
func hostileMsgpack(valid []byte) [][]byte {
	return [][]byte{
		{},                                // empty
		valid[:len(valid)/2],              // truncated
		append(bytes.Clone(valid), 0),     // trailing byte
		bytes.Repeat([]byte{0x91}, 10000), // arrays nested 10000 deep, never closed
		append(bytes.Repeat([]byte{0x91}, 100), 0xc0), // arrays nested 100 deep
		{0x81, 0x01, 0x02},                            // a map with an integer key
		{0x91, 0x81, 0x01, 0x02},                      // the same in an array
		{0x81, 0xc0, 0x02},                            // a map with a nil key
		{0xdd, 0xff, 0xff, 0xff, 0xff},                // array32 of 2^32-1 elements
		{0xdf, 0xff, 0xff, 0xff, 0xff},                // map32 of 2^32-1 pairs
		{0xdb, 0xff, 0xff, 0xff, 0xff},                // str32 of 2^32-1 bytes
		{0xc6, 0xff, 0xff, 0xff, 0xff},                // bin32 of 2^32-1 bytes
		{0xc9, 0xff, 0xff, 0xff, 0xff, 0xff},          // ext32 of 2^32-1 bytes
		{0x91, 0x91, 0xc0},                            // nils where maps belong
		{0xc1},                                        // the never-used code
		{0xcb, 0x80, 0, 0, 0, 0, 0, 0, 0},             // float64 -0.0
		{0xd6, 0xff, 0xff, 0xff, 0xff, 0xff},          // timestamp ext
		{0xc7, 0x0c, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0xff, // timestamp96, huge seconds
			0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
	}
}

// hostileJSON returns JSON edge cases.
func hostileJSON() [][]byte {
	return [][]byte{
		{},
		[]byte("null"),
		[]byte("[]"),
		[]byte("{"),
		[]byte(strings.Repeat("[", 10000)),
		[]byte(strings.Repeat("[", 65) + "1" + strings.Repeat("]", 65)),
		[]byte(`{"a":1}}`),
		[]byte(`1 ]`),
		[]byte(`{"a":1,"a":2}`),
		[]byte(`{"x":-0.0,"y":1.0,"z":1e400}`),
		[]byte(`{"big":18446744073709551616,"f":9007199254740993.0}`),
		[]byte("\"\xff\xfe\""),
		[]byte(`"<&>\u2028"`),
		[]byte("{}\v"),
		[]byte("{}\u00a0"),
	}
}

// checkRefusal fails unless err is a *events.Refusal with one of codes.
func checkRefusal(t *testing.T, err error, codes ...events.Code) {
	t.Helper()
	code, ok := events.CodeOf(err)
	if !ok {
		t.Fatalf("error is not a *events.Refusal: %T %v", err, err)
	}
	for _, c := range codes {
		if code == c {
			return
		}
	}
	t.Fatalf("refusal code %q is not one of %q: %v", code, codes, err)
}

func FuzzDecodeCommit(f *testing.F) {
	seeds := goldenSeeds(f, "events", ".msgpack")
	var all []events.Event
	for _, typ := range events.Types() {
		all = append(all, eventSamples()[typ].event)
	}
	multi, _, err := events.EncodeCommit(all)
	if err != nil {
		f.Fatalf("encode all samples: %v", err)
	}
	seeds = append(seeds, multi, nilBlockCommit(f))
	seeds = append(seeds, hostileMsgpack(multi)...)
	for _, s := range seeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		evs, err := events.DecodeCommit(b, nil)
		if err != nil {
			if evs != nil {
				t.Fatalf("DecodeCommit returned events and an error: %v", err)
			}
			return
		}
		b1, types1, err := events.EncodeCommit(evs)
		if err != nil {
			t.Fatalf("a decoded commit does not encode: %v", err)
		}
		evs2, err := events.DecodeCommit(b1, types1)
		if err != nil {
			t.Fatalf("a re-encoded commit does not decode: %v", err)
		}
		if !reflect.DeepEqual(evs, evs2) {
			t.Fatalf("round trip changed the events\n first: %s\nsecond: %s", show(evs), show(evs2))
		}
		b2, _, err := events.EncodeCommit(evs2)
		if err != nil {
			t.Fatalf("second encode: %v", err)
		}
		if !bytes.Equal(b1, b2) {
			t.Fatalf("%s", diffBytes("encoding is not stable across two rounds", b2, b1))
		}
	})
}

// addBoth seeds f with each input as msgpack and as JSON.
func addBoth(f *testing.F, msgpackSeeds, jsonSeeds [][]byte) {
	for _, s := range msgpackSeeds {
		f.Add(s, false)
	}
	for _, s := range jsonSeeds {
		f.Add(s, true)
	}
	f.Add([]byte{}, false)
	f.Add([]byte{}, true)
}

// wireSeeds returns the msgpack and JSON fixtures of the named wire
// messages, with edge cases.
func wireSeeds(f *testing.F, names ...string) (mp, js [][]byte) {
	f.Helper()
	for _, name := range names {
		b, err := os.ReadFile(wireFixturePath(name, "msgpack"))
		if err != nil {
			f.Fatalf("read golden fixture: %v", err)
		}
		mp = append(mp, b)
		mp = append(mp, hostileMsgpack(b)...)
		j, err := os.ReadFile(wireFixturePath(name, "json"))
		if err != nil {
			f.Fatalf("read golden fixture: %v", err)
		}
		js = append(js, j, j[:len(j)/2], append(bytes.Clone(j), '}'))
	}
	js = append(js, hostileJSON()...)
	return mp, js
}

// roundTrips checks that v, which decode read from the wire, decodes to an
// equal value again from its msgpack encoding and, when it came as JSON,
// from its JSON encoding; it returns what the msgpack encoding decoded to.
func roundTrips[T any](t *testing.T, what string, v T, isJSON bool, decode func(b []byte, isJSON bool) (T, error)) T {
	t.Helper()
	enc, err := events.Marshal(v)
	if err != nil {
		t.Fatalf("a decoded %s does not encode: %v", what, err)
	}
	v2, err := decode(enc, false)
	if err != nil {
		t.Fatalf("a re-encoded %s does not decode: %v", what, err)
	}
	if !reflect.DeepEqual(v, v2) {
		t.Fatalf("msgpack round trip changed the %s\n first: %s\nsecond: %s", what, show(v), show(v2))
	}
	if !isJSON {
		return v2
	}
	j, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("a decoded %s does not encode as JSON: %v", what, err)
	}
	v3, err := decode(j, true)
	if err != nil {
		t.Fatalf("a re-encoded JSON %s does not decode: %v\n%s", what, err, j)
	}
	if !reflect.DeepEqual(v, v3) {
		t.Fatalf("JSON round trip changed the %s\n first: %s\nsecond: %s", what, show(v), show(v3))
	}
	return v2
}

func FuzzDecodeSubmit(f *testing.F) {
	mp, js := wireSeeds(f, "submit")
	addBoth(f, mp, js)
	lim := events.DefaultLimits()
	f.Fuzz(func(t *testing.T, b []byte, isJSON bool) {
		s, err := protocol.DecodeSubmit(b, isJSON, lim)
		if err != nil {
			if s != nil && s.Validate(lim) == nil {
				t.Fatalf("DecodeSubmit returned a valid submission with an error: %v", err)
			}
			checkRefusal(t, err, events.CodeUndecodable, events.CodeForbiddenField, events.CodeInvalidID,
				events.CodeLimitExceeded, events.CodeDuplicateCallID)
			return
		}
		if isJSON {
			checkValidJSON(t, b)
		}
		if err := s.Validate(lim); err != nil {
			t.Fatalf("a decoded submission does not validate: %v", err)
		}
		digest := s.Digest()
		s2 := roundTrips(t, "submission", s, isJSON, func(b []byte, isJSON bool) (*protocol.Submit, error) {
			return protocol.DecodeSubmit(b, isJSON, lim)
		})
		if d := s2.Digest(); d != digest {
			t.Fatalf("digest changed in a round trip: %s, then %s", digest, d)
		}
	})
}

func FuzzDecodeResume(f *testing.F) {
	mp, js := wireSeeds(f, "resume_permission", "resume_tool_result", "resume_input")
	addBoth(f, mp, js)
	lim := events.DefaultLimits()
	f.Fuzz(func(t *testing.T, b []byte, isJSON bool) {
		r, err := protocol.DecodeResume(b, isJSON, lim)
		if err != nil {
			if r != nil {
				t.Fatalf("DecodeResume returned a resume and an error: %v", err)
			}
			checkRefusal(t, err, events.CodeUndecodable, events.CodeForbiddenField, events.CodeInvalidID, events.CodeLimitExceeded)
			return
		}
		if isJSON {
			checkValidJSON(t, b)
		}
		roundTrips(t, "resume", r, isJSON, func(b []byte, isJSON bool) (*protocol.Resume, error) {
			return protocol.DecodeResume(b, isJSON, lim)
		})
	})
}

func FuzzDecodeControl(f *testing.F) {
	mp, js := wireSeeds(f, "control")
	js = append(js, []byte(`{"action":"cancel"}`), []byte(`{"action":"interrupt","reason":"r"}`), []byte(`{"action":"perform"}`))
	addBoth(f, mp, js)
	f.Fuzz(func(t *testing.T, b []byte, isJSON bool) {
		c, err := protocol.DecodeControl(b, isJSON)
		if err != nil {
			if c != nil {
				t.Fatalf("DecodeControl returned a control and an error: %v", err)
			}
			checkRefusal(t, err, events.CodeUndecodable, events.CodeForbiddenField, events.CodeInvalidID)
			return
		}
		if isJSON {
			checkValidJSON(t, b)
		}
		roundTrips(t, "control", c, isJSON, protocol.DecodeControl)
	})
}

func FuzzDecodeResult(f *testing.F) {
	for _, name := range []string{"result_output", "result_error"} {
		b, err := os.ReadFile(wireFixturePath(name, "msgpack"))
		if err != nil {
			f.Fatalf("read golden fixture: %v", err)
		}
		f.Add(b)
		for _, h := range hostileMsgpack(b) {
			f.Add(h)
		}
	}
	lim := events.DefaultLimits()
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := protocol.DecodeResult(b, lim)
		if err != nil {
			if r != nil {
				t.Fatalf("DecodeResult returned a result and an error: %v", err)
			}
			if code, ok := events.CodeOf(err); ok && code == events.CodeLimitExceeded {
				return
			}
			if !errors.Is(err, events.ErrMalformed) && !errors.Is(err, protocol.ErrResultShape) {
				t.Fatalf("error is neither ErrMalformed, ErrResultShape nor limit_exceeded: %v", err)
			}
			return
		}
		enc, err := events.Marshal(r)
		if err != nil {
			t.Fatalf("a decoded result does not encode: %v", err)
		}
		r2, err := protocol.DecodeResult(enc, lim)
		if err != nil {
			t.Fatalf("a re-encoded result does not decode: %v", err)
		}
		if !reflect.DeepEqual(r, r2) {
			t.Fatalf("round trip changed the result\n first: %s\nsecond: %s", show(r), show(r2))
		}
		enc2, err := events.Marshal(r2)
		if err != nil {
			t.Fatalf("second encode: %v", err)
		}
		if !bytes.Equal(enc, enc2) {
			t.Fatalf("%s", diffBytes("encoding is not stable across two rounds", enc2, enc))
		}
	})
}

// FuzzUnmarshalWire decodes every input into each wire message that has no
// decoder of its own.
func FuzzUnmarshalWire(f *testing.F) {
	for _, s := range goldenSeeds(f, "wire", ".msgpack") {
		f.Add(s)
	}
	b, err := os.ReadFile(wireFixturePath("results_out", "msgpack"))
	if err != nil {
		f.Fatalf("read golden fixture: %v", err)
	}
	for _, h := range hostileMsgpack(b) {
		f.Add(h)
	}
	nilBlock, err := events.Marshal(map[string]any{"batch_id": "run_1/1", "results": []any{nil}})
	if err != nil {
		f.Fatalf("Marshal: %v", err)
	}
	f.Add(nilBlock)
	var kinds []wireFixture
	for _, fx := range wireFixtures() {
		if fx.decode == nil {
			kinds = append(kinds, fx)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, fx := range kinds {
			v := fx.newValue()
			if err := events.Unmarshal(b, v); err != nil {
				if !errors.Is(err, events.ErrMalformed) {
					t.Fatalf("%s: error is not ErrMalformed: %v", fx.name, err)
				}
				continue
			}
			enc, err := events.Marshal(v)
			if err != nil {
				t.Fatalf("%s: a decoded message does not encode: %v", fx.name, err)
			}
			v2 := fx.newValue()
			if err := events.Unmarshal(enc, v2); err != nil {
				t.Fatalf("%s: a re-encoded message does not decode: %v", fx.name, err)
			}
			if !reflect.DeepEqual(v, v2) {
				t.Fatalf("%s: round trip changed the message\n first: %s\nsecond: %s", fx.name, show(v), show(v2))
			}
			enc2, err := events.Marshal(v2)
			if err != nil {
				t.Fatalf("%s: second encode: %v", fx.name, err)
			}
			if !bytes.Equal(enc, enc2) {
				t.Fatalf("%s", diffBytes(fx.name+": encoding is not stable across two rounds", enc2, enc))
			}
		}
	})
}

func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range goldenSeeds(f, "wire", ".json") {
		f.Add(s)
	}
	f.Add([]byte(goldenValue))
	for _, s := range hostileJSON() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := events.CanonicalJSON(b)
		if err != nil {
			return
		}
		checkValidJSON(t, b)
		if len(c) == 0 {
			// The canonical form of null is the empty RawJSON.
			if string(bytes.Trim(b, " \t\r\n")) != "null" {
				t.Fatalf("CanonicalJSON(%q) is empty, but the input is not null", b)
			}
			return
		}
		if !json.Valid(c) {
			t.Fatalf("canonical form %q of %q is not valid JSON", c, b)
		}
		c2, err := events.CanonicalJSON(c)
		if err != nil {
			t.Fatalf("canonical form %q does not canonicalize: %v", c, err)
		}
		if !bytes.Equal(c, c2) {
			t.Fatalf("CanonicalJSON is not idempotent: %q, then %q", c, c2)
		}
		// The canonical form is the same JSON value.
		var in, out any
		if err := json.Unmarshal(b, &in); err != nil {
			t.Fatalf("encoding/json rejects %q: %v", b, err)
		}
		if err := json.Unmarshal(c, &out); err != nil {
			t.Fatalf("encoding/json rejects %q: %v", c, err)
		}
		if !reflect.DeepEqual(in, out) {
			t.Fatalf("canonical form %q of %q is another value", c, b)
		}
		// In msgpack a RawJSON is the native value; it comes back unchanged.
		enc, err := events.Marshal(c)
		if err != nil {
			t.Fatalf("RawJSON %q does not encode: %v", c, err)
		}
		var r events.RawJSON
		if err := events.Unmarshal(enc, &r); err != nil {
			t.Fatalf("RawJSON %q does not decode from msgpack: %v", c, err)
		}
		if !bytes.Equal(r, c) {
			t.Fatalf("RawJSON msgpack round trip: %q, then %q", c, r)
		}
	})
}
