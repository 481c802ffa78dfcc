package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/audit"
)

// Headers of the engine's messages (engine/store.go, engine/projector.go).
const (
	headerEvent  = "Toolbatch-Event"
	headerPrev   = "Toolbatch-Prev"
	headerSource = "Toolbatch-Source"
)

// Reading limits.
const (
	// stallTimeout is how long a NATS read waits for the next message it
	// knows is there before it gives up.
	stallTimeout = 15 * time.Second
	// connectTimeout bounds connecting to NATS.
	connectTimeout = 5 * time.Second
	// fetchBatch is how many messages an ordered consumer asks for at once.
	fetchBatch = 1000
)

// wireRecord is one line of an export file: one message of a stream.
type wireRecord struct {
	Seq     uint64              `json:"seq"`
	Subject string              `json:"subject"`
	Time    time.Time           `json:"time"`
	Headers map[string][]string `json:"headers"`
	Data    []byte              `json:"data"` // base64 of the message body (msgpack)
}

// stream names one of the two streams replay reads.
type stream int

const (
	eventsStream stream = iota
	outStream
)

// source is where the streams are read from: NATS or export files. Both
// deliver records in stream order, filtered by the selection, and stop
// early when fn returns an error.
type source interface {
	read(ctx context.Context, which stream, sel selection, fn func(audit.Record) error) error
	close()
}

// openSource opens the source the options name. From files, the out
// stream is read from outFile, or else from the events file's .out.jsonl
// sibling when there is one.
func openSource(o *options, outFile string) (source, error) {
	if o.set["file"] {
		out := outFile
		if out == "" {
			if sib := outSibling(o.file); fileExists(sib) {
				out = sib
			}
		}
		return &fileSource{events: o.file, out: out, prefix: o.prefix}, nil
	}
	nc, err := nats.Connect(o.natsURL, nats.Name("toolbatch-replay"), nats.Timeout(connectTimeout))
	if err != nil {
		return nil, usageErrorf("connect to %s: %v", o.natsURL, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, usageErrorf("jetstream: %v", err)
	}
	return &natsSource{nc: nc, js: js, prefix: o.prefix}, nil
}

func fileExists(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular()
}

// subjectFilter is the subject (or wildcard) a stream is read on.
func subjectFilter(prefix string, which stream, run string) string {
	switch {
	case which == eventsStream && run != "":
		return prefix + ".events." + run
	case which == eventsStream:
		return prefix + ".events.>"
	case run != "":
		return prefix + ".out." + run + ".>"
	default:
		return prefix + ".out.>"
	}
}

// streamName is the JetStream stream of a prefix, as engine.Names derives
// it: the prefix upper-cased, other characters as _, then _EVENTS or _OUT.
func streamName(prefix string, which stream) string {
	up := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z':
			return r - 'a' + 'A'
		case r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			return r
		default:
			return '_'
		}
	}, prefix)
	if which == eventsStream {
		return up + "_EVENTS"
	}
	return up + "_OUT"
}

// keep applies the selection to one record: keep it, skip it, or stop
// (the first message stored after --until ends the read).
func (s selection) keep(which stream, r audit.Record) (keep, stop bool) {
	if !s.until.IsZero() && r.Time.After(s.until) {
		return false, true
	}
	if !s.since.IsZero() && r.Time.Before(s.since) {
		return false, false
	}
	if which == eventsStream && r.Seq < s.fromSeq {
		return false, false
	}
	return true, false
}

// subjectMatches reports whether a subject matches a filter made by
// subjectFilter (a full subject, or one ending in ".>").
func subjectMatches(filter, subject string) bool {
	if base, ok := strings.CutSuffix(filter, ">"); ok {
		return strings.HasPrefix(subject, base) && len(subject) > len(base)
	}
	return subject == filter
}

// fileSource reads export files.
type fileSource struct {
	events, out string // out is empty when there is no out stream file
	prefix      string
}

func (f *fileSource) close() {}

func (f *fileSource) read(ctx context.Context, which stream, sel selection, fn func(audit.Record) error) error {
	path := f.events
	if which == outStream {
		if f.out == "" {
			return nil
		}
		path = f.out
	}
	file, err := os.Open(path)
	if err != nil {
		return usageErrorf("%v", err)
	}
	defer file.Close()
	filter := subjectFilter(f.prefix, which, sel.run)
	return readRecords(ctx, path, file, func(r audit.Record) error {
		if !subjectMatches(filter, r.Subject) {
			return nil
		}
		keep, stop := sel.keep(which, r)
		if stop {
			return errStop
		}
		if !keep {
			return nil
		}
		return fn(r)
	})
}

// errStop ends a read early without an error.
var errStop = errors.New("stop")

// readRecords decodes JSON Lines records from r, in order. Blank lines are
// skipped; a line that is not a record is a read error naming the line.
func readRecords(ctx context.Context, name string, r io.Reader, fn func(audit.Record) error) error {
	br := bufio.NewReaderSize(r, 1<<20)
	for line := 1; ; line++ {
		b, err := br.ReadBytes('\n')
		if len(bytes.TrimSpace(b)) > 0 {
			rec, derr := decodeRecord(b)
			if derr != nil {
				return usageErrorf("%s:%d: %v", name, line, derr)
			}
			if ferr := fn(rec); ferr != nil {
				if errors.Is(ferr, errStop) {
					return nil
				}
				return ferr
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return usageErrorf("read %s: %v", name, err)
		}
		if line%4096 == 0 && ctx.Err() != nil {
			return usageErrorf("interrupted")
		}
	}
}

// decodeRecord decodes one export line.
func decodeRecord(line []byte) (audit.Record, error) {
	var w wireRecord
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&w); err != nil {
		return audit.Record{}, fmt.Errorf("not an export record: %v", err)
	}
	if dec.More() {
		return audit.Record{}, errors.New("not an export record: more than one value on the line")
	}
	switch {
	case w.Seq == 0:
		return audit.Record{}, errors.New("record without a seq")
	case w.Subject == "":
		return audit.Record{}, errors.New("record without a subject")
	}
	if w.Headers == nil {
		w.Headers = map[string][]string{}
	}
	return audit.Record{Seq: w.Seq, Subject: w.Subject, Time: w.Time, Headers: w.Headers, Data: w.Data}, nil
}

// encodeRecord writes one export line.
func encodeRecord(w io.Writer, r audit.Record) error {
	h := r.Headers
	if h == nil {
		h = map[string][]string{}
	}
	data := r.Data
	if data == nil {
		data = []byte{}
	}
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc.Encode(wireRecord{Seq: r.Seq, Subject: r.Subject, Time: r.Time.UTC(), Headers: h, Data: data})
}

// natsSource reads the streams with ordered consumers.
type natsSource struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	prefix string
}

func (n *natsSource) close() { n.nc.Close() }

// read delivers every message of the stream that matches the selection,
// up to the last one stored when the read began.
func (n *natsSource) read(ctx context.Context, which stream, sel selection, fn func(audit.Record) error) error {
	name := streamName(n.prefix, which)
	st, err := n.js.Stream(ctx, name)
	if err != nil {
		return usageErrorf("stream %s: %v", name, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return usageErrorf("stream %s: %v", name, err)
	}
	if info.State.Msgs == 0 || info.State.LastSeq < sel.fromSeq && which == eventsStream {
		return nil
	}
	upTo := info.State.LastSeq
	cfg := jetstream.OrderedConsumerConfig{
		FilterSubjects:    []string{subjectFilter(n.prefix, which, sel.run)},
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		InactiveThreshold: 30 * time.Second,
	}
	switch {
	case which == eventsStream && sel.fromSeq > 1:
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, sel.fromSeq
	case !sel.since.IsZero():
		since := sel.since
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &since
	}
	cons, err := n.js.OrderedConsumer(ctx, name, cfg)
	if err != nil {
		return usageErrorf("stream %s: consumer: %v", name, err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(fetchBatch))
	if err != nil {
		return usageErrorf("stream %s: consumer: %v", name, err)
	}
	defer it.Stop()
	if ci := cons.CachedInfo(); ci != nil && ci.NumPending == 0 {
		return nil // nothing matches
	}
	var last uint64
	for {
		nctx, cancel := context.WithTimeout(ctx, stallTimeout)
		m, err := it.Next(jetstream.NextContext(nctx))
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return usageErrorf("interrupted")
			}
			return usageErrorf("stream %s: no message after seq %d for %s (%v)", name, last, stallTimeout, err)
		}
		meta, err := m.Metadata()
		if err != nil {
			return usageErrorf("stream %s: %v", name, err)
		}
		seq := meta.Sequence.Stream
		if seq > upTo {
			return nil // stored after the read began
		}
		last = seq
		h := make(map[string][]string, len(m.Headers()))
		for k, v := range m.Headers() {
			h[k] = append([]string(nil), v...)
		}
		r := audit.Record{Seq: seq, Subject: m.Subject(), Time: meta.Timestamp.UTC(), Headers: h, Data: bytes.Clone(m.Data())}
		keep, stop := sel.keep(which, r)
		if stop {
			return nil
		}
		if keep {
			if err := fn(r); err != nil {
				if errors.Is(err, errStop) {
					return nil
				}
				return err
			}
		}
		if seq >= upTo || meta.NumPending == 0 {
			return nil
		}
	}
}
