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
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/protocol"
)

// Headers of the engine's messages.
const (
	headerEvent  = protocol.HeaderEvent
	headerPrev   = protocol.HeaderPrev
	headerSource = protocol.HeaderSource
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
//
// With decode, the commits of the events stream are decoded on every core
// while fn gets the messages, in order, on the caller's goroutine; fn must
// then not keep a record's Data after it returns.
type source interface {
	read(ctx context.Context, which stream, sel selection, decode bool, fn func(*message) error) error
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
	n := protocol.Names{Prefix: prefix}
	switch {
	case which == eventsStream && run != "":
		return n.Events(run)
	case which == eventsStream:
		return n.Events(">")
	case run != "":
		return n.RunOut(run)
	default:
		return n.Subject(protocol.Out, ">")
	}
}

// streamName is the JetStream stream of a prefix: its events or out stream.
func streamName(prefix string, which stream) string {
	if which == eventsStream {
		return protocol.Names{Prefix: prefix}.EventsStream()
	}
	return protocol.Names{Prefix: prefix}.OutStream()
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

func (f *fileSource) read(ctx context.Context, which stream, sel selection, decode bool, fn func(*message) error) error {
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
	accept := func(r audit.Record) (keep, stop bool) {
		if !subjectMatches(filter, r.Subject) {
			return false, false
		}
		return sel.keep(which, r)
	}
	return readRecords(ctx, path, file, accept, decode && which == eventsStream, fn)
}

// errStop ends a read early without an error.
var errStop = errors.New("stop")

// Errors of records that decode but are not messages.
var (
	errNoSeq     = errors.New("record without a seq")
	errNoSubject = errors.New("record without a subject")
)

// lineChunk is a run of export lines read together, and what they hold.
type lineChunk struct {
	buf   []byte // the lines, one after another
	ends  []int  // where each line ends in buf
	lines []int  // each line's number in the file
	msgs  []message
	keep  []bool
	arena []byte    // the bodies (see work)
	hb    headerBuf // the headers, with decode
	stop  int       // the index of the first message that ends the read, or -1
	err   error     // the first line that is not a record (after msgs)
}

// Chunk sizes: a chunk is handed on when it holds this many lines or bytes.
const (
	chunkLines = 512
	chunkBytes = 512 << 10
)

// freeChunks keeps chunks (and their buffers) for the next ones: a read
// has at most a few dozen in flight.
var freeChunks = make(chan *lineChunk, 64)

// readRecords decodes JSON Lines records from r, in order; accept says which
// to keep and where to stop (the first record it says stop for ends the
// read). Lines are decoded on every core (with their commits when decode
// is set); fn gets them in order. With decode, a record's Data is valid
// only until fn returns. Blank lines are skipped; a line that is not a
// record is a read error naming the line.
func readRecords(ctx context.Context, name string, r io.Reader, accept func(audit.Record) (keep, stop bool),
	decode bool, fn func(*message) error) error {
	br := bufio.NewReaderSize(r, 1<<20)
	produce := func(emit func(*lineChunk) bool) error {
		c := newChunk()
		for line := 1; ; line++ {
			start := len(c.buf)
			var err error
			for {
				var b []byte
				b, err = br.ReadSlice('\n')
				c.buf = append(c.buf, b...)
				if err != bufio.ErrBufferFull {
					break
				}
			}
			if len(bytes.TrimSpace(c.buf[start:])) > 0 {
				c.ends, c.lines = append(c.ends, len(c.buf)), append(c.lines, line)
			} else {
				c.buf = c.buf[:start]
			}
			if err != nil && err != io.EOF {
				return usageErrorf("read %s: %v", name, err)
			}
			if err == io.EOF || len(c.ends) >= chunkLines || len(c.buf) >= chunkBytes {
				if len(c.ends) > 0 {
					if ctx.Err() != nil {
						return usageErrorf("interrupted")
					}
					if !emit(c) {
						return nil
					}
					c = newChunk()
				}
				if err == io.EOF {
					return nil
				}
			}
		}
	}
	work := func(c *lineChunk) {
		// The bodies go to one buffer per chunk (base64 takes 4 bytes for
		// 3). With decode, fn sees only decoded commits, and the buffer is
		// used again for the next chunk; else it is the records' own.
		arena := c.arena[:0]
		if need := len(c.buf)/4*3 + 4; !decode || cap(arena) < need {
			arena = make([]byte, 0, need)
		}
		var dec *events.Decoder
		if decode {
			dec = decoders.Get().(*events.Decoder)
			defer func() {
				c.arena = arena[:0]
				decoders.Put(dec)
			}()
		}
		start := 0
		for i, end := range c.ends {
			var hb *headerBuf
			if decode {
				hb = &c.hb
			}
			rec, hdrs, err := decodeRecord(c.buf[start:end], &arena, hb)
			start = end
			if err != nil {
				c.err = usageErrorf("%s:%d: %v", name, c.lines[i], err)
				return
			}
			keep, stop := accept(rec)
			if stop {
				c.stop = len(c.msgs)
				return
			}
			m := message{Record: rec, hdrs: hdrs}
			if keep && decode {
				m.decodeWith(dec)
			}
			c.msgs, c.keep = append(c.msgs, m), append(c.keep, keep)
		}
	}
	consume := func(c *lineChunk) error {
		defer recycle(c)
		for i := range c.msgs {
			if !c.keep[i] {
				continue
			}
			if err := fn(&c.msgs[i]); err != nil {
				return err
			}
		}
		if c.stop >= 0 {
			return errStop
		}
		return c.err
	}
	err := inOrder(produce, work, consume)
	if errors.Is(err, errStop) {
		return nil
	}
	return err
}

func newChunk() *lineChunk {
	var c *lineChunk
	select {
	case c = <-freeChunks:
	default:
		c = new(lineChunk)
	}
	c.stop = -1
	return c
}

// recycle returns a chunk to the pool once its messages were handed on:
// what fn kept of them (records, events) is not in the chunk's buffers.
func recycle(c *lineChunk) {
	clear(c.msgs)
	c.buf, c.ends, c.lines, c.msgs, c.keep = c.buf[:0], c.ends[:0], c.lines[:0], c.msgs[:0], c.keep[:0]
	c.hb.reset()
	c.err = nil
	select {
	case freeChunks <- c:
	default:
	}
}

// decodeRecord decodes one export line, with parseRecordFast when the
// line is in encodeRecord's own form, else with encoding/json; the body is
// decoded into arena.
//
// With hb, a line in encodeRecord's form has its headers returned as a
// list cut from hb, and the record has no Headers map.
func decodeRecord(line []byte, arena *[]byte, hb *headerBuf) (audit.Record, []header, error) {
	w, hdrs, ok := parseRecordFast(line, arena, hb)
	if !ok {
		var err error
		if w, err = decodeRecordJSON(line); err != nil {
			return audit.Record{}, nil, err
		}
	}
	if hdrs != nil {
		if err := checkRecord(w); err != nil {
			return audit.Record{}, nil, err
		}
		return audit.Record{Seq: w.Seq, Subject: w.Subject, Time: w.Time, Data: w.Data}, hdrs, nil
	}
	r, err := recordOf(w)
	return r, nil, err
}

// decodeRecordJSON decodes one export line with encoding/json.
func decodeRecordJSON(line []byte) (wireRecord, error) {
	var w wireRecord
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&w); err != nil {
		return w, fmt.Errorf("not an export record: %v", err)
	}
	if dec.More() {
		return w, errors.New("not an export record: more than one value on the line")
	}
	return w, nil
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
func (n *natsSource) read(ctx context.Context, which stream, sel selection, decode bool, fn func(*message) error) error {
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
	decode = decode && which == eventsStream
	// The reading loop hands on batches of messages; their commits are
	// decoded on every core; fn gets them in order.
	const batch = 256
	produce := func(emit func([]message) bool) error {
		var last uint64
		msgs := make([]message, 0, batch)
		flush := func() bool {
			if len(msgs) == 0 {
				return true
			}
			ok := emit(msgs)
			msgs = make([]message, 0, batch)
			return ok
		}
		// One timer, armed while waiting for a message, is much cheaper than
		// a context with a deadline per message.
		wctx, stalled := context.WithCancel(ctx)
		defer stalled()
		stall := time.AfterFunc(stallTimeout, stalled)
		stall.Stop()
		for {
			stall.Reset(stallTimeout)
			m, err := it.Next(jetstream.NextContext(wctx))
			stall.Stop()
			if err != nil {
				flush()
				if ctx.Err() != nil {
					return usageErrorf("interrupted")
				}
				return usageErrorf("stream %s: no message after seq %d for %s (%v)", name, last, stallTimeout, err)
			}
			meta, err := m.Metadata()
			if err != nil {
				flush()
				return usageErrorf("stream %s: %v", name, err)
			}
			seq := meta.Sequence.Stream
			if seq > upTo {
				flush()
				return nil // stored after the read began
			}
			last = seq
			// The client gives every message its own body and header map.
			h := map[string][]string(m.Headers())
			if h == nil {
				h = map[string][]string{}
			}
			r := audit.Record{Seq: seq, Subject: m.Subject(), Time: meta.Timestamp.UTC(), Headers: h, Data: m.Data()}
			keep, stop := sel.keep(which, r)
			if stop {
				flush()
				return nil
			}
			if keep {
				msgs = append(msgs, message{Record: r})
				if len(msgs) == batch && !flush() {
					return nil
				}
			}
			if seq >= upTo || meta.NumPending == 0 {
				flush()
				return nil
			}
		}
	}
	work := func(msgs []message) {
		if decode {
			dec := decoders.Get().(*events.Decoder)
			for i := range msgs {
				msgs[i].decodeWith(dec)
			}
			decoders.Put(dec)
		}
	}
	consume := func(msgs []message) error {
		for i := range msgs {
			if err := fn(&msgs[i]); err != nil {
				return err
			}
		}
		return nil
	}
	err = inOrder(produce, work, consume)
	if errors.Is(err, errStop) {
		return nil
	}
	return err
}
