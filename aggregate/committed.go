package aggregate

import (
	"maps"

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

// Stamp is a place in the events stream's order: a commit's stream
// sequence, then an index in what the commit carries or derives (a
// command of the state it finalizes; an out message the projection
// derives from it).
type Stamp struct {
	Seq uint64
	Idx int
}

// After reports whether a comes after b.
func (a Stamp) After(b Stamp) bool { return a.Seq > b.Seq || (a.Seq == b.Seq && a.Idx > b.Idx) }

// StateEntry is one key of the committed state with what makes its
// commands apply in any order, and any number of times, to the value their
// application in stream order gives: the stamp of the command that last
// replaced the value whole (a set other than an object merge, a remove),
// and, for each field an object merge wrote since, that merge's stamp.
// Each field is then the latest write of it, as in the stream's order,
// and a command older than the last replacement changes nothing.
type StateEntry struct {
	Value    events.RawJSON   // nil: absent (never set, or removed)
	Replaced Stamp            // the last whole replacement (zero: none known)
	Merged   Stamp            // the latest object merge after Replaced (zero: none)
	Fields   map[string]Stamp // each field's latest object merge after Replaced
}

// Apply returns the entry with the command stamped at applied, and
// whether it changed. The result is the same whatever the order in which
// a key's commands are applied, and applying one again changes nothing:
// it equals MergeState of the commands in stamp order.
func (e StateEntry) Apply(c events.Command, at Stamp) (StateEntry, bool, error) {
	if !at.After(e.Replaced) {
		return e, false, nil // replaced by a later command, or this one again
	}
	if c.Action == events.ActionSet && c.Merge == events.MergeCommutative {
		nv, err := c.Value.Value()
		if err != nil {
			return e, false, err
		}
		if obj, ok := nv.(map[string]any); ok {
			return e.merge(obj, at)
		}
	}
	// A whole replacement: a later object merge's fields stay on it.
	next := StateEntry{Replaced: at}
	if c.Action == events.ActionSet {
		next.Value = c.Value
		if len(next.Value) == 0 {
			next.Value = events.RawJSON("null")
		}
	}
	if !e.Merged.After(at) {
		return next, true, nil
	}
	cur, err := e.object()
	if err != nil {
		return e, false, err
	}
	out := map[string]any{}
	if base, err := next.object(); err != nil {
		return e, false, err
	} else if base != nil {
		out = base
	}
	next.Merged, next.Fields = e.Merged, map[string]Stamp{}
	for f, s := range e.Fields {
		if s.After(at) {
			out[f], next.Fields[f] = cur[f], s
		}
	}
	if next.Value, err = events.ValueJSON(out); err != nil {
		return e, false, err
	}
	return next, true, nil
}

// merge writes an object merge's fields, each unless a later merge wrote
// it. Onto an absent or non-object value the object replaces it, as
// MergeState does; such a value has no merged fields.
func (e StateEntry) merge(obj map[string]any, at Stamp) (StateEntry, bool, error) {
	cur, err := e.object()
	if err != nil {
		return e, false, err
	}
	if cur == nil {
		cur = map[string]any{}
	}
	next := StateEntry{Replaced: e.Replaced, Merged: e.Merged, Fields: make(map[string]Stamp, len(e.Fields)+len(obj))}
	maps.Copy(next.Fields, e.Fields)
	changed := at.After(next.Merged)
	if changed {
		next.Merged = at
	}
	for f, v := range obj {
		if at.After(next.Fields[f]) {
			cur[f], next.Fields[f], changed = v, at, true
		}
	}
	if !changed {
		return e, false, nil // this merge again
	}
	if next.Value, err = events.ValueJSON(cur); err != nil {
		return e, false, err
	}
	return next, true, nil
}

// object decodes the value when it is an object (nil when it is absent or
// not an object).
func (e StateEntry) object() (map[string]any, error) {
	if len(e.Value) == 0 {
		return nil, nil
	}
	v, err := e.Value.Value()
	if err != nil {
		return nil, err
	}
	m, _ := v.(map[string]any)
	return m, nil
}
