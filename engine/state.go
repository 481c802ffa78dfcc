package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/aggregate"
	"github.com/toolbatch/toolbatch/events"
)

// stateStore keeps the committed state projection in the state bucket: the
// staged commands of finalized batches, applied in order. Keys are the
// aggregate's state keys (run.<run_id>.<key>, thread.<thread_id>.<key>,
// shared.<key>) with the command key escaped for the bucket: every byte
// outside [A-Za-z0-9_-] becomes =XX (hex).
type stateStore struct {
	kv jetstream.KeyValue // the state bucket, opened by Setup
}

func escapeKey(k string) string {
	var b strings.Builder
	for i := 0; i < len(k); i++ {
		c := k[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "=%02X", c)
		}
	}
	return b.String()
}

func unescapeKey(k string) string {
	var b strings.Builder
	for i := 0; i < len(k); i++ {
		if k[i] == '=' && i+2 < len(k) {
			var c byte
			if _, err := fmt.Sscanf(k[i+1:i+3], "%02X", &c); err == nil {
				b.WriteByte(c)
				i += 2
				continue
			}
		}
		b.WriteByte(k[i])
	}
	return b.String()
}

// bucketKey maps an aggregate state key to its bucket key.
func bucketKey(c events.Command, runID, threadID string) string {
	switch c.Scope {
	case events.ScopeRun:
		return "run." + runID + "." + escapeKey(c.Key)
	case events.ScopeThread:
		return "thread." + threadID + "." + escapeKey(c.Key)
	default:
		return "shared." + escapeKey(c.Key)
	}
}

// apply commits a finalized batch's commands in order, with the merge rules
// of aggregate.MergeState. Applying the same batch again gives the same
// state, so a redelivered commit is harmless.
func (s *stateStore) apply(ctx context.Context, runID, threadID string, cmds []events.Command) error {
	if len(cmds) == 0 {
		return nil
	}
	kv := s.kv
	for _, c := range cmds {
		key := bucketKey(c, runID, threadID)
		current := map[string]events.RawJSON{}
		if c.Action == events.ActionSet && c.Merge == events.MergeCommutative {
			entry, err := kv.Get(ctx, key)
			switch {
			case errors.Is(err, jetstream.ErrKeyNotFound):
			case err != nil:
				return err
			default:
				current[aggregate.StateKey(c, runID, threadID)] = entry.Value()
			}
		}
		next, err := aggregate.MergeState(current, runID, threadID, []events.Command{c})
		if err != nil {
			return err
		}
		v, ok := next[aggregate.StateKey(c, runID, threadID)]
		if !ok {
			if err := kv.Delete(ctx, key); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
				return err
			}
			continue
		}
		if len(v) == 0 {
			v = events.RawJSON("null")
		}
		if _, err := kv.Put(ctx, key, v); err != nil {
			return err
		}
	}
	return nil
}

// visible returns the committed state a run sees, keyed by the aggregate's
// state keys.
func (s *stateStore) visible(ctx context.Context, runID, threadID string) (map[string]any, error) {
	kv := s.kv
	lister, err := kv.ListKeysFiltered(ctx, "run."+runID+".>", "thread."+threadID+".>", "shared.>")
	if err != nil {
		return nil, err
	}
	out := map[string]any{}
	for key := range lister.Keys() {
		entry, err := kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		scope, rest, _ := strings.Cut(key, ".")
		if scope != "shared" {
			_, rest, _ = strings.Cut(rest, ".")
		}
		prefix := strings.TrimSuffix(key, rest)
		out[prefix+unescapeKey(rest)] = events.RawJSON(entry.Value())
	}
	return out, nil
}
