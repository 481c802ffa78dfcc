package proof

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/toolbatch/toolbatch/protocol"
)

// Errors of verification. Each failure wraps one, with what was seen.
var (
	// ErrUnsigned: the commit carries no signature.
	ErrUnsigned = errors.New("proof: unsigned")
	// ErrUnknownKey: the signer is not a key of the keyring.
	ErrUnknownKey = errors.New("proof: signed by a key that is not pinned")
	// ErrRevoked: the key was revoked before this sequence.
	ErrRevoked = errors.New("proof: signed by a revoked key")
	// ErrBadSignature: the signature does not verify.
	ErrBadSignature = errors.New("proof: signature does not verify")
	// ErrMalformed: a header of the proof does not parse.
	ErrMalformed = errors.New("proof: malformed")
	// ErrChain: the commit does not name its run's previous commit.
	ErrChain = errors.New("proof: the run's hash chain is broken")
)

// Hash is a SHA-256 digest.
type Hash [sha256.Size]byte

// ZeroHash is the previous hash of a run's first commit.
var ZeroHash Hash

// String is the hash in lower-case hex.
func (h Hash) String() string { return hex.EncodeToString(h[:]) }

// ParseHash reads a hash in hex.
func ParseHash(s string) (Hash, error) {
	var h Hash
	if len(s) != 2*len(h) {
		return h, fmt.Errorf("%w: hash %q: want %d hex digits", ErrMalformed, s, 2*len(h))
	}
	if _, err := hex.Decode(h[:], []byte(s)); err != nil {
		return h, fmt.Errorf("%w: hash %q: %v", ErrMalformed, s, err)
	}
	return h, nil
}

// Commit is what a commit's hash covers: a message of the events stream
// with the headers that place it in its run's chain.
type Commit struct {
	Subject  string
	Prev     uint64 // Toolbatch-Prev
	PrevHash Hash   // Toolbatch-Prev-Hash (ZeroHash when absent)
	Signer   string // Toolbatch-Signer ("" when unsigned)
	Types    []string
	Body     []byte
}

const commitTag = "toolbatch commit v1"

// Follows checks that the commit names prev, the hash of its run's
// previous commit as read, as its previous hash (ErrChain).
func (c Commit) Follows(prev Hash) error {
	if c.PrevHash != prev {
		return fmt.Errorf("%w: the commit names %s as its previous commit's hash, the run's previous commit read hashes to %s",
			ErrChain, c.PrevHash.String()[:16], prev.String()[:16])
	}
	return nil
}

// Hash is the commit's hash: what the run's next commit names as its
// previous hash, and the leaf its signature covers.
func (c Commit) Hash() Hash {
	h := sha256.New()
	field := func(b []byte) {
		var n [binary.MaxVarintLen64]byte
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(b)))])
		h.Write(b)
	}
	var scratch [96]byte // the strings' bytes, one buffer for all of them
	text := func(s string) { field(append(scratch[:0], s...)) }
	text(commitTag)
	text(c.Subject)
	field(strconv.AppendUint(scratch[:0], c.Prev, 10))
	field(c.PrevHash[:])
	text(c.Signer)
	field(strconv.AppendInt(scratch[:0], int64(len(c.Types)), 10))
	for _, t := range c.Types {
		text(t)
	}
	field(c.Body)
	var out Hash
	h.Sum(out[:0])
	return out
}

// Message is a stored message as a verifier reads it: NATS headers (or an
// export's), its subject and body.
type Message struct {
	Subject string
	Header  map[string][]string
	Body    []byte
}

func first(h map[string][]string, name string) string {
	if v := h[name]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// Read returns the commit of a message, and its seal when it is signed
// (nil when it carries none of the signature headers).
func Read(m Message) (Commit, *Seal, error) {
	c := Commit{Subject: m.Subject, Types: m.Header[protocol.HeaderEvent], Body: m.Body, Signer: first(m.Header, protocol.HeaderSigner)}
	prev, err := strconv.ParseUint(first(m.Header, protocol.HeaderPrev), 10, 64)
	if err != nil {
		return c, nil, fmt.Errorf("%w: header %s: %v", ErrMalformed, protocol.HeaderPrev, err)
	}
	c.Prev = prev
	if ph := first(m.Header, protocol.HeaderPrevHash); ph != "" {
		if c.PrevHash, err = ParseHash(ph); err != nil {
			return c, nil, fmt.Errorf("header %s: %w", protocol.HeaderPrevHash, err)
		}
	}
	sig, path := first(m.Header, protocol.HeaderSig), first(m.Header, protocol.HeaderSigProof)
	if c.Signer == "" && sig == "" && path == "" {
		return c, nil, nil
	}
	s, err := ParseSeal(sig, path)
	if err != nil {
		return c, nil, err
	}
	return c, &s, nil
}

// Seal is a commit's signature: the signature of its batch's root and
// the commit's place in that batch.
type Seal struct {
	Sig         []byte
	Index, Size int
	Path        []Hash
}

var b64 = base64.RawURLEncoding

// Headers are the seal's two header values (Toolbatch-Sig,
// Toolbatch-Sig-Proof).
func (s Seal) Headers() (sig, proof string) {
	var b strings.Builder
	b.WriteString(strconv.Itoa(s.Index))
	b.WriteByte('/')
	b.WriteString(strconv.Itoa(s.Size))
	b.WriteByte(':')
	for i, h := range s.Path {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(b64.EncodeToString(h[:]))
	}
	return b64.EncodeToString(s.Sig), b.String()
}

// ParseSeal reads a seal's header values.
func ParseSeal(sig, proof string) (Seal, error) {
	var s Seal
	raw, err := b64.DecodeString(sig)
	if err != nil || len(raw) != 64 {
		return s, fmt.Errorf("%w: header %s: want a 64-byte signature in base64url", ErrMalformed, protocol.HeaderSig)
	}
	s.Sig = raw
	place, path, ok := strings.Cut(proof, ":")
	i, n, ok2 := strings.Cut(place, "/")
	idx, err1 := strconv.Atoi(i)
	size, err2 := strconv.Atoi(n)
	if !ok || !ok2 || err1 != nil || err2 != nil || size < 1 || idx < 0 || idx >= size || size > maxBatch {
		return s, fmt.Errorf("%w: header %s %q: want <index>/<size>:<path>", ErrMalformed, protocol.HeaderSigProof, proof)
	}
	s.Index, s.Size = idx, size
	if path != "" {
		for _, p := range strings.Split(path, ",") {
			var h Hash
			if b, err := b64.DecodeString(p); err != nil || len(b) != len(h) {
				return s, fmt.Errorf("%w: header %s: a path hash is not 32 bytes in base64url", ErrMalformed, protocol.HeaderSigProof)
			} else {
				copy(h[:], b)
			}
			s.Path = append(s.Path, h)
		}
	}
	return s, nil
}

// Root recomputes the root of the seal's batch from the commit's hash and
// the audit path (RFC 9162 §2.1.3.2).
func (s Seal) Root(commit Hash) (Hash, error) {
	fn, sn := uint64(s.Index), uint64(s.Size-1)
	r := leafHash(commit)
	for _, p := range s.Path {
		if sn == 0 {
			return Hash{}, fmt.Errorf("%w: audit path longer than the batch", ErrBadSignature)
		}
		if fn&1 == 1 || fn == sn {
			r = nodeHash(p, r)
			for fn&1 == 0 && fn != 0 {
				fn >>= 1
				sn >>= 1
			}
		} else {
			r = nodeHash(r, p)
		}
		fn >>= 1
		sn >>= 1
	}
	if sn != 0 {
		return Hash{}, fmt.Errorf("%w: audit path shorter than the batch", ErrBadSignature)
	}
	return r, nil
}

func leafHash(h Hash) Hash {
	var b [1 + len(h)]byte
	copy(b[1:], h[:])
	return sha256.Sum256(b[:])
}

func nodeHash(l, r Hash) Hash {
	var b [1 + 2*len(l)]byte
	b[0] = 1
	copy(b[1:], l[:])
	copy(b[1+len(l):], r[:])
	return sha256.Sum256(b[:])
}

// tree returns the root of leaves (already leaf hashes) and each leaf's
// audit path (RFC 9162 §2.1.1, §2.1.3.1).
func tree(leaves []Hash) (Hash, [][]Hash) {
	paths := make([][]Hash, len(leaves))
	var build func(lo, hi int) Hash
	build = func(lo, hi int) Hash {
		if hi-lo == 1 {
			return leaves[lo]
		}
		k := 1
		for k*2 < hi-lo {
			k *= 2
		}
		l, r := build(lo, lo+k), build(lo+k, hi)
		for i := lo; i < lo+k; i++ {
			paths[i] = append(paths[i], r)
		}
		for i := lo + k; i < hi; i++ {
			paths[i] = append(paths[i], l)
		}
		return nodeHash(l, r)
	}
	return build(0, len(leaves)), paths
}

const rootTag = "toolbatch commits v1\x00"

// rootMessage is what a batch's signature signs.
func rootMessage(root Hash) []byte { return append([]byte(rootTag), root[:]...) }

// maxBatch bounds the commits one signature covers.
const maxBatch = 1024
