package replay

import (
	"context"

	"github.com/toolbatch/toolbatch/audit"
	"github.com/toolbatch/toolbatch/proof"
)

// AuditReport is what an audit of a recorded log found.
type AuditReport struct {
	Violations  []audit.Violation
	Runs        int // runs with events
	OutMessages int // out messages checked against the events
	// OutChecked is false when there was no out stream to read (a file
	// source without its out file): invariant 8 was not checked.
	OutChecked bool
	// Proofs is what the audit saw of the log's signatures.
	Proofs audit.Proofs
}

// Audit feeds the selected events, then the out messages derived from
// them, to an auditor of the prefix's subjects, and reports its
// violations. Out messages derived from commits stored after the events
// were read are left out. each, when not nil, sees every events message
// as it is read (progress).
func Audit(ctx context.Context, src Source, prefix string, sel Selection, keys *proof.Keyring, cps []proof.Checkpoint, each func(*Message)) (AuditReport, error) {
	a := audit.New(prefix)
	a.Keys(keys)
	a.Checkpoints(cps)
	var lastEvent uint64
	err := src.Read(ctx, EventsStream, sel, true, func(m *Message) error {
		if each != nil {
			each(m)
		}
		evs, err := m.Commit()
		a.EventDecoded(m.WithHeaders(), evs, err)
		lastEvent = m.Seq
		return nil
	})
	if err != nil {
		return AuditReport{}, err
	}
	rep := AuditReport{OutChecked: true}
	err = src.Read(ctx, OutStream, sel, false, func(m *Message) error {
		if DerivedAfter(m.Record, lastEvent) {
			return nil // derived from a commit stored after the events were read
		}
		rep.OutMessages++
		a.Out(m.Record)
		return nil
	})
	if err != nil {
		return AuditReport{}, err
	}
	// The out stream was read (even empty) unless a file source has none.
	if fs, ok := src.(*FileSource); ok && !fs.HasOut() {
		rep.OutChecked = false
	} else {
		a.OutRead()
	}
	rep.Violations = a.Finish()
	rep.Runs = len(a.Runs())
	rep.Proofs = a.Proofs()
	return rep, nil
}
