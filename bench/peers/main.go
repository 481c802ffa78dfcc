package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
)

type options struct {
	reps          int
	w1, w2, warm  time.Duration
	w2runs, steps int
	pgBin         string
	out           string
	dir           string
	compare       bool
}

// Result is what the peers program writes (--out).
type Result struct {
	Peer     string    `json:"peer"`
	Postgres string    `json:"postgres"`
	Started  time.Time `json:"started"`
	Steps    int       `json:"steps_per_workflow"`
	W1P50ms  []float64 `json:"w1_p50_ms_per_rep"`
	W2PerSec []float64 `json:"w2_workflows_per_s_per_rep"`
	W2Runs   int       `json:"w2_concurrent"`
	W1       float64   `json:"w1_p50_ms"`
	W2       float64   `json:"w2_workflows_per_s"`
}

func main() {
	var o options
	flag.IntVar(&o.reps, "reps", 3, "repetitions (the median is reported)")
	flag.DurationVar(&o.w1, "w1", 5*time.Second, "W1: length of one repetition")
	flag.DurationVar(&o.w2, "w2", 10*time.Second, "W2: length of one measured window")
	flag.DurationVar(&o.warm, "w2-warmup", 3*time.Second, "W2: warm-up before the first window")
	flag.IntVar(&o.w2runs, "w2-runs", 64, "W2: workflows at once")
	flag.IntVar(&o.steps, "steps", 4, "concurrent steps per workflow (a batch's calls)")
	flag.StringVar(&o.pgBin, "pg-bin", "", "directory of initdb and pg_ctl (default: found on PATH or in /usr/lib/postgresql/*/bin)")
	flag.StringVar(&o.out, "out", "", "write the result as JSON here")
	flag.StringVar(&o.dir, "dir", "", "with --compare: the directory of the rounds' dbos-<i>.json and toolbatch-<i>.json")
	flag.BoolVar(&o.compare, "compare", false, "measure nothing: print the ratios of each round's toolbatch figures to DBOS's, and their medians")
	flag.Parse()
	if err := run(o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "peers:", err)
		os.Exit(1)
	}
}

func run(o options, stdout io.Writer) error {
	if o.compare {
		if o.dir == "" {
			return errors.New("--compare needs --dir DIR")
		}
		return compare(o, stdout)
	}
	pg, err := startPostgres(o.pgBin)
	if err != nil {
		return err
	}
	defer pg.stop()
	res := Result{Peer: "DBOS Transact Go v1.8.0", Postgres: pg.version, Started: time.Now().UTC(), Steps: o.steps, W2Runs: o.w2runs}
	ctx := context.Background()
	dctx, err := dbos.NewContext(ctx, dbos.Config{DatabaseURL: pg.url("dbos_bench"), AppName: "toolbatch-peers",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return fmt.Errorf("dbos: %w", err)
	}
	noop := func(context.Context) (int, error) { return 0, nil }
	batch := func(c dbos.Context, n int) (int, error) {
		chans := make([]<-chan dbos.StepOutcome[int], n)
		for i := range n {
			ch, err := dbos.Go(c, noop, dbos.WithStepName("call-"+strconv.Itoa(i)))
			if err != nil {
				return 0, err
			}
			chans[i] = ch
		}
		for _, ch := range chans {
			if out := <-ch; out.Err != nil {
				return 0, out.Err
			}
		}
		return n, nil
	}
	dbos.RegisterWorkflow(dctx, batch, dbos.WithWorkflowName("batch"))
	if err := dbos.Launch(dctx); err != nil {
		return fmt.Errorf("dbos launch: %w", err)
	}
	defer dbos.Shutdown(dctx, 5*time.Second)
	one := func() (time.Duration, error) {
		start := time.Now()
		h, err := dbos.RunWorkflow(dctx, batch, o.steps)
		if err != nil {
			return 0, err
		}
		if _, err := h.GetResult(); err != nil {
			return 0, err
		}
		return time.Since(start), nil
	}
	for range 20 { // warm the pool and the plans
		if _, err := one(); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
	}
	for rep := range o.reps {
		var lat []time.Duration
		for end := time.Now().Add(o.w1); time.Now().Before(end); {
			d, err := one()
			if err != nil {
				return fmt.Errorf("w1: %w", err)
			}
			lat = append(lat, d)
		}
		p50 := ms(percentile(lat, 0.5))
		res.W1P50ms = append(res.W1P50ms, p50)
		fmt.Fprintf(stdout, "DBOS W1 rep %d: %d workflows, p50 %.2f ms\n", rep+1, len(lat), p50)
	}
	for rep := range o.reps {
		rate, err := throughput(o, one)
		if err != nil {
			return fmt.Errorf("w2: %w", err)
		}
		res.W2PerSec = append(res.W2PerSec, rate)
		fmt.Fprintf(stdout, "DBOS W2 rep %d: %.0f workflows/s at %d concurrent\n", rep+1, rate, o.w2runs)
	}
	res.W1, res.W2 = median(res.W1P50ms), median(res.W2PerSec)
	if o.out != "" {
		b, _ := json.MarshalIndent(res, "", "  ")
		if err := os.WriteFile(o.out, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	fmt.Fprintf(stdout, "DBOS: W1 p50 %.2f ms, W2 %.0f workflows/s (%s)\n", res.W1, res.W2, pg.version)
	return nil
}

// throughput runs o.w2runs loops of workflows and counts those that end
// inside the window.
func throughput(o options, one func() (time.Duration, error)) (float64, error) {
	var done atomic.Int64
	var counting atomic.Bool
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var firstErr atomic.Value
	for range o.w2runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := one(); err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				if counting.Load() {
					done.Add(1)
				}
			}
		}()
	}
	time.Sleep(o.warm) // the warm-up is a length of time, not a condition
	counting.Store(true)
	start := time.Now()
	time.Sleep(o.w2)
	counting.Store(false)
	n, elapsed := done.Load(), time.Since(start)
	close(stop)
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		return 0, err
	}
	return float64(n) / elapsed.Seconds(), nil
}

// toolbatchRun is what compare reads of a toolbatch bench results file.
type toolbatchRun struct {
	Command string `json:"command"`
	Modes   []struct {
		Mode   string `json:"mode"`
		W1Noop *struct {
			P50 float64 `json:"p50_ms"`
		} `json:"w1_noop"`
		W1Echo *struct {
			P50 float64 `json:"p50_ms"`
		} `json:"w1_echo"`
		W2 *struct {
			Rate float64 `json:"batches_per_s"`
		} `json:"w2"`
	} `json:"modes"`
}

// compare prints, round by round, toolbatch's figures next to DBOS's of
// the same round (dbos-<i>.json, toolbatch-<i>.json in --dir), and the
// median of each ratio over the rounds: rounds alternate the two, so that
// both see the machine as it is at that moment.
func compare(o options, stdout io.Writer) error {
	var noop, echo, w2 []float64
	var peer Result
	var cmd string
	for i := 1; ; i++ {
		var tb toolbatchRun
		var p Result
		err := readJSON(filepath.Join(o.dir, fmt.Sprintf("dbos-%d.json", i)), &p)
		if errors.Is(err, os.ErrNotExist) && i > 1 {
			break
		}
		if err != nil {
			return err
		}
		if err := readJSON(filepath.Join(o.dir, fmt.Sprintf("toolbatch-%d.json", i)), &tb); err != nil {
			return err
		}
		peer, cmd = p, tb.Command
		for _, m := range tb.Modes {
			if m.Mode != "default" || m.W1Noop == nil || m.W1Echo == nil || m.W2 == nil {
				continue
			}
			fmt.Fprintf(stdout, "round %d: W1 noop %.2f ms, echo %.2f ms vs DBOS %.2f ms (%.2fx, %.2fx); W2 %.0f/s vs DBOS %.0f/s (%.2fx)\n",
				i, m.W1Noop.P50, m.W1Echo.P50, p.W1, m.W1Noop.P50/p.W1, m.W1Echo.P50/p.W1, m.W2.Rate, p.W2, m.W2.Rate/p.W2)
			noop, echo, w2 = append(noop, m.W1Noop.P50/p.W1), append(echo, m.W1Echo.P50/p.W1), append(w2, m.W2.Rate/p.W2)
		}
	}
	if len(noop) == 0 {
		return errors.New("no round with toolbatch's default-mode W1 and W2")
	}
	fmt.Fprintf(stdout, "\nsame run, %d rounds: toolbatch (%s) against %s on %s\n", len(noop), cmd, peer.Peer, peer.Postgres)
	fmt.Fprintf(stdout, "  W1 p50, 4 worker noop calls, toolbatch/DBOS latency: %.2fx (target at most 0.5x)\n", median(noop))
	fmt.Fprintf(stdout, "  W1 p50, 4 brain echo calls, toolbatch/DBOS latency:  %.2fx\n", median(echo))
	fmt.Fprintf(stdout, "  W2, %d runs at once, toolbatch/DBOS batches/s:       %.2fx (target at least 3x)\n", peer.W2Runs, median(w2))
	return nil
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// postgres is a cluster in a temporary directory.
type postgres struct {
	dir, bin, version string
	port              int
	asUser            []string // runuser -u postgres -- when root
}

func (p *postgres) url(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", p.port, db)
}

func findPGBin(dir string) (string, error) {
	if dir != "" {
		return dir, nil
	}
	if path, err := exec.LookPath("pg_ctl"); err == nil {
		return filepath.Dir(path), nil
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_ctl")
	if len(found) == 0 {
		return "", errors.New("no PostgreSQL: install Debian's postgresql package (make bench-peers does when it runs as root) or give --pg-bin")
	}
	sort.Strings(found)
	return filepath.Dir(found[len(found)-1]), nil
}

func startPostgres(binDir string) (*postgres, error) {
	bin, err := findPGBin(binDir)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "toolbatch-peers-pg")
	if err != nil {
		return nil, err
	}
	p := &postgres{dir: dir, bin: bin}
	if os.Geteuid() == 0 {
		// PostgreSQL refuses to run as root: run it as the postgres user.
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("running as root needs the postgres user (Debian's postgresql package makes it): %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, err
		}
		p.asUser = []string{"runuser", "-u", "postgres", "--"}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p.port = ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	data := filepath.Join(dir, "data")
	if out, err := p.cmd("initdb", "-D", data, "-U", "postgres", "-A", "trust", "--no-sync").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %v: %s", err, out)
	}
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c max_connections=200", p.port, dir)
	if out, err := p.cmd("pg_ctl", "-D", data, "-o", opts, "-l", filepath.Join(dir, "log"), "-w", "start").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("pg_ctl start: %v: %s", err, out)
	}
	if out, err := p.cmd("postgres", "--version").Output(); err == nil {
		p.version = string(slices.DeleteFunc(out, func(b byte) bool { return b == '\n' }))
	}
	return p, nil
}

func (p *postgres) cmd(name string, args ...string) *exec.Cmd {
	all := append(slices.Clone(p.asUser), append([]string{filepath.Join(p.bin, name)}, args...)...)
	return exec.Command(all[0], all[1:]...)
}

func (p *postgres) stop() {
	_ = p.cmd("pg_ctl", "-D", filepath.Join(p.dir, "data"), "-m", "fast", "-w", "stop").Run()
	os.RemoveAll(p.dir)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func percentile(d []time.Duration, q float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1))]
}

// median is the bench's (bench/stats.go): of an even number of values,
// the lower of the two middle ones, so that both programs' medians of the
// same rounds agree.
func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}
