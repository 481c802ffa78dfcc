package chaos

import (
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/toolbatch/toolbatch/audit"
	"github.com/toolbatch/toolbatch/events"
)

// These tests show the cluster mode's pure parts on fabricated input: the
// server-only checks, the failover figures and the fault plan.

func TestServerOnlyChecksPassAGoodSchedule(t *testing.T) {
	rec, _ := scenario(t)
	if got := checkServerOnly(foldEvents(rec), map[string][]int{"r1/1/c1": {1}, "r1/1/c2": {2}}); len(got) != 0 {
		t.Fatalf("failures:\n%s", strings.Join(got, "\n"))
	}
}

func TestServerOnlyChecksCatch(t *testing.T) {
	cases := []struct {
		name    string
		change  func(rec *recorded, effects map[string][]int)
		message string
	}{
		{"a replay_safe effect doubled", func(_ *recorded, e map[string][]int) {
			e["r1/1/c2"] = []int{1, 2}
		}, "r1/1/c2 (sb_replay, replay_safe): effect doubled: 2 effect lines"},
		{"the same attempt entered twice", func(_ *recorded, e map[string][]int) {
			e["r1/1/c2"] = []int{2, 2}
		}, "lines per attempt map[2:2]"},
		{"a call made indeterminate", func(rec *recorded, _ map[string][]int) {
			rec.events[2] = commit(t, 3, "r1", &events.CallIndeterminate{BatchID: "r1/1", CallID: "c1", Attempt: 1, Reason: "owner lost", At: at})
		}, "server-only faults: r1/1/c1 made indeterminate (owner lost)"},
		{"a call completed unavailable", func(rec *recorded, _ map[string][]int) {
			rec.events[2] = commit(t, 3, "r1", &events.CallCompleted{BatchID: "r1/1", CallID: "c1", Attempt: 1,
				ErrorKind: events.ErrorUnavailableBeforeDispatch, Output: events.ErrorOutput("c1", "unavailable"), At: at})
		}, "r1/1/c1 completed unavailable_before_dispatch"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec, _ := scenario(t)
			effects := map[string][]int{"r1/1/c1": {1}, "r1/1/c2": {2}}
			tc.change(rec, effects)
			got := strings.Join(checkServerOnly(foldEvents(rec), effects), "\n")
			if !strings.Contains(got, tc.message) {
				t.Fatalf("failures:\n%s\nwant one containing %q", got, tc.message)
			}
		})
	}
}

func TestFailoversCountRunsWithAnUnfinishedBatch(t *testing.T) {
	timed := func(r audit.Record, d time.Duration) audit.Record { r.Time = at.Add(d); return r }
	rec := &recorded{events: []audit.Record{
		// r1: a batch open across the fault, its next commit 700 ms after.
		timed(commit(t, 1, "r1", &events.BatchSubmitted{RunID: "r1", BatchID: "r1/1", Step: 1, At: at}), 0),
		// r2: a batch finalized before the fault: not counted.
		timed(commit(t, 2, "r2", &events.BatchSubmitted{RunID: "r2", BatchID: "r2/1", Step: 1, At: at}), 100*time.Millisecond),
		timed(commit(t, 3, "r2", &events.BatchFinalized{BatchID: "r2/1", Step: 1, At: at}), 200*time.Millisecond),
		// r3: a batch open across the fault, its next commit 2.3 s after.
		timed(commit(t, 4, "r3", &events.BatchSubmitted{RunID: "r3", BatchID: "r3/1", Step: 1, At: at}), 300*time.Millisecond),
		timed(commit(t, 5, "r1", &events.BatchFinalized{BatchID: "r1/1", Step: 1, At: at}), 1200*time.Millisecond),
		timed(commit(t, 6, "r2", &events.BatchSubmitted{RunID: "r2", BatchID: "r2/2", Step: 2, At: at}), 1300*time.Millisecond),
		timed(commit(t, 7, "r3", &events.BatchFinalized{BatchID: "r3/1", Step: 1, At: at}), 2800*time.Millisecond),
	}}
	fault := faultMoment{kind: FaultKillStreamLeader, what: "kill -9 n1", at: at.Add(500 * time.Millisecond)}
	fos := failovers(rec, []faultMoment{fault}, at)
	if len(fos) != 1 || fos[0].At != 500*time.Millisecond {
		t.Fatalf("failovers = %+v", fos)
	}
	got := append([]time.Duration(nil), fos[0].Waits...)
	sort.Slice(got, func(i, j int) bool { return got[i] < got[j] })
	if want := []time.Duration{700 * time.Millisecond, 2300 * time.Millisecond}; !reflect.DeepEqual(got, want) {
		t.Fatalf("waits = %v, want %v", got, want)
	}
	if s := FailoverFigures(fos); s != "kill-stream-leader: median 1.5s, max 2.3s (1 faults, 2 runs)" {
		t.Fatalf("figures = %q", s)
	}
}

func TestFaultPlanIsDrawnFromTheSeed(t *testing.T) {
	for _, seed := range []int64{10, 11} {
		kinds, a := faultPlan(seed, ClusterLong)
		_, b := faultPlan(seed, ClusterLong)
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("seed %d: two draws differ", seed)
		}
		want := ServerFaults
		if seed%2 != 0 {
			want = AllFaults
		}
		if !reflect.DeepEqual(kinds, want) || serverOnly(kinds) != (seed%2 == 0) {
			t.Fatalf("seed %d: kinds %v", seed, kinds)
		}
		var got []string
		for _, st := range a {
			got = append(got, st.kind)
			if st.kind == FaultStop && (st.down < ClusterLong.StopMin || st.down > ClusterLong.StopMax) {
				t.Fatalf("seed %d: stopped for %s", seed, st.down)
			}
		}
		sort.Strings(got)
		sorted := append([]string(nil), want...)
		sort.Strings(sorted)
		if !reflect.DeepEqual(got, sorted) {
			t.Fatalf("seed %d: plan %v, want each of %v once", seed, got, want)
		}
	}
}

// TestClusterShortSeedPlan holds clusterShortSeed to what its comment
// says: a kill of the events leader, and a SIGSTOP of the events leader.
func TestClusterShortSeedPlan(t *testing.T) {
	_, plan := faultPlan(clusterShortSeed, ClusterShort)
	if len(plan) != 2 || plan[0].kind != FaultKillStreamLeader || plan[1].kind != FaultStop || plan[1].pick%3 != 0 {
		t.Fatalf("plan of seed %d: %+v", clusterShortSeed, plan)
	}
}
