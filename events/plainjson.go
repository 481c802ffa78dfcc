package events

import (
	"bytes"
	"encoding/binary"
	"strconv"
	"unicode/utf8"
)

// The way back of RawJSON's msgpack (see jsonfast.go for the way there):
// the values a tool's arguments and outputs are made of, nulls, booleans,
// integers, plain strings, and arrays and objects of them with their keys
// in order, are written as JSON straight from their msgpack bytes, as the
// generic path (decodeValue, then valueToJSON) writes them. Anything else
// (a float, a string JSON escapes, keys out of order or repeated, a key
// that is no string, bin, ext, nesting deeper than maxDepth, bytes that
// end early) is left to the generic path, which is the reference: the two
// agree byte for byte wherever the plain one answers (FuzzPlainMsgpack).

// plainMsgpackJSON is the JSON of a msgpack value that is plain (ok false:
// it is not, or bytes follow it). A null is no value, as valueToJSON has
// it.
func plainMsgpackJSON(b []byte) (RawJSON, bool) {
	if len(b) == 1 && b[0] == 0xc0 {
		return nil, true
	}
	out, rest, ok := appendPlainJSON(make([]byte, 0, len(b)+len(b)/2+2), b, 0)
	return out, ok && len(rest) == 0
}

// appendPlainJSON appends the JSON of the msgpack value at the start of b
// and returns it and the bytes after the value; ok is false when the value
// is not plain (dst is then to be dropped).
func appendPlainJSON(dst, b []byte, depth int) (out, rest []byte, ok bool) {
	if len(b) == 0 || depth > maxDepth {
		return dst, nil, false
	}
	c, b := b[0], b[1:]
	switch {
	case c <= 0x7f: // positive fixint
		return strconv.AppendInt(dst, int64(c), 10), b, true
	case c >= 0xe0: // negative fixint
		return strconv.AppendInt(dst, int64(int8(c)), 10), b, true
	case c&0xf0 == 0x80: // fixmap
		return appendPlainObject(dst, b, int(c&0x0f), depth)
	case c&0xf0 == 0x90: // fixarray
		return appendPlainArray(dst, b, int(c&0x0f), depth)
	case c&0xe0 == 0xa0: // fixstr
		return appendPlainString(dst, b, int(c&0x1f))
	}
	switch c {
	case 0xc0:
		return append(dst, "null"...), b, true
	case 0xc2:
		return append(dst, "false"...), b, true
	case 0xc3:
		return append(dst, "true"...), b, true
	case 0xcc, 0xcd, 0xce, 0xcf: // uint 8, 16, 32, 64
		n, rest, ok := fixed(b, 1<<(c-0xcc))
		if !ok {
			return dst, nil, false
		}
		return strconv.AppendUint(dst, n, 10), rest, true
	case 0xd0, 0xd1, 0xd2, 0xd3: // int 8, 16, 32, 64
		size := 1 << (c - 0xd0)
		n, rest, ok := fixed(b, size)
		if !ok {
			return dst, nil, false
		}
		shift := 64 - 8*size // sign-extend from size bytes
		return strconv.AppendInt(dst, int64(n<<shift)>>shift, 10), rest, true
	case 0xd9, 0xda, 0xdb: // str 8, 16, 32
		n, rest, ok := fixed(b, 1<<(c-0xd9))
		if !ok {
			return dst, nil, false
		}
		return appendPlainString(dst, rest, int(min(n, uint64(len(rest))+1)))
	case 0xdc, 0xdd: // array 16, 32
		n, rest, ok := fixed(b, 2<<(c-0xdc))
		if !ok || n > uint64(len(rest)) {
			return dst, nil, false
		}
		return appendPlainArray(dst, rest, int(n), depth)
	case 0xde, 0xdf: // map 16, 32
		n, rest, ok := fixed(b, 2<<(c-0xde))
		if !ok || n > uint64(len(rest)) {
			return dst, nil, false
		}
		return appendPlainObject(dst, rest, int(n), depth)
	}
	return dst, nil, false // float, bin, ext, never used
}

// fixed reads a big-endian unsigned integer of size bytes.
func fixed(b []byte, size int) (uint64, []byte, bool) {
	if len(b) < size {
		return 0, nil, false
	}
	switch size {
	case 1:
		return uint64(b[0]), b[1:], true
	case 2:
		return uint64(binary.BigEndian.Uint16(b)), b[2:], true
	case 4:
		return uint64(binary.BigEndian.Uint32(b)), b[4:], true
	}
	return binary.BigEndian.Uint64(b), b[8:], true
}

func appendPlainArray(dst, b []byte, n, depth int) ([]byte, []byte, bool) {
	dst = append(dst, '[')
	for i := range n {
		if i > 0 {
			dst = append(dst, ',')
		}
		var ok bool
		if dst, b, ok = appendPlainJSON(dst, b, depth+1); !ok {
			return dst, nil, false
		}
	}
	return append(dst, ']'), b, true
}

// appendPlainObject writes a map whose keys are plain strings in strictly
// increasing byte order: the order valueToJSON writes them in.
func appendPlainObject(dst, b []byte, n, depth int) ([]byte, []byte, bool) {
	dst = append(dst, '{')
	var last []byte
	for i := range n {
		if i > 0 {
			dst = append(dst, ',')
		}
		key, rest, ok := plainKey(b)
		if !ok || (i > 0 && bytes.Compare(last, key) >= 0) {
			return dst, nil, false
		}
		last = key
		dst = append(append(append(dst, '"'), key...), '"', ':')
		if dst, b, ok = appendPlainJSON(dst, rest, depth+1); !ok {
			return dst, nil, false
		}
	}
	return append(dst, '}'), b, true
}

// plainKey reads a map key: a msgpack string JSON writes as it is.
func plainKey(b []byte) (key, rest []byte, ok bool) {
	if len(b) == 0 {
		return nil, nil, false
	}
	c, b := b[0], b[1:]
	var n uint64
	switch {
	case c&0xe0 == 0xa0:
		n = uint64(c & 0x1f)
	case c == 0xd9 || c == 0xda || c == 0xdb:
		if n, b, ok = fixed(b, 1<<(c-0xd9)); !ok {
			return nil, nil, false
		}
	default:
		return nil, nil, false
	}
	if n > uint64(len(b)) || !unescaped(b[:n]) {
		return nil, nil, false
	}
	return b[:n], b[n:], true
}

// appendPlainString writes the n bytes at the start of b as a JSON string
// when JSON needs no escape for them.
func appendPlainString(dst, b []byte, n int) ([]byte, []byte, bool) {
	if n > len(b) || !unescaped(b[:n]) {
		return dst, nil, false
	}
	return append(append(append(dst, '"'), b[:n]...), '"'), b[n:], true
}

// unescaped reports whether s is valid UTF-8 that encoding/json (HTML
// escaping off) writes between quotes unchanged: no control character,
// quote or backslash, and neither U+2028 nor U+2029.
func unescaped(s []byte) bool {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c < 0x20 || c == '"' || c == '\\' {
				return false
			}
			i++
			continue
		}
		r, size := utf8.DecodeRune(s[i:])
		if r == utf8.RuneError && size == 1 || r == '\u2028' || r == '\u2029' {
			return false
		}
		i += size
	}
	return true
}
