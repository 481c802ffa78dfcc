package events

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/vmihailenco/msgpack/v5"
)

// field is one key of an encoded map, in the order it is written.
type field struct {
	key string
	val any
}

// fields returns the keys a block carries: those of its type in a fixed
// order, then its uninterpreted ones in key order.
func (b ContentBlock) fields() []field {
	fs := b.typedFields()
	if len(b.Extra) == 0 {
		return fs
	}
	return append(fs, b.extraFields()...)
}

func (b ContentBlock) typedFields() []field {
	switch b.Type {
	case BlockText:
		return []field{{"type", string(b.Type)}, {"text", b.Text}}
	case BlockImage:
		return []field{{"type", string(b.Type)}, {"source", b.Source}}
	case BlockToolUse:
		in := b.Input
		if len(in) == 0 {
			in = RawJSON("null")
		}
		return []field{{"type", string(b.Type)}, {"id", b.ID}, {"name", b.Name}, {"input", in}}
	case BlockToolResult:
		content := b.Content
		if content == nil {
			content = []ContentBlock{}
		}
		return []field{{"type", string(b.Type)}, {"tool_use_id", b.ToolUseID}, {"content", content}, {"is_error", b.IsError}}
	case BlockJSON:
		v := b.Value
		if len(v) == 0 {
			v = RawJSON("null")
		}
		return []field{{"type", string(b.Type)}, {"value", v}}
	default:
		return []field{{"type", string(b.Type)}}
	}
}

// extraFields returns the uninterpreted keys in key order, each value as
// canonical JSON (CheckBlocks has made sure Extra is an object).
func (b ContentBlock) extraFields() []field {
	v, err := jsonToValue(b.Extra)
	m, ok := v.(map[string]any)
	if err != nil || !ok {
		return nil
	}
	fs := make([]field, 0, len(m))
	for _, k := range sortedKeys(m) {
		raw, _ := valueToJSON(m[k]) // parsed from JSON: always writes
		fs = append(fs, field{k, raw})
	}
	return fs
}

// blockKeys are the keys the engine interprets in a block of type t
// (unknown types: only "type").
func blockKeys(t BlockType) []string {
	switch t {
	case BlockText:
		return []string{"type", "text"}
	case BlockImage:
		return []string{"type", "source"}
	case BlockToolUse:
		return []string{"type", "id", "name", "input"}
	case BlockToolResult:
		return []string{"type", "tool_use_id", "content", "is_error"}
	case BlockJSON:
		return []string{"type", "value"}
	default:
		return []string{"type"}
	}
}

// ForbiddenCallFields may never be in a submission or in one of its
// tool_use blocks: placement and recovery are the operator's, not the
// model's.
var ForbiddenCallFields = []string{"target", "kind", "pool", "recovery", "capability"}

// StrictBlocks refuses a block of a type the engine does not interpret, or
// one that carries keys it does not interpret, at any depth: for what the
// operator's own programs write (a sandbox tool's JSON output), where such
// a block is a mistake to report, not a provider's content to keep.
func StrictBlocks(bs []ContentBlock) error {
	for i, b := range bs {
		if len(blockKeys(b.Type)) == 1 {
			return fmt.Errorf("content[%d].type: unknown content block type %q", i, b.Type)
		}
		if len(b.Extra) > 0 {
			var extra map[string]json.RawMessage
			_ = json.Unmarshal(b.Extra, &extra)
			keys := make([]string, 0, len(extra))
			for k := range extra {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			return fmt.Errorf("content[%d]: unknown field %s in a %s block", i, quoteAll(keys), b.Type)
		}
		if err := StrictBlocks(b.Content); err != nil {
			return fmt.Errorf("content[%d].%v", i, err)
		}
	}
	return nil
}

// What a key of a block of type t is: one of its type's, one a call may
// not carry, or free (kept in Extra).
const (
	keyFree = iota
	keyTyped
	keyForbidden
)

func keyOf(t BlockType, k string) int {
	switch {
	case slices.Contains(blockKeys(t), k):
		return keyTyped
	case t == BlockToolUse && slices.Contains(ForbiddenCallFields, k):
		return keyForbidden
	}
	return keyFree
}

// extraOf returns the keys of m outside the type's as a JSON object (nil:
// none); a forbidden key of a tool_use block is refused.
func extraOf(m map[string]any, t BlockType, path string) (RawJSON, error) {
	var extra map[string]any
	for k, v := range m {
		switch keyOf(t, k) {
		case keyTyped:
			continue
		case keyForbidden:
			return nil, Refuse(CodeForbiddenField, "%s.%s: a call cannot choose placement or recovery", path, k)
		}
		if extra == nil {
			extra = map[string]any{}
		}
		extra[k] = v
	}
	if extra == nil {
		return nil, nil
	}
	return valueToJSON(extra)
}

func (s *ImageSource) fields() []field {
	if s == nil {
		return nil
	}
	if s.Type == "url" {
		return []field{{"type", s.Type}, {"url", s.URL}}
	}
	return []field{{"type", s.Type}, {"media_type", s.MediaType}, {"data", s.Data}}
}

func encodeFields(enc *msgpack.Encoder, fs []field) error {
	if err := enc.EncodeMapLen(len(fs)); err != nil {
		return err
	}
	for _, f := range fs {
		if err := enc.EncodeString(f.key); err != nil {
			return err
		}
		if err := enc.Encode(f.val); err != nil {
			return err
		}
	}
	return nil
}

func marshalFields(fs []field) ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteByte('{')
	for i, f := range fs {
		if i > 0 {
			buf.WriteByte(',')
		}
		if err := writeJSON(&buf, f.key); err != nil {
			return nil, err
		}
		buf.WriteByte(':')
		if err := writeJSON(&buf, f.val); err != nil {
			return nil, err
		}
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

// EncodeMsgpack implements msgpack.CustomEncoder.
func (b ContentBlock) EncodeMsgpack(enc *msgpack.Encoder) error {
	if err := CheckBlocks([]ContentBlock{b}); err != nil {
		return err
	}
	if len(b.Extra) == 0 {
		switch b.Type {
		case BlockText, BlockToolUse:
			return b.encodeTyped(enc)
		}
	}
	return encodeFields(enc, b.fields())
}

// encodeTyped writes a text or tool_use block without extra keys as
// encodeFields writes its typedFields, without boxing each field
// (TestBlockEncodedTyped).
func (b ContentBlock) encodeTyped(enc *msgpack.Encoder) error {
	if b.Type == BlockText {
		return errors.Join(enc.EncodeMapLen(2), enc.EncodeString("type"), enc.EncodeString(string(b.Type)),
			enc.EncodeString("text"), enc.EncodeString(b.Text))
	}
	in := b.Input
	if len(in) == 0 {
		in = RawJSON("null")
	}
	return errors.Join(enc.EncodeMapLen(4), enc.EncodeString("type"), enc.EncodeString(string(b.Type)),
		enc.EncodeString("id"), enc.EncodeString(b.ID), enc.EncodeString("name"), enc.EncodeString(b.Name),
		enc.EncodeString("input"), in.EncodeMsgpack(enc))
}

// DecodeMsgpack implements msgpack.CustomDecoder; it is strict.
func (b *ContentBlock) DecodeMsgpack(dec *msgpack.Decoder) error {
	return b.set(decodeValue(dec, 0))
}

// MarshalJSON implements json.Marshaler.
func (b ContentBlock) MarshalJSON() ([]byte, error) {
	if len(b.Extra) > 0 {
		if err := CheckBlocks([]ContentBlock{b}); err != nil {
			return nil, err // Extra not an object, or shadowing a key of the type
		}
	}
	return marshalFields(b.fields())
}

// UnmarshalJSON implements json.Unmarshaler; it is strict.
func (b *ContentBlock) UnmarshalJSON(data []byte) error { return b.set(jsonToValue(data)) }

// set stores in b the block parsed from v; err is the error of reading v
// off the wire, returned as it is.
func (b *ContentBlock) set(v any, err error) error {
	if err != nil {
		return err
	}
	blk, err := parseBlock(v, "block")
	if err != nil {
		return err
	}
	*b = blk
	return nil
}

// EncodeMsgpack implements msgpack.CustomEncoder.
func (s *ImageSource) EncodeMsgpack(enc *msgpack.Encoder) error {
	if s == nil {
		return enc.EncodeNil()
	}
	return encodeFields(enc, s.fields())
}

// DecodeMsgpack implements msgpack.CustomDecoder.
func (s *ImageSource) DecodeMsgpack(dec *msgpack.Decoder) error {
	return s.set(decodeValue(dec, 0))
}

// MarshalJSON implements json.Marshaler.
func (s *ImageSource) MarshalJSON() ([]byte, error) {
	if s == nil {
		return []byte("null"), nil
	}
	return marshalFields(s.fields())
}

// UnmarshalJSON implements json.Unmarshaler.
func (s *ImageSource) UnmarshalJSON(data []byte) error { return s.set(jsonToValue(data)) }

// set stores in s the image source parsed from v; err is the error of
// reading v off the wire, returned as it is.
func (s *ImageSource) set(v any, err error) error {
	if err != nil {
		return err
	}
	src, err := parseImageSource(v, "source")
	if err != nil {
		return err
	}
	*s = *src
	return nil
}

// parseBlock reads a content block from a generic value: the keys of its
// type strictly (each of the right kind), every other key and every block
// of a type the engine does not interpret into Extra, as it came.
func parseBlock(v any, path string) (ContentBlock, error) {
	m, err := object(v, path)
	if err != nil {
		return ContentBlock{}, err
	}
	typ, err := str(m, "type", path, true)
	if err != nil {
		return ContentBlock{}, err
	}
	if typ == "" {
		return ContentBlock{}, undecodablef("%s.type: empty", path)
	}
	b := ContentBlock{Type: BlockType(typ)}
	if b.Extra, err = extraOf(m, b.Type, path); err != nil {
		return b, err
	}
	switch b.Type {
	case BlockText:
		b.Text, err = str(m, "text", path, true)
	case BlockImage:
		b.Source, err = parseImageSource(m["source"], path+".source")
	case BlockToolUse:
		if b.ID, err = str(m, "id", path, true); err != nil {
			return b, err
		}
		if b.Name, err = str(m, "name", path, true); err != nil {
			return b, err
		}
		b.Input, err = valueToJSON(m["input"])
	case BlockToolResult:
		if b.ToolUseID, err = str(m, "tool_use_id", path, true); err != nil {
			return b, err
		}
		if b.Content, err = parseBlocks(m["content"], path+".content"); err != nil {
			return b, err
		}
		b.IsError, err = boolean(m, "is_error", path)
	case BlockJSON:
		b.Value, err = valueToJSON(m["value"])
	}
	return b, err
}

func parseBlocks(v any, path string) ([]ContentBlock, error) {
	if v == nil {
		return nil, nil
	}
	arr, ok := v.([]any)
	if !ok {
		return nil, undecodablef("%s: want an array of content blocks, got %s", path, kindOf(v))
	}
	out := make([]ContentBlock, 0, len(arr))
	for i, e := range arr {
		b, err := parseBlock(e, fmt.Sprintf("%s[%d]", path, i))
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

func parseImageSource(v any, path string) (*ImageSource, error) {
	m, err := object(v, path)
	if err != nil {
		return nil, err
	}
	typ, err := str(m, "type", path, true)
	if err != nil {
		return nil, err
	}
	s := &ImageSource{Type: typ}
	switch typ {
	case "base64":
		if err := only(m, path, "type", "media_type", "data"); err != nil {
			return nil, err
		}
		if s.MediaType, err = str(m, "media_type", path, true); err != nil {
			return nil, err
		}
		s.Data, err = str(m, "data", path, true)
	case "url":
		if err := only(m, path, "type", "url"); err != nil {
			return nil, err
		}
		s.URL, err = str(m, "url", path, true)
	default:
		return nil, undecodablef("%s.type: unknown image source type %q", path, typ)
	}
	if err != nil {
		return nil, err
	}
	return s, nil
}

// writeJSON appends v as JSON without HTML escaping, like canonical JSON.
func writeJSON(buf *bytes.Buffer, v any) error {
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return err
	}
	buf.Truncate(buf.Len() - 1) // the encoder's newline
	return nil
}
