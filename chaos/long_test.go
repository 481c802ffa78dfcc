//go:build chaos

package chaos

import (
	"os"
	"strconv"
	"testing"
)

// TestChaos runs CHAOS_SCHEDULES long schedules (default 20), or the one
// of -seed or CHAOS_SEED. It is built only with the chaos tag: `make chaos`.
func TestChaos(t *testing.T) {
	runSchedules(t, "TestChaos", single(Long), randomSeeds(schedules(t, 20)))
}

// schedules is CHAOS_SCHEDULES, or def when it is not set.
func schedules(t *testing.T, def int) int {
	s := os.Getenv("CHAOS_SCHEDULES")
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		t.Fatalf("CHAOS_SCHEDULES=%q: want a positive number", s)
	}
	return n
}

// TestChaosCluster runs CHAOS_SCHEDULES cluster schedules (default 6), or
// the one of -seed or CHAOS_SEED: `make chaos-cluster`. Its random seeds
// alternate even and odd, so that server-only plans (even seeds) and mixed
// plans with engine kills (odd seeds) both run, and with six schedules each
// fault kind occurs at least three times.
func TestChaosCluster(t *testing.T) {
	seeds := randomSeeds(schedules(t, 6))
	for i := range seeds {
		seeds[i] = 2*seeds[i] + int64(i%2)
	}
	runSchedules(t, "TestChaosCluster", onCluster(ClusterLong), seeds)
}
