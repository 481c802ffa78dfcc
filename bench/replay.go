package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/aggregate"
	"github.com/toolbatch/toolbatch/engine"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/internal/testproc"
	"github.com/toolbatch/toolbatch/protocol"
	"github.com/toolbatch/toolbatch/replay"
)

// W3: a synthetic recorded stream, legal by construction: every commit is
// what aggregate.Decide returns for the engine's commands on a batch of 4
// sandbox calls (submit; then per call: gate allow + executing, claim,
// complete; the last completion carries the barrier), encoded with
// events.EncodeCommit, with the engine's headers. 64 runs are in progress
// at a time and their commits interleave round-robin, as in W2; each run
// has stepsPerRun batches. That is 18 events in 13 commits per batch.

// genRun is a run being generated.
type genRun struct {
	id      string
	run     *aggregate.Run
	step    int64
	last    uint64
	pending [][]events.Event
}

var genBase = time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)

// genBatch returns the commits of the run's next batch.
func genBatch(r *genRun, at time.Time) ([][]events.Event, error) {
	r.step++
	s := batchOf(r.id, r.step, "noop", 4)
	desc := events.Descriptor{Target: events.TargetSandbox, Kind: events.KindTool, Pool: "default",
		Policy: events.Policy{Mode: events.ModeReplaySafe, MaxAttempts: 3}}
	tools := []events.Descriptor{desc, desc, desc, desc}
	var commits [][]events.Event
	decide := func(cmd aggregate.Command) error {
		_, evs, err := aggregate.Decide(r.run, cmd)
		if err != nil {
			return err
		}
		if len(evs) == 0 {
			return fmt.Errorf("%T decided nothing", cmd)
		}
		if err := r.run.ApplyAll(evs); err != nil {
			return err
		}
		commits = append(commits, evs)
		return nil
	}
	if err := decide(aggregate.Submit{Submission: s.Submission(), Tools: tools, SnapshotID: "cat-0123456789abcdef", At: at}); err != nil {
		return nil, err
	}
	for i := 1; i <= 4; i++ {
		call := fmt.Sprintf("c%d", i)
		token := fmt.Sprintf("tok-%s-%d-%d", r.id, r.step, i)
		at = at.Add(time.Millisecond)
		if err := decide(aggregate.Gate{Decisions: []aggregate.Decision{{CallID: call, Outcome: events.GateAllow,
			Stage: events.StageDefault, Capability: events.CapReplaySafe}}, At: at}); err != nil {
			return nil, err
		}
		if err := decide(aggregate.Claim{CallID: call, Attempt: 1, WorkerID: "worker1", Token: token, LeaseMS: 10000, At: at}); err != nil {
			return nil, err
		}
		if err := decide(aggregate.Complete{CallID: call, Attempt: 1, ClaimToken: token,
			Output: &events.Output{CallID: call}, At: at}); err != nil {
			return nil, err
		}
	}
	return commits, nil
}

// genCommit is one generated commit, ready to store.
type genCommit struct {
	seq     uint64
	subject string
	time    time.Time
	headers map[string][]string
	body    []byte
	events  int
}

// generate produces commits until at least target events, calling emit for
// each in stream order. It returns the events, commits and runs.
func generate(target, stepsPerRun int, emit func(genCommit) error) (nEvents, nCommits, nRuns int, err error) {
	const active = 64
	runs := make([]*genRun, 0, active)
	newRun := func() *genRun {
		nRuns++
		return &genRun{id: fmt.Sprintf("rec-%d", nRuns), run: aggregate.New(fmt.Sprintf("rec-%d", nRuns))}
	}
	for i := 0; i < active; i++ {
		runs = append(runs, newRun())
	}
	var seq uint64
	for nEvents < target {
		for i := range runs {
			if nEvents >= target {
				break
			}
			r := runs[i]
			at := genBase.Add(time.Duration(seq) * 50 * time.Microsecond)
			if len(r.pending) == 0 {
				if r.step >= int64(stepsPerRun) {
					r = newRun()
					runs[i] = r
				}
				if r.pending, err = genBatch(r, at); err != nil {
					return nEvents, nCommits, nRuns, fmt.Errorf("generate run %s: %w", r.id, err)
				}
			}
			evs := r.pending[0]
			r.pending = r.pending[1:]
			body, types, err := events.EncodeCommit(evs)
			if err != nil {
				return nEvents, nCommits, nRuns, err
			}
			seq++
			sum := sha256.Sum256(body)
			c := genCommit{seq: seq, subject: "toolbatch.events." + r.id, time: at, body: body, events: len(evs),
				headers: map[string][]string{
					jetstream.MsgIDHeader: {fmt.Sprintf("%s/%d/%s", r.id, r.last, hex.EncodeToString(sum[:8]))},
					protocol.HeaderEvent:  types,
					protocol.HeaderPrev:   {strconv.FormatUint(r.last, 10)},
				}}
			r.last = seq
			if err := emit(c); err != nil {
				return nEvents, nCommits, nRuns, err
			}
			nEvents += len(evs)
			nCommits++
		}
	}
	return nEvents, nCommits, nRuns, nil
}

// W3Result is the replay benchmark.
type W3Result struct {
	Events       int     `json:"events"`
	Commits      int     `json:"commits"`
	Runs         int     `json:"runs"`
	FileMiB      Num     `json:"file_mib"`
	GenerateSecs Num     `json:"generate_seconds"`
	FileFoldRate Num     `json:"file_fold_events_per_s"`
	FileWallRate Num     `json:"file_wall_events_per_s"`
	FileWallSecs Num     `json:"file_wall_seconds"`
	NATSEvents   int     `json:"nats_events"`
	NATSCommits  int     `json:"nats_commits"`
	NATSLoadSecs Num     `json:"nats_load_seconds"`
	NATSFoldRate Num     `json:"nats_fold_events_per_s"`
	NATSWallRate Num     `json:"nats_wall_events_per_s"`
	NATSWallSecs Num     `json:"nats_wall_seconds"`
	Reps         []W3Rep `json:"reps"`
	// Signing is the audit of a shorter stream, signed and unsigned.
	Signing        *W3Signing `json:"signing,omitempty"`
	Note           string     `json:"note,omitempty"`
	ReplayCommand  string     `json:"replay_command"`
	ReplaySubjects string     `json:"subjects"`
}

// W3Rep is one replay run.
type W3Rep struct {
	Source   string `json:"source"`
	Events   int    `json:"events"`
	WallSecs Num    `json:"wall_seconds"`
	FoldRate Num    `json:"fold_events_per_s"`
}

// progressLine is replay's last stderr line.
var progressLine = regexp.MustCompile(`replay: (\d+) events, (\d+) runs, (\d+) events/s`)

// runReplay runs the replay binary and returns the events it read, its own
// rate (its progress line: reading, decoding and folding) and the wall
// time of the whole process (including printing the history to
// /dev/null).
func runReplay(bin string, args ...string) (int, float64, float64, error) {
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		return 0, 0, 0, err
	}
	defer null.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stdout = null
	var stderr strings.Builder
	cmd.Stderr = &stderr
	start := time.Now()
	err = cmd.Run()
	wall := time.Since(start).Seconds()
	if err != nil {
		return 0, 0, wall, fmt.Errorf("replay %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	all := progressLine.FindAllStringSubmatch(stderr.String(), -1)
	if len(all) == 0 {
		return 0, 0, wall, fmt.Errorf("replay printed no progress line: %s", stderr.String())
	}
	last := all[len(all)-1]
	n, _ := strconv.Atoi(last[1])
	rate, _ := strconv.ParseFloat(last[3], 64)
	return n, rate, wall, nil
}

// runW3 generates the stream into a file and into an embedded JetStream,
// then replays each reps times.
func runW3(ctx context.Context, replayBin, dir string, target, stepsPerRun, reps int, loadLimit time.Duration) (W3Result, error) {
	res := W3Result{ReplaySubjects: "toolbatch.events.<run>", ReplayCommand: "replay --file FILE; replay --nats-url URL (stdout to /dev/null)"}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return res, err
	}
	path := filepath.Join(dir, "recorded.jsonl")
	f, err := os.Create(path)
	if err != nil {
		return res, err
	}
	bw := bufio.NewWriterSize(f, 4<<20)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false)
	start := time.Now()
	res.Events, res.Commits, res.Runs, err = generate(target, stepsPerRun, func(c genCommit) error {
		return enc.Encode(replay.ExportRecord{Seq: c.seq, Subject: c.subject, Time: c.time, Headers: c.headers, Data: c.body})
	})
	if err == nil {
		err = bw.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return res, err
	}
	res.GenerateSecs = Num(time.Since(start).Seconds())
	if st, err := os.Stat(path); err == nil {
		res.FileMiB = Num(float64(st.Size()) / (1 << 20))
	}
	var fileFold, fileWall, fileSecs []float64
	for r := 0; r < reps; r++ {
		n, rate, wall, err := runReplay(replayBin, "--file", path)
		if err != nil {
			return res, err
		}
		if n != res.Events {
			return res, fmt.Errorf("replay read %d events from the file, want %d", n, res.Events)
		}
		res.Reps = append(res.Reps, W3Rep{Source: "file", Events: n, WallSecs: Num(wall), FoldRate: Num(rate)})
		fileFold, fileWall, fileSecs = append(fileFold, rate), append(fileWall, float64(n)/wall), append(fileSecs, wall)
	}
	res.FileFoldRate, res.FileWallRate, res.FileWallSecs = Num(median(fileFold)), Num(median(fileWall)), Num(median(fileSecs))

	// The same stream in JetStream: an embedded server of this process,
	// with the engine's streams, loaded by publishing the same commits in
	// order (so that the stream sequences are the file's).
	port, err := testproc.Port()
	if err != nil {
		return res, err
	}
	srv, err := server.NewServer(&server.Options{ServerName: "toolbatch-bench-w3", Host: "127.0.0.1", Port: port,
		JetStream: true, StoreDir: filepath.Join(dir, "store"), MaxPayload: 8 << 20, NoSigs: true, NoLog: true})
	if err != nil {
		return res, err
	}
	go srv.Start()
	defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
	if !srv.ReadyForConnections(10 * time.Second) {
		return res, errors.New("W3: embedded NATS server did not start")
	}
	nc, js, err := connect(srv.ClientURL(), "toolbatch-bench-w3-load")
	if err != nil {
		return res, err
	}
	defer nc.Close()
	if err := engine.EnsureStreams(ctx, js, protocol.Names{Prefix: protocol.DefaultPrefix}, engine.StreamConfig{}); err != nil {
		return res, err
	}
	errFull := errors.New("time is up")
	start = time.Now()
	var loadEvents, loadCommits int
	_, _, _, err = generate(target, stepsPerRun, func(c genCommit) error {
		if time.Since(start) > loadLimit {
			return errFull
		}
		m := nats.NewMsg(c.subject)
		m.Data = c.body
		for k, v := range c.headers {
			m.Header[k] = v
		}
		if _, err := js.PublishMsgAsync(m, jetstream.WithStallWait(30*time.Second)); err != nil {
			return err
		}
		loadEvents += c.events
		loadCommits++
		return nil
	})
	if err != nil && !errors.Is(err, errFull) {
		return res, err
	}
	if errors.Is(err, errFull) {
		res.Note = fmt.Sprintf("loading NATS was stopped after %s: the NATS figures are for %d events", loadLimit, loadEvents)
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(2 * time.Minute):
		return res, errors.New("W3: acks of the load missing after 2 minutes")
	}
	res.NATSLoadSecs = Num(time.Since(start).Seconds())
	res.NATSEvents, res.NATSCommits = loadEvents, loadCommits
	if last, err := lastSeq(ctx, js, "TOOLBATCH_EVENTS"); err != nil || last != uint64(loadCommits) {
		return res, fmt.Errorf("W3: the events stream ends at %d, want %d (%v)", last, loadCommits, err)
	}
	var natsFold, natsWall, natsSecs []float64
	for r := 0; r < reps; r++ {
		n, rate, wall, err := runReplay(replayBin, "--nats-url", srv.ClientURL())
		if err != nil {
			return res, err
		}
		if n != loadEvents {
			return res, fmt.Errorf("replay read %d events from NATS, want %d", n, loadEvents)
		}
		res.Reps = append(res.Reps, W3Rep{Source: "nats", Events: n, WallSecs: Num(wall), FoldRate: Num(rate)})
		natsFold, natsWall, natsSecs = append(natsFold, rate), append(natsWall, float64(n)/wall), append(natsSecs, wall)
	}
	res.NATSFoldRate, res.NATSWallRate, res.NATSWallSecs = Num(median(natsFold)), Num(median(natsWall)), Num(median(natsSecs))
	return res, nil
}
