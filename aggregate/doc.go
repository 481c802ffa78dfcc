// Package aggregate is the pure core of toolbatch: it folds a run's events
// into its state, and decides which events carry out a command. It does no
// IO, reads no clock, takes no context and logs nothing: time, ids, the
// catalog's descriptors and the executors' live capabilities arrive inside
// commands, and leave inside events. Folding the same events always gives
// the same state.
//
// Two functions make the whole interface, in the manner of etcd's raft:
//
//   - (*Run).Apply(event) folds one event. An event that is not a legal
//     transition returns a *TransitionError and changes nothing.
//   - Decide(run, command) returns the events to commit, as one commit, and
//     the run after them (folded once), or a named error. It never changes
//     the run it is given. A refusal of client input is an *events.Refusal
//     with its protocol code; an illegal transition is one of the Err*
//     sentinels. A command already carried out (the same batch submitted
//     again, a second cancel) returns no events and no error. Refusals the
//     log records are decisions like any other: a refused submission is its
//     BatchRejected event (Submit, Reject), a worker's result that is not
//     the current claim its ResultRefused (Result).
//
// Every domain answer is decided here, from facts the engine gathers: the
// limits an output must fit (OutputLimits) and the server's message size
// (Submit.MaxPayload), the narrowing stage of the gate chain (Narrowed), a
// heartbeat's currency (CheckHeartbeat), the call whose capability a ticket
// needs (TicketCall).
//
// Next(run) says what the run needs from the engine: gate a call, park a
// client call, wait for executors, wait on a ticket, or nothing. Decide
// appends on its own every follow-up that needs no IO: a call of a tool the
// catalog lacks (or of a name that is no tool id) completes with "unknown
// tool: <id>", a call whose input is not a JSON object with
// invalid_arguments, a batch whose calls are
// all terminal is finalized in the same commit (the barrier), an exclusive
// state conflict or an indeterminate delegation ends the run.
//
// # The engine's duties, in order
//
//  1. Decide the command; append the returned events as one commit, with the
//     run's expected last sequence; only then Apply them to the cached run.
//  2. After a commit that contains CallExecuting, enter the executor (invoke
//     the brain tool, or publish the sandbox dispatch): never before.
//  3. Grant a sandbox claim only after CallClaimed is committed.
//  4. Publish to subscribers only what the projector derives from committed
//     events: results only from BatchFinalized.
//  5. After a restart or a takeover, fold the run from the log and Decide
//     Recover before entering any executor again.
//
// # A call's phases
//
//	            gate allow / approve / perform / recover / retry
//	requested ─────────────────────────────────────────▶ executing{attempt}
//	   │  ▲ │                                              │   │   │
//	   │  │ │ ask / schedule / client        delegation    │   │   │ claim (sandbox:
//	   │  │ ▼                                awaits input  │   │   │ the dispatch boundary)
//	   │  awaiting{ticket} ◀─────────────────────────────────┘   │   ▼
//	   │      │  resolved: approve → executing; input → executing │  (executing, claimed)
//	   │      │  deny, client result, expiry → completed          │
//	   │      ▼                                                   ▼
//	   └──▶ completed{output}                    indeterminate{reason}
//	       (block, set_result, unknown tool,    (owner lost, budget exhausted,
//	        unsupported mode, interrupt)          mode unsupported, cancel)
//
// Completed and indeterminate are terminal: a terminal call never reopens,
// and a finalized batch never changes.
//
// # A run's states
//
//	running ──ask/schedule/client/delegation input──▶ awaiting
//	   ▲                                                  │
//	   └──────────────── ticket resolved ─────────────────┘
//	running/awaiting ──cancel, interrupt, state conflict,
//	                   indeterminate delegation──▶ ended{cause}
//
// A run holds at most one open batch and at most one ticket. A batch is
// accepted only when the run has not ended, no batch is open and its step is
// after the last accepted one; a refused batch does not use up its step.
//
// # Recovery
//
// recoverCall is the recovery table of contract.md §4, for an executing call
// whose dispatch boundary was crossed; Recover applies it to every such call
// after a restart, LeaseExpired to one call whose owner was lost. Calls in
// other phases need no decision: terminal calls are kept, awaiting calls keep
// their ticket, requested calls are gated again (Next), and an executing call
// whose boundary was not crossed is dispatched again with the same attempt.
//
// Imports: events.
package aggregate
