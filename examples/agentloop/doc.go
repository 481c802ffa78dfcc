// Command agentloop is an agent loop driven through toolbatch: a scripted
// model (no network) answers, turn by turn, with Anthropic-shaped and
// OpenAI-shaped tool calls, and the loop submits each turn as one batch
// with the client's adapters, answers the batch's tickets (a confirmation
// by a scripted person, a client-executed tool by the loop itself), waits
// for the answer to exactly what it sent, and hands the results back to
// the model in the model's own format, until the model answers without a
// call. One of its calls is malformed: the model hears about it as that
// call's error, and the others run.
//
// Run it against an engine started with its catalog (catalog.yaml here):
//
//	make run ARGS='--catalog examples/agentloop/catalog.yaml'
//	go run ./examples/agentloop --nats-url nats://127.0.0.1:4222
//
// Imports: client, events, protocol, github.com/nats-io/nats.go.
package main
