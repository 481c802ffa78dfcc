package audit_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/toolbatch/toolbatch/aggregate"
	"github.com/toolbatch/toolbatch/audit"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/projector"
	"github.com/toolbatch/toolbatch/protocol"
)

var at = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// stream builds a recorded run the way the engine writes it: one message
// per commit, with its headers, and the out messages its projector
// publishes.
type stream struct {
	t       *testing.T
	run     *aggregate.Run
	model   projector.Model
	seq     uint64
	last    uint64
	commits [][]events.Event
	evs     []audit.Record
	out     []audit.Record
}

func newStream(t *testing.T) *stream {
	return &stream{t: t, run: aggregate.New("r1"), model: projector.NewModel("r1")}
}

func (s *stream) do(cmd aggregate.Command) {
	s.t.Helper()
	_, evs, err := aggregate.Decide(s.run, cmd)
	if err != nil {
		s.t.Fatal(err)
	}
	if err := s.run.ApplyAll(evs); err != nil {
		s.t.Fatal(err)
	}
	s.commits = append(s.commits, evs)
}

// records encodes the commits (after any corruption) as messages.
func (s *stream) records() {
	s.t.Helper()
	for _, evs := range s.commits {
		s.seq++
		body, types, err := events.EncodeCommit(evs)
		if err != nil {
			s.t.Fatal(err)
		}
		s.evs = append(s.evs, audit.Record{Seq: s.seq, Subject: "toolbatch.events.r1", Data: body,
			Headers: map[string][]string{"Toolbatch-Event": types, "Toolbatch-Prev": {fmt.Sprint(s.last)}}})
		s.last = s.seq
		var outs []projector.Output
		for _, e := range evs {
			var o []projector.Output
			if s.model, o, err = projector.Project(s.model, e); err != nil {
				break // a corrupted log: the engine would not have published past it
			}
			outs = append(outs, o...)
		}
		for i, o := range outs {
			b, err := o.Encode()
			if err != nil {
				s.t.Fatal(err)
			}
			s.out = append(s.out, audit.Record{Seq: uint64(len(s.out) + 1), Subject: "toolbatch.out.r1." + o.Subject(), Data: b,
				Headers: map[string][]string{"Toolbatch-Source": {fmt.Sprintf("%d/%d", s.seq, i)}}})
		}
	}
}

func (s *stream) audit() string {
	a := audit.New("toolbatch")
	for _, r := range s.evs {
		a.Event(r)
	}
	for _, r := range s.out {
		a.Out(r)
	}
	var lines []string
	for _, v := range a.Finish() {
		lines = append(lines, v.String())
	}
	return strings.Join(lines, "\n")
}

// build records a batch of a brain call and a sandbox call, claimed and
// completed.
func build(t *testing.T) *stream {
	s := newStream(t)
	sub := &protocol.Submit{RunID: "r1", ThreadID: "t", Step: 1, Assistant: events.Message{ID: "m", Content: []events.ContentBlock{
		{Type: events.BlockToolUse, ID: "c1", Name: "echo"}, {Type: events.BlockToolUse, ID: "c2", Name: "build"}}}}
	s.do(aggregate.Submit{Submission: sub.Submission(), At: at, SnapshotID: "snap", Tools: []events.Descriptor{
		{Target: events.TargetBrain, Kind: events.KindTool, Policy: events.Policy{Mode: events.ModeNeverReplay}},
		{Target: events.TargetSandbox, Kind: events.KindTool, Policy: events.Policy{Mode: events.ModeReplaySafe}}}})
	s.do(aggregate.Gate{At: at, Decisions: []aggregate.Decision{{CallID: "c1", Outcome: events.GateAllow, Capability: events.CapNonRecoverable}}})
	o := events.TextOutput("", "one")
	s.do(aggregate.Complete{CallID: "c1", Attempt: 1, Output: &o, At: at})
	s.do(aggregate.Gate{At: at, Decisions: []aggregate.Decision{{CallID: "c2", Outcome: events.GateAllow, Capability: events.CapReplaySafe}}})
	s.do(aggregate.Claim{CallID: "c2", Attempt: 1, WorkerID: "w1", Token: "t1", At: at})
	o2 := events.TextOutput("", "built")
	s.do(aggregate.Complete{CallID: "c2", Attempt: 1, ClaimToken: "t1", Output: &o2, At: at})
	return s
}

func TestGoodStreamHasNoViolations(t *testing.T) {
	s := build(t)
	s.records()
	if got := s.audit(); got != "" {
		t.Fatalf("violations in a good stream:\n%s", got)
	}
}

// TestRefusalsOutsideTheLogAreSkipped: the intake's refusals are not
// derived from commits (a throttled submission, a refused resume, also of
// a run with no events), nor is a throttle refusal an engine before the
// throttled subject published on rejected with the source 0/0; the audit
// of a good stream with them finds nothing.
func TestRefusalsOutsideTheLogAreSkipped(t *testing.T) {
	s := build(t)
	s.records()
	throttled, err := events.Marshal(protocol.RejectedOut{BatchID: "r1/2", Code: events.CodeThrottled, Reason: "over its limits"})
	if err != nil {
		t.Fatal(err)
	}
	refused, err := events.Marshal(protocol.RefusedOut{CorrelationID: "x", Code: events.CodeNotAwaiting, Reason: "no ticket"})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []audit.Record{
		{Subject: "toolbatch.out.r1.throttled", Data: throttled},
		{Subject: "toolbatch.out.r9.throttled", Data: throttled},
		{Subject: "toolbatch.out.r1.rejected", Data: throttled, Headers: map[string][]string{"Toolbatch-Source": {"0/0"}}},
		{Subject: "toolbatch.out.r9.refused", Data: refused},
	} {
		r.Seq = uint64(len(s.out) + 1)
		s.out = append(s.out, r)
	}
	if got := s.audit(); got != "" {
		t.Fatalf("violations in a good stream with the intake's refusals:\n%s", got)
	}
}

func TestCorruptedStreams(t *testing.T) {
	cases := []struct {
		name    string
		corrupt func(s *stream)
		want    string
	}{
		{"missing commit", func(s *stream) {
			s.records()
			s.evs = append(s.evs[:2], s.evs[3:]...) // drop the completion of c1
		}, "seq 4 run r1: log (every commit of a run, in order, decodable): a commit is missing: this one follows 3, the run's last commit seen is 2\n" +
			"seq 4 run r1 batch r1/1 call c2: invariant 2 (nothing published before the barrier; one result per tool_use, in model order): apply CallGated to call c2: aggregate: an earlier call is not terminal"},
		{"events out of order", func(s *stream) {
			s.records()
			// The completion of c1 stored before its executing.
			a, b := &s.evs[1], &s.evs[2]
			a.Data, b.Data = b.Data, a.Data
			a.Headers["Toolbatch-Event"], b.Headers["Toolbatch-Event"] = b.Headers["Toolbatch-Event"], a.Headers["Toolbatch-Event"]
		}, "seq 2 run r1 batch r1/1 call c1: log (every commit of a run, in order, decodable): apply CallCompleted to call c1: aggregate: the attempt is not the call's current attempt"},
		{"forged result", func(s *stream) {
			s.commits = append(s.commits[:4], s.commits[5:]...) // drop the claim
			s.records()
		}, "seq 5 run r1 batch r1/1 call c2: invariant 1 (no executor entry before executing is committed): forged result: attempt 1 completed with ok \"built\" but was never claimed"},
		{"claim without executing", func(s *stream) {
			claim := s.commits[4]
			s.commits = append(s.commits[:3], append([][]events.Event{claim}, s.commits[3:4]...)...)
			s.records()
		}, "seq 4 run r1 batch r1/1 call c2: invariant 1 (no executor entry before executing is committed): apply CallClaimed to call c2: aggregate: the call is not executing"},
		{"results before the barrier", func(s *stream) {
			s.records()
			for i := range s.out {
				if strings.HasSuffix(s.out[i].Subject, ".results") {
					s.out[i].Headers["Toolbatch-Source"] = []string{"3/0"}
				}
			}
		}, "seq 3 run r1: invariant 2 (nothing published before the barrier; one result per tool_use, in model order): toolbatch.out.r1.results (out seq 3, source 3/0) was published, but the events derive nothing there: results before (or without) their barrier\n" +
			"seq 6 run r1: invariant 2 (nothing published before the barrier; one result per tool_use, in model order): toolbatch.out.r1.results (source 6/2) derives from the events but was never published"},
		{"results missing", func(s *stream) {
			s.records()
			s.out = s.out[:len(s.out)-1]
		}, "seq 6 run r1: invariant 2 (nothing published before the barrier; one result per tool_use, in model order): toolbatch.out.r1.results (source 6/2) derives from the events but was never published"},
		{"a never_replay call entered twice", func(s *stream) {
			// A second executing for c1 after its first was entered.
			s.commits = s.commits[:2]
			s.commits = append(s.commits, []events.Event{&events.CallExecuting{BatchID: "r1/1", CallID: "c1", Attempt: 2,
				OperationID: "r1/1/c1", Cause: events.CauseRecovered, Capability: events.CapNonRecoverable, At: at}})
			s.records()
		}, "seq 3 run r1 batch r1/1 call c1: invariant 7 (replay only when the pinned mode equals the live capability, within max_attempts): replayed as attempt 2 with mode never_replay, capability non_recoverable, max_attempts 3\n" +
			"seq 3 run r1 batch r1/1 call c1: invariant 6 (a never_replay call is entered at most once): entered 2 times"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := build(t)
			tc.corrupt(s)
			if got := s.audit(); got != tc.want {
				t.Fatalf("audit\n got: %s\nwant: %s", got, tc.want)
			}
		})
	}
}
