// An agent loop driven through toolbatch, as examples/agentloop does in
// Go: a scripted model (no network) answers with an Anthropic-shaped turn
// (thinking, an echo and an email a person must confirm), then an
// OpenAI-shaped one (a client tool and a call whose arguments are cut
// off), then with text only. Each turn is one batch; the loop answers the
// batch's tickets, waits for the answer to what it sent and hands the
// results back in the model's own format.
//
// Against an engine started with examples/agentloop/catalog.yaml:
//   node examples/agentloop.js nats://127.0.0.1:4222

import { Client, fromAnthropic, toAnthropic, fromOpenAIChat, toOpenAIChat } from "../src/index.js";

const PERSON = "alice";
const USER_ANSWER = "eu-west-1";

function model(step, heard) {
  switch (step) {
    case 1:
      return {
        format: "anthropic", message: {
          id: "msg_01", type: "message", role: "assistant", model: "scripted", stop_reason: "tool_use", content: [
            { type: "thinking", thinking: "Check the channel, then tell ops.", signature: "c2NyaXB0ZWQ=" },
            { type: "text", text: "Let me check and notify ops.", citations: null },
            { type: "tool_use", id: "toolu_01", name: "echo", input: { text: "ping" } },
            { type: "tool_use", id: "toolu_02", name: "send_email", input: { to: "ops@example.com", subject: "deploy" } },
          ],
        },
      };
    case 2:
      return {
        format: "openai", message: {
          role: "assistant", content: null, tool_calls: [
            { id: "call_1", type: "function", function: { name: "ask_user", arguments: '{"question":"Which region?"}' } },
            { id: "call_2", type: "function", function: { name: "echo", arguments: '{"text": "unfinished' } },
          ],
        },
      };
    default:
      return { final: "Done: " + heard.join("; ") };
  }
}

/** Answers the run's tickets until signal aborts. */
async function answerTickets(c, runId, signal) {
  const answered = new Set();
  try {
    for await (const m of c.watch(runId, { kinds: ["awaiting"], signal })) {
      const t = m.body;
      if (answered.has(t.correlation_id)) continue;
      answered.add(t.correlation_id);
      // Not awaited: the effect shows as the batch's answer.
      const done = t.reason === "permission"
        ? c.approve(t, { principal: PERSON, note: "ok to send", signal })
        : c.toolResult(t, { content: [{ type: "text", text: USER_ANSWER }] }, { signal });
      done.catch(() => {});
    }
  } catch (e) {
    if (!signal.aborted) throw e;
  }
}

/** Runs the scripted model to its end; returns what the model heard at each step. */
export async function loop(c, runId, log = console.log) {
  const controller = new AbortController();
  const tickets = answerTickets(c, runId, controller.signal);
  const transcript = [];
  let heard = [];
  try {
    for (let step = 1; ; step++) {
      const r = model(step, heard);
      if (r.final) {
        log(`model: ${r.final}`);
        return transcript;
      }
      const turn = { runId, threadId: `thread-${runId}`, step };
      const sub = r.format === "anthropic" ? fromAnthropic(turn, r.message) : fromOpenAIChat(turn, `chatcmpl-${step}`, r.message);
      const res = await c.submit(sub, { signal: AbortSignal.timeout(60000) });
      heard = r.format === "anthropic"
        ? toAnthropic(res).content.map((b) => `${b.tool_use_id} error=${b.is_error ?? false} ${b.content.map((x) => x.text).join("")}`)
        : toOpenAIChat(res).map((m) => `${m.tool_call_id} ${m.content}`);
      heard.forEach((h) => log(`step ${step}: ${h}`));
      transcript.push(heard);
    }
  } finally {
    controller.abort();
    await tickets;
  }
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const c = await Client.connect({ servers: process.argv[2] ?? "nats://127.0.0.1:4222" });
  try {
    await loop(c, `agentloop-${Date.now()}`);
  } finally {
    await c.close();
  }
}
