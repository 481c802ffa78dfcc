// Package testproc builds this module's programs and runs them as
// processes for tests that talk to them only over NATS: build once per test
// binary, start with a wait for a log line that says the program is ready,
// kill at cleanup (with its logs printed when the test failed).
//
// Imports: nothing but the standard library.
package testproc
