package access

import (
	"fmt"
	"slices"
	"strings"

	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/protocol"
)

// Role is what a NATS user of toolbatch may do.
type Role string

// The roles.
const (
	// RoleEngine runs the engine: the only writer of the events, dispatch,
	// out and timers streams, the buckets and the forward subjects.
	RoleEngine Role = "engine"
	// RoleWorker is a sandbox worker of some pools: it pulls its pools'
	// jobs, claims, heartbeats, publishes results and advertises its own
	// tools under its own name.
	RoleWorker Role = "worker"
	// RoleClient submits batches, controls runs and reads the out stream;
	// it resumes (unattributed) only when its user allows it.
	RoleClient Role = "client"
	// RoleApprover answers tickets as one principal, and reads the out
	// stream.
	RoleApprover Role = "approver"
	// RoleGate, RoleBrain and RoleDelegate are the services the engine
	// calls: each answers its own subjects and nothing else.
	RoleGate     Role = "gate"
	RoleBrain    Role = "brain"
	RoleDelegate Role = "delegate"
	// RoleAuditor reads the events and out streams (for replay) and the
	// catalogs, and nothing else.
	RoleAuditor Role = "auditor"
	// RoleConsole is the operator console (toolbatch console): it reads
	// what an auditor reads, controls runs, and answers tickets as each of
	// the principals it serves, and as no one else.
	RoleConsole Role = "console"
	// RoleAdmin reads and writes everything except that it may not
	// delete or purge toolbatch's streams and buckets.
	RoleAdmin Role = "admin"
)

// Roles lists every role, in the order of docs/security.md.
var Roles = []Role{RoleEngine, RoleWorker, RoleClient, RoleApprover, RoleGate, RoleBrain, RoleDelegate, RoleAuditor, RoleConsole, RoleAdmin}

// Rule is an allow list and a deny list of subjects. An empty allow list
// allows nothing.
type Rule struct {
	Allow []string `json:"allow,omitempty"`
	Deny  []string `json:"deny,omitempty"`
}

// Permissions is a NATS user's permission set.
type Permissions struct {
	Publish   Rule `json:"publish"`
	Subscribe Rule `json:"subscribe"`
	// AllowResponses lets the user answer each request it receives once,
	// on the request's reply subject (NATS's allow_responses).
	AllowResponses bool `json:"allow_responses,omitempty"`
}

// Layout is what a permission set is computed from: the subject layout,
// and the sandbox tools of each pool (a worker may consume only its
// pools' dispatch consumers, one per tool).
type Layout struct {
	Names protocol.Names
	// PoolTools lists the sandbox tools of each pool, from the catalog.
	PoolTools map[string][]string
}

// InboxPrefix is the reply-subject prefix of the user with public key
// nkey: each user subscribes to its own inbox only, so that no one reads
// another's replies (a claim's token, a granted job).
func InboxPrefix(nkey string) string { return "_INBOX_" + nkey }

// InboxOwner returns the public nkey whose inbox subject is (ok false for
// a subject outside every user's inbox).
func InboxOwner(subject string) (nkey string, ok bool) {
	rest, ok := strings.CutPrefix(subject, "_INBOX_")
	if !ok {
		return "", false
	}
	nkey, _, ok = strings.Cut(rest, ".")
	return nkey, ok && validNKey(nkey)
}

// IsInbox reports whether subject is a reply inbox: a user's own
// (_INBOX_<nkey>.) or the NATS clients' default (_INBOX.). The engine
// answers requests there only, never on a subject a request names as its
// reply to have the engine publish into a stream.
func IsInbox(subject string) bool {
	return strings.HasPrefix(subject, "_INBOX.") || strings.HasPrefix(subject, "_INBOX_")
}

// Permissions computes u's permission set. It is the one place where a
// role becomes subjects: every subject comes from the families of package
// protocol.
func (l Layout) Permissions(u User) (Permissions, error) {
	if err := u.Check(); err != nil {
		return Permissions{}, err
	}
	n := l.Names
	own := InboxPrefix(u.NKey) + ".>"
	var p Permissions
	p.Subscribe.Allow = []string{own}
	pub := func(s ...string) { p.Publish.Allow = append(p.Publish.Allow, s...) }
	sub := func(s ...string) { p.Subscribe.Allow = append(p.Subscribe.Allow, s...) }
	switch u.Role {
	case RoleEngine:
		pub(n.Prefix+".>", "$JS.API.>", "$JS.ACK.>")
		for _, b := range buckets {
			pub(n.KVSubject(b, ">"))
		}
		sub(n.Pattern(protocol.ClaimFamily), n.Pattern(protocol.HeartbeatFamily), n.Pattern(protocol.ResultRequestFamily), n.Pattern(protocol.ForwardFamily), n.Pattern(protocol.PingFamily),
			n.Pattern(protocol.CheckpointRequestFamily))
		p.AllowResponses = true // claims and heartbeats are answered on the worker's inbox
		// the engines trim the inbox and dispatch streams below what
		// their consumers acknowledged (engine/trim.go)
		p.Publish.Deny = l.destructive(protocol.StreamInbox, protocol.StreamDispatch)
	case RoleWorker:
		pub(n.Pattern(protocol.ClaimFamily), n.Pattern(protocol.HeartbeatFamily), n.Pattern(protocol.ResultRequestFamily), n.Pattern(protocol.ResultFamily))
		pub(streamInfo(n.KVStream(protocol.BucketWorkers)))
		for _, pool := range u.Pools {
			for _, tool := range l.PoolTools[pool] {
				c := protocol.PoolConsumer(pool, tool)
				pub(consumerAPI("INFO", n.DispatchStream(), c), consumerAPI("MSG.NEXT", n.DispatchStream(), c),
					"$JS.ACK."+n.DispatchStream()+"."+c+".>")
			}
			// its own advertisements only: sandbox.<pool>.<tool_id>.<its name>
			pub(n.KVSubject(protocol.BucketWorkers, protocol.WorkerKey(pool, "*", u.Name)))
		}
	case RoleClient, RoleApprover:
		if u.Role == RoleClient {
			// its own submissions only: the engine's per-client limits
			// count them under its key
			pub(n.Subject(protocol.SubmitAsFamily, "*", u.NKey), n.Pattern(protocol.ControlFamily))
			if u.Resume {
				pub(n.Pattern(protocol.ResumeFamily))
			}
		} else {
			pub(n.Subject(protocol.ResumeAsFamily, "*", u.Principal))
		}
		pub(reader(n.OutStream())...)
		// every run's open ticket (what the out stream says too)
		pub(reader(n.KVStream(protocol.BucketTickets))...)
	case RoleGate:
		sub(n.Pattern(protocol.GateFamily))
		p.AllowResponses = true
	case RoleBrain, RoleDelegate:
		f := protocol.BrainFamily
		if u.Role == RoleDelegate {
			f = protocol.DelegateFamily
		}
		for _, tool := range toolsOr(u.Tools) {
			sub(n.Subject(f, tool))
			if u.Role == RoleBrain { // a host service registers its tools' capability
				pub(n.KVSubject(protocol.BucketRegistry, protocol.RegistryKey(tool)))
			}
		}
		if u.Role == RoleBrain {
			pub(streamInfo(n.KVStream(protocol.BucketRegistry)))
		}
		p.AllowResponses = true
	case RoleAuditor, RoleConsole:
		p.Publish.Deny = append(p.Publish.Deny, l.auditorReads(pub)...)
		if u.Role == RoleConsole {
			pub(n.Pattern(protocol.ControlFamily))
			for _, pr := range u.Principals {
				pub(n.Subject(protocol.ResumeAsFamily, "*", pr))
			}
		}
	case RoleAdmin:
		pub(">")
		sub(">")
		p.Publish.Deny = l.destructive()
	}
	if len(p.Publish.Allow) == 0 {
		// NATS reads an empty allow list as no restriction: deny every
		// subject instead (answers to requests stay allowed).
		p.Publish.Deny = []string{">"}
	}
	p.Publish.Allow = unique(p.Publish.Allow)
	if u.Role == RoleWorker && l.PoolTools == nil {
		return Permissions{}, fmt.Errorf("user %s: a worker's permissions name its pools' tools: the catalog is needed", u.Name)
	}
	return p, nil
}

// auditorReads allows, through pub, what an auditor (and the console)
// reads, and returns what it must still be denied.
func (l Layout) auditorReads(pub func(...string)) (deny []string) {
	n := l.Names
	pub(reader(n.EventsStream())...)
	// the earlier versions' projector durable on the events stream is the
	// engines' alone: an engine that finds it drains it before it serves
	// (engine/projector.go)
	deny = []string{
		"$JS.API.CONSUMER.CREATE." + n.EventsStream() + "." + protocol.ConsumerProjector,
		"$JS.API.CONSUMER.CREATE." + n.EventsStream() + "." + protocol.ConsumerProjector + ".>",
		"$JS.API.CONSUMER.DURABLE.CREATE." + n.EventsStream() + "." + protocol.ConsumerProjector,
		consumerAPI("DELETE", n.EventsStream(), protocol.ConsumerProjector)}
	pub(reader(n.OutStream())...)
	// the checkpoints, and a checkpoint now
	pub(reader(n.CheckpointsStream())...)
	pub(n.Pattern(protocol.CheckpointRequestFamily))
	cat := n.KVStream(protocol.BucketCatalogs)
	pub(streamInfo(cat), "$JS.API.DIRECT.GET."+cat+".>", "$JS.API.STREAM.MSG.GET."+cat)
	// the engines' signing keys, all of them (to pin them), and the
	// open tickets
	pub(reader(n.KVStream(protocol.BucketKeys))...)
	pub(reader(n.KVStream(protocol.BucketTickets))...)
	return deny
}

// buckets lists every bucket.
var buckets = []protocol.Bucket{protocol.BucketCatalogs, protocol.BucketRegistry, protocol.BucketState, protocol.BucketWorkers, protocol.BucketOwners, protocol.BucketKeys, protocol.BucketTickets}

// destructive lists the JetStream API subjects that delete or purge a
// toolbatch stream or bucket, or a message of one, but the purges of the
// trimmed streams: no role may publish them (the operator deletes a
// deployment's data with the server's own system account, or by removing
// the store of a stopped embedded server).
func (l Layout) destructive(trimmed ...protocol.Stream) []string {
	n := l.Names
	var streams []string
	for _, s := range []protocol.Stream{protocol.StreamEvents, protocol.StreamInbox, protocol.StreamDispatch, protocol.StreamOut, protocol.StreamTimers, protocol.StreamCheckpoints} {
		streams = append(streams, n.StreamName(s))
	}
	for _, b := range buckets {
		streams = append(streams, n.KVStream(b))
	}
	var out []string
	for _, s := range streams {
		out = append(out, "$JS.API.STREAM.DELETE."+s, "$JS.API.STREAM.MSG.DELETE."+s)
		if !slices.ContainsFunc(trimmed, func(t protocol.Stream) bool { return n.StreamName(t) == s }) {
			out = append(out, "$JS.API.STREAM.PURGE."+s)
		}
	}
	return out
}

// reader is what reading a stream needs: finding the stream by subject,
// getting a message (the last of a subject, say), creating consumers on it
// (with any filter: NATS puts a consumer's filters in the request subject
// only when there is one), pulling from them, deleting them, and the
// stream's and consumers' info.
func reader(stream string) []string {
	return []string{
		"$JS.API.STREAM.NAMES", streamInfo(stream),
		"$JS.API.STREAM.MSG.GET." + stream, "$JS.API.DIRECT.GET." + stream + ".>", "$JS.API.DIRECT.GET." + stream,
		"$JS.API.CONSUMER.CREATE." + stream + ".>",
		consumerAPI("MSG.NEXT", stream, "*"), consumerAPI("INFO", stream, "*"), consumerAPI("DELETE", stream, "*"),
	}
}

func streamInfo(stream string) string { return "$JS.API.STREAM.INFO." + stream }

func consumerAPI(op, stream, consumer string) string {
	return "$JS.API.CONSUMER." + op + "." + stream + "." + consumer
}

// unique drops repeated subjects, keeping the first of each.
func unique(s []string) []string {
	seen := map[string]bool{}
	return slices.DeleteFunc(s, func(x string) bool {
		if seen[x] {
			return true
		}
		seen[x] = true
		return false
	})
}

func toolsOr(tools []string) []string {
	if len(tools) == 0 {
		return []string{"*"}
	}
	return tools
}

// Check reports what is wrong with a user's entry.
func (u User) Check() error {
	if !events.ValidToolID(u.Name) {
		return fmt.Errorf("user %q: a name must match [A-Za-z0-9_-]{1,64}", u.Name)
	}
	if !slices.Contains(Roles, u.Role) {
		return fmt.Errorf("user %s: unknown role %q (want one of %s)", u.Name, u.Role, roleList())
	}
	if !validNKey(u.NKey) {
		return fmt.Errorf("user %s: nkey %q is not a user public key (U...)", u.Name, u.NKey)
	}
	if u.Role == RoleWorker && len(u.Pools) == 0 {
		return fmt.Errorf("user %s: a worker names its pools", u.Name)
	}
	for _, p := range u.Pools {
		if !events.ValidToolID(p) {
			return fmt.Errorf("user %s: pool %q must match [A-Za-z0-9_-]{1,64}", u.Name, p)
		}
	}
	if u.Role == RoleConsole && len(u.Principals) == 0 {
		return fmt.Errorf("user %s: a console names the principals it serves", u.Name)
	}
	for _, p := range u.Principals {
		if !events.ValidToolID(p) {
			return fmt.Errorf("user %s: principal %q must match [A-Za-z0-9_-]{1,64}", u.Name, p)
		}
	}
	if u.Role == RoleApprover && !events.ValidToolID(u.Principal) {
		return fmt.Errorf("user %s: an approver names its principal ([A-Za-z0-9_-]{1,64}), got %q", u.Name, u.Principal)
	}
	for _, t := range u.Tools {
		if !events.ValidToolID(t) {
			return fmt.Errorf("user %s: tool %q must match [A-Za-z0-9_-]{1,64}", u.Name, t)
		}
	}
	if len(u.Pools) > 0 && u.Role != RoleWorker || u.Principal != "" && u.Role != RoleApprover || len(u.Principals) > 0 && u.Role != RoleConsole ||
		len(u.Tools) > 0 && u.Role != RoleBrain && u.Role != RoleDelegate || u.Resume && u.Role != RoleClient {
		return fmt.Errorf("user %s: pools are a worker's, principal an approver's, principals a console's, tools a brain or delegate service's, resume a client's", u.Name)
	}
	return nil
}

func roleList() string {
	s := make([]string, len(Roles))
	for i, r := range Roles {
		s[i] = string(r)
	}
	return strings.Join(s, ", ")
}
