package chaos

import (
	"strings"
	"testing"
	"time"

	"github.com/toolbatch/toolbatch/audit"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/protocol"
)

// These tests feed the checks fabricated streams and effects, to show that
// each check fires on what it must catch and stays quiet otherwise.

var at = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func commit(t *testing.T, seq uint64, run string, evs ...events.Event) audit.Record {
	t.Helper()
	body, types, err := events.EncodeCommit(evs)
	if err != nil {
		t.Fatal(err)
	}
	return audit.Record{Seq: seq, Subject: prefix + ".events." + run, Headers: map[string][]string{protocol.HeaderEvent: types}, Data: body}
}

func resultsRecord(t *testing.T, seq uint64, run, batchID string, callIDs ...string) audit.Record {
	t.Helper()
	res := protocol.ResultsOut{BatchID: batchID, Step: 1}
	for _, id := range callIDs {
		res.Results = append(res.Results, events.TextOutput(id, "ok").ToolResultBlock())
	}
	body, err := events.Marshal(&res)
	if err != nil {
		t.Fatal(err)
	}
	return audit.Record{Seq: seq, Subject: prefix + ".out." + run + ".results", Data: body}
}

// scenario is one batch of two sandbox calls: c1 never_replay, c2
// replay_safe; both claimed once (c2 also as attempt 2) and completed.
func scenario(t *testing.T) (*recorded, []batchSpec) {
	s := &protocol.Submit{RunID: "r1", ThreadID: "t", Step: 1, Assistant: events.Message{ID: "m", Content: []events.ContentBlock{
		{Type: events.BlockToolUse, ID: "c1", Name: toolSBNever, Input: events.MustJSON(`{}`)},
		{Type: events.BlockToolUse, ID: "c2", Name: toolSBReplay, Input: events.MustJSON(`{}`)}}}}
	sandbox := func(mode events.Mode) events.Descriptor {
		return events.Descriptor{Target: events.TargetSandbox, Kind: events.KindTool, Policy: events.Policy{Mode: mode, MaxAttempts: 3}}
	}
	rec := &recorded{}
	rec.events = append(rec.events,
		commit(t, 1, "r1", &events.BatchSubmitted{RunID: "r1", ThreadID: "t", BatchID: "r1/1", Step: 1, Assistant: s.Assistant, At: at,
			Calls: []events.Call{{CallID: "c1", ToolID: toolSBNever, Tool: sandbox(events.ModeNeverReplay)},
				{CallID: "c2", ToolID: toolSBReplay, Tool: sandbox(events.ModeReplaySafe)}}}),
		commit(t, 2, "r1", &events.CallClaimed{BatchID: "r1/1", CallID: "c1", Attempt: 1, WorkerID: "w", At: at}),
		commit(t, 3, "r1", &events.CallCompleted{BatchID: "r1/1", CallID: "c1", Attempt: 1, Output: events.TextOutput("c1", "done"), At: at}),
		commit(t, 4, "r1", &events.CallClaimed{BatchID: "r1/1", CallID: "c2", Attempt: 1, WorkerID: "w", At: at}),
		commit(t, 5, "r1", &events.CallExecuting{BatchID: "r1/1", CallID: "c2", Attempt: 2, Cause: events.CauseRecovered, At: at}),
		commit(t, 6, "r1", &events.CallClaimed{BatchID: "r1/1", CallID: "c2", Attempt: 2, WorkerID: "w", At: at}),
		commit(t, 7, "r1", &events.CallCompleted{BatchID: "r1/1", CallID: "c2", Attempt: 2, Output: events.TextOutput("c2", "done"), At: at}),
	)
	rec.out = append(rec.out, resultsRecord(t, 1, "r1", "r1/1", "c1", "c2"))
	return rec, []batchSpec{{submit: s}}
}

func TestChecksPassAGoodSchedule(t *testing.T) {
	rec, subs := scenario(t)
	f := foldEvents(rec)
	effects := map[string][]int{"r1/1/c1": {1}, "r1/1/c2": {1, 2}}
	if got := checkSchedule(rec, nil, f, effects, subs); len(got) != 0 {
		t.Fatalf("failures in a good schedule:\n%s", strings.Join(got, "\n"))
	}
	if len(f.replayed) != 1 || f.replayed[0] != "r1/1/c2 attempt 2" {
		t.Fatalf("replayed = %v", f.replayed)
	}
}

func TestChecksCatch(t *testing.T) {
	cases := []struct {
		name    string
		change  func(rec *recorded, effects map[string][]int, subs *[]batchSpec)
		message string
	}{
		{"a never_replay tool entered twice", func(_ *recorded, e map[string][]int, _ *[]batchSpec) {
			e["r1/1/c1"] = []int{1, 2}
		}, "r1/1/c1 (sb_never, never_replay): entered 2 times"},
		{"an entry without a claim", func(_ *recorded, e map[string][]int, _ *[]batchSpec) {
			e["r1/1/c2"] = []int{1, 2, 3}
		}, "attempt 3 ran but no CallClaimed"},
		{"a success the tool never recorded", func(_ *recorded, e map[string][]int, _ *[]batchSpec) {
			e["r1/1/c2"] = []int{1}
		}, "completed successfully as attempt 2, but the tool never recorded that attempt"},
		{"results published twice", func(rec *recorded, _ map[string][]int, _ *[]batchSpec) {
			rec.out = append(rec.out, rec.out[0])
		}, "batch r1/1: 2 results messages, want exactly 1"},
		{"results lost", func(rec *recorded, _ map[string][]int, _ *[]batchSpec) {
			rec.out = nil
		}, "batch r1/1: 0 results messages, want exactly 1"},
		{"a result missing", func(rec *recorded, _ map[string][]int, _ *[]batchSpec) {
			rec.out = []audit.Record{resultsRecord(t, 1, "r1", "r1/1", "c1")}
		}, "results for tool_use ids [c1], want [c1,c2]"},
		{"an acknowledged batch never accepted", func(_ *recorded, _ map[string][]int, subs *[]batchSpec) {
			s := *(*subs)[0].submit
			s.Step = 2
			*subs = append(*subs, batchSpec{submit: &s})
		}, "batch r1/2: acknowledged by NATS but never accepted"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec, subs := scenario(t)
			effects := map[string][]int{"r1/1/c1": {1}, "r1/1/c2": {1, 2}}
			tc.change(rec, effects, &subs)
			got := strings.Join(checkSchedule(rec, nil, foldEvents(rec), effects, subs), "\n")
			if !strings.Contains(got, tc.message) {
				t.Fatalf("failures:\n%s\nwant one containing %q", got, tc.message)
			}
		})
	}
}

func TestChecksReportAuditViolations(t *testing.T) {
	rec, subs := scenario(t)
	vs := []audit.Violation{{Run: "r1", Batch: "r1/1", Call: "c1", Seq: 3, Invariant: audit.InvNeverReplay, Detail: "entered 2 times"}}
	got := strings.Join(checkSchedule(rec, vs, foldEvents(rec), map[string][]int{"r1/1/c1": {1}, "r1/1/c2": {1, 2}}, subs), "\n")
	if !strings.Contains(got, "audit: seq 3 run r1 batch r1/1 call c1: "+audit.InvNeverReplay) || !strings.Contains(got, "history of r1/1/c1") {
		t.Fatalf("failures:\n%s", got)
	}
}

func TestWorkloadIsDrawnFromTheSeed(t *testing.T) {
	a, b := workload(42, Short), workload(42, Short)
	if len(a) != Short.Runs {
		t.Fatalf("%d runs, want %d", len(a), Short.Runs)
	}
	for i := range a {
		if len(a[i].batches) != len(b[i].batches) {
			t.Fatalf("run %d: %d and %d batches from the same seed", i, len(a[i].batches), len(b[i].batches))
		}
		for j := range a[i].batches {
			if a[i].batches[j].submit.Digest() != b[i].batches[j].submit.Digest() {
				t.Fatalf("run %d batch %d differs between two draws of the same seed", i, j)
			}
			if err := a[i].batches[j].submit.Validate(events.DefaultLimits()); err != nil {
				t.Fatalf("run %d batch %d: %v", i, j, err)
			}
		}
	}
}
