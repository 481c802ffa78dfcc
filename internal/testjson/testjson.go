package testjson

import (
	"bytes"
	"encoding/json"
	"testing"
)

// Canonical is the JSON text b with object keys sorted and numbers kept as
// written, so that two texts of one value compare equal.
func Canonical(t testing.TB, b []byte) string {
	t.Helper()
	var v any
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if err := d.Decode(&v); err != nil {
		t.Fatalf("not JSON: %v: %s", err, b)
	}
	out, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// Same fails the test unless got and want are texts of one JSON value.
func Same(t testing.TB, got, want []byte) {
	t.Helper()
	if a, b := Canonical(t, got), Canonical(t, want); a != b {
		t.Fatalf("got  %s\nwant %s", a, b)
	}
}
