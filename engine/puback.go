package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// publishAcked publishes msg into its stream and waits for the stream's
// acknowledgement, as jetstream's PublishMsg does, and returns the
// sequence the stream stored it at. The plain acknowledgement,
// {"stream":"S","seq":N} with or without "duplicate": true, is read here;
// every other answer takes encoding/json (decodeAck) and fails as
// PublishMsg fails. A commit's acknowledgement so costs no reflective
// decoding on the commit's path. No responders is not retried here: the
// caller's retrying does, as for any passing failure.
func publishAcked(ctx context.Context, nc *nats.Conn, msg *nats.Msg) (uint64, error) {
	resp, err := nc.RequestMsgWithContext(ctx, msg)
	if errors.Is(err, nats.ErrNoResponders) {
		return 0, jetstream.ErrNoStreamResponse
	}
	if err != nil {
		return 0, err
	}
	return readAck(resp.Data)
}

// readAck reads a stream's answer to a publish.
func readAck(b []byte) (uint64, error) {
	if seq, ok := plainAck(b); ok {
		return seq, nil
	}
	return decodeAck(b)
}

// plainAck reads {"stream":"<name>","seq":<n>} or the same with
// ,"duplicate": true before its brace; ok false is anything else.
func plainAck(b []byte) (uint64, bool) {
	rest, ok := bytes.CutPrefix(b, []byte(`{"stream":"`))
	if !ok {
		return 0, false
	}
	end := bytes.IndexByte(rest, '"')
	if end <= 0 || bytes.IndexByte(rest[:end], '\\') >= 0 {
		return 0, false
	}
	if rest, ok = bytes.CutPrefix(rest[end+1:], []byte(`,"seq":`)); !ok {
		return 0, false
	}
	n := 0
	for n < len(rest) && rest[n] >= '0' && rest[n] <= '9' {
		n++
	}
	seq, err := strconv.ParseUint(string(rest[:n]), 10, 64)
	if n == 0 || err != nil || seq == 0 {
		return 0, false
	}
	switch string(rest[n:]) {
	case "}", `,"duplicate": true}`, `,"duplicate":true}`: // the server writes the space
		return seq, true
	}
	return 0, false
}

// decodeAck reads any acknowledgement as jetstream's PublishMsg does: an
// API error is returned as *jetstream.APIError (wrapped), an answer that
// names no stream is jetstream.ErrInvalidJSAck.
func decodeAck(b []byte) (uint64, error) {
	var ack struct {
		Error    *jetstream.APIError `json:"error"`
		Stream   string              `json:"stream"`
		Sequence uint64              `json:"seq"`
	}
	if err := json.Unmarshal(b, &ack); err != nil {
		return 0, jetstream.ErrInvalidJSAck
	}
	if ack.Error != nil {
		return 0, fmt.Errorf("nats: %w", ack.Error)
	}
	if ack.Stream == "" {
		return 0, jetstream.ErrInvalidJSAck
	}
	return ack.Sequence, nil
}

// asyncAckWait bounds the wait for an acknowledgement whose waiter sets no
// earlier deadline (jetstream's async publish timed out after as long).
const asyncAckWait = 10 * time.Second

// outPublisher publishes into streams without waiting, as jetstream's
// PublishMsgAsync does, and takes the acknowledgements on one
// subscription of an inbox of its own, each read by readAck. A wait that
// ends without an acknowledgement fails (waitAcks: its context, or
// asyncAckWait at most), rather than waiting forever among the pending
// ones; the projection's watcher gives up sooner (streamTry).
type outPublisher struct {
	nc     *nats.Conn
	prefix string // <inbox>.

	mu      sync.Mutex
	sub     *nats.Subscription // made at the first publish
	next    uint64
	pending map[string]*ackFuture // by the reply token
}

// ackFuture is a publication waiting for its acknowledgement: done closes
// once seq or err is set.
type ackFuture struct {
	subject string
	token   string
	done    chan struct{}
	seq     uint64
	err     error
}

func newOutPublisher(nc *nats.Conn) *outPublisher {
	return &outPublisher{nc: nc, prefix: nc.NewInbox() + ".", pending: map[string]*ackFuture{}}
}

// publish sends msg (its reply subject is the publisher's) and returns its
// future.
func (p *outPublisher) publish(msg *nats.Msg) (*ackFuture, error) {
	p.mu.Lock()
	if p.sub == nil {
		sub, err := p.nc.Subscribe(p.prefix+"*", p.acked)
		if err != nil {
			p.mu.Unlock()
			return nil, fmt.Errorf("subscribe to the acknowledgements: %w", err)
		}
		p.sub = sub
	}
	p.next++
	f := &ackFuture{subject: msg.Subject, token: strconv.FormatUint(p.next, 36), done: make(chan struct{})}
	p.pending[f.token] = f
	p.mu.Unlock()
	msg.Reply = p.prefix + f.token
	if err := p.nc.PublishMsg(msg); err != nil {
		p.forget(f)
		return nil, err
	}
	return f, nil
}

// acked settles the future an acknowledgement answers (none: it was
// forgotten).
func (p *outPublisher) acked(m *nats.Msg) {
	token := strings.TrimPrefix(m.Subject, p.prefix)
	p.mu.Lock()
	f := p.pending[token]
	delete(p.pending, token)
	p.mu.Unlock()
	if f == nil {
		return
	}
	if len(m.Data) == 0 && m.Header.Get("Status") == noRespondersStatus {
		f.err = jetstream.ErrNoStreamResponse
	} else {
		f.seq, f.err = readAck(m.Data)
	}
	close(f.done)
}

// forget drops futures no one waits for any more.
func (p *outPublisher) forget(fs ...*ackFuture) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, f := range fs {
		delete(p.pending, f.token)
	}
}

// close ends the subscription (a later publish subscribes again); the
// futures not acknowledged stay open.
func (p *outPublisher) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sub != nil {
		_ = p.sub.Unsubscribe()
		p.sub = nil
	}
}

// waitAcks waits for the acknowledgement of each publication, at most
// until ctx ends or asyncAckWait passes; the futures not settled by then
// are forgotten.
func (p *outPublisher) waitAcks(ctx context.Context, futures []*ackFuture) error {
	ctx, cancel := context.WithTimeout(ctx, asyncAckWait)
	defer cancel()
	for i, f := range futures {
		select {
		case <-f.done:
			if f.err != nil {
				p.forget(futures[i+1:]...)
				return fmt.Errorf("publish %s: %w", f.subject, f.err)
			}
		case <-ctx.Done():
			p.forget(futures[i:]...)
			return fmt.Errorf("publish %s: %w", f.subject, ctx.Err())
		}
	}
	return nil
}
