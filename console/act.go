package console

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/client"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/protocol"
)

// answerWait bounds how long an action waits for the engine's word on it
// before the page says it was sent and not yet answered.
const answerWait = 10 * time.Second

// fate is what became of a command the console published.
type fate struct {
	// Refused is the engine's refusal of exactly this command.
	Refused *protocol.RefusedOut
	// Done is the event that shows its effect (a TicketResolved, a
	// RunEnded).
	Done events.Event
	// Pending: neither arrived within answerWait.
	Pending bool
}

// violations remembers the subjects NATS refused this connection (its
// error handler learns them; a refused publish would otherwise only time
// out).
type violations struct {
	mu       sync.Mutex
	subjects map[string]error
}

func (v *violations) handler(_ *nats.Conn, _ *nats.Subscription, err error) {
	if err == nil || !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.subjects == nil {
		v.subjects = map[string]error{}
	}
	// nats: permissions violation for publish to "<subject>"
	msg := err.Error()
	if i := strings.Index(msg, `"`); i >= 0 {
		if j := strings.LastIndex(msg, `"`); j > i {
			v.subjects[msg[i+1:j]] = err
		}
	}
}

func (v *violations) take(subject string) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	err := v.subjects[subject]
	delete(v.subjects, subject)
	return err
}

// await publishes a command of a run (send) and waits for its fate: the
// run's refused message with its Nats-Msg-Id, or the first event of the
// run for which done returns true. Both are read from the run's first
// message, so a command the stream had already (a double click) gets the
// first one's fate.
func (s *Server) await(ctx context.Context, runID string, send func(context.Context) (client.Sent, error), done func(events.Event) bool) (fate, error) {
	pctx, cancel := context.WithTimeout(ctx, answerWait)
	defer cancel()
	sent, err := send(pctx)
	if err != nil {
		return fate{}, err
	}
	ctx, cancel = context.WithTimeout(ctx, answerWait)
	defer cancel()
	type result struct {
		f   fate
		err error
	}
	found := make(chan result, 2)
	go func() {
		want := protocol.RefusedMsgID(sent.InboxSeq)
		err := follow(ctx, s.js, s.names.OutStream(), []string{s.names.Out(runID, protocol.OutRefused)}, func(m jetstream.Msg) bool {
			if m.Headers().Get(jetstream.MsgIDHeader) != want {
				return false
			}
			var r protocol.RefusedOut
			if err := events.Unmarshal(m.Data(), &r); err != nil {
				r = protocol.RefusedOut{Code: events.CodeUndecodable, Reason: "the refusal does not decode: " + err.Error()}
			}
			found <- result{f: fate{Refused: &r}}
			return true
		})
		if err != nil {
			found <- result{err: err}
		}
	}()
	go func() {
		err := follow(ctx, s.js, s.names.EventsStream(), []string{s.names.Events(runID)}, func(m jetstream.Msg) bool {
			evs, err := events.DecodeCommit(m.Data(), m.Headers().Values(protocol.HeaderEvent))
			if err != nil {
				return false
			}
			for _, e := range evs {
				if done(e) {
					found <- result{f: fate{Done: e}}
					return true
				}
			}
			return false
		})
		if err != nil {
			found <- result{err: err}
		}
	}()
	for range 2 {
		select {
		case r := <-found:
			if r.err != nil && ctx.Err() == nil {
				return fate{}, r.err
			}
			if r.err == nil {
				return r.f, nil
			}
		case <-ctx.Done():
			return fate{Pending: true}, nil
		}
	}
	return fate{Pending: true}, nil
}

// follow delivers the messages of a stream (those of subjects; all when
// none) from its first, and on as they are stored, to fn until fn returns
// true or ctx ends (nil then).
func follow(ctx context.Context, js jetstream.JetStream, stream string, subjects []string, fn func(jetstream.Msg) bool) error {
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: subjects, DeliverPolicy: jetstream.DeliverAllPolicy, InactiveThreshold: 10 * time.Second,
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("read %s %v: %w", stream, subjects, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("read %s %v: %w", stream, subjects, err)
	}
	defer it.Stop()
	go func() { <-ctx.Done(); it.Stop() }()
	for {
		m, err := it.Next()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			return fmt.Errorf("read %s %v: %w", stream, subjects, err)
		}
		if fn(m) {
			return nil
		}
	}
}

// answer approves or denies a ticket as principal and says what became of
// it.
func (s *Server) answer(ctx context.Context, t protocol.AwaitingOut, principal string, allow bool, note string) flash {
	result := events.ResumeResult{Kind: events.ResultPermission, Allow: allow}
	if allow {
		result.Note = note
	} else {
		result.Reason = note
	}
	r := &protocol.Resume{CorrelationID: t.CorrelationID, RunID: t.RunID, ThreadID: t.ThreadID, CallID: t.CallID, SnapshotID: t.SnapshotID, Result: result}
	what := fmt.Sprintf("%s of call %s (tool %s) in run %s", map[bool]string{true: "Approval", false: "Denial"}[allow], t.CallID, t.ToolID, t.RunID)
	want := events.ResolutionDenied
	if allow {
		want = events.ResolutionApproved
	}
	subject := s.names.ResumeAs(t.RunID, principal)
	f, err := s.await(ctx, t.RunID, func(ctx context.Context) (client.Sent, error) { return s.client.SendResume(ctx, r, principal) },
		func(e events.Event) bool {
			// Only this answer's own effect: another's resolution of the
			// ticket means this one is refused, and the refusal says why.
			tr, ok := e.(*events.TicketResolved)
			return ok && tr.CorrelationID == t.CorrelationID && tr.Principal == principal && tr.Resolution == want
		})
	return s.describe(what, subject, f, err, func(e events.Event) flash {
		tr := e.(*events.TicketResolved)
		return flash{Kind: "ok", Text: fmt.Sprintf("%s recorded: %s by %s.", what, tr.Resolution, tr.Principal)}
	})
}

// control ends a run or performs its scheduled action now.
func (s *Server) control(ctx context.Context, runID string, ctl protocol.Control) flash {
	what := fmt.Sprintf("%s of run %s", strings.ToUpper(string(ctl.Action[:1]))+string(ctl.Action[1:]), runID)
	f, err := s.await(ctx, runID, func(ctx context.Context) (client.Sent, error) { return s.client.SendControl(ctx, runID, ctl) },
		func(e events.Event) bool {
			switch ev := e.(type) {
			case *events.RunEnded:
				return true
			case *events.TicketResolved:
				return ctl.Action == protocol.ControlPerform && ev.CorrelationID == ctl.CorrelationID
			}
			return false
		})
	return s.describe(what, s.names.Control(runID), f, err, func(e events.Event) flash {
		switch ev := e.(type) {
		case *events.RunEnded:
			if endsWith[ctl.Action] != ev.Cause {
				return flash{Kind: "refused", Text: fmt.Sprintf("%s: the run has ended (%s).", what, ev.Cause)}
			}
			return flash{Kind: "ok", Text: fmt.Sprintf("%s done: the run ended (%s).", what, ev.Cause)}
		case *events.TicketResolved:
			if ev.Resolution == events.ResolutionPerformed {
				return flash{Kind: "ok", Text: what + " done: the scheduled action was performed."}
			}
			return flash{Kind: "refused", Text: fmt.Sprintf("%s not applied: the ticket was already resolved (%s).", what, ev.Resolution)}
		}
		return flash{Kind: "ok", Text: what + " done."}
	})
}

// endsWith is the cause a run ends with when a control ends it.
var endsWith = map[protocol.ControlAction]events.EndCause{
	protocol.ControlCancel: events.EndCancelled, protocol.ControlInterrupt: events.EndInterrupted,
}

// describe turns a command's fate into the message shown to the person.
func (s *Server) describe(what, subject string, f fate, err error, done func(events.Event) flash) flash {
	var ref *events.Refusal
	switch {
	case errors.As(err, &ref):
		return flash{Kind: "refused", Text: fmt.Sprintf("%s refused before it was sent: %s: %s", what, ref.Code, ref.Reason)}
	case err != nil:
		if v := s.violations.take(subject); v != nil {
			return flash{Kind: "error", Text: fmt.Sprintf("%s not sent: NATS refused the console's credential (%v): it must serve this principal (docs/console.md).", what, v)}
		}
		return flash{Kind: "error", Text: fmt.Sprintf("%s not sent: %v", what, err)}
	case f.Refused != nil:
		return flash{Kind: "refused", Text: fmt.Sprintf("%s refused by the engine: %s: %s", what, f.Refused.Code, f.Refused.Reason)}
	case f.Done != nil:
		return done(f.Done)
	}
	return flash{Kind: "ok", Text: fmt.Sprintf("%s sent; the engine has not answered it yet (see the run's page).", what)}
}
