// Package worker is the sandbox worker loop: it takes sandbox jobs from
// the dispatch stream, claims each one from the engine before it runs it,
// heartbeats while it runs, and reports the outcome with its claim token.
// Any number of workers, on any machines, share the work: each (pool, tool)
// has one durable consumer that all workers pull from.
//
// Duties for one job, in order:
//
//  1. Claim the attempt on <prefix>.api.claim. Refused: the job is a
//     duplicate or stale; acknowledge it and run nothing. No answer: give
//     the job back (nak) and run nothing.
//  2. Run the tool, heartbeating on <prefix>.api.heartbeat and marking the
//     job in progress every third of the lease. A heartbeat that says the
//     claim is no longer current stops the tool: its result would be
//     refused anyway.
//  3. Publish the result on <prefix>.result.<run_id> with the claim token,
//     then acknowledge the job.
//
// Imports: events, metrics, protocol, sandbox, github.com/nats-io/nats.go,
// github.com/nats-io/nuid, github.com/rs/zerolog.
package worker
