package sandbox

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// Whether the sandbox's user can reach the host paths a sandbox binds:
// when the worker runs as root each tool runs as a user of its own, so a
// work root or a mount under a private directory (a TMPDIR of mode 0700,
// /run/user/<uid>) would fail every call with bubblewrap's "Can't find
// source path". The worker checks at start and says so in one line.

// Permission bits of reach.
const (
	mayRead  = 4
	mayWrite = 2
	mayEnter = 1
)

// reach reports why the user uid:gid cannot reach path with the access
// want (bits of mayRead, mayWrite, mayEnter) after entering every
// directory above it; nil when it can.
func reach(path string, uid, gid int, want uint32) error {
	path = filepath.Clean(path)
	for dir := filepath.Dir(path); ; dir = filepath.Dir(dir) {
		if err := allows(dir, uid, gid, mayEnter); err != nil {
			return err
		}
		if dir == "/" || dir == "." {
			break
		}
	}
	return allows(path, uid, gid, want)
}

func allows(path string, uid, gid int, want uint32) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	mode := st.Mode & 0o777
	var have uint32
	switch {
	case int(st.Uid) == uid:
		have = mode >> 6
	case int(st.Gid) == gid:
		have = mode >> 3 & 7
	default:
		have = mode & 7
	}
	if have&want != want {
		return fmt.Errorf("%s is mode %04o, owner %d: the sandbox's user (uid %d) cannot %s it", path, mode, st.Uid, uid, verb(want))
	}
	return nil
}

func verb(want uint32) string {
	switch {
	case want&mayWrite != 0:
		return "write"
	case want&mayRead != 0:
		return "read"
	}
	return "enter"
}

// DefaultWorkParent is where a worker that names no work root makes its
// own: the system temp directory when the sandbox's user can enter it,
// else /var/tmp or /tmp (a private TMPDIR, say, of mode 0700).
func DefaultWorkParent() string {
	if os.Geteuid() != 0 {
		return os.TempDir() // the sandbox runs as the worker's own user
	}
	for _, dir := range []string{os.TempDir(), "/var/tmp", "/tmp"} {
		if reach(dir, DefaultSandboxUID, DefaultSandboxGID, mayEnter) == nil {
			return dir
		}
	}
	return os.TempDir()
}
