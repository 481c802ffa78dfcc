// Package embedded runs the NATS server an engine embeds (engine without
// --nats-url): JetStream on a store directory, loopback only unless an
// auth file gives every connection a user and the permissions of its role
// (computed by package access), optional TLS and mutual TLS, and reloads
// of the auth file (revocation). The engine itself connects in process as
// a user made at start.
//
// Imports: access, github.com/nats-io/nats-server/v2/server,
// github.com/nats-io/nats.go.
package embedded
