package events

// Test hooks: the two commit decoders DecodeCommit combines.
var (
	DecodeCommitFast    = func(b []byte, types []string) ([]Event, bool) { return decodeCommitFast(b, types, nil) }
	DecodeCommitReflect = decodeCommitReflect
)
