package proof

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/toolbatch/toolbatch/protocol"
)

// Head is the hash chain over every message of the events stream, in
// stream order: its head after the message at Seq, and how many messages
// it covers.
type Head struct {
	Seq     uint64
	Commits uint64
	Hash    Hash
}

const headTag = "toolbatch head v1\x00"

// Add folds the message at seq: its commit's hash and its signature
// headers as stored (so that a signature stripped or replaced changes the
// head too).
func (h *Head) Add(seq uint64, commit Hash, sig, proof string) {
	d := sha256.New()
	d.Write([]byte(headTag))
	d.Write(h.Hash[:])
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], seq)
	d.Write(n[:])
	d.Write(commit[:])
	for _, s := range []string{sig, proof} {
		var l [binary.MaxVarintLen64]byte
		d.Write(l[:binary.PutUvarint(l[:], uint64(len(s)))])
		d.Write([]byte(s))
	}
	d.Sum(h.Hash[:0])
	h.Seq = seq
	h.Commits++
}

// AddMessage folds a stored message (Read's headers).
func (h *Head) AddMessage(seq uint64, m Message) {
	c, _, err := Read(m)
	if err != nil {
		// a message whose headers don't parse is folded as it is: the
		// head covers its bytes all the same
		c = Commit{Subject: m.Subject, Types: m.Header[protocol.HeaderEvent], Body: m.Body}
	}
	h.Add(seq, c.Hash(), first(m.Header, protocol.HeaderSig), first(m.Header, protocol.HeaderSigProof))
}

// Checkpoint is a signed head of the events stream: the stream, the
// sequence the head is at, how many messages it covers, the head, when it
// was made, and the signer with its signature.
type Checkpoint struct {
	Stream  string    `json:"stream"`
	Seq     uint64    `json:"seq"`
	Commits uint64    `json:"commits"`
	Head    string    `json:"head"`
	At      time.Time `json:"at"`
	Signer  string    `json:"signer"`
	Sig     string    `json:"sig"`
}

// NewCheckpoint is the unsigned checkpoint of a head.
func NewCheckpoint(stream string, h Head, at time.Time) Checkpoint {
	return Checkpoint{Stream: stream, Seq: h.Seq, Commits: h.Commits, Head: h.Hash.String(), At: at.UTC().Truncate(time.Millisecond)}
}

const checkpointTag = "toolbatch checkpoint v1\x00"

// message is what a checkpoint's signature signs.
func (c Checkpoint) message() []byte {
	b := []byte(checkpointTag)
	for _, s := range []string{c.Stream, strconv.FormatUint(c.Seq, 10), strconv.FormatUint(c.Commits, 10), c.Head,
		c.At.UTC().Format(time.RFC3339Nano), c.Signer} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	return b
}

// Encode is the checkpoint as one JSON line (what is published, and what
// replay checkpoint prints).
func (c Checkpoint) Encode() []byte {
	b, _ := json.Marshal(c)
	return b
}

// DecodeCheckpoint reads a checkpoint's JSON.
func DecodeCheckpoint(data []byte) (Checkpoint, error) {
	var c Checkpoint
	if err := json.Unmarshal(data, &c); err != nil {
		return c, fmt.Errorf("%w: checkpoint: %v", ErrMalformed, err)
	}
	if c.Stream == "" || c.Seq == 0 || c.Signer == "" || c.Sig == "" {
		return c, fmt.Errorf("%w: checkpoint: stream, seq, signer and sig are required", ErrMalformed)
	}
	if _, err := ParseHash(c.Head); err != nil {
		return c, fmt.Errorf("checkpoint head: %w", err)
	}
	return c, nil
}
