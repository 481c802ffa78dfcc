package embedded_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/access"
	"github.com/toolbatch/toolbatch/catalog"
	"github.com/toolbatch/toolbatch/client"
	"github.com/toolbatch/toolbatch/embedded"
	"github.com/toolbatch/toolbatch/engine"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/internal/testwait"
	"github.com/toolbatch/toolbatch/protocol"
)

const matrixCatalog = `
tools:
  - {id: build, target: sandbox, recovery: {mode: replay_safe, max_attempts: 3}}
  - {id: render, target: sandbox, pool: gpu, recovery: {mode: replay_safe, max_attempts: 3}}
  - {id: echo, builtin: echo, recovery: {mode: replay_safe, max_attempts: 3}}
  - {id: confirm, builtin: echo, recovery: {mode: replay_safe, max_attempts: 3}}
gate:
  rules:
    - tools: ["confirm"]
      outcome: require_confirmation
`

// deployment is an engine with its embedded server and an auth file with
// one user of every role (two workers of different pools, two clients,
// two approvers), each with a credentials file written by package access.
type deployment struct {
	srv   *embedded.Server
	url   string
	auth  string            // the auth file
	creds map[string]string // user name -> credentials file
	keys  map[string]string // user name -> public nkey
	names protocol.Names
}

// Where a deployment's NATS server comes from.
const (
	embeddedServer = "embedded" // the engine's, from the auth file
	externalServer = "external" // a nats-server configured with toolbatch auth permissions' block
)

func deploy(t *testing.T, mode string) *deployment {
	t.Helper()
	dir := t.TempDir()
	cat, err := catalog.Parse([]byte(matrixCatalog))
	if err != nil {
		t.Fatal(err)
	}
	d := &deployment{creds: map[string]string{}, keys: map[string]string{}, names: protocol.Names{Prefix: protocol.DefaultPrefix}}
	var f access.File
	for _, u := range []access.User{
		{Name: "w1", Role: access.RoleWorker, Pools: []string{"default"}},
		{Name: "w2", Role: access.RoleWorker, Pools: []string{"gpu"}},
		{Name: "c1", Role: access.RoleClient},
		{Name: "c2", Role: access.RoleClient, Resume: true},
		{Name: "alice", Role: access.RoleApprover, Principal: "alice"},
		{Name: "bob", Role: access.RoleApprover, Principal: "bob"},
		{Name: "g1", Role: access.RoleGate},
		{Name: "b1", Role: access.RoleBrain, Tools: []string{"search"}},
		{Name: "d1", Role: access.RoleDelegate},
		{Name: "aud", Role: access.RoleAuditor},
		{Name: "con", Role: access.RoleConsole, Principals: []string{"carol", "dave"}},
		{Name: "adm", Role: access.RoleAdmin},
		{Name: "eng", Role: access.RoleEngine},
	} {
		made, seed, err := access.NewUser(u.Name, u.Role)
		if err != nil {
			t.Fatal(err)
		}
		u.NKey = made.NKey
		f.Users = append(f.Users, u)
		d.creds[u.Name] = filepath.Join(dir, u.Name+".creds")
		d.keys[u.Name] = u.NKey
		if err := access.WriteCreds(d.creds[u.Name], seed); err != nil {
			t.Fatal(err)
		}
	}
	d.auth = filepath.Join(dir, "auth.yaml")
	if err := f.Save(d.auth); err != nil {
		t.Fatal(err)
	}
	layout := access.Layout{Names: d.names, PoolTools: cat.PoolTools()}
	var engineOpts []nats.Option
	switch mode {
	case embeddedServer:
		d.srv, err = embedded.Start(embedded.Config{Listen: "127.0.0.1:-1", Store: filepath.Join(dir, "store"), Auth: d.auth, Layout: layout})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(d.srv.Stop)
		d.url = d.srv.ClientURL()
		engineOpts = d.srv.EngineOptions()
	case externalServer:
		var conf strings.Builder
		fmt.Fprintf(&conf, "listen: \"127.0.0.1:-1\"\njetstream { store_dir: %q }\nmax_payload: %d\n", filepath.Join(dir, "ext"), embedded.MaxPayload)
		if err := access.ServerConfig(&conf, layout, f.Users, "auth.yaml"); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, "nats.conf")
		if err := os.WriteFile(path, []byte(conf.String()), 0o600); err != nil {
			t.Fatal(err)
		}
		opts, err := server.ProcessConfigFile(path)
		if err != nil {
			t.Fatalf("the printed configuration: %v\n%s", err, conf.String())
		}
		opts.NoLog, opts.NoSigs = true, true
		srv, err := server.NewServer(opts)
		if err != nil {
			t.Fatal(err)
		}
		go srv.Start()
		t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
		if !srv.ReadyForConnections(10 * time.Second) {
			t.Fatal("nats-server did not start")
		}
		d.url = srv.ClientURL()
		if engineOpts, err = (access.Conn{Creds: d.creds["eng"]}).Options(); err != nil {
			t.Fatal(err)
		}
	}
	nc, err := nats.Connect(d.url, engineOpts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	pools := f.WorkerPools() // as cmd/engine does with --auth
	eng, err := engine.New(nc, engine.Config{Catalog: cat, WorkerPools: func(k string) []string { return pools[k] }, TrimEvery: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- eng.Run(ctx) }()
	t.Cleanup(func() { stop(); <-done })
	select {
	case <-eng.Ready():
	case err := <-done:
		t.Fatalf("engine: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("engine not ready")
	}
	return d
}

// conn is one user's connection, with the permission errors the server
// sent it.
type conn struct {
	nc   *nats.Conn
	js   jetstream.JetStream
	errs chan error
}

func (d *deployment) connect(t *testing.T, name string, extra ...nats.Option) *conn {
	t.Helper()
	opts, err := access.Conn{Creds: d.creds[name]}.Options()
	if err != nil {
		t.Fatal(err)
	}
	c := &conn{errs: make(chan error, 64)}
	opts = append(opts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case c.errs <- err:
		default:
		}
	}))
	c.nc, err = nats.Connect(d.url, append(opts, extra...)...)
	if err != nil {
		t.Fatalf("connect as %s: %v", name, err)
	}
	t.Cleanup(c.nc.Close)
	c.js, err = jetstream.New(c.nc)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// op is an operation on NATS. A core publish or subscription is async:
// it returns before the server answers, so only the server's error says
// whether it was refused.
type op struct {
	run   func(ctx context.Context) error
	async bool
}

// attempt runs o and returns its error and the first error the server
// sent the connection afterwards (nil: none within the wait).
func (c *conn) attempt(o op) (opErr, serverErr error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	opErr = o.run(ctx)
	_ = c.nc.Flush() // the server answers in order: its -ERR comes before the PONG
	select {
	case serverErr = <-c.errs:
	case <-time.After(2 * time.Second):
	}
	return opErr, serverErr
}

// checkRefused asserts that the server refused an operation with a
// permissions violation, and that the operation did not succeed.
func checkRefused(t *testing.T, o op, opErr, serverErr error) {
	t.Helper()
	switch {
	case serverErr == nil:
		t.Fatalf("no permissions violation (the operation returned %v)", opErr)
	case !errors.Is(serverErr, nats.ErrPermissionViolation) && !strings.Contains(strings.ToLower(serverErr.Error()), "permissions violation"):
		t.Fatalf("an error, but not a permissions violation: %v", serverErr)
	case opErr == nil && !o.async:
		t.Fatal("the operation succeeded")
	}
}

func (c *conn) allowed(t *testing.T, what string, o op) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := o.run(ctx); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if err := c.nc.FlushWithContext(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-c.errs:
		t.Fatalf("%s: %v", what, err)
	default:
	}
}

func publish(c *conn, subject string) op {
	return op{run: func(context.Context) error { return c.nc.Publish(subject, []byte("{}")) }, async: true}
}

func subscribe(c *conn, subject string) op {
	return op{run: func(context.Context) error { _, err := c.nc.SubscribeSync(subject); return err }, async: true}
}

func jsPublish(c *conn, subject string) op {
	return do(func(ctx context.Context) error { _, err := c.js.Publish(ctx, subject, []byte("{}")); return err })
}

func do(fn func(ctx context.Context) error) op { return op{run: fn} }

func kvPut(c *conn, bucket, key string) op {
	return do(func(ctx context.Context) error {
		kv, err := c.js.KeyValue(ctx, bucket)
		if err != nil {
			return err
		}
		_, err = kv.Put(ctx, key, []byte("replay_safe"))
		return err
	})
}

func request(c *conn, subject string) op {
	return do(func(ctx context.Context) error {
		_, err := c.nc.RequestWithContext(ctx, subject, []byte("{}"))
		return err
	})
}

// snapshot is the last sequence of every stream that only an engine or
// an allowed operation may change, so that a refused operation can be
// shown to change nothing.
func (d *deployment) snapshot(t *testing.T, admin *conn) map[string]uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n := d.names
	out := map[string]uint64{}
	for _, s := range []string{n.EventsStream(), n.InboxStream(), n.DispatchStream(), n.OutStream(), n.TimersStream(),
		"KV_" + n.StateBucket(), "KV_" + n.CatalogBucket(), "KV_" + n.WorkersBucket(), "KV_" + n.RegistryBucket()} {
		st, err := admin.js.Stream(ctx, s)
		if err != nil {
			t.Fatalf("stream %s: %v", s, err)
		}
		info, err := st.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out[s] = info.State.LastSeq
	}
	return out
}

// TestPermissionMatrix runs every role's allowed operations, then every
// forbidden one, on the two production setups: the engine's embedded
// server with an auth file, and a nats-server configured with the block
// toolbatch auth permissions prints, the engine connecting as an engine
// user. Each forbidden operation is refused by NATS and changes nothing.
func TestPermissionMatrix(t *testing.T) {
	for _, mode := range []string{embeddedServer, externalServer} {
		t.Run(mode, func(t *testing.T) { permissionMatrix(t, deploy(t, mode)) })
	}
}

func permissionMatrix(t *testing.T, d *deployment) {
	n := d.names
	adm := d.connect(t, "adm")

	// Without credentials nobody gets in.
	if nc, err := nats.Connect(d.url); err == nil {
		nc.Close()
		t.Fatal("an anonymous connection was accepted")
	} else if !strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
		t.Fatalf("anonymous connection: %v", err)
	}

	// Allowed: a client submits and reads its results; an approver
	// answers a ticket as itself; a worker binds to its pool's consumer,
	// advertises under its own name, claims and publishes a result;
	// services subscribe to their subjects; the auditor reads the log.
	c1 := d.connect(t, "c1")
	cl, err := client.New(c1.nc, client.WithSubmitter(d.keys["c1"]))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c1.allowed(t, "client submits and waits for the results", do(func(ctx context.Context) error {
		if err := cl.Submit(ctx, submitOf("r1", "echo", `{"text":"hi"}`)); err != nil {
			return err
		}
		_, err := cl.WaitResults(ctx, "r1", "r1/1")
		return err
	}))
	c1.allowed(t, "client submits a call that needs confirmation", do(func(ctx context.Context) error {
		return cl.Submit(ctx, submitOf("r2", "confirm", `{"text":"hi"}`))
	}))
	ticket := awaiting(t, ctx, cl, "r2")
	alice := d.connect(t, "alice")
	acl, err := client.New(alice.nc)
	if err != nil {
		t.Fatal(err)
	}
	alice.allowed(t, "approver approves as itself", do(func(ctx context.Context) error {
		if err := acl.Approve(ctx, ticket, "alice", "ok"); err != nil {
			return err
		}
		res, err := acl.WaitResults(ctx, "r2", "r2/1")
		if err == nil && len(res.Results) != 1 {
			err = fmt.Errorf("results %+v", res)
		}
		return err
	}))
	w1 := d.connect(t, "w1")
	w1.allowed(t, "worker binds to its pool's consumer", do(func(ctx context.Context) error {
		_, err := w1.js.Consumer(ctx, n.DispatchStream(), protocol.PoolConsumer("default", "build"))
		return err
	}))
	w1.allowed(t, "worker advertises under its own name", kvPut(w1, n.WorkersBucket(), protocol.WorkerKey("default", "build", "w1")))
	w1.allowed(t, "worker claims (refused by the engine: nothing to claim)", do(func(ctx context.Context) error {
		body, _ := events.Marshal(protocol.ClaimRequest{OperationID: "r9/1/c1", Attempt: 1, WorkerID: "w1"})
		_, err := w1.nc.RequestWithContext(ctx, n.Claim(), body)
		return err
	}))
	w1.allowed(t, "worker publishes a result", jsPublish(w1, n.Result("r9")))
	g1 := d.connect(t, "g1")
	g1.allowed(t, "gate subscribes to the gate subject", subscribe(g1, n.Gate()))
	b1 := d.connect(t, "b1")
	b1.allowed(t, "brain service subscribes to its tool", subscribe(b1, n.Brain("search")))
	b1.allowed(t, "brain service registers its tool", kvPut(b1, n.RegistryBucket(), protocol.RegistryKey("search")))
	d1 := d.connect(t, "d1")
	d1.allowed(t, "delegate service subscribes to delegations", subscribe(d1, n.Delegate("child")))
	aud := d.connect(t, "aud")
	readsTheLog := func(c *conn) op {
		return do(func(ctx context.Context) error {
			count := 0
			err := protocol.ReadOrdered(ctx, c.js, n.EventsStream(), protocol.ReadOptions{Subjects: []string{n.Events("r1")}},
				func(jetstream.Msg, *jetstream.MsgMetadata) error { count++; return nil })
			if err == nil && count == 0 {
				err = errors.New("no commits")
			}
			return err
		})
	}
	aud.allowed(t, "auditor reads the log", readsTheLog(aud))
	con := d.connect(t, "con")
	con.allowed(t, "console reads the log", readsTheLog(con))
	con.allowed(t, "console resumes as a principal it serves", jsPublish(con, n.ResumeAs("r2", "dave")))
	con.allowed(t, "console controls a run", jsPublish(con, n.Control("r-none")))
	adm.allowed(t, "admin reads the inbox stream", do(func(ctx context.Context) error {
		_, err := adm.js.Stream(ctx, n.InboxStream())
		return err
	}))

	// A sandbox call is granted only to a worker of its pool: w2 (pool
	// gpu) is refused the claim of a default-pool call, w1 gets it with
	// the job. Its result, reported by w2 with w1's token and an offer to
	// take the next call, is recorded, but the next call (default pool)
	// is not granted to w2: it is dispatched, and w1's claim and result
	// complete it.
	if err := cl.Submit(ctx, submitOf("rs", "build", `{"target":"all"}`, "build", `{"target":"docs"}`)); err != nil {
		t.Fatal(err)
	}
	claim := func(c *conn, worker string, op string) protocol.ClaimReply {
		t.Helper()
		body, _ := events.Marshal(protocol.ClaimRequest{OperationID: op, Attempt: 1, WorkerID: worker})
		for {
			m, err := c.nc.RequestWithContext(ctx, n.Claim(), body)
			if err != nil {
				t.Fatalf("claim as %s: %v", worker, err)
			}
			var r protocol.ClaimReply
			if err := events.Unmarshal(m.Data, &r); err != nil {
				t.Fatal(err)
			}
			if r.Reason != "the batch is not open" && r.Reason != "aggregate: the call is not executing" && r.Reason != protocol.ReasonBusy {
				return r
			}
			select { // the call is not dispatched yet
			case <-ctx.Done():
				t.Fatalf("claim as %s: %+v", worker, r)
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	w2 := d.connect(t, "w2")
	if r := claim(w2, "w2", "rs/1/c1"); r.Granted || !strings.Contains(r.Reason, "not a worker of pool default") {
		t.Fatalf("a gpu worker claiming a default-pool call: %+v", r)
	}
	g := claim(w1, "w1", "rs/1/c1")
	if !g.Granted || g.Job == nil || string(g.Job.Arguments) != `{"target":"all"}` {
		t.Fatalf("the pool's worker claiming: %+v", g)
	}
	out := events.TextOutput("c1", "built")
	body, _ := events.Marshal(protocol.ResultRequest{Result: protocol.Result{OperationID: "rs/1/c1", Attempt: 1, ClaimToken: g.ClaimToken, Output: &out},
		WorkerID: "w2", NextPool: "default", NextTools: []string{"build"}})
	m, err := w2.nc.RequestWithContext(ctx, n.ResultRequest(), body)
	if err != nil {
		t.Fatal(err)
	}
	var rr protocol.ResultReply
	if err := events.Unmarshal(m.Data, &rr); err != nil || !rr.Recorded || rr.Next != nil {
		t.Fatalf("a gpu worker's result offering to take a default-pool call: %+v %v", rr, err)
	}
	g2 := claim(w1, "w1", "rs/1/c2")
	if !g2.Granted {
		t.Fatalf("the pool's worker claiming the next call: %+v", g2)
	}
	out2 := events.TextOutput("c2", "built docs")
	body, _ = events.Marshal(protocol.Result{OperationID: "rs/1/c2", Attempt: 1, ClaimToken: g2.ClaimToken, Output: &out2})
	if _, err := w1.js.Publish(ctx, n.Result("rs"), body); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.WaitResults(ctx, "rs", "rs/1"); err != nil {
		t.Fatal(err)
	}

	// Let the engine settle what the allowed operations asked (the result
	// of nobody's call is terminated), then take the snapshot.
	waitQuiet(t, ctx, d, adm)
	// The engine's role may trim what the engine acknowledged.
	inbox, err := adm.js.Stream(ctx, n.InboxStream())
	if err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, ctx, "the engine trims the inbox", func() bool {
		info, err := inbox.Info(ctx)
		return err == nil && info.State.Msgs == 0
	})
	before := d.snapshot(t, adm)

	// Writes that permissions cannot stop, which must change nothing: a
	// request naming a stream's subject as its reply (the engine answers
	// on inboxes only), and a worker's advertisement carrying a rollup
	// header (the workers bucket takes none). A request after the first
	// on the same subject is answered after it.
	if err := w1.nc.PublishRequest(n.Claim(), n.Events("r1"), []byte("junk")); err != nil {
		t.Fatal(err)
	}
	if _, err := w1.nc.RequestWithContext(ctx, n.Claim(), []byte("junk")); err != nil {
		t.Fatalf("the engine answers an inbox: %v", err)
	}
	rollup := nats.NewMsg(n.KVSubject(protocol.BucketWorkers, protocol.WorkerKey("default", "build", "w1")))
	rollup.Data = []byte("replay_safe")
	rollup.Header.Set("Nats-Rollup", "all")
	if _, err := w1.js.PublishMsg(ctx, rollup); err == nil {
		t.Fatal("a rollup on the workers bucket was stored")
	}

	w2key := d.keys["w2"]
	type row struct {
		user, what string
		op         func(c *conn) op
	}
	destructive := []row{}
	for _, u := range []string{"eng", "w1", "c1", "alice", "g1", "b1", "aud", "con", "adm"} {
		destructive = append(destructive,
			row{u, "delete the events stream", func(c *conn) op {
				return do(func(ctx context.Context) error { return c.js.DeleteStream(ctx, n.EventsStream()) })
			}},
			row{u, "purge the out stream", func(c *conn) op {
				return do(func(ctx context.Context) error {
					_, err := c.nc.RequestWithContext(ctx, "$JS.API.STREAM.PURGE."+n.OutStream(), nil)
					return err
				})
			}},
			row{u, "delete the state bucket", func(c *conn) op {
				return do(func(ctx context.Context) error { return c.js.DeleteKeyValue(ctx, n.StateBucket()) })
			}},
			row{u, "delete a message of the inbox", func(c *conn) op {
				return do(func(ctx context.Context) error {
					_, err := c.nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.DELETE."+n.InboxStream(), []byte(`{"seq":1}`))
					return err
				})
			}},
		)
	}
	rows := append(destructive, []row{
		// workers
		{"w1", "publish a commit on a run's events subject", func(c *conn) op { return jsPublish(c, n.Events("r1")) }},
		{"w1", "publish a dispatch job", func(c *conn) op { return jsPublish(c, n.Dispatch("default", "build")) }},
		{"w1", "bind to another pool's consumer", func(c *conn) op {
			return do(func(ctx context.Context) error {
				_, err := c.js.Consumer(ctx, n.DispatchStream(), protocol.PoolConsumer("gpu", "render"))
				return err
			})
		}},
		{"w1", "create a consumer on the dispatch stream", func(c *conn) op {
			return do(func(ctx context.Context) error {
				_, err := c.js.CreateConsumer(ctx, n.DispatchStream(), jetstream.ConsumerConfig{Durable: "mine", FilterSubject: n.Dispatch("default", "build"), AckPolicy: jetstream.AckExplicitPolicy})
				return err
			})
		}},
		{"w1", "advertise another pool's tool", func(c *conn) op {
			return kvPut(c, n.WorkersBucket(), protocol.WorkerKey("gpu", "render", "w1"))
		}},
		{"w1", "advertise under another worker's name", func(c *conn) op {
			return kvPut(c, n.WorkersBucket(), protocol.WorkerKey("default", "build", "w2"))
		}},
		{"w1", "write the state bucket", func(c *conn) op { return kvPut(c, n.StateBucket(), "shared.budget") }},
		{"w1", "subscribe to every subject", func(c *conn) op { return subscribe(c, ">") }},
		{"w1", "subscribe to the shared inbox prefix", func(c *conn) op { return subscribe(c, "_INBOX.>") }},
		{"w1", "subscribe to another worker's inbox", func(c *conn) op { return subscribe(c, access.InboxPrefix(w2key)+".>") }},
		{"w1", "subscribe to the claim subject (answer claims)", func(c *conn) op { return subscribe(c, n.Claim()) }},
		{"w1", "subscribe to the result subject (answer results, grant next calls)", func(c *conn) op { return subscribe(c, n.ResultRequest()) }},
		{"c1", "report a worker's result on api.result", func(c *conn) op { return publish(c, n.ResultRequest()) }},
		{"w1", "publish a claim grant to another worker's inbox", func(c *conn) op { return publish(c, access.InboxPrefix(w2key)+".x.y") }},
		{"w1", "publish to an engine's forward subject", func(c *conn) op { return publish(c, n.Forward("e1")) }},
		{"w1", "answer an engine's liveness probes (keep a dead engine alive)", func(c *conn) op { return subscribe(c, n.Ping("e1")) }},
		{"w1", "write an engine's presence", func(c *conn) op { return kvPut(c, n.OwnersBucket(), protocol.PresenceKey("e1")) }},
		{"w1", "submit a batch", func(c *conn) op { return jsPublish(c, n.Submit("r3")) }},
		// clients
		{"c1", "publish a commit on a run's events subject", func(c *conn) op { return jsPublish(c, n.Events("r1")) }},
		{"c1", "submit unattributed", func(c *conn) op { return jsPublish(c, n.Submit("r8")) }},
		{"c1", "submit as another client", func(c *conn) op { return jsPublish(c, n.SubmitAs("r8", d.keys["c2"])) }},
		{"c1", "resume unattributed (not allowed for this client)", func(c *conn) op { return jsPublish(c, n.Resume("r2")) }},
		{"c1", "resume as a principal", func(c *conn) op { return jsPublish(c, n.ResumeAs("r2", "alice")) }},
		{"c1", "publish a result", func(c *conn) op { return jsPublish(c, n.Result("r1")) }},
		{"c1", "read the events stream", func(c *conn) op {
			return do(func(ctx context.Context) error {
				_, err := c.js.OrderedConsumer(ctx, n.EventsStream(), jetstream.OrderedConsumerConfig{})
				return err
			})
		}},
		{"c1", "read other clients' submits in the inbox", func(c *conn) op {
			return do(func(ctx context.Context) error {
				_, err := c.js.OrderedConsumer(ctx, n.InboxStream(), jetstream.OrderedConsumerConfig{})
				return err
			})
		}},
		{"c1", "store a catalog", func(c *conn) op { return kvPut(c, n.CatalogBucket(), "cat-0000000000000000") }},
		{"c1", "write the state bucket", func(c *conn) op { return kvPut(c, n.StateBucket(), "shared.budget") }},
		{"c1", "subscribe to the shared inbox prefix", func(c *conn) op { return subscribe(c, "_INBOX.>") }},
		{"c1", "subscribe to submits", func(c *conn) op { return subscribe(c, n.Submit("*")) }},
		{"c1", "publish to an engine's forward subject", func(c *conn) op { return publish(c, n.Forward("e1")) }},
		{"c1", "answer an engine's liveness probes (keep a dead engine alive)", func(c *conn) op { return subscribe(c, n.Ping("e1")) }},
		{"c1", "delete an engine's presence (declare it dead)", func(c *conn) op { return kvPut(c, n.OwnersBucket(), protocol.PresenceKey("e1")) }},
		{"c1", "ask a brain tool directly", func(c *conn) op { return request(c, n.Brain("search")) }},
		// approvers
		{"alice", "resume as another principal", func(c *conn) op { return jsPublish(c, n.ResumeAs("r2", "bob")) }},
		{"alice", "resume unattributed", func(c *conn) op { return jsPublish(c, n.Resume("r2")) }},
		{"alice", "submit a batch", func(c *conn) op { return jsPublish(c, n.Submit("r4")) }},
		{"alice", "subscribe to the shared inbox prefix", func(c *conn) op { return subscribe(c, "_INBOX.>") }},
		// services
		{"g1", "publish a commit", func(c *conn) op { return jsPublish(c, n.Events("r1")) }},
		{"g1", "subscribe to a brain tool", func(c *conn) op { return subscribe(c, n.Brain("search")) }},
		{"g1", "publish to the gate subject", func(c *conn) op { return publish(c, n.Gate()) }},
		{"b1", "subscribe to another brain tool", func(c *conn) op { return subscribe(c, n.Brain("other")) }},
		{"b1", "register another tool's capability", func(c *conn) op {
			return kvPut(c, n.RegistryBucket(), protocol.RegistryKey("other"))
		}},
		{"b1", "submit a batch", func(c *conn) op { return jsPublish(c, n.Submit("r5")) }},
		{"d1", "subscribe to the gate subject", func(c *conn) op { return subscribe(c, n.Gate()) }},
		{"d1", "submit a batch", func(c *conn) op { return jsPublish(c, n.Submit("r6")) }},
		// auditor
		{"aud", "submit a batch", func(c *conn) op { return jsPublish(c, n.Submit("r7")) }},
		{"aud", "read the inbox", func(c *conn) op {
			return do(func(ctx context.Context) error {
				_, err := c.js.OrderedConsumer(ctx, n.InboxStream(), jetstream.OrderedConsumerConfig{})
				return err
			})
		}},
		{"aud", "delete the projector's consumer", func(c *conn) op {
			return do(func(ctx context.Context) error {
				return c.js.DeleteConsumer(ctx, n.EventsStream(), protocol.ConsumerProjector)
			})
		}},
		{"aud", "replace the projector's consumer", func(c *conn) op {
			return do(func(ctx context.Context) error {
				_, err := c.js.CreateOrUpdateConsumer(ctx, n.EventsStream(), jetstream.ConsumerConfig{Durable: protocol.ConsumerProjector, FilterSubject: n.Events("r1")})
				return err
			})
		}},
		{"aud", "write the state bucket", func(c *conn) op { return kvPut(c, n.StateBucket(), "shared.budget") }},
		// console
		{"con", "resume as a principal it does not serve", func(c *conn) op { return jsPublish(c, n.ResumeAs("r2", "alice")) }},
		{"con", "resume unattributed", func(c *conn) op { return jsPublish(c, n.Resume("r2")) }},
		{"con", "submit a batch", func(c *conn) op { return jsPublish(c, n.Submit("r8")) }},
		{"con", "publish a commit", func(c *conn) op { return jsPublish(c, n.Events("r1")) }},
		{"con", "delete the projector's consumer", func(c *conn) op {
			return do(func(ctx context.Context) error {
				return c.js.DeleteConsumer(ctx, n.EventsStream(), protocol.ConsumerProjector)
			})
		}},
	}...)
	// Every forbidden operation at once, each on its own connection (a
	// refused request waits for its timeout), then the verdicts.
	type outcome struct{ opErr, serverErr error }
	outcomes := make([]outcome, len(rows))
	ops := make([]op, len(rows))
	var wg sync.WaitGroup
	for i, r := range rows {
		c := d.connect(t, r.user)
		ops[i] = r.op(c)
		wg.Add(1)
		go func() {
			defer wg.Done()
			outcomes[i].opErr, outcomes[i].serverErr = c.attempt(ops[i])
		}()
	}
	wg.Wait()
	for i, r := range rows {
		t.Run("refused/"+r.user+": "+r.what, func(t *testing.T) {
			checkRefused(t, ops[i], outcomes[i].opErr, outcomes[i].serverErr)
		})
	}
	// NATS does not check a push consumer's deliver subject against its
	// creator's permissions: a client may create one on the out stream
	// delivering to a run's events subject. It delivers only where
	// someone subscribes, and no role but admin may subscribe there (the
	// engine does not), so nothing is delivered and nothing is stored
	// (docs/security.md).
	push := d.connect(t, "c1")
	pc, err := push.js.CreateConsumer(ctx, n.OutStream(), jetstream.ConsumerConfig{DeliverSubject: n.Events("r1"), AckPolicy: jetstream.AckNonePolicy})
	if err != nil {
		t.Fatalf("push consumer: %v", err)
	}
	info, err := pc.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.PushBound || info.Delivered.Consumer != 0 || info.NumPending == 0 {
		t.Fatalf("a push consumer into the events subjects is bound or delivering: %+v", info)
	}
	after := d.snapshot(t, adm)
	for s, seq := range before {
		if after[s] != seq {
			t.Errorf("stream %s: last sequence %d before the refused operations, %d after", s, seq, after[s])
		}
	}
}

// submitOf is a batch of calls c1, c2, ... of (tool, arguments) pairs.
func submitOf(runID string, calls ...string) *protocol.Submit {
	s := &protocol.Submit{RunID: runID, ThreadID: "t", Step: 1, Assistant: events.Message{ID: "m", Content: []events.ContentBlock{events.TextBlock("calling")}}}
	for i := 0; i+1 < len(calls); i += 2 {
		in, err := events.CanonicalJSON([]byte(calls[i+1]))
		if err != nil {
			panic(err)
		}
		s.Assistant.Content = append(s.Assistant.Content, events.ContentBlock{Type: events.BlockToolUse, ID: fmt.Sprintf("c%d", i/2+1), Name: calls[i], Input: in})
	}
	return s
}

// awaiting waits for the run's ticket.
func awaiting(t *testing.T, ctx context.Context, cl *client.Client, runID string) protocol.AwaitingOut {
	t.Helper()
	w, err := cl.Watch(ctx, runID)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for {
		m, err := w.Next(ctx)
		if err != nil {
			t.Fatalf("waiting for run %s's ticket: %v", runID, err)
		}
		if m.Awaiting != nil {
			return *m.Awaiting
		}
	}
}

// waitQuiet waits until the engine has taken every inbox message.
func waitQuiet(t *testing.T, ctx context.Context, d *deployment, adm *conn) {
	t.Helper()
	cons, err := adm.js.Consumer(ctx, d.names.InboxStream(), protocol.ConsumerEngine)
	if err != nil {
		t.Fatal(err)
	}
	for {
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.NumPending == 0 && info.NumAckPending == 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the engine did not take every inbox message: %+v", info)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestReloadRevokes: after a user is removed from the auth file and the
// server reloads it, the user's open connection is closed and it cannot
// connect again; a user added meanwhile can.
func TestReloadRevokes(t *testing.T) {
	d := deploy(t, embeddedServer)
	c2 := d.connect(t, "c2")
	closed := make(chan struct{})
	c2.nc.SetClosedHandler(func(*nats.Conn) { close(closed) })

	f, err := access.LoadFile(d.auth)
	if err != nil {
		t.Fatal(err)
	}
	if !f.Remove("c2") {
		t.Fatal("no c2")
	}
	added, seed, err := access.NewUser("c3", access.RoleClient)
	if err != nil {
		t.Fatal(err)
	}
	f.Users = append(f.Users, added)
	d.creds["c3"] = filepath.Join(t.TempDir(), "c3.creds")
	if err := access.WriteCreds(d.creds["c3"], seed); err != nil {
		t.Fatal(err)
	}
	if err := f.Save(d.auth); err != nil {
		t.Fatal(err)
	}
	if err := d.srv.Reload(); err != nil {
		t.Fatal(err)
	}
	d.connect(t, "c3") // the new user gets in
	// The revoked user's connection is dropped, and every reconnect is
	// refused, so it ends closed.
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatalf("the revoked user's connection is still %v", c2.nc.Status())
	}
	opts, err := access.Conn{Creds: d.creds["c2"]}.Options()
	if err != nil {
		t.Fatal(err)
	}
	if nc, err := nats.Connect(d.url, opts...); err == nil {
		nc.Close()
		t.Fatal("a revoked user connected")
	}
}
