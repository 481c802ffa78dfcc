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
package main

import (
	"os"
	"runtime/debug"
)

// gcPercent is the garbage collector's target when GOGC is not set: replay
// keeps the whole history in memory, and the default (100) spends a fifth
// of a long read marking it again and again; 300 costs about 40% more
// memory. The history's read runs with the collector off, and its printing
// at the default target (gc.go).
const gcPercent = 300

func main() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}
