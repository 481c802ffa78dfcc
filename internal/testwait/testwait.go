package testwait

import (
	"context"
	"testing"
	"time"
)

// Until checks cond every 10ms until it holds, failing the test, with
// what, at ctx's deadline.
func Until(t testing.TB, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not before the deadline", what)
		case <-tick.C:
		}
	}
}
