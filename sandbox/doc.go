// Package sandbox is the execution side of a sandbox worker: it loads the
// worker config (the operator's public interface, described in
// docs/workers.md) and runs one call of a tool, either a trusted builtin in
// process or a command as a sandboxed subprocess. It knows nothing of NATS,
// claims or leases: the worker loop calls Runner.Run once per claimed
// attempt and publishes the Result.
//
// A subprocess call, with isolation bubblewrap:
//
//	worker (root)            bwrap as the tool's own uid (its own process group)
//	  └─ bwrap ─ new user, PID, IPC, UTS (and network) namespaces
//	       └─ bwrap (PID 1)
//	            └─ env -u PWD (bwrap sets PWD; execs)
//	                 └─ prlimit --as --cpu --nproc --fsize --core (sets rlimits, execs)
//	                      └─ the tool: argv from the config, arguments on stdin
//
// The tool sees a read-only view of the host (--ro-bind / /), a private
// /proc and /dev, a private /tmp (tmpfs of limits.memory_mb), its mounts
// at the same paths, and a fresh empty working directory, bound at the same
// path, that is its cwd and HOME and is removed afterwards. Its environment
// is exactly PATH, HOME, LANG, the TOOLBATCH_* variables, TRACEPARENT
// when the call is traced, and its env map.
//
// rlimits are set by prlimit inside the sandbox, after the user namespace
// exists: RLIMIT_NPROC is then counted per user namespace and user, so
// max_procs caps each call on its own rather than all calls of the uid
// together; and because bwrap runs as an unprivileged uid, root's exemption
// from RLIMIT_NPROC does not apply. Go cannot set a child's rlimits before
// exec (SysProcAttr has no rlimit field), and a re-exec helper would tie
// the sandbox to the worker binary; prlimit (util-linux) is on every Linux.
//
// Every failure is a Result: a missing program, a non-zero exit (with the
// tail of stderr), a timeout, a cancelled context, too much output,
// malformed JSON output. On a timeout, cancellation or too much output the
// sandbox's init process is killed, which makes the kernel kill every
// process of its PID namespace; Run returns once bubblewrap has exited.
//
// With isolation bubblewrap a Runner also keeps pre-started sandboxes
// (Config.Prestart, default 2 per subprocess tool; prestart.go): the same
// bubblewrap command line, whose first process is the stage (StageMain: the
// program itself re-executed) instead of env. The stage waits for the
// call's environment on a pipe and execs the same prlimit command line, so
// the tool's process is the one a sandbox started for the call runs. Each
// serves one call; Close kills the ready ones and removes their working
// directories.
//
// With isolation none the same command line runs without bubblewrap, in
// its own process group; Runner.Warning says what is then not isolated.
//
// An MCP tool (ToolConfig.MCP; mcp.go, mcpshared.go) is a subprocess tool
// whose command is a stdio MCP server: the program itself, mounted
// read-only into the sandbox (MCPCallMain), is its MCP client, outside the
// rlimits, with the server under them; per call (a server in each call's
// sandbox) or shared (one long-lived sandboxed server per worker whose
// calls go over one session).
//
// Imports: events, internal/located, internal/mcpcontent,
// go.yaml.in/yaml/v3, golang.org/x/sys/unix.
package sandbox
