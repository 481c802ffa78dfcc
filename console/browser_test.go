package console_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/nats-io/nats.go"

	"github.com/toolbatch/toolbatch/access"
	"github.com/toolbatch/toolbatch/client"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/internal/testproc"
	"github.com/toolbatch/toolbatch/internal/testwait"
	"github.com/toolbatch/toolbatch/protocol"
)

// These tests run the real programs (an engine with credentials, sandbox
// workers, toolbatch console) and drive the console in Debian's Chromium.

var screenshots = flag.String("screenshots", "", "write a screenshot of each page to this directory (docs/console)")

var engineBin, workerBin, toolbatchBin string

func TestMain(m *testing.M) {
	flag.Parse()
	dir, err := os.MkdirTemp("", "toolbatch-console-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bins, err := testproc.Build(dir, "../cmd/engine", "../cmd/sandbox-worker", "../cmd/toolbatch")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	engineBin, workerBin, toolbatchBin = bins[0], bins[1], bins[2]
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

const browserCatalog = `
tools:
  - {id: mark, target: sandbox, recovery: {mode: never_replay}, dispatch_deadline: 20s}
  - {id: slow_rs, target: sandbox, recovery: {mode: replay_safe, max_attempts: 3}, dispatch_deadline: 30s}
  - {id: later, builtin: echo}
gate:
  rules:
    - tools: ["mark"]
      outcome: require_confirmation
    - tools: ["later"]
      outcome: schedule
      after: 1h
      action_kind: nightly
`

// deployment is an engine on a secured embedded server, a worker, the
// console, and a client and an approver of their own.
type deployment struct {
	dir, url, consoleURL, effects string
	creds                         map[string]string
	workers                       map[string]*testproc.Proc
	t                             *testing.T // the processes' lifetime
	client                        *client.Client
	approver                      *client.Client // principal carol, outside the console
}

const alicePassword, bobPassword = "alice-password-1", "bob-password-22"

func deploy(t *testing.T) *deployment {
	t.Helper()
	d := &deployment{dir: t.TempDir(), creds: map[string]string{}, workers: map[string]*testproc.Proc{}, t: t}
	d.effects = filepath.Join(d.dir, "effects")
	if err := os.Mkdir(d.effects, 0o755); err != nil {
		t.Fatal(err)
	}
	cat := filepath.Join(d.dir, "catalog.yaml")
	if err := os.WriteFile(cat, []byte(browserCatalog), 0o644); err != nil {
		t.Fatal(err)
	}
	var f access.File
	for _, u := range []access.User{
		{Name: "con", Role: access.RoleConsole, Principals: []string{"alice", "bob"}},
		{Name: "app", Role: access.RoleClient},
		{Name: "carol", Role: access.RoleApprover, Principal: "carol"},
		{Name: "w1", Role: access.RoleWorker, Pools: []string{"default"}},
		{Name: "w2", Role: access.RoleWorker, Pools: []string{"default"}},
	} {
		made, seed, err := access.NewUser(u.Name, u.Role)
		if err != nil {
			t.Fatal(err)
		}
		u.NKey = made.NKey
		f.Users = append(f.Users, u)
		d.creds[u.Name] = filepath.Join(d.dir, u.Name+".creds")
		if err := access.WriteCreds(d.creds[u.Name], seed); err != nil {
			t.Fatal(err)
		}
	}
	auth := filepath.Join(d.dir, "auth.yaml")
	if err := f.Save(auth); err != nil {
		t.Fatal(err)
	}
	port := testproc.FreePort(t)
	d.url = fmt.Sprintf("nats://127.0.0.1:%d", port)
	testproc.Start(t, "engine", `"engine ready"`, engineBin, "--store", filepath.Join(d.dir, "store"), "--listen", fmt.Sprintf("127.0.0.1:%d", port),
		"--catalog", cat, "--auth", auth, "--log-format", "json", "--lease", "1s", "--ack-wait", "2s", "--inbox-ack-wait", "2s")
	d.startWorker(t, "w1")

	users := filepath.Join(d.dir, "console-users.yaml")
	for name, pw := range map[string]string{"alice": alicePassword, "bob": bobPassword} {
		out, err := exec.Command("sh", "-c", fmt.Sprintf("printf '%%s\\n' %q | %s console user --users %s --name %s", pw, toolbatchBin, users, name)).CombinedOutput()
		if err != nil {
			t.Fatalf("console user %s: %v: %s", name, err, out)
		}
	}
	cport := testproc.FreePort(t)
	testproc.Start(t, "console", `"console ready"`, toolbatchBin, "console", "--users", users, "--listen", fmt.Sprintf("127.0.0.1:%d", cport),
		"--nats-url", d.url, "--creds", d.creds["con"], "--log-format", "json")
	d.consoleURL = fmt.Sprintf("http://127.0.0.1:%d", cport)

	d.client = d.connect(t, "app")
	d.approver = d.connect(t, "carol")
	return d
}

func (d *deployment) connect(t *testing.T, user string) *client.Client {
	t.Helper()
	conn := access.Conn{Creds: d.creds[user]}
	opts, err := conn.Options()
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(d.url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	key, err := conn.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	var copts []client.Option
	if user == "app" {
		copts = append(copts, client.WithSubmitter(key))
	}
	cl, err := client.New(nc, copts...)
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// startWorker starts a worker (isolation none: what is tested here is
// the console, not the sandbox). Every tool records its operation id in
// the effects directory before it does anything else.
func (d *deployment) startWorker(t *testing.T, name string) {
	t.Helper()
	rec := fmt.Sprintf(`echo "$TOOLBATCH_OPERATION_ID" >> %s/effects.log`, d.effects)
	cfg := fmt.Sprintf(`
pools: [default]
isolation: none
tools:
  - id: mark
    command: ["/bin/sh", "-c", %q]
    capability: non_recoverable
    timeout: 20s
  - id: slow_rs
    command: ["/bin/sh", "-c", %q]
    capability: replay_safe
    timeout: 60s
`, rec+"; echo marked", rec+`; if [ "$TOOLBATCH_ATTEMPT" = 1 ]; then sleep 30; fi; echo "done by `+name+`"`)
	path := filepath.Join(d.dir, name+".yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	d.workers[name] = testproc.Start(t, name, `"ready"`, workerBin, "--nats-url", d.url, "--creds", d.creds[name], "--config", path,
		"--worker-id", name, "--log-format", "json")
}

// entered returns how many times each operation entered its tool.
func (d *deployment) entered(t *testing.T) map[string]int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(d.effects, "effects.log"))
	if os.IsNotExist(err) {
		return map[string]int{}
	}
	if err != nil {
		t.Fatal(err)
	}
	n := map[string]int{}
	for _, l := range strings.Fields(string(data)) {
		n[l]++
	}
	return n
}

func submit(t *testing.T, ctx context.Context, cl *client.Client, run string, tools ...string) {
	t.Helper()
	var content []events.ContentBlock
	for i, tool := range tools {
		content = append(content, events.ContentBlock{Type: events.BlockToolUse, ID: fmt.Sprintf("c%d", i+1), Name: tool,
			Input: events.MustJSON(fmt.Sprintf(`{"run":%q,"n":%d}`, run, i+1))})
	}
	if err := cl.Submit(ctx, &protocol.Submit{RunID: run, ThreadID: "thread-" + run, Step: 0,
		Assistant: events.Message{ID: "m-" + run, Content: content}}); err != nil {
		t.Fatal(err)
	}
}

// browser starts Chromium (a new profile) and returns a tab's context.
func browser(t *testing.T, ctx context.Context) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("the console tests need Debian's chromium (apt-get install chromium; .ci/run installs it)")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 900))
	actx, cancel := chromedp.NewExecAllocator(ctx, opts...)
	t.Cleanup(cancel)
	bctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return bctx
}

// stepTimeout bounds one step in the browser (a wait for a page to show
// something included).
const stepTimeout = 30 * time.Second

func run(t *testing.T, ctx context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, stepTimeout)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		html, _ := chromedp.Run(ctx, chromedp.OuterHTML(chromedp.CSS("main")))
		t.Fatalf("%s: %v\npage main:\n%s", what, err, html)
	}
}

// value runs an action that returns a value.
func value[T any](t *testing.T, ctx context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, stepTimeout)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

// text returns the text of the first element sel matches ("" when none).
func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	q, _ := json.Marshal(sel)
	return value(t, ctx, "read "+sel, chromedp.Evaluate[string](fmt.Sprintf(`(document.querySelector(%s) || {textContent: ""}).textContent.replace(/\s+/g, " ").trim()`, q)))
}

// waitText waits until the first element sel matches has a text that
// contains every one of want (the page updates itself), and returns it.
// When it does not, the failure says what the element last showed.
func waitText(t *testing.T, ctx context.Context, sel string, want ...string) string {
	t.Helper()
	step, cancel := context.WithTimeout(ctx, stepTimeout)
	defer cancel()
	var got string
	defer func() {
		if t.Failed() {
			t.Logf("%s last showed %q", sel, got)
		}
	}()
	testwait.Until(t, step, fmt.Sprintf("%s shows %q", sel, want), func() bool {
		got = text(t, ctx, sel) // a read of its own: not cut short by the step's deadline
		for _, w := range want {
			if !strings.Contains(got, w) {
				return false
			}
		}
		return true
	})
	return got
}

func shot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	if *screenshots == "" {
		return
	}
	png := value(t, ctx, "screenshot", chromedp.CaptureScreenshot())
	if err := os.WriteFile(filepath.Join(*screenshots, name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// signIn signs in with the keyboard alone: the name field has the focus.
func signIn(t *testing.T, ctx context.Context, base, name, password string) {
	t.Helper()
	run(t, ctx, "sign in", chromedp.Navigate(base+"/approvals"), chromedp.WaitVisible(chromedp.CSS("#name")),
		chromedp.KeyEvent(name), chromedp.KeyEvent(kb.Tab), chromedp.KeyEvent(password), chromedp.KeyEvent(kb.Enter),
		chromedp.WaitVisible(chromedp.CSS("form.who")))
}

// live waits until the page's event stream is connected.
func live(t *testing.T, ctx context.Context) {
	t.Helper()
	run(t, ctx, "live updates connect", chromedp.WaitReady(chromedp.CSS(`html[data-live="connected"]`)))
}

func TestConsoleInABrowser(t *testing.T) {
	d := deploy(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	tab := browser(t, ctx)

	t.Run("sign-in refuses a wrong password", func(t *testing.T) {
		run(t, tab, "wrong password", chromedp.Navigate(d.consoleURL+"/runs"), chromedp.WaitVisible(chromedp.CSS("#name")),
			chromedp.SendKeys(chromedp.CSS("#name"), "alice"), chromedp.SendKeys(chromedp.CSS("#password"), "not-the-password"),
			chromedp.Submit(chromedp.CSS("#password")), chromedp.WaitVisible(chromedp.CSS(".flash.error")))
		if got := text(t, tab, ".flash.error"); got != "wrong name or password" {
			t.Fatalf("flash: %q", got)
		}
	})
	signIn(t, tab, d.consoleURL, "alice", alicePassword)

	t.Run("a parked call appears in the inbox without a reload, and Approve runs it once", func(t *testing.T) {
		run(t, tab, "inbox", chromedp.Navigate(d.consoleURL+"/approvals"), chromedp.WaitVisible(chromedp.CSS("p.empty")))
		live(t, tab)
		value(t, tab, "mark the page", chromedp.Evaluate[string](`window.__same = "same page"`))
		submit(t, ctx, d.client, "b1", "mark")
		run(t, tab, "the ticket appears", chromedp.WaitVisible(chromedp.CSS("#approve-b1")))
		if same := value(t, tab, "read the mark", chromedp.Evaluate[string](`window.__same`)); same != "same page" {
			t.Fatal("the page was reloaded")
		}
		if got := text(t, tab, "#t-b1 pre.args"); !strings.Contains(got, `"run": "b1"`) {
			t.Fatalf("arguments shown: %q", got)
		}
		if got := text(t, tab, `[data-count="approvals"]`); got != "1" {
			t.Fatalf("approvals badge: %q", got)
		}
		shot(t, tab, "approvals")
		run(t, tab, "approve", chromedp.Click(chromedp.CSS("#approve-b1")), chromedp.WaitVisible(chromedp.CSS(".flash")))
		if got := text(t, tab, ".flash"); got != "Approval of call c1 (tool mark) in run b1 recorded: approved by alice." {
			t.Fatalf("flash: %q", got)
		}
		res, err := d.client.WaitResults(ctx, "b1", "b1/0")
		if err != nil {
			t.Fatal(err)
		}
		if res.Results[0].IsError {
			t.Fatalf("result: %+v", res.Results[0])
		}
		if n := d.entered(t)["b1/0/c1"]; n != 1 {
			t.Fatalf("the approved call entered its tool %d times", n)
		}
		run(t, tab, "run page", chromedp.Navigate(d.consoleURL+"/runs/b1"), chromedp.WaitVisible(chromedp.CSS("pre.output")))
		waitText(t, tab, "table.calls tbody", "completed", "w1", "executed")
		waitText(t, tab, "details.call ol.timeline", "approved by alice", "claimed", "attempt 1 by worker w1")
		waitText(t, tab, "details.call pre.output", "marked")
		shot(t, tab, "run")
	})

	t.Run("Deny with a note blocks the call", func(t *testing.T) {
		run(t, tab, "inbox", chromedp.Navigate(d.consoleURL+"/approvals"))
		live(t, tab)
		submit(t, ctx, d.client, "d1", "mark")
		run(t, tab, "deny with a note", chromedp.WaitVisible(chromedp.CSS("#deny-d1")),
			chromedp.SendKeys(chromedp.CSS("#note-d1"), "not on a Friday"), chromedp.Click(chromedp.CSS("#deny-d1")),
			chromedp.WaitVisible(chromedp.CSS(".flash")))
		if got := text(t, tab, ".flash"); got != "Denial of call c1 (tool mark) in run d1 recorded: denied by alice." {
			t.Fatalf("flash: %q", got)
		}
		res, err := d.client.WaitResults(ctx, "d1", "d1/0")
		if err != nil {
			t.Fatal(err)
		}
		if r := res.Results[0]; !r.IsError || len(r.Content) != 1 || r.Content[0].Text != "blocked: not on a Friday" {
			t.Fatalf("result: %+v", r)
		}
		if n := d.entered(t)["d1/0/c1"]; n != 0 {
			t.Fatalf("the denied call entered its tool %d times", n)
		}
	})

	t.Run("an approval of a ticket answered elsewhere shows the refusal", func(t *testing.T) {
		run(t, tab, "inbox", chromedp.Navigate(d.consoleURL+"/approvals"))
		live(t, tab)
		submit(t, ctx, d.client, "a1", "mark")
		// A note typed: the page keeps the form while it changes.
		run(t, tab, "type a note", chromedp.WaitVisible(chromedp.CSS("#approve-a1")), chromedp.SendKeys(chromedp.CSS("#note-a1"), "ok by me"))
		tickets, err := d.approver.Tickets(ctx)
		if err != nil || len(tickets) != 1 {
			t.Fatalf("tickets: %v %v", tickets, err)
		}
		if err := d.approver.Deny(ctx, tickets[0], "carol", "carol said no"); err != nil {
			t.Fatal(err)
		}
		run(t, tab, "the page says it changed", chromedp.WaitVisible(chromedp.CSS("#updates")))
		run(t, tab, "approve the answered ticket", chromedp.Click(chromedp.CSS("#approve-a1")), chromedp.WaitVisible(chromedp.CSS(".flash")))
		got := text(t, tab, ".flash")
		if got != "Approval of call c1 (tool mark) in run a1 refused by the engine: not_awaiting: ticket "+tickets[0].CorrelationID+" was already resolved" {
			t.Fatalf("flash: %q", got)
		}
		res, err := d.client.WaitResults(ctx, "a1", "a1/0")
		if err != nil {
			t.Fatal(err)
		}
		if r := res.Results[0]; !r.IsError || r.Content[0].Text != "blocked: carol said no" {
			t.Fatalf("result: %+v", r)
		}
	})

	t.Run("a run's timeline after a worker kill shows the recovery", func(t *testing.T) {
		submit(t, ctx, d.client, "k1", "slow_rs")
		run(t, tab, "run page", chromedp.Navigate(d.consoleURL+"/runs/k1"))
		live(t, tab)
		run(t, tab, "claimed", chromedp.WaitVisible(chromedp.CSS("li.ev-claimed")))
		for d.entered(t)["k1/0/c1"] == 0 {
			select {
			case <-ctx.Done():
				t.Fatal("the call never entered its tool")
			case <-time.After(20 * time.Millisecond):
			}
		}
		d.workers["w1"].Kill()
		d.startWorker(d.t, "w2") // it serves the tests that follow too
		res, err := d.client.WaitResults(ctx, "k1", "k1/0")
		if err != nil {
			t.Fatal(err)
		}
		if got := res.Results[0].Content[0].Text; got != "done by w2\n" {
			t.Fatalf("result: %q", got)
		}
		// The page follows by itself.
		run(t, tab, "the recovery shows", chromedp.WaitVisible(chromedp.CSS("li.recovery")), chromedp.WaitVisible(chromedp.CSS("pre.output")))
		waitText(t, tab, "li.recovery", "attempt 2 cause recovered")
		waitText(t, tab, "table.calls tbody", "completed", "w2")
		shot(t, tab, "run-recovery")
	})

	t.Run("the inbox works with the keyboard alone", func(t *testing.T) {
		kbTab := browser(t, ctx)
		signIn(t, kbTab, d.consoleURL, "bob", bobPassword)
		live(t, kbTab)
		submit(t, ctx, d.client, "kb1", "mark")
		run(t, kbTab, "the ticket appears", chromedp.WaitVisible(chromedp.CSS("#approve-kb1")))
		focused := func() string {
			return value(t, kbTab, "focus", chromedp.Evaluate[string](`document.activeElement ? document.activeElement.id : ""`))
		}
		for i := 0; focused() != "note-kb1"; i++ {
			if i == 40 {
				t.Fatal("the note field is not reached with Tab")
			}
			run(t, kbTab, "tab", chromedp.KeyEvent(kb.Tab))
		}
		run(t, kbTab, "note, approve", chromedp.KeyEvent("by keyboard"), chromedp.KeyEvent(kb.Tab))
		if id := focused(); id != "approve-kb1" {
			t.Fatalf("after the note, Tab focuses %q", id)
		}
		run(t, kbTab, "press Enter", chromedp.KeyEvent(kb.Enter), chromedp.WaitVisible(chromedp.CSS(".flash")))
		if got := text(t, kbTab, ".flash"); got != "Approval of call c1 (tool mark) in run kb1 recorded: approved by bob." {
			t.Fatalf("flash: %q", got)
		}
		res, err := d.client.WaitResults(ctx, "kb1", "kb1/0")
		if err != nil {
			t.Fatal(err)
		}
		if r := res.Results[0]; r.IsError {
			t.Fatalf("result: %+v", r)
		}
		run(t, kbTab, "run page", chromedp.Navigate(d.consoleURL+"/runs/kb1"), chromedp.WaitVisible(chromedp.CSS("pre.output")))
		waitText(t, kbTab, "details.call ol.timeline", `approved by bob note "by keyboard"`)
	})

	t.Run("several selected tickets are answered at once", func(t *testing.T) {
		run(t, tab, "inbox", chromedp.Navigate(d.consoleURL+"/approvals"))
		live(t, tab)
		submit(t, ctx, d.client, "m1", "mark")
		submit(t, ctx, d.client, "m2", "mark")
		run(t, tab, "select both", chromedp.WaitVisible(chromedp.CSS("#sel-m1")), chromedp.WaitVisible(chromedp.CSS("#sel-m2")),
			chromedp.Click(chromedp.CSS("#sel-m1")), chromedp.Click(chromedp.CSS("#sel-m2")),
			chromedp.SendKeys(chromedp.CSS("#bulk-note"), "both fine"), chromedp.Click(chromedp.CSS(`button[name="bulk"][value="approve"]`)),
			chromedp.WaitVisible(chromedp.CSS("#flashes .flash")))
		got := text(t, tab, "#flashes")
		for _, r := range []string{"m1", "m2"} {
			if !strings.Contains(got, "Approval of call c1 (tool mark) in run "+r+" recorded: approved by alice.") {
				t.Fatalf("flashes: %q", got)
			}
			if _, err := d.client.WaitResults(ctx, r, r+"/0"); err != nil {
				t.Fatal(err)
			}
			if n := d.entered(t)[r+"/0/c1"]; n != 1 {
				t.Fatalf("%s entered its tool %d times", r, n)
			}
		}
		run(t, tab, "run page", chromedp.Navigate(d.consoleURL+"/runs/m2"))
		waitText(t, tab, "details.call ol.timeline", `approved by alice note "both fine"`)
	})

	t.Run("a scheduled action is performed now from the waits page", func(t *testing.T) {
		submit(t, ctx, d.client, "s1", "later")
		run(t, tab, "waits", chromedp.Navigate(d.consoleURL+"/waits"), chromedp.WaitVisible(chromedp.CSS("#perform-s1")))
		waitText(t, tab, "main table tbody", "s1", "later", "nightly", "in 59m")
		shot(t, tab, "waits")
		run(t, tab, "perform now", chromedp.Click(chromedp.CSS("#perform-s1")), chromedp.WaitVisible(chromedp.CSS(".flash")))
		if got := text(t, tab, ".flash"); got != "Perform of run s1 done: the scheduled action was performed." {
			t.Fatalf("flash: %q", got)
		}
		res, err := d.client.WaitResults(ctx, "s1", "s1/0")
		if err != nil {
			t.Fatal(err)
		}
		if r := res.Results[0]; r.IsError || r.Content[0].Text != `{"n":1,"run":"s1"}` {
			t.Fatalf("result: %+v", r)
		}
	})

	t.Run("runs, waits and audit pages", func(t *testing.T) {
		run(t, tab, "runs", chromedp.Navigate(d.consoleURL+"/runs?state=ended"), chromedp.WaitVisible(chromedp.CSS("form.filters")))
		if got := text(t, tab, "main"); !strings.Contains(got, "No run matches.") {
			t.Fatalf("ended runs: %q", got)
		}
		run(t, tab, "runs", chromedp.Navigate(d.consoleURL+"/runs?q=k1"), chromedp.WaitVisible(chromedp.CSS("table.runs")))
		if got := text(t, tab, "table.runs tbody"); !strings.Contains(got, "k1") || strings.Contains(got, "b1") {
			t.Fatalf("runs matching k1: %q", got)
		}
		run(t, tab, "all runs", chromedp.Navigate(d.consoleURL+"/runs"), chromedp.WaitVisible(chromedp.CSS("table.runs")))
		shot(t, tab, "runs")
		// Cancel a parked run from its page.
		submit(t, ctx, d.client, "c1", "mark")
		run(t, tab, "run page", chromedp.Navigate(d.consoleURL+"/runs/c1"), chromedp.WaitVisible(chromedp.CSS("p.ticket-open")),
			chromedp.SendKeys(chromedp.CSS("#reason"), "wrong plan"), chromedp.Click(chromedp.CSS("#cancel")), chromedp.WaitVisible(chromedp.CSS(".flash")))
		if got := text(t, tab, ".flash"); got != "Cancel of run c1 done: the run ended (cancelled)." {
			t.Fatalf("flash: %q", got)
		}
		run(t, tab, "ended runs", chromedp.Navigate(d.consoleURL+"/runs?state=ended"), chromedp.WaitVisible(chromedp.CSS("table.runs")))
		waitText(t, tab, "table.runs tbody", "ended: cancelled (wrong plan)")
		run(t, tab, "audit", chromedp.Navigate(d.consoleURL+"/audit"), chromedp.Click(chromedp.CSS(`button[name="go"]`)),
			chromedp.WaitVisible(chromedp.CSS(".flash")))
		if got := text(t, tab, ".flash"); !strings.HasPrefix(got, "No violation in 9 runs;") {
			t.Fatalf("audit: %q", got)
		}
		shot(t, tab, "audit")
	})
}
