package testnats

import (
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/internal/testproc"
)

// Start starts an embedded nats-server on a free port of 127.0.0.1 with
// JetStream storing in dir, and returns its client URL. The server stops
// after everything the test registers later with t.Cleanup (engines and
// connections, say).
func Start(t testing.TB, dir string) (url string) {
	t.Helper()
	return serve(t, &server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
}

// serve starts a server, stopped at the test's cleanup, and returns its
// client URL once it accepts connections.
func serve(t testing.TB, opts *server.Options) string {
	t.Helper()
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("new server: %v", err)
	}
	go srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	return srv.ClientURL()
}

// Connect connects to url; the connection is closed at the test's cleanup.
func Connect(t testing.TB, url string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// JetStream returns the JetStream context of nc.
func JetStream(t testing.TB, nc *nats.Conn) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	return js
}

// StartCluster starts n embedded nats-servers clustered on loopback, each
// with JetStream storing under dir, and returns their client URLs joined
// by commas (a URL list NATS clients take). It returns once every server
// accepts connections, not once the cluster has formed or elected its
// JetStream leader: what a client meets right after a cluster's start.
func StartCluster(t testing.TB, dir string, n int) string {
	t.Helper()
	ports := make([]int, n)
	for i := range ports {
		p, err := testproc.Port()
		if err != nil {
			t.Fatal(err)
		}
		ports[i] = p
	}
	var routes []*url.URL
	for _, p := range ports {
		routes = append(routes, &url.URL{Scheme: "nats", Host: fmt.Sprintf("127.0.0.1:%d", p)})
	}
	var urls []string
	for i := range n {
		opts := &server.Options{ServerName: fmt.Sprintf("s%d", i+1), Host: "127.0.0.1", Port: -1, JetStream: true,
			StoreDir: filepath.Join(dir, fmt.Sprintf("s%d", i+1)), NoLog: true, NoSigs: true,
			Cluster: server.ClusterOpts{Name: "test", Host: "127.0.0.1", Port: ports[i]}, Routes: routes}
		urls = append(urls, serve(t, opts))
	}
	return strings.Join(urls, ",")
}
