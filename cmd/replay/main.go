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
