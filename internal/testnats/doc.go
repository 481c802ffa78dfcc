// Package testnats starts an embedded nats-server with JetStream for tests
// that run in the test's own process, and opens connections to it: each is
// stopped or closed at the test's cleanup.
//
// Imports: internal/testproc, github.com/nats-io/nats-server/v2,
// github.com/nats-io/nats.go.
package testnats
