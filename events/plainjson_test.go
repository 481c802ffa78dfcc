package events

import (
	"bytes"
	"math"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// generic is the reference: the JSON decodeValue and valueToJSON make of
// a msgpack value.
func generic(b []byte) (RawJSON, error) {
	dec := msgpack.NewDecoder(bytes.NewReader(b))
	v, err := decodeValue(dec, 0)
	if err != nil {
		return nil, err
	}
	if _, err := dec.PeekCode(); err == nil {
		return nil, ErrMalformed // trailing bytes
	}
	return valueToJSON(v)
}

// msgpackOf encodes with the library's own encoder, in the order given
// (maps as ordered key-value lists, so that unsorted and repeated keys can
// be written).
func msgpackOf(t testing.TB, write func(*msgpack.Encoder) error) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := write(msgpack.NewEncoder(&buf)); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func nested(depth int) []byte {
	return append(bytes.Repeat([]byte{0x91}, depth), 0x01) // [[[...1...]]]
}

// TestPlainJSONMatchesGeneric: the plain path answers for the values it
// is meant for, with the generic path's bytes, and leaves the others to
// it.
func TestPlainJSONMatchesGeneric(t *testing.T) {
	enc := func(v any) func(*msgpack.Encoder) error {
		return func(e *msgpack.Encoder) error { return encodeValue(e, v) }
	}
	mapOf := func(kv ...any) func(*msgpack.Encoder) error {
		return func(e *msgpack.Encoder) error {
			if err := e.EncodeMapLen(len(kv) / 2); err != nil {
				return err
			}
			for _, x := range kv {
				if err := e.Encode(x); err != nil {
					return err
				}
			}
			return nil
		}
	}
	long := strings.Repeat("x", 70000) // str32
	for _, tc := range []struct {
		name  string
		b     []byte
		plain bool
	}{
		{"small ints", msgpackOf(t, enc([]any{int64(0), int64(127), int64(-1), int64(-32)})), true},
		{"ints of every width", msgpackOf(t, enc([]any{int64(128), int64(-33), int64(300), int64(-300), int64(70000), int64(-70000),
			int64(math.MaxInt64), int64(math.MinInt64), uint64(math.MaxUint64)})), true},
		{"fixed-width codes", []byte{0x96, 0xcc, 0x05, 0xcd, 0x00, 0x05, 0xce, 0, 0, 0, 5, 0xd0, 0xfb, 0xd1, 0xff, 0xfb, 0xd2, 0xff, 0xff, 0xff, 0xfb}, true},
		{"int64 code", []byte{0xd3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfb}, true},
		{"uint64 code", []byte{0xcf, 0, 0, 0, 0, 0, 0, 0, 7}, true},
		{"null, booleans", msgpackOf(t, enc([]any{nil, true, false})), true},
		{"null alone", []byte{0xc0}, true},
		{"object", msgpackOf(t, enc(map[string]any{"path": "/tmp/a b", "n": int64(3), "deep": map[string]any{"list": []any{"é", "日本", ""}}})), true},
		{"empty object and array", msgpackOf(t, enc(map[string]any{"a": map[string]any{}, "b": []any{}})), true},
		{"html characters", msgpackOf(t, enc("<a href='x'>&amp;</a>")), true},
		{"long string", msgpackOf(t, enc(long)), true},
		{"str8 key", msgpackOf(t, enc(map[string]any{strings.Repeat("k", 40): int64(1)})), true},
		{"deepest", nested(maxDepth), true},
		{"too deep", nested(maxDepth + 1), false},
		{"float", msgpackOf(t, enc(1.5)), false},
		{"integral float", msgpackOf(t, enc([]any{2.0})), false},
		{"escaped string", msgpackOf(t, enc("a\"b\\c\nd\x01")), false},
		{"line separator", msgpackOf(t, enc("a\u2028b")), false},
		{"invalid UTF-8", msgpackOf(t, enc("a\xffb")), false},
		{"keys out of order", msgpackOf(t, mapOf("b", 1, "a", 2)), false},
		{"key repeated", msgpackOf(t, mapOf("a", 1, "a", 2)), false},
		{"integer key", msgpackOf(t, mapOf(1, 2)), false},
		{"escaped key", msgpackOf(t, mapOf("a\"", 1)), false},
		{"bin", msgpackOf(t, func(e *msgpack.Encoder) error { return e.EncodeBytes([]byte{1, 2}) }), false},
		{"truncated", []byte{0x92, 0x01}, false},
		{"truncated string", []byte{0xd9, 0x05, 'a'}, false},
		{"declared longer than its bytes", []byte{0xdd, 0xff, 0xff, 0xff, 0xff}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, ok := plainMsgpackJSON(tc.b)
			if ok != tc.plain {
				t.Fatalf("plain path answered %v, want %v", ok, tc.plain)
			}
			want, err := generic(tc.b)
			if !ok {
				return // the generic path's, whatever it is
			}
			if err != nil {
				t.Fatalf("the plain path wrote %s where the generic one fails: %v", out, err)
			}
			if !bytes.Equal(out, want) {
				t.Fatalf("plain %s\ngeneric %s", out, want)
			}
			// and through the decoder, as RawJSON is decoded
			var r RawJSON
			if err := msgpack.Unmarshal(tc.b, &r); err != nil || !bytes.Equal(r, want) {
				t.Fatalf("RawJSON decoded %s (%v), want %s", r, err, want)
			}
		})
	}
}

// TestRawJSONDecodesAsBefore: through RawJSON's decoder, every value
// decodes as the generic path alone decoded it, the plain ones and the
// others, and a null is no value.
func TestRawJSONDecodesAsBefore(t *testing.T) {
	for _, js := range []string{`{"a":1,"b":[true,null,"x"]}`, `{"b":1,"a":2}`, `{"f":1.25,"s":"a\nb"}`, `[1e300,-0.5]`, `"\u2028"`, `{}`, `null`} {
		var in RawJSON = RawJSON(js)
		b, err := msgpack.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		want, werr := generic(b)
		var got RawJSON
		err = msgpack.Unmarshal(b, &got)
		if (err != nil) != (werr != nil) || !bytes.Equal(got, want) {
			t.Errorf("%s: decoded %q (%v), the generic path %q (%v)", js, got, err, want, werr)
		}
		if js == "null" && got != nil {
			t.Errorf("null decoded as %q, want no value", got)
		}
	}
}

// FuzzPlainMsgpack: wherever the plain path answers, the generic path
// succeeds with the same bytes.
func FuzzPlainMsgpack(f *testing.F) {
	for _, v := range []any{
		map[string]any{"a": int64(1), "b": []any{"x", nil, true, int64(-5)}},
		[]any{uint64(math.MaxUint64), int64(math.MinInt64), "é\u2028", 0.5},
		map[string]any{"k": map[string]any{"z": "<>&"}},
	} {
		var buf bytes.Buffer
		if err := encodeValue(msgpack.NewEncoder(&buf), v); err != nil {
			f.Fatal(err)
		}
		f.Add(buf.Bytes())
	}
	f.Add([]byte{0x82, 0xa1, 'b', 0x01, 0xa1, 'a', 0x02})
	f.Add(nested(maxDepth))
	f.Add([]byte{0xc0})
	f.Fuzz(func(t *testing.T, b []byte) {
		out, ok := plainMsgpackJSON(b)
		if !ok {
			return
		}
		want, err := generic(b)
		if err != nil {
			t.Fatalf("the plain path wrote %s where the generic one fails: %v", out, err)
		}
		if !bytes.Equal(out, want) {
			t.Fatalf("plain %s\ngeneric %s", out, want)
		}
	})
}

// BenchmarkRawJSONDecode: a call's arguments decoded from msgpack, as a
// worker decodes its grants and an engine or an audit its commits (go
// test -bench RawJSONDecode -benchmem ./events): through RawJSON's
// decoder (the plain path), and through the generic path alone, the only
// one before it.
func BenchmarkRawJSONDecode(b *testing.B) {
	args, err := msgpack.Marshal(RawJSON(`{"limit":200,"offset":0,"path":"/workspace/src/main.go","recursive":false}`))
	if err != nil {
		b.Fatal(err)
	}
	b.Run("decoder", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var r RawJSON
			if err := msgpack.Unmarshal(args, &r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("generic", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := generic(args); err != nil {
				b.Fatal(err)
			}
		}
	})
}
