package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/protocol"
)

// What the engine shows outside (package metrics): the gauges read when
// scraped, and its readiness.

// ticketCounts mirrors the tickets bucket as counts by wait reason, for
// toolbatch_tickets_open: every engine reports the whole deployment's.
type ticketCounts struct {
	mu      sync.Mutex
	reasons map[string]string // run key -> reason
	watch   jetstream.KeyWatcher
}

func (t *ticketCounts) start(ctx context.Context, kv jetstream.KeyValue) error {
	t.reasons = map[string]string{}
	var err error
	t.watch, err = mirror(ctx, kv, protocol.TicketKeyPrefix+">", t.apply)
	return err
}

func (t *ticketCounts) apply(up jetstream.KeyValueEntry) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if up.Operation() != jetstream.KeyValuePut {
		delete(t.reasons, up.Key())
		return
	}
	var a protocol.AwaitingOut
	if json.Unmarshal(up.Value(), &a) == nil {
		t.reasons[up.Key()] = string(a.Reason)
	}
}

func (t *ticketCounts) stop() {
	if t != nil && t.watch != nil {
		_ = t.watch.Stop()
	}
}

func (t *ticketCounts) counts() map[string]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[string]int{}
	for _, r := range t.reasons {
		out[r]++
	}
	return out
}

// inboxPending is the inbox messages the engines have not taken or not
// acknowledged (the intake consumer's pending and unacknowledged).
func (e *Engine) inboxPending() float64 {
	c := e.intake.Load()
	if c == nil {
		return 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	info, err := (*c).Info(ctx)
	if err != nil {
		return 0
	}
	return float64(info.NumPending) + float64(info.NumAckPending)
}

// Readiness reports what keeps the engine from serving: not yet started,
// not connected to NATS, a stream missing, its intake consumer not bound.
// Nil means ready.
func (e *Engine) Readiness(ctx context.Context) error {
	select {
	case <-e.ready:
	default:
		return errors.New("starting: not consuming its inbox yet")
	}
	if st := e.nc.Status(); st != nats.CONNECTED {
		return fmt.Errorf("NATS connection %s", strings.ToLower(st.String()))
	}
	var missing []string
	for _, s := range []string{e.names.EventsStream(), e.names.InboxStream(), e.names.OutStream(), e.names.DispatchStream(), e.names.TimersStream()} {
		if _, err := e.js.Stream(ctx, s); err != nil {
			missing = append(missing, fmt.Sprintf("stream %s: %v", s, err))
		}
	}
	if _, err := e.js.Consumer(ctx, e.names.InboxStream(), protocol.ConsumerEngine); err != nil {
		missing = append(missing, fmt.Sprintf("intake consumer %s: %v", protocol.ConsumerEngine, err))
	}
	if len(missing) > 0 {
		return errors.New(strings.Join(missing, "; "))
	}
	return nil
}
