package events

import (
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// The fast commit encoder. EncodeCommit writes each event's data with the
// writes generated into fastencode_gen.go (go generate, from the structs'
// msgpack tags), which call the encoder's own methods in the order the
// library's reflective struct encoding would: a map of the exported
// fields in their order, an omitempty field left out when the library
// finds it empty, and the content blocks and JSON values written by their
// EncodeMsgpack. So the bytes are the library's, without its reflection
// and the field list it builds per struct with omitempty fields
// (TestFastEncoderMatchesLibrary, FuzzFastEncoder); an event type the
// writes do not know is written by the library.

// menc writes with an msgpack.Encoder and keeps its first error.
type menc struct {
	enc *msgpack.Encoder
	err error
}

func (w *menc) null() {
	if w.err == nil {
		w.err = w.enc.EncodeNil()
	}
}

func (w *menc) mapLen(n int) {
	if w.err == nil {
		w.err = w.enc.EncodeMapLen(n)
	}
}

func (w *menc) arrayLen(n int) {
	if w.err == nil {
		w.err = w.enc.EncodeArrayLen(n)
	}
}

func (w *menc) str(s string) {
	if w.err == nil {
		w.err = w.enc.EncodeString(s)
	}
}

// int and uint write as the library does with compact integers (the
// encoders of Marshal and EncodeCommit use them).
func (w *menc) int(n int64) {
	if w.err == nil {
		w.err = w.enc.EncodeInt(n)
	}
}

func (w *menc) uint(n uint64) {
	if w.err == nil {
		w.err = w.enc.EncodeUint(n)
	}
}

func (w *menc) boolean(b bool) {
	if w.err == nil {
		w.err = w.enc.EncodeBool(b)
	}
}

func (w *menc) time(t time.Time) {
	if w.err == nil {
		w.err = w.enc.EncodeTime(t)
	}
}

func (w *menc) timePtr(t *time.Time) {
	if t == nil {
		w.null()
		return
	}
	w.time(*t)
}

// custom writes a JSON value with its own encoder, as the library does
// (which writes an empty one, nil or not, as nil).
func (w *menc) custom(v RawJSON) {
	if w.err == nil {
		w.err = v.EncodeMsgpack(w.enc)
	}
}

// blocks writes content blocks, as the library writes a slice of a type
// with its own encoder.
func (w *menc) blocks(bs []ContentBlock) {
	if bs == nil {
		w.null()
		return
	}
	w.arrayLen(len(bs))
	for i := range bs {
		if w.err != nil {
			return
		}
		w.err = bs[i].EncodeMsgpack(w.enc)
	}
}
