package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/aggregate"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/protocol"
)

// An engine may believe it holds a run's key when it does not: its release
// landed but the answer was lost, or another engine found it dead. These
// tests put it in that state and check that it decides nothing over the
// run before it has confirmed the key.

// TestALoadRecoversOnlyARunWhoseKeyItHolds: a run with a never_replay
// call executing (another engine's, which runs it) is loaded here by an
// engine whose revision of the key is not the key's: it lets the run go,
// and the call is not made indeterminate. The same load by the key's
// holder recovers it (the set-up does reach the recovery).
func TestALoadRecoversOnlyARunWhoseKeyItHolds(t *testing.T) {
	for _, holder := range []bool{false, true} {
		e, s, ctx := projectionShard(t)
		const run = "stale-owner"
		appendExecuting(t, ctx, e.js, run)
		rs := s.state(run)
		e.setOwned(rs, true)
		rev, err := e.ownersKV.Create(ctx, protocol.OwnerKey(run), []byte("another-engine"))
		if err != nil {
			t.Fatal(err)
		}
		rs.ownRev = rev - 1 // this engine's revision, from before the other took the key
		if holder {
			if rs.ownRev, err = e.ownersKV.Put(ctx, protocol.OwnerKey(run), []byte(e.id)); err != nil {
				t.Fatal(err)
			}
		}
		err = s.load(ctx, rs)
		commits := eventCount(t, ctx, e, run)
		switch {
		case holder && (err != nil || commits != 2):
			t.Fatalf("the key's holder: load %v, %d commits (want the recovery's second)", err, commits)
		case !holder && (err != ErrNotOwner || rs.owned || commits != 1):
			t.Fatalf("a stale holder: load %v, owned %v, %d commits (want ErrNotOwner, the run let go, the log untouched)", err, rs.owned, commits)
		}
	}
}

// TestAnUnsureReleaseIsConfirmed: a release that gets no answer leaves
// the run owned here with its key unsure. When the release had landed, the
// next acquire takes the key anew rather than going on with a revision the
// key is no longer at; when it had not, the key is confirmed and the run
// kept as it is.
func TestAnUnsureReleaseIsConfirmed(t *testing.T) {
	for _, landed := range []bool{true, false} {
		e, s, ctx := projectionShard(t)
		const run = "unsure"
		rs, key := heldHere(t, ctx, e, s, run)
		if landed {
			if err := e.ownersKV.Delete(ctx, key); err != nil { // the release's marker, landed
				t.Fatal(err)
			}
		}
		unanswered, cancel := context.WithCancel(ctx)
		cancel()
		s.release(unanswered, rs)
		if !rs.owned || !rs.keyUnsure {
			t.Fatalf("landed %v: a release without an answer left owned %v, unsure %v (want both)", landed, rs.owned, rs.keyUnsure)
		}
		if err := s.acquire(ctx, rs); err != nil {
			t.Fatal(err)
		}
		entry, err := e.ownersKV.Get(ctx, key)
		if err != nil {
			t.Fatalf("landed %v: the key is not held: %v", landed, err)
		}
		if !rs.owned || rs.keyUnsure || rs.ownRev != entry.Revision() || string(entry.Value()) != e.id {
			t.Fatalf("landed %v: owned %v, unsure %v, revision %d; the key: %q at %d", landed, rs.owned, rs.keyUnsure, rs.ownRev, entry.Value(), entry.Revision())
		}
	}
}

// TestAConfirmationThatLandedUnansweredKeepsTheRun: the key was written
// again by this engine (a confirmation whose answer was lost), so that it
// is not at the revision the engine holds; it still names this engine,
// and the next confirmation keeps the run rather than letting it go.
func TestAConfirmationThatLandedUnansweredKeepsTheRun(t *testing.T) {
	e, s, ctx := projectionShard(t)
	const run = "confirmed-unanswered"
	rs, key := heldHere(t, ctx, e, s, run)
	rs.loaded = true
	if _, err := e.ownersKV.Update(ctx, key, []byte(e.id), rs.ownRev); err != nil { // the confirmation that landed
		t.Fatal(err)
	}
	if err := s.confirmKey(ctx, rs); err != nil {
		t.Fatalf("confirmKey: %v", err)
	}
	entry, err := e.ownersKV.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if !rs.owned || !rs.loaded || rs.ownRev != entry.Revision() {
		t.Fatalf("owned %v, loaded %v, revision %d, the key's %d: want the run kept at the key's revision", rs.owned, rs.loaded, rs.ownRev, entry.Revision())
	}
}

// TestAReleaseAfterAConfirmationThatLandedUnanswered: the key was written
// again by this engine (a confirmation whose answer was lost), so that it
// is not at the revision the engine holds; a release deletes it all the
// same, rather than leaving it naming this engine.
func TestAReleaseAfterAConfirmationThatLandedUnanswered(t *testing.T) {
	e, s, ctx := projectionShard(t)
	rs, key := heldHere(t, ctx, e, s, "released-after-confirmation")
	if _, err := e.ownersKV.Update(ctx, key, []byte(e.id), rs.ownRev); err != nil { // the confirmation that landed
		t.Fatal(err)
	}
	s.release(ctx, rs)
	_, err := e.ownersKV.Get(ctx, key)
	if rs.owned || rs.releasedRev == 0 || !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("owned %v, released at %d, the key: %v; want the key deleted by the release", rs.owned, rs.releasedRev, err)
	}
}

// TestAConflictGoesOnOnlyWithTheKeyConfirmed: a run this engine owns is
// extended by another commit while its never_replay call runs here; the
// call's outcome then meets a conflict. The engine goes on only once a
// write conditional on its revision of the key succeeds: when another
// engine took the key, it lets the run go, although its reads of the key
// (from a replica that is behind) still name this engine; when the owners
// bucket cannot be reached, it commits nothing and keeps the key unsure.
func TestAConflictGoesOnOnlyWithTheKeyConfirmed(t *testing.T) {
	for _, taken := range []bool{true, false} {
		e, s, ctx := projectionShard(t)
		const run = "conflict"
		appendExecuting(t, ctx, e.js, run)
		rs, key := heldHere(t, ctx, e, s, run)
		rev := rs.ownRev
		rs.inflight["c1/1"] = true // the call runs here
		if err := s.load(ctx, rs); err != nil {
			t.Fatal(err)
		}
		if taken {
			stale, err := e.ownersKV.Get(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := e.ownersKV.Update(ctx, key, []byte("another-engine"), rev); err != nil {
				t.Fatal(err)
			}
			e.ownersKV = laggingKV{e.ownersKV, stale} // its reads still name this engine
		}
		b := rs.run.OpenBatch()
		appendAfter(t, ctx, e.js, run, rs.tip.seq, &events.CallIndeterminate{BatchID: b.ID, CallID: "c1", Attempt: 1,
			Reason: "recovered by another engine", At: time.Now().UTC()})
		if !taken {
			if err := e.js.DeleteKeyValue(ctx, e.names.OwnersBucket()); err != nil {
				t.Fatal(err)
			}
		}
		sent := events.TextOutput("c1", "sent")
		s.handle(ctx, item{runID: run, work: &outcome{callID: "c1", attempt: 1, output: &sent}})
		commits := eventCount(t, ctx, e, run)
		switch {
		case commits != 2:
			t.Fatalf("taken %v: %d commits, want 2 (this engine's outcome not committed after the conflict)", taken, commits)
		case taken && rs.owned:
			t.Fatal("the key was taken by another engine, and the run is still owned here")
		case !taken && (!rs.owned || !rs.keyUnsure):
			t.Fatalf("bucket unreachable: owned %v, unsure %v (want the run kept, its key unsure)", rs.owned, rs.keyUnsure)
		}
	}
}

// TestAnOutcomeWaitsForAnUnsureKey: the outcome of a call that ran here
// reaches a run whose key is unsure (a release without an answer) and
// which another engine has taken since: nothing is committed, the run is
// let go, and nothing of it stays in flight here.
func TestAnOutcomeWaitsForAnUnsureKey(t *testing.T) {
	e, s, ctx := projectionShard(t)
	const run = "outcome-unsure"
	appendExecuting(t, ctx, e.js, run)
	rs := takenUnsure(t, ctx, e, s, run)
	rs.inflight["c1/1"] = true // the call ran here
	sent := events.TextOutput("c1", "sent")
	s.handle(ctx, item{runID: run, work: &outcome{callID: "c1", attempt: 1, output: &sent}})
	if commits := eventCount(t, ctx, e, run); commits != 1 || rs.owned || len(rs.inflight) != 0 {
		t.Fatalf("%d commits, owned %v, in flight %v: want the log untouched and the run let go", commits, rs.owned, rs.inflight)
	}
}

// TestKeepAliveConfirmsAnUnsureKey: the shard's tick, which drives again
// a run whose last attempt failed, confirms an unsure key first: a run
// another engine has taken since is let go, not gated here.
func TestKeepAliveConfirmsAnUnsureKey(t *testing.T) {
	e, s, ctx := projectionShard(t)
	const run = "keep-alive-unsure"
	_, evs := submitted(t, run, e.cfg.Catalog.SnapshotID())
	appendFirst(t, ctx, e.js, run, evs...)
	rs := takenUnsure(t, ctx, e, s, run)
	rs.projection.unknown = true // the last append's answer was lost: driven again on the tick
	s.keepAlive(ctx)
	if commits := eventCount(t, ctx, e, run); commits != 1 || rs.owned {
		t.Fatalf("%d commits, owned %v: want the log untouched and the run let go", commits, rs.owned)
	}
}

// takenUnsure returns a run this engine holds with its key unsure, whose
// key another engine has taken since.
func takenUnsure(t *testing.T, ctx context.Context, e *Engine, s *shard, run string) *runState {
	t.Helper()
	rs, key := heldHere(t, ctx, e, s, run)
	if _, err := e.ownersKV.Update(ctx, key, []byte("another-engine"), rs.ownRev); err != nil {
		t.Fatal(err)
	}
	rs.keyUnsure = true
	return rs
}

// heldHere returns a run whose key this engine creates and holds, and the
// key.
func heldHere(t *testing.T, ctx context.Context, e *Engine, s *shard, run string) (*runState, string) {
	t.Helper()
	key := protocol.OwnerKey(run)
	rev, err := e.ownersKV.Create(ctx, key, []byte(e.id))
	if err != nil {
		t.Fatal(err)
	}
	rs := s.state(run)
	e.setOwned(rs, true)
	rs.ownRev = rev
	return rs, key
}

// TestAKeyReadAsThisEnginesIsWrittenAgain: a key whose last message names
// this engine is taken with a write conditional on that message, not on
// the read alone: the read may come from a replica that is behind (a
// direct get), while another engine holds the key.
func TestAKeyReadAsThisEnginesIsWrittenAgain(t *testing.T) {
	e, _, ctx := projectionShard(t)
	key := protocol.OwnerKey("mine")
	rev, err := e.ownersKV.Create(ctx, key, []byte(e.id))
	if err != nil {
		t.Fatal(err)
	}
	got, from, _, err := e.takeKey(ctx, key)
	if err != nil || from != e.id || got <= rev {
		t.Fatalf("takeKey: revision %d (the read's %d), from %q, %v: want the key written again", got, rev, from, err)
	}
}

// appendExecuting appends a run's first commit: a batch of one
// never_replay brain call, allowed and entered.
func appendExecuting(t *testing.T, ctx context.Context, js jetstream.JetStream, run string) {
	t.Helper()
	r, evs := submitted(t, run, "")
	now := time.Now().UTC()
	_, gated, err := aggregate.Decide(r, aggregate.Gate{Decisions: []aggregate.Decision{{CallID: "c1", Outcome: events.GateAllow,
		Stage: events.StageDefault, Capability: events.CapNonRecoverable}}, At: now})
	if err != nil {
		t.Fatal(err)
	}
	appendFirst(t, ctx, js, run, append(evs, gated...)...)
}

// submitted is the decision of a run's first batch under a catalog
// snapshot: one call of a never_replay brain tool, not yet gated.
func submitted(t *testing.T, run, snapshot string) (*aggregate.Run, []events.Event) {
	t.Helper()
	sub := &protocol.Submit{RunID: run, ThreadID: "t", Step: 1, Assistant: events.Message{ID: "m", Content: []events.ContentBlock{
		{Type: events.BlockToolUse, ID: "c1", Name: "send", Input: events.RawJSON("{}")}}}}
	nr := events.Descriptor{Target: events.TargetBrain, Kind: events.KindTool, Policy: events.Policy{Mode: events.ModeNeverReplay}}
	r, evs, err := aggregate.Decide(aggregate.New(run), aggregate.Submit{Submission: sub.Submission(), Tools: []events.Descriptor{nr}, SnapshotID: snapshot, At: time.Now().UTC()})
	if err != nil {
		t.Fatal(err)
	}
	return r, evs
}

// laggingKV answers reads of one key as a replica behind the others may:
// with an entry read before the key moved on.
type laggingKV struct {
	jetstream.KeyValue
	stale jetstream.KeyValueEntry
}

func (l laggingKV) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	if key == l.stale.Key() {
		return l.stale, nil
	}
	return l.KeyValue.Get(ctx, key)
}

// eventCount returns how many commits of a run the events stream holds.
func eventCount(t *testing.T, ctx context.Context, e *Engine, run string) uint64 {
	t.Helper()
	info, err := e.events.stream.Info(ctx, jetstream.WithSubjectFilter(e.names.Events(run)))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Subjects[e.names.Events(run)]
}
