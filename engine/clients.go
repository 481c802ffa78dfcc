package engine

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/protocol"
)

// Per-client limits: one client's flood of submissions must not hold the
// engine or delay the other clients' runs for long. A client is the NATS
// user of an attributed submission (<prefix>.submit.<run_id>.<client>,
// which permissions bind to the user's public nkey), or else the run id's
// prefix (up to its first '-' or '_'). Each client may have ClientMaxRuns
// runs in flight and submit at ClientSubmitRate per second (bursts of
// ClientSubmitBurst). A submission over either is refused before any run
// work, with code throttled on the run's throttled subject, and nothing is
// recorded: a flood costs one check and one out message each.
//
// A run is in flight for its client while this engine works on it: from
// its submission's admission (or, for one another engine admitted, its
// batch's acceptance here) until its batch is finalized, the run ends, or
// this engine gives the run up (a run parked on a ticket is given up at
// once: it costs nothing while it waits, and is not counted). Only a
// submission's first delivery is checked: a redelivered one was admitted
// before.
//
// The counts are this engine's: with several engines, each holds its
// share (a client's runs spread over the engines that own them), and a
// restarted engine counts the runs accepted since its start.

// Default per-client limits.
const (
	DefaultClientMaxRuns     = 20000
	DefaultClientSubmitRate  = 2000.0
	DefaultClientSubmitBurst = 4000
)

// clientLimits counts each client's runs in flight and its submissions.
type clientLimits struct {
	maxRuns int     // 0: no limit
	rate    float64 // per second; 0: no limit
	burst   float64

	mu      sync.Mutex
	runs    map[string]int    // client -> runs in flight
	of      map[string]string // run id -> its client, while in flight
	buckets map[string]*bucket
}

type bucket struct {
	tokens float64
	at     time.Time
}

func newClientLimits(maxRuns int, rate float64, burst int) *clientLimits {
	return &clientLimits{maxRuns: maxRuns, rate: rate, burst: float64(burst),
		runs: map[string]int{}, of: map[string]string{}, buckets: map[string]*bucket{}}
}

// clientOf is the client a submission's subject names.
func clientOf(runID, attributed string) string {
	if attributed != "" {
		return "user:" + attributed
	}
	if i := strings.IndexAny(runID, "-_"); i > 0 {
		runID = runID[:i]
	}
	return "run:" + runID
}

// admit takes one submission of client for runID at now, or says why
// not. An admitted run is in flight from then on (so that a burst cannot
// pass the limit before its runs are accepted), until release.
func (l *clientLimits) admit(client, runID string, now time.Time) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, flying := l.of[runID]
	if !flying && l.maxRuns > 0 && l.runs[client] >= l.maxRuns {
		return events.Refuse(events.CodeThrottled, "client %s has %d runs in flight, at most %d", client, l.runs[client], l.maxRuns)
	}
	if l.rate > 0 {
		b := l.buckets[client]
		if b == nil {
			b = &bucket{tokens: l.burst, at: now}
			l.buckets[client] = b
		}
		b.tokens = min(l.burst, b.tokens+now.Sub(b.at).Seconds()*l.rate)
		b.at = now
		if b.tokens < 1 {
			return events.Refuse(events.CodeThrottled, "client %s submits faster than %g per second", client, l.rate)
		}
		b.tokens--
		if len(l.buckets) > 100000 {
			l.dropFull(now)
		}
	}
	if !flying {
		l.of[runID] = client
		l.runs[client]++
	}
	return nil
}

// release takes a run out of flight: its batch was finalized, the run
// ended, or its submission left it without an open batch (refused, or a
// repeat).
func (l *clientLimits) release(runID string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c, ok := l.of[runID]; ok {
		delete(l.of, runID)
		if l.runs[c]--; l.runs[c] <= 0 {
			delete(l.runs, c)
		}
	}
}

// dropFull forgets the buckets that are full again: they hold nothing a
// new bucket would not.
func (l *clientLimits) dropFull(now time.Time) {
	for c, b := range l.buckets {
		if b.tokens+now.Sub(b.at).Seconds()*l.rate >= l.burst {
			delete(l.buckets, c)
		}
	}
}

// hold puts a run in flight for client (again): its batch was accepted
// here, whichever engine admitted its submission.
func (l *clientLimits) hold(runID, client string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.of[runID]; !ok {
		l.of[runID] = client
		l.runs[client]++
	}
}

// committed counts what a run's commit changed: a batch accepted holds the
// run in flight for client, a batch finalized or the run's end releases it.
func (l *clientLimits) committed(runID, client string, evs []events.Event) {
	for _, e := range evs {
		switch e.(type) {
		case *events.BatchSubmitted:
			l.hold(runID, client)
		case *events.BatchFinalized, *events.RunEnded:
			l.release(runID)
		}
	}
}

// throttle refuses a submission over its client's limits: it publishes the
// refusal on the run's throttled subject, naming the batch when the body
// says its step, and terminates the message. It reports whether it did.
func (e *Engine) throttle(m jetstream.Msg, runID, attributed string) bool {
	if md, err := m.Metadata(); err == nil && md.NumDelivered > 1 {
		return false
	}
	err := e.clients.admit(clientOf(runID, attributed), runID, time.Now())
	if err == nil {
		return false
	}
	ref := err.(*events.Refusal)
	e.metrics.Rejected(string(ref.Code))
	out := protocol.RejectedOut{Code: ref.Code, Reason: ref.Reason}
	if msgID, seq := origin(m); msgID != "" || seq != 0 {
		out.Submission = &protocol.SubmissionOut{MsgID: msgID, InboxSeq: seq}
	}
	var head struct {
		Step *int64 `msgpack:"step" json:"step"`
	}
	var derr error
	if isJSON(m) {
		derr = json.Unmarshal(m.Data(), &head)
	} else {
		derr = events.Unmarshal(m.Data(), &head)
	}
	if derr == nil && head.Step != nil && *head.Step >= 0 {
		out.BatchID = events.BatchID(runID, *head.Step)
	}
	if body, merr := events.Marshal(out); merr == nil {
		// Not derived from a commit: no Toolbatch-Source, and a subject the
		// projection does not publish on (protocol.OutThrottled).
		msg := nats.NewMsg(e.names.Out(runID, protocol.OutThrottled))
		msg.Data = body
		// A core publish, which the out stream stores like any other: a
		// JetStream publish would wait for its acknowledgement (or, async,
		// stall once too many are pending), and a flood must not hold the
		// intake.
		_ = e.nc.PublishMsg(msg)
	}
	_ = m.TermWithReason(fmt.Sprintf("%s: %s", ref.Code, ref.Reason))
	return true
}
