package engine

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/internal/testnats"
)

// TestPublishAckedAsPublishMsg: publishAcked answers as jetstream's
// PublishMsg on a real server's acknowledgements: a stored message, a
// duplicate, a wrong last sequence (the conflict), and no stream; and
// reads the plain ones itself.
func TestPublishAckedAsPublishMsg(t *testing.T) {
	nc := testnats.Connect(t, testnats.Start(t, t.TempDir()))
	js := testnats.JetStream(t, nc)
	ctx := context.Background()
	for _, name := range []string{"ACKS", "JSACKS"} {
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{strings.ToLower(name) + ".>"}}); err != nil {
			t.Fatal(err)
		}
	}
	msg := func(subject, id string, last uint64) *nats.Msg {
		m := nats.NewMsg(subject)
		m.Data = []byte("body")
		m.Header.Set(jetstream.MsgIDHeader, id)
		m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(last, 10))
		return m
	}
	// The same steps on two streams alike: publishAcked into ACKS,
	// PublishMsg into JSACKS; the answers must agree.
	for _, c := range []struct {
		name, subject, id string
		last, seq         uint64
		failure           func(error) bool
	}{
		{name: "stored", subject: "a", id: "a1", seq: 1},
		{name: "a retry that landed", subject: "a", id: "a1", failure: isWrongLastSequence}, // checked before duplicates
		{name: "stored after", subject: "a", id: "a2", last: 1, seq: 2},
		{name: "a duplicate", subject: "b", id: "a2", seq: 2},
		{name: "wrong last sequence", subject: "a", id: "a3", last: 1, failure: isWrongLastSequence},
		{name: "no stream", subject: "", id: "n1", failure: func(err error) bool { return errors.Is(err, jetstream.ErrNoStreamResponse) }},
	} {
		subject := func(stream string) string {
			if c.subject == "" {
				return "nowhere." + stream
			}
			return stream + "." + c.subject
		}
		var seq uint64
		var err error
		if c.subject == "" {
			seq, err = publishAcked(ctx, nc, msg(subject("acks"), c.id, c.last))
		} else {
			// the server's answer, read by readAck; a plain one by plainAck
			resp, rerr := nc.RequestMsg(msg(subject("acks"), c.id, c.last), time.Second)
			if rerr != nil {
				t.Fatal(rerr)
			}
			seq, err = readAck(resp.Data)
			if _, plain := plainAck(resp.Data); plain != (err == nil) {
				t.Fatalf("%s: the server answered %s, and plainAck reads it: %v", c.name, resp.Data, plain)
			}
		}
		if c.failure != nil {
			if err == nil || !c.failure(err) {
				t.Fatalf("%s: %d, %v; want the failure", c.name, seq, err)
			}
		} else if err != nil || seq != c.seq {
			t.Fatalf("%s: %d, %v; want sequence %d", c.name, seq, err, c.seq)
		}
		ack, jerr := js.PublishMsg(ctx, msg(subject("jsacks"), c.id, c.last), jetstream.WithRetryAttempts(0))
		switch {
		case (err == nil) != (jerr == nil):
			t.Fatalf("%s: publishAcked says %v, PublishMsg %v", c.name, err, jerr)
		case err == nil && ack.Sequence != seq:
			t.Fatalf("%s: publishAcked says sequence %d, PublishMsg %d", c.name, seq, ack.Sequence)
		case err != nil && err.Error() != jerr.Error():
			t.Fatalf("%s: publishAcked fails with %q, PublishMsg with %q", c.name, err, jerr)
		}
	}
}

// TestPlainAck: what the fast read takes and what it leaves to JSON.
func TestPlainAck(t *testing.T) {
	for in, want := range map[string]uint64{
		`{"stream":"TOOLBATCH_EVENTS","seq":42}`:                                         42,
		`{"stream":"S","seq":18446744073709551615,"duplicate":true}`:                     18446744073709551615,
		`{"stream":"S","seq":42,"domain":"hub"}`:                                         0,
		`{"stream":"S","seq":42,"duplicate":false}`:                                      0,
		`{"stream":"S\"x","seq":42}`:                                                     0,
		`{"stream":"","seq":42}`:                                                         0,
		`{"stream":"S","seq":0}`:                                                         0,
		`{"stream":"S","seq":18446744073709551616}`:                                      0,
		`{"stream":"S","seq":}`:                                                          0,
		`{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 1"}}`: 0,
		`{"stream":"S","seq":42} `:                                                       0,
	} {
		seq, ok := plainAck([]byte(in))
		if ok != (want != 0) || seq != want {
			t.Errorf("plainAck(%s) = %d, %v; want %d", in, seq, ok, want)
		}
		if !ok {
			continue
		}
		if dseq, err := decodeAck([]byte(in)); err != nil || dseq != seq {
			t.Errorf("decodeAck(%s) = %d, %v; plainAck read %d", in, dseq, err, seq)
		}
	}
}

// TestOutPublisher: the out messages' publisher settles each future with
// the stream's answer (stored, a duplicate, a refusal, no stream), and
// forgets the futures whose wait ended without one.
func TestOutPublisher(t *testing.T) {
	nc := testnats.Connect(t, testnats.Start(t, t.TempDir()))
	js := testnats.JetStream(t, nc)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "OUTS", Subjects: []string{"outs.>"}, MaxMsgSize: 100}); err != nil {
		t.Fatal(err)
	}
	p := newOutPublisher(nc)
	defer p.close()
	send := func(subject, id string, size int) *ackFuture {
		m := nats.NewMsg(subject)
		m.Data = make([]byte, size)
		m.Header.Set(jetstream.MsgIDHeader, id)
		f, err := p.publish(m)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	stored, again, later := send("outs.a", "o1", 10), send("outs.a", "o1", 10), send("outs.b", "o2", 10)
	if err := p.waitAcks(ctx, []*ackFuture{stored, again, later}); err != nil {
		t.Fatal(err)
	}
	if stored.seq != 1 || again.seq != 1 || later.seq != 2 {
		t.Fatalf("sequences %d, %d, %d; want 1, 1 (a duplicate), 2", stored.seq, again.seq, later.seq)
	}
	var apiErr *jetstream.APIError
	if err := p.waitAcks(ctx, []*ackFuture{send("outs.c", "o3", 1000)}); !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamMessageExceedsMaximum {
		t.Fatalf("a message over the stream's size: %v; want the stream's refusal", err)
	}
	if err := p.waitAcks(ctx, []*ackFuture{send("nowhere.a", "n1", 10)}); !errors.Is(err, jetstream.ErrNoStreamResponse) {
		t.Fatalf("a subject of no stream: %v; want %v", err, jetstream.ErrNoStreamResponse)
	}
	// An answer that never comes: a subscriber that takes the message and
	// says nothing. The wait ends with its context, and the future is
	// forgotten.
	silent, err := nc.SubscribeSync("silent.a")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Unsubscribe()
	wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if err := p.waitAcks(wctx, []*ackFuture{send("silent.a", "s1", 10)}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("no answer: %v; want the deadline", err)
	}
	p.mu.Lock()
	left := len(p.pending)
	p.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d futures still pending after every wait ended", left)
	}
}
