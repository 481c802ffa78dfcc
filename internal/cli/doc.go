// Package cli holds what the commands share at their edges: an error that
// carries its exit status, the status and one-line message a command's
// error ends with, the parsing of a flag set whose help goes to stderr,
// and the logging flags.
//
// Imports: github.com/rs/zerolog, golang.org/x/sys/unix.
package cli
