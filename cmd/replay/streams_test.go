package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"
	"github.com/toolbatch/toolbatch/aggregate"
	"github.com/toolbatch/toolbatch/audit"
	"github.com/toolbatch/toolbatch/events"

	"github.com/toolbatch/toolbatch/projector"
	"github.com/toolbatch/toolbatch/proof"
	"github.com/toolbatch/toolbatch/protocol"
	"github.com/toolbatch/toolbatch/replay"
)

// The recorded streams of testdata/streams are generated here: a good one,
// built with aggregate.Decide as the engine would build it, and corrupted
// copies of it. `go test ./cmd/replay -run TestStreams -update` rewrites
// the streams and their expected audit reports; without -update the test
// checks that the generator still writes exactly the committed files and
// that the audit still prints exactly the committed reports.

var update = flag.Bool("update", false, "rewrite testdata/streams from the generator")

const streamsDir = "../../testdata/streams"

// epoch is the time of the generated streams: commit n is stored at epoch
// plus n seconds.
var epoch = time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)

// recorder writes commits the way engine/store.go appends them, and the out
// messages the way engine/projector.go publishes them.
type recorder struct {
	t      *testing.T
	seq    uint64
	runs   map[string]*recordedRun
	evs    []audit.Record
	out    []audit.Record
	signer *proof.Signer
}

type recordedRun struct {
	run   *aggregate.Run
	model projector.Model
	last  uint64
	hash  proof.Hash
}

// engineKey is the generated streams' engine key (keys.yaml pins it);
// strangerKey is another, that no keys file pins.
var engineKey, strangerKey = testKey("toolbatch test engine key 000001"), testKey("toolbatch test stranger key 0001")

func testKey(seed string) func(t *testing.T) *proof.Signer {
	return func(t *testing.T) *proof.Signer {
		t.Helper()
		kp, err := nkeys.FromRawSeed(nkeys.PrefixByteUser, []byte(seed))
		if err != nil {
			t.Fatal(err)
		}
		s, err := proof.NewSigner(kp)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		go s.Run(ctx)
		return s
	}
}

func newRecorder(t *testing.T) *recorder {
	return &recorder{t: t, runs: map[string]*recordedRun{}, signer: engineKey(t)}
}

// sign gives a commit its signature headers as the engine writes them,
// after the run's previous commit's hash, and returns the commit's hash.
func sign(t *testing.T, s *proof.Signer, r *audit.Record, prevHash proof.Hash) proof.Hash {
	t.Helper()
	prev, err := strconv.ParseUint(r.Headers[protocol.HeaderPrev][0], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	c := proof.Commit{Subject: r.Subject, Prev: prev, PrevHash: prevHash, Signer: s.Key(), Types: r.Headers[protocol.HeaderEvent], Body: r.Data}
	seal, err := s.Seal(context.Background(), c.Hash())
	if err != nil {
		t.Fatal(err)
	}
	sig, path := seal.Headers()
	r.Headers[protocol.HeaderPrevHash] = []string{prevHash.String()}
	r.Headers[protocol.HeaderSigner] = []string{s.Key()}
	r.Headers[protocol.HeaderSig] = []string{sig}
	r.Headers[protocol.HeaderSigProof] = []string{path}
	return c.Hash()
}

// at is the time of the next commit.
func (rc *recorder) at() time.Time { return epoch.Add(time.Duration(rc.seq+1) * time.Second) }

func (rc *recorder) runOf(id string) *recordedRun {
	r := rc.runs[id]
	if r == nil {
		r = &recordedRun{run: aggregate.New(id), model: projector.NewModel(id)}
		rc.runs[id] = r
	}
	return r
}

// do decides a command and commits its events; it returns the commit's
// sequence.
func (rc *recorder) do(runID string, cmd aggregate.Command) uint64 {
	rc.t.Helper()
	_, evs, err := aggregate.Decide(rc.runOf(runID).run, cmd)
	if err != nil {
		rc.t.Fatalf("decide %T: %v", cmd, err)
	}
	if len(evs) == 0 {
		rc.t.Fatalf("decide %T: no events", cmd)
	}
	return rc.commit(runID, evs...)
}

// commit appends events as one commit, folds them, and publishes what the
// projector derives.
func (rc *recorder) commit(runID string, evs ...events.Event) uint64 {
	rc.t.Helper()
	r := rc.runOf(runID)
	body, types, err := events.EncodeCommit(evs)
	if err != nil {
		rc.t.Fatal(err)
	}
	rc.seq++
	at := epoch.Add(time.Duration(rc.seq) * time.Second)
	sum := sha256.Sum256(body)
	rec := audit.Record{Seq: rc.seq, Subject: "toolbatch.events." + runID, Time: at, Data: body,
		Headers: map[string][]string{
			protocol.HeaderEvent: types,
			protocol.HeaderPrev:  {strconv.FormatUint(r.last, 10)},
			"Nats-Msg-Id":        {fmt.Sprintf("%s/%d/%s", runID, r.last, hex.EncodeToString(sum[:8]))},
		}}
	r.hash = sign(rc.t, rc.signer, &rec, r.hash)
	rc.evs = append(rc.evs, rec)
	r.last = rc.seq
	var outs []projector.Output
	for _, e := range evs {
		if err := r.run.Apply(e); err != nil {
			rc.t.Fatalf("apply %s: %v", e.EventType(), err)
		}
		var o []projector.Output
		if r.model, o, err = projector.Project(r.model, e); err != nil {
			rc.t.Fatal(err)
		}
		outs = append(outs, o...)
	}
	for i, o := range outs {
		b, err := o.Encode()
		if err != nil {
			rc.t.Fatal(err)
		}
		src := fmt.Sprintf("%d/%d", rc.seq, i)
		rc.out = append(rc.out, audit.Record{Seq: uint64(len(rc.out) + 1), Subject: "toolbatch.out." + runID + "." + o.Subject(),
			Time: at, Data: b, Headers: map[string][]string{protocol.HeaderSource: {src}, "Nats-Msg-Id": {"out/" + src}}})
	}
	return rc.seq
}

// Descriptors of the generated catalog.
var tools = map[string]events.Descriptor{
	"echo":     {Target: events.TargetBrain, Kind: events.KindTool, Policy: events.Policy{Mode: events.ModeReplaySafe, MaxAttempts: 3}},
	"build":    {Target: events.TargetSandbox, Kind: events.KindTool, Pool: "default", Policy: events.Policy{Mode: events.ModeReplaySafe, MaxAttempts: 3}},
	"deploy":   {Target: events.TargetBrain, Kind: events.KindTool, Policy: events.Policy{Mode: events.ModeNeverReplay, MaxAttempts: 1}},
	"rm":       {Target: events.TargetBrain, Kind: events.KindTool, Policy: events.Policy{Mode: events.ModeNeverReplay, MaxAttempts: 3}},
	"weather":  {Target: events.TargetBrain, Kind: events.KindTool, Policy: events.Policy{Mode: events.ModeIdempotent, MaxAttempts: 2}},
	"ask_user": {Target: events.TargetBrain, Kind: events.KindClient, Policy: events.Policy{Mode: events.ModeNeverReplay, MaxAttempts: 1}},
}

// submit builds a Submit command; each call is "id name {json}".
func submit(runID string, step int64, at time.Time, calls ...string) aggregate.Submit {
	s := &protocol.Submit{RunID: runID, ThreadID: "thread-" + runID, Step: step,
		Assistant: events.Message{ID: fmt.Sprintf("msg-%s-%d", runID, step), Content: []events.ContentBlock{events.TextBlock("working on it")}}}
	var ds []events.Descriptor
	for _, c := range calls {
		f := strings.SplitN(c, " ", 3)
		s.Assistant.Content = append(s.Assistant.Content, events.ContentBlock{Type: events.BlockToolUse, ID: f[0], Name: f[1], Input: events.MustJSON(f[2])})
		ds = append(ds, tools[f[1]])
	}
	return aggregate.Submit{Submission: s.Submission(), Tools: ds, SnapshotID: "cat-0123456789abcdef", At: at}
}

func gate(call string, outcome events.GateOutcome, stage, rule string, at time.Time) aggregate.Gate {
	return aggregate.Gate{At: at, Decisions: []aggregate.Decision{{CallID: call, Outcome: outcome, Stage: stage, Rule: rule}}}
}

func allow(call string, capability events.Capability, at time.Time) aggregate.Gate {
	g := gate(call, events.GateAllow, events.StageDefault, "", at)
	g.Decisions[0].Capability = capability
	return g
}

func text(call, s string) *events.Output {
	return &events.Output{CallID: call, Content: []events.ContentBlock{events.TextBlock(s)}}
}

// seqs names the commits the corruptions work on.
type seqs struct {
	completeC1, gateC2, claimC2, finalR1 uint64
}

// goodStream records two interleaved runs that use every kind of event:
// brain and sandbox calls, a claim and a fenced (refused) result, a
// confirmation approved by a principal, a client tool's result, a block, a
// set_result, a recovery that re-invokes a replay_safe call and one that
// makes a never_replay call indeterminate, a rejected submission, staged
// state and a cancelled run. With replayed set, the never_replay call is
// (wrongly) re-invoked instead.
func goodStream(rc *recorder, replayed bool) seqs {
	var s seqs
	rc.do("r1", submit("r1", 1, rc.at(), `c1 echo {"q":"hi"}`, `c2 build {"target":"app"}`, `c3 deploy {"env":"prod"}`))
	rc.do("r2", submit("r2", 1, rc.at(), `c1 rm {"path":"/tmp/x"}`, `c2 ask_user {"question":"colour?"}`))
	rc.do("r1", allow("c1", events.CapReplaySafe, rc.at()))
	rc.do("r2", allow("c1", events.CapNonRecoverable, rc.at()))
	s.completeC1 = rc.do("r1", aggregate.Complete{CallID: "c1", Attempt: 1, Output: text("c1", "hi"), At: rc.at()})
	s.gateC2 = rc.do("r1", allow("c2", events.CapReplaySafe, rc.at()))
	if replayed {
		rc.commit("r2", &events.CallExecuting{BatchID: "r2/1", CallID: "c1", Attempt: 2, OperationID: "r2/1/c1",
			Cause: events.CauseRecovered, Capability: events.CapNonRecoverable, At: rc.at()})
		rc.do("r2", aggregate.Complete{CallID: "c1", Attempt: 2, Output: text("c1", "removed again"), At: rc.at()})
	} else {
		rc.do("r2", aggregate.Recover{Capabilities: map[string]events.Capability{"rm": events.CapNonRecoverable}, At: rc.at()})
	}
	s.claimC2 = rc.do("r1", aggregate.Claim{CallID: "c2", Attempt: 1, WorkerID: "worker-a", Token: "tok-1", LeaseMS: 30000, At: rc.at()})
	rc.commit("r1", &events.ResultRefused{BatchID: "r1/1", CallID: "c2", Attempt: 1, ClaimToken: "tok-0",
		Reason: aggregate.ErrStaleClaim.Error(), At: rc.at()})
	rc.do("r1", aggregate.Complete{CallID: "c2", Attempt: 1, ClaimToken: "tok-1", Output: text("c2", "built app"), At: rc.at()})
	rc.do("r2", aggregate.ParkClient{CallID: "c2", CorrelationID: "ticket-client", At: rc.at()})
	deadline := epoch.Add(time.Hour)
	ask := gate("c3", events.GateRequireConfirmation, events.StagePolicy, "gate.rules[0]", rc.at())
	ask.Decisions[0].CorrelationID, ask.Decisions[0].Deadline = "ticket-deploy", &deadline
	rc.do("r1", ask)
	rc.do("r2", aggregate.Resume{Principal: "client-app", At: rc.at(), Answer: events.Answer{CorrelationID: "ticket-client",
		RunID: "r2", ThreadID: "thread-r2", Result: events.ResumeResult{Kind: events.ResultToolResult, Output: text("c2", "blue")}}})
	rc.do("r1", aggregate.Resume{Principal: "alice", Capability: events.CapNonRecoverable, At: rc.at(), Answer: events.Answer{
		CorrelationID: "ticket-deploy", RunID: "r1", ThreadID: "thread-r1", Result: events.ResumeResult{Kind: events.ResultPermission, Allow: true, Note: "ship it"}}})
	s.finalR1 = rc.do("r1", aggregate.Complete{CallID: "c3", Attempt: 1, Output: text("c3", "deployed"), At: rc.at()})
	// A second step 1 with other calls is refused, and recorded.
	again := submit("r2", 1, rc.at(), `c1 rm {"path":"/"}`)
	if _, evs, err := aggregate.Decide(rc.runOf("r2").run, again); err != nil || len(evs) != 1 || evs[0].EventType() != events.TypeBatchRejected {
		rc.t.Fatalf("a second step 1 was not rejected: %v %v", evs, err)
	} else {
		rc.commit("r2", evs...)
	}
	rc.do("r2", aggregate.End{Cause: events.EndCancelled, Reason: "user closed the chat", At: rc.at()})
	rc.do("r1", submit("r1", 2, rc.at(), `c1 rm {"path":"/"}`, `c2 echo {"q":"again"}`, `c3 weather {"city":"Oslo"}`))
	block := gate("c1", events.GateBlock, events.StagePolicy, "gate.rules[1]", rc.at())
	block.Decisions[0].Reason = "rm of / is never allowed"
	rc.do("r1", block)
	rc.do("r1", allow("c2", events.CapReplaySafe, rc.at()))
	rc.do("r1", aggregate.Recover{Capabilities: map[string]events.Capability{"echo": events.CapReplaySafe}, At: rc.at()})
	out := text("c2", "again")
	out.State = []events.Command{{Scope: events.ScopeRun, Key: "echoes", Merge: events.MergeDisjoint, Action: events.ActionSet, Value: events.MustJSON(`2`)}}
	rc.do("r1", aggregate.Complete{CallID: "c2", Attempt: 2, Output: out, At: rc.at()})
	set := gate("c3", events.GateSetResult, events.StagePolicy, "gate.rules[2]", rc.at())
	set.Decisions[0].Output = text("", "sunny (cached)")
	rc.do("r1", set)
	return s
}

// streamCase is one recorded stream of testdata/streams.
type streamCase struct {
	name string
	// want lists what the audit report must mention (beyond the golden
	// file, so that -update cannot bless a report that misses the point).
	want []string
	make func(t *testing.T) (evs, out []audit.Record)
	// keys is the keys file the audit pins (default keys.yaml).
	keys string
	// checkpointed: the audit compares the log with the good stream's
	// checkpoints (good.checkpoints.json).
	checkpointed bool
}

// checkpoints are the good stream's checkpoints, signed by the engine
// key, at two sequences (one inside the stream, one at its end).
func checkpoints(t *testing.T) []byte {
	rc, _ := good(t)
	signer := engineKey(t)
	var h proof.Head
	var b bytes.Buffer
	for _, r := range rc.evs {
		h.AddMessage(r.Seq, proof.Message{Subject: r.Subject, Header: r.Headers, Body: r.Data})
		if r.Seq == 12 || r.Seq == rc.seq {
			cp, err := signer.SignCheckpoint(proof.NewCheckpoint("TOOLBATCH_EVENTS", h, epoch.Add(time.Duration(r.Seq)*time.Second+time.Minute)))
			if err != nil {
				t.Fatal(err)
			}
			b.Write(cp.Encode())
			b.WriteByte('\n')
		}
	}
	return b.Bytes()
}

func good(t *testing.T) (*recorder, seqs) {
	rc := newRecorder(t)
	s := goodStream(rc, false)
	return rc, s
}

var streamCases = []streamCase{
	{name: "good", checkpointed: true, make: func(t *testing.T) ([]audit.Record, []audit.Record) {
		rc, _ := good(t)
		return rc.evs, rc.out
	}},
	{name: "missing-commit", want: []string{"seq 6 run r1: log (every commit of a run, in order, decodable): a commit is missing"},
		make: func(t *testing.T) ([]audit.Record, []audit.Record) {
			rc, s := good(t)
			return drop(rc.evs, s.completeC1), rc.out
		}},
	{name: "swapped-commits", want: []string{"seq 5 run r1: log", "invariant 2"},
		make: func(t *testing.T) ([]audit.Record, []audit.Record) {
			rc, s := good(t)
			return swap(rc.evs, s.completeC1, s.gateC2), rc.out
		}},
	{name: "forged-result", want: []string{"call c2: invariant 1", "forged result"},
		make: func(t *testing.T) ([]audit.Record, []audit.Record) {
			rc, s := good(t)
			return rechain(drop(rc.evs, s.claimC2)), rc.out
		}},
	{name: "claim-without-executing", want: []string{"seq 8 run r1 batch r1/1 call c2: invariant 1"},
		make: func(t *testing.T) ([]audit.Record, []audit.Record) {
			rc, s := good(t)
			return edit(t, rc.evs, s.gateC2, func(evs []events.Event) []events.Event { return evs[:1] }), rc.out
		}},
	{name: "never-replay-replayed", want: []string{"invariant 6", "invariant 7"},
		make: func(t *testing.T) ([]audit.Record, []audit.Record) {
			rc := newRecorder(t)
			goodStream(rc, true)
			return rc.evs, rc.out
		}},
	{name: "results-before-barrier", want: []string{"invariant 2", "results before (or without) their barrier"},
		make: func(t *testing.T) ([]audit.Record, []audit.Record) {
			rc, s := good(t)
			// A results message of r1/1 published from the commit before its
			// barrier, ahead of everything the barrier published.
			i := outIndex(t, rc.out, "toolbatch.out.r1.results", s.finalR1)
			early := cloneRecord(rc.out[i])
			early.Headers[protocol.HeaderSource] = []string{fmt.Sprintf("%d/0", s.finalR1-1)}
			first := outIndex(t, rc.out, "toolbatch.out.r1.disposition", s.finalR1)
			out := append(append(append([]audit.Record{}, rc.out[:first]...), early), rc.out[first:]...)
			return rc.evs, renumber(out)
		}},
	{name: "results-missing", want: []string{"invariant 2", "never published"},
		make: func(t *testing.T) ([]audit.Record, []audit.Record) {
			rc, _ := good(t)
			var out []audit.Record
			for _, r := range rc.out {
				if r.Subject != "toolbatch.out.r2.results" {
					out = append(out, r)
				}
			}
			return rc.evs, renumber(out)
		}},
	{name: "argument-changed", want: []string{"seq 1 run r1: invariant 9", "signature does not verify"},
		make: func(t *testing.T) ([]audit.Record, []audit.Record) {
			rc, _ := good(t)
			return edit(t, rc.evs, 1, func(evs []events.Event) []events.Event {
				b := evs[0].(*events.BatchSubmitted)
				b.Calls[2].Arguments = events.MustJSON(`{"env":"prod","notify":"eve@example.org"}`)
				return evs
			}), rc.out
		}},
	{name: "principal-changed", want: []string{"run r1: invariant 9", "signature does not verify"},
		make: func(t *testing.T) ([]audit.Record, []audit.Record) {
			rc, _ := good(t)
			for _, r := range rc.evs {
				evs, err := events.DecodeCommit(r.Data, r.Headers[protocol.HeaderEvent])
				if err != nil {
					t.Fatal(err)
				}
				if len(evs) > 0 {
					if tr, ok := evs[0].(*events.TicketResolved); ok && tr.Principal == "alice" {
						return edit(t, rc.evs, r.Seq, func(evs []events.Event) []events.Event {
							evs[0].(*events.TicketResolved).Principal = "chris"
							return evs
						}), rc.out
					}
				}
			}
			t.Fatal("no ticket resolved by alice")
			return nil, nil
		}},
	{name: "run-cloned", want: []string{"run r3: invariant 9", "signature does not verify"},
		make: func(t *testing.T) ([]audit.Record, []audit.Record) {
			rc, _ := good(t)
			evs := append([]audit.Record{}, rc.evs...)
			for _, r := range rc.evs {
				if r.Subject == "toolbatch.events.r2" {
					c := cloneRecord(r)
					c.Seq, c.Subject = uint64(len(evs)+1), "toolbatch.events.r3"
					evs = append(evs, c)
				}
			}
			return rechain(evs), rc.out
		}},
	{name: "unsigned-commit", want: []string{"call c2: invariant 1", "invariant 9", "an unsigned commit in a signed log"},
		make: func(t *testing.T) ([]audit.Record, []audit.Record) {
			// a process that is not an engine appends a completion, without a
			// signature: it cannot make one
			rc, s := good(t)
			evs := rechain(drop(rc.evs, s.claimC2))
			for i, r := range evs {
				if r.Seq > s.claimC2 && r.Subject == "toolbatch.events.r1" {
					c := cloneRecord(r)
					for _, h := range []string{protocol.HeaderPrevHash, protocol.HeaderSigner, protocol.HeaderSig, protocol.HeaderSigProof} {
						delete(c.Headers, h)
					}
					evs[i] = c
					break
				}
			}
			return evs, rc.out
		}},
	{name: "resigned-by-stranger", want: []string{"invariant 9", "signed by a key that is not pinned"},
		make: func(t *testing.T) ([]audit.Record, []audit.Record) {
			// the whole log rewritten consistently (an argument changed, every
			// chain and signature remade) with a key of the forger's own
			rc, _ := good(t)
			evs := edit(t, rc.evs, 1, func(evs []events.Event) []events.Event {
				evs[0].(*events.BatchSubmitted).Calls[2].Arguments = events.MustJSON(`{"env":"staging"}`)
				return evs
			})
			stranger := strangerKey(t)
			last := map[string]proof.Hash{}
			for i := range evs {
				evs[i] = cloneRecord(evs[i])
				last[evs[i].Subject] = sign(t, stranger, &evs[i], last[evs[i].Subject])
			}
			return evs, rc.out
		}},
	{name: "revoked-key", keys: "keys-revoked.yaml", want: []string{"seq 21 run r1", "signed by a revoked key", "was revoked after sequence 20"},
		make: func(t *testing.T) ([]audit.Record, []audit.Record) {
			rc, _ := good(t)
			return rc.evs, rc.out
		}},
	{name: "run-dropped", checkpointed: true, want: []string{"seq 12: invariant 9", "differs from what was checkpointed"},
		make: func(t *testing.T) ([]audit.Record, []audit.Record) {
			// every commit and out message of r2 removed: r1's chain holds,
			// only the checkpoints see it
			rc, _ := good(t)
			var evs, out []audit.Record
			for _, r := range rc.evs {
				if r.Subject != "toolbatch.events.r2" {
					evs = append(evs, r)
				}
			}
			for _, r := range rc.out {
				if !strings.HasPrefix(r.Subject, "toolbatch.out.r2.") {
					out = append(out, r)
				}
			}
			return evs, renumber(out)
		}},
	{name: "truncated", checkpointed: true, want: []string{"seq 23: invariant 9", "the log ends at seq 20, before the checkpoint"},
		make: func(t *testing.T) ([]audit.Record, []audit.Record) {
			rc, _ := good(t)
			var out []audit.Record
			for _, r := range rc.out {
				if sourceSeq(r.Headers[protocol.HeaderSource][0]) <= 20 {
					out = append(out, r)
				}
			}
			return rc.evs[:20], out
		}},
	{name: "results-altered", want: []string{"invariant 8", "differs from what the events derive"},
		make: func(t *testing.T) ([]audit.Record, []audit.Record) {
			rc, _ := good(t)
			out := append([]audit.Record{}, rc.out...)
			last := len(out) - 1 // r1/2's results
			var res protocol.ResultsOut
			if err := events.Unmarshal(out[last].Data, &res); err != nil {
				t.Fatal(err)
			}
			res.Results[2].Content = []events.ContentBlock{events.TextBlock("rainy")}
			b, err := events.Marshal(res)
			if err != nil {
				t.Fatal(err)
			}
			out[last] = cloneRecord(out[last])
			out[last].Data = b
			return rc.evs, out
		}},
}

// drop removes the commit at seq (its sequence is not reused).
func drop(rs []audit.Record, seq uint64) []audit.Record {
	var out []audit.Record
	for _, r := range rs {
		if r.Seq != seq {
			out = append(out, r)
		}
	}
	return out
}

// swap exchanges two commits' messages, headers included, leaving the
// sequences where they were: the log holds them in the wrong order.
func swap(rs []audit.Record, a, b uint64) []audit.Record {
	out := append([]audit.Record{}, rs...)
	var ia, ib int
	for i, r := range out {
		switch r.Seq {
		case a:
			ia = i
		case b:
			ib = i
		}
	}
	ra, rb := out[ia], out[ib]
	out[ia] = audit.Record{Seq: ra.Seq, Time: ra.Time, Subject: rb.Subject, Headers: rb.Headers, Data: rb.Data}
	out[ib] = audit.Record{Seq: rb.Seq, Time: rb.Time, Subject: ra.Subject, Headers: ra.Headers, Data: ra.Data}
	return out
}

// rechain rewrites every Toolbatch-Prev so that each run's chain is whole
// again: a forger who covers their tracks.
func rechain(rs []audit.Record) []audit.Record {
	last := map[string]uint64{}
	out := make([]audit.Record, len(rs))
	for i, r := range rs {
		c := cloneRecord(r)
		c.Headers[protocol.HeaderPrev] = []string{strconv.FormatUint(last[r.Subject], 10)}
		last[r.Subject] = r.Seq
		out[i] = c
	}
	return out
}

// edit rewrites the events of the commit at seq.
func edit(t *testing.T, rs []audit.Record, seq uint64, fn func([]events.Event) []events.Event) []audit.Record {
	out := append([]audit.Record{}, rs...)
	for i, r := range out {
		if r.Seq != seq {
			continue
		}
		evs, err := events.DecodeCommit(r.Data, r.Headers[protocol.HeaderEvent])
		if err != nil {
			t.Fatal(err)
		}
		body, types, err := events.EncodeCommit(fn(evs))
		if err != nil {
			t.Fatal(err)
		}
		c := cloneRecord(r)
		c.Data, c.Headers[protocol.HeaderEvent] = body, types
		out[i] = c
	}
	return out
}

func outIndex(t *testing.T, rs []audit.Record, subject string, seq uint64) int {
	for i, r := range rs {
		if r.Subject == subject && strings.HasPrefix(r.Headers[protocol.HeaderSource][0], fmt.Sprintf("%d/", seq)) {
			return i
		}
	}
	t.Fatalf("no %s from commit %d", subject, seq)
	return -1
}

// renumber gives out messages consecutive sequences again.
func renumber(rs []audit.Record) []audit.Record {
	out := make([]audit.Record, len(rs))
	for i, r := range rs {
		out[i] = cloneRecord(r)
		out[i].Seq = uint64(i + 1)
	}
	return out
}

func cloneRecord(r audit.Record) audit.Record {
	h := make(map[string][]string, len(r.Headers))
	for k, v := range r.Headers {
		h[k] = append([]string(nil), v...)
	}
	r.Headers = h
	return r
}

func encodeAll(t *testing.T, rs []audit.Record) []byte {
	var b bytes.Buffer
	for _, r := range rs {
		if err := replay.WriteRecord(&b, r); err != nil {
			t.Fatal(err)
		}
	}
	return b.Bytes()
}

// golden compares got with a committed file, or writes it with -update.
func golden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./cmd/replay -run %s -update)", err, t.Name())
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from what the test produces (go test ./cmd/replay -run %s -update rewrites it):\n--- got\n%s\n--- want\n%s", path, t.Name(), got, want)
	}
}

// inProcess runs the command in-process and returns its stdout and status.
func inProcess(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return out.String(), errb.String(), code
}

// TestStreams checks the recorded streams byte for byte against their
// generator, and their audit reports against the committed ones.
func TestStreams(t *testing.T) {
	if *update {
		if err := os.MkdirAll(streamsDir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	pub := engineKey(t).Key()
	golden(t, filepath.Join(streamsDir, "keys.yaml"), proof.Format([]proof.Key{{Key: pub, Name: "engine-1"}}))
	golden(t, filepath.Join(streamsDir, "good.checkpoints.json"), checkpoints(t))
	golden(t, filepath.Join(streamsDir, "keys-revoked.yaml"), proof.Format([]proof.Key{{Key: pub, Name: "engine-1", Revoked: true, RevokedAfter: 20}}))
	for _, c := range streamCases {
		t.Run(c.name, func(t *testing.T) {
			evs, out := c.make(t)
			path := filepath.Join(streamsDir, c.name+".jsonl")
			golden(t, path, encodeAll(t, evs))
			golden(t, replay.OutSibling(path), encodeAll(t, out))
			keys := c.keys
			if keys == "" {
				keys = "keys.yaml"
			}
			args := []string{"audit", "--file", path, "--keys", filepath.Join(streamsDir, keys)}
			if c.checkpointed {
				args = append(args, "--checkpoint", filepath.Join(streamsDir, "good.checkpoints.json"))
			}
			stdout, stderr, code := inProcess(t, args...)
			golden(t, filepath.Join(streamsDir, c.name+".audit.txt"), []byte(stdout))
			wantCode := 1
			if len(c.want) == 0 {
				wantCode = 0
			}
			if code != wantCode {
				t.Errorf("audit exited %d, want %d\n%s%s", code, wantCode, stdout, stderr)
			}
			for _, w := range c.want {
				if !strings.Contains(stdout, w) {
					t.Errorf("the report does not mention %q:\n%s", w, stdout)
				}
			}
			if wantCode == 0 && !strings.Contains(stdout, "every invariant holds") {
				t.Errorf("report:\n%s", stdout)
			}
		})
	}
}

// sourceSeq is the commit sequence of an out message's Toolbatch-Source.
func sourceSeq(src string) uint64 {
	s, _, _ := strings.Cut(src, "/")
	n, _ := strconv.ParseUint(s, 10, 64)
	return n
}
