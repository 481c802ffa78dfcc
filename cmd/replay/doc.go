// Command replay reads toolbatch's event log, from NATS or from an export
// file, folds it with the engine's own aggregate, and tells what happened:
//
//	replay [flags]                      the history of every call, per run and batch
//	replay export --out FILE [flags]    write the log (and the out stream) as JSON Lines
//	replay audit [flags]                check every invariant of contract.md §6
//	replay what-if --catalog FILE       re-gate the recorded calls with another catalog
//
// docs/replay.md describes the commands, the export format, what the audit
// checks and how, and gives an example report. This program is the flags
// and exit statuses (cli.go), the progress lines (progress.go), opening the
// source and running each command (commands.go, export.go, auditcmd.go,
// which prints the audit's report); package replay reads the streams,
// decodes them, folds the history and re-gates for what-if
// (replay.HoldGC sets the garbage collector for the history's read), and
// package audit checks the invariants.
//
// Imports: access, audit, catalog, events, internal/cli, proof, protocol, replay,
// github.com/nats-io/nats.go.
package main
