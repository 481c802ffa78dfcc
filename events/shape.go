package events

import (
	"encoding/binary"
	"fmt"
)

// maxShapeDepth bounds the nesting checkShape accepts.
const maxShapeDepth = 100

// checkShape walks a msgpack encoding without decoding it and refuses one
// that is truncated, nested too deep, has trailing bytes, or declares an
// array or map longer than the bytes that are left (every element takes at
// least one byte). The msgpack library allocates a slice of the declared
// length before it reads the elements, so a five-byte body could otherwise
// ask for gigabytes; checkShape runs first on every body Unmarshal decodes.
func checkShape(b []byte) error {
	rest, err := walkValue(b, 0)
	if err != nil {
		return err
	}
	if len(rest) != 0 {
		return fmt.Errorf("%w: %d trailing bytes", ErrMalformed, len(rest))
	}
	return nil
}

func truncated() error { return fmt.Errorf("%w: truncated", ErrMalformed) }

func skip(b []byte, n uint64) ([]byte, error) {
	if n > uint64(len(b)) {
		return nil, truncated()
	}
	return b[n:], nil
}

// length reads a big-endian length of size bytes.
func length(b []byte, size int) (uint64, []byte, error) {
	if len(b) < size {
		return 0, nil, truncated()
	}
	var n uint64
	switch size {
	case 1:
		n = uint64(b[0])
	case 2:
		n = uint64(binary.BigEndian.Uint16(b))
	default:
		n = uint64(binary.BigEndian.Uint32(b))
	}
	return n, b[size:], nil
}

func walkValue(b []byte, depth int) ([]byte, error) {
	if depth > maxShapeDepth {
		return nil, fmt.Errorf("%w: nested deeper than %d levels", ErrMalformed, maxShapeDepth)
	}
	if len(b) == 0 {
		return nil, truncated()
	}
	c, b := b[0], b[1:]
	switch {
	case c <= 0x7f || c >= 0xe0, c == 0xc0, c == 0xc2, c == 0xc3: // fixint, nil, bool
		return b, nil
	case c&0xf0 == 0x80: // fixmap
		return walkElems(b, uint64(c&0x0f)*2, depth)
	case c&0xf0 == 0x90: // fixarray
		return walkElems(b, uint64(c&0x0f), depth)
	case c&0xe0 == 0xa0: // fixstr
		return skip(b, uint64(c&0x1f))
	}
	switch c {
	case 0xcc, 0xd0:
		return skip(b, 1)
	case 0xcd, 0xd1:
		return skip(b, 2)
	case 0xca, 0xce, 0xd2:
		return skip(b, 4)
	case 0xcb, 0xcf, 0xd3:
		return skip(b, 8)
	case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8: // fixext 1, 2, 4, 8, 16 plus the type byte
		return skip(b, 1+(uint64(1)<<(c-0xd4)))
	case 0xc4, 0xd9, 0xc5, 0xda, 0xc6, 0xdb: // bin, str
		n, rest, err := length(b, sizeOf(c))
		if err != nil {
			return nil, err
		}
		return skip(rest, n)
	case 0xc7, 0xc8, 0xc9: // ext
		n, rest, err := length(b, 1<<(c-0xc7))
		if err != nil {
			return nil, err
		}
		return skip(rest, 1+n)
	case 0xdc, 0xdd: // array16, array32
		n, rest, err := length(b, 2*int(c-0xdc+1))
		if err != nil {
			return nil, err
		}
		return walkElems(rest, n, depth)
	case 0xde, 0xdf: // map16, map32
		n, rest, err := length(b, 2*int(c-0xde+1))
		if err != nil {
			return nil, err
		}
		return walkElems(rest, 2*n, depth)
	default: // 0xc1 is never used
		return nil, fmt.Errorf("%w: code 0x%x", ErrMalformed, c)
	}
}

func sizeOf(c byte) int {
	switch c {
	case 0xc4, 0xd9:
		return 1
	case 0xc5, 0xda:
		return 2
	default:
		return 4
	}
}

func walkElems(b []byte, n uint64, depth int) ([]byte, error) {
	if n > uint64(len(b)) {
		return nil, fmt.Errorf("%w: %d elements declared, %d bytes left", ErrMalformed, n, len(b))
	}
	var err error
	for i := uint64(0); i < n; i++ {
		if b, err = walkValue(b, depth+1); err != nil {
			return nil, err
		}
	}
	return b, nil
}
