package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/client"
	"github.com/toolbatch/toolbatch/proof"
	"github.com/toolbatch/toolbatch/protocol"
)

// The engines' signing keys live in the keys bucket, where each signing
// engine registers its own (engine/trust.go): these commands read it and
// revoke a key in it, over NATS.

// cmdKeys: toolbatch auth keys: print the keys file of the engines'
// signing keys, for replay audit --keys.
func cmdKeys(args []string, stdout io.Writer) error {
	c := newCommon("auth keys")
	if _, err := c.parse(args); err != nil {
		return err
	}
	return c.withClient(func(ctx context.Context, nc *nats.Conn, _ *client.Client) error {
		kv, err := keysBucket(ctx, nc, c.prefix)
		if err != nil {
			return err
		}
		keys, err := readKeys(ctx, kv)
		if err != nil {
			return err
		}
		_, err = stdout.Write(proof.Format(keys))
		return err
	})
}

// cmdRevokeKey: toolbatch auth revoke-key KEY [--after SEQ]
func cmdRevokeKey(args []string, stdout io.Writer) error {
	c := newCommon("auth revoke-key")
	after := c.fs.Uint64("after", 0, "the last events-stream sequence the key's signatures stay valid for (default: the stream's last sequence now)")
	pos, err := c.parse(args, "KEY")
	if err != nil {
		return err
	}
	afterSet := false
	c.fs.Visit(func(f *flag.Flag) { afterSet = afterSet || f.Name == "after" })
	key := pos[0]
	return c.withClient(func(ctx context.Context, nc *nats.Conn, _ *client.Client) error {
		kv, err := keysBucket(ctx, nc, c.prefix)
		if err != nil {
			return err
		}
		entry, err := kv.Get(ctx, protocol.SigningKey(key))
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return failf("auth revoke-key: no engine registered the key %s (toolbatch auth keys lists them)", key)
		}
		if err != nil {
			return failf("auth revoke-key: %v", err)
		}
		var k proof.Key
		if err := json.Unmarshal(entry.Value(), &k); err != nil {
			return failf("auth revoke-key: the keys bucket's entry of %s: %v", key, err)
		}
		if !afterSet {
			js, _ := jetstream.New(nc)
			s, err := js.Stream(ctx, protocol.Names{Prefix: c.prefix}.EventsStream())
			if err != nil {
				return failf("auth revoke-key: the events stream: %v", err)
			}
			*after = s.CachedInfo().State.LastSeq
		}
		if k.Revoked && k.RevokedAfter <= *after {
			return failf("auth revoke-key: %s is already revoked after sequence %d", key, k.RevokedAfter)
		}
		k.Revoked, k.RevokedAfter = true, *after
		b, _ := json.Marshal(k)
		if _, err := kv.Update(ctx, entry.Key(), b, entry.Revision()); err != nil {
			return failf("auth revoke-key: %v (written meanwhile? try again)", err)
		}
		fmt.Fprintf(stdout, "key %s (%s) revoked after sequence %d: what it signed after that fails verification; an engine holding it commits nothing more and does not start again; pin the new keys file (toolbatch auth keys)\n",
			key, k.Name, *after)
		return nil
	})
}

func keysBucket(ctx context.Context, nc *nats.Conn, prefix string) (jetstream.KeyValue, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, failf("%v", err)
	}
	name := protocol.Names{Prefix: prefix}.KeysBucket()
	kv, err := js.KeyValue(ctx, name)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, failf("no bucket %s: no signing engine has started with prefix %s on this NATS", name, prefix)
	}
	if err != nil {
		return nil, failf("bucket %s: %v", name, err)
	}
	return kv, nil
}

// readKeys lists the keys of the bucket, by name then key.
func readKeys(ctx context.Context, kv jetstream.KeyValue) ([]proof.Key, error) {
	lister, err := kv.ListKeysFiltered(ctx, protocol.SigningKeyPrefix+">")
	if err != nil {
		return nil, failf("list the signing keys: %v", err)
	}
	var keys []proof.Key
	for name := range lister.Keys() {
		entry, err := kv.Get(ctx, name)
		if err != nil {
			return nil, failf("read %s: %v", name, err)
		}
		var k proof.Key
		if err := json.Unmarshal(entry.Value(), &k); err != nil {
			return nil, failf("the keys bucket's entry %s: %v", name, err)
		}
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b proof.Key) int {
		return strings.Compare(a.Name+"\x00"+a.Key, b.Name+"\x00"+b.Key)
	})
	return keys, nil
}
