package chaos

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/audit"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/protocol"
)

// The engine's names for the default prefix.
var (
	names        = protocol.Names{Prefix: protocol.DefaultPrefix}
	prefix       = names.Prefix
	eventsStream = names.EventsStream()
	outStream    = names.OutStream()
)

// recorded is what the streams hold at the end of a schedule.
type recorded struct {
	events, out []audit.Record
}

// readStreams reads the whole out and events streams with ordered consumers.
func readStreams(ctx context.Context, url string) (*recorded, error) {
	nc, err := nats.Connect(url, nats.Name("toolbatch-chaos-reader"))
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	// The out stream first: every out message read then has its commit in
	// the events read after it. The other way round, a commit made between
	// the two reads would look like an out message without a source.
	var r recorded
	if r.out, err = readStream(ctx, js, outStream); err != nil {
		return nil, err
	}
	if r.events, err = readStream(ctx, js, eventsStream); err != nil {
		return nil, err
	}
	return &r, nil
}

// readStream reads every message of a stream, in order, up to its last
// sequence when the read began.
func readStream(ctx context.Context, js jetstream.JetStream, name string) ([]audit.Record, error) {
	var out []audit.Record
	err := protocol.ReadOrdered(ctx, js, name, protocol.ReadOptions{}, func(m jetstream.Msg, meta *jetstream.MsgMetadata) error {
		out = append(out, audit.Record{Seq: meta.Sequence.Stream, Subject: m.Subject(), Time: meta.Timestamp,
			Headers: map[string][]string(m.Headers()), Data: m.Data()})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", name, err)
	}
	return out, nil
}

// runAudit feeds both streams to an auditor.
func runAudit(r *recorded) []audit.Violation {
	a := audit.New(prefix)
	for _, rec := range r.events {
		a.Event(rec)
	}
	for _, rec := range r.out {
		a.Out(rec)
	}
	return a.Finish()
}

// notYetPublished reports whether every violation is an out message the
// events derive but nobody has published yet: the engine that took a run
// over after the last crash may not have projected its last commit again.
func notYetPublished(vs []audit.Violation) bool {
	if len(vs) == 0 {
		return false
	}
	for _, v := range vs {
		if !strings.Contains(v.Detail, "was never published") {
			return false
		}
	}
	return true
}

// settle reads the streams and audits them until the audit finds nothing,
// or finds more than out messages not yet published, or the deadline
// passes; it returns the last read and its violations.
func settle(ctx context.Context, url string, within time.Duration) (*recorded, []audit.Violation, error) {
	dctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	var (
		rec     *recorded
		vs      []audit.Violation
		lastErr error
	)
	for {
		r, err := readStreams(dctx, url)
		if err == nil {
			rec, vs = r, runAudit(r)
			if !notYetPublished(vs) {
				return rec, vs, nil
			}
		} else {
			lastErr = err
		}
		if !sleepCtx(dctx, 250*time.Millisecond) {
			if rec == nil {
				return nil, nil, fmt.Errorf("read the streams: %w", lastErr)
			}
			return rec, vs, nil
		}
	}
}

// callInfo is what the events say of one call.
type callInfo struct {
	runID, batchID, callID, toolID string
	op                             string
	tool                           events.Descriptor
	claimed                        map[int]bool // attempts a worker was granted
	history                        []string
}

// fold is the facts the checks need, from the events stream.
type fold struct {
	calls         map[string]*callInfo // by operation id
	order         []string             // operation ids, in stream order of their batch
	batches       map[string]bool      // accepted batch ids
	batchOrder    []string
	completedOK   map[string]int // op -> attempt of a successful sandbox completion
	indeterminate []string       // "op: reason"
	unavailable   []string       // ops completed unavailable_before_dispatch (the model sees it)
	replayed      []string       // "op attempt n"
	retries       int
	claims        int
	refusedRes    int
	failures      []string
	at            time.Time // the commit being applied (its stream timestamp)
}

// when is the time of the commit being applied, for a call's history.
func (f *fold) when() string {
	if f.at.IsZero() {
		return ""
	}
	return " [" + f.at.Format("15:04:05.000") + "]"
}

// foldEvents decodes every commit of the events stream.
func foldEvents(r *recorded) *fold {
	f := &fold{calls: map[string]*callInfo{}, batches: map[string]bool{}, completedOK: map[string]int{}}
	for _, rec := range r.events {
		runID, _ := names.RunOf(protocol.EventsFamily, rec.Subject)
		evs, err := events.DecodeCommit(rec.Data, rec.Headers[protocol.HeaderEvent])
		if err != nil {
			f.failures = append(f.failures, fmt.Sprintf("events seq %d: undecodable commit: %v", rec.Seq, err))
			continue
		}
		for _, e := range evs {
			f.at = rec.Time
			f.apply(runID, rec.Seq, e)
		}
	}
	return f
}

func (f *fold) call(batchID, callID string) *callInfo {
	return f.calls[batchID+"/"+callID]
}

func (f *fold) note(seq uint64, batchID, callID, what string) *callInfo {
	c := f.call(batchID, callID)
	if c != nil {
		c.history = append(c.history, fmt.Sprintf("seq %d %s%s", seq, what, f.when()))
	}
	return c
}

func (f *fold) apply(runID string, seq uint64, e events.Event) {
	switch ev := e.(type) {
	case *events.BatchSubmitted:
		f.batches[ev.BatchID] = true
		f.batchOrder = append(f.batchOrder, ev.BatchID)
		for _, c := range ev.Calls {
			op := ev.BatchID + "/" + c.CallID
			f.calls[op] = &callInfo{runID: runID, batchID: ev.BatchID, callID: c.CallID, toolID: c.ToolID, op: op,
				tool: c.Tool, claimed: map[int]bool{}, history: []string{fmt.Sprintf("seq %d submitted (%s, %s, mode %s)%s", seq, c.ToolID, c.Tool.Target, c.Tool.Policy.Mode, f.when())}}
			f.order = append(f.order, op)
		}
	case *events.CallGated:
		f.note(seq, ev.BatchID, ev.CallID, "gated "+ev.Label)
	case *events.CallExecuting:
		f.note(seq, ev.BatchID, ev.CallID, fmt.Sprintf("executing attempt %d (%s, capability %s)", ev.Attempt, ev.Cause, ev.Capability))
		switch ev.Cause {
		case events.CauseRecovered:
			f.replayed = append(f.replayed, fmt.Sprintf("%s/%s attempt %d", ev.BatchID, ev.CallID, ev.Attempt))
		case events.CauseRetry:
			f.retries++
		}
	case *events.CallClaimed:
		f.claims++
		if c := f.note(seq, ev.BatchID, ev.CallID, fmt.Sprintf("claimed attempt %d by %s", ev.Attempt, ev.WorkerID)); c != nil {
			c.claimed[ev.Attempt] = true
		}
	case *events.CallCompleted:
		c := f.note(seq, ev.BatchID, ev.CallID, fmt.Sprintf("completed attempt %d: %s", ev.Attempt, events.DescribeOutput(ev.Output)))
		if c != nil && c.tool.Target == events.TargetSandbox && !ev.Output.IsError && ev.ErrorKind == "" {
			f.completedOK[c.op] = ev.Attempt
		}
		if ev.ErrorKind == events.ErrorUnavailableBeforeDispatch {
			f.unavailable = append(f.unavailable, ev.BatchID+"/"+ev.CallID)
		}
	case *events.CallIndeterminate:
		f.note(seq, ev.BatchID, ev.CallID, fmt.Sprintf("indeterminate attempt %d: %s", ev.Attempt, ev.Reason))
		f.indeterminate = append(f.indeterminate, fmt.Sprintf("%s/%s: %s", ev.BatchID, ev.CallID, ev.Reason))
	case *events.CallAwaiting:
		f.note(seq, ev.BatchID, ev.CallID, "awaiting "+string(ev.Ticket.Reason))
	case *events.TicketResolved:
		f.note(seq, ev.BatchID, ev.CallID, "ticket resolved: "+string(ev.Resolution))
	case *events.ResultRefused:
		f.refusedRes++
	}
}

// effects reads the effects file: operation id -> the attempts recorded, one
// per line.
func readEffects(path string) (map[string][]int, []string, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return map[string][]int{}, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	out := map[string][]int{}
	var bad []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		op, attempt, ok := strings.Cut(sc.Text(), " ")
		n, err := strconv.Atoi(attempt)
		if !ok || err != nil {
			bad = append(bad, fmt.Sprintf("effects file: malformed line %q", sc.Text()))
			continue
		}
		out[op] = append(out[op], n)
	}
	return out, bad, sc.Err()
}

// checkSchedule runs every check of a finished schedule and returns its
// failures: batches accepted by NATS but not by the engine, batches without
// exactly one results message of one result per tool_use, never_replay
// tools entered more than once (by their own effect), effects without a
// claim, and the audit's violations.
func checkSchedule(rec *recorded, vs []audit.Violation, f *fold, effects map[string][]int, submitted []batchSpec) []string {
	var failures []string
	failures = append(failures, f.failures...)

	// Nothing accepted was lost: every batch NATS acknowledged was accepted by
	// the engine, and every accepted batch has exactly one results message.
	results := map[string]int{}
	resultsOf := map[string]*protocol.ResultsOut{}
	for _, r := range rec.out {
		switch {
		case strings.HasSuffix(r.Subject, ".results"):
			var res protocol.ResultsOut
			if err := events.Unmarshal(r.Data, &res); err != nil {
				failures = append(failures, fmt.Sprintf("out seq %d %s: undecodable: %v", r.Seq, r.Subject, err))
				continue
			}
			results[res.BatchID]++
			resultsOf[res.BatchID] = &res
		case strings.HasSuffix(r.Subject, ".rejected"), strings.HasSuffix(r.Subject, ".ended"):
			failures = append(failures, fmt.Sprintf("out seq %d %s: the workload never earns this", r.Seq, r.Subject))
		}
	}
	specs := map[string]batchSpec{}
	for _, b := range submitted {
		id := b.submit.BatchID()
		specs[id] = b
		if !f.batches[id] {
			failures = append(failures, fmt.Sprintf("batch %s: acknowledged by NATS but never accepted (no BatchSubmitted)", id))
		}
	}
	for _, id := range f.batchOrder {
		if n := results[id]; n != 1 {
			failures = append(failures, fmt.Sprintf("batch %s: %d results messages, want exactly 1%s", id, n, f.batchHistory(id)))
			continue
		}
		var want []string
		for _, op := range f.order {
			if c := f.calls[op]; c.batchID == id {
				want = append(want, c.callID)
			}
		}
		var got []string
		for _, b := range resultsOf[id].Results {
			got = append(got, b.ToolUseID)
		}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			failures = append(failures, fmt.Sprintf("batch %s: results for tool_use ids [%s], want [%s]", id, strings.Join(got, ","), strings.Join(want, ",")))
		}
		if _, ok := specs[id]; !ok {
			failures = append(failures, fmt.Sprintf("batch %s: accepted but the driver never submitted it", id))
		}
	}

	// Side effects, counted by the tools themselves.
	ops := make([]string, 0, len(effects))
	for op := range effects {
		ops = append(ops, op)
	}
	sort.Strings(ops)
	for _, op := range ops {
		attempts := effects[op]
		c := f.calls[op]
		if c == nil {
			failures = append(failures, fmt.Sprintf("effect of %s (attempts %v): no such call in the events", op, attempts))
			continue
		}
		if c.tool.Policy.Mode == events.ModeNeverReplay && len(attempts) > 1 {
			failures = append(failures, fmt.Sprintf("%s (%s, never_replay): entered %d times (attempts %v)%s", op, c.toolID, len(attempts), attempts, c.describe()))
		}
		for _, a := range attempts {
			if !c.claimed[a] {
				failures = append(failures, fmt.Sprintf("%s (%s): attempt %d ran but no CallClaimed for it was committed%s", op, c.toolID, a, c.describe()))
			}
		}
	}
	for op, attempt := range f.completedOK {
		found := false
		for _, a := range effects[op] {
			found = found || a == attempt
		}
		if !found {
			c := f.calls[op]
			failures = append(failures, fmt.Sprintf("%s (%s): completed successfully as attempt %d, but the tool never recorded that attempt%s", op, c.toolID, attempt, c.describe()))
		}
	}

	for _, v := range vs {
		detail := "audit: " + v.String()
		if c := f.call(v.Batch, v.Call); c != nil {
			detail += c.describe()
		}
		failures = append(failures, detail)
	}
	return failures
}

// describe returns the call's history from the events, for a report.
func (c *callInfo) describe() string {
	return "\n      history of " + c.op + ":\n        " + strings.Join(c.history, "\n        ")
}

// batchHistory returns the history of every call of a batch.
func (f *fold) batchHistory(batchID string) string {
	var b strings.Builder
	for _, op := range f.order {
		if c := f.calls[op]; c.batchID == batchID {
			b.WriteString(c.describe())
		}
	}
	return b.String()
}

// checkServerOnly runs the checks of a schedule whose faults hit only the
// nats-servers (no engine, no worker was killed): a server loss must cost
// no call its outcome and show the model nothing. It returns a failure for
// every call made indeterminate, every call completed
// unavailable_before_dispatch, and every replay_safe tool entered more than
// once (its effect lines counted per operation and attempt).
func checkServerOnly(f *fold, effects map[string][]int) []string {
	var failures []string
	for _, s := range f.indeterminate {
		op, reason, _ := strings.Cut(s, ": ")
		failures = append(failures, fmt.Sprintf("server-only faults: %s made indeterminate (%s)%s", op, reason, f.describeOp(op)))
	}
	for _, op := range f.unavailable {
		failures = append(failures, fmt.Sprintf("server-only faults: %s completed unavailable_before_dispatch (a model-visible error)%s", op, f.describeOp(op)))
	}
	ops := make([]string, 0, len(effects))
	for op := range effects {
		ops = append(ops, op)
	}
	sort.Strings(ops)
	for _, op := range ops {
		c := f.calls[op]
		attempts := effects[op]
		if c == nil || c.tool.Policy.Mode != events.ModeReplaySafe || len(attempts) < 2 {
			continue
		}
		per := map[int]int{}
		for _, a := range attempts {
			per[a]++
		}
		failures = append(failures, fmt.Sprintf("server-only faults: %s (%s, replay_safe): effect doubled: %d effect lines (lines per attempt %v)%s",
			op, c.toolID, len(attempts), per, c.describe()))
	}
	return failures
}

// describeOp returns the history of a call, or nothing for an unknown one.
func (f *fold) describeOp(op string) string {
	if c := f.calls[op]; c != nil {
		return c.describe()
	}
	return ""
}
