package events_test

import (
	"testing"
	"time"

	"github.com/toolbatch/toolbatch/events"
	"github.com/vmihailenco/msgpack/v5"
)

func TestScratch(t *testing.T) {
	for _, s := range []string{"1 ]", "{} }", "[1]]", "1 x", "1 2", "-0.0", "1.0", "[[[[[[]]]]]]"} {
		c, err := events.CanonicalJSON([]byte(s))
		t.Logf("canon %q -> %q %v", s, c, err)
	}
	for _, s := range []string{`{"action":"perform","correlation_id":""}`, `{"action":"perform","correlation_id":null}`} {
		c, err := events.DecodeControl([]byte(s), true)
		t.Logf("control %s -> %+v %v", s, c, err)
		if err == nil {
			b, _ := events.Marshal(c)
			_, err2 := events.DecodeControl(b, false)
			t.Logf("  re-decode: %v", err2)
		}
	}
	// nil content block in a result
	body, _ := msgpack.Marshal(map[string]any{"operation_id": "r/1/c", "attempt": 1, "claim_token": "t",
		"output": map[string]any{"call_id": "c", "content": []any{nil}}})
	r, err := events.DecodeResult(body, events.DefaultLimits())
	t.Logf("result %+v %v", r, err)
	if err == nil {
		ev := &events.CallCompleted{BatchID: "r/1", CallID: "c", Attempt: 1, Output: *r.Output, At: time.Now().UTC()}
		cb, _, err := events.EncodeCommit([]events.Event{ev})
		t.Logf("encode commit err=%v", err)
		_, err = events.DecodeCommit(cb, nil)
		t.Logf("decode commit err=%v", err)
	}
	// -0.0 and invalid utf8 keys in RawJSON from msgpack
	var rj events.RawJSON
	b, _ := msgpack.Marshal(map[string]any{"a": -0.0 * 1})
	b = []byte{0x81, 0xa1, 'a', 0xcb, 0x80, 0, 0, 0, 0, 0, 0, 0}
	err = events.Unmarshal(b, &rj)
	t.Logf("negzero %q %v", rj, err)
	b = []byte{0x82, 0xa1, 0xff, 0x01, 0xa1, 0xfe, 0x02}
	err = events.Unmarshal(b, &rj)
	t.Logf("dupkeys %q %v", rj, err)
	b2, err := events.Marshal(rj)
	var rj2 events.RawJSON
	err = events.Unmarshal(b2, &rj2)
	t.Logf("dupkeys again %q %v", rj2, err)
}
