package proof

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/nats-io/nkeys"
	"go.yaml.in/yaml/v3"
)

// Key is an engine's public signing key as pinned: its nkey, a name for
// people, and when it was revoked. A key revoked after sequence N signs
// nothing valid after N: its commits and checkpoints at sequences above
// N fail; those up to N still verify.
type Key struct {
	Key          string `yaml:"key" json:"key"`
	Name         string `yaml:"name,omitempty" json:"name,omitempty"`
	RevokedAfter uint64 `yaml:"revoked_after,omitempty" json:"revoked_after,omitempty"`
	// Revoked reports whether RevokedAfter applies (a key revoked after
	// sequence 0 signs nothing valid).
	Revoked bool `yaml:"revoked,omitempty" json:"revoked,omitempty"`
}

// KeyFile is the keys file an auditor pins (replay audit --keys).
type KeyFile struct {
	Keys []Key `yaml:"keys"`
}

// Keyring is the set of keys a verifier trusts. It remembers the batch
// roots it has verified, so that the commits of one batch cost one
// signature check. It is safe for concurrent use.
type Keyring struct {
	mu   sync.Mutex
	keys map[string]keyEntry
	// roots are the roots verified lately, in two generations: when
	// roots is full it becomes old, and what neither holds is verified
	// again.
	roots, old map[rootKey]bool
}

type keyEntry struct {
	Key
	pub nkeys.KeyPair
}

type rootKey struct {
	signer string
	root   Hash
	sig    string
}

// maxRoots bounds the cache of verified roots.
const maxRoots = 4096

// NewKeyring trusts keys. A key that is not a public nkey, or a key listed
// twice, is an error.
func NewKeyring(keys []Key) (*Keyring, error) {
	k := &Keyring{keys: map[string]keyEntry{}, roots: map[rootKey]bool{}}
	var errs []error
	for _, key := range keys {
		if err := k.add(key); err != nil {
			errs = append(errs, err)
		}
	}
	return k, errors.Join(errs...)
}

func (k *Keyring) add(key Key) error {
	if _, dup := k.keys[key.Key]; dup {
		return fmt.Errorf("key %s listed twice", key.Key)
	}
	return k.Put(key)
}

// Put trusts key, or replaces what the keyring held for it (a
// revocation: a root verified before is accepted only where the key may
// still sign).
func (k *Keyring) Put(key Key) error {
	pub, err := nkeys.FromPublicKey(key.Key)
	if err != nil {
		return fmt.Errorf("key %q: not a public nkey: %v", key.Key, err)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.keys[key.Key] = keyEntry{Key: key, pub: pub}
	return nil
}

// LoadKeys reads a keys file.
func LoadKeys(path string) (*Keyring, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("keys file: %w", err)
	}
	var f KeyFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("keys file %s: %w", path, err)
	}
	k, err := NewKeyring(f.Keys)
	if err != nil {
		return nil, fmt.Errorf("keys file %s: %w", path, err)
	}
	return k, nil
}

// Format writes keys as a keys file.
func Format(keys []Key) []byte {
	var b strings.Builder
	b.WriteString("# toolbatch engines' public signing keys: pin this file and give it to replay audit --keys\n")
	b.WriteString("# a key revoked after stream sequence N signs nothing valid after N (revoked: true, revoked_after: N)\n")
	out, _ := yaml.Marshal(KeyFile{Keys: keys})
	b.Write(out)
	return []byte(b.String())
}

// entry returns the key that may sign at seq.
func (k *Keyring) entry(signer string, seq uint64) (keyEntry, error) {
	e, ok := k.keys[signer]
	if !ok {
		return e, fmt.Errorf("%w: %s", ErrUnknownKey, signer)
	}
	if e.Revoked && seq > e.RevokedAfter {
		return e, fmt.Errorf("%w: %s was revoked after sequence %d", ErrRevoked, signer, e.RevokedAfter)
	}
	return e, nil
}

// Verify checks the seal of a commit stored at seq, given its signer and
// hash (Commit.Hash): the signer is trusted and not revoked at seq, and
// its signature covers the root the commit's audit path leads to. A nil
// seal is ErrUnsigned.
func (k *Keyring) Verify(signer string, commit Hash, s *Seal, seq uint64) error {
	if s == nil || signer == "" {
		return ErrUnsigned
	}
	root, err := s.Root(commit)
	if err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	e, err := k.entry(signer, seq)
	if err != nil {
		return err
	}
	rk := rootKey{signer: signer, root: root, sig: string(s.Sig)}
	if k.roots[rk] || k.old[rk] {
		return nil
	}
	if err := e.pub.Verify(rootMessage(root), s.Sig); err != nil {
		return fmt.Errorf("%w: signer %s", ErrBadSignature, signer)
	}
	k.remember(rk)
	return nil
}

// verified takes a root as verified (Signer.VouchTo).
func (k *Keyring) verified(rk rootKey) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.remember(rk)
}

func (k *Keyring) remember(rk rootKey) {
	if len(k.roots) >= maxRoots {
		k.old, k.roots = k.roots, make(map[rootKey]bool, maxRoots)
	}
	k.roots[rk] = true
}

// VerifyCheckpoint checks a checkpoint's signature against the keyring.
func (k *Keyring) VerifyCheckpoint(c Checkpoint) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	e, err := k.entry(c.Signer, c.Seq)
	if err != nil {
		return err
	}
	sig, err := b64.DecodeString(c.Sig)
	if err != nil {
		return fmt.Errorf("%w: checkpoint signature: %v", ErrMalformed, err)
	}
	if err := e.pub.Verify(c.message(), sig); err != nil {
		return fmt.Errorf("%w: checkpoint at %d signed by %s", ErrBadSignature, c.Seq, c.Signer)
	}
	return nil
}
