package main_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolbatch/toolbatch/client"
	"github.com/toolbatch/toolbatch/internal/testwait"
)

// TestStatus: after one run finished, one parked on a ticket and one
// cancelled, status says so in text and JSON.
func TestStatus(t *testing.T) {
	cat := filepath.Join(t.TempDir(), "catalog.yaml")
	if err := os.WriteFile(cat, []byte(confirmCatalog), 0o644); err != nil {
		t.Fatal(err)
	}
	url := startEngine(t, "--catalog", cat)
	ctx := ctxT(t, 90*time.Second)
	if _, stderr, code := cli(t, ctx, batch("st-done", 1, `{"type":"tool_use","id":"a","name":"echo","input":{}}`), "submit", "--wait", "--nats-url", url); code != 0 {
		t.Fatalf("submit: exit %d: %s", code, stderr)
	}
	if _, stderr, code := cli(t, ctx, batch("st-parked", 1, `{"type":"tool_use","id":"b","name":"guarded","input":{}}`), "submit", "--nats-url", url); code != 0 {
		t.Fatalf("submit: exit %d: %s", code, stderr)
	}
	watchUntil(t, ctx, url, "st-parked", "awaiting")
	if _, stderr, code := cli(t, ctx, "", "cancel", "st-ended", "--nats-url", url); code != 0 {
		t.Fatalf("cancel: exit %d: %s", code, stderr)
	}
	watchUntil(t, ctx, url, "st-ended", "ended")

	var st client.Status
	testwait.Until(t, ctx, "an empty inbox backlog", func() bool {
		stdout, stderr, code := cli(t, ctx, "", "status", "--json", "--nats-url", url)
		if code != 0 {
			t.Fatalf("status --json: exit %d: %s", code, stderr)
		}
		st = client.Status{}
		if err := json.Unmarshal([]byte(stdout), &st); err != nil {
			t.Fatalf("status --json: %v: %s", err, stdout)
		}
		return st.Inbox.Pending == 0 && st.Inbox.Unacknowledged == 0
	})
	if len(st.Engines) != 1 || !st.Engines[0].Alive {
		t.Errorf("engines: %+v", st.Engines)
	}
	if len(st.Tickets) != 1 || st.Tickets[0].RunID != "st-parked" || st.TicketsByReason["permission"] != 1 {
		t.Errorf("tickets: %+v, by reason %v", st.Tickets, st.TicketsByReason)
	}
	if st.Runs.Total != 3 || st.Runs.Parked != 1 || st.Runs.Ended != 1 {
		t.Errorf("runs: %+v", st.Runs)
	}
	if st.Log.Stream != "TOOLBATCH_EVENTS" || st.Log.Commits < 4 || st.Log.Bytes == 0 || len(st.Workers) != 0 {
		t.Errorf("log %+v, workers %+v", st.Log, st.Workers)
	}
	if len(st.Queues) != 2 || st.Queues[0].Stream != "TOOLBATCH_INBOX" || st.Queues[1].Stream != "TOOLBATCH_DISPATCH" {
		t.Errorf("queues: %+v", st.Queues)
	}

	stdout, stderr, code := cli(t, ctx, "", "status", "--nats-url", url)
	if code != 0 || stderr != "" {
		t.Fatalf("status: exit %d: %s", code, stderr)
	}
	for _, want := range []string{"engines: 1 alive", "workers: 0", "inbox backlog: 0", "open tickets: 1 (permission 1)", "st-parked",
		"runs: 3 in the log, 1 parked, 1 ended", "log: TOOLBATCH_EVENTS, ", "queues stored: TOOLBATCH_INBOX "} {
		if !strings.Contains(stdout, want) {
			t.Errorf("status lacks %q:\n%s", want, stdout)
		}
	}

	// no engine behind the prefix: one line
	_, stderr, code = cli(t, ctx, "", "status", "--prefix", "nobody", "--timeout", "5s", "--nats-url", url)
	if code != 1 {
		t.Errorf("status of another prefix: exit %d", code)
	}
	oneLine(t, "status of another prefix", stderr, "toolbatch: reading the status: bucket NOBODY_OWNERS: ")
}
