// Command replay reads toolbatch's event log, from NATS or from an export
// file, folds it with the engine's own aggregate, and tells what happened:
//
//	replay [flags]                      the history of every call, per run and batch
//	replay export --out FILE [flags]    write the log (and the out stream) as JSON Lines
//	replay audit [flags]                check every invariant of contract.md §6
//	replay what-if --catalog FILE       re-gate the recorded calls with another catalog
//
// docs/replay.md describes the commands, the export format, what the audit
// checks and how, and gives an example report. The work is done by the
// files of this package: cli.go (flags and exit statuses), source.go
// (reading NATS and files), history.go and print.go (the history),
// export.go, auditcmd.go and whatif.go; gc.go sets the garbage collector
// for the history's read.
//
// Imports: aggregate, audit, catalog, events, projector, protocol, replay,
// github.com/nats-io/nats.go.
package main
