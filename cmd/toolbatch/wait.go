package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/client"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/protocol"
)

// acceptedDigest returns the digest of the batch the run accepted at step,
// read from the run's event log, or "" when it accepted none. The engine
// treats a submission for an accepted step as a harmless repetition when
// the digests are equal, and rejects it otherwise.
func acceptedDigest(ctx context.Context, nc *nats.Conn, prefix, runID string, step int64) (string, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return "", err
	}
	names := protocol.Names{Prefix: prefix}
	name, err := js.StreamNameBySubject(ctx, names.StreamSubjects(protocol.StreamEvents)[0])
	if err != nil {
		return "", fmt.Errorf("find the events stream: %w", err)
	}
	var digest string
	err = protocol.ReadOrdered(ctx, js, name, protocol.ReadOptions{Subjects: []string{names.Events(runID)}}, func(m jetstream.Msg, meta *jetstream.MsgMetadata) error {
		seq := meta.Sequence.Stream
		evs, err := events.DecodeCommit(m.Data(), m.Headers().Values(protocol.HeaderEvent))
		if err != nil {
			return fmt.Errorf("commit %d of run %s: %w", seq, runID, err)
		}
		for _, e := range evs {
			if bs, ok := e.(*events.BatchSubmitted); ok && bs.Step == step {
				digest = bs.Digest
				return protocol.ErrStopRead
			}
		}
		return nil
	})
	return digest, err
}

// waitRejection waits for the engine's rejection of a submission for a step
// that already holds another batch: the step's published results are not
// this submission's. It returns the newest rejection of the batch once the
// watch has caught up.
func waitRejection(ctx context.Context, cl *client.Client, runID, batchID string) error {
	w, err := cl.Watch(ctx, runID)
	if err != nil {
		return err
	}
	defer w.Stop()
	var verdict *events.Refusal
	for {
		m, err := nextReadable(ctx, w)
		if err != nil {
			return err
		}
		if m.Rejected != nil && m.Rejected.BatchID == batchID {
			verdict = &events.Refusal{Code: m.Rejected.Code, Reason: m.Rejected.Reason}
		}
		if verdict != nil && m.Pending == 0 {
			return fmt.Errorf("%w: %s: %w", client.ErrRejected, batchID, verdict)
		}
	}
}

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
func watchBatch(ctx context.Context, cl *client.Client, runID, batchID string, timeout time.Duration, stderr io.Writer, expire func()) {
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
				fmt.Fprintln(stderr, "toolbatch: waiting on "+ticketLine(*m.Awaiting))
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
