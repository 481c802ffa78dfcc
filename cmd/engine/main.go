// Command engine will run the toolbatch engine. With no flags it will start
// an embedded NATS server with JetStream (store directory ./toolbatch-data,
// listening on 127.0.0.1:4222 so that workers and clients can connect) and
// run everything: intake, gates, brain tools, dispatch, claims, timers,
// recovery and the projector. --nats-url will use an existing NATS server or
// cluster instead; --catalog FILE will name the operator's tool catalog and
// gate rules.
//
// It is not built yet: for now it says so and exits with status 2.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "engine: not built yet: the JetStream engine is issue 3")
	os.Exit(2)
}
