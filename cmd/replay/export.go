package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/toolbatch/toolbatch/audit"
	"github.com/toolbatch/toolbatch/replay"
)

// cmdExport writes the selected events (and, with --out-file, the out
// stream) as JSON Lines.
func cmdExport(ctx context.Context, o *options, stdout, stderr io.Writer) error {
	src, closeSrc, err := openSource(o, "")
	if err != nil {
		return err
	}
	defer closeSrc()
	prog := newProgress(stderr)
	var lastEvent uint64
	n, err := exportStream(ctx, src, replay.EventsStream, o.sel, o.out, stdout, func(r audit.Record) bool {
		prog.add(&replay.Message{Record: r})
		lastEvent = r.Seq
		return true
	})
	if err != nil {
		return err
	}
	prog.done()
	report := stdout
	if o.out == "-" {
		report = stderr // stdout holds the export
	}
	fmt.Fprintf(report, "exported %d events stream messages to %s\n", n, o.out)
	if o.outFile == "" {
		return nil
	}
	// Out messages derived from commits stored after the events were read
	// are left out, as their commits are.
	n, err = exportStream(ctx, src, replay.OutStream, o.sel, o.outFile, stdout, func(r audit.Record) bool {
		return !replay.DerivedAfter(r, lastEvent)
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(report, "exported %d out stream messages to %s\n", n, o.outFile)
	return nil
}

// exportStream writes one stream to path ("-": stdout) and returns how many
// messages it wrote; keep sees each message first and may leave it out. A
// failed export removes the file it was writing.
func exportStream(ctx context.Context, src replay.Source, which replay.Stream, sel replay.Selection, path string, stdout io.Writer, keep func(audit.Record) bool) (n int, err error) {
	var w io.Writer = stdout
	if path != "-" {
		f, cerr := os.Create(path)
		if cerr != nil {
			return 0, usageErrorf("%v", cerr)
		}
		defer func() {
			if cerr := f.Close(); cerr != nil && err == nil {
				err = usageErrorf("write %s: %v", path, cerr)
			}
			if err != nil {
				os.Remove(path)
			}
		}()
		w = f
	}
	n, err = replay.Export(ctx, src, which, sel, w, keep)
	var werr *replay.WriteError
	if errors.As(err, &werr) {
		return n, usageErrorf("write %s: %v", path, werr.Err)
	}
	return n, err
}
