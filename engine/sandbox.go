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

	"github.com/toolbatch/toolbatch/access"
	"github.com/toolbatch/toolbatch/aggregate"
	"github.com/toolbatch/toolbatch/catalog"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/protocol"
)

// Sandbox calls run on sandbox workers. The engine's side, in order:
//
//  1. When a sandbox call's CallExecuting is committed, publish its dispatch
//     on <prefix>.dispatch.<pool>.<tool_id> (message id
//     <operation_id>/<attempt>) and watch its dispatch deadline. The
//     deadline is watched in memory, like a lease: while the attempt is
//     unclaimed the run holds an unacknowledged inbox message, so after a
//     crash the run is taken over and its unclaimed attempt dispatched again
//     by the recovery table, with a new deadline. (A stored timer per
//     dispatch would cost a write per call and a delivery long after most
//     calls are done.)
//  2. A worker asks for the attempt on <prefix>.api.claim. The engine
//     decides the claim, commits CallClaimed (the dispatch boundary), and
//     only then answers with a claim token and a lease. A second claim of
//     the same attempt (a redelivered or duplicated dispatch) is refused
//     (protocol.ReasonClaimed), unless it comes from the same worker
//     process (its first answer was lost): its grant is answered again.
//  3. The worker heartbeats on <prefix>.api.heartbeat while the tool runs;
//     each heartbeat renews the lease. A lease that runs out is decided by
//     the recovery table (LeaseExpired). After a restart the engine waits
//     one lease period for heartbeats before it decides.
//  4. The worker asks the engine to record the outcome on
//     <prefix>.api.result with its claim token; the reply comes once the
//     result is decided and committed. A result whose token is not the
//     call's current claim is refused (fencing), recorded as
//     ResultRefused, and never applied. The request may offer the
//     attempt's slot to the run's next call (chain): when that call's
//     CallExecuting follows in the same drive, on a tool the worker
//     offered, the engine decides the worker's claim of it, commits it with
//     the result, and grants it in the reply; no dispatch notice or claim
//     request is sent for it. A worker that no engine answers publishes the
//     outcome on <prefix>.result.<run_id> in the inbox instead, where the
//     run's owner takes it.
//  5. No claim before the dispatch deadline: the call completes (or is
//     retried, within max_attempts) with unavailable_before_dispatch.
//
// Workers advertise the tools they serve, with each tool's recovery
// capability, in the workers bucket: key sandbox.<pool>.<tool_id>.<worker_id>,
// value the capability, kept alive by the worker (the bucket forgets a key
// WorkerTTL after its last write).

// Sandbox defaults.
const (
	DefaultLease = 10 * time.Second
	// WorkerTTL is how long a worker's advertisement lives without renewal.
	WorkerTTL = 30 * time.Second
)

// lease is what the engine knows of a claimed attempt's owner.
type lease struct {
	attempt  int
	token    string
	deadline time.Time
}

// dispatch publishes a sandbox attempt's job.
func (e *Engine) dispatch(ctx context.Context, inv invocation) error {
	body, err := events.Marshal(protocol.Dispatch{BatchID: inv.batchID, RunID: inv.runID, CallID: inv.callID, ToolID: inv.toolID,
		Attempt: inv.attempt, OperationID: inv.operationID}) // a notice: the claim reply carries the arguments
	if err != nil {
		return err
	}
	msg := nats.NewMsg(e.names.Dispatch(poolOf(inv.tool), inv.toolID))
	msg.Data = body
	if inv.traceparent != "" {
		msg.Header.Set(protocol.HeaderTraceParent, inv.traceparent)
	}
	msg.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("%s/%d", inv.operationID, inv.attempt))
	if _, err := publishAcked(ctx, e.nc, msg); err != nil {
		return fmt.Errorf("dispatch %s attempt %d: %w", inv.operationID, inv.attempt, err)
	}
	return nil
}

// poolOf is the pool of a sandbox tool's descriptor (the catalog's
// default when a descriptor pinned before pools names none).
func poolOf(d events.Descriptor) string {
	if d.Pool == "" {
		return catalog.DefaultPool
	}
	return d.Pool
}

// dispatchUntil publishes an attempt's job, retrying (under the same
// message id, so a publish that did land is not doubled) through a
// server's passing failure, such as a leader election, until it lands or
// the attempt's dispatch deadline passes: then the deadline's watch
// completes the attempt unavailable_before_dispatch, as for an attempt
// nobody claimed. A failed publish spends no attempt by itself.
func (e *Engine) dispatchUntil(runCtx context.Context, inv invocation, deadline time.Duration) {
	ctx, cancel := context.WithTimeout(runCtx, deadline)
	defer cancel()
	_, err := retrying(ctx, 5*time.Second, func(ctx context.Context) (struct{}, error) { return struct{}{}, e.dispatch(ctx, inv) }, func(err error) {
		e.log.Warn().Str(fieldRunID, inv.runID).Str(fieldCallID, inv.callID).Err(err).Str(protocol.FieldMeaning, protocol.Meaning(err)).Msg("dispatch failed; retrying until its dispatch deadline")
	})
	if err != nil && ctx.Err() == nil {
		// Refused for good: the deadline's watch decides the attempt.
		e.log.Error().Str(fieldRunID, inv.runID).Str(fieldCallID, inv.callID).Err(err).Msg("dispatch refused")
	}
}

// dispatchDeadline is how long a sandbox tool's attempt may wait for a
// claim.
func (e *Engine) dispatchDeadline(toolID string) time.Duration {
	if t, ok := e.cfg.Catalog.Tool(toolID); ok && t.DispatchDeadline > 0 {
		return t.DispatchDeadline
	}
	return DefaultDispatchDeadline
}

// onDispatchDeadline completes an attempt no worker claimed in time
// (unavailable_before_dispatch: nothing ran); the aggregate retries it
// while attempts remain. An attempt claimed or moved on meanwhile is left
// alone.
func (s *shard) onDispatchDeadline(ctx context.Context, rs *runState, callID string, attempt int) error {
	msg := "no worker claimed it before its dispatch deadline"
	if b := rs.run.OpenBatch(); b != nil {
		if c, _ := b.Call(callID); c != nil {
			msg = fmt.Sprintf("no worker of pool %s claimed it within its dispatch deadline (%s): is a worker serving tool %s running?",
				poolOf(c.Tool), s.e.dispatchDeadline(c.ToolID), c.ToolID)
		}
	}
	_, err := s.decide(ctx, rs, aggregate.Complete{CallID: callID, Attempt: attempt, At: s.e.cfg.Now(),
		Error: &events.ToolError{Kind: events.ErrorUnavailableBeforeDispatch, Message: msg}})
	if aggregate.IsDecision(err) {
		return nil // claimed, or moved on: nothing to do
	}
	if err != nil {
		return err
	}
	delete(rs.inflight, fmt.Sprintf("%s/%d", callID, attempt))
	return nil // handle drives the run
}

// DefaultDispatchDeadline is how long a sandbox attempt may wait for a
// worker's claim when the catalog names no deadline.
const DefaultDispatchDeadline = 30 * time.Second

// serveWorkers answers claims and heartbeats: each is routed to its run's
// shard, so that it is decided in order with the run's other work.
func (e *Engine) serveWorkers() ([]*nats.Subscription, error) {
	var subs []*nats.Subscription
	for _, api := range []struct {
		subject string
		decode  func(*nats.Msg) (work, string, error)
	}{{e.names.Claim(), decodeClaim}, {e.names.Heartbeat(), decodeHeartbeat}, {e.names.ResultRequest(), decodeResultReq}} {
		// Every engine receives every request; only the run's owner answers.
		sub, err := e.nc.Subscribe(api.subject, func(m *nats.Msg) {
			w, op, err := api.decode(m)
			runID, _, _, ok := splitOperationID(op)
			if err != nil || !ok {
				respond(m, protocol.ClaimReply{Reason: fmt.Sprintf("undecodable %s request", w.kindName())})
				return
			}
			// Never block the subscription behind a full shard: a request
			// that cannot be queued is answered busy at once (the worker
			// gives the job back, or heartbeats again), so the
			// subscription keeps up with any flood. Only the run's owner
			// says so: another engine may be about to answer.
			if !e.shardOf(runID).tryPost(item{runID: runID, work: w}) && e.ownsRun(runID) {
				respond(m, protocol.ClaimReply{Reason: protocol.ReasonBusy})
			}
		})
		if err != nil {
			return nil, err
		}
		subs = append(subs, sub)
	}
	return subs, nil
}

// ownsRun reports whether the owners bucket names this engine as the
// run's owner. It waits briefly: it runs in the request's callback.
func (e *Engine) ownsRun(runID string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 250*time.Millisecond)
	defer cancel()
	owner, _ := e.readOwner(ctx, protocol.OwnerKey(runID))
	return owner == e.id
}

// decodeClaim and decodeHeartbeat decode a worker's request into its work
// item, once, and return the operation id that names its run.
func decodeClaim(m *nats.Msg) (work, string, error) {
	cr := &claimReq{req: m}
	err := events.Unmarshal(m.Data, &cr.body)
	return cr, cr.body.OperationID, err
}

func decodeHeartbeat(m *nats.Msg) (work, string, error) {
	hr := &heartbeatReq{req: m}
	err := events.Unmarshal(m.Data, &hr.body)
	return hr, hr.body.OperationID, err
}

// decodeResultReq decodes a result request. One whose outcome does not
// decode still names its attempt (resultHead): it is routed, and the
// shard completes the call with that error (decodeResult, which decodes
// the result again with the engine's limits).
func decodeResultReq(m *nats.Msg) (work, string, error) {
	rr := &resultReq{req: m}
	if err := events.Unmarshal(m.Data, &rr.body); err != nil {
		var head resultHead
		if herr := events.Unmarshal(m.Data, &head); herr != nil {
			return rr, "", err
		}
		rr.body = protocol.ResultRequest{Result: protocol.Result{OperationID: head.OperationID, Attempt: head.Attempt, ClaimToken: head.ClaimToken}}
	}
	return rr, rr.body.OperationID, nil
}

// respond answers a worker's request (r a protocol.ClaimReply or
// ResultReply) on its reply inbox, and nowhere else: a request naming a
// stream's subject as its reply would otherwise have the engine, which may
// write every stream, publish into it. (A ClaimReply that only says busy
// reads as a ResultReply that recorded nothing: both name it "reason".)
func respond(m *nats.Msg, r any) {
	if !access.IsInbox(m.Reply) {
		return
	}
	body, err := events.Marshal(r)
	if err == nil {
		_ = m.Respond(body)
	}
}

// splitOperationID splits <run_id>/<step>/<call_id>.
func splitOperationID(op string) (runID, batchID, callID string, ok bool) {
	parts := strings.Split(op, "/")
	if len(parts) != 3 || !events.ValidRunID(parts[0]) || !events.ValidCallID(parts[2]) {
		return "", "", "", false
	}
	return parts[0], parts[0] + "/" + parts[1], parts[2], true
}

// onClaim grants an attempt to a worker, after CallClaimed is committed.
func (s *shard) onClaim(ctx context.Context, rs *runState, cr *claimReq) error {
	req := cr.body
	_, batchID, callID, _ := splitOperationID(req.OperationID)
	if b := rs.run.OpenBatch(); b == nil || b.ID != batchID {
		respond(cr.req, protocol.ClaimReply{Reason: "the batch is not open"})
		return nil
	}
	if err := s.e.claimerMayRun(cr.req.Reply, rs, callID); err != nil {
		respond(cr.req, protocol.ClaimReply{Reason: err.Error()})
		return nil
	}
	leaseMS := s.e.cfg.Lease.Milliseconds()
	_, err := s.decideNow(ctx, rs, aggregate.Claim{CallID: callID, Attempt: req.Attempt, WorkerID: req.WorkerID,
		Incarnation: req.Incarnation, Token: newID(), LeaseMS: leaseMS, At: s.e.cfg.Now()})
	if err != nil && !aggregate.IsDecision(err) {
		return err // answered busy: the worker gives the job back
	}
	if errors.Is(err, aggregate.ErrAlreadyClaimed) {
		respond(cr.req, protocol.ClaimReply{Reason: protocol.ReasonClaimed})
		return nil
	}
	if err != nil {
		respond(cr.req, protocol.ClaimReply{Reason: err.Error()})
		return nil
	}
	respond(cr.req, s.grant(rs, callID))
	return nil
}

// grant is the reply that hands a claimed attempt to its worker, as the
// log holds the claim (new, or the one this worker process asks for
// again); from now on the attempt's lease is watched here.
func (s *shard) grant(rs *runState, callID string) protocol.ClaimReply {
	b := rs.run.OpenBatch()
	c, _ := b.Call(callID)
	rs.leases[callID] = lease{attempt: c.Claim.Attempt, token: c.Claim.Token, deadline: time.Now().Add(s.e.cfg.Lease)}
	delete(rs.unclaimed, callID)
	return protocol.ClaimReply{Granted: true, ClaimToken: c.Claim.Token, LeaseMS: s.e.cfg.Lease.Milliseconds(),
		TraceParent: rs.batchSpan.Attempt(callID, c.Claim.Attempt),
		Job: &protocol.Dispatch{BatchID: b.ID, RunID: rs.id, CallID: callID, ToolID: c.ToolID, Arguments: c.Arguments,
			Attempt: c.Claim.Attempt, OperationID: b.OperationID(callID)}}
}

// claimerMayRun refuses a claim from a worker that does not serve the
// call's pool, when the engine knows the workers' users (Config.WorkerPools):
// the claimer is the user whose inbox the grant would reach.
func (e *Engine) claimerMayRun(reply string, rs *runState, callID string) error {
	if e.cfg.WorkerPools == nil {
		return nil
	}
	c, _ := rs.run.OpenBatch().Call(callID)
	if c == nil {
		return nil // the aggregate refuses it
	}
	pool := poolOf(c.Tool)
	nkey, ok := access.InboxOwner(reply)
	if !ok || !slices.Contains(e.cfg.WorkerPools(nkey), pool) {
		return fmt.Errorf("the claimer is not a worker of pool %s", pool)
	}
	return nil
}

// onHeartbeat renews the lease of a current claim.
func (s *shard) onHeartbeat(rs *runState, hr *heartbeatReq) error {
	hb := hr.body
	_, batchID, callID, _ := splitOperationID(hb.OperationID)
	if err := rs.run.CheckHeartbeat(batchID, callID, hb.Attempt, hb.ClaimToken); err != nil {
		respond(hr.req, protocol.ClaimReply{Reason: "the claim is not current"})
		return nil
	}
	rs.leases[callID] = lease{attempt: hb.Attempt, token: hb.ClaimToken, deadline: time.Now().Add(s.e.cfg.Lease)}
	respond(hr.req, protocol.ClaimReply{Granted: true, ClaimToken: hb.ClaimToken, LeaseMS: s.e.cfg.Lease.Milliseconds()})
	return nil
}

// onResult applies a worker's result from the inbox, or records it as
// refused.
func (s *shard) onResult(ctx context.Context, rs *runState, in *inboxMsg) error {
	res, err := s.e.decodeResult(in.msg.Data())
	if err != nil {
		s.e.log.Warn().Str(fieldRunID, rs.id).Err(err).Msg("undecodable result: terminated")
		return in.msg.TermWithReason("undecodable result: " + err.Error())
	}
	runID, _, _, ok := splitOperationID(res.OperationID)
	if !ok {
		return in.msg.TermWithReason("result with a bad operation id " + res.OperationID)
	}
	if rs.answered[resultID(res)] {
		return s.settle(rs, in.msg) // recorded when asked on api.result
	}
	if runID != rs.id {
		s.e.log.Warn().Str(fieldRunID, rs.id).Str("operation_id", res.OperationID).Msg("result names another run: terminated")
		return in.msg.TermWithReason("result for operation " + res.OperationID + " published on run " + rs.id + "'s subject")
	}
	refused, err := s.takeResult(ctx, rs, res)
	if err != nil {
		return err // not recorded: the message comes back
	}
	if refused != "" {
		return s.settle(rs, in.msg)
	}
	rs.held = append(rs.held, in.msg)
	return nil // handle drives the run
}

// resultID names a result: its attempt and claim.
func resultID(r *protocol.Result) string {
	return fmt.Sprintf("%s/%d/%s", r.OperationID, r.Attempt, r.ClaimToken)
}

// onResultReq decides a worker's result asked on <prefix>.api.result; the
// reply (handle sends it after the drive, so that the result and whatever
// the drive decided with it are committed) says it is recorded, and grants
// the run's next call when the worker offered to take it (chain) or was
// granted a call of this run it may not have heard of.
func (s *shard) onResultReq(ctx context.Context, rs *runState, rr *resultReq) error {
	res, err := s.e.decodeResult(rr.req.Data)
	if err != nil {
		rr.reply = protocol.ResultReply{Reason: "undecodable result: " + err.Error()}
		return nil
	}
	rr.id = resultID(res)
	if rs.answered[rr.id] {
		// Asked again after its answer was lost: recorded, and the grant
		// that answer carried comes again (the worker runs an attempt once
		// however many times it hears of it).
		rr.reply = protocol.ResultReply{Recorded: true, Next: s.regrant(rs, rr)}
		return nil
	}
	refused, err := s.takeResult(ctx, rs, res)
	if err != nil {
		return err // not recorded: answered busy, the worker asks again
	}
	rr.reply = protocol.ResultReply{Recorded: true, Refused: refused}
	if refused != "" {
		// Asked again of an engine that took the run over from the one
		// that recorded it (and granted the next call with it, say): the
		// grant comes again.
		rr.reply.Next = s.regrant(rs, rr)
		return nil
	}
	if rr.body.NextPool != "" && len(rr.body.NextTools) > 0 {
		rs.offer = rr
	}
	return nil // handle drives the run
}

// decodeResult decodes a worker's result with the engine's limits. A
// result that names its attempt but whose outcome is malformed (an invalid
// staged command, an oversized output) completes the call with an error
// output, as a brain tool's would; one that names nothing is an error.
func (e *Engine) decodeResult(body []byte) (*protocol.Result, error) {
	res, err := protocol.DecodeResult(body, e.cfg.Limits)
	if err == nil {
		return res, nil
	}
	var head resultHead
	if herr := events.Unmarshal(body, &head); herr != nil || head.OperationID == "" {
		return nil, err
	}
	return &protocol.Result{OperationID: head.OperationID, Attempt: head.Attempt, ClaimToken: head.ClaimToken,
		Error: &events.ToolError{Kind: events.ErrorExecution, Message: "malformed result from the worker: " + err.Error()}}, nil
}

// takeResult decides a result of the run: applied (the attempt's lease
// and flight end here; handle drives the run) or refused, with why (the
// refusal, when it is recorded, is flushed). An error is no decision:
// nothing was recorded.
func (s *shard) takeResult(ctx context.Context, rs *runState, res *protocol.Result) (string, error) {
	_, batchID, callID, _ := splitOperationID(res.OperationID)
	evs, err := s.decide(ctx, rs, aggregate.Result{BatchID: batchID, Complete: aggregate.Complete{CallID: callID, Attempt: res.Attempt,
		ClaimToken: res.ClaimToken, Output: res.Output, Error: res.Error, Limits: s.e.outputLimits(), At: s.e.cfg.Now()}})
	if err != nil && !aggregate.IsDecision(err) {
		return "", err
	}
	var refused string
	if err != nil {
		refused = err.Error() // another batch's, or a call that is gone
	} else if ref, ok := sole[*events.ResultRefused](evs); ok {
		refused = ref.Reason // fencing: recorded as refused, never applied
	}
	if refused != "" {
		if err := s.flush(ctx, rs); err != nil {
			return "", err
		}
		s.e.log.Info().Str(fieldRunID, rs.id).Str(fieldCallID, callID).Str("reason", refused).Msg("result refused")
		return refused, nil
	}
	delete(rs.leases, callID)
	delete(rs.inflight, fmt.Sprintf("%s/%d", callID, res.Attempt))
	return "", nil
}

// chain claims for the worker of the result request being handled, when
// it offered its slot, the first of the run's executing calls that no
// executor has entered here and that runs in the offered pool on an
// offered tool. The claim is staged with the result, so the drive's flush
// commits both; it is decided as any claim (a call the aggregate will not
// let it claim is dispatched as usual). It returns the request, with the
// call it claimed, or nil.
func (s *shard) chain(ctx context.Context, rs *runState, callIDs []string) (*resultReq, error) {
	rr := rs.offer
	rs.offer = nil
	if rr == nil {
		return nil, nil
	}
	b := rs.run.OpenBatch()
	for _, id := range callIDs {
		c, _ := b.Call(id)
		if c == nil || c.Tool.Target != events.TargetSandbox || rs.inflight[fmt.Sprintf("%s/%d", id, c.Attempt)] ||
			poolOf(c.Tool) != rr.body.NextPool || !slices.Contains(rr.body.NextTools, c.ToolID) {
			continue
		}
		if s.e.claimerMayRun(rr.req.Reply, rs, id) != nil {
			return nil, nil
		}
		_, err := s.decide(ctx, rs, aggregate.Claim{CallID: id, Attempt: c.Attempt, WorkerID: rr.body.WorkerID,
			Incarnation: rr.body.Incarnation, Token: newID(), LeaseMS: s.e.cfg.Lease.Milliseconds(), At: s.e.cfg.Now()})
		if aggregate.IsDecision(err) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		rr.chained = id
		return rr, nil
	}
	return nil, nil
}

// answerNow answers the result request being handled before the drive
// goes on, when what follows may take its time (an external gate): the
// result is committed, and no call is granted with it.
func (s *shard) answerNow(rs *runState) {
	if rr := rs.offer; rr != nil {
		rs.offer = nil
		s.answer(rs, rr)
	}
}

// answer sends a result request's reply, once what it says is committed,
// and remembers the result it recorded.
func (s *shard) answer(rs *runState, rr *resultReq) {
	respond(rr.req, rr.reply)
	rr.answered = true
	if !rr.reply.Recorded || rr.reply.Refused != "" {
		return
	}
	if rs.answered == nil || len(rs.answered) >= maxAnswered {
		rs.answered = map[string]bool{} // older ones: refused if they come again
	}
	rs.answered[rr.id] = true
}

// maxAnswered bounds the results remembered per run.
const maxAnswered = 64

// granted hands a call chain claimed, now committed, to its worker: the
// grant goes in the result request's reply, and the call is in flight
// here (no dispatch notice is sent for it).
func (s *shard) granted(rs *runState, rr *resultReq) {
	c, _ := rs.run.OpenBatch().Call(rr.chained)
	rs.inflight[fmt.Sprintf("%s/%d", rr.chained, c.Attempt)] = true
	g := s.grant(rs, rr.chained)
	rr.reply.Next = &g
}

// regrant is the grant of a call of the run's open batch whose current
// claim the requesting worker process holds, or nil.
func (s *shard) regrant(rs *runState, rr *resultReq) *protocol.ClaimReply {
	b := rs.run.OpenBatch()
	if b == nil || rr.body.Incarnation == "" {
		return nil
	}
	for id, l := range rs.leases {
		c, _ := b.Call(id)
		if c != nil && c.Claim != nil && c.Claim.Token == l.token && c.Claim.WorkerID == rr.body.WorkerID &&
			c.Claim.Incarnation == rr.body.Incarnation && s.e.claimerMayRun(rr.req.Reply, rs, id) == nil {
			g := s.grant(rs, id)
			return &g
		}
	}
	return nil
}

// checkLeases decides the attempts whose lease or dispatch deadline ran
// out, while this engine's connection works (liveness.connected).
func (s *shard) checkLeases() {
	now := time.Now()
	up, since := s.e.liveness.connected()
	if !up || now.Before(since.Add(s.e.cfg.Lease)) {
		return // what could not reach this engine is not held against a worker
	}
	for _, rs := range s.runs {
		for callID, u := range rs.unclaimed {
			if now.Before(u.deadline) {
				continue
			}
			delete(rs.unclaimed, callID)
			s.handle(s.runCtx, item{runID: rs.id, work: &unclaimedExpiry{callID: callID, attempt: u.attempt}})
		}
		for callID, l := range rs.leases {
			if now.Before(l.deadline) || !rs.loaded {
				continue
			}
			delete(rs.leases, callID)
			s.handle(s.runCtx, item{runID: rs.id, work: &leaseExpiry{callID: callID, lease: l}})
		}
	}
}

// resultHead is what names a worker's result: its attempt and claim.
type resultHead struct {
	OperationID string `msgpack:"operation_id"`
	Attempt     int    `msgpack:"attempt"`
	ClaimToken  string `msgpack:"claim_token"`
}

// resultWaits reports whether a worker's result for the attempt is stored
// in the inbox above the intake consumer's acknowledgement floor: not yet
// taken, or taken after a message still unacknowledged (the inbox keeps
// what was taken until a trim). An error is no answer.
func (e *Engine) resultWaits(ctx context.Context, runID, operationID string, attempt int) (bool, error) {
	intake, err := e.js.Consumer(ctx, e.names.InboxStream(), protocol.ConsumerEngine)
	if err != nil {
		return false, err
	}
	subject := e.names.Result(runID)
	for seq := intake.CachedInfo().AckFloor.Stream + 1; ; {
		m, err := e.inbox.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		var head resultHead
		if events.Unmarshal(m.Data, &head) == nil && head.OperationID == operationID && head.Attempt == attempt {
			return true, nil
		}
		seq = m.Sequence + 1
	}
}

type unclaimedExpiry struct {
	callID  string
	attempt int
}

type leaseExpiry struct {
	callID string
	lease  lease
}

func (s *shard) onLeaseExpired(ctx context.Context, rs *runState, le *leaseExpiry) error {
	b := rs.run.OpenBatch()
	if b == nil {
		return nil
	}
	c, _ := b.Call(le.callID)
	if c == nil {
		return nil
	}
	if waits, err := s.e.resultWaits(ctx, rs.id, b.OperationID(le.callID), le.lease.attempt); waits || err != nil {
		// The worker answered: its result is stored above the intake's
		// floor, most likely not yet taken (its delivery is late, a
		// consumer's leader election, say), or the inbox cannot tell now.
		// Not a lost worker: watch it a while more.
		s.e.log.Info().Str(fieldRunID, rs.id).Str(fieldCallID, le.callID).AnErr("inbox", err).Msg("lease ran out with the result on its way: waiting for it")
		le.lease.deadline = time.Now().Add(s.e.cfg.Lease)
		rs.leases[le.callID] = le.lease
		return nil
	}
	_, err := s.decideNow(ctx, rs, aggregate.LeaseExpired{CallID: le.callID, Attempt: le.lease.attempt, ClaimToken: le.lease.token,
		Capability: s.e.capability(ctx, c.ToolID, c.Tool), At: s.e.cfg.Now()})
	if err != nil && !aggregate.IsDecision(err) {
		// Not recorded: watch the lease again and decide it soon.
		le.lease.deadline = time.Now().Add(time.Second)
		rs.leases[le.callID] = le.lease
		return err
	}
	delete(rs.inflight, fmt.Sprintf("%s/%d", le.callID, le.lease.attempt))
	if err != nil {
		return nil // the attempt moved on (a result arrived first)
	}
	s.e.log.Info().Str(fieldRunID, rs.id).Str(fieldCallID, le.callID).Msg("lease expired")
	return nil // handle drives the run
}
