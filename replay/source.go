package replay

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/audit"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/proof"
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
	// fetchBatch is how many messages an ordered consumer asks for at once.
	fetchBatch = 1000
)

// ErrInterrupted means a read ended because its context did.
var ErrInterrupted = errors.New("interrupted")

// Stream names one of the two streams replay reads.
type Stream int

// The streams replay reads.
const (
	EventsStream Stream = iota // <P>_EVENTS, the event log
	OutStream                  // <P>_OUT, the projections
)

// Selection is what the filters keep. Its zero value keeps everything.
type Selection struct {
	Run          string    // one run only ("": every run)
	Since, Until time.Time // store times; zero: no bound
	FromSeq      uint64    // events stream sequence to start at; 0: the first message
}

// StartsLate reports whether the selection may begin after a run's first
// commit, so that a run whose first commit is missing is not a gap.
func (s Selection) StartsLate() bool { return !s.Since.IsZero() || s.FromSeq > 1 }

// Source is where the streams are read from: a *FileSource or a
// *NATSSource. Read delivers the messages of one stream in stream order,
// filtered by the selection, and stops early when fn returns an error (that
// error is Read's).
//
// With decode, the commits of the events stream are decoded on every core
// while fn gets the messages, in order, on the caller's goroutine; fn must
// then not keep a message's Data after it returns.
type Source interface {
	Read(ctx context.Context, which Stream, sel Selection, decode bool, fn func(*Message) error) error
}

var (
	_ Source = (*FileSource)(nil)
	_ Source = (*NATSSource)(nil)
)

// OutSibling names the out stream's export file beside an events export:
// events.jsonl -> events.out.jsonl, anything else gets .out appended.
func OutSibling(path string) string {
	if base, ok := strings.CutSuffix(path, ".jsonl"); ok {
		return base + ".out.jsonl"
	}
	return path + ".out"
}

// DerivedAfter reports whether an out message names, in its
// Toolbatch-Source header, a commit after lastEvent, the last events
// message read: on a live system the projector may have published it
// between the reads of the two streams. A reader leaves such a message out,
// as its commit is.
func DerivedAfter(r audit.Record, lastEvent uint64) bool {
	src := ""
	if vs := r.Headers[headerSource]; len(vs) > 0 {
		src = vs[0]
	}
	seqText, _, _ := strings.Cut(src, "/")
	seq, err := strconv.ParseUint(seqText, 10, 64)
	return err == nil && seq > lastEvent
}

// subjectFilter is the subject (or wildcard) a stream is read on.
func subjectFilter(prefix string, which Stream, run string) string {
	n := protocol.Names{Prefix: prefix}
	switch {
	case which == EventsStream && run != "":
		return n.Events(run)
	case which == EventsStream:
		return n.Events(">")
	case run != "":
		return n.RunOut(run)
	default:
		return n.Subject(protocol.OutFamily, ">")
	}
}

// streamName is the JetStream stream of a prefix: its events or out stream.
func streamName(prefix string, which Stream) string {
	if which == EventsStream {
		return protocol.Names{Prefix: prefix}.EventsStream()
	}
	return protocol.Names{Prefix: prefix}.OutStream()
}

// keep applies the selection to one record: keep it, skip it, or stop
// (the first message stored after Until ends the read).
func (s Selection) keep(which Stream, r audit.Record) (keep, stop bool) {
	if !s.Until.IsZero() && r.Time.After(s.Until) {
		return false, true
	}
	if !s.Since.IsZero() && r.Time.Before(s.Since) {
		return false, false
	}
	if which == EventsStream && r.Seq < s.FromSeq {
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

// FileSource reads export files: one of the events stream and, maybe, one
// of the out stream.
type FileSource struct {
	events, out string // out is empty when there is no out stream file
	prefix      string
}

// NewFileSource returns a source that reads the events stream from the
// export file events and the out stream from the export file out ("": the
// out stream is empty), for a subject prefix.
func NewFileSource(events, out, prefix string) *FileSource {
	return &FileSource{events: events, out: out, prefix: prefix}
}

// HasOut reports whether the source has an out stream file.
func (f *FileSource) HasOut() bool { return f.out != "" }

// Read delivers the messages of a stream's file (see Source). A line that
// is not a record is an error naming the file and the line.
func (f *FileSource) Read(ctx context.Context, which Stream, sel Selection, decode bool, fn func(*Message) error) error {
	path := f.events
	if which == OutStream {
		if f.out == "" {
			return nil
		}
		path = f.out
	}
	file, err := os.Open(path)
	if err != nil {
		return err
	}
	defer file.Close()
	filter := subjectFilter(f.prefix, which, sel.Run)
	accept := func(r audit.Record) (keep, stop bool) {
		if !subjectMatches(filter, r.Subject) {
			return false, false
		}
		return sel.keep(which, r)
	}
	return readRecords(ctx, path, file, accept, decode && which == EventsStream, fn)
}

// errStop ends a read early without an error.
var errStop = errors.New("stop")

// lineChunk is a run of export lines read together, and what they hold.
type lineChunk struct {
	buf   []byte // the lines, one after another
	ends  []int  // where each line ends in buf
	lines []int  // each line's number in the file
	msgs  []Message
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
	decode bool, fn func(*Message) error) error {
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
				return fmt.Errorf("read %s: %w", name, err)
			}
			if err == io.EOF || len(c.ends) >= chunkLines || len(c.buf) >= chunkBytes {
				if len(c.ends) > 0 {
					if ctx.Err() != nil {
						return ErrInterrupted
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
				c.err = fmt.Errorf("%s:%d: %w", name, c.lines[i], err)
				return
			}
			keep, stop := accept(rec)
			if stop {
				c.stop = len(c.msgs)
				return
			}
			m := Message{Record: rec, hdrs: hdrs}
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

// NATSSource reads the streams from JetStream with ordered consumers
// (protocol.ReadOrdered), waiting stallTimeout for a message the stream
// says is there.
type NATSSource struct {
	js     jetstream.JetStream
	prefix string
}

// NewNATSSource returns a source that reads the streams of a subject
// prefix through js; the caller owns (and closes) its connection.
func NewNATSSource(js jetstream.JetStream, prefix string) *NATSSource {
	return &NATSSource{js: js, prefix: prefix}
}

// Read delivers every message of the stream that matches the selection,
// up to the last one stored when the read began (see Source).
func (n *NATSSource) Read(ctx context.Context, which Stream, sel Selection, decode bool, fn func(*Message) error) error {
	name := streamName(n.prefix, which)
	opt := protocol.ReadOptions{Subjects: []string{subjectFilter(n.prefix, which, sel.Run)},
		Since: sel.Since, Stall: stallTimeout, Pull: fetchBatch, Inactive: 30 * time.Second}
	if which == EventsStream {
		opt.FromSeq = sel.FromSeq
	}
	decode = decode && which == EventsStream
	// The reading loop hands on batches of messages; their commits are
	// decoded on every core; fn gets them in order.
	const batch = 256
	produce := func(emit func([]Message) bool) error {
		msgs := make([]Message, 0, batch)
		flush := func() bool {
			if len(msgs) == 0 {
				return true
			}
			ok := emit(msgs)
			msgs = make([]Message, 0, batch)
			return ok
		}
		err := protocol.ReadOrdered(ctx, n.js, name, opt, func(m jetstream.Msg, meta *jetstream.MsgMetadata) error {
			// The client gives every message its own body and header map.
			h := map[string][]string(m.Headers())
			if h == nil {
				h = map[string][]string{}
			}
			r := audit.Record{Seq: meta.Sequence.Stream, Subject: m.Subject(), Time: meta.Timestamp.UTC(), Headers: h, Data: m.Data()}
			keep, stop := sel.keep(which, r)
			if stop {
				return protocol.ErrStopRead
			}
			if keep {
				msgs = append(msgs, Message{Record: r})
				if len(msgs) == batch && !flush() {
					return protocol.ErrStopRead
				}
			}
			return nil
		})
		flush()
		if err != nil && ctx.Err() != nil {
			return ErrInterrupted
		}
		return err
	}
	work := func(msgs []Message) {
		if decode {
			dec := decoders.Get().(*events.Decoder)
			for i := range msgs {
				msgs[i].decodeWith(dec)
			}
			decoders.Put(dec)
		}
	}
	consume := func(msgs []Message) error {
		for i := range msgs {
			if err := fn(&msgs[i]); err != nil {
				return err
			}
		}
		return nil
	}
	err := inOrder(produce, work, consume)
	if errors.Is(err, errStop) {
		return nil
	}
	return err
}

// LatestCheckpoint reads the last checkpoint the engines published
// (found is false when there is none, or no checkpoints stream).
func (s *NATSSource) LatestCheckpoint(ctx context.Context) (cp proof.Checkpoint, found bool, err error) {
	names := protocol.Names{Prefix: s.prefix}
	st, err := s.js.Stream(ctx, names.CheckpointsStream())
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return cp, false, nil
	}
	if err != nil {
		return cp, false, fmt.Errorf("checkpoints stream: %w", err)
	}
	m, err := st.GetLastMsgForSubject(ctx, names.Checkpoint())
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return cp, false, nil
	}
	if err != nil {
		return cp, false, fmt.Errorf("last checkpoint: %w", err)
	}
	if cp, err = proof.DecodeCheckpoint(m.Data); err != nil {
		return cp, false, fmt.Errorf("last checkpoint (seq %d of %s): %w", m.Sequence, names.CheckpointsStream(), err)
	}
	return cp, true, nil
}
