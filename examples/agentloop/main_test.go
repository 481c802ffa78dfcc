package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/catalog"
	"github.com/toolbatch/toolbatch/client"
	"github.com/toolbatch/toolbatch/engine"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/internal/testnats"
	"github.com/toolbatch/toolbatch/protocol"
)

// TestTheLoopRunsToItsEnd runs the scripted model through a real engine
// with the example's catalog: the model hears one result per call, in its
// order and its format, the confirmation was answered by the scripted
// person and recorded as theirs, the client tool by the loop, and the
// malformed call is that call's error while the others ran.
func TestTheLoopRunsToItsEnd(t *testing.T) {
	url := testnats.Start(t, t.TempDir())
	yaml, err := os.ReadFile("catalog.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cat, err := catalog.Parse(yaml)
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(testnats.Connect(t, url), engine.Config{Catalog: cat})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("engine: %v", err)
		}
	})
	<-e.Ready()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.New(testnats.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	got, err := Loop(ctx, c, "loop-1", &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	want := [][]string{
		{`toolu_01 error=false {"text":"ping"}`, `toolu_02 error=false {"subject":"deploy","to":"ops@example.com"}`},
		{`call_1 eu-west-1`, `call_2 Error: invalid arguments: the input must be a JSON object, got a string`},
	}
	if len(got) != len(want) {
		t.Fatalf("the model heard %q, want %q", got, want)
	}
	for i := range want {
		if strings.Join(got[i], "\n") != strings.Join(want[i], "\n") {
			t.Fatalf("step %d: the model heard %q, want %q", i+1, got[i], want[i])
		}
	}
	if !strings.Contains(out.String(), "model: Done: ") {
		t.Fatalf("the loop did not end with the model's answer:\n%s", out.String())
	}

	// The log says who approved the email, and holds the thinking block.
	js := testnats.JetStream(t, testnats.Connect(t, url))
	names := protocol.Names{Prefix: protocol.DefaultPrefix}
	var approvedBy string
	var thinking bool
	err = protocol.ReadOrdered(ctx, js, names.EventsStream(), protocol.ReadOptions{Subjects: []string{names.Events("loop-1")}}, func(m jetstream.Msg, _ *jetstream.MsgMetadata) error {
		evs, err := events.DecodeCommit(m.Data(), m.Headers().Values(protocol.HeaderEvent))
		if err != nil {
			return err
		}
		for _, ev := range evs {
			switch ev := ev.(type) {
			case *events.TicketResolved:
				if ev.Resolution == events.ResolutionApproved {
					approvedBy = ev.Principal
				}
			case *events.BatchSubmitted:
				for _, b := range ev.Assistant.Content {
					thinking = thinking || (b.Type == "thinking" && strings.Contains(string(b.Extra), `"signature":"c2NyaXB0ZWQ="`))
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if approvedBy != person || !thinking {
		t.Fatalf("approved by %q (want %q), thinking block kept %t", approvedBy, person, thinking)
	}
}
