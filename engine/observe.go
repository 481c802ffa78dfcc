package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbatch/toolbatch/protocol"
)

// What the engine shows outside (package metrics): the gauges read when
// scraped, and its readiness.

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
