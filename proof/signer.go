package proof

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nkeys"
)

// Signer signs an engine's commits in batches: Seal hands it a commit's
// hash and returns once a signature covers it. One goroutine (Run) signs;
// every commit that waits while it signs goes into the next batch.
type Signer struct {
	// priv is the key pair's private key, derived from its seed once
	// (nkeys derives it again at each Sign).
	priv ed25519.PrivateKey
	key  string
	reqs chan sealReq
	done chan struct{}
	once sync.Once
	// vouch, when set, learns every root this signer signs as verified:
	// the engine's own projector so checks its own commits without an
	// ed25519 verification.
	vouch atomic.Pointer[Keyring]
}

// VouchTo makes k take every root this signer signs from now on as
// verified (a signature it made itself). k must trust the signer's key
// for its commits to verify.
func (s *Signer) VouchTo(k *Keyring) { s.vouch.Store(k) }

type sealReq struct {
	commit Hash
	reply  chan Seal
}

// ErrClosed is returned by Seal once the signer has stopped.
var ErrClosed = errors.New("proof: signer stopped")

// NewSigner signs with kp, an nkey pair (ed25519) with its seed.
func NewSigner(kp nkeys.KeyPair) (*Signer, error) {
	key, err := kp.PublicKey()
	if err != nil {
		return nil, fmt.Errorf("proof: signing key: %w", err)
	}
	seed, err := kp.Seed()
	if err != nil {
		return nil, fmt.Errorf("proof: signing key %s: no seed: %w", key, err)
	}
	_, raw, err := nkeys.DecodeSeed(seed)
	if err != nil {
		return nil, fmt.Errorf("proof: signing key %s: %w", key, err)
	}
	return &Signer{priv: ed25519.NewKeyFromSeed(raw), key: key, reqs: make(chan sealReq, maxBatch), done: make(chan struct{})}, nil
}

// Key is the signer's public key: the Toolbatch-Signer of its commits.
func (s *Signer) Key() string { return s.key }

// Run signs until ctx ends or Close; then Seal fails with ErrClosed.
func (s *Signer) Run(ctx context.Context) {
	defer s.Close()
	batch := make([]sealReq, 0, maxBatch)
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.done:
			return
		case r := <-s.reqs:
			batch = append(batch[:0], r)
		}
		if len(s.reqs) == 0 {
			// Alone: let the goroutines that can run (under load,
			// commits on their way here) run first, so that one
			// signature covers them too; without this a batch was
			// mostly one commit even under load (docs/performance.md).
			// With nothing else to run, the yield returns at once.
			runtime.Gosched()
		}
	more:
		for len(batch) < maxBatch {
			select {
			case r := <-s.reqs:
				batch = append(batch, r)
			default:
				break more
			}
		}
		s.sign(batch)
	}
}

// Close stops the signer.
func (s *Signer) Close() { s.once.Do(func() { close(s.done) }) }

func (s *Signer) sign(batch []sealReq) {
	leaves := make([]Hash, len(batch))
	for i, r := range batch {
		leaves[i] = leafHash(r.commit)
	}
	root, paths := tree(leaves)
	sig := ed25519.Sign(s.priv, rootMessage(root))
	if k := s.vouch.Load(); k != nil {
		k.verified(rootKey{signer: s.key, root: root, sig: string(sig)})
	}
	for i, r := range batch {
		r.reply <- Seal{Sig: sig, Index: i, Size: len(batch), Path: paths[i]}
	}
}

// Seal returns the seal of a commit: a signature of the root of the batch
// it was signed in, and its audit path in that batch.
func (s *Signer) Seal(ctx context.Context, commit Hash) (Seal, error) {
	r := sealReq{commit: commit, reply: make(chan Seal, 1)}
	select {
	case s.reqs <- r:
	case <-s.done:
		return Seal{}, ErrClosed
	case <-ctx.Done():
		return Seal{}, ctx.Err()
	}
	select {
	case res := <-r.reply:
		return res, nil
	case <-s.done:
		// signed before it stopped, or never
		select {
		case res := <-r.reply:
			return res, nil
		default:
			return Seal{}, ErrClosed
		}
	case <-ctx.Done():
		return Seal{}, ctx.Err()
	}
}

// SignCheckpoint signs a checkpoint as this signer.
func (s *Signer) SignCheckpoint(c Checkpoint) (Checkpoint, error) {
	c.Signer = s.key
	sig := ed25519.Sign(s.priv, c.message())
	c.Sig = b64.EncodeToString(sig)
	return c, nil
}
