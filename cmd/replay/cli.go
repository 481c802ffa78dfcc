package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/toolbatch/toolbatch/access"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/internal/cli"
	"github.com/toolbatch/toolbatch/protocol"
	"github.com/toolbatch/toolbatch/replay"
)

// usage is printed for help and after a usage error's one line is not
// enough (never on its own for a bad flag: that is one line).
const usage = `usage:
  replay [--nats-url URL | --file FILE] [filters] [--json] [--prefix P]
      print, per run and batch, the history of every call: gate decisions
      and their rule, attempts, claims and their worker, waits and who
      resolved them, outcomes, indeterminate reasons, refused results and
      the published results
  replay export --out FILE [--nats-url URL | --file FILE] [filters]
                [--out-stream] [--out-file FILE] [--prefix P]
      write the events stream as JSON Lines, one line per message in stream
      order: {"seq","subject","time","headers","data" (base64 msgpack)};
      --out - writes to stdout. --out-file FILE (or --out-stream, which
      defaults it to FILE with .jsonl replaced by .out.jsonl) also writes
      the out stream, in the same format
  replay audit [--nats-url URL | --file FILE [--out-file FILE]] [--run ID] [--keys FILE] [--checkpoint FILE]
               [--json] [--prefix P]
      check every invariant of contract.md §6 and that the out stream holds
      exactly what the events derive; print each violation on its own line.
      With --file, the out stream is --out-file, else FILE's .out.jsonl
      sibling when it exists, else invariant 8 is not checked. --keys FILE
      pins the engines' signing keys (toolbatch auth keys prints them);
      --checkpoint FILE compares the log with kept checkpoints
  replay checkpoint [--nats-url URL] [--now] [--prefix P]
      print the engines' latest signed checkpoint of the events stream
      (one JSON line: keep it outside the cluster, give it to audit
      --checkpoint); --now asks the engines for one first
  replay what-if --catalog FILE [--nats-url URL | --file FILE] [filters]
                 [--changed] [--json] [--prefix P]
      re-evaluate the policy stage of every recorded gate decision with
      another catalog and print old -> new per call; no tool runs

source (one of):
  --nats-url URL   read <PREFIX>_EVENTS (and <PREFIX>_OUT) with an ordered
                   consumer (default nats://127.0.0.1:4222)
  --file FILE      read an export file

filters (history, export, what-if; audit takes --run only):
  --run ID         one run only
  --since T        messages stored at or after T (RFC 3339)
  --until T        messages stored up to T (RFC 3339); reading stops at the
                   first message stored after it
  --from-seq N     messages from events stream sequence N on

  --prefix P       subject prefix, the engine's --prefix (default toolbatch)
  --json           one JSON object per line (docs/replay.md gives the shapes)

A progress line goes to stderr every 100000 messages and at the end.
exit status: 0 done (audit: every invariant holds), 1 audit found a
violation, 2 usage or read error (one line on stderr)
`

// defaultNATSURL is where replay reads when neither --nats-url nor --file
// is given.
const defaultNATSURL = "nats://127.0.0.1:4222"

// defaultPrefix is the engine's default subject prefix.
const defaultPrefix = protocol.DefaultPrefix

// usageErrorf is a usage or read error: exit status 2.
func usageErrorf(format string, args ...any) error {
	return cli.Errorf(2, format, args...)
}

// errViolations makes replay audit exit with status 1; its report is
// already on stdout.
var errViolations = &cli.ExitError{Code: 1}

// options are the flags of every command; each command registers the ones
// it takes.
type options struct {
	natsURL   string
	conn      access.Conn
	file      string
	prefix    string
	run       string
	since     string
	until     string
	fromSeq   uint64
	json      bool
	out       string
	outFile   string
	outStream bool
	catalog   string
	changed   bool
	keys      string
	now       bool
	checkpts  string

	set map[string]bool // flags given on the command line
	sel replay.Selection
}

// run runs one command and returns its exit status.
func run(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cmd := ""
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	var err error
	switch cmd {
	case "":
		err = withOptions("replay", args, stdout, func(o *options) error { return cmdHistory(ctx, o, stdout, stderr) })
	case "export":
		err = withOptions(cmd, args, stdout, func(o *options) error { return cmdExport(ctx, o, stdout, stderr) })
	case "audit":
		err = withOptions(cmd, args, stdout, func(o *options) error { return cmdAudit(ctx, o, stdout, stderr) })
	case "what-if":
		err = withOptions(cmd, args, stdout, func(o *options) error { return cmdWhatIf(ctx, o, stdout, stderr) })
	case "checkpoint":
		err = withOptions(cmd, args, stdout, func(o *options) error { return cmdCheckpoint(ctx, o, stdout) })
	case "help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		err = usageErrorf("unknown command %q (want export, audit, checkpoint, what-if, or flags; replay --help)", cmd)
	}
	code, msg := cli.Status(err, 2, usage, stdout)
	if msg != "" {
		fmt.Fprintln(stderr, "replay: "+msg)
	}
	return code
}

// withOptions parses a command's flags, checks them, and runs fn.
func withOptions(cmd string, args []string, stdout io.Writer, fn func(*options) error) error {
	o := &options{}
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // a bad flag is one line, from run
	fs.StringVar(&o.natsURL, "nats-url", defaultNATSURL, "NATS server")
	o.conn.Flags(fs)
	fs.StringVar(&o.file, "file", "", "export file to read")
	fs.StringVar(&o.prefix, "prefix", defaultPrefix, "subject prefix")
	fs.StringVar(&o.run, "run", "", "one run only")
	if cmd != "export" {
		fs.BoolVar(&o.json, "json", false, "JSON lines")
	}
	if cmd != "audit" {
		fs.StringVar(&o.since, "since", "", "RFC 3339 time")
		fs.StringVar(&o.until, "until", "", "RFC 3339 time")
		fs.Uint64Var(&o.fromSeq, "from-seq", 0, "stream sequence")
	}
	switch cmd {
	case "export":
		fs.StringVar(&o.out, "out", "", "file to write")
		fs.StringVar(&o.outFile, "out-file", "", "file to write the out stream to")
		fs.BoolVar(&o.outStream, "out-stream", false, "also export the out stream")
	case "audit":
		fs.StringVar(&o.outFile, "out-file", "", "export file of the out stream")
		fs.StringVar(&o.keys, "keys", "", "the engines' pinned public signing keys (YAML): verify every commit's signature")
		fs.StringVar(&o.checkpts, "checkpoint", "", "checkpoints kept outside the stream (JSON lines, replay checkpoint): compare the log with each")
	case "checkpoint":
		fs.BoolVar(&o.now, "now", false, "ask the engines for a checkpoint of the stream as it is now")
	case "what-if":
		fs.StringVar(&o.catalog, "catalog", "", "catalog to gate with")
		fs.BoolVar(&o.changed, "changed", false, "only the calls whose decision changes")
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageErrorf("%s", err.Error())
	}
	if fs.NArg() > 0 {
		return usageErrorf("unexpected argument %q", fs.Arg(0))
	}
	o.set = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { o.set[f.Name] = true })
	if err := o.check(cmd); err != nil {
		return err
	}
	return fn(o)
}

// check validates the flags of a command and fills the selection.
func (o *options) check(cmd string) error {
	var problems []string
	if o.set["nats-url"] && o.set["file"] {
		problems = append(problems, "--nats-url and --file exclude each other")
	}
	if o.set["file"] && o.file == "" {
		problems = append(problems, "--file needs a file name")
	}
	if o.prefix == "" || strings.ContainsAny(o.prefix, " *>") {
		problems = append(problems, fmt.Sprintf("--prefix %q is not a subject prefix", o.prefix))
	}
	if o.run != "" && !events.ValidRunID(o.run) {
		problems = append(problems, fmt.Sprintf("--run %q is not a run id ([A-Za-z0-9_-]{1,64})", o.run))
	}
	o.sel.Run = o.run
	o.sel.FromSeq = o.fromSeq
	for _, t := range []struct {
		name, val string
		dst       *time.Time
	}{{"since", o.since, &o.sel.Since}, {"until", o.until, &o.sel.Until}} {
		if t.val == "" {
			continue
		}
		v, err := time.Parse(time.RFC3339Nano, t.val)
		if err != nil {
			problems = append(problems, fmt.Sprintf("--%s %q is not an RFC 3339 time", t.name, t.val))
			continue
		}
		*t.dst = v
	}
	if !o.sel.Since.IsZero() && !o.sel.Until.IsZero() && o.sel.Until.Before(o.sel.Since) {
		problems = append(problems, "--until is before --since")
	}
	switch cmd {
	case "export":
		if o.out == "" {
			problems = append(problems, "export needs --out FILE")
		}
		if o.outStream && o.outFile == "" && o.out != "" {
			if o.out == "-" {
				problems = append(problems, "--out-stream with --out - needs --out-file FILE")
			} else {
				o.outFile = replay.OutSibling(o.out)
			}
		}
		if o.outFile != "" && (o.outFile == o.out || o.outFile == "-" && o.out == "-") {
			problems = append(problems, "--out-file must differ from --out")
		}
	case "audit":
		if o.outFile != "" && !o.set["file"] {
			problems = append(problems, "--out-file goes with --file (from NATS the audit reads the out stream itself)")
		}
	case "what-if":
		if o.catalog == "" {
			problems = append(problems, "what-if needs --catalog FILE")
		}
	}
	if len(problems) > 0 {
		return usageErrorf("%s", strings.Join(problems, "; "))
	}
	return nil
}
