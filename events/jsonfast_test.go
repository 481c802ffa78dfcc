package events

import (
	"bytes"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// FuzzPlainJSON: a JSON text in the plain form is written to msgpack
// straight from its text with the same bytes as the general path, which
// parses it into values; a text the general path refuses is never plain.
func FuzzPlainJSON(f *testing.F) {
	for _, s := range []string{
		`null`, `true`, `false`, `0`, `-0`, `-1`, `127`, `128`, `-33`, `-129`, `65536`, `4294967296`,
		`9223372036854775807`, `9223372036854775808`, `18446744073709551615`, `18446744073709551616`, `-9223372036854775809`,
		`1.5`, `1e3`, `01`, `-`, `""`, `"a"`, `"é ✓"`, `"a\"b"`, `"\u2028"`, `[]`, `{}`, `[1,[2,[3]],{}]`,
		`{"a":1,"b":[true,false,null],"c":{"d":"e"}}`, `{"b":1,"a":2}`, `{"a":1,"a":2}`, `{"a":1,}`, `[1,]`, `[1 ,2]`,
		`{"i":3}`, `{"duration":"200ms"}`, `{"x":"` + string(bytes.Repeat([]byte("y"), 40)) + `"}`, `[` + string(bytes.Repeat([]byte("["), 70)) + `]`,
		"\"\xff\"", `{"":0}`, `{"a":{}}`, `[[],[]]`,
	} {
		f.Add([]byte(s))
	}
	for _, depth := range []int{maxDepth, maxDepth + 1, maxDepth + 2} {
		f.Add([]byte(strings.Repeat("[", depth) + strings.Repeat("]", depth)))
		f.Add([]byte(strings.Repeat(`{"a":`, depth) + "1" + strings.Repeat("}", depth)))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if !plainJSON(b) {
			return
		}
		var fast, slow bytes.Buffer
		enc := msgpack.NewEncoder(&fast)
		enc.UseCompactInts(true)
		if end, err := encodePlain(enc, b, 0); err != nil || end != len(b) {
			t.Fatalf("%q: plain, but written up to %d of %d: %v", b, end, len(b), err)
		}
		v, err := jsonToValue(b)
		if err != nil {
			t.Fatalf("%q: plain, but the general path refuses it: %v", b, err)
		}
		enc = msgpack.NewEncoder(&slow)
		enc.UseCompactInts(true)
		if err := encodeValue(enc, v); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(fast.Bytes(), slow.Bytes()) {
			t.Fatalf("%q: plain path %x, general path %x", b, fast.Bytes(), slow.Bytes())
		}
	})
}

// TestPlainJSONTakesCanonicalJSON: what valueToJSON writes of integers,
// strings without escapes, arrays and objects is plain; what it writes of
// a float or an escaped string is not, and takes the general path.
func TestPlainJSONTakesCanonicalJSON(t *testing.T) {
	for s, want := range map[string]bool{
		`{ "b": [1, 2], "a": {"x": null, "y": "z"} }`: true,
		`{"a": 1.5}`:    false,
		`{"a": "q\"q"}`: false,
		`[true, -7]`:    true,
	} {
		c, err := CanonicalJSON([]byte(s))
		if err != nil {
			t.Fatal(err)
		}
		if got := plainJSON(c); got != want {
			t.Errorf("%s, canonical %s: plain %v, want %v", s, c, got, want)
		}
	}
}

// TestBlockEncodedTyped: text and tool_use blocks are written as
// encodeFields writes their fields.
func TestBlockEncodedTyped(t *testing.T) {
	for _, b := range []ContentBlock{
		TextBlock(""), TextBlock("tab\there ✓ " + strings.Repeat("x", 300)),
		{Type: BlockToolUse, ID: "t1", Name: "noop"},
		{Type: BlockToolUse, ID: "t2", Name: "echo", Input: MustJSON(`{"b":[1,2.5,"q\"q"],"a":{"x":null}}`)},
		{Type: BlockToolUse, ID: "t3", Name: "echo", Input: MustJSON(`{"i":3}`)},
	} {
		var typed, fields bytes.Buffer
		enc := msgpack.NewEncoder(&typed)
		enc.UseCompactInts(true)
		if err := b.EncodeMsgpack(enc); err != nil {
			t.Fatal(err)
		}
		enc = msgpack.NewEncoder(&fields)
		enc.UseCompactInts(true)
		if err := encodeFields(enc, b.fields()); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(typed.Bytes(), fields.Bytes()) {
			t.Errorf("%+v: typed %x, fields %x", b, typed.Bytes(), fields.Bytes())
		}
	}
}
