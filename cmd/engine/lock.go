package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/toolbatch/toolbatch/internal/lockfile"
)

// lockFile is the file in the store directory an engine holds locked
// while it runs its embedded server on that store: two servers writing one
// JetStream store corrupt it.
const lockFile = "toolbatch.lock"

// lockStore locks the store directory for this process (the lock ends
// with it, whatever kills it). It fails with one line naming the process
// that holds it.
func lockStore(store string) (func(), error) {
	if err := os.MkdirAll(store, 0o700); err != nil {
		return nil, fmt.Errorf("--store: %w", err)
	}
	path := filepath.Join(store, lockFile)
	f, err := lockfile.Open(path, os.O_CREATE)
	if errors.Is(err, lockfile.ErrHeld) {
		holder := "another process"
		if data, rerr := os.ReadFile(path); rerr == nil {
			if pid, perr := strconv.Atoi(strings.TrimSpace(string(data))); perr == nil {
				holder = "process " + strconv.Itoa(pid)
			}
		}
		return nil, fmt.Errorf("--store %s is in use by %s (an engine with its embedded server): stop it, or give this engine another --store", store, holder)
	}
	if err != nil {
		return nil, fmt.Errorf("--store: lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return func() { f.Close() }, nil
}
