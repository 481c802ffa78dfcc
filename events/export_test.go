package events

// Test hooks: the two commit decoders DecodeCommit combines.
var (
	DecodeCommitFast    = decodeCommitFast
	DecodeCommitReflect = decodeCommitReflect
)
