package events

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// Code is a protocol refusal code, carried on .rejected (submissions) and
// .refused (resume and control) messages. Codes are part of the protocol.
type Code string

// Refusal codes of a submission.
const (
	CodeUndecodable      Code = "undecodable"
	CodeInvalidID        Code = "invalid_id"
	CodeLimitExceeded    Code = "limit_exceeded"
	CodeDuplicateCallID  Code = "duplicate_call_id"
	CodeForbiddenField   Code = "forbidden_field"
	CodeStepNotAfterLast Code = "step_not_after_last"
	CodeBatchOpen        Code = "batch_open"
	CodeRunEnded         Code = "run_ended"
	// CodeThrottled: the submitting client is over its limit of runs in
	// flight or of submissions per second; nothing was recorded.
	CodeThrottled Code = "throttled"
)

// Refusal codes of a resume or control message (they also use undecodable,
// forbidden_field, invalid_id and limit_exceeded).
const (
	CodeUnknownCorrelation Code = "unknown_correlation"
	CodeWrongRun           Code = "wrong_run"
	CodeWrongThread        Code = "wrong_thread"
	CodeWrongSnapshot      Code = "wrong_snapshot"
	CodeWrongCall          Code = "wrong_call"
	CodeWrongResultKind    Code = "wrong_result_kind"
	CodeNotAwaiting        Code = "not_awaiting"
	CodeExpired            Code = "expired"
)

// Refusal is a domain refusal: the input was well understood and is not
// acceptable. It changes nothing. Compare with errors.Is against a Refusal
// of the same Code (the reason is ignored).
type Refusal struct {
	Code   Code
	Reason string
}

// Error implements error.
func (r *Refusal) Error() string {
	if r.Reason == "" {
		return string(r.Code)
	}
	return string(r.Code) + ": " + r.Reason
}

// Is reports whether target is a Refusal with the same code.
func (r *Refusal) Is(target error) bool {
	t, ok := target.(*Refusal)
	return ok && t.Code == r.Code
}

// Refuse returns a Refusal with a formatted reason.
func Refuse(code Code, format string, args ...any) *Refusal {
	return &Refusal{Code: code, Reason: fmt.Sprintf(format, args...)}
}

// CodeOf returns the refusal code of err, if it is or wraps a Refusal.
func CodeOf(err error) (Code, bool) {
	var r *Refusal
	if errors.As(err, &r) {
		return r.Code, true
	}
	return "", false
}

func undecodablef(format string, args ...any) *Refusal {
	return Refuse(CodeUndecodable, format, args...)
}

// Generic value readers for strict decoding. Paths name the offending field
// in every error, so a client sees exactly what to fix.

func object(v any, path string) (map[string]any, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return nil, undecodablef("%s: want an object, got %s", path, kindOf(v))
	}
	return m, nil
}

// only refuses keys outside allowed as forbidden_field.
func only(m map[string]any, path string, allowed ...string) error {
	var extra []string
	for k := range m {
		ok := false
		for _, a := range allowed {
			if k == a {
				ok = true
				break
			}
		}
		if !ok {
			extra = append(extra, k)
		}
	}
	if len(extra) == 0 {
		return nil
	}
	sort.Strings(extra)
	return Refuse(CodeForbiddenField, "%s: unknown field %s (allowed: %s)", path, quoteAll(extra), strings.Join(allowed, ", "))
}

func quoteAll(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = fmt.Sprintf("%q", s)
	}
	return strings.Join(q, ", ")
}

func str(m map[string]any, key, path string, required bool) (string, error) {
	v, ok := m[key]
	if !ok || v == nil {
		if required {
			return "", undecodablef("%s.%s: missing", path, key)
		}
		return "", nil
	}
	s, ok := v.(string)
	if !ok {
		return "", undecodablef("%s.%s: want a string, got %s", path, key, kindOf(v))
	}
	return s, nil
}

func boolean(m map[string]any, key, path string) (bool, error) {
	v, ok := m[key]
	if !ok || v == nil {
		return false, nil
	}
	b, ok := v.(bool)
	if !ok {
		return false, undecodablef("%s.%s: want a boolean, got %s", path, key, kindOf(v))
	}
	return b, nil
}

func integer(m map[string]any, key, path string, required bool) (int64, error) {
	v, ok := m[key]
	if !ok || v == nil {
		if required {
			return 0, undecodablef("%s.%s: missing", path, key)
		}
		return 0, nil
	}
	switch n := v.(type) {
	case int64:
		return n, nil
	case uint64:
		return 0, undecodablef("%s.%s: %d is out of range", path, key, n)
	default:
		return 0, undecodablef("%s.%s: want an integer, got %s", path, key, kindOf(v))
	}
}

func kindOf(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case int64, uint64, float64:
		return "a number"
	case string:
		return "a string"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	default:
		return fmt.Sprintf("%T", v)
	}
}
