package replay

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/toolbatch/toolbatch/audit"
	"github.com/toolbatch/toolbatch/events"
)

// ExportRecord is one line of an export file: one message of a stream
// (docs/replay.md, section 4). WriteRecord writes it in its canonical form.
type ExportRecord struct {
	Seq     uint64              `json:"seq"`
	Subject string              `json:"subject"`
	Time    time.Time           `json:"time"`
	Headers map[string][]string `json:"headers"`
	Data    []byte              `json:"data"` // base64 of the message body (msgpack)
}

// Errors of records that decode but are not messages.
var (
	errNoSeq     = errors.New("record without a seq")
	errNoSubject = errors.New("record without a subject")
)

// ParseRecord reads one line of an export file (what WriteRecord writes,
// or any JSON object encoding/json reads as an ExportRecord with a seq and
// a subject).
func ParseRecord(line []byte) (audit.Record, error) {
	r, _, err := decodeRecord(line, new([]byte), nil)
	return r, err
}

// decodeRecord decodes one export line, with parseRecordFast when the
// line is in WriteRecord's own form, else with encoding/json; the body is
// decoded into arena.
//
// With hb, a line in WriteRecord's form has its headers returned as a
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
func decodeRecordJSON(line []byte) (ExportRecord, error) {
	var w ExportRecord
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&w); err != nil {
		return w, fmt.Errorf("not an export record: %w", err)
	}
	if dec.More() {
		return w, errors.New("not an export record: more than one value on the line")
	}
	return w, nil
}

// WriteRecord writes one export line.
func WriteRecord(w io.Writer, r audit.Record) error {
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
	return enc.Encode(ExportRecord{Seq: r.Seq, Subject: r.Subject, Time: r.Time.UTC(), Headers: h, Data: data})
}

// header is one header of a message and its values.
type header struct {
	name string
	vals []string
}

// headerBuf holds the headers of many records: they are cut from its
// slices, which a reader uses again once the records were handed on.
type headerBuf struct {
	hdrs []header
	vals []string
}

func (hb *headerBuf) reset() { hb.hdrs, hb.vals = hb.hdrs[:0], hb.vals[:0] }

// parseRecordFast reads an export line in the exact form WriteRecord
// writes it, without encoding/json:
//
//	{"seq":N,"subject":"S","time":"T","headers":{"K":["V",...],...},"data":"B"}
//
// with nothing to unescape in its strings. It reports false for anything
// else (other spacing or key order, escapes, nulls, a duplicate header),
// and decodeRecord then reads the line with encoding/json, which decides:
// so what it accepts, it reads as encoding/json does (record_test.go checks
// it). The body is decoded into arena, which grows as needed.
//
// With hb, the headers are not put in a map but in hb's buffers, and
// returned as a list (the map is most of what a line costs to read).
func parseRecordFast(line []byte, arena *[]byte, hb *headerBuf) (ExportRecord, []header, bool) {
	var w ExportRecord
	var hdrs []header
	p := recordParser{b: line}
	if !p.lit(`{"seq":`) {
		return w, nil, false
	}
	seq, ok := p.uint()
	if !ok || !p.lit(`,"subject":`) {
		return w, nil, false
	}
	subject, ok := p.str()
	if !ok || !p.lit(`,"time":`) {
		return w, nil, false
	}
	start := p.i
	if _, ok := p.str(); !ok {
		return w, nil, false
	}
	// The very method encoding/json calls for a time.Time.
	if err := w.Time.UnmarshalJSON(line[start:p.i]); err != nil {
		return w, nil, false
	}
	if !p.lit(`,"headers":{`) {
		return w, nil, false
	}
	if hb == nil {
		w.Headers = make(map[string][]string, 4)
	}
	firstHdr := 0
	if hb != nil {
		firstHdr = len(hb.hdrs)
	}
	for first := true; !p.lit("}"); first = false {
		if !first && !p.lit(",") {
			return w, nil, false
		}
		name, ok := p.str()
		if !ok || !p.lit(":[") {
			return w, nil, false
		}
		key := headerName(name)
		var vals []string
		firstVal := 0
		if hb == nil {
			if _, dup := w.Headers[key]; dup {
				return w, nil, false
			}
			vals = make([]string, 0, 1)
		} else {
			for _, h := range hb.hdrs[firstHdr:] {
				if h.name == key {
					return w, nil, false
				}
			}
			firstVal = len(hb.vals)
		}
		for firstV := true; !p.lit("]"); firstV = false {
			if !firstV && !p.lit(",") {
				return w, nil, false
			}
			v, ok := p.str()
			if !ok {
				return w, nil, false
			}
			if hb == nil {
				vals = append(vals, headerValue(key, v))
			} else {
				hb.vals = append(hb.vals, headerValue(key, v))
			}
		}
		if hb == nil {
			w.Headers[key] = vals
		} else {
			vals = hb.vals[firstVal:len(hb.vals):len(hb.vals)]
			if len(vals) == 0 {
				vals = []string{} // as encoding/json reads []
			}
			hb.hdrs = append(hb.hdrs, header{name: key, vals: vals})
		}
	}
	if hb != nil {
		hdrs = hb.hdrs[firstHdr:len(hb.hdrs):len(hb.hdrs)]
	}
	// The body: base64 refuses every byte a JSON string would have to
	// escape, or that would need unescaping, except the line breaks it
	// skips, which are looked for here.
	if !p.lit(`,"data":"`) {
		return w, nil, false
	}
	end := bytes.IndexByte(p.b[p.i:], '"')
	if end < 0 {
		return w, nil, false
	}
	data := p.b[p.i : p.i+end]
	p.i += end + 1
	if bytes.IndexByte(data, '\r') >= 0 || bytes.IndexByte(data, '\n') >= 0 || !p.lit("}") {
		return w, nil, false
	}
	for _, c := range line[p.i:] {
		if c != ' ' && c != '\t' && c != '\r' && c != '\n' {
			return w, nil, false
		}
	}
	// As encoding/json decodes a []byte.
	n := base64.StdEncoding.DecodedLen(len(data))
	if cap(*arena)-len(*arena) < n {
		*arena = make([]byte, 0, max(n, 64<<10))
	}
	buf := (*arena)[len(*arena) : len(*arena)+n]
	m, err := base64.StdEncoding.Decode(buf, data)
	if err != nil {
		return w, nil, false
	}
	*arena = (*arena)[:len(*arena)+m]
	w.Seq, w.Subject, w.Data = seq, string(subject), buf[:m:m]
	if w.Data == nil {
		w.Data = []byte{} // encoding/json's empty body is not nil either
	}
	return w, hdrs, true
}

// recordParser is a cursor over one line.
type recordParser struct {
	b []byte
	i int
}

// lit consumes s if the line continues with it.
func (p *recordParser) lit(s string) bool {
	if len(p.b)-p.i < len(s) || string(p.b[p.i:p.i+len(s)]) != s {
		return false
	}
	p.i += len(s)
	return true
}

// uint reads a JSON number that is a decimal integer without sign,
// fraction or exponent, as encoding/json reads one into a uint64.
func (p *recordParser) uint() (uint64, bool) {
	start := p.i
	for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
		p.i++
	}
	digits := p.b[start:p.i]
	if len(digits) == 0 || len(digits) > 1 && digits[0] == '0' {
		return 0, false
	}
	n, err := strconv.ParseUint(string(digits), 10, 64)
	return n, err == nil
}

// str reads a JSON string with nothing to unescape: valid UTF-8 without
// control characters or backslashes. It returns the bytes between the
// quotes.
func (p *recordParser) str() ([]byte, bool) {
	if p.i >= len(p.b) || p.b[p.i] != '"' {
		return nil, false
	}
	start := p.i + 1
	ascii := true
	for j := start; j < len(p.b); j++ {
		c := p.b[j]
		if !strSpecial[c] {
			continue
		}
		switch {
		case c == '"':
			s := p.b[start:j]
			if !ascii && !utf8.Valid(s) {
				return nil, false
			}
			p.i = j + 1
			return s, true
		case c < 0x20 || c == '\\':
			return nil, false
		default: // c >= utf8.RuneSelf
			ascii = false
		}
	}
	return nil, false
}

// strSpecial marks the bytes str looks at: the closing quote, what needs
// unescaping, and the start of a byte sequence to check as UTF-8.
var strSpecial = func() (t [256]bool) {
	for c := range t {
		t[c] = c < 0x20 || c == '"' || c == '\\' || c >= utf8.RuneSelf
	}
	return t
}()

// eventTypeNames are the values of the Toolbatch-Event header, shared by
// every record that has them.
var eventTypeNames = func() []string {
	var names []string
	for _, t := range events.Types() {
		names = append(names, string(t))
	}
	return names
}()

// headerName returns a header's name, shared by every record when it is
// one the engine writes (a switch is cheaper than a map here).
func headerName(b []byte) string {
	switch string(b) {
	case headerEvent:
		return headerEvent
	case headerPrev:
		return headerPrev
	case headerSource:
		return headerSource
	case "Nats-Msg-Id":
		return "Nats-Msg-Id"
	}
	return string(b)
}

func headerValue(name string, b []byte) string {
	if name == headerEvent {
		for _, t := range eventTypeNames {
			if t == string(b) {
				return t
			}
		}
	}
	return string(b)
}

// recordOf is the record an export line holds, after the checks every
// line gets.
func recordOf(w ExportRecord) (audit.Record, error) {
	if err := checkRecord(w); err != nil {
		return audit.Record{}, err
	}
	if w.Headers == nil {
		w.Headers = map[string][]string{}
	}
	return audit.Record{Seq: w.Seq, Subject: w.Subject, Time: w.Time, Headers: w.Headers, Data: w.Data}, nil
}

// checkRecord is the check every line gets: a record has a seq and a
// subject.
func checkRecord(w ExportRecord) error {
	switch {
	case w.Seq == 0:
		return errNoSeq
	case w.Subject == "":
		return errNoSubject
	}
	return nil
}

// Export writes the selected messages of one stream to w as export lines
// (WriteRecord), in stream order, and returns how many it wrote; keep sees
// each message first and may leave it out.
func Export(ctx context.Context, src Source, which Stream, sel Selection, w io.Writer, keep func(audit.Record) bool) (int, error) {
	bw := bufio.NewWriterSize(w, 1<<20)
	n := 0
	err := src.Read(ctx, which, sel, false, func(m *Message) error {
		if !keep(m.Record) {
			return nil
		}
		n++
		if err := WriteRecord(bw, m.Record); err != nil {
			return &WriteError{Err: err}
		}
		return nil
	})
	if err != nil {
		return n, err
	}
	if err := bw.Flush(); err != nil {
		return n, &WriteError{Err: err}
	}
	return n, nil
}

// WriteError is a failure to write an export, as opposed to reading the
// log.
type WriteError struct{ Err error }

func (e *WriteError) Error() string { return e.Err.Error() }
func (e *WriteError) Unwrap() error { return e.Err }
