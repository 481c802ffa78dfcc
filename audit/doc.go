// Package audit checks a recorded toolbatch stream against the invariants
// of contract.md §6. It folds the events stream with the same aggregate the
// engine uses (so an illegal transition in the log is caught by the same
// checks that refuse it live), adds the checks a fold cannot make on its own
// (a gap in a run's commits, a forged result, replays the recovery table
// does not allow), and compares what the projector derives from the events
// with what the out stream holds. It does no IO: the caller feeds it
// messages.
//
// Imports: aggregate, events, projector, proof, protocol.
package audit
