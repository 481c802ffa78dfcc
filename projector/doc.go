// Package projector derives what subscribers see on toolbatch.out.<run_id>.*
// from a run's events (contract.md §5). It is the pure core of the
// projection: no IO, no clock, no NATS. The runner that publishes its
// outputs lives with the engine.
//
// The projection state of one run is a Model: the same aggregate the engine
// folds (aggregate.Run) and the number of events applied. Project folds one
// event into a copy of the model and returns the messages that event
// causes, in the order they must be published:
//
//	event            outputs
//	CallAwaiting     one disposition per call (model order), then awaiting (the ticket)
//	BatchFinalized   one disposition per call (model order), then one results
//	RunEnded         ended
//	BatchRejected    rejected
//	anything else    nothing
//
// Dispositions come from the committed ticket, never from call phases: the
// call awaiting a permission ticket is pending_builtin, the call awaiting an
// external_result ticket is pending_client, and every other call (scheduled
// and delegation waits, requested and executing calls of a parked batch,
// every call of a finalized batch) is executed. Each disposition also
// carries the call's phase after the event and its latest attempt.
//
// Results are emitted only for BatchFinalized, the barrier, so nothing of a
// batch reaches the transcript before every call is terminal (invariant 2),
// and the aggregate accepts one BatchFinalized per batch, so a well-formed
// stream yields exactly one results message per batch. A redelivered event
// that was already applied is refused by the aggregate: the runner must skip
// events it has already projected (Model.Applied, or the stream sequence it
// records) rather than rely on Project to ignore them.
//
// ProjectAll folds a whole stream from zero and concatenates the outputs.
// It is deterministic, so projecting the same events twice gives identical
// outputs; replay compares it with what was published (invariant 8).
//
// Refusals of resume and control messages (.refused) are not derived from
// events (no event records them); the engine publishes them directly, and
// they are outside this projection.
//
// What it derives are protocol's out messages (their types, not any NATS
// IO: the package stays pure).
//
// Imports: aggregate, events, protocol.
package projector
