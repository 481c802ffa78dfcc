package main_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/toolbatch/toolbatch/client"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/internal/testnats"
	"github.com/toolbatch/toolbatch/internal/testproc"
	"github.com/toolbatch/toolbatch/internal/testwait"
	"github.com/toolbatch/toolbatch/protocol"
)

// These tests build the engine binary, start it as a process with its
// embedded server in a temp directory, and talk to it only over NATS.

var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "toolbatch-engine-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bins, err := testproc.Build(dir, ".")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = bins[0]
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is a running engine and the URL of its embedded server.
type proc struct {
	*testproc.Proc
	url string
}

// startEngine starts the binary and waits for its "engine ready" log line.
func startEngine(t *testing.T, store string, port int, args ...string) *proc {
	t.Helper()
	all := append([]string{"--store", store, "--listen", fmt.Sprintf("127.0.0.1:%d", port), "--log-format", "json", "--ack-wait", "1s", "--inbox-ack-wait", "1s"}, args...)
	return &proc{Proc: testproc.Start(t, "engine", `"engine ready"`, binary, all...), url: fmt.Sprintf("nats://127.0.0.1:%d", port)}
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestJSONBatchFromAPlainClient submits a JSON batch with nothing but a
// NATS client and reads its results from the out stream.
func TestJSONBatchFromAPlainClient(t *testing.T) {
	p := startEngine(t, t.TempDir(), testproc.FreePort(t))
	js := testnats.JetStream(t, testnats.Connect(t, p.url))
	ctx := ctxT(t, 30*time.Second)
	msg := nats.NewMsg("toolbatch.submit.plain1")
	msg.Header.Set("Content-Type", "application/json")
	msg.Header.Set("Nats-Msg-Id", "plain1/1/a")
	msg.Data = []byte(`{"run_id":"plain1","thread_id":"t1","step":1,"assistant":{"id":"m1","content":[
		{"type":"text","text":"checking"},
		{"type":"tool_use","id":"a","name":"echo","input":{"q":"first"}},
		{"type":"tool_use","id":"b","name":"invented_tool","input":{}},
		{"type":"tool_use","id":"c","name":"echo","input":null}]}}`)
	if _, err := js.PublishMsg(ctx, msg); err != nil {
		t.Fatal(err)
	}
	cons, err := js.OrderedConsumer(ctx, "TOOLBATCH_OUT", jetstream.OrderedConsumerConfig{FilterSubjects: []string{"toolbatch.out.plain1.results"}})
	if err != nil {
		t.Fatal(err)
	}
	m, err := cons.Next(jetstream.FetchMaxWait(20 * time.Second))
	if err != nil {
		t.Fatalf("no results: %v\n%s", err, p.Logs())
	}
	var body map[string]any
	if err := msgpack.Unmarshal(m.Data(), &body); err != nil {
		t.Fatal(err)
	}
	results := body["results"].([]any)
	var got []string
	for _, r := range results {
		rm := r.(map[string]any)
		text := rm["content"].([]any)[0].(map[string]any)["text"]
		got = append(got, fmt.Sprintf("%s:%v:%v", rm["tool_use_id"], rm["is_error"], text))
	}
	want := `[a:false:{"q":"first"} b:true:unknown tool: invented_tool c:false:{}]`
	if fmt.Sprint(got) != want {
		t.Fatalf("results %v, want %s", got, want)
	}
}

func TestBadFlagsAndCatalog(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("tools:\n  - id: x\n    target: cloud\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	noAuth := filepath.Join(t.TempDir(), "none.yaml")
	unknownBuiltin := filepath.Join(t.TempDir(), "builtin.yaml")
	if err := os.WriteFile(unknownBuiltin, []byte("tools:\n  - {id: x, builtin: rm}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// refused before anything starts: the store stays empty
	store := t.TempDir()
	if out, err := exec.Command(binary, "--catalog", unknownBuiltin, "--store", store).CombinedOutput(); err == nil ||
		strings.TrimSpace(string(out)) != "engine: "+unknownBuiltin+":2: tools[0] (id \"x\"): unknown builtin rm (the engine has echo, sleep and fail)" {
		t.Errorf("an unknown builtin: %v: %s", err, out)
	}
	if entries, _ := os.ReadDir(store); len(entries) != 0 {
		t.Errorf("a refused start wrote %d entries into the store", len(entries))
	}
	for _, c := range []struct {
		args []string
		want string // in the line
	}{
		{[]string{"--no-such-flag"}, "no-such-flag"},
		{[]string{"--log-format", "xml"}, "xml"},
		{[]string{"--listen", "nonsense"}, "nonsense"},
		// An open listener without authentication: refused, saying what to do.
		{[]string{"--listen", "0.0.0.0:4222"}, "give --auth FILE"},
		{[]string{"--listen", ":4222"}, "loopback only"},
		{[]string{"--auth", noAuth}, "auth file"},
		{[]string{"--tls-cert", "x.pem"}, "--tls-cert and --tls-key go together"},
		{[]string{"--creds", "x.creds"}, "--creds and --tls-ca are for --nats-url"},
		{[]string{"--nats-url", "nats://127.0.0.1:1", "--tls-cert", "x.pem", "--tls-key", "y.pem"}, "with --nats-url, give --creds"},
		{[]string{"--nats-url", "nats://127.0.0.1:1", "--auth", noAuth}, "auth file"},
		{[]string{"--cache-runs", "0"}, "--cache-runs 0"},
		{[]string{"--catalog", bad}, "cloud"},
		{[]string{"--catalog", filepath.Join(t.TempDir(), "missing.yaml")}, "missing.yaml"},
	} {
		cmd := exec.Command(binary, append(c.args, "--store", t.TempDir())...)
		out, err := cmd.CombinedOutput()
		if err == nil || cmd.ProcessState.ExitCode() == 0 {
			t.Fatalf("%v: exited 0", c.args)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if len(lines) != 1 || !strings.HasPrefix(lines[0], "engine: ") || !strings.Contains(lines[0], c.want) {
			t.Fatalf("%v: want one line starting with \"engine: \" and saying %q, got:\n%s", c.args, c.want, out)
		}
	}
}

func TestSIGTERMExitsZero(t *testing.T) {
	p := startEngine(t, t.TempDir(), testproc.FreePort(t))
	if err := p.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Exited():
	case <-time.After(30 * time.Second):
		t.Fatal("engine did not exit on SIGTERM")
	}
	if code := p.Cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("exit code %d after SIGTERM:\n%s", code, p.Logs())
	}
}

// TestKillNineLosesNothing kills the engine (and its embedded server) with
// SIGKILL in the middle of a stream of batches and restarts it on the same
// store: every accepted batch gets exactly one results message, with every
// call's result in model order.
func TestKillNineLosesNothing(t *testing.T) {
	store, port := t.TempDir(), testproc.FreePort(t)
	p := startEngine(t, store, port)
	nc := testnats.Connect(t, p.url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	c, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 120*time.Second)
	const runs, steps = 6, 4
	accepted := make(chan string, runs*steps)
	var wg sync.WaitGroup
	for r := 0; r < runs; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			run := fmt.Sprintf("k%d", r)
			for s := int64(1); s <= steps; s++ {
				sub := &protocol.Submit{RunID: run, ThreadID: "t", Step: s, Assistant: events.Message{ID: "m", Content: []events.ContentBlock{
					{Type: events.BlockToolUse, ID: "c1", Name: "echo", Input: events.MustJSON(fmt.Sprintf(`{"s":%d}`, s))},
					{Type: events.BlockToolUse, ID: "c2", Name: "sleep", Input: events.MustJSON(`{"duration":"30ms"}`)},
					{Type: events.BlockToolUse, ID: "c3", Name: "echo", Input: events.MustJSON(`{}`)},
				}}}
				// Retry the submit until it is accepted by the stream: the
				// same message id makes a retry harmless.
				for {
					sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
					err := c.Submit(sctx, sub)
					cancel()
					if err == nil {
						break
					}
					if ctx.Err() != nil {
						return
					}
				}
				accepted <- events.BatchID(run, s)
				for {
					wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
					_, err := c.WaitResults(wctx, run, events.BatchID(run, s))
					cancel()
					if err == nil {
						break
					}
					if ctx.Err() != nil {
						return
					}
				}
			}
		}()
	}
	// Kill once a few batches have been accepted.
	for i := 0; i < runs; i++ {
		select {
		case <-accepted:
		case <-ctx.Done():
			t.Fatal("no batch accepted")
		}
	}
	p.Kill()
	p = startEngine(t, store, port)
	wg.Wait()
	if ctx.Err() != nil {
		t.Fatalf("runs did not finish:\n%s", p.Logs())
	}
	js := testnats.JetStream(t, nc)
	out, err := js.Stream(ctx, "TOOLBATCH_OUT")
	if err != nil {
		t.Fatal(err)
	}
	cons, err := js.OrderedConsumer(ctx, "TOOLBATCH_OUT", jetstream.OrderedConsumerConfig{FilterSubjects: []string{"toolbatch.out.*.results"}})
	if err != nil {
		t.Fatal(err)
	}
	info, err := out.Info(ctx, jetstream.WithSubjectFilter("toolbatch.out.*.results"))
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, n := range info.State.Subjects {
		total += int(n)
	}
	if total != runs*steps {
		t.Fatalf("%d results messages, want %d (one per accepted batch)", total, runs*steps)
	}
	seen := map[string]int{}
	for i := 0; i < total; i++ {
		m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var r protocol.ResultsOut
		if err := events.Unmarshal(m.Data(), &r); err != nil {
			t.Fatal(err)
		}
		seen[r.BatchID]++
		if len(r.Results) != 3 || r.Results[0].ToolUseID != "c1" || r.Results[1].ToolUseID != "c2" || r.Results[2].ToolUseID != "c3" {
			t.Fatalf("%s: results %+v", r.BatchID, r.Results)
		}
	}
	for r := 0; r < runs; r++ {
		for s := int64(1); s <= steps; s++ {
			id := events.BatchID(fmt.Sprintf("k%d", r), s)
			if seen[id] != 1 {
				t.Fatalf("%s: %d results messages, want 1", id, seen[id])
			}
		}
	}
}

// TestRestartTakesItsRunsBack: an engine killed while a call runs and
// restarted on its store (which keeps its id) takes the run back at once,
// rather than when its owner keys expire and its unfinished messages come
// back (after an ack wait of 2 minutes here): the batch's results arrive
// well before that.
func TestRestartTakesItsRunsBack(t *testing.T) {
	store, port := t.TempDir(), testproc.FreePort(t)
	p := startEngine(t, store, port, "--ack-wait", "2m", "--inbox-ack-wait", "2m")
	nc := testnats.Connect(t, p.url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	c, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 60*time.Second)
	sub := &protocol.Submit{RunID: "rb", ThreadID: "t", Step: 1, Assistant: events.Message{ID: "m", Content: []events.ContentBlock{
		{Type: events.BlockToolUse, ID: "c1", Name: "sleep", Input: events.MustJSON(`{"duration":"2s"}`)}}}}
	if err := c.Submit(ctx, sub); err != nil {
		t.Fatal(err)
	}
	js := testnats.JetStream(t, nc)
	ev, err := js.Stream(ctx, "TOOLBATCH_EVENTS")
	if err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, ctx, "the call executing", func() bool {
		m, err := ev.GetLastMsgForSubject(ctx, "toolbatch.events.rb")
		return err == nil && slices.Contains(m.Header.Values(protocol.HeaderEvent), string(events.TypeCallExecuting))
	})
	p.Kill()
	p = startEngine(t, store, port, "--ack-wait", "2m", "--inbox-ack-wait", "2m")
	c2, err := client.New(testnats.Connect(t, p.url)) // a connection to the restarted server
	if err != nil {
		t.Fatal(err)
	}
	res, err := c2.WaitResults(ctx, "rb", "rb/1")
	if err != nil {
		t.Fatalf("the run after the restart: %v\n%s", err, p.Logs())
	}
	if len(res.Results) != 1 || res.Results[0].IsError {
		t.Fatalf("results %+v", res.Results)
	}
}

// TestAnotherEngineTakesAKilledEnginesRuns: two engines on one server;
// the one that owns the runs is killed while their calls run, and the
// other takes them over at once: it finds the killed engine gone (its
// probes meet no responders) rather than waiting for the killed engine's
// messages to come back after an ack wait of 2 minutes here. The runs'
// results arrive well before that; and the calls of the runs the live
// engine owned are not touched.
func TestAnotherEngineTakesAKilledEnginesRuns(t *testing.T) {
	url := testnats.Start(t, t.TempDir())
	engineAt := func(name string) *testproc.Proc {
		return testproc.Start(t, name, `"engine ready"`, binary, "--nats-url", url, "--log-format", "json", "--ack-wait", "2m", "--inbox-ack-wait", "2m")
	}
	doomed := engineAt("doomed")
	nc := testnats.Connect(t, url)
	c, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 60*time.Second)
	js := testnats.JetStream(t, nc)
	ev, err := js.Stream(ctx, "TOOLBATCH_EVENTS")
	if err != nil {
		t.Fatal(err)
	}
	runs := []string{"k1", "k2", "k3"}
	for _, run := range runs {
		sub := &protocol.Submit{RunID: run, ThreadID: "t", Step: 1, Assistant: events.Message{ID: "m", Content: []events.ContentBlock{
			{Type: events.BlockToolUse, ID: "c1", Name: "sleep", Input: events.MustJSON(`{"duration":"3s"}`)}}}}
		if err := c.Submit(ctx, sub); err != nil {
			t.Fatal(err)
		}
	}
	for _, run := range runs {
		testwait.Until(t, ctx, run+"'s call executing", func() bool {
			m, err := ev.GetLastMsgForSubject(ctx, "toolbatch.events."+run)
			return err == nil && slices.Contains(m.Header.Values(protocol.HeaderEvent), string(events.TypeCallExecuting))
		})
	}
	heir := engineAt("heir")
	doomed.Kill()
	for _, run := range runs {
		res, err := c.WaitResults(ctx, run, run+"/1")
		if err != nil {
			t.Fatalf("%s after its engine was killed: %v\n%s", run, err, heir.Logs())
		}
		if len(res.Results) != 1 || res.Results[0].IsError {
			t.Fatalf("%s: results %+v", run, res.Results)
		}
	}
	if !strings.Contains(heir.Logs(), "taking its runs over") {
		t.Fatalf("the heir did not find the killed engine gone:\n%s", heir.Logs())
	}
}

// TestSecondEngineOnAStoreExits: the store is locked while an engine runs
// its embedded server on it; a second engine on the same --store exits
// with one line naming the first, and changes nothing; once the first is
// gone (killed: the kernel drops its lock) the store starts again.
func TestSecondEngineOnAStoreExits(t *testing.T) {
	store := t.TempDir()
	first := startEngine(t, store, testproc.FreePort(t))
	cmd := exec.Command(binary, "--store", store, "--listen", fmt.Sprintf("127.0.0.1:%d", testproc.FreePort(t)))
	out, _ := cmd.CombinedOutput()
	want := fmt.Sprintf("engine: --store %s is in use by process %d (an engine with its embedded server): stop it, or give this engine another --store", store, first.Cmd.Process.Pid)
	if cmd.ProcessState.ExitCode() == 0 || strings.TrimSpace(string(out)) != want {
		t.Fatalf("second engine: exit %d, output %q, want %q", cmd.ProcessState.ExitCode(), out, want)
	}
	first.Kill()
	startEngine(t, store, testproc.FreePort(t))
}

// TestConsoleLogsArePlainOffATerminal: the console format written to a
// pipe or a file carries no colour codes.
func TestConsoleLogsArePlainOffATerminal(t *testing.T) {
	p := testproc.Start(t, "engine", "engine ready", binary, "--store", t.TempDir(), "--listen", fmt.Sprintf("127.0.0.1:%d", testproc.FreePort(t)))
	if logs := p.Logs(); strings.Contains(logs, "\x1b[") || !strings.Contains(logs, "INF") {
		t.Fatalf("console logs on a pipe:\n%q", logs)
	}
}

// TestMakeRunStopsOnSIGTERM: make run execs the engine it built, so that
// kill -TERM of make reaches it: it exits and frees its port.
func TestMakeRunStopsOnSIGTERM(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatalf("make is not installed: %v", err) // the README's commands need it
	}
	port := testproc.FreePort(t)
	args := fmt.Sprintf("ARGS=--store %s --listen 127.0.0.1:%d --log-format json", t.TempDir(), port)
	p := testproc.Start(t, "make run", `"engine ready"`, "make", "-s", "-C", "../..", "run", args)
	if err := p.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Exited():
	case <-time.After(30 * time.Second):
		t.Fatal("make run did not exit on SIGTERM")
	}
	// the engine is gone with make: its port is free again
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	testwait.Until(t, ctx, "the engine's port free", func() bool {
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			ln.Close()
		}
		return err == nil
	})
}
