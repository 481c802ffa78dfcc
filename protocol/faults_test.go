package protocol

import (
	"context"
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
