package aggregate_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/toolbatch/toolbatch/aggregate"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/internal/datadriven"
	"github.com/toolbatch/toolbatch/protocol"
)

// TestScenarios runs the scripts in testdata/scenarios: the contract written
// as cases. See testdata/scenarios/README.md for the directives.
func TestScenarios(t *testing.T) {
	files, err := filepath.Glob("../testdata/scenarios/*.txt")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no scenario scripts found")
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) {
			h := newHarness(t, "r1")
			datadriven.RunFile(t, f, h.do)
		})
	}
}

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

type harness struct {
	t       *testing.T
	run     *aggregate.Run
	commits [][]byte   // the log, encoded as the engine appends it
	types   [][]string // the Toolbatch-Event header of each commit
	now     time.Time
	tools   map[string]events.Descriptor
	caps    map[string]events.Capability // live capabilities by tool
	state   map[string]events.RawJSON    // committed state
}

func newHarness(t *testing.T, runID string) *harness {
	return &harness{t: t, run: aggregate.New(runID), now: epoch,
		tools: map[string]events.Descriptor{}, caps: map[string]events.Capability{}, state: map[string]events.RawJSON{}}
}

func (h *harness) do(t *testing.T, c *datadriven.Case) string {
	out, err := h.dispatch(c)
	if err != nil {
		t.Fatalf("%s: %s: %v", c.Pos, c.Directive, err)
	}
	return out
}

// dispatch runs one directive. An error here is a broken script, not a
// refusal: refusals are printed as output.
func (h *harness) dispatch(c *datadriven.Case) (string, error) {
	switch c.Directive {
	case "run":
		id, _ := c.Get("id")
		*h = *newHarness(h.t, id)
		return "", nil
	case "catalog":
		return "", h.catalog(c)
	case "capability":
		for _, a := range c.Args {
			h.caps[a.Key] = events.Capability(a.Value)
		}
		return "", nil
	case "tick":
		d, err := time.ParseDuration(arg(c, "d", "0s"))
		if err != nil {
			return "", err
		}
		h.now = h.now.Add(d)
		return "now " + h.now.Format(time.RFC3339), nil
	case "submit":
		return h.submit(c)
	case "gate":
		return h.gate(c)
	case "park-client":
		return h.decide(aggregate.ParkClient{CallID: arg(c, "call", ""), CorrelationID: arg(c, "corr", ""), Deadline: h.after(c, "deadline"), At: h.now})
	case "claim":
		return h.decide(aggregate.Claim{CallID: arg(c, "call", ""), Attempt: argInt(c, "attempt", 1), WorkerID: arg(c, "worker", "w1"),
			Incarnation: arg(c, "process", ""), Token: arg(c, "token", "tok"), LeaseMS: 10000, At: h.now})
	case "complete":
		return h.complete(c)
	case "resume":
		return h.resume(c)
	case "perform":
		return h.decide(aggregate.Perform{CorrelationID: arg(c, "corr", ""), Principal: arg(c, "by", ""), Timer: c.Has("timer"),
			Capability: h.capOfTicket(), At: h.now})
	case "expire":
		return h.decide(aggregate.Expire{CorrelationID: arg(c, "corr", ""), At: h.now})
	case "delegation-await":
		return h.decide(aggregate.DelegationAwait{CallID: arg(c, "call", ""), Attempt: argInt(c, "attempt", 1),
			CorrelationID: arg(c, "corr", ""), Deadline: h.after(c, "deadline"), At: h.now})
	case "lease-expired":
		call := arg(c, "call", "")
		return h.decide(aggregate.LeaseExpired{CallID: call, Attempt: argInt(c, "attempt", 1), ClaimToken: arg(c, "token", "tok"),
			Capability: h.capOfCall(call), At: h.now})
	case "recover":
		return h.decide(aggregate.Recover{Capabilities: h.caps, At: h.now})
	case "recovery-plan":
		return h.recoveryPlan(), nil
	case "cancel":
		return h.decide(aggregate.End{Cause: events.EndCancelled, Reason: arg(c, "reason", ""), At: h.now})
	case "interrupt":
		return h.decide(aggregate.End{Cause: events.EndInterrupted, Reason: arg(c, "reason", ""), At: h.now})
	case "crash":
		return h.crash()
	case "state":
		return h.printState(), nil
	case "next":
		return aggregate.Next(h.run).String(), nil
	case "committed-state":
		return h.printCommitted(), nil
	default:
		return "", fmt.Errorf("unknown directive %q", c.Directive)
	}
}

func arg(c *datadriven.Case, key, def string) string {
	if v, ok := c.Get(key); ok {
		return v
	}
	return def
}

func argInt(c *datadriven.Case, key string, def int) int {
	v, ok := c.Get(key)
	if !ok {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		panic(fmt.Sprintf("%s: %s=%q is not a number", c.Pos, key, v))
	}
	return n
}

// after reads a duration argument as a time after now.
func (h *harness) after(c *datadriven.Case, key string) *time.Time {
	v, ok := c.Get(key)
	if !ok {
		return nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		panic(fmt.Sprintf("%s: %s=%q: %v", c.Pos, key, v, err))
	}
	t := h.now.Add(d)
	return &t
}

// catalog lines: <tool> [target=sandbox] [kind=client|delegation] [mode=M]
// [max=N] [parallel] [cap=C] (the live capability; default non_recoverable).
func (h *harness) catalog(c *datadriven.Case) error {
	for _, line := range c.Lines() {
		args, err := datadriven.ParseArgs(line)
		if err != nil {
			return err
		}
		id := args[0].Key
		d := events.Descriptor{Target: events.TargetBrain, Kind: events.KindTool}
		for _, a := range args[1:] {
			switch a.Key {
			case "target":
				d.Target = events.Target(a.Value)
			case "kind":
				d.Kind = events.ToolKind(a.Value)
			case "mode":
				d.Policy.Mode = events.Mode(a.Value)
			case "max":
				d.Policy.MaxAttempts, err = strconv.Atoi(a.Value)
			case "parallel":
				d.ParallelCompletion = true
			case "cap":
				h.caps[id] = events.Capability(a.Value)
			default:
				return fmt.Errorf("catalog: unknown attribute %q", a.Key)
			}
			if err != nil {
				return err
			}
		}
		h.tools[id] = d
	}
	return nil
}

func (h *harness) capOfCall(callID string) events.Capability {
	if b := h.run.Batch; b != nil {
		if c, _ := b.Call(callID); c != nil {
			return h.caps[c.ToolID]
		}
	}
	return ""
}

func (h *harness) capOfTicket() events.Capability {
	if t := h.run.Ticket(); t != nil {
		return h.caps[t.ToolID]
	}
	return ""
}

// submit: with json, the input is a JSON body decoded as the engine decodes
// it; otherwise each input line is <call_id> <tool_id> [arguments JSON].
func (h *harness) submit(c *datadriven.Case) (string, error) {
	var s *protocol.Submit
	if c.Has("json") {
		lim := events.DefaultLimits()
		if v, ok := c.Get("max-calls"); ok {
			lim.MaxCalls, _ = strconv.Atoi(v)
		}
		var err error
		s, err = protocol.DecodeSubmit([]byte(c.Input), true, lim)
		if err != nil {
			return h.reject(s, err)
		}
	} else {
		s = &protocol.Submit{RunID: arg(c, "run", h.run.RunID), ThreadID: arg(c, "thread", "t1"),
			Step: int64(argInt(c, "step", 1)), Narrowing: arg(c, "narrowing", ""),
			Assistant: events.Message{ID: "msg", Content: []events.ContentBlock{events.TextBlock("calling tools")}}}
		for _, line := range c.Lines() {
			f := strings.SplitN(line, " ", 3)
			if len(f) < 2 {
				return "", fmt.Errorf("submit: want <call_id> <tool_id> [args], got %q", line)
			}
			var in events.RawJSON
			if len(f) == 3 {
				var err error
				if in, err = events.CanonicalJSON([]byte(f[2])); err != nil {
					return "", err
				}
			}
			s.Assistant.Content = append(s.Assistant.Content, events.ContentBlock{Type: events.BlockToolUse, ID: f[0], Name: f[1], Input: in})
		}
		if err := s.Validate(events.DefaultLimits()); err != nil {
			return h.reject(s, err)
		}
	}
	calls := s.Calls()
	tools := make([]events.Descriptor, len(calls))
	for i, call := range calls {
		d, ok := h.tools[call.ToolID]
		if !ok {
			d = events.Descriptor{Kind: events.KindUnknown}
		}
		tools[i] = d
	}
	return h.decide(aggregate.Submit{Submission: s.Submission(), Tools: tools, SnapshotID: "snap1", At: h.now})
}

// reject decides the rejection of a submission refused before the
// aggregate could see it (it does not decode), as the engine does.
func (h *harness) reject(s *protocol.Submit, err error) (string, error) {
	var ref *events.Refusal
	if !errors.As(err, &ref) {
		return "", err
	}
	rej := aggregate.Reject{Refusal: ref, At: h.now}
	if s != nil {
		rej.Step, rej.HasStep = s.Step, true
	}
	return h.decide(rej)
}

// gate lines: <call_id> <outcome> [stage=] [rule=] [reason=] [corr=]
// [deadline=D] [due=D] [text=T] (set_result output).
func (h *harness) gate(c *datadriven.Case) (string, error) {
	var g aggregate.Gate
	g.At = h.now
	for _, line := range c.Lines() {
		args, err := datadriven.ParseArgs(line)
		if err != nil {
			return "", err
		}
		if len(args) < 2 {
			return "", fmt.Errorf("gate: want <call_id> <outcome>, got %q", line)
		}
		lc := &datadriven.Case{Pos: c.Pos, Args: args[2:]}
		d := aggregate.Decision{CallID: args[0].Key, Outcome: events.GateOutcome(args[1].Key),
			Stage: arg(lc, "stage", events.StagePolicy), Rule: arg(lc, "rule", ""), Reason: arg(lc, "reason", ""),
			CorrelationID: arg(lc, "corr", ""), Deadline: h.after(lc, "deadline"), Due: h.after(lc, "due"),
			Capability: h.capOfCall(args[0].Key)}
		if d.Outcome == events.GateAllow && !lc.Has("stage") {
			d.Stage = events.StageDefault
		}
		if text, ok := lc.Get("text"); ok {
			o := events.TextOutput("", text)
			d.Output = &o
		}
		g.Decisions = append(g.Decisions, d)
	}
	return h.decide(g)
}

// complete: text="..." for a success, error=<kind> msg="..." for an error;
// input lines are staged commands: set|remove <scope> <key> <merge> [JSON].
// With token=T it is a sandbox worker's result, which names its claim
// (aggregate.Result); without, the engine's own outcome (aggregate.Complete).
func (h *harness) complete(c *datadriven.Case) (string, error) {
	cp := aggregate.Complete{CallID: arg(c, "call", ""), Attempt: argInt(c, "attempt", 1), ClaimToken: arg(c, "token", ""), At: h.now}
	if kind, ok := c.Get("error"); ok {
		cp.Error = &events.ToolError{Kind: events.ErrorKind(kind), Message: arg(c, "msg", "")}
	} else {
		o := events.Output{}
		if text, ok := c.Get("text"); ok {
			o.Content = []events.ContentBlock{events.TextBlock(text)}
		}
		for _, line := range c.Lines() {
			f := strings.SplitN(line, " ", 5)
			if len(f) < 4 {
				return "", fmt.Errorf("complete: want <action> <scope> <key> <merge> [value], got %q", line)
			}
			cmd := events.Command{Action: events.Action(f[0]), Scope: events.Scope(f[1]), Key: f[2], Merge: events.Merge(f[3])}
			if len(f) == 5 {
				v, err := events.CanonicalJSON([]byte(f[4]))
				if err != nil {
					return "", err
				}
				cmd.Value = v
			}
			o.State = append(o.State, cmd)
		}
		cp.Output = &o
	}
	if c.Has("token") {
		// A worker's result names its claim: fenced by the aggregate.
		r := aggregate.Result{Complete: cp}
		if h.run.Batch != nil {
			r.BatchID = h.run.Batch.ID
		}
		return h.decide(r)
	}
	return h.decide(cp)
}

// resume corr=K [run=] [thread=] [call=] [snapshot=] [by=P] then one of:
// allow [note=], deny [reason=], result [for=CALL] [text=] [error], input text=.
func (h *harness) resume(c *datadriven.Case) (string, error) {
	threadID := h.run.ThreadID
	m := &protocol.Resume{CorrelationID: arg(c, "corr", ""), RunID: arg(c, "run", h.run.RunID), ThreadID: arg(c, "thread", threadID),
		CallID: arg(c, "call", ""), SnapshotID: arg(c, "snapshot", "")}
	switch {
	case c.Has("allow"):
		m.Result = events.ResumeResult{Kind: events.ResultPermission, Allow: true, Note: arg(c, "note", "")}
	case c.Has("deny"):
		m.Result = events.ResumeResult{Kind: events.ResultPermission, Reason: arg(c, "reason", "")}
	case c.Has("result"):
		o := events.Output{CallID: arg(c, "for", ""), IsError: c.Has("error")}
		if text, ok := c.Get("text"); ok {
			o.Content = []events.ContentBlock{events.TextBlock(text)}
		}
		m.Result = events.ResumeResult{Kind: events.ResultToolResult, Output: &o}
	case c.Has("input"):
		m.Result = events.ResumeResult{Kind: events.ResultInput, Text: arg(c, "text", "")}
	default:
		return "", fmt.Errorf("resume: want allow, deny, result or input")
	}
	return h.decide(aggregate.Resume{Answer: m.Answer(), Principal: arg(c, "by", ""), Capability: h.capOfTicket(), At: h.now})
}

// decide runs a command and commits its events, or prints its refusal.
func (h *harness) decide(cmd aggregate.Command) (string, error) {
	_, evs, err := aggregate.Decide(h.run, cmd)
	return h.commit(evs, err)
}

// commit appends the events as one encoded commit, folds the decoded copy
// into the live state (as a restarted engine would read it), and prints
// them. A command error is printed: refusals by code, illegal transitions by
// their message.
func (h *harness) commit(evs []events.Event, err error) (string, error) {
	if err != nil {
		if code, ok := events.CodeOf(err); ok {
			var ref *events.Refusal
			errors.As(err, &ref)
			return fmt.Sprintf("refused %s: %s", code, ref.Reason), nil
		}
		return "error: " + err.Error(), nil
	}
	if len(evs) == 0 {
		return "no events", nil
	}
	body, types, err := events.EncodeCommit(evs)
	if err != nil {
		return "", err
	}
	decoded, err := events.DecodeCommit(body, types)
	if err != nil {
		return "", err
	}
	before := h.run.Clone()
	if err := h.run.ApplyAll(decoded); err != nil {
		return "", fmt.Errorf("a decided event does not apply: %w", err)
	}
	if reflect.DeepEqual(before, h.run) {
		return "", fmt.Errorf("a commit changed nothing")
	}
	h.commits = append(h.commits, body)
	h.types = append(h.types, types)
	var lines []string
	for _, e := range decoded {
		lines = append(lines, events.Describe(e))
		if f, ok := e.(*events.BatchFinalized); ok && f.Conflict == "" {
			if h.state, err = aggregate.MergeState(h.state, h.run.RunID, h.run.ThreadID, f.State); err != nil {
				return "", err
			}
		}
	}
	// What the commit asks of the outside world once it is durable.
	for _, c := range aggregate.ChildrenToCancel(h.run, decoded) {
		lines = append(lines, fmt.Sprintf("-> cancel child %s attempt %d (%s)", c.OperationID, c.Attempt, c.ToolID))
	}
	return strings.Join(lines, "\n"), nil
}

// crash drops the live state and folds the log again from zero, as a
// restarted engine does; the result must equal the state before the crash,
// and so must a snapshot taken halfway plus the tail.
func (h *harness) crash() (string, error) {
	fresh := aggregate.New(h.run.RunID)
	var all []events.Event
	for i, body := range h.commits {
		evs, err := events.DecodeCommit(body, h.types[i])
		if err != nil {
			return "", err
		}
		all = append(all, evs...)
	}
	if err := fresh.ApplyAll(all); err != nil {
		return "", err
	}
	if !reflect.DeepEqual(fresh, h.run) {
		return "", fmt.Errorf("state folded from the log differs from the live state:\n%+v\n%+v", fresh, h.run)
	}
	half := aggregate.New(h.run.RunID)
	if err := half.ApplyAll(all[:len(all)/2]); err != nil {
		return "", err
	}
	snap, err := half.Snapshot()
	if err != nil {
		return "", err
	}
	restored, err := aggregate.Restore(snap)
	if err != nil {
		return "", err
	}
	if err := restored.ApplyAll(all[len(all)/2:]); err != nil {
		return "", err
	}
	if !reflect.DeepEqual(restored, h.run) {
		return "", fmt.Errorf("snapshot plus tail differs from the live state")
	}
	h.run = fresh
	return fmt.Sprintf("restarted: folded %d events from %d commits; next: %s", len(all), len(h.commits), aggregate.Next(h.run)), nil
}

func (h *harness) recoveryPlan() string {
	b := h.run.OpenBatch()
	if b == nil {
		return "no open batch"
	}
	var lines []string
	for _, c := range b.Calls {
		lines = append(lines, fmt.Sprintf("%s: %s", c.CallID, aggregate.RecoveryAction(h.run, c.CallID, h.caps[c.ToolID])))
	}
	return strings.Join(lines, "\n")
}

func (h *harness) printState() string {
	r := h.run
	var lines []string
	head := fmt.Sprintf("run %s status=%s", r.RunID, r.Status())
	if r.HasStep {
		head += fmt.Sprintf(" last_step=%d", r.LastStep)
	}
	if r.End != nil {
		head += " cause=" + string(r.End.Cause)
	}
	lines = append(lines, head)
	if b := r.Batch; b != nil {
		bl := fmt.Sprintf("batch %s", b.ID)
		if b.Finalized {
			bl += " finalized"
		} else {
			bl += " open"
		}
		if b.Parallel {
			bl += " parallel"
		}
		if t := b.Ticket; t != nil {
			bl += fmt.Sprintf(" ticket=%s(%s %s)", t.CorrelationID, t.Reason, t.CallID)
		}
		lines = append(lines, bl)
		for _, c := range b.Calls {
			cl := fmt.Sprintf("  %s %s %s attempt=%d", c.CallID, c.ToolID, c.Phase, c.Attempt)
			if c.Entries > 0 {
				cl += fmt.Sprintf(" entries=%d", c.Entries)
			}
			if c.Claim != nil {
				cl += " claim=" + c.Claim.WorkerID + "/" + c.Claim.Token
			}
			switch c.Phase {
			case events.PhaseCompleted:
				cl += " " + events.DescribeOutput(*c.Output)
			case events.PhaseIndeterminate:
				cl += fmt.Sprintf(" %q", c.Reason)
			}
			lines = append(lines, cl)
		}
	}
	return strings.Join(lines, "\n")
}

func (h *harness) printCommitted() string {
	if len(h.state) == 0 {
		return "empty"
	}
	keys := make([]string, 0, len(h.state))
	for k := range h.state {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var lines []string
	for _, k := range keys {
		lines = append(lines, k+" = "+string(h.state[k]))
	}
	return strings.Join(lines, "\n")
}
