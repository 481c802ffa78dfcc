// Command bench is toolbatch's benchmark (`make bench`, issue 7). It
// builds the engine, the sandbox worker and replay from this module, runs
// them as processes against the engine's embedded JetStream, and measures:
//
//   - W1 latency: one run at a time, batches of 4 calls of the sandbox
//     workers' builtin noop through one sandbox-worker process, and of 4
//     calls of the engine's brain builtin echo; p50 and p99 from submit to
//     the batch's .results message;
//   - W2 throughput: 64 runs at once, batches of 4 noop calls, 2 worker
//     processes; batches/s, calls/s, commits/s, p50/p99, the engine's RSS
//     and CPU;
//   - the engine's RSS holding 10,000 runs parked on a permission ticket;
//   - the ceiling, in the same run and on the same server: raw JetStream
//     rates of the primitives the engine uses, and a hand-rolled minimum of
//     W1 (the same appends and round trips, no engine logic);
//   - W3 replay: the replay program folding a recorded stream of 1,000,000
//     events, from a file and from NATS;
//   - W4 sandbox cost: /bin/true through sandbox.Runner with bubblewrap
//     against a bare fork and exec;
//   - W5 a sandboxed batch (w5.go): W1's shape with 4 calls of /bin/true
//     on a sandbox worker in pre-started bubblewrap sandboxes, each batch
//     after an idle pause (--w5-pause, a model's turn), against the same
//     with isolation none and a bare exec, in the same run;
//   - failover (issue 16, failover.go): against nats-server processes
//     built from the module's requirement, how long runs wait after a
//     kill -9 of their engine (restarted with its id, or taken over by
//     another), how long the projector's output waits after its leader's,
//     and, on a 3-node cluster, whether a paused or killed events-stream
//     leader moves any run (owner changes, indeterminate calls) and how
//     long commits stop.
//
// W1, W2 and the ceiling run once with the engine's default durability
// (JetStream's periodic flush) and once with --sync-always. Every figure is
// the median of --reps repetitions. The table goes to stdout, the full
// results (with the machine's core count and the command) to --out as JSON.
// docs/performance.md explains every figure and gives one run's table.
//
// Imports: aggregate, catalog, client, engine, events, metrics, proof, protocol, replay, sandbox, tracing,
// internal/testproc, github.com/nats-io/nats-server/v2, github.com/nats-io/nats.go,
// github.com/nats-io/nkeys, github.com/prometheus/client_golang, github.com/rs/zerolog.
package main
