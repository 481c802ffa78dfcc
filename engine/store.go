package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/aggregate"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/metrics"
	"github.com/toolbatch/toolbatch/proof"
	"github.com/toolbatch/toolbatch/protocol"
	"github.com/toolbatch/toolbatch/tracing"
)

// Store errors.
var (
	// ErrConflict means another writer extended the run since it was loaded
	// (JetStream's wrong-last-sequence, 10071, or 10164 on replicated
	// streams): reload the run and decide again.
	ErrConflict = errors.New("engine: the run was extended by another writer")
)

// engineDuplicates is the duplicate window of the streams only engines
// write (events, dispatch, out): their message ids make an engine's own
// retries of an append harmless, and a retry comes within seconds (a
// commit projected again after a crash is checked against the stream
// itself, however late). JetStream's default of 2 minutes keeps
// every id of the last 2 minutes in the server's memory: about 300 MB at
// 16,000 appends/s. The inbox, which clients and workers write, keeps the
// default.
const engineDuplicates = 30 * time.Second

// StreamConfig sets the streams up.
type StreamConfig struct {
	Replicas  int           // replicas of every stream (default 1)
	OutMaxAge time.Duration // how long out messages are kept (default 168h)
}

// EnsureStreams creates or updates the four streams and the catalog bucket.
func EnsureStreams(ctx context.Context, js jetstream.JetStream, n protocol.Names, sc StreamConfig) error {
	if sc.Replicas <= 0 {
		sc.Replicas = 1
	}
	if sc.OutMaxAge <= 0 {
		sc.OutMaxAge = DefaultOutMaxAge
	}
	cfgs := []jetstream.StreamConfig{{
		Name: n.EventsStream(), Subjects: n.StreamSubjects(protocol.StreamEvents), Retention: jetstream.LimitsPolicy,
		Storage: jetstream.FileStorage, DenyDelete: true, DenyPurge: true, Replicas: sc.Replicas,
		Duplicates: engineDuplicates, Description: "toolbatch event log: the only source of truth",
	}, {
		// The inbox and the dispatch stream are trimmed by the engines
		// below their consumers' acknowledgement floors (trim.go).
		Name: n.InboxStream(), Retention: jetstream.LimitsPolicy, Storage: jetstream.FileStorage, Replicas: sc.Replicas,
		Subjects:    n.StreamSubjects(protocol.StreamInbox),
		Description: "toolbatch commands from clients and workers",
	}, {
		Name: n.DispatchStream(), Subjects: n.StreamSubjects(protocol.StreamDispatch), Retention: jetstream.LimitsPolicy,
		Storage: jetstream.FileStorage, Replicas: sc.Replicas, Duplicates: engineDuplicates,
		Description: "toolbatch sandbox jobs",
	}, {
		Name: n.OutStream(), Subjects: n.StreamSubjects(protocol.StreamOut), Retention: jetstream.LimitsPolicy,
		Storage: jetstream.FileStorage, MaxAge: sc.OutMaxAge, Replicas: sc.Replicas, Duplicates: engineDuplicates,
		Description: "toolbatch projections for subscribers",
	}}
	cfgs = append(cfgs, jetstream.StreamConfig{
		Name: n.CheckpointsStream(), Subjects: n.StreamSubjects(protocol.StreamCheckpoints), Retention: jetstream.LimitsPolicy,
		Storage: jetstream.FileStorage, DenyDelete: true, DenyPurge: true, Replicas: sc.Replicas, Duplicates: engineDuplicates,
		Description: "toolbatch signed checkpoints of the event log: keep copies elsewhere (replay checkpoint)",
	}, jetstream.StreamConfig{
		// A work queue: a fired timer is removed once the engine
		// acknowledges it; a pending schedule matches no consumer and stays
		// until it fires.
		Name: n.TimersStream(), Subjects: n.StreamSubjects(protocol.StreamTimers), Retention: jetstream.WorkQueuePolicy,
		Storage: jetstream.FileStorage, Replicas: sc.Replicas, AllowMsgSchedules: true, AllowRollup: true,
		Description: "toolbatch ticket timers (deadlines and due scheduled actions) and cancels of delegated children",
	})
	// Every stream and bucket at once: on a cluster each replicated one
	// waits for its own group's leader election, and these overlap.
	var steps []func() error
	for _, cfg := range cfgs {
		steps = append(steps, func() error {
			// JetStream changes no stream to or from a work queue: an inbox
			// or dispatch stream made by an earlier version stays one (the
			// trims then find nothing to remove).
			if old, err := js.Stream(ctx, cfg.Name); err == nil && old.CachedInfo().Config.Retention == jetstream.WorkQueuePolicy {
				cfg.Retention = jetstream.WorkQueuePolicy
			}
			if _, err := js.CreateOrUpdateStream(ctx, cfg); err != nil {
				return fmt.Errorf("create stream %s: %w", cfg.Name, err)
			}
			return nil
		})
	}
	for _, kv := range []jetstream.KeyValueConfig{
		{Bucket: n.CatalogBucket(), Description: "toolbatch catalogs by snapshot id"},
		// No TTL: a run's key is its owner's while the owner lives; an
		// engine's presence key carries its own TTL (liveness.go).
		{Bucket: n.OwnersBucket(), LimitMarkerTTL: releasedTTL, Description: "toolbatch: which engine works on which run, and the engines alive"},
		{Bucket: n.StateBucket(), Description: "toolbatch committed state: staged commands of finalized batches"},
		{Bucket: n.WorkersBucket(), TTL: WorkerTTL, Description: "toolbatch live sandbox workers: sandbox.<pool>.<tool_id>.<worker_id> = capability"},
		{Bucket: n.RegistryBucket(), Description: "toolbatch live executor registry: recovery capabilities"},
		{Bucket: n.TicketsBucket(), Description: "toolbatch every run's open ticket (run.<run_id> = JSON AwaitingOut), kept by the engines"},
		{Bucket: n.KeysBucket(), History: 16, Description: "toolbatch engines' public signing keys (signer.<nkey>) and where signing began (unsigned_until)"},
	} {
		kv.Storage, kv.Replicas = jetstream.FileStorage, sc.Replicas
		steps = append(steps, func() error {
			if slices.ContainsFunc(sealedBuckets, func(b protocol.Bucket) bool { return n.BucketName(b) == kv.Bucket }) {
				// Made once: an update would undo the purge refusal below,
				// which JetStream then refuses to cancel.
				if _, err := js.KeyValue(ctx, kv.Bucket); err == nil {
					return nil
				}
			}
			if _, err := js.CreateOrUpdateKeyValue(ctx, kv); err != nil {
				return fmt.Errorf("create bucket %s: %w", kv.Bucket, err)
			}
			return nil
		})
	}
	if err := inParallel(steps); err != nil {
		return err
	}
	// Workers and brain services write their own keys of these two
	// buckets: a rollup header on one of their writes would purge every
	// other key, so the buckets take none (their keys are deleted with
	// delete markers, which need no rollup).
	for _, b := range sealedBuckets {
		s, err := js.Stream(ctx, n.KVStream(b))
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			// Found or made above, by this engine or another: a
			// cluster that is still placing it answers so for a moment.
			err = protocol.NotYet(err)
		}
		if err != nil {
			return fmt.Errorf("bucket %s: %w", b, err)
		}
		cfg := s.CachedInfo().Config
		if cfg.AllowRollup || !cfg.DenyPurge {
			cfg.AllowRollup, cfg.DenyPurge = false, true
			if _, err := js.UpdateStream(ctx, cfg); err != nil {
				return fmt.Errorf("bucket %s: refuse rollups: %w", b, err)
			}
		}
	}
	return nil
}

// inParallel runs steps at once and returns their errors.
func inParallel(steps []func() error) error {
	errs := make([]error, len(steps))
	var wg sync.WaitGroup
	for i, step := range steps {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = step() }()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// sealedBuckets are the buckets that take no rollup: workers and brain
// services write them.
var sealedBuckets = []protocol.Bucket{protocol.BucketWorkers, protocol.BucketRegistry}

// log reads and appends a run's events.
type eventLog struct {
	js     jetstream.JetStream
	names  protocol.Names
	stream jetstream.Stream // the events stream, opened by Setup
	signer *proof.Signer    // nil: unsigned commits
	trust  *trust           // verifies what load folds (nil: nothing)
	// metrics counts what is appended (nil: nothing).
	metrics *metrics.Engine
	// tracer makes the spans (nil: none): the attempts' trace contexts
	// here, the spans from what observer hands it.
	tracer *tracing.Engine
	// observer folds what is appended and loaded into the metrics and
	// the spans, off the commit's path (nil: neither is on).
	observer *observer
}

// tip is where a run's log ends: its last commit's stream sequence (0 for
// none) and hash (proof.ZeroHash for none), what its next commit follows.
type tip struct {
	seq  uint64
	hash proof.Hash
}

// loaded is a run folded from its subject: the state, the run's tip, the
// bytes of its commits (what the cache counts it as), and its last commit's
// events with the state before them (what projecting that commit again
// needs; nil for a run without commits).
type loaded struct {
	run      *aggregate.Run
	at       tip
	size     int64
	last     []events.Event
	beforeIt *aggregate.Run
	// batchSpan is the span context of the run's last batch, derived from
	// the traceparent header of the commit that submitted it.
	batchSpan tracing.BatchSpan
}

// load folds a run from its subject.
func (l *eventLog) load(ctx context.Context, runID string) (loaded, error) {
	out := loaded{run: aggregate.New(runID)}
	last, err := l.lastSeq(ctx, runID)
	if err != nil {
		return loaded{}, fmt.Errorf("load run %s: %w", runID, err)
	}
	if last == 0 {
		return out, nil
	}
	err = protocol.ReadOrdered(ctx, l.js, l.names.EventsStream(), protocol.ReadOptions{Subjects: []string{l.names.Events(runID)}, UpTo: last}, func(m jetstream.Msg, meta *jetstream.MsgMetadata) error {
		s := meta.Sequence.Stream
		// the next commit names the hash of the last one
		hash, err := l.trust.check(ctx, m, s, out.at.hash)
		if err != nil {
			return err
		}
		evs, err := events.DecodeCommit(m.Data(), m.Headers().Values(protocol.HeaderEvent))
		if err != nil {
			return fmt.Errorf("commit at %d: %w", s, err)
		}
		if s == last {
			out.beforeIt, out.last = out.run.Clone(), evs
		}
		if err := out.run.ApplyAll(evs); err != nil {
			return fmt.Errorf("commit at %d: %w", s, err)
		}
		tp := m.Headers().Get(protocol.HeaderTraceParent)
		if sub := submittedBatch(evs); sub != nil {
			out.batchSpan = l.tracer.Batch(runID, sub.BatchID, tp)
		}
		l.observer.loaded(runID, tp, evs)
		out.at, out.size = tip{seq: s, hash: hash}, out.size+int64(len(m.Data()))
		return nil
	})
	if err != nil {
		return loaded{}, fmt.Errorf("load run %s: %w", runID, err)
	}
	return out, nil
}

// lastSeq returns the sequence of the run's last commit (0: none).
func (l *eventLog) lastSeq(ctx context.Context, runID string) (uint64, error) {
	last, err := retrying(ctx, streamTry, func(ctx context.Context) (*jetstream.RawStreamMsg, error) {
		return l.stream.GetLastMsgForSubject(ctx, l.names.Events(runID))
	}, nil)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return last.Sequence, nil
}

// append publishes events as one commit after the run's tip, signed
// when the log has a signer, and returns the new tip and the commit's
// size. traceparent, when set, is the submitter's trace context of the
// batch the commit submits: it travels in a header, outside the commit's
// hash.
func (l *eventLog) append(ctx context.Context, runID string, after tip, evs []events.Event, traceparent string) (tip, int, error) {
	body, types, err := events.EncodeCommit(evs)
	if err != nil {
		return tip{}, 0, err
	}
	lastSeq := after.seq
	msg := nats.NewMsg(l.names.Events(runID))
	msg.Data = body
	for _, t := range types {
		msg.Header.Add(protocol.HeaderEvent, t)
	}
	msg.Header.Set(protocol.HeaderPrev, strconv.FormatUint(lastSeq, 10))
	if traceparent != "" {
		msg.Header.Set(protocol.HeaderTraceParent, traceparent)
	}
	c := proof.Commit{Subject: msg.Subject, Prev: lastSeq, Types: types, Body: body}
	if l.signer != nil {
		c.PrevHash, c.Signer = after.hash, l.signer.Key()
	}
	hash := c.Hash()
	if l.signer != nil {
		seal, err := l.signer.Seal(ctx, hash)
		if err != nil {
			return tip{}, 0, fmt.Errorf("append to run %s: %w", runID, err)
		}
		sig, path := seal.Headers()
		msg.Header.Set(protocol.HeaderPrevHash, c.PrevHash.String())
		msg.Header.Set(protocol.HeaderSigner, c.Signer)
		msg.Header.Set(protocol.HeaderSig, sig)
		msg.Header.Set(protocol.HeaderSigProof, path)
	}
	sum := sha256.Sum256(body)
	id := fmt.Sprintf("%s/%d/%s", runID, lastSeq, hex.EncodeToString(sum[:8]))
	msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(lastSeq, 10))
	msg.Header.Set(jetstream.MsgIDHeader, id)
	seq, err := retrying(ctx, streamTry, func(ctx context.Context) (uint64, error) {
		return publishAcked(ctx, l.js.Conn(), msg)
	}, nil)
	if err != nil {
		if isWrongLastSequence(err) {
			l.metrics.Conflict()
			return tip{}, 0, fmt.Errorf("%w: %v", ErrConflict, err)
		}
		return tip{}, 0, fmt.Errorf("append to run %s: %w", runID, err)
	}
	l.metrics.Commit()
	l.observer.committed(runID, traceparent, evs)
	return tip{seq: seq, hash: hash}, len(body), nil
}

// streamTry bounds one try of a request to the events stream (retry.go):
// a commit so goes through within a try of an election's end instead of
// when its whole operation times out. A try that did land is not doubled:
// an append carries its message id.
const streamTry = 2 * time.Second

func isWrongLastSequence(err error) bool {
	if err == nil {
		return false
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
	}
	return strings.Contains(err.Error(), "wrong last sequence")
}
