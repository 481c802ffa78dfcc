package aggregate

import "github.com/toolbatch/toolbatch/events"

// ChildCancel names a delegated child the outside world must be told to
// cancel: the delegation call's tool, its delegation (operation) id and
// the attempt that started the child.
type ChildCancel struct {
	CallID      string
	ToolID      string
	OperationID string
	Attempt     int
}

// ChildrenToCancel returns the delegated children a commit stopped, given
// the run r after the commit's events evs: every started delegation call
// the commit made terminal because the run ended, and every one whose
// input never came (its ticket expired). They are in the order of the
// commit's events.
func ChildrenToCancel(r *Run, evs []events.Event) []ChildCancel {
	ended := false
	expired := map[string]bool{}
	for _, e := range evs {
		switch ev := e.(type) {
		case *events.RunEnded:
			ended = true
		case *events.TicketResolved:
			if ev.Resolution == events.ResolutionExpired {
				expired[ev.CallID] = true
			}
		}
	}
	b := r.Batch
	if (!ended && len(expired) == 0) || b == nil {
		return nil
	}
	var out []ChildCancel
	for _, e := range evs {
		var callID string
		switch ev := e.(type) {
		case *events.CallIndeterminate:
			callID = ev.CallID
		case *events.CallCompleted:
			callID = ev.CallID
		default:
			continue
		}
		c, _ := b.Call(callID)
		if (ended || expired[callID]) && c != nil && c.Tool.Kind == events.KindDelegation && c.Attempt > 0 {
			out = append(out, ChildCancel{CallID: callID, ToolID: c.ToolID, OperationID: b.OperationID(callID), Attempt: c.Attempt})
		}
	}
	return out
}
