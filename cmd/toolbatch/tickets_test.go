package main_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolbatch/toolbatch/internal/testproc"
	"github.com/toolbatch/toolbatch/internal/testwait"
)

const ticketsCatalog = `tools:
  - id: guarded
    builtin: echo
  - id: weather
    kind: client
gate:
  rules:
    - tools: ["guarded"]
      outcome: require_confirmation
`

// ticketsOf runs toolbatch tickets --json.
func ticketsOf(t *testing.T, url string, args ...string) []map[string]any {
	t.Helper()
	stdout, stderr, code := cli(t, ctxT(t, 30*time.Second), "", append([]string{"tickets", "--json", "--nats-url", url}, args...)...)
	if code != 0 {
		t.Fatalf("tickets: exit %d: %s", code, stderr)
	}
	var out []map[string]any
	if err := json.Unmarshal([]byte(stdout), &out); err != nil {
		t.Fatalf("tickets --json: %v: %q", err, stdout)
	}
	return out
}

// TestEveryTicketFromTheShell: submit --wait shows each ticket of its
// batch with the command that answers it and keeps waiting past its
// --timeout while the ticket is open; tickets lists them; approve answers
// the permission, result the client tool (text, and JSON blocks); a ticket
// answered with the wrong command names the right one; every command says
// what it did.
func TestEveryTicketFromTheShell(t *testing.T) {
	cat := filepath.Join(t.TempDir(), "catalog.yaml")
	if err := os.WriteFile(cat, []byte(ticketsCatalog), 0o644); err != nil {
		t.Fatal(err)
	}
	url := startEngine(t, "--catalog", cat)
	ctx := ctxT(t, 90*time.Second)

	wait := submitInBackgroundArgs(t, ctx, batch("tk-1", 1, `{"type":"tool_use","id":"b","name":"guarded","input":{}}`,
		`{"type":"tool_use","id":"w","name":"weather","input":{"city":"Paris"}}`), "--timeout", "1s", "--nats-url", url)
	var perm map[string]any
	testwait.Until(t, ctx, "the permission ticket", func() bool {
		ts := ticketsOf(t, url, "--run", "tk-1")
		if len(ts) == 1 && ts[0]["reason"] == "permission" {
			perm = ts[0]
			return true
		}
		return false
	})
	corr := perm["correlation_id"].(string)
	testwait.Until(t, ctx, "submit --wait's ticket line", func() bool {
		return strings.Contains(wait.stderr(), "waiting on ticket "+corr+" of run tk-1: permission for call b (tool guarded); answer: toolbatch approve tk-1 "+corr)
	})
	// --timeout is 1s: submit goes on waiting for well past it while the
	// batch is parked (the passing of time is what is tested here)
	parked, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	testwait.Holds(t, parked, "submit --wait waiting while its batch is parked", func() bool { return !wait.exited() })
	cancel()
	if got := ticketsOf(t, url, "--reason", "external_result"); len(got) != 0 {
		t.Errorf("tickets --reason external_result: %v", got)
	}

	stdout, stderr, code := cli(t, ctx, "", "approve", "tk-1", corr, "--principal", "alice", "--nats-url", url)
	if code != 0 || strings.TrimSpace(stdout) != "approved call b (tool guarded) of run tk-1 as alice (ticket "+corr+")" {
		t.Fatalf("approve: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}

	var ext map[string]any
	testwait.Until(t, ctx, "the client tool's ticket", func() bool {
		ts := ticketsOf(t, url, "--reason", "external_result")
		if len(ts) == 1 {
			ext = ts[0]
			return true
		}
		return false
	})
	ecorr := ext["correlation_id"].(string)
	// the wrong command names the right one
	_, stderr, code = cli(t, ctx, "", "approve", "tk-1", ecorr, "--nats-url", url)
	if code != 1 {
		t.Fatalf("approve of a client tool's ticket: exit %d", code)
	}
	oneLine(t, "approve of a client tool's ticket", stderr, "toolbatch: ticket "+ecorr+" of run tk-1 waits for a external_result, not for a permission: answer it with toolbatch result tk-1 "+ecorr)
	_, stderr, code = cli(t, ctx, "", "input", "tk-1", ecorr, "hello", "--nats-url", url)
	if code != 1 || !strings.Contains(stderr, "answer it with toolbatch result tk-1 "+ecorr) {
		t.Fatalf("input to a client tool's ticket: exit %d, %q", code, stderr)
	}
	stdout, stderr, code = cli(t, ctx, "18 degrees and sunny\n", "result", "tk-1", ecorr, "--nats-url", url)
	if code != 0 || strings.TrimSpace(stdout) != "sent the result of call w (tool weather) for ticket "+ecorr+" of run tk-1" {
		t.Fatalf("result: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	out, errOut, code := wait.wait()
	if code != 0 {
		t.Fatalf("submit --wait: exit %d: %s", code, errOut)
	}
	res := parseResults(t, out)
	if got := res.summary(); !strings.Contains(got, ":w:false:18 degrees and sunny") || !strings.Contains(got, ":b:false:") {
		t.Errorf("results: %s", got)
	}
	// The command names the deployment it was given, so that it can be pasted.
	if !strings.Contains(errOut, "waiting on ticket "+ecorr+" of run tk-1: external_result for call w (tool weather); answer: toolbatch result tk-1 "+ecorr+" --nats-url "+url+" < output.txt") {
		t.Errorf("submit --wait did not show the client tool's ticket: %s", errOut)
	}

	// --blocks: content blocks as JSON, checked by the engine's decoder
	if _, stderr, code := cli(t, ctx, batch("tk-2", 1, `{"type":"tool_use","id":"w","name":"weather","input":{}}`), "submit", "--nats-url", url); code != 0 {
		t.Fatalf("submit: %s", stderr)
	}
	testwait.Until(t, ctx, "the second client ticket", func() bool { return len(ticketsOf(t, url, "--run", "tk-2")) == 1 })
	c2 := ticketsOf(t, url, "--run", "tk-2")[0]["correlation_id"].(string)
	_, stderr, code = cli(t, ctx, `[{"type":"bogus"}]`, "result", "tk-2", c2, "--blocks", "--nats-url", url)
	if code != 1 || !strings.HasPrefix(stderr, "toolbatch: rejected ") {
		t.Fatalf("result with a bad block: exit %d, %q", code, stderr)
	}
	stdout, stderr, code = cli(t, ctx, `[{"type":"text","text":"no such city"}]`, "result", "tk-2", c2, "--blocks", "--error", "--json", "--nats-url", url)
	if code != 0 {
		t.Fatalf("result --blocks: exit %d: %s", code, stderr)
	}
	var d map[string]any
	if err := json.Unmarshal([]byte(stdout), &d); err != nil || d["done"] != "result" || d["call_id"] != "w" {
		t.Errorf("result --json: %q (%v)", stdout, err)
	}
	// the identical batch again, with --wait: its results
	stdout, stderr, code = cli(t, ctx, batch("tk-2", 1, `{"type":"tool_use","id":"w","name":"weather","input":{}}`), "submit", "--wait", "--nats-url", url)
	if code != 0 {
		t.Fatalf("submit --wait of the answered batch: exit %d: %s", code, stderr)
	}
	if got := parseResults(t, stdout).summary(); !strings.Contains(got, ":w:true:no such city") {
		t.Errorf("results of tk-2: %s", got)
	}
}

// background is a CLI command running while the test goes on.
type background struct {
	cmd            *exec.Cmd
	stdout, errOut testproc.Buffer
	done           chan struct{}
}

func (b *background) stderr() string { return b.errOut.String() }

func (b *background) exited() bool {
	select {
	case <-b.done:
		return true
	default:
		return false
	}
}

func (b *background) wait() (string, string, int) {
	<-b.done
	return b.stdout.String(), b.errOut.String(), b.cmd.ProcessState.ExitCode()
}

// submitInBackgroundArgs starts submit --wait with args.
func submitInBackgroundArgs(t *testing.T, ctx context.Context, body string, args ...string) *background {
	t.Helper()
	b := &background{done: make(chan struct{})}
	b.cmd = exec.CommandContext(ctx, cliBin, append([]string{"submit", "--wait"}, args...)...)
	b.cmd.Stdin = strings.NewReader(body)
	b.cmd.Stdout, b.cmd.Stderr = &b.stdout, &b.errOut
	if err := b.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = b.cmd.Wait(); close(b.done) }()
	t.Cleanup(func() { _ = b.cmd.Process.Kill(); <-b.done })
	return b
}
