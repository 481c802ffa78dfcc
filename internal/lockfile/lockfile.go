package lockfile

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// ErrHeld is returned when another process holds the lock.
var ErrHeld = errors.New("held by another process")

// Open opens path with flag (os.O_CREATE to make it) and locks it without
// waiting: ErrHeld when another process holds it. The lock lasts until the
// file is closed or the process ends.
func Open(path string, flag int) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|flag, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, ErrHeld
		}
		return nil, err
	}
	return f, nil
}
