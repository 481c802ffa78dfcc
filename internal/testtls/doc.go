// Package testtls writes a fresh test PKI (a CA, a server certificate for
// 127.0.0.1 and a client certificate) for tests that run NATS over real
// TLS and mutual TLS.
//
// Imports: nothing but the standard library.
package testtls
