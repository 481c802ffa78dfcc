package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/toolbatch/toolbatch/audit"
	"github.com/toolbatch/toolbatch/internal/cli"
	"github.com/toolbatch/toolbatch/proof"
	"github.com/toolbatch/toolbatch/replay"
)

// cmdAudit feeds the events stream, then the out stream, to the auditor
// and prints each violation on its own line, then a summary line. It
// returns errViolations (exit status 1) when an invariant does not hold.
func cmdAudit(ctx context.Context, o *options, stdout, stderr io.Writer) error {
	src, closeSrc, err := openSource(o, o.outFile)
	if err != nil {
		return err
	}
	defer closeSrc()
	var keys *proof.Keyring
	if o.keys != "" {
		if keys, err = proof.LoadKeys(o.keys); err != nil {
			return err
		}
	}
	var cps []proof.Checkpoint
	if o.checkpts != "" {
		if o.run != "" {
			return usageErrorf("--checkpoint covers the whole stream: it does not go with --run")
		}
		if cps, err = readCheckpoints(o.checkpts); err != nil {
			return err
		}
	} else if ns, ok := src.(*replay.NATSSource); ok && o.run == "" {
		// from NATS, the latest checkpoint the engines published
		cp, found, err := ns.LatestCheckpoint(ctx)
		if err != nil {
			return err
		}
		if found {
			cps = []proof.Checkpoint{cp}
		}
	}
	prog := newProgress(stderr)
	rep, err := replay.Audit(ctx, src, o.prefix, o.sel, keys, cps, prog.add)
	if err != nil {
		return err
	}
	prog.done()
	if o.run != "" && rep.Runs == 0 {
		return cli.Errorf(1, "audit --run %s: the log has no commit of that run: nothing was audited (check the run id, --prefix and the source)", o.run)
	}
	vs := rep.Violations
	s := summary{Type: "summary", OK: len(vs) == 0, Violations: len(vs), Runs: rep.Runs, Commits: prog.msgs,
		Events: prog.events, OutMessages: rep.OutMessages, OutChecked: rep.OutChecked}
	if !rep.OutChecked {
		s.OutNote = "invariant 8 not checked (no out stream: --out-file)"
	}
	s.Signed, s.Unsigned, s.Checkpoints, s.SigNote = rep.Proofs.Signed, rep.Proofs.Unsigned, rep.Proofs.Checkpoints, signatureNote(rep.Proofs)
	if err := printAudit(stdout, vs, s, o.json); err != nil {
		return err
	}
	if len(vs) > 0 {
		return errViolations
	}
	return nil
}

// readCheckpoints reads a file of checkpoints, one JSON object per line
// (blank lines and lines starting with # skipped).
func readCheckpoints(path string) ([]proof.Checkpoint, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--checkpoint: %w", err)
	}
	var cps []proof.Checkpoint
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		cp, err := proof.DecodeCheckpoint([]byte(line))
		if err != nil {
			return nil, fmt.Errorf("--checkpoint %s:%d: %w", path, i+1, err)
		}
		cps = append(cps, cp)
	}
	if len(cps) == 0 {
		return nil, fmt.Errorf("--checkpoint %s: no checkpoint in it", path)
	}
	return cps, nil
}

// summary is the audit's last line.
type summary struct {
	Type        string `json:"type"` // "summary"
	OK          bool   `json:"ok"`
	Violations  int    `json:"violations"`
	Runs        int    `json:"runs"`
	Commits     int    `json:"commits"`
	Events      int    `json:"events"`
	OutMessages int    `json:"out_messages"`
	OutChecked  bool   `json:"out_checked"`        // false: invariant 8 was not checked
	OutNote     string `json:"out_note,omitempty"` // why not
	Signed      int    `json:"signed"`             // commits with a signature
	Unsigned    int    `json:"unsigned"`           // commits without one
	Checkpoints int    `json:"checkpoints"`        // checkpoints the log was compared with
	SigNote     string `json:"signature_note,omitempty"`
}

// signatureNote says what invariant 9's check could not cover: a log
// without signatures (written before engines signed, or with --unsigned),
// commits from before signing began, signatures not verified without
// pinned keys.
func signatureNote(p audit.Proofs) string {
	switch {
	case p.Signed == 0 && p.Unsigned > 0:
		return "unsigned log: no commit is signed (written before engines signed, or by engines run --unsigned); invariant 9 not checked"
	case !p.Verified && p.Signed > 0:
		return "signatures not verified (no --keys): only the runs' hash chains were checked"
	case p.Unsigned > 0:
		return fmt.Sprintf("%d commit%s before the first signed one written unsigned", p.Unsigned, plural(p.Unsigned))
	}
	return ""
}

func (s summary) String() string {
	var head string
	if s.OK {
		head = "audit: every invariant holds"
	} else {
		head = fmt.Sprintf("audit: %d violation%s", s.Violations, plural(s.Violations))
	}
	line := fmt.Sprintf("%s: %d run%s, %d event%s in %d commit%s, %d out message%s", head, s.Runs, plural(s.Runs),
		s.Events, plural(s.Events), s.Commits, plural(s.Commits), s.OutMessages, plural(s.OutMessages))
	if s.OutNote != "" {
		line += "; " + s.OutNote
	}
	if s.Checkpoints > 0 {
		line += fmt.Sprintf("; compared with %d checkpoint%s", s.Checkpoints, plural(s.Checkpoints))
	}
	if s.SigNote != "" {
		line += "; " + s.SigNote
	}
	return line
}

// violationLine is a violation as a JSON line.
type violationLine struct {
	Type      string `json:"type"` // "violation"
	Seq       uint64 `json:"seq"`
	Run       string `json:"run,omitempty"`
	Batch     string `json:"batch,omitempty"`
	Call      string `json:"call,omitempty"`
	Invariant string `json:"invariant"`
	Detail    string `json:"detail"`
}

func printAudit(w io.Writer, vs []audit.Violation, s summary, asJSON bool) error {
	bw := bufio.NewWriter(w)
	if asJSON {
		enc := json.NewEncoder(bw)
		enc.SetEscapeHTML(false)
		for _, v := range vs {
			if err := enc.Encode(violationLine{Type: "violation", Seq: v.Seq, Run: v.Run, Batch: v.Batch, Call: v.Call,
				Invariant: v.Invariant, Detail: v.Detail}); err != nil {
				return err
			}
		}
		if err := enc.Encode(s); err != nil {
			return err
		}
		return bw.Flush()
	}
	for _, v := range vs {
		fmt.Fprintln(bw, strings.ReplaceAll(v.String(), "\n", " "))
	}
	fmt.Fprintln(bw, s.String())
	return bw.Flush()
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
