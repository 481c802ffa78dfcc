package events_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/protocol"
)

// Golden fixtures pin the log and wire formats. Each event type and wire
// message has one fully populated sample below; its encoding is stored under
// testdata/golden and compared byte for byte. Fixtures are never rewritten or
// deleted: a change to an encoding is a new schema version with a new
// fixture, and the old fixture must keep decoding.
//
// Create missing fixtures with:
//
//	go test ./events -run '^TestGolden' -update
var update = flag.Bool("update", false, "write golden fixtures that are missing (existing fixtures are never rewritten)")

// goldenDir is testdata/golden at the repository root.
const goldenDir = "../testdata/golden"

// wireVersion is the version in wire fixture names; wire messages carry no
// version of their own.
const wireVersion = 1

// Fixed times of the samples. Deadline has nanoseconds so that the 8-byte
// msgpack timestamp form is pinned too.
var (
	goldenAt       = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	goldenDeadline = time.Date(2026, 11, 30, 12, 0, 0, 500_000_000, time.UTC)
	goldenDue      = time.Date(2026, 11, 29, 18, 30, 0, 0, time.UTC)
)

// goldenValue is a JSON value holding every JSON kind, including numbers that
// need int64, uint64 and float64, and characters that must not be escaped.
const goldenValue = `{"arr":[1,"two",false,null],"big":18446744073709551615,"bool":true,` +
	`"float":1.5,"int":-42,"null":null,"obj":{"a":2,"z":1},"str":"é <&> ok"}`

// outputBlocks returns content blocks of every kind a tool output holds.
func outputBlocks() []events.ContentBlock {
	return []events.ContentBlock{
		events.TextBlock("Read 3 lines <a&b>."),
		{Type: events.BlockImage, Source: &events.ImageSource{
			Type: "base64", MediaType: "image/png",
			Data: "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==",
		}},
		{Type: events.BlockImage, Source: &events.ImageSource{Type: "url", URL: "https://example.com/plot.png?w=1&h=2"}},
		{Type: events.BlockJSON, Value: events.MustJSON(goldenValue)},
	}
}

// resultBlocks returns tool_result blocks with nested content, one an error.
func resultBlocks() []events.ContentBlock {
	return []events.ContentBlock{
		{Type: events.BlockToolResult, ToolUseID: "toolu_01", Content: outputBlocks(), IsError: true},
		{Type: events.BlockToolResult, ToolUseID: "toolu_02", Content: []events.ContentBlock{events.TextBlock("yes")}},
	}
}

// assistant returns an assistant message with text and two tool_use blocks.
func assistant() events.Message {
	return events.Message{ID: "msg_01", Content: []events.ContentBlock{
		events.TextBlock("Let me look at that file and ask you first."),
		{Type: events.BlockToolUse, ID: "toolu_01", Name: "read_file", Input: events.MustJSON(`{"path":"/etc/hosts","limit":3}`)},
		{Type: events.BlockToolUse, ID: "toolu_02", Name: "ask_user", Input: events.MustJSON(goldenValue)},
	}}
}

// commands returns staged commands of every scope, merge and action. A
// remove carries no value.
func commands() []events.Command {
	return []events.Command{
		{Scope: events.ScopeRun, Key: "cursor", Merge: events.MergeDisjoint, Action: events.ActionSet, Value: events.MustJSON(`{"line":3}`)},
		{Scope: events.ScopeThread, Key: "seen", Merge: events.MergeCommutative, Action: events.ActionSet, Value: events.MustJSON(`{"hosts":true}`)},
		{Scope: events.ScopeShared, Key: "lock", Merge: events.MergeExclusive, Action: events.ActionRemove},
	}
}

func output() events.Output {
	return events.Output{CallID: "toolu_01", Content: outputBlocks(), IsError: true, State: commands()}
}

func ticket() events.Ticket {
	deadline, due := goldenDeadline, goldenDue
	return events.Ticket{
		CorrelationID: "corr_9b1", RunID: "run_7f3a", ThreadID: "thread_42", BatchID: "run_7f3a/3",
		CallID: "toolu_02", ToolID: "ask_user", Arguments: events.MustJSON(goldenValue),
		Reason: events.WaitScheduledAction, SnapshotID: "snap_0003",
		Deadline: &deadline, Due: &due, ActionKind: "deploy",
	}
}

// eventSample is one event fixture: a fully populated event and the paths
// of fields that are zero on purpose.
type eventSample struct {
	event     events.Event
	allowZero []string
}

// eventSamples returns one sample per event type.
func eventSamples() map[events.Type]eventSample {
	out := outputPtr()
	return map[events.Type]eventSample{
		events.TypeBatchSubmitted: {event: &events.BatchSubmitted{
			RunID: "run_7f3a", ThreadID: "thread_42", BatchID: "run_7f3a/3", Step: 3,
			Assistant: assistant(),
			Calls: []events.Call{
				{CallID: "toolu_01", ToolID: "read_file", Arguments: events.MustJSON(`{"path":"/etc/hosts","limit":3}`),
					Tool: events.Descriptor{Target: events.TargetSandbox, Kind: events.KindTool, Pool: "linux-small",
						Policy: events.Policy{Mode: events.ModeIdempotent, MaxAttempts: 5}, ParallelCompletion: true}},
				{CallID: "toolu_02", ToolID: "ask_user", Arguments: events.MustJSON(goldenValue),
					Tool: events.Descriptor{Target: events.TargetBrain, Kind: events.KindClient, Pool: "default",
						Policy: events.Policy{Mode: events.ModeNeverReplay, MaxAttempts: 1}, ParallelCompletion: true}},
			},
			SnapshotID: "snap_0003", Narrowing: events.NarrowingDenyAll,
			Digest: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", At: goldenAt,
		}, allowZero: []string{"MsgID", "InboxSeq", "Calls[0].Invalid", "Calls[1].Invalid"}}, // added later, omitted when empty: the fixture's bytes stand
		events.TypeBatchRejected: {event: &events.BatchRejected{
			RunID: "run_7f3a", BatchID: "run_7f3a/4", Step: 4, Code: events.CodeDuplicateCallID,
			Reason: `call_id "toolu_01" appears twice`, At: goldenAt,
		}, allowZero: []string{"MsgID", "InboxSeq", "Digest"}}, // the same
		events.TypeCallGated: {event: &events.CallGated{
			BatchID: "run_7f3a/3", CallID: "toolu_01", Outcome: events.GateSetResult, Label: events.GateSetResult.Label(),
			Stage: events.StagePolicy, Rule: "cache-hit", Reason: "answered from cache", Output: out, At: goldenAt,
		}},
		events.TypeCallExecuting: {event: &events.CallExecuting{
			BatchID: "run_7f3a/3", CallID: "toolu_01", Attempt: 2, OperationID: "run_7f3a/3/toolu_01",
			Cause: events.CauseRetry, Detail: "worker lost before dispatch", Capability: events.CapIdempotent,
			Parallel: true, At: goldenAt,
		}},
		events.TypeCallClaimed: {event: &events.CallClaimed{
			BatchID: "run_7f3a/3", CallID: "toolu_01", Attempt: 2, WorkerID: "worker-a1",
			ClaimToken: "claim_5e2", LeaseMS: 30000, At: goldenAt,
		}, allowZero: []string{"Incarnation"}}, // added later, omitted when empty: the fixture's bytes stand
		events.TypeCallCompleted: {event: &events.CallCompleted{
			BatchID: "run_7f3a/3", CallID: "toolu_01", Attempt: 2, Output: output(),
			ErrorKind: events.ErrorExecution, At: goldenAt,
		}},
		events.TypeCallIndeterminate: {event: &events.CallIndeterminate{
			BatchID: "run_7f3a/3", CallID: "toolu_01", Attempt: 2, Reason: "lease expired after dispatch", At: goldenAt,
		}},
		events.TypeCallAwaiting: {event: &events.CallAwaiting{
			BatchID: "run_7f3a/3", CallID: "toolu_02", Ticket: ticket(), At: goldenAt,
		}},
		events.TypeTicketResolved: {event: &events.TicketResolved{
			BatchID: "run_7f3a/3", CallID: "toolu_02", CorrelationID: "corr_9b1", Resolution: events.ResolutionInput,
			Principal: "alice", Note: "go ahead", Input: "use the staging host", At: goldenAt,
		}},
		events.TypeResultRefused: {event: &events.ResultRefused{
			BatchID: "run_7f3a/3", CallID: "toolu_01", Attempt: 1, ClaimToken: "claim_old",
			Reason: "claim token is not current", At: goldenAt,
		}},
		events.TypeBatchFinalized: {event: &events.BatchFinalized{
			BatchID: "run_7f3a/3", Step: 3, Results: resultBlocks(), State: commands(),
			Conflict: "shared/lock was set by another batch", At: goldenAt,
		}},
		events.TypeRunEnded: {event: &events.RunEnded{
			Cause: events.EndStateConflict, Reason: "shared/lock conflict", At: goldenAt,
		}},
	}
}

func outputPtr() *events.Output {
	o := output()
	return &o
}

// wireFixture is one wire message fixture.
type wireFixture struct {
	name      string                                   // file name stem: <name>.v1.msgpack
	sample    any                                      // pointer to a fully populated value
	newValue  func() any                               // a new pointer of the sample's type, for Unmarshal
	decode    func(b []byte, isJSON bool) (any, error) // the message's own decoder, nil if it has none
	hasJSON   bool                                     // whether a JSON form <name>.v1.json exists
	allowZero []string                                 // paths of fields that are zero on purpose
}

func decodeSubmit(b []byte, isJSON bool) (any, error) {
	return protocol.DecodeSubmit(b, isJSON, events.DefaultLimits())
}

func decodeResume(b []byte, isJSON bool) (any, error) {
	return protocol.DecodeResume(b, isJSON, events.DefaultLimits())
}

func decodeControl(b []byte, isJSON bool) (any, error) {
	return protocol.DecodeControl(b, isJSON)
}

func decodeResult(b []byte, isJSON bool) (any, error) {
	if isJSON {
		return nil, errors.New("a result has no JSON form")
	}
	return protocol.DecodeResult(b, events.DefaultLimits())
}

func newOf[T any]() func() any { return func() any { return new(T) } }

// wireFixtures returns every wire fixture. Names are stable: the walk over
// testdata/golden/wire maps files to decoders by them.
func wireFixtures() []wireFixture {
	tk := ticket()
	return []wireFixture{
		{name: "submit", newValue: newOf[protocol.Submit](), decode: decodeSubmit, hasJSON: true,
			sample: &protocol.Submit{RunID: "run_7f3a", ThreadID: "thread_42", Step: 3, Assistant: assistant(), Narrowing: events.NarrowingDenyAll}},
		{name: "resume_permission", newValue: newOf[protocol.Resume](), decode: decodeResume, hasJSON: true,
			sample: &protocol.Resume{CorrelationID: "corr_9b1", RunID: "run_7f3a", ThreadID: "thread_42", CallID: "toolu_02", SnapshotID: "snap_0003",
				Result: events.ResumeResult{Kind: events.ResultPermission, Allow: true, Note: "approved by on-call", Reason: "low risk"}}},
		{name: "resume_tool_result", newValue: newOf[protocol.Resume](), decode: decodeResume, hasJSON: true,
			sample: &protocol.Resume{CorrelationID: "corr_9b1", RunID: "run_7f3a", ThreadID: "thread_42", CallID: "toolu_02", SnapshotID: "snap_0003",
				Result: events.ResumeResult{Kind: events.ResultToolResult, Output: outputPtr()}}},
		{name: "resume_input", newValue: newOf[protocol.Resume](), decode: decodeResume, hasJSON: true,
			sample: &protocol.Resume{CorrelationID: "corr_9b1", RunID: "run_7f3a", ThreadID: "thread_42", CallID: "toolu_02", SnapshotID: "snap_0003",
				Result: events.ResumeResult{Kind: events.ResultInput, Text: "use the staging host"}}},
		{name: "control", newValue: newOf[protocol.Control](), decode: decodeControl, hasJSON: true,
			sample: &protocol.Control{Action: protocol.ControlPerform, CorrelationID: "corr_9b1", Reason: "maintenance window open"}},
		{name: "dispatch", newValue: newOf[protocol.Dispatch](),
			sample: &protocol.Dispatch{BatchID: "run_7f3a/3", RunID: "run_7f3a", CallID: "toolu_01", ToolID: "read_file",
				Arguments: events.MustJSON(goldenValue), Attempt: 2, OperationID: "run_7f3a/3/toolu_01"}},
		{name: "claim_request", newValue: newOf[protocol.ClaimRequest](), allowZero: []string{"Incarnation"}, // a worker before it
			sample: &protocol.ClaimRequest{OperationID: "run_7f3a/3/toolu_01", Attempt: 2, WorkerID: "worker-a1"}},
		{name: "claim_request_process", newValue: newOf[protocol.ClaimRequest](),
			sample: &protocol.ClaimRequest{OperationID: "run_7f3a/3/toolu_01", Attempt: 2, WorkerID: "worker-a1", Incarnation: "Q7bDh2kxN1c9mT0sWv4ZpE"}},
		{name: "claim_reply", newValue: newOf[protocol.ClaimReply](), allowZero: []string{"Job", "TraceParent"}, // a heartbeat's reply; TraceParent added later, omitted when empty
			sample: &protocol.ClaimReply{Granted: true, ClaimToken: "claim_5e2", LeaseMS: 30000, Reason: "granted on first claim"}},
		{name: "claim_reply_job", newValue: newOf[protocol.ClaimReply](), allowZero: []string{"TraceParent"}, // the same
			sample: &protocol.ClaimReply{Granted: true, ClaimToken: "claim_5e2", LeaseMS: 30000, Reason: "granted on first claim",
				Job: &protocol.Dispatch{BatchID: "run_7f3a/3", RunID: "run_7f3a", CallID: "toolu_01", ToolID: "build",
					Arguments: events.MustJSON(`{"target":"all"}`), Attempt: 2, OperationID: "run_7f3a/3/toolu_01"}}},
		{name: "heartbeat", newValue: newOf[protocol.Heartbeat](),
			sample: &protocol.Heartbeat{OperationID: "run_7f3a/3/toolu_01", Attempt: 2, ClaimToken: "claim_5e2", WorkerID: "worker-a1"}},
		{name: "result_output", newValue: newOf[protocol.Result](), decode: decodeResult, allowZero: []string{"Error"},
			sample: &protocol.Result{OperationID: "run_7f3a/3/toolu_01", Attempt: 2, ClaimToken: "claim_5e2", Output: outputPtr()}},
		{name: "result_error", newValue: newOf[protocol.Result](), decode: decodeResult, allowZero: []string{"Output"},
			sample: &protocol.Result{OperationID: "run_7f3a/3/toolu_01", Attempt: 2, ClaimToken: "claim_5e2",
				Error: &events.ToolError{Kind: events.ErrorInvalidArguments, Message: "path must be absolute"}}},
		{name: "result_request", newValue: newOf[protocol.ResultRequest](), allowZero: []string{"Result.Error"},
			sample: &protocol.ResultRequest{Result: protocol.Result{OperationID: "run_7f3a/3/toolu_01", Attempt: 2, ClaimToken: "claim_5e2", Output: outputPtr()},
				WorkerID: "worker-a1", Incarnation: "Q7bDh2kxN1c9mT0sWv4ZpE", NextPool: "default", NextTools: []string{"build", "lint"}}},
		{name: "result_reply_next", newValue: newOf[protocol.ResultReply](),
			sample: &protocol.ResultReply{Recorded: true, Refused: "aggregate: the call is terminal", Reason: "engine busy, try again",
				Next: &protocol.ClaimReply{Granted: true, ClaimToken: "claim_6f3", LeaseMS: 30000, Reason: "granted with a result",
					TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
					Job: &protocol.Dispatch{BatchID: "run_7f3a/3", RunID: "run_7f3a", CallID: "toolu_02", ToolID: "build",
						Arguments: events.MustJSON(`{"target":"docs"}`), Attempt: 1, OperationID: "run_7f3a/3/toolu_02"}}}},
		{name: "disposition_out", newValue: newOf[protocol.DispositionOut](),
			sample: &protocol.DispositionOut{BatchID: "run_7f3a/3", CallID: "toolu_01", ToolID: "read_file",
				Disposition: events.DispositionPendingBuiltin, Phase: events.PhaseExecuting, Attempt: 2}},
		{name: "results_out", newValue: newOf[protocol.ResultsOut](), allowZero: []string{"Submission"}, // added later, omitted when nil: the fixture's bytes stand
			sample: &protocol.ResultsOut{BatchID: "run_7f3a/3", Step: 3, Results: resultBlocks(), State: commands()}},
		{name: "awaiting_out", newValue: newOf[protocol.AwaitingOut](), sample: ptr(protocol.Awaiting(tk))},
		{name: "rejected_out", newValue: newOf[protocol.RejectedOut](), allowZero: []string{"Submission"}, // the same
			sample: &protocol.RejectedOut{BatchID: "run_7f3a/4", Code: events.CodeLimitExceeded, Reason: "129 calls in one batch, at most 128"}},
		{name: "refused_out", newValue: newOf[protocol.RefusedOut](),
			sample: &protocol.RefusedOut{CorrelationID: "corr_9b1", Code: events.CodeWrongSnapshot, Reason: "snapshot snap_0002 is not snap_0003"}},
		{name: "ended_out", newValue: newOf[protocol.EndedOut](),
			sample: &protocol.EndedOut{Cause: events.EndCancelled, Reason: "user pressed stop"}},
	}
}

func ptr[T any](v T) *T { return &v }

func eventFixturePath(t events.Type, version int) string {
	return filepath.Join(goldenDir, "events", fmt.Sprintf("%s.v%d.msgpack", t, version))
}

func wireFixturePath(name, ext string) string {
	return filepath.Join(goldenDir, "wire", fmt.Sprintf("%s.v%d.%s", name, wireVersion, ext))
}

// goldenFile returns the fixture at path. A missing fixture is written from
// fresh with -update, and fails the test without it. An existing fixture is
// never rewritten.
func goldenFile(t *testing.T, path string, fresh []byte) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		return b
	case !errors.Is(err, fs.ErrNotExist):
		t.Fatalf("read golden fixture: %v", err)
	case !*update:
		t.Fatalf("golden fixture %s is missing; create it with: go test ./events -run '^TestGolden' -update", path)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatalf("create golden dir: %v", err)
	}
	if err := os.WriteFile(path, fresh, 0o644); err != nil {
		t.Fatalf("write golden fixture: %v", err)
	}
	t.Logf("wrote missing golden fixture %s", path)
	return fresh
}

// diffBytes describes where two encodings first differ.
func diffBytes(what string, got, want []byte) string {
	off := 0
	for off < len(got) && off < len(want) && got[off] == want[off] {
		off++
	}
	lo := max(0, off-8)
	window := func(b []byte) []byte { return b[min(lo, len(b)):min(off+16, len(b))] }
	return fmt.Sprintf("%s: first difference at offset %d (%d bytes vs %d bytes)\n  got[%d:]:  % x\n  want[%d:]: % x",
		what, off, len(got), len(want), lo, window(got), lo, window(want))
}

// show renders a value for a failure message.
func show(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%#v", v)
	}
	return string(b)
}

// checkEqual fails unless got and want are deeply equal.
func checkEqual(t *testing.T, what string, got, want any) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s: decoded value differs from the sample\n  got:  %s\n  want: %s", what, show(got), show(want))
	}
}

func TestGoldenEvents(t *testing.T) {
	samples := eventSamples()
	for _, typ := range events.Types() {
		t.Run(string(typ), func(t *testing.T) {
			s, ok := samples[typ]
			if !ok {
				t.Fatalf("no golden sample for event type %s: add one to eventSamples", typ)
			}
			fresh, headers, err := events.EncodeCommit([]events.Event{s.event})
			if err != nil {
				t.Fatalf("encode sample: %v", err)
			}
			path := eventFixturePath(typ, events.SchemaVersion)
			file := goldenFile(t, path, fresh)
			if !bytes.Equal(file, fresh) {
				t.Errorf("%s", diffBytes(path+": fixture (got) differs from a fresh encoding of the sample (want); "+
					"fixtures are never rewritten: a format change needs a new schema version", file, fresh))
			}
			got, err := events.DecodeCommit(file, headers)
			if err != nil {
				t.Fatalf("decode %s: %v", path, err)
			}
			if len(got) != 1 {
				t.Fatalf("decode %s: %d events, want 1", path, len(got))
			}
			checkEqual(t, path, got[0], s.event)
			again, _, err := events.EncodeCommit(got)
			if err != nil {
				t.Fatalf("re-encode %s: %v", path, err)
			}
			if !bytes.Equal(again, file) {
				t.Errorf("%s", diffBytes(path+": re-encoding of the decoded fixture (got) differs from the fixture (want)", again, file))
			}
		})
	}
}

func TestGoldenWire(t *testing.T) {
	for _, fx := range wireFixtures() {
		t.Run(fx.name, func(t *testing.T) {
			fresh, err := events.Marshal(fx.sample)
			if err != nil {
				t.Fatalf("encode sample: %v", err)
			}
			path := wireFixturePath(fx.name, "msgpack")
			file := goldenFile(t, path, fresh)
			if !bytes.Equal(file, fresh) {
				t.Errorf("%s", diffBytes(path+": fixture (got) differs from a fresh encoding of the sample (want)", file, fresh))
			}

			v := fx.newValue()
			if err := events.Unmarshal(file, v); err != nil {
				t.Fatalf("unmarshal %s: %v", path, err)
			}
			checkEqual(t, path+" (Unmarshal)", v, fx.sample)
			again, err := events.Marshal(v)
			if err != nil {
				t.Fatalf("re-encode %s: %v", path, err)
			}
			if !bytes.Equal(again, file) {
				t.Errorf("%s", diffBytes(path+": re-encoding of the decoded fixture (got) differs from the fixture (want)", again, file))
			}
			if fx.decode != nil {
				d, err := fx.decode(file, false)
				if err != nil {
					t.Fatalf("strict decode %s: %v", path, err)
				}
				checkEqual(t, path+" (strict decoder)", d, fx.sample)
			}

			if !fx.hasJSON {
				return
			}
			freshJSON, err := json.Marshal(fx.sample)
			if err != nil {
				t.Fatalf("encode sample as JSON: %v", err)
			}
			jpath := wireFixturePath(fx.name, "json")
			jfile := goldenFile(t, jpath, freshJSON)
			if !bytes.Equal(jfile, freshJSON) {
				t.Errorf("%s", diffBytes(jpath+": fixture (got) differs from a fresh JSON encoding of the sample (want)", jfile, freshJSON))
			}
			d, err := fx.decode(jfile, true)
			if err != nil {
				t.Fatalf("strict decode %s: %v", jpath, err)
			}
			checkEqual(t, jpath+" (strict decoder)", d, fx.sample)
			againJSON, err := json.Marshal(d)
			if err != nil {
				t.Fatalf("re-encode %s: %v", jpath, err)
			}
			if !bytes.Equal(againJSON, jfile) {
				t.Errorf("%s", diffBytes(jpath+": re-encoding of the decoded fixture (got) differs from the fixture (want)", againJSON, jfile))
			}
		})
	}
}

var (
	eventFixtureName = regexp.MustCompile(`^([A-Za-z]+)\.v([0-9]+)\.msgpack$`)
	wireFixtureName  = regexp.MustCompile(`^([a-z_]+)\.v([0-9]+)\.(msgpack|json)$`)
)

// TestGoldenFixturesDecode decodes every fixture on disk, of every version,
// so that old fixtures (never deleted) keep decoding. A file that cannot be
// mapped to a decoder fails the test.
func TestGoldenFixturesDecode(t *testing.T) {
	dir := filepath.Join(goldenDir, "events")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("read %s: %v", dir, err)
	}
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		m := eventFixtureName.FindStringSubmatch(e.Name())
		if e.IsDir() || m == nil {
			t.Errorf("%s: cannot map to a decoder: event fixtures are named <Type>.v<N>.msgpack", path)
			continue
		}
		version, _ := strconv.Atoi(m[2])
		body, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("read %s: %v", path, err)
		}
		// The file name must say what the commit holds.
		var envs []struct {
			Type          string `msgpack:"type"`
			SchemaVersion int    `msgpack:"schema_version"`
		}
		if err := events.Unmarshal(body, &envs); err != nil {
			t.Errorf("%s: not a commit body: %v", path, err)
			continue
		}
		if len(envs) != 1 || envs[0].Type != m[1] || envs[0].SchemaVersion != version {
			t.Errorf("%s: holds %+v, want one %s event of schema version %d", path, envs, m[1], version)
			continue
		}
		evs, err := events.DecodeCommit(body, []string{m[1]})
		if err != nil {
			t.Errorf("%s: %v", path, err)
			continue
		}
		if got := evs[0].EventType(); string(got) != m[1] {
			t.Errorf("%s: decoded a %s", path, got)
		}
	}

	byName := map[string]wireFixture{}
	for _, fx := range wireFixtures() {
		byName[fx.name] = fx
	}
	dir = filepath.Join(goldenDir, "wire")
	entries, err = os.ReadDir(dir)
	if err != nil {
		t.Fatalf("read %s: %v", dir, err)
	}
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		m := wireFixtureName.FindStringSubmatch(e.Name())
		if e.IsDir() || m == nil {
			t.Errorf("%s: cannot map to a decoder: wire fixtures are named <name>.v<N>.msgpack or .json", path)
			continue
		}
		fx, ok := byName[m[1]]
		if !ok {
			t.Errorf("%s: cannot map to a decoder: no wire fixture named %q in wireFixtures", path, m[1])
			continue
		}
		isJSON := m[3] == "json"
		if isJSON && !fx.hasJSON {
			t.Errorf("%s: cannot map to a decoder: %s has no JSON form", path, m[1])
			continue
		}
		body, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("read %s: %v", path, err)
		}
		if !isJSON {
			if err := events.Unmarshal(body, fx.newValue()); err != nil {
				t.Errorf("%s: Unmarshal: %v", path, err)
			}
		}
		if fx.decode != nil {
			if _, err := fx.decode(body, isJSON); err != nil {
				t.Errorf("%s: decode: %v", path, err)
			}
		}
	}
}

// TestGoldenCoverage checks that every event type has a sample and a
// fixture, and that the samples set every field and use every block kind.
func TestGoldenCoverage(t *testing.T) {
	samples := eventSamples()
	registered := map[events.Type]bool{}
	for _, typ := range events.Types() {
		registered[typ] = true
		s, ok := samples[typ]
		if !ok {
			t.Errorf("event type %s has no golden sample: add one to eventSamples", typ)
			continue
		}
		if got := s.event.EventType(); got != typ {
			t.Errorf("sample for %s is a %s", typ, got)
		}
		path := eventFixturePath(typ, events.SchemaVersion)
		if _, err := os.Stat(path); err != nil {
			t.Errorf("event type %s has no golden fixture %s: run go test ./events -run '^TestGolden' -update", typ, path)
		}
	}
	for typ := range samples {
		if !registered[typ] {
			t.Errorf("sample for %s, which events.Types() does not list", typ)
		}
	}

	seen := map[string]bool{}
	check := func(name string, v any, allowZero []string) {
		var zero []string
		zeroPaths(reflect.ValueOf(v), "", &zero, seen)
		allowed := map[string]bool{}
		for _, p := range allowZero {
			allowed[p] = true
		}
		for _, p := range zero {
			if !allowed[p] {
				t.Errorf("sample %s: field %s is zero; golden samples set every field", name, p)
			}
		}
	}
	for typ, s := range samples {
		check(string(typ), s.event, s.allowZero)
	}
	for _, fx := range wireFixtures() {
		check(fx.name, fx.sample, fx.allowZero)
		if fx.name == "resume_tool_result" {
			if r := fx.sample.(*protocol.Resume); r.Result.Output != nil {
				check(fx.name+".Result.Output", r.Result.Output, nil)
			}
		}
	}
	for _, kind := range []string{"text", "image/base64", "image/url", "tool_use", "tool_result", "tool_result/is_error", "tool_result/nested", "json"} {
		if !seen[kind] {
			t.Errorf("no golden sample holds a %s content block", kind)
		}
	}
}

var (
	timeType    = reflect.TypeOf(time.Time{})
	rawJSONType = reflect.TypeOf(events.RawJSON(nil))
	blockType   = reflect.TypeOf(events.ContentBlock{})
	resumeType  = reflect.TypeOf(events.ResumeResult{})
	commandType = reflect.TypeOf(events.Command{})
)

// zeroPaths appends the path of every zero field under v. Content blocks and
// resume results are tagged unions: only the fields of their kind are set,
// so they are recorded in seen by kind instead. A remove command has no
// value.
func zeroPaths(v reflect.Value, path string, out *[]string, seen map[string]bool) {
	switch {
	case v.Type() == timeType:
		if v.Interface().(time.Time).IsZero() {
			*out = append(*out, path)
		}
		return
	case v.Type() == rawJSONType:
		if v.Len() == 0 {
			*out = append(*out, path)
		}
		return
	case v.Type() == blockType:
		b := v.Interface().(events.ContentBlock)
		kind := string(b.Type)
		if b.Type == events.BlockImage && b.Source != nil {
			kind += "/" + b.Source.Type
		}
		seen[kind] = true
		if b.Type == events.BlockToolResult {
			if b.IsError {
				seen["tool_result/is_error"] = true
			}
			if len(b.Content) > 0 {
				seen["tool_result/nested"] = true
			}
			for i := range b.Content {
				zeroPaths(reflect.ValueOf(b.Content[i]), fmt.Sprintf("%s.Content[%d]", path, i), out, seen)
			}
		}
		return
	case v.Type() == resumeType:
		return
	}
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			*out = append(*out, path)
			return
		}
		zeroPaths(v.Elem(), path, out, seen)
	case reflect.Struct:
		remove := v.Type() == commandType && v.Interface().(events.Command).Action == events.ActionRemove
		for i := 0; i < v.NumField(); i++ {
			name := v.Type().Field(i).Name
			if remove && name == "Value" {
				continue
			}
			p := name
			if path != "" {
				p = path + "." + p
			}
			zeroPaths(v.Field(i), p, out, seen)
		}
	case reflect.Slice:
		if v.Len() == 0 {
			*out = append(*out, path)
		}
		for i := 0; i < v.Len(); i++ {
			zeroPaths(v.Index(i), fmt.Sprintf("%s[%d]", path, i), out, seen)
		}
	default:
		if v.IsZero() {
			*out = append(*out, path)
		}
	}
}
