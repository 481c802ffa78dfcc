package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// publishAcked publishes msg into its stream and waits for the stream's
// acknowledgement, as jetstream's PublishMsg does, and returns the
// sequence the stream stored it at. The plain acknowledgement,
// {"stream":"S","seq":N} with or without "duplicate": true, is read here;
// every other answer takes encoding/json (decodeAck) and fails as
// PublishMsg fails. A commit's acknowledgement so costs no reflective
// decoding on the commit's path. No responders is not retried here: the
// caller's retrying does, as for any passing failure.
func publishAcked(ctx context.Context, nc *nats.Conn, msg *nats.Msg) (uint64, error) {
	resp, err := nc.RequestMsgWithContext(ctx, msg)
	if errors.Is(err, nats.ErrNoResponders) {
		return 0, jetstream.ErrNoStreamResponse
	}
	if err != nil {
		return 0, err
	}
	return readAck(resp.Data)
}

// readAck reads a stream's answer to a publish.
func readAck(b []byte) (uint64, error) {
	if seq, ok := plainAck(b); ok {
		return seq, nil
	}
	return decodeAck(b)
}

// plainAck reads {"stream":"<name>","seq":<n>} or the same with
// ,"duplicate": true before its brace; ok false is anything else.
func plainAck(b []byte) (uint64, bool) {
	rest, ok := bytes.CutPrefix(b, []byte(`{"stream":"`))
	if !ok {
		return 0, false
	}
	end := bytes.IndexByte(rest, '"')
	if end <= 0 || bytes.IndexByte(rest[:end], '\\') >= 0 {
		return 0, false
	}
	if rest, ok = bytes.CutPrefix(rest[end+1:], []byte(`,"seq":`)); !ok {
		return 0, false
	}
	n := 0
	for n < len(rest) && rest[n] >= '0' && rest[n] <= '9' {
		n++
	}
	seq, err := strconv.ParseUint(string(rest[:n]), 10, 64)
	if n == 0 || err != nil || seq == 0 {
		return 0, false
	}
	switch string(rest[n:]) {
	case "}", `,"duplicate": true}`, `,"duplicate":true}`: // the server writes the space
		return seq, true
	}
	return 0, false
}

// decodeAck reads any acknowledgement as jetstream's PublishMsg does: an
// API error is returned as *jetstream.APIError (wrapped), an answer that
// names no stream is jetstream.ErrInvalidJSAck.
func decodeAck(b []byte) (uint64, error) {
	var ack struct {
		Error    *jetstream.APIError `json:"error"`
		Stream   string              `json:"stream"`
		Sequence uint64              `json:"seq"`
	}
	if err := json.Unmarshal(b, &ack); err != nil {
		return 0, jetstream.ErrInvalidJSAck
	}
	if ack.Error != nil {
		return 0, fmt.Errorf("nats: %w", ack.Error)
	}
	if ack.Stream == "" {
		return 0, jetstream.ErrInvalidJSAck
	}
	return ack.Sequence, nil
}
