package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// The default work roots: <parent>/toolbatch-worker-<worker id>, each
// holding a lock file its worker holds while it runs. A worker started
// without --work-root removes the default roots of workers that are gone
// (killed: their lock is free), so that roots named by a pid do not pile
// up on a machine.
const (
	defaultRootPrefix = "toolbatch-worker-"
	rootLock          = ".toolbatch-worker.lock"
)

// holdRoot locks a work root for this process (the lock ends with it). A
// new lock file is locked under a name of its own first and then renamed,
// so that another worker's sweep never finds it unlocked.
func holdRoot(root string) (func(), error) {
	final := filepath.Join(root, rootLock)
	f, err := os.OpenFile(final, os.O_RDWR, 0)
	created := ""
	if errors.Is(err, os.ErrNotExist) {
		created = final + "." + strconv.Itoa(os.Getpid())
		f, err = os.OpenFile(created, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	}
	if err != nil {
		return nil, fmt.Errorf("--work-root %s: %w", root, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("--work-root %s is in use by another worker: give each worker its own --worker-id or --work-root", root)
		}
		return nil, fmt.Errorf("--work-root %s: lock: %w", root, err)
	}
	if created != "" {
		if err := os.Rename(created, final); err != nil {
			f.Close()
			os.Remove(created)
			return nil, fmt.Errorf("--work-root %s: %w", root, err)
		}
	}
	return func() { f.Close() }, nil
}

// sweepGoneRoots removes the default work roots under parent whose
// worker is gone; it returns how many.
func sweepGoneRoots(parent, own string) int {
	dirs, _ := filepath.Glob(filepath.Join(parent, defaultRootPrefix+"*"))
	n := 0
	for _, dir := range dirs {
		if dir == own || !strings.HasPrefix(filepath.Base(dir), defaultRootPrefix) {
			continue
		}
		f, err := os.OpenFile(filepath.Join(dir, rootLock), os.O_RDWR, 0)
		if err != nil {
			continue // not a root a worker made (or not ours to open)
		}
		free := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil
		if free && os.RemoveAll(dir) == nil {
			n++
		}
		f.Close()
	}
	return n
}
