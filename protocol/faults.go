package protocol

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// FieldMeaning is the log field that carries Meaning.
const FieldMeaning = "meaning"

// Meaning says in words what a NATS or JetStream error met under a fault
// means for the operation that is retried: logged next to the error, so
// that an operator reading "no response from stream" knows it is a leader
// election and not a lost message. "" when there is nothing to add.
func Meaning(err error) string {
	var apiErr *jetstream.APIError
	switch {
	case err == nil:
		return ""
	case errors.As(err, &apiErr):
		switch apiErr.ErrorCode {
		case 10008:
			return "JetStream is electing a leader or catching up: the request is retried"
		case 10005:
			return "not enough servers are up to place the replicas: waiting for them"
		case jetstream.JSErrCodeStreamWrongLastSequence, jetstream.JSErrCodeStreamWrongLastSequenceConstant:
			return "someone wrote first (another engine, or this one's earlier try that did land): reloaded and decided again"
		case 10158:
			return "the same message is being stored by an earlier try: the retry is answered once it lands, never stored twice"
		}
	case errors.Is(err, jetstream.ErrNoStreamResponse), strings.Contains(err.Error(), "no response from stream"):
		return "the stream has no leader at the moment (a server lost or paused, an election): the publish is retried under the same message id"
	case errors.Is(err, nats.ErrNoResponders):
		return "nothing serves that subject now (JetStream starting or electing, or a service down): retried"
	case errors.Is(err, nats.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		return "no answer in time (a slow or failing server): retried; a timeout never counts as a refusal"
	case errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrConnectionReconnecting), errors.Is(err, nats.ErrDisconnected):
		return "the connection is moving to another server: retried"
	}
	return ""
}

// passingCodes are the JetStream errors that pass by themselves: no
// suitable peers for placement yet (10005), the system temporarily
// unavailable (10008), incomplete results (10004), a request the cluster
// cannot handle yet (10009), a stream or consumer offline (10118, 10119,
// 10194, 10195), a name already in use by a concurrent creation (10058,
// 10148: the next try updates it), a duplicate still in process (10158)
// and an expected sequence temporarily unavailable (10163).
var passingCodes = []jetstream.ErrorCode{10005, 10008, 10004, 10009, 10118, 10119, 10194, 10195, 10058, 10148, 10158, 10163}

// Passing reports whether an error met on a request to JetStream may pass
// by itself, so that the request is worth trying again: one of
// passingCodes, or no answer of JetStream's at all (a timeout, no
// responders while JetStream starts or elects, a connection moving to
// another server). A definite answer (a configuration refused, a missing
// permission, a wrong last sequence, a message the server will never take)
// does not pass. A joined error passes when each of its errors does.
func Passing(err error) bool {
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range joined.Unwrap() {
			if !Passing(e) {
				return false
			}
		}
		return true
	}
	var n notYet
	if errors.As(err, &n) {
		return true
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return slices.Contains(passingCodes, apiErr.ErrorCode)
	}
	var d definite
	return !errors.Is(err, nats.ErrMaxPayload) && !errors.As(err, &d)
}

// NotYet marks an error that passes in its context although its answer
// is definite elsewhere (a stream not found by one server right after
// another made it, while a cluster places it): Passing reports true.
func NotYet(err error) error { return notYet{err} }

type notYet struct{ error }

func (n notYet) Unwrap() error { return n.error }

// Definite marks an error that no retry changes, although no JetStream
// answer says so (a revoked signing key, say): Passing reports false.
func Definite(err error) error { return definite{err} }

type definite struct{ error }

func (d definite) Unwrap() error { return d.error }

// Pulls of the long-lived consumers (the engine's intake and timers, a
// worker's jobs) expire after ServicePullExpiry and carry a heartbeat every
// ServicePullHeartbeat: a pull lost with its consumer's leader (a server
// lost or paused, an election) is noticed within two heartbeats and made
// again, instead of after nats.go's default of 30 s, during which nothing
// would be delivered.
const (
	ServicePullExpiry    = 5 * time.Second
	ServicePullHeartbeat = time.Second
)
