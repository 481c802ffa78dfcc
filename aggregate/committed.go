package aggregate

import (
	"github.com/toolbatch/toolbatch/events"
)

// StateKey returns the key of a staged command in the committed state:
// run.<run_id>.<key>, thread.<thread_id>.<key> or shared.<key>.
func StateKey(c events.Command, runID, threadID string) string {
	switch c.Scope {
	case events.ScopeRun:
		return "run." + runID + "." + c.Key
	case events.ScopeThread:
		return "thread." + threadID + "." + c.Key
	default:
		return "shared." + c.Key
	}
}

// MergeState applies a finalized batch's staged commands, in order, to the
// committed state and returns the new state (the input is not changed).
// disjoint and exclusive sets replace the value; a commutative set
// shallow-merges into an object when both values are objects, and replaces
// otherwise; remove deletes the key.
func MergeState(state map[string]events.RawJSON, runID, threadID string, cmds []events.Command) (map[string]events.RawJSON, error) {
	out := make(map[string]events.RawJSON, len(state)+len(cmds))
	for k, v := range state {
		out[k] = v
	}
	for _, c := range cmds {
		k := StateKey(c, runID, threadID)
		if c.Action == events.ActionRemove {
			delete(out, k)
			continue
		}
		old, ok := out[k]
		if c.Merge != events.MergeCommutative || !ok {
			out[k] = c.Value
			continue
		}
		merged, err := shallowMerge(old, c.Value)
		if err != nil {
			return nil, err
		}
		out[k] = merged
	}
	return out, nil
}

func shallowMerge(old, next events.RawJSON) (events.RawJSON, error) {
	ov, err := old.Value()
	if err != nil {
		return nil, err
	}
	nv, err := next.Value()
	if err != nil {
		return nil, err
	}
	om, ok1 := ov.(map[string]any)
	nm, ok2 := nv.(map[string]any)
	if !ok1 || !ok2 {
		return next, nil
	}
	for k, v := range nm {
		om[k] = v
	}
	return events.ValueJSON(om)
}
