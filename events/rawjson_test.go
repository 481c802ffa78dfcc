package events

import (
	"bytes"
	"math"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// decoded is what a reading of a msgpack value gave: its JSON, or that it
// failed, and how many bytes it took.
type decoded struct {
	json RawJSON
	err  bool
	took int
}

// viaDecoder reads b's first value with RawJSON's decoder.
func viaDecoder(b []byte) decoded {
	rd := bytes.NewReader(b)
	var r RawJSON
	err := r.DecodeMsgpack(msgpack.NewDecoder(rd))
	return decoded{json: r, err: err != nil, took: len(b) - rd.Len()}
}

// viaGeneric reads it the generic way alone (decodeValue, then
// valueToJSON), as RawJSON's decoder did before it had a fast path.
func viaGeneric(b []byte) decoded {
	rd := bytes.NewReader(b)
	v, err := decodeValue(msgpack.NewDecoder(rd), 0)
	var out RawJSON
	if err == nil {
		out, err = valueToJSON(v)
	}
	return decoded{json: out, err: err != nil, took: len(b) - rd.Len()}
}

func sameReading(t *testing.T, b []byte) {
	t.Helper()
	got, want := viaDecoder(b), viaGeneric(b)
	if got.err != want.err || !bytes.Equal(got.json, want.json) || !got.err && got.took != want.took {
		t.Fatalf("% x: the decoder read %q (failed %v, %d bytes), the generic way %q (failed %v, %d bytes)",
			b[:min(len(b), 32)], got.json, got.err, got.took, want.json, want.err, want.took)
	}
}

func encoded(t testing.TB, write func(*msgpack.Encoder) error) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := write(msgpack.NewEncoder(&buf)); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// nestedArrays is [[[...1...]]], depth arrays deep.
func nestedArrays(depth int) []byte {
	return append(bytes.Repeat([]byte{0x91}, depth), 0x01)
}

// TestRawJSONDecoderMatchesGeneric: RawJSON's decoder reads every value as
// the generic way does, the ones its fast path writes (checked to take
// it) and the others, failures included, and takes as many bytes; a
// hostile nesting or length fails without following it.
func TestRawJSONDecoderMatchesGeneric(t *testing.T) {
	value := func(v any) func(*msgpack.Encoder) error {
		return func(e *msgpack.Encoder) error { return encodeValue(e, v) }
	}
	pairs := func(kv ...any) func(*msgpack.Encoder) error { // a map in the order given
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
	for _, tc := range []struct {
		name string
		b    []byte
		fast bool // the fast path writes it
	}{
		{"small ints", encoded(t, value([]any{int64(0), int64(127), int64(-1), int64(-32)})), true},
		{"ints of every width", encoded(t, value([]any{int64(128), int64(-33), int64(300), int64(-300), int64(70000), int64(-70000),
			int64(math.MaxInt64), int64(math.MinInt64), uint64(math.MaxUint64)})), true},
		{"fixed-width codes", []byte{0x96, 0xcc, 0x05, 0xcd, 0x00, 0x05, 0xce, 0, 0, 0, 5, 0xd0, 0xfb, 0xd1, 0xff, 0xfb, 0xd2, 0xff, 0xff, 0xff, 0xfb}, true},
		{"null, booleans", encoded(t, value([]any{nil, true, false})), true},
		{"arguments", encoded(t, value(map[string]any{"path": "/tmp/a b", "n": int64(3), "deep": map[string]any{"list": []any{"é", "日本", ""}}})), true},
		{"empty object and array", encoded(t, value(map[string]any{"a": map[string]any{}, "b": []any{}})), true},
		{"html characters", encoded(t, value("<a href='x'>&amp;</a>")), true},
		{"long string", encoded(t, value(strings.Repeat("x", 70000))), true},
		{"map 16 and array 16", encoded(t, value(func() map[string]any {
			m := map[string]any{}
			for i := range 20 {
				m[string(rune('a'+i))] = []any{int64(i), int64(i), int64(i), int64(i), int64(i), int64(i), int64(i), int64(i),
					int64(i), int64(i), int64(i), int64(i), int64(i), int64(i), int64(i), int64(i), int64(i)}
			}
			return m
		}())), true},
		{"null alone", []byte{0xc0}, false}, // no value, before the fast path
		{"float", encoded(t, value(1.5)), false},
		{"integral float", encoded(t, value([]any{2.0})), false},
		{"escaped string", encoded(t, value("a\"b\\c\nd\x01")), false},
		{"line separator", encoded(t, value("a\u2028b")), false},
		{"keys out of order", encoded(t, pairs("b", 1, "a", 2)), false},
		{"key repeated", encoded(t, pairs("a", 1, "a", 2)), false},
		{"integer key", encoded(t, pairs(1, 2)), false},
		{"invalid UTF-8", encoded(t, value("a\xffb")), false},
		{"bin", encoded(t, func(e *msgpack.Encoder) error { return e.EncodeBytes([]byte{1, 2}) }), false},
		{"ext", []byte{0xd4, 0x01, 0x02}, false},
		{"never-used code", []byte{0xc1}, false},
		{"deeper than the fast path", nestedArrays(fastJSONDepth + 1), false},
		{"as deep as allowed", nestedArrays(maxDepth), false},
		{"one level too deep", nestedArrays(maxDepth + 1), false},
		{"a million levels", nestedArrays(1_000_000), false},
		{"truncated", []byte{0x92, 0x01}, false},
		{"a length the bytes do not back", []byte{0xdb, 0xff, 0xff, 0xff, 0xff, 'a'}, false},
		{"elements the bytes do not back", []byte{0xdd, 0xff, 0xff, 0xff, 0xff, 0x01}, false},
		{"bytes after the value", []byte{0x91, 0x01, 0x02}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fast := mp{b: tc.b}
			_, ok := fast.appendJSON(nil, 0)
			if ok = ok && !fast.bad && tc.b[0] != 0xc0; ok != tc.fast {
				t.Fatalf("fast path %v, want %v", ok, tc.fast)
			}
			sameReading(t, tc.b)
		})
	}
}

// FuzzRawJSONDecoder: whatever the bytes, RawJSON's decoder and the
// generic way read the same.
func FuzzRawJSONDecoder(f *testing.F) {
	for _, v := range []any{
		map[string]any{"a": int64(1), "b": []any{"x", nil, true, int64(-5)}},
		[]any{uint64(math.MaxUint64), int64(math.MinInt64), "é\u2028", 0.5},
		map[string]any{"k": map[string]any{"z": "<>&"}},
	} {
		f.Add(encoded(f, func(e *msgpack.Encoder) error { return encodeValue(e, v) }))
	}
	f.Add([]byte{0x82, 0xa1, 'b', 0x01, 0xa1, 'a', 0x02})
	f.Add(nestedArrays(maxDepth + 1))
	f.Add([]byte{0xc0})
	f.Fuzz(func(t *testing.T, b []byte) { sameReading(t, b) })
}

// BenchmarkRawJSONDecode: a call's arguments decoded from msgpack, as a
// worker decodes its grants (go test -run '^$' -bench RawJSONDecode
// -benchmem ./events): RawJSON's decoder, and the generic way alone, the
// only one before the fast path.
func BenchmarkRawJSONDecode(b *testing.B) {
	args, err := msgpack.Marshal(RawJSON(`{"limit":200,"offset":0,"path":"/workspace/src/main.go","recursive":false}`))
	if err != nil {
		b.Fatal(err)
	}
	for _, way := range []struct {
		name string
		read func([]byte) decoded
	}{{"decoder", viaDecoder}, {"generic", viaGeneric}} {
		b.Run(way.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if d := way.read(args); d.err {
					b.Fatal("failed")
				}
			}
		})
	}
}

// TestRawJSONDecoderStopsAtMaxDepth: a nesting deeper than maxDepth is
// refused where it passes the limit, not followed to its end (the
// library's own raw read would recurse a million levels here).
func TestRawJSONDecoderStopsAtMaxDepth(t *testing.T) {
	d := viaDecoder(nestedArrays(1_000_000))
	if !d.err || d.took != maxDepth+1 {
		t.Fatalf("read %d bytes (failed %v), want a failure after the %d headers the limit allows", d.took, d.err, maxDepth+1)
	}
}
