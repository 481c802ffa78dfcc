package engine

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/protocol"
)

// DefaultDelegateTimeout bounds one request to a delegation service.
const DefaultDelegateTimeout = 60 * time.Second

// delegate starts a call's child, or resumes it with its input.
func (b *brainExecutor) delegate(ctx context.Context, inv invocation) outcome {
	o := outcome{callID: inv.callID, attempt: inv.attempt}
	req := protocol.DelegateRequest{Op: protocol.DelegateStart, DelegationID: inv.operationID, RunID: inv.runID, CallID: inv.callID,
		ToolID: inv.toolID, Arguments: inv.arguments, Attempt: inv.attempt}
	if inv.hasInput {
		req.Op, req.Input, req.Arguments = protocol.DelegateResume, inv.input, nil
	}
	reply, err := b.request(ctx, b.names.Delegate(inv.toolID), req)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		o.err = &events.ToolError{Kind: events.ErrorUnavailableBeforeDispatch, Message: "no delegation service answers " + b.names.Delegate(inv.toolID)}
		return o
	case err != nil:
		o.lost = true // the request may have reached the child: recovery decides
		return o
	}
	switch reply.Status {
	case protocol.DelegationEnded:
		out := events.TextOutput(inv.callID, reply.Text)
		o.output = &out
	case protocol.DelegationAwaiting:
		o.awaiting = true
	case protocol.DelegationError:
		if reply.Retryable {
			o.lost = true
		} else {
			o.err = &events.ToolError{Kind: events.ErrorExecution, Message: reply.Message}
		}
	default:
		o.err = &events.ToolError{Kind: events.ErrorExecution, Message: "malformed reply from the delegation service: status " + reply.Status}
	}
	return o
}

func (b *brainExecutor) request(ctx context.Context, subject string, req protocol.DelegateRequest) (protocol.DelegateReply, error) {
	var reply protocol.DelegateReply
	body, err := events.Marshal(req)
	if err != nil {
		return reply, err
	}
	rctx, cancel := context.WithTimeout(ctx, DefaultDelegateTimeout)
	defer cancel()
	msg, err := b.nc.RequestWithContext(rctx, subject, body)
	if err != nil {
		return reply, err
	}
	if err := events.Unmarshal(msg.Data, &reply); err != nil {
		return protocol.DelegateReply{Status: "malformed"}, nil
	}
	return reply, nil
}

// cancelChild sends a delegated child's service the cancel a fire asks
// for, in the background, and acknowledges the fire once the service has
// answered with anything but an error. Otherwise (no reply, an error, this
// engine stopping) the fire is given back, to this engine or another, after
// a delay that doubles with every delivery from 100 ms to 10 s.
func (e *Engine) cancelChild(ctx context.Context, m jetstream.Msg, req protocol.DelegateRequest) {
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		// Answered well within the fire's ack wait, or given back.
		rctx, cancel := context.WithTimeout(ctx, max(e.cfg.InboxAckWait/2, time.Second))
		reply, err := e.brain.request(rctx, e.names.Delegate(req.ToolID), req)
		cancel()
		log := e.log.With().Str(fieldRunID, req.RunID).Str(fieldCallID, req.CallID).Logger()
		if err == nil && reply.Status != protocol.DelegationError {
			log.Info().Str("status", reply.Status).Msg("child cancelled")
			_ = m.Ack()
			return
		}
		n := uint64(1)
		if meta, merr := m.Metadata(); merr == nil {
			n = max(meta.NumDelivered, 1)
		}
		delay := min(100*time.Millisecond<<min(n-1, 7), 10*time.Second)
		log.Warn().Err(err).Str("status", reply.Status).Str("message", reply.Message).Dur("retry_in", delay).Msg("child not cancelled yet")
		_ = m.NakWithDelay(delay)
	}()
}
