package datadriven

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
)

var rewrite = flag.Bool("rewrite", false, "rewrite scenario scripts with the actual output")

// Case is one test case of a script.
type Case struct {
	Pos       string // file:line of the directive
	Directive string
	Args      []Arg
	Input     string
	Expected  string
}

// Arg is one argument of a directive: key=value, or a bare key.
type Arg struct {
	Key   string
	Value string
	Bare  bool
}

// Get returns the value of key and whether it is present.
func (c *Case) Get(key string) (string, bool) {
	for _, a := range c.Args {
		if a.Key == key {
			return a.Value, true
		}
	}
	return "", false
}

// Has reports whether key is present (bare or with a value).
func (c *Case) Has(key string) bool {
	_, ok := c.Get(key)
	return ok
}

// Lines returns the non-empty input lines.
func (c *Case) Lines() []string {
	var out []string
	for _, l := range strings.Split(c.Input, "\n") {
		if strings.TrimSpace(l) != "" {
			out = append(out, l)
		}
	}
	return out
}

// ParseArgs splits a line into arguments: words, key=value and
// key="quoted value" (Go string syntax).
func ParseArgs(line string) ([]Arg, error) {
	var args []Arg
	s := strings.TrimSpace(line)
	for s != "" {
		var tok string
		i := 0
		for i < len(s) && s[i] != ' ' {
			if s[i] == '"' {
				q, err := strconv.QuotedPrefix(s[i:])
				if err != nil {
					return nil, fmt.Errorf("bad quoting in %q: %v", s, err)
				}
				i += len(q)
				continue
			}
			i++
		}
		tok, s = s[:i], strings.TrimSpace(s[i:])
		k, v, hasValue := strings.Cut(tok, "=")
		if !hasValue {
			args = append(args, Arg{Key: tok, Bare: true})
			continue
		}
		if strings.HasPrefix(v, `"`) {
			u, err := strconv.Unquote(v)
			if err != nil {
				return nil, fmt.Errorf("bad quoting in %q: %v", tok, err)
			}
			v = u
		}
		args = append(args, Arg{Key: k, Value: v})
	}
	return args, nil
}

// Parse reads a script.
func Parse(path string, data string) ([]Case, error) {
	var cases []Case
	sc := bufio.NewScanner(strings.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	lineNo := 0
	next := func() (string, bool) {
		if !sc.Scan() {
			return "", false
		}
		lineNo++
		return sc.Text(), true
	}
	for {
		line, ok := next()
		if !ok {
			break
		}
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
			continue
		}
		c := Case{Pos: fmt.Sprintf("%s:%d", path, lineNo)}
		fields := strings.SplitN(strings.TrimSpace(line), " ", 2)
		c.Directive = fields[0]
		if len(fields) == 2 {
			args, err := ParseArgs(fields[1])
			if err != nil {
				return nil, fmt.Errorf("%s: %v", c.Pos, err)
			}
			c.Args = args
		}
		var input []string
		for {
			l, ok := next()
			if !ok {
				return nil, fmt.Errorf("%s: missing ---- separator", c.Pos)
			}
			if l == "----" {
				break
			}
			input = append(input, l)
		}
		c.Input = strings.Join(input, "\n")
		var expected []string
		for {
			l, ok := next()
			if !ok || strings.TrimSpace(l) == "" {
				break
			}
			expected = append(expected, l)
		}
		c.Expected = strings.Join(expected, "\n")
		cases = append(cases, c)
	}
	return cases, sc.Err()
}

// RunFile runs every case of a script in order through run, comparing its
// output with the expected output (or rewriting the file with -rewrite).
// Output lines may not be blank: a blank line ends a case.
func RunFile(t *testing.T, path string, run func(t *testing.T, c *Case) string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cases, err := Parse(path, string(data))
	if err != nil {
		t.Fatal(err)
	}
	var rewritten []string
	if *rewrite {
		rewritten = rewriteSkeleton(string(data))
	}
	for i := range cases {
		c := &cases[i]
		got := strings.TrimRight(run(t, c), "\n")
		got = strings.ReplaceAll(got, "\n\n", "\n")
		if got == "" {
			got = "ok"
		}
		if *rewrite {
			rewritten = fillCase(rewritten, got)
			continue
		}
		if got != c.Expected {
			t.Errorf("%s: %s\n--- want\n%s\n--- got\n%s", c.Pos, c.Directive, c.Expected, got)
		}
	}
	if *rewrite {
		if err := os.WriteFile(path, []byte(strings.Join(rewritten, "\n")), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// rewriteSkeleton splits a script into chunks so that the expected output of
// each case can be replaced: text before each case's expected output, and
// the rest.
func rewriteSkeleton(data string) []string {
	lines := strings.Split(data, "\n")
	var out []string
	for i := 0; i < len(lines); i++ {
		out = append(out, lines[i])
		if lines[i] != "----" {
			continue
		}
		// Drop the old expected output up to the blank line.
		j := i + 1
		for j < len(lines) && strings.TrimSpace(lines[j]) != "" {
			j++
		}
		out = append(out, "\x00expected")
		i = j - 1
	}
	return out
}

// fillCase puts a case's output in place of the first unfilled one: cases
// are filled in order.
func fillCase(lines []string, got string) []string {
	for i, l := range lines {
		if l == "\x00expected" {
			lines[i] = got
			return lines
		}
	}
	return lines
}
