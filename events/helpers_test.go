package events_test

import (
	"encoding/json"
	"testing"
)

// checkValidJSON fails t unless b, which a decoder accepted, is valid JSON.
func checkValidJSON(t *testing.T, b []byte) {
	t.Helper()
	if !json.Valid(b) {
		t.Fatalf("accepted invalid JSON %q", b)
	}
}
