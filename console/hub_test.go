package console

import (
	"fmt"
	"testing"
)

// TestStreamsStartFromWhatThePageSaw: a stream that starts from the
// generation its page was rendered at gets nothing until a new notice,
// one whose page is older gets an "all" at once, and every notice brings
// the generation a reconnection resumes from.
func TestStreamsStartFromWhatThePageSaw(t *testing.T) {
	h := newHub()
	start := h.generation()
	h.notify(topicRun + "a")
	h.notify(topicTickets)
	rendered := h.generation()
	if rendered != start+2 {
		t.Fatalf("generation after two notices: %d, from %d", rendered, start)
	}

	current := h.listen(rendered)
	defer h.leave(current)
	select {
	case <-current.wake:
		t.Fatal("a page that missed nothing was woken")
	default:
	}
	behind := h.listen(rendered - 1)
	defer h.leave(behind)
	select {
	case <-behind.wake:
	default:
		t.Fatal("a page that missed a notice was not woken")
	}
	if topics, gen := behind.take(); fmt.Sprint(topics) != "[all]" || gen != rendered {
		t.Fatalf("what the page behind takes: %v at %d", topics, gen)
	}

	// A page of another console process names a generation this hub
	// never had: it reloads.
	other := h.listen(rendered + 1000)
	defer h.leave(other)
	select {
	case <-other.wake:
	default:
		t.Fatal("a page of another console process was not woken")
	}

	h.notify(topicRun + "b")
	<-current.wake
	if topics, gen := current.take(); fmt.Sprint(topics) != "[run:b]" || gen != rendered+1 {
		t.Fatalf("after a new notice: %v at %d", topics, gen)
	}
}
