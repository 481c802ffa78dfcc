package aggregate

import (
	"time"

	"github.com/toolbatch/toolbatch/events"
)

// Command asks the aggregate to decide one transition. Commands carry
// everything the decision needs that is not in the state: the time, new
// ids, the catalog's descriptors and the live capabilities. The engine
// gathers those (that is its IO) and the aggregate decides.
type Command interface{ command() }

// Submit accepts or refuses a batch. Tools holds the descriptor pinned for
// each call, in call order (Kind unknown for a tool the catalog lacks). A
// refusal is decided as the BatchRejected event that records it.
type Submit struct {
	Submission events.Submission
	Tools      []events.Descriptor
	// ArgumentProblems says, for each call in call order, why its
	// arguments do not match its tool's input schema ("" when they do;
	// nil: all match).
	ArgumentProblems []string
	SnapshotID       string
	// MaxPayload is the largest message the log's server takes (0: no
	// limit), and SubmissionBytes the size of the submission as it arrived:
	// a batch whose commit would not fit one message is refused.
	MaxPayload      int
	SubmissionBytes int
	// MsgID and InboxSeq name the inbox message the submission came in
	// (its Nats-Msg-Id and stream sequence), recorded so that the answer
	// names them.
	MsgID    string
	InboxSeq uint64
	At       time.Time
}

// CommitHeaderRoom is what a commit's headers take at most, beyond its
// body: the event types, the previous sequence, the message id and the
// expected sequence.
const CommitHeaderRoom = 8 << 10

// Reject records a submission refused before it could be decided (its body
// does not decode, or names another run): the decision is its BatchRejected.
// Step names the batch when the body decoded far enough (HasStep).
type Reject struct {
	Step    int64
	HasStep bool
	Refusal *events.Refusal
	// MsgID, InboxSeq and Digest name the submission, as Submit's do
	// (Digest: when its body decoded).
	MsgID    string
	InboxSeq uint64
	Digest   string
	At       time.Time
}

// Gate applies gate decisions. Normally it holds one decision, for the call
// Next names. For a batch eligible for the parallel branch it holds one
// decision per call, in model order: if every one allows, all calls enter
// executing in one commit; otherwise only the first call's decision is
// applied and the batch goes on one call at a time (the other calls are
// gated again when their turn comes).
type Gate struct {
	Decisions []Decision
	At        time.Time
}

// Decision is the gate chain's outcome for one call.
type Decision struct {
	CallID  string
	Outcome events.GateOutcome
	Stage   string // narrowing, policy, external or default
	Rule    string // the rule that decided, for the audit
	Reason  string // block
	Output  *events.Output
	// CorrelationID names the new ticket (require_confirmation, schedule).
	CorrelationID string
	Deadline      *time.Time // require_confirmation: when the ticket expires
	Due           *time.Time // schedule: when the engine performs it
	ActionKind    string     // schedule
	// Capability is the executor's live recovery capability (allow).
	Capability events.Capability
}

// ParkClient parks a client-executed call on an external_result ticket.
type ParkClient struct {
	CallID        string
	CorrelationID string
	Deadline      *time.Time
	At            time.Time
}

// Claim grants an attempt of a sandbox call to a worker: the dispatch
// boundary.
type Claim struct {
	CallID      string
	Attempt     int
	WorkerID    string
	Incarnation string // the worker process's id: its claim again is granted again
	Token       string
	LeaseMS     int64
	At          time.Time
}

// Complete reports an attempt's outcome: an output, or an error. A sandbox
// outcome carries the claim token (fencing); the engine's own
// unavailable_before_dispatch for an unclaimed attempt carries none.
type Complete struct {
	CallID     string
	Attempt    int
	ClaimToken string
	Output     *events.Output
	Error      *events.ToolError
	Limits     OutputLimits
	At         time.Time
}

// OutputLimits bound what an output may add to the log; 0 means no limit.
// An output over a limit completes the call with an execution error
// instead.
type OutputLimits struct {
	// MaxOutputBytes bounds one output (its canonical JSON).
	MaxOutputBytes int
	// MaxBatchOutputBytes bounds the outputs of a batch together: the
	// barrier's commit carries every one of them again.
	MaxBatchOutputBytes int
}

// Result is a sandbox worker's report of an attempt, on the inbox: the
// outcome, as a Complete, of a call of the batch BatchID. When it is the
// current claim's it completes the call, as Complete does; otherwise
// (fencing: another token, a stale attempt, a call that moved on) the
// decision records it as ResultRefused and applies nothing. A result for a
// batch that is not the run's latest changes nothing and is refused with
// the reason.
type Result struct {
	BatchID string
	Complete
}

// Resume answers the run's ticket, as a resume message says (package
// protocol decodes it). Principal is who decided, when known.
// Capability is the live capability of the ticket's tool (for approval).
type Resume struct {
	Answer     events.Answer
	Principal  string
	Capability events.Capability
	At         time.Time
}

// Perform performs a scheduled ticket: explicitly (a control message), or at
// its due time when Timer is set.
type Perform struct {
	CorrelationID string
	Principal     string
	Timer         bool
	Capability    events.Capability
	At            time.Time
}

// Expire resolves a ticket whose deadline has passed.
type Expire struct {
	CorrelationID string
	At            time.Time
}

// DelegationAwait reports that a delegated child awaits input.
type DelegationAwait struct {
	CallID        string
	Attempt       int
	CorrelationID string
	Deadline      *time.Time
	At            time.Time
}

// LeaseExpired reports that an attempt's owner was lost: a sandbox claim's
// lease ran out without a heartbeat (ClaimToken names it), or a delegation
// answered with a retryable error. The recovery table decides.
type LeaseExpired struct {
	CallID     string
	Attempt    int
	ClaimToken string
	Capability events.Capability
	At         time.Time
}

// Recover takes over a run whose batch is not finalized (after a restart,
// or from another engine): every executing call is decided by the recovery
// table, with the live capability of its tool (a call missing from
// Capabilities is taken as non_recoverable).
type Recover struct {
	Capabilities map[string]events.Capability
	// Exclude names calls to leave executing: a claimed sandbox attempt
	// whose lease is still watched.
	Exclude map[string]bool
	At      time.Time
}

// End ends the run: cancel or interrupt.
type End struct {
	Cause  events.EndCause
	Reason string
	At     time.Time
}

func (Submit) command()          {}
func (Reject) command()          {}
func (Result) command()          {}
func (Gate) command()            {}
func (ParkClient) command()      {}
func (Claim) command()           {}
func (Complete) command()        {}
func (Resume) command()          {}
func (Perform) command()         {}
func (Expire) command()          {}
func (DelegationAwait) command() {}
func (LeaseExpired) command()    {}
func (Recover) command()         {}
func (End) command()             {}
