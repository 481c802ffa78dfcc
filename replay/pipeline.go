package replay

import (
	"runtime"
	"sync"

	"github.com/toolbatch/toolbatch/audit"
	"github.com/toolbatch/toolbatch/events"
)

// Message is one message of a stream as a read delivers it: its record
// and, when the read was asked to decode, its commit already decoded. A
// Message made from a record alone (Message{Record: r}) decodes its commit
// when Commit is first called.
type Message struct {
	audit.Record
	// hdrs are the headers when Record.Headers is nil (reads that decode
	// the commits do not build the map): see Header.
	hdrs    []header
	decoded bool
	events  []events.Event
	err     error // decoding the commit
}

// Commit returns the message's events, decoding them unless the read did.
func (m *Message) Commit() ([]events.Event, error) {
	if !m.decoded {
		m.events, m.err = events.DecodeCommit(m.Data, m.Header(headerEvent))
		m.decoded = true
	}
	return m.events, m.err
}

// decodeWith decodes the message's commit with dec, which shares the
// strings that repeat between commits (see events.Decoder).
func (m *Message) decodeWith(dec *events.Decoder) {
	m.events, m.err = dec.DecodeCommit(m.Data, m.Header(headerEvent))
	m.decoded = true
}

// decoders are the commit decoders of a read's workers: one per batch of
// messages at a time, and as many as run at once.
var decoders = sync.Pool{New: func() any { return new(events.Decoder) }}

// Header returns the values of a header.
func (m *Message) Header(name string) []string {
	if m.Headers != nil {
		return m.Headers[name]
	}
	for _, h := range m.hdrs {
		if h.name == name {
			return h.vals
		}
	}
	return nil
}

// WithHeaders returns the record with its headers as a map, which the
// read may have left out (see hdrs); the map is the record's own.
func (m *Message) WithHeaders() audit.Record {
	r := m.Record
	if r.Headers == nil {
		r.Headers = make(map[string][]string, len(m.hdrs))
		for _, h := range m.hdrs {
			r.Headers[h.name] = append([]string{}, h.vals...)
		}
	}
	return r
}

// inOrder is the read pipeline: produce makes batches in stream order, work
// runs on them on every core, and consume gets them in the order they were
// made, each after its work is done. It stops at the first error of
// consume (or when emit reports false to produce after that) and returns
// consume's error, else produce's, once every goroutine it started has
// ended.
func inOrder[T any](produce func(emit func(T) bool) error, work func(T), consume func(T) error) error {
	type item struct {
		v    T
		done chan struct{}
	}
	workers := runtime.GOMAXPROCS(0)
	todo := make(chan *item, workers)
	order := make(chan *item, 4*workers)
	quit := make(chan struct{})
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for it := range todo {
				work(it.v)
				close(it.done)
			}
		})
	}
	var perr error
	wg.Go(func() {
		defer close(order)
		defer close(todo)
		perr = produce(func(v T) bool {
			it := &item{v: v, done: make(chan struct{})}
			select {
			case order <- it:
			case <-quit:
				return false
			}
			select {
			case todo <- it:
				return true
			case <-quit:
				return false
			}
		})
	})
	var cerr error
	for it := range order {
		<-it.done
		if cerr = consume(it.v); cerr != nil {
			break
		}
	}
	close(quit)
	wg.Wait()
	if cerr != nil {
		return cerr
	}
	return perr
}
