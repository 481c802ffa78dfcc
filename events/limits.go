package events

import (
	"errors"
	"fmt"
	"time"
)

// Default input limits.
const (
	DefaultMaxCalls         = 128
	DefaultMaxArgumentBytes = 256 << 10 // per call, as canonical JSON
	DefaultMaxOutputBytes   = 1 << 20   // per call, as canonical JSON
)

// Limits bound what a submission, resume or result may carry. Every limit
// must be positive; there is no "unlimited".
type Limits struct {
	MaxCalls         int // tool_use blocks per batch
	MaxArgumentBytes int // bytes of one call's arguments
	MaxOutputBytes   int // bytes of one call's output
}

// DefaultLimits returns the default limits.
func DefaultLimits() Limits {
	return Limits{MaxCalls: DefaultMaxCalls, MaxArgumentBytes: DefaultMaxArgumentBytes, MaxOutputBytes: DefaultMaxOutputBytes}
}

// Validate reports every limit that is not positive.
func (l Limits) Validate() error {
	var errs []error
	if l.MaxCalls <= 0 {
		errs = append(errs, fmt.Errorf("max calls %d must be positive", l.MaxCalls))
	}
	if l.MaxArgumentBytes <= 0 {
		errs = append(errs, fmt.Errorf("max argument bytes %d must be positive", l.MaxArgumentBytes))
	}
	if l.MaxOutputBytes <= 0 {
		errs = append(errs, fmt.Errorf("max output bytes %d must be positive", l.MaxOutputBytes))
	}
	return errors.Join(errs...)
}

// Out returns the ticket as published on .awaiting.
func (t Ticket) Out() AwaitingOut {
	return AwaitingOut{
		CorrelationID: t.CorrelationID, RunID: t.RunID, ThreadID: t.ThreadID, BatchID: t.BatchID,
		CallID: t.CallID, ToolID: t.ToolID, Arguments: t.Arguments, Reason: t.Reason,
		SnapshotID: t.SnapshotID, Deadline: rfc3339(t.Deadline), Due: rfc3339(t.Due), ActionKind: t.ActionKind,
	}
}

func rfc3339(t *time.Time) string {
	if t == nil {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}
