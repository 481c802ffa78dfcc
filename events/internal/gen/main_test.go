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

// TestRefusesUnknownFieldType: a field type gen has no read for stops
// generation and names the field.
func TestRefusesUnknownFieldType(t *testing.T) {
	dir := t.TempDir()
	src := `package events

type Type string

const TypeThingHappened Type = "ThingHappened"

type ThingHappened struct {
	Weight float64 ` + "`msgpack:\"weight\"`" + `
}

func (*ThingHappened) EventType() Type { return TypeThingHappened }
`
	if err := os.WriteFile(filepath.Join(dir, "events.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := generate(dir)
	if err == nil || !strings.Contains(err.Error(), "ThingHappened.Weight") {
		t.Fatalf("generate: %v; want an error naming ThingHappened.Weight", err)
	}
}
