package engine

import (
	"testing"

	"github.com/toolbatch/toolbatch/metrics"
	"github.com/toolbatch/toolbatch/tracing"
)

func TestObserverKeepsOrderAndSyncs(t *testing.T) {
	o := newObserver(nil, tracing.NewEngine(&tracing.Provider{}))
	if o == nil {
		t.Fatal("an observer with a tracer is nil")
	}
	o.start()
	var got []int
	for i := range 1000 {
		o.add(func() { got = append(got, i) })
	}
	// What Sync waits for includes a function still running when it is
	// called.
	release, flag := make(chan struct{}), false
	o.add(func() { <-release; flag = true })
	synced := make(chan bool)
	go func() { o.Sync(); synced <- flag }()
	close(release)
	if !<-synced {
		t.Fatal("Sync returned before what was given before it was done")
	}
	if len(got) != 1000 {
		t.Fatalf("%d of 1000 done after Sync", len(got))
	}
	for i, v := range got {
		if v != i {
			t.Fatalf("done out of order: %d at %d", v, i)
		}
	}
	o.add(func() { got = append(got, -1) })
	o.stop()
	if got[len(got)-1] != -1 {
		t.Fatal("stop returned before the queue was done")
	}
	// Stopped: done at once, in order.
	o.add(func() { got = append(got, -2) })
	if got[len(got)-1] != -2 {
		t.Fatal("a function added after stop was not done at once")
	}
	o.Sync()
}

func TestNoObserverWithoutMetricsOrTraces(t *testing.T) {
	if o := newObserver(nil, tracing.NewEngine(nil)); o != nil {
		t.Fatal("an observer with neither metrics nor traces")
	}
	var m *metrics.Engine
	if o := newObserver(m, nil); o != nil {
		t.Fatal("an observer with neither metrics nor traces")
	}
	var o *observer // nil: every method is a no-op
	o.start()
	o.committed("r", "", nil)
	o.Sync()
	if tp := o.attempt("r", "c", 1); tp != "" {
		t.Fatalf("a nil observer's attempt: %q", tp)
	}
	o.stop()
}
