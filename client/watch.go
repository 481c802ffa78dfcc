package client

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/protocol"
)

// Message is one out message of a run, decoded. Exactly one payload is
// set: the one of its Kind (Rejected for KindRejected and KindThrottled).
type Message struct {
	Kind    string // KindDisposition, KindResults, ...
	Subject string // <prefix>.out.<run_id>.<kind>
	Seq     uint64 // sequence in the out stream
	// Pending is how many messages of the watch were still in the stream
	// after this one when it was delivered: 0 means the watch had caught up.
	Pending uint64

	Disposition *protocol.DispositionOut
	Results     *protocol.ResultsOut
	Awaiting    *protocol.AwaitingOut
	Rejected    *protocol.RejectedOut
	Refused     *protocol.RefusedOut
	Ended       *protocol.EndedOut
}

// DecodeError is an out message this client cannot read: an unexpected
// subject, an unknown kind, or a body that does not decode. It wraps
// ErrUndecodable and the cause. The watch goes on: the next call to Next
// returns the following message.
type DecodeError struct {
	Subject string
	Seq     uint64 // 0 when unknown
	Err     error
}

// Error implements error.
func (e *DecodeError) Error() string {
	return fmt.Sprintf("%v on %s (stream seq %d): %v", ErrUndecodable, e.Subject, e.Seq, e.Err)
}

// Unwrap returns ErrUndecodable and the cause.
func (e *DecodeError) Unwrap() []error { return []error{ErrUndecodable, e.Err} }

// EndedError is returned by WaitResults when the run ended without
// publishing the batch's results. It wraps ErrRunEnded.
type EndedError struct {
	RunID string
	Ended protocol.EndedOut
}

// Error implements error.
func (e *EndedError) Error() string {
	s := fmt.Sprintf("%v: run %s: %s", ErrRunEnded, e.RunID, e.Ended.Cause)
	if e.Ended.Reason != "" {
		s += ": " + e.Ended.Reason
	}
	return s
}

// Unwrap returns ErrRunEnded.
func (e *EndedError) Unwrap() error { return ErrRunEnded }

// Watch reads one run's out messages in stream order, from the first one
// still in the out stream. Next must not be called from several goroutines at
// once; Stop may be called at any time.
type Watch struct {
	runID string
	base  string // <prefix>.out.<run_id>.
	iter  jetstream.MessagesContext
}

// Watch starts reading the run's out messages: an ordered consumer on the
// out stream (StreamOut for the default prefix) filtered to
// <prefix>.out.<run_id>.>, delivering everything the stream holds, so that
// nothing published before Watch is missed. ctx bounds only the start; call
// Stop when done.
func (c *Client) Watch(ctx context.Context, runID string) (*Watch, error) {
	return c.watch(ctx, runID, c.outSubject(runID, ">"))
}

// outStreamName returns the name of the stream that holds <prefix>.out.>
// (StreamOut for the default prefix), asking the server once.
func (c *Client) outStreamName(ctx context.Context) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.outStream != "" {
		return c.outStream, nil
	}
	name, err := c.js.StreamNameBySubject(ctx, c.names.StreamSubjects(protocol.StreamOut)[0])
	if err != nil {
		return "", fmt.Errorf("find the stream of %s: %w", c.names.StreamSubjects(protocol.StreamOut)[0], err)
	}
	c.outStream = name
	return name, nil
}

// outSubject returns <prefix>.out.<run_id>.<kind>.
func (c *Client) outSubject(runID, kind string) string {
	return c.names.Out(runID, kind)
}

func (c *Client) watch(ctx context.Context, runID string, filters ...string) (*Watch, error) {
	if !events.ValidRunID(runID) {
		return nil, events.Refuse(events.CodeInvalidID, "watch: run_id %q must match [A-Za-z0-9_-]{1,64}", runID)
	}
	stream, err := c.outStreamName(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w run %s: %w", ErrWatch, runID, err)
	}
	cons, err := c.js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: filters,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		// The server drops the consumer soon after the watch stops pulling,
		// so that many short watches do not pile up consumers.
		InactiveThreshold: 10 * time.Second,
	})
	if err != nil {
		return nil, fmt.Errorf("%w run %s: %w", ErrWatch, runID, err)
	}
	iter, err := cons.Messages()
	if err != nil {
		return nil, fmt.Errorf("%w run %s: %w", ErrWatch, runID, err)
	}
	return &Watch{runID: runID, base: c.outSubject(runID, ""), iter: iter}, nil
}

// Next returns the run's next out message, waiting for one until ctx is
// done. A message that cannot be read is returned as a *DecodeError (never
// skipped); the watch then goes on with the following message. After Stop,
// Next returns ErrWatchStopped.
func (w *Watch) Next(ctx context.Context) (Message, error) {
	m, err := w.iter.Next(jetstream.NextContext(ctx))
	if err != nil {
		if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
			return Message{}, fmt.Errorf("%w: run %s: %w", ErrWatchStopped, w.runID, err)
		}
		return Message{}, fmt.Errorf("client: watch run %s: %w", w.runID, err)
	}
	return w.decode(m)
}

// Stop ends the watch. The server removes the ephemeral consumer once it
// has been inactive for a while.
func (w *Watch) Stop() { w.iter.Stop() }

// decode reads an out message: its kind from the subject, its payload from
// the msgpack body.
func (w *Watch) decode(m jetstream.Msg) (Message, error) {
	msg := Message{Subject: m.Subject()}
	meta, err := m.Metadata()
	if err != nil {
		return Message{}, &DecodeError{Subject: msg.Subject, Err: err}
	}
	msg.Seq, msg.Pending = meta.Sequence.Stream, meta.NumPending
	fail := func(err error) (Message, error) {
		return Message{}, &DecodeError{Subject: msg.Subject, Seq: msg.Seq, Err: err}
	}
	kind, ok := strings.CutPrefix(msg.Subject, w.base)
	if !ok || kind == "" || strings.Contains(kind, ".") {
		return fail(fmt.Errorf("subject is not %s<kind>", w.base))
	}
	msg.Kind = kind
	var (
		target  any
		missing string // the identifying field, when it is empty
	)
	switch kind {
	case KindDisposition:
		msg.Disposition = new(protocol.DispositionOut)
		target = msg.Disposition
	case KindResults:
		msg.Results = new(protocol.ResultsOut)
		target = msg.Results
	case KindAwaiting:
		msg.Awaiting = new(protocol.AwaitingOut)
		target = msg.Awaiting
	case KindRejected, KindThrottled:
		msg.Rejected = new(protocol.RejectedOut)
		target = msg.Rejected
	case KindRefused:
		msg.Refused = new(protocol.RefusedOut)
		target = msg.Refused
	case KindEnded:
		msg.Ended = new(protocol.EndedOut)
		target = msg.Ended
	default:
		return fail(fmt.Errorf("unknown kind %q", kind))
	}
	if err := events.Unmarshal(m.Data(), target); err != nil {
		return fail(err)
	}
	// Every out message carries what identifies it; a body without it (nil,
	// an empty map) is not one of the engine's.
	switch {
	case msg.Disposition != nil && (msg.Disposition.BatchID == "" || msg.Disposition.CallID == ""):
		missing = "batch_id and call_id"
	case msg.Results != nil && msg.Results.BatchID == "":
		missing = "batch_id"
	case msg.Awaiting != nil && msg.Awaiting.CorrelationID == "":
		missing = "correlation_id"
	case msg.Rejected != nil && msg.Rejected.Code == "":
		missing = "code"
	case msg.Refused != nil && msg.Refused.Code == "":
		missing = "code"
	case msg.Ended != nil && msg.Ended.Cause == "":
		missing = "cause"
	}
	if missing != "" {
		return fail(fmt.Errorf("%s message without %s", kind, missing))
	}
	return msg, nil
}

// WaitResults watches the run until the results of batchID and returns
// them. It reads the run's results, rejected, throttled and ended messages
// from the first one the stream holds:
//
//   - results of batchID: returned, wherever they are in the stream;
//   - rejected or throttled with batchID: an error wrapping ErrRejected and
//     the *events.Refusal (Code, Reason);
//   - ended: an *EndedError (wrapping ErrRunEnded).
//
// Because a rejected batch does not use up its step, a step can be rejected
// and later accepted under the same batch id; a rejection or an end
// therefore decides only once the watch has caught up with the stream and no
// later results of batchID were found. (A rejection of an earlier attempt
// that is still the newest verdict when WaitResults catches up is returned:
// after resubmitting a rejected step, wait on a Watch started before the
// resubmission.) A rejection without a batch id (an undecodable body) names
// no batch and is ignored; an unreadable message is returned as its
// *DecodeError. It waits until ctx is done.
func (c *Client) WaitResults(ctx context.Context, runID, batchID string) (*protocol.ResultsOut, error) {
	return c.await(ctx, runID, batchID,
		func(r *protocol.ResultsOut) bool { return r.BatchID == batchID },
		func(r *protocol.RejectedOut) bool { return r.BatchID == batchID }, true)
}

// Answer waits for the answer to a sent submission, matched by what names
// it rather than by its batch id:
//
//   - the results of its batch when they name it (its message id or inbox
//     sequence), or name a submission of the same batch with the same
//     digest (an identical one the engine took first: this one changed
//     nothing);
//   - its own rejection (one that names it, whatever was accepted at that
//     step before): an error wrapping ErrRejected and the *events.Refusal.
//
// The run's end is not an answer: a submission to an ended run is
// rejected (run_ended), and a batch open when its run ends still gets its
// results. A rejection is the answer once the watch has caught up with the
// stream and no results naming the submission followed it.
//
// It waits until ctx is done.
func (c *Client) Answer(ctx context.Context, sent Sent) (*protocol.ResultsOut, error) {
	// The inbox sequence names this submission alone; the message id also
	// an earlier one of the same content (a retry after the duplicate
	// window), so it counts only when the sequence is unknown.
	msgID := sent.MsgID
	if sent.InboxSeq != 0 {
		msgID = ""
	}
	return c.await(ctx, sent.RunID, sent.BatchID,
		func(r *protocol.ResultsOut) bool {
			return r.Submission.Names(msgID, sent.InboxSeq) ||
				(r.BatchID == sent.BatchID && r.Submission != nil && r.Submission.Digest == sent.Digest)
		},
		func(r *protocol.RejectedOut) bool { return r.Submission.Names(msgID, sent.InboxSeq) }, false)
}

// await reads the run's results, rejected, throttled and ended messages
// from the first one the stream holds until results match; a matching
// rejection (or, with ended, the run's end) is the answer once the watch
// has caught up.
func (c *Client) await(ctx context.Context, runID, batchID string,
	results func(*protocol.ResultsOut) bool, rejected func(*protocol.RejectedOut) bool, ended bool) (*protocol.ResultsOut, error) {
	w, err := c.watch(ctx, runID,
		c.outSubject(runID, KindResults), c.outSubject(runID, KindRejected), c.outSubject(runID, KindThrottled), c.outSubject(runID, KindEnded))
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	var verdict error // the newest rejection or end seen, decided once caught up
	for {
		m, err := w.Next(ctx)
		if err != nil {
			return nil, err
		}
		switch {
		case m.Results != nil && results(m.Results):
			return m.Results, nil
		case m.Rejected != nil && rejected(m.Rejected):
			verdict = fmt.Errorf("%w: %s: %w", ErrRejected, batchID,
				&events.Refusal{Code: m.Rejected.Code, Reason: m.Rejected.Reason})
		case m.Ended != nil && ended:
			verdict = &EndedError{RunID: runID, Ended: *m.Ended}
		}
		if verdict != nil && m.Pending == 0 {
			return nil, verdict
		}
	}
}
