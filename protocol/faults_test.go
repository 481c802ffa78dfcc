package protocol

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestMeaningOfFaultErrors: each error met under a server fault is
// explained, wrapped or not; an error of another kind gets nothing.
func TestMeaningOfFaultErrors(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{&jetstream.APIError{Code: 503, ErrorCode: 10008}, "electing a leader"},
		{fmt.Errorf("append: %w", &jetstream.APIError{Code: 400, ErrorCode: 10164}), "someone wrote first"},
		{&jetstream.APIError{Code: 400, ErrorCode: 10158}, "never stored twice"},
		{fmt.Errorf("dispatch: %w", jetstream.ErrNoStreamResponse), "no leader"},
		{nats.ErrNoResponders, "nothing serves"},
		{context.DeadlineExceeded, "no answer in time"},
		{fmt.Errorf("x: %w", nats.ErrConnectionReconnecting), "another server"},
	} {
		if got := Meaning(c.err); !strings.Contains(got, c.want) {
			t.Errorf("Meaning(%v) = %q, want it to say %q", c.err, got, c.want)
		}
	}
	if got := Meaning(fmt.Errorf("a catalog error")); got != "" {
		t.Errorf("an unrelated error explained as %q", got)
	}
}

// TestPassingErrors: what passes by itself (a timeout, no suitable peers
// yet, the system temporarily unavailable) is waited out; a refusal of the
// configuration is not, alone or among passing errors; nor a definite
// answer to a request (a wrong last sequence, a message too large for the
// server, a message not found), unless marked NotYet where it is met.
func TestPassingErrors(t *testing.T) {
	refused := &jetstream.APIError{Code: 500, ErrorCode: 10052, Description: "stream configuration update can not cancel deny purge"}
	for _, c := range []struct {
		err  error
		want bool
	}{
		{context.DeadlineExceeded, true},
		{&jetstream.APIError{Code: 400, ErrorCode: 10005, Description: "no suitable peers for placement"}, true},
		{fmt.Errorf("create stream X: %w", &jetstream.APIError{Code: 503, ErrorCode: 10008}), true},
		{refused, false},
		{&jetstream.APIError{Code: 503, ErrorCode: 10039, Description: "jetstream not enabled for account"}, false},
		{errors.Join(context.DeadlineExceeded, fmt.Errorf("bucket: %w", refused)), false},
		{errors.Join(context.DeadlineExceeded, nats.ErrNoResponders), true},
		{&jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamWrongLastSequence}, false},
		{fmt.Errorf("append: %w", nats.ErrMaxPayload), false},
		{jetstream.ErrMsgNotFound, false},
		{fmt.Errorf("bucket W: %w", jetstream.ErrStreamNotFound), false},
		{fmt.Errorf("bucket W: %w", NotYet(jetstream.ErrStreamNotFound)), true},
		{Definite(fmt.Errorf("revoked")), false},
	} {
		if got := Passing(c.err); got != c.want {
			t.Errorf("Passing(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
