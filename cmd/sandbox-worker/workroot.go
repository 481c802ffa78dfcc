package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/toolbatch/toolbatch/internal/lockfile"
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
	f, err := lockfile.Open(final, 0)
	created := ""
	if errors.Is(err, os.ErrNotExist) {
		created = final + "." + strconv.Itoa(os.Getpid())
		f, err = lockfile.Open(created, os.O_CREATE|os.O_TRUNC)
	}
	switch {
	case errors.Is(err, lockfile.ErrHeld):
		return nil, fmt.Errorf("--work-root %s is in use by another worker: give each worker its own --worker-id or --work-root", root)
	case err != nil:
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

// killSandboxesOf kills what is left of a gone worker's sandboxes: the
// processes of bubblewrap that name a directory under root. Killing a
// worker (kill -9) normally takes its sandboxes with it, but a sandbox
// being made at that moment can be left: bubblewrap's child, in its own
// namespaces, waiting forever for a parent that is gone. It returns how
// many it killed.
func killSandboxesOf(root string) int {
	entries, _ := os.ReadDir("/proc")
	n := 0
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		if filepath.Base(args[0]) != "bwrap" {
			continue
		}
		for _, a := range args[1:] {
			if strings.HasPrefix(a, root+"/") {
				if syscall.Kill(pid, syscall.SIGKILL) == nil {
					n++
				}
				break
			}
		}
	}
	return n
}

// sweepGoneRoots removes the default work roots under parent whose
// worker is gone (their lock is free), and what is left of their
// sandboxes; it returns how many roots.
func sweepGoneRoots(parent, own string) int {
	dirs, _ := filepath.Glob(filepath.Join(parent, defaultRootPrefix+"*"))
	n := 0
	for _, dir := range dirs {
		if dir == own {
			continue
		}
		f, err := lockfile.Open(filepath.Join(dir, rootLock), 0)
		if err != nil {
			continue // held (a live worker), or not a root a worker made
		}
		killSandboxesOf(dir)
		if os.RemoveAll(dir) == nil {
			n++
		}
		f.Close()
	}
	return n
}
