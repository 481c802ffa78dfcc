package located

import (
	"errors"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

type problem struct {
	line int
	msg  string
}

func (p *problem) Error() string { return Format("", p.line, "", p.msg) }

func TestFormat(t *testing.T) {
	for _, c := range []struct {
		path        string
		line        int
		where, want string
	}{
		{"tools.yaml", 3, "tools[0]", "tools.yaml:3: tools[0]: bad"},
		{"tools.yaml", 0, "", "tools.yaml: bad"},
		{"", 7, "gate", "line 7: gate: bad"},
		{"", 0, "", "bad"},
	} {
		if got := Format(c.path, c.line, c.where, "bad"); got != c.want {
			t.Errorf("Format(%q, %d, %q): %q, want %q", c.path, c.line, c.where, got, c.want)
		}
	}
	if got := ToolWhere(2, "rm") + " " + ToolWhere(0, ""); got != `tools[2] (id "rm") tools[0]` {
		t.Errorf("ToolWhere: %q", got)
	}
}

// TestJoinOrdersByLine: problems by line, those without one last in the
// order found; none joins to nil.
func TestJoinOrdersByLine(t *testing.T) {
	line := func(p *problem) int { return p.line }
	if err := Join([]*problem(nil), line); err != nil {
		t.Fatalf("no problems: %v", err)
	}
	err := Join([]*problem{{0, "a"}, {9, "b"}, {0, "c"}, {2, "d"}}, line)
	want := "line 2: d\nline 9: b\na\nc"
	if err == nil || err.Error() != want {
		t.Fatalf("joined:\n%v\nwant:\n%s", err, want)
	}
	var p *problem
	if !errors.As(err, &p) || p.msg != "d" {
		t.Fatalf("errors.As finds %+v", p)
	}
}

type doc struct {
	A int `yaml:"a"`
}

// TestMessages: the decoder's complaints with their lines, columns when it
// gives them, and whether the document was read at all.
func TestMessages(t *testing.T) {
	var v doc
	dec := yaml.NewDecoder(strings.NewReader("a: x\nb: 1\n"))
	dec.KnownFields(true)
	msgs, typed := Messages(dec.Decode(&v))
	if !typed || len(msgs) != 2 || msgs[0].Line != 1 || msgs[1].Line != 2 {
		t.Fatalf("typed %v, messages %+v", typed, msgs)
	}
	if key, ok := UnknownKey(msgs[1].Text); !ok || key != "b" {
		t.Fatalf("unknown key of %q: %q %v", msgs[1].Text, key, ok)
	}
	if _, ok := UnknownKey(msgs[0].Text); ok {
		t.Fatalf("%q read as an unknown key", msgs[0].Text)
	}
	msgs, typed = Messages(yaml.Unmarshal([]byte("a: [1\n"), &v))
	if typed || len(msgs) != 1 || msgs[0].Line == 0 || strings.HasPrefix(msgs[0].Text, "yaml: ") {
		t.Fatalf("syntax error: typed %v, messages %+v", typed, msgs)
	}
	msgs, _ = Messages(errors.New("yaml: no line here"))
	if len(msgs) != 1 || msgs[0].Line != 0 || msgs[0].Text != "no line here" {
		t.Fatalf("a complaint without a line: %+v", msgs)
	}
}

// TestSyntaxLine: an indentation mistake is placed on its own line, not
// on the line where the block it breaks begins (where the decoder puts it).
func TestSyntaxLine(t *testing.T) {
	for _, c := range []struct {
		doc  string
		want int
	}{
		{"tools:\n  - id: a\n    builtin: echo\n   recovery: {mode: replay_safe}\n  - id: b\n", 4},
		{"pools: [default]\ntools:\n  - id: a\n    command: [/bin/true]\n     timeout: 5s\n", 5},
		{"a: 1\nb:\n  c: 2\n d: 3\n", 4},
	} {
		var doc yaml.Node
		err := yaml.Unmarshal([]byte(c.doc), &doc)
		msgs, _ := Messages(err)
		if len(msgs) != 1 {
			t.Fatalf("%q: %v", c.doc, err)
		}
		if got := SyntaxLine([]byte(c.doc), msgs[0].Line, msgs[0].Text); got != c.want {
			t.Errorf("%q: %q at line %d placed at %d, want %d", c.doc, msgs[0].Text, msgs[0].Line, got, c.want)
		}
	}
	// other complaints keep their line
	if got := SyntaxLine([]byte("a: [1,\n"), 1, "did not find expected node content"); got != 1 {
		t.Errorf("an unclosed list: line %d", got)
	}
}
