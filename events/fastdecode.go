package events

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/vmihailenco/msgpack/v5"
)

//go:generate go run ./internal/gen

// The fast commit decoder. DecodeCommit tries it first; it reads
// the encodings EncodeCommit writes (and the equivalent ones the msgpack
// library would decode the same way) straight into the event structs,
// without reflection. It never refuses anything itself: whatever it does
// not expect (an unknown key or type, a float where JSON text is wanted, a
// duplicate key, trailing bytes, a length longer than the bytes left)
// makes it give up, and DecodeCommit runs the reflective decoder, which
// decides as it always did. So the fast path can only accept what the
// reflective decoder accepts, with an equal result: fastdecode_test.go
// checks that over every golden fixture, their mutations and a fuzz
// target.

// fastJSONDepth bounds the nesting the fast path handles inside a JSON
// value or a content block; deeper values take the exact path (decodeValue),
// whose limit is maxDepth.
const fastJSONDepth = 32

// mp is a cursor over a msgpack encoding. A read that meets an encoding it
// does not handle sets bad, which sticks: the caller then gives up.
type mp struct {
	b   []byte
	i   int
	bad bool
	// recent holds strings decoded lately, so that the ids repeated in
	// one commit (a batch id, a call id) share one allocation; shared, when
	// a Decoder decodes, does the same across its commits instead.
	recent [8]string
	next   int
	shared *Decoder
	// scratch is where JSON text is written before it is copied out.
	scratch []byte
}

// decodeCommitFast decodes a commit body with the fast decoders. It
// reports false when it cannot: the reflective decoder then decides.
func decodeCommitFast(body []byte, headerTypes []string, shared *Decoder) ([]Event, bool) {
	d := mp{b: body, shared: shared}
	n := d.arrayLen()
	if d.bad || n < 1 || headerTypes != nil && len(headerTypes) != n {
		return nil, false
	}
	out := make([]Event, min(n, 64))[:0]
	for i := range n {
		if d.mapLen() != 3 || string(d.key()) != "type" {
			return nil, false
		}
		typ := d.typeName()
		if string(d.key()) != "schema_version" || d.int64() != SchemaVersion || string(d.key()) != "data" {
			return nil, false
		}
		if d.bad || headerTypes != nil && headerTypes[i] != string(typ) {
			return nil, false
		}
		if d.i >= len(d.b) || !isMapCode(d.b[d.i]) {
			return nil, false // the reflective decoder decides what a nil or an array is
		}
		e := d.event(typ)
		if d.bad || e == nil || validBlocksOf(e) != nil {
			return nil, false
		}
		out = append(out, e)
	}
	if d.i != len(d.b) {
		return nil, false
	}
	return out, true
}

func isMapCode(c byte) bool { return c&0xf0 == 0x80 || c == 0xde || c == 0xdf }

// typeName reads an event type as its registered constant.
func (d *mp) typeName() Type {
	b := d.strBytes()
	for _, t := range typeList {
		if string(t) == string(b) {
			return t
		}
	}
	d.bad = true
	return ""
}

var typeList = Types()

// The reads of the event structs (event and one method per struct) are
// generated into fastdecode_gen.go from the struct tags: a map whose keys
// are the struct's msgpack names, in any order, each at most once; nil is
// the zero struct.

// Primitive reads.

// peek returns the next code, or sets bad at the end of the input.
func (d *mp) peek() byte {
	if d.bad || d.i >= len(d.b) {
		d.bad = true
		return 0xc1
	}
	return d.b[d.i]
}

// take returns the next n bytes.
func (d *mp) take(n int) []byte {
	if d.bad || n < 0 || n > len(d.b)-d.i {
		d.bad = true
		return nil
	}
	s := d.b[d.i : d.i+n]
	d.i += n
	return s
}

// length reads a big-endian length of size bytes.
func (d *mp) length(size int) int {
	s := d.take(size)
	switch {
	case d.bad:
		return 0
	case size == 1:
		return int(s[0])
	case size == 2:
		return int(binary.BigEndian.Uint16(s))
	default:
		return int(binary.BigEndian.Uint32(s))
	}
}

// mapLen reads a map header; nil reads as an empty map (the library
// decodes a nil struct as the zero struct).
func (d *mp) mapLen() int { return d.header(0x80, 0xde, 1, 0) }

// arrayLen reads an array header; -1 is nil.
func (d *mp) arrayLen() int { return d.header(0x90, 0xdc, 0, -1) }

// header reads the header of a map or an array: fix is its fix code's high
// nibble, code16 its 16-bit code (the 32-bit one follows), and nilLen what
// nil reads as. Every item takes at least 1<<itemShift bytes (a map's pair
// two), so a longer declared length is refused before anything is
// allocated for it.
func (d *mp) header(fix, code16 byte, itemShift uint, nilLen int) int {
	c := d.peek()
	if d.bad {
		return 0
	}
	d.i++
	var n int
	switch {
	case c&0xf0 == fix:
		n = int(c & 0x0f)
	case c == code16:
		n = d.length(2)
	case c == code16+1:
		n = d.length(4)
	case c == 0xc0:
		return nilLen
	default:
		d.bad = true
		return 0
	}
	if n > (len(d.b)-d.i)>>itemShift {
		d.bad = true
		return 0
	}
	return n
}

// key reads a map key, which must be a string.
func (d *mp) key() []byte {
	c := d.peek()
	switch {
	case d.bad:
		return nil
	case c&0xe0 == 0xa0:
		d.i++
		return d.take(int(c & 0x1f))
	case c == 0xd9 || c == 0xda || c == 0xdb:
		d.i++
		return d.take(d.length(1 << (c - 0xd9)))
	}
	d.bad = true
	return nil
}

// strBytes reads a string as the library does: str or bin, nil as empty.
func (d *mp) strBytes() []byte {
	c := d.peek()
	if d.bad {
		return nil
	}
	switch {
	case c&0xe0 == 0xa0:
		d.i++
		return d.take(int(c & 0x1f))
	case c == 0xd9 || c == 0xc4:
		d.i++
		return d.take(d.length(1))
	case c == 0xda || c == 0xc5:
		d.i++
		return d.take(d.length(2))
	case c == 0xdb || c == 0xc6:
		d.i++
		return d.take(d.length(4))
	case c == 0xc0:
		d.i++
		return nil
	}
	d.bad = true
	return nil
}

// str reads a string.
func (d *mp) str() string {
	b := d.strBytes()
	if len(b) == 0 {
		return ""
	}
	if d.shared != nil {
		return d.shared.intern(b)
	}
	for _, s := range d.recent {
		if len(s) == len(b) && s == string(b) {
			return s
		}
	}
	s := string(b)
	d.recent[d.next] = s
	d.next = (d.next + 1) % len(d.recent)
	return s
}

// A Decoder decodes commits as DecodeCommit does, and shares the strings
// that repeat from one commit to the next (the ids of runs, batches,
// calls, tools and workers): a string is allocated once while it stays in
// the decoder's table, and the events of every commit it decodes hold that
// one. The events are the same as DecodeCommit's otherwise. The zero
// value is ready; a Decoder is not safe for concurrent use.
type Decoder struct {
	strs [decoderStrings]string
}

// decoderStrings is the size of a Decoder's table (a power of two): a
// string takes the slot its hash names, in place of what was there.
const decoderStrings = 1024

// DecodeCommit decodes a commit body as the package's DecodeCommit does.
func (dec *Decoder) DecodeCommit(body []byte, headerTypes []string) ([]Event, error) {
	if evs, ok := decodeCommitFast(body, headerTypes, dec); ok {
		return evs, nil
	}
	return decodeCommitReflect(body, headerTypes)
}

// intern returns b as a string, the table's when it holds an equal one.
func (dec *Decoder) intern(b []byte) string {
	h := uint32(2166136261) // FNV-1a
	for _, c := range b {
		h = (h ^ uint32(c)) * 16777619
	}
	slot := &dec.strs[h&(decoderStrings-1)]
	if *slot == string(b) {
		return *slot
	}
	s := string(b)
	*slot = s
	return s
}

// sym reads a string that is usually one of the package's constants.
func (d *mp) sym() string {
	start := d.i
	b := d.strBytes()
	if s, ok := symbol(b); ok {
		return s
	}
	d.i = start
	return d.str()
}

// int64 reads an integer as the library's DecodeInt64 does (nil is 0, a
// uint64 wraps).
func (d *mp) int64() int64 {
	c := d.peek()
	if d.bad {
		return 0
	}
	if c <= 0x7f || c >= 0xe0 {
		d.i++
		return int64(int8(c))
	}
	d.i++
	switch c {
	case 0xc0:
		return 0
	case 0xcc:
		return int64(d.length(1))
	case 0xcd:
		return int64(d.length(2))
	case 0xce:
		return int64(uint32(d.length(4)))
	case 0xd0:
		return int64(int8(d.length(1)))
	case 0xd1:
		return int64(int16(d.length(2)))
	case 0xd2:
		return int64(int32(uint32(d.length(4))))
	case 0xcf, 0xd3:
		s := d.take(8)
		if d.bad {
			return 0
		}
		return int64(binary.BigEndian.Uint64(s))
	}
	d.bad = true
	return 0
}

// boolean reads a bool (nil is false).
func (d *mp) boolean() bool {
	switch d.peek() {
	case 0xc2, 0xc0:
		d.i++
		return false
	case 0xc3:
		d.i++
		return true
	}
	d.bad = true
	return false
}

// time reads a msgpack timestamp (extension -1) as the decoder registered
// in codec.go does: in UTC.
func (d *mp) time() time.Time {
	c := d.peek()
	if d.bad {
		return time.Time{}
	}
	var n int
	switch c {
	case 0xd6:
		n = 4
	case 0xd7:
		n = 8
	case 0xc7:
		if d.i+1 < len(d.b) && d.b[d.i+1] == 12 {
			d.i++
			n = 12
		}
	}
	if n == 0 || d.i+2+n > len(d.b) || d.b[d.i+1] != 0xff {
		d.bad = true
		return time.Time{}
	}
	b := d.b[d.i+2 : d.i+2+n]
	d.i += 2 + n
	switch n {
	case 4:
		return time.Unix(int64(binary.BigEndian.Uint32(b)), 0).UTC()
	case 8:
		v := binary.BigEndian.Uint64(b)
		return time.Unix(int64(v&0x00000003ffffffff), int64(v>>34)).UTC()
	default:
		return time.Unix(int64(binary.BigEndian.Uint64(b[4:])), int64(binary.BigEndian.Uint32(b))).UTC()
	}
}

// timePtr reads an optional time: nil is a nil pointer.
func (d *mp) timePtr() *time.Time {
	if d.peek() == 0xc0 && !d.bad {
		d.i++
		return nil
	}
	t := d.time()
	return &t
}

// isNil consumes a nil if it is next.
func (d *mp) isNil() bool {
	if d.peek() == 0xc0 && !d.bad {
		d.i++
		return true
	}
	return false
}

// seen marks a struct field as read; a second time is a duplicate key,
// which the fast path leaves to the reflective decoder.
func (d *mp) seen(set *uint32, bit uint) {
	if *set&(1<<bit) != 0 {
		d.bad = true
	}
	*set |= 1 << bit
}

// once returns set with a struct field marked as read, as seen does; the
// generated reads mark a field in the assignment that reads it.
func (d *mp) once(set uint32, bit uint) uint32 {
	d.seen(&set, bit)
	return set
}

// JSON values (RawJSON).

// rawJSON reads a value as canonical JSON text, as RawJSON.DecodeMsgpack
// does: nil is the empty RawJSON.
func (d *mp) rawJSON() RawJSON {
	if d.isNil() || d.bad {
		return nil
	}
	start := d.i
	out, ok := d.appendJSON(d.scratch[:0], 0)
	d.scratch = out[:0]
	if ok {
		return RawJSON(bytes.Clone(out))
	}
	d.i, d.bad = start, false
	sub := d.value()
	if d.bad {
		return nil
	}
	r, err := exactly(genericJSON, sub)
	if err != nil {
		d.bad = true
	}
	return r
}

// value skips one well-formed value and returns its bytes.
func (d *mp) value() []byte {
	if d.bad {
		return nil
	}
	rest, err := walkValue(d.b[d.i:], 0)
	if err != nil {
		d.bad = true
		return nil
	}
	end := len(d.b) - len(rest)
	sub := d.b[d.i:end]
	d.i = end
	return sub
}

// exactly runs one of the package's generic decoders on the encoding of one
// value, as the reflective path would; a panic of the msgpack library is an
// error here as it is in Unmarshal.
func exactly[T any](fn func(*msgpack.Decoder) (T, error), sub []byte) (v T, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v", ErrMalformed, r)
		}
	}()
	return fn(msgpack.NewDecoder(bytes.NewReader(sub)))
}

// appendJSON writes the next value as canonical JSON (what decodeValue and
// valueToJSON make of it) when that is simple: integers, strings that need
// no escaping, maps whose keys come sorted. It reports false for anything
// else (floats, escapes, unsorted or duplicate keys, deep nesting, what is
// not JSON), leaving the cursor anywhere.
func (d *mp) appendJSON(dst []byte, depth int) ([]byte, bool) {
	if depth > fastJSONDepth || d.i >= len(d.b) {
		return dst, false
	}
	c := d.b[d.i]
	d.i++
	switch {
	case c <= 0x7f || c >= 0xe0:
		return strconv.AppendInt(dst, int64(int8(c)), 10), true
	case c&0xf0 == 0x80:
		return d.appendObject(dst, int(c&0x0f), depth)
	case c&0xf0 == 0x90:
		return d.appendArray(dst, int(c&0x0f), depth)
	case c&0xe0 == 0xa0:
		return appendJSONString(dst, d.take(int(c&0x1f)), !d.bad)
	}
	switch c {
	case 0xc0:
		return append(dst, "null"...), true
	case 0xc2:
		return append(dst, "false"...), true
	case 0xc3:
		return append(dst, "true"...), true
	case 0xcc, 0xcd, 0xce, 0xd0, 0xd1, 0xd2, 0xcf, 0xd3:
		d.i--
		n := d.int64()
		if d.bad {
			return dst, false
		}
		if c == 0xcf && n < 0 {
			return strconv.AppendUint(dst, uint64(n), 10), true
		}
		return strconv.AppendInt(dst, n, 10), true
	case 0xd9, 0xda, 0xdb:
		s := d.take(d.length(1 << (c - 0xd9)))
		return appendJSONString(dst, s, !d.bad)
	case 0xdc, 0xdd:
		return d.appendArray(dst, d.length(2<<(c-0xdc)), depth)
	case 0xde, 0xdf:
		return d.appendObject(dst, d.length(2<<(c-0xde)), depth)
	}
	return dst, false
}

func (d *mp) appendArray(dst []byte, n, depth int) ([]byte, bool) {
	if d.bad || n > len(d.b)-d.i {
		return dst, false
	}
	dst = append(dst, '[')
	for k := 0; k < n; k++ {
		if k > 0 {
			dst = append(dst, ',')
		}
		var ok bool
		if dst, ok = d.appendJSON(dst, depth+1); !ok {
			return dst, false
		}
	}
	return append(dst, ']'), true
}

func (d *mp) appendObject(dst []byte, n, depth int) ([]byte, bool) {
	if d.bad || n > (len(d.b)-d.i)/2 {
		return dst, false
	}
	dst = append(dst, '{')
	var prev []byte
	for k := 0; k < n; k++ {
		if k > 0 {
			dst = append(dst, ',')
		}
		key := d.key()
		if d.bad || k > 0 && bytes.Compare(key, prev) <= 0 {
			return dst, false
		}
		prev = key
		var ok bool
		if dst, ok = appendJSONString(dst, key, true); !ok {
			return dst, false
		}
		dst = append(dst, ':')
		if dst, ok = d.appendJSON(dst, depth+1); !ok {
			return dst, false
		}
	}
	return append(dst, '}'), true
}

// appendJSONString writes s quoted when encoding/json would write it
// unchanged: valid UTF-8 with nothing to escape.
func appendJSONString(dst, s []byte, ok bool) ([]byte, bool) {
	if !ok || !plainText(s) {
		return dst, false
	}
	dst = append(dst, '"')
	dst = append(dst, s...)
	return append(dst, '"'), true
}

// plainText reports whether s is valid UTF-8 that encoding/json writes as
// it is (no control characters, quotes, backslashes, U+2028 or U+2029).
func plainText(s []byte) bool {
	ascii := true
	for i, c := range s {
		switch {
		case c < 0x20 || c == '"' || c == '\\':
			return false
		case c == 0xe2 && i+2 < len(s) && s[i+1] == 0x80 && (s[i+2] == 0xa8 || s[i+2] == 0xa9):
			return false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return ascii || utf8.Valid(s)
}

// Content blocks.

// blockList reads a []ContentBlock struct field as the library does: nil
// is a nil slice, an empty array an empty one; each element is decoded by
// ContentBlock.DecodeMsgpack (a nil element is left to the reflective
// decoder, which makes it a zero block that validBlocksOf refuses).
func (d *mp) blockList() []ContentBlock {
	n := d.arrayLen()
	if d.bad || n < 0 {
		return nil
	}
	out := make([]ContentBlock, 0, min(n, 16))
	for range n {
		if d.peek() == 0xc0 {
			d.bad = true
		}
		if d.bad {
			return nil
		}
		out = append(out, d.block())
	}
	return out
}

// block reads one content block as DecodeMsgpack does (decodeValue, then
// parseBlock).
func (d *mp) block() ContentBlock {
	start := d.i
	b := d.blockFast(0)
	if !d.bad {
		return b
	}
	d.bad = false
	d.i = start
	sub := d.value()
	if d.bad {
		return ContentBlock{}
	}
	b, err := exactly(func(dec *msgpack.Decoder) (ContentBlock, error) {
		v, err := decodeValue(dec, 0)
		if err != nil {
			return ContentBlock{}, err
		}
		return parseBlock(v, "block")
	}, sub)
	if err != nil {
		d.bad = true
	}
	return b
}

// blockFast reads the common blocks: text, tool_use, tool_result, json,
// with "type" first and every key at most once.
func (d *mp) blockFast(depth int) ContentBlock {
	var b ContentBlock
	if depth > fastJSONDepth {
		d.bad = true
		return b
	}
	c := d.peek()
	if !isMapCode(c) {
		d.bad = true
		return b
	}
	n := d.mapLen()
	if n < 1 || string(d.key()) != "type" {
		d.bad = true
		return b
	}
	b.Type = BlockType(d.plainSym())
	var set uint32
	for k := 1; k < n && !d.bad; k++ {
		key := d.key()
		switch {
		case b.Type == BlockText && string(key) == "text":
			d.seen(&set, 0)
			b.Text = d.plainStr()
		case b.Type == BlockToolUse && string(key) == "id":
			d.seen(&set, 1)
			b.ID = d.plainStr()
		case b.Type == BlockToolUse && string(key) == "name":
			d.seen(&set, 2)
			b.Name = d.plainStr()
		case b.Type == BlockToolUse && string(key) == "input":
			d.seen(&set, 3)
			b.Input = d.blockJSON(depth + 1)
		case b.Type == BlockToolResult && string(key) == "tool_use_id":
			d.seen(&set, 4)
			b.ToolUseID = d.plainStr()
		case b.Type == BlockToolResult && string(key) == "content":
			d.seen(&set, 5)
			b.Content = d.nestedBlocks(depth + 1)
		case b.Type == BlockToolResult && string(key) == "is_error":
			d.seen(&set, 6)
			b.IsError = d.boolean()
		case b.Type == BlockJSON && string(key) == "value":
			d.seen(&set, 7)
			b.Value = d.blockJSON(depth + 1)
		default:
			d.bad = true
		}
	}
	// The keys parseBlock requires.
	switch b.Type {
	case BlockText:
		d.require(set, 0)
	case BlockToolUse:
		d.require(set, 1, 2)
	case BlockToolResult:
		d.require(set, 4)
	case BlockJSON:
	default:
		d.bad = true
	}
	return b
}

func (d *mp) require(set uint32, bits ...uint) {
	for _, b := range bits {
		if set&(1<<b) == 0 {
			d.bad = true
		}
	}
}

// plainStr reads a string that decodeValue accepts (a str, valid UTF-8);
// nil, which parseBlock takes as missing, is left to the exact path.
func (d *mp) plainStr() string {
	c := d.peek()
	if c == 0xc4 || c == 0xc5 || c == 0xc6 || c == 0xc0 {
		d.bad = true
		return ""
	}
	start := d.i
	b := d.strBytes()
	if d.bad || !utf8.Valid(b) {
		d.bad = true
		return ""
	}
	if s, ok := symbol(b); ok {
		return s
	}
	d.i = start
	return d.str()
}

// plainSym is plainStr for a block type.
func (d *mp) plainSym() string {
	start := d.i
	b := d.key() // a str code, as decodeValue wants
	if d.bad {
		return ""
	}
	switch string(b) {
	case string(BlockText):
		return string(BlockText)
	case string(BlockToolUse):
		return string(BlockToolUse)
	case string(BlockToolResult):
		return string(BlockToolResult)
	case string(BlockJSON):
		return string(BlockJSON)
	}
	d.i = start
	d.bad = true
	return ""
}

// blockJSON reads a JSON value inside a block (valueToJSON of what
// decodeValue read: nil is the empty RawJSON).
func (d *mp) blockJSON(depth int) RawJSON {
	if d.isNil() || d.bad {
		return nil
	}
	out, ok := d.appendJSON(d.scratch[:0], depth)
	d.scratch = out[:0]
	if !ok {
		d.bad = true
		return nil
	}
	return RawJSON(bytes.Clone(out))
}

// nestedBlocks reads a tool_result's content as parseBlocks does: nil is a
// nil slice, an array a slice of its blocks.
func (d *mp) nestedBlocks(depth int) []ContentBlock {
	n := d.arrayLen()
	if d.bad || n < 0 {
		return nil
	}
	out := make([]ContentBlock, 0, min(n, 16))
	for range n {
		out = append(out, d.blockFast(depth+1))
		if d.bad {
			return nil
		}
	}
	return out
}
