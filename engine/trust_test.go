package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/toolbatch/toolbatch/engine"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/internal/testnats"
	"github.com/toolbatch/toolbatch/proof"
	"github.com/toolbatch/toolbatch/protocol"
)

func newSigner(t *testing.T) *proof.Signer {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	s, err := proof.NewSigner(kp)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

const confirmCatalog = `
tools:
  - {id: send_mail, builtin: echo}
gate:
  rules:
    - tools: ["send_*"]
      outcome: require_confirmation
      deadline: 10m
`

// openTicket submits a batch of one send_mail call, which waits for a
// confirmation, and waits for its ticket on the out stream.
func openTicket(t *testing.T, ctx context.Context, url, run string) {
	t.Helper()
	c := newClient(t, url)
	w, err := c.Watch(ctx, run)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if err := c.Submit(ctx, submitOf(run, 1, "send_mail", `{"to":"bob@example.org"}`)); err != nil {
		t.Fatal(err)
	}
	for {
		o, err := w.Next(ctx)
		if err != nil {
			t.Fatalf("%s: no ticket: %v", run, err)
		}
		if o.Awaiting != nil {
			return
		}
	}
}

// firstCommit reads a run's first commit.
func firstCommit(t *testing.T, ctx context.Context, js jetstream.JetStream, run string) *jetstream.RawStreamMsg {
	t.Helper()
	s, err := js.Stream(ctx, "TOOLBATCH_EVENTS")
	if err != nil {
		t.Fatal(err)
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{"toolbatch.events." + run}})
	if err != nil {
		t.Fatal(err)
	}
	m, err := cons.Next(jetstream.FetchContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	meta, _ := m.Metadata()
	raw, err := s.GetMsg(ctx, meta.Sequence.Stream)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// TestOnlyWhatVerifiesIsProjected: commits on a signing engine's stream
// that no engine of it signed (one signed by another deployment's engine,
// one without a signature) are published to no one, and the engine's own
// runs go on. An engine whose key was revoked does not start.
func TestOnlyWhatVerifiesIsProjected(t *testing.T) {
	cat := mustCatalog(t, confirmCatalog)
	ctx := ctxT(t, 60*time.Second)

	// Another deployment's engine, with its own key, writes the commits
	// to be copied.
	elsewhere := testnats.Start(t, t.TempDir())
	startEngine(t, elsewhere, engine.Config{Catalog: cat, Signer: newSigner(t)})
	jsElsewhere := testnats.JetStream(t, testnats.Connect(t, elsewhere))
	var copies []*nats.Msg
	for _, run := range []string{"forged", "bare"} {
		openTicket(t, ctx, elsewhere, run)
		raw := firstCommit(t, ctx, jsElsewhere, run)
		if !slices.Contains(raw.Header.Values(protocol.HeaderEvent), string(events.TypeCallAwaiting)) {
			t.Fatalf("%s: its first commit (%v) opens no ticket: the copy would publish nothing either way", run, raw.Header.Values(protocol.HeaderEvent))
		}
		m := nats.NewMsg(raw.Subject)
		m.Header, m.Data = raw.Header, raw.Data
		copies = append(copies, m)
	}
	for _, h := range []string{protocol.HeaderPrevHash, protocol.HeaderSigner, protocol.HeaderSig, protocol.HeaderSigProof} {
		copies[1].Header.Del(h) // "bare": stripped of its signature
	}

	url := testnats.Start(t, t.TempDir())
	signer := newSigner(t)
	startEngine(t, url, engine.Config{Catalog: cat, Signer: signer})
	js := testnats.JetStream(t, testnats.Connect(t, url))
	openTicket(t, ctx, url, "before")
	for _, m := range copies {
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	// The projector folds the stream in order: once the ticket of a run
	// submitted after the copies is out, the copies were handled.
	openTicket(t, ctx, url, "after")
	out, err := js.Stream(ctx, "TOOLBATCH_OUT")
	if err != nil {
		t.Fatal(err)
	}
	for _, run := range []string{"forged", "bare"} {
		m, err := out.GetLastMsgForSubject(ctx, "toolbatch.out."+run+".>")
		if !errors.Is(err, jetstream.ErrMsgNotFound) {
			t.Errorf("%s: the projector published a commit no engine of this stream signed: %v", run, errors.Join(err, subjectOf(m)))
		}
	}

	// An admin revokes the engine's key (toolbatch auth revoke-key): an
	// engine with it does not start.
	kv, err := js.KeyValue(ctx, "TOOLBATCH_KEYS")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(proof.Key{Key: signer.Key(), Revoked: true, RevokedAfter: 1})
	if _, err := kv.Put(ctx, protocol.SigningKey(signer.Key()), b); err != nil {
		t.Fatal(err)
	}
	again, err := engine.New(testnats.Connect(t, url), engine.Config{Catalog: cat, Signer: signer, ID: "again"})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := again.Run(rctx); err == nil || !strings.Contains(err.Error(), "was revoked after stream sequence 1") {
		t.Errorf("an engine with a revoked key: %v", err)
	}
}

func subjectOf(m *jetstream.RawStreamMsg) error {
	if m == nil {
		return nil
	}
	return errors.New("published on " + m.Subject)
}
