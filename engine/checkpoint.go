package engine

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/proof"
	"github.com/toolbatch/toolbatch/protocol"
)

// checkpointer folds the head of the whole events stream (proof.Head) and
// publishes it, signed, on the checkpoints stream: every
// Config.CheckpointEvery and whenever someone asks on
// <prefix>.api.checkpoint. One engine at a time does it (the key
// "checkpointer" of the owners bucket, taken like a run's key).
// It resumes from its own last checkpoint when that verifies with its own
// key, and otherwise folds the stream from its first message.
type checkpointer struct {
	e      *Engine
	keys   *proof.Keyring // the engine's own key: which checkpoints it may resume from
	head   proof.Head
	last   proof.Checkpoint
	loaded bool
}

func (e *Engine) runCheckpoints(ctx context.Context) error {
	s := e.cfg.Signer
	if s == nil || e.cfg.CheckpointEvery < 0 {
		return nil
	}
	keys, err := proof.NewKeyring([]proof.Key{{Key: s.Key()}})
	if err != nil {
		return err
	}
	c := &checkpointer{e: e, keys: keys}
	asks := make(chan *nats.Msg, 16)
	sub, err := e.nc.Subscribe(e.names.CheckpointRequest(), func(m *nats.Msg) {
		select {
		case asks <- m:
		default: // many at once: those waiting get the next checkpoint
		}
	})
	if err != nil {
		return fmt.Errorf("checkpoint requests: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	lead := &leader{e: e, key: protocol.CheckpointerLeaderKey}
	defer lead.resign()
	tick := time.NewTicker(e.cfg.CheckpointEvery)
	defer tick.Stop()
	for {
		var ask *nats.Msg
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case ask = <-asks:
		}
		if !lead.hold(ctx) {
			c.loaded = false // another engine checkpoints; it answers the requests
			continue
		}
		cp, err := c.advance(ctx)
		if err != nil {
			e.log.Warn().Err(err).Str(protocol.FieldMeaning, protocol.Meaning(err)).Msg("checkpoint not made; trying again at the next")
			c.loaded = false
		}
		if ask != nil && ask.Reply != "" {
			if err != nil {
				_ = ask.Respond([]byte(`{"error":` + strconv.Quote(err.Error()) + `}`))
			} else {
				_ = ask.Respond(cp.Encode())
			}
		}
	}
}

// advance folds the events stream up to its last message and publishes a
// checkpoint there when the head moved.
func (c *checkpointer) advance(ctx context.Context) (proof.Checkpoint, error) {
	ctx, cancel := context.WithTimeout(ctx, checkpointTimeout)
	defer cancel()
	e := c.e
	if !c.loaded {
		c.head, c.last = proof.Head{}, proof.Checkpoint{}
		st, err := e.js.Stream(ctx, e.names.CheckpointsStream())
		if err != nil {
			return proof.Checkpoint{}, fmt.Errorf("checkpoints stream: %w", err)
		}
		if m, err := st.GetLastMsgForSubject(ctx, e.names.Checkpoint()); err == nil {
			if cp, err := proof.DecodeCheckpoint(m.Data); err == nil && c.keys.VerifyCheckpoint(cp) == nil {
				h, _ := proof.ParseHash(cp.Head)
				c.head, c.last = proof.Head{Seq: cp.Seq, Commits: cp.Commits, Hash: h}, cp
			}
		} else if !errors.Is(err, jetstream.ErrMsgNotFound) {
			return proof.Checkpoint{}, fmt.Errorf("read the last checkpoint: %w", err)
		}
		c.loaded = true
	}
	info, err := e.events.stream.Info(ctx)
	if err != nil {
		return proof.Checkpoint{}, fmt.Errorf("events stream: %w", err)
	}
	last := info.State.LastSeq
	if last > c.head.Seq {
		err := protocol.ReadOrdered(ctx, e.js, e.names.EventsStream(), protocol.ReadOptions{FromSeq: c.head.Seq + 1, UpTo: last},
			func(m jetstream.Msg, meta *jetstream.MsgMetadata) error {
				c.head.AddMessage(meta.Sequence.Stream, proof.Message{Subject: m.Subject(), Header: m.Headers(), Body: m.Data()})
				return nil
			})
		if err != nil {
			return proof.Checkpoint{}, fmt.Errorf("fold the events stream: %w", err)
		}
	}
	if c.head.Seq == 0 || c.head.Seq == c.last.Seq {
		return c.last, nil
	}
	cp, err := e.cfg.Signer.SignCheckpoint(proof.NewCheckpoint(e.names.EventsStream(), c.head, e.cfg.Now()))
	if err != nil {
		return proof.Checkpoint{}, err
	}
	msg := nats.NewMsg(e.names.Checkpoint())
	msg.Data = cp.Encode()
	if _, err := e.js.PublishMsg(ctx, msg, jetstream.WithMsgID("checkpoint/"+strconv.FormatUint(cp.Seq, 10))); err != nil {
		return proof.Checkpoint{}, fmt.Errorf("publish checkpoint: %w", err)
	}
	c.last = cp
	e.log.Info().Uint64(fieldStreamSeq, cp.Seq).Str("head", cp.Head).Msg("checkpoint published")
	return cp, nil
}

// checkpointTimeout bounds one checkpoint (folding what the stream gained
// since the last one).
const checkpointTimeout = 5 * time.Minute
