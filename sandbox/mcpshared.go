package sandbox

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/internal/mcpcontent"
)

// Shared MCP servers: the tools with mcp.lifecycle shared and one
// mcp.server name use one long-lived server per worker. It runs in a
// bubblewrap sandbox of its own, started at the first call (and again
// after it is gone), with the tools' command, limits, mounts, network
// setting and environment (Config.Validate holds them equal); inside it,
// the worker program keeps one MCP session with the server and makes the
// calls the worker sends it on stdin, concurrently, answering on stdout.
// Calls share the server's limits and whatever the server keeps between
// calls; a call's timeout kills the server (and fails the calls in
// progress in it), as a call's timeout kills its sandbox.

// sharedRequest and sharedReply are the lines the worker and the server's
// MCP client exchange. The client's first line is a reply with Ready set,
// or with Error when the session did not come up.
type (
	sharedRequest struct {
		ID          uint64          `json:"id"`
		Tool        string          `json:"tool"`
		Arguments   json.RawMessage `json:"arguments,omitempty"`
		OperationID string          `json:"operation_id"`
	}
	sharedReply struct {
		ID     uint64          `json:"id"`
		Ready  bool            `json:"ready,omitempty"`
		Output json.RawMessage `json:"output,omitempty"`
		Error  string          `json:"error,omitempty"`
	}
)

// mcpServe runs inside the shared server's sandbox: one session with the
// server (args: -- <server argv>), the worker's calls made as they come,
// until stdin ends or the session does.
func mcpServe(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	maxBytes := 0
	if len(args) > 0 && strings.HasPrefix(args[0], "--max-bytes=") {
		maxBytes, _ = strconv.Atoi(strings.TrimPrefix(args[0], "--max-bytes="))
		args = args[1:]
	}
	if len(args) < 2 || args[0] != "--" || maxBytes <= 0 {
		fmt.Fprintln(stderr, "mcp serve: want --max-bytes=N -- <server command>")
		return 2
	}
	server := args[1:]
	var mu sync.Mutex
	enc := json.NewEncoder(stdout)
	write := func(r sharedReply) {
		mu.Lock()
		defer mu.Unlock()
		_ = enc.Encode(r)
	}
	ctx := context.Background()
	session, err := mcpcontent.Stdio(ctx, mcpClientName, server, stderr, 0)
	if err != nil {
		write(sharedReply{Error: err.Error()})
		return mcpNotDispatched
	}
	write(sharedReply{Ready: true})
	gone := make(chan struct{})
	go func() { _ = session.Wait(); close(gone) }()
	reqs := make(chan sharedRequest)
	go func() {
		defer close(reqs)
		dec := json.NewDecoder(stdin)
		for {
			var req sharedRequest
			if dec.Decode(&req) != nil {
				return
			}
			reqs <- req
		}
	}()
	for {
		select {
		case <-gone:
			fmt.Fprintln(stderr, "the MCP server's session ended")
			return 1
		case req, ok := <-reqs:
			if !ok {
				return 0
			}
			go func() {
				out, err := mcpcontent.Call(ctx, session, req.Tool, req.Arguments, req.OperationID)
				switch {
				case err != nil:
					write(sharedReply{ID: req.ID, Error: err.Error()})
					return
				case len(out) > maxBytes:
					write(sharedReply{ID: req.ID, Error: fmt.Sprintf("tools/call %s: the result is %d bytes, more than limits.output_kb (%d bytes)", req.Tool, len(out), maxBytes)})
					return
				}
				write(sharedReply{ID: req.ID, Output: out})
			}()
		}
	}
}

// sharedServer is a shared MCP server of a Runner.
type sharedServer struct {
	r    *Runner
	tool ToolConfig // the first of its tools: command, limits, mounts, env

	mu      sync.Mutex
	live    *sharedLive // nil: not started, or gone
	next    uint64
	writeMu sync.Mutex
}

// sharedLive is one run of a shared server's sandbox.
type sharedLive struct {
	p       *proc
	workdir string
	pending map[uint64]chan sharedReply
	gone    chan struct{} // closed when its stdout ended: every pending call has failed
	stderr  *tailBuffer
}

// sharedFor returns the shared server of an MCP tool.
func (r *Runner) sharedFor(t ToolConfig) *sharedServer {
	r.sharedMu.Lock()
	defer r.sharedMu.Unlock()
	if r.shared == nil {
		r.shared = map[string]*sharedServer{}
	}
	s := r.shared[t.MCP.Server]
	if s == nil {
		// The server runs as the first of its tools, in the config's order
		// (its user, its pinned mounts).
		first := t
		for _, o := range r.cfg.Tools {
			if o.MCP.shared() && o.MCP.Server == t.MCP.Server {
				first = o
				break
			}
		}
		s = &sharedServer{r: r, tool: first}
		r.shared[t.MCP.Server] = s
	}
	return s
}

// closeShared stops every shared server (Runner.Close).
func (r *Runner) closeShared() {
	r.sharedMu.Lock()
	defer r.sharedMu.Unlock()
	for _, s := range r.shared {
		s.stop()
	}
}

// ensure returns the running server, starting it when there is none. An
// error means nothing was sent to it.
func (s *sharedServer) ensure(ctx context.Context) (*sharedLive, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.r.closed.Load() {
		return nil, errors.New("the worker is stopping")
	}
	if s.live != nil {
		select {
		case <-s.live.gone:
			s.live = nil
		default:
			return s.live, nil
		}
	}
	t, r := s.tool, s.r
	prog, err := resolveProgram(t.Command[0])
	if err != nil {
		return nil, err
	}
	workdir, err := r.newWorkdir(t.ID)
	if err != nil {
		return nil, fmt.Errorf("cannot create the working directory: %w", err)
	}
	p, err := r.start(t.ID, r.argv(t, workdir, prog), toolEnv(t, Call{}, workdir), workdir, nil)
	if err != nil {
		removeWorkdir(workdir)
		return nil, err
	}
	l := &sharedLive{p: p, workdir: workdir, pending: map[uint64]chan sharedReply{}, gone: make(chan struct{}), stderr: newTailBuffer(StderrTailBytes)}
	stderrDone := make(chan struct{})
	go func() { _, _ = io.Copy(l.stderr, p.stderr); close(stderrDone) }()
	lines := bufio.NewScanner(p.stdout)
	lines.Buffer(make([]byte, 64<<10), t.Limits.OutputKB<<10+64<<10) // the client bounds each reply's output
	ready := make(chan error, 1)
	go func() {
		first := true
		for lines.Scan() {
			var rep sharedReply
			if err := json.Unmarshal(lines.Bytes(), &rep); err != nil {
				break
			}
			if first {
				first = false
				if !rep.Ready {
					ready <- errors.New(rep.Error)
					break
				}
				ready <- nil
				continue
			}
			s.mu.Lock()
			ch := l.pending[rep.ID]
			delete(l.pending, rep.ID)
			s.mu.Unlock()
			if ch != nil {
				ch <- rep
			}
		}
		if first {
			ready <- fmt.Errorf("it ended before its session was up: %s", l.stderr.String())
		}
		// Gone: whatever is pending was sent and has no answer.
		p.stop()
		removeWorkdir(workdir)
		s.mu.Lock()
		for id, ch := range l.pending {
			delete(l.pending, id)
			// Not its stderr: it holds what other calls wrote.
			ch <- sharedReply{ID: id, Error: "the shared MCP server exited during the call"}
		}
		close(l.gone)
		s.mu.Unlock()
	}()
	select {
	case err = <-ready:
	case <-time.After(t.Timeout):
		err = fmt.Errorf("its session was not up after %s", t.Timeout)
	case <-ctx.Done():
		err = context.Cause(ctx)
	}
	if err != nil {
		p.stop()
		select {
		case <-stderrDone:
		case <-time.After(killGrace):
		}
		if tail := strings.TrimSpace(l.stderr.String()); tail != "" {
			err = fmt.Errorf("%w; its stderr: %s", err, tail)
		}
		return nil, err
	}
	s.live = l
	return l, nil
}

// stop kills the server's sandbox, if it runs; the calls in it fail.
func (s *sharedServer) stop() {
	s.mu.Lock()
	l := s.live
	s.mu.Unlock()
	if l != nil {
		s.stopLive(l)
	}
}

// stopLive kills one run of the server (the one a call used, not whatever
// runs by now) and waits until its calls have failed.
func (s *sharedServer) stopLive(l *sharedLive) {
	s.mu.Lock()
	if s.live == l {
		s.live = nil
	}
	s.mu.Unlock()
	l.p.stop()
	<-l.gone
}

// call makes one call of the tool t on the shared server. Its timeout
// counts from here, the server's start included.
func (s *sharedServer) call(ctx context.Context, t ToolConfig, call Call) Result {
	timer := time.NewTimer(t.Timeout)
	defer timer.Stop()
	sctx, cancel := context.WithTimeoutCause(ctx, t.Timeout, fmt.Errorf("the call's timeout (%s) passed", t.Timeout))
	defer cancel()
	l, err := s.ensure(sctx)
	if err != nil {
		return failure(events.ErrorUnavailableBeforeDispatch, "the shared MCP server %s did not start: %v", t.MCP.Server, err)
	}
	ch := make(chan sharedReply, 1)
	s.mu.Lock()
	s.next++
	id := s.next
	select {
	case <-l.gone:
		s.mu.Unlock()
		return failure(events.ErrorUnavailableBeforeDispatch, "the shared MCP server %s exited before the call was sent", t.MCP.Server)
	default:
	}
	l.pending[id] = ch
	s.mu.Unlock()
	line, err := json.Marshal(sharedRequest{ID: id, Tool: t.MCP.Tool, Arguments: json.RawMessage(call.Arguments), OperationID: call.OperationID})
	if err == nil {
		s.writeMu.Lock()
		_, err = l.p.stdin.Write(append(line, '\n'))
		s.writeMu.Unlock()
	}
	if err != nil {
		s.mu.Lock()
		delete(l.pending, id)
		s.mu.Unlock()
		return failure(events.ErrorUnavailableBeforeDispatch, "the call could not be sent to the shared MCP server %s: %v", t.MCP.Server, err)
	}
	forget := func() {
		s.mu.Lock()
		delete(l.pending, id)
		s.mu.Unlock()
	}
	select {
	case rep := <-ch:
		if rep.Error != "" {
			return failure(events.ErrorExecution, "%s", rep.Error)
		}
		out, err := decodeOutput(rep.Output, false)
		if err != nil {
			return failure(events.ErrorExecution, "the MCP result could not be read: %v", err)
		}
		out.CallID = call.CallID
		return success(out)
	case <-timer.C:
		// A call that outlives its timeout takes its server down with it,
		// as a call's sandbox is killed: nothing of it runs on.
		forget()
		s.stopLive(l)
		return failure(events.ErrorExecution, "timed out after %s (the shared MCP server %s was stopped)", t.Timeout, t.MCP.Server).as(ExitTimeout)
	case <-ctx.Done():
		// The claim is gone (or the worker stops): the call must not run
		// on where another worker may make it again.
		forget()
		s.stopLive(l)
		return failure(events.ErrorExecution, "interrupted: %v (the shared MCP server %s was stopped)", context.Cause(ctx), t.MCP.Server).as(ExitKilled)
	}
}

// tailBuffer keeps the last n bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	n   int
	buf []byte
}

func newTailBuffer(n int) *tailBuffer { return &tailBuffer{n: n} }

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if len(b.buf) > b.n {
		b.buf = b.buf[len(b.buf)-b.n:]
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}
