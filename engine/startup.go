package engine

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/protocol"
)

// Start-up on a cluster: a stream, bucket or consumer created while the
// cluster forms, elects its meta leader or places a new replicated stream
// (several engines creating the same one at once, say) fails for a while
// with answers that only mean "not yet". The engine waits those out, with
// a backoff, and says in one line what it waits for; any other error (a
// configuration the server refuses, a permission) ends the start-up.

// transientCodes are the JetStream errors that pass: no suitable peers
// for placement yet (10005), the system temporarily unavailable (10008),
// incomplete results (10004), a request the cluster cannot handle yet
// (10009), a stream or consumer offline (10118, 10119, 10194, 10195), and
// a name already in use by a concurrent creation (10058, 10148: the next
// try updates it), and, for a publish, a duplicate still in process
// (10158) or an expected sequence temporarily unavailable (10163).
var transientCodes = []jetstream.ErrorCode{10005, 10008, 10004, 10009, 10118, 10119, 10194, 10195, 10058, 10148, 10158, 10163}

// transient reports whether a start-up step's error may pass by itself.
func transient(err error) bool {
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range joined.Unwrap() {
			if !transient(e) {
				return false
			}
		}
		return true
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return slices.Contains(transientCodes, apiErr.ErrorCode)
	}
	// Not an answer of JetStream's: a timeout, no responders (JetStream
	// not up yet), a connection being re-established.
	return true
}

// setupAttempt bounds one try of a start-up step.
const setupAttempt = 3 * time.Second

// untilDone runs a start-up step until it succeeds, fails for good, or
// ctx ends.
func (e *Engine) untilDone(ctx context.Context, what string, step func(context.Context) error) error {
	var said string
	for backoff := 100 * time.Millisecond; ; backoff = min(2*backoff, 2*time.Second) {
		actx, cancel := context.WithTimeout(ctx, setupAttempt)
		err := step(actx)
		cancel()
		if err == nil {
			if said != "" {
				e.log.Info().Str("step", what).Msg("JetStream answered: going on")
			}
			return nil
		}
		if ctx.Err() != nil || !transient(err) {
			return err
		}
		if msg := strings.ReplaceAll(err.Error(), "\n", "; "); msg != said {
			e.log.Warn().Str("step", what).Str("error", msg).Str(protocol.FieldMeaning, protocol.Meaning(err)).Msg("waiting for JetStream to " + what)
			said = msg
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(backoff):
		}
	}
}
