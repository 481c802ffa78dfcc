package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/catalog"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/proof"
	"github.com/toolbatch/toolbatch/protocol"
	"github.com/toolbatch/toolbatch/replay"
)

// connectTimeout bounds connecting to NATS.
const connectTimeout = 5 * time.Second

// openSource opens the source the options name, and returns the function
// that closes it. From files, the out stream is read from outFile, or else
// from the events file's .out.jsonl sibling when there is one.
func openSource(o *options, outFile string) (replay.Source, func(), error) {
	if o.set["file"] {
		out := outFile
		if out == "" {
			if sib := replay.OutSibling(o.file); fileExists(sib) {
				out = sib
			}
		}
		return replay.NewFileSource(o.file, out, o.prefix), func() {}, nil
	}
	nc, js, err := connect(o)
	if err != nil {
		return nil, nil, err
	}
	return replay.NewNATSSource(js, o.prefix), nc.Close, nil
}

// connect connects to the options' NATS server.
func connect(o *options) (*nats.Conn, jetstream.JetStream, error) {
	connOpts, err := o.conn.Options()
	if err != nil {
		return nil, nil, usageErrorf("%v", err)
	}
	nc, err := nats.Connect(o.natsURL, append(connOpts, nats.Name("toolbatch-replay"), nats.Timeout(connectTimeout))...)
	if err != nil {
		return nil, nil, usageErrorf("connect to %s: %v", o.natsURL, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, usageErrorf("jetstream: %v", err)
	}
	return nc, js, nil
}

func fileExists(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular()
}

// cmdHistory prints the history of every call of the selected runs.
func cmdHistory(ctx context.Context, o *options, stdout, stderr io.Writer) error {
	src, closeSrc, err := openSource(o, "")
	if err != nil {
		return err
	}
	defer closeSrc()
	h := replay.NewHistory(o.prefix, o.sel.StartsLate())
	prog := newProgress(stderr)
	releaseGC := replay.HoldGC() // the history keeps what it reads
	err = src.Read(ctx, replay.EventsStream, o.sel, true, func(m *replay.Message) error {
		prog.add(m)
		h.Add(m)
		return nil
	})
	releaseGC()
	if err != nil {
		return err
	}
	prog.done()
	h.Finish()
	if o.json {
		return h.WriteJSON(stdout)
	}
	return h.WriteText(stdout)
}

// cmdWhatIf re-gates every recorded gate decision with another catalog.
func cmdWhatIf(ctx context.Context, o *options, stdout, stderr io.Writer) error {
	cat, err := catalog.Load(o.catalog)
	if err != nil {
		return usageErrorf("%v", err)
	}
	if cat.UsesState() {
		fmt.Fprintf(stderr, "replay: what-if: rules of %s read state; they are evaluated with an empty state\n", o.catalog)
	}
	src, closeSrc, err := openSource(o, "")
	if err != nil {
		return err
	}
	defer closeSrc()
	w := replay.NewWhatIf(catalogPolicy{cat}, o.prefix)
	prog := newProgress(stderr)
	err = src.Read(ctx, replay.EventsStream, o.sel, true, func(m *replay.Message) error {
		prog.add(m)
		w.Add(m)
		return nil
	})
	if err != nil {
		return err
	}
	prog.done()
	if o.json {
		return w.WriteJSON(stdout, o.changed)
	}
	return w.WriteText(stdout, o.changed)
}

// catalogPolicy is a catalog's gate rules as what-if's policy.
type catalogPolicy struct{ cat *catalog.Catalog }

var _ replay.Policy = catalogPolicy{}

// Evaluate is the catalog's policy stage, with an empty state.
func (p catalogPolicy) Evaluate(toolID string, args events.RawJSON, at time.Time) replay.PolicyDecision {
	d := p.cat.Evaluate(toolID, args, nil, at)
	return replay.PolicyDecision{Matched: d.Matched, Rule: d.Rule, Outcome: d.Outcome, Reason: d.Reason}
}

// HasExternal reports whether the catalog names an external gate service.
func (p catalogPolicy) HasExternal() bool {
	_, ok := p.cat.External()
	return ok
}

// cmdCheckpoint prints the latest checkpoint of the events stream, after
// asking the engines for one with --now.
func cmdCheckpoint(ctx context.Context, o *options, stdout io.Writer) error {
	if o.set["file"] {
		return usageErrorf("checkpoint reads NATS: the engines publish checkpoints there (--nats-url)")
	}
	nc, js, err := connect(o)
	if err != nil {
		return err
	}
	defer nc.Close()
	names := protocol.Names{Prefix: o.prefix}
	var cp proof.Checkpoint
	if o.now {
		reply, err := nc.RequestWithContext(ctx, names.CheckpointRequest(), nil)
		if err != nil {
			return fmt.Errorf("ask for a checkpoint on %s: %w (is an engine running, with signing on?)", names.CheckpointRequest(), err)
		}
		if cp, err = proof.DecodeCheckpoint(reply.Data); err != nil {
			return fmt.Errorf("the engine answered %q: %w", reply.Data, err)
		}
	} else {
		var found bool
		if cp, found, err = replay.NewNATSSource(js, o.prefix).LatestCheckpoint(ctx); err != nil {
			return err
		}
		if !found {
			return fmt.Errorf("no checkpoint on %s yet (replay checkpoint --now asks for one)", names.Checkpoint())
		}
	}
	_, err = fmt.Fprintf(stdout, "%s\n", cp.Encode())
	return err
}
