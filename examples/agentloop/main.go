package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbatch/toolbatch/client"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/protocol"
)

func main() {
	url := flag.String("nats-url", nats.DefaultURL, "the engine's NATS")
	run := flag.String("run", fmt.Sprintf("agentloop-%d", time.Now().Unix()), "run id")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	nc, err := nats.Connect(*url)
	if err != nil {
		fmt.Fprintln(os.Stderr, "agentloop:", err)
		os.Exit(1)
	}
	defer nc.Close()
	c, err := client.New(nc)
	if err != nil {
		fmt.Fprintln(os.Stderr, "agentloop:", err)
		os.Exit(1)
	}
	if _, err := Loop(ctx, c, *run, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "agentloop:", err)
		os.Exit(1)
	}
}

// format is a model provider's message format.
type format int

const (
	anthropic format = iota
	openAIChat
)

// reply is one answer of the scripted model: a provider message, in its
// format, or a final text (no calls: the loop ends).
type reply struct {
	format  format
	message string
	final   string
}

// model is the scripted model: it reads what the previous turn's results
// said (in its own format, as a real model would) and answers.
func model(step int, heard []string) reply {
	switch step {
	case 1:
		// Anthropic, with extended thinking: an echo and an email, which a
		// person must confirm.
		return reply{format: anthropic, message: `{"id":"msg_01","type":"message","role":"assistant","model":"scripted",
			"stop_reason":"tool_use","content":[
			{"type":"thinking","thinking":"Check the channel, then tell ops.","signature":"c2NyaXB0ZWQ="},
			{"type":"text","text":"Let me check and notify ops.","citations":null},
			{"type":"tool_use","id":"toolu_01","name":"echo","input":{"text":"ping"}},
			{"type":"tool_use","id":"toolu_02","name":"send_email","input":{"to":"ops@example.com","subject":"deploy"}}]}`}
	case 2:
		// OpenAI Chat Completions: the user is asked something (a client
		// tool), and one call's arguments are cut off.
		return reply{format: openAIChat, message: `{"role":"assistant","content":null,"tool_calls":[
			{"id":"call_1","type":"function","function":{"name":"ask_user","arguments":"{\"question\":\"Which region?\"}"}},
			{"id":"call_2","type":"function","function":{"name":"echo","arguments":"{\"text\": \"unfinished"}}]}`}
	default:
		return reply{final: "Done: " + strings.Join(heard, "; ")}
	}
}

// person is the scripted person who answers confirmations, and user the
// loop's user who answers ask_user.
const (
	person     = "alice"
	userAnswer = "eu-west-1"
)

// Loop runs the scripted model to its end through toolbatch and returns
// what the model heard at each step (one line per tool result, in its
// format), printing the same to out.
func Loop(ctx context.Context, c *client.Client, runID string, out io.Writer) ([][]string, error) {
	tickets, err := answerTickets(ctx, c, runID)
	if err != nil {
		return nil, err
	}
	defer tickets()
	var transcript [][]string
	var heard []string
	for step := 1; ; step++ {
		r := model(step, heard)
		if r.final != "" {
			fmt.Fprintln(out, "model:", r.final)
			return transcript, nil
		}
		turn := client.Turn{RunID: runID, ThreadID: "thread-" + runID, Step: int64(step)}
		var sub *protocol.Submit
		if r.format == anthropic {
			sub, err = client.FromAnthropic(turn, []byte(r.message))
		} else {
			sub, err = client.FromOpenAIChat(turn, fmt.Sprintf("chatcmpl-%d", step), []byte(r.message))
		}
		if err != nil {
			return nil, fmt.Errorf("step %d: %w", step, err)
		}
		res, err := c.SubmitAndWait(ctx, sub)
		if err != nil {
			return nil, fmt.Errorf("step %d: %w", step, err)
		}
		if heard, err = render(r.format, res); err != nil {
			return nil, err
		}
		for _, h := range heard {
			fmt.Fprintf(out, "step %d: %s\n", step, h)
		}
		transcript = append(transcript, heard)
	}
}

// render is what the model hears of the results, in its format.
func render(f format, res *protocol.ResultsOut) ([]string, error) {
	var lines []string
	if f == anthropic {
		msg, err := client.ToAnthropic(res)
		if err != nil {
			return nil, err
		}
		var m struct {
			Content []struct {
				ToolUseID string `json:"tool_use_id"`
				IsError   bool   `json:"is_error"`
				Content   []struct {
					Text string `json:"text"`
				} `json:"content"`
			} `json:"content"`
		}
		if err := json.Unmarshal(msg, &m); err != nil {
			return nil, err
		}
		for _, r := range m.Content {
			text := ""
			for _, c := range r.Content {
				text += c.Text
			}
			lines = append(lines, fmt.Sprintf("%s error=%t %s", r.ToolUseID, r.IsError, text))
		}
		return lines, nil
	}
	msgs, err := client.ToOpenAIChat(res)
	if err != nil {
		return nil, err
	}
	for _, b := range msgs {
		var m struct {
			ToolCallID string `json:"tool_call_id"`
			Content    string `json:"content"`
		}
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, err
		}
		lines = append(lines, m.ToolCallID+" "+m.Content)
	}
	return lines, nil
}

// answerTickets answers the run's tickets as they open, until the
// returned stop is called: a confirmation is approved by the scripted
// person, an ask_user call answered with the user's answer.
func answerTickets(ctx context.Context, c *client.Client, runID string) (stop func(), err error) {
	ctx, cancel := context.WithCancel(ctx)
	w, err := c.Watch(ctx, runID)
	if err != nil {
		cancel()
		return nil, err
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer w.Stop()
		answered := map[string]bool{}
		for {
			m, err := w.Next(ctx)
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				return
			}
			if err != nil || m.Awaiting == nil || answered[m.Awaiting.CorrelationID] {
				continue
			}
			t := *m.Awaiting
			answered[t.CorrelationID] = true
			switch t.Reason {
			case events.WaitPermission:
				err = c.Approve(ctx, t, person, "ok to send")
			case events.WaitExternalResult:
				err = c.ToolResult(ctx, t, events.TextOutput(t.CallID, userAnswer))
			}
			if err != nil && ctx.Err() == nil {
				fmt.Fprintf(os.Stderr, "agentloop: answering ticket %s: %v\n", t.CorrelationID, err)
			}
		}
	}()
	return func() { cancel(); wg.Wait() }, nil
}
