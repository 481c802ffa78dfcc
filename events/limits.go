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
	DefaultMaxSubmitBytes   = 4 << 20   // one submission as it arrived
	DefaultMaxBlockBytes    = 1 << 20   // one content block of the assistant message
)

// Limits bound what a submission, resume or result may carry. Every limit
// must be positive; there is no "unlimited".
type Limits struct {
	MaxCalls         int // tool_use blocks per batch
	MaxArgumentBytes int // bytes of one call's arguments
	MaxOutputBytes   int // bytes of one call's output
	MaxSubmitBytes   int // bytes of one submission, as it arrived
	MaxBlockBytes    int // bytes of one content block of a submission (ContentBlock.Bytes)
}

// DefaultLimits returns the default limits.
func DefaultLimits() Limits {
	return Limits{MaxCalls: DefaultMaxCalls, MaxArgumentBytes: DefaultMaxArgumentBytes, MaxOutputBytes: DefaultMaxOutputBytes,
		MaxSubmitBytes: DefaultMaxSubmitBytes, MaxBlockBytes: DefaultMaxBlockBytes}
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
	if l.MaxSubmitBytes <= 0 {
		errs = append(errs, fmt.Errorf("max submit bytes %d must be positive", l.MaxSubmitBytes))
	}
	if l.MaxBlockBytes <= 0 {
		errs = append(errs, fmt.Errorf("max block bytes %d must be positive", l.MaxBlockBytes))
	}
	return errors.Join(errs...)
}
