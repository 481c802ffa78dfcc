// Package cli holds what the commands share at their edges: an error that
// carries its exit status, the status and one-line message a command's
// error ends with, and the parsing of a flag set whose help goes to
// stderr.
//
// Imports: nothing but the standard library.
package cli
