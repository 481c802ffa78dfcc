package main_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/access"
	"github.com/toolbatch/toolbatch/client"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/internal/testproc"
	"github.com/toolbatch/toolbatch/internal/testtls"
	"github.com/toolbatch/toolbatch/protocol"
)

const secureCatalog = `
tools:
  - {id: local, target: sandbox, recovery: {mode: replay_safe}, dispatch_deadline: 20s}
  - {id: remote, target: sandbox, pool: gpu, recovery: {mode: replay_safe}, dispatch_deadline: 20s}
gate:
  rules:
    - tools: ["remote"]
      outcome: require_confirmation
  external: {timeout: 5s, on_timeout: block}
`

func secureWorkerYAML(pool, tool, text string) string {
	return fmt.Sprintf(`
pools: [%s]
isolation: none
tools:
  - id: %s
    command: ["/bin/echo", %q]
    capability: replay_safe
`, pool, tool, text)
}

// TestSecuredDeployment runs the production setup of docs/security.md:
// users made with toolbatch auth, an engine whose embedded server
// requires them and mutual TLS, a second engine connected with engine
// credentials, two workers of different pools, a gate
// service, a client and two approvers, each with its own credentials. A
// batch runs end to end; an approver cannot answer as the other; nobody
// connects without credentials or a client certificate.
func TestSecuredDeployment(t *testing.T) {
	dir := t.TempDir()
	pki := testtls.Write(t, dir)
	authFile := filepath.Join(dir, "auth.yaml")
	creds := func(name string) string { return filepath.Join(dir, name+".creds") }
	for _, args := range [][]string{
		{"--role", "worker", "--name", "w1", "--pool", "default"},
		{"--role", "worker", "--name", "w2", "--pool", "gpu"},
		{"--role", "client", "--name", "c1"},
		{"--role", "approver", "--name", "alice", "--principal", "alice"},
		{"--role", "approver", "--name", "bob", "--principal", "bob"},
		{"--role", "gate", "--name", "g1"},
		{"--role", "auditor", "--name", "aud"},
		{"--role", "engine", "--name", "e2"},
	} {
		name := args[3]
		out, err := exec.Command(toolbatchBin, append([]string{"auth", "create", "--file", authFile, "--out", creds(name)}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("toolbatch auth create %s: %v: %s", name, err, out)
		}
		if st, err := os.Stat(creds(name)); err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("credentials of %s: %v %v", name, st.Mode(), err)
		}
	}
	cat := filepath.Join(dir, "catalog.yaml")
	if err := os.WriteFile(cat, []byte(secureCatalog), 0o644); err != nil {
		t.Fatal(err)
	}
	port := testproc.FreePort(t)
	url := fmt.Sprintf("tls://127.0.0.1:%d", port)
	testproc.Start(t, "engine", `"engine ready"`, engineBin, "--store", filepath.Join(dir, "store"), "--listen", fmt.Sprintf("127.0.0.1:%d", port),
		"--catalog", cat, "--log-format", "json", "--auth", authFile,
		"--tls-cert", pki.ServerCert, "--tls-key", pki.ServerKey, "--tls-client-ca", pki.CA)
	tlsFlags := []string{"--tls-ca", pki.CA, "--tls-client-cert", pki.ClientCert, "--tls-client-key", pki.ClientKey}
	// A second engine shares the work over the network with an engine
	// user's credentials, as engines on other machines do.
	testproc.Start(t, "engine2", `"engine ready"`, engineBin, append([]string{"--nats-url", url, "--creds", creds("e2"),
		"--catalog", cat, "--log-format", "json"}, tlsFlags...)...)
	for _, w := range []struct{ name, pool, tool string }{{"w1", "default", "local"}, {"w2", "gpu", "remote"}} {
		cfg := filepath.Join(dir, w.name+".yaml")
		if err := os.WriteFile(cfg, []byte(secureWorkerYAML(w.pool, w.tool, "ran on "+w.name)), 0o644); err != nil {
			t.Fatal(err)
		}
		testproc.Start(t, w.name, `"ready"`, workerBin, append([]string{"--nats-url", url, "--config", cfg, "--worker-id", w.name,
			"--log-format", "json", "--creds", creds(w.name)}, tlsFlags...)...)
	}
	// A worker may advertise only under its own user's name: one started
	// with another id stops at start, saying why.
	out, err := exec.Command(workerBin, append([]string{"--nats-url", url, "--config", filepath.Join(dir, "w1.yaml"), "--worker-id", "w9",
		"--creds", creds("w1")}, tlsFlags...)...).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--worker-id must be the user's name") {
		t.Fatalf("a worker advertising under another name: %v: %s", err, out)
	}
	connect := func(name string) *nats.Conn {
		t.Helper()
		opts, err := access.Conn{Creds: creds(name), TLSCA: pki.CA, TLSCert: pki.ClientCert, TLSKey: pki.ClientKey}.Options()
		if err != nil {
			t.Fatal(err)
		}
		nc, err := nats.Connect(url, opts...)
		if err != nil {
			t.Fatalf("connect as %s: %v", name, err)
		}
		t.Cleanup(nc.Close)
		return nc
	}

	// Nobody gets in without a client certificate, or without credentials.
	if nc, err := nats.Connect(url, nats.RootCAs(pki.CA)); err == nil {
		nc.Close()
		t.Fatal("connected without a client certificate")
	}
	if nc, err := nats.Connect(url, nats.RootCAs(pki.CA), nats.ClientCert(pki.ClientCert, pki.ClientKey)); err == nil {
		nc.Close()
		t.Fatal("connected without credentials")
	}

	// The gate service allows every call and records what it was asked.
	var gateMu sync.Mutex
	var gated []string
	gate := connect("g1")
	if _, err := gate.Subscribe(protocol.Names{Prefix: protocol.DefaultPrefix}.Gate(), func(m *nats.Msg) {
		var req protocol.GateRequest
		if err := events.Unmarshal(m.Data, &req); err != nil {
			return
		}
		gateMu.Lock()
		gated = append(gated, req.ToolID)
		gateMu.Unlock()
		body, _ := events.Marshal(protocol.GateReply{Outcome: events.GateAllow})
		_ = m.Respond(body)
	}); err != nil {
		t.Fatal(err)
	}
	if err := gate.Flush(); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c1key, err := access.Conn{Creds: creds("c1")}.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	c1, err := client.New(connect("c1"), client.WithSubmitter(c1key))
	if err != nil {
		t.Fatal(err)
	}
	if err := c1.Submit(ctx, batch("sec", 1, "local", "remote")); err != nil {
		t.Fatal(err)
	}
	w, err := c1.Watch(ctx, "sec")
	if err != nil {
		t.Fatal(err)
	}
	ticket := nextTicket(t, ctx, w, "")
	w.Stop()

	// an approver lists the open tickets with its own credentials; the
	// status of the deployment is the admin's only
	list := exec.Command(toolbatchBin, append([]string{"tickets", "--nats-url", url, "--creds", creds("alice"), "--timeout", "20s"}, tlsFlags...)...)
	if out, err := list.CombinedOutput(); err != nil || !strings.Contains(string(out), "ticket "+ticket.CorrelationID+" of run sec: permission") {
		t.Fatalf("alice listing the tickets: %v: %s", err, out)
	}
	status := exec.Command(toolbatchBin, append([]string{"status", "--nats-url", url, "--creds", creds("alice"), "--timeout", "10s"}, tlsFlags...)...)
	if out, err := status.CombinedOutput(); err == nil || strings.Count(strings.TrimSpace(string(out)), "\n") != 0 || !strings.Contains(string(out), "NATS refused it") {
		t.Fatalf("an approver reading the status: %v: %s", err, out)
	}

	// bob cannot answer as alice: NATS refuses the publish, the command
	// says so in one line, and the ticket stays open. alice can, with the
	// shell client and her credentials.
	approve := func(user string) (int, string) {
		cmd := exec.Command(toolbatchBin, append([]string{"approve", "sec", ticket.CorrelationID, "--principal", "alice",
			"--nats-url", url, "--creds", creds(user), "--timeout", "20s"}, tlsFlags...)...)
		out, _ := cmd.CombinedOutput()
		return cmd.ProcessState.ExitCode(), string(out)
	}
	if code, out := approve("bob"); code != 1 || strings.Count(strings.TrimSpace(out), "\n") != 0 || !strings.Contains(out, "NATS refused it") {
		t.Fatalf("bob approving as alice: status %d: %s", code, out)
	}
	if code, out := approve("alice"); code != 0 {
		t.Fatalf("alice approving: status %d: %s", code, out)
	}
	res, err := c1.WaitResults(ctx, "sec", "sec/1")
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(texts(res)); got != `[ok "ran on w1\n" ok "ran on w2\n"]` {
		t.Fatalf("results %q", got)
	}
	// The operator's rule decided remote (a confirmation); the gate
	// service decided local.
	gateMu.Lock()
	if fmt.Sprint(gated) != "[local]" {
		t.Errorf("the gate service was asked about %v", gated)
	}
	gateMu.Unlock()

	// The log records alice, and only alice, as the principal.
	js, err := jetstream.New(connect("aud"))
	if err != nil {
		t.Fatal(err)
	}
	var principals []string
	err = protocol.ReadOrdered(ctx, js, protocol.Names{Prefix: protocol.DefaultPrefix}.EventsStream(),
		protocol.ReadOptions{Subjects: []string{"toolbatch.events.sec"}}, func(m jetstream.Msg, _ *jetstream.MsgMetadata) error {
			evs, err := events.DecodeCommit(m.Data(), m.Headers().Values(protocol.HeaderEvent))
			for _, e := range evs {
				if r, ok := e.(*events.TicketResolved); ok {
					principals = append(principals, r.Principal)
				}
			}
			return err
		})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(principals, ",") != "alice" {
		t.Fatalf("ticket resolutions by %v", principals)
	}
}
