package main_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

// toolbatch runs the CLI and returns its exit status, stdout and stderr.
func toolbatch(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(cliBin, args...)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if err != nil && cmd.ProcessState == nil {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), out.String(), errOut.String()
}

// TestAuthCommands: users are created (credentials 0600), listed,
// printed as a configuration nats-server accepts, and revoked; each
// mistake is one line and a non-zero status, and changes nothing.
func TestAuthCommands(t *testing.T) {
	dir := t.TempDir()
	auth := filepath.Join(dir, "auth.yaml")
	cat := filepath.Join(dir, "catalog.yaml")
	if err := os.WriteFile(cat, []byte("tools:\n  - {id: build, target: sandbox}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"--role", "worker", "--name", "w1", "--pool", "default"},
		{"--role", "approver", "--name", "alice", "--principal", "alice"},
		{"--role", "client", "--name", "app", "--resume"},
	} {
		if code, out, errOut := toolbatch(t, append([]string{"auth", "create", "--file", auth, "--out", filepath.Join(dir, args[3]+".creds")}, args...)...); code != 0 {
			t.Fatalf("create %v: %d %s %s", args, code, out, errOut)
		}
	}
	st, err := os.Stat(filepath.Join(dir, "w1.creds"))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("w1.creds: %v %v", st, err)
	}
	before, _ := os.ReadFile(auth)
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"auth", "create", "--file", auth, "--role", "worker", "--name", "w1", "--pool", "default", "--out", filepath.Join(dir, "again.creds")}, 1, "user w1 exists"},
		{[]string{"auth", "create", "--file", auth, "--role", "root", "--name", "x", "--out", filepath.Join(dir, "x.creds")}, 2, `unknown role "root"`},
		{[]string{"auth", "create", "--file", auth, "--role", "worker", "--name", "w2", "--out", filepath.Join(dir, "w2.creds")}, 2, "a worker names its pools"},
		{[]string{"auth", "create", "--file", auth, "--role", "client", "--name", "b", "--out", filepath.Join(dir, "w1.creds")}, 1, "file exists"},
		{[]string{"auth", "create", "--role", "client", "--name", "b"}, 2, "--file AUTH is required"},
		{[]string{"auth", "revoke", "--file", auth, "--name", "nobody"}, 1, `no user "nobody"`},
		{[]string{"auth", "permissions", "--file", auth}, 1, "the catalog is needed"},
		{[]string{"auth", "permissions", "--file", auth, "--catalog", cat, "--format", "yaml"}, 2, "want server or jwt"},
		{[]string{"auth", "frobnicate"}, 2, "unknown subcommand"},
	} {
		code, _, errOut := toolbatch(t, c.args...)
		lines := strings.Split(strings.TrimSpace(errOut), "\n")
		if code != c.code || len(lines) != 1 || !strings.Contains(lines[0], c.want) {
			t.Errorf("%v: status %d, stderr %q; want %d and %q", c.args[1:], code, errOut, c.code, c.want)
		}
	}
	if after, _ := os.ReadFile(auth); string(after) != string(before) {
		t.Fatalf("a refused command changed the auth file:\n%s", after)
	}
	if _, err := os.Stat(filepath.Join(dir, "x.creds")); err == nil {
		t.Fatal("a refused create wrote credentials")
	}

	code, out, _ := toolbatch(t, "auth", "list", "--file", auth)
	if code != 0 || !strings.Contains(out, "alice") || !strings.Contains(out, "principal alice") || !strings.Contains(out, "pools default") {
		t.Fatalf("list: %d %s", code, out)
	}
	code, out, _ = toolbatch(t, "auth", "permissions", "--file", auth, "--catalog", cat)
	if code != 0 {
		t.Fatalf("permissions: %d", code)
	}
	conf := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(conf, []byte("port: -1\n"+out), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil || len(opts.Nkeys) != 3 {
		t.Fatalf("nats-server reads the printed block: %v (%d users)\n%s", err, len(opts.Nkeys), out)
	}
	code, out, _ = toolbatch(t, "auth", "permissions", "--file", auth, "--catalog", cat, "--format", "jwt", "--name", "alice")
	if code != 0 || !strings.Contains(out, `"toolbatch.resume.*.alice"`) {
		t.Fatalf("jwt claims: %d %s", code, out)
	}
	// A decentralized setup: the credentials are the user's JWT, signed by
	// the account, with the role's permissions.
	akp, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	aseed, _ := akp.Seed()
	accountSeed := filepath.Join(dir, "account.nk")
	if err := os.WriteFile(accountSeed, aseed, 0o600); err != nil {
		t.Fatal(err)
	}
	jwtCreds := filepath.Join(dir, "w3.creds")
	if code, _, errOut := toolbatch(t, "auth", "create", "--file", auth, "--role", "worker", "--name", "w3", "--pool", "default",
		"--account-seed", accountSeed, "--catalog", cat, "--out", jwtCreds); code != 0 {
		t.Fatalf("create with --account-seed: %s", errOut)
	}
	data, err := os.ReadFile(jwtCreds)
	if err != nil {
		t.Fatal(err)
	}
	token, err := jwt.ParseDecoratedJWT(data)
	if err != nil {
		t.Fatal(err)
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		t.Fatal(err)
	}
	apub, _ := akp.PublicKey()
	if uc.Issuer != apub || uc.Name != "w3" || !uc.Pub.Allow.Contains("$JS.API.CONSUMER.MSG.NEXT.TOOLBATCH_DISPATCH.pool-default-build") {
		t.Fatalf("user claims %+v", uc)
	}
	if code, _, errOut := toolbatch(t, "auth", "revoke", "--file", auth, "--name", "alice"); code != 0 {
		t.Fatalf("revoke: %s", errOut)
	}
	if _, out, _ = toolbatch(t, "auth", "list", "--file", auth); strings.Contains(out, "alice") {
		t.Fatalf("alice still listed:\n%s", out)
	}
}
