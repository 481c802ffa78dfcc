package events_test

import (
	"encoding/json"
	"testing"

	"github.com/toolbatch/toolbatch/events"
)

// checkValidJSON fails t unless b, which a decoder accepted, is valid JSON.
func checkValidJSON(t *testing.T, b []byte) {
	t.Helper()
	if !json.Valid(b) {
		t.Fatalf("accepted invalid JSON %q", b)
	}
}

type doc = map[string]any

func mustMsgpack(t testing.TB, v any) []byte {
	t.Helper()
	b, err := events.Marshal(v)
	if err != nil {
		t.Fatalf("events.Marshal: %v", err)
	}
	return b
}
