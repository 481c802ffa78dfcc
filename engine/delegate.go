package engine

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/events"
)

// Delegation operations on <prefix>.delegate.<tool_id>.
const (
	DelegateStart  = "start"
	DelegateResume = "resume"
	DelegateCancel = "cancel"
)

// DelegateRequest asks a delegation service to start, resume or cancel the
// child run of a call. DelegationID is the call's operation id: the same on
// every attempt, after a resume and on recovery, so that a repeated start
// addresses the same child. The engine's delegation protocol is
// durable_request by construction: a service must honour the delegation id.
type DelegateRequest struct {
	Op           string         `msgpack:"op" json:"op"`
	DelegationID string         `msgpack:"delegation_id" json:"delegation_id"`
	RunID        string         `msgpack:"run_id" json:"run_id"`
	CallID       string         `msgpack:"call_id" json:"call_id"`
	ToolID       string         `msgpack:"tool_id" json:"tool_id"`
	Arguments    events.RawJSON `msgpack:"arguments,omitempty" json:"arguments,omitempty"`
	Attempt      int            `msgpack:"attempt" json:"attempt"`
	Input        string         `msgpack:"input,omitempty" json:"input,omitempty"` // resume
}

// Delegation reply statuses.
const (
	DelegationEnded    = "ended"    // the child finished: Text is the call's output
	DelegationAwaiting = "awaiting" // the child waits for input: the parent parks
	DelegationError    = "error"    // Message; Retryable leaves the call to recovery
	DelegationCanceled = "cancelled"
)

// DelegateReply is a delegation service's answer.
type DelegateReply struct {
	Status    string `msgpack:"status" json:"status"`
	Text      string `msgpack:"text,omitempty" json:"text,omitempty"`
	Message   string `msgpack:"message,omitempty" json:"message,omitempty"`
	Retryable bool   `msgpack:"retryable,omitempty" json:"retryable,omitempty"`
}

// DefaultDelegateTimeout bounds one request to a delegation service.
const DefaultDelegateTimeout = 60 * time.Second

// delegate starts a call's child, or resumes it with its input.
func (b *brainExecutor) delegate(ctx context.Context, inv invocation) outcome {
	o := outcome{callID: inv.callID, attempt: inv.attempt}
	req := DelegateRequest{Op: DelegateStart, DelegationID: inv.operationID, RunID: inv.runID, CallID: inv.callID,
		ToolID: inv.toolID, Arguments: inv.arguments, Attempt: inv.attempt}
	if inv.hasInput {
		req.Op, req.Input, req.Arguments = DelegateResume, inv.input, nil
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
	case DelegationEnded:
		out := events.TextOutput(inv.callID, reply.Text)
		o.output = &out
	case DelegationAwaiting:
		o.awaiting = true
	case DelegationError:
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

func (b *brainExecutor) request(ctx context.Context, subject string, req DelegateRequest) (DelegateReply, error) {
	var reply DelegateReply
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
		return DelegateReply{Status: "malformed"}, nil
	}
	return reply, nil
}

// cancelChild sends a delegated child's service the cancel a fire asks
// for, in the background, and acknowledges the fire once the service has
// answered with anything but an error. Otherwise (no reply, an error, this
// engine stopping) the fire is given back, to this engine or another, after
// a delay that doubles with every delivery from 100 ms to 10 s.
func (e *Engine) cancelChild(ctx context.Context, m jetstream.Msg, req DelegateRequest) {
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		// Answered well within the fire's ack wait, or given back.
		rctx, cancel := context.WithTimeout(ctx, max(e.cfg.AckWait/2, time.Second))
		reply, err := e.brain.request(rctx, e.names.Delegate(req.ToolID), req)
		cancel()
		log := e.log.With().Str(fieldRunID, req.RunID).Str(fieldCallID, req.CallID).Logger()
		if err == nil && reply.Status != DelegationError {
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
