package events_test

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/toolbatch/toolbatch/events"
)

// nested returns n arrays around inner.
func nested(n int, inner string) string {
	return strings.Repeat("[", n) + inner + strings.Repeat("]", n)
}

func TestCanonicalJSON(t *testing.T) {
	const refused = "<refused>"
	tests := []struct {
		name string
		in   string
		want string // canonical form, or refused
	}{
		// Object keys are sorted, at every level, and whitespace goes.
		{"key order", `{"b":1,"a":2,"c":3}`, `{"a":2,"b":1,"c":3}`},
		{"nested key order", `{"z":{"y":1,"x":[{"b":1,"a":2}]},"a":null}`, `{"a":null,"z":{"x":[{"a":2,"b":1}],"y":1}}`},
		{"whitespace", " {\n\t\"a\" : [ 1 , 2 ] }\r\n", `{"a":[1,2]}`},
		{"duplicate key, last wins", `{"a":1,"a":2}`, `{"a":2}`},

		// Integers are written as integers, whatever their spelling.
		{"int", `42`, `42`},
		{"negative int", `-7`, `-7`},
		{"1.0 is 1", `1.0`, `1`},
		{"1.50 is 1.5", `1.50`, `1.5`},
		{"exponent integer", `1e2`, `100`},
		{"fractional exponent", `25e-1`, `2.5`},
		{"negative zero", `-0.0`, `0`},
		{"max int64", `9223372036854775807`, `9223372036854775807`},
		{"min int64", `-9223372036854775808`, `-9223372036854775808`},
		{"max uint64", `18446744073709551615`, `18446744073709551615`},
		{"beyond uint64 is refused, not rounded to a float", `18446744073709551616`, refused},
		{"integral float beyond 2^53 stays a float", `9007199254740993.0`, `9007199254740992`},
		{"large float", `1.5e300`, `1.5e+300`},
		{"small float", `0.000001`, `0.000001`},
		{"float out of range", `1e400`, refused},

		// No HTML escaping; escapes that need none are resolved.
		{"no HTML escaping", `"<a href='x'>&</a>"`, `"<a href='x'>&</a>"`},
		{"escaped HTML is unescaped", `"\u003c\u0026\u003e"`, `"<&>"`},
		{"unicode escape", `"\u00e9"`, `"é"`},
		{"control character stays escaped", `"a\u0001b"`, `"a\u0001b"`},
		{"newline escape", `"a\nb"`, `"a\nb"`},

		// One value, and nothing after it but whitespace.
		{"trailing value", `1 2`, refused},
		{"trailing object", `{}{}`, refused},
		{"trailing garbage", `{"a":1} x`, refused},
		{"trailing bracket", `1 ]`, refused},
		{"trailing brace", `{"a":1}}`, refused},
		{"trailing whitespace", "{} \n", `{}`},

		// Depth: the root is at depth 0; a value at depth 64 is accepted,
		// one at depth 65 is refused.
		{"depth 64", nested(64, "1"), nested(64, "1")},
		{"depth 65", nested(65, "1"), refused},
		{"depth 65 in objects", strings.Repeat(`{"a":`, 65) + "1" + strings.Repeat("}", 65), refused},
		{"depth 1000", nested(1000, ""), refused},

		// Not JSON.
		{"empty", ``, refused},
		{"whitespace only", `  `, refused},
		{"unterminated", `{"a":`, refused},
		{"bare word", `nope`, refused},
		{"single quotes", `{'a':1}`, refused},
		{"NaN", `NaN`, refused},

		// Scalars.
		{"null is the empty RawJSON", `null`, ``},
		{"null inside stays", `[null,{"a":null}]`, `[null,{"a":null}]`},
		{"true", `true`, `true`},
		{"string", `"x"`, `"x"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := events.CanonicalJSON([]byte(tt.in))
			if tt.want == refused {
				if err == nil {
					t.Fatalf("CanonicalJSON(%q) = %q, want an error", tt.in, got)
				}
				return
			}
			if err != nil {
				t.Fatalf("CanonicalJSON(%q): %v", tt.in, err)
			}
			if string(got) != tt.want {
				t.Fatalf("CanonicalJSON(%q) = %q, want %q", tt.in, got, tt.want)
			}
			if len(got) == 0 {
				return // null
			}
			again, err := events.CanonicalJSON(got)
			if err != nil || !bytes.Equal(again, got) {
				t.Fatalf("CanonicalJSON is not idempotent on %q: %q, %v", got, again, err)
			}
		})
	}
}

// TestCanonicalJSONNonJSONSpace checks that only JSON white space (space,
// tab, CR, LF) may follow the value.
func TestCanonicalJSONNonJSONSpace(t *testing.T) {
	for _, in := range []string{"0\v", "{}\f", "{}\u00a0", "{}\u2028", "{}\u0085"} {
		t.Run(fmt.Sprintf("%q", in), func(t *testing.T) {
			if got, err := events.CanonicalJSON([]byte(in)); err == nil {
				t.Fatalf("CanonicalJSON(%q) = %q, want an error", in, got)
			}
		})
	}
}

// TestRawJSONMsgpack checks that a RawJSON travels in msgpack as the native
// value and comes back in canonical form.
func TestRawJSONMsgpack(t *testing.T) {
	tests := []struct {
		name string
		in   []byte // msgpack
		want string // canonical JSON; "" when the input must be refused
	}{
		{"map", []byte{0x82, 0xa1, 'b', 0x01, 0xa1, 'a', 0x02}, `{"a":2,"b":1}`},
		{"float64 1.0 is 1", []byte{0xcb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0}, `1`},
		{"float64 -0.0 is 0", []byte{0xcb, 0x80, 0, 0, 0, 0, 0, 0, 0}, `0`},
		{"float64 1.5", []byte{0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0}, `1.5`},
		{"uint64 max", []byte{0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, `18446744073709551615`},
		{"no HTML escaping", []byte{0xa3, '<', '&', '>'}, `"<&>"`},
		{"NaN", []byte{0xcb, 0x7f, 0xf8, 0, 0, 0, 0, 0, 0, 1}, ""},
		{"integer map key", []byte{0x81, 0x01, 0x02}, ""},
		{"duplicate map key", []byte{0x82, 0xa1, 'a', 0x01, 0xa1, 'a', 0x02}, ""},
		{"invalid UTF-8 string", []byte{0xa1, 0xff}, ""},
		{"invalid UTF-8 key", []byte{0x81, 0xa1, 0xff, 0x01}, ""},
		{"binary", []byte{0xc4, 0x01, 0x00}, ""},
		{"depth 64", append(bytes.Repeat([]byte{0x91}, 64), 0x01), nested(64, "1")},
		{"depth 65", append(bytes.Repeat([]byte{0x91}, 65), 0x01), ""},
		{"array32 of 2^32-1", []byte{0xdd, 0xff, 0xff, 0xff, 0xff}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got events.RawJSON
			err := events.Unmarshal(tt.in, &got)
			if tt.want == "" {
				if err == nil {
					t.Fatalf("Unmarshal(% x) = %q, want an error", tt.in, got)
				}
				return
			}
			if err != nil {
				t.Fatalf("Unmarshal(% x): %v", tt.in, err)
			}
			if string(got) != tt.want {
				t.Fatalf("Unmarshal(% x) = %q, want %q", tt.in, got, tt.want)
			}
			enc, err := events.Marshal(got)
			if err != nil {
				t.Fatalf("Marshal(%q): %v", got, err)
			}
			var again events.RawJSON
			if err := events.Unmarshal(enc, &again); err != nil || !bytes.Equal(again, got) {
				t.Fatalf("round trip of %q: %q, %v", got, again, err)
			}
		})
	}
}

// TestRawJSONNull checks that null and absent are one value: the empty
// RawJSON, written as null in JSON and as nil in msgpack.
func TestRawJSONNull(t *testing.T) {
	c, err := events.CanonicalJSON([]byte("null"))
	if err != nil {
		t.Fatalf("CanonicalJSON(null): %v", err)
	}
	if len(c) != 0 {
		t.Fatalf("CanonicalJSON(null) = %q, want empty", c)
	}
	j, err := c.MarshalJSON()
	if err != nil || string(j) != "null" {
		t.Fatalf("MarshalJSON of the empty RawJSON = %q, %v; want null", j, err)
	}
	for _, r := range []events.RawJSON{nil, events.RawJSON("null")} {
		enc, err := events.Marshal(r)
		if err != nil {
			t.Fatalf("Marshal(%q): %v", r, err)
		}
		if want := []byte{0xc0}; !bytes.Equal(enc, want) {
			t.Fatalf("Marshal(%q) = % x, want % x", r, enc, want)
		}
	}
	var got events.RawJSON
	if err := events.Unmarshal([]byte{0xc0}, &got); err != nil {
		t.Fatalf("Unmarshal(nil): %v", err)
	}
	if len(got) != 0 {
		t.Fatalf("msgpack nil decodes as %q, want empty", got)
	}
	if !got.IsObjectOrNull() {
		t.Fatalf("the empty RawJSON is not IsObjectOrNull")
	}
}

// TestJSONHeldToMsgpacksRules: what msgpack cannot carry is refused in
// JSON too, never replaced or rounded: invalid UTF-8, lone surrogates,
// integers beyond 64 bits. Surrogate pairs and escaped backslashes stay.
func TestJSONHeldToMsgpacksRules(t *testing.T) {
	for _, c := range []struct {
		in   string
		want string // "" for accepted
	}{
		{"{\"a\":\"\xff\"}", "invalid UTF-8"},
		{`{"a":"\ud800"}`, `lone surrogate \ud800`},
		{`{"a":"x\udc00y"}`, `lone surrogate \udc00`},
		{`{"a":"\ud800\u0041"}`, `lone surrogate \ud800`},
		{`{"a":1180591620717411303424}`, "outside the 64-bit range"},
		{`{"a":-9223372036854775809}`, "outside the 64-bit range"},
		{`{"a":"\ud83d\ude00"}`, ""},
		{`{"a":"\\ud800"}`, ""},
		{`{"a":1e30,"b":18446744073709551615,"c":-9223372036854775808}`, ""},
	} {
		_, err := events.CanonicalJSON([]byte(c.in))
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: refused: %v", c.in, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v, want %q", c.in, err, c.want)
		}
	}
}
