package audit

import (
	"bytes"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/toolbatch/toolbatch/aggregate"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/projector"
	"github.com/toolbatch/toolbatch/proof"
	"github.com/toolbatch/toolbatch/protocol"
)

// Record is one message of a stream.
type Record struct {
	Seq     uint64
	Subject string
	Time    time.Time
	Headers map[string][]string
	Data    []byte
}

// Violation is one invariant that does not hold, where it was seen.
type Violation struct {
	Run, Batch, Call string
	Seq              uint64
	Invariant        string
	Detail           string
}

// String is the violation on one line.
func (v Violation) String() string {
	where := "seq " + strconv.FormatUint(v.Seq, 10)
	if v.Run != "" {
		where += " run " + v.Run
	}
	if v.Batch != "" {
		where += " batch " + v.Batch
	}
	if v.Call != "" {
		where += " call " + v.Call
	}
	return where + ": " + v.Invariant + ": " + v.Detail
}

// Invariants, named as contract.md §6 numbers them, plus the log's own.
const (
	InvEntry       = "invariant 1 (no executor entry before executing is committed)"
	InvBarrier     = "invariant 2 (nothing published before the barrier; one result per tool_use, in model order)"
	InvNeverRan    = "invariant 3 (an awaiting, denied or blocked call never runs)"
	InvTerminal    = "invariant 4 (terminal calls never reopen; a finalized batch never changes)"
	InvOneTicket   = "invariant 5 (one awaiting call per batch, one ticket per run)"
	InvNeverReplay = "invariant 6 (a never_replay call is entered at most once)"
	InvReplay      = "invariant 7 (replay only when the pinned mode equals the live capability, within max_attempts)"
	InvProjection  = "invariant 8 (the projection derived from the events equals what was published)"
	InvSigned      = "invariant 9 (only engines write the log: each commit signed by a pinned engine key and chained to its run's previous commit)"
	InvLog         = "log (every commit of a run, in order, decodable)"
)

// Headers the engine writes.
const (
	headerEvent  = protocol.HeaderEvent
	headerPrev   = protocol.HeaderPrev
	headerSource = protocol.HeaderSource
	// throttledSource is the source engines before protocol.OutThrottled
	// gave the throttle refusals they published on a run's rejected
	// subject.
	throttledSource = "0/0"
)

// Auditor folds a stream and collects violations.
type Auditor struct {
	prefix     string
	runs       map[string]*runAudit
	order      []string
	out        []Record
	sawOut     bool
	violations []Violation
	reported   map[string]bool
	keys       *proof.Keyring // nil: signatures are not verified
	proofs     Proofs
	head       proof.Head         // over every events message read
	cps        []proof.Checkpoint // to compare the head with, by sequence
	nextCP     int                // the first checkpoint not compared yet
}

// Proofs counts what the audit saw of the log's signatures.
type Proofs struct {
	Signed   int  // commits with a signature
	Unsigned int  // commits without one before the first signed commit (written before signing)
	Verified bool // the signatures were checked against pinned keys
	// Checkpoints is how many checkpoints the stream was compared with.
	Checkpoints int
}

type runAudit struct {
	id      string
	run     *aggregate.Run
	model   projector.Model
	lastSeq uint64
	last    proof.Hash        // the hash of the run's last commit read
	broken  bool              // folding stopped at an illegal transition
	derived map[string][]byte // "<subject> <source>" -> body the projector derives
}

// New returns an auditor for the streams of a subject prefix.
func New(prefix string) *Auditor {
	if prefix == "" {
		prefix = protocol.DefaultPrefix
	}
	return &Auditor{prefix: prefix, runs: map[string]*runAudit{}, reported: map[string]bool{}}
}

// Keys makes the auditor verify every signature against keys (the pinned
// keyring); without it, only the runs' hash chains are checked.
func (a *Auditor) Keys(keys *proof.Keyring) { a.keys, a.proofs.Verified = keys, keys != nil }

// Checkpoints makes the auditor compare the head of the events stream
// with each checkpoint at its sequence (and, with pinned keys, verify its
// signature). The audit must then read the whole events stream.
func (a *Auditor) Checkpoints(cps []proof.Checkpoint) {
	a.cps = append([]proof.Checkpoint(nil), cps...)
	sort.SliceStable(a.cps, func(i, j int) bool { return a.cps[i].Seq < a.cps[j].Seq })
	a.proofs.Checkpoints = len(a.cps)
}

// compareCheckpoints compares the head with every checkpoint before seq
// (the next message's sequence; ^0 at the end of the log).
func (a *Auditor) compareCheckpoints(seq uint64) {
	for ; a.nextCP < len(a.cps) && a.cps[a.nextCP].Seq < seq; a.nextCP++ {
		cp := a.cps[a.nextCP]
		v := Violation{Seq: cp.Seq, Invariant: InvSigned}
		at := fmt.Sprintf("checkpoint at seq %d (%s, signed by %s)", cp.Seq, cp.At.UTC().Format(time.RFC3339), cp.Signer)
		if a.keys != nil {
			if err := a.keys.VerifyCheckpoint(cp); err != nil {
				v.Detail = at + ": " + strings.TrimPrefix(err.Error(), "proof: ")
				a.add(v)
				continue
			}
		}
		switch {
		case a.head.Seq != cp.Seq && seq == ^uint64(0):
			v.Detail = fmt.Sprintf("%s: the log ends at seq %d, before the checkpoint: commits after it are missing", at, a.head.Seq)
		case a.head.Seq != cp.Seq:
			v.Detail = fmt.Sprintf("%s: the log has no message at the checkpoint's sequence (it goes from %d to %d): a commit is missing", at, a.head.Seq, seq)
		case a.head.Hash.String() != cp.Head || a.head.Commits != cp.Commits:
			v.Detail = fmt.Sprintf("%s: the log up to it differs from what was checkpointed (%d messages, head %s; the checkpoint: %d, %s): a commit was dropped, inserted, moved or altered at or before it",
				at, a.head.Commits, a.head.Hash.String()[:16], cp.Commits, cp.Head[:min(16, len(cp.Head))])
		default:
			continue
		}
		a.add(v)
	}
}

// Proofs reports what the audit saw of the log's signatures.
func (a *Auditor) Proofs() Proofs { return a.proofs }

// Runs returns the folded runs, by id.
func (a *Auditor) Runs() map[string]*aggregate.Run {
	out := make(map[string]*aggregate.Run, len(a.runs))
	for id, ra := range a.runs {
		out[id] = ra.run
	}
	return out
}

// add records a violation once per run, batch, call and invariant: a
// state that breaks an invariant is reported where it first appears.
func (a *Auditor) add(v Violation) {
	key := v.Run + "|" + v.Batch + "|" + v.Call + "|" + v.Invariant
	if v.Invariant == InvLog || v.Invariant == InvProjection || v.Invariant == InvBarrier || v.Invariant == InvSigned {
		key += "|" + v.Detail
	}
	if a.reported[key] {
		return
	}
	a.reported[key] = true
	a.violations = append(a.violations, v)
}

// Event folds one message of the events stream; messages must come in
// stream order.
func (a *Auditor) Event(r Record) {
	evs, err := events.DecodeCommit(r.Data, r.Headers[headerEvent])
	a.EventDecoded(r, evs, err)
}

// EventDecoded is Event for a message whose commit the caller has decoded
// already: evs and decodeErr are what events.DecodeCommit returned for its body
// and Toolbatch-Event header. A reader can so decode commits on every core
// while the audit folds them in stream order.
func (a *Auditor) EventDecoded(r Record, evs []events.Event, decodeErr error) {
	commit, seal, proofErr := proof.Read(proof.Message{Subject: r.Subject, Header: r.Headers, Body: r.Data})
	hash := commit.Hash()
	if len(a.cps) > 0 {
		a.compareCheckpoints(r.Seq)
		a.head.Add(r.Seq, hash, first(r.Headers[protocol.HeaderSig]), first(r.Headers[protocol.HeaderSigProof]))
	}
	runID, ok := protocol.Names{Prefix: a.prefix}.RunOf(protocol.EventsFamily, r.Subject)
	if !ok || !events.ValidRunID(runID) {
		a.add(Violation{Seq: r.Seq, Invariant: InvLog, Detail: fmt.Sprintf("subject %q is not a run's events subject", r.Subject)})
		return
	}
	ra := a.runs[runID]
	if ra == nil {
		ra = &runAudit{id: runID, run: aggregate.New(runID), model: projector.NewModel(runID), derived: map[string][]byte{}}
		a.runs[runID] = ra
		a.order = append(a.order, runID)
	}
	if ra.broken {
		return
	}
	v := Violation{Run: runID, Seq: r.Seq}
	prev, err := strconv.ParseUint(first(r.Headers[headerPrev]), 10, 64)
	switch {
	case err != nil:
		v.Invariant, v.Detail = InvLog, "the commit has no valid "+headerPrev+" header"
		a.add(v)
	case prev != ra.lastSeq:
		v.Invariant = InvLog
		if prev >= r.Seq {
			v.Detail = fmt.Sprintf("commit out of order: it names %d as the run's previous commit, which is not stored before it", prev)
		} else if prev > ra.lastSeq {
			v.Detail = fmt.Sprintf("a commit is missing: this one follows %d, the run's last commit seen is %d", prev, ra.lastSeq)
		} else {
			v.Detail = fmt.Sprintf("commit out of order: it follows %d, the run's last commit seen is %d", prev, ra.lastSeq)
		}
		a.add(v)
	}
	ra.lastSeq = r.Seq
	a.checkProof(ra, r.Seq, commit, seal, proofErr, hash)
	if decodeErr != nil {
		v.Invariant, v.Detail = InvLog, "undecodable commit: "+decodeErr.Error()
		a.add(v)
		ra.broken = true
		return
	}
	var outs []projector.Output
	for _, e := range evs {
		a.check(ra, r.Seq, e)
		if err := ra.run.Apply(e); err != nil {
			a.add(transition(ra, r.Seq, e, err))
			ra.broken = true
			return
		}
		a.after(ra, r.Seq, e)
		var o []projector.Output
		if ra.model, o, err = projector.Project(ra.model, e); err == nil {
			outs = append(outs, o...)
		}
	}
	// Numbered across the commit, as the engine's projector numbers them.
	for i, o := range outs {
		if body, err := o.Encode(); err == nil {
			ra.derived[fmt.Sprintf("%s.out.%s.%s %d/%d", a.prefix, runID, o.Subject(), r.Seq, i)] = body
		}
	}
}

// checkProof checks a commit's place in its run's hash chain and, with
// pinned keys, its signature. An unsigned commit is reported when keys
// are pinned, or once a signed one has been stored before it; without
// pinned keys, unsigned commits before the first signed one are counted
// as written before signing.
func (a *Auditor) checkProof(ra *runAudit, seq uint64, c proof.Commit, seal *proof.Seal, err error, hash proof.Hash) {
	v := Violation{Run: ra.id, Seq: seq, Invariant: InvSigned}
	prevHash := ra.last
	ra.last = hash
	if err != nil {
		v.Detail = err.Error()
		a.add(v)
		return
	}
	if seal == nil {
		if a.proofs.Signed > 0 || a.keys != nil {
			v.Detail = "an unsigned commit in a signed log: not written by an engine"
			a.add(v)
		} else {
			a.proofs.Unsigned++
		}
		return
	}
	a.proofs.Signed++
	if err := c.Follows(prevHash); err != nil {
		v.Detail = strings.TrimPrefix(err.Error(), "proof: ")
		a.add(v)
	}
	if a.keys == nil {
		return
	}
	if err := a.keys.Verify(c.Signer, hash, seal, seq); err != nil {
		v.Detail = "not signed by a pinned engine key: " + strings.TrimPrefix(err.Error(), "proof: ")
		a.add(v)
	}
}

// check looks at an event before it is folded, for what the fold accepts
// but the contract forbids.
func (a *Auditor) check(ra *runAudit, seq uint64, e events.Event) {
	b := ra.run.OpenBatch()
	if b == nil {
		return
	}
	switch ev := e.(type) {
	case *events.CallCompleted:
		c, _ := b.Call(ev.CallID)
		if c != nil && c.Tool.Target == events.TargetSandbox && c.Phase == events.PhaseExecuting &&
			c.Claim == nil && ev.ErrorKind != events.ErrorUnavailableBeforeDispatch {
			a.add(Violation{Run: ra.id, Batch: b.ID, Call: ev.CallID, Seq: seq, Invariant: InvEntry,
				Detail: fmt.Sprintf("forged result: attempt %d completed with %s but was never claimed", ev.Attempt, events.DescribeOutput(ev.Output))})
		}
	case *events.CallExecuting:
		c, _ := b.Call(ev.CallID)
		if c == nil || ev.Cause != events.CauseRecovered {
			return
		}
		if string(c.Tool.Policy.Mode) != string(ev.Capability) || ev.Attempt > c.Tool.Policy.MaxAttempts {
			a.add(Violation{Run: ra.id, Batch: b.ID, Call: ev.CallID, Seq: seq, Invariant: InvReplay,
				Detail: fmt.Sprintf("replayed as attempt %d with mode %s, capability %s, max_attempts %d",
					ev.Attempt, c.Tool.Policy.Mode, ev.Capability, c.Tool.Policy.MaxAttempts)})
		}
	}
}

// after checks the state an event left.
func (a *Auditor) after(ra *runAudit, seq uint64, e events.Event) {
	b := ra.run.Batch
	if b == nil {
		return
	}
	for _, c := range b.Calls {
		if c.Tool.Policy.Mode == events.ModeNeverReplay && c.Entries > 1 {
			a.add(Violation{Run: ra.id, Batch: b.ID, Call: c.CallID, Seq: seq, Invariant: InvNeverReplay,
				Detail: fmt.Sprintf("entered %d times", c.Entries)})
		}
		if c.Attempt == 0 && c.Entries > 0 {
			a.add(Violation{Run: ra.id, Batch: b.ID, Call: c.CallID, Seq: seq, Invariant: InvNeverRan,
				Detail: "entered without an attempt"})
		}
	}
}

// transition names the invariant an illegal event breaks.
func transition(ra *runAudit, seq uint64, e events.Event, err error) Violation {
	v := Violation{Run: ra.id, Seq: seq, Invariant: InvLog, Detail: err.Error()}
	var te *aggregate.TransitionError
	if errors.As(err, &te) {
		v.Call = te.Call
	}
	if b := ra.run.Batch; b != nil {
		v.Batch = b.ID
	}
	switch {
	case errors.Is(err, aggregate.ErrNotExecuting) && e.EventType() == events.TypeCallClaimed,
		errors.Is(err, aggregate.ErrAlreadyClaimed):
		v.Invariant = InvEntry
	case errors.Is(err, aggregate.ErrCallTerminal), errors.Is(err, aggregate.ErrFinalized):
		v.Invariant = InvTerminal
	case errors.Is(err, aggregate.ErrParked), errors.Is(err, aggregate.ErrCorrelationUsed):
		v.Invariant = InvOneTicket
	case errors.Is(err, aggregate.ErrResultsDiffer), errors.Is(err, aggregate.ErrOutOfOrder):
		v.Invariant = InvBarrier
	case errors.Is(err, aggregate.ErrNoBatch) && e.EventType() != events.TypeBatchFinalized:
		v.Invariant = InvTerminal
	}
	return v
}

// Out records one message of the out stream.
func (a *Auditor) Out(r Record) {
	a.sawOut = true
	a.out = append(a.out, r)
}

// OutRead says the out stream was read, even when it held no message: the
// projection is then compared with it (an empty out stream next to events
// that derive messages is a violation). Without Out or OutRead, invariant 8
// is not checked.
func (a *Auditor) OutRead() { a.sawOut = true }

// Finish compares the out stream with the derived projection (when out
// messages were given) and returns every violation, by stream sequence.
func (a *Auditor) Finish() []Violation {
	a.compareCheckpoints(^uint64(0))
	if a.sawOut {
		a.compareOut()
	}
	sort.SliceStable(a.violations, func(i, j int) bool { return a.violations[i].Seq < a.violations[j].Seq })
	return a.violations
}

func (a *Auditor) compareOut() {
	published := map[string]bool{}
	for _, r := range a.out {
		runID, kind, ok := protocol.Names{Prefix: a.prefix}.OutKind(r.Subject)
		if !ok {
			continue
		}
		src := first(r.Headers[headerSource])
		switch {
		case kind == protocol.OutRefused:
			continue // refusals of resumes and controls change nothing and are not in the log
		case kind == protocol.OutThrottled, kind == protocol.OutRejected && src == throttledSource:
			// Refusals of a client over its limits are not in the log
			// either; engines before the throttled subject published them
			// on rejected with the source 0/0.
			continue
		}
		v := Violation{Run: runID, Seq: sourceSeq(src), Invariant: InvProjection}
		ra := a.runs[runID]
		if ra == nil {
			v.Detail = fmt.Sprintf("%s (out seq %d) was published for a run with no events", r.Subject, r.Seq)
			a.add(v)
			continue
		}
		if ra.broken {
			continue
		}
		key := r.Subject + " " + src
		want, ok := ra.derived[key]
		switch {
		case src == "":
			v.Detail = fmt.Sprintf("%s (out seq %d) has no %s header", r.Subject, r.Seq, headerSource)
			a.add(v)
		case !ok:
			v.Detail = fmt.Sprintf("%s (out seq %d, source %s) was published, but the events derive nothing there", r.Subject, r.Seq, src)
			if kind == "results" {
				v.Invariant = InvBarrier
				v.Detail += ": results before (or without) their barrier"
			}
			a.add(v)
		case published[key]:
			v.Detail = fmt.Sprintf("%s (source %s) was published twice", r.Subject, src)
			a.add(v)
		case !bytes.Equal(want, r.Data):
			v.Detail = fmt.Sprintf("%s (out seq %d, source %s) differs from what the events derive", r.Subject, r.Seq, src)
			a.add(v)
		}
		published[key] = true
	}
	for _, id := range a.order {
		ra := a.runs[id]
		if ra.broken {
			continue
		}
		var missing []string
		for key := range ra.derived {
			if !published[key] {
				missing = append(missing, key)
			}
		}
		sort.Strings(missing)
		for _, key := range missing {
			subject, src, _ := strings.Cut(key, " ")
			v := Violation{Run: id, Seq: sourceSeq(src), Invariant: InvProjection,
				Detail: fmt.Sprintf("%s (source %s) derives from the events but was never published", subject, src)}
			if strings.HasSuffix(subject, ".results") {
				v.Invariant = InvBarrier
			}
			a.add(v)
		}
	}
}

func sourceSeq(src string) uint64 {
	s, _, _ := strings.Cut(src, "/")
	n, _ := strconv.ParseUint(s, 10, 64)
	return n
}

func first(vs []string) string {
	if len(vs) == 0 {
		return ""
	}
	return vs[0]
}
