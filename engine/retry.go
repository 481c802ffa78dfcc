package engine

import (
	"context"
	"strings"
	"time"

	"github.com/toolbatch/toolbatch/protocol"
)

// Retries through a server's passing failure. A leader election, a server
// lost or paused, a cluster still forming: requests then go unanswered, or
// are answered "not yet", for seconds. The engine tries such a request
// again, each try bounded so that the next one reaches the new leader soon
// after the election ends, for as long as the operation may take (a
// commit's, a dispatch's deadline, the engine's start-up). Which errors
// pass is protocol.Passing's to say; a definite answer ends the retries.

// retrying calls f, each try bounded by try, again (after a backoff) while
// it fails for a passing reason and ctx lasts. failed, when not nil, hears
// each failure that is tried again.
func retrying[T any](ctx context.Context, try time.Duration, f func(context.Context) (T, error), failed func(error)) (T, error) {
	for backoff := 50 * time.Millisecond; ; backoff = min(2*backoff, time.Second) {
		tctx, cancel := context.WithTimeout(ctx, try)
		v, err := f(tctx)
		cancel()
		if err == nil || ctx.Err() != nil || !protocol.Passing(err) {
			return v, err
		}
		if failed != nil {
			failed(err)
		}
		select {
		case <-ctx.Done():
			return v, err
		case <-time.After(backoff):
		}
	}
}

// Start-up on a cluster: a stream, bucket or consumer created while the
// cluster forms, elects its meta leader or places a new replicated stream
// (several engines creating the same one at once, say) fails for a while
// with answers that only mean "not yet". The engine waits those out and
// says in one line what it waits for; any other error (a configuration the
// server refuses, a permission) ends the start-up.

// setupAttempt bounds one try of a start-up step.
const setupAttempt = 3 * time.Second

// untilDone runs a start-up step until it succeeds, fails for good, or
// ctx ends.
func (e *Engine) untilDone(ctx context.Context, what string, step func(context.Context) error) error {
	var said string
	_, err := retrying(ctx, setupAttempt, func(ctx context.Context) (struct{}, error) { return struct{}{}, step(ctx) }, func(err error) {
		if msg := strings.ReplaceAll(err.Error(), "\n", "; "); msg != said {
			e.log.Warn().Str("step", what).Str("error", msg).Str(protocol.FieldMeaning, protocol.Meaning(err)).Msg("waiting for JetStream to " + what)
			said = msg
		}
	})
	if err == nil && said != "" {
		e.log.Info().Str("step", what).Msg("JetStream answered: going on")
	}
	return err
}
