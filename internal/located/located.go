// Package located formats and orders the problems of a configuration file
// (the catalog, a worker config): each names its file, its line, the part
// of the document it is about, and what is wrong.
package located

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// Format returns "path:line: where: msg", leaving out what is not known
// (an empty path or where, a line of 0).
func Format(path string, line int, where, msg string) string {
	var b strings.Builder
	switch {
	case path != "" && line > 0:
		fmt.Fprintf(&b, "%s:%d: ", path, line)
	case path != "":
		b.WriteString(path + ": ")
	case line > 0:
		fmt.Fprintf(&b, "line %d: ", line)
	}
	if where != "" {
		b.WriteString(where + ": ")
	}
	b.WriteString(msg)
	return b.String()
}

// Join orders problems by line (those without one, line 0, last, in the
// order found) and joins them with errors.Join; nil when there are none.
func Join[P error](ps []P, line func(P) int) error {
	if len(ps) == 0 {
		return nil
	}
	sort.SliceStable(ps, func(i, j int) bool {
		li, lj := line(ps[i]), line(ps[j])
		if li == 0 || lj == 0 {
			return li != 0 && lj == 0
		}
		return li < lj
	})
	errs := make([]error, len(ps))
	for i, p := range ps {
		errs[i] = p
	}
	return errors.Join(errs...)
}

// ToolWhere names the i-th tool of a document, with its id when it has
// one: tools[2] (id "rm").
func ToolWhere(i int, id string) string {
	if id == "" {
		return fmt.Sprintf("tools[%d]", i)
	}
	return fmt.Sprintf("tools[%d] (id %q)", i, id)
}
