package events_test

import (
	"bytes"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/toolbatch/toolbatch/events"
)

// The generated commit encoder (fastencode_gen.go) against the library's
// reflective encoding of the same events (EncodeCommitAsEnvelopes): equal
// bytes, or the same failure, for events whose every field is drawn at
// random, with the values where encodings change (empty, nil, zero times,
// string and integer lengths at their format boundaries).

// filler fills values at random from a source of bytes (a fuzz input) or
// of numbers.
type filler struct {
	next func(n int) int // a number in [0, n)
}

func (f filler) pick(n int) int { return f.next(n) }

var (
	fillStrings = []string{"", "a", "toolu_01", strings.Repeat("x", 31), strings.Repeat("y", 32), strings.Repeat("z", 255),
		strings.Repeat("w", 256), strings.Repeat("v", 70000), "héllo ✓", "run_7f3a/3"}
	fillInts = []int64{0, 1, -1, 127, 128, -32, -33, 255, 256, 65535, 65536, -129, -32769, math.MaxInt32, math.MaxInt64,
		math.MinInt64, 1 << 33}
	fillTimes = []time.Time{{}, time.Unix(0, 0).UTC(), time.Date(2026, 12, 6, 4, 0, 0, 0, time.UTC),
		time.Date(2026, 12, 6, 4, 0, 0, 123456789, time.UTC), time.Unix(1<<34, 5).UTC(), time.Unix(-1, 0).UTC(),
		time.Date(1969, 7, 20, 20, 17, 0, 0, time.UTC)}
	fillJSON = []string{"null", "1", "-2.5", `"s"`, "true", "[]", "{}", `{"a":1,"b":[true,null,"x"]}`,
		`{"z":1,"a":{"nested":[1,2,{"k":"v"}]}}`, `"` + strings.Repeat("j", 300) + `"`}
	fillBlocks = []events.ContentBlock{
		{Type: events.BlockText, Text: "done"},
		{Type: events.BlockText, Text: ""},
		{Type: events.BlockToolUse, ID: "toolu_01", Name: "read_file", Input: events.MustJSON(`{"path":"/etc/hosts"}`)},
		{Type: events.BlockToolUse, ID: "toolu_02", Name: "noop"},
	}
)

// fill sets v, settable, at random; depth bounds the nesting.
func (f filler) fill(v reflect.Value, depth int) {
	switch {
	case v.Type() == timeType:
		v.Set(reflect.ValueOf(fillTimes[f.pick(len(fillTimes))]))
		return
	case v.Type() == rawJSONType:
		switch k := f.pick(len(fillJSON) + 2); {
		case k == len(fillJSON):
			v.Set(reflect.Zero(rawJSONType)) // nil
		case k == len(fillJSON)+1:
			v.Set(reflect.ValueOf(events.RawJSON{})) // empty, not nil
		default:
			v.Set(reflect.ValueOf(events.MustJSON(fillJSON[k])))
		}
		return
	case v.Type() == blockType:
		v.Set(reflect.ValueOf(fillBlocks[f.pick(len(fillBlocks))]))
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(fillStrings[f.pick(len(fillStrings))])
	case reflect.Int, reflect.Int64, reflect.Int32:
		n := fillInts[f.pick(len(fillInts))]
		if v.OverflowInt(n) {
			n = int64(int32(n))
		}
		v.SetInt(n)
	case reflect.Uint64, reflect.Uint, reflect.Uint32:
		n := uint64(fillInts[f.pick(len(fillInts))])
		if v.OverflowUint(n) {
			n = uint64(uint32(n))
		}
		v.SetUint(n)
	case reflect.Bool:
		v.SetBool(f.pick(2) == 1)
	case reflect.Pointer:
		if depth == 0 || f.pick(3) == 0 {
			v.Set(reflect.Zero(v.Type()))
			return
		}
		p := reflect.New(v.Type().Elem())
		f.fill(p.Elem(), depth-1)
		v.Set(p)
	case reflect.Slice:
		switch k := f.pick(4); {
		case depth == 0 || k == 0:
			v.Set(reflect.Zero(v.Type())) // nil
		case k == 1:
			v.Set(reflect.MakeSlice(v.Type(), 0, 0)) // empty, not nil
		default:
			s := reflect.MakeSlice(v.Type(), k-1, k-1)
			for i := range k - 1 {
				f.fill(s.Index(i), depth-1)
			}
			v.Set(s)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				f.fill(v.Field(i), depth)
			}
		}
	case reflect.Map, reflect.Interface:
		// none in the events; left zero
	default:
		panic("fill: no values for " + v.Type().String())
	}
}

// commit draws 1 to 4 events of any type.
func (f filler) commit() []events.Event {
	types := events.Types()
	evs := make([]events.Event, 1+f.pick(4))
	for i := range evs {
		sample := eventSamples()[types[f.pick(len(types))]].event
		p := reflect.New(reflect.TypeOf(sample).Elem())
		f.fill(p.Elem(), 3)
		evs[i] = p.Interface().(events.Event)
	}
	return evs
}

// checkEncoders fails t when EncodeCommit and the library's encoding of
// evs differ (in bytes or in failing); it reports whether they encoded.
func checkEncoders(t *testing.T, evs []events.Event) bool {
	t.Helper()
	got, _, err := events.EncodeCommit(evs)
	want, werr := events.EncodeCommitAsEnvelopes(evs)
	if (err != nil) != (werr != nil) {
		t.Fatalf("EncodeCommit: %v; the library: %v (events %s)", err, werr, show(evs))
	}
	if err == nil && !bytes.Equal(got, want) {
		i := 0
		for i < min(len(got), len(want)) && got[i] == want[i] {
			i++
		}
		t.Fatalf("EncodeCommit writes other bytes than the library from byte %d (of %d and %d) for %s", i, len(got), len(want), show(evs))
	}
	return err == nil
}

// TestFastEncoderMatchesLibrary: 3,000 commits of random events, every
// type, encoded alike. It also checks that the draws reach the cases that
// change encodings.
func TestFastEncoderMatchesLibrary(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	f := filler{next: r.IntN}
	encoded := 0
	seen := map[events.Type]bool{}
	for range 3000 {
		evs := f.commit()
		if checkEncoders(t, evs) {
			encoded++
			for _, e := range evs {
				seen[e.EventType()] = true
			}
		}
	}
	if encoded < 1000 || len(seen) != len(events.Types()) {
		t.Fatalf("%d of 3000 commits encoded, %d of %d types: the test checks too little", encoded, len(seen), len(events.Types()))
	}
}

// FuzzFastEncoder: the encoders agree on events drawn from any input.
//
//	go test ./events -run '^$' -fuzz '^FuzzFastEncoder$' -fuzztime 30s
func FuzzFastEncoder(f *testing.F) {
	f.Add([]byte{0})
	f.Add([]byte("a commit of events drawn from these bytes"))
	f.Fuzz(func(t *testing.T, b []byte) {
		i := 0
		next := func(n int) int {
			if i >= len(b) {
				return 0
			}
			i++
			return int(b[i-1]) % n
		}
		checkEncoders(t, filler{next: next}.commit())
	})
}
