package replay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/toolbatch/toolbatch/audit"
	"github.com/toolbatch/toolbatch/events"
)

// bigExport returns an export of n commits of one event each, over many
// chunks of the read pipeline, with blank lines between some records.
func bigExport(t *testing.T, n int) []byte {
	t.Helper()
	var b bytes.Buffer
	at := time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)
	for i := 1; i <= n; i++ {
		ev := &events.RunEnded{Cause: events.EndCancelled, Reason: fmt.Sprint("r", i), At: at}
		body, types, err := events.EncodeCommit([]events.Event{ev})
		if err != nil {
			t.Fatal(err)
		}
		r := audit.Record{Seq: uint64(i), Subject: fmt.Sprintf("toolbatch.events.run%d", i%7), Time: at.Add(time.Duration(i) * time.Second),
			Headers: map[string][]string{headerEvent: types, headerPrev: {"0"}}, Data: body}
		if err := WriteRecord(&b, r); err != nil {
			t.Fatal(err)
		}
		if i%1000 == 0 {
			b.WriteString("\n  \n")
		}
	}
	return b.Bytes()
}

// lineOf returns the line number of the record with seq.
func lineOf(file []byte, seq int) int {
	prefix := fmt.Sprintf(`{"seq":%d,`, seq)
	for i, l := range strings.Split(string(file), "\n") {
		if strings.HasPrefix(l, prefix) {
			return i + 1
		}
	}
	return -1
}

// TestReadRecordsInOrder: records decoded on every core reach fn in file
// order, each once, with their commits when asked; fn's error and a stop
// end the read where they happen; a line that is not a record is reported
// after every record before it, with its line number.
func TestReadRecordsInOrder(t *testing.T) {
	const n = 5000
	file := bigExport(t, n)
	all := func(audit.Record) (bool, bool) { return true, false }
	for _, decode := range []bool{false, true} {
		var seqs []uint64
		err := readRecords(context.Background(), "f", bytes.NewReader(file), all, decode, func(m *Message) error {
			seqs = append(seqs, m.Seq)
			if m.decoded != decode {
				t.Fatalf("seq %d decoded %v, want %v", m.Seq, m.decoded, decode)
			}
			evs, err := m.Commit()
			if err != nil || len(evs) != 1 || evs[0].(*events.RunEnded).Reason != fmt.Sprint("r", m.Seq) {
				t.Fatalf("seq %d: %v %v", m.Seq, evs, err)
			}
			if got := m.Header(headerEvent); len(got) != 1 || got[0] != "RunEnded" {
				t.Fatalf("seq %d: %s %q", m.Seq, headerEvent, got)
			}
			return nil
		})
		if err != nil || len(seqs) != n {
			t.Fatalf("decode %v: %d records, %v", decode, len(seqs), err)
		}
		for i, s := range seqs {
			if s != uint64(i+1) {
				t.Fatalf("decode %v: record %d has seq %d", decode, i, s)
			}
		}
	}

	// fn's error ends the read at once.
	boom := errors.New("boom")
	count := 0
	err := readRecords(context.Background(), "f", bytes.NewReader(file), all, true, func(m *Message) error {
		count++
		if m.Seq == 1234 {
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) || count != 1234 {
		t.Fatalf("fn's error: %v after %d records", err, count)
	}

	// A stop (the first record after --until) ends the read without error;
	// records that are not kept are skipped.
	count = 0
	stopAt := func(r audit.Record) (bool, bool) { return r.Seq%2 == 0, r.Seq == 3001 }
	err = readRecords(context.Background(), "f", bytes.NewReader(file), stopAt, true, func(m *Message) error {
		count++
		if m.Seq%2 != 0 {
			t.Fatalf("seq %d was not kept", m.Seq)
		}
		return nil
	})
	if err != nil || count != 1500 {
		t.Fatalf("stop: %v after %d records", err, count)
	}

	// A bad line: every record before it is read, then the error names it.
	bad := bytes.Replace(file, []byte(`{"seq":4321,`), []byte(`{"seq":4321,"nope":1,`), 1)
	count = 0
	err = readRecords(context.Background(), "f", bytes.NewReader(bad), all, true, func(*Message) error {
		count++
		return nil
	})
	want := fmt.Sprintf("f:%d: ", lineOf(bad, 4321))
	if err == nil || !strings.HasPrefix(err.Error(), want) || count != 4320 {
		t.Fatalf("bad line: %v after %d records, want an error starting with %q after 4320", err, count, want)
	}
}
