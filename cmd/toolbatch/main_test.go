package main_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/toolbatch/toolbatch/internal/testproc"
)

// These tests build the toolbatch CLI and the engine, start the engine as a
// process with its embedded NATS server in a temp directory, and run the CLI
// against it as a shell script would.

var cliBin, engineBin string

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "toolbatch-cli-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	cliBin = filepath.Join(dir, "toolbatch")
	engineBin = filepath.Join(dir, "engine")
	for bin, pkg := range map[string]string{cliBin: ".", engineBin: "../engine"} {
		build := exec.Command("go", "build", "-o", bin, pkg)
		build.Stderr = os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n", pkg, err)
			return 1
		}
	}
	return m.Run()
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// startEngine starts the engine on a free port and waits for its "engine
// ready" log line. It returns the NATS URL.
func startEngine(t *testing.T, args ...string) string {
	t.Helper()
	port := testproc.FreePort(t)
	all := append([]string{"--store", t.TempDir(), "--listen", fmt.Sprintf("127.0.0.1:%d", port), "--log-format", "json"}, args...)
	cmd := exec.Command(engineBin, all...)
	pipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	ready := make(chan struct{})
	var logs testproc.Buffer
	go func() {
		sc := bufio.NewScanner(pipe)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		var once sync.Once
		for sc.Scan() {
			fmt.Fprintln(&logs, sc.Text())
			if strings.Contains(sc.Text(), "engine ready") {
				once.Do(func() { close(ready) })
			}
		}
		_, _ = io.Copy(io.Discard, pipe)
	}()
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			_ = cmd.Process.Signal(syscall.SIGKILL)
			<-exited
		}
		if t.Failed() {
			t.Logf("engine log:\n%s", logs.String())
		}
	})
	select {
	case <-ready:
	case <-exited:
		t.Fatalf("engine exited before it was ready:\n%s", logs.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("engine not ready within 30s:\n%s", logs.String())
	}
	return fmt.Sprintf("nats://127.0.0.1:%d", port)
}

// cli runs the CLI to completion and returns its stdout, stderr and exit
// status.
func cli(t *testing.T, ctx context.Context, stdin string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.CommandContext(ctx, cliBin, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("toolbatch %v: %v", args, err)
	}
	if ctx.Err() != nil {
		t.Fatalf("toolbatch %v did not finish in time; stderr:\n%s", args, stderr.String())
	}
	return stdout.String(), stderr.String(), cmd.ProcessState.ExitCode()
}

// oneLine checks that stderr is exactly one line starting with prefix.
func oneLine(t *testing.T, what, stderr, prefix string) {
	t.Helper()
	lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
	if len(lines) != 1 || !strings.HasPrefix(lines[0], prefix) {
		t.Fatalf("%s: want one stderr line starting with %q, got:\n%s", what, prefix, stderr)
	}
}

// watchLine is one line of toolbatch watch.
type watchLine struct {
	Kind    string          `json:"kind"`
	Subject string          `json:"subject"`
	Body    json.RawMessage `json:"body"`
}

// watchUntil runs toolbatch watch on the run until it prints a line of the
// kind, then interrupts it (SIGINT must exit 0) and returns that line.
func watchUntil(t *testing.T, ctx context.Context, url, runID, kind string) watchLine {
	t.Helper()
	cmd := exec.CommandContext(ctx, cliBin, "watch", runID, "--nats-url", url)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr testproc.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
	})
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	var found *watchLine
	var seen []string
	for found == nil && sc.Scan() {
		seen = append(seen, sc.Text())
		var l watchLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("watch printed a line that is not JSON: %q: %v", sc.Text(), err)
		}
		if l.Kind == "" || l.Subject != "toolbatch.out."+runID+"."+l.Kind || len(l.Body) == 0 || l.Body[0] != '{' {
			t.Fatalf("watch line %q: want kind, subject toolbatch.out.%s.<kind> and an object body", sc.Text(), runID)
		}
		if l.Kind == kind {
			found = &l
		}
	}
	if found == nil {
		t.Fatalf("watch ended without a %s line (context: %v); lines:\n%s\nstderr:\n%s", kind, ctx.Err(), strings.Join(seen, "\n"), stderr.String())
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	go func() {
		_, _ = io.Copy(io.Discard, stdout)
		done <- cmd.Wait()
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("watch after SIGINT: %v (want exit 0); stderr:\n%s", err, stderr.String())
		}
	case <-ctx.Done():
		t.Fatalf("watch did not exit after SIGINT")
	}
	return *found
}

// results is the JSON submit --wait prints.
type results struct {
	BatchID string `json:"batch_id"`
	Step    int64  `json:"step"`
	Results []struct {
		Type      string `json:"type"`
		ToolUseID string `json:"tool_use_id"`
		Content   []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
		IsError bool `json:"is_error"`
	} `json:"results"`
	State      []json.RawMessage `json:"state"`
	Submission struct {
		MsgID    string `json:"msg_id"`
		InboxSeq uint64 `json:"inbox_seq"`
		Digest   string `json:"digest"`
	} `json:"submission"`
}

func (r results) summary() string {
	var parts []string
	for _, b := range r.Results {
		text := ""
		for _, c := range b.Content {
			text += c.Text
		}
		parts = append(parts, fmt.Sprintf("%s:%s:%v:%s", b.Type, b.ToolUseID, b.IsError, text))
	}
	return strings.Join(parts, " | ")
}

func parseResults(t *testing.T, stdout string) results {
	t.Helper()
	if strings.Count(strings.TrimRight(stdout, "\n"), "\n") != 0 {
		t.Fatalf("want one JSON object on one line, got:\n%s", stdout)
	}
	var r results
	dec := json.NewDecoder(strings.NewReader(stdout))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		t.Fatalf("stdout is not the results object: %v\n%s", err, stdout)
	}
	return r
}

func batch(runID string, step int, calls ...string) string {
	content := []string{`{"type":"text","text":"calling tools"}`}
	content = append(content, calls...)
	return fmt.Sprintf(`{"run_id":%q,"thread_id":"thread-1","step":%d,"assistant":{"id":"msg-%d","content":[%s]}}`,
		runID, step, step, strings.Join(content, ","))
}

func TestSubmitWaitPrintsResultsInModelOrder(t *testing.T) {
	url := startEngine(t)
	ctx := ctxT(t, 60*time.Second)
	body := batch("cli-1", 1,
		`{"type":"tool_use","id":"first","name":"echo","input":{"n":1}}`,
		`{"type":"tool_use","id":"second","name":"echo","input":{"n":2,"s":"<b>"}}`)
	stdout, stderr, code := cli(t, ctx, body, "submit", "--wait", "--nats-url", url)
	if code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}
	r := parseResults(t, stdout)
	want := `tool_result:first:false:{"n":1} | tool_result:second:false:{"n":2,"s":"<b>"}`
	if r.BatchID != "cli-1/1" || r.Step != 1 || r.summary() != want || r.State == nil || len(r.State) != 0 {
		t.Fatalf("results %s (batch %s, step %d, state %v), want %s", r.summary(), r.BatchID, r.Step, r.State, want)
	}
	if r.Submission.InboxSeq == 0 || !strings.HasPrefix(r.Submission.MsgID, "cli-1/1/") || r.Submission.Digest == "" {
		t.Fatalf("the results name no submission: %+v", r.Submission)
	}

	// The same body again is a retry: deduplicated, same results.
	stdout, stderr, code = cli(t, ctx, body, "submit", "--wait", "--nats-url", url)
	if code != 0 || parseResults(t, stdout).summary() != want {
		t.Fatalf("retry: exit %d, stdout %s, stderr %s", code, stdout, stderr)
	}

	// Another batch for the accepted step: the engine rejects it.
	other := batch("cli-1", 1, `{"type":"tool_use","id":"third","name":"echo","input":{}}`)
	stdout, stderr, code = cli(t, ctx, other, "submit", "--wait", "--nats-url", url)
	if code != 1 || stdout != "" {
		t.Fatalf("engine rejection: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	oneLine(t, "engine rejection", stderr, "toolbatch: rejected step_not_after_last: ")
}

func TestBadInputIsOneLine(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	// Local refusals need no engine: nothing is published.
	noEngine := "nats://127.0.0.1:1"
	for _, c := range []struct {
		name, body, prefix string
	}{
		{"not JSON", `{"run_id":`, "toolbatch: rejected undecodable: "},
		{"empty", ``, "toolbatch: rejected undecodable: "},
		{"forbidden field", `{"run_id":"r","thread_id":"t","step":1,"assistant":{"content":[]},"target":"sandbox"}`, "toolbatch: rejected forbidden_field: "},
		{"bad run id", batch("bad.run", 1), "toolbatch: rejected invalid_id: "},
		{"duplicate call id", batch("r", 1, `{"type":"tool_use","id":"a","name":"echo","input":{}}`, `{"type":"tool_use","id":"a","name":"echo","input":{}}`), "toolbatch: rejected duplicate_call_id: "},
	} {
		stdout, stderr, code := cli(t, ctx, c.body, "submit", "--wait", "--nats-url", noEngine)
		if code != 1 || stdout != "" {
			t.Fatalf("%s: exit %d, stdout %q, stderr %q", c.name, code, stdout, stderr)
		}
		oneLine(t, c.name, stderr, c.prefix)
	}

	for _, args := range [][]string{
		{},
		{"frobnicate"},
		{"submit", "extra"},
		{"submit", "--no-such-flag"},
		{"watch"},
		{"watch", "bad.run"},
		{"approve", "run-1"},
		{"deny", "run-1", "corr", "--note", "x"},
		{"cancel", "run-1", "run-2"},
		{"perform", "run-1", "bad corr"},
		{"cancel", "run-1", "--prefix", "a..b"},
	} {
		stdout, stderr, code := cli(t, ctx, "", args...)
		if code != 2 || stdout != "" {
			t.Fatalf("%v: exit %d, stdout %q, stderr %q; want exit 2", args, code, stdout, stderr)
		}
		if len(args) == 0 {
			if !strings.HasPrefix(stderr, "toolbatch: no command\nusage:") {
				t.Fatalf("no command: stderr %q", stderr)
			}
			continue
		}
		oneLine(t, fmt.Sprint(args), stderr, "toolbatch: ")
	}

	// NATS unreachable: exit 1, one line.
	_, stderr, code := cli(t, ctx, "", "cancel", "run-1", "--nats-url", noEngine)
	if code != 1 {
		t.Fatalf("unreachable NATS: exit %d, stderr %q", code, stderr)
	}
	oneLine(t, "unreachable NATS", stderr, "toolbatch: connect to nats://127.0.0.1:1: ")
}

func TestCancelThenWatchShowsEnded(t *testing.T) {
	url := startEngine(t)
	ctx := ctxT(t, 60*time.Second)
	// Flags may follow the arguments.
	stdout, stderr, code := cli(t, ctx, "", "cancel", "cli-3", "--reason", "user left", "--nats-url", url)
	if code != 0 || strings.TrimSpace(stdout) != "asked the engine to cancel run cli-3 (toolbatch watch cli-3 shows it ended)" || stderr != "" {
		t.Fatalf("cancel: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	l := watchUntil(t, ctx, url, "cli-3", "ended")
	var ended struct {
		Cause  string `json:"cause"`
		Reason string `json:"reason"`
	}
	if err := json.Unmarshal(l.Body, &ended); err != nil || ended.Cause != "cancelled" || ended.Reason != "user left" {
		t.Fatalf("ended body %s (%v), want cause cancelled, reason \"user left\"", l.Body, err)
	}

	// A submission for the ended run is rejected by the engine.
	_, stderr, code = cli(t, ctx, batch("cli-3", 1, `{"type":"tool_use","id":"a","name":"echo","input":{}}`),
		"submit", "--wait", "--nats-url", url)
	if code != 1 {
		t.Fatalf("submit to an ended run: exit %d, stderr %q", code, stderr)
	}
	// The rejection, or the end when the watch caught up before the engine
	// published the rejection.
	if !strings.HasPrefix(stderr, "toolbatch: run cli-3 ended (cancelled)") {
		oneLine(t, "submit to an ended run", stderr, "toolbatch: rejected run_ended: ")
	}
	oneLine(t, "submit to an ended run", stderr, "toolbatch: ")
}

const confirmCatalog = `tools:
  - id: echo
    builtin: echo
    recovery: {mode: replay_safe, max_attempts: 3}
  - id: guarded
    builtin: echo
gate:
  rules:
    - tools: ["guarded"]
      outcome: require_confirmation
`

// submitInBackground starts submit --wait and returns a function that waits
// for it and returns its stdout, stderr and exit status.
func submitInBackground(t *testing.T, ctx context.Context, url, body string) func() (string, string, int) {
	t.Helper()
	cmd := exec.CommandContext(ctx, cliBin, "submit", "--wait", "--timeout", "50s", "--nats-url", url)
	cmd.Stdin = strings.NewReader(body)
	var stdout, stderr testproc.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	return func() (string, string, int) {
		err := cmd.Wait()
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			t.Fatalf("submit: %v", err)
		}
		return stdout.String(), stderr.String(), cmd.ProcessState.ExitCode()
	}
}

func TestApproveAndDeny(t *testing.T) {
	cat := filepath.Join(t.TempDir(), "catalog.yaml")
	if err := os.WriteFile(cat, []byte(confirmCatalog), 0o644); err != nil {
		t.Fatal(err)
	}
	url := startEngine(t, "--catalog", cat)
	ctx := ctxT(t, 90*time.Second)

	ticketOf := func(runID string) string {
		t.Helper()
		l := watchUntil(t, ctx, url, runID, "awaiting")
		var ticket struct {
			CorrelationID string `json:"correlation_id"`
			CallID        string `json:"call_id"`
			Reason        string `json:"reason"`
		}
		if err := json.Unmarshal(l.Body, &ticket); err != nil || ticket.CallID != "b" || ticket.Reason != "permission" {
			t.Fatalf("awaiting body %s (%v): want the permission ticket of call b", l.Body, err)
		}
		return ticket.CorrelationID
	}
	calls := []string{
		`{"type":"tool_use","id":"a","name":"echo","input":{"x":1}}`,
		`{"type":"tool_use","id":"b","name":"guarded","input":{"y":2}}`,
	}

	// Approve.
	wait := submitInBackground(t, ctx, url, batch("cli-4", 1, calls...))
	corr := ticketOf("cli-4")
	if _, stderr, code := cli(t, ctx, "", "approve", "cli-4", corr, "--principal", "alice", "--note", "fine", "--nats-url", url); code != 0 {
		t.Fatalf("approve: exit %d, stderr %q", code, stderr)
	}
	stdout, stderr, code := wait()
	if code != 0 {
		t.Fatalf("submit --wait: exit %d, stderr %q", code, stderr)
	}
	if got, want := parseResults(t, stdout).summary(), `tool_result:a:false:{"x":1} | tool_result:b:false:{"y":2}`; got != want {
		t.Fatalf("approved results %s, want %s", got, want)
	}
	// The ticket is resolved: a second answer is refused before it is sent.
	_, stderr, code = cli(t, ctx, "", "deny", "cli-4", corr, "--nats-url", url)
	if code != 1 {
		t.Fatalf("second answer: exit %d, stderr %q", code, stderr)
	}
	oneLine(t, "second answer", stderr, "toolbatch: ticket "+corr+" of run cli-4 is no longer open: ")
	// An unknown ticket.
	_, stderr, code = cli(t, ctx, "", "approve", "cli-4", "nope", "--nats-url", url)
	if code != 1 {
		t.Fatalf("unknown ticket: exit %d, stderr %q", code, stderr)
	}
	oneLine(t, "unknown ticket", stderr, "toolbatch: run cli-4 has no ticket nope")
	// A run without any out message at all.
	_, stderr, code = cli(t, ctx, "", "approve", "cli-none", "nope", "--nats-url", url)
	if code != 1 {
		t.Fatalf("run without tickets: exit %d, stderr %q", code, stderr)
	}
	oneLine(t, "run without tickets", stderr, "toolbatch: run cli-none has no ticket nope")

	// Deny.
	wait = submitInBackground(t, ctx, url, batch("cli-5", 1, calls...))
	corr = ticketOf("cli-5")
	if _, stderr, code := cli(t, ctx, "", "deny", "cli-5", corr, "--reason", "not today", "--nats-url", url); code != 0 {
		t.Fatalf("deny: exit %d, stderr %q", code, stderr)
	}
	stdout, stderr, code = wait()
	if code != 0 {
		t.Fatalf("submit --wait: exit %d, stderr %q", code, stderr)
	}
	if got, want := parseResults(t, stdout).summary(), `tool_result:a:false:{"x":1} | tool_result:b:true:blocked: not today`; got != want {
		t.Fatalf("denied results %s, want %s", got, want)
	}
}

// TestToolsPrintsDefinitions: the catalog's tools as each provider's tool
// definitions.
func TestToolsPrintsDefinitions(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	cat := "../../examples/agentloop/catalog.yaml"
	for format, want := range map[string]string{
		"anthropic":        `{"description":"Asks the user a question and returns the answer.","input_schema":{"properties":{"question":{"type":"string"}},"required":["question"],"type":"object"},"name":"ask_user"}`,
		"openai":           `{"function":{"description":"Asks the user a question and returns the answer.","name":"ask_user","parameters":{"properties":{"question":{"type":"string"}},"required":["question"],"type":"object"}},"type":"function"}`,
		"openai-responses": `{"description":"Asks the user a question and returns the answer.","name":"ask_user","parameters":{"properties":{"question":{"type":"string"}},"required":["question"],"type":"object"},"type":"function"}`,
	} {
		stdout, stderr, code := cli(t, ctx, "", "tools", "--catalog", cat, "--format", format)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", format, code, stderr)
		}
		var defs []json.RawMessage
		if err := json.Unmarshal([]byte(stdout), &defs); err != nil || len(defs) != 3 || string(defs[2]) != want {
			t.Fatalf("%s: %v\n got %s\nwant the third %s", format, err, stdout, want)
		}
	}
	if _, stderr, code := cli(t, ctx, "", "tools", "--format", "gemini"); code != 2 || !strings.Contains(stderr, `--format "gemini"`) {
		t.Fatalf("an unknown format: exit %d, %q", code, stderr)
	}
}
