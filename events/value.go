package events

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// maxDepth bounds the nesting of any decoded value, so that hostile input
// cannot exhaust the stack.
const maxDepth = 64

// RawJSON is a JSON value in canonical form: compact, object keys sorted,
// integers written as integers, no HTML escaping. Arguments, json content
// blocks and staged state values are RawJSON. The canonical form of JSON
// null is the empty RawJSON (msgpack's nil cannot tell null from absent);
// it is written as null.
//
// In msgpack, a RawJSON is encoded as the native msgpack value (a map for an
// object), so msgpack clients never handle JSON text.
type RawJSON []byte

// CanonicalJSON parses b as one JSON value and returns its canonical form.
func CanonicalJSON(b []byte) (RawJSON, error) {
	v, err := jsonToValue(b)
	if err != nil {
		return nil, err
	}
	return valueToJSON(v)
}

// MustJSON returns the canonical form of a JSON literal written in code or
// tests. It is for literals only: it panics on invalid JSON.
func MustJSON(s string) RawJSON {
	r, err := CanonicalJSON([]byte(s))
	if err != nil {
		panic(fmt.Sprintf("events.MustJSON(%q): %v", s, err))
	}
	return r
}

// Value decodes r into nil, bool, int64, uint64, float64, string, []any or
// map[string]any.
func (r RawJSON) Value() (any, error) {
	if len(r) == 0 {
		return nil, nil
	}
	return jsonToValue(r)
}

// IsObjectOrNull reports whether r is a JSON object or null (or absent).
func (r RawJSON) IsObjectOrNull() bool {
	if len(r) == 0 || string(r) == "null" {
		return true
	}
	return r[0] == '{'
}

// MarshalJSON implements json.Marshaler. An absent value is null.
func (r RawJSON) MarshalJSON() ([]byte, error) {
	if len(r) == 0 {
		return []byte("null"), nil
	}
	return r, nil
}

// UnmarshalJSON implements json.Unmarshaler; it canonicalizes.
func (r *RawJSON) UnmarshalJSON(b []byte) error {
	c, err := CanonicalJSON(b)
	if err != nil {
		return err
	}
	*r = c
	return nil
}

// EncodeMsgpack implements msgpack.CustomEncoder.
func (r RawJSON) EncodeMsgpack(enc *msgpack.Encoder) error {
	if len(r) == 0 {
		return enc.EncodeNil()
	}
	if plainJSON(r) {
		_, err := encodePlain(enc, r, 0)
		return err
	}
	v, err := jsonToValue(r)
	if err != nil {
		return err
	}
	return encodeValue(enc, v)
}

// DecodeMsgpack implements msgpack.CustomDecoder. It reads the value's
// encoding whole (readRaw, as deep as maxDepth) and has the fast commit
// decoder's rawJSON write it: straight from the bytes when it can
// (integers, strings with nothing to escape, objects with their keys in
// order, ...), the generic way (genericJSON) otherwise; the two agree
// (TestRawJSONDecoderMatchesGeneric, FuzzRawJSONDecoder).
func (r *RawJSON) DecodeMsgpack(dec *msgpack.Decoder) error {
	raw, err := readRaw(dec, nil, 0)
	if err != nil {
		return err
	}
	d := mp{b: raw, scratch: make([]byte, 0, len(raw)+len(raw)/2+2)}
	if out := d.rawJSON(); !d.bad {
		*r = out
		return nil
	}
	out, err := genericJSON(msgpack.NewDecoder(bytes.NewReader(raw))) // refused: why
	if err == nil {
		*r = out
	}
	return err
}

// genericJSON reads a value into generic values (decodeValue) and writes
// them as canonical JSON (valueToJSON): the reference of every faster way.
func genericJSON(dec *msgpack.Decoder) (RawJSON, error) {
	v, err := decodeValue(dec, 0)
	if err != nil {
		return nil, err
	}
	return valueToJSON(v)
}

// readRaw appends the encoding of dec's next value to b. Unlike the
// library's DecodeRaw, which follows nesting as deep as the input goes, it
// refuses a value nested deeper than maxDepth before reading its inside,
// as decodeValue does; and it reads long strings in chunks, so that a
// length the input does not back costs one 64 KiB chunk at most.
func readRaw(dec *msgpack.Decoder, b []byte, depth int) ([]byte, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("value nested deeper than %d levels", maxDepth)
	}
	at := len(b)
	b, err := readBytes(dec, b, 1)
	if err != nil {
		return nil, err
	}
	c := b[at]
	switch {
	case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3: // fixint, nil, bool
		return b, nil
	case c&0xf0 == 0x80: // fixmap
		return readElems(dec, b, 2*uint64(c&0x0f), depth)
	case c&0xf0 == 0x90: // fixarray
		return readElems(dec, b, uint64(c&0x0f), depth)
	case c&0xe0 == 0xa0: // fixstr
		return readBytes(dec, b, uint64(c&0x1f))
	}
	// the others: a length of size bytes, then bytes (times per, plus
	// extra) or elements (per per entry)
	var size, extra int
	per, elems := uint64(1), false
	switch c {
	case 0xcc, 0xd0:
		extra = 1
	case 0xcd, 0xd1:
		extra = 2
	case 0xca, 0xce, 0xd2:
		extra = 4
	case 0xcb, 0xcf, 0xd3:
		extra = 8
	case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8: // fixext: the type byte and 1 to 16 bytes
		extra = 1 + 1<<(c-0xd4)
	case 0xc4, 0xd9: // bin 8, str 8
		size = 1
	case 0xc5, 0xda:
		size = 2
	case 0xc6, 0xdb:
		size = 4
	case 0xc7, 0xc8, 0xc9: // ext 8, 16, 32: the type byte after the length
		size, extra = 1<<(c-0xc7), 1
	case 0xdc, 0xdd: // array 16, 32
		size, elems = 2<<(c-0xdc), true
	case 0xde, 0xdf: // map 16, 32
		size, elems, per = 2<<(c-0xde), true, 2
	default: // 0xc1 is never used
		return nil, fmt.Errorf("%w: msgpack code 0x%x", errNotJSON, c)
	}
	var n uint64
	if size > 0 {
		at := len(b)
		if b, err = readBytes(dec, b, uint64(size)); err != nil {
			return nil, err
		}
		for _, x := range b[at:] {
			n = n<<8 | uint64(x)
		}
	}
	if elems {
		return readElems(dec, b, per*n, depth)
	}
	return readBytes(dec, b, n+uint64(extra))
}

func readElems(dec *msgpack.Decoder, b []byte, n uint64, depth int) ([]byte, error) {
	var err error
	for ; n > 0; n-- {
		if b, err = readRaw(dec, b, depth+1); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// readBytes appends the next n bytes of dec to b, 64 KiB at a time.
func readBytes(dec *msgpack.Decoder, b []byte, n uint64) ([]byte, error) {
	for n > 0 {
		k := int(min(n, 64<<10))
		at := len(b)
		b = slices.Grow(b, k)[:at+k]
		if err := dec.ReadFull(b[at:]); err != nil {
			return nil, err
		}
		n -= uint64(k)
	}
	return b, nil
}

// errNotJSON is returned for msgpack values that have no JSON equivalent.
var errNotJSON = errors.New("value has no JSON equivalent")

// decodeValue reads one msgpack value as a generic JSON-compatible value,
// with a depth limit.
func decodeValue(dec *msgpack.Decoder, depth int) (any, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("value nested deeper than %d levels", maxDepth)
	}
	c, err := dec.PeekCode()
	if err != nil {
		return nil, err
	}
	switch {
	case c == msgpcode.Nil:
		return nil, dec.DecodeNil()
	case c == msgpcode.True || c == msgpcode.False:
		return dec.DecodeBool()
	case msgpcode.IsFixedNum(c) || c == msgpcode.Int8 || c == msgpcode.Int16 || c == msgpcode.Int32 || c == msgpcode.Int64 ||
		c == msgpcode.Uint8 || c == msgpcode.Uint16 || c == msgpcode.Uint32:
		return dec.DecodeInt64()
	case c == msgpcode.Uint64:
		u, err := dec.DecodeUint64()
		if err != nil {
			return nil, err
		}
		if u <= math.MaxInt64 {
			return int64(u), nil
		}
		return u, nil
	case c == msgpcode.Float || c == msgpcode.Double:
		f, err := dec.DecodeFloat64()
		if err != nil {
			return nil, err
		}
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, fmt.Errorf("%w: %v", errNotJSON, f)
		}
		return normalFloat(f), nil
	case msgpcode.IsString(c):
		s, err := dec.DecodeString()
		if err != nil {
			return nil, err
		}
		if !utf8.ValidString(s) {
			return nil, fmt.Errorf("%w: string is not valid UTF-8", errNotJSON)
		}
		return s, nil
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		n, err := dec.DecodeArrayLen()
		if err != nil {
			return nil, err
		}
		if n < 0 {
			return nil, nil
		}
		out := make([]any, 0, min(n, 1024))
		for i := 0; i < n; i++ {
			v, err := decodeValue(dec, depth+1)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, nil
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		n, err := dec.DecodeMapLen()
		if err != nil {
			return nil, err
		}
		if n < 0 {
			return nil, nil
		}
		out := make(map[string]any, min(n, 1024))
		for i := 0; i < n; i++ {
			kc, err := dec.PeekCode()
			if err != nil {
				return nil, err
			}
			if !msgpcode.IsString(kc) {
				return nil, fmt.Errorf("%w: map key of code 0x%x is not a string", errNotJSON, kc)
			}
			k, err := dec.DecodeString()
			if err != nil {
				return nil, err
			}
			if !utf8.ValidString(k) {
				return nil, fmt.Errorf("%w: map key is not valid UTF-8", errNotJSON)
			}
			v, err := decodeValue(dec, depth+1)
			if err != nil {
				return nil, err
			}
			if _, dup := out[k]; dup {
				return nil, fmt.Errorf("duplicate map key %q", k)
			}
			out[k] = v
		}
		return out, nil
	default:
		return nil, fmt.Errorf("%w: msgpack code 0x%x", errNotJSON, c)
	}
}

// encodeValue writes a generic value with map keys sorted, so that equal
// values always give equal bytes.
func encodeValue(enc *msgpack.Encoder, v any) error {
	switch x := v.(type) {
	case nil:
		return enc.EncodeNil()
	case bool:
		return enc.EncodeBool(x)
	case int64:
		return enc.EncodeInt(x)
	case uint64:
		return enc.EncodeUint(x)
	case float64:
		return enc.EncodeFloat64(x)
	case string:
		return enc.EncodeString(x)
	case []any:
		if err := enc.EncodeArrayLen(len(x)); err != nil {
			return err
		}
		for _, e := range x {
			if err := encodeValue(enc, e); err != nil {
				return err
			}
		}
		return nil
	case map[string]any:
		if err := enc.EncodeMapLen(len(x)); err != nil {
			return err
		}
		for _, k := range sortedKeys(x) {
			if err := enc.EncodeString(k); err != nil {
				return err
			}
			if err := encodeValue(enc, x[k]); err != nil {
				return err
			}
		}
		return nil
	default:
		return fmt.Errorf("%w: %T", errNotJSON, v)
	}
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// jsonToValue parses JSON into a generic value with numbers normalized.
func jsonToValue(b []byte) (any, error) {
	// encoding/json is lenient where msgpack is not: it reads invalid
	// UTF-8 and lone surrogates as U+FFFD. Hold JSON to msgpack's rules.
	if !utf8.Valid(b) {
		return nil, errors.New("invalid UTF-8 in JSON")
	}
	if err := checkSurrogates(b); err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if rest := bytes.Trim(b[dec.InputOffset():], " \t\r\n"); len(rest) != 0 {
		return nil, errors.New("trailing data after JSON value")
	}
	return normalizeJSON(v, 0)
}

// normalizeJSON converts json.Number into int64, uint64 or float64 and
// checks the depth.
func normalizeJSON(v any, depth int) (any, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("value nested deeper than %d levels", maxDepth)
	}
	switch x := v.(type) {
	case json.Number:
		if i, err := strconv.ParseInt(string(x), 10, 64); err == nil {
			return i, nil
		}
		if u, err := strconv.ParseUint(string(x), 10, 64); err == nil {
			return u, nil
		}
		if !strings.ContainsAny(string(x), ".eE") {
			// An integer msgpack could not carry: refused, never rounded.
			return nil, fmt.Errorf("integer %s is outside the 64-bit range", x)
		}
		f, err := strconv.ParseFloat(string(x), 64)
		if err != nil {
			return nil, fmt.Errorf("number %s: %w", x, err)
		}
		return normalFloat(f), nil
	case []any:
		for i, e := range x {
			n, err := normalizeJSON(e, depth+1)
			if err != nil {
				return nil, err
			}
			x[i] = n
		}
		return x, nil
	case map[string]any:
		for k, e := range x {
			n, err := normalizeJSON(e, depth+1)
			if err != nil {
				return nil, err
			}
			x[k] = n
		}
		return x, nil
	default:
		return v, nil
	}
}

// normalFloat writes an integral float (also -0) as an integer, as JSON
// does not tell them apart, so that a value has one canonical form.
func normalFloat(f float64) any {
	if f == math.Trunc(f) && math.Abs(f) < 1<<53 {
		return int64(f)
	}
	return f
}

// valueToJSON writes a generic value as canonical JSON.
func valueToJSON(v any) (RawJSON, error) {
	if v == nil {
		return nil, nil // null and absent are one value: msgpack cannot tell them apart
	}
	if err := checkValue(v, 0); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return RawJSON(bytes.TrimSuffix(buf.Bytes(), []byte("\n"))), nil
}

// checkValue rejects what JSON cannot carry (and floats that are integers
// are turned into integers by normalizeJSON, not here).
func checkValue(v any, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("value nested deeper than %d levels", maxDepth)
	}
	switch x := v.(type) {
	case nil, bool, int64, uint64, string:
		return nil
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return fmt.Errorf("%w: %v", errNotJSON, x)
		}
		return nil
	case []any:
		for _, e := range x {
			if err := checkValue(e, depth+1); err != nil {
				return err
			}
		}
		return nil
	case map[string]any:
		for _, e := range x {
			if err := checkValue(e, depth+1); err != nil {
				return err
			}
		}
		return nil
	default:
		return fmt.Errorf("%w: %T", errNotJSON, v)
	}
}

// ValueJSON returns the canonical JSON of a generic value (nil, bool,
// int64, uint64, float64, string, []any, map[string]any).
func ValueJSON(v any) (RawJSON, error) { return valueToJSON(v) }

// checkSurrogates refuses a \u escape of a UTF-16 surrogate that is not
// half of a pair (a high one followed by a low one): JSON can spell it,
// UTF-8 cannot hold it.
func checkSurrogates(b []byte) error {
	inString := false
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			inString = !inString
		case c == '\\' && inString && i+1 < len(b):
			if b[i+1] != 'u' {
				i++ // an escaped character, '"' and '\\' included
				continue
			}
			r, ok := hex4(b, i+2)
			if !ok {
				return nil // malformed: the decoder reports it
			}
			switch {
			case r >= 0xD800 && r <= 0xDBFF:
				lo, ok := hex4(b, i+8)
				if !ok || b[i+6] != '\\' || b[i+7] != 'u' || lo < 0xDC00 || lo > 0xDFFF {
					return fmt.Errorf("lone surrogate \\u%04x in a JSON string", r)
				}
				i += 11
			case r >= 0xDC00 && r <= 0xDFFF:
				return fmt.Errorf("lone surrogate \\u%04x in a JSON string", r)
			default:
				i += 5
			}
		}
	}
	return nil
}

// hex4 reads the 4 hex digits at b[i:].
func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	v, err := strconv.ParseUint(string(b[i:i+4]), 16, 32)
	return rune(v), err == nil
}
