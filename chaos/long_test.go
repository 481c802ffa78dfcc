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
	n := 0
	if s := os.Getenv("CHAOS_SCHEDULES"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil || n < 1 {
			t.Fatalf("CHAOS_SCHEDULES=%q: want a positive number", s)
		}
	}
	if n == 0 {
		n = 20
	}
	runSchedules(t, "TestChaos", Long, randomSeeds(n))
}
