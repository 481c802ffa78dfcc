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

// TestGeneratedFileIsCurrent fails when events/fastdecode_gen.go is not
// what gen writes from the source as it is: run go generate ./events.
func TestGeneratedFileIsCurrent(t *testing.T) {
	want, err := generate(eventsDir)
	if err != nil {
		t.Fatalf("generate: %v", err)
	}
	got, err := os.ReadFile(filepath.Join(eventsDir, outputName))
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
			t.Fatalf("events/%s is stale (run go generate ./events); line %d is\n\t%q\nand gen writes\n\t%q", outputName, i+1, g, w)
		}
	}
}

// TestRefuses: gen stops, naming the cause, on a field type it has no read
// for, and on a listed symbol field that the package does not have.
func TestRefuses(t *testing.T) {
	for field, want := range map[string]string{
		"Weight float64 `msgpack:\"weight\"`": "ThingHappened.Weight",
		"Name string `msgpack:\"name\"`":      "is listed as a symbol",
		"Name string":                         "msgpack tag",
	} {
		dir := t.TempDir()
		src := "package events\n\ntype Type string\n\nconst TypeThingHappened Type = \"ThingHappened\"\n\n" +
			"type ThingHappened struct {\n\t" + field + "\n}\n\n" +
			"func (*ThingHappened) EventType() Type { return TypeThingHappened }\n"
		if err := os.WriteFile(filepath.Join(dir, "events.go"), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := generate(dir); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("generate with the field %s: %v; want an error naming %s", field, err, want)
		}
	}
}
