package aggregate_test

import (
	"flag"
	"fmt"
	"maps"
	"math/rand"
	"reflect"
	"testing"
	"time"

	"github.com/toolbatch/toolbatch/aggregate"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/projector"
	"github.com/toolbatch/toolbatch/protocol"
)

var (
	propSeed  = flag.Int64("seed", 0, "run the property test with this seed only")
	propRuns  = flag.Int("prop-runs", 300, "random command sequences per property test")
	propSteps = flag.Int("prop-steps", 120, "commands per sequence")
)

// propTools is a catalog with every kind, target and mode.
var propTools = map[string]events.Descriptor{
	"nr":     {Target: events.TargetBrain, Kind: events.KindTool, Policy: events.Policy{Mode: events.ModeNeverReplay, MaxAttempts: 2}},
	"rs":     {Target: events.TargetBrain, Kind: events.KindTool, Policy: events.Policy{Mode: events.ModeReplaySafe, MaxAttempts: 3}},
	"sb_id":  {Target: events.TargetSandbox, Kind: events.KindTool, Policy: events.Policy{Mode: events.ModeIdempotent, MaxAttempts: 3}},
	"sb_nr":  {Target: events.TargetSandbox, Kind: events.KindTool, Policy: events.Policy{Mode: events.ModeNeverReplay, MaxAttempts: 1}},
	"client": {Target: events.TargetBrain, Kind: events.KindClient},
	"del":    {Target: events.TargetBrain, Kind: events.KindDelegation, ParallelCompletion: true},
	"del1":   {Target: events.TargetBrain, Kind: events.KindDelegation},
}

var propToolIDs = []string{"nr", "rs", "sb_id", "sb_nr", "client", "del", "del1", "ghost"}

// TestProperties drives the aggregate with seeded random command sequences
// (legal ones, and illegal ones mixed in) and checks after every step that
// every invariant of contract.md §6 the state can show holds, that a
// refused command changed nothing, that folding from zero and from a
// snapshot plus the tail give the live state, and that the projection
// follows contract.md §5. A failure prints its seed; rerun it with
// go test ./aggregate -run TestProperties -seed N.
func TestProperties(t *testing.T) {
	seeds := make([]int64, 0, *propRuns)
	if *propSeed != 0 {
		seeds = append(seeds, *propSeed)
	} else {
		for i := 0; i < *propRuns; i++ {
			seeds = append(seeds, int64(i+1))
		}
	}
	for _, seed := range seeds {
		if err := propRun(seed, *propSteps); err != nil {
			t.Fatalf("seed %d: %v\nreproduce: go test ./aggregate -run TestProperties -seed %d", seed, err, seed)
		}
	}
}

type prop struct {
	rng     *rand.Rand
	run     *aggregate.Run
	log     []events.Event
	now     time.Time
	caps    map[string]events.Capability
	corr    int
	step    int64
	tokens  int
	entries map[string]int // never_replay entries by batch/call
}

func propRun(seed int64, steps int) error {
	p := &prop{rng: rand.New(rand.NewSource(seed)), run: aggregate.New("r1"), now: epoch,
		caps: map[string]events.Capability{}, entries: map[string]int{}}
	for i := 0; i < steps; i++ {
		p.now = p.now.Add(time.Duration(p.rng.Intn(120)) * time.Second)
		if p.rng.Intn(8) == 0 { // capabilities drift
			id := propToolIDs[p.rng.Intn(len(propToolIDs))]
			p.caps[id] = events.Capabilities[p.rng.Intn(len(events.Capabilities))]
		}
		cmd := p.pick()
		if cmd == nil {
			break
		}
		// a copy of the maps too: Clone shares them, and a Decide that
		// wrote one in place would change both
		before := p.run.Clone()
		before.Digests, before.Correlations = maps.Clone(p.run.Digests), maps.Clone(p.run.Correlations)
		_, evs, err := aggregate.Decide(p.run, cmd)
		if !reflect.DeepEqual(before, p.run) {
			return fmt.Errorf("step %d: Decide(%T) changed the state", i, cmd)
		}
		if err != nil || len(evs) == 0 {
			continue // refusals, illegal and already-done commands are part of the mix
		}
		if err := p.commit(evs); err != nil {
			return fmt.Errorf("step %d (%T): %v", i, cmd, err)
		}
		if err := p.check(before, evs); err != nil {
			return fmt.Errorf("step %d (%T): %v", i, cmd, err)
		}
	}
	return p.checkFolds()
}

func (p *prop) commit(evs []events.Event) error {
	body, types, err := events.EncodeCommit(evs)
	if err != nil {
		return err
	}
	decoded, err := events.DecodeCommit(body, types)
	if err != nil {
		return err
	}
	if err := p.run.ApplyAll(decoded); err != nil {
		return fmt.Errorf("decided events do not apply: %w", err)
	}
	p.log = append(p.log, decoded...)
	return nil
}

func (p *prop) newCorr() string {
	p.corr++
	return fmt.Sprintf("k%d", p.corr)
}

func (p *prop) cap(tool string) events.Capability {
	if c, ok := p.caps[tool]; ok {
		return c
	}
	switch tool {
	case "rs":
		return events.CapReplaySafe
	case "sb_id":
		return events.CapIdempotent
	case "del", "del1":
		return events.CapDurableRequest
	}
	return events.CapNonRecoverable
}

// pick returns the next command: mostly what Next asks for, sometimes
// something else (stale, mismatched or out of turn).
func (p *prop) pick() aggregate.Command {
	r := p.run
	if p.rng.Intn(25) == 0 {
		return aggregate.End{Cause: []events.EndCause{events.EndCancelled, events.EndInterrupted}[p.rng.Intn(2)], At: p.now}
	}
	if p.rng.Intn(10) == 0 {
		return p.noise()
	}
	w := aggregate.Next(r)
	b := r.OpenBatch()
	switch w.Kind {
	case aggregate.NextNone:
		if r.End != nil && p.rng.Intn(3) == 0 {
			return nil
		}
		return p.submit()
	case aggregate.NextGate:
		g := aggregate.Gate{At: p.now}
		allAllow := p.rng.Intn(2) == 0
		for _, id := range w.CallIDs {
			c, _ := b.Call(id)
			d := aggregate.Decision{CallID: id, Outcome: events.GateAllow, Stage: events.StageDefault, Capability: p.cap(c.ToolID)}
			if !allAllow {
				switch p.rng.Intn(5) {
				case 1:
					d.Outcome, d.Reason = events.GateBlock, "no"
				case 2:
					o := events.TextOutput("", "set")
					d.Outcome, d.Output = events.GateSetResult, &o
				case 3:
					dl := p.now.Add(time.Duration(p.rng.Intn(600)) * time.Second)
					d.Outcome, d.CorrelationID, d.Deadline = events.GateRequireConfirmation, p.newCorr(), &dl
				case 4:
					due := p.now.Add(time.Duration(p.rng.Intn(600)) * time.Second)
					d.Outcome, d.CorrelationID, d.Due = events.GateSchedule, p.newCorr(), &due
				}
			}
			g.Decisions = append(g.Decisions, d)
		}
		return g
	case aggregate.NextParkClient:
		var dl *time.Time
		if p.rng.Intn(2) == 0 {
			t := p.now.Add(time.Duration(p.rng.Intn(600)) * time.Second)
			dl = &t
		}
		return aggregate.ParkClient{CallID: w.CallIDs[0], CorrelationID: p.newCorr(), Deadline: dl, At: p.now}
	case aggregate.NextExecuting:
		c, _ := b.Call(w.CallIDs[p.rng.Intn(len(w.CallIDs))])
		return p.executing(c)
	case aggregate.NextAwaiting:
		return p.awaiting(w.Ticket)
	}
	return p.noise()
}

func (p *prop) submit() aggregate.Command {
	p.step += int64(1 + p.rng.Intn(2))
	if p.rng.Intn(6) == 0 {
		p.step -= 2 // sometimes not after the last step
	}
	s := &protocol.Submit{RunID: "r1", ThreadID: "t1", Step: p.step, Assistant: events.Message{ID: "m"}}
	n := p.rng.Intn(5)
	parallel := p.rng.Intn(4) == 0
	var tools []events.Descriptor
	for i := 0; i < n; i++ {
		id := propToolIDs[p.rng.Intn(len(propToolIDs))]
		if parallel {
			id = "del"
		}
		s.Assistant.Content = append(s.Assistant.Content, events.ContentBlock{Type: events.BlockToolUse,
			ID: fmt.Sprintf("c%d", i+1), Name: id})
		d, ok := propTools[id]
		if !ok {
			d = events.Descriptor{Kind: events.KindUnknown}
		}
		tools = append(tools, d)
	}
	return aggregate.Submit{Submission: s.Submission(), Tools: tools, SnapshotID: "snap", At: p.now}
}

func (p *prop) executing(c *aggregate.Call) aggregate.Command {
	tok := ""
	if c.Claim != nil {
		tok = c.Claim.Token
	}
	if c.Tool.Target == events.TargetSandbox && c.Claim == nil {
		switch p.rng.Intn(4) {
		case 0:
			return aggregate.Complete{CallID: c.CallID, Attempt: c.Attempt, Error: &events.ToolError{Kind: events.ErrorUnavailableBeforeDispatch}, At: p.now}
		case 1:
			return aggregate.Recover{Capabilities: p.capsByTool(), At: p.now}
		default:
			p.tokens++
			return aggregate.Claim{CallID: c.CallID, Attempt: c.Attempt, WorkerID: "w", Token: fmt.Sprintf("t%d", p.tokens), LeaseMS: 1000, At: p.now}
		}
	}
	switch p.rng.Intn(7) {
	case 0:
		return aggregate.Complete{CallID: c.CallID, Attempt: c.Attempt, ClaimToken: tok,
			Error: &events.ToolError{Kind: events.ErrorExecution, Message: "boom"}, At: p.now}
	case 1:
		return aggregate.Complete{CallID: c.CallID, Attempt: c.Attempt, ClaimToken: tok,
			Error: &events.ToolError{Kind: events.ErrorUnavailableBeforeDispatch}, At: p.now}
	case 2:
		return aggregate.LeaseExpired{CallID: c.CallID, Attempt: c.Attempt, ClaimToken: tok, Capability: p.cap(c.ToolID), At: p.now}
	case 3:
		return aggregate.Recover{Capabilities: p.capsByTool(), At: p.now}
	case 4:
		if c.Tool.Kind == events.KindDelegation {
			return aggregate.DelegationAwait{CallID: c.CallID, Attempt: c.Attempt, CorrelationID: p.newCorr(), At: p.now}
		}
	}
	o := events.Output{Content: []events.ContentBlock{events.TextBlock("ok")}}
	if p.rng.Intn(3) == 0 {
		merge := []events.Merge{events.MergeDisjoint, events.MergeCommutative, events.MergeExclusive}[p.rng.Intn(3)]
		o.State = []events.Command{{Scope: events.ScopeRun, Key: fmt.Sprintf("k%d", p.rng.Intn(2)), Merge: merge, Action: events.ActionSet, Value: events.RawJSON(`{"a":1}`)}}
	}
	return aggregate.Complete{CallID: c.CallID, Attempt: c.Attempt, ClaimToken: tok, Output: &o, At: p.now}
}

func (p *prop) capsByTool() map[string]events.Capability {
	m := map[string]events.Capability{}
	for _, id := range propToolIDs {
		m[id] = p.cap(id)
	}
	return m
}

func (p *prop) awaiting(t *events.Ticket) aggregate.Command {
	res := &protocol.Resume{CorrelationID: t.CorrelationID, RunID: t.RunID, ThreadID: t.ThreadID}
	switch p.rng.Intn(6) {
	case 0:
		return aggregate.Expire{CorrelationID: t.CorrelationID, At: p.now}
	case 1:
		return aggregate.Perform{CorrelationID: t.CorrelationID, Timer: p.rng.Intn(2) == 0, Capability: p.cap(t.ToolID), At: p.now}
	}
	switch t.Reason {
	case events.WaitExternalResult:
		o := events.TextOutput(t.CallID, "client")
		res.Result = events.ResumeResult{Kind: events.ResultToolResult, Output: &o}
	case events.WaitDelegation:
		res.Result = events.ResumeResult{Kind: events.ResultInput, Text: "more"}
	default:
		res.Result = events.ResumeResult{Kind: events.ResultPermission, Allow: p.rng.Intn(3) > 0}
	}
	return aggregate.Resume{Answer: res.Answer(), Principal: "alice", Capability: p.cap(t.ToolID), At: p.now}
}

// noise is a command that is usually out of turn: a stale or forged result,
// a claim of an old attempt, a resume of a resolved ticket.
func (p *prop) noise() aggregate.Command {
	callID := fmt.Sprintf("c%d", 1+p.rng.Intn(4))
	attempt := p.rng.Intn(4)
	switch p.rng.Intn(5) {
	case 0:
		o := events.TextOutput("", "forged")
		return aggregate.Complete{CallID: callID, Attempt: attempt, ClaimToken: "forged", Output: &o, At: p.now}
	case 1:
		return aggregate.Claim{CallID: callID, Attempt: attempt, WorkerID: "w9", Token: "dup", At: p.now}
	case 2:
		res := &protocol.Resume{CorrelationID: fmt.Sprintf("k%d", 1+p.rng.Intn(p.corr+1)), RunID: "r1", ThreadID: "t1",
			Result: events.ResumeResult{Kind: events.ResultPermission, Allow: true}}
		return aggregate.Resume{Answer: res.Answer(), At: p.now}
	case 3:
		return aggregate.Perform{CorrelationID: fmt.Sprintf("k%d", 1+p.rng.Intn(p.corr+1)), At: p.now}
	default:
		return aggregate.LeaseExpired{CallID: callID, Attempt: attempt, ClaimToken: "x", At: p.now}
	}
}

// check verifies the invariants of contract.md §6 that the state and the
// new events can show.
func (p *prop) check(before *aggregate.Run, evs []events.Event) error {
	r := p.run
	// 4. Terminal calls never reopen; a finalized batch never changes.
	if ob := before.Batch; ob != nil && r.Batch != nil && ob.ID == r.Batch.ID {
		for i, oc := range ob.Calls {
			nc := r.Batch.Calls[i]
			if oc.Phase.Terminal() && (nc.Phase != oc.Phase || !reflect.DeepEqual(nc.Output, oc.Output)) {
				return fmt.Errorf("invariant 4: terminal call %s reopened (%s -> %s)", oc.CallID, oc.Phase, nc.Phase)
			}
		}
		if ob.Finalized && !reflect.DeepEqual(ob, r.Batch) {
			return fmt.Errorf("invariant 4: finalized batch %s changed", ob.ID)
		}
	}
	for _, e := range evs {
		if x, ok := e.(*events.CallExecuting); ok && x.Cause == events.CauseRecovered {
			c, _ := r.Batch.Call(x.CallID)
			// 7. Replay only when the pinned mode equals the live capability,
			// within max_attempts.
			if string(c.Tool.Policy.Mode) != string(x.Capability) || x.Attempt > c.Tool.Policy.MaxAttempts {
				return fmt.Errorf("invariant 7: %s replayed with mode %s, capability %s, attempt %d of %d",
					x.CallID, c.Tool.Policy.Mode, x.Capability, x.Attempt, c.Tool.Policy.MaxAttempts)
			}
		}
	}
	b := r.Batch
	if b == nil {
		return nil
	}
	awaiting := 0
	for _, c := range b.Calls {
		// 1. No executor entry without executing committed for that attempt.
		if c.Entries > c.Attempt {
			return fmt.Errorf("invariant 1: call %s has %d entries for %d attempts", c.CallID, c.Entries, c.Attempt)
		}
		// 3. A blocked or denied call, or one awaiting approval, never ran.
		if c.Phase == events.PhaseAwaiting && b.Ticket != nil && b.Ticket.Reason == events.WaitPermission && c.Entries != 0 {
			return fmt.Errorf("invariant 3: call %s awaiting approval has %d entries", c.CallID, c.Entries)
		}
		if c.Output != nil && c.Attempt == 0 && c.Entries != 0 {
			return fmt.Errorf("invariant 3: call %s completed without executing but has entries", c.CallID)
		}
		// 6. A never_replay call is entered at most once.
		if c.Tool.Policy.Mode == events.ModeNeverReplay && c.Entries > 1 {
			return fmt.Errorf("invariant 6: never_replay call %s entered %d times", c.CallID, c.Entries)
		}
		if c.Phase == events.PhaseAwaiting {
			awaiting++
		}
	}
	// 5. At most one awaiting call per batch, and it is the ticket's.
	if awaiting > 1 || (awaiting == 1) != (b.Ticket != nil) {
		return fmt.Errorf("invariant 5: %d awaiting calls, ticket %v", awaiting, b.Ticket != nil)
	}
	// 2. Nothing is published before every call is terminal; then one
	// result per tool_use, in model order.
	if !b.Finalized && b.Results != nil {
		return fmt.Errorf("invariant 2: results of open batch %s", b.ID)
	}
	if b.Finalized {
		if !b.AllTerminal() || len(b.Results) != len(b.Calls) {
			return fmt.Errorf("invariant 2: batch %s finalized with %d results for %d calls", b.ID, len(b.Results), len(b.Calls))
		}
		for i, c := range b.Calls {
			if b.Results[i].ToolUseID != c.CallID {
				return fmt.Errorf("invariant 2: result %d is for %s, want %s", i, b.Results[i].ToolUseID, c.CallID)
			}
		}
	}
	// contract.md §5: dispositions come from the committed ticket.
	for _, d := range projector.Dispositions(r) {
		want := events.DispositionExecuted
		if t := b.Ticket; t != nil && !b.Finalized && t.CallID == d.CallID {
			switch t.Reason {
			case events.WaitPermission:
				want = events.DispositionPendingBuiltin
			case events.WaitExternalResult:
				want = events.DispositionPendingClient
			}
		}
		if d.Disposition != want {
			return fmt.Errorf("§5: call %s disposition %s, want %s", d.CallID, d.Disposition, want)
		}
	}
	return nil
}

// checkFolds verifies that folding the log from zero, and from a snapshot
// at every point plus the tail, gives the live state.
func (p *prop) checkFolds() error {
	fresh := aggregate.New("r1")
	if err := fresh.ApplyAll(p.log); err != nil {
		return fmt.Errorf("fold from zero: %w", err)
	}
	if !reflect.DeepEqual(fresh, p.run) {
		return fmt.Errorf("fold from zero differs from the live state")
	}
	for cut := 0; cut <= len(p.log); cut += 1 + len(p.log)/7 {
		head := aggregate.New("r1")
		if err := head.ApplyAll(p.log[:cut]); err != nil {
			return err
		}
		snap, err := head.Snapshot()
		if err != nil {
			return err
		}
		restored, err := aggregate.Restore(snap)
		if err != nil {
			return err
		}
		if err := restored.ApplyAll(p.log[cut:]); err != nil {
			return fmt.Errorf("snapshot at %d plus tail: %w", cut, err)
		}
		if !reflect.DeepEqual(restored, p.run) {
			return fmt.Errorf("snapshot at %d plus tail differs from the live state", cut)
		}
	}
	return nil
}
