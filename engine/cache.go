package engine

import (
	"cmp"
	"slices"
)

// trimOldest bounds a cache: when m holds more than max entries, it drops
// the least recently used ones that may go, down to nine tenths of max,
// so that a cache at its bound is not sorted at every insertion.
func trimOldest[K comparable, V any](m map[K]V, max int, used func(V) int64, mayGo func(V) bool) {
	if len(m) <= max {
		return
	}
	type entry struct {
		key  K
		used int64
	}
	var idle []entry
	for k, v := range m {
		if mayGo(v) {
			idle = append(idle, entry{k, used(v)})
		}
	}
	slices.SortFunc(idle, func(a, b entry) int { return cmp.Compare(a.used, b.used) })
	for _, e := range idle[:min(len(idle), len(m)-max*9/10)] {
		delete(m, e.key)
	}
}
