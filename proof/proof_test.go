package proof

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nkeys"
)

func newSigner(t *testing.T) (*Signer, context.CancelFunc) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewSigner(kp)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go s.Run(ctx)
	t.Cleanup(cancel)
	return s, cancel
}

func commit(i int) Commit {
	return Commit{Subject: fmt.Sprintf("toolbatch.events.r%d", i%3), Prev: uint64(i), Signer: "U", Types: []string{"BatchSubmitted"}, Body: []byte(fmt.Sprint("body", i))}
}

// TestAuditPaths: every leaf of every tree size leads to the root, and no
// other leaf, index or size does.
func TestAuditPaths(t *testing.T) {
	for n := 1; n <= 40; n++ {
		leaves := make([]Hash, n)
		commits := make([]Hash, n)
		for i := range leaves {
			commits[i] = commit(i).Hash()
			leaves[i] = leafHash(commits[i])
		}
		root, paths := tree(leaves)
		for i := range n {
			s := Seal{Index: i, Size: n, Path: paths[i]}
			got, err := s.Root(commits[i])
			if err != nil || got != root {
				t.Fatalf("size %d leaf %d: root %v, %v; want %v", n, i, got, err, root)
			}
			other := commits[(i+1)%n]
			if n > 1 {
				if got, err := s.Root(other); err == nil && got == root {
					t.Fatalf("size %d leaf %d: another commit's hash verifies", n, i)
				}
				moved := Seal{Index: (i + 1) % n, Size: n, Path: paths[i]}
				if got, err := moved.Root(commits[i]); err == nil && got == root {
					t.Fatalf("size %d leaf %d: verifies at index %d", n, i, moved.Index)
				}
			}
		}
	}
}

func TestSealRoundTripAndTampering(t *testing.T) {
	s, _ := newSigner(t)
	ring, err := NewKeyring([]Key{{Key: s.Key(), Name: "engine-1"}})
	if err != nil {
		t.Fatal(err)
	}
	// many at once, so that batches form
	const n = 64
	seals := make([]Seal, n)
	commits := make([]Commit, n)
	var wg sync.WaitGroup
	for i := range n {
		commits[i] = commit(i)
		commits[i].Signer = s.Key()
		wg.Add(1)
		go func() {
			defer wg.Done()
			seal, err := s.Seal(context.Background(), commits[i].Hash())
			if err != nil {
				t.Error(err)
			}
			seals[i] = seal
		}()
	}
	wg.Wait()
	batched := false
	for i := range n {
		sig, path := seals[i].Headers()
		parsed, err := ParseSeal(sig, path)
		if err != nil {
			t.Fatal(err)
		}
		if parsed.Size > 1 {
			batched = true
		}
		if err := ring.Verify(commits[i].Signer, commits[i].Hash(), &parsed, uint64(i+1)); err != nil {
			t.Fatalf("commit %d: %v", i, err)
		}
	}
	t.Logf("batched: %v", batched)
	c := commits[0]
	seal := seals[0]
	for name, tc := range map[string]struct {
		c    Commit
		want error
	}{
		"body":    {Commit{Subject: c.Subject, Prev: c.Prev, Signer: c.Signer, Types: c.Types, Body: []byte("other")}, ErrBadSignature},
		"subject": {Commit{Subject: "toolbatch.events.clone", Prev: c.Prev, Signer: c.Signer, Types: c.Types, Body: c.Body}, ErrBadSignature},
		"prev":    {Commit{Subject: c.Subject, Prev: c.Prev + 1, Signer: c.Signer, Types: c.Types, Body: c.Body}, ErrBadSignature},
		"types":   {Commit{Subject: c.Subject, Prev: c.Prev, Signer: c.Signer, Types: []string{"CallGated"}, Body: c.Body}, ErrBadSignature},
		"unknown": {Commit{Subject: c.Subject, Prev: c.Prev, Signer: "UNOTAKEY", Types: c.Types, Body: c.Body}, ErrUnknownKey},
	} {
		// a fresh keyring: no verified root remembered
		ring, _ := NewKeyring([]Key{{Key: s.Key()}})
		err := ring.Verify(tc.c.Signer, tc.c.Hash(), &seal, 1)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s altered: %v, want %v", name, err, tc.want)
		}
	}
	if err := ring.Verify(c.Signer, c.Hash(), nil, 1); !errors.Is(err, ErrUnsigned) {
		t.Errorf("no seal: %v", err)
	}
}

func TestRevocationAndRotation(t *testing.T) {
	old, _ := newSigner(t)
	next, _ := newSigner(t)
	c := commit(1)
	c.Signer = old.Key()
	seal, err := old.Seal(context.Background(), c.Hash())
	if err != nil {
		t.Fatal(err)
	}
	ring, err := NewKeyring([]Key{{Key: old.Key(), Revoked: true, RevokedAfter: 10}, {Key: next.Key()}})
	if err != nil {
		t.Fatal(err)
	}
	if err := ring.Verify(c.Signer, c.Hash(), &seal, 10); err != nil {
		t.Errorf("a commit up to the revocation: %v", err)
	}
	if err := ring.Verify(c.Signer, c.Hash(), &seal, 11); !errors.Is(err, ErrRevoked) {
		t.Errorf("a commit after the revocation: %v, want ErrRevoked", err)
	}
	var h Head
	h.Add(11, c.Hash(), "", "")
	cp, err := old.SignCheckpoint(NewCheckpoint("TOOLBATCH_EVENTS", h, time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)))
	if err != nil {
		t.Fatal(err)
	}
	if err := ring.VerifyCheckpoint(cp); !errors.Is(err, ErrRevoked) {
		t.Errorf("a checkpoint after the revocation: %v", err)
	}
	cp2, _ := next.SignCheckpoint(NewCheckpoint("TOOLBATCH_EVENTS", h, time.Now()))
	back, err := DecodeCheckpoint(cp2.Encode())
	if err != nil {
		t.Fatal(err)
	}
	if err := ring.VerifyCheckpoint(back); err != nil {
		t.Errorf("the new key's checkpoint: %v", err)
	}
	back.Seq++
	if err := ring.VerifyCheckpoint(back); !errors.Is(err, ErrBadSignature) {
		t.Errorf("an altered checkpoint: %v", err)
	}
	if _, err := NewKeyring([]Key{{Key: "nope"}}); err == nil {
		t.Error("a key that is no nkey was accepted")
	}
	// A key revoked while its root is cached as verified.
	if err := ring.Verify(back.Signer, c.Hash(), mustSeal(t, next, c), 20); err != nil {
		t.Fatal(err)
	}
	if err := ring.Put(Key{Key: next.Key(), Revoked: true, RevokedAfter: 15}); err != nil {
		t.Fatal(err)
	}
	if err := ring.Verify(back.Signer, c.Hash(), mustSeal(t, next, c), 20); !errors.Is(err, ErrRevoked) {
		t.Errorf("a cached root of a key revoked since: %v, want ErrRevoked", err)
	}
}

func mustSeal(t *testing.T, s *Signer, c Commit) *Seal {
	t.Helper()
	seal, err := s.Seal(context.Background(), c.Hash())
	if err != nil {
		t.Fatal(err)
	}
	return &seal
}

// TestHeadCoversEverything: the head changes with any message's sequence,
// hash, signature or order.
func TestHeadCoversEverything(t *testing.T) {
	fold := func(edit func(i int, seq *uint64, h *Hash, sig *string)) Hash {
		var hd Head
		for i := range 5 {
			seq, h, sig := uint64(i+1), commit(i).Hash(), "sig"
			edit(i, &seq, &h, &sig)
			hd.Add(seq, h, sig, "0/1:")
		}
		return hd.Hash
	}
	base := fold(func(int, *uint64, *Hash, *string) {})
	for name, edit := range map[string]func(int, *uint64, *Hash, *string){
		"seq":       func(i int, s *uint64, _ *Hash, _ *string) { *s += uint64(i / 4) },
		"hash":      func(i int, _ *uint64, h *Hash, _ *string) { h[0] ^= byte(i / 4) },
		"signature": func(i int, _ *uint64, _ *Hash, s *string) { *s += fmt.Sprint(i / 4) },
		"order": func(i int, _ *uint64, h *Hash, _ *string) {
			if i == 1 || i == 2 {
				*h = commit(3 - i).Hash()
			}
		},
	} {
		if fold(edit) == base {
			t.Errorf("%s changed, the head did not", name)
		}
	}
}

// TestVouchedRoots: a keyring a signer vouches to takes the roots it
// signs as verified, and nothing else.
func TestVouchedRoots(t *testing.T) {
	s, _ := newSigner(t)
	ring, err := NewKeyring([]Key{{Key: s.Key()}})
	if err != nil {
		t.Fatal(err)
	}
	s.VouchTo(ring)
	c := commit(1)
	c.Signer = s.Key()
	seal := mustSeal(t, s, c)
	ring.mu.Lock()
	n := len(ring.roots)
	ring.mu.Unlock()
	if n != 1 {
		t.Fatalf("%d roots vouched for, want 1", n)
	}
	if err := ring.Verify(c.Signer, c.Hash(), seal, 1); err != nil {
		t.Errorf("a vouched commit: %v", err)
	}
	c.Body = append(c.Body, 'x')
	if err := ring.Verify(c.Signer, c.Hash(), seal, 1); !errors.Is(err, ErrBadSignature) {
		t.Errorf("an altered commit of a vouched batch: %v, want ErrBadSignature", err)
	}
}
