package events

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// Codec errors.
var (
	// ErrUnknownEventType is returned for an event type that is not registered.
	ErrUnknownEventType = errors.New("events: unknown event type")
	// ErrUnknownSchemaVersion is returned for a registered type with a schema
	// version this build does not know.
	ErrUnknownSchemaVersion = errors.New("events: unknown schema version")
	// ErrMalformed is returned for bytes that are not a valid encoding.
	ErrMalformed = errors.New("events: malformed encoding")
	// ErrTypeMismatch is returned when a commit's headers name other types
	// than its body holds.
	ErrTypeMismatch = errors.New("events: header types differ from the body")
)

func init() {
	// Times decode as UTC, so that a folded state does not depend on the
	// machine's zone and equal events compare equal.
	msgpack.RegisterExtDecoder(-1, time.Time{}, func(d *msgpack.Decoder, v reflect.Value, extLen int) error {
		b := make([]byte, extLen)
		if err := d.ReadFull(b); err != nil {
			return err
		}
		var tm time.Time
		switch extLen {
		case 4:
			tm = time.Unix(int64(binary.BigEndian.Uint32(b)), 0)
		case 8:
			n := binary.BigEndian.Uint64(b)
			tm = time.Unix(int64(n&0x00000003ffffffff), int64(n>>34))
		case 12:
			tm = time.Unix(int64(binary.BigEndian.Uint64(b[4:])), int64(binary.BigEndian.Uint32(b)))
		default:
			return fmt.Errorf("msgpack: invalid ext len=%d decoding time", extLen)
		}
		v.Set(reflect.ValueOf(tm.UTC()))
		return nil
	})
}

var encPool = sync.Pool{New: func() any {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.SetSortMapKeys(true)
	enc.UseCompactInts(true)
	return &pooledEncoder{buf: &buf, enc: enc}
}}

type pooledEncoder struct {
	buf *bytes.Buffer
	enc *msgpack.Encoder
}

// Marshal encodes v as msgpack with sorted map keys and compact integers,
// so that equal values always give equal bytes.
func Marshal(v any) ([]byte, error) {
	p := encPool.Get().(*pooledEncoder)
	defer encPool.Put(p)
	p.buf.Reset()
	if err := p.enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.Clone(p.buf.Bytes()), nil
}

// Unmarshal decodes msgpack into v. It is lenient about unknown keys (newer
// writers may add fields) but not about types; trailing bytes are an error.
func Unmarshal(b []byte, v any) (err error) {
	defer func() {
		// The msgpack library can panic on some hostile inputs; no input may
		// crash a decoder of ours.
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v", ErrMalformed, r)
		}
	}()
	if err := checkShape(b); err != nil {
		return err
	}
	r := bytes.NewReader(b)
	dec := msgpack.NewDecoder(r)
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if r.Len() != 0 {
		return fmt.Errorf("%w: %d trailing bytes", ErrMalformed, r.Len())
	}
	if vb, ok := v.(interface{ CheckBlocks() error }); ok {
		return vb.CheckBlocks()
	}
	return nil
}

// envelope is one event in a commit body.
type envelope struct {
	Type          Type               `msgpack:"type"`
	SchemaVersion int                `msgpack:"schema_version"`
	Data          msgpack.RawMessage `msgpack:"data"`
}

// EncodeCommit encodes events as one commit body: a msgpack array of
// {type, schema_version, data} maps. It also returns the type names for the
// Toolbatch-Event header, in order.
//
// It writes the body in one pass, each envelope as the encoder writes the
// envelope struct (a map of its three fields in their order) with the
// event's encoding in place of its data: the bytes Marshal([]envelope)
// gives (TestEncodeCommitAsEnvelopes).
func EncodeCommit(evs []Event) ([]byte, []string, error) {
	types := make([]string, len(evs))
	p := encPool.Get().(*pooledEncoder)
	defer encPool.Put(p)
	p.buf.Reset()
	enc := p.enc
	if err := enc.EncodeArrayLen(len(evs)); err != nil {
		return nil, nil, err
	}
	w := menc{enc: enc}
	for i, e := range evs {
		if e == nil {
			return nil, nil, fmt.Errorf("%w: nil event at %d", ErrMalformed, i)
		}
		t := e.EventType()
		if _, ok := registry[t]; !ok {
			return nil, nil, fmt.Errorf("%w: %q", ErrUnknownEventType, t)
		}
		if err := errors.Join(enc.EncodeMapLen(3), enc.EncodeString("type"), enc.EncodeString(string(t)),
			enc.EncodeString("schema_version"), enc.EncodeInt(SchemaVersion), enc.EncodeString("data")); err != nil {
			return nil, nil, err
		}
		if !w.event(e) { // a type without generated writes: the library's
			w.err = enc.Encode(e)
		}
		if w.err != nil {
			return nil, nil, fmt.Errorf("encode %s: %w", t, w.err)
		}
		types[i] = string(t)
	}
	return bytes.Clone(p.buf.Bytes()), types, nil
}

// DecodeCommit decodes a commit body. When headerTypes is not nil, it must
// list the body's types in order.
//
// It reads the body with the fast decoders of fastdecode.go (their reads
// of the structs are generated into fastdecode_gen.go), and with the
// reflective decoder (decodeCommitReflect) whenever those cannot:
// the two agree on everything the first accepts, and every refusal comes
// from the second.
func DecodeCommit(body []byte, headerTypes []string) ([]Event, error) {
	if evs, ok := decodeCommitFast(body, headerTypes, nil); ok {
		return evs, nil
	}
	return decodeCommitReflect(body, headerTypes)
}

// decodeCommitReflect decodes a commit body with the msgpack library's
// reflection: the reference decoder.
func decodeCommitReflect(body []byte, headerTypes []string) ([]Event, error) {
	var envs []envelope
	if err := Unmarshal(body, &envs); err != nil {
		return nil, err
	}
	if len(envs) == 0 {
		return nil, fmt.Errorf("%w: empty commit", ErrMalformed)
	}
	if headerTypes != nil && len(headerTypes) != len(envs) {
		return nil, fmt.Errorf("%w: %d header types, %d events", ErrTypeMismatch, len(headerTypes), len(envs))
	}
	out := make([]Event, len(envs))
	for i, env := range envs {
		if headerTypes != nil && headerTypes[i] != string(env.Type) {
			return nil, fmt.Errorf("%w: header %q, body %q at %d", ErrTypeMismatch, headerTypes[i], env.Type, i)
		}
		e, err := DecodeEvent(env.Type, env.SchemaVersion, env.Data)
		if err != nil {
			return nil, err
		}
		out[i] = e
	}
	return out, nil
}

// DecodeEvent decodes one event's data written with the given type and
// schema version.
func DecodeEvent(t Type, version int, data []byte) (Event, error) {
	versions, ok := registry[t]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownEventType, t)
	}
	newEvent, ok := versions[version]
	if !ok {
		return nil, fmt.Errorf("%w: %s version %d", ErrUnknownSchemaVersion, t, version)
	}
	e := newEvent()
	if err := Unmarshal(data, e); err != nil {
		return nil, fmt.Errorf("decode %s v%d: %w", t, version, err)
	}
	if err := validBlocksOf(e); err != nil {
		return nil, fmt.Errorf("decode %s v%d: %w", t, version, err)
	}
	return e, nil
}

// validBlocksOf checks the content blocks an event carries: the msgpack
// library decodes a nil block as a zero block without asking the block's
// decoder, and a zero block must never be accepted.
func validBlocksOf(e Event) error {
	switch ev := e.(type) {
	case *BatchSubmitted:
		return CheckBlocks(ev.Assistant.Content)
	case *CallGated:
		if ev.Output != nil {
			return CheckBlocks(ev.Output.Content)
		}
	case *CallCompleted:
		return CheckBlocks(ev.Output.Content)
	case *BatchFinalized:
		return CheckBlocks(ev.Results)
	}
	return nil
}
