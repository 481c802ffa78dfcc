package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/access"
	"github.com/toolbatch/toolbatch/client"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/protocol"
)

// Defaults of the common flags.
const (
	defaultURL     = "nats://127.0.0.1:4222"
	defaultTimeout = 30 * time.Second
	// maxBody bounds what submit reads from stdin; NATS refuses far smaller
	// messages anyway (1 MiB by default).
	maxBody = 64 << 20
)

// common holds the flags every command takes.
type common struct {
	fs      *flag.FlagSet
	natsURL string
	conn    access.Conn
	prefix  string
	timeout time.Duration
}

func newCommon(name string) *common {
	c := &common{fs: flag.NewFlagSet(name, flag.ContinueOnError)}
	c.fs.SetOutput(io.Discard) // a bad flag is one line, from run
	c.fs.StringVar(&c.natsURL, "nats-url", defaultURL, "NATS server")
	c.conn.Flags(c.fs)
	c.fs.StringVar(&c.prefix, "prefix", client.DefaultPrefix, "subject prefix")
	c.fs.DurationVar(&c.timeout, "timeout", defaultTimeout, "how long to wait for NATS and the engine")
	return c
}

// connFlags are the connection flags given on the command line (NATS URL,
// prefix, credentials, TLS), as " --flag value" for a command printed for
// a person to run against the same deployment.
func (c *common) connFlags() string {
	var b strings.Builder
	c.fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "nats-url", "prefix", "creds", "tls-ca", "tls-client-cert", "tls-client-key":
			v := f.Value.String()
			if strings.ContainsAny(v, " \t'\"$`\\") {
				v = "'" + strings.ReplaceAll(v, "'", `'\''`) + "'"
			}
			fmt.Fprintf(&b, " --%s %s", f.Name, v)
		}
	})
	return b.String()
}

// parse reads flags and positional arguments in any order ("--" ends the
// flags) and checks the number of positional arguments (a name in
// brackets, last, is optional).
func (c *common) parse(args []string, names ...string) ([]string, error) {
	var pos []string
	for {
		if err := c.fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, usageErrorf("%s: %v", c.fs.Name(), err)
		}
		rest := c.fs.Args()
		if len(rest) == 0 {
			break
		}
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			pos = append(pos, rest...)
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	required := len(names)
	for required > 0 && strings.HasPrefix(names[required-1], "[") {
		required--
	}
	if len(pos) < required || len(pos) > len(names) {
		want := "no arguments"
		if len(names) > 0 {
			want = strings.Join(names, " ")
		}
		return nil, usageErrorf("%s: want %s, got %d argument(s) (toolbatch help)", c.fs.Name(), want, len(pos))
	}
	if !protocol.ValidPrefix(c.prefix) {
		return nil, usageErrorf("--prefix %q must be dot-separated tokens of [A-Za-z0-9_-]", c.prefix)
	}
	if c.timeout < 0 {
		return nil, usageErrorf("--timeout %v must not be negative", c.timeout)
	}
	return pos, nil
}

// parseTicket reads the arguments RUN_ID CORRELATION_ID of a command that
// answers a ticket, and checks both.
func (c *common) parseTicket(args []string) (runID, corr string, err error) {
	pos, err := c.parse(args, "RUN_ID", "CORRELATION_ID")
	if err != nil {
		return "", "", err
	}
	runID, corr = pos[0], pos[1]
	if err := validRun(c.fs.Name(), runID); err != nil {
		return "", "", err
	}
	if err := validCorrelation(c.fs.Name(), corr); err != nil {
		return "", "", err
	}
	return runID, corr, nil
}

// context returns a context bounded by --timeout (none for 0) and ended by
// SIGINT or SIGTERM.
func (c *common) context() (context.Context, context.CancelFunc) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	if c.timeout == 0 {
		return ctx, stop
	}
	tctx, cancel := context.WithTimeout(ctx, c.timeout)
	return tctx, func() { cancel(); stop() }
}

// connect opens the NATS connection and the client.
func (c *common) connect() (*nats.Conn, *client.Client, error) {
	connOpts, err := c.conn.Options()
	if err != nil {
		return nil, nil, usageErrorf("%v", err)
	}
	nc, err := nats.Connect(c.natsURL, append(connOpts, nats.Name("toolbatch-cli"))...)
	if err != nil {
		return nil, nil, failf("connect to %s: %v", c.natsURL, err)
	}
	key, err := c.conn.PublicKey()
	if err != nil {
		nc.Close()
		return nil, nil, usageErrorf("%v", err)
	}
	opts := []client.Option{client.WithPrefix(c.prefix)}
	if key != "" {
		opts = append(opts, client.WithSubmitter(key)) // a client user submits as itself
	}
	cl, err := client.New(nc, opts...)
	if err != nil {
		nc.Close()
		return nil, nil, usageErrorf("%v", err)
	}
	return nc, cl, nil
}

// withClient connects, runs fn with the connection, the client and the
// command's context, and closes them when fn returns.
func (c *common) withClient(fn func(ctx context.Context, nc *nats.Conn, cl *client.Client) error) error {
	nc, cl, err := c.connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	tctx, cancel := c.context()
	defer cancel()
	// A publish or subscription NATS refuses (this user's role does not
	// allow it) is reported to the connection, not to the call, which
	// would wait for its timeout: end the command with it at once.
	ctx, refuse := context.WithCancelCause(tctx)
	defer refuse(nil)
	nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if isPermissionViolation(err) {
			refuse(err)
		}
	})
	return fn(ctx, nc, cl)
}

func isPermissionViolation(err error) bool {
	return errors.Is(err, nats.ErrPermissionViolation) || strings.Contains(strings.ToLower(err.Error()), "permissions violation")
}

// explain turns an error of the client into the CLI's one-line error: a
// refusal shows its code, an expired context says what was awaited.
func explain(ctx context.Context, err error, what string) error {
	var ref *events.Refusal
	switch {
	case errors.As(err, &ref):
		return failf("refused %s: %s", ref.Code, ref.Reason)
	case ctx.Err() != nil && isPermissionViolation(context.Cause(ctx)):
		return failf("%s: NATS refused it: %v (this user's role does not allow it: see docs/security.md)", what, context.Cause(ctx))
	case ctx.Err() != nil && errors.Is(context.Cause(ctx), context.DeadlineExceeded):
		return failf("timed out %s", what)
	case ctx.Err() != nil:
		return failf("interrupted %s", what)
	case errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrNoStreamResponse):
		return failf("%s: %v (is an engine running with this --prefix?)", what, err)
	default:
		return failf("%s: %v", what, err)
	}
}

func validRun(cmd, runID string) error {
	if !events.ValidRunID(runID) {
		return usageErrorf("%s: RUN_ID %q must match [A-Za-z0-9_-]{1,64}", cmd, runID)
	}
	return nil
}

func validCorrelation(cmd, id string) error {
	if !events.ValidCallID(id) {
		return usageErrorf("%s: CORRELATION_ID %q must match [A-Za-z0-9_-]{1,128}", cmd, id)
	}
	return nil
}

// cmdSubmit: toolbatch submit [--wait] < batch.json
func cmdSubmit(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	c := newCommon("submit")
	wait := c.fs.Bool("wait", false, "wait for the batch's results and print them")
	asJSON := c.fs.Bool("json", false, "without --wait: say what was done as one JSON object")
	if _, err := c.parse(args); err != nil {
		return err
	}
	body, err := io.ReadAll(io.LimitReader(stdin, maxBody+1))
	if err != nil {
		return failf("read stdin: %v", err)
	}
	if len(body) > maxBody {
		return failf("rejected %s: body is larger than %d bytes", events.CodeLimitExceeded, maxBody)
	}
	sub, err := protocol.DecodeSubmit(body, true, events.DefaultLimits())
	if err != nil {
		return rejected(err)
	}
	if !*wait {
		return c.withClient(func(ctx context.Context, nc *nats.Conn, cl *client.Client) error {
			if err := submit(ctx, cl, sub, false, stdout); err != nil {
				return err
			}
			return report(stdout, *asJSON, done{Done: "submitted", RunID: sub.RunID, BatchID: sub.BatchID()},
				"submitted batch %s (%d calls); toolbatch watch %s follows it", sub.BatchID(), len(sub.Calls()), sub.RunID)
		})
	}
	// --timeout bounds the wait for the engine, not for the people who
	// answer the batch's tickets: it runs until the batch first parks.
	timeout := c.timeout
	c.timeout = 0
	return c.withClient(func(ctx context.Context, nc *nats.Conn, cl *client.Client) error {
		wctx, expire := context.WithCancelCause(ctx)
		defer expire(nil)
		go watchBatch(wctx, cl, sub.RunID, sub.BatchID(), c.connFlags(), timeout, stderr, func() { expire(context.DeadlineExceeded) })
		return submit(wctx, cl, sub, true, stdout)
	})
}

// submit publishes sub and, with wait, prints its answer: the results
// that name it, or its own refusal (client.Answer).
func submit(ctx context.Context, cl *client.Client, sub *protocol.Submit, wait bool, stdout io.Writer) error {
	sent, err := cl.Send(ctx, sub)
	if err != nil {
		if _, ok := events.CodeOf(err); ok {
			return rejected(err)
		}
		return explain(ctx, err, "publishing batch "+sub.BatchID())
	}
	if !wait {
		return nil
	}
	res, err := cl.Answer(ctx, sent)
	var ended *client.EndedError
	switch {
	case errors.Is(err, client.ErrRejected):
		return rejected(err)
	case errors.As(err, &ended):
		msg := fmt.Sprintf("run %s ended (%s) without the results of batch %s", sub.RunID, ended.Ended.Cause, sub.BatchID())
		if ended.Ended.Reason != "" {
			msg += ": " + ended.Ended.Reason
		}
		return failf("%s", msg)
	case err != nil:
		return explain(ctx, err, "waiting for the results of batch "+sub.BatchID())
	}
	if res.Results == nil {
		res.Results = []events.ContentBlock{}
	}
	if res.State == nil {
		res.State = []events.Command{}
	}
	return writeJSON(stdout, res)
}

// rejected is the one-line error of a refused submission.
func rejected(err error) error {
	var ref *events.Refusal
	if errors.As(err, &ref) {
		return failf("rejected %s: %s", ref.Code, ref.Reason)
	}
	return failf("rejected: %v", err)
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return failf("write output: %v", err)
	}
	return nil
}

// watchLine is one line of toolbatch watch.
type watchLine struct {
	Kind    string `json:"kind"`
	Subject string `json:"subject"`
	Body    any    `json:"body"`
}

// cmdWatch: toolbatch watch RUN_ID
func cmdWatch(args []string, stdout, stderr io.Writer) error {
	c := newCommon("watch")
	pos, err := c.parse(args, "RUN_ID")
	if err != nil {
		return err
	}
	runID := pos[0]
	if err := validRun("watch", runID); err != nil {
		return err
	}
	nc, cl, err := c.connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	startCtx, cancel := context.WithCancel(ctx)
	if c.timeout > 0 {
		startCtx, cancel = context.WithTimeout(ctx, c.timeout)
	}
	w, err := cl.Watch(startCtx, runID)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return nil // interrupted while starting
		}
		return explain(startCtx, err, "starting to watch run "+runID)
	}
	defer w.Stop()
	for {
		m, err := w.Next(ctx)
		if ctx.Err() != nil {
			return nil // SIGINT or SIGTERM: done
		}
		var derr *client.DecodeError
		switch {
		case errors.As(err, &derr):
			fmt.Fprintln(stderr, "toolbatch: skipped an unreadable out message:", strings.ReplaceAll(derr.Error(), "\n", " "))
			continue
		case err != nil:
			return failf("watch run %s: %v", runID, err)
		}
		if err := writeJSON(stdout, watchLine{Kind: m.Kind, Subject: m.Subject, Body: body(m)}); err != nil {
			return err
		}
	}
}

// body returns the payload of an out message.
func body(m client.Message) any {
	switch {
	case m.Disposition != nil:
		return m.Disposition
	case m.Results != nil:
		r := *m.Results
		if r.Results == nil {
			r.Results = []events.ContentBlock{}
		}
		if r.State == nil {
			r.State = []events.Command{}
		}
		return r
	case m.Awaiting != nil:
		return m.Awaiting
	case m.Rejected != nil:
		return m.Rejected
	case m.Refused != nil:
		return m.Refused
	case m.Ended != nil:
		return m.Ended
	}
	return struct{}{}
}

// cmdAnswer: toolbatch approve|deny RUN_ID CORRELATION_ID [--principal P]
// [--note|--reason TEXT]
func cmdAnswer(cmd string, args []string, stdout io.Writer) error {
	c := newCommon(cmd)
	asJSON := c.fs.Bool("json", false, "say what was done as one JSON object")
	principal := c.fs.String("principal", "", "who decides: the resume goes to <prefix>.resume.<run_id>.<principal>")
	var text *string
	if cmd == "approve" {
		text = c.fs.String("note", "", "a note recorded with the approval")
	} else {
		text = c.fs.String("reason", "", "the reason shown to the model (blocked: <reason>; default denied)")
	}
	runID, corr, err := c.parseTicket(args)
	if err != nil {
		return err
	}
	if *principal != "" && !events.ValidRunID(*principal) {
		return usageErrorf("%s: --principal %q must match [A-Za-z0-9_-]{1,64}", cmd, *principal)
	}
	return c.withClient(func(ctx context.Context, nc *nats.Conn, cl *client.Client) error {
		t, err := findTicket(ctx, nc, cl, runID, corr)
		if err != nil {
			return err
		}
		switch t.Reason {
		case events.WaitPermission, events.WaitScheduledAction:
		default:
			return wrongKind(*t, "a permission", c.connFlags())
		}
		verb := "approved"
		if cmd == "approve" {
			err = cl.Approve(ctx, *t, *principal, *text)
		} else {
			verb = "denied"
			err = cl.Deny(ctx, *t, *principal, *text)
		}
		if err != nil {
			return explain(ctx, err, "answering ticket "+corr)
		}
		as := ""
		if *principal != "" {
			as = " as " + *principal
		}
		return report(stdout, *asJSON, done{Done: verb, RunID: runID, CorrelationID: corr, CallID: t.CallID, ToolID: t.ToolID},
			"%s call %s (tool %s) of run %s%s (ticket %s)", verb, t.CallID, t.ToolID, runID, as, corr)
	})
}

// findTicket reads the run's out messages until it has caught up and
// returns the ticket with the correlation id. It fails when the run has no
// such ticket, or when a later out message shows that the ticket is no
// longer open (another ticket, the batch's results, the run's end).
func findTicket(ctx context.Context, nc *nats.Conn, cl *client.Client, runID, corr string) (*protocol.AwaitingOut, error) {
	// Watch waits for messages; a run without any ticket would make it wait
	// until the timeout, so look first.
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, failf("jetstream: %v", err)
	}
	names := protocol.Names{Prefix: cl.Prefix()}
	name, err := js.StreamNameBySubject(ctx, names.StreamSubjects(protocol.StreamOut)[0])
	if err != nil {
		return nil, explain(ctx, err, "finding the out stream")
	}
	stream, err := js.Stream(ctx, name)
	if err != nil {
		return nil, explain(ctx, err, "finding the out stream")
	}
	if _, err := stream.GetLastMsgForSubject(ctx, names.Out(runID, protocol.OutAwaiting)); errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, failf("run %s has no ticket %s (it has no ticket at all)", runID, corr)
	} else if err != nil {
		return nil, explain(ctx, err, "reading the tickets of run "+runID)
	}
	w, err := cl.Watch(ctx, runID)
	if err != nil {
		return nil, explain(ctx, err, "reading the tickets of run "+runID)
	}
	defer w.Stop()
	var (
		ticket *protocol.AwaitingOut
		closed string // why the ticket is no longer open
	)
	for {
		m, err := nextReadable(ctx, w)
		if err != nil {
			return nil, explain(ctx, err, "reading the tickets of run "+runID)
		}
		switch {
		case m.Awaiting != nil && m.Awaiting.CorrelationID == corr:
			ticket, closed = m.Awaiting, ""
		case ticket == nil || closed != "":
		case m.Awaiting != nil:
			closed = "the run has awaited another ticket since"
		case m.Results != nil && m.Results.BatchID == ticket.BatchID:
			closed = "its batch " + ticket.BatchID + " has published its results"
		case m.Ended != nil:
			closed = "the run ended (" + string(m.Ended.Cause) + ")"
		}
		if m.Pending == 0 {
			break
		}
	}
	switch {
	case ticket == nil:
		return nil, failf("run %s has no ticket %s", runID, corr)
	case closed != "":
		return nil, failf("ticket %s of run %s is no longer open: %s", corr, runID, closed)
	}
	return ticket, nil
}

// cmdEnd: toolbatch cancel|interrupt RUN_ID [--reason TEXT]
func cmdEnd(cmd string, args []string, stdout io.Writer) error {
	c := newCommon(cmd)
	reason := c.fs.String("reason", "", "why the run ends")
	asJSON := c.fs.Bool("json", false, "say what was done as one JSON object")
	pos, err := c.parse(args, "RUN_ID")
	if err != nil {
		return err
	}
	runID := pos[0]
	if err := validRun(cmd, runID); err != nil {
		return err
	}
	return c.withClient(func(ctx context.Context, _ *nats.Conn, cl *client.Client) error {
		var err error
		if cmd == "cancel" {
			err = cl.Cancel(ctx, runID, *reason)
		} else {
			err = cl.Interrupt(ctx, runID, *reason)
		}
		if err != nil {
			return explain(ctx, err, cmd+"ing run "+runID)
		}
		return report(stdout, *asJSON, done{Done: cmd, RunID: runID},
			"asked the engine to %s run %s (toolbatch watch %s shows it ended)", cmd, runID, runID)
	})
}

// cmdPerform: toolbatch perform RUN_ID CORRELATION_ID
func cmdPerform(args []string, stdout io.Writer) error {
	c := newCommon("perform")
	asJSON := c.fs.Bool("json", false, "say what was done as one JSON object")
	runID, corr, err := c.parseTicket(args)
	if err != nil {
		return err
	}
	return c.withClient(func(ctx context.Context, _ *nats.Conn, cl *client.Client) error {
		if err := cl.Perform(ctx, runID, corr); err != nil {
			return explain(ctx, err, "performing ticket "+corr)
		}
		return report(stdout, *asJSON, done{Done: "perform", RunID: runID, CorrelationID: corr},
			"asked the engine to perform the scheduled action of ticket %s of run %s now", corr, runID)
	})
}
