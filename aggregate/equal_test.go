package aggregate

import (
	"math/rand"
	"reflect"
	"testing"

	"github.com/toolbatch/toolbatch/events"
)

// resultsEqual and commandsEqual against their oracle, reflect.DeepEqual
// with a nil list and an empty one alike at the top: the finalization
// check compared that way before.

func oracle[T any](a, b []T) bool {
	if len(a) == 0 {
		a = nil
	}
	if len(b) == 0 {
		b = nil
	}
	return reflect.DeepEqual(a, b)
}

// TestEqualFields fails when a field is added to a type the comparisons
// read: they must then compare it too.
func TestEqualFields(t *testing.T) {
	for _, c := range []struct {
		v    any
		want int
	}{{events.ContentBlock{}, 11}, {events.ImageSource{}, 4}, {events.Command{}, 5}} {
		if n := reflect.TypeOf(c.v).NumField(); n != c.want {
			t.Errorf("%T has %d fields, resultsEqual and commandsEqual compare %d: compare the new ones", c.v, n, c.want)
		}
	}
}

// equalGen makes block lists and their near copies from a small set of
// values, so that equal and unequal pairs both come up often.
type equalGen struct{ r *rand.Rand }

func (g equalGen) raw() events.RawJSON {
	switch g.r.Intn(4) {
	case 0:
		return nil
	case 1:
		return events.RawJSON{}
	case 2:
		return events.RawJSON("1")
	}
	return events.RawJSON("2")
}

func (g equalGen) str() string { return []string{"", "a", "b"}[g.r.Intn(3)] }

func (g equalGen) blocks(depth int) []events.ContentBlock {
	switch g.r.Intn(4) {
	case 0:
		return nil
	case 1:
		return []events.ContentBlock{}
	}
	out := make([]events.ContentBlock, 1+g.r.Intn(2))
	for i := range out {
		b := events.ContentBlock{Type: []events.BlockType{events.BlockText, events.BlockToolResult}[g.r.Intn(2)],
			Text: g.str(), ID: g.str(), Name: g.str(), ToolUseID: g.str(), IsError: g.r.Intn(2) == 0,
			Input: g.raw(), Value: g.raw(), Extra: g.raw()}
		if g.r.Intn(3) == 0 {
			b.Source = &events.ImageSource{Type: g.str(), MediaType: g.str(), Data: g.str(), URL: g.str()}
		}
		if depth < 2 {
			b.Content = g.blocks(depth + 1)
		}
		out[i] = b
	}
	return out
}

// near returns a deep copy of bs with at most one thing changed.
func (g equalGen) near(bs []events.ContentBlock, depth int) []events.ContentBlock {
	if bs == nil {
		if g.r.Intn(8) == 0 {
			return []events.ContentBlock{}
		}
		return nil
	}
	if g.r.Intn(16) == 0 {
		return g.blocks(depth) // anything
	}
	out := make([]events.ContentBlock, len(bs))
	for i, b := range bs {
		if b.Source != nil {
			s := *b.Source
			b.Source = &s
		}
		b.Input, b.Value, b.Extra = clone(b.Input), clone(b.Value), clone(b.Extra)
		b.Content = g.near(b.Content, depth+1)
		if g.r.Intn(4) == 0 {
			switch g.r.Intn(10) {
			case 0:
				b.Text = g.str()
			case 1:
				b.ID, b.Name = g.str(), g.str()
			case 2:
				b.ToolUseID = g.str()
			case 3:
				b.IsError = !b.IsError
			case 4:
				b.Input = g.raw()
			case 5:
				b.Value = g.raw()
			case 6:
				if b.Source == nil {
					b.Source = &events.ImageSource{}
				} else if g.r.Intn(2) == 0 {
					b.Source = nil
				} else {
					f := []*string{&b.Source.Type, &b.Source.MediaType, &b.Source.Data, &b.Source.URL}[g.r.Intn(4)]
					*f += "x"
				}
			case 7:
				b.Type = events.BlockJSON
			case 8:
				b.Content = g.blocks(depth + 1)
			case 9:
				b.Extra = g.raw()
			}
		}
		out[i] = b
	}
	return out
}

func clone(r events.RawJSON) events.RawJSON {
	if r == nil {
		return nil
	}
	return append(events.RawJSON{}, r...)
}

func (g equalGen) commands() []events.Command {
	if g.r.Intn(4) == 0 {
		return []events.Command{}[:g.r.Intn(1)]
	}
	out := make([]events.Command, g.r.Intn(3))
	for i := range out {
		out[i] = events.Command{Scope: events.Scope(g.str()), Key: g.str(), Merge: events.Merge(g.str()),
			Action: events.Action(g.str()), Value: g.raw()}
	}
	return out
}

func TestResultsEqualOracle(t *testing.T) {
	const seed, n = 1, 20000
	g := equalGen{rand.New(rand.NewSource(seed))}
	same, differ := 0, 0
	for i := range n {
		a := g.blocks(0)
		b := g.near(a, 0)
		want := oracle(a, b)
		if got := resultsEqual(a, b); got != want {
			t.Fatalf("seed %d, pair %d: resultsEqual = %v, reflect.DeepEqual says %v\na: %#v\nb: %#v", seed, i, got, want, a, b)
		}
		if want {
			same++
		} else {
			differ++
		}
		ca, cb := g.commands(), g.commands()
		if got, want := commandsEqual(ca, cb), oracle(ca, cb); got != want {
			t.Fatalf("seed %d, pair %d: commandsEqual = %v, reflect.DeepEqual says %v\na: %#v\nb: %#v", seed, i, got, want, ca, cb)
		}
		if got, want := commandsEqual(ca, ca), oracle(ca, ca); got != want {
			t.Fatalf("seed %d, pair %d: commandsEqual of a list and itself = %v", seed, i, got)
		}
	}
	if same < n/10 || differ < n/10 {
		t.Fatalf("the generator made %d equal and %d unequal pairs: too few of one kind", same, differ)
	}
}
