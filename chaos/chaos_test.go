package chaos

import (
	"context"
	"flag"
	"io"
	"math/rand"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// seedFlag replays one schedule: go test ./chaos -run TestChaos -seed N.
var seedFlag = flag.String("seed", "", "run one schedule with this seed (or set CHAOS_SEED)")

// shortSeeds are the schedules of TestChaosShort inside `make test`: fixed
// seeds, so that CI runs the same workloads and crash plans every time
// (`make chaos` draws random ones). 227 kills its one engine once, 558 runs
// two engines and kills the nats-server once; both kill workers.
var shortSeeds = []int64{227, 558}

// TestChaosShort runs the short schedules of shortSeeds inside `make test`;
// with -seed or CHAOS_SEED it runs that one schedule.
func TestChaosShort(t *testing.T) {
	runSchedules(t, "TestChaosShort", single(Short), shortSeeds)
}

// clusterShortSeed is the schedule of TestChaosClusterShort: a fixed seed,
// so that CI runs the same plan every time. Its plan (ClusterShort's kinds)
// kills -9 the events stream's leader, then SIGSTOPs the events leader of
// the moment for 8-9 s (the seed picks the stopped server's role).
const clusterShortSeed = 3

// TestChaosClusterShort runs one short schedule on a 3-node nats-server
// cluster inside `make test`; with -seed or CHAOS_SEED it runs that seed.
func TestChaosClusterShort(t *testing.T) {
	runSchedules(t, "TestChaosClusterShort", onCluster(ClusterShort), []int64{clusterShortSeed})
}

// scheduleFunc runs one schedule of a seed in dir.
type scheduleFunc func(ctx context.Context, b Binaries, seed int64, dir string, progress io.Writer) (*Result, error)

// single runs the schedules of the one-server mode.
func single(p Profile) scheduleFunc {
	return func(ctx context.Context, b Binaries, seed int64, dir string, progress io.Writer) (*Result, error) {
		return Run(ctx, b, p, seed, dir, dir, progress)
	}
}

// onCluster runs the schedules of the cluster mode.
func onCluster(p ClusterProfile) scheduleFunc {
	return func(ctx context.Context, b Binaries, seed int64, dir string, progress io.Writer) (*Result, error) {
		return RunCluster(ctx, b, p, seed, dir, dir, progress)
	}
}

// randomSeeds draws n seeds from the clock.
func randomSeeds(n int) []int64 {
	r := rand.New(rand.NewSource(time.Now().UnixNano()))
	seeds := make([]int64, n)
	for i := range seeds {
		seeds[i] = 1 + r.Int63n(1_000_000_000)
	}
	return seeds
}

func seedGiven() string {
	if *seedFlag != "" {
		return *seedFlag
	}
	return os.Getenv("CHAOS_SEED")
}

var (
	buildOnce sync.Once
	bins      Binaries
	buildErr  error
	binDir    string
)

func binaries(t *testing.T) Binaries {
	t.Helper()
	buildOnce.Do(func() {
		if binDir, buildErr = os.MkdirTemp("", "toolbatch-chaos-bin"); buildErr != nil {
			return
		}
		bins, buildErr = Build("..", binDir)
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return bins
}

func TestMain(m *testing.M) {
	flag.Parse()
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// logWriter hands progress lines to t.Log.
type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// runSchedules runs a schedule per seed, or only the one of -seed or
// CHAOS_SEED when given, and reports each failure with how to reproduce it.
func runSchedules(t *testing.T, name string, run scheduleFunc, seeds []int64) {
	if s := seedGiven(); s != "" {
		seed, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("seed %q: want an integer", s)
		}
		seeds = []int64{seed}
	}
	b := binaries(t)
	var results []*Result
	for _, seed := range seeds {
		t.Logf("chaos: schedule seed %d (reproduce: go test -count=1 ./chaos -run '^%s$' -seed %d)", seed, name, seed)
		dir, err := os.MkdirTemp("", "toolbatch-chaos-"+strconv.FormatInt(seed, 10)+"-")
		if err != nil {
			t.Fatal(err)
		}
		// The sandbox user (uid 65534) must reach the effects directory and
		// the workers' work roots inside it.
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		res, err := run(ctx, b, seed, dir, logWriter{t})
		cancel()
		if err != nil {
			t.Fatalf("seed %d: %v (logs in %s)", seed, err, dir)
		}
		results = append(results, res)
		t.Logf("chaos: %s", res.Line())
		what := "crashes"
		if res.Servers > 1 {
			what = "faults"
		}
		t.Logf("chaos: seed %d: %s: %s", seed, what, strings.Join(res.CrashLog, "; "))
		for _, s := range res.Indeterminate {
			t.Logf("chaos: seed %d: indeterminate %s", seed, s)
		}
		for _, s := range res.Replayed {
			t.Logf("chaos: seed %d: replayed %s", seed, s)
		}
		for _, s := range res.Unavailable {
			t.Logf("chaos: seed %d: completed unavailable_before_dispatch %s", seed, s)
		}
		if len(res.Failures) > 0 {
			var sb strings.Builder
			Report(&sb, res, "go test -count=1 ./chaos -run '^"+name+"$' -seed "+strconv.FormatInt(seed, 10))
			t.Errorf("%s\n%s", sb.String(), LogTails(res, 40))
			continue
		}
		for _, s := range res.Surprises {
			t.Logf("chaos: seed %d: note: %s", seed, s)
		}
		if os.Getenv("CHAOS_KEEP") != "" {
			t.Logf("chaos: seed %d: CHAOS_KEEP: logs kept in %s", seed, filepath.Join(dir, "logs"))
			continue
		}
		os.RemoveAll(dir)
	}
	t.Logf("%s", Summary(results))
}
