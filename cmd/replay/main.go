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
// decodes them, folds the history and re-gates for what-if, and package
// audit checks the invariants.
package main

import (
	"os"
	"runtime/debug"
)

// gcPercent is the garbage collector's target when GOGC is not set: replay
// keeps the whole history in memory, and the default (100) spends a fifth
// of a long read marking it again and again; 300 costs about 40% more
// memory. The history's read runs with the collector off, and its printing
// at the default target (replay.HoldGC).
const gcPercent = 300

func main() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}
