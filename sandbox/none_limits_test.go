package sandbox

import (
	"testing"

	"github.com/toolbatch/toolbatch/events"
)

// TestIsolationNoneLimits checks that a tool without isolation runs under
// its rlimits, whether the runner sets them on the tool stopped at its
// exec or, where a process may not trace its child, execs prlimit: both
// give the same limits and the same errors.
func TestIsolationNoneLimits(t *testing.T) {
	t.Parallel()
	for _, traced := range []bool{true, false} {
		name := "prlimit"
		if traced {
			name = "traced"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r, workRoot := newRunner(t, fresh, `
isolation: none
tools:
  - id: limits
    command: [/bin/sh, -c, 'for l in t p v f c; do printf "%s=%s " $l "$(ulimit -$l)"; done; printf "hard_t=%s" "$(ulimit -Ht)"']
    limits: {cpu_seconds: 3, max_procs: 7, memory_mb: 32}
  - id: mem
    command: [python3, ./memory.py]
    limits: {memory_mb: 64}
  - id: spin
    command: [python3, ./spin.py]
    timeout: 20s
    limits: {cpu_seconds: 1}
  - id: bigfile
    command: [/bin/sh, -c, 'head -c 17000000 /dev/zero > f']
    limits: {memory_mb: 16}
`)
			if !traced {
				r.noTrace.Store(true)
			}
			// fsize is the larger of the output cap and the memory
			// limit: 32 MiB, 65536 blocks of 512 bytes.
			wantText(t, run(t, r, "limits", `{}`), "t=3 p=7 v=32768 f=65536 c=0 hard_t=4")
			wantText(t, run(t, r, "mem", `{"mb":8}`), "allocated 8 MiB\n")
			wantError(t, run(t, r, "mem", `{"mb":256}`), events.ErrorExecution, "exit status 1", "MemoryError")
			wantError(t, run(t, r, "spin", `{}`), events.ErrorExecution, "exit status 152", "CPU time limit exceeded", "limits.cpu_seconds is 1")
			wantError(t, run(t, r, "bigfile", `{}`), events.ErrorExecution, "file size limit exceeded", "no file may exceed 16777216 bytes")
			want := int64(0)
			if traced {
				want = 5
			}
			if st := r.Stats(); st.DirectLimits != want || st.Fresh != 5 {
				t.Fatalf("stats %+v: want %d calls with limits set by the runner, of 5", st, want)
			}
			wantCleanedUp(t, r, workRoot)
		})
	}
}
