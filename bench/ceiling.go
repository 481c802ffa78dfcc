package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/client"
	"github.com/toolbatch/toolbatch/engine"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/protocol"
)

// The ceiling: what this machine's JetStream does with the primitives the
// engine uses, measured in a process that embeds a fresh server exactly
// as cmd/engine does (same options, same sync mode, same disk), over
// in-process connections from that process to its own server, as the
// engine connects to its embedded server.

// Ceiling is the raw JetStream figures of one durability mode.
type Ceiling struct {
	// PayloadBytes is the body size used for commits: the average body
	// of the engine's own commits in W1.
	PayloadBytes int `json:"commit_payload_bytes"`
	// ExpectPub is async publishing with a per-subject expected last
	// sequence and a message id, as the engine's commits: one chain per
	// subject (the next publish needs the previous ack's sequence).
	ExpectPub []ChainRate `json:"expect_seq_publish"`
	// ExpectPubBest is the best of ExpectPub: the commit ceiling.
	ExpectPubBest Num `json:"expect_seq_publish_msgs_per_s"`
	// PlainAsyncPub is pipelined async publishing with no expectation and
	// no message id (4000 in flight): the server's raw append rate.
	PlainAsyncPub Num `json:"plain_async_publish_msgs_per_s"`
	// WorkQueue is fetching and acknowledging a work-queue stream, until
	// the stream is empty.
	WorkQueue Num `json:"workqueue_fetch_ack_msgs_per_s"`
	// PubToConsume is the latency from publishing a message to its
	// delivery to a pull consumer on another connection.
	PubToConsumeP50 Num `json:"publish_to_consume_p50_ms"`
	PubToConsumeP99 Num `json:"publish_to_consume_p99_ms"`
	// SyncPubP50 is one awaited publish (with expected sequence and
	// message id): the latency of one commit.
	SyncPubP50 Num `json:"awaited_publish_p50_ms"`
	// RequestP50 is one core NATS request/reply round trip.
	RequestP50 Num `json:"request_reply_p50_ms"`
	// Remote are the same latencies measured from another process (as
	// sandbox workers and clients talk to the server).
	Remote *RemoteLatency `json:"from_another_process,omitempty"`
}

// RemoteLatency are latencies measured from another process than the
// server's.
type RemoteLatency struct {
	PubToConsumeP50 Num `json:"publish_to_consume_p50_ms"`
	PubToConsumeP99 Num `json:"publish_to_consume_p99_ms"`
	SyncPubP50      Num `json:"awaited_publish_p50_ms"`
	RequestP50      Num `json:"request_reply_p50_ms"`
}

// ChainRate is the expected-sequence publish rate with a number of chains.
type ChainRate struct {
	Chains     int `json:"chains"`
	MsgsPerSec Num `json:"msgs_per_s"`
}

// eventsLike creates a stream with the events stream's configuration.
func eventsLike(ctx context.Context, js jetstream.JetStream, name, subject string, wq bool) (jetstream.Stream, error) {
	cfg := jetstream.StreamConfig{Name: name, Subjects: []string{subject}, Retention: jetstream.LimitsPolicy,
		Storage: jetstream.FileStorage, DenyDelete: true, DenyPurge: true}
	if wq {
		cfg.Retention, cfg.DenyDelete, cfg.DenyPurge = jetstream.WorkQueuePolicy, false, false
	}
	_ = js.DeleteStream(ctx, name)
	return js.CreateStream(ctx, cfg)
}

// endpoint is where a connection goes: a URL, or a server of this process,
// reached in process as cmd/engine reaches its embedded server.
type endpoint struct {
	url string
	srv *server.Server
}

func connect(url, name string) (*nats.Conn, jetstream.JetStream, error) {
	return connectTo(endpoint{url: url}, name)
}

func connectTo(to endpoint, name string) (*nats.Conn, jetstream.JetStream, error) {
	opts := []nats.Option{nats.Name(name), nats.MaxReconnects(-1)}
	url := to.url
	if to.srv != nil {
		url = "in-process"
		opts = append(opts, nats.InProcessServer(to.srv))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// commitMsg is a message shaped like one of the engine's commits.
func commitMsg(subject string, body []byte, prev uint64) *nats.Msg {
	m := nats.NewMsg(subject)
	m.Data = body
	m.Header.Add(protocol.HeaderEvent, "CallCompleted")
	m.Header.Set(protocol.HeaderPrev, strconv.FormatUint(prev, 10))
	return m
}

// expectChains publishes for dur on `chains` subjects at once, each
// publish expecting the subject's last sequence (known from the previous
// ack), with a message id. It returns the acknowledged messages per second.
func expectChains(ctx context.Context, to endpoint, chains int, dur time.Duration, body []byte, rep int) (float64, error) {
	nc, js, err := connectTo(to, "toolbatch-bench-ceiling")
	if err != nil {
		return 0, err
	}
	defer nc.Close()
	name := fmt.Sprintf("BENCHCEIL_PUB_%d_%d", chains, rep)
	if _, err := eventsLike(ctx, js, name, "benchceil.pub.>", false); err != nil {
		return 0, err
	}
	defer js.DeleteStream(context.Background(), name)
	var count atomic.Int64
	var failed atomic.Pointer[error]
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(dur)
	for i := 0; i < chains; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			subject := fmt.Sprintf("benchceil.pub.r%d", i)
			var last uint64
			for time.Now().Before(end) {
				m := commitMsg(subject, body, last)
				f, err := js.PublishMsgAsync(m, jetstream.WithExpectLastSequencePerSubject(last),
					jetstream.WithMsgID(subject+"/"+strconv.FormatUint(last, 10)))
				if err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
				select {
				case ack := <-f.Ok():
					last = ack.Sequence
					count.Add(1)
				case err := <-f.Err():
					failed.CompareAndSwap(nil, &err)
					return
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	wg.Wait()
	if p := failed.Load(); p != nil {
		return 0, *p
	}
	return float64(count.Load()) / time.Since(start).Seconds(), nil
}

// plainAsync publishes pipelined for dur (at most 4096 unacknowledged), no
// expectation, no id, and returns the acknowledged messages per second.
func plainAsync(ctx context.Context, to endpoint, dur time.Duration, body []byte, rep int) (float64, error) {
	nc, js, err := connectTo(to, "toolbatch-bench-ceiling")
	if err != nil {
		return 0, err
	}
	defer nc.Close()
	name := fmt.Sprintf("BENCHCEIL_RAW_%d", rep)
	if _, err := eventsLike(ctx, js, name, "benchceil.raw.>", false); err != nil {
		return 0, err
	}
	defer js.DeleteStream(context.Background(), name)
	start := time.Now()
	n, err := publishAsync(js, "benchceil.raw.r", body, func(int) bool { return time.Since(start) < dur }, "plain async publish")
	if err != nil {
		return 0, err
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// publishAsync publishes body pipelined, to 64 subjects that start with
// subject, for as long as more holds for the number sent so far; it waits
// a minute at the most for the acks (what names the work in that error)
// and returns the number sent.
func publishAsync(js jetstream.JetStream, subject string, body []byte, more func(sent int) bool, what string) (int, error) {
	n := 0
	for ; more(n); n++ {
		m := nats.NewMsg(subject + strconv.Itoa(n%64))
		m.Data = body
		if _, err := js.PublishMsgAsync(m, jetstream.WithStallWait(30*time.Second)); err != nil {
			return 0, err
		}
	}
	select {
	case <-js.PublishAsyncComplete():
		return n, nil
	case <-time.After(time.Minute):
		return 0, errors.New(what + ": acks missing after a minute")
	}
}

// workQueue fills a work-queue stream with n messages, then consumes them
// as the engine's intake does (pull consumer, 256 at a time, explicit
// acks) and returns messages per second until the stream is empty.
func workQueue(ctx context.Context, to endpoint, n int, body []byte, rep int) (float64, error) {
	nc, js, err := connectTo(to, "toolbatch-bench-ceiling")
	if err != nil {
		return 0, err
	}
	defer nc.Close()
	name := fmt.Sprintf("BENCHCEIL_WQ_%d", rep)
	st, err := eventsLike(ctx, js, name, "benchceil.wq.>", true)
	if err != nil {
		return 0, err
	}
	defer js.DeleteStream(context.Background(), name)
	if _, err := publishAsync(js, "benchceil.wq.r", body, func(sent int) bool { return sent < n }, "work queue fill"); err != nil {
		return 0, err
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, name, jetstream.ConsumerConfig{Durable: "engine",
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxAckPending: 10000, MaxDeliver: -1})
	if err != nil {
		return 0, err
	}
	var got atomic.Int64
	done := make(chan struct{})
	start := time.Now()
	cc, err := cons.Consume(func(m jetstream.Msg) {
		_ = m.Ack()
		if got.Add(1) == int64(n) {
			close(done)
		}
	}, jetstream.PullMaxMessages(256))
	if err != nil {
		return 0, err
	}
	defer cc.Stop()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		return 0, errors.New("work queue: not every message delivered in 2 minutes")
	}
	for {
		info, err := st.Info(ctx)
		if err != nil {
			return 0, err
		}
		if info.State.Msgs == 0 {
			break
		}
		if time.Since(start) > 2*time.Minute {
			return 0, errors.New("work queue: acks not applied in 2 minutes")
		}
		time.Sleep(time.Millisecond)
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// latencies measures, n times each and one at a time: publish to delivery
// on another connection's pull consumer; one awaited publish with expected
// sequence and id; one core request/reply.
func latencies(ctx context.Context, to endpoint, n int, body []byte, rep int) (p2c []time.Duration, pub []time.Duration, req []time.Duration, err error) {
	nc, js, err := connectTo(to, "toolbatch-bench-ceiling")
	if err != nil {
		return nil, nil, nil, err
	}
	defer nc.Close()
	nc2, js2, err := connectTo(to, "toolbatch-bench-ceiling-consumer")
	if err != nil {
		return nil, nil, nil, err
	}
	defer nc2.Close()
	name := fmt.Sprintf("BENCHCEIL_LAT_%d", rep)
	if _, err := eventsLike(ctx, js, name, "benchceil.lat.>", false); err != nil {
		return nil, nil, nil, err
	}
	defer js.DeleteStream(context.Background(), name)
	cons, err := js2.OrderedConsumer(ctx, name, jetstream.OrderedConsumerConfig{FilterSubjects: []string{"benchceil.lat.p2c"}})
	if err != nil {
		return nil, nil, nil, err
	}
	it, err := cons.Messages()
	if err != nil {
		return nil, nil, nil, err
	}
	defer it.Stop()
	for i := 0; i < n; i++ {
		m := nats.NewMsg("benchceil.lat.p2c")
		m.Data = body
		start := time.Now()
		f, err := js.PublishMsgAsync(m, jetstream.WithStallWait(30*time.Second))
		if err != nil {
			return nil, nil, nil, err
		}
		if _, err := it.Next(); err != nil {
			return nil, nil, nil, err
		}
		p2c = append(p2c, time.Since(start))
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return nil, nil, nil, err
		}
	}
	var last uint64
	for i := 0; i < n; i++ {
		m := commitMsg("benchceil.lat.commit", body, last)
		start := time.Now()
		ack, err := js.PublishMsg(ctx, m, jetstream.WithExpectLastSequencePerSubject(last), jetstream.WithMsgID("c/"+strconv.FormatUint(last, 10)))
		if err != nil {
			return nil, nil, nil, err
		}
		pub = append(pub, time.Since(start))
		last = ack.Sequence
	}
	sub, err := nc2.Subscribe("benchceil.req", func(m *nats.Msg) { _ = m.Respond(m.Data) })
	if err != nil {
		return nil, nil, nil, err
	}
	defer sub.Unsubscribe()
	if err := nc2.Flush(); err != nil {
		return nil, nil, nil, err
	}
	for i := 0; i < n; i++ {
		start := time.Now()
		if _, err := nc.Request("benchceil.req", body[:min(len(body), 128)], 5*time.Second); err != nil {
			return nil, nil, nil, err
		}
		req = append(req, time.Since(start))
	}
	return p2c, pub, req, nil
}

// commitPayload returns the average body size of the engine's commits:
// the last 270 commits up to `to` (30 whole W1 batches of 9 commits, so
// that every kind of commit counts as often as it happens).
func commitPayload(ctx context.Context, js jetstream.JetStream, from, to uint64) int {
	st, err := js.Stream(ctx, "TOOLBATCH_EVENTS")
	if err != nil || to < from {
		return 400
	}
	from = max(from, to-min(to, 269))
	total, n := 0, 0
	for seq := from; seq <= to; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			continue
		}
		total += len(m.Data)
		n++
	}
	if n == 0 {
		return 400
	}
	return total / n
}

// runCeiling measures every primitive reps times and keeps the medians.
func runCeiling(ctx context.Context, to endpoint, payload int, reps int, dur time.Duration, chainCounts []int) (Ceiling, error) {
	c := Ceiling{PayloadBytes: payload}
	body := bytes.Repeat([]byte{'x'}, payload)
	best := 0.0
	for _, chains := range chainCounts {
		var v []float64
		for r := 0; r < reps; r++ {
			rate, err := expectChains(ctx, to, chains, dur, body, r)
			if err != nil {
				return c, fmt.Errorf("expected-sequence publish, %d chains: %w", chains, err)
			}
			v = append(v, rate)
		}
		m := median(v)
		c.ExpectPub = append(c.ExpectPub, ChainRate{Chains: chains, MsgsPerSec: Num(m)})
		best = max(best, m)
	}
	c.ExpectPubBest = Num(best)
	var raw, wq, p2c50, p2c99, pub50, req50 []float64
	for r := 0; r < reps; r++ {
		rate, err := plainAsync(ctx, to, dur, body, r)
		if err != nil {
			return c, fmt.Errorf("plain async publish: %w", err)
		}
		raw = append(raw, rate)
		// As many jobs as about two seconds of raw publishing fill.
		n := int(min(50000, max(2000, 2*rate)))
		if rate, err = workQueue(ctx, to, n, body[:min(len(body), 256)], r); err != nil {
			return c, fmt.Errorf("work queue: %w", err)
		}
		wq = append(wq, rate)
		p2c, pub, req, err := latencies(ctx, to, 1000, body, r)
		if err != nil {
			return c, fmt.Errorf("latencies: %w", err)
		}
		p2c50 = append(p2c50, percentile(p2c, 50))
		p2c99 = append(p2c99, percentile(p2c, 99))
		pub50 = append(pub50, percentile(pub, 50))
		req50 = append(req50, percentile(req, 50))
	}
	c.PlainAsyncPub, c.WorkQueue = Num(median(raw)), Num(median(wq))
	c.PubToConsumeP50, c.PubToConsumeP99 = Num(median(p2c50)), Num(median(p2c99))
	c.SyncPubP50, c.RequestP50 = Num(median(pub50)), Num(median(req50))
	return c, nil
}

// The hand-rolled minimum of W1: the same JetStream appends and round trips
// as one batch of 4 sandbox calls in the engine, with no engine logic (no
// decoding or folding, no gate, no owner keys, no capability lookups, no
// caches): a client submits on the inbox (the real client, so the same
// Submit and the same watch as W1), a minimal "engine" appends the 9 commits
// the engine makes, with expected sequences (the submission with the first
// call's gate decision and entry; per call its claim, and its completion
// with the next call's gate decision and entry, the last one with the
// barrier), publishes each call's dispatch, answers the claim after
// committing it, and records the result; a minimal "worker" takes the job
// from the dispatch stream, claims it by request/reply, publishes the
// result on the inbox and acks the job; a minimal "projector" consumes the
// events stream and publishes the 4 dispositions and the results of the
// final commit on the out stream. Per batch: 1 submit, 9 commits, 4
// dispatches, 4 claim round trips, 4 results, 5 out messages.

// HandRolled is the hand-rolled W1 minimum.
type HandRolled struct {
	P50ms         Num          `json:"p50_ms"`
	P99ms         Num          `json:"p99_ms"`
	BatchesPerSec Num          `json:"batches_per_s"`
	Commits       Num          `json:"commits_per_batch"`
	Reps          []LatencyRep `json:"reps"`
	// CPU per batch over the repetitions: the server's process (the
	// server, the minimal engine and projector) and this process (the
	// minimal worker and the client).
	ServerCPUms Num `json:"server_process_cpu_ms_per_batch"`
	BenchCPUms  Num `json:"worker_and_client_cpu_ms_per_batch"`
	// W2's shape against the same minimal pipeline: as many runs at once,
	// as many workers with the same concurrency (run here, not as
	// processes of their own). The commit rate is what the engine's W2
	// commit rate is compared with, at its best.
	W2 *HandRolledW2 `json:"w2,omitempty"`
}

// HandRolledW2 is the hand-rolled minimum under W2's load.
type HandRolledW2 struct {
	Runs          int `json:"runs"`
	Workers       int `json:"workers"`
	Concurrency   int `json:"worker_concurrency"`
	BatchesPerSec Num `json:"batches_per_s"`
	CommitsPerSec Num `json:"commits_per_s"`
	P50ms         Num `json:"p50_ms"`
}

const minPrefix = "benchmin"

// minNames are the minimum's stream and subject names.
var minNames = protocol.Names{Prefix: minPrefix}

type minRun struct {
	seq    uint64
	batch  string // <run>/<step>
	next   int    // calls gated so far
	submit jetstream.Msg
}

type minEngine struct {
	nc    *nats.Conn
	js    jetstream.JetStream
	body  []byte
	runs  map[string]*minRun
	inbox chan jetstream.Msg
	claim chan *nats.Msg
	err   atomic.Pointer[error]
}

const minCalls = 4

func (e *minEngine) fail(err error) { e.err.CompareAndSwap(nil, &err) }

func (e *minEngine) commit(ctx context.Context, runID string, r *minRun, types []string, final bool) error {
	m := nats.NewMsg(minNames.Events(runID))
	m.Data = e.body
	for _, t := range types {
		m.Header.Add(protocol.HeaderEvent, t)
	}
	m.Header.Set(protocol.HeaderPrev, strconv.FormatUint(r.seq, 10))
	if final {
		m.Header.Set("Bench-Final", r.batch)
	}
	ack, err := e.js.PublishMsg(ctx, m, jetstream.WithExpectLastSequencePerSubject(r.seq),
		jetstream.WithMsgID(runID+"/"+strconv.FormatUint(r.seq, 10)))
	if err != nil {
		return err
	}
	r.seq = ack.Sequence
	return nil
}

// gateAndDispatch commits what came before (the submission, or the
// previous call's completion) with the next call's gate decision and entry,
// as the engine does, and publishes its dispatch.
func (e *minEngine) gateAndDispatch(ctx context.Context, runID string, r *minRun, before string) error {
	r.next++
	if err := e.commit(ctx, runID, r, []string{before, "CallGated", "CallExecuting"}, false); err != nil {
		return err
	}
	op := fmt.Sprintf("%s/c%d", r.batch, r.next)
	d := nats.NewMsg(minNames.Dispatch("default", "noop"))
	d.Data = []byte(op)
	_, err := e.js.PublishMsg(ctx, d, jetstream.WithMsgID(op+"/1"))
	return err
}

func (e *minEngine) loop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case m := <-e.inbox:
			if err := e.onInbox(ctx, m); err != nil {
				e.fail(err)
				return
			}
		case m := <-e.claim:
			op := string(m.Data)
			runID, _, _ := strings.Cut(op, "/")
			r := e.runs[runID]
			if r == nil {
				e.fail(fmt.Errorf("claim of unknown run %s", op))
				return
			}
			if err := e.commit(ctx, runID, r, []string{"CallClaimed"}, false); err != nil {
				e.fail(err)
				return
			}
			_ = m.Respond([]byte("granted"))
		}
	}
}

func (e *minEngine) onInbox(ctx context.Context, m jetstream.Msg) error {
	kind, runID, _, _ := minNames.InboxKind(m.Subject())
	r := e.runs[runID]
	if r == nil {
		r = &minRun{}
		e.runs[runID] = r
	}
	switch kind {
	case protocol.KindSubmit:
		// The client's message id is <run_id>/<step>/<digest>.
		id := m.Headers().Get(jetstream.MsgIDHeader)
		parts := strings.Split(id, "/")
		if len(parts) != 3 {
			return fmt.Errorf("submit without a message id: %q", id)
		}
		r.batch, r.next, r.submit = parts[0]+"/"+parts[1], 0, m
		return e.gateAndDispatch(ctx, runID, r, "BatchSubmitted")
	case protocol.KindResult:
		if r.next < minCalls {
			if err := e.gateAndDispatch(ctx, runID, r, "CallCompleted"); err != nil {
				return err
			}
			return m.Ack()
		}
		if err := e.commit(ctx, runID, r, []string{"CallCompleted", "BatchFinalized"}, true); err != nil {
			return err
		}
		_ = m.Ack()
		return r.submit.Ack()
	}
	return fmt.Errorf("inbox subject %s", m.Subject())
}

// minWorker takes jobs from the dispatch stream and runs up to
// concurrency of them at once (each: claim, result, ack).
func minWorker(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, concurrency int, fail func(error)) (func(), error) {
	cons, err := js.CreateOrUpdateConsumer(ctx, minNames.DispatchStream(), jetstream.ConsumerConfig{
		Durable: protocol.PoolConsumer("default", "noop"), FilterSubject: minNames.Dispatch("default", "noop"),
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxDeliver: -1})
	if err != nil {
		return nil, err
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(max(4, concurrency)))
	if err != nil {
		return nil, err
	}
	job := func(m jetstream.Msg) error {
		op := string(m.Data())
		if _, err := nc.Request(minNames.Claim(), []byte(op), 5*time.Second); err != nil {
			return fmt.Errorf("claim: %w", err)
		}
		runID, _, _ := strings.Cut(op, "/")
		res := nats.NewMsg(minNames.Result(runID))
		res.Data = []byte(op)
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := js.PublishMsg(rctx, res, jetstream.WithMsgID("result/"+op))
		cancel()
		if err != nil {
			return fmt.Errorf("result: %w", err)
		}
		return m.Ack()
	}
	slots := make(chan struct{}, concurrency)
	go func() {
		for {
			m, err := it.Next()
			if err != nil {
				if !errors.Is(err, jetstream.ErrMsgIteratorClosed) {
					fail(err)
				}
				return
			}
			slots <- struct{}{}
			go func() {
				defer func() { <-slots }()
				if err := job(m); err != nil {
					fail(err)
				}
			}()
		}
	}()
	return it.Stop, nil
}

// minProjector publishes the dispositions and results of final commits.
func minProjector(ctx context.Context, js jetstream.JetStream, fail func(error)) (func(), error) {
	cons, err := js.CreateOrUpdateConsumer(ctx, minNames.EventsStream(), jetstream.ConsumerConfig{
		Durable: "projector", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second,
		MaxAckPending: 1024, MaxDeliver: -1, DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		return nil, err
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		batch := m.Headers().Get("Bench-Final")
		if batch == "" {
			_ = m.Ack()
			return
		}
		runID, step, _ := strings.Cut(batch, "/")
		stepN, _ := strconv.ParseInt(step, 10, 64)
		res := protocol.ResultsOut{BatchID: batch, Step: stepN}
		var futures []jetstream.PubAckFuture
		for i := 1; i <= minCalls; i++ {
			callID := "c" + strconv.Itoa(i)
			res.Results = append(res.Results, events.ContentBlock{Type: events.BlockToolResult, ToolUseID: callID})
			body, err := events.Marshal(protocol.DispositionOut{BatchID: batch, CallID: callID, ToolID: "noop",
				Disposition: events.DispositionExecuted, Phase: events.PhaseCompleted, Attempt: 1})
			if err != nil {
				fail(err)
				return
			}
			f, err := publishOut(js, runID, "disposition", body, batch, i)
			if err != nil {
				fail(err)
				return
			}
			futures = append(futures, f)
		}
		body, err := events.Marshal(res)
		if err != nil {
			fail(err)
			return
		}
		f, err := publishOut(js, runID, "results", body, batch, 0)
		if err != nil {
			fail(err)
			return
		}
		futures = append(futures, f)
		for _, f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				fail(err)
				return
			}
		}
		_ = m.Ack()
	}, jetstream.PullMaxMessages(256))
	if err != nil {
		return nil, err
	}
	return cc.Stop, nil
}

func publishOut(js jetstream.JetStream, runID, kind string, body []byte, batch string, i int) (jetstream.PubAckFuture, error) {
	m := nats.NewMsg(minNames.Out(runID, kind))
	m.Data = body
	id := fmt.Sprintf("%s/%d", batch, i)
	m.Header.Set(protocol.HeaderSource, id)
	return js.PublishMsgAsync(m, jetstream.WithMsgID("out/"+id))
}

// startMinimalEngine runs the minimal engine and projector on one
// connection to url, as the engine does. It returns a function that stops
// them and one that reports their first failure.
func startMinimalEngine(ctx context.Context, to endpoint, payload int) (stop func(), failed func() error, err error) {
	enc, ejs, err := connectTo(to, "toolbatch-bench-min-engine")
	if err != nil {
		return nil, nil, err
	}
	var stops []func()
	stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	stops = append(stops, enc.Close)
	defer func() {
		if err != nil {
			stop()
		}
	}()
	if err = engine.EnsureStreams(ctx, ejs, minNames, engine.StreamConfig{}); err != nil {
		return nil, nil, err
	}
	e := &minEngine{nc: enc, js: ejs, body: bytes.Repeat([]byte{'x'}, payload), runs: map[string]*minRun{},
		inbox: make(chan jetstream.Msg, 256), claim: make(chan *nats.Msg, 256)}
	runCtx, cancel := context.WithCancel(context.Background())
	stops = append(stops, cancel)
	intake, err := ejs.CreateOrUpdateConsumer(ctx, minNames.InboxStream(), jetstream.ConsumerConfig{
		Durable: "engine", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxAckPending: 10000, MaxDeliver: -1})
	if err != nil {
		return nil, nil, err
	}
	cc, err := intake.Consume(func(m jetstream.Msg) { e.inbox <- m }, jetstream.PullMaxMessages(256))
	if err != nil {
		return nil, nil, err
	}
	stops = append(stops, cc.Stop)
	sub, err := enc.Subscribe(minNames.Claim(), func(m *nats.Msg) { e.claim <- m })
	if err != nil {
		return nil, nil, err
	}
	stops = append(stops, func() { _ = sub.Unsubscribe() })
	go e.loop(runCtx)
	stopProj, err := minProjector(runCtx, ejs, e.fail)
	if err != nil {
		return nil, nil, err
	}
	stops = append(stops, stopProj)
	failed = func() error {
		if p := e.err.Load(); p != nil {
			return *p
		}
		return nil
	}
	return stop, failed, nil
}

// runHandRolled measures the hand-rolled minimum like W1 (a warm-up
// second, then reps windows of dur): the minimal worker and the client run
// here, the minimal engine and projector in the process of the server
// (serverPID), which minimalFailed reports on.
func runHandRolled(ctx context.Context, url string, serverPID int, minimalFailed func() error, reps int, dur time.Duration, stepsPerRun int, w2 HandRolledW2) (HandRolled, error) {
	var res HandRolled
	wnc, wjs, err := connect(url, "toolbatch-bench-min-worker")
	if err != nil {
		return res, err
	}
	defer wnc.Close()
	cnc, cjs, err := connect(url, "toolbatch-bench-min-client")
	if err != nil {
		return res, err
	}
	defer cnc.Close()
	var workerErr atomic.Pointer[error]
	failWorker := func(err error) { workerErr.CompareAndSwap(nil, &err) }
	failed := func() error {
		if p := workerErr.Load(); p != nil {
			return *p
		}
		return minimalFailed()
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	stopWorker, err := minWorker(runCtx, wnc, wjs, 1, failWorker)
	if err != nil {
		return res, err
	}
	defer func() { stopWorker() }()
	cl, err := client.New(cnc, client.WithPrefix(minPrefix))
	if err != nil {
		return res, err
	}
	loop := func(prefix string, d time.Duration) ([]sample, float64, error) {
		var samples []sample
		stop := make(chan struct{})
		timer := time.AfterFunc(d, func() { close(stop) })
		defer timer.Stop()
		lctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() {
			// A failure of the minimal engine, worker or projector stops
			// the client instead of leaving it waiting.
			for lctx.Err() == nil {
				if failed() != nil {
					cancel()
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
		}()
		start := time.Now()
		err := clientLoop(lctx, loopConfig{client: cl, js: cjs, prefix: minPrefix, runPrefix: prefix, tool: "noop", calls: minCalls, stepsPerRun: stepsPerRun},
			stop, func(s sample) { samples = append(samples, s) })
		if ferr := failed(); ferr != nil {
			err = ferr
		}
		return samples, time.Since(start).Seconds(), err
	}
	if _, _, err := loop("min-warm", time.Second); err != nil {
		return res, fmt.Errorf("hand-rolled: %w", err)
	}
	before, err := lastSeq(ctx, cjs, minNames.EventsStream())
	if err != nil {
		return res, err
	}
	srv0, err1 := cpuSeconds(serverPID)
	self0, err2 := cpuSeconds(os.Getpid())
	if err := errors.Join(err1, err2); err != nil {
		return res, err
	}
	total := 0
	for r := 0; r < reps; r++ {
		samples, secs, err := loop(fmt.Sprintf("min-r%d", r), dur)
		if err != nil {
			return res, fmt.Errorf("hand-rolled: %w", err)
		}
		total += len(samples)
		res.Reps = append(res.Reps, latencyRep(samples, secs))
	}
	srv1, err1 := cpuSeconds(serverPID)
	self1, err2 := cpuSeconds(os.Getpid())
	if err := errors.Join(err1, err2); err != nil {
		return res, err
	}
	res.ServerCPUms = Num(ratio((srv1-srv0)*1000, float64(total)))
	res.BenchCPUms = Num(ratio((self1-self0)*1000, float64(total)))
	after, err := lastSeq(ctx, cjs, minNames.EventsStream())
	if err != nil {
		return res, err
	}
	res.Commits = Num(ratio(float64(after-before), float64(total)))
	res.P50ms = medianOf(res.Reps, func(r LatencyRep) Num { return r.P50ms })
	res.P99ms = medianOf(res.Reps, func(r LatencyRep) Num { return r.P99ms })
	res.BatchesPerSec = medianOf(res.Reps, func(r LatencyRep) Num { return r.BatchesPerSec })
	if w2.Runs == 0 {
		return res, nil
	}
	// W2's shape: the serial worker gives way to w2.Workers workers of
	// w2.Concurrency.
	stopWorker()
	stopWorker = func() {}
	var stops []func()
	defer func() {
		for _, f := range stops {
			f()
		}
	}()
	for i := 0; i < w2.Workers; i++ {
		nc, js, err := connect(url, fmt.Sprintf("toolbatch-bench-min-worker-%d", i))
		if err != nil {
			return res, err
		}
		stops = append(stops, nc.Close)
		stop, err := minWorker(runCtx, nc, js, w2.Concurrency, failWorker)
		if err != nil {
			return res, err
		}
		stops = append(stops, stop)
	}
	var rates, commits, p50s []float64
	for r := 0; r < reps; r++ {
		l := startLoads(ctx, w2.Runs, func(i int) loopConfig {
			return loopConfig{client: cl, js: cjs, prefix: minPrefix, runPrefix: fmt.Sprintf("min-w2-r%d-%d", r, i), tool: "noop", calls: minCalls, stepsPerRun: stepsPerRun}
		})
		finish := func() error {
			if err := l.finish(); err != nil {
				return err
			}
			return failed()
		}
		// The first second is a warm-up; the window is dur.
		time.Sleep(time.Second)
		from, err := lastSeq(ctx, cjs, minNames.EventsStream())
		if err != nil {
			finish()
			return res, err
		}
		start := time.Now()
		time.Sleep(dur)
		to, err := lastSeq(ctx, cjs, minNames.EventsStream())
		end := time.Now()
		if err != nil {
			finish()
			return res, err
		}
		if err := finish(); err != nil {
			return res, fmt.Errorf("hand-rolled W2: %w", err)
		}
		secs := end.Sub(start).Seconds()
		win := l.window(start, end)
		rep := latencyRep(win, secs)
		rates, p50s = append(rates, float64(rep.BatchesPerSec)), append(p50s, float64(rep.P50ms))
		commits = append(commits, float64(to-from)/secs)
	}
	res.W2 = &HandRolledW2{Runs: w2.Runs, Workers: w2.Workers, Concurrency: w2.Concurrency,
		BatchesPerSec: Num(median(rates)), CommitsPerSec: Num(median(commits)), P50ms: Num(median(p50s))}
	return res, nil
}
