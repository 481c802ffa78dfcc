package events_test

import (
	"errors"
	"reflect"
	"testing"

	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/protocol"
)

// unregistered is an event type that is not in the registry.
type unregistered struct{}

func (*unregistered) EventType() events.Type { return "SomethingHappened" }

func TestEncodeCommitRefuses(t *testing.T) {
	tests := []struct {
		name string
		evs  []events.Event
		want error
	}{
		{"nil event", []events.Event{&events.RunEnded{}, nil}, events.ErrMalformed},
		{"unregistered type", []events.Event{&unregistered{}}, events.ErrUnknownEventType},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, _, err := events.EncodeCommit(tt.evs); !errors.Is(err, tt.want) {
				t.Fatalf("EncodeCommit error = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestDecodeCommit(t *testing.T) {
	ended := &events.RunEnded{Cause: events.EndCancelled, At: goldenAt}
	resolved := &events.TicketResolved{BatchID: "b", CallID: "c", CorrelationID: "x", Resolution: events.ResolutionApproved, At: goldenAt}
	body, types, err := events.EncodeCommit([]events.Event{resolved, ended})
	if err != nil {
		t.Fatalf("EncodeCommit: %v", err)
	}
	if want := []string{"TicketResolved", "RunEnded"}; !reflect.DeepEqual(types, want) {
		t.Fatalf("header types = %q, want %q", types, want)
	}
	envelope := func(typ string, version int, data any) []byte {
		d, err := events.Marshal(data)
		if err != nil {
			t.Fatalf("Marshal: %v", err)
		}
		return mustMsgpack(t, []any{doc{"type": typ, "schema_version": version, "data": rawMsgpack(d)}})
	}

	tests := []struct {
		name    string
		body    []byte
		headers []string
		want    error // nil when the commit decodes
	}{
		{"two events, headers", body, types, nil},
		{"two events, no headers", body, nil, nil},
		{"fewer headers", body, types[:1], events.ErrTypeMismatch},
		{"headers in another order", body, []string{"RunEnded", "TicketResolved"}, events.ErrTypeMismatch},
		{"empty commit", mustMsgpack(t, []any{}), nil, events.ErrMalformed},
		{"nil commit", []byte{0xc0}, nil, events.ErrMalformed},
		{"not an array", mustMsgpack(t, doc{}), nil, events.ErrMalformed},
		{"unknown type", envelope("SomethingHappened", 1, doc{}), nil, events.ErrUnknownEventType},
		{"unknown schema version", envelope("RunEnded", 99, doc{"cause": "cancelled"}), nil, events.ErrUnknownSchemaVersion},
		{"data of the wrong shape", envelope("RunEnded", 1, []any{1, 2, 3}), nil, events.ErrMalformed},
		{"truncated", body[:len(body)-3], nil, events.ErrMalformed},
		{"trailing byte", append(append([]byte{}, body...), 0), nil, events.ErrMalformed},
		{"array32 of 2^32-1", []byte{0xdd, 0xff, 0xff, 0xff, 0xff}, nil, events.ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			evs, err := events.DecodeCommit(tt.body, tt.headers)
			if tt.want != nil {
				if !errors.Is(err, tt.want) {
					t.Fatalf("DecodeCommit error = %v, want %v", err, tt.want)
				}
				if evs != nil {
					t.Fatalf("an error also returned events")
				}
				return
			}
			if err != nil {
				t.Fatalf("DecodeCommit: %v", err)
			}
			if want := []events.Event{resolved, ended}; !reflect.DeepEqual(evs, want) {
				t.Fatalf("got %s, want %s", show(evs), show(want))
			}
		})
	}
}

// nilBlockCommit returns a commit whose BatchFinalized has a nil where a
// content block belongs.
func nilBlockCommit(t testing.TB) []byte {
	data, err := events.Marshal(doc{"batch_id": "run_1/1", "step": 1, "results": []any{nil}, "state": []any{}, "at": goldenAt})
	if err != nil {
		t.Fatalf("Marshal: %v", err)
	}
	body, err := events.Marshal([]any{doc{"type": "BatchFinalized", "schema_version": 1, "data": rawMsgpack(data)}})
	if err != nil {
		t.Fatalf("Marshal: %v", err)
	}
	return body
}

// TestNilContentBlock checks that a nil where a content block belongs is
// refused, and that EncodeCommit never writes what DecodeCommit refuses.
func TestNilContentBlock(t *testing.T) {
	t.Run("DecodeCommit", func(t *testing.T) {
		if evs, err := events.DecodeCommit(nilBlockCommit(t), nil); err == nil {
			t.Fatalf("DecodeCommit accepted results [nil] as %s", show(evs))
		}
	})
	t.Run("Unmarshal ResultsOut", func(t *testing.T) {
		var out protocol.ResultsOut
		if err := events.Unmarshal(mustMsgpack(t, doc{"batch_id": "run_1/1", "results": []any{nil}}), &out); err == nil {
			t.Fatalf("Unmarshal accepted results [nil] as %s", show(out))
		}
	})
	t.Run("EncodeCommit", func(t *testing.T) {
		ev := &events.BatchFinalized{BatchID: "run_1/1", Step: 1, Results: []events.ContentBlock{{}}, At: goldenAt}
		body, types, err := events.EncodeCommit([]events.Event{ev})
		if err != nil {
			return // refusing the zero block is fine
		}
		if _, err := events.DecodeCommit(body, types); err != nil {
			t.Fatalf("EncodeCommit wrote a commit DecodeCommit refuses: %v", err)
		}
	})
}

// rawMsgpack is msgpack bytes embedded as is.
type rawMsgpack []byte

func (r rawMsgpack) MarshalMsgpack() ([]byte, error) { return r, nil }
