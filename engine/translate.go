package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/aggregate"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/protocol"
	"github.com/toolbatch/toolbatch/tracing"
)

// Translation: each inbox message, timer fire and executor outcome becomes
// the aggregate command that carries its facts (the time, new ids, live
// capabilities, limits); what it means is the aggregate's decision.

func isJSON(m jetstream.Msg) bool {
	return strings.HasPrefix(m.Headers().Get("Content-Type"), "application/json")
}

func (s *shard) onSubmit(ctx context.Context, rs *runState, in *inboxMsg) error {
	now := s.e.cfg.Now()
	rs.client = clientOf(rs.id, in.principal)
	// only a well-formed context is kept (it is written into the log)
	rs.traceparent = tracing.Format(tracing.Parse(in.msg.Headers().Get(protocol.HeaderTraceParent)))
	sub, err := protocol.DecodeSubmit(in.msg.Data(), isJSON(in.msg), s.e.cfg.Limits)
	if err == nil && sub.RunID != rs.id {
		err = events.Refuse(events.CodeInvalidID, "body run_id %q differs from the subject's %q", sub.RunID, rs.id)
	}
	msgID, inboxSeq := origin(in.msg)
	var cmd aggregate.Command
	if err != nil {
		rej := aggregate.Reject{Refusal: asRefusal(err), MsgID: msgID, InboxSeq: inboxSeq, At: now}
		if sub != nil {
			rej.Step, rej.HasStep = sub.Step, true
		}
		cmd = rej
	} else {
		cat := s.e.cfg.Catalog
		calls := sub.Calls()
		tools := make([]events.Descriptor, len(calls))
		problems := make([]string, len(calls))
		for i, c := range calls {
			t, ok := cat.Tool(c.ToolID)
			tools[i] = t.Descriptor()
			if !ok {
				tools[i] = events.Descriptor{Kind: events.KindUnknown}
			} else if c.Arguments.IsObjectOrNull() {
				problems[i] = t.ArgumentProblem(c.Arguments)
			}
		}
		cmd = aggregate.Submit{Submission: sub.Submission(), Tools: tools, ArgumentProblems: problems, SnapshotID: cat.SnapshotID(),
			MaxPayload: int(s.e.nc.MaxPayload()), SubmissionBytes: len(in.msg.Data()), MsgID: msgID, InboxSeq: inboxSeq, At: now}
	}
	evs, err := s.decide(ctx, rs, cmd)
	if err != nil {
		return err
	}
	if rs.run.OpenBatch() == nil {
		s.e.clients.release(rs.id) // refused, or a repeat of a finalized batch: nothing in flight
	}
	if ev, ok := sole[*events.BatchRejected](evs); ok {
		if err := s.flush(ctx, rs); err != nil {
			return err
		}
		s.e.log.Info().Str(fieldRunID, rs.id).Str(fieldBatchID, ev.BatchID).Str("code", string(ev.Code)).Str("reason", ev.Reason).Msg("submission rejected")
		return s.settle(rs, in.msg)
	}
	rs.held = append(rs.held, in.msg)
	return nil // handle drives the run
}

// origin returns what names an inbox message to its publisher: its
// Nats-Msg-Id and its inbox stream sequence (0 when unknown).
func origin(m jetstream.Msg) (string, uint64) {
	var seq uint64
	if md, err := m.Metadata(); err == nil {
		seq = md.Sequence.Stream
	}
	return m.Headers().Get(jetstream.MsgIDHeader), seq
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
	res, err := protocol.DecodeResume(in.msg.Data(), isJSON(in.msg), s.e.cfg.Limits)
	if err == nil && in.principal != "" && !events.ValidRunID(in.principal) {
		err = events.Refuse(events.CodeInvalidID, "principal %q must match [A-Za-z0-9_-]{1,64}", in.principal)
	}
	if err != nil {
		return s.refuse(ctx, rs, in.msg, "", err)
	}
	_, err = s.decide(ctx, rs, aggregate.Resume{Answer: res.Answer(), Principal: in.principal,
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
	c, err := protocol.DecodeControl(in.msg.Data(), isJSON(in.msg))
	if err != nil {
		return s.refuse(ctx, rs, in.msg, "", err)
	}
	now := s.e.cfg.Now()
	var cmd aggregate.Command
	switch c.Action {
	case protocol.ControlCancel:
		cmd = aggregate.End{Cause: events.EndCancelled, Reason: c.Reason, At: now}
	case protocol.ControlInterrupt:
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
	body, merr := events.Marshal(protocol.RefusedOut{CorrelationID: correlationID, Code: code, Reason: reason})
	if merr != nil {
		return merr
	}
	meta, merr := m.Metadata()
	if merr != nil {
		return merr
	}
	out := nats.NewMsg(s.e.names.Out(rs.id, protocol.OutRefused))
	out.Data = body
	if _, perr := s.e.js.PublishMsg(ctx, out, jetstream.WithMsgID(protocol.RefusedMsgID(meta.Sequence.Stream))); perr != nil {
		return perr
	}
	s.e.log.Info().Str(fieldRunID, rs.id).Str("code", string(code)).Str("reason", reason).Msg("refused")
	return s.settle(rs, m)
}

// onTimer resolves a ticket whose deadline or due time came.
func (s *shard) onTimer(ctx, runCtx context.Context, rs *runState, in *inboxMsg) error {
	var f protocol.TimerFire
	if err := events.Unmarshal(in.msg.Data(), &f); err != nil {
		s.e.log.Warn().Str(fieldRunID, rs.id).Err(err).Msg("undecodable timer: terminated")
		return in.msg.TermWithReason("undecodable timer: " + err.Error())
	}
	if f.Action == protocol.TimerCancelChild {
		// Nothing of the run changes: the child's service is told, and the
		// fire is acknowledged once it has answered.
		s.e.cancelChild(runCtx, in.msg, protocol.DelegateRequest{Op: protocol.DelegateCancel, DelegationID: f.OperationID, RunID: rs.id,
			CallID: f.CallID, ToolID: f.ToolID, Attempt: f.Attempt})
		return nil
	}
	now := s.e.cfg.Now()
	var cmd aggregate.Command
	switch f.Action {
	case protocol.TimerExpire:
		cmd = aggregate.Expire{CorrelationID: f.CorrelationID, At: now}
	case protocol.TimerDispatchDeadline:
		// Scheduled by engines before deadlines were watched in memory.
		if err := s.onDispatchDeadline(ctx, rs, f.CallID, f.Attempt); err != nil {
			return err
		}
		return s.settle(rs, in.msg)
	case protocol.TimerPerform:
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
		if t != nil && f.Action == protocol.TimerExpire && t.Deadline != nil {
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
