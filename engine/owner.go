package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/aggregate"
	"github.com/toolbatch/toolbatch/protocol"
)

// Ownership: one engine at a time works on a run. Every engine shares the
// inbox, timers and worker subjects, so a message of a run may reach any of
// them; the engine that holds the run's key in the owners bucket
// (run.<run_id>, value its engine id) is the only one that decides for it.
// It creates the key before it touches the run and deletes it when the run
// is quiescent (after a linger, between batches). The key has no TTL and
// is never renewed: it stays its owner's for as long as the owner is alive
// (liveness.go), however slow a commit or a leader election. When the
// owner is dead, the first engine to swap the key takes the run over,
// folding it from the log and recovering it. Others forward the run's
// messages to the owner (forward.go), and stay silent to a claim or
// heartbeat, which every engine receives.

// ErrNotOwner means another engine works on the run now.
var ErrNotOwner = errors.New("engine: another engine owns the run")

// acquire makes this engine the run's owner. A run acquired anew is
// checked against the log: if another engine extended it since this engine
// last held it, the cache is folded again. When the key's last write is
// still this engine's own release, nobody held the run in between and the
// check is skipped: the key is taken back in one round trip.
func (s *shard) acquire(ctx context.Context, rs *runState) error {
	if rs.owned && rs.keyUnsure {
		if err := s.confirmKey(ctx, rs); !errors.Is(err, ErrNotOwner) {
			return err
		}
		// Released after all: taken below like any free or held key.
	}
	if rs.owned {
		return nil
	}
	kv := s.e.ownersKV
	key := protocol.OwnerKey(rs.id)
	if rs.releasedRev != 0 {
		rev, err := kv.Update(ctx, key, []byte(s.e.id), rs.releasedRev)
		rs.releasedRev = 0
		if err == nil {
			s.e.setOwned(rs, true)
			rs.ownRev = rev
			rs.keyProjected = 0
			if !rs.loaded {
				rs.keyProjected = rs.releasedAt // released here, with every commit up to there projected
			}
			return nil
		}
	}
	rev, from, projected, err := s.e.takeKey(ctx, key)
	if errors.Is(err, ErrNotOwner) {
		return err
	}
	if err != nil {
		return fmt.Errorf("own run %s: %w", rs.id, err)
	}
	if from != "" && from != s.e.id {
		s.e.log.Info().Str(fieldRunID, rs.id).Str("engine", from).Msg("took the run over from a dead engine")
	}
	s.e.setOwned(rs, true)
	rs.ownRev = rev
	if rs.loaded {
		seq, err := s.e.events.lastSeq(ctx, rs.id)
		if err != nil {
			return err
		}
		if seq != rs.tip.seq {
			rs.loaded = false
		}
	}
	// A key found free was released with every commit up to the one its
	// marker names projected (project.go); one taken from an engine may
	// not have been. The next load says which (a run still cached here
	// needs none).
	rs.keyProjected = 0
	if from == "" && !rs.loaded {
		rs.keyProjected = projected
	}
	return nil
}

// takeKey makes this engine the holder of a key of the owners bucket (a
// run's, or a leader's): it creates the key when it is free, writes it
// again on condition when it names this engine already (a previous
// process of it; or a replica's stale answer), and swaps it
// from a dead engine (liveness.go), the first engine to swap it taking it.
// It returns the key's revision and the engine it was taken from: "" when
// it was free, this engine's id when it named it already, or the dead
// engine's; or ownedElsewhere (a live engine holds it) or ErrNotOwner (it
// went away, or another engine swapped it first: the message comes back
// soon). For a key found free, projected is what its release marker says
// was projected (HeaderProjected; anyProjected when there is no marker or
// it says nothing, as an earlier version's).
//
// It does what the bucket's Create does (a write on an empty subject, or
// else a read of the key's last message and a write conditional on it),
// reading the last message whole, so that a marker's header costs no
// round trip more.
func (e *Engine) takeKey(ctx context.Context, key string) (rev uint64, from string, projected uint64, err error) {
	kv := e.ownersKV
	rev, err = kv.Update(ctx, key, []byte(e.id), 0)
	if !isWrongLastSequence(err) {
		return rev, "", anyProjected, err
	}
	last, err := e.ownersStream.GetLastMsgForSubject(ctx, e.names.KVSubject(protocol.BucketOwners, key))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return 0, "", 0, ErrNotOwner
	case err != nil:
		return 0, "", 0, err
	}
	// Every way of taking it is a write conditional on the message read:
	// the read may come from a replica behind the others (a direct get),
	// one just back from a pause say, while another engine took the key
	// since. Taken on that read alone, the run had two engines.
	switch owner := string(last.Data); {
	case kvRemoved(last.Header):
		projected = anyProjected
		if h := last.Header.Get(protocol.HeaderProjected); h != "" {
			var perr error
			if projected, perr = strconv.ParseUint(h, 10, 64); perr != nil {
				projected = 0 // not known: projected again
			}
		}
	case owner == e.id:
		from = e.id
	case e.liveness.alive(ctx, owner):
		return 0, "", 0, ownedElsewhere{owner: owner}
	default:
		from = owner
	}
	rev, err = kv.Update(ctx, key, []byte(e.id), last.Sequence)
	if isWrongLastSequence(err) {
		return 0, "", 0, ErrNotOwner
	}
	if err != nil {
		return 0, "", 0, err
	}
	return rev, from, projected, nil
}

// anyProjected says that every commit of a run is projected, whatever its
// log's last: a key never made, or whose release marker has gone (after
// releasedTTL; the run's held messages bring an engine to it well before
// then), or written by an earlier version.
const anyProjected = math.MaxUint64

// forget drops this engine's hold on a run it no longer owns: its held
// messages are given back at once (not acknowledged here: they go to the
// owner now, without waiting out their ack wait), its executors' outcomes
// are stale.
func (s *shard) forget(rs *runState) {
	for _, m := range rs.held {
		_ = m.Nak()
	}
	s.e.clients.release(rs.id)
	s.e.setOwned(rs, false)
	rs.loaded = false
	rs.releasedRev, rs.idleSince, rs.keyUnsure = 0, time.Time{}, false
	rs.held, rs.durableHeld, rs.pending = nil, 0, nil
	// The engine that takes the run projects its last commit again; so
	// does this one if it takes the run back: what it projected is not
	// known any more (sends may be in flight).
	rs.projection = projection{quarantined: rs.projection.quarantined}
	clear(rs.inflight)
	clear(rs.leases)
	clear(rs.unclaimed)
}

// ownerLinger is how long an engine keeps a run between two batches before
// it gives it up: the next batch of an active run usually comes within
// it, and its messages then reach (or are forwarded to) the engine that has
// the run folded in memory, which saves the key's release and creation. A
// run parked on a ticket, or ended, is given up at once: what it waits for
// may take hours, and the cache can then let it go.
const ownerLinger = 2 * time.Second

// quiescent reports whether nothing of the run is in progress here.
func (rs *runState) quiescent() bool {
	return len(rs.held) == 0 && len(rs.pending) == 0 && len(rs.inflight) == 0 && len(rs.leases) == 0 && !rs.projection.pending()
}

// noteIdle starts (or stops) the linger of a run this engine owns, or
// gives the run up at once when lingering would serve nothing.
func (s *shard) noteIdle(ctx context.Context, rs *runState) {
	switch {
	case !rs.owned || !rs.quiescent():
		rs.idleSince = time.Time{}
	case !rs.loaded || rs.run.End != nil || aggregate.Next(rs.run).Kind != aggregate.NextNone:
		s.release(ctx, rs)
	case rs.idleSince.IsZero():
		rs.idleSince = time.Now()
	}
}

// releaseIdle gives up the runs quiescent here for longer than the linger
// (all of them, at shutdown); the cache may then let them go (the lease
// tick's evict).
func (s *shard) releaseIdle(all bool) {
	linger := min(ownerLinger, s.e.cfg.AckWait/3)
	var ctx context.Context
	for _, rs := range s.runs {
		if !rs.owned || !rs.quiescent() || rs.idleSince.IsZero() || (!all && time.Since(rs.idleSince) < linger) {
			continue
		}
		if ctx == nil {
			var cancel context.CancelFunc
			ctx, cancel = opCtx()
			defer cancel()
		}
		s.release(ctx, rs)
	}
}

// release gives the run up. It deletes the key as the bucket does (a
// delete marker, so that another engine's Create succeeds), but through a
// plain publish, which returns the marker's revision for the next acquire.
//
// A release that fails for a passing reason (an election) keeps the run,
// and is tried again after the linger: the key has no TTL, and one left
// behind would name this engine until it dies. Each try is short, so that
// a shard with many runs to release is not held up by a server that does
// not answer.
func (s *shard) release(ctx context.Context, rs *runState) {
	if !rs.owned || !rs.quiescent() {
		return
	}
	key := protocol.OwnerKey(rs.id)
	m := nats.NewMsg(s.e.names.KVSubject(protocol.BucketOwners, key))
	m.Header.Set(kvOperation, kvOperationDelete)
	// Whoever takes the key next projects again a commit after this one: a
	// commit appended late by an engine this one took the run from.
	m.Header.Set(protocol.HeaderProjected, strconv.FormatUint(rs.tip.seq, 10))
	tctx, cancel := context.WithTimeout(ctx, streamTry)
	deleteAt := func(rev uint64) (*jetstream.PubAck, error) {
		return s.e.js.PublishMsg(tctx, m, jetstream.WithExpectLastSequencePerSubject(rev), jetstream.WithMsgTTL(releasedTTL))
	}
	ack, err := deleteAt(rs.ownRev)
	if isWrongLastSequence(err) {
		if rev, ok := s.e.namesThis(tctx, key); ok {
			ack, err = deleteAt(rev)
		}
	}
	cancel()
	if err != nil && !isWrongLastSequence(err) {
		s.e.log.Debug().Str(fieldRunID, rs.id).Err(err).Msg("release failed; trying again after the linger")
		rs.idleSince = time.Now()
		rs.keyUnsure = true // it may have landed all the same
		return
	}
	s.e.setOwned(rs, false)
	rs.keyUnsure = false
	rs.idleSince = time.Time{}
	s.e.clients.release(rs.id) // not this engine's work any more
	if err == nil {
		rs.releasedRev, rs.releasedAt = ack.Sequence, rs.tip.seq
	} // else the key moved on: not this engine's to release
}

// confirmKey makes sure that this engine still holds the run's key, by
// writing it again on the condition that it is at the revision this
// engine holds, and returns ErrNotOwner (the run forgotten here) when it
// is not: released by an answer that was lost, or taken by an engine that
// found this one dead. An engine that went on as the owner then would
// decide over another engine's work: enter a call that engine enters too,
// or find that engine's call executing and make it indeterminate.
func (s *shard) confirmKey(ctx context.Context, rs *runState) error {
	if !rs.owned {
		return ErrNotOwner
	}
	kv, key := s.e.ownersKV, protocol.OwnerKey(rs.id)
	rev, err := kv.Update(ctx, key, []byte(s.e.id), rs.ownRev)
	if isWrongLastSequence(err) {
		if read, ok := s.e.namesThis(ctx, key); ok {
			rev, err = kv.Update(ctx, key, []byte(s.e.id), read)
		}
	}
	if isWrongLastSequence(err) {
		s.e.log.Warn().Str(fieldRunID, rs.id).Msg("lost the run to another engine: its key is not this engine's any more")
		s.forget(rs)
		return ErrNotOwner
	}
	if err != nil {
		rs.keyUnsure = true // it may have landed all the same
		return fmt.Errorf("confirm the key of run %s: %w", rs.id, err)
	}
	rs.ownRev, rs.keyUnsure = rev, false
	return nil
}

// namesThis reads a run's key that was not at the revision this engine
// holds, and returns the revision read when the key names this engine: a
// write of its own whose answer was lost (a confirmation) landed, and the
// key is still this engine's if a write conditional on that revision
// succeeds.
func (e *Engine) namesThis(ctx context.Context, key string) (uint64, bool) {
	owner, rev := e.readOwner(ctx, key)
	return rev, owner == e.id
}

// readOwner reads a key of the owners bucket: the engine it names and its
// revision ("" when it names none, or the read failed). The read is a
// direct get, which a replica behind the others may answer: it decides
// nothing alone, only what a write conditional on its revision then
// confirms, or where an inbox message is forwarded.
func (e *Engine) readOwner(ctx context.Context, key string) (string, uint64) {
	entry, err := e.ownersKV.Get(ctx, key)
	if err != nil {
		return "", 0
	}
	return string(entry.Value()), entry.Revision()
}

// confirmIfUnsure confirms the run's key when it is unsure (keyUnsure).
func (s *shard) confirmIfUnsure(ctx context.Context, rs *runState) error {
	if !rs.keyUnsure {
		return nil
	}
	return s.confirmKey(ctx, rs)
}

// releasedTTL is how long the delete marker of a released key stays in
// the owners bucket: the keys have no TTL of their own, and a marker kept
// forever would be one message per run ever run.
const releasedTTL = 10 * time.Minute

// ownerNow is ErrNotOwner naming the engine the run's key names, as read
// (ownedElsewhere: an inbox message is forwarded to it), or plain
// ErrNotOwner when the read names none other. It decides nothing: a run is
// let go only on a conditional write's answer (confirmKey).
func (e *Engine) ownerNow(ctx context.Context, runID string) error {
	if owner, _ := e.readOwner(ctx, protocol.OwnerKey(runID)); owner != "" && owner != e.id {
		return ownedElsewhere{owner: owner}
	}
	return ErrNotOwner
}

// The key-value protocol's delete marker (JetStream ADR-8).
const (
	kvOperation       = "KV-Operation"
	kvOperationDelete = "DEL"
	kvOperationPurge  = "PURGE"
)

// kvRemoved reports whether a bucket's message says its key is gone:
// deleted, purged, or a marker the server left where a message expired
// (a bucket's LimitMarkerTTL), as the bucket's own reads take them.
func kvRemoved(h nats.Header) bool {
	op := h.Get(kvOperation)
	return op == kvOperationDelete || op == kvOperationPurge || h.Get(jetstream.MarkerReasonHeader) != ""
}

// setOwned records whether this engine holds the run's owner key, and
// counts the runs it holds (toolbatch_runs_owned).
func (e *Engine) setOwned(rs *runState, owned bool) {
	if rs.owned == owned {
		return
	}
	rs.owned = owned
	if owned {
		e.ownedRuns.Add(1)
	} else {
		e.ownedRuns.Add(-1)
	}
}
