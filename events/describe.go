package events

import (
	"fmt"
	"strings"
	"time"
)

// Describe returns a one-line, human-readable summary of an event, for
// scenario scripts, logs and replay's tables. It is stable: tests compare it.
func Describe(e Event) string {
	switch ev := e.(type) {
	case *BatchSubmitted:
		calls := make([]string, len(ev.Calls))
		for i, c := range ev.Calls {
			calls[i] = fmt.Sprintf("%s:%s(%s,%s/%d)", c.CallID, c.ToolID, c.Tool.Kind, c.Tool.Policy.Mode, c.Tool.Policy.MaxAttempts)
		}
		return fmt.Sprintf("BatchSubmitted %s calls=[%s] snapshot=%s", ev.BatchID, strings.Join(calls, " "), ev.SnapshotID)
	case *BatchRejected:
		return fmt.Sprintf("BatchRejected %s %s: %s", orDash(ev.BatchID), ev.Code, ev.Reason)
	case *CallGated:
		s := fmt.Sprintf("CallGated %s %s stage=%s", ev.CallID, ev.Label, ev.Stage)
		if ev.Rule != "" {
			s += " rule=" + ev.Rule
		}
		return s
	case *CallExecuting:
		s := fmt.Sprintf("CallExecuting %s attempt=%d cause=%s cap=%s", ev.CallID, ev.Attempt, ev.Cause, ev.Capability)
		if ev.Parallel {
			s += " parallel"
		}
		return s
	case *CallClaimed:
		s := fmt.Sprintf("CallClaimed %s attempt=%d worker=%s token=%s", ev.CallID, ev.Attempt, ev.WorkerID, ev.ClaimToken)
		if ev.Incarnation != "" {
			s += " process=" + ev.Incarnation
		}
		return s
	case *CallCompleted:
		return fmt.Sprintf("CallCompleted %s attempt=%d %s", ev.CallID, ev.Attempt, DescribeOutput(ev.Output))
	case *CallIndeterminate:
		return fmt.Sprintf("CallIndeterminate %s attempt=%d %q", ev.CallID, ev.Attempt, ev.Reason)
	case *CallAwaiting:
		t := ev.Ticket
		s := fmt.Sprintf("CallAwaiting %s ticket=%s %s", ev.CallID, t.CorrelationID, t.Reason)
		if t.Deadline != nil {
			s += " deadline=" + t.Deadline.UTC().Format(time.RFC3339)
		}
		if t.Due != nil {
			s += " due=" + t.Due.UTC().Format(time.RFC3339)
		}
		return s
	case *TicketResolved:
		s := fmt.Sprintf("TicketResolved %s ticket=%s %s", ev.CallID, ev.CorrelationID, ev.Resolution)
		if ev.Principal != "" {
			s += " by=" + ev.Principal
		}
		if ev.Note != "" {
			s += fmt.Sprintf(" note=%q", ev.Note)
		}
		return s
	case *ResultRefused:
		return fmt.Sprintf("ResultRefused %s attempt=%d %s", ev.CallID, ev.Attempt, ev.Reason)
	case *BatchFinalized:
		rs := make([]string, len(ev.Results))
		for i, b := range ev.Results {
			rs[i] = b.ToolUseID + "=" + DescribeOutput(Output{Content: b.Content, IsError: b.IsError})
		}
		s := fmt.Sprintf("BatchFinalized %s results=[%s]", ev.BatchID, strings.Join(rs, " "))
		if len(ev.State) > 0 {
			cs := make([]string, len(ev.State))
			for i, c := range ev.State {
				cs[i] = DescribeCommand(c)
			}
			s += " state=[" + strings.Join(cs, " ") + "]"
		}
		if ev.Conflict != "" {
			s += fmt.Sprintf(" conflict=%q", ev.Conflict)
		}
		return s
	case *RunEnded:
		s := "RunEnded " + string(ev.Cause)
		if ev.Reason != "" {
			s += fmt.Sprintf(" %q", ev.Reason)
		}
		return s
	default:
		return fmt.Sprintf("%T", e)
	}
}

// DescribeOutput summarizes an output as ok or error with its text.
func DescribeOutput(o Output) string {
	kind := "ok"
	if o.IsError {
		kind = "error"
	}
	text := o.Text()
	for _, c := range o.Content {
		if c.Type != BlockText {
			text += "[" + string(c.Type) + "]"
		}
	}
	return fmt.Sprintf("%s %q", kind, text)
}

// DescribeCommand summarizes a staged state command.
func DescribeCommand(c Command) string {
	s := fmt.Sprintf("%s:%s %s/%s", c.Scope, c.Key, c.Action, c.Merge)
	if c.Action == ActionSet {
		s += "=" + string(c.Value)
	}
	return s
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
