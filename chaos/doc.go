// Package chaos is toolbatch's crash-schedule driver (issue 6): it proves
// that a crash never repeats an unsafe side effect and never loses a
// result.
//
// A schedule is drawn from a seed (math/rand). For one schedule the driver:
//
//  1. runs the programs Build compiled once: the nats-server from the
//     module's requirement, cmd/engine and cmd/sandbox-worker;
//  2. starts an out-of-process nats-server with JetStream in the schedule's
//     directory, then one or two engines (--nats-url, --ack-wait 1s,
//     --lease 1s, the catalog below) and two sandbox workers (bubblewrap);
//  3. drives the seed's workload: runs, each a series of batches mixing
//     brain builtins (echo, sleep; replay_safe and never_replay), sandbox
//     tools of each recovery mode (never_replay, replay_safe, idempotent,
//     the workers advertising the matching capability), a confirmation (the
//     client approves it when its ticket appears), a client-executed tool
//     (the client answers with ToolResult) and a scheduled action (a
//     schedule rule, after: 1s, performed by the engine's timer). Every
//     sandbox tool writes "<operation_id> <attempt>" to an effects file as
//     its first statement. Clients retry every command until NATS
//     acknowledges it (commands carry deterministic message ids) and watch
//     for results across outages;
//  4. meanwhile, at the seed's moments, kills -9 an engine, a worker or the
//     nats-server, keeps it down for a while, and restarts it on the same
//     store directory and port;
//  5. when every run is done, reads the whole events and out streams with
//     ordered consumers and checks: every batch NATS acknowledged was
//     accepted; every accepted batch has exactly one results message, with
//     one result per tool_use in model order; every never_replay tool was
//     entered at most once (counted by its own effect lines), every entry
//     recorded by a tool was a claimed attempt, and every successful sandbox
//     completion was recorded by its tool; and package audit finds no
//     violation of contract.md §6 over both streams.
//
// Cluster mode (RunCluster, natscluster.go and faults.go) runs a schedule
// on a 3-node nats-server cluster instead: three processes on loopback,
// each with its own store directory and a config file (server_name n1..n3,
// cluster { name, listen, routes } to all three, JetStream, the monitoring
// endpoint), started together and waited for until every server passes
// its full /healthz. Two engines run with --replicas 3, --ack-wait 15s and
// --lease 15s, the sandbox tools with dispatch_deadline 30s (all above an
// election plus a stalled-server detection, as docs/operations.md asks of
// the ack wait; see clusterAckWait), engines and workers with --nats-url
// listing the three servers. The seed draws a fault plan: each
// fault kind of its class once, in a seeded order (even seeds: the server
// faults only; odd seeds: those and the engine faults):
//
//   - kill -9 a follower (a server leading neither the events stream nor
//     the meta group), the events stream's leader (StreamInfo's
//     Cluster.Leader) or the meta leader (meta_cluster.leader of /jsz, as
//     a majority of the servers names it); it stays down for a while and
//     is restarted on its store;
//   - SIGSTOP a server (the events leader, the meta leader or a follower)
//     for 8-12 s, longer than an election, then SIGCONT;
//   - a rolling restart: SIGTERM each server in turn and start it again,
//     waiting for the cluster to be healthy before the next;
//   - kill -9 one engine while the other lives, restarted later; kill -9
//     both, then restart one and later the other.
//
// Before each fault the driver finds its target from the live cluster, and
// after it waits until every server passes /healthz and the events stream
// has a leader (a cluster that does not heal in 2 minutes fails the
// schedule), then until every run that awaited results at the fault has
// committed since (at most 2 minutes), so that one fault's failover figure
// does not run into the next fault. The runs keep submitting batches until the plan is done. Every
// check above applies; a plan of server faults only must also make no call
// indeterminate, complete no call unavailable_before_dispatch (a server
// loss must not become a model-visible error), and enter no replay_safe
// tool twice (its effect lines per operation and attempt). For each fault
// the Result records the failover: from the fault to the first commit
// (events stream timestamp) of each run that had an unfinished batch then;
// the median and maximum per fault kind are printed as figures, never
// checked. The driver's own connections ping every second, so that they
// leave a stopped server within seconds.
//
// Run returns a Result: the crashes injected by kind, the calls made
// indeterminate, the attempts recovery replayed (CallExecuting with cause
// recovered), and every failure with the history of the calls involved
// (RunCluster's also the faults by kind, the calls completed
// unavailable_before_dispatch and the failover figures). The same seed
// draws the same workload and the same crash sequence (or fault plan), so a
// failing seed reproduces the failure (the exact interleaving with the
// processes is up to the machine): go test ./chaos -run TestChaos -seed N,
// or CHAOS_SEED=N; CHAOS_KEEP=1 keeps the logs of a schedule that passed. `make chaos` runs CHAOS_SCHEDULES long schedules of
// random seeds; TestChaosShort runs two short ones of fixed seeds inside
// `make test` (see shortSeeds for why they are fixed). `make
// chaos-cluster` runs CHAOS_SCHEDULES (default 6) cluster schedules of
// random seeds, alternately even and odd (TestChaosCluster);
// TestChaosClusterShort runs one of a fixed seed inside `make test` (a
// kill -9 of the events leader, then a SIGSTOP of the events leader).
// TestRefusedRedeliveryKeepsRunAlive is the regression test of an engine
// bug the long schedules found.
//
// Imports: audit, client, events, protocol, internal/testproc,
// github.com/nats-io/nats.go.
package chaos
