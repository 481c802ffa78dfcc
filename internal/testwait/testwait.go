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

// Holds checks cond every 10ms until ctx's deadline and fails the test,
// with what, at the first check it does not hold: for a property over a
// span of time (a wait that must outlast a timeout), where the passing of
// time is what is tested.
func Holds(t testing.TB, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if !cond() {
			t.Fatalf("%s: no longer so", what)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
