package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/nats-io/nats.go"

	"github.com/toolbatch/toolbatch/client"
)

// cmdStatus: toolbatch status [--json]
func cmdStatus(args []string, stdout io.Writer) error {
	c := newCommon("status")
	asJSON := c.fs.Bool("json", false, "print the status as one JSON object")
	if _, err := c.parse(args); err != nil {
		return err
	}
	return c.withClient(func(ctx context.Context, _ *nats.Conn, cl *client.Client) error {
		st, err := cl.Status(ctx)
		if err != nil {
			return explain(ctx, err, "reading the status")
		}
		if *asJSON {
			return writeJSON(stdout, st)
		}
		if err := printStatus(stdout, st); err != nil {
			return failf("write output: %v", err)
		}
		return nil
	})
}

// maxListed bounds the run ids and tickets the text lists (--json has
// them all).
const maxListed = 10

func printStatus(w io.Writer, st *client.Status) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	alive := 0
	for _, e := range st.Engines {
		if e.Alive {
			alive++
		}
	}
	fmt.Fprintf(tw, "engines: %d alive\n", alive)
	for _, e := range st.Engines {
		state := "alive"
		if !e.Alive {
			state = "gone (its runs are taken over on their next message)"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%d runs owned%s\n", e.ID, state, len(e.Runs), listed(e.Runs))
	}
	fmt.Fprintf(tw, "workers: %d\n", len(st.Workers))
	for _, wk := range st.Workers {
		var tools []string
		for _, t := range wk.Tools {
			tools = append(tools, fmt.Sprintf("%s/%s (%s)", t.Pool, t.Tool, t.Capability))
		}
		fmt.Fprintf(tw, "  %s\tpools %s\t%s\n", wk.ID, strings.Join(wk.Pools, ","), strings.Join(tools, ", "))
	}
	if len(st.BrainTools) > 0 {
		var tools []string
		for _, id := range slices.Sorted(maps.Keys(st.BrainTools)) {
			tools = append(tools, fmt.Sprintf("%s (%s)", id, st.BrainTools[id]))
		}
		fmt.Fprintf(tw, "brain services: %s\n", strings.Join(tools, ", "))
	}
	fmt.Fprintf(tw, "inbox backlog: %d (%d not taken, %d not acknowledged)\n", st.Inbox.Pending+uint64(st.Inbox.Unacknowledged), st.Inbox.Pending, st.Inbox.Unacknowledged)
	var reasons []string
	for _, r := range slices.Sorted(maps.Keys(st.TicketsByReason)) {
		reasons = append(reasons, fmt.Sprintf("%s %d", r, st.TicketsByReason[r]))
	}
	fmt.Fprintf(tw, "open tickets: %d", len(st.Tickets))
	if len(reasons) > 0 {
		fmt.Fprintf(tw, " (%s)", strings.Join(reasons, ", "))
	}
	fmt.Fprintln(tw)
	for i, t := range st.Tickets {
		if i == maxListed {
			fmt.Fprintf(tw, "  ... and %d more (--json lists them all)\n", len(st.Tickets)-maxListed)
			break
		}
		deadline := ""
		if t.Deadline != "" {
			deadline = "deadline " + t.Deadline
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s %s\t%s\n", t.RunID, t.CorrelationID, t.Reason, t.ToolID, deadline)
	}
	fmt.Fprintf(tw, "runs: %d in the log, %d parked, %d ended (as long as the out stream keeps their ended message)\n", st.Runs.Total, st.Runs.Parked, st.Runs.Ended)
	fmt.Fprintf(tw, "log: %s, %d commits, %s\n", st.Log.Stream, st.Log.Commits, bytesOf(st.Log.Bytes))
	var queues []string
	for _, q := range st.Queues {
		queues = append(queues, fmt.Sprintf("%s %d (%s)", q.Stream, q.Messages, bytesOf(q.Bytes)))
	}
	fmt.Fprintf(tw, "queues stored: %s\n", strings.Join(queues, ", "))
	return tw.Flush()
}

// listed shows the first run ids.
func listed(runs []string) string {
	if len(runs) == 0 {
		return ""
	}
	if len(runs) > maxListed {
		return ": " + strings.Join(runs[:maxListed], " ") + " ..."
	}
	return ": " + strings.Join(runs, " ")
}

func bytesOf(n uint64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
