package engine

import (
	"fmt"
	"sync"
	"testing"

	"github.com/toolbatch/toolbatch/aggregate"
	"github.com/toolbatch/toolbatch/events"
)

// TestStateInStreamOrderWhateverTheApplyOrder applies finalized batches'
// commands to the real state bucket out of stream order, again, and from
// several writers at once, and reads back what applying them in stream
// order gives.
func TestStateInStreamOrderWhateverTheApplyOrder(t *testing.T) {
	e, ctx := setUpEngine(t)
	if err := e.openBuckets(ctx); err != nil {
		t.Fatal(err)
	}
	s := e.state
	merge := func(key, v string) events.Command {
		return events.Command{Scope: events.ScopeThread, Key: key, Merge: events.MergeCommutative, Action: events.ActionSet, Value: events.MustJSON(v)}
	}
	set := func(key, v string) events.Command {
		return events.Command{Scope: events.ScopeThread, Key: key, Merge: events.MergeDisjoint, Action: events.ActionSet, Value: events.MustJSON(v)}
	}
	remove := func(key string) events.Command {
		return events.Command{Scope: events.ScopeThread, Key: key, Action: events.ActionRemove}
	}
	apply := func(run string, seq uint64, cmds ...events.Command) {
		t.Helper()
		if err := s.apply(ctx, run, "t1", seq, 0, cmds); err != nil {
			t.Fatalf("apply commit %d: %v", seq, err)
		}
	}
	visible := func() map[string]string {
		t.Helper()
		v, err := s.visible(ctx, "r1", "t1")
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for k, x := range v {
			out[k] = string(x.(events.RawJSON))
		}
		return out
	}

	// Commit 12 (run r2) is applied before commit 10 (run r1), and 10 twice.
	apply("r2", 12, merge("color", `{"b":2}`), set("size", `"L"`))
	apply("r1", 10, merge("color", `{"a":1,"b":1}`), remove("size"), set("mood", `"calm"`))
	apply("r1", 10, merge("color", `{"a":1,"b":1}`), remove("size"), set("mood", `"calm"`))
	// A remove after a set, applied before it.
	apply("r3", 20, remove("mood"))
	apply("r2", 18, set("mood", `"busy"`))
	want := map[string]string{"thread.t1.color": `{"a":1,"b":2}`, "thread.t1.size": `"L"`}
	if got := visible(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("state %v, want %v", got, want)
	}

	// A key written by an earlier version, without stamps, is as of where
	// its projection ended (here 25): a commit before then, projected
	// again, changes nothing; a later one applies on top of it.
	if _, err := s.kv.Put(ctx, "thread.t1.old", []byte(`{"x":1}`)); err != nil {
		t.Fatal(err)
	}
	s.unstampedUntil = 25
	apply("r1", 24, set("old", `"from commit 24"`))
	apply("r1", 30, merge("old", `{"y":2}`))
	if got := visible()["thread.t1.old"]; got != `{"x":1,"y":2}` {
		t.Fatalf("old key: %s", got)
	}

	// Many writers at once on one key: each write is conditional on the
	// key's last message, and the value is the stream order's.
	var cmds []events.Command
	var wg sync.WaitGroup
	errs := make(chan error, 26)
	for i := range 26 {
		var c events.Command
		switch i % 4 {
		case 0:
			c = set("busy", fmt.Sprintf(`{"base":%d}`, i))
		case 3:
			c = remove("busy")
		default:
			c = merge("busy", fmt.Sprintf(`{"f%d":%d,"g":%d}`, i%3, i, i))
		}
		cmds = append(cmds, c)
		wg.Add(1)
		go func(seq uint64, c events.Command) {
			defer wg.Done()
			errs <- s.apply(ctx, "r9", "t1", seq, 0, []events.Command{c})
		}(uint64(100+i), c)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	inOrder, err := aggregate.MergeState(nil, "r9", "t1", cmds)
	if err != nil {
		t.Fatal(err)
	}
	got, ok := visible()["thread.t1.busy"]
	if w, wok := inOrder["thread.t1.busy"]; ok != wok || got != string(w) {
		t.Fatalf("busy key after concurrent writers: %q (present %v), want %q (present %v)", got, ok, w, wok)
	}
}
