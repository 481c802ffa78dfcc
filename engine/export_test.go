package engine

// Test hooks for the engine_test package.

// AppendUnprojected appends a run's first commit, a rejection, as an
// engine would, and projects nothing of it.
var AppendUnprojected = appendUnprojected
