package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/client"
	"github.com/toolbatch/toolbatch/events"
)

// headerEvent carries the event types of a commit on the events stream.
const headerEvent = "Toolbatch-Event"

// acceptedDigest returns the digest of the batch the run accepted at step,
// read from the run's event log, or "" when it accepted none. The engine
// treats a submission for an accepted step as a harmless repetition when
// the digests are equal, and rejects it otherwise.
func acceptedDigest(ctx context.Context, nc *nats.Conn, prefix, runID string, step int64) (string, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return "", err
	}
	name, err := js.StreamNameBySubject(ctx, prefix+".events.>")
	if err != nil {
		return "", fmt.Errorf("find the events stream: %w", err)
	}
	stream, err := js.Stream(ctx, name)
	if err != nil {
		return "", err
	}
	subject := prefix + ".events." + runID
	last, err := stream.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return "", nil // a new run
	}
	if err != nil {
		return "", err
	}
	cons, err := js.OrderedConsumer(ctx, name, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
	if err != nil {
		return "", err
	}
	iter, err := cons.Messages()
	if err != nil {
		return "", err
	}
	defer iter.Stop()
	for {
		m, err := iter.Next(jetstream.NextContext(ctx))
		if err != nil {
			return "", err
		}
		meta, err := m.Metadata()
		if err != nil {
			return "", err
		}
		evs, err := events.DecodeCommit(m.Data(), m.Headers().Values(headerEvent))
		if err != nil {
			return "", fmt.Errorf("commit %d of run %s: %w", meta.Sequence.Stream, runID, err)
		}
		for _, e := range evs {
			if bs, ok := e.(*events.BatchSubmitted); ok && bs.Step == step {
				return bs.Digest, nil
			}
		}
		if meta.Sequence.Stream >= last.Sequence {
			return "", nil
		}
	}
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
		m, err := w.Next(ctx)
		var derr *client.DecodeError
		switch {
		case errors.As(err, &derr):
			continue
		case err != nil:
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
