package protocol

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrEndedEarly means a stream or subject ended before the sequence a read
// was asked to reach (messages were removed, or the stream was reset).
var ErrEndedEarly = errors.New("protocol: the stream ended before the sequence to read up to")

// ReadOrdered delivers every message of a stream in order, through an
// ordered consumer, up to and including the sequence upTo; with subjects
// given (nil: all), only the messages of those subjects. upTo 0 means the stream's
// (or the subjects') last sequence when the read begins; a stream or
// subject with no message delivers nothing. fn gets each message and its
// stream sequence; an error from it ends the read.
func ReadOrdered(ctx context.Context, js jetstream.JetStream, stream string, subjects []string, upTo uint64, fn func(jetstream.Msg, uint64) error) error {
	if upTo == 0 {
		last, err := lastSequence(ctx, js, stream, subjects)
		if err != nil || last == 0 {
			return err
		}
		upTo = last
	}
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: subjects, DeliverPolicy: jetstream.DeliverAllPolicy,
		InactiveThreshold: 5 * time.Second, MaxResetAttempts: 3,
	})
	if err != nil {
		return fmt.Errorf("read stream %s: %w", stream, err)
	}
	for {
		batch, err := cons.Fetch(512, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return fmt.Errorf("read stream %s: %w", stream, err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			meta, err := m.Metadata()
			if err != nil {
				return err
			}
			if meta.Sequence.Stream > upTo {
				return nil
			}
			if err := fn(m, meta.Sequence.Stream); err != nil {
				return err
			}
			if meta.Sequence.Stream == upTo {
				return nil
			}
		}
		if err := batch.Error(); err != nil {
			return fmt.Errorf("read stream %s: %w", stream, err)
		}
		if n == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
			return fmt.Errorf("%w: stream %s %v, sequence %d", ErrEndedEarly, stream, subjects, upTo)
		}
	}
}

// lastSequence is the stream's last sequence, or that of its last message
// on one of subjects (0: none).
func lastSequence(ctx context.Context, js jetstream.JetStream, stream string, subjects []string) (uint64, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return 0, fmt.Errorf("stream %s: %w", stream, err)
	}
	if len(subjects) == 0 {
		info, err := s.Info(ctx)
		if err != nil {
			return 0, fmt.Errorf("stream %s: %w", stream, err)
		}
		if info.State.Msgs == 0 {
			return 0, nil
		}
		return info.State.LastSeq, nil
	}
	var last uint64
	for _, subj := range subjects {
		m, err := s.GetLastMsgForSubject(ctx, subj)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("stream %s: %w", stream, err)
		}
		last = max(last, m.Sequence)
	}
	return last, nil
}
