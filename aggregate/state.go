package aggregate

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/toolbatch/toolbatch/events"
)

// Illegal transitions. Deciding or applying one returns one of these
// (wrapped with context) and leaves the state unchanged. Domain refusals of
// client input (a bad submission, a resume that does not match its ticket)
// are *events.Refusal instead, with a protocol code.
var (
	ErrNoBatch          = errors.New("aggregate: the run has no open batch")
	ErrUnknownCall      = errors.New("aggregate: no such call in the open batch")
	ErrCallTerminal     = errors.New("aggregate: the call is terminal")
	ErrOutOfOrder       = errors.New("aggregate: an earlier call is not terminal")
	ErrParked           = errors.New("aggregate: the batch is parked on a ticket")
	ErrNotRequested     = errors.New("aggregate: the call is not requested")
	ErrNotExecuting     = errors.New("aggregate: the call is not executing")
	ErrStaleAttempt     = errors.New("aggregate: the attempt is not the call's current attempt")
	ErrAlreadyClaimed   = errors.New("aggregate: the attempt is already claimed")
	ErrNotSandbox       = errors.New("aggregate: the call does not run on a sandbox worker")
	ErrStaleClaim       = errors.New("aggregate: the claim token is not the current claim")
	ErrNotClaimed       = errors.New("aggregate: the attempt was never claimed")
	ErrNotDue           = errors.New("aggregate: the ticket is not due yet")
	ErrCorrelationUsed  = errors.New("aggregate: the correlation id was used before in this run")
	ErrBadDecision      = errors.New("aggregate: the gate decisions do not fit the batch")
	ErrFinalized        = errors.New("aggregate: the batch is finalized")
	ErrRunEnded         = errors.New("aggregate: the run has ended")
	ErrResultsDiffer    = errors.New("aggregate: finalized results differ from the calls' outcomes")
	ErrMalformedCommand = errors.New("aggregate: malformed command")
)

// sentinels are every illegal-transition error above.
var sentinels = []error{ErrNoBatch, ErrUnknownCall, ErrCallTerminal, ErrOutOfOrder, ErrParked,
	ErrNotRequested, ErrNotExecuting, ErrStaleAttempt, ErrAlreadyClaimed, ErrNotSandbox, ErrStaleClaim,
	ErrNotClaimed, ErrNotDue, ErrCorrelationUsed, ErrBadDecision, ErrFinalized, ErrRunEnded,
	ErrResultsDiffer, ErrMalformedCommand}

// IsDecision reports whether err is the aggregate's own answer to a
// command (a refusal with a protocol code, or an illegal transition) rather
// than a failure of the caller's IO: such a command is settled and must not
// be retried.
func IsDecision(err error) bool {
	if _, ok := events.CodeOf(err); ok {
		return true
	}
	for _, target := range sentinels {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

// Status is a run's state.
type Status string

// Run states.
const (
	StatusRunning  Status = "running"  // accepting a batch, or working on one
	StatusAwaiting Status = "awaiting" // parked on a ticket
	StatusEnded    Status = "ended"    // sealed, with a cause
)

// Run is the folded state of one run: the aggregate. Its fields are
// exported so that it can be inspected and snapshotted; change it only
// through Apply.
type Run struct {
	RunID    string `msgpack:"run_id"`
	ThreadID string `msgpack:"thread_id"`
	// HasStep reports whether a batch was ever accepted; LastStep is then
	// the step of the last accepted batch.
	HasStep  bool  `msgpack:"has_step"`
	LastStep int64 `msgpack:"last_step"`
	// Digests holds the digest of every accepted step, so that an
	// identical resubmission is recognised. Never written in place (see
	// Clone).
	Digests map[int64]string `msgpack:"digests"`
	// Batch is the latest accepted batch (open or finalized).
	Batch *Batch `msgpack:"batch"`
	// Correlations holds every correlation id issued in the run, true once
	// its ticket was resolved or cleared. Never written in place (see
	// Clone).
	Correlations map[string]bool `msgpack:"correlations"`
	// End is set once the run has ended.
	End *Ended `msgpack:"end"`
	// Version counts the events applied.
	Version int `msgpack:"version"`
}

// Ended records why and when a run ended.
type Ended struct {
	Cause  events.EndCause `msgpack:"cause"`
	Reason string          `msgpack:"reason"`
	At     time.Time       `msgpack:"at"`
}

// Batch is a run's batch and its calls.
type Batch struct {
	ID         string         `msgpack:"id"`
	Step       int64          `msgpack:"step"`
	ThreadID   string         `msgpack:"thread_id"`
	SnapshotID string         `msgpack:"snapshot_id"`
	Narrowing  string         `msgpack:"narrowing"`
	Assistant  events.Message `msgpack:"assistant"`
	Calls      []Call         `msgpack:"calls"`
	// Parallel reports whether the calls entered executing together (the
	// parallel delegation branch).
	Parallel bool `msgpack:"parallel"`
	// Ticket is the one wait parking the batch, if any.
	Ticket    *events.Ticket        `msgpack:"ticket"`
	Finalized bool                  `msgpack:"finalized"`
	Results   []events.ContentBlock `msgpack:"results"`
	State     []events.Command      `msgpack:"state"`
	Conflict  string                `msgpack:"conflict"`
	// Digest, MsgID and InboxSeq name the submission accepted as the
	// batch (BatchSubmitted's), what its results name.
	Digest   string `msgpack:"digest"`
	MsgID    string `msgpack:"msg_id"`
	InboxSeq uint64 `msgpack:"inbox_seq"`
}

// Call is one call and its durable phase.
type Call struct {
	events.Call `msgpack:",inline"`
	Phase       events.Phase `msgpack:"phase"`
	// Attempt is the latest attempt that entered executing (0: none).
	Attempt int `msgpack:"attempt"`
	// Crossed reports whether the latest attempt crossed its dispatch
	// boundary: at executing for brain and delegation tools (they are
	// invoked right after the commit), at the claim for sandbox tools.
	Crossed bool `msgpack:"crossed"`
	// Capability is the live capability recorded when the latest attempt
	// entered executing.
	Capability events.Capability `msgpack:"capability"`
	// Claim is the latest attempt's claim (sandbox tools).
	Claim *Grant `msgpack:"claim"`
	// Gate is the latest gate decision.
	Gate *events.CallGated `msgpack:"gate"`
	// Output is set when completed; ErrorKind classifies an error output.
	Output    *events.Output   `msgpack:"output"`
	ErrorKind events.ErrorKind `msgpack:"error_kind"`
	// OutputBytes is the size of Output as canonical JSON
	// (events.OutputSize), measured once when it is set: what counts
	// against the batch's output limit, which would otherwise measure
	// every output of the batch again at each result.
	OutputBytes int `msgpack:"output_bytes"`
	// Reason is set when indeterminate.
	Reason string `msgpack:"reason"`
	// Input is the input a delegated child was resumed with, when HasInput:
	// the executor resumes the child with it rather than starting it.
	Input    string `msgpack:"input"`
	HasInput bool   `msgpack:"has_input"`
	// Entries counts executor entries: executing commits of brain and
	// delegation attempts, claims of sandbox attempts.
	Entries int `msgpack:"entries"`
}

// Grant is a granted claim of one attempt.
type Grant struct {
	Attempt     int       `msgpack:"attempt"`
	WorkerID    string    `msgpack:"worker_id"`
	Incarnation string    `msgpack:"incarnation,omitempty"`
	Token       string    `msgpack:"token"`
	LeaseMS     int64     `msgpack:"lease_ms"`
	At          time.Time `msgpack:"at"`
}

// New returns the empty state of a run.
func New(runID string) *Run {
	return &Run{RunID: runID, Digests: map[int64]string{}, Correlations: map[string]bool{}}
}

// Status returns the run's state.
func (r *Run) Status() Status {
	switch {
	case r.End != nil:
		return StatusEnded
	case r.Batch != nil && r.Batch.Ticket != nil:
		return StatusAwaiting
	default:
		return StatusRunning
	}
}

// OpenBatch returns the batch that is not finalized, or nil.
func (r *Run) OpenBatch() *Batch {
	if r.Batch == nil || r.Batch.Finalized {
		return nil
	}
	return r.Batch
}

// TicketCall returns the call of the run's ticket when correlationID names
// it, or nil: the call whose live capability a resume or perform of that
// ticket needs.
func (r *Run) TicketCall(correlationID string) *Call {
	t := r.Ticket()
	if t == nil || t.CorrelationID != correlationID || r.Batch == nil {
		return nil
	}
	c, _ := r.Batch.Call(t.CallID)
	return c
}

// CheckHeartbeat returns nil when a worker's heartbeat names the current
// claim of an executing call of the open batch, and ErrStaleClaim
// otherwise: only the current claim's lease is renewed.
func (r *Run) CheckHeartbeat(batchID, callID string, attempt int, token string) error {
	b := r.OpenBatch()
	if b == nil || b.ID != batchID {
		return ErrStaleClaim
	}
	c, _ := b.Call(callID)
	if c == nil || c.Phase != events.PhaseExecuting || c.Attempt != attempt || c.Claim == nil || c.Claim.Token != token {
		return ErrStaleClaim
	}
	return nil
}

// Ticket returns the run's ticket, or nil.
func (r *Run) Ticket() *events.Ticket {
	if r.Batch == nil {
		return nil
	}
	return r.Batch.Ticket
}

// Call returns the call with the id, or nil.
func (b *Batch) Call(callID string) (*Call, int) {
	for i := range b.Calls {
		if b.Calls[i].CallID == callID {
			return &b.Calls[i], i
		}
	}
	return nil, -1
}

// OperationID returns the call's operation id.
func (b *Batch) OperationID(callID string) string { return events.OperationID(b.ID, callID) }

// AllTerminal reports whether every call is completed or indeterminate.
func (b *Batch) AllTerminal() bool {
	for i := range b.Calls {
		if !b.Calls[i].Phase.Terminal() {
			return false
		}
	}
	return true
}

// ParallelEligible reports whether the batch may take the parallel branch:
// it has at least two calls and every call is a delegation whose descriptor
// supports parallel completion and whose input is an object (a call the
// aggregate completes on its own is not gated).
func (b *Batch) ParallelEligible() bool {
	if len(b.Calls) < 2 {
		return false
	}
	for _, c := range b.Calls {
		if c.Tool.Kind != events.KindDelegation || !c.Tool.ParallelCompletion || !c.Arguments.IsObjectOrNull() || c.Invalid != "" {
			return false
		}
	}
	return true
}

// Clone returns a copy of the run. What no run writes in place is shared:
// calls' pointer fields, and the Digests and Correlations maps, which
// grow with the run and are replaced on each write (once a step or a
// ticket), where a run is cloned for every decision and every projected
// event.
func (r *Run) Clone() *Run {
	c := *r
	if r.Batch != nil {
		b := *r.Batch
		b.Calls = slices.Clone(r.Batch.Calls)
		c.Batch = &b
	}
	return &c
}

// with returns a new map holding m's entries and k = v: how the run's
// maps are written (see Clone).
func with[K comparable, V any](m map[K]V, k K, v V) map[K]V {
	out := make(map[K]V, len(m)+1)
	maps.Copy(out, m)
	out[k] = v
	return out
}

// Snapshot encodes the state, so that a fold can resume from it.
func (r *Run) Snapshot() ([]byte, error) { return events.Marshal(r) }

// Restore decodes a snapshot.
func Restore(b []byte) (*Run, error) {
	r := New("")
	if err := events.Unmarshal(b, r); err != nil {
		return nil, fmt.Errorf("restore snapshot: %w", err)
	}
	if r.Digests == nil {
		r.Digests = map[int64]string{}
	}
	if r.Correlations == nil {
		r.Correlations = map[string]bool{}
	}
	return r, nil
}
