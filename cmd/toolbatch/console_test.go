package main_test

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolbatch/toolbatch/internal/testproc"
	"github.com/toolbatch/toolbatch/internal/testtls"
)

func TestConsoleRefusals(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	users := filepath.Join(t.TempDir(), "users.yaml")
	_, stderr, code := cli(t, ctx, "", "console", "--users", users, "--listen", "0.0.0.0:8080")
	if code != 2 {
		t.Fatalf("open listener without TLS: exit %d", code)
	}
	oneLine(t, "open listener", stderr, "toolbatch: console: --listen 0.0.0.0:8080 is not a loopback address: serve it over HTTPS")
	_, stderr, code = cli(t, ctx, "", "console", "--listen", "127.0.0.1:0")
	if code != 2 {
		t.Fatalf("no users: exit %d", code)
	}
	oneLine(t, "no users", stderr, "toolbatch: console: --users FILE is required")
	_, stderr, code = cli(t, ctx, "short\n", "console", "user", "--users", users, "--name", "alice")
	if code != 1 {
		t.Fatalf("short password: exit %d", code)
	}
	oneLine(t, "short password", stderr, "toolbatch: console user: a password has at least 12 characters")
	if _, err := os.Stat(users); !os.IsNotExist(err) {
		t.Fatalf("a refused user wrote the users file: %v", err)
	}
	stdout, stderr, code := cli(t, ctx, "a long enough password\n", "console", "user", "--users", users, "--name", "alice", "--principal", "ops-alice")
	if code != 0 || stdout != "user alice (principal ops-alice) set in "+users+"; the console's NATS credential must serve principals ops-alice\n" {
		t.Fatalf("console user: exit %d %q %s", code, stdout, stderr)
	}
}

// TestConsoleOverHTTPS: with a certificate the console listens on any
// address, serves HTTPS only, and its session cookie is Secure.
func TestConsoleOverHTTPS(t *testing.T) {
	url0 := startEngine(t)
	dir := t.TempDir()
	pki := testtls.Write(t, dir)
	users := filepath.Join(dir, "users.yaml")
	ctx := ctxT(t, 60*time.Second)
	if _, stderr, code := cli(t, ctx, "a long enough password\n", "console", "user", "--users", users, "--name", "alice"); code != 0 {
		t.Fatal(stderr)
	}
	port := testproc.FreePort(t)
	testproc.Start(t, "console", `"console ready"`, cliBin, "console", "--users", users, "--listen", fmt.Sprintf("0.0.0.0:%d", port),
		"--tls-cert", pki.ServerCert, "--tls-key", pki.ServerKey, "--nats-url", url0, "--log-format", "json")
	ca, err := os.ReadFile(pki.CA)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	base := fmt.Sprintf("https://127.0.0.1:%d", port)
	resp, err := hc.PostForm(base+"/signin", url.Values{"name": {"alice"}, "password": {"a long enough password"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	cookie := resp.Header.Get("Set-Cookie")
	if resp.StatusCode != http.StatusSeeOther || !strings.Contains(cookie, "Secure") || !strings.Contains(cookie, "HttpOnly") || !strings.Contains(cookie, "SameSite=Strict") {
		t.Fatalf("sign-in over HTTPS: %d, cookie %q", resp.StatusCode, cookie)
	}
	// Plain HTTP on the same port gets no page.
	plain, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", port))
	if err == nil {
		plain.Body.Close()
		if plain.StatusCode == http.StatusOK {
			t.Fatal("the console answered plain HTTP")
		}
	}
}
