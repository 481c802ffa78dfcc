package engine

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
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
// is given back to the stream. A forward carries a reply subject of the
// forwarding engine's, so that one that reaches no subscriber (the owner
// is gone, and not yet declared dead) is answered "no responders" by the
// server and given back to the stream at once; the owner sends nothing
// there. One lost otherwise (the owner died with it) is redelivered after
// the inbox ack wait, as any unacknowledged message is.

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
	reply := e.fwd.track(m)
	err := e.nc.PublishMsg(&nats.Msg{Subject: e.names.Forward(owner), Reply: reply, Header: h, Data: m.Data()})
	if err != nil {
		e.fwd.take(reply)
	}
	return err == nil
}

// forwards are the messages this engine forwarded recently, by the reply
// subject their forward carried.
type forwards struct {
	inbox string // <inbox>.<n> is a forward's reply subject
	mu    sync.Mutex
	next  uint64
	sent  map[string]sentForward
	swept time.Time
}

type sentForward struct {
	msg jetstream.Msg
	at  time.Time
}

// forwardMemory is how long a forward is remembered: a "no responders"
// answer comes within a round trip.
const forwardMemory = 5 * time.Second

func (f *forwards) track(m jetstream.Msg) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	if now.Sub(f.swept) > forwardMemory {
		for k, s := range f.sent {
			if now.Sub(s.at) > forwardMemory {
				delete(f.sent, k)
			}
		}
		f.swept = now
	}
	f.next++
	reply := f.inbox + "." + strconv.FormatUint(f.next, 10)
	f.sent[reply] = sentForward{msg: m, at: now}
	return reply
}

func (f *forwards) take(reply string) jetstream.Msg {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.sent[reply]
	delete(f.sent, reply)
	if !ok {
		return nil
	}
	return s.msg
}

// serveForwardReplies gives back to the stream the forwards that reached
// nobody.
func (e *Engine) serveForwardReplies() (*nats.Subscription, error) {
	e.fwd.inbox = e.nc.NewInbox()
	return e.nc.Subscribe(e.fwd.inbox+".*", func(r *nats.Msg) {
		if r.Header.Get("Status") != noRespondersStatus {
			return
		}
		if m := e.fwd.take(r.Subject); m != nil {
			_ = m.NakWithDelay(busyDelay(m, e.cfg.InboxAckWait))
		}
	})
}

// noRespondersStatus is the status NATS answers a message with a reply
// subject that reached no subscriber.
const noRespondersStatus = "503"

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
