package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/access"
	"github.com/toolbatch/toolbatch/internal/testnats"
	"github.com/toolbatch/toolbatch/internal/testproc"
	"github.com/toolbatch/toolbatch/proof"
	"github.com/toolbatch/toolbatch/replay"
)

// TestEndToEnd runs the engine as a process, submits JSON batches with a
// plain NATS client, waits for their results, and then replays the stream
// from NATS and from an export of it: the history names every call, the
// two histories are the same, and the audit passes on both.
func TestEndToEnd(t *testing.T) {
	bins, err := testproc.Build(t.TempDir(), "../engine", ".", "../toolbatch")
	if err != nil {
		t.Fatal(err)
	}
	engineBin, replayBin, cliBin := bins[0], bins[1], bins[2]
	port := testproc.FreePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	store := t.TempDir()
	testproc.Start(t, "engine", `"engine ready"`, engineBin,
		"--store", store, "--listen", fmt.Sprintf("127.0.0.1:%d", port), "--log-format", "json")

	js := testnats.JetStream(t, testnats.Connect(t, url))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// Each batch: run, step, and its calls as "id tool {json}"; call ids
	// are unique across the test so that the history can be searched.
	batches := []struct {
		run   string
		step  int
		calls []string
	}{
		{"e2e-a", 1, []string{`a1 echo {"q":"first"}`, `a2 invented_tool {}`, `a3 echo null`}},
		{"e2e-b", 1, []string{`b1 fail {}`, `b2 echo {"n":2}`}},
		{"e2e-a", 2, []string{`a4 echo {"q":"second"}`}},
	}
	var calls []string
	for _, b := range batches {
		var blocks []string
		for _, c := range b.calls {
			f := strings.SplitN(c, " ", 3)
			blocks = append(blocks, fmt.Sprintf(`{"type":"tool_use","id":%q,"name":%q,"input":%s}`, f[0], f[1], f[2]))
			calls = append(calls, fmt.Sprintf("%s/%d %s", b.run, b.step, f[0]))
		}
		msg := nats.NewMsg("toolbatch.submit." + b.run)
		msg.Header.Set("Content-Type", "application/json")
		msg.Header.Set("Nats-Msg-Id", fmt.Sprintf("%s/%d", b.run, b.step))
		msg.Data = fmt.Appendf(nil, `{"run_id":%q,"thread_id":"t","step":%d,"assistant":{"id":"m","content":[{"type":"text","text":"on it"},%s]}}`,
			b.run, b.step, strings.Join(blocks, ","))
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
		waitResults(t, ctx, js, b.run, b.step)
	}

	dir := t.TempDir()
	fromNATS := runReplay(t, replayBin, 0, "--nats-url", url)
	for _, c := range calls {
		batch, id, _ := strings.Cut(c, " ")
		if !regexp.MustCompile(`(?m)^\s+\d+\s+\S+\s+` + id + `\s+published\s`).MatchString(batchSection(fromNATS, batch)) {
			t.Errorf("the history has no published result for %s:\n%s", c, fromNATS)
		}
	}
	if !strings.Contains(fromNATS, `error "unknown tool: invented_tool"`) {
		t.Errorf("history:\n%s", fromNATS)
	}
	if got := runReplay(t, replayBin, 0, "--nats-url", url, "--run", "e2e-b"); strings.Contains(got, "e2e-a") || !strings.Contains(got, "batch e2e-b/1") {
		t.Errorf("--run e2e-b:\n%s", got)
	}
	// From the submission of e2e-a/2 on (how many commits come before it
	// depends on how the engine groups its decisions).
	sub := regexp.MustCompile(`batch e2e-a/2 +step 2 +submitted at seq (\d+)`).FindStringSubmatch(fromNATS)
	if sub == nil {
		t.Fatalf("the history has no submission of e2e-a/2:\n%s", fromNATS)
	}
	if got := runReplay(t, replayBin, 0, "--nats-url", url, "--from-seq", sub[1]); !strings.Contains(got, "batch e2e-a/2") ||
		strings.Contains(got, "e2e-a/1") || !strings.Contains(got, "not folded") {
		t.Errorf("--from-seq %s:\n%s", sub[1], got)
	}
	if got := runReplay(t, replayBin, 0, "--nats-url", url, "--since", time.Now().Add(time.Hour).Format(time.RFC3339)); got != "no events\n" {
		t.Errorf("--since in an hour:\n%s", got)
	}
	if got := runReplay(t, replayBin, 0, "audit", "--nats-url", url, "--run", "e2e-b"); !regexp.MustCompile(`^audit: every invariant holds: 1 run, 8 events in \d+ commits, 3 out messages`).MatchString(got) {
		t.Errorf("audit --run e2e-b: %s", got)
	}
	// a run the log does not have is not "every invariant holds"
	if got := runReplay(t, replayBin, 1, "audit", "--nats-url", url, "--run", "nosuch"); got != "" {
		t.Errorf("audit --run nosuch printed %q", got)
	}

	export := filepath.Join(dir, "events.jsonl")
	runReplay(t, replayBin, 0, "export", "--nats-url", url, "--out", export, "--out-stream")
	for _, f := range []string{export, replay.OutSibling(export)} {
		if b, err := os.ReadFile(f); err != nil || bytes.Count(b, []byte("\n")) < 5 {
			t.Fatalf("%s: %v\n%s", f, err, b)
		}
	}
	if fromFile := runReplay(t, replayBin, 0, "--file", export); fromFile != fromNATS {
		t.Errorf("the history of the export differs from the one read from NATS:\n%s\n---\n%s", fromFile, fromNATS)
	}
	// The engine signed every commit with the key it made in its store,
	// and registered it: toolbatch auth keys prints it; pinned, every
	// signature verifies.
	kp, err := access.SigningKey(filepath.Join(store, "signing.nk"), false)
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	keysFile := runReplay(t, cliBin, 0, "auth", "keys", "--nats-url", url)
	if !strings.Contains(keysFile, "- key: "+pub+"\n") || strings.Count(keysFile, "- key: ") != 1 {
		t.Fatalf("toolbatch auth keys: want the engine's key %s:\n%s", pub, keysFile)
	}
	keys := filepath.Join(dir, "keys.yaml")
	if err := os.WriteFile(keys, []byte(keysFile), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"audit", "--nats-url", url}, {"audit", "--file", export}} {
		out := runReplay(t, replayBin, 0, append(args, "--keys", keys)...)
		if !strings.HasPrefix(out, "audit: every invariant holds: 2 runs, ") || strings.Contains(out, "not checked") || strings.Contains(out, "not verified") {
			t.Errorf("%v: %s", args, out)
		}
	}
	// A checkpoint asked for now covers the whole stream, is the latest one
	// published, and the export agrees with it.
	cpLine := runReplay(t, replayBin, 0, "checkpoint", "--nats-url", url, "--now")
	cp, err := proof.DecodeCheckpoint([]byte(cpLine))
	if err != nil {
		t.Fatalf("checkpoint --now: %v: %s", err, cpLine)
	}
	if info, err := js.Stream(ctx, "TOOLBATCH_EVENTS"); err != nil || info.CachedInfo().State.LastSeq != cp.Seq || cp.Signer != pub {
		t.Errorf("checkpoint %s: want the events stream's last sequence, signed by %s (%v)", cpLine, pub, err)
	}
	if latest := runReplay(t, replayBin, 0, "checkpoint", "--nats-url", url); latest != cpLine {
		t.Errorf("the latest checkpoint %s is not the one made now %s", latest, cpLine)
	}
	cpFile := filepath.Join(dir, "checkpoint.json")
	if err := os.WriteFile(cpFile, []byte(cpLine), 0o644); err != nil {
		t.Fatal(err)
	}
	if out := runReplay(t, replayBin, 0, "audit", "--file", export, "--keys", keys, "--checkpoint", cpFile); !strings.Contains(out, "every invariant holds") || !strings.Contains(out, "compared with 1 checkpoint") {
		t.Errorf("audit with the checkpoint: %s", out)
	}
	if out := runReplay(t, replayBin, 0, "audit", "--nats-url", url, "--keys", keys); !strings.Contains(out, "compared with 1 checkpoint") {
		t.Errorf("audit from NATS does not compare with the latest checkpoint: %s", out)
	}
	// One byte of one commit's body changed in the export: its signature
	// fails, and the audit names the commit.
	exported, err := os.ReadFile(export)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(exported), "\n")
	rec, err := replay.ParseRecord([]byte(lines[2]))
	if err != nil {
		t.Fatal(err)
	}
	rec.Data[len(rec.Data)-1] ^= 1
	var b bytes.Buffer
	if err := replay.WriteRecord(&b, rec); err != nil {
		t.Fatal(err)
	}
	lines[2] = b.String()
	if err := os.WriteFile(export, []byte(strings.Join(lines, "")), 0o644); err != nil {
		t.Fatal(err)
	}
	out := runReplay(t, replayBin, 1, "audit", "--file", export, "--keys", keys, "--checkpoint", cpFile)
	if want := fmt.Sprintf("seq %d run ", rec.Seq); !strings.Contains(out, want) || !strings.Contains(out, "invariant 9") || !strings.Contains(out, "signature does not verify") ||
		!strings.Contains(out, "differs from what was checkpointed") {
		t.Errorf("a changed commit: want %q, its signature and the checkpoint in:\n%s", want, out)
	}

	// A writer that is not an engine (this test's connection: the engine
	// runs without --auth, so anyone may write its streams) appends a copy
	// of e2e-b's last commit, without a signature, after it. The audit of
	// the live stream names it; the engine's projector publishes nothing of
	// it (engine.TestOnlyWhatVerifiesIsProjected).
	events, err := js.Stream(ctx, "TOOLBATCH_EVENTS")
	if err != nil {
		t.Fatal(err)
	}
	last, err := events.GetLastMsgForSubject(ctx, "toolbatch.events.e2e-b")
	if err != nil {
		t.Fatal(err)
	}
	forged := nats.NewMsg(last.Subject)
	forged.Data = last.Data
	forged.Header.Set("Toolbatch-Prev", fmt.Sprint(last.Sequence))
	for _, typ := range last.Header.Values("Toolbatch-Event") {
		forged.Header.Add("Toolbatch-Event", typ)
	}
	ack, err := js.PublishMsg(ctx, forged)
	if err != nil {
		t.Fatal(err)
	}
	out = runReplay(t, replayBin, 1, "audit", "--nats-url", url, "--keys", keys)
	if want := fmt.Sprintf("seq %d run e2e-b", ack.Sequence); !strings.Contains(out, want) || !strings.Contains(out, "an unsigned commit in a signed log: not written by an engine") {
		t.Errorf("a commit appended by a non-engine writer: want %q in:\n%s", want, out)
	}

	// The engine's key revoked now: what it signed so far still verifies,
	// and the keys file says from where it does not.
	if got := runReplay(t, cliBin, 1, "auth", "revoke-key", "--nats-url", url, "UNKNOWN"); got != "" {
		t.Errorf("revoke-key of an unknown key printed %q", got)
	}
	if got := runReplay(t, cliBin, 0, "auth", "revoke-key", "--nats-url", url, pub); !strings.Contains(got, fmt.Sprintf("revoked after sequence %d", ack.Sequence)) {
		t.Errorf("revoke-key: %s", got)
	}
	runReplay(t, cliBin, 1, "auth", "revoke-key", "--nats-url", url, pub) // already revoked
	keysFile = runReplay(t, cliBin, 0, "auth", "keys", "--nats-url", url)
	if !strings.Contains(keysFile, fmt.Sprintf("revoked_after: %d\n", ack.Sequence)) || !strings.Contains(keysFile, "revoked: true\n") {
		t.Errorf("toolbatch auth keys after the revocation:\n%s", keysFile)
	}
}

// waitResults waits for a batch's results message on the out stream.
func waitResults(t *testing.T, ctx context.Context, js jetstream.JetStream, run string, step int) {
	t.Helper()
	cons, err := js.OrderedConsumer(ctx, "TOOLBATCH_OUT", jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{"toolbatch.out." + run + ".results"}})
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("%s/%d", run, step)
	for {
		m, err := cons.Next(jetstream.FetchContext(ctx))
		if err != nil {
			t.Fatalf("no results for %s: %v", want, err)
		}
		if bytes.Contains(m.Data(), []byte(want)) {
			return
		}
	}
}

// runReplay runs the replay binary, checks its exit status, and returns
// its stdout.
func runReplay(t *testing.T, bin string, wantCode int, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if code := cmd.ProcessState.ExitCode(); code != wantCode {
		t.Fatalf("replay %v: exit %d (%v), want %d\n%s%s", args, code, err, wantCode, stdout.String(), stderr.String())
	}
	return stdout.String()
}
