// Command peers measures DBOS Transact for Go on PostgreSQL with the shapes
// of toolbatch's W1 and W2 (make bench-peers), on a PostgreSQL cluster it
// starts in a temporary directory and stops. make bench-peers alternates
// it with toolbatch's bench (W1 and W2 only) for a few rounds, and then
// this program (--compare) prints each round's ratios of the engine's
// figures to DBOS's, and their medians.
//
// It is a module of its own so that the project's go.mod does not depend
// on DBOS.
//
//   - W1: one workflow at a time, each running 4 no-op steps concurrently
//     (dbos.Go, then every outcome received), for --w1 per repetition; the
//     latency of each workflow, p50 per repetition.
//   - W2: --w2-runs goroutines each running such workflows one after
//     another, for --w2 after --w2-warmup; workflows per second.
//
// PostgreSQL runs with its defaults: fsync on, synchronous_commit on (a
// commit waits for its WAL flush), as toolbatch's default mode waits for
// JetStream's.
//
// Imports: github.com/dbos-inc/dbos-transact-golang.
package main
