package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/internal/testproc"
)

// clusterSize is the number of nats-servers of a cluster schedule.
const clusterSize = 3

// Timing of the cluster's checks.
const (
	// healTimeout bounds the wait for a cluster to be healthy again after a
	// fault: a cluster that does not heal in this time fails the schedule.
	healTimeout = 2 * time.Minute
	// probeTimeout bounds one request to a server (monitoring endpoint,
	// stream info): a stopped server answers none.
	probeTimeout = time.Second
	// pollEvery is how often a condition on the cluster is polled.
	pollEvery = 100 * time.Millisecond
)

// The engines' timing on a cluster. docs/operations.md asks for an ack
// wait above the longest pause an engine may have, and a server fault
// pauses it: an election takes up to 9 s (nats-server's election timeout
// is 4-9 s), and a client finds a stopped server out in about 3 s before
// it moves to another. The one-server mode's 1 s ack wait and lease, and
// its 3 s dispatch deadline (3 or 4 attempts: 9-12 s, less than a stop
// plus an election), would turn server faults into lost leases,
// taken-over runs and unavailable_before_dispatch by construction: a
// finding of the driver's settings rather than of the engine. The cluster
// mode's dispatch deadline is the catalog's default.
const (
	clusterAckWait       = "15s"
	clusterLease         = "15s"
	clusterDispatchLimit = "30s"
)

// errNotHealthy is the cause of a health wait that ran out of time.
var errNotHealthy = errors.New("chaos: the nats cluster is not healthy in time")

// natsNode is one server of a cluster: its process (named by its
// server_name, as the cluster names its leaders) and its addresses.
type natsNode struct {
	*proc
	url     string // client URL
	monitor string // base URL of its monitoring endpoint
}

// clusterConf is a server's config file: its own store directory, a
// route to every server of the cluster, JetStream, and the monitoring
// endpoint.
func clusterConf(name string, port, clusterPort, httpPort int, store string, routes []string) string {
	quoted := make([]string, len(routes))
	for i, r := range routes {
		quoted[i] = fmt.Sprintf("%q", r)
	}
	return fmt.Sprintf(`# the chaos driver's cluster node %s
server_name: %s
host: 127.0.0.1
port: %d
http: "127.0.0.1:%d"
jetstream {
  store_dir: %q
}
cluster {
  name: toolbatch-chaos
  listen: "127.0.0.1:%d"
  routes: [%s]
}
`, name, name, port, httpPort, store, clusterPort, strings.Join(quoted, ", "))
}

// newNATSNodes writes the configs of a 3-node cluster into dir (store
// directories under dir/store) and returns its servers, not started.
func newNATSNodes(bin, dir string, logPath func(string) string) ([]*natsNode, error) {
	ports := make([][3]int, clusterSize) // client, cluster, http
	for i := range ports {
		for j := range ports[i] {
			p, err := testproc.Port()
			if err != nil {
				return nil, err
			}
			ports[i][j] = p
		}
	}
	var routes []string
	for _, p := range ports {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", p[1]))
	}
	var nodes []*natsNode
	for i, p := range ports {
		name := fmt.Sprintf("n%d", i+1)
		store := filepath.Join(dir, "store", name)
		if err := os.MkdirAll(store, 0o755); err != nil {
			return nil, err
		}
		conf := filepath.Join(dir, name+".conf")
		if err := os.WriteFile(conf, []byte(clusterConf(name, p[0], p[1], p[2], store, routes)), 0o644); err != nil {
			return nil, err
		}
		pr, err := newProc(name, KindNATS, logPath("nats-"+name), bin, readyNATS, "-c", conf)
		if err != nil {
			return nil, err
		}
		nodes = append(nodes, &natsNode{proc: pr, url: fmt.Sprintf("nats://127.0.0.1:%d", p[0]),
			monitor: fmt.Sprintf("http://127.0.0.1:%d", p[2])})
	}
	return nodes, nil
}

// observe connects the driver's observer (leaders, stream infos) to the
// cluster. Its pings are short, so that a connection to a stopped server
// moves to another within seconds.
func (c *cluster) observe() error {
	nc, err := nats.Connect(c.url, append(fastFailover(), nats.Name("toolbatch-chaos-observer"))...)
	if err != nil {
		return err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return err
	}
	c.obs, c.obsJS = nc, js
	return nil
}

// fastFailover is the connection options of the driver's own clients on a
// cluster: reconnect for ever, and find a stopped server out in about two
// seconds (the default ping interval is two minutes; a client on a stopped
// server would wait for it).
func fastFailover() []nats.Option {
	return []nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(100 * time.Millisecond), nats.RetryOnFailedConnect(true),
		nats.PingInterval(time.Second), nats.MaxPingsOutstanding(2)}
}

// probe GETs a monitoring path of a server: its status code and body.
func (n *natsNode) probe(ctx context.Context, path string) (int, []byte, error) {
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(pctx, http.MethodGet, n.monitor+path, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, body, err
}

// healthy reports whether the server answers its full health check:
// JetStream enabled, the meta group with a leader and current, and every
// stream and consumer it holds current. why says what it answered
// otherwise.
func (n *natsNode) healthy(ctx context.Context) (ok bool, why string) {
	code, body, err := n.probe(ctx, "/healthz")
	switch {
	case err != nil:
		return false, err.Error()
	case code != http.StatusOK:
		return false, fmt.Sprintf("%d %s", code, strings.TrimSpace(string(body)))
	}
	return true, ""
}

// metaLeader is the meta group's leader as the server's /jsz sees it ("":
// none, or no answer).
func (n *natsNode) metaLeader(ctx context.Context) string {
	code, body, err := n.probe(ctx, "/jsz")
	if err != nil || code != http.StatusOK {
		return ""
	}
	var jsz struct {
		Meta *struct {
			Leader string `json:"leader"`
		} `json:"meta_cluster"`
	}
	if json.Unmarshal(body, &jsz) != nil || jsz.Meta == nil {
		return ""
	}
	return jsz.Meta.Leader
}

// node returns the server of that name, or nil.
func (c *cluster) node(name string) *natsNode {
	for _, n := range c.nodes {
		if n.name == name {
			return n
		}
	}
	return nil
}

// streamLeader returns the events stream's leader ("" when the stream has
// none now), and whether the stream exists.
func (c *cluster) streamLeader(ctx context.Context) (leader string, exists bool, err error) {
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	s, err := c.obsJS.Stream(pctx, eventsStream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return "", false, nil
	}
	if err != nil {
		return "", true, err
	}
	info := s.CachedInfo()
	if info.Cluster == nil {
		return "", true, nil
	}
	return info.Cluster.Leader, true, nil
}

// waitStreamLeader waits until the events stream has a leader, and
// returns it.
func (c *cluster) waitStreamLeader(ctx context.Context) (string, error) {
	var last error
	for {
		leader, _, err := c.streamLeader(ctx)
		if leader != "" && c.node(leader) != nil {
			return leader, nil
		}
		if err != nil {
			last = err
		}
		if !sleepCtx(ctx, pollEvery) {
			return "", fmt.Errorf("no leader of stream %s: %w (last error: %v)", eventsStream, context.Cause(ctx), last)
		}
	}
}

// waitMetaLeader waits until a majority of the servers name the same meta
// leader in /jsz, and returns it.
func (c *cluster) waitMetaLeader(ctx context.Context) (string, error) {
	for {
		votes := map[string]int{}
		for _, n := range c.nodes {
			if l := n.metaLeader(ctx); l != "" {
				votes[l]++
			}
		}
		for l, v := range votes {
			if v > clusterSize/2 && c.node(l) != nil {
				return l, nil
			}
		}
		if !sleepCtx(ctx, pollEvery) {
			return "", fmt.Errorf("no meta leader named by a majority of /jsz: %w (last votes %v)", context.Cause(ctx), votes)
		}
	}
}

// waitHealthy waits until every server of the cluster passes its full
// health check (/healthz) and, once the engine made its streams, the events
// stream has a leader.
func (c *cluster) waitHealthy(ctx context.Context) error {
	for {
		var why []string
		for _, n := range c.nodes {
			if ok, w := n.healthy(ctx); !ok {
				why = append(why, n.name+": "+w)
			}
		}
		if len(why) == 0 {
			leader, exists, err := c.streamLeader(ctx)
			switch {
			case err != nil:
				why = append(why, fmt.Sprintf("stream %s: %v", eventsStream, err))
			case exists && leader == "":
				why = append(why, fmt.Sprintf("stream %s: no leader", eventsStream))
			default:
				return nil
			}
		}
		if !sleepCtx(ctx, pollEvery) {
			return fmt.Errorf("%w (%s)", context.Cause(ctx), strings.Join(why, "; "))
		}
	}
}

// waitCommits waits until each run has a commit in the events stream at
// or after since, or done is closed, or ctx is done; it returns the runs
// that had none.
func (c *cluster) waitCommits(ctx context.Context, runs []string, since time.Time, done <-chan struct{}) []string {
	left := append([]string(nil), runs...)
	for len(left) > 0 {
		var still []string
		for _, run := range left {
			if !c.committedSince(ctx, run, since) {
				still = append(still, run)
			}
		}
		left = still
		if len(left) == 0 || closed(done) || !sleepCtx(ctx, pollEvery) {
			break
		}
	}
	return left
}

// committedSince reports whether the run's last commit in the events
// stream is at or after since (false when it cannot be read now).
func (c *cluster) committedSince(ctx context.Context, run string, since time.Time) bool {
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	s, err := c.obsJS.Stream(pctx, eventsStream)
	if err != nil {
		return false
	}
	m, err := s.GetLastMsgForSubject(pctx, names.Events(run))
	return err == nil && !m.Time.Before(since)
}
