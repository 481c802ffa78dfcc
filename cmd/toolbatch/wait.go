package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/toolbatch/toolbatch/client"
)

// nextReadable returns the next message of w, passing over the ones that
// do not decode.
func nextReadable(ctx context.Context, w *client.Watch) (client.Message, error) {
	for {
		m, err := w.Next(ctx)
		var derr *client.DecodeError
		if !errors.As(err, &derr) {
			return m, err
		}
	}
}

// watchBatch prints on stderr each ticket the batch opens, with the
// command that answers it, until ctx ends. With timeout > 0 it also bounds
// the wait until the batch first parks: expire is called after timeout
// without a disposition of the batch. Once a ticket opens it waits without
// a limit (a person may answer hours later, and the engine publishes
// nothing more until the batch parks again or clears its barrier).
func watchBatch(ctx context.Context, cl *client.Client, runID, batchID, flags string, timeout time.Duration, stderr io.Writer, expire func()) {
	var timer *time.Timer
	if timeout > 0 {
		timer = time.AfterFunc(timeout, expire)
		defer timer.Stop()
	}
	w, err := cl.Watch(ctx, runID)
	if err != nil {
		return // the wait itself fails the same way
	}
	defer w.Stop()
	shown := map[string]bool{}
	for {
		m, err := nextReadable(ctx, w)
		if err != nil {
			return
		}
		switch {
		case m.Awaiting != nil && m.Awaiting.BatchID == batchID:
			if !shown[m.Awaiting.CorrelationID] {
				shown[m.Awaiting.CorrelationID] = true
				fmt.Fprintln(stderr, "toolbatch: waiting on "+ticketLine(*m.Awaiting, flags))
			}
			if timer != nil {
				timer.Stop() // parked: waiting for an answer, not for the engine
			}
		case m.Disposition != nil && m.Disposition.BatchID == batchID && len(shown) == 0:
			if timer != nil {
				timer.Reset(timeout)
			}
		}
	}
}
