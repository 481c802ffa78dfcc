package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/protocol"
)

// The inbox and the dispatch stream keep their messages until the engines
// trim them (limits retention, not a work queue). A work queue removes
// each message as its consumer acknowledges it, and whenever that empties
// the stream, as the last acknowledgement of every batch does on a
// deployment that is not saturated, the server's file store replaces the
// stream's block file: it creates a file, writes a tombstone and deletes
// the old one. With the embedded server that was 5 to 9% of W1's CPU
// (docs/performance.md, "Trimmed queues"). Instead, every TrimEvery each
// engine removes what the consumers have acknowledged: the inbox's
// messages below the intake consumer's acknowledgement floor, and for each
// pool consumer on the dispatch stream (those of every engine's catalog)
// the messages of its subject below its floor. What no consumer has taken
// stays, as on a work queue (a dispatch for a tool no catalog has, say).
//
// A floor stays below a message taken and not yet acknowledged, and a run
// keeps one of its inbox messages unacknowledged while it has work in
// progress (drive.go), so the inbox keeps what arrived during the longest
// call in progress (docs/operations.md).

// trimmer remembers the floor each consumer was trimmed to, so that an
// idle deployment makes no purge requests.
type trimmer struct {
	js     jetstream.JetStream
	names  protocol.Names
	floors map[string]uint64 // by stream and consumer
}

func (e *Engine) newTrimmer() *trimmer {
	return &trimmer{js: e.js, names: e.names, floors: map[string]uint64{}}
}

// trim trims the inbox below the intake consumer's floor and the dispatch
// stream below each pool consumer's. A consumer that fails is tried again
// at the next trim; the errors are joined.
func (t *trimmer) trim(ctx context.Context) error {
	var errs []error
	if c, err := t.js.Consumer(ctx, t.names.InboxStream(), protocol.ConsumerEngine); err != nil {
		errs = append(errs, fmt.Errorf("trim %s: %w", t.names.InboxStream(), err))
	} else if err := t.below(ctx, c.CachedInfo(), ""); err != nil {
		errs = append(errs, err)
	}
	s, err := t.js.Stream(ctx, t.names.DispatchStream())
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("trim %s: %w", t.names.DispatchStream(), err))...)
	}
	list := s.ListConsumers(ctx)
	for info := range list.Info() {
		if strings.HasPrefix(info.Name, protocol.PoolConsumerPrefix) && info.Config.FilterSubject != "" {
			if err := t.below(ctx, info, info.Config.FilterSubject); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := list.Err(); err != nil {
		errs = append(errs, fmt.Errorf("trim %s: list the pool consumers: %w", t.names.DispatchStream(), err))
	}
	return errors.Join(errs...)
}

// below removes the consumer's stream's messages at or below its
// acknowledgement floor, of the filter subject ("": all), every one of
// them acknowledged.
func (t *trimmer) below(ctx context.Context, info *jetstream.ConsumerInfo, filter string) error {
	key := info.Stream + "/" + info.Name
	floor := info.AckFloor.Stream
	// Not while the consumer may have redeliveries queued for nobody (a
	// negative acknowledgement or an expired ack wait, with no pull request
	// waiting): JetStream's purge drops a consumer's queued redeliveries,
	// which then wait out their ack wait again. A floor below the last one
	// trimmed to is a stream made again.
	if floor == t.floors[key] || (info.NumAckPending > 0 && info.NumWaiting == 0) {
		return nil
	}
	s, err := t.js.Stream(ctx, info.Stream)
	if err != nil {
		return fmt.Errorf("trim %s below consumer %s's floor: %w", info.Stream, info.Name, err)
	}
	// Everything below the sequence goes (JetStream holds the stream's
	// lock for the purge, so no message is stored in between).
	opts := []jetstream.StreamPurgeOpt{jetstream.WithPurgeSequence(floor + 1)}
	if filter != "" {
		opts = append(opts, jetstream.WithPurgeSubject(filter))
	}
	if err := s.Purge(ctx, opts...); err != nil {
		return fmt.Errorf("trim %s below consumer %s's floor: %w", info.Stream, info.Name, err)
	}
	t.floors[key] = floor
	return nil
}

// runTrims trims every TrimEvery until ctx is done.
func (e *Engine) runTrims(ctx context.Context) {
	t := e.newTrimmer()
	e.every(ctx, e.cfg.TrimEvery, "trimming acknowledged messages", t.trim)
}

// every calls fn every period until ctx is done, each call bounded by the
// period; a failure is logged with what, and the next period tries again.
func (e *Engine) every(ctx context.Context, period time.Duration, what string, fn func(context.Context) error) {
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		tctx, cancel := context.WithTimeout(ctx, period)
		if err := fn(tctx); err != nil && ctx.Err() == nil {
			e.log.Warn().Err(err).Msg(what)
		}
		cancel()
	}
}
