package engine

import (
	"strings"

	"github.com/toolbatch/toolbatch/events"
)

// Names derives stream names and subjects from the subject prefix.
type Names struct {
	Prefix string
}

// DefaultPrefix is the default subject prefix.
const DefaultPrefix = "toolbatch"

func (n Names) stream(kind string) string { return events.StreamName(n.Prefix, kind) }

// Stream names: TOOLBATCH_EVENTS and so on for the default prefix.
func (n Names) EventsStream() string   { return n.stream("EVENTS") }
func (n Names) InboxStream() string    { return n.stream("INBOX") }
func (n Names) DispatchStream() string { return n.stream("DISPATCH") }
func (n Names) OutStream() string      { return n.stream("OUT") }
func (n Names) TimersStream() string   { return n.stream("TIMERS") }
func (n Names) CatalogBucket() string  { return n.stream("CATALOGS") }
func (n Names) RegistryBucket() string { return n.stream("REGISTRY") }
func (n Names) StateBucket() string    { return n.stream("STATE") }

// Subjects.
func (n Names) Events(runID string) string { return n.Prefix + ".events." + runID }
func (n Names) Submit(runID string) string { return n.Prefix + ".submit." + runID }
func (n Names) Resume(runID string) string { return n.Prefix + ".resume." + runID }
func (n Names) Control(runID string) string {
	return n.Prefix + ".control." + runID
}
func (n Names) Result(runID string) string    { return n.Prefix + ".result." + runID }
func (n Names) Out(runID, kind string) string { return n.Prefix + ".out." + runID + "." + kind }
func (n Names) Brain(toolID string) string    { return n.Prefix + ".brain." + toolID }
func (n Names) Gate() string                  { return n.Prefix + ".gate" }
func (n Names) Dispatch(pool, toolID string) string {
	return n.Prefix + ".dispatch." + pool + "." + toolID
}

// inboxKind splits an inbox subject into its kind (submit, resume, control,
// result), run id and principal (resume only). ok is false when the subject
// cannot be attributed to a run.
func (n Names) inboxKind(subject string) (kind, runID, principal string, ok bool) {
	rest, found := strings.CutPrefix(subject, n.Prefix+".")
	if !found {
		return "", "", "", false
	}
	parts := strings.Split(rest, ".")
	switch {
	case len(parts) == 2:
		return parts[0], parts[1], "", true
	case len(parts) == 3 && parts[0] == "resume":
		return parts[0], parts[1], parts[2], true
	case len(parts) == 3 && parts[0] == "timer" && parts[1] == "fire":
		return "timer", parts[2], "", true
	default:
		return "", "", "", false
	}
}

// Log field names, defined once.
const (
	fieldRunID     = "run_id"
	fieldBatchID   = "batch_id"
	fieldCallID    = "call_id"
	fieldStreamSeq = "stream_seq"
	fieldSubject   = "subject"
)

// TimerAt is the subject of a ticket's schedule in the timers stream.
func (n Names) TimerAt(runID, action, correlationID string) string {
	return n.Prefix + ".timer.at." + runID + "." + action + "." + correlationID
}

// TimerFire is where a run's schedules fire.
func (n Names) TimerFire(runID string) string { return n.Prefix + ".timer.fire." + runID }

// Delegate is a delegation service's subject.
func (n Names) Delegate(toolID string) string { return n.Prefix + ".delegate." + toolID }

// API is a request/reply subject of the engine: claim, heartbeat.
func (n Names) API(kind string) string { return n.Prefix + ".api." + kind }

// Forward is where other engines forward the messages of the runs an
// engine owns (core NATS, engine internal).
func (n Names) Forward(engineID string) string { return n.Prefix + ".engine." + engineID + ".forward" }

// WorkersBucket holds the live workers' advertisements.
func (n Names) WorkersBucket() string { return n.stream("WORKERS") }

// OwnersBucket holds which engine works on which run.
func (n Names) OwnersBucket() string { return n.stream("OWNERS") }
