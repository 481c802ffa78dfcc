// Package proof makes toolbatch's event log prove itself: what an engine's
// signature covers, how commits are signed in batches, how a run's commits
// chain, the head of the whole stream that checkpoints sign, and the
// keyring that auditors pin. It does no IO and reads no clock: the engine
// signs with it, the projector and replay audit verify with it.
//
// # A commit
//
// A commit's hash (Commit.Hash) is SHA-256 over a domain tag and, each
// preceded by its length, the subject, the previous commit's sequence
// (Toolbatch-Prev) and hash (Toolbatch-Prev-Hash), the signer's public key
// (Toolbatch-Signer), the event type names (Toolbatch-Event, in order) and
// the body. So the subject (its run), the place in the run's chain, the
// signer and every byte of the events are covered; a run's commits are a
// hash chain from its first commit, whose previous hash is ZeroHash.
//
// # Signed in batches
//
// An engine signs many commits with one ed25519 signature: the commits
// that are ready while the previous signature is made (Signer.Seal) are
// the leaves of a Merkle tree (RFC 9162 §2.1: leaf 0x00||hash, node
// 0x01||left||right), and the signature covers the tree's root. Each
// commit carries the signature and its audit path (Seal), so each commit
// is verified on its own, as if signed alone: a verifier recomputes the
// root from the commit's hash and the path, and checks the signature of
// that root (Keyring caches roots it has verified). An idle engine signs
// each commit alone; a busy one signs as many as are waiting.
//
// # The stream's head and checkpoints
//
// Head folds every message of the events stream in stream order: its
// sequence, its commit hash and its signature headers. A Checkpoint is a
// signed head at a sequence: any message dropped, inserted, moved,
// altered or stripped of its signature before that sequence, in any run,
// changes the head.
//
// Imports: protocol, github.com/nats-io/nkeys, go.yaml.in/yaml/v3.
package proof
