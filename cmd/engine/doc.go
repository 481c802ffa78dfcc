// Command engine runs the toolbatch engine: intake, gates, brain tools,
// claims, timers, recovery and the projector, on NATS JetStream.
//
// With no flags it starts an embedded NATS server with JetStream, storing in
// ./toolbatch-data and listening on 127.0.0.1:4222, so that workers and
// clients can connect. With --nats-url it uses an existing server or
// cluster instead.
//
// Imports: access, catalog, embedded, engine, events, internal/cli, internal/lockfile, metrics, proof, protocol, tracing,
// github.com/nats-io/nats.go, github.com/nats-io/nuid,
// github.com/prometheus/client_golang, github.com/rs/zerolog.
package main
