package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// eventsDir is the events package, from this one.
const eventsDir = "../.."

// TestGeneratedFileIsCurrent fails when events/fastdecode_gen.go or
// events/fastencode_gen.go is not what gen writes from the source as it
// is: run go generate ./events.
func TestGeneratedFileIsCurrent(t *testing.T) {
	files, err := generate(eventsDir)
	if err != nil {
		t.Fatalf("generate: %v", err)
	}
	for _, name := range []string{outputName, encodeOutputName} {
		current(t, name, files[name])
	}
}

func current(t *testing.T, name string, want []byte) {
	got, err := os.ReadFile(filepath.Join(eventsDir, name))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(got, want) {
		return
	}
	gl, wl := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
	for i := range max(len(gl), len(wl)) {
		var g, w string
		if i < len(gl) {
			g = gl[i]
		}
		if i < len(wl) {
			w = wl[i]
		}
		if g != w {
			t.Fatalf("events/%s is stale (run go generate ./events); line %d is\n\t%q\nand gen writes\n\t%q", name, i+1, g, w)
		}
	}
}

// TestRefuses: gen stops, naming the cause, on a field type it has no read
// for, on a listed symbol field that the package does not have, and on an
// omitempty field whose type has an IsZero method (the library asks it
// whether the field is empty; the encoder does not guess).
func TestRefuses(t *testing.T) {
	for field, want := range map[string]string{
		"Weight float64 `msgpack:\"weight\"`":    "ThingHappened.Weight",
		"Name string `msgpack:\"name\"`":         "is listed as a symbol",
		"Name string":                            "msgpack tag",
		"When Span `msgpack:\"when,omitempty\"`": "IsZero method",
		"Tags []string `msgpack:\"tags\"`":       "ThingHappened.Tags",
	} {
		dir := t.TempDir()
		src := "package events\n\ntype Type string\n\nconst TypeThingHappened Type = \"ThingHappened\"\n\n" +
			"type ThingHappened struct {\n\t" + field + "\n}\n\n" +
			"func (*ThingHappened) EventType() Type { return TypeThingHappened }\n\n" +
			"type Span struct {\n\tN int `msgpack:\"n\"`\n}\n\nfunc (s Span) IsZero() bool { return s.N == 0 }\n"
		if err := os.WriteFile(filepath.Join(dir, "events.go"), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := generate(dir); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("generate with the field %s: %v; want an error naming %s", field, err, want)
		}
	}
}
