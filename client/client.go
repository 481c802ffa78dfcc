package client

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/protocol"
)

// DefaultPrefix is the subject prefix of every toolbatch subject unless
// WithPrefix chooses another one (the engine's --prefix).
const DefaultPrefix = protocol.DefaultPrefix

// Stream names for the default prefix. The engine creates the streams; the
// client never does, and finds the out stream by its subjects (so that it
// also works with the engine's stream names for another prefix).
var (
	// StreamInbox holds the commands to the engine: submit, resume, control
	// (and the workers' results), taken by the engines' intake consumer.
	StreamInbox = protocol.Names{Prefix: DefaultPrefix}.InboxStream()
	// StreamOut holds the projections the engine publishes for subscribers
	// on <prefix>.out.<run_id>.<kind>.
	StreamOut = protocol.Names{Prefix: DefaultPrefix}.OutStream()
)

// Out message kinds: the last token of <prefix>.out.<run_id>.<kind>.
const (
	KindDisposition = protocol.OutDisposition // protocol.DispositionOut
	KindResults     = protocol.OutResults     // protocol.ResultsOut
	KindAwaiting    = protocol.OutAwaiting    // protocol.AwaitingOut: a ticket
	KindRejected    = protocol.OutRejected    // protocol.RejectedOut: a submission refused
	KindRefused     = protocol.OutRefused     // protocol.RefusedOut: a resume or control refused
	KindEnded       = protocol.OutEnded       // protocol.EndedOut
	KindThrottled   = protocol.OutThrottled   // protocol.RejectedOut: a submission refused by its client's limits (code throttled)
)

// Errors of the client. Domain refusals found before publishing are
// returned as the *events.Refusal the engine would have published, with
// its protocol code; the sentinels below are everything else.
var (
	// ErrConfig is returned by New for an unusable option or connection.
	ErrConfig = errors.New("client: bad configuration")
	// ErrPublish wraps a failure to publish a command and get the stream's
	// acknowledgement (NATS unreachable, no inbox stream, ...). The command
	// may or may not have been stored: retrying is safe, it carries a
	// deterministic Nats-Msg-Id.
	ErrPublish = errors.New("client: publish")
	// ErrWatch wraps a failure to start watching a run's out messages.
	ErrWatch = errors.New("client: watch")
	// ErrWatchStopped is returned by Watch.Next after Stop, or when the
	// connection is closed.
	ErrWatchStopped = errors.New("client: watch stopped")
	// ErrUndecodable is wrapped by every *DecodeError: an out message whose
	// subject or body this client cannot read.
	ErrUndecodable = errors.New("client: undecodable out message")
	// ErrRejected is wrapped (together with the *events.Refusal) by the
	// error WaitResults returns when the engine rejected the batch.
	ErrRejected = errors.New("client: batch rejected")
	// ErrRunEnded is wrapped by the *EndedError WaitResults returns when the
	// run ended without publishing the batch's results.
	ErrRunEnded = errors.New("client: run ended")
)

// Client talks to the toolbatch engine over NATS JetStream only. It is safe
// for concurrent use.
type Client struct {
	nc        *nats.Conn
	js        jetstream.JetStream
	names     protocol.Names
	limits    events.Limits
	submitter string // WithSubmitter

	mu        sync.Mutex
	outStream string // the stream holding <prefix>.out.>, once found
}

type options struct {
	prefix    string
	limits    events.Limits
	submitter string
}

// Option changes one setting of New.
type Option func(*options)

// WithPrefix sets the subject prefix (default DefaultPrefix); it must match
// the engine's --prefix. A prefix is one or more dot-separated tokens of
// [A-Za-z0-9_-].
func WithPrefix(p string) Option { return func(o *options) { o.prefix = p } }

// WithLimits sets the input limits checked before publishing (default
// events.DefaultLimits()); they should match the engine's.
func WithLimits(l events.Limits) Option { return func(o *options) { o.limits = l } }

// WithSubmitter attributes every submission to client, the public nkey of
// the connection's NATS user: submissions go to
// <prefix>.submit.<run_id>.<client>, and the engine counts them against
// that client's limits. With authentication (docs/security.md) a client
// user may publish attributed submissions only, as itself
// (access.Conn.PublicKey gives the key of a credentials file).
func WithSubmitter(client string) Option { return func(o *options) { o.submitter = client } }

// New returns a client on the connection nc. The connection stays the
// caller's: the client never closes it.
func New(nc *nats.Conn, opts ...Option) (*Client, error) {
	o := options{prefix: DefaultPrefix, limits: events.DefaultLimits()}
	for _, opt := range opts {
		opt(&o)
	}
	var errs []error
	if nc == nil {
		errs = append(errs, errors.New("nil NATS connection"))
	}
	if !protocol.ValidPrefix(o.prefix) {
		errs = append(errs, fmt.Errorf("prefix %q must be dot-separated tokens of [A-Za-z0-9_-]", o.prefix))
	}
	if err := o.limits.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return &Client{nc: nc, js: js, names: protocol.Names{Prefix: o.prefix}, limits: o.limits, submitter: o.submitter}, nil
}

// Prefix returns the subject prefix the client uses.
func (c *Client) Prefix() string { return c.names.Prefix }

// Limits returns the limits the client checks before publishing.
func (c *Client) Limits() events.Limits { return c.limits }

// Submit publishes a batch on <prefix>.submit.<run_id> and waits for the
// stream's acknowledgement. The submission is checked first, exactly as the
// engine decodes it; a problem is returned as its *events.Refusal and
// nothing is published. The Nats-Msg-Id is <run_id>/<step>/<first 16 hex
// digits of s.Digest()>: a retry of the same submission is deduplicated by
// the stream (and is not an error), a corrected one is not.
//
// A nil error means the engine will read the batch, not that it accepted
// it: acceptance shows as dispositions and results, refusal on .rejected,
// or on .throttled when its client is over its limits (see WaitResults).
func (c *Client) Submit(ctx context.Context, s *protocol.Submit) error {
	_, err := c.submit(ctx, s, "")
	return err
}

// Sent is a command as the inbox stream acknowledged it: for a
// submission, what its answer names (Answer); a resume or control has no
// BatchID or Digest.
type Sent struct {
	RunID, BatchID string
	MsgID          string // its Nats-Msg-Id
	InboxSeq       uint64 // its sequence in the inbox stream
	Digest         string // protocol.Submit.Digest
	// Duplicate: the stream held it already (a retry within the duplicate
	// window): InboxSeq is the first one's.
	Duplicate bool
}

// Send publishes a submission as Submit does and returns what names it, so
// that Answer finds the answer to exactly this submission.
func (c *Client) Send(ctx context.Context, s *protocol.Submit) (Sent, error) {
	return c.submit(ctx, s, "")
}

// SubmitAndWait sends a submission and waits for its answer (Answer).
func (c *Client) SubmitAndWait(ctx context.Context, s *protocol.Submit) (*protocol.ResultsOut, error) {
	sent, err := c.Send(ctx, s)
	if err != nil {
		return nil, err
	}
	return c.Answer(ctx, sent)
}

// Resubmit publishes the submission again under a message id of its own
// (the usual one with /retry-<n>), for a submission refused as throttled:
// nothing of it was recorded, and within the inbox's duplicate window (2
// minutes) the stream would drop an identical Submit as a duplicate. An
// identical batch the engine did take is harmless: it is ignored.
func (c *Client) Resubmit(ctx context.Context, s *protocol.Submit, n int) error {
	_, err := c.submit(ctx, s, fmt.Sprintf("/retry-%d", n))
	return err
}

func (c *Client) submit(ctx context.Context, s *protocol.Submit, retry string) (Sent, error) {
	if s == nil {
		return Sent{}, events.Refuse(events.CodeUndecodable, "submit: nil submission")
	}
	if err := s.Validate(c.limits); err != nil {
		return Sent{}, err
	}
	body, err := events.Marshal(s)
	if err != nil {
		return Sent{}, events.Refuse(events.CodeUndecodable, "submit: encode: %v", err)
	}
	// The engine's own decoder is the final word on what it will accept.
	if _, err := protocol.DecodeSubmit(body, false, c.limits); err != nil {
		return Sent{}, err
	}
	digest := s.Digest()
	msgID := fmt.Sprintf("%s/%d/%s%s", s.RunID, s.Step, digest[:16], retry)
	subject := c.names.Submit(s.RunID)
	if c.submitter != "" {
		subject = c.names.SubmitAs(s.RunID, c.submitter)
	}
	m := nats.NewMsg(subject)
	m.Data = body
	if tp, _ := ctx.Value(traceParentKey{}).(string); tp != "" {
		m.Header.Set(protocol.HeaderTraceParent, tp)
	}
	ack, err := c.publishAck(ctx, m, msgID)
	if err != nil {
		return Sent{}, err
	}
	return Sent{RunID: s.RunID, BatchID: s.BatchID(), MsgID: msgID, InboxSeq: ack.Sequence, Digest: digest, Duplicate: ack.Duplicate}, nil
}

type traceParentKey struct{}

// WithTraceParent returns a context whose Submit carries traceparent (a
// W3C trace context header, 00-<trace id>-<span id>-<flags>): the
// engine's span of the batch becomes a child of that span.
func WithTraceParent(ctx context.Context, traceparent string) context.Context {
	return context.WithValue(ctx, traceParentKey{}, traceparent)
}

// Approve answers a permission (or scheduled action) ticket with allow,
// attributed to principal when it is not empty (see Resume).
func (c *Client) Approve(ctx context.Context, t protocol.AwaitingOut, principal, note string) error {
	return c.Resume(ctx, resumeFor(t, events.ResumeResult{Kind: events.ResultPermission, Allow: true, Note: note}), principal)
}

// Deny answers a permission (or scheduled action) ticket with deny and a
// reason, attributed to principal when it is not empty (see Resume).
func (c *Client) Deny(ctx context.Context, t protocol.AwaitingOut, principal, reason string) error {
	return c.Resume(ctx, resumeFor(t, events.ResumeResult{Kind: events.ResultPermission, Allow: false, Reason: reason}), principal)
}

// ToolResult answers an external_result ticket (a client-executed tool)
// with the tool's output. An output without a call id gets the ticket's.
func (c *Client) ToolResult(ctx context.Context, t protocol.AwaitingOut, out events.Output) error {
	if out.CallID == "" {
		out.CallID = t.CallID
	}
	return c.Resume(ctx, resumeFor(t, events.ResumeResult{Kind: events.ResultToolResult, Output: &out}), "")
}

// Input answers a delegation ticket with input text for the child run.
func (c *Client) Input(ctx context.Context, t protocol.AwaitingOut, text string) error {
	return c.Resume(ctx, resumeFor(t, events.ResumeResult{Kind: events.ResultInput, Text: text}), "")
}

// resumeFor returns a resume answering ticket t with result, carrying the
// ticket's ids so that the engine can check them.
func resumeFor(t protocol.AwaitingOut, result events.ResumeResult) *protocol.Resume {
	return &protocol.Resume{
		CorrelationID: t.CorrelationID,
		RunID:         t.RunID,
		ThreadID:      t.ThreadID,
		CallID:        t.CallID,
		SnapshotID:    t.SnapshotID,
		Result:        result,
	}
}

// Resume publishes r on <prefix>.resume.<run_id>, or on
// <prefix>.resume.<run_id>.<principal> when principal is not empty (NATS
// permissions then decide who may publish as whom), and waits for the
// stream's acknowledgement. The resume is checked first as the engine
// decodes it; a problem is returned as its *events.Refusal and nothing is
// published. The Nats-Msg-Id is
// resume/<run_id>/<correlation_id>/<kind>/<allow>/<hash>, the hash covering
// the subject and the body: a retried click is deduplicated, a corrected
// answer (or another principal's) is not.
//
// A nil error means the engine will read the resume; whether it applied it
// shows on the run's out messages (.refused when it did not).
func (c *Client) Resume(ctx context.Context, r *protocol.Resume, principal string) error {
	_, err := c.SendResume(ctx, r, principal)
	return err
}

// SendResume publishes a resume as Resume does and returns where the inbox
// stored it (RunID, MsgID, InboxSeq, Duplicate): the engine's refusal of
// it is the run's .refused message with Nats-Msg-Id
// protocol.RefusedMsgID(InboxSeq).
func (c *Client) SendResume(ctx context.Context, r *protocol.Resume, principal string) (Sent, error) {
	if r == nil {
		return Sent{}, events.Refuse(events.CodeUndecodable, "resume: nil resume")
	}
	if !events.ValidRunID(r.RunID) {
		return Sent{}, events.Refuse(events.CodeInvalidID, "resume: run_id %q must match [A-Za-z0-9_-]{1,64}", r.RunID)
	}
	subject := c.names.Resume(r.RunID)
	if principal != "" {
		if !events.ValidRunID(principal) { // the engine's rule for the principal token
			return Sent{}, events.Refuse(events.CodeInvalidID, "resume: principal %q must match [A-Za-z0-9_-]{1,64}", principal)
		}
		subject = c.names.ResumeAs(r.RunID, principal)
	}
	body, err := events.Marshal(r)
	if err != nil {
		return Sent{}, events.Refuse(events.CodeUndecodable, "resume: encode: %v", err)
	}
	if _, err := protocol.DecodeResume(body, false, c.limits); err != nil {
		return Sent{}, err
	}
	msgID := fmt.Sprintf("resume/%s/%s/%s/%t/%s",
		r.RunID, r.CorrelationID, r.Result.Kind, r.Result.Allow, shortHash(subject, body))
	return c.send(ctx, r.RunID, subject, msgID, body)
}

// Cancel asks the engine to cancel the run, on <prefix>.control.<run_id>.
func (c *Client) Cancel(ctx context.Context, runID, reason string) error {
	return c.control(ctx, runID, protocol.Control{Action: protocol.ControlCancel, Reason: reason})
}

// Interrupt asks the engine to interrupt the run, on
// <prefix>.control.<run_id>.
func (c *Client) Interrupt(ctx context.Context, runID, reason string) error {
	return c.control(ctx, runID, protocol.Control{Action: protocol.ControlInterrupt, Reason: reason})
}

// Perform asks the engine to perform a scheduled action now: correlationID
// is its ticket's.
func (c *Client) Perform(ctx context.Context, runID, correlationID string) error {
	return c.control(ctx, runID, protocol.Control{Action: protocol.ControlPerform, CorrelationID: correlationID})
}

func (c *Client) control(ctx context.Context, runID string, ctl protocol.Control) error {
	_, err := c.SendControl(ctx, runID, ctl)
	return err
}

// SendControl checks and publishes a control message (Cancel, Interrupt
// and Perform build them) and returns where the inbox stored it, as
// SendResume does. Its Nats-Msg-Id is
// control/<run_id>/<action>/<correlation_id>, so a retry is deduplicated.
func (c *Client) SendControl(ctx context.Context, runID string, ctl protocol.Control) (Sent, error) {
	if !events.ValidRunID(runID) {
		return Sent{}, events.Refuse(events.CodeInvalidID, "control: run_id %q must match [A-Za-z0-9_-]{1,64}", runID)
	}
	body, err := events.Marshal(&ctl)
	if err != nil {
		return Sent{}, events.Refuse(events.CodeUndecodable, "control: encode: %v", err)
	}
	if _, err := protocol.DecodeControl(body, false); err != nil {
		return Sent{}, err
	}
	msgID := fmt.Sprintf("control/%s/%s/%s", runID, ctl.Action, ctl.CorrelationID)
	return c.send(ctx, runID, c.names.Control(runID), msgID, body)
}

// send publishes a command of a run and returns where it was stored.
func (c *Client) send(ctx context.Context, runID, subject, msgID string, body []byte) (Sent, error) {
	m := nats.NewMsg(subject)
	m.Data = body
	ack, err := c.publishAck(ctx, m, msgID)
	if err != nil {
		return Sent{}, err
	}
	return Sent{RunID: runID, MsgID: msgID, InboxSeq: ack.Sequence, Duplicate: ack.Duplicate}, nil
}

func (c *Client) publishAck(ctx context.Context, m *nats.Msg, msgID string) (*jetstream.PubAck, error) {
	if max := c.nc.MaxPayload(); max > 0 && int64(len(m.Data)) > max {
		return nil, events.Refuse(events.CodeLimitExceeded, "%s: the message is %d bytes, and the NATS server takes at most %d (its max_payload): make the batch smaller, or raise the server's max_payload",
			m.Subject, len(m.Data), max)
	}
	ack, err := c.js.PublishMsg(ctx, m, jetstream.WithMsgID(msgID))
	if err != nil {
		return nil, fmt.Errorf("%w %s: %w", ErrPublish, m.Subject, err)
	}
	return ack, nil
}

// shortHash returns the first 16 hex digits of a SHA-256 over the subject
// and the body.
func shortHash(subject string, body []byte) string {
	h := sha256.New()
	h.Write([]byte(subject))
	h.Write([]byte{0})
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil))[:16]
}
