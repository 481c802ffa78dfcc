// Command gen writes events/fastdecode_gen.go, the mechanical part of the
// fast commit decoder of package events: the switch from an event type to
// its read, one read method per struct (a switch over its msgpack keys),
// and the symbol table; and events/fastencode_gen.go, the fast commit
// encoder's writes: per struct, its map of fields in their order, each
// written with the encoder's method for its type, an omitempty field only
// when the library would find it not empty (encode.go). It reads them from
// the package's source (go/ast, no type checking):
//
//  1. The event types are the EventType methods: the receiver is the
//     struct, the constant it returns the registered name.
//  2. A struct's fields are read by their msgpack tag names, each with the
//     hand-written read of fastdecode.go that its Go type names (reads
//     below); a field of a struct type, a pointer to one or a slice of
//     them calls that struct's generated read.
//  3. The symbol table holds the values of the string constants whose
//     type a field holds, the values of the untyped constants named after a
//     symbol field (Stage* for CallGated.Stage), and a few more that
//     repeat (extraSymbols).
//
// A field of a type it has no read or write for is an error, never a
// guess, and so is an omitempty field of a type with an IsZero method:
// generation stops and names the field. Run it with go generate in
// events; events/internal/gen's test fails when the file on disk differs
// from what it writes.
//
// The reads are switches, not tables of per-field functions: a table
// (tried first) read the benchmark's commits with about 16% more
// instructions, and the W3 replay about 7% slower, as its func values move
// the cursor to the heap and its keys are compared by memequal rather
// than as constants.
//
// Imports: nothing but the standard library.
package main
