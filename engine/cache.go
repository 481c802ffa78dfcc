package engine

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/toolbatch/toolbatch/aggregate"
	"github.com/toolbatch/toolbatch/events"
)

// bound is a cache's size: at most max entries of at most maxBytes bytes
// in all.
type bound struct {
	max      int
	maxBytes int64
}

// trimOldest bounds a cache: when m holds more entries or bytes than b,
// it drops the least recently used ones that may go, down to nine tenths
// of the bound, so that a cache at its bound is not sorted at every
// insertion. size is what an entry counts as.
func trimOldest[K comparable, V any](m map[K]V, b bound, used func(V) int64, size func(V) int64, mayGo func(V) bool) {
	var total int64
	for _, v := range m {
		total += size(v)
	}
	if len(m) <= b.max && total <= b.maxBytes {
		return
	}
	type entry struct {
		key        K
		used, size int64
	}
	var idle []entry
	for k, v := range m {
		if mayGo(v) {
			idle = append(idle, entry{k, used(v), size(v)})
		}
	}
	slices.SortFunc(idle, func(a, b entry) int { return cmp.Compare(a.used, b.used) })
	n := len(m)
	for _, e := range idle {
		if n <= b.max*9/10 && total <= b.maxBytes*9/10 {
			break
		}
		delete(m, e.key)
		n, total = n-1, total-e.size
	}
}

func (s *shard) state(runID string) *runState {
	rs := s.runs[runID]
	if rs == nil {
		rs = &runState{id: runID, inflight: map[string]bool{}, leases: map[string]lease{}, unclaimed: map[string]lease{}}
		s.runs[runID] = rs
	}
	rs.used = time.Now()
	return rs
}

// load folds the run from the log when the cache is not current, and
// recovers it: executing calls that are not in progress here (a crash, a
// takeover) are decided by the recovery table before anything else touches
// the run. A claimed sandbox attempt may still run on its worker: its lease
// is watched for one period before it is decided.
func (s *shard) load(ctx context.Context, rs *runState) error {
	if rs.loaded {
		return nil
	}
	l, err := s.e.events.load(ctx, rs.id)
	if err != nil {
		return err
	}
	run := l.run
	rs.run, rs.tip, rs.bytes, rs.batchSpan = run, l.at, l.size, l.batchSpan
	if err := s.projectLoaded(ctx, rs, l); err != nil {
		return err
	}
	if aggregate.Next(run).Kind == aggregate.NextExecuting {
		caps := map[string]events.Capability{}
		exclude := map[string]bool{}
		b := run.OpenBatch()
		for _, c := range b.Calls {
			caps[c.ToolID] = s.e.capability(ctx, c.ToolID, c.Tool)
			if c.Phase != events.PhaseExecuting {
				continue
			}
			key := fmt.Sprintf("%s/%d", c.CallID, c.Attempt)
			switch {
			case rs.inflight[key]:
				exclude[c.CallID] = true // running here: its outcome comes
			case c.Claim != nil:
				exclude[c.CallID] = true
				if _, ok := rs.leases[c.CallID]; !ok {
					rs.leases[c.CallID] = lease{attempt: c.Attempt, token: c.Claim.Token, deadline: time.Now().Add(s.e.cfg.Lease)}
				}
				rs.inflight[key] = true
			case !c.Crossed:
				s.e.metrics.Redispatched() // its job is published again by drive
				s.e.events.observer.redispatched(rs.id, c.CallID)
			}
		}
		after, evs, err := aggregate.Decide(run, aggregate.Recover{Capabilities: caps, Exclude: exclude, At: s.e.cfg.Now()})
		if err != nil {
			return fmt.Errorf("recover run %s: %w", rs.id, err)
		}
		if len(evs) > 0 {
			// What became of calls another engine may be running is
			// decided only by the run's owner, confirmed.
			if err := s.confirmKey(ctx, rs); err != nil {
				return err
			}
			s.stage(rs, after, evs)
			if err := s.flush(ctx, rs); err != nil {
				return fmt.Errorf("recover run %s: %w", rs.id, err)
			}
			s.e.log.Info().Str(fieldRunID, rs.id).Msg("run recovered")
		}
	}
	rs.loaded = true
	return nil
}

// evict drops the least recently used idle runs beyond the cache size.
func (s *shard) evict() {
	trimOldest(s.runs, s.bound, func(rs *runState) int64 { return rs.used.UnixNano() },
		func(rs *runState) int64 { return rs.bytes },
		func(rs *runState) bool { return !rs.owned && rs.quiescent() })
}
