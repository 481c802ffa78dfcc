package chaos

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbatch/toolbatch/client"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/protocol"
)

// TestRefusedRedeliveryKeepsRunAlive is the regression test of an engine
// bug the long crash schedules found (seeds 290050785 and 600553432 of
// `make chaos`), step by step:
//
//  1. a batch [ask (client), sleep_nr, sleep_nr]; the client answers the
//     ticket; the engine holds the resume message while c2 runs;
//  2. kill -9 the engine while c2 runs, restart it: the resume is
//     redelivered, the engine recovers the run (c2 indeterminate) and
//     refuses the resume (its ticket was resolved), then drives on: c3
//     executing. The engine used to acknowledge the refused resume, leaving
//     no inbox message held for a run with work in progress;
//  3. kill -9 the engine while c3 runs, restart it: the held message is
//     redelivered, the run is taken over, and the batch finalizes.
func TestRefusedRedeliveryKeepsRunAlive(t *testing.T) {
	b := binaries(t)
	dir, err := os.MkdirTemp("", "toolbatch-chaos-knownbug-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := startCluster(ctx, b, dir, dir, 1, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer c.stop()
	nc, err := nats.Connect(c.url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	cl, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s := &protocol.Submit{RunID: "stranded", ThreadID: "t", Step: 1, Assistant: events.Message{ID: "m", Content: []events.ContentBlock{
		{Type: events.BlockToolUse, ID: "c1", Name: toolAsk, Input: events.MustJSON(`{}`)},
		{Type: events.BlockToolUse, ID: "c2", Name: toolSleepNR, Input: events.MustJSON(`{"duration":"4s"}`)},
		{Type: events.BlockToolUse, ID: "c3", Name: toolSleepNR, Input: events.MustJSON(`{"duration":"4s"}`)}}}}
	if err := cl.Submit(ctx, s); err != nil {
		t.Fatal(err)
	}
	w, err := cl.Watch(ctx, s.RunID)
	if err != nil {
		t.Fatal(err)
	}
	for {
		m, err := w.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if m.Awaiting != nil {
			if err := cl.ToolResult(ctx, *m.Awaiting, events.TextOutput("", "answer")); err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	w.Stop()
	engine := c.engines[0]
	crashWhenExecuting := func(callID string) {
		t.Helper()
		waitFor(ctx, t, c.url, "stranded/1/"+callID+" executing", func(f *fold) bool {
			ci := f.calls["stranded/1/"+callID]
			return ci != nil && hasStep(ci.history, "executing attempt 1")
		})
		engine.kill()
		engine.restart()
		if err := engine.waitReady(ctx); err != nil {
			t.Fatal(err)
		}
		t.Logf("engine killed while %s ran, and restarted", callID)
	}
	crashWhenExecuting("c2")
	crashWhenExecuting("c3")
	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	defer rcancel()
	res, err := cl.WaitResults(rctx, s.RunID, s.BatchID())
	if err != nil {
		rec, _ := readStreams(ctx, c.url)
		f := foldEvents(rec)
		logs, _ := os.ReadFile(filepath.Join(dir, "logs", "engine-1.log"))
		t.Fatalf("no results 30 s after the second restart (%v): the run was never taken over again%s\n--- engine log:\n%s",
			err, f.batchHistory(s.BatchID()), logs)
	}
	t.Logf("results: %d", len(res.Results))
	os.RemoveAll(dir)
}

// hasStep reports whether a call's history has a step starting with what.
func hasStep(history []string, what string) bool {
	for _, l := range history {
		if _, rest, ok := strings.Cut(strings.TrimPrefix(l, "seq "), " "); ok && strings.HasPrefix(rest, what) {
			return true
		}
	}
	return false
}

// waitFor polls the events stream until cond holds.
func waitFor(ctx context.Context, t *testing.T, url, what string, cond func(*fold) bool) {
	t.Helper()
	for {
		if rec, err := readStreams(ctx, url); err == nil && cond(foldEvents(rec)) {
			return
		}
		if !sleepCtx(ctx, 50*time.Millisecond) {
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		}
	}
}
