package access_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/toolbatch/toolbatch/access"
	"github.com/toolbatch/toolbatch/protocol"
)

// TestUserCheck: each bad entry of an auth file is refused with a line
// that names the user and what to fix.
func TestUserCheck(t *testing.T) {
	good, _, err := access.NewUser("w1", access.RoleWorker)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		u    access.User
		want string
	}{
		{"bad name", access.User{Name: "w 1", Role: access.RoleWorker, NKey: good.NKey, Pools: []string{"p"}}, "a name must match"},
		{"unknown role", access.User{Name: "x", Role: "root", NKey: good.NKey}, `unknown role "root"`},
		{"not a user key", access.User{Name: "x", Role: access.RoleClient, NKey: "SUABC"}, "not a user public key"},
		{"worker without pools", access.User{Name: "x", Role: access.RoleWorker, NKey: good.NKey}, "a worker names its pools"},
		{"approver without principal", access.User{Name: "x", Role: access.RoleApprover, NKey: good.NKey}, "an approver names its principal"},
		{"pools on a client", access.User{Name: "x", Role: access.RoleClient, NKey: good.NKey, Pools: []string{"p"}}, "pools are a worker's"},
		{"resume on an approver", access.User{Name: "x", Role: access.RoleApprover, Principal: "a", NKey: good.NKey, Resume: true}, "resume a client's"},
	} {
		err := c.u.Check()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
}

// TestAuthFile: a saved file loads back; one name or key twice, or an
// unknown field, is refused.
func TestAuthFile(t *testing.T) {
	dir := t.TempDir()
	a, _, _ := access.NewUser("a", access.RoleClient)
	b, _, _ := access.NewUser("b", access.RoleAuditor)
	f := &access.File{Users: []access.User{a, b}}
	path := filepath.Join(dir, "auth.yaml")
	if err := f.Save(path); err != nil {
		t.Fatal(err)
	}
	got, err := access.LoadFile(path)
	if err != nil || len(got.Users) != 2 || got.Users[1].NKey != b.NKey || got.Users[1].Role != b.Role {
		t.Fatalf("loaded %+v, %v", got, err)
	}
	b.NKey = a.NKey
	if err := (&access.File{Users: []access.User{a, b}}).Check(); err == nil || !strings.Contains(err.Error(), "another user's too") {
		t.Fatalf("one key twice: %v", err)
	}
	if err := (&access.File{Users: []access.User{a, a}}).Check(); err == nil || !strings.Contains(err.Error(), "given twice") {
		t.Fatalf("one name twice: %v", err)
	}
	if err := os.WriteFile(path, []byte("users:\n  - {name: a, role: client, nkey: "+a.NKey+", password: x}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := access.LoadFile(path); err == nil || !strings.Contains(err.Error(), "password") {
		t.Fatalf("an unknown field: %v", err)
	}
}

// TestCreds: credentials are written 0600 and never over an existing
// file; a file without a seed is refused by name.
func TestCreds(t *testing.T) {
	dir := t.TempDir()
	_, seed, err := access.NewUser("c", access.RoleClient)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "c.creds")
	if err := access.WriteCreds(path, seed); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v", st.Mode())
	}
	if err := access.WriteCreds(path, seed); err == nil {
		t.Fatal("an existing credentials file was replaced")
	}
	if _, err := (access.Conn{Creds: path}).Options(); err != nil {
		t.Fatal(err)
	}
	junk := filepath.Join(dir, "junk")
	os.WriteFile(junk, []byte("hello"), 0o600)
	if _, err := (access.Conn{Creds: junk}).Options(); err == nil || !strings.Contains(err.Error(), "no user nkey seed") {
		t.Fatalf("junk credentials: %v", err)
	}
	if _, err := (access.Conn{TLSCert: "x"}).Options(); err == nil {
		t.Fatal("a client certificate without its key")
	}
}

// TestWorkerNeedsTheCatalog: a worker's permissions name its pools'
// tools, so they cannot be computed without the catalog's.
func TestWorkerNeedsTheCatalog(t *testing.T) {
	w, _, _ := access.NewUser("w", access.RoleWorker)
	w.Pools = []string{"default"}
	l := access.Layout{Names: protocol.Names{Prefix: "toolbatch"}}
	if _, err := l.Permissions(w); err == nil || !strings.Contains(err.Error(), "the catalog is needed") {
		t.Fatalf("without the catalog: %v", err)
	}
	l.PoolTools = map[string][]string{"default": {"build"}}
	p, err := l.Permissions(w)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(p.Publish.Allow, " "), "$JS.API.CONSUMER.MSG.NEXT.TOOLBATCH_DISPATCH.pool-default-build") {
		t.Fatalf("the pool's consumer is not in %v", p.Publish.Allow)
	}
}
