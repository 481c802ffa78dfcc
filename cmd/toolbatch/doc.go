// Command toolbatch is a small command-line client of the toolbatch engine,
// for people and shell scripts. It talks to the engine over NATS JetStream
// through the client package, exactly as any other client would (see
// docs/protocol.md).
//
//	toolbatch submit [--wait] < batch.json
//	toolbatch watch RUN_ID
//	toolbatch approve RUN_ID CORRELATION_ID [--principal P] [--note TEXT]
//	toolbatch deny RUN_ID CORRELATION_ID [--principal P] [--reason TEXT]
//	toolbatch cancel RUN_ID [--reason TEXT]
//	toolbatch interrupt RUN_ID [--reason TEXT]
//	toolbatch perform RUN_ID CORRELATION_ID
//	toolbatch auth create|list|revoke|permissions|keys|revoke-key ...
//
// Every command takes --nats-url (default nats://127.0.0.1:4222), --prefix
// (default toolbatch) and --timeout (default 30s). Errors are one line on
// stderr; the exit status is 2 for a usage error and 1 for anything else
// that failed (a refusal, a rejection, a timeout, NATS unreachable).
//
// Imports: access, catalog, client, console, events, internal/cli, internal/mcpcontent,
// proof, protocol, sandbox, github.com/modelcontextprotocol/go-sdk, github.com/nats-io/jwt/v2,
// github.com/nats-io/nats.go, github.com/nats-io/nkeys, go.yaml.in/yaml/v3.
package main
