package events

// Test hooks: the two commit decoders DecodeCommit combines.
var (
	DecodeCommitFast    = func(b []byte, types []string) ([]Event, bool) { return decodeCommitFast(b, types, nil) }
	DecodeCommitReflect = decodeCommitReflect
)

// EncodeCommitAsEnvelopes encodes a commit as EncodeCommit did before it
// wrote in one pass: each event marshalled alone, then the envelopes.
func EncodeCommitAsEnvelopes(evs []Event) ([]byte, error) {
	envs := make([]envelope, len(evs))
	for i, e := range evs {
		data, err := Marshal(e)
		if err != nil {
			return nil, err
		}
		envs[i] = envelope{Type: e.EventType(), SchemaVersion: SchemaVersion, Data: data}
	}
	return Marshal(envs)
}
