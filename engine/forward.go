package engine

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/protocol"
)

// Forwarding: every engine pulls from the shared inbox and timers, so with
// several engines a message of a run often reaches one that does not own
// the run. Rather than giving it back to the stream to be delivered again
// to whichever engine pulls next, the engine forwards it to the owner the
// owners bucket names, on <prefix>.engine.<engine id>.forward (core NATS),
// with the message's subject and acknowledgement subject in headers (the
// server refuses a $JS.ACK subject as a reply subject). The owner handles
// it as if JetStream had delivered it there and acknowledges it through
// that subject, to which any connection may publish. A forwarded
// message is never forwarded again: if its run changed hands meanwhile it
// is given back to the stream. A forward that is lost (the owner died) is
// redelivered after the ack wait, as any unacknowledged message is.

// ownedElsewhere is ErrNotOwner with the owner's engine id.
type ownedElsewhere struct{ owner string }

func (o ownedElsewhere) Error() string        { return ErrNotOwner.Error() + " (" + o.owner + ")" }
func (o ownedElsewhere) Is(target error) bool { return target == ErrNotOwner }

// forward hands a message to the engine that owns its run, and reports
// whether it did.
func (e *Engine) forward(m jetstream.Msg, owner string) bool {
	if owner == "" || owner == e.id || m.Reply() == "" {
		return false
	}
	h := nats.Header{}
	for k, v := range m.Headers() {
		h[k] = v
	}
	h.Set(protocol.HeaderForwardedSubject, m.Subject())
	h.Set(protocol.HeaderForwardedAck, m.Reply())
	err := e.nc.PublishMsg(&nats.Msg{Subject: e.names.Forward(owner), Header: h, Data: m.Data()})
	return err == nil
}

// serveForwards takes the messages other engines forward to this one.
func (e *Engine) serveForwards() (*nats.Subscription, error) {
	return e.nc.Subscribe(e.names.Forward(e.id), func(m *nats.Msg) {
		subject, ack := m.Header.Get(protocol.HeaderForwardedSubject), m.Header.Get(protocol.HeaderForwardedAck)
		m.Header.Del(protocol.HeaderForwardedSubject)
		m.Header.Del(protocol.HeaderForwardedAck)
		if subject == "" || !strings.HasPrefix(ack, "$JS.ACK.") {
			return // not a forward: nothing to acknowledge
		}
		m.Reply = ack
		fm := &forwardedMsg{msg: m, subject: subject, nc: e.nc}
		kind, runID, principal, ok := e.names.InboxKind(subject)
		if !ok {
			_ = fm.TermWithReason("cannot be attributed to a run: subject " + subject)
			return
		}
		e.shardOf(runID).post(item{runID: runID, work: &inboxMsg{msg: fm, kind: kind, principal: principal, forwarded: true}})
	})
}

// forwardedMsg is a JetStream message another engine forwarded: its
// acknowledgements go to the original acknowledgement subject.
type forwardedMsg struct {
	msg     *nats.Msg // Reply is the acknowledgement subject; Sub is the forward subscription
	subject string
	nc      *nats.Conn
}

var _ jetstream.Msg = (*forwardedMsg)(nil)

func (f *forwardedMsg) Metadata() (*jetstream.MsgMetadata, error) {
	md, err := f.msg.Metadata() // parses the acknowledgement subject
	if err != nil {
		return nil, err
	}
	return &jetstream.MsgMetadata{
		Sequence:     jetstream.SequencePair{Consumer: md.Sequence.Consumer, Stream: md.Sequence.Stream},
		NumDelivered: md.NumDelivered, NumPending: md.NumPending, Timestamp: md.Timestamp,
		Stream: md.Stream, Consumer: md.Consumer, Domain: md.Domain,
	}, nil
}

func (f *forwardedMsg) Data() []byte                       { return f.msg.Data }
func (f *forwardedMsg) Headers() nats.Header               { return f.msg.Header }
func (f *forwardedMsg) Subject() string                    { return f.subject }
func (f *forwardedMsg) Reply() string                      { return f.msg.Reply }
func (f *forwardedMsg) Ack() error                         { return f.msg.Ack() }
func (f *forwardedMsg) Nak() error                         { return f.msg.Nak() }
func (f *forwardedMsg) NakWithDelay(d time.Duration) error { return f.msg.NakWithDelay(d) }
func (f *forwardedMsg) InProgress() error                  { return f.msg.InProgress() }
func (f *forwardedMsg) Term() error                        { return f.msg.Term() }

func (f *forwardedMsg) DoubleAck(ctx context.Context) error {
	return f.msg.AckSync(nats.Context(ctx))
}

func (f *forwardedMsg) TermWithReason(reason string) error {
	return f.nc.Publish(f.msg.Reply, []byte(fmt.Sprintf("+TERM %s", reason)))
}
