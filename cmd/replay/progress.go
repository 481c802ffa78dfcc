package main

import (
	"fmt"
	"io"
	"time"

	"github.com/toolbatch/toolbatch/protocol"
	"github.com/toolbatch/toolbatch/replay"
)

// progressEvery is how many messages pass between two progress lines.
const progressEvery = 100_000

// progress counts what was read and writes a line on stderr every
// progressEvery messages and at the end:
//
//	replay: 1200000 events, 5310 runs, 184211 events/s
//
// Events are counted from the Toolbatch-Event header (one value per event
// of a commit), runs from the distinct events subjects.
type progress struct {
	w      io.Writer
	start  time.Time
	now    func() time.Time
	msgs   int
	events int
	runs   map[string]struct{}
}

func newProgress(w io.Writer) *progress {
	return &progress{w: w, start: time.Now(), now: time.Now, runs: map[string]struct{}{}}
}

// add counts one message of the events stream.
func (p *progress) add(m *replay.Message) {
	r := m.Record
	p.msgs++
	p.events += len(m.Header(protocol.HeaderEvent))
	if _, ok := p.runs[r.Subject]; !ok {
		p.runs[r.Subject] = struct{}{}
	}
	if p.msgs%progressEvery == 0 {
		p.line()
	}
}

// done writes the last line.
func (p *progress) done() { p.line() }

func (p *progress) line() {
	secs := p.now().Sub(p.start).Seconds()
	rate := 0.0
	if secs > 0 {
		rate = float64(p.events) / secs
	}
	fmt.Fprintf(p.w, "replay: %d events, %d runs, %.0f events/s\n", p.events, len(p.runs), rate)
}
