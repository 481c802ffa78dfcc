package engine

import (
	"context"
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

// TestAnUnsureReleaseIsConfirmed: a release whose answer was lost leaves
// the run owned here with its key unsure; when the release had landed,
// the next acquire takes the key anew rather than going on with a
// revision the key is no longer at.
func TestAnUnsureReleaseIsConfirmed(t *testing.T) {
	e, s, ctx := projectionShard(t)
	const run = "unsure"
	key := protocol.OwnerKey(run)
	rev, err := e.ownersKV.Create(ctx, key, []byte(e.id))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.ownersKV.Delete(ctx, key); err != nil { // the release that landed
		t.Fatal(err)
	}
	rs := s.state(run)
	e.setOwned(rs, true)
	rs.ownRev, rs.keyUnsure = rev, true
	if err := s.acquire(ctx, rs); err != nil {
		t.Fatal(err)
	}
	entry, err := e.ownersKV.Get(ctx, key)
	if err != nil {
		t.Fatalf("the key was not taken anew: %v", err)
	}
	if !rs.owned || rs.keyUnsure || rs.ownRev != entry.Revision() || string(entry.Value()) != e.id {
		t.Fatalf("owned %v, unsure %v, revision %d; the key: %q at %d", rs.owned, rs.keyUnsure, rs.ownRev, entry.Value(), entry.Revision())
	}
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
	sub := &protocol.Submit{RunID: run, ThreadID: "t", Step: 1, Assistant: events.Message{ID: "m", Content: []events.ContentBlock{
		{Type: events.BlockToolUse, ID: "c1", Name: "send", Input: events.RawJSON("{}")}}}}
	nr := events.Descriptor{Target: events.TargetBrain, Kind: events.KindTool, Policy: events.Policy{Mode: events.ModeNeverReplay}}
	now := time.Now().UTC()
	r, evs, err := aggregate.Decide(aggregate.New(run), aggregate.Submit{Submission: sub.Submission(), Tools: []events.Descriptor{nr}, At: now})
	if err != nil {
		t.Fatal(err)
	}
	_, gated, err := aggregate.Decide(r, aggregate.Gate{Decisions: []aggregate.Decision{{CallID: "c1", Outcome: events.GateAllow,
		Stage: events.StageDefault, Capability: events.CapNonRecoverable}}, At: now})
	if err != nil {
		t.Fatal(err)
	}
	appendFirst(t, ctx, js, run, append(evs, gated...)...)
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
