// Package client is the Go client of the toolbatch engine. It talks to the
// engine over NATS JetStream only, as a client in any other language would
// (see docs/protocol.md):
//
//   - commands are published, with a deterministic Nats-Msg-Id and a wait
//     for the stream's acknowledgement, into TOOLBATCH_INBOX:
//     Submit on <prefix>.submit.<run_id> (<prefix>.submit.<run_id>.<client>
//     with WithSubmitter, as an authenticated client user must; Resubmit
//     after a throttled refusal); Resume (and Approve, Deny,
//     ToolResult, Input) on <prefix>.resume.<run_id>[.<principal>]; Cancel,
//     Interrupt and Perform on <prefix>.control.<run_id>;
//   - what the engine publishes for a run is read from TOOLBATCH_OUT on
//     <prefix>.out.<run_id>.<kind> by Watch (every kind, in stream order,
//     from the first message the stream holds), Answer (until the answer
//     to one submission: results or refusal that name it, as Send returned
//     it) and WaitResults (until one batch's results).
//
// The client never creates streams: the engine does. Every command is
// checked before it is published with the engine's own decoder and the
// client's limits; a problem is returned as the *events.Refusal the engine
// would have published, and nothing is sent. A nil error from a command
// means the engine will read it, not that it accepted it: acceptance and
// refusal arrive as out messages. Publishing again after an error is safe:
// a retry carries the same Nats-Msg-Id and the stream drops the duplicate.
//
// SendResume and SendControl publish as Resume and the controls do and
// return where the inbox stored the command: the engine's refusal of it is
// the run's .refused message with Nats-Msg-Id
// protocol.RefusedMsgID(InboxSeq) (the console waits for it so).
//
// Infrastructure failures wrap ErrPublish or ErrWatch; an out message that
// cannot be read is a *DecodeError (ErrUndecodable), never skipped.
//
// A run of one batch:
//
//	nc, err := nats.Connect("nats://127.0.0.1:4222")
//	if err != nil { ... }
//	defer nc.Close()
//	c, err := client.New(nc) // client.WithPrefix("toolbatch") to match --prefix
//	if err != nil { ... }
//
//	s := &protocol.Submit{
//		RunID: "run-1", ThreadID: "thread-1", Step: 0,
//		Assistant: events.Message{ID: "msg-1", Content: []events.ContentBlock{
//			{Type: events.BlockToolUse, ID: "call-1", Name: "echo", Input: events.MustJSON(`{"text":"hi"}`)},
//		}},
//	}
//	sent, err := c.Send(ctx, s)
//	if err != nil {
//		// a *events.Refusal (checked locally) or ErrPublish
//	}
//	res, err := c.Answer(ctx, sent) // or both at once: c.SubmitAndWait(ctx, s)
//	switch {
//	case errors.Is(err, client.ErrRejected): // events.CodeOf(err) tells why
//	case errors.Is(err, client.ErrRunEnded):
//	case err != nil:
//	default:
//		for _, b := range res.Results { ... } // one tool_result per tool_use, in order
//	}
//
// To answer tickets, watch the run and resume each one:
//
//	w, err := c.Watch(ctx, "run-1")
//	if err != nil { ... }
//	defer w.Stop()
//	for {
//		m, err := w.Next(ctx)
//		if err != nil { ... } // a *DecodeError names the subject; Next may be called again
//		if m.Awaiting != nil && m.Awaiting.Reason == events.WaitPermission {
//			err = c.Approve(ctx, *m.Awaiting, "alice", "looks fine")
//		}
//	}
//
// Imports: events, protocol, github.com/nats-io/nats.go.
package client
