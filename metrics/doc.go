// Package metrics defines toolbatch's Prometheus metrics (their names,
// labels and label values are part of the public interface: dashboards and
// alerts depend on them; docs/operations.md lists each) and serves them
// with the health endpoints. The engine's counters are derived from the
// events of each commit it appends (Engine.Committed), so that across
// engines every fact is counted once, by the engine that committed it, with
// its durations from the events' own times.
//
// Imports: events, internal/inorder, protocol, github.com/prometheus/client_golang.
package metrics
