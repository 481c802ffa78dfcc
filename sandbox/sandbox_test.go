package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/toolbatch/toolbatch/events"
)

// These tests run real processes in real bubblewrap sandboxes; nothing is
// skipped (.ci/run installs bubblewrap). Tests that count processes or set
// the environment do not run in parallel; the others do, after them.

// callTimeout bounds every call a test makes.
const callTimeout = 30 * time.Second

// worldDir returns a new directory under the system temp dir that any user
// may read (or, when writable, write): the sandbox runs as nobody when the
// tests run as root, and t.TempDir's parents are private.
func worldDir(t *testing.T, writable bool) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "toolbatch-sandbox-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeWorkdir(dir) })
	mode := os.FileMode(0o755)
	if writable {
		mode = 0o777
	}
	if err := os.Chmod(dir, mode); err != nil {
		t.Fatal(err)
	}
	return dir
}

// toolsDir copies testdata/sandbox (the test tools) to a directory the
// sandbox user can read, wherever the repository is checked out.
func toolsDir(t *testing.T) string {
	t.Helper()
	dir := worldDir(t, false)
	src := filepath.Join("..", "testdata", "sandbox")
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// load writes the worker config into the tools directory and loads it from
// there, so that relative script paths resolve against it.
func load(t *testing.T, dir, yaml string) Config {
	t.Helper()
	path := filepath.Join(dir, "worker.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfig(path)
	if err != nil {
		t.Fatalf("LoadConfig:\n%v", err)
	}
	return cfg
}

// mode is how a test's runner starts its sandboxes. The containment tests
// run in both.
type mode string

const (
	// fresh: a sandbox started for each call (prestart: 0).
	fresh mode = "fresh"
	// prestarted: pre-started sandboxes (the config's default with
	// bubblewrap); every subprocess call must take one, and its stage must
	// start the tool as its child.
	prestarted mode = "prestarted"
	// inPlace: pre-started sandboxes whose stage execs the tool in place,
	// as it does where it cannot start the tool as its child.
	inPlace mode = "prestarted-in-place"
	// childFails: pre-started sandboxes whose stage starts the tool, fails
	// to set its limits, kills it stopped at its exec and execs it in
	// place.
	childFails mode = "prestarted-child-fails"
)

// withStage makes the Runner's stages those of mode m.
func withStage(m mode) Option {
	return func(r *Runner) {
		switch m {
		case inPlace:
			r.stageVariant = stageArgInPlace
		case childFails:
			r.stageVariant = stageArgChildFails
		}
	}
}

// inModes runs f as a subtest in each mode.
func inModes(t *testing.T, f func(t *testing.T, m mode)) {
	t.Helper()
	for _, m := range []mode{fresh, prestarted, inPlace, childFails} {
		t.Run(string(m), func(t *testing.T) { f(t, m) })
	}
}

// newRunner loads the config and builds a runner whose calls' working
// directories go to a fresh work root. The tools directory is under /tmp,
// which the sandbox replaces with its own: every subprocess tool mounts it
// read-only, as an operator would. In mode prestarted it waits until the
// pre-started sandboxes are ready, and at the end of the test checks that
// every subprocess call took one; in mode fresh, that none did. The runner
// is closed at the end of the test.
func newRunner(t *testing.T, m mode, yaml string, opts ...Option) (*Runner, string) {
	t.Helper()
	dir := toolsDir(t)
	workRoot := worldDir(t, false)
	cfg := load(t, dir, yaml)
	for i := range cfg.Tools {
		if cfg.Tools[i].IsBuiltin() {
			continue
		}
		cfg.Tools[i].Mounts = append(cfg.Tools[i].Mounts, Mount{Path: dir})
		if m == fresh {
			cfg.Tools[i].Prestart = new(int)
		}
	}
	opts = append(opts, withStage(m))
	r, err := NewRunner(cfg, append([]Option{WithWorkRoot(workRoot)}, opts...)...)
	if err != nil {
		t.Fatalf("NewRunner: %v", err)
	}
	t.Cleanup(func() { _ = r.Close() })
	t.Cleanup(func() {
		st := r.Stats()
		bwrap := cfg.Isolation == IsolationBubblewrap
		switch {
		case m == fresh && st.Prestarted > 0:
			t.Errorf("mode fresh: %d calls took a pre-started sandbox", st.Prestarted)
		case m != fresh && bwrap && st.Fresh > 0:
			t.Errorf("mode %s: %d calls started their own sandbox (stats %+v)", m, st.Fresh, st)
		case m == prestarted && bwrap && st.StageChild != st.StageLimits:
			t.Errorf("mode prestarted: the stage ran %d of %d tools as its child (stats %+v)", st.StageChild, st.StageLimits, st)
		case (m == inPlace || m == childFails) && st.StageChild > 0:
			t.Errorf("mode %s: the stage ran %d tools as its child (stats %+v)", m, st.StageChild, st)
		}
	})
	if m != fresh {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		if err := r.WaitPrestarted(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return r, workRoot
}

// wantCleanedUp closes the runner (tearing down its pre-started
// sandboxes) and fails unless every working directory is gone.
func wantCleanedUp(t *testing.T, r *Runner, workRoot string) {
	t.Helper()
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	wantEmpty(t, workRoot)
}

func run(t *testing.T, r *Runner, tool, args string) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	return r.Run(ctx, Call{ToolID: tool, CallID: "call-" + tool, OperationID: "run-1/1/call-" + tool, Attempt: 2, Arguments: []byte(args)})
}

// wantOutput fails unless the result is an output, and returns it.
func wantOutput(t *testing.T, res Result) events.Output {
	t.Helper()
	if res.Err != nil || res.Output == nil {
		t.Fatalf("want an output, got error %+v", res.Err)
	}
	return *res.Output
}

// wantText fails unless the result is a successful output with this text.
func wantText(t *testing.T, res Result, want string) {
	t.Helper()
	o := wantOutput(t, res)
	if o.IsError || o.Text() != want {
		t.Fatalf("want output %q, got %q (is_error %v)", want, o.Text(), o.IsError)
	}
}

// wantError fails unless the result is an error of the kind whose message
// holds every part, and returns the message.
func wantError(t *testing.T, res Result, kind events.ErrorKind, parts ...string) string {
	t.Helper()
	if res.Err == nil {
		t.Fatalf("want a %s error, got output %+v", kind, res.Output)
	}
	if res.Output != nil {
		t.Fatalf("a result has both an output and an error: %+v", res)
	}
	if res.Err.Kind != kind {
		t.Fatalf("want a %s error, got %s: %s", kind, res.Err.Kind, res.Err.Message)
	}
	for _, p := range parts {
		if !strings.Contains(res.Err.Message, p) {
			t.Fatalf("error message lacks %q:\n%s", p, res.Err.Message)
		}
	}
	return res.Err.Message
}

// wantEmpty fails unless dir has no entries: the calls' working
// directories were removed.
func wantEmpty(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) > 0 {
		t.Fatalf("%s still holds %v", dir, entries)
	}
}

// countUID is the sandbox user of the tests that count processes: a uid of
// their own, so that sandboxes of other test processes do not count.
var countUID = 40000 + os.Getpid()%20000

// sandboxProcs counts the live processes of countUID (every process when
// the tests do not run as root, since tools then run as us). Zombies are
// left out: they run nothing, and the sandbox's own are reaped by whoever
// inherits them once their worker is gone.
func sandboxProcs(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		if os.Geteuid() != 0 {
			n++
			continue
		}
		status, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue // gone meanwhile
		}
		uid, zombie := "", false
		for _, line := range strings.Split(string(status), "\n") {
			f := strings.Fields(line)
			switch {
			case len(f) > 1 && f[0] == "Uid:":
				uid = f[1]
			case len(f) > 1 && f[0] == "State:":
				zombie = f[1] == "Z"
			}
		}
		if uid == strconv.Itoa(countUID) && !zombie {
			n++
		}
	}
	return n
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not within %s", what, d)
		case <-tick.C:
		}
	}
}

const scriptTools = `
isolation: bubblewrap
tools:
  - id: cat
    command: [/bin/sh, ./cat.sh]
  - id: cat_json
    command: [/bin/sh, ./cat.sh]
    output: json
  - id: env
    command: [env]
    env: {GREETING: hello world, EMPTY: ""}
  - id: fail
    command: [/bin/sh, ./fail.sh]
  - id: workdir
    command: [/bin/sh, -c, 'ls -A; pwd; echo "$HOME"; id -u; hostname']
  - id: noop
    builtin: noop
  - id: echo
    builtin: echo
  - id: sleep
    builtin: sleep
    timeout: 200ms
`

func TestEchoScriptAndBuiltins(t *testing.T) {
	t.Parallel()
	inModes(t, func(t *testing.T, m mode) {
		r, workRoot := newRunner(t, m, scriptTools)
		if w := r.Warning(); w != "" {
			t.Fatalf("bubblewrap runner warns: %s", w)
		}

		wantText(t, run(t, r, "cat", `{"text":"héllo"}`), `{"text":"héllo"}`)
		wantText(t, run(t, r, "cat", ``), `{}`)
		wantText(t, run(t, r, "echo", `{"a":1}`), `{"a":1}`)

		o := wantOutput(t, run(t, r, "noop", `{}`))
		if o.IsError || len(o.Content) != 0 || o.CallID != "call-noop" {
			t.Fatalf("noop: %+v", o)
		}
		wantText(t, run(t, r, "sleep", `{"duration":"5ms"}`), "slept 5ms")
		wantError(t, run(t, r, "sleep", `{"duration":"1h"}`), events.ErrorExecution, "timed out after 200ms")
		wantError(t, run(t, r, "sleep", `{"duration":"soon"}`), events.ErrorInvalidArguments, `"soon"`)
		wantError(t, run(t, r, "nope", `{}`), events.ErrorExecution, `tool "nope" is not served by this worker`)

		// A fresh, empty working directory that is cwd and HOME, as nobody
		// when the worker is root, removed afterwards.
		lines := strings.Split(strings.TrimSpace(wantOutput(t, run(t, r, "workdir", `{}`)).Text()), "\n")
		if len(lines) != 4 || lines[0] != lines[1] || !strings.HasPrefix(lines[0], workRoot+"/toolbatch-call-") || lines[3] != "toolbatch-sandbox" {
			t.Fatalf("want [workdir workdir uid hostname] with an empty workdir, got %q", lines)
		}
		if want, _ := r.userOf("workdir"); os.Geteuid() == 0 && lines[2] != strconv.Itoa(want) {
			t.Fatalf("tool runs as uid %s, want %d", lines[2], want)
		}
		wantCleanedUp(t, r, workRoot)
	})
}

func TestEnvironmentIsExact(t *testing.T) {
	// Not parallel: it sets the test process's environment.
	t.Setenv("TOOLBATCH_TEST_SECRET", "hunter2")
	t.Setenv("TOOLBATCH_OPERATION_ID", "from-the-worker")
	inModes(t, func(t *testing.T, m mode) {
		r, _ := newRunner(t, m, scriptTools)
		res := r.Run(context.Background(), Call{ToolID: "env", CallID: "c7", OperationID: "run-9/4/c7", Attempt: 3, Arguments: []byte(`{}`)})
		got := strings.Split(strings.TrimSpace(wantOutput(t, res).Text()), "\n")
		slices.Sort(got)
		home := ""
		for _, l := range got {
			if h, ok := strings.CutPrefix(l, "HOME="); ok {
				home = h
			}
		}
		want := []string{
			"EMPTY=",
			"GREETING=hello world",
			"HOME=" + home,
			"LANG=C.UTF-8",
			"PATH=/usr/local/bin:/usr/bin:/bin",
			"TOOLBATCH_ATTEMPT=3",
			"TOOLBATCH_CALL_ID=c7",
			"TOOLBATCH_OPERATION_ID=run-9/4/c7",
		}
		if !slices.Equal(got, want) || !strings.Contains(home, "toolbatch-call-") {
			t.Fatalf("environment:\n got %q\nwant %q", got, want)
		}
	})
}

// TestProgramsCheckedAtStart: a worker whose tool names a program that
// does not exist, or a file the sandbox hides (under /tmp, without a
// mount), does not start: it says which, in one line.
func TestProgramsCheckedAtStart(t *testing.T) {
	t.Parallel()
	dir := toolsDir(t)
	hidden, err := os.CreateTemp("", "toolbatch-hidden-*.sh")
	if err != nil {
		t.Fatal(err)
	}
	hidden.Close()
	t.Cleanup(func() { os.Remove(hidden.Name()) })
	for _, c := range []struct{ isolation, command, mounts, want string }{
		{"none", "[/nonexistent/tool]", "", `sandbox: tool "x": program /nonexistent/tool does not exist`},
		{"bubblewrap", "[no-such-program-toolbatch]", "", `sandbox: tool "x": program "no-such-program-toolbatch" not found in PATH /usr/local/bin:/usr/bin:/bin`},
		{"bubblewrap", "[./no-such-script.sh]", "", `sandbox: tool "x": program ` + filepath.Join(dir, "no-such-script.sh") + ` does not exist`},
		{"bubblewrap", "[/bin/sh, " + hidden.Name() + "]", "", `sandbox: tool "x": ` + hidden.Name() +
			` is under /tmp, which the sandbox replaces with an empty directory: add it (or its directory) to the tool's mounts, or keep it elsewhere`},
		{"bubblewrap", "[/bin/sh, " + hidden.Name() + "]", "[{path: " + hidden.Name() + "}]", ""},
		{"none", "[/bin/sh, " + hidden.Name() + "]", "", ""}, // nothing is hidden without a sandbox
	} {
		yaml := fmt.Sprintf("isolation: %s\ntools:\n  - id: x\n    command: %s\n", c.isolation, c.command)
		if c.mounts != "" {
			yaml += "    mounts: " + c.mounts + "\n"
		}
		r := &Runner{cfg: load(t, dir, yaml).WithDefaults(), workRoot: worldDir(t, false)}
		err := r.checkPrograms()
		if got := fmt.Sprint(err); c.want == "" && err != nil || c.want != "" && got != c.want {
			t.Errorf("%s %s: %v, want %q", c.isolation, c.command, err, c.want)
		}
	}
}

func TestNonZeroExitReportsStderrTail(t *testing.T) {
	t.Parallel()
	inModes(t, func(t *testing.T, m mode) {
		r, _ := newRunner(t, m, scriptTools)
		msg := wantError(t, run(t, r, "fail", `{}`), events.ErrorExecution, "exit status 3", "something broke: the disk is full")
		if !strings.Contains(msg, "noise that scrolls away") {
			t.Fatalf("short stderr is reported whole:\n%s", msg)
		}
	})
}

func TestJSONOutput(t *testing.T) {
	t.Parallel()
	inModes(t, func(t *testing.T, m mode) {
		r, _ := newRunner(t, m, scriptTools)

		o := wantOutput(t, run(t, r, "cat_json", `{"content":[{"type":"text","text":"done"},{"type":"json","value":{"b":2,"a":1}}],
		"state":[{"scope":"run","key":"k","merge":"disjoint","action":"set","value":[1]}]}`))
		if o.IsError || o.CallID != "call-cat_json" || o.Text() != "done" || len(o.Content) != 2 || string(o.Content[1].Value) != `{"a":1,"b":2}` ||
			len(o.State) != 1 || string(o.State[0].Value) != `[1]` {
			t.Fatalf("json output: %+v", o)
		}
		o = wantOutput(t, run(t, r, "cat_json", `{"content":[{"type":"text","text":"no such file"}],"is_error":true}`))
		if !o.IsError || o.Text() != "no such file" {
			t.Fatalf("tool's own error output: %+v", o)
		}

		for _, c := range []struct{ stdout, problem string }{
			{``, "{}"}, // the runner sends {} for empty arguments: a valid, empty output
			{`[1]`, "stdout is not a JSON object"},
			{`{"content":"done"}`, "cannot unmarshal string"},
			{`{"contents":[]}`, `unknown field "contents"`},
			{`{"content":[{"type":"bogus"}]}`, `unknown content block type "bogus"`},
			{`{"content":[{"type":"text","text":"a","extra":1}]}`, `extra`},
			{`{"is_error":"yes"}`, "cannot unmarshal string"},
			{`{"state":[{"scope":"galaxy","key":"k","merge":"disjoint","action":"set"}]}`, `state[0]: command scope "galaxy"`},
			{`{} {}`, "more than one JSON value"},
			{`{"content":[`, "unexpected EOF"},
			{`{"call_id":"c"}`, `unknown field "call_id"`},
		} {
			res := run(t, r, "cat_json", c.stdout)
			if c.problem == "{}" {
				wantOutput(t, res)
				continue
			}
			wantError(t, res, events.ErrorExecution, "malformed JSON output: ", c.problem)
		}
	})
}

func TestWritesOutsideTheWorkdirFail(t *testing.T) {
	t.Parallel()
	inModes(t, func(t *testing.T, m mode) {
		r, workRoot := newRunner(t, m, `
tools:
  - id: escape
    command: [/bin/sh, ./escape.sh]
`)
		got := strings.Split(strings.TrimSpace(wantOutput(t, run(t, r, "escape", `{}`)).Text()), "\n")
		want := []string{
			// ../ of the working directory is inside the sandbox's private
			// /tmp (or a read-only directory): checked on the host below.
			"dotdot ok",
			"dotdot2 failed",
			"etc failed",
			"usr failed",
			"home ok",
			"cwd ok",
			"readback ok",
		}
		if os.Geteuid() != 0 || !under(workRoot, "/tmp") {
			want[0] = got[0] // outside /tmp the parent is read-only: either is fine
		}
		if !slices.Equal(got, want) {
			t.Fatalf("escape attempts:\n got %q\nwant %q", got, want)
		}
		for _, p := range []string{filepath.Join(workRoot, "escape-dotdot"), "/etc/escape-dotdot2", "/etc/toolbatch-escape", "/usr/toolbatch-escape"} {
			if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the tool wrote %s on the host (%v)", p, err)
			}
		}
		wantCleanedUp(t, r, workRoot)
	})
}

func TestMounts(t *testing.T) {
	t.Parallel()
	inModes(t, func(t *testing.T, m mode) {
		shared := worldDir(t, true) // under /tmp: seen through the private /tmp
		readOnly := worldDir(t, true)
		for _, d := range []string{shared, readOnly} {
			if err := os.WriteFile(filepath.Join(d, "in.txt"), []byte("from the host\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		r, _ := newRunner(t, m, fmt.Sprintf(`
tools:
  - id: rw
    command: [/bin/sh, ./mount.sh, %[1]s, scratch]
    mounts: [{path: %[1]s, writable: true}]
  - id: ro
    command: [/bin/sh, ./mount_ro.sh, %[2]s]
    mounts: [{path: %[2]s}]
  - id: none
    command: [/bin/sh, -c, 'ls %[1]s/in.txt /tmp/scratch 2>&1 || true']
`, shared, readOnly))

		wantText(t, run(t, r, "rw", `{}`), "from the host\ntmp works\n")
		wantText(t, run(t, r, "rw", `{}`), "from the host\ntmp works\n") // /tmp/scratch was private to the first call
		out, err := os.ReadFile(filepath.Join(shared, "out.txt"))
		if err != nil || string(out) != "appended by call-rw\nappended by call-rw\n" {
			t.Fatalf("writable mount: %q, %v", out, err)
		}
		wantText(t, run(t, r, "ro", `{}`), "from the host\nwrite failed\n")
		if _, err := os.Stat(filepath.Join(readOnly, "written.txt")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("read-only mount was written: %v", err)
		}
		// A tool without the mount sees neither it nor another call's /tmp.
		if o := wantOutput(t, run(t, r, "none", `{}`)).Text(); strings.Count(o, "No such file") != 2 {
			t.Fatalf("a tool sees what it should not:\n%s", o)
		}
	})
}

func TestNetwork(t *testing.T) {
	t.Parallel()
	inModes(t, func(t *testing.T, m mode) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		port := l.Addr().(*net.TCPAddr).Port
		r, _ := newRunner(t, m, `
tools:
  - id: offline
    command: [python3, ./connect.py]
  - id: online
    command: [python3, ./connect.py]
    limits: {network: true}
`)
		args := fmt.Sprintf(`{"port":%d}`, port)

		// accepted reports whether a connection is waiting: the tool has ended,
		// so a connection it made is already in the backlog.
		accepted := func() (string, bool) {
			if err := l.(*net.TCPListener).SetDeadline(time.Now().Add(100 * time.Millisecond)); err != nil {
				t.Fatal(err)
			}
			c, err := l.Accept()
			if err != nil {
				return "", false
			}
			defer c.Close()
			if err := c.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 64)
			n, _ := c.Read(buf)
			return string(buf[:n]), true
		}

		if o := wantOutput(t, run(t, r, "offline", args)).Text(); !strings.HasPrefix(o, "failed:") {
			t.Fatalf("network false: %q", o)
		}
		if msg, ok := accepted(); ok {
			t.Fatalf("network false: a connection arrived at the listener: %q", msg)
		}
		// The control: the same tool with the network reaches the listener.
		wantText(t, run(t, r, "online", args), "connected\n")
		if msg, ok := accepted(); !ok || msg != "hello from the sandbox\n" {
			t.Fatalf("network true: no connection arrived (%q)", msg)
		}
	})
}

func TestInfiniteLoopIsKilledAtTheTimeout(t *testing.T) {
	t.Parallel()
	inModes(t, func(t *testing.T, m mode) {
		r, workRoot := newRunner(t, m, `
tools:
  - id: loop
    command: [/bin/sh, ./loop.sh]
    timeout: 1s
`)
		start := time.Now()
		wantError(t, run(t, r, "loop", `{}`), events.ErrorExecution, "timed out after 1s")
		if d := time.Since(start); d > 10*time.Second {
			t.Fatalf("the loop ran %s", d)
		}
		wantCleanedUp(t, r, workRoot)
	})
}

// TestSignalToItsOwnGroup: a tool that signals its own process group (a
// usual way to stop what it started) reaches only what it started, in
// every mode: not the stage that is its parent in a pre-started sandbox.
func TestSignalToItsOwnGroup(t *testing.T) {
	t.Parallel()
	inModes(t, func(t *testing.T, m mode) {
		r, _ := newRunner(t, m, `
tools:
  - id: group
    command: [/bin/sh, -c, 'sleep 30 & trap "" TERM; kill -TERM 0; wait; echo survived']
`)
		if got := wantOutput(t, run(t, r, "group", `{}`)).Text(); got != "survived\n" {
			t.Fatalf("output %q", got)
		}
	})
}

// TestStageIsPrivate: in a pre-started sandbox the tool cannot read what
// the stage that is its parent holds (its open files, among them the
// worker's program) nor trace it, though they run as the same user.
func TestStageIsPrivate(t *testing.T) {
	t.Parallel()
	r, _ := newRunner(t, prestarted, `
tools:
  - id: peek
    command: [/bin/sh, -c, 'for f in exe fd/6 environ mem; do if head -c 1 /proc/$PPID/$f >/dev/null 2>&1; then echo "read $f"; fi; done; echo done']
`)
	if got := wantOutput(t, run(t, r, "peek", `{}`)).Text(); got != "done\n" {
		t.Fatalf("the tool read its stage's files:\n%s", got)
	}
	if st := r.Stats(); st.StageChild < 2 {
		t.Fatalf("the stage was not the tool's parent (stats %+v)", st)
	}
}

func TestCancelKillsTheTool(t *testing.T) {
	t.Parallel()
	inModes(t, func(t *testing.T, m mode) {
		r, _ := newRunner(t, m, `
tools:
  - id: loop
    command: [/bin/sh, ./loop.sh]
    timeout: 1m
`)
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		res := r.Run(ctx, Call{ToolID: "loop", CallID: "c", OperationID: "r/1/c", Attempt: 1})
		wantError(t, res, events.ErrorExecution, "interrupted", "deadline exceeded")
	})
}

func TestForkBombIsContained(t *testing.T) {
	// Not parallel: it counts the sandbox user's processes.
	inModes(t, func(t *testing.T, m mode) {
		r, _ := newRunner(t, m, `
tools:
  - id: bomb
    command: [/bin/bash, ./forkbomb.sh]
    timeout: 2s
    limits: {max_procs: 32}
  - id: count
    command: [python3, ./forkcount.py]
    limits: {max_procs: 32}
`, WithSandboxUser(countUID, countUID))
		before := sandboxProcs(t)
		start := time.Now()
		wantError(t, run(t, r, "bomb", `{}`), events.ErrorExecution, "timed out after 2s")
		if d := time.Since(start); d > 15*time.Second {
			t.Fatalf("the fork bomb ran %s", d)
		}
		eventually(t, 10*time.Second, "the fork bomb's processes are gone", func() bool { return sandboxProcs(t) <= before })
		if err := exec.Command("/bin/true").Run(); err != nil {
			t.Fatalf("the test process cannot fork after the bomb: %v", err)
		}

		// The cap itself: a tool forks until it cannot (bwrap's init process
		// and the tool count too, and, when the stage is the tool's parent,
		// the stage's threads: about 5). Three calls at once each get the
		// whole cap: it is counted per call's user namespace, not per uid
		// (shared, each would get about a third).
		low := 24
		if m == prestarted {
			low = 16
		}
		counts := make(chan string, 3)
		for range 3 {
			go func() {
				res := r.Run(context.Background(), Call{ToolID: "count", CallID: "c", OperationID: "r/1/c", Attempt: 1})
				if res.Err != nil {
					counts <- "error: " + res.Err.Message
					return
				}
				counts <- res.Output.Text()
			}()
		}
		for range 3 {
			f := strings.Fields(<-counts)
			t.Logf("forked before the cap: %q", f)
			n, err := strconv.Atoi(f[0])
			if err != nil || n >= 32 || n < low {
				t.Fatalf("forked %q before the cap of 32", f)
			}
		}
		eventually(t, 10*time.Second, "the counted processes are gone", func() bool { return sandboxProcs(t) <= before })
	})
}

// TestMain lets the test binary be the stage of pre-started sandboxes,
// and play a worker that runs one call and is then killed (see
// TestSandboxDiesWithTheWorker).
func TestMain(m *testing.M) {
	StageMain()
	MCPCallMain()
	if os.Getenv(envTestMCPServer) == "1" {
		os.Exit(testMCPServer())
	}
	if cfgPath := os.Getenv("TOOLBATCH_SANDBOX_TEST_WORKER"); cfgPath != "" {
		countUID, _ = strconv.Atoi(os.Getenv("TOOLBATCH_SANDBOX_TEST_UID"))
		os.Exit(helperWorker(cfgPath, os.Getenv("TOOLBATCH_SANDBOX_TEST_WORK_ROOT"), mode(os.Getenv("TOOLBATCH_SANDBOX_TEST_MODE"))))
	}
	code := m.Run()
	removeMCPServers()
	os.Exit(code)
}

func helperWorker(cfgPath, workRoot string, m mode) int {
	cfg, err := LoadConfig(cfgPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if m == fresh {
		for i := range cfg.Tools {
			cfg.Tools[i].Prestart = new(int)
		}
	}
	r, err := NewRunner(cfg, WithWorkRoot(workRoot), WithSandboxUser(countUID, countUID), withStage(m))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	res := r.Run(context.Background(), Call{ToolID: "hang", CallID: "c", OperationID: "r/1/c", Attempt: 1})
	fmt.Fprintf(os.Stderr, "the call returned: %+v %+v\n", res.Output, res.Err)
	return 1
}

func TestSandboxDiesWithTheWorker(t *testing.T) {
	// Not parallel: it counts the sandbox user's processes.
	inModes(t, func(t *testing.T, m mode) {
		dir := toolsDir(t)
		shared := worldDir(t, true)
		cfgPath := filepath.Join(dir, "worker.yaml")
		if err := os.WriteFile(cfgPath, []byte(fmt.Sprintf(`
tools:
  - id: hang
    command: [/bin/sh, -c, 'sleep 1000 & sleep 1000 & touch %[1]s/started; wait']
    timeout: 1h
    mounts: [{path: %[1]s, writable: true}]
`, shared)), 0o644); err != nil {
			t.Fatal(err)
		}
		before := sandboxProcs(t)
		worker := exec.Command(os.Args[0], "-test.run=^$")
		// A killed worker cannot remove its call's working directory: keep it
		// where the test's cleanup removes it.
		workRoot := worldDir(t, false)
		worker.Env = append(os.Environ(), "TOOLBATCH_SANDBOX_TEST_WORKER="+cfgPath, "TOOLBATCH_SANDBOX_TEST_WORK_ROOT="+workRoot,
			"TOOLBATCH_SANDBOX_TEST_UID="+strconv.Itoa(countUID), "TOOLBATCH_SANDBOX_TEST_MODE="+string(m))
		var stderr strings.Builder
		worker.Stderr = &stderr
		if err := worker.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { _ = worker.Wait(); close(exited) }()
		t.Cleanup(func() { _ = worker.Process.Kill(); <-exited })
		eventually(t, 20*time.Second, "the tool started", func() bool {
			select {
			case <-exited:
				t.Fatalf("the worker exited early: %s", stderr.String())
			default:
			}
			_, err := os.Stat(filepath.Join(shared, "started"))
			return err == nil
		})
		// bwrap, its init, the shell and two sleeps; with pre-started
		// sandboxes also those (bwrap, init and the stage each), and the
		// call's stage when it is the tool's parent.
		want := before + 5
		if m != fresh {
			want += 3 * DefaultPrestart
		}
		if m == prestarted {
			want++
		}
		got := 0
		eventually(t, 20*time.Second, fmt.Sprintf("%d sandbox processes while the tool runs", want-before), func() bool {
			got = sandboxProcs(t)
			return got >= want
		})
		if err := worker.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		<-exited
		eventually(t, 10*time.Second, "the sandboxes died with their worker", func() bool { return sandboxProcs(t) <= before })
	})
}

func TestHugeOutputIsCapped(t *testing.T) {
	t.Parallel()
	inModes(t, func(t *testing.T, m mode) {
		r, _ := newRunner(t, m, `
tools:
  - id: big
    command: [/bin/sh, ./bigout.sh]
  - id: small_cap
    command: [/bin/sh, -c, 'head -c 2049 /dev/zero']
    limits: {output_kb: 2}
  - id: exact_cap
    command: [/bin/sh, -c, 'head -c 2048 /dev/zero | tr "\0" x']
    limits: {output_kb: 2}
`)
		start := time.Now()
		wantError(t, run(t, r, "big", `{}`), events.ErrorExecution, "output exceeded 256 KiB")
		if d := time.Since(start); d > 10*time.Second {
			t.Fatalf("1 GiB of output took %s to stop", d)
		}
		wantError(t, run(t, r, "small_cap", `{}`), events.ErrorExecution, "output exceeded 2 KiB")
		wantText(t, run(t, r, "exact_cap", `{}`), strings.Repeat("x", 2048))
	})
}

// limitedTools run into their memory, CPU and file-size limits
// (wantLimitsHold).
const limitedTools = `
  - id: mem
    command: [python3, ./memory.py]
    limits: {memory_mb: 64}
  - id: spin
    command: [python3, ./spin.py]
    timeout: 20s
    limits: {cpu_seconds: 1}
  - id: bigfile
    command: [/bin/sh, -c, 'head -c 17000000 /dev/zero > f']
    limits: {memory_mb: 16}
`

// wantLimitsHold calls limitedTools and fails unless each limit held.
func wantLimitsHold(t *testing.T, r *Runner) {
	t.Helper()
	wantText(t, run(t, r, "mem", `{"mb":8}`), "allocated 8 MiB\n")
	wantError(t, run(t, r, "mem", `{"mb":256}`), events.ErrorExecution, "exit status 1", "MemoryError")
	start := time.Now()
	wantError(t, run(t, r, "spin", `{}`), events.ErrorExecution, "exit status 152", "CPU time limit exceeded", "limits.cpu_seconds is 1")
	if d := time.Since(start); d > 15*time.Second {
		t.Fatalf("a CPU limit of 1s took %s", d)
	}
	wantError(t, run(t, r, "bigfile", `{}`), events.ErrorExecution, "file size limit exceeded", "no file may exceed 16777216 bytes")
}

func TestMemoryAndCPULimits(t *testing.T) {
	t.Parallel()
	inModes(t, func(t *testing.T, m mode) {
		r, _ := newRunner(t, m, "tools:"+limitedTools)
		wantLimitsHold(t, r)
	})
}

// TestIsolationNoneLimits checks that a tool without isolation runs under
// its rlimits, whether the runner sets them on the tool stopped at its
// exec or, where a process may not trace its child, execs prlimit: both
// give the same limits and the same errors.
func TestIsolationNoneLimits(t *testing.T) {
	t.Parallel()
	for _, traced := range []bool{true, false} {
		name := "prlimit"
		if traced {
			name = "traced"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r, workRoot := newRunner(t, fresh, `
isolation: none
tools:
  - id: limits
    command: [/bin/sh, -c, 'for l in t p v f c; do printf "%s=%s " $l "$(ulimit -$l)"; done; printf "hard_t=%s" "$(ulimit -Ht)"']
    limits: {cpu_seconds: 3, max_procs: 7, memory_mb: 32}`+limitedTools)
			if !traced {
				r.noTrace.Store(true)
			}
			// fsize is the larger of the output cap and the memory
			// limit: 32 MiB, 65536 blocks of 512 bytes.
			wantText(t, run(t, r, "limits", `{}`), "t=3 p=7 v=32768 f=65536 c=0 hard_t=4")
			wantLimitsHold(t, r)
			want := int64(0)
			if traced {
				want = 5
			}
			if st := r.Stats(); st.DirectLimits != want || st.Fresh != 5 {
				t.Fatalf("stats %+v: want %d calls with limits set by the runner, of 5", st, want)
			}
			wantCleanedUp(t, r, workRoot)
		})
	}
}

func TestIsolationNone(t *testing.T) {
	// Not parallel: it sets the test process's environment.
	t.Setenv("TOOLBATCH_TEST_SECRET", "hunter2")
	r, workRoot := newRunner(t, fresh, `
isolation: none
tools:
  - id: cat
    command: [/bin/sh, ./cat.sh]
  - id: env
    command: [env]
  - id: loop
    command: [/bin/sh, -c, 'sleep 60 & sleep 60 & wait']
    timeout: 300ms
`)
	w := r.Warning()
	for _, p := range []string{"isolation: none", "NOT isolated", "filesystem", "network", "processes"} {
		if !strings.Contains(w, p) {
			t.Fatalf("warning lacks %q:\n%s", p, w)
		}
	}
	wantText(t, run(t, r, "cat", `{"x":1}`), `{"x":1}`)
	env := wantOutput(t, run(t, r, "env", `{}`)).Text()
	if strings.Contains(env, "hunter2") || strings.Count(env, "\n") != 6 {
		t.Fatalf("environment without isolation:\n%s", env)
	}
	wantError(t, run(t, r, "loop", `{}`), events.ErrorExecution, "timed out after 300ms")
	wantCleanedUp(t, r, workRoot)
}

func TestNewRunnerRefuses(t *testing.T) {
	// Not parallel: it empties PATH.
	cfg, err := ParseConfig([]byte("tools: [{id: t, command: [/bin/true]}]"))
	if err != nil {
		t.Fatal(err)
	}
	none, err := ParseConfig([]byte("isolation: none\ntools: [{id: t, command: [/bin/true]}]"))
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", worldDir(t, false))
	if _, err := NewRunner(cfg); !errors.Is(err, ErrNoBubblewrap) {
		t.Fatalf("without bwrap on PATH: %v", err)
	}
	if _, err := NewRunner(none); !errors.Is(err, ErrNoPrlimit) {
		t.Fatalf("without prlimit on PATH: %v", err)
	}
	// Builtins need neither.
	r, err := NewRunner(Config{Isolation: IsolationBubblewrap, Tools: []ToolConfig{{ID: "n", Builtin: BuiltinNoop}}})
	if err != nil || r.Warning() != "" {
		t.Fatalf("builtins only: %v %q", err, r.Warning())
	}
}

func TestNewRunnerChecksMountsAndConfig(t *testing.T) {
	t.Parallel()
	root := worldDir(t, false)
	shared := worldDir(t, true)
	inRoot := filepath.Join(root, "data")
	link := filepath.Join(worldDir(t, false), "link")
	for _, dir := range []string{filepath.Join(shared, "sub"), inRoot} {
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(shared, link); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Tools: []ToolConfig{{ID: "t", Command: []string{"/bin/true"}, Mounts: []Mount{{Path: "/nonexistent/dir"}}}}}, "mount /nonexistent/dir: no such file or directory"},
		{Config{Tools: []ToolConfig{{ID: "t", Command: []string{"/bin/true"}, Mounts: []Mount{{Path: filepath.Dir(root)}}}}}, "holds the work root"},
		{Config{Tools: []ToolConfig{{ID: "t"}}}, "command is required"},
		{Config{Tools: []ToolConfig{{ID: "t", Command: []string{"bin/tool"}}}}, `program "bin/tool" is a relative path`},
		// A mount another tool could change, and one among the calls'
		// working directories.
		{Config{Tools: []ToolConfig{
			{ID: "w", Command: []string{"/bin/true"}, Mounts: []Mount{{Path: shared, Writable: true}}},
			{ID: "r", Command: []string{"/bin/true"}, Mounts: []Mount{{Path: filepath.Join(shared, "sub")}}}}}, `is inside tool "w"'s writable mount`},
		{Config{Tools: []ToolConfig{{ID: "t", Command: []string{"/bin/true"}, Mounts: []Mount{{Path: inRoot}}}}}, "is inside the work root"},
		{Config{Tools: []ToolConfig{{ID: "t", Command: []string{"/bin/true"}, Mounts: []Mount{{Path: filepath.Join(link, "sub")}}}}}, "a symlink is in its path"},
	} {
		if _, err := NewRunner(c.cfg, WithWorkRoot(root)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewRunner(%+v): %v, want %q", c.cfg, err, c.want)
		}
	}
}

// TestPrestartedToolIsTheSame: the tool's process in a pre-started sandbox
// is the one a sandbox started for the call runs: the same credentials,
// capabilities, signal mask and ignored signals, rlimits, open files,
// environment, working directory, stdin and hostname. Only its place in
// the PID namespace differs: the stage stays its parent (pid 2), so the
// tool is a later pid and there is one more process.
func TestPrestartedToolIsTheSame(t *testing.T) {
	t.Parallel()
	const probe = `
tools:
  - id: probe
    command: [/bin/sh, -c, 'echo "pid $$ ppid $PPID"; while read -r k v; do case $k in Uid:|Gid:|Groups:|NoNewPrivs:|Seccomp:|Cap???:|SigBlk:|SigIgn:) echo "$k $v";; esac; done < /proc/$$/status; cat /proc/$$/limits; ls /proc/$$/fd; set -- /proc/[0-9]*; echo "processes $#"; env | sort; pwd; ls -A; umask; hostname; cat']
    env: {SECRET_TOKEN: s3cret}
    limits: {memory_mb: 128, cpu_seconds: 7, output_kb: 64, max_procs: 40}
`
	outputs := map[mode]string{}
	inModes(t, func(t *testing.T, m mode) {
		r, workRoot := newRunner(t, m, probe)
		res := r.Run(context.Background(), Call{ToolID: "probe", CallID: "c9", OperationID: "run-3/2/c9", Attempt: 4, Arguments: []byte(`{"q":"stdin"}`)})
		text := wantOutput(t, res).Text()
		// Each call has its own working directory.
		home := regexp.MustCompile(workRoot + `/toolbatch-call-[0-9]+`).FindString(text)
		if home == "" {
			t.Fatalf("no working directory in:\n%s", text)
		}
		outputs[m] = strings.ReplaceAll(text, home, "WORKDIR")
	})
	if t.Failed() {
		return
	}
	f, p := outputs[fresh], outputs[prestarted]
	// The stage's place: the tool's parent, and one more process.
	if m := regexp.MustCompile(`^pid ([0-9]+) ppid 2\n`).FindStringSubmatch(p); m == nil || m[1] == "2" {
		t.Fatalf("in a pre-started sandbox the tool is not the stage's child:\n%s", p)
	}
	p = regexp.MustCompile(`^pid [0-9]+ ppid 2\n`).ReplaceAllString(p, "pid 2 ppid 1\n")
	fm := regexp.MustCompile(`processes ([0-9]+)\n`).FindStringSubmatch(f)
	if fm == nil {
		t.Fatalf("no process count in:\n%s", f)
	}
	n, _ := strconv.Atoi(fm[1])
	p = strings.Replace(p, fmt.Sprintf("processes %d\n", n+1), fmt.Sprintf("processes %d\n", n), 1)
	// Its open files are stdin, stdout and stderr, nothing the test
	// process inherited (go test leaves some open across exec).
	if !strings.Contains(f, "\n0\n1\n2\nprocesses ") {
		t.Fatalf("the tool has more open files than stdin, stdout and stderr:\n%s", f)
	}
	for _, want := range []string{"pid 2 ppid 1\n", "TOOLBATCH_ATTEMPT=4\n", "TOOLBATCH_CALL_ID=c9\n", "TOOLBATCH_OPERATION_ID=run-3/2/c9\n",
		"SECRET_TOKEN=s3cret\n", "HOME=WORKDIR\n", "Max cpu time              7                    8", `{"q":"stdin"}`} {
		if !strings.Contains(f, want) {
			t.Fatalf("the probe's output lacks %q:\n%s", want, f)
		}
	}
	if f != p {
		t.Fatalf("the tool's process differs:\n--- fresh\n%s\n--- prestarted\n%s", f, p)
	}
	// Exec'd in place by the stage, the tool is exactly the one of a fresh
	// sandbox, place included.
	for _, m := range []mode{inPlace, childFails} {
		if outputs[m] != f {
			t.Fatalf("the tool's process differs:\n--- fresh\n%s\n--- %s\n%s", f, m, outputs[m])
		}
	}
}

// TestPrestartedSandboxDiedBeforeUse: pre-started sandboxes that died
// while they waited are never a call's failure: the call takes the next
// one (here, the replacement being started).
func TestPrestartedSandboxDiedBeforeUse(t *testing.T) {
	t.Parallel()
	r, _ := newRunner(t, prestarted, scriptTools)
	p := r.pools["cat"]
	p.mu.Lock()
	ready := slices.Clone(p.ready)
	p.mu.Unlock()
	if len(ready) != DefaultPrestart {
		t.Fatalf("%d ready, want %d", len(ready), DefaultPrestart)
	}
	for _, w := range ready {
		if err := syscall.Kill(-w.p.pgid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-w.p.done
	}
	wantText(t, run(t, r, "cat", `{"after":"the deaths"}`), `{"after":"the deaths"}`)
	if st := r.Stats(); st.DiedBeforeUse != int64(len(ready)) || st.Prestarted != 1 || st.Fresh != 0 {
		t.Fatalf("stats %+v, want %d died before use and the call in a pre-started sandbox", st, len(ready))
	}
}

// TestRefillWaitsForQuiet: the sandboxes calls take are replaced only once
// the calls have been quiet for a while, not between the calls of a batch
// (here the while never passes); a call that finds none ready has the pool
// filled at once and runs in the first sandbox started, not in one of its
// own.
func TestRefillWaitsForQuiet(t *testing.T) {
	t.Parallel()
	r, _ := newRunner(t, prestarted, scriptTools, func(r *Runner) { r.refillAfter = time.Hour })
	p := r.pools["cat"]
	poolState := func() (ready, starting int) {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.ready), p.starting
	}
	for i := range DefaultPrestart {
		wantText(t, run(t, r, "cat", `{}`), `{}`)
		if ready, starting := poolState(); ready != DefaultPrestart-1-i || starting != 0 {
			t.Fatalf("after call %d: %d ready, %d starting; want %d ready and none started", i+1, ready, starting, DefaultPrestart-1-i)
		}
	}
	wantText(t, run(t, r, "cat", `{"n":3}`), `{"n":3}`)
	if st := r.Stats(); st.Prestarted != DefaultPrestart+1 || st.Fresh != 0 {
		t.Fatalf("stats %+v: want every call in a pre-started sandbox", st)
	}
	// Quiet now: the pool fills up.
	r.refillAfter = time.Millisecond
	r.callActivity()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	if err := r.WaitPrestarted(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestAloneCallDoesNotWaitForTeardown: when the stage finds nothing of the
// tool running after its exit, the call's result does not wait for the
// sandbox's teardown (TestToolCannotOutliveItsCall has a tool that leaves
// a daemon: that call waits, and the daemon is gone when it returns).
func TestAloneCallDoesNotWaitForTeardown(t *testing.T) {
	t.Parallel()
	r, _ := newRunner(t, prestarted, scriptTools)
	before := r.Stats() // NewRunner's trial call
	wantText(t, run(t, r, "cat", `{"a":1}`), `{"a":1}`)
	if st := r.Stats(); st.StageChild-before.StageChild != 1 || st.StageAlone-before.StageAlone != 1 {
		t.Fatalf("stats %+v (before the call %+v): want the call run by the stage, with nothing left running", st, before)
	}
}

// TestCloseTearsDownPrestarted: Close kills every pre-started sandbox and
// removes its working directory before it returns; calls after Close
// start their own sandbox.
func TestCloseTearsDownPrestarted(t *testing.T) {
	// Not parallel: it counts the sandbox user's processes.
	before := sandboxProcs(t)
	r, workRoot := newRunner(t, prestarted, scriptTools, WithSandboxUser(countUID, countUID))
	// cat, cat_json, env, fail, workdir: 2 each, of 3 processes (bwrap,
	// its init, the stage).
	const sandboxes = 5 * DefaultPrestart
	if n := sandboxProcs(t); n < before+3*sandboxes {
		t.Fatalf("%d sandbox processes, want at least %d", n-before, 3*sandboxes)
	}
	if entries, _ := os.ReadDir(workRoot); len(entries) != sandboxes {
		t.Fatalf("%d working directories, want %d", len(entries), sandboxes)
	}
	wantCleanedUp(t, r, workRoot)
	if n := sandboxProcs(t); n > before {
		t.Fatalf("%d sandbox processes left after Close", n-before)
	}
	wantText(t, run(t, r, "cat", `{}`), `{}`)
	if st := r.Stats(); st.Fresh != 1 {
		t.Fatalf("stats after Close: %+v", st)
	}
	r.stats.fresh.Store(0) // newRunner's check is about calls before Close
	wantEmpty(t, workRoot)
}

// TestPrestartBroken: a program whose stage does not run StageMain
// (here /bin/true) is refused by NewRunner with a clear error.
func TestPrestartBroken(t *testing.T) {
	t.Parallel()
	cfg, err := ParseConfig([]byte("tools: [{id: t, command: [/bin/true]}]"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = NewRunner(cfg, WithWorkRoot(worldDir(t, false)), func(r *Runner) { r.stagePath = "/bin/true" })
	if !errors.Is(err, ErrPrestartBroken) || !strings.Contains(err.Error(), "the sandbox ended before it was ready: exit status 0") {
		t.Fatalf("NewRunner with a stage that does not run StageMain: %v", err)
	}
}

// TestMemoryFileSystemsAreBounded: /dev/shm and /tmp hold at most half the
// tool's memory limit each (so together no more than the limit), and /dev
// itself takes no files; its devices still work.
func TestMemoryFileSystemsAreBounded(t *testing.T) {
	t.Parallel()
	inModes(t, func(t *testing.T, m mode) {
		r, _ := newRunner(t, m, `
tools:
  - id: fill
    command: [/bin/sh, -c, 'for d in /dev/shm /tmp; do for i in 1 2 3; do head -c 12000000 /dev/zero > $d/f$i 2>/dev/null || { echo "$d full at $i"; break; }; done; done; echo x > /dev/x 2>/dev/null || echo "dev read-only"; echo ok > /dev/null && echo "null works"']
    limits: {memory_mb: 32}
`)
		wantText(t, run(t, r, "fill", `{}`), "/dev/shm full at 2\n/tmp full at 2\ndev read-only\nnull works\n")
	})
}

// TestToolCannotOutliveItsCall: a hostile tool cannot trace the sandbox's
// init or read another process's memory (the seccomp filter), and the
// daemon it leaves is gone when its call returns (the whole PID namespace
// is killed with the sandbox's init).
func TestToolCannotOutliveItsCall(t *testing.T) {
	t.Parallel()
	inModes(t, func(t *testing.T, m mode) {
		r, _ := newRunner(t, m, `
tools:
  - id: hostile
    command: [python3, ./hostile.py]
`)
		marker := fmt.Sprintf("toolbatch-hostile-%s-%d", m, time.Now().UnixNano())
		before := r.Stats()
		wantText(t, run(t, r, "hostile", fmt.Sprintf(`{"marker":%q}`, marker)),
			"seize init Operation not permitted\nattach init Operation not permitted\nread init's memory Operation not permitted\n")
		if pids := processesWith(t, marker); len(pids) > 0 {
			t.Fatalf("the tool's daemon outlived its call: pids %v", pids)
		}
		if st := r.Stats(); st.StageAlone != before.StageAlone {
			t.Fatalf("stats %+v (before the call %+v): the stage found nothing running after the tool, which left a daemon", st, before)
		}
	})
}

// processesWith returns the host processes whose command line holds s.
func processesWith(t *testing.T, s string) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cmdline), s) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestMountsArePinned: a mount is the directory the worker opened at start,
// by descriptor: replacing its path with a symlink to somewhere else (what
// a tool with write access above it would do) changes nothing a later
// call sees.
func TestMountsArePinned(t *testing.T) {
	t.Parallel()
	inModes(t, func(t *testing.T, m mode) {
		parent := worldDir(t, true)
		data, elsewhere := filepath.Join(parent, "data"), worldDir(t, false)
		if err := os.Mkdir(data, 0o755); err != nil {
			t.Fatal(err)
		}
		for dir, text := range map[string]string{data: "original", elsewhere: "redirected"} {
			if err := os.WriteFile(filepath.Join(dir, "a"), []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		r, _ := newRunner(t, m, fmt.Sprintf(`
tools:
  - id: read
    command: [/bin/cat, %s/a]
    mounts: [{path: %s}]
`, data, data))
		wantText(t, run(t, r, "read", `{}`), "original")
		if err := os.Rename(data, data+".moved"); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(elsewhere, data); err != nil {
			t.Fatal(err)
		}
		wantText(t, run(t, r, "read", `{}`), "original")
	})
}

// TestToolsAreSeparateUsers: each tool runs as its own user, so a file one
// tool keeps private (mode 0600) in a workspace two tools share is not
// readable by the other; a file it shares (0644) is. (A worker that is
// not root runs every tool as its own user: then both are readable.)
func TestToolsAreSeparateUsers(t *testing.T) {
	t.Parallel()
	root := os.Geteuid() == 0
	inModes(t, func(t *testing.T, m mode) {
		shared := worldDir(t, true)
		r, _ := newRunner(t, m, fmt.Sprintf(`
tools:
  - id: writer
    command: [/bin/sh, -c, 'umask 077; echo secret > %[1]s/private; umask 022; echo hello > %[1]s/public; echo done']
    mounts: [{path: %[1]s, writable: true}]
  - id: reader
    command: [/bin/sh, -c, 'cat %[1]s/public; cat %[1]s/private 2>/dev/null || echo "private: denied"']
    mounts: [{path: %[1]s, writable: true}]
`, shared))
		wantText(t, run(t, r, "writer", `{}`), "done\n")
		want := "hello\nprivate: denied\n"
		if !root {
			want = "hello\nsecret\n"
		}
		wantText(t, run(t, r, "reader", `{}`), want)
		if users := r.Users(); users["writer"] == users["reader"] || users["writer"] < SandboxUIDBase {
			t.Fatalf("users %v", users)
		}
	})
}
