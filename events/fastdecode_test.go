package events_test

import (
	"bytes"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strconv"
	"testing"
	"unsafe"

	"github.com/toolbatch/toolbatch/events"
)

// The hand-written commit decoder (fastdecode.go) against the reflective
// one, its oracle: whatever the fast decoder accepts, the reflective one
// accepts with an equal result. Where the fast one gives up, DecodeCommit
// answers with the reflective one, so refusals are unchanged.

// checkFastAgrees fails t when the fast decoder accepts b and the
// reflective decoder refuses it or decodes other events. It reports
// whether the fast decoder accepted b.
func checkFastAgrees(t *testing.T, b []byte, headers []string) bool {
	t.Helper()
	fast, ok := events.DecodeCommitFast(b, headers)
	ref, err := events.DecodeCommitReflect(b, headers)
	if !ok {
		if fast != nil {
			t.Fatalf("the fast decoder gave up but returned events: %s", show(fast))
		}
		return false
	}
	if err != nil {
		t.Fatalf("the fast decoder accepted % x, the reflective decoder refuses it: %v\nfast: %s", b, err, show(fast))
	}
	if !reflect.DeepEqual(fast, ref) {
		t.Fatalf("the decoders differ on % x\n      fast: %s\nreflective: %s", b, show(fast), show(ref))
	}
	checkDecoderAgrees(t, sharedDecoder, b, headers)
	return true
}

// sharedDecoder decodes every commit the tests check, so that its table
// holds the strings of the commits before.
var sharedDecoder = new(events.Decoder)

// checkDecoderAgrees fails t when a Decoder decodes b otherwise than
// DecodeCommit does.
func checkDecoderAgrees(t *testing.T, dec *events.Decoder, b []byte, headers []string) {
	t.Helper()
	got, gerr := dec.DecodeCommit(b, headers)
	want, werr := events.DecodeCommit(b, headers)
	if (gerr == nil) != (werr == nil) || gerr != nil && gerr.Error() != werr.Error() {
		t.Fatalf("on % x the Decoder's error is %v, DecodeCommit's %v", b, gerr, werr)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("the Decoder and DecodeCommit differ on % x\n  Decoder: %s\nDecodeCommit: %s", b, show(got), show(want))
	}
}

// TestDecoderShares: a Decoder decodes a long stream of commits whose ids
// repeat, and more of them than its table holds, as DecodeCommit does;
// the repeated ids share one string.
func TestDecoderShares(t *testing.T) {
	dec := new(events.Decoder)
	var first *events.CallClaimed
	for i := range 5000 {
		run := fmt.Sprintf("run-%d", i%37)
		e := &events.CallClaimed{BatchID: run + "/" + strconv.Itoa(i%3000), CallID: "c" + strconv.Itoa(i%4),
			Attempt: 1, WorkerID: "worker-" + strconv.Itoa(i%2), ClaimToken: "tok-" + strconv.Itoa(i), LeaseMS: 100, At: goldenAt}
		b, types, err := events.EncodeCommit([]events.Event{e})
		if err != nil {
			t.Fatal(err)
		}
		checkDecoderAgrees(t, dec, b, types)
		if i == 0 || i == 4 {
			evs, err := dec.DecodeCommit(b, types)
			if err != nil {
				t.Fatal(err)
			}
			c := evs[0].(*events.CallClaimed)
			if i == 0 {
				first = c
			} else if unsafe.StringData(c.WorkerID) != unsafe.StringData(first.WorkerID) {
				t.Errorf("worker id %q decoded twice is two strings", c.WorkerID)
			}
		}
	}
}

// fastSeeds returns commit bodies the fast decoder must read by itself:
// every golden event fixture, one commit of every sample, and commits with
// values its exact fallbacks handle (floats, escapes, unsorted keys).
func fastSeeds(t testing.TB) (bodies [][]byte, headers [][]string) {
	t.Helper()
	for _, typ := range events.Types() {
		b := readGolden(t, eventFixturePath(typ, events.SchemaVersion))
		bodies, headers = append(bodies, b), append(headers, []string{string(typ)})
	}
	var all []events.Event
	for _, typ := range events.Types() {
		all = append(all, eventSamples()[typ].event)
	}
	odd := []events.Event{
		&events.CallAwaiting{BatchID: "r/1", CallID: "c1", Ticket: events.Ticket{
			Arguments: events.MustJSON(`{"esc":"a\"b\\c\n\u0001\u2028","deep":[[[[{"x":[1.25,-0.5,1e300]}]]]],"neg":-129,"u":4294967296}`),
		}, At: goldenAt},
		&events.CallCompleted{BatchID: "r/1", CallID: "c1", Attempt: 1, Output: events.Output{CallID: "c1",
			Content: []events.ContentBlock{events.TextBlock("tab\there \"quoted\" é ✓"), {Type: events.BlockToolResult, ToolUseID: "t",
				Content: []events.ContentBlock{{Type: events.BlockToolResult, ToolUseID: "u"}}}},
		}, At: goldenAt.Add(123456789)},
		&events.BatchFinalized{BatchID: "r/1", Step: 1, Results: []events.ContentBlock{}, At: goldenAt.AddDate(400, 0, 0)},
		&events.RunEnded{Cause: events.EndCancelled, At: goldenAt.AddDate(-100, 0, 0)},
	}
	for _, evs := range [][]events.Event{all, odd} {
		b, types, err := events.EncodeCommit(evs)
		if err != nil {
			t.Fatalf("encode: %v", err)
		}
		bodies, headers = append(bodies, b), append(headers, types)
	}
	return bodies, headers
}

func readGolden(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden fixture: %v", err)
	}
	return b
}

func TestFastDecodeGolden(t *testing.T) {
	bodies, headers := fastSeeds(t)
	for i, b := range bodies {
		if !checkFastAgrees(t, b, headers[i]) {
			t.Errorf("the fast decoder gave up on seed %d (%v): it must read what EncodeCommit writes", i, headers[i])
		}
		if !checkFastAgrees(t, b, nil) {
			t.Errorf("the fast decoder gave up on seed %d without headers", i)
		}
	}
}

// TestFastDecodeOddEncodings: encodings EncodeCommit does not write but the
// reflective decoder reads; the fast decoder either reads them equally or
// leaves them to it.
func TestFastDecodeOddEncodings(t *testing.T) {
	envelope := func(typ string, data doc) []byte {
		return mustMsgpack(t, []any{doc{"type": typ, "schema_version": 1, "data": rawMsgpack(mustMsgpack(t, data))}})
	}
	cases := map[string][]byte{
		"keys sorted":      envelope("CallClaimed", doc{"at": goldenAt, "attempt": 1, "batch_id": "r/1", "call_id": "c1", "lease_ms": 5, "worker_id": "w"}),
		"nil fields":       envelope("CallClaimed", doc{"attempt": nil, "batch_id": nil, "claim_token": nil}),
		"unknown key":      envelope("CallClaimed", doc{"batch_id": "r/1", "later": "field"}),
		"bin string":       envelope("CallClaimed", doc{"batch_id": []byte("r/1")}),
		"big attempt":      envelope("CallClaimed", doc{"attempt": uint64(1) << 63}),
		"float attempt":    envelope("CallClaimed", doc{"attempt": 1.5}),
		"nil time":         envelope("CallClaimed", doc{"at": nil}),
		"nil output":       envelope("CallGated", doc{"output": nil}),
		"nil ticket":       envelope("CallAwaiting", doc{"ticket": nil}),
		"nil deadline":     envelope("CallAwaiting", doc{"ticket": doc{"deadline": nil, "arguments": nil}}),
		"empty calls":      envelope("BatchSubmitted", doc{"calls": []any{}, "assistant": doc{"content": []any{}}}),
		"nil call":         envelope("BatchSubmitted", doc{"calls": []any{nil}}),
		"text block nil":   envelope("BatchFinalized", doc{"results": []any{doc{"type": "text", "text": nil}}}),
		"text block bin":   envelope("BatchFinalized", doc{"results": []any{doc{"type": "text", "text": []byte("x")}}}),
		"text block extra": envelope("BatchFinalized", doc{"results": []any{doc{"type": "text", "text": "x", "id": "y"}}}),
		"block type last":  envelope("BatchFinalized", doc{"results": []any{doc{"text": "x", "type": "text"}}}),
		"unknown block":    envelope("BatchFinalized", doc{"results": []any{doc{"type": "video"}}}),
		"result nil bits":  envelope("BatchFinalized", doc{"results": []any{doc{"type": "tool_result", "tool_use_id": "t", "content": nil, "is_error": nil}}}),
		"bad utf8 text":    envelope("BatchFinalized", doc{"results": []any{doc{"type": "text", "text": "\xff"}}}),
		"bad utf8 json":    envelope("CallAwaiting", doc{"ticket": doc{"arguments": doc{"k": "\xff"}}}),
		"json int key":     envelope("CallAwaiting", doc{"ticket": doc{"arguments": map[int]int{1: 2}}}),
		"data nil":         mustMsgpack(t, []any{doc{"type": "RunEnded", "schema_version": 1, "data": nil}}),
		"version 2":        mustMsgpack(t, []any{doc{"type": "RunEnded", "schema_version": 2, "data": doc{}}}),
		"unknown type":     mustMsgpack(t, []any{doc{"type": "RunPaused", "schema_version": 1, "data": doc{}}}),
		"empty commit":     mustMsgpack(t, []any{}),
		"inbox seq":        envelope("BatchSubmitted", doc{"msg_id": "r/1/x", "inbox_seq": uint64(1)<<63 + 5}),
		"invalid call":     envelope("BatchSubmitted", doc{"calls": []any{doc{"call_id": "c1", "tool_id": "t", "invalid": "the arguments do not match"}}}),
		"negative seq":     envelope("BatchRejected", doc{"inbox_seq": -3, "digest": "d"}),
		"thinking block":   envelope("BatchSubmitted", doc{"assistant": doc{"content": []any{doc{"type": "thinking", "thinking": "x", "signature": "s"}, doc{"type": "text", "text": "y", "citations": nil}}}}),
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			checkFastAgrees(t, b, nil)
			evs, err := events.DecodeCommit(b, nil)
			ref, rerr := events.DecodeCommitReflect(b, nil)
			if (err == nil) != (rerr == nil) || !reflect.DeepEqual(evs, ref) {
				t.Fatalf("DecodeCommit: %s, %v; reflective: %s, %v", show(evs), err, show(ref), rerr)
			}
		})
	}
}

// TestFastDecodeMutations changes every byte of every seed in several ways,
// truncates it at every length and drops every byte: the decoders must
// agree on each result.
func TestFastDecodeMutations(t *testing.T) {
	bodies, _ := fastSeeds(t)
	replace := []byte{0x00, 0x01, 0x7f, 0x80, 0x81, 0x90, 0x91, 0xa0, 0xa1, 0xc0, 0xc1, 0xc2, 0xc3, 0xc4, 0xc7,
		0xca, 0xcb, 0xcc, 0xcf, 0xd3, 0xd6, 0xd7, 0xd9, 0xdb, 0xdc, 0xdd, 0xde, 0xdf, 0xe0, 0xff}
	var accepted, total int
	for _, seed := range bodies {
		b := bytes.Clone(seed)
		for i := range b {
			orig := b[i]
			// Every byte gets three of the codes (a different three at each
			// position) and its neighbours.
			k := i % len(replace)
			for _, r := range []byte{replace[k], replace[(k+11)%len(replace)], replace[(k+19)%len(replace)], orig ^ 1, orig + 1, orig - 1} {
				b[i] = r
				total++
				if checkFastAgrees(t, b, nil) {
					accepted++
				}
			}
			b[i] = orig
			total += 2
			checkFastAgrees(t, b[:i], nil)
			checkFastAgrees(t, append(bytes.Clone(b[:i]), b[i+1:]...), nil)
		}
	}
	t.Logf("%d variants, %d read by the fast decoder", total, accepted)
	if accepted == 0 {
		t.Fatal("the fast decoder read no variant: the test checks nothing")
	}
}

// FuzzFastDecode: the decoders agree on any input.
//
//	go test ./events -run '^$' -fuzz '^FuzzFastDecode$' -fuzztime 30s
func FuzzFastDecode(f *testing.F) {
	bodies, _ := fastSeeds(f)
	for _, b := range bodies {
		f.Add(b)
		for _, h := range hostileMsgpack(b) {
			f.Add(h)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		checkFastAgrees(t, b, nil)
	})
}

func BenchmarkDecodeCommit(b *testing.B) {
	bodies, headers := fastSeeds(b)
	w3 := w3Commits(b)
	for _, c := range []struct {
		name   string
		decode func([]byte, []string) ([]events.Event, error)
	}{
		{"fast", events.DecodeCommit},
		{"reflect", events.DecodeCommitReflect},
	} {
		b.Run("golden/"+c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				for i, body := range bodies {
					if _, err := c.decode(body, headers[i]); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
		b.Run("w3/"+c.name, func(b *testing.B) {
			b.ReportAllocs()
			n := 0
			for b.Loop() {
				for _, cm := range w3 {
					evs, err := c.decode(cm.body, cm.types)
					if err != nil {
						b.Fatal(err)
					}
					n += len(evs)
				}
			}
			b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

// w3Commits returns the commits of one batch as bench/replay.go writes
// them: a submission of 4 sandbox calls, per call a gate commit
// (CallGated, CallExecuting), a claim and a completion, the last
// completion with the barrier.
func w3Commits(tb testing.TB) []struct {
	body  []byte
	types []string
} {
	at := goldenAt
	desc := events.Descriptor{Target: events.TargetSandbox, Kind: events.KindTool, Pool: "default",
		Policy: events.Policy{Mode: events.ModeReplaySafe, MaxAttempts: 3}}
	var blocks []events.ContentBlock
	var calls []events.Call
	var results []events.ContentBlock
	for i, id := range []string{"c1", "c2", "c3", "c4"} {
		args := events.MustJSON(`{"i":` + string(rune('0'+i)) + `}`)
		blocks = append(blocks, events.ContentBlock{Type: events.BlockToolUse, ID: id, Name: "noop", Input: args})
		calls = append(calls, events.Call{CallID: id, ToolID: "noop", Arguments: args, Tool: desc})
		results = append(results, events.TextOutput(id, events.EmptySuccessText).ToolResultBlock())
	}
	commits := [][]events.Event{{&events.BatchSubmitted{RunID: "rec-1", ThreadID: "t-rec-1", BatchID: "rec-1/1", Step: 1,
		Assistant: events.Message{ID: "m1", Content: blocks}, Calls: calls, SnapshotID: "cat-0123456789abcdef",
		Digest: "b8c7996c16494a3e377137933ce985786b90b712ef333e7e34a5592a3ccbedf7", At: at}}}
	for i, id := range []string{"c1", "c2", "c3", "c4"} {
		at = at.Add(1000)
		commits = append(commits,
			[]events.Event{
				&events.CallGated{BatchID: "rec-1/1", CallID: id, Outcome: events.GateAllow, Label: "allow", Stage: events.StageDefault, At: at},
				&events.CallExecuting{BatchID: "rec-1/1", CallID: id, Attempt: 1, OperationID: "rec-1/1/" + id, Cause: events.CauseAllowed,
					Capability: events.CapReplaySafe, At: at},
			},
			[]events.Event{&events.CallClaimed{BatchID: "rec-1/1", CallID: id, Attempt: 1, WorkerID: "worker1", ClaimToken: "tok-rec-1-1-" + id,
				LeaseMS: 10000, At: at}})
		done := []events.Event{&events.CallCompleted{BatchID: "rec-1/1", CallID: id, Attempt: 1,
			Output: events.TextOutput(id, events.EmptySuccessText), At: at}}
		if i == 3 {
			done = append(done, &events.BatchFinalized{BatchID: "rec-1/1", Step: 1, Results: results, State: []events.Command{}, At: at})
		}
		commits = append(commits, done)
	}
	var out []struct {
		body  []byte
		types []string
	}
	for _, evs := range commits {
		body, types, err := events.EncodeCommit(evs)
		if err != nil {
			tb.Fatalf("encode: %v", err)
		}
		out = append(out, struct {
			body  []byte
			types []string
		}{body, types})
	}
	return out
}

// BenchmarkEncodeCommit encodes the commits of a W1 batch (w3Commits).
func BenchmarkEncodeCommit(b *testing.B) {
	var commits [][]events.Event
	for _, cm := range w3Commits(b) {
		evs, err := events.DecodeCommit(cm.body, cm.types)
		if err != nil {
			b.Fatal(err)
		}
		commits = append(commits, evs)
	}
	b.ReportAllocs()
	for b.Loop() {
		for _, evs := range commits {
			if _, _, err := events.EncodeCommit(evs); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// TestEncodeCommitAsEnvelopes: the one-pass commit encoding gives the
// bytes of the envelopes marshalled whole, for commits of one event to
// more than a small array's 15 (every sample type, the W1 batch's
// commits).
func TestEncodeCommitAsEnvelopes(t *testing.T) {
	var all []events.Event
	for _, typ := range events.Types() {
		all = append(all, eventSamples()[typ].event)
	}
	commits := [][]events.Event{all, slices.Concat(all, all), all[:1]}
	for _, cm := range w3Commits(t) {
		evs, err := events.DecodeCommit(cm.body, cm.types)
		if err != nil {
			t.Fatal(err)
		}
		commits = append(commits, evs)
	}
	for i, evs := range commits {
		got, _, err := events.EncodeCommit(evs)
		if err != nil {
			t.Fatal(err)
		}
		want, err := events.EncodeCommitAsEnvelopes(evs)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("commit %d (%d events): one pass gives %x, the envelopes %x", i, len(evs), got, want)
		}
	}
}
