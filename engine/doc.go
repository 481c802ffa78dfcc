// Package engine is toolbatch's IO shell around the pure aggregate: it reads
// commands from NATS JetStream, asks the aggregate what they mean, appends
// the resulting events to the log, and only then acts on them.
//
// # Duties, in order
//
//  1. Intake: a durable consumer on the inbox stream takes submit, resume,
//     control and result messages. A message is routed to its run's shard, so
//     that the work of one run is serialized while different runs proceed
//     concurrently.
//  2. Load: a run not in the cache is folded from its subject on the events
//     stream. If its open batch has executing calls, the engine decides
//     Recover first (contract.md §4), before anything else touches the run.
//  3. Decide, stage, flush: aggregate.Decide returns one decision's events
//     and the run after them (folded once, by the aggregate); that run
//     becomes the cached state and the events are staged. A flush appends
//     everything staged as one message on <prefix>.events.<run_id> with the
//     run's expected last subject sequence and a deterministic message id
//     (several messages only when one would exceed the server's size; a
//     decision is never split). The engine flushes before it acts on the
//     outside world: before entering an executor, answering a claim,
//     acknowledging a message or asking the external gate. So a call's
//     completion and the next call's gate decision are one commit. "Wrong
//     last sequence" (10071, or 10164 when replicated) means another
//     engine extended the run; a failed flush of any kind drops what was
//     staged, gives back the messages whose decisions it held, and the run
//     is folded again from the log and decided again. With a signer, each
//     commit names the hash of the run's previous commit and carries the
//     signature of the batch it was signed in (proof.Signer), made before
//     it is published.
//  4. Drive: after each decision the engine asks aggregate.Next what the
//     run needs: run the gate chain (narrowing, the catalog's rules, the
//     external gate service, allow) and decide; park a client call; or
//     invoke the executors of calls whose CallExecuting is committed. An
//     executor is never entered before that commit.
//  5. Acknowledge: an inbox message is acknowledged when its run is
//     quiescent (parked on a ticket, finalized or ended). Until then it is
//     kept in progress, so that after a crash nothing of the run is lost:
//     another engine, finding the crashed one dead (liveness.go), takes
//     the run over and recovers it from the log, and the message comes
//     back to whichever engine owns the run then.
//  6. Project: right after each append, before the run's next commit, the
//     engine folds the commit through the projector and publishes
//     dispositions, tickets, results, refusals and run ends on
//     <prefix>.out.<run_id>.<kind>, the run's ticket, the committed state
//     and timers (project.go). Only a run's last commit can be left
//     unprojected (a crash); the engine that takes the run over projects
//     it again. Each output carries its source (stream sequence and
//     index), checked against what the out stream already holds, so a
//     result is published exactly once, also long after the duplicate
//     window. One engine at a time (checkpoint.go) folds the head of the
//     whole stream and publishes it, signed, on <prefix>.checkpoint.events.
//
// # Where each duty lives
//
// Each run is an actor: its shard (shard.go) takes one work item at a time
// (an inbox message, an executor's outcome, a worker's claim or heartbeat,
// a lease or dispatch deadline), each of its own type and decoded once,
// and drives the run once per item. Ownership of runs is owner.go and
// forward.go, which engines are alive liveness.go, retries through a
// server's passing failure and start-up on a cluster retry.go, the run cache and recovery at load cache.go, commit staging
// and flush commit.go, the translation of messages and outcomes into
// aggregate commands translate.go (sandbox.go for the workers' claims,
// heartbeats and results), driving the run up to its executors drive.go,
// the executors brain.go, delegate.go and sandbox.go, the gate chain
// gate.go, timers timers.go, the projection project.go (and the drain of
// an earlier version's projector consumer projector.go), the log store.go.
//
// The engine never decides what the aggregate decides: it gathers the facts
// a decision needs (time, new ids, the catalog, live capabilities, gate
// answers, executor outcomes) and hands them over as commands.
//
// Imports: access, aggregate, catalog, events, internal/mcpcontent, metrics,
// projector, proof, protocol, tracing, github.com/modelcontextprotocol/go-sdk,
// github.com/nats-io/nats.go, github.com/nats-io/nuid,
// github.com/prometheus/client_golang, github.com/rs/zerolog.
package engine
