package protocol

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Reader errors.
var (
	// ErrEndedEarly means a stream or subject ended before the sequence a
	// read was asked to reach (ReadOptions.UpTo).
	ErrEndedEarly = errors.New("protocol: the stream ended before the sequence to read up to")
	// ErrStopRead, returned by a read's callback, ends the read early
	// without an error.
	ErrStopRead = errors.New("protocol: stop reading")
)

// ReadOptions choose what ReadOrdered delivers. The zero value reads the
// whole stream as it is when the read begins.
type ReadOptions struct {
	// Subjects are the subjects (or wildcards) to read; nil reads all.
	Subjects []string
	// UpTo is the last sequence to deliver, which the read must reach (a
	// subject's last commit, say): ending before it is ErrEndedEarly. 0
	// means the stream's last sequence when the read begins, and a filtered
	// read ends quietly where its messages do.
	UpTo uint64
	// FromSeq starts the read at a stream sequence; Since, when FromSeq is
	// not set, at the first message stored at or after a time.
	FromSeq uint64
	Since   time.Time
	// Stall is how long the read waits for a message the stream says is
	// there before it fails (default DefaultStall).
	Stall time.Duration
	// Pull is how many messages the consumer asks for ahead (default
	// DefaultPull).
	Pull int
	// Inactive is how long the server keeps the read's consumer while
	// nothing is pulled (default DefaultInactive).
	Inactive time.Duration
}

// Reader defaults.
const (
	DefaultStall    = 15 * time.Second
	DefaultPull     = 512
	DefaultInactive = 5 * time.Second
)

// ReadOrdered delivers the messages of a stream in stream order, through an
// ordered consumer, as opt selects: fn gets each message with its metadata.
// An error from fn ends the read with that error (ErrStopRead: with none).
func ReadOrdered(ctx context.Context, js jetstream.JetStream, stream string, opt ReadOptions, fn func(jetstream.Msg, *jetstream.MsgMetadata) error) error {
	strict := opt.UpTo > 0
	upTo := opt.UpTo
	if !strict {
		s, err := js.Stream(ctx, stream)
		if err != nil {
			return fmt.Errorf("stream %s: %w", stream, err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			return fmt.Errorf("stream %s: %w", stream, err)
		}
		if info.State.Msgs == 0 || info.State.LastSeq < opt.FromSeq {
			return nil
		}
		upTo = info.State.LastSeq
	}
	cfg := jetstream.OrderedConsumerConfig{
		FilterSubjects: opt.Subjects, DeliverPolicy: jetstream.DeliverAllPolicy,
		InactiveThreshold: orDefault(opt.Inactive, DefaultInactive), MaxResetAttempts: 3,
	}
	switch {
	case opt.FromSeq > 1:
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, opt.FromSeq
	case !opt.Since.IsZero():
		since := opt.Since
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &since
	}
	cons, err := js.OrderedConsumer(ctx, stream, cfg)
	if err != nil {
		return fmt.Errorf("stream %s: consumer: %w", stream, err)
	}
	ended := func(last uint64) error {
		if strict && last < upTo {
			return fmt.Errorf("%w: stream %s %v ended at %d before %d", ErrEndedEarly, stream, opt.Subjects, last, upTo)
		}
		return nil
	}
	if ci := cons.CachedInfo(); ci != nil && ci.NumPending == 0 {
		return ended(0) // nothing matches
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(orDefault(opt.Pull, DefaultPull)))
	if err != nil {
		return fmt.Errorf("stream %s: consumer: %w", stream, err)
	}
	defer it.Stop()
	// One timer, armed while waiting for a message, is much cheaper than a
	// context with a deadline per message.
	stallFor := orDefault(opt.Stall, DefaultStall)
	wctx, stalled := context.WithCancel(ctx)
	defer stalled()
	stall := time.AfterFunc(stallFor, stalled)
	stall.Stop()
	var last uint64
	for {
		stall.Reset(stallFor)
		m, err := it.Next(jetstream.NextContext(wctx))
		stall.Stop()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("stream %s: no message after seq %d for %s (%w)", stream, last, stallFor, err)
		}
		meta, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("stream %s: %w", stream, err)
		}
		seq := meta.Sequence.Stream
		if seq > upTo {
			return ended(last) // stored after the read began
		}
		last = seq
		if err := fn(m, meta); err != nil {
			if errors.Is(err, ErrStopRead) {
				return nil
			}
			return err
		}
		if seq >= upTo || meta.NumPending == 0 {
			return ended(last)
		}
	}
}

func orDefault[T int | time.Duration](v, def T) T {
	if v > 0 {
		return v
	}
	return def
}
