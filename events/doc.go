// Package events defines every event toolbatch appends to its log and every
// message it exchanges on NATS, with their stable type names, schema
// versions and the msgpack codec.
//
// Events are the only source of truth: the aggregate folds them, the
// projector derives what subscribers see from them, and replay audits them.
// Each event has a registered, past-tense type name (never derived from the
// Go type) and a schema version. A commit is one JetStream message holding
// one or more events; see EncodeCommit and DecodeCommit.
//
// Wire messages (submit, resume, control, dispatch, claim, result and the
// out messages) are msgpack maps with snake_case keys. Submit, resume and
// control also decode from JSON. Decoding a submission is strict: unknown
// fields and fields that try to choose placement or recovery are refused
// with a protocol Code, and every input limit is checked (see Limits).
//
// The package does no IO and reads no clock: times arrive as data.
//
// Imports: github.com/vmihailenco/msgpack/v5.
package events
