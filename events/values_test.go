package events

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
)

// TestIDRules: the ids' rules, written as a loop, accept exactly what
// their regular expressions (the rules as docs/protocol.md gives them)
// accept, at the length boundaries and on random strings of bytes near
// the allowed ones.
func TestIDRules(t *testing.T) {
	rules := []struct {
		name  string
		valid func(string) bool
		re    *regexp.Regexp
	}{
		{"run_id", ValidRunID, regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)},
		{"tool_id", ValidToolID, regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)},
		{"call_id", ValidCallID, regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)},
	}
	cases := []string{"", "a", "A-z_09", strings.Repeat("x", 64), strings.Repeat("x", 65), strings.Repeat("x", 128),
		strings.Repeat("x", 129), "a.b", "a b", "a*", "a>", "é", "a\n", "a/b", "\x00"}
	alphabet := "azAZ09_-.:/ *>\x00\x7f\xc3\xa9`@[{"
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		b := make([]byte, rng.IntN(140))
		for i := range b {
			if rng.IntN(50) == 0 {
				b[i] = alphabet[rng.IntN(len(alphabet))]
			} else {
				b[i] = "abcXYZ019_-"[rng.IntN(11)]
			}
		}
		cases = append(cases, string(b))
	}
	for _, r := range rules {
		for _, c := range cases {
			if got, want := r.valid(c), r.re.MatchString(c); got != want {
				t.Fatalf("%s %q: valid %v, the rule says %v", r.name, c, got, want)
			}
		}
	}
}
