package console

import (
	"sync"
	"time"
)

// A topic names what changed: a run (topicRun + its id), the open tickets
// (topicTickets), or anything (topicAll, when a listener fell behind).
const (
	topicRun     = "run:"
	topicTickets = "tickets"
	topicAll     = "all"
)

// hub fans change notices out to the pages listening on /events. A
// listener that falls behind loses nothing that matters: its pending
// topics are coalesced (a page reloads its part on any notice of its
// topic), and past maxPending it gets one "all".
//
// Every notice moves the hub's generation on. A page is rendered with the
// generation read before its data, and its stream resumes from it (or from
// the last notice it took, on a reconnection): a page that missed a
// notice gets an "all" at once, one that missed nothing is not reloaded.
type hub struct {
	mu        sync.Mutex
	gen       uint64
	listeners map[*listener]struct{}
}

type listener struct {
	mu      sync.Mutex
	pending map[string]bool
	gen     uint64        // the generation of the last notice pending
	wake    chan struct{} // buffered 1
}

const maxPending = 64

// newHub starts the generations at the clock's nanoseconds, so that a
// page rendered by an earlier process of the console, or by another one
// behind the same address, never names a generation of this one.
func newHub() *hub {
	return &hub{gen: uint64(time.Now().UnixNano()), listeners: map[*listener]struct{}{}}
}

// listen adds a listener that has seen every notice up to generation
// since: when more came since (or since is not this hub's), it gets an
// "all" at once.
func (h *hub) listen(since uint64) *listener {
	l := &listener{pending: map[string]bool{}, wake: make(chan struct{}, 1)}
	h.mu.Lock()
	h.listeners[l] = struct{}{}
	if h.gen != since {
		l.pending[topicAll], l.gen = true, h.gen
		l.wake <- struct{}{}
	}
	h.mu.Unlock()
	return l
}

// generation is the number of notices so far.
func (h *hub) generation() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.gen
}

func (h *hub) leave(l *listener) {
	h.mu.Lock()
	delete(h.listeners, l)
	h.mu.Unlock()
}

// notify tells every listener that topic changed.
func (h *hub) notify(topic string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.gen++
	for l := range h.listeners {
		l.mu.Lock()
		l.gen = h.gen
		if len(l.pending) >= maxPending {
			clear(l.pending)
			l.pending[topicAll] = true
		} else if !l.pending[topicAll] {
			l.pending[topic] = true
		}
		l.mu.Unlock()
		select {
		case l.wake <- struct{}{}:
		default:
		}
	}
}

// take returns the listener's pending topics, clearing them, and the
// generation they bring it to.
func (l *listener) take() ([]string, uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]string, 0, len(l.pending))
	for t := range l.pending {
		out = append(out, t)
	}
	clear(l.pending)
	return out, l.gen
}
