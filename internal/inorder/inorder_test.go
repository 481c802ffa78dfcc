package inorder

import "testing"

type call struct{ id string }

func idOf(c *call) string { return c.id }

func TestFindSearchesAroundFromTheLast(t *testing.T) {
	s := []call{{"a"}, {"b"}, {"c"}}
	last := 0
	for _, step := range []struct {
		id   string
		want int // index found, -1 none
	}{{"b", 1}, {"c", 2}, {"a", 0}, {"c", 2}, {"x", -1}} {
		got := Find(s, &last, step.id, idOf)
		switch {
		case step.want < 0 && got != nil:
			t.Fatalf("Find(%q) = %v, want none", step.id, *got)
		case step.want >= 0 && got != &s[step.want]:
			t.Fatalf("Find(%q) = %v, want element %d", step.id, got, step.want)
		case step.want >= 0 && last != step.want:
			t.Fatalf("after Find(%q), last = %d, want %d", step.id, last, step.want)
		}
	}
	if last != 2 {
		t.Fatalf("a search that found nothing moved last to %d", last)
	}
	if Find([]call(nil), &last, "a", idOf) != nil {
		t.Fatal("found an element of an empty slice")
	}
}
