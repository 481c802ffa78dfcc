package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/aggregate"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/protocol"
)

// stateStore keeps the committed state projection in the state bucket: the
// staged commands of finalized batches, applied in order. Keys are the
// aggregate's state keys (run.<run_id>.<key>, thread.<thread_id>.<key>,
// shared.<key>) with the command key escaped for the bucket: every byte
// outside [A-Za-z0-9_-] becomes =XX (hex).
type stateStore struct {
	kv     jetstream.KeyValue // the state bucket, opened by Setup
	stream jetstream.Stream   // the bucket's stream: a key's last message with its headers
	js     jetstream.JetStream
	names  protocol.Names
	// unstampedUntil is where an earlier version's projection ended
	// (protocol.StateUnstampedUntilKey; 0: none): what a key without
	// stamps is as of.
	unstampedUntil uint64
}

// loadUnstampedUntil reads where an earlier version's projection ended.
func (s *stateStore) loadUnstampedUntil(ctx context.Context) error {
	entry, err := s.kv.Get(ctx, protocol.StateUnstampedUntilKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	s.unstampedUntil, err = strconv.ParseUint(string(entry.Value()), 10, 64)
	if err != nil {
		return fmt.Errorf("state bucket key %s: %w", protocol.StateUnstampedUntilKey, err)
	}
	return nil
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

// apply commits a finalized batch's commands, finalized by the commit at
// seq of the events stream, with the merge rules of aggregate.MergeState;
// first is the index in the commit of the first command (a commit may
// finalize more than one batch).
//
// Each key's message carries its stamps (aggregate.StateEntry), so that a
// batch's commands give the value that applying every batch in stream
// order gives, whatever the order in which the projection applies them
// and however often: a commit projected again, or projected after a later
// one, changes nothing it should not. Each write is conditional on the
// key's last message, and tried again when another write came first.
func (s *stateStore) apply(ctx context.Context, runID, threadID string, seq uint64, first int, cmds []events.Command) error {
	for i, c := range cmds {
		subject := s.names.KVSubject(protocol.BucketState, bucketKey(c, runID, threadID))
		at := aggregate.Stamp{Seq: seq, Idx: first + i}
		for {
			entry, last, err := s.read(ctx, subject)
			if err != nil {
				return err
			}
			next, changed, err := entry.Apply(c, at)
			if err != nil {
				return err
			}
			if !changed {
				break
			}
			err = s.write(ctx, subject, next, last)
			if isWrongLastSequence(err) {
				continue // written meanwhile (or being written, on a cluster): read it again
			}
			if err != nil {
				return err
			}
			break
		}
	}
	return nil
}

// applyState commits the state of every batch a commit finalized without
// a conflict, its commands stamped in their order in the commit.
func applyState(ctx context.Context, s *stateStore, runID, threadID string, seq uint64, evs []events.Event) error {
	first := 0
	for _, ev := range evs {
		if f, ok := ev.(*events.BatchFinalized); ok && f.Conflict == "" {
			if err := s.apply(ctx, runID, threadID, seq, first, f.State); err != nil {
				return err
			}
			first += len(f.State)
		}
	}
	return nil
}

// read returns a key's entry and the stream sequence of its last message
// (0: none).
func (s *stateStore) read(ctx context.Context, subject string) (aggregate.StateEntry, uint64, error) {
	m, err := s.stream.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return aggregate.StateEntry{}, 0, nil
	}
	if err != nil {
		return aggregate.StateEntry{}, 0, err
	}
	var e aggregate.StateEntry
	if !kvRemoved(m.Header) {
		e.Value = events.RawJSON(m.Data)
	}
	if r := m.Header.Get(protocol.HeaderStateReplaced); r == "" {
		// written by an earlier version: as of where its projection ended
		e.Replaced = aggregate.Stamp{Seq: s.unstampedUntil, Idx: math.MaxInt}
	} else if e.Replaced, err = parseStamp(r); err == nil {
		e.Merged, err = parseStamp(m.Header.Get(protocol.HeaderStateMerged))
	}
	if f := m.Header.Get(protocol.HeaderStateFields); err == nil && f != "" {
		var fields map[string]string
		if err = json.Unmarshal([]byte(f), &fields); err == nil {
			e.Fields = make(map[string]aggregate.Stamp, len(fields))
			for k, v := range fields {
				if e.Fields[k], err = parseStamp(v); err != nil {
					break
				}
			}
		}
	}
	if err != nil {
		return aggregate.StateEntry{}, 0, fmt.Errorf("state %s: %w", subject, err)
	}
	return e, m.Sequence, nil
}

// write stores a key's entry if its last message is still the one at
// last: the value (a delete marker when absent) and its stamps.
func (s *stateStore) write(ctx context.Context, subject string, e aggregate.StateEntry, last uint64) error {
	msg := nats.NewMsg(subject)
	msg.Data = e.Value
	if e.Value == nil {
		msg.Header.Set(kvOperation, kvOperationDelete)
	}
	msg.Header.Set(protocol.HeaderStateReplaced, formatStamp(e.Replaced))
	if e.Merged != (aggregate.Stamp{}) {
		msg.Header.Set(protocol.HeaderStateMerged, formatStamp(e.Merged))
	}
	if len(e.Fields) > 0 {
		fields := make(map[string]string, len(e.Fields))
		for k, v := range e.Fields {
			fields[k] = formatStamp(v)
		}
		b, err := json.Marshal(fields)
		if err != nil {
			return err
		}
		msg.Header.Set(protocol.HeaderStateFields, string(b))
	}
	_, err := s.js.PublishMsg(ctx, msg, jetstream.WithExpectLastSequencePerSubject(last))
	return err
}

// formatStamp and parseStamp write and read a stamp as "<seq>/<index>"
// ("" is the zero stamp): a state key's stamps, and an out message's
// source (protocol.HeaderSource).
func formatStamp(s aggregate.Stamp) string {
	return strconv.FormatUint(s.Seq, 10) + "/" + strconv.Itoa(s.Idx)
}

func parseStamp(v string) (aggregate.Stamp, error) {
	if v == "" {
		return aggregate.Stamp{}, nil
	}
	a, b, ok := strings.Cut(v, "/")
	seq, err1 := strconv.ParseUint(a, 10, 64)
	idx, err2 := strconv.Atoi(b)
	if !ok || err1 != nil || err2 != nil || idx < 0 {
		return aggregate.Stamp{}, fmt.Errorf("invalid stamp %q", v)
	}
	return aggregate.Stamp{Seq: seq, Idx: idx}, nil
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
