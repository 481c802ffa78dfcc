package catalog

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/toolbatch/toolbatch/internal/located"
)

// ErrInvalid is matched (errors.Is) by every problem of a catalog that does
// not parse or validate.
var ErrInvalid = errors.New("catalog: invalid catalog")

// ProblemError is one problem of a catalog, and where it is. Parse, Load and
// Config.Validate report every problem, joined with errors.Join.
type ProblemError struct {
	// Path is the catalog file (set by Load), or empty.
	Path string
	// Line is the 1-based line of the problem in the file, or 0 when it is
	// not known (or the configuration did not come from a file).
	Line int
	// Where names the part of the catalog: `tools[2] (id "rm")`,
	// `gate.rules[1]`, `gate.external`; empty for the document as a whole.
	Where string
	// Msg says what is wrong, starting with the field: `target "cloud" is
	// not brain or sandbox`.
	Msg string
}

// Error returns "path:line: where: msg", leaving out what is not known.
func (e *ProblemError) Error() string { return located.Format(e.Path, e.Line, e.Where, e.Msg) }

// Unwrap returns ErrInvalid.
func (e *ProblemError) Unwrap() error { return ErrInvalid }

// joinProblems orders the problems by line (those without a line last, in
// the order found) and joins them; nil when there are none.
func joinProblems(ps []*ProblemError) error {
	return located.Join(ps, func(p *ProblemError) int { return p.Line })
}

// entry is one located node of the document: a mapping key with its value,
// or a sequence item.
type entry struct {
	path              string // tools[2].recovery.mode
	key               string // the mapping key; empty for a sequence item
	value             string // the value of a scalar
	collection        bool   // the value (or the item) is a list or a mapping
	keyLine, keyCol   int
	nodeLine, nodeCol int // the value (or the item)
}

// index maps the document's nodes to their paths, so that problems can name
// both the place in the catalog and the line. A nil index (a Config built in
// Go) knows no lines.
type index struct {
	entries []entry
	byPath  map[string]int  // path -> entries index
	bad     map[string]bool // paths whose value did not decode
}

func newIndex(doc *yaml.Node) *index {
	x := &index{byPath: map[string]int{}, bad: map[string]bool{}}
	if doc == nil {
		return x
	}
	root := doc
	if root.Kind == yaml.DocumentNode && len(root.Content) > 0 {
		root = root.Content[0]
	}
	x.walk(root, "")
	return x
}

func (x *index) add(e entry) {
	if _, dup := x.byPath[e.path]; !dup {
		x.byPath[e.path] = len(x.entries)
	}
	x.entries = append(x.entries, e)
}

// walk records the nodes under n. It does not follow aliases: an alias may
// point at a node that holds it, and its nodes are recorded where they are
// written.
func (x *index) walk(n *yaml.Node, path string) {
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := k.Value
			if path != "" {
				p = path + "." + k.Value
			}
			x.add(entry{path: p, key: k.Value, value: scalar(v), collection: isCollection(v), keyLine: k.Line, keyCol: k.Column, nodeLine: v.Line, nodeCol: v.Column})
			x.walk(v, p)
		}
	case yaml.SequenceNode:
		for i, v := range n.Content {
			p := path + "[" + strconv.Itoa(i) + "]"
			x.add(entry{path: p, value: scalar(v), collection: isCollection(v), nodeLine: v.Line, nodeCol: v.Column})
			x.walk(v, p)
		}
	}
}

// scalar returns the value of a scalar node, or "".
func scalar(n *yaml.Node) string {
	if n.Kind == yaml.ScalarNode {
		return n.Value
	}
	return ""
}

// isCollection reports whether a node is a list or a mapping.
func isCollection(n *yaml.Node) bool {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n.Kind == yaml.SequenceNode || n.Kind == yaml.MappingNode
}

// line returns the line of the node at path (its key's line for a mapping
// key), or of the nearest enclosing node that is known; 0 when none is.
func (x *index) line(path string) int {
	for path != "" {
		if i, ok := x.byPath[path]; ok {
			e := x.entries[i]
			if e.key != "" {
				return e.keyLine
			}
			return e.nodeLine
		}
		path = parentPath(path)
	}
	return 0
}

// undecoded reports whether the value at path, or one that holds it, did
// not decode.
func (x *index) undecoded(path string) bool {
	for ; path != ""; path = parentPath(path) {
		if x.bad[path] {
			return true
		}
	}
	return false
}

// parentPath drops the last element of a path: a.b[2] -> a.b -> a -> "".
func parentPath(p string) string {
	i := strings.LastIndexAny(p, ".[")
	if i < 0 {
		return ""
	}
	return p[:i]
}

// query describes the node a decode error is about.
type query struct {
	line, col  int    // col 0: not known
	key        string // a mapping key (unknown or repeated key)
	value      string // a scalar as the decoder quotes it: cut to 7 bytes and "..." when longer than 10
	collection bool   // the node is a list or a mapping
}

// matchesValue reports whether a scalar is the one the decoder quoted.
func (q query) matchesValue(v string) bool {
	if cut, ok := strings.CutSuffix(q.value, "..."); ok && len(v) > 10 {
		return strings.HasPrefix(v, cut)
	}
	return v == q.value
}

// locate finds the path of the node a decode error is about. When several
// nodes of one line could still be meant, it returns their common parent.
func (x *index) locate(q query) string {
	var cands []string
	for _, e := range x.entries {
		switch {
		case q.key != "":
			if e.key == q.key && e.keyLine == q.line {
				return e.path
			}
		case q.col > 0:
			if e.nodeLine == q.line && e.nodeCol == q.col {
				cands = append(cands, e.path)
			}
		case e.nodeLine == q.line:
			switch {
			case q.collection && e.collection,
				!q.collection && q.value != "" && !e.collection && q.matchesValue(e.value):
				cands = append(cands, e.path)
			}
		}
	}
	if len(cands) == 0 {
		return ""
	}
	// The deepest candidates; when more than one, their common parent.
	depth := func(p string) int { return strings.Count(p, ".") + strings.Count(p, "[") }
	best := 0
	for _, c := range cands {
		best = max(best, depth(c))
	}
	var deepest []string
	for _, c := range cands {
		if depth(c) == best {
			deepest = append(deepest, c)
		}
	}
	if len(deepest) == 1 {
		return deepest[0]
	}
	p := deepest[0]
	for _, c := range deepest[1:] {
		for p != "" && c != p && !strings.HasPrefix(c, p+".") && !strings.HasPrefix(c, p+"[") {
			p = parentPath(p)
		}
	}
	return p
}

var (
	reToolPath = regexp.MustCompile(`^tools\[(\d+)\](?:\.(.*))?$`)
	reRulePath = regexp.MustCompile(`^gate\.rules\[(\d+)\](?:\.(.*))?$`)
	reExtPath  = regexp.MustCompile(`^gate\.external(?:\.(.*))?$`)
)

// split turns a path into the part of the catalog it belongs to (a tool, a
// rule, the external gate) and the field inside it.
func split(path string, cfg *Config) (where, field string) {
	if m := reToolPath.FindStringSubmatch(path); m != nil {
		i, _ := strconv.Atoi(m[1])
		id := ""
		if cfg != nil && i < len(cfg.Tools) {
			id = cfg.Tools[i].ID
		}
		return located.ToolWhere(i, id), m[2]
	}
	if m := reRulePath.FindStringSubmatch(path); m != nil {
		return "gate.rules[" + m[1] + "]", m[2]
	}
	if m := reExtPath.FindStringSubmatch(path); m != nil {
		return "gate.external", m[1]
	}
	return "", path
}

var (
	reDupKey = regexp.MustCompile(`^mapping key "(.*)" already defined at line (\d+)$`)
)

// yamlProblems turns the decoder's errors into problems that name the place
// in the catalog, in the words of the file rather than of the Go types.
func yamlProblems(err error, x *index, cfg *Config) []*ProblemError {
	msgs, typed := located.Messages(err)
	out := make([]*ProblemError, 0, len(msgs))
	for _, msg := range msgs {
		if msg.Line == 0 {
			out = append(out, &ProblemError{Msg: msg.Text})
			continue
		}
		line, text := msg.Line, msg.Text
		q := query{line: line, col: msg.Col}
		tag := ""
		unknown, isUnknown := located.UnknownKey(text)
		switch {
		case isUnknown:
			q.key = unknown
			text = fmt.Sprintf("unknown key %q", q.key)
		case reDupKey.MatchString(text):
			d := reDupKey.FindStringSubmatch(text)
			q.key = d[1]
			text = fmt.Sprintf("key %q is written twice (first at line %s)", q.key, d[2])
		case located.IsMismatch(text):
			text, tag, q.value, _ = located.Mismatch(text)
			q.collection = tag == "!!seq" || tag == "!!map"
		}
		p := &ProblemError{Line: line, Msg: text}
		if !typed {
			// A syntax error: the document could not be read at all.
			out = append(out, p)
			continue
		}
		path := x.locate(q)
		if i, ok := x.byPath[path]; ok && tag != "" && !q.collection {
			// Quote the whole value, not the decoder's cut.
			text = strings.Replace(text, located.TagWords(tag, q.value), located.TagWords(tag, x.entries[i].value), 1)
		}
		if q.key != "" {
			// The key belongs to the mapping that holds it.
			path = parentPath(path)
		}
		if tag != "" || q.col > 0 {
			// The value stayed zero: validation must not also call it
			// missing.
			x.bad[path] = true
		}
		p.Msg = text
		where, field := split(path, cfg)
		p.Where = where
		if field != "" {
			p.Msg = field + ": " + text
		}
		out = append(out, p)
	}
	return out
}
