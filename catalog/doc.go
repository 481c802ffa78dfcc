// Package catalog is the operator's tool catalog and gate policy: which tools
// exist, where and how each runs, what recovery each may use, and the rules
// that gate every call. It is the trusted side of every call: nothing here is
// ever taken from a model or a submitted batch.
//
// A catalog is a YAML document (docs/catalog.md describes it for operators).
// Parse decodes it strictly, so an unknown key is an error, and validates
// all of it: every problem is reported at once, each as a *ProblemError that
// names the tool or rule and the line (`tools[2] (id "rm"): target "cloud"
// is not brain or sandbox`). Every CEL expression is compiled and
// type-checked at parse time, so a bad rule is a startup error, never a
// surprise at the first call.
//
// The engine uses a catalog in three places:
//
//  1. At submit, Descriptor pins each call's target, kind, pool and recovery
//     policy into BatchSubmitted, together with SnapshotID.
//  2. When a call's turn comes, Evaluate is stage b of the gate chain
//     (contract.md §3.3): (a) the run's narrowing (deny_all blocks), (b) the
//     policy rules, first match wins, (c) the external gate service of
//     External, (d) allow. A when expression that fails to evaluate blocks
//     the call with "policy error: ..." (fail closed).
//  3. The engine keeps Raw under SnapshotID, so that a batch pinned to an
//     older catalog is still gated by the rules it was submitted under after
//     the file changed: parsing the same bytes gives the same catalog and
//     the same snapshot id.
//
// The package is pure: Parse does no IO (Load is the one function that reads
// a file), and Evaluate reads no clock: the time arrives as an argument.
// A Catalog is immutable and safe for concurrent use.
//
// Imports: events, internal/located, cel.dev/cel-go,
// github.com/google/jsonschema-go, go.yaml.in/yaml/v3.
package catalog
