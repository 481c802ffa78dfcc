package engine

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/client"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/internal/testnats"
	"github.com/toolbatch/toolbatch/internal/testwait"
	"github.com/toolbatch/toolbatch/protocol"
)

// TestMessagesReachTheOwner: with two engines, a message of a run that
// reaches the engine not owning it is forwarded to the owner, which
// handles it and acknowledges it through the original acknowledgement
// subject. Every run is owned by engine A before its first submission, so
// the submissions engine B pulls are forwarded.
func TestMessagesReachTheOwner(t *testing.T) {
	url := testnats.Start(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	a, _ := runEngine(t, url, Config{AckWait: 5 * time.Second}), runEngine(t, url, Config{AckWait: 5 * time.Second})

	nc := testnats.Connect(t, url)
	var forwards atomic.Int64
	if _, err := nc.Subscribe(a.names.Forward("*"), func(*nats.Msg) { forwards.Add(1) }); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	const runs = 30
	for i := 0; i < runs; i++ {
		if _, err := a.ownersKV.Create(ctx, fmt.Sprintf("run.fw%d", i), []byte(a.id)); err != nil {
			t.Fatal(err)
		}
	}
	c, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < runs; i++ {
		run := fmt.Sprintf("fw%d", i)
		s := &protocol.Submit{RunID: run, ThreadID: "t1", Step: 1, Assistant: events.Message{ID: "m",
			Content: []events.ContentBlock{{Type: events.BlockToolUse, ID: "c1", Name: "echo", Input: events.MustJSON(`{"text":"hi"}`)}}}}
		if err := c.Submit(ctx, s); err != nil {
			t.Fatal(err)
		}
		res, err := c.WaitResults(ctx, run, events.BatchID(run, 1))
		if err != nil {
			t.Fatalf("%s: %v", run, err)
		}
		if len(res.Results) != 1 || res.Results[0].IsError {
			t.Fatalf("%s: results %+v", run, res.Results)
		}
	}
	if forwards.Load() == 0 {
		t.Fatalf("no submission of %d reached engine B and was forwarded", runs)
	}
	js := testnats.JetStream(t, nc)
	intake, err := js.Consumer(ctx, a.names.InboxStream(), protocol.ConsumerEngine)
	if err != nil {
		t.Fatal(err)
	}
	// Forwarded messages were acknowledged by their owner: the intake
	// consumer has nothing pending or unacknowledged.
	testwait.Until(t, ctx, "inbox acknowledged", func() bool {
		info, err := intake.Info(ctx)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	})
	t.Logf("%d of %d submissions forwarded", forwards.Load(), runs)
}

// TestBusyDelay: a message of a run owned elsewhere comes back after 5 ms,
// doubling with each delivery, at most a quarter of the ack wait and never
// more than 500 ms (here through a forwarded message's metadata, parsed
// from its acknowledgement subject).
func TestBusyDelay(t *testing.T) {
	msg := func(delivered int) jetstream.Msg {
		return &forwardedMsg{subject: "toolbatch.result.r1", msg: &nats.Msg{Sub: &nats.Subscription{},
			Reply: fmt.Sprintf("$JS.ACK.TOOLBATCH_INBOX.engine.%d.7.7.1700000000000000000.0", delivered)}}
	}
	for _, c := range []struct {
		delivered int
		ackWait   time.Duration
		want      time.Duration
	}{
		{1, 30 * time.Second, 5 * time.Millisecond},
		{2, 30 * time.Second, 10 * time.Millisecond},
		{7, 30 * time.Second, 320 * time.Millisecond},
		{8, 30 * time.Second, 500 * time.Millisecond},
		{1000, 30 * time.Second, 500 * time.Millisecond},
		{6, time.Second, 160 * time.Millisecond},
		{7, time.Second, 250 * time.Millisecond},
		{3, 100 * time.Millisecond, 20 * time.Millisecond},
		{9, 100 * time.Millisecond, 100 * time.Millisecond},
	} {
		if got := busyDelay(msg(c.delivered), c.ackWait); got != c.want {
			t.Errorf("delivery %d, ack wait %s: %s, want %s", c.delivered, c.ackWait, got, c.want)
		}
	}
}
