package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/toolbatch/toolbatch/audit"
	"github.com/toolbatch/toolbatch/protocol"
	"github.com/toolbatch/toolbatch/replay"
)

var goodFile = filepath.Join(streamsDir, "good.jsonl")

// TestHistory prints the good stream's history: every call of every batch
// is in it, with the facts the history is for.
func TestHistory(t *testing.T) {
	stdout, stderr, code := inProcess(t, "--file", goodFile)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	golden(t, filepath.Join(streamsDir, "good.history.txt"), []byte(stdout))
	for _, call := range []string{"r1/1 c1", "r1/1 c2", "r1/1 c3", "r1/2 c1", "r1/2 c2", "r1/2 c3", "r2/1 c1", "r2/1 c2"} {
		batch, id, _ := strings.Cut(call, " ")
		section := batchSection(stdout, batch)
		if !regexp.MustCompile(`(?m)^\s+\d+\s+\S+\s+` + id + `\s+published\s`).MatchString(section) {
			t.Errorf("batch %s: no published result for %s:\n%s", batch, id, section)
		}
	}
	for _, want := range []string{
		"allow by default", "ask by policy rule gate.rules[0]", "deny by policy rule gate.rules[1]", // gate decisions and rules
		"attempt 2 cause recovered capability replay_safe",   // attempts
		"by worker worker-a token tok-1",                     // claims and their worker
		"ticket ticket-deploy approved by alice",             // who resolved a wait
		"ticket ticket-client tool_result by client-app",     //
		`reason "owner lost after the executor was entered"`, // indeterminate reasons
		"refused    attempt 1 token tok-0",                   // refused results
		"ended (cancelled: user closed the chat)",            // the run's end
		"rejected  batch r2/1 step 1: step_not_after_last",   //
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("the history does not mention %q", want)
		}
	}
	if !regexp.MustCompile(`^replay: 35 events, 2 runs, \d+ events/s\n$`).MatchString(stderr) {
		t.Errorf("progress line: %q", stderr)
	}
}

// batchSection returns the lines of one batch in a history table.
func batchSection(out, batch string) string {
	i := strings.Index(out, "  batch "+batch+" ")
	if i < 0 {
		return ""
	}
	rest := out[i+1:]
	if j := strings.Index(rest, "\n  batch "); j >= 0 {
		rest = rest[:j]
	}
	if j := strings.Index(rest, "\nrun "); j >= 0 {
		rest = rest[:j]
	}
	return rest
}

func TestHistoryJSON(t *testing.T) {
	stdout, stderr, code := inProcess(t, "--file", goodFile, "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	count := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(stdout), "\n") {
		var v map[string]any
		if err := json.Unmarshal([]byte(line), &v); err != nil {
			t.Fatalf("not JSON: %s", line)
		}
		count[v["type"].(string)]++
		if v["type"] == "event" && v["event_type"] == "CallClaimed" {
			ev := v["event"].(map[string]any)
			if ev["worker_id"] != "worker-a" || v["call"] != "c2" || v["batch"] != "r1/1" {
				t.Errorf("claim line: %s", line)
			}
		}
		if v["type"] == "batch" && v["batch"] == "r2/1" {
			calls := v["calls"].([]any)
			if c := calls[0].(map[string]any); c["phase"] != "indeterminate" || c["entries"] != 1.0 {
				t.Errorf("batch line: %s", line)
			}
		}
	}
	if count["run"] != 2 || count["batch"] != 3 || count["event"] != 35 || count["note"] != 0 {
		t.Errorf("lines by type: %v", count)
	}
}

func TestFilters(t *testing.T) {
	for _, c := range []struct {
		args         []string
		want, absent []string
	}{
		{[]string{"--run", "r2"}, []string{"run r2 ", "batch r2/1"}, []string{"run r1 "}},
		{[]string{"--from-seq", "18"}, []string{"run r1 ", "batch r1/2", "not folded", "submitted at seq 18"}, []string{"run r2 ", "batch r1/1"}},
		{[]string{"--since", "2026-03-02T09:00:18Z"}, []string{"batch r1/2", "not folded"}, []string{"run r2 "}},
		{[]string{"--until", "2026-03-02T09:00:10Z"}, []string{"run r1 ", "run r2 ", "(seq 1..10)", "open"}, []string{"finalized at", "    11 "}},
		{[]string{"--run", "r1", "--until", "2026-03-02T09:00:03Z"}, []string{"run r1  thread thread-r1  running  2 commits (seq 1..3)"}, nil},
		{[]string{"--run", "nobody"}, []string{"no events"}, nil},
	} {
		stdout, stderr, code := inProcess(t, append([]string{"--file", goodFile}, c.args...)...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", c.args, code, stderr)
		}
		for _, w := range c.want {
			if !strings.Contains(stdout, w) {
				t.Errorf("%v: no %q in:\n%s", c.args, w, stdout)
			}
		}
		for _, a := range c.absent {
			if strings.Contains(stdout, a) {
				t.Errorf("%v: %q in:\n%s", c.args, a, stdout)
			}
		}
	}
}

// TestExportFromFile re-exports an export file: the same bytes, for both
// streams; with --run only that run's messages.
func TestExportFromFile(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "copy.jsonl")
	stdout, stderr, code := inProcess(t, "export", "--file", goodFile, "--out", out, "--out-stream")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if stdout != "exported 23 events stream messages to "+out+"\nexported 20 out stream messages to "+replay.OutSibling(out)+"\n" {
		t.Errorf("stdout: %q", stdout)
	}
	for _, pair := range [][2]string{{out, goodFile}, {replay.OutSibling(out), replay.OutSibling(goodFile)}} {
		got, _ := os.ReadFile(pair[0])
		want, _ := os.ReadFile(pair[1])
		if len(want) == 0 || !bytes.Equal(got, want) {
			t.Errorf("%s differs from %s", pair[0], pair[1])
		}
	}
	runOnly := filepath.Join(dir, "r2.jsonl")
	if _, stderr, code := inProcess(t, "export", "--file", goodFile, "--run", "r2", "--out", runOnly, "--out-file", filepath.Join(dir, "r2-out.jsonl")); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, f := range []string{runOnly, filepath.Join(dir, "r2-out.jsonl")} {
		b, _ := os.ReadFile(f)
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		for _, l := range lines {
			r, err := replay.ParseRecord([]byte(l))
			if err != nil || !strings.Contains(r.Subject, ".r2") {
				t.Errorf("%s: %s (%v)", f, l, err)
			}
		}
		if len(lines) < 3 {
			t.Errorf("%s: %d lines", f, len(lines))
		}
	}
	// The export of one run audits clean on its own.
	stdout, _, code = inProcess(t, "audit", "--file", runOnly, "--out-file", filepath.Join(dir, "r2-out.jsonl"))
	if code != 0 || !strings.HasPrefix(stdout, "audit: every invariant holds: 1 run,") {
		t.Errorf("exit %d: %s", code, stdout)
	}
}

func TestAuditJSONAndWithoutOut(t *testing.T) {
	// The forged result without the claim: the chain rewritten around the
	// dropped claim breaks the runs' hash chain (invariant 9) at the two
	// rechained commits, and the completion was never claimed (invariant 1).
	stdout, _, code := inProcess(t, "audit", "--json", "--file", filepath.Join(streamsDir, "forged-result.jsonl"))
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if code != 1 || len(lines) != 4 {
		t.Fatalf("exit %d:\n%s", code, stdout)
	}
	want := []struct {
		seq  uint64
		call string
		inv  string
	}{{9, "", "invariant 9 "}, {10, "", "invariant 9 "}, {10, "c2", "invariant 1 "}}
	for i, w := range want {
		var v violationLine
		if err := json.Unmarshal([]byte(lines[i]), &v); err != nil || v.Seq != w.seq || v.Call != w.call || !strings.HasPrefix(v.Invariant, w.inv) {
			t.Errorf("violation line %s (%v), want seq %d call %q %s", lines[i], err, w.seq, w.call, w.inv)
		}
	}
	var s summary
	if err := json.Unmarshal([]byte(lines[3]), &s); err != nil || s.OK || s.Violations != 3 || !s.OutChecked || s.Signed != 22 ||
		!strings.Contains(s.SigNote, "no --keys") {
		t.Errorf("summary line %s (%v)", lines[3], err)
	}
	// An events file alone: every invariant but 8.
	lone := filepath.Join(t.TempDir(), "lone.jsonl")
	b, _ := os.ReadFile(goodFile)
	if err := os.WriteFile(lone, b, 0o644); err != nil {
		t.Fatal(err)
	}
	stdout, _, code = inProcess(t, "audit", "--file", lone)
	if code != 0 || !strings.Contains(stdout, "invariant 8 not checked") {
		t.Errorf("exit %d: %s", code, stdout)
	}
}

func TestWhatIf(t *testing.T) {
	cat := filepath.Join(streamsDir, "whatif.yaml")
	stdout, stderr, code := inProcess(t, "what-if", "--catalog", cat, "--file", goodFile)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	golden(t, filepath.Join(streamsDir, "good.whatif.txt"), []byte(stdout))
	stdout, _, _ = inProcess(t, "what-if", "--catalog", cat, "--file", goodFile, "--changed", "--json")
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if len(lines) != 6 {
		t.Fatalf("%d lines:\n%s", len(lines), stdout)
	}
	var row replay.WhatIfRow
	if err := json.Unmarshal([]byte(lines[1]), &row); err != nil || row.Call != "c3" || row.Old.Label != "ask" || row.New.Label != "deny" ||
		row.New.Reason != "deploys are frozen this week" || !row.Changed {
		t.Errorf("row %s (%v)", lines[1], err)
	}
}

// TestUsageAndReadErrors: one line on stderr, exit status 2, nothing on
// stdout.
func TestUsageAndReadErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.jsonl")
	b, _ := os.ReadFile(goodFile)
	lines := strings.SplitAfter(string(b), "\n")
	if err := os.WriteFile(bad, []byte(lines[0]+lines[1]+"{\"seq\":3,\"subject\":\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	badCat := filepath.Join(dir, "cat.yaml")
	if err := os.WriteFile(badCat, []byte("gate:\n  rules:\n    - tools: [x]\n      outcome: maybe\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--bogus"}, "flag provided but not defined"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"--file", goodFile, "extra"}, `unexpected argument "extra"`},
		{[]string{"--file", goodFile, "--nats-url", "nats://127.0.0.1:4222"}, "exclude each other"},
		{[]string{"--file", goodFile, "--since", "yesterday"}, "not an RFC 3339 time"},
		{[]string{"--file", goodFile, "--since", "2026-03-02T10:00:00Z", "--until", "2026-03-02T09:00:00Z"}, "--until is before --since"},
		{[]string{"--file", goodFile, "--run", "a.b"}, "is not a run id"},
		{[]string{"--file", goodFile, "--from-seq", "-1"}, "invalid value"},
		{[]string{"export", "--file", goodFile}, "export needs --out FILE"},
		{[]string{"export", "--file", goodFile, "--out", "-", "--out-stream"}, "needs --out-file"},
		{[]string{"audit", "--file", goodFile, "--since", "2026-03-02T09:00:00Z"}, "flag provided but not defined: -since"},
		{[]string{"audit", "--out-file", goodFile}, "--out-file goes with --file"},
		{[]string{"what-if", "--file", goodFile}, "what-if needs --catalog FILE"},
		{[]string{"what-if", "--file", goodFile, "--catalog", badCat}, "outcome"},
		{[]string{"--file", filepath.Join(dir, "missing.jsonl")}, "no such file"},
		{[]string{"--file", bad}, "bad.jsonl:3: not an export record"},
		{[]string{"audit", "--file", bad}, "bad.jsonl:3: not an export record"},
		{[]string{"--nats-url", "nats://127.0.0.1:1"}, "connect to nats://127.0.0.1:1"},
	} {
		stdout, stderr, code := inProcess(t, c.args...)
		if code != 2 || stdout != "" {
			t.Errorf("%v: exit %d, stdout %q", c.args, code, stdout)
		}
		if !strings.HasPrefix(stderr, "replay: ") || !strings.Contains(stderr, c.want) || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%v: want one line with %q, got %q", c.args, c.want, stderr)
		}
	}
	stdout, _, code := inProcess(t, "--help")
	if code != 0 || !strings.HasPrefix(stdout, "usage:") {
		t.Errorf("--help: exit %d %q", code, stdout)
	}
}

func TestProgressEvery100k(t *testing.T) {
	var b bytes.Buffer
	p := newProgress(&b)
	r := audit.Record{Subject: "toolbatch.events.r1", Headers: map[string][]string{protocol.HeaderEvent: {"CallGated", "CallExecuting"}}}
	for i := 0; i < 2*progressEvery+5; i++ {
		p.add(&replay.Message{Record: r})
	}
	p.done()
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "replay: 200000 events, 1 runs, ") || !strings.HasPrefix(lines[2], "replay: 400010 events, 1 runs, ") {
		t.Errorf("progress:\n%s", b.String())
	}
}
