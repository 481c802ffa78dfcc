package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/proof"
	"github.com/toolbatch/toolbatch/protocol"
)

// trust is what a signing engine takes to be written by an engine: a
// commit signed by a key of the keys bucket that is not revoked at the
// commit's sequence and that follows its run's previous commit, or an
// unsigned commit stored before the first signing engine started. The
// projector publishes nothing else, and a run that holds anything else
// is folded no further, by the projector or by its owner.
//
// Engines register their own key in the bucket; only engines and admins
// may write it (docs/security.md), and an admin revokes a key there
// (toolbatch auth revoke-key). A watch keeps the keyring current.
type trust struct {
	e     *Engine
	kv    jetstream.KeyValue
	keys  *proof.Keyring
	watch jetstream.KeyWatcher
	// unsignedUntil is the last sequence an unsigned commit may have.
	unsignedUntil atomic.Uint64
}

// errUntrusted marks a commit that does not verify.
var errUntrusted = errors.New("a commit no engine signed")

// register puts this engine's key in the keys bucket (it refuses a
// revoked one), records where signing began when no engine has, and
// watches the bucket; it returns once the keyring holds every key.
func (t *trust) register(ctx context.Context) error {
	e := t.e
	key := e.cfg.Signer.Key()
	entry, err := t.kv.Get(ctx, protocol.SigningKey(key))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		b, _ := json.Marshal(proof.Key{Key: key, Name: e.id})
		if _, err := t.kv.Create(ctx, protocol.SigningKey(key), b); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
			return fmt.Errorf("register the signing key: %w", err)
		}
	case err != nil:
		return fmt.Errorf("read the signing key: %w", err)
	default:
		var k proof.Key
		if err := json.Unmarshal(entry.Value(), &k); err != nil {
			return fmt.Errorf("keys bucket: %s: %w", entry.Key(), err)
		}
		if k.Revoked {
			return protocol.Definite(fmt.Errorf("the signing key %s was revoked after stream sequence %d (toolbatch auth revoke-key): give the engine a new --signing-key", key, k.RevokedAfter))
		}
	}
	info, err := e.events.stream.Info(ctx)
	if err != nil {
		return fmt.Errorf("events stream: %w", err)
	}
	since := strconv.FormatUint(info.State.LastSeq, 10)
	if _, err := t.kv.Create(ctx, protocol.UnsignedUntilKey, []byte(since)); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("record where signing began: %w", err)
	}
	t.keys, _ = proof.NewKeyring(nil)
	e.cfg.Signer.VouchTo(t.keys) // its own commits verify without an ed25519 check
	t.watch, err = mirror(ctx, t.kv, ">", t.apply)
	return err
}

// apply takes one entry of the bucket. A key deleted from the bucket is
// kept: what it signed before stays signed (a revocation says until when).
func (t *trust) apply(up jetstream.KeyValueEntry) {
	e := t.e
	if up.Operation() != jetstream.KeyValuePut {
		return
	}

	switch {
	case up.Key() == protocol.UnsignedUntilKey:
		seq, err := strconv.ParseUint(string(up.Value()), 10, 64)
		if err != nil {
			e.log.Error().Str("key", up.Key()).Msg("keys bucket: not a sequence: ignored")
			return
		}
		t.unsignedUntil.Store(seq)
	case strings.HasPrefix(up.Key(), protocol.SigningKeyPrefix):
		var k proof.Key
		err := json.Unmarshal(up.Value(), &k)
		if err == nil && k.Key != strings.TrimPrefix(up.Key(), protocol.SigningKeyPrefix) {
			err = fmt.Errorf("names key %s", k.Key)
		}
		if err == nil {
			err = t.keys.Put(k)
		}
		if err != nil {
			e.log.Error().Str("key", up.Key()).Err(err).Msg("keys bucket: a bad entry: ignored")
			return
		}
		if k.Revoked && k.Key == e.cfg.Signer.Key() {
			e.log.Error().Str("key", k.Key).Uint64("revoked_after", k.RevokedAfter).
				Msg("this engine's signing key was revoked: it commits nothing more; restart it with a new --signing-key")
			e.cfg.Signer.Close()
		}
	}
}

func (t *trust) stop() {
	if t != nil && t.watch != nil {
		_ = t.watch.Stop()
	}
}

// check verifies a stored commit at seq that follows the run's previous
// commit, whose hash is prev, and returns its hash. A nil trust (an
// engine that does not sign, and so needs no hashes) verifies nothing.
func (t *trust) check(ctx context.Context, m jetstream.Msg, seq uint64, prev proof.Hash) (proof.Hash, error) {
	if t == nil {
		return proof.ZeroHash, nil
	}
	c, seal, err := proof.Read(proof.Message{Subject: m.Subject(), Header: m.Headers(), Body: m.Data()})
	if err != nil {
		return proof.Hash{}, fmt.Errorf("%w: commit %d: %v", errUntrusted, seq, err)
	}
	hash := c.Hash()
	if seal == nil {
		if until := t.unsignedUntil.Load(); seq > until {
			return hash, fmt.Errorf("%w: commit %d is unsigned, and every commit after %d is signed", errUntrusted, seq, until)
		}
		return hash, nil
	}
	if err := c.Follows(prev); err != nil {
		return hash, fmt.Errorf("%w: commit %d: %v", errUntrusted, seq, err)
	}
	err = t.keys.Verify(c.Signer, hash, seal, seq)
	if errors.Is(err, proof.ErrUnknownKey) {
		// An engine that registered a moment ago: its key may still be on
		// its way to the watch.
		entry, gerr := t.kv.Get(ctx, protocol.SigningKey(c.Signer))
		switch {
		case errors.Is(gerr, jetstream.ErrKeyNotFound):
		case gerr != nil:
			return hash, fmt.Errorf("commit %d: read its signer's key: %w", seq, gerr) // not a verdict: tried again
		default:
			t.apply(entry)
			err = t.keys.Verify(c.Signer, hash, seal, seq)
		}
	}
	if err != nil {
		return hash, fmt.Errorf("%w: commit %d: %v", errUntrusted, seq, err)
	}
	return hash, nil
}
