package located

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
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

// ReadFile reads the document at path. Its error starts with the path,
// as the document's problems do, and says what went wrong without the
// operation's name ("catalog.yaml: no such file or directory").
func ReadFile(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return data, nil
}

// Problems returns the problems of type P in err: err itself, or each
// error it joins, that is or wraps a P.
func Problems[P error](err error) []P {
	list := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		list = j.Unwrap()
	}
	var out []P
	for _, e := range list {
		var p P
		if errors.As(e, &p) {
			out = append(out, p)
		}
	}
	return out
}

// ToolWhere names the i-th tool of a document, with its id when it has
// one: tools[2] (id "rm").
func ToolWhere(i int, id string) string {
	if id == "" {
		return fmt.Sprintf("tools[%d]", i)
	}
	return fmt.Sprintf("tools[%d] (id %q)", i, id)
}

// Message is one complaint of the YAML decoder: its line and column (0:
// not known) and what it says, with an unknown key said in the file's
// words ("unknown key \"x\"", not the Go type's field).
type Message struct {
	Line, Col int
	Text      string
}

var (
	reYAMLLine = regexp.MustCompile(`^(?:yaml: )?line (\d+): (?:column (\d+): )?(.*)$`)
	reUnknown  = regexp.MustCompile(`^field (\S+) not found in type \S+$`)
)

// Messages splits a decode error of go.yaml.in/yaml/v3 into its
// complaints; typed is true for a *yaml.TypeError (the document was read,
// some values did not fit), false for a syntax error. A complaint without
// a line has Line 0 and its text without the "yaml: " prefix.
func Messages(err error) (msgs []Message, typed bool) {
	texts := []string{err.Error()}
	var te *yaml.TypeError
	if errors.As(err, &te) {
		texts, typed = te.Errors, true
	}
	for _, t := range texts {
		m := reYAMLLine.FindStringSubmatch(t)
		if m == nil {
			msgs = append(msgs, Message{Text: strings.TrimPrefix(t, "yaml: ")})
			continue
		}
		line, _ := strconv.Atoi(m[1])
		col, _ := strconv.Atoi(m[2])
		msgs = append(msgs, Message{Line: line, Col: col, Text: m[3]})
	}
	return msgs, typed
}

// UnknownKey returns the key a complaint about an unknown field names.
func UnknownKey(text string) (key string, ok bool) {
	if u := reUnknown.FindStringSubmatch(text); u != nil {
		return u[1], true
	}
	return "", false
}

var reUnmarshal = regexp.MustCompile("^cannot unmarshal (!!\\w+)(?: `(.*)`)? into (\\S+)$")

// IsMismatch reports whether a complaint says a value does not fit its
// Go type ("cannot unmarshal !!int `30` into time.Duration").
func IsMismatch(text string) bool { return reUnmarshal.MatchString(text) }

// Mismatch says such a complaint in the file's words ("want a duration
// such as 30s, 10m or 1h, got int 30"), with the value's YAML tag and the
// value as the decoder quoted it (possibly cut).
func Mismatch(text string) (words, tag, value string, ok bool) {
	u := reUnmarshal.FindStringSubmatch(text)
	if u == nil {
		return text, "", "", false
	}
	tag, value = u[1], u[2]
	return fmt.Sprintf("want %s, got %s", goTypeWords(u[3]), TagWords(tag, value)), tag, value, true
}

// goTypeWords says what a Go type expects, in the words of the file.
func goTypeWords(t string) string {
	switch {
	case t == "time.Duration":
		return "a duration such as 30s, 10m or 1h"
	case t == "string" || strings.HasPrefix(t, "events."):
		return "a string"
	case t == "bool":
		return "true or false"
	case strings.HasPrefix(t, "int") || strings.HasPrefix(t, "uint"):
		return "an integer"
	case t == "[]string":
		return "a list of strings"
	case strings.HasPrefix(t, "[]"):
		return "a list"
	default:
		return "a mapping"
	}
}

// TagWords describes a YAML value by its tag.
func TagWords(tag, value string) string {
	switch tag {
	case "!!seq":
		return "a list"
	case "!!map":
		return "a mapping"
	case "!!null":
		return "nothing"
	case "!!str":
		return fmt.Sprintf("the string %q", value)
	default:
		return strings.TrimPrefix(tag, "!!") + " " + value
	}
}

// blockComplaints are the syntax errors go.yaml.in/yaml/v3 reports at the
// line where the enclosing block begins rather than where the problem is
// (a line indented too little or too much, say).
var blockComplaints = []string{"did not find expected key", "did not find expected '-' indicator"}

// maxRelineLines bounds the documents SyntaxLine searches (it parses each
// prefix: quadratic).
const maxRelineLines = 4000

// SyntaxLine returns the line a syntax complaint is about: for the
// complaints the decoder places at the start of the enclosing block, the
// first line after it whose addition makes the document's prefix fail to
// parse; line itself otherwise (or when no prefix fails).
func SyntaxLine(data []byte, line int, text string) int {
	block := false
	for _, c := range blockComplaints {
		block = block || strings.Contains(text, c)
	}
	lines := bytes.SplitAfter(data, []byte("\n"))
	if !block || line <= 0 || len(lines) > maxRelineLines {
		return line
	}
	for n := line + 1; n <= len(lines); n++ {
		var doc yaml.Node
		if err := yaml.Unmarshal(bytes.Join(lines[:n], nil), &doc); err != nil {
			return n
		}
	}
	return line
}
