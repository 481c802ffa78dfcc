package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/aggregate"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/protocol"
	"github.com/toolbatch/toolbatch/tracing"
)

// item is one piece of work for a run.
type item struct {
	runID string
	work  work
}

// work is one kind of work item: *inboxMsg, *outcome, *claimReq,
// *heartbeatReq, *resultReq, *leaseExpiry, *unclaimedExpiry, *reclaimRun
// or *acksIn. Each is decoded once, where it enters the engine, and the
// run is driven once per item.
type work interface{ kindName() string }

// inboxMsg is a message of the inbox or a timer's fire.
type inboxMsg struct {
	msg       jetstream.Msg
	kind      string // protocol.KindSubmit, KindResume, KindControl, KindResult, KindTimer
	principal string // resume.<run_id>.<principal>, or submit.<run_id>.<client>
	forwarded bool   // forwarded by another engine
}

// claimReq and heartbeatReq are a worker's requests, with their decoded
// bodies.
type claimReq struct {
	req  *nats.Msg
	body protocol.ClaimRequest
}

type heartbeatReq struct {
	req  *nats.Msg
	body protocol.Heartbeat
}

// resultReq is a worker's request to record its result: its body (its
// result is decoded again, with the engine's limits, where it is decided)
// and what the reply will say.
type resultReq struct {
	req   *nats.Msg
	body  protocol.ResultRequest
	reply protocol.ResultReply
	// id is the result's resultID; chained the call the drive claimed
	// for the worker (chain); answered: the reply is sent.
	id       string
	chained  string
	answered bool
}

func (w *inboxMsg) kindName() string      { return w.kind }
func (*outcome) kindName() string         { return "outcome" }
func (*claimReq) kindName() string        { return "claim" }
func (*heartbeatReq) kindName() string    { return "heartbeat" }
func (*resultReq) kindName() string       { return "result request" }
func (*leaseExpiry) kindName() string     { return "lease" }
func (*unclaimedExpiry) kindName() string { return "unclaimed" }
func (*reclaimRun) kindName() string      { return "reclaim" }
func (*acksIn) kindName() string          { return "out acknowledgements" }

// msg returns the item's inbox message, or nil.
func (it item) msg() jetstream.Msg {
	if in, ok := it.work.(*inboxMsg); ok {
		return in.msg
	}
	return nil
}

// request returns the item's worker request, or nil.
func (it item) request() *nats.Msg {
	switch w := it.work.(type) {
	case *claimReq:
		return w.req
	case *heartbeatReq:
		return w.req
	case *resultReq:
		return w.req
	}
	return nil
}

// reclaimRun takes back a run a previous process of this engine owned.
type reclaimRun struct{}

// outcome is what an executor reported for an attempt.
type outcome struct {
	callID  string
	attempt int
	output  *events.Output
	err     *events.ToolError
	lost    bool // the executor's owner was lost: the recovery table decides
	// awaiting: a delegated child waits for input.
	awaiting bool
	// counted: the engine counts this call as running until it is handled.
	counted bool
}

// runState is a cached run.
type runState struct {
	id     string
	run    *aggregate.Run
	tip    tip    // where the run's log ends: what its next commit follows
	bytes  int64  // bytes of the commits folded into run: what the cache counts it as
	client string // the client of the last submission taken (per-client limits)
	// traceparent is the trace context of the last submission taken (its
	// header; "" for none), what its BatchSubmitted commit carries.
	traceparent string
	// batchSpan is the span context of the run's last batch (zero: traces
	// off), derived once from the trace context its commit carries: its
	// attempts' trace contexts are derived from it.
	batchSpan tracing.BatchSpan
	loaded    bool
	// held are inbox messages acknowledged once the run is quiescent, so
	// that a crash before then redelivers them and the run is recovered.
	held     []jetstream.Msg
	inflight map[string]bool  // "<call_id>/<attempt>" executing here
	leases   map[string]lease // claimed sandbox attempts, by call id
	// unclaimed are dispatched sandbox attempts waiting for a claim, by
	// call id: their attempt and dispatch deadline.
	unclaimed map[string]lease
	used      time.Time
	// pending are the decisions staged since the last flush, each a
	// decision's events; durableHeld counts the held messages whose
	// decisions are in the log.
	pending     [][]events.Event
	durableHeld int
	owned       bool   // this engine holds the run's owner key
	ownRev      uint64 // its revision
	// keyUnsure: a release or a confirmation of the key got no answer and
	// may have landed, or a commit met a conflict (another engine may hold
	// the key since): the key is confirmed before the run is used again
	// (confirmKey).
	keyUnsure bool
	// releasedRev is the revision of this engine's last release of the
	// key (0: none, or taken since), releasedAt the run's last commit then.
	releasedRev, releasedAt uint64
	// idleSince is when the owned run became quiescent here (zero: busy,
	// or not owned).
	idleSince time.Time
	// offer is the result request being handled whose worker offers to
	// take the run's next call (drive claims it for the worker: chain).
	offer *resultReq
	// answered are the results asked on api.result that this engine
	// recorded and answered, by resultID: the same one asked again (its
	// answer lost) or published on the inbox after it (the worker heard
	// nothing) is the same result, not one to refuse.
	answered map[string]bool
	// projection is what of the run's log this engine published
	// (project.go); keyProjected is what the owner key said was projected
	// when this engine took it free (its release marker's commit, or
	// anyProjected; 0: nothing, taken from an engine).
	projection   projection
	keyProjected uint64
}

// shard serializes the work of the runs hashed to it.
type shard struct {
	e      *Engine
	runCtx context.Context // set by loop: ends at shutdown
	in     chan item
	fence  chan struct{} // this engine was declared dead: let every run go
	runs   map[string]*runState
	bound  bound     // of runs
	acks   acksWatch // its commits' out messages in flight
}

func newShard(e *Engine, b bound) *shard {
	return &shard{e: e, in: make(chan item, 256), fence: make(chan struct{}, 1), runs: map[string]*runState{}, bound: b,
		acks: acksWatch{notify: make(chan struct{}, 1)}}
}

func (s *shard) post(it item) { s.in <- it }

// tryPost posts unless the shard's queue is full, and reports whether it
// posted.
func (s *shard) tryPost(it item) bool {
	select {
	case s.in <- it:
		return true
	default:
		return false
	}
}

// postCtx posts unless ctx is done (executors finishing after shutdown),
// and reports whether it posted.
func (s *shard) postCtx(ctx context.Context, it item) bool {
	select {
	case s.in <- it:
		return true
	case <-ctx.Done():
		return false
	}
}

func (s *shard) loop(ctx context.Context) {
	s.runCtx = ctx
	tick := time.NewTicker(s.e.cfg.InboxAckWait / 3)
	defer tick.Stop()
	leaseTick := time.NewTicker(max(s.e.cfg.Lease/10, 50*time.Millisecond))
	defer leaseTick.Stop()
	for {
		select {
		case <-ctx.Done():
			s.settleOuts()
			s.releaseIdle(true)
			return
		case it := <-s.in:
			// Runs whose out messages are in go first: a run waiting
			// for its acksIn can be neither released nor evicted, and a
			// burst of parking runs kept thousands of them in memory.
			s.handleAcked(ctx)
			s.handle(ctx, it)
		case <-s.acks.notify:
			s.handleAcked(ctx)
		case <-s.fence:
			for _, rs := range s.runs {
				if rs.owned {
					s.forget(rs)
				}
			}
		case <-leaseTick.C:
			// What came while the shard was busy (a heartbeat, a result)
			// is taken before a lease is found out of time.
			for range len(s.in) {
				s.handleAcked(ctx)
				s.handle(ctx, <-s.in)
			}
			s.checkLeases()
			s.releaseIdle(false)
			s.evict()
		case <-tick.C:
			s.keepAlive(ctx)
		}
	}
}

// keepAlive keeps the messages of the runs this engine works on in
// progress, and drives again a run whose last attempt at it failed. (The
// runs' owner keys need no renewal: liveness.go.)
func (s *shard) keepAlive(runCtx context.Context) {
	ctx, cancel := opCtx()
	defer cancel()
	for _, rs := range s.runs {
		if !rs.owned {
			continue
		}
		for _, m := range rs.held {
			_ = m.InProgress()
		}
		if (len(rs.held) > 0 || rs.projection.pending()) && len(rs.inflight) == 0 {
			err := s.confirmIfUnsure(ctx, rs)
			if err == nil {
				err = s.load(ctx, rs)
			}
			if err == nil {
				err = s.settleProjection(ctx, rs)
			}
			if err == nil {
				err = s.drive(ctx, runCtx, rs)
			}
			if errors.Is(err, ErrNotOwner) {
				continue // let go (confirmKey)
			}
			if err != nil {
				s.e.log.Warn().Str(fieldRunID, rs.id).Err(err).Str(protocol.FieldMeaning, protocol.Meaning(err)).Msg("drive failed; will retry")
				s.abandon(rs)
			}
		}
		s.noteIdle(ctx, rs)
	}
}

// handleAcked handles the runs whose out messages the watcher has waited
// for (acksIn).
func (s *shard) handleAcked(ctx context.Context) {
	for _, a := range s.takeAcked() {
		s.handle(ctx, item{runID: a.runID, work: &acksIn{a}})
	}
}

// settleOuts waits, at shutdown, for the out messages the runs' last
// commits sent, so that those runs can be released. A run they settle has
// its held messages acknowledged as its acksIn would have done: left
// unacknowledged, a command applied here (an approval, say) would be
// delivered again to the next engine and refused as already done.
func (s *shard) settleOuts() {
	ctx, cancel := opCtx()
	defer cancel()
	for _, rs := range s.runs {
		if rs.owned && rs.projection.acks != nil && s.settleProjection(ctx, rs) == nil {
			if rs.settled() {
				s.ackHeld(rs)
			}
			s.noteIdle(ctx, rs)
		}
	}
}

// opCtx bounds one commit or load; it is not tied to shutdown, so that the
// commit in progress finishes.
func opCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 10*time.Second)
}

func (s *shard) handle(runCtx context.Context, it item) {
	done, _ := it.work.(*outcome)
	if done != nil && done.counted {
		done.counted = false // a retry of the same outcome is not counted again
		defer s.e.running.Add(-1)
	}
	rs := s.state(it.runID)
	ctx, cancel := opCtx()
	defer cancel()
	if _, back := it.work.(*reclaimRun); it.msg() == nil && it.request() == nil && !back {
		// An executor's outcome, a watched deadline of this engine's, or
		// out messages acknowledged.
		if !rs.owned {
			return // this engine lost the run since: the new owner recovers the call
		}
		if in, ok := it.work.(*acksIn); ok && in.acks != rs.projection.acks {
			return // settled since
		}
	} else if err := s.acquire(ctx, rs); err != nil {
		s.busy(it, err)
		return
	}
	var err error
	defer func() { rs.offer = nil }()
	for try := 0; try < 3; try++ {
		err = s.confirmIfUnsure(ctx, rs)
		if err == nil {
			err = s.load(ctx, rs)
		}
		if err == nil {
			err = s.handleOnce(ctx, runCtx, rs, it)
			if err == nil {
				// Whatever the item was, the run goes on from where it is:
				// driven once, here (it flushes).
				err = s.drive(ctx, runCtx, rs)
			}
		}
		if !errors.Is(err, ErrConflict) {
			break
		}
		s.abandon(rs) // the key is unsure (flush): confirmed first
		s.e.log.Debug().Str(fieldRunID, it.runID).Err(err).Msg("run extended elsewhere: confirming the key and reloading")
	}
	if errors.Is(err, ErrNotOwner) {
		// Taken over, or released by an answer that was lost: the run's
		// owner decides now, and the item goes to it (confirmKey said so
		// in the log).
		if rs.owned {
			s.forget(rs)
		}
		s.busy(it, s.e.ownerNow(ctx, rs.id))
		return
	}
	if err != nil {
		s.e.log.Error().Str(fieldRunID, it.runID).Err(err).Str(protocol.FieldMeaning, protocol.Meaning(err)).Str("kind", it.work.kindName()).Msg("work failed; will retry")
		m := it.msg()
		held := m != nil && slices.Contains(rs.held, m)
		s.abandon(rs) // fold again next time
		if m != nil && !held {
			_ = m.NakWithDelay(time.Second)
		}
		if req := it.request(); req != nil {
			respond(req, protocol.ClaimReply{Reason: protocol.ReasonBusy})
		}
		if o := done; o != nil {
			// Not recorded: keep the outcome and try again.
			rs.inflight[fmt.Sprintf("%s/%d", o.callID, o.attempt)] = true
			time.AfterFunc(time.Second, func() { s.postCtx(runCtx, item{runID: rs.id, work: o}) })
		}
	} else if rr, ok := it.work.(*resultReq); ok && !rr.answered {
		s.answer(rs, rr) // after drive: the result and what it led to are in the log
	}
	s.noteIdle(ctx, rs)
	if len(s.runs) > s.bound.max {
		s.evict() // the bytes bound is checked on the lease tick: evict reads every run
	}
}

// busyDelay is how long a message of a run another engine owns waits
// before it is delivered again: 5 ms at first, doubling with every
// delivery, at most a quarter of the ack wait and never more than 500 ms.
// A result that reached the wrong engine comes back at once; one whose run
// stays owned elsewhere (its owner crashed, say, and its key has not
// expired yet) does not churn.
func busyDelay(m jetstream.Msg, ackWait time.Duration) time.Duration {
	n := uint64(1)
	if meta, err := m.Metadata(); err == nil {
		n = max(meta.NumDelivered, 1)
	}
	ceiling := min(max(ackWait/4, 100*time.Millisecond), 500*time.Millisecond)
	if n > 8 {
		return ceiling
	}
	return min(5*time.Millisecond<<(n-1), ceiling)
}

// busy gives an item back when another engine owns its run, or the owners
// bucket cannot be reached.
func (s *shard) busy(it item, err error) {
	if !errors.Is(err, ErrNotOwner) {
		s.e.log.Warn().Str(fieldRunID, it.runID).Err(err).Msg("cannot own the run; will retry")
	}
	var elsewhere ownedElsewhere
	in, _ := it.work.(*inboxMsg)
	if in != nil && in.kind == protocol.KindSubmit {
		s.e.clients.release(it.runID) // handled elsewhere, or later: not in flight here
	}
	switch {
	case in != nil && !in.forwarded && errors.As(err, &elsewhere) && s.e.forward(in.msg, elsewhere.owner):
		// The owner handles it, and counts it against its client.
	case in != nil:
		// Back soon: the owner may release the run in a moment.
		_ = in.msg.NakWithDelay(busyDelay(in.msg, s.e.cfg.InboxAckWait))
	case it.request() != nil && !errors.Is(err, ErrNotOwner):
		respond(it.request(), protocol.ClaimReply{Reason: protocol.ReasonBusy})
	}
	// A claim or heartbeat of a run another engine owns is answered by it.
}

// handleOnce translates one item into what the run needs; ctx bounds the
// whole item (handle's, one per item), runCtx ends at shutdown.
func (s *shard) handleOnce(ctx, runCtx context.Context, rs *runState, it item) error {
	switch w := it.work.(type) {
	case *reclaimRun:
		return nil // owned and loaded (recovered): handle drives it
	case *acksIn:
		if rs.projection.acks != w.acks {
			return nil // settled since (by the load)
		}
		return s.settleProjection(ctx, rs)
	case *outcome:
		return s.onOutcome(ctx, runCtx, rs, w)
	case *claimReq:
		return s.onClaim(ctx, rs, w)
	case *heartbeatReq:
		return s.onHeartbeat(rs, w)
	case *resultReq:
		return s.onResultReq(ctx, rs, w)
	case *leaseExpiry:
		return s.onLeaseExpired(ctx, rs, w)
	case *unclaimedExpiry:
		return s.onDispatchDeadline(ctx, rs, w.callID, w.attempt)
	case *inboxMsg:
		switch w.kind {
		case protocol.KindSubmit:
			return s.onSubmit(ctx, rs, w)
		case protocol.KindResume:
			return s.onResume(ctx, rs, w)
		case protocol.KindControl:
			return s.onControl(ctx, rs, w)
		case protocol.KindTimer:
			return s.onTimer(ctx, runCtx, rs, w)
		case protocol.KindResult:
			return s.onResult(ctx, rs, w)
		}
		s.e.log.Warn().Str(fieldSubject, w.msg.Subject()).Msg("inbox message of an unknown kind: terminated")
		return w.msg.TermWithReason("unknown inbox kind " + w.kind)
	}
	return fmt.Errorf("engine: unknown work item %T", it.work)
}
