package worker

import (
	"fmt"
	"testing"
	"time"
)

func TestRecentForgetsAfterItsMemory(t *testing.T) {
	var r recent
	t0 := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	r.add("a/1", t0)
	r.add("b/1", t0.Add(5*time.Minute))
	r.add("a/1", t0.Add(6*time.Minute)) // already remembered: still from t0
	if !r.has("a/1") || !r.has("b/1") || r.has("c/1") {
		t.Fatalf("after two adds: a %v b %v c %v, want true true false", r.has("a/1"), r.has("b/1"), r.has("c/1"))
	}
	r.add("c/1", t0.Add(ranMemory)) // exactly ranMemory after a: a stays
	if !r.has("a/1") {
		t.Fatal("a/1 forgotten exactly ranMemory after it was added; it must be remembered that long")
	}
	r.add("d/1", t0.Add(ranMemory+time.Nanosecond))
	if r.has("a/1") || !r.has("b/1") || !r.has("c/1") || !r.has("d/1") {
		t.Fatalf("just after a's memory: a %v b %v c %v d %v, want false true true true", r.has("a/1"), r.has("b/1"), r.has("c/1"), r.has("d/1"))
	}
	r.add("e/1", t0.Add(ranMemory+6*time.Minute))
	if r.has("b/1") || !r.has("c/1") {
		t.Fatalf("after b's memory: b %v c %v, want false true", r.has("b/1"), r.has("c/1"))
	}
	if len(r.set) != len(r.order) {
		t.Fatalf("%d keys in the set, %d in the order", len(r.set), len(r.order))
	}
}

// One key per call for ten minutes: adding one must not cost a scan of
// the others (the worker did that, and spent most of its CPU there).
func BenchmarkRecentAdd(b *testing.B) {
	var r recent
	t0 := time.Now()
	for i := range 200_000 {
		r.add(fmt.Sprintf("op-%d/1", i), t0)
	}
	b.ResetTimer()
	for i := range b.N {
		r.add(fmt.Sprintf("next-%d/1", i), t0.Add(time.Duration(i)*time.Microsecond))
	}
}
