package engine

import (
	"context"
	"errors"
	"fmt"
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
// engine removes what the consumers have acknowledged: a stream's
// messages below its consumer's acknowledgement floor, a pool consumer's
// by its filter subject. What no consumer has taken stays, as on a work
// queue (a dispatch for a tool the catalog no longer has, say).

// trimTarget is a consumer whose acknowledged messages are trimmed:
// filter is "" for the whole stream (the inbox), or the consumer's filter
// subject.
type trimTarget struct {
	stream, consumer, filter string
}

// trimmer trims the targets; floors remembers the floor each was trimmed
// to, so that an idle deployment makes no purge requests.
type trimmer struct {
	js      jetstream.JetStream
	targets []trimTarget
	floors  map[trimTarget]uint64
}

// newTrimmer returns the trimmer of the intake consumer and of every pool
// consumer of the catalog (those ensurePoolConsumers creates).
func (e *Engine) newTrimmer() *trimmer {
	t := &trimmer{js: e.js, floors: map[trimTarget]uint64{},
		targets: []trimTarget{{stream: e.names.InboxStream(), consumer: protocol.ConsumerEngine}}}
	for pool, tools := range e.cfg.Catalog.PoolTools() {
		for _, tool := range tools {
			t.targets = append(t.targets, trimTarget{stream: e.names.DispatchStream(),
				consumer: protocol.PoolConsumer(pool, tool), filter: e.names.Dispatch(pool, tool)})
		}
	}
	return t
}

// trim removes, for each target, the messages at or below its consumer's
// acknowledgement floor (every one of them acknowledged). A target that
// fails is tried again at the next trim; the errors are joined.
func (t *trimmer) trim(ctx context.Context) error {
	var errs []error
	for _, tg := range t.targets {
		if err := t.trimOne(ctx, tg); err != nil {
			errs = append(errs, fmt.Errorf("trim %s below consumer %s's floor: %w", tg.stream, tg.consumer, err))
		}
	}
	return errors.Join(errs...)
}

func (t *trimmer) trimOne(ctx context.Context, tg trimTarget) error {
	c, err := t.js.Consumer(ctx, tg.stream, tg.consumer)
	if err != nil {
		return err
	}
	info, err := c.Info(ctx)
	if err != nil {
		return err
	}
	floor := info.AckFloor.Stream
	if floor <= t.floors[tg] {
		return nil
	}
	s, err := t.js.Stream(ctx, tg.stream)
	if err != nil {
		return err
	}
	// Everything below the sequence goes (JetStream holds the stream's
	// lock for the purge, so no message is stored in between).
	opts := []jetstream.StreamPurgeOpt{jetstream.WithPurgeSequence(floor + 1)}
	if tg.filter != "" {
		opts = append(opts, jetstream.WithPurgeSubject(tg.filter))
	}
	if err := s.Purge(ctx, opts...); err != nil {
		return err
	}
	t.floors[tg] = floor
	return nil
}

// runTrims trims every TrimEvery until ctx is done.
func (e *Engine) runTrims(ctx context.Context) {
	t := e.newTrimmer()
	tick := time.NewTicker(e.cfg.TrimEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		tctx, cancel := context.WithTimeout(ctx, e.cfg.TrimEvery)
		if err := t.trim(tctx); err != nil && ctx.Err() == nil {
			e.log.Warn().Err(err).Msg("trimming acknowledged messages")
		}
		cancel()
	}
}
