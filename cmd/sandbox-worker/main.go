// Command sandbox-worker will connect to NATS, consume its pools' dispatch
// subjects, claim each job, run the tool in a sandboxed subprocess,
// heartbeat while it runs and report the result. Any number of workers may
// run, on any number of machines.
//
// It is not built yet: for now it says so and exits with status 2.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "sandbox-worker: not built yet: the sandbox worker and its subprocess sandbox do not exist")
	os.Exit(2)
}
