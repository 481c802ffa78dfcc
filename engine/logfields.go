package engine

// Log field names, defined once.
const (
	fieldRunID     = "run_id"
	fieldBatchID   = "batch_id"
	fieldCallID    = "call_id"
	fieldStreamSeq = "stream_seq"
	fieldSubject   = "subject"
)
