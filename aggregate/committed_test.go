package aggregate_test

import (
	"bytes"
	"math/rand"
	"testing"

	"github.com/toolbatch/toolbatch/aggregate"
	"github.com/toolbatch/toolbatch/events"
)

// TestStateEntryAnyOrder applies a key's commands in random orders, some
// of them twice, and checks that the value is always MergeState's of the
// commands in stamp order: what lets any engine apply any finalized
// batch's state whenever it projects it.
func TestStateEntryAnyOrder(t *testing.T) {
	values := []string{`{"a":1}`, `{"a":3,"b":2}`, `{}`, `{"c":{"d":1}}`, `{"b":null}`, `5`, `"s"`, `null`, `[1]`, ``}
	merges := []events.Merge{events.MergeDisjoint, events.MergeExclusive, events.MergeCommutative, events.MergeCommutative}
	seed := *propSeed
	if seed == 0 {
		seed = 1
	}
	for run := range *propRuns * 10 {
		rng := rand.New(rand.NewSource(seed + int64(run)))
		// What an earlier version wrote: a value without stamps.
		var initial events.RawJSON
		if rng.Intn(3) == 0 {
			initial = events.RawJSON(`{"a":0,"z":9}`)
		}
		type stamped struct {
			c  events.Command
			at aggregate.Stamp
		}
		var cmds []stamped
		seq := uint64(1)
		for range 1 + rng.Intn(7) {
			seq += uint64(1 + rng.Intn(2))
			c := events.Command{Scope: events.ScopeShared, Key: "k", Action: events.ActionSet, Merge: merges[rng.Intn(len(merges))]}
			if rng.Intn(6) == 0 {
				c = events.Command{Scope: events.ScopeShared, Key: "k", Action: events.ActionRemove}
			} else if v := values[rng.Intn(len(values))]; v != "" {
				c.Value = events.MustJSON(v)
			}
			cmds = append(cmds, stamped{c, aggregate.Stamp{Seq: seq, Idx: rng.Intn(3)}})
		}

		in := map[string]events.RawJSON{}
		if initial != nil {
			in["shared.k"] = initial
		}
		var ordered []events.Command
		for _, s := range cmds {
			ordered = append(ordered, s.c)
		}
		want, err := aggregate.MergeState(in, "r", "t", ordered)
		if err != nil {
			t.Fatalf("seed %d: MergeState: %v", seed+int64(run), err)
		}
		wantV, wantOK := want["shared.k"]
		if wantOK && len(wantV) == 0 {
			wantV = events.RawJSON("null") // as the bucket stores an absent value
		}

		order := rng.Perm(len(cmds))
		for range rng.Intn(3) { // some delivered again
			order = append(order, rng.Intn(len(cmds)))
		}
		e := aggregate.StateEntry{Value: initial}
		for _, i := range order {
			if e, _, err = e.Apply(cmds[i].c, cmds[i].at); err != nil {
				t.Fatalf("seed %d: Apply: %v", seed+int64(run), err)
			}
		}
		if (e.Value != nil) != wantOK || !bytes.Equal(e.Value, wantV) {
			t.Fatalf("seed %d: commands %v applied in order %v: %q, want %q (present %v)", seed+int64(run), cmds, order, e.Value, wantV, wantOK)
		}
		// Once every command is in, none changes it again.
		for _, s := range cmds {
			if _, changed, _ := e.Apply(s.c, s.at); changed {
				t.Fatalf("seed %d: command %v at %v applied again changed %q", seed+int64(run), s.c, s.at, e.Value)
			}
		}
	}
}
