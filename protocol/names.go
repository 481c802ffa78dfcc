package protocol

import (
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/events"
)

// DefaultPrefix is the default subject prefix (the engine's --prefix).
const DefaultPrefix = "toolbatch"

// ValidPrefix reports whether p can be a subject prefix: one or more
// dot-separated NATS tokens of A-Z, a-z, 0-9, _ and -.
func ValidPrefix(p string) bool {
	for tok := range strings.SplitSeq(p, ".") {
		if !events.IDToken(tok) {
			return false
		}
	}
	return true
}

// Stream is the kind of one of toolbatch's JetStream streams: the part of
// its name after the upper-cased prefix (TOOLBATCH_EVENTS for StreamEvents
// under the default prefix).
type Stream string

// The streams.
const (
	StreamEvents   Stream = "EVENTS"   // the event log: the only source of truth
	StreamInbox    Stream = "INBOX"    // commands from clients and workers (trimmed by the engines)
	StreamDispatch Stream = "DISPATCH" // sandbox jobs (trimmed by the engines)
	StreamOut      Stream = "OUT"      // projections for subscribers
	StreamTimers   Stream = "TIMERS"   // ticket timers and their fires (work queue)
	// StreamCheckpoints holds the engines' signed checkpoints of the events
	// stream (limits): anchors outside the log that an auditor compares
	// the log with.
	StreamCheckpoints Stream = "CHECKPOINTS"
)

// Bucket is the kind of one of toolbatch's KV buckets, named like a stream.
type Bucket string

// The KV buckets.
const (
	BucketCatalogs Bucket = "CATALOGS" // catalogs by snapshot id
	BucketRegistry Bucket = "REGISTRY" // live executor capabilities
	BucketState    Bucket = "STATE"    // committed state
	BucketWorkers  Bucket = "WORKERS"  // live sandbox workers' advertisements
	BucketOwners   Bucket = "OWNERS"   // which engine works on which run
	BucketKeys     Bucket = "KEYS"     // engines' public signing keys
	BucketTickets  Bucket = "TICKETS"  // every run's open ticket
)

// Placeholders of a subject family's tokens.
const (
	TokRunID         = "{run_id}"
	TokPrincipal     = "{principal}"
	TokKind          = "{kind}"
	TokPool          = "{pool}"
	TokToolID        = "{tool_id}"
	TokEngineID      = "{engine_id}"
	TokAction        = "{action}"
	TokCorrelationID = "{correlation_id}"
	TokClient        = "{client}"
)

// Family is one family of subjects of the public interface: the tokens that
// follow the prefix, literal or placeholders (Tok*), and the stream that
// stores it ("" for core NATS request/reply). Every subject any program
// publishes or subscribes to is built from a Family, so that the layout is
// written once and a permission table can be computed from Families.
type Family struct {
	Name   string
	Tokens []string
	Stream Stream
}

// The subject families.
var (
	EventsFamily = Family{"events", []string{"events", TokRunID}, StreamEvents}
	SubmitFamily = Family{"submit", []string{"submit", TokRunID}, StreamInbox}
	// SubmitAsFamily is a submission attributed to a client (the public
	// nkey of its NATS user, which permissions bind it to): the engine's
	// per-client limits count it under that client.
	SubmitAsFamily = Family{"submit_as", []string{"submit", TokRunID, TokClient}, StreamInbox}
	ResumeFamily   = Family{"resume", []string{"resume", TokRunID}, StreamInbox}
	ResumeAsFamily = Family{"resume_as", []string{"resume", TokRunID, TokPrincipal}, StreamInbox}
	ControlFamily  = Family{"control", []string{"control", TokRunID}, StreamInbox}
	ResultFamily   = Family{"result", []string{"result", TokRunID}, StreamInbox}
	DispatchFamily = Family{"dispatch", []string{"dispatch", TokPool, TokToolID}, StreamDispatch}
	OutFamily      = Family{"out", []string{"out", TokRunID, TokKind}, StreamOut}
	TimerAtFamily  = Family{"timer_at", []string{"timer", "at", TokRunID, TokAction, TokCorrelationID}, StreamTimers}
	// TimerFireFamily is where the server publishes a schedule when it is due.
	TimerFireFamily = Family{"timer_fire", []string{"timer", "fire", TokRunID}, StreamTimers}
	ClaimFamily     = Family{"claim", []string{"api", "claim"}, ""}
	HeartbeatFamily = Family{"heartbeat", []string{"api", "heartbeat"}, ""}
	// ResultRequestFamily is where a worker asks the run's owner to record
	// its result (request/reply; the inbox's result subject is the
	// fallback when no engine answers).
	ResultRequestFamily = Family{"result_request", []string{"api", "result"}, ""}
	GateFamily          = Family{"gate", []string{"gate"}, ""}
	BrainFamily         = Family{"brain", []string{"brain", TokToolID}, ""}
	DelegateFamily      = Family{"delegate", []string{"delegate", TokToolID}, ""}
	// ForwardFamily carries the messages other engines forward to the owner of
	// their run (engine internal).
	ForwardFamily = Family{"forward", []string{"engine", TokEngineID, "forward"}, ""}
	// PingFamily is where an engine answers other engines' liveness probes
	// (engine internal).
	PingFamily = Family{"ping", []string{"engine", TokEngineID, "ping"}, ""}
	// CheckpointFamily is where the engine that leads the projection
	// publishes its signed checkpoints of the events stream.
	CheckpointFamily = Family{"checkpoint", []string{"checkpoint", "events"}, StreamCheckpoints}
	// CheckpointRequestFamily asks for a checkpoint now (request/reply,
	// answered by the engine that leads the projection).
	CheckpointRequestFamily = Family{"checkpoint_request", []string{"api", "checkpoint"}, ""}
)

// Families lists every subject family, in the order of docs/protocol.md.
var Families = []Family{EventsFamily, SubmitFamily, SubmitAsFamily, ResumeFamily, ResumeAsFamily, ControlFamily, ResultFamily, DispatchFamily, OutFamily,
	TimerAtFamily, TimerFireFamily, ClaimFamily, HeartbeatFamily, ResultRequestFamily, GateFamily, BrainFamily, DelegateFamily, ForwardFamily, PingFamily,
	CheckpointFamily, CheckpointRequestFamily}

// Out kinds: the last token of an out subject.
const (
	OutDisposition = "disposition"
	OutResults     = "results"
	OutAwaiting    = "awaiting"
	OutRejected    = "rejected"
	OutRefused     = "refused"
	OutEnded       = "ended"
	// OutThrottled carries a submission refused by its client's limits
	// before any work on its run (a RejectedOut, code throttled). It is
	// not derived from a commit, so it has a subject of its own: the
	// projection's subjects hold only what commits derive, and what the
	// last message on one of them says is what the projection published.
	OutThrottled = "throttled"
)

// Names derives stream names and subjects from the subject prefix.
type Names struct {
	Prefix string
}

// Subject builds a subject of f: args fill its placeholders in order. An
// argument may be a wildcard: "*", or ">", which covers every token after
// it.
func (n Names) Subject(f Family, args ...string) string {
	var b strings.Builder
	b.WriteString(n.Prefix)
	i := 0
	for _, t := range f.Tokens {
		b.WriteByte('.')
		if isPlaceholder(t) {
			if i < len(args) {
				b.WriteString(args[i])
				if args[i] == ">" {
					return b.String() // covers the remaining tokens
				}
			}
			i++
			continue
		}
		b.WriteString(t)
	}
	return b.String()
}

// Pattern is the subject of f with every placeholder a "*" wildcard: what
// a permission or a filter that covers the whole family names.
func (n Names) Pattern(f Family) string {
	args := make([]string, 0, len(f.Tokens))
	for range f.Tokens {
		args = append(args, "*")
	}
	return n.Subject(f, args...)
}

// Match reports whether subject belongs to f, and returns the values of
// its placeholders in order.
func (n Names) Match(f Family, subject string) ([]string, bool) {
	rest, ok := strings.CutPrefix(subject, n.Prefix+".")
	if !ok {
		return nil, false
	}
	toks := strings.Split(rest, ".")
	if len(toks) != len(f.Tokens) {
		return nil, false
	}
	var vals []string
	for i, t := range f.Tokens {
		switch {
		case isPlaceholder(t):
			if toks[i] == "" {
				return nil, false
			}
			vals = append(vals, toks[i])
		case toks[i] != t:
			return nil, false
		}
	}
	return vals, true
}

// RunOf returns the run id of a subject of f (a family whose first
// placeholder is the run id).
func (n Names) RunOf(f Family, subject string) (string, bool) {
	vals, ok := n.Match(f, subject)
	if !ok || len(vals) == 0 {
		return "", false
	}
	return vals[0], true
}

func isPlaceholder(t string) bool { return strings.HasPrefix(t, "{") }

// StreamName returns a stream's name: the prefix upper-cased, every
// character outside [A-Z0-9] as _, then _ and the kind (TOOLBATCH_EVENTS
// for the default prefix).
func (n Names) StreamName(s Stream) string { return n.upper() + "_" + string(s) }

// BucketName returns a KV bucket's name, formed like a stream's.
func (n Names) BucketName(b Bucket) string { return n.upper() + "_" + string(b) }

func (n Names) upper() string {
	up := []byte(n.Prefix)
	for i, c := range up {
		switch {
		case c >= 'a' && c <= 'z':
			up[i] = c - 'a' + 'A'
		case c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		default:
			up[i] = '_'
		}
	}
	return string(up)
}

// StreamSubjects returns the subjects a stream is configured with: one
// filter per first token of its families.
func (n Names) StreamSubjects(s Stream) []string {
	var out []string
	for _, f := range Families {
		if f.Stream != s {
			continue
		}
		subj := n.Prefix + "." + f.Tokens[0] + ".>"
		if !slices.Contains(out, subj) {
			out = append(out, subj)
		}
	}
	return out
}

// Stream names: TOOLBATCH_EVENTS and so on for the default prefix.
func (n Names) EventsStream() string   { return n.StreamName(StreamEvents) }
func (n Names) InboxStream() string    { return n.StreamName(StreamInbox) }
func (n Names) DispatchStream() string { return n.StreamName(StreamDispatch) }
func (n Names) OutStream() string      { return n.StreamName(StreamOut) }
func (n Names) TimersStream() string   { return n.StreamName(StreamTimers) }
func (n Names) CheckpointsStream() string {
	return n.StreamName(StreamCheckpoints)
}
func (n Names) CatalogBucket() string  { return n.BucketName(BucketCatalogs) }
func (n Names) RegistryBucket() string { return n.BucketName(BucketRegistry) }
func (n Names) StateBucket() string    { return n.BucketName(BucketState) }
func (n Names) WorkersBucket() string  { return n.BucketName(BucketWorkers) }
func (n Names) OwnersBucket() string   { return n.BucketName(BucketOwners) }
func (n Names) KeysBucket() string     { return n.BucketName(BucketKeys) }
func (n Names) TicketsBucket() string  { return n.BucketName(BucketTickets) }

// Subjects of the families, by name.
func (n Names) Events(runID string) string { return n.Subject(EventsFamily, runID) }
func (n Names) Submit(runID string) string { return n.Subject(SubmitFamily, runID) }

// SubmitAs is a submission attributed to client (its public nkey).
func (n Names) SubmitAs(runID, client string) string { return n.Subject(SubmitAsFamily, runID, client) }
func (n Names) Resume(runID string) string           { return n.Subject(ResumeFamily, runID) }
func (n Names) Control(runID string) string          { return n.Subject(ControlFamily, runID) }
func (n Names) Result(runID string) string           { return n.Subject(ResultFamily, runID) }
func (n Names) Out(runID, kind string) string        { return n.Subject(OutFamily, runID, kind) }
func (n Names) Brain(toolID string) string           { return n.Subject(BrainFamily, toolID) }
func (n Names) Gate() string                         { return n.Subject(GateFamily) }
func (n Names) Delegate(toolID string) string        { return n.Subject(DelegateFamily, toolID) }
func (n Names) Dispatch(pool, toolID string) string {
	return n.Subject(DispatchFamily, pool, toolID)
}

// ResumeAs is a resume published as principal (attributed approvals).
func (n Names) ResumeAs(runID, principal string) string {
	return n.Subject(ResumeAsFamily, runID, principal)
}

// TimerAt is the subject of a ticket's schedule in the timers stream.
func (n Names) TimerAt(runID, action, correlationID string) string {
	return n.Subject(TimerAtFamily, runID, action, correlationID)
}

// TimerFire is where a run's schedules fire.
func (n Names) TimerFire(runID string) string { return n.Subject(TimerFireFamily, runID) }

// Claim and Heartbeat are the engine's request/reply subjects for workers.
func (n Names) Claim() string     { return n.Subject(ClaimFamily) }
func (n Names) Heartbeat() string { return n.Subject(HeartbeatFamily) }

// ResultRequest is where a worker asks the engine to record its result.
func (n Names) ResultRequest() string { return n.Subject(ResultRequestFamily) }

// Forward is where other engines forward the messages of the runs an
// engine owns (core NATS, engine internal).
func (n Names) Forward(engineID string) string { return n.Subject(ForwardFamily, engineID) }

// Ping is where an engine answers the liveness probes of the others.
func (n Names) Ping(engineID string) string { return n.Subject(PingFamily, engineID) }

// Checkpoint is where the signed checkpoints of the events stream are
// published; CheckpointRequest asks for one now.
func (n Names) Checkpoint() string        { return n.Subject(CheckpointFamily) }
func (n Names) CheckpointRequest() string { return n.Subject(CheckpointRequestFamily) }

// RunOut is the filter of every out subject of a run.
func (n Names) RunOut(runID string) string { return n.Subject(OutFamily, runID, ">") }

// OutKind returns the run id and kind of an out subject.
func (n Names) OutKind(subject string) (runID, kind string, ok bool) {
	vals, ok := n.Match(OutFamily, subject)
	if !ok {
		return "", "", false
	}
	return vals[0], vals[1], true
}

// Inbox kinds: what an inbox or timer message asks of its run.
const (
	KindSubmit  = "submit"
	KindResume  = "resume"
	KindControl = "control"
	KindResult  = "result"
	KindTimer   = "timer"
)

// InboxKind splits a subject the engine consumes (the inbox families and
// TimerFire) into its kind, run id and who it names: the principal of an
// attributed resume, the client of an attributed submission. ok is false
// when the subject cannot be attributed to a run.
func (n Names) InboxKind(subject string) (kind, runID, principal string, ok bool) {
	for _, k := range []struct {
		f    Family
		kind string
	}{{SubmitFamily, KindSubmit}, {SubmitAsFamily, KindSubmit}, {ResumeFamily, KindResume}, {ResumeAsFamily, KindResume}, {ControlFamily, KindControl},
		{ResultFamily, KindResult}, {TimerFireFamily, KindTimer}} {
		if vals, ok := n.Match(k.f, subject); ok {
			if len(vals) == 2 {
				principal = vals[1]
			}
			return k.kind, vals[0], principal, true
		}
	}
	return "", "", "", false
}

// Durable consumer names.
const (
	// ConsumerEngine is the engines' shared consumer of the inbox and of
	// the timers' fires.
	ConsumerEngine = "engine"
	// ConsumerProjector is the projector's consumer of the events stream.
	ConsumerProjector = "projector"
)

// PoolConsumer is the workers' shared consumer of a pool's tool on the
// dispatch stream.
func PoolConsumer(pool, toolID string) string { return PoolConsumerPrefix + pool + "-" + toolID }

// PoolConsumerPrefix begins the name of every pool consumer.
const PoolConsumerPrefix = "pool-"

// Headers of the public interface.
const (
	// HeaderMsgID is JetStream's deduplication id.
	HeaderMsgID = jetstream.MsgIDHeader
	// HeaderContentType with ContentTypeJSON marks a JSON submit, resume or
	// control body (msgpack otherwise).
	HeaderContentType = "Content-Type"
	ContentTypeJSON   = "application/json"
	// HeaderEvent carries the type names of a commit's events, in order.
	HeaderEvent = "Toolbatch-Event"
	// HeaderPrev carries the stream sequence of the run's previous commit
	// (0 for its first), so that a reader can tell it has every commit.
	HeaderPrev = "Toolbatch-Prev"
	// HeaderPrevHash carries the hash of the run's previous commit (64
	// zeros for its first), so that a run's commits are a hash chain.
	HeaderPrevHash = "Toolbatch-Prev-Hash"
	// HeaderSigner is the public key (an nkey) of the engine that signed
	// the commit; HeaderSig its ed25519 signature, in base64url, of the
	// root of the signed batch of commits the commit is a leaf of, and
	// HeaderSigProof the commit's place in that batch:
	// "<index>/<size>" then ":" and the Merkle audit path, leaf to root,
	// each hash base64url, joined by ",".
	HeaderSigner   = "Toolbatch-Signer"
	HeaderSig      = "Toolbatch-Sig"
	HeaderSigProof = "Toolbatch-Sig-Proof"
	// HeaderTraceParent is the W3C trace context: on a submit, the batch's
	// parent span; on the commit of its BatchSubmitted, the same, kept for
	// whichever engine ends the batch; on a sandbox dispatch, the
	// attempt's span.
	HeaderTraceParent = "traceparent"
	// HeaderSource names the commit an out message was derived from:
	// "<events stream sequence>/<index of the output in that commit>".
	HeaderSource = "Toolbatch-Source"
	// HeaderStateReplaced, HeaderStateMerged and HeaderStateFields are a
	// committed state key's stamps (docs/protocol.md 5.4), each
	// "<events stream sequence>/<index of the command in its batch>": the
	// command that last replaced the value whole, the latest object merge
	// since, and a JSON object of each field that merges wrote since.
	HeaderStateReplaced = "Toolbatch-State-Replaced"
	HeaderStateMerged   = "Toolbatch-State-Merged"
	HeaderStateFields   = "Toolbatch-State-Fields"
	// HeaderProjected is on the delete marker of a run's key in the owners
	// bucket, written when its engine releases the run: the events stream
	// sequence of the run's last commit, which that engine projected.
	HeaderProjected = "Toolbatch-Projected"
	// HeaderForwardedSubject and HeaderForwardedAck carry a forwarded
	// message's subject and acknowledgement subject (engine internal).
	HeaderForwardedSubject = "Toolbatch-Forwarded-Subject"
	HeaderForwardedAck     = "Toolbatch-Forwarded-Ack"
)

// KV keys.

// OwnerKey is a run's key in the owners bucket.
func OwnerKey(runID string) string { return "run." + runID }

// TicketKey is a run's key in the tickets bucket: its open ticket, as
// JSON AwaitingOut, while it is open (a run has one at most).
func TicketKey(runID string) string { return TicketKeyPrefix + runID }

// TicketKeyPrefix begins every key of the tickets bucket.
const TicketKeyPrefix = "run."

// Key prefixes of the executor advertisements: the workers bucket holds
// sandbox.<pool>.<tool_id>.<worker_id> = capability, the registry bucket
// brain.<tool_id> = capability.
const (
	WorkerKeyPrefix   = "sandbox."
	RegistryKeyPrefix = "brain."
)

// WorkerKey is a worker's advertisement of a pool's tool in the workers
// bucket.
func WorkerKey(pool, toolID, workerID string) string {
	return WorkerKeyPrefix + pool + "." + toolID + "." + workerID
}

// ParseWorkerKey reads a worker's advertisement key (WorkerKey); ok is
// false for any other key.
func ParseWorkerKey(key string) (pool, toolID, workerID string, ok bool) {
	parts := strings.Split(strings.TrimPrefix(key, WorkerKeyPrefix), ".")
	if !strings.HasPrefix(key, WorkerKeyPrefix) || len(parts) != 3 {
		return "", "", "", false
	}
	return parts[0], parts[1], parts[2], true
}

// WorkerFilter matches every worker's advertisement of a pool's tool.
func WorkerFilter(pool, toolID string) string { return WorkerKey(pool, toolID, "*") }

// RegistryKey is a brain tool's capability in the registry bucket.
func RegistryKey(toolID string) string { return RegistryKeyPrefix + toolID }

// PresenceKey is an engine's presence in the owners bucket: it lives
// while the engine renews it, and its deletion (by the engine at shutdown,
// by another engine that found it dead, or by its TTL) hands the runs it
// owned to the others.
func PresenceKey(engineID string) string { return PresenceKeyPrefix + engineID }

// PresenceKeyPrefix begins every engine's presence key.
const PresenceKeyPrefix = "engine."

// SigningKey is an engine's public signing key in the keys bucket: its
// value is the key as a keys file lists it (JSON: key, name, revoked,
// revoked_after). The engines' projectors trust the commits these keys
// sign, as long as they are not revoked at the commit's sequence.
func SigningKey(nkey string) string { return SigningKeyPrefix + nkey }

// SigningKeyPrefix begins every signing key's key in the keys bucket.
const SigningKeyPrefix = "signer."

// UnsignedUntilKey is the key in the keys bucket of the events stream's
// last sequence when the first signing engine started (decimal): commits
// at or below it may be unsigned (written before signing began); every
// later commit must verify.
const UnsignedUntilKey = "unsigned_until"

// CheckpointerLeaderKey is the key in the owners bucket of the engine
// that publishes the checkpoints.
const CheckpointerLeaderKey = "checkpointer"

// StateUnstampedUntilKey is the key in the state bucket of the events
// stream's last sequence when an earlier version's projection was drained
// (decimal): a state key without stamps was written by that version, as of
// then (docs/protocol.md 5.4).
const StateUnstampedUntilKey = "unstamped_until"

// ProjectorLeaderKey is the key in the owners bucket of the engine that
// runs the projector.
const ProjectorLeaderKey = "projector"

// KVStream is the stream a KV bucket is stored in (NATS's layout of
// buckets on streams).
func (n Names) KVStream(b Bucket) string { return "KV_" + n.BucketName(b) }

// KVSubject is the subject a KV bucket stores a key under (NATS's layout
// of buckets on streams), for a direct publish to the bucket.
func (n Names) KVSubject(b Bucket, key string) string { return "$KV." + n.BucketName(b) + "." + key }
