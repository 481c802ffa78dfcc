package protocol

import (
	"math/rand/v2"
	"regexp"
	"slices"
	"testing"
)

// TestLayout pins the public names: clients in other languages and the
// operators' permissions depend on each of them.
func TestLayout(t *testing.T) {
	n := Names{Prefix: DefaultPrefix}
	for _, c := range []struct{ got, want string }{
		{n.Events("r1"), "toolbatch.events.r1"},
		{n.Submit("r1"), "toolbatch.submit.r1"},
		{n.Resume("r1"), "toolbatch.resume.r1"},
		{n.ResumeAs("r1", "alice"), "toolbatch.resume.r1.alice"},
		{n.Control("r1"), "toolbatch.control.r1"},
		{n.Result("r1"), "toolbatch.result.r1"},
		{n.Dispatch("default", "build"), "toolbatch.dispatch.default.build"},
		{n.Out("r1", OutResults), "toolbatch.out.r1.results"},
		{n.RunOut("r1"), "toolbatch.out.r1.>"},
		{n.Subject(OutFamily, ">"), "toolbatch.out.>"},
		{n.TimerAt("r1", "expire", "c1"), "toolbatch.timer.at.r1.expire.c1"},
		{n.TimerFire("r1"), "toolbatch.timer.fire.r1"},
		{n.Claim(), "toolbatch.api.claim"},
		{n.Heartbeat(), "toolbatch.api.heartbeat"},
		{n.Gate(), "toolbatch.gate"},
		{n.Brain("echo"), "toolbatch.brain.echo"},
		{n.Delegate("child"), "toolbatch.delegate.child"},
		{n.Forward("e1"), "toolbatch.engine.e1.forward"},
		{n.Ping("e1"), "toolbatch.engine.e1.ping"},
		{n.Pattern(ResumeAsFamily), "toolbatch.resume.*.*"},
		{n.Pattern(GateFamily), "toolbatch.gate"},
		{n.EventsStream(), "TOOLBATCH_EVENTS"},
		{n.InboxStream(), "TOOLBATCH_INBOX"},
		{n.DispatchStream(), "TOOLBATCH_DISPATCH"},
		{n.OutStream(), "TOOLBATCH_OUT"},
		{n.TimersStream(), "TOOLBATCH_TIMERS"},
		{n.CatalogBucket(), "TOOLBATCH_CATALOGS"},
		{n.RegistryBucket(), "TOOLBATCH_REGISTRY"},
		{n.StateBucket(), "TOOLBATCH_STATE"},
		{n.WorkersBucket(), "TOOLBATCH_WORKERS"},
		{n.OwnersBucket(), "TOOLBATCH_OWNERS"},
		{Names{Prefix: "acme.tb-1"}.EventsStream(), "ACME_TB_1_EVENTS"},
		{n.KVSubject(BucketOwners, OwnerKey("r1")), "$KV.TOOLBATCH_OWNERS.run.r1"},
		{WorkerKey("default", "build", "w1"), "sandbox.default.build.w1"},
		{WorkerFilter("default", "build"), "sandbox.default.build.*"},
		{RegistryKey("echo"), "brain.echo"},
		{PoolConsumer("default", "build"), "pool-default-build"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
	for s, want := range map[Stream][]string{
		StreamEvents:   {"toolbatch.events.>"},
		StreamInbox:    {"toolbatch.submit.>", "toolbatch.resume.>", "toolbatch.control.>", "toolbatch.result.>"},
		StreamDispatch: {"toolbatch.dispatch.>"},
		StreamOut:      {"toolbatch.out.>"},
		StreamTimers:   {"toolbatch.timer.>"},
	} {
		if got := n.StreamSubjects(s); !slices.Equal(got, want) {
			t.Errorf("stream %s subjects %q, want %q", s, got, want)
		}
	}
}

func TestMatch(t *testing.T) {
	n := Names{Prefix: "acme.tb"}
	for _, c := range []struct {
		subject              string
		kind, run, principal string
		ok                   bool
	}{
		{"acme.tb.submit.r1", KindSubmit, "r1", "", true},
		{"acme.tb.resume.r1", KindResume, "r1", "", true},
		{"acme.tb.resume.r1.bob", KindResume, "r1", "bob", true},
		{"acme.tb.control.r1", KindControl, "r1", "", true},
		{"acme.tb.result.r1", KindResult, "r1", "", true},
		{"acme.tb.timer.fire.r1", KindTimer, "r1", "", true},
		{"acme.tb.submit.r1.x", KindSubmit, "r1", "x", true},
		{"acme.tb.submit.r1.x.y", "", "", "", false},
		{"acme.tb.submit", "", "", "", false},
		{"toolbatch.submit.r1", "", "", "", false},
		{"acme.tb.events.r1", "", "", "", false},
		{"acme.tb.timer.at.r1.expire.c", "", "", "", false},
	} {
		kind, run, principal, ok := n.InboxKind(c.subject)
		if kind != c.kind || run != c.run || principal != c.principal || ok != c.ok {
			t.Errorf("InboxKind(%q) = %q %q %q %v, want %q %q %q %v", c.subject, kind, run, principal, ok, c.kind, c.run, c.principal, c.ok)
		}
	}
	if run, kind, ok := n.OutKind("acme.tb.out.r1.results"); !ok || run != "r1" || kind != OutResults {
		t.Errorf("OutKind = %q %q %v", run, kind, ok)
	}
	if _, ok := n.RunOf(EventsFamily, "acme.tb.events."); ok {
		t.Error("an empty run token matched")
	}
	// Every family's subject matches itself.
	for _, f := range Families {
		args := make([]string, len(f.Tokens))
		for i := range args {
			args[i] = "x"
		}
		if _, ok := n.Match(f, n.Subject(f, args...)); !ok {
			t.Errorf("family %s does not match its own subject %s", f.Name, n.Subject(f, args...))
		}
	}
}

func TestParseWorkerKey(t *testing.T) {
	pool, tool, worker, ok := ParseWorkerKey(WorkerKey("gpu", "render", "w-1"))
	if !ok || pool != "gpu" || tool != "render" || worker != "w-1" {
		t.Errorf("round trip: %q %q %q %v", pool, tool, worker, ok)
	}
	for _, k := range []string{RegistryKey("render"), "sandbox.gpu.render", "sandbox.a.b.c.d", "other.a.b.c"} {
		if _, _, _, ok := ParseWorkerKey(k); ok {
			t.Errorf("%q read as a worker key", k)
		}
	}
}

// TestValidPrefix: the prefix rule (the engine's, the client's and the
// CLI's, which each had their own copy) is the pattern the client used,
// on its boundaries and 20,000 random strings.
func TestValidPrefix(t *testing.T) {
	re := regexp.MustCompile(`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$`)
	cases := []string{"", ".", "a", "a.", ".a", "a..b", "toolbatch", "acme.prod-1.tb_2", "a b", "a*", "a>", "é", "a\n", "a/b", "\x00"}
	rng := rand.New(rand.NewPCG(3, 4))
	for range 20000 {
		const alphabet = "abZ09_-.. *>\xc3"
		b := make([]byte, rng.IntN(20))
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		cases = append(cases, string(b))
	}
	for _, c := range cases {
		if got, want := ValidPrefix(c), re.MatchString(c); got != want {
			t.Fatalf("prefix %q: valid %v, the rule says %v", c, got, want)
		}
	}
}
