package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/toolbatch/toolbatch/aggregate"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/protocol"
)

// item is one piece of work for a run.
type item struct {
	runID string
	work  work
}

// work is one kind of work item: *inboxMsg, *outcome, *claimReq,
// *heartbeatReq, *leaseExpiry or *unclaimedExpiry. Each is decoded once,
// where it enters the engine, and the run is driven once per item.
type work interface{ kindName() string }

// inboxMsg is a message of the inbox or a timer's fire.
type inboxMsg struct {
	msg       jetstream.Msg
	kind      string // protocol.KindSubmit, KindResume, KindControl, KindResult, KindTimer
	principal string // resume.<run_id>.<principal>
	forwarded bool   // forwarded by another engine
}

// claimReq and heartbeatReq are a worker's requests, with their decoded
// bodies.
type claimReq struct {
	req  *nats.Msg
	body events.ClaimRequest
}

type heartbeatReq struct {
	req  *nats.Msg
	body events.Heartbeat
}

func (w *inboxMsg) kindName() string      { return w.kind }
func (*outcome) kindName() string         { return "outcome" }
func (*claimReq) kindName() string        { return "claim" }
func (*heartbeatReq) kindName() string    { return "heartbeat" }
func (*leaseExpiry) kindName() string     { return "lease" }
func (*unclaimedExpiry) kindName() string { return "unclaimed" }

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
	}
	return nil
}

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
	seq    uint64 // stream sequence of the run's last commit
	loaded bool
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
	// releasedRev is the revision of this engine's last release of the
	// key (0: none, or taken since).
	releasedRev uint64
	// idleSince is when the owned run became quiescent here (zero: busy,
	// or not owned).
	idleSince time.Time
}

// shard serializes the work of the runs hashed to it.
type shard struct {
	e      *Engine
	runCtx context.Context // set by loop: ends at shutdown
	in     chan item
	runs   map[string]*runState
	max    int
}

func newShard(e *Engine, max int) *shard {
	return &shard{e: e, in: make(chan item, 256), runs: map[string]*runState{}, max: max}
}

func (s *shard) post(it item) { s.in <- it }

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
	tick := time.NewTicker(s.e.cfg.AckWait / 3)
	defer tick.Stop()
	leaseTick := time.NewTicker(max(s.e.cfg.Lease/10, 50*time.Millisecond))
	defer leaseTick.Stop()
	for {
		select {
		case <-ctx.Done():
			s.releaseIdle(true)
			return
		case it := <-s.in:
			s.handle(ctx, it)
		case <-leaseTick.C:
			s.checkLeases()
			s.releaseIdle(false)
		case <-tick.C:
			s.keepAlive(ctx)
		}
	}
}

// keepAlive renews the runs this engine works on, keeps their messages in
// progress, and drives again a run whose last attempt at it failed.
func (s *shard) keepAlive(runCtx context.Context) {
	ctx, cancel := opCtx()
	defer cancel()
	for _, rs := range s.runs {
		if !rs.owned {
			continue
		}
		s.renew(ctx, rs)
		if !rs.owned {
			continue
		}
		for _, m := range rs.held {
			_ = m.InProgress()
		}
		if len(rs.held) > 0 && len(rs.inflight) == 0 {
			err := s.load(ctx, rs)
			if err == nil {
				err = s.drive(ctx, runCtx, rs)
			}
			if err != nil {
				s.e.log.Warn().Str(fieldRunID, rs.id).Err(err).Msg("drive failed; will retry")
				s.abandon(rs)
			}
		}
		s.noteIdle(ctx, rs)
	}
}

// opCtx bounds one commit or load; it is not tied to shutdown, so that the
// commit in progress finishes.
func opCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 10*time.Second)
}

func (s *shard) state(runID string) *runState {
	rs := s.runs[runID]
	if rs == nil {
		rs = &runState{id: runID, inflight: map[string]bool{}, leases: map[string]lease{}, unclaimed: map[string]lease{}}
		s.runs[runID] = rs
	}
	rs.used = time.Now()
	return rs
}

func (s *shard) handle(runCtx context.Context, it item) {
	done, _ := it.work.(*outcome)
	if done != nil && done.counted {
		done.counted = false // a retry of the same outcome is not counted again
		defer s.e.running.Add(-1)
	}
	log := s.e.log.With().Str(fieldRunID, it.runID).Logger()
	rs := s.state(it.runID)
	ctx, cancel := opCtx()
	defer cancel()
	if it.msg() == nil && it.request() == nil {
		// An executor's outcome or a watched deadline of this engine's.
		if !rs.owned {
			return // this engine lost the run since: the new owner recovers the call
		}
	} else if err := s.acquire(ctx, rs); err != nil {
		s.busy(it, err)
		return
	}
	var err error
	for try := 0; try < 3; try++ {
		if err = s.load(ctx, rs); err == nil {
			err = s.handleOnce(runCtx, rs, it)
			if err == nil {
				// Whatever the item was, the run goes on from where it is:
				// driven once, here (it flushes).
				err = s.drive(ctx, runCtx, rs)
			}
		}
		if !errors.Is(err, ErrConflict) {
			break
		}
		log.Debug().Err(err).Msg("run extended elsewhere: reloading")
		s.abandon(rs)
	}
	if err != nil {
		log.Error().Err(err).Str("kind", it.work.kindName()).Msg("work failed; will retry")
		m := it.msg()
		held := m != nil && slices.Contains(rs.held, m)
		s.abandon(rs) // fold again next time
		if m != nil && !held {
			_ = m.NakWithDelay(time.Second)
		}
		if req := it.request(); req != nil {
			respond(req, events.ClaimReply{Reason: ReasonBusy})
		}
		if o := done; o != nil {
			// Not recorded: keep the outcome and try again.
			rs.inflight[fmt.Sprintf("%s/%d", o.callID, o.attempt)] = true
			time.AfterFunc(time.Second, func() { s.postCtx(runCtx, item{runID: rs.id, work: o}) })
		}
	}
	s.noteIdle(ctx, rs)
	s.evict()
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

// ReasonBusy answers a claim the engine could not decide now: try again.
const ReasonBusy = events.ReasonBusy

// busy gives an item back when another engine owns its run, or the owners
// bucket cannot be reached.
func (s *shard) busy(it item, err error) {
	if !errors.Is(err, ErrNotOwner) {
		s.e.log.Warn().Str(fieldRunID, it.runID).Err(err).Msg("cannot own the run; will retry")
	}
	var elsewhere ownedElsewhere
	in, _ := it.work.(*inboxMsg)
	switch {
	case in != nil && !in.forwarded && errors.As(err, &elsewhere) && s.e.forward(in.msg, elsewhere.owner):
		// The owner handles it.
	case in != nil:
		// Back soon: the owner may release the run in a moment.
		_ = in.msg.NakWithDelay(busyDelay(in.msg, s.e.cfg.AckWait))
	case it.request() != nil && !errors.Is(err, ErrNotOwner):
		respond(it.request(), events.ClaimReply{Reason: ReasonBusy})
	}
	// A claim or heartbeat of a run another engine owns is answered by it.
}

// load folds the run from the log when the cache is not current, and
// recovers it: executing calls that are not in progress here (a crash, a
// takeover) are decided by the recovery table before anything else touches
// the run. A claimed sandbox attempt may still run on its worker: its lease
// is watched for one period before it is decided.
func (s *shard) load(ctx context.Context, rs *runState) error {
	if rs.loaded {
		return nil
	}
	run, seq, err := s.e.events.load(ctx, rs.id)
	if err != nil {
		return err
	}
	rs.run, rs.seq = run, seq
	if aggregate.Next(run).Kind == aggregate.NextExecuting {
		caps := map[string]events.Capability{}
		exclude := map[string]bool{}
		b := run.OpenBatch()
		for _, c := range b.Calls {
			caps[c.ToolID] = s.e.capability(ctx, c.ToolID, c.Tool)
			if c.Phase != events.PhaseExecuting {
				continue
			}
			key := fmt.Sprintf("%s/%d", c.CallID, c.Attempt)
			switch {
			case rs.inflight[key]:
				exclude[c.CallID] = true // running here: its outcome comes
			case c.Claim != nil:
				exclude[c.CallID] = true
				if _, ok := rs.leases[c.CallID]; !ok {
					rs.leases[c.CallID] = lease{attempt: c.Attempt, token: c.Claim.Token, deadline: time.Now().Add(s.e.cfg.Lease)}
				}
				rs.inflight[key] = true
			}
		}
		after, evs, err := aggregate.Decide(run, aggregate.Recover{Capabilities: caps, Exclude: exclude, At: s.e.cfg.Now()})
		if err != nil {
			return fmt.Errorf("recover run %s: %w", rs.id, err)
		}
		if len(evs) > 0 {
			s.stage(rs, after, evs)
			if err := s.flush(ctx, rs); err != nil {
				return fmt.Errorf("recover run %s: %w", rs.id, err)
			}
			s.e.log.Info().Str(fieldRunID, rs.id).Msg("run recovered")
		}
	}
	rs.loaded = true
	return nil
}

// evict drops the least recently used idle runs beyond the cache size.
func (s *shard) evict() {
	trimOldest(s.runs, s.max, func(rs *runState) int64 { return rs.used.UnixNano() },
		func(rs *runState) bool { return !rs.owned && rs.quiescent() })
}

// decide runs a command and stages its events: they are applied to the
// cached run at once and appended to the log by the next flush, together
// with whatever else was staged since the last one. Every path that acts
// on the outside world (entering an executor, answering a claim,
// acknowledging a message) flushes first, so nothing is ever acted on
// before its events are durable; what is staged between two such actions
// (a call's completion and the next call's gate decision, say) becomes one
// commit instead of several.
func (s *shard) decide(ctx context.Context, rs *runState, cmd aggregate.Command) ([]events.Event, error) {
	run, evs, err := aggregate.Decide(rs.run, cmd)
	if err != nil || len(evs) == 0 {
		return nil, err
	}
	s.stage(rs, run, evs)
	return evs, nil
}

// decideNow decides and flushes at once.
func (s *shard) decideNow(ctx context.Context, rs *runState, cmd aggregate.Command) ([]events.Event, error) {
	evs, err := s.decide(ctx, rs, cmd)
	if err != nil {
		return nil, err
	}
	return evs, s.flush(ctx, rs)
}

// stage takes one decision: the run after its events becomes the cached
// run, and the events are kept for the next flush.
func (s *shard) stage(rs *runState, run *aggregate.Run, evs []events.Event) {
	rs.run = run
	rs.pending = append(rs.pending, evs)
}

// flush appends the staged decisions as one commit (several when together
// they exceed the server's message size; a decision is never split). A
// failed append abandons the staged decisions: the run is folded again
// from the log, and the messages held since the last flush are given back
// to be decided again.
func (s *shard) flush(ctx context.Context, rs *runState) error {
	for len(rs.pending) > 0 {
		n := len(rs.pending)
		var seq uint64
		var evs []events.Event
		var err error
		for {
			evs = slices.Concat(rs.pending[:n]...)
			seq, err = s.e.events.append(ctx, rs.id, rs.seq, evs)
			if n == 1 || !errors.Is(err, nats.ErrMaxPayload) {
				break
			}
			n = (n + 1) / 2 // nothing was sent: try fewer decisions
		}
		if err != nil {
			s.abandon(rs)
			return err
		}
		if s.e.log.GetLevel() <= zerolog.DebugLevel {
			for _, e := range evs {
				ev := s.e.log.Debug().Str(fieldRunID, rs.id).Uint64(fieldStreamSeq, seq)
				if b := rs.run.Batch; b != nil {
					ev = ev.Str(fieldBatchID, b.ID)
				}
				ev.Msg(events.Describe(e))
			}
		}
		rs.seq = seq
		rs.pending = rs.pending[n:]
	}
	rs.pending = nil
	rs.durableHeld = len(rs.held)
	return nil
}

// abandon forgets what is staged: the cached run is folded again from the
// log, and the messages held since the last flush, whose decisions were
// never recorded, come back to be decided again.
func (s *shard) abandon(rs *runState) {
	rs.pending = nil
	rs.loaded = false
	for _, m := range rs.held[rs.durableHeld:] {
		_ = m.NakWithDelay(100 * time.Millisecond)
	}
	rs.held = rs.held[:rs.durableHeld]
}

func (s *shard) handleOnce(runCtx context.Context, rs *runState, it item) error {
	ctx, cancel := opCtx()
	defer cancel()
	switch w := it.work.(type) {
	case *outcome:
		return s.onOutcome(ctx, runCtx, rs, w)
	case *claimReq:
		return s.onClaim(ctx, rs, w)
	case *heartbeatReq:
		return s.onHeartbeat(rs, w)
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

func isJSON(m jetstream.Msg) bool {
	return strings.HasPrefix(m.Headers().Get("Content-Type"), "application/json")
}

func (s *shard) onSubmit(ctx context.Context, rs *runState, in *inboxMsg) error {
	now := s.e.cfg.Now()
	sub, err := events.DecodeSubmit(in.msg.Data(), isJSON(in.msg), s.e.cfg.Limits)
	if err == nil && sub.RunID != rs.id {
		err = events.Refuse(events.CodeInvalidID, "body run_id %q differs from the subject's %q", sub.RunID, rs.id)
	}
	var cmd aggregate.Command
	if err != nil {
		rej := aggregate.Reject{Refusal: asRefusal(err), At: now}
		if sub != nil {
			rej.Step, rej.HasStep = sub.Step, true
		}
		cmd = rej
	} else {
		cat := s.e.cfg.Catalog
		calls := sub.Calls()
		tools := make([]events.Descriptor, len(calls))
		for i, c := range calls {
			d, ok := cat.Descriptor(c.ToolID)
			if !ok {
				d = events.Descriptor{Kind: events.KindUnknown}
			}
			tools[i] = d
		}
		cmd = aggregate.Submit{Submit: sub, Tools: tools, SnapshotID: cat.SnapshotID(),
			MaxPayload: int(s.e.nc.MaxPayload()), SubmissionBytes: len(in.msg.Data()), At: now}
	}
	evs, err := s.decide(ctx, rs, cmd)
	if err != nil {
		return err
	}
	if len(evs) == 1 {
		if ev, ok := evs[0].(*events.BatchRejected); ok {
			if err := s.flush(ctx, rs); err != nil {
				return err
			}
			s.e.log.Info().Str(fieldRunID, rs.id).Str(fieldBatchID, ev.BatchID).Str("code", string(ev.Code)).Str("reason", ev.Reason).Msg("submission rejected")
			return s.settle(rs, in.msg)
		}
	}
	rs.held = append(rs.held, in.msg)
	return nil // handle drives the run
}

// asRefusal returns err as a refusal: a decoding failure without a protocol
// code is undecodable.
func asRefusal(err error) *events.Refusal {
	var ref *events.Refusal
	if errors.As(err, &ref) {
		return ref
	}
	return events.Refuse(events.CodeUndecodable, "%v", err)
}

// ticketCapability is the live capability of the tool of the run's ticket
// that correlationID names (non_recoverable when it names none: the
// aggregate then refuses the command).
func (s *shard) ticketCapability(ctx context.Context, rs *runState, correlationID string) events.Capability {
	if c := rs.run.TicketCall(correlationID); c != nil {
		return s.e.capability(ctx, c.ToolID, c.Tool)
	}
	return events.CapNonRecoverable
}

func (s *shard) onResume(ctx context.Context, rs *runState, in *inboxMsg) error {
	res, err := events.DecodeResume(in.msg.Data(), isJSON(in.msg), s.e.cfg.Limits)
	if err == nil && in.principal != "" && !events.ValidRunID(in.principal) {
		err = events.Refuse(events.CodeInvalidID, "principal %q must match [A-Za-z0-9_-]{1,64}", in.principal)
	}
	if err != nil {
		return s.refuse(ctx, rs, in.msg, "", err)
	}
	_, err = s.decide(ctx, rs, aggregate.Resume{Resume: res, Principal: in.principal,
		Capability: s.ticketCapability(ctx, rs, res.CorrelationID), At: s.e.cfg.Now()})
	if err != nil {
		if _, refused := events.CodeOf(err); refused {
			return s.refuse(ctx, rs, in.msg, res.CorrelationID, err)
		}
		return err
	}
	rs.held = append(rs.held, in.msg)
	return nil // handle drives the run
}

func (s *shard) onControl(ctx context.Context, rs *runState, in *inboxMsg) error {
	c, err := events.DecodeControl(in.msg.Data(), isJSON(in.msg))
	if err != nil {
		return s.refuse(ctx, rs, in.msg, "", err)
	}
	now := s.e.cfg.Now()
	var cmd aggregate.Command
	switch c.Action {
	case events.ControlCancel:
		cmd = aggregate.End{Cause: events.EndCancelled, Reason: c.Reason, At: now}
	case events.ControlInterrupt:
		cmd = aggregate.End{Cause: events.EndInterrupted, Reason: c.Reason, At: now}
	default: // perform
		cmd = aggregate.Perform{CorrelationID: c.CorrelationID, Capability: s.ticketCapability(ctx, rs, c.CorrelationID), At: now}
	}
	if _, err := s.decide(ctx, rs, cmd); err != nil {
		if _, refused := events.CodeOf(err); refused {
			return s.refuse(ctx, rs, in.msg, c.CorrelationID, err)
		}
		return err
	}
	rs.held = append(rs.held, in.msg)
	return nil // handle drives the run
}

// refuse publishes a resume or control refusal on .refused; it changes
// nothing else. The message id makes a redelivered refusal harmless.
func (s *shard) refuse(ctx context.Context, rs *runState, m jetstream.Msg, correlationID string, err error) error {
	code, ok := events.CodeOf(err)
	reason := err.Error()
	var ref *events.Refusal
	if errors.As(err, &ref) {
		reason = ref.Reason
	}
	if !ok {
		code = events.CodeUndecodable
	}
	body, merr := events.Marshal(events.RefusedOut{CorrelationID: correlationID, Code: code, Reason: reason})
	if merr != nil {
		return merr
	}
	meta, merr := m.Metadata()
	if merr != nil {
		return merr
	}
	out := nats.NewMsg(s.e.names.Out(rs.id, "refused"))
	out.Data = body
	if _, perr := s.e.js.PublishMsg(ctx, out, jetstream.WithMsgID(fmt.Sprintf("refused/%d", meta.Sequence.Stream))); perr != nil {
		return perr
	}
	s.e.log.Info().Str(fieldRunID, rs.id).Str("code", string(code)).Str("reason", reason).Msg("refused")
	return s.settle(rs, m)
}

// onOutcome records an executor's outcome.
func (s *shard) onOutcome(ctx, runCtx context.Context, rs *runState, o *outcome) error {
	key := fmt.Sprintf("%s/%d", o.callID, o.attempt)
	if !rs.inflight[key] {
		return nil // the run was reloaded and recovered since: this outcome is stale
	}
	delete(rs.inflight, key)
	if u, ok := rs.unclaimed[o.callID]; ok && u.attempt == o.attempt {
		delete(rs.unclaimed, o.callID) // its dispatch failed
	}
	now := s.e.cfg.Now()
	var cmd aggregate.Command
	if o.awaiting {
		var deadline *time.Time
		if b := rs.run.OpenBatch(); b != nil {
			if c, _ := b.Call(o.callID); c != nil {
				deadline = s.e.waitDeadline(ctx, b.SnapshotID, c.ToolID, now)
			}
		}
		cmd = aggregate.DelegationAwait{CallID: o.callID, Attempt: o.attempt, CorrelationID: newID(), Deadline: deadline, At: now}
	} else if o.lost {
		b := rs.run.OpenBatch()
		if b == nil {
			return nil
		}
		c, _ := b.Call(o.callID)
		if c == nil {
			return nil
		}
		cmd = aggregate.LeaseExpired{CallID: o.callID, Attempt: o.attempt, Capability: s.e.capability(ctx, c.ToolID, c.Tool), At: now}
	} else {
		cmd = aggregate.Complete{CallID: o.callID, Attempt: o.attempt, Output: o.output, Error: o.err, Limits: s.e.outputLimits(), At: now}
	}
	if _, err := s.decide(ctx, rs, cmd); err != nil {
		if aggregate.IsDecision(err) {
			// The call moved on without this outcome (cancelled, say): it
			// is not applied.
			s.e.log.Info().Str(fieldRunID, rs.id).Str(fieldCallID, o.callID).Err(err).Msg("outcome not applied")
			return nil
		}
		return err // handle keeps the outcome and tries again
	}
	return nil
}

// outputLimits are the facts an outcome's size is decided by: the
// configured output limit, and half the server's message size for a
// batch's outputs together (the barrier's commit carries every one again).
func (e *Engine) outputLimits() aggregate.OutputLimits {
	return aggregate.OutputLimits{MaxOutputBytes: e.cfg.Limits.MaxOutputBytes, MaxBatchOutputBytes: int(e.nc.MaxPayload()) / 2}
}

// drive does what the run needs until it waits for an executor, a ticket
// or a new batch.
func (s *shard) drive(ctx, runCtx context.Context, rs *runState) error {
	for {
		w := aggregate.Next(rs.run)
		switch w.Kind {
		case aggregate.NextGate:
			if s.e.gateAsksOutside(ctx, rs.run) {
				// The external gate may take its time: record what is
				// decided before asking it.
				if err := s.flush(ctx, rs); err != nil {
					return err
				}
			}
			decisions, err := s.e.gateDecisions(ctx, rs.run, w.CallIDs)
			if err != nil {
				return err
			}
			if _, err := s.decide(ctx, rs, aggregate.Gate{Decisions: decisions, At: s.e.cfg.Now()}); err != nil {
				return err
			}
		case aggregate.NextParkClient:
			now := s.e.cfg.Now()
			park := aggregate.ParkClient{CallID: w.CallIDs[0], CorrelationID: newID(), At: now}
			if c, _ := rs.run.Batch.Call(w.CallIDs[0]); c != nil {
				park.Deadline = s.e.waitDeadline(ctx, rs.run.Batch.SnapshotID, c.ToolID, now)
			}
			if _, err := s.decide(ctx, rs, park); err != nil {
				return err
			}
		case aggregate.NextExecuting:
			if err := s.flush(ctx, rs); err != nil {
				return err
			}
			s.startExecutors(runCtx, rs, w.CallIDs)
			return nil
		default: // parked, finalized, ended or idle: quiescent
			if err := s.flush(ctx, rs); err != nil {
				return err
			}
			for _, m := range rs.held {
				if err := m.Ack(); err != nil {
					s.e.log.Warn().Str(fieldRunID, rs.id).Err(err).Msg("ack failed; the message will be redelivered and is harmless")
				}
			}
			rs.held, rs.durableHeld = nil, 0
			return nil
		}
	}
}

// startExecutors enters the executor of each executing call not already in
// flight here. Their CallExecuting is committed.
func (s *shard) startExecutors(runCtx context.Context, rs *runState, callIDs []string) {
	b := rs.run.OpenBatch()
	for _, id := range callIDs {
		c, _ := b.Call(id)
		key := fmt.Sprintf("%s/%d", id, c.Attempt)
		if rs.inflight[key] {
			continue
		}
		rs.inflight[key] = true
		if c.Tool.Target == events.TargetSandbox {
			rs.unclaimed[id] = lease{attempt: c.Attempt, deadline: time.Now().Add(s.e.dispatchDeadline(c.ToolID))}
		}
		inv := invocation{runID: rs.id, batchID: b.ID, callID: id, toolID: c.ToolID, arguments: c.Arguments,
			attempt: c.Attempt, operationID: b.OperationID(id), tool: c.Tool, input: c.Input, hasInput: c.HasInput}
		s.e.wg.Add(1)
		go func() {
			defer s.e.wg.Done()
			if inv.tool.Target == events.TargetSandbox {
				ctx, cancel := opCtx()
				defer cancel()
				if err := s.e.dispatch(ctx, inv); err != nil {
					// Not known to be queued: as good as never dispatched. A
					// worker that claims it anyway is refused, since the
					// attempt moves on.
					s.e.log.Warn().Str(fieldRunID, inv.runID).Str(fieldCallID, inv.callID).Err(err).Msg("dispatch failed")
					o := outcome{callID: inv.callID, attempt: inv.attempt,
						err: &events.ToolError{Kind: events.ErrorUnavailableBeforeDispatch, Message: "dispatch failed: " + err.Error()}}
					s.postCtx(runCtx, item{runID: inv.runID, work: &o})
				}
				return
			}
			s.e.running.Add(1)
			o := s.e.brain.invoke(runCtx, s.e.cfg.Catalog, inv)
			o.counted = true // the shard counts it done once it is recorded
			if !s.postCtx(runCtx, item{runID: inv.runID, work: &o}) {
				s.e.running.Add(-1)
			}
		}()
	}
}

// onTimer resolves a ticket whose deadline or due time came.
func (s *shard) onTimer(ctx, runCtx context.Context, rs *runState, in *inboxMsg) error {
	var f timerFire
	if err := events.Unmarshal(in.msg.Data(), &f); err != nil {
		s.e.log.Warn().Str(fieldRunID, rs.id).Err(err).Msg("undecodable timer: terminated")
		return in.msg.TermWithReason("undecodable timer: " + err.Error())
	}
	if f.Action == timerCancelChild {
		// Nothing of the run changes: the child's service is told, and the
		// fire is acknowledged once it has answered.
		s.e.cancelChild(runCtx, in.msg, DelegateRequest{Op: DelegateCancel, DelegationID: f.OperationID, RunID: rs.id,
			CallID: f.CallID, ToolID: f.ToolID, Attempt: f.Attempt})
		return nil
	}
	now := s.e.cfg.Now()
	var cmd aggregate.Command
	switch f.Action {
	case timerExpire:
		cmd = aggregate.Expire{CorrelationID: f.CorrelationID, At: now}
	case timerDispatchDeadline:
		// Scheduled by engines before deadlines were watched in memory.
		if err := s.onDispatchDeadline(ctx, rs, f.CallID, f.Attempt); err != nil {
			return err
		}
		return s.settle(rs, in.msg)
	case timerPerform:
		cmd = aggregate.Perform{CorrelationID: f.CorrelationID, Timer: true, Capability: s.ticketCapability(ctx, rs, f.CorrelationID), At: now}
	default:
		return in.msg.TermWithReason("unknown timer action " + f.Action)
	}
	_, err := s.decide(ctx, rs, cmd)
	switch {
	case errors.Is(err, aggregate.ErrNotDue):
		// Our clock is behind the server's: try again a little later.
		t := rs.run.Ticket()
		at := now.Add(time.Second)
		if t != nil && f.Action == timerExpire && t.Deadline != nil {
			at = *t.Deadline
		} else if t != nil && t.Due != nil {
			at = *t.Due
		}
		if err := s.e.schedule(ctx, rs.id, f, at); err != nil {
			return err
		}
		return s.settle(rs, in.msg)
	case err != nil:
		if _, refused := events.CodeOf(err); refused || errors.Is(err, aggregate.ErrRunEnded) {
			return s.settle(rs, in.msg) // resolved or ended before its time: nothing to do
		}
		return err
	}
	s.e.log.Info().Str(fieldRunID, rs.id).Str("action", f.Action).Str("correlation_id", f.CorrelationID).Msg("timer fired")
	rs.held = append(rs.held, in.msg)
	return nil // handle drives the run
}

// settle is done with a message that changed nothing: it is acknowledged
// when the run is quiescent here, and otherwise held with the run's other
// messages. So whenever a run has work in progress on this engine, one of
// its messages is unacknowledged, and a crash redelivers it to whichever
// engine takes the run over (a recovery at load, say, starts work that a
// refused message alone would not keep alive).
func (s *shard) settle(rs *runState, m jetstream.Msg) error {
	if rs.loaded && len(rs.pending) == 0 && len(rs.inflight) == 0 && len(rs.leases) == 0 {
		switch aggregate.Next(rs.run).Kind {
		case aggregate.NextNone, aggregate.NextAwaiting:
			return m.Ack()
		}
	}
	rs.held = append(rs.held, m)
	return nil
}
