// Package lockfile holds files locked by this process, the kernel's way
// (flock): a lock ends with its process, however it ends, so that a
// killed program's lock is free at once.
//
// Imports: golang.org/x/sys/unix.
package lockfile
