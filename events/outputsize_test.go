package events

import (
	"strings"
	"testing"
)

// The counted size of a text output is the encoded size, byte for byte,
// and the outputs it does not count are measured by encoding.
func TestOutputSizeCountsAsItEncodes(t *testing.T) {
	texts := []string{"", "ok", `quote " backslash \ slash /`, "tab\tnewline\nreturn\r", "bell \a nul \x00 unit \x1f del \x7f",
		"<html> & </html>", "é ü 日本 😀", "line sep \u2028 para sep \u2029", "backspace \b", "form feed \f", "bad \xff utf-8",
		strings.Repeat("y", 1<<14)}
	var outs []Output
	for _, s := range texts {
		outs = append(outs, TextOutput("c1", s), Output{CallID: s, Content: []ContentBlock{}}, Output{CallID: "c1", IsError: true,
			Content: []ContentBlock{{Type: BlockText, Text: s}, {Type: BlockText, Text: "second"}}})
	}
	outs = append(outs, Output{CallID: "c1"}, // no content: null
		Output{CallID: "c1", Content: []ContentBlock{{Type: BlockText, Text: "x", Extra: RawJSON(`{"cache_control":{"type":"ephemeral"}}`)}}},
		Output{CallID: "c1", Content: []ContentBlock{{Type: BlockJSON, Value: RawJSON(`{"a":1}`)}}},
		Output{CallID: "c1", Content: []ContentBlock{{Type: BlockText, Text: "x"}}, State: []Command{{Action: ActionSet, Key: "k", Value: RawJSON(`1`)}}})
	counted := 0
	for i, o := range outs {
		want := encodedOutputSize(o)
		if got := OutputSize(o); got != want {
			t.Errorf("output %d (%+v): OutputSize %d, encoded %d", i, o, got, want)
		}
		if _, ok := textOutputSize(o); ok {
			counted++
		}
	}
	// Most of them are counted, not encoded: the test checks the count.
	if counted < len(outs)/2 {
		t.Fatalf("only %d of %d outputs counted without encoding", counted, len(outs))
	}
}

func FuzzOutputSize(f *testing.F) {
	for _, s := range []string{"", "ok", "a\"b\\c\n\t\r", "\x00\x1f\x7f\b\f", "é日😀\u2028", "\xff\xfe", "<&>"} {
		f.Add("c1", s, s+"!", false)
	}
	f.Fuzz(func(t *testing.T, callID, text1, text2 string, isError bool) {
		o := Output{CallID: callID, IsError: isError, Content: []ContentBlock{{Type: BlockText, Text: text1}, {Type: BlockText, Text: text2}}}
		if got, want := OutputSize(o), encodedOutputSize(o); got != want {
			t.Fatalf("%+v: OutputSize %d, encoded %d", o, got, want)
		}
	})
}
