package console

import (
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/toolbatch/toolbatch/aggregate"
	"github.com/toolbatch/toolbatch/internal/testnats"
)

func TestUsersFile(t *testing.T) {
	var u Users
	if err := u.Set("alice", "alice", "short"); err == nil || !strings.Contains(err.Error(), "at least 12 characters") {
		t.Fatalf("a short password: %v", err)
	}
	if err := u.Set("alice", "alice", "long enough password"); err != nil {
		t.Fatal(err)
	}
	if err := u.Set("bob", "ops.team", "long enough password"); err == nil || !strings.Contains(err.Error(), `principal "ops.team"`) {
		t.Fatalf("a principal that is no id: %v", err)
	}
	u.Users = u.Users[:1]
	if err := u.Set("alice", "alice-2", "another long password"); err != nil {
		t.Fatal(err)
	}
	if len(u.Users) != 1 || u.Users[0].Principal != "alice-2" {
		t.Fatalf("set replaced nothing: %+v", u.Users)
	}
	path := filepath.Join(t.TempDir(), "users.yaml")
	if err := u.Save(path); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("users file mode: %v %v", fi.Mode(), err)
	}
	got, err := LoadUsers(path)
	if err != nil || got.find("alice", "another long password") == nil || got.find("alice", "long enough password") != nil {
		t.Fatalf("load: %v", err)
	}
	for _, bad := range []string{
		"users:\n  - {name: a, principal: a, password: plain}\n",
		"users:\n  - {name: a, principal: a, password: " + u.Users[0].Password + "}\n  - {name: a, principal: b, password: " + u.Users[0].Password + "}\n",
		"users:\n  - {name: 'a b', principal: a, password: " + u.Users[0].Password + "}\n",
	} {
		if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadUsers(path); err == nil {
			t.Errorf("loaded %q", bad)
		}
	}
}

func TestSignInLockout(t *testing.T) {
	var u Users
	if err := u.Set("alice", "alice", "long enough password"); err != nil {
		t.Fatal(err)
	}
	s := newSessions()
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	for i := range maxFailures {
		if _, err := s.signIn(&u, "alice", "wrong", now); err == nil || err.Error() != "wrong name or password" {
			t.Fatalf("attempt %d: %v", i, err)
		}
	}
	if _, err := s.signIn(&u, "alice", "long enough password", now.Add(time.Second)); err == nil || !strings.Contains(err.Error(), "too many wrong passwords") {
		t.Fatalf("locked out: %v", err)
	}
	tok, err := s.signIn(&u, "alice", "long enough password", now.Add(lockedFor+time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if x := s.get(tok, now.Add(lockedFor+2*time.Second)); x == nil || x.user.Principal != "alice" {
		t.Fatal("no session")
	}
	if x := s.get(tok, now.Add(lockedFor+sessionTTL+2*time.Second)); x != nil {
		t.Fatal("an expired session is still served")
	}
	if _, err := s.signIn(&u, "nobody", "long enough password", now); err == nil {
		t.Fatal("an unknown user signed in")
	}
}

func TestSafeNext(t *testing.T) {
	for in, want := range map[string]string{
		"/runs?state=ended": "/runs?state=ended", "//evil.example/x": "/approvals", "https://evil.example": "/approvals",
		"/\\evil.example": "/approvals", "": "/approvals",
	} {
		if got := safeNext(in); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", in, got, want)
		}
	}
}

// consoleServer serves a console on a real NATS server (no engine: what
// is tested happens before anything is published).
func consoleServer(t *testing.T) (*httptest.Server, *http.Client) {
	t.Helper()
	nc := testnats.Connect(t, testnats.Start(t, t.TempDir()))
	var u Users
	if err := u.Set("alice", "alice", "long enough password"); err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{NC: nc, Users: &u, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(hs.Close)
	jar, _ := cookiejar.New(nil)
	return hs, &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func TestPagesNeedASession(t *testing.T) {
	hs, c := consoleServer(t)
	for _, path := range []string{"/approvals", "/runs", "/runs/r1", "/waits", "/audit"} {
		resp, err := c.Get(hs.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusSeeOther || loc != "/signin?next="+url.QueryEscape(path) {
			t.Errorf("GET %s signed out: %d %q", path, resp.StatusCode, loc)
		}
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
			t.Errorf("GET %s: CSP %q", path, csp)
		}
	}
	// Nothing feeds this console (Run is not called): it is not ready,
	// and says what it lacks.
	resp, err := c.Get(hs.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || string(body) != "not ready: still reading the events stream; still reading the tickets bucket\n" {
		t.Errorf("readyz: %d %q", resp.StatusCode, body)
	}
	for _, req := range []struct{ method, path string }{{"GET", "/events"}, {"POST", "/approvals"}, {"POST", "/runs/r1/control"}, {"POST", "/waits/perform"}} {
		r, _ := http.NewRequest(req.method, hs.URL+req.path, strings.NewReader(""))
		resp, err := c.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s %s signed out: %d", req.method, req.path, resp.StatusCode)
		}
	}
}

var csrfInput = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func TestPostsNeedTheTokenFromTheSameOrigin(t *testing.T) {
	hs, c := consoleServer(t)
	post := func(path string, form url.Values, hdr map[string]string) (int, string) {
		t.Helper()
		r, _ := http.NewRequest("POST", hs.URL+path, strings.NewReader(form.Encode()))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		for k, v := range hdr {
			r.Header.Set(k, v)
		}
		resp, err := c.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// A sign-in from another site is refused before the password is read.
	if code, body := post("/signin", url.Values{"name": {"alice"}, "password": {"long enough password"}}, map[string]string{"Origin": "http://evil.example"}); code != http.StatusForbidden || !strings.Contains(body, "cross-site") {
		t.Fatalf("cross-site sign-in: %d %s", code, body)
	}
	if code, _ := post("/signin", url.Values{"name": {"alice"}, "password": {"long enough password"}, "next": {"/waits"}}, nil); code != http.StatusSeeOther {
		t.Fatalf("sign-in: %d", code)
	}
	resp, err := c.Get(hs.URL + "/approvals")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := csrfInput.FindSubmatch(page)
	if resp.StatusCode != http.StatusOK || m == nil {
		t.Fatalf("approvals page: %d\n%s", resp.StatusCode, page)
	}
	token := string(m[1])
	form := url.Values{"one": {"approve|r1|abc"}, "csrf": {token}}
	for _, tc := range []struct {
		what string
		form url.Values
		hdr  map[string]string
	}{
		{"no token", url.Values{"one": {"approve|r1|abc"}}, nil},
		{"another token", url.Values{"one": {"approve|r1|abc"}, "csrf": {token[1:] + "x"}}, nil},
		{"another site's page", form, map[string]string{"Origin": "http://evil.example"}},
		{"a cross-site fetch", form, map[string]string{"Sec-Fetch-Site": "cross-site"}},
	} {
		if code, _ := post("/approvals", tc.form, tc.hdr); code != http.StatusForbidden {
			t.Errorf("%s: %d, want 403", tc.what, code)
		}
	}
	// Sign-out needs the token too; then the session is gone.
	if code, _ := post("/signout", url.Values{"csrf": {token}}, map[string]string{"Origin": hs.URL}); code != http.StatusSeeOther {
		t.Fatalf("sign out: %d", code)
	}
	if code, _ := post("/approvals", form, nil); code != http.StatusUnauthorized {
		t.Fatalf("after sign-out: %d", code)
	}
}

// fill puts n runs in the index, as the fold leaves them: a third parked,
// a third ended.
func fill(ix *index, n int) {
	for i := range n {
		x := &indexed{sum: RunSummary{ID: fmt.Sprintf("run-%05d", i), Thread: fmt.Sprintf("thread-%d", i%100), Status: aggregate.StatusRunning, LastSeq: uint64(i + 1)}}
		switch i % 3 {
		case 1:
			x.sum.Status, x.sum.Wait = aggregate.StatusAwaiting, "permission"
		case 2:
			x.sum.Status, x.sum.Cause = aggregate.StatusEnded, "cancelled"
		}
		ix.runs[x.sum.ID] = x
		ix.order = append(ix.order, x)
	}
}

func TestRunsPages(t *testing.T) {
	ix := newIndex(nil)
	fill(ix, 10000)
	p := ix.query(StateParked, "", 1)
	if p.Total != 3333 || p.Pages != 67 || len(p.Runs) != PageSize || p.Runs[0].ID != "run-09997" || p.Runs[1].ID != "run-09994" {
		t.Fatalf("parked, page 1: total %d pages %d first %v", p.Total, p.Pages, p.Runs[:2])
	}
	last := ix.query(StateParked, "", 1000) // past the end: the last page
	if last.Page != 67 || len(last.Runs) != 3333-66*PageSize || last.Runs[len(last.Runs)-1].ID != "run-00001" {
		t.Fatalf("parked, last page: page %d, %d runs", last.Page, len(last.Runs))
	}
	q := ix.query(StateAll, "thread-42", 1)
	if q.Total != 100 {
		t.Fatalf("thread search: %d", q.Total)
	}
	for _, r := range q.Runs {
		if r.Thread != "thread-42" {
			t.Fatalf("thread search found %+v", r)
		}
	}
	if got := ix.query(StateEnded, "run-0000", 1); got.Total != 3 {
		t.Fatalf("ended runs matching run-0000: %d", got.Total)
	}
	if c := ix.counts(); c[StateAll] != 10000 || c[StateRunning] != 3334 || c[StateParked] != 3333 || c[StateEnded] != 3333 {
		t.Fatalf("counts: %v", c)
	}
}

// BenchmarkRunsPage10k: the runs page (query and render) over 10,000 runs.
func BenchmarkRunsPage10k(b *testing.B) {
	ix := newIndex(nil)
	fill(ix, 10000)
	pages, err := parsePages()
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	for b.Loop() {
		d := runsData{State: StateAll, States: []string{StateAll, StateRunning, StateParked, StateEnded}, Counts: ix.counts(), Page: ix.query(StateAll, "", 100)}
		if err := pages["runs"].ExecuteTemplate(io.Discard, "layout.html", view{Title: "Runs", Nav: "runs", Now: now, Data: d}); err != nil {
			b.Fatal(err)
		}
	}
}
