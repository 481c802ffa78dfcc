// Package access says who may do what on toolbatch's NATS: the roles
// (engine, worker, client, approver, gate, brain, delegate, auditor,
// admin), each role's permission set computed from the subject layout of
// package protocol (roles.go: the one place a role becomes subjects), the
// auth file of an engine's embedded server (users with their public nkeys
// and what their role is scoped to), and the credentials and TLS options
// every program connects with.
//
// Imports: events, protocol, github.com/nats-io/jwt/v2, github.com/nats-io/nats.go,
// github.com/nats-io/nkeys, go.yaml.in/yaml/v3.
package access
