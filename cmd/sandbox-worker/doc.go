// Command sandbox-worker runs sandbox tools for the toolbatch engine:
// it takes jobs of its pools from NATS, claims each from the engine, runs
// the tool in a sandboxed subprocess (or a built-in), heartbeats while it
// runs, and reports the result. Start as many as you like, on as many
// machines as reach NATS.
//
//	sandbox-worker --nats-url URL --config worker.yaml [--pools a,b] [--concurrency N] [--worker-id ID] [--prestart N]
//
// With isolation bubblewrap it keeps pre-started sandboxes for each
// subprocess tool (the config's prestart, default 2; --prestart overrides
// it, 0 turns them off). The program is their first stage: it is
// re-executed inside each one (sandbox.StageMain). On exit they are killed
// and their working directories removed.
//
// SIGTERM or SIGINT drains: no new jobs, running calls finish within the
// grace period and report; a second signal stops them at once.
//
// Imports: access, internal/cli, internal/lockfile, metrics, protocol, sandbox, worker,
// github.com/nats-io/nats.go, github.com/prometheus/client_golang,
// github.com/rs/zerolog.
package main
