// Package protocol is toolbatch's public interface on NATS: every name
// (the subject prefix, streams, KV buckets and their keys, durable
// consumers, headers), the subject layout as a table of Families, and one
// ordered reader of a stream subject.
//
// Every program (engine, worker, client, replay, bench, chaos) takes its
// names from here and builds no subject string itself. A Family lists the
// tokens of a subject after the prefix, literal or placeholders, and the
// stream that stores it, so that a permission table for each role can be
// computed from Families with Names.Pattern.
//
// It also holds every wire message with its strict decoder (wire.go):
// submit, resume, control, dispatch, claim, heartbeat, result and the out
// messages, and the messages of the services the engine calls (gate,
// brain, delegate) and of its timers. Decoders refuse with the codes of
// package events, since the log records refusals.
//
// The pure core does not import it: the aggregate reads a submission and a
// resume as events.Submission and events.Answer. The projector imports it
// for the out messages' types only.
//
// Imports: events, github.com/nats-io/nats.go.
package protocol
