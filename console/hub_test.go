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
	h.notify(topicRun + "a")
	h.notify(topicTickets)
	rendered := h.generation()
	if rendered != 2 {
		t.Fatalf("generation after two notices: %d", rendered)
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
	if topics, gen := behind.take(); fmt.Sprint(topics) != "[all]" || gen != 2 {
		t.Fatalf("what the page behind takes: %v at %d", topics, gen)
	}

	h.notify(topicRun + "b")
	<-current.wake
	if topics, gen := current.take(); fmt.Sprint(topics) != "[run:b]" || gen != 3 {
		t.Fatalf("after a new notice: %v at %d", topics, gen)
	}
}
