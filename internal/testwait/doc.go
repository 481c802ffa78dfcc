// Package testwait polls, in tests, for a condition that another process
// or goroutine makes true, with the test's deadline: never a sleep that
// hopes the condition holds by then.
//
// Imports: nothing but the standard library.
package testwait
