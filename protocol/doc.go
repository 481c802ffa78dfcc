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
// It may import events and the NATS client; nothing of toolbatch imports
// it back except the programs and the shell packages.
//
// Imports: events, github.com/nats-io/nats.go.
package protocol
