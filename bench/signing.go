package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/nats-io/nkeys"

	"github.com/toolbatch/toolbatch/proof"
	"github.com/toolbatch/toolbatch/protocol"
	"github.com/toolbatch/toolbatch/replay"
)

// W3 signed: what verifying signatures costs an audit. The W3 stream,
// shorter, written twice: as the engine writes it with --unsigned, and
// signed and chained as a signing engine writes it, each commit signed
// alone (an idle engine; a busy one signs several commits with one
// signature, which the audit then verifies once). Both are audited with
// replay audit --file, the signed one with --keys.

// W3Signing is the signed audit benchmark.
type W3Signing struct {
	Events           int    `json:"events"`
	Commits          int    `json:"commits"`
	UnsignedAuditEPS Num    `json:"unsigned_audit_events_per_s"`
	SignedAuditEPS   Num    `json:"signed_audit_events_per_s"`
	Ratio            Num    `json:"signed_over_unsigned"`
	Command          string `json:"command"`
}

func runW3Signing(ctx context.Context, replayBin, dir string, target, stepsPerRun, reps int) (W3Signing, error) {
	res := W3Signing{Command: "replay audit --file UNSIGNED; replay audit --file SIGNED --keys KEYS (median of --reps each, alternating)"}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return res, err
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		return res, err
	}
	signer, err := proof.NewSigner(kp)
	if err != nil {
		return res, err
	}
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	go signer.Run(sctx)
	keys := filepath.Join(dir, "keys.yaml")
	if err := os.WriteFile(keys, proof.Format([]proof.Key{{Key: signer.Key(), Name: "bench"}}), 0o644); err != nil {
		return res, err
	}
	paths := [2]string{filepath.Join(dir, "unsigned.jsonl"), filepath.Join(dir, "signed.jsonl")}
	var files [2]*os.File
	var bufs [2]*bufio.Writer
	var encs [2]*json.Encoder
	for i, p := range paths {
		if files[i], err = os.Create(p); err != nil {
			return res, err
		}
		defer files[i].Close()
		bufs[i] = bufio.NewWriterSize(files[i], 4<<20)
		encs[i] = json.NewEncoder(bufs[i])
		encs[i].SetEscapeHTML(false)
	}
	last := map[string]proof.Hash{} // each run's last commit hash
	res.Events, res.Commits, _, err = generate(target, stepsPerRun, func(c genCommit) error {
		rec := replay.ExportRecord{Seq: c.seq, Subject: c.subject, Time: c.time, Headers: c.headers, Data: c.body}
		if err := encs[0].Encode(rec); err != nil {
			return err
		}
		var prev uint64
		fmt.Sscan(c.headers[protocol.HeaderPrev][0], &prev)
		pc := proof.Commit{Subject: c.subject, Prev: prev, PrevHash: last[c.subject], Signer: signer.Key(),
			Types: c.headers[protocol.HeaderEvent], Body: c.body}
		hash := pc.Hash()
		seal, err := signer.Seal(ctx, hash)
		if err != nil {
			return err
		}
		last[c.subject] = hash
		sig, path := seal.Headers()
		h := map[string][]string{protocol.HeaderPrevHash: {pc.PrevHash.String()}, protocol.HeaderSigner: {pc.Signer},
			protocol.HeaderSig: {sig}, protocol.HeaderSigProof: {path}}
		for k, v := range c.headers {
			h[k] = v
		}
		rec.Headers = h
		return encs[1].Encode(rec)
	})
	if err != nil {
		return res, err
	}
	for _, b := range bufs {
		if err := b.Flush(); err != nil {
			return res, err
		}
	}
	var rates [2][]float64
	for r := 0; r < reps; r++ {
		for i, args := range [][]string{{"audit", "--file", paths[0]}, {"audit", "--file", paths[1], "--keys", keys}} {
			n, rate, _, err := runReplay(replayBin, args...)
			if err != nil {
				return res, err
			}
			if n != res.Events {
				return res, fmt.Errorf("%v read %d events, want %d", args, n, res.Events)
			}
			rates[i] = append(rates[i], rate)
		}
	}
	res.UnsignedAuditEPS, res.SignedAuditEPS = Num(median(rates[0])), Num(median(rates[1]))
	res.Ratio = Num(median(rates[1]) / median(rates[0]))
	return res, nil
}

// w3SignedEvents bounds the signed audit's stream: every commit is signed
// alone, which takes a while.
const w3SignedEvents = 200_000
