package main

import (
	"fmt"
	"io"
	"os"

	"github.com/toolbatch/toolbatch/internal/cli"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// usage is the text printed for a usage error and for help.
const usage = `usage:
  toolbatch submit [--wait] [flags] < batch.json
      publish one JSON submit body read from stdin; with --wait, print the
      batch's results as one JSON object on stdout, and on stderr each
      ticket the batch waits on with the command that answers it
      (--timeout bounds the wait until the batch first parks on a ticket;
      then it waits without a limit)
  toolbatch watch RUN_ID [flags]
      print every out message of the run as one JSON line
      {"kind":...,"subject":...,"body":{...}} until interrupted
  toolbatch tickets [--run RUN_ID] [--reason R] [flags]
      list the open tickets of every run, each with the command that
      answers it
  toolbatch approve RUN_ID CORRELATION_ID [--principal P] [--note TEXT] [flags]
  toolbatch deny RUN_ID CORRELATION_ID [--principal P] [--reason TEXT] [flags]
      answer the run's permission (or scheduled action) ticket
  toolbatch result RUN_ID CORRELATION_ID [--file F] [--blocks] [--error] [flags]
      answer a client-executed tool's ticket with its output: the text of
      stdin (or F), or with --blocks a JSON array of content blocks or an
      output object {"content": [...], "is_error": false}
  toolbatch input RUN_ID CORRELATION_ID [TEXT] [flags]
      answer a delegated agent's ticket with input (TEXT, or stdin)
  toolbatch perform RUN_ID CORRELATION_ID [flags]
      perform the run's scheduled action now
  toolbatch cancel RUN_ID [--reason TEXT] [flags]
  toolbatch interrupt RUN_ID [--reason TEXT] [flags]
      end the run
  toolbatch status [--json] [flags]
      engines and the runs each owns, workers with their pools and tools,
      the inbox backlog, open tickets, parked and ended runs, the log's
      size (needs the admin role on a secured deployment)
  toolbatch tools [--catalog FILE] [--format anthropic|openai|openai-responses]
      print the catalog's tools (the built-in catalog without --catalog) as
      the tool definitions an agent loop sends to the model: name,
      description and input schema, as one JSON array
  toolbatch mcp import --server NAME [--trusted] [--pool P] --catalog FILE --worker FILE -- COMMAND [ARGS...]
      start a stdio MCP server (on this machine, unsandboxed), read its
      tools/list, and write the catalog entries (description, input schema;
      with --trusted, recovery modes and a confirmation rule from the
      annotations) and the worker config entries of its tools to two new
      files (docs/mcp.md)
  toolbatch console --users FILE [--listen ADDR] [--tls-cert F --tls-key F] [--keys FILE] [flags]
      serve the operator console (docs/console.md): runs and their
      timelines, the approvals inbox, waits, audits; people sign in as the
      users of FILE and answer as their principals; ADDR defaults to
      127.0.0.1:8080, and an address that is not loopback needs
      --tls-cert and --tls-key (or loopback behind your TLS proxy, with
      --secure-cookie)
  toolbatch console user --users FILE --name NAME [--principal P]
      add a console user, or set one's password and principal (P: NAME by
      default); the password is the first line of stdin
  toolbatch auth create|list|revoke|permissions|keys|revoke-key ...
      users, roles and credentials (toolbatch auth -h)

flags of every command:
  --nats-url URL   NATS server (default nats://127.0.0.1:4222)
  --prefix P       subject prefix, the engine's --prefix (default toolbatch)
  --timeout D      how long to wait for NATS and the engine (default 30s;
                   0 waits without limit; watch: only while starting)
  --creds FILE     this user's credentials (toolbatch auth create)
  --tls-ca FILE    CA of the server's TLS certificate
  --tls-client-cert FILE, --tls-client-key FILE
                   a client certificate, for a server that requires one


Every command that acts prints one line saying what it did; with --json
(submit without --wait, approve, deny, result, input, perform, cancel,
interrupt; tickets and status print what they read), one JSON object.

exit status: 0 done, 1 refused, rejected, timed out or failed, 2 usage error
`

// usageErrorf is a usage error: exit status 2.
func usageErrorf(format string, args ...any) error {
	return cli.Errorf(2, format, args...)
}

// failf is any other failure: exit status 1.
func failf(format string, args ...any) error {
	return cli.Errorf(1, format, args...)
}

// run runs one command and returns its exit status.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, "toolbatch: no command\n"+usage)
		return 2
	}
	cmd, rest := args[0], args[1:]
	var err error
	switch cmd {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	case "submit":
		err = cmdSubmit(rest, stdin, stdout, stderr)
	case "watch":
		err = cmdWatch(rest, stdout, stderr)
	case "approve", "deny":
		err = cmdAnswer(cmd, rest, stdout)
	case "result":
		err = cmdResult(rest, stdin, stdout)
	case "input":
		err = cmdInput(rest, stdin, stdout)
	case "tickets":
		err = cmdTickets(rest, stdout)
	case "cancel", "interrupt":
		err = cmdEnd(cmd, rest, stdout)
	case "perform":
		err = cmdPerform(rest, stdout)
	case "status":
		err = cmdStatus(rest, stdout)
	case "tools":
		err = cmdTools(rest, stdout)
	case "mcp":
		err = cmdMCP(rest, stdout, stderr)
	case "auth":
		err = cmdAuth(rest, stdout)
	case "console":
		err = cmdConsole(rest, stdin, stdout, stderr)
	default:
		err = usageErrorf("unknown command %q (want submit, watch, tickets, approve, deny, result, input, perform, cancel, interrupt, status, tools, mcp, auth or console; toolbatch help)", cmd)
	}
	code, msg := cli.Status(err, 1, usage, stdout)
	if code != 0 {
		fmt.Fprintln(stderr, "toolbatch: "+msg) // one line, whatever the error holds
	}
	return code
}
