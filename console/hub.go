package console

import (
	"sync"
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
type hub struct {
	mu        sync.Mutex
	listeners map[*listener]struct{}
}

type listener struct {
	mu      sync.Mutex
	pending map[string]bool
	wake    chan struct{} // buffered 1
}

const maxPending = 64

func newHub() *hub { return &hub{listeners: map[*listener]struct{}{}} }

func (h *hub) listen() *listener {
	l := &listener{pending: map[string]bool{}, wake: make(chan struct{}, 1)}
	h.mu.Lock()
	h.listeners[l] = struct{}{}
	h.mu.Unlock()
	return l
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
	for l := range h.listeners {
		l.mu.Lock()
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

// take returns the listener's pending topics and clears them.
func (l *listener) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]string, 0, len(l.pending))
	for t := range l.pending {
		out = append(out, t)
	}
	clear(l.pending)
	return out
}
