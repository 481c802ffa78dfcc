package replay

import (
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"
)

func TestGCPlan(t *testing.T) {
	env := func(kv map[string]string) func(string) string {
		return func(k string) string { return kv[k] }
	}
	cases := []struct {
		name  string
		env   map[string]string
		avail uint64
		want  gcHold
	}{
		{"default", nil, 8 << 30, gcHold{off: true, limit: 4 << 30}},
		{"GOGC set", map[string]string{"GOGC": "100"}, 8 << 30, gcHold{}},
		{"GOGC off", map[string]string{"GOGC": "off"}, 8 << 30, gcHold{}},
		{"GOGC and GOMEMLIMIT set", map[string]string{"GOGC": "50", "GOMEMLIMIT": "1GiB"}, 8 << 30, gcHold{}},
		{"GOMEMLIMIT set", map[string]string{"GOMEMLIMIT": "1GiB"}, 8 << 30, gcHold{off: true, limit: -1}},
		{"memory unknown", nil, 0, gcHold{}},
	}
	for _, c := range cases {
		if got := gcPlan(env(c.env), c.avail); got != c.want {
			t.Errorf("%s: gcPlan = %+v, want %+v", c.name, got, c.want)
		}
	}
}

// writeFiles makes a file tree under a temporary root.
func writeFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for name, text := range files {
		path := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestAvailableMemory(t *testing.T) {
	const meminfo = "MemTotal:       24684084 kB\nMemFree:        17000000 kB\nMemAvailable:   20000000 kB\n"
	const avail = 20000000 << 10
	cases := []struct {
		name  string
		files map[string]string
		want  uint64
	}{
		{"no meminfo", map[string]string{}, 0},
		{"no MemAvailable", map[string]string{"proc/meminfo": "MemTotal: 1000 kB\n"}, 0},
		{"bad MemAvailable", map[string]string{"proc/meminfo": "MemAvailable: 12x kB\n"}, 0},
		{"meminfo only", map[string]string{"proc/meminfo": meminfo}, avail},
		{"cgroup v2 without a limit", map[string]string{"proc/meminfo": meminfo,
			"proc/self/cgroup": "0::/a/b\n", "sys/fs/cgroup/a/b/memory.max": "max\n",
			"sys/fs/cgroup/a/b/memory.current": "1000\n"}, avail},
		{"cgroup v2 with a limit", map[string]string{"proc/meminfo": meminfo,
			"proc/self/cgroup": "0::/a/b\n", "sys/fs/cgroup/a/b/memory.max": "4294967296\n",
			"sys/fs/cgroup/a/b/memory.current": "1073741824\n"}, 3 << 30},
		{"cgroup v2 in its own namespace", map[string]string{"proc/meminfo": meminfo,
			"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/memory.max": "2147483648\n",
			"sys/fs/cgroup/memory.current": "0\n"}, 2 << 30},
		{"cgroup v2 over its limit", map[string]string{"proc/meminfo": meminfo,
			"proc/self/cgroup": "0::/a\n", "sys/fs/cgroup/a/memory.max": "1000\n",
			"sys/fs/cgroup/a/memory.current": "2000\n"}, 0},
		{"cgroup v2 limit above what is available", map[string]string{"proc/meminfo": meminfo,
			"proc/self/cgroup": "0::/a\n", "sys/fs/cgroup/a/memory.max": "68719476736\n",
			"sys/fs/cgroup/a/memory.current": "0\n"}, avail},
		{"cgroup v1 without a limit", map[string]string{"proc/meminfo": meminfo,
			"proc/self/cgroup": "5:devices:/\n4:memory:/x\n0::/\n",
			"sys/fs/cgroup/memory/x/memory.limit_in_bytes": "9223372036854771712\n",
			"sys/fs/cgroup/memory/x/memory.usage_in_bytes": "6684090368\n"}, avail},
		{"cgroup v1 with a limit", map[string]string{"proc/meminfo": meminfo,
			"proc/self/cgroup": "5:devices:/\n4:cpuacct,memory:/x\n0::/\n",
			"sys/fs/cgroup/memory/x/memory.limit_in_bytes": "2147483648\n",
			"sys/fs/cgroup/memory/x/memory.usage_in_bytes": "1073741824\n"}, 1 << 30},
		{"cgroup v1 path not under the mount", map[string]string{"proc/meminfo": meminfo,
			"proc/self/cgroup":                           "4:memory:/elsewhere\n",
			"sys/fs/cgroup/memory/memory.limit_in_bytes": "2147483648\n",
			"sys/fs/cgroup/memory/memory.usage_in_bytes": "0\n"}, 2 << 30},
	}
	for _, c := range cases {
		if got := availableMemory(writeFiles(t, c.files)); got != c.want {
			t.Errorf("%s: availableMemory = %d, want %d", c.name, got, c.want)
		}
	}
}

// TestHoldGC checks that HoldGC turns the collector off with a limit, and
// that its release sets the target for printing and restores the limit.
func TestHoldGC(t *testing.T) {
	t.Setenv("GOGC", "")
	t.Setenv("GOMEMLIMIT", "")
	// Linux has had MemAvailable since 3.14: none here is availableMemory's
	// fault, not the machine's.
	if availableMemory("/") == 0 {
		t.Fatal("availableMemory found no memory available in /proc/meminfo")
	}
	percent := debug.SetGCPercent(150)
	defer debug.SetGCPercent(percent)
	limit := debug.SetMemoryLimit(-1)
	release := HoldGC()
	if got := debug.SetGCPercent(-1); got != -1 {
		t.Errorf("GC percent while held = %d, want -1 (off)", got)
	}
	if got := debug.SetMemoryLimit(-1); got == limit || got <= 0 {
		t.Errorf("memory limit while held = %d, want a limit of its own (before: %d)", got, limit)
	}
	release()
	if got := debug.SetGCPercent(150); got != printGCPercent {
		t.Errorf("GC percent after release = %d, want %d", got, printGCPercent)
	}
	if got := debug.SetMemoryLimit(-1); got != limit {
		t.Errorf("memory limit after release = %d, want %d", got, limit)
	}
}
