package events

import (
	"bytes"
	"strconv"
	"unicode/utf8"

	"github.com/vmihailenco/msgpack/v5"
)

// The fast path of RawJSON.EncodeMsgpack. The JSON a run carries is
// canonical (valueToJSON wrote it: no whitespace, object keys sorted, most
// numbers integers), and the general path parses it into generic values
// with encoding/json only to write them out again. When a value is in
// the plain form below, it is written to msgpack straight from its text,
// with the encoder's own primitives, in the order the general path
// writes: the same bytes (FuzzPlainJSON holds the two equal). Anything
// else takes the general path.
//
// The plain form: no whitespace; strings without escapes or control
// characters; numbers that are integers (no fraction, no exponent) within
// 64 bits; object keys strictly increasing (the general path sorts them
// and keeps one of each); at most maxDepth levels; valid UTF-8.

// plainJSON reports whether b is in the plain form.
func plainJSON(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	end, ok := plainValue(b, 0, 0)
	return ok && end == len(b)
}

// plainValue checks the value at i and returns where it ends.
func plainValue(b []byte, i, depth int) (int, bool) {
	if i >= len(b) || depth > maxDepth {
		return 0, false
	}
	switch c := b[i]; {
	case c == '{' || c == '[':
		// An object's members are a key, a colon and a value; an array's
		// a value.
		closing := byte(']')
		if c == '{' {
			closing = '}'
		}
		i++
		var last []byte
		for n := 0; ; n++ {
			if i < len(b) && b[i] == closing && n == 0 {
				return i + 1, true
			}
			if c == '{' {
				ke, ok := plainString(b, i)
				if !ok || ke >= len(b) || b[ke] != ':' {
					return 0, false
				}
				key := b[i+1 : ke-1]
				if n > 0 && bytes.Compare(last, key) >= 0 {
					return 0, false
				}
				last, i = key, ke+1
			}
			var ok bool
			if i, ok = plainValue(b, i, depth+1); !ok || i >= len(b) {
				return 0, false
			}
			switch b[i] {
			case ',':
				i++
			case closing:
				return i + 1, true
			default:
				return 0, false
			}
		}
	case c == '"':
		return plainString(b, i)
	case c == '-' || c >= '0' && c <= '9':
		e := numberEnd(b, i)
		_, _, ok := plainInt(b[i:e])
		return e, ok
	}
	for _, lit := range [...]string{"null", "true", "false"} {
		if bytes.HasPrefix(b[i:], []byte(lit)) {
			return i + len(lit), true
		}
	}
	return 0, false
}

// plainString returns where the string at i ends (after its quote).
func plainString(b []byte, i int) (int, bool) {
	if i >= len(b) || b[i] != '"' {
		return 0, false
	}
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			return j + 1, true
		case c == '\\' || c < 0x20:
			return 0, false
		}
	}
	return 0, false
}

func numberEnd(b []byte, i int) int {
	for i < len(b) && (b[i] == '-' || b[i] == '+' || b[i] == '.' || b[i] == 'e' || b[i] == 'E' || b[i] >= '0' && b[i] <= '9') {
		i++
	}
	return i
}

// plainInt reads a JSON integer as the general path does: int64 when it
// fits, else uint64.
func plainInt(s []byte) (i int64, u uint64, ok bool) {
	digits := s
	if len(digits) > 0 && digits[0] == '-' {
		digits = digits[1:]
	}
	if len(digits) == 0 || digits[0] == '0' && len(digits) > 1 {
		return 0, 0, false // not JSON
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, 0, false // a fraction or an exponent: the general path
		}
	}
	if i, err := strconv.ParseInt(string(s), 10, 64); err == nil {
		return i, 0, true
	}
	if u, err := strconv.ParseUint(string(s), 10, 64); err == nil {
		return 0, u, true
	}
	return 0, 0, false
}

// encodePlain writes the plain JSON value at i and returns where it ends.
func encodePlain(enc *msgpack.Encoder, b []byte, i int) (int, error) {
	switch c := b[i]; {
	case c == '{' || c == '[':
		n := countItems(b, i)
		var err error
		if c == '{' {
			err = enc.EncodeMapLen(n)
		} else {
			err = enc.EncodeArrayLen(n)
		}
		if err != nil {
			return 0, err
		}
		i++
		for range n {
			if c == '{' {
				ke, _ := plainString(b, i)
				if err := enc.EncodeString(string(b[i+1 : ke-1])); err != nil {
					return 0, err
				}
				i = ke + 1
			}
			if i, err = encodePlain(enc, b, i); err != nil {
				return 0, err
			}
			i++ // the ',' or the closing bracket
		}
		if n == 0 {
			i++
		}
		return i, nil
	case c == '"':
		e, _ := plainString(b, i)
		return e, enc.EncodeString(string(b[i+1 : e-1]))
	case c == 'n':
		return i + 4, enc.EncodeNil()
	case c == 't':
		return i + 4, enc.EncodeBool(true)
	case c == 'f':
		return i + 5, enc.EncodeBool(false)
	}
	e := numberEnd(b, i)
	n, u, _ := plainInt(b[i:e])
	if u != 0 {
		return e, enc.EncodeUint(u)
	}
	return e, enc.EncodeInt(n)
}

// countItems counts the members of the plain object or array at i.
func countItems(b []byte, i int) int {
	if b[i+1] == '}' || b[i+1] == ']' {
		return 0
	}
	n, depth := 1, 0
	for j := i + 1; ; j++ {
		switch b[j] {
		case '"':
			j, _ = plainString(b, j)
			j--
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return n
			}
			depth--
		case ',':
			if depth == 0 {
				n++
			}
		}
	}
}
