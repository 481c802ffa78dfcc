package events

import (
	"errors"
	"fmt"
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
