// Package console is the operator console (toolbatch console): a web
// page for people, served by a NATS client like any other. It reads the
// events stream (runs and their timelines, folded with the engine's own
// aggregate), the out stream (dispositions, refusals) and the tickets
// bucket (the approvals inbox), and publishes resumes and controls; it
// decides nothing the engine decides.
//
// People sign in with a name and password from a users file; each user is
// a principal, and every answer a user gives is published as that
// principal, on the subject NATS lets the console's credential use for it
// (role console, access.RoleConsole). Pages are server-rendered
// (html/template, assets embedded), forms work without JavaScript, and a
// little script keeps them live from server-sent events.
//
// Imports: aggregate, audit, client, events, protocol, proof, replay,
// github.com/nats-io/nats.go, github.com/rs/zerolog, golang.org/x/crypto, go.yaml.in/yaml/v3.
package console
