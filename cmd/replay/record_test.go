package main

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/toolbatch/toolbatch/audit"
)

// parseRecordFast against encoding/json (decodeRecordJSON), its oracle:
// whatever the fast parser reads, encoding/json reads into an equal record.

// checkRecordAgrees fails t when parseRecordFast reads line and
// encoding/json refuses it or reads another record. It reports whether the
// fast parser read it.
func checkRecordAgrees(t *testing.T, line []byte) bool {
	t.Helper()
	var arena []byte
	fast, _, ok := parseRecordFast(line, &arena, nil)
	// The same with the headers as a list.
	var hb headerBuf
	listed, hdrs, listOK := parseRecordFast(line, &arena, &hb)
	if ok != listOK {
		t.Fatalf("the fast parser reads %q with a map: %v, with a list: %v", line, ok, listOK)
	}
	if !ok {
		return false
	}
	if listed.Headers != nil {
		t.Fatalf("with a list, the record has a map too")
	}
	listed.Headers = map[string][]string{}
	for _, h := range hdrs {
		listed.Headers[h.name] = h.vals
	}
	ref, err := decodeRecordJSON(line)
	if err != nil {
		t.Fatalf("the fast parser read %q, encoding/json refuses it: %v", line, err)
	}
	if !reflect.DeepEqual(fast, ref) || fast.Time.Location() != ref.Time.Location() {
		t.Fatalf("the parsers differ on %q\n      fast: %+v\nencoding/json: %+v", line, fast, ref)
	}
	if !reflect.DeepEqual(listed, ref) {
		t.Fatalf("the parsers differ on %q\nfast, listed: %+v\nencoding/json: %+v", line, listed, ref)
	}
	return true
}

// checkDecodeListed fails t when decodeRecord reads line otherwise with
// the headers as a list (as reads that decode do) than with a map.
func checkDecodeListed(t *testing.T, line []byte) {
	t.Helper()
	var arena []byte
	var hb headerBuf
	withMap, _, merr := decodeRecord(line, &arena, nil)
	listed, hdrs, lerr := decodeRecord(line, &arena, &hb)
	if (merr == nil) != (lerr == nil) || merr != nil && merr.Error() != lerr.Error() {
		t.Fatalf("decodeRecord on %q: with a map %v, with a list %v", line, merr, lerr)
	}
	if hdrs != nil {
		if listed.Headers != nil {
			t.Fatalf("with a list, the record of %q has a map too", line)
		}
		m := message{Record: listed, hdrs: hdrs}
		listed = m.withHeaders()
	}
	if !reflect.DeepEqual(withMap, listed) {
		t.Fatalf("decodeRecord differs on %q\n with a map: %+v\nwith a list: %+v", line, withMap, listed)
	}
}

// recordSeeds returns export lines: every line of the recorded streams and
// lines written by encodeRecord for odd records.
func recordSeeds(t testing.TB) [][]byte {
	t.Helper()
	var out [][]byte
	files, err := filepath.Glob(filepath.Join(streamsDir, "*.jsonl"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no recorded streams in %s (%v)", streamsDir, err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for l := range bytes.Lines(b) {
			out = append(out, l)
		}
	}
	odd := []audit.Record{
		{Seq: 1, Subject: "toolbatch.events.r1", Time: time.Date(2026, 1, 2, 3, 4, 5, 600, time.UTC)},
		{Seq: 18446744073709551615, Subject: "toolbatch.events.é", Time: time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC),
			Headers: map[string][]string{"Toolbatch-Event": {}, "X": {"a", "", "é"}}, Data: []byte{}},
		{Seq: 2, Subject: `toolbatch.events."quoted"<&>`, Time: time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("x", 3600)),
			Headers: map[string][]string{"Toolbatch-Event": {"CallGated\n"}}, Data: []byte("\xff\x00\x01")},
	}
	for _, r := range odd {
		var b bytes.Buffer
		if err := encodeRecord(&b, r); err != nil {
			t.Fatal(err)
		}
		out = append(out, b.Bytes())
	}
	return out
}

func TestParseRecordFast(t *testing.T) {
	read := 0
	for _, l := range recordSeeds(t) {
		checkDecodeListed(t, l)
		if checkRecordAgrees(t, l) {
			read++
		} else if !bytes.Contains(l, []byte(`\`)) {
			t.Errorf("the fast parser gave up on %q, which encodeRecord wrote with nothing to unescape", l)
		}
	}
	if read == 0 {
		t.Fatal("the fast parser read no line")
	}
	odd := []string{
		`{"seq":1,"subject":"s","time":"2026-01-02T03:04:05Z","headers":{},"data":""}`,
		`{"seq":1,"subject":"s","time":"2026-01-02T03:04:05Z","headers":{},"data":""}}`,
		`{"seq":1,"subject":"s","time":"2026-01-02T03:04:05Z","headers":{},"data":""} {}`,
		`{"seq":01,"subject":"s","time":"2026-01-02T03:04:05Z","headers":{},"data":""}`,
		`{"seq":1.0,"subject":"s","time":"2026-01-02T03:04:05Z","headers":{},"data":""}`,
		`{"seq":-1,"subject":"s","time":"2026-01-02T03:04:05Z","headers":{},"data":""}`,
		`{"seq":18446744073709551616,"subject":"s","time":"2026-01-02T03:04:05Z","headers":{},"data":""}`,
		`{"seq":1,"subject":"s","time":"2026-01-02T03:04:05+01:00","headers":{},"data":""}`,
		`{"seq":1,"subject":"s","time":"2026-01-02T03:04:05.123456789Z","headers":{},"data":""}`,
		`{"seq":1,"subject":"s","time":"2026-01-02 03:04:05Z","headers":{},"data":""}`,
		`{"seq":1,"subject":"s","time":"2026-13-02T03:04:05Z","headers":{},"data":""}`,
		`{"seq":1,"subject":"s","time":"2026-01-02T03:04:05Z","headers":{"A":["1"],"A":["2"]},"data":""}`,
		`{"seq":1,"subject":"s","time":"2026-01-02T03:04:05Z","headers":{"A":[]},"data":"kYA"}`,
		`{"seq":1,"subject":"s","time":"2026-01-02T03:04:05Z","headers":{"A":[]},"data":"kYA=="}`,
		`{"seq":1,"subject":"s","time":"2026-01-02T03:04:05Z","headers":{"A":[]},"data":"k YA="}`,
		`{"seq":1,"subject":"s","time":"2026-01-02T03:04:05Z","headers":{"A":[],},"data":""}`,
		`{"seq":1,"subject":"s","time":"2026-01-02T03:04:05Z","headers":{"A":["x",]},"data":""}`,
		`{"seq":1,"subject":"s","time":"2026-01-02T03:04:05Z","headers":null,"data":null}`,
		`{"seq":1,"subject":"s\u0000","time":"2026-01-02T03:04:05Z","headers":{},"data":""}`,
		"{\"seq\":1,\"subject\":\"s\xff\",\"time\":\"2026-01-02T03:04:05Z\",\"headers\":{},\"data\":\"\"}",
		"{\"seq\":1,\"subject\":\"s\t\",\"time\":\"2026-01-02T03:04:05Z\",\"headers\":{},\"data\":\"\"}",
		`{"Seq":1,"subject":"s","time":"2026-01-02T03:04:05Z","headers":{},"data":""}`,
		`{"seq":1,"subject":"s","time":"2026-01-02T03:04:05Z","headers":{},"data":"","more":1}`,
		` {"seq":1,"subject":"s","time":"2026-01-02T03:04:05Z","headers":{},"data":""}` + "\r\n",
	}
	for _, l := range odd {
		checkRecordAgrees(t, []byte(l))
		checkRecordAgrees(t, []byte(l+"\n"))
		checkDecodeListed(t, []byte(l))
	}
}

// FuzzParseRecord: the parsers agree on any line.
//
//	go test ./cmd/replay -run '^$' -fuzz '^FuzzParseRecord$' -fuzztime 30s
func FuzzParseRecord(f *testing.F) {
	for _, l := range recordSeeds(f) {
		f.Add(l)
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		checkRecordAgrees(t, line)
		checkDecodeListed(t, line)
	})
}

func BenchmarkDecodeRecord(b *testing.B) {
	var lines [][]byte
	for _, l := range recordSeeds(b) {
		if strings.Contains(string(l), `"toolbatch.events.`) {
			lines = append(lines, l)
		}
	}
	// As a reader does: one buffer for the bodies, used again, and the
	// headers as a list.
	arena := make([]byte, 0, 1<<20)
	var hb headerBuf
	for _, c := range []struct {
		name  string
		parse func([]byte) error
	}{
		{"fast", func(l []byte) error {
			arena = arena[:0]
			hb.reset()
			_, _, err := decodeRecord(l, &arena, &hb)
			return err
		}},
		{"json", func(l []byte) error { _, err := decodeRecordJSON(l); return err }},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				for _, l := range lines {
					if err := c.parse(l); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
