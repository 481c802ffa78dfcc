// Package replay reads toolbatch's event log and folds it: the library
// behind the replay program (cmd/replay, docs/replay.md). It owns
//
//   - the sources: a Source delivers the messages of the events or the out
//     stream in stream order, filtered by a Selection (run, store times,
//     first sequence), from export files (FileSource) or from JetStream
//     with an ordered consumer (NATSSource);
//   - the export format: ExportRecord, one JSON line per message, written
//     by WriteRecord (a whole stream by Export) and read by ParseRecord
//     (and by FileSource, with a hand-written fast path for the lines
//     WriteRecord writes);
//   - the ordered decode pipeline: one goroutine reads, workers on every
//     core decode the records and their commits, and the caller's function
//     gets each Message in stream order;
//   - the history fold (History: every call of every batch, folded with
//     the engine's aggregate, written as text or JSON lines) and what-if
//     (WhatIf: every recorded gate decision re-evaluated with another
//     Policy);
//   - HoldGC, the garbage collector's setting for a read that keeps what
//     it reads.
//
// The invariant checks are package audit's; Audit feeds it what a Source
// reads (the events, then the out messages derived from them). Flags,
// progress lines, the audit's report and exit statuses are the program's.
//
// It may import events, aggregate, projector, protocol (every subject,
// stream and header name comes from there), audit, the standard library
// and the NATS client; never engine or a cmd/ package.
//
// Imports: aggregate, audit, events, projector, proof, protocol,
// github.com/nats-io/nats.go.
package replay
