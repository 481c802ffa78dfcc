package replay

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
)

// The garbage collector while the history is read. The history keeps every
// event it reads, so nearly all of the heap is live while the stream is
// folded, and each collection marks all of it again to find little to
// free: about a quarter of the CPU of a long read at GOGC=300. So the read
// runs with the collector off and a memory limit as the safety net:
// nothing is collected until the heap reaches the limit, and then only as
// much as keeping under it takes. Printing then runs with the collector's
// default target (printGCPercent).
//
// The cost is memory: the read's garbage (the records and headers of the
// messages, the aggregate's copies) is not given back until the read ends,
// so the heap peaks at everything the read allocated (about 1.5 times what
// it keeps), unless that reaches the limit first.

// memoryShare is the share of the memory available when the read starts
// (the smaller of the system's and the memory cgroup's) that the limit
// allows.
const memoryShare = 0.5

// printGCPercent is the collector's target after a held read (GOGC=100,
// the runtime's default): printing allocates much that it drops at once,
// on one goroutine, so the collector works on another core while the heap
// stays near twice what the history keeps. On W3's stream (1,000,000
// events) the process peaked at 1.05 GB with it and at 1.73 GB with 300,
// in the same wall time.
const printGCPercent = 100

// gcHold is what HoldGC decided.
type gcHold struct {
	off   bool  // the collector is off during the read
	limit int64 // the memory limit during the read (bytes), when off
}

// gcPlan decides the collector's setting for the read: off, with the
// memory limit GOMEMLIMIT gives or else memoryShare of available; left
// alone when GOGC is set (the user decides), or when GOMEMLIMIT is not set
// and available is unknown (0).
func gcPlan(getenv func(string) string, available uint64) gcHold {
	if getenv("GOGC") != "" {
		return gcHold{}
	}
	if getenv("GOMEMLIMIT") != "" {
		return gcHold{off: true, limit: -1} // the runtime already has it
	}
	if available == 0 {
		return gcHold{}
	}
	return gcHold{off: true, limit: int64(float64(available) * memoryShare)}
}

// HoldGC turns the process's garbage collector off for a read that keeps
// what it reads, such as a History's (see gcPlan), and returns the function
// that ends that: it sets the target to printGCPercent and the memory limit
// back to what it was. It changes settings of the whole process: it is for
// a program's main path.
func HoldGC() (release func()) {
	p := gcPlan(os.Getenv, availableMemory("/"))
	if !p.off {
		return func() {}
	}
	debug.SetGCPercent(-1)
	limit := debug.SetMemoryLimit(p.limit) // a negative limit only reads it
	return func() {
		debug.SetGCPercent(printGCPercent)
		debug.SetMemoryLimit(limit)
	}
}

// availableMemory returns, in bytes, the memory this process can take
// without swapping: /proc/meminfo's MemAvailable, or less when the memory
// cgroup (v2, else v1) of the process has a limit; 0 when MemAvailable is
// unknown. root is the file system's root ("/"; tests give another).
func availableMemory(root string) uint64 {
	avail := meminfoAvailable(filepath.Join(root, "proc/meminfo"))
	if avail == 0 {
		return 0
	}
	if left, ok := cgroupLeft(root); ok && left < avail {
		return left
	}
	return avail
}

// meminfoAvailable reads MemAvailable (in kB) from a meminfo file.
func meminfoAvailable(path string) uint64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "MemAvailable:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0
		}
		kb, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return 0
		}
		return kb << 10
	}
	return 0
}

// cgroupLeft returns what the memory cgroup of the process allows beyond
// what it uses, when it has a limit: cgroup v2's memory.max less
// memory.current, or v1's memory.limit_in_bytes less memory.usage_in_bytes.
// The cgroup's directory is looked for under the mount by the path
// /proc/self/cgroup names, else at the mount itself (a container's own
// namespace shows its cgroup there).
func cgroupLeft(root string) (uint64, bool) {
	b, err := os.ReadFile(filepath.Join(root, "proc/self/cgroup"))
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		var mount, limitFile, usageFile string
		switch {
		case parts[0] == "0" && parts[1] == "":
			mount, limitFile, usageFile = "sys/fs/cgroup", "memory.max", "memory.current"
		case hasController(parts[1], "memory"):
			mount, limitFile, usageFile = "sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes"
		default:
			continue
		}
		for _, dir := range []string{filepath.Join(root, mount, parts[2]), filepath.Join(root, mount)} {
			limit, found := readBytes(filepath.Join(dir, limitFile))
			if !found {
				continue
			}
			if limit == 0 {
				break // the cgroup has no limit
			}
			used, _ := readBytes(filepath.Join(dir, usageFile))
			if used >= limit {
				return 0, true
			}
			return limit - used, true
		}
	}
	return 0, false
}

// hasController reports whether a cgroup v1 line's controller list names c.
func hasController(list, c string) bool {
	for _, x := range strings.Split(list, ",") {
		if x == c {
			return true
		}
	}
	return false
}

// readBytes reads a cgroup file holding a number of bytes, and reports
// whether the file is there. "max" (no limit), or a value no real machine
// has (cgroup v1 writes about 2^63 for no limit), reads as 0.
func readBytes(path string) (uint64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || n >= 1<<62 {
		return 0, true
	}
	return n, true
}
