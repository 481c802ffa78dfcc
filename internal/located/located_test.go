package located

import (
	"errors"
	"testing"
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
