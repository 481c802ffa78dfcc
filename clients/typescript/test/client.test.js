// The client against a real engine (built from this repository), with the
// catalog of test/catalog.yaml: echo, send_email (needs a confirmation),
// ask_user (a client tool).

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";

import {
  Client, Refusal, checkSubmission,
  fromAnthropic, toAnthropic, fromOpenAIChat, toOpenAIChat, fromOpenAIResponses, toOpenAIResponses,
} from "../src/index.js";
import { repo, startEngine } from "./engine.js";

let engine;
let c;

before(async () => {
  engine = await startEngine(join(repo, "clients/typescript/test/catalog.yaml"));
  c = await Client.connect({ servers: engine.url });
});

after(async () => {
  await c?.close();
  await engine?.stop();
});

const signal = () => AbortSignal.timeout(20000);

function call(id, name, input) {
  return { type: "tool_use", id, name, input };
}

function batch(run, step, ...blocks) {
  return { run_id: run, thread_id: "t1", step, assistant: { id: `m-${step}`, content: blocks } };
}

function texts(res) {
  return res.results.map((r) => `${r.tool_use_id} ${r.is_error ? "error" : "ok"} ${r.content.map((b) => b.text).join("")}`);
}

/** The next awaiting ticket of a run. */
async function nextTicket(run, skip = new Set()) {
  for await (const m of c.watch(run, { kinds: ["awaiting"], signal: signal() })) {
    if (!skip.has(m.body.correlation_id)) return m.body;
  }
  throw new Error("no ticket");
}

test("submit resolves to the results that name the submission", async () => {
  const s = batch("ts-1", 1, { type: "text", text: "go" }, call("c1", "echo", { n: 1 }), call("c2", "echo", { n: 2 }));
  const sent = await c.send(s);
  assert.ok(sent.inboxSeq > 0 && !sent.duplicate);
  const res = await c.answer(sent, { signal: signal() });
  assert.deepEqual(texts(res), ['c1 ok {"n":1}', 'c2 ok {"n":2}']);
  assert.equal(res.submission.msg_id, sent.msgID);
  assert.equal(BigInt(res.submission.inbox_seq), BigInt(sent.inboxSeq));

  // The same body again: deduplicated by the stream, same answer.
  const again = await c.send(s);
  assert.ok(again.duplicate);
  assert.deepEqual(texts(await c.answer(again, { signal: signal() })), texts(res));

  // Another batch for the accepted step: its own refusal, not the old results.
  await assert.rejects(c.submit(batch("ts-1", 1, call("c9", "echo", {})), { signal: signal() }),
    (e) => e instanceof Refusal && e.code === "step_not_after_last");
});

test("a real Anthropic message goes through as it is, with a malformed call answered on its own", async () => {
  const message = {
    id: "msg_01", type: "message", role: "assistant", model: "claude", stop_reason: "tool_use",
    content: [
      { type: "thinking", thinking: "Two echoes.", signature: "EqQBCkYIBxgCKkA=" },
      { type: "text", text: "Sure.", citations: null, cache_control: { type: "ephemeral" } },
      call("toolu_01", "echo", { text: "one" }),
      call("toolu_02", "fs.read", { path: "a" }),
      { ...call("toolu_03", "echo", { text: "three" }), cache_control: { type: "ephemeral" } },
    ],
  };
  const res = await c.submit(fromAnthropic({ runId: "ts-2", threadId: "t1", step: 1 }, message), { signal: signal() });
  assert.deepEqual(texts(res), ['toolu_01 ok {"text":"one"}', "toolu_02 error unknown tool: fs.read", 'toolu_03 ok {"text":"three"}']);
  const next = toAnthropic(res);
  assert.equal(next.role, "user");
  assert.deepEqual(next.content.map((b) => [b.type, b.tool_use_id, b.is_error ?? false]),
    [["tool_result", "toolu_01", false], ["tool_result", "toolu_02", true], ["tool_result", "toolu_03", false]]);
});

test("OpenAI tool calls with broken arguments: that call's error, the others run", async () => {
  const message = {
    role: "assistant", content: null, tool_calls: [
      { id: "call_1", type: "function", function: { name: "echo", arguments: '{"text":"ok"}' } },
      { id: "call_2", type: "function", function: { name: "echo", arguments: '{"text": "cut' } },
      { id: "call_3", type: "function", function: { name: "echo", arguments: "" } },
    ],
  };
  const res = await c.submit(fromOpenAIChat({ runId: "ts-3", threadId: "t1", step: 1 }, "chatcmpl-1", message), { signal: signal() });
  assert.deepEqual(toOpenAIChat(res), [
    { role: "tool", tool_call_id: "call_1", content: '{"text":"ok"}' },
    { role: "tool", tool_call_id: "call_2", content: "Error: invalid arguments: the input must be a JSON object, got a string" },
    { role: "tool", tool_call_id: "call_3", content: "{}" },
  ]);
  const responses = fromOpenAIResponses({ runId: "ts-3", threadId: "t1", step: 2 }, "resp_1", [
    { type: "reasoning", id: "rs_1", summary: [], encrypted_content: "gAAA" },
    { type: "function_call", id: "fc_1", call_id: "call_9", name: "echo", arguments: '{"x":1}' },
  ]);
  const res2 = await c.submit(responses, { signal: signal() });
  assert.deepEqual(toOpenAIResponses(res2), [{ type: "function_call_output", call_id: "call_9", output: '{"x":1}' }]);
});

test("approve, deny, a late approval, and a client tool's result", async () => {
  const sent = await c.send(batch("ts-4", 1,
    call("c1", "send_email", { to: "a@example.com" }), call("c2", "send_email", { to: "b@example.com" }), call("c3", "ask_user", { q: "?" })));
  const first = await nextTicket("ts-4");
  assert.equal(first.reason, "permission");
  assert.equal(first.call_id, "c1");
  const effect = await c.approve(first, { principal: "alice", note: "fine", signal: signal() });
  assert.equal(effect.kind, "awaiting"); // the next ticket is what the run awaits now
  const second = effect.body;
  assert.equal(second.call_id, "c2");
  await assert.rejects(c.approve(first, { principal: "alice", signal: signal() }),
    (e) => e instanceof Refusal && e.code === "not_awaiting");
  const third = (await c.deny(second, { principal: "bob", reason: "not b", signal: signal() })).body;
  assert.equal(third.reason, "external_result");
  await c.toolResult(third, { content: [{ type: "text", text: "blue" }] }, { signal: signal() });
  const res = await c.answer(sent, { signal: signal() });
  assert.deepEqual(texts(res), ['c1 ok {"to":"a@example.com"}', "c2 error blocked: not b", "c3 ok blue"]);
});

test("integers beyond 2^53 are kept exactly (BigInt)", async () => {
  const big = 2n ** 63n - 1n;
  const huge = 2n ** 64n - 1n;
  const res = await c.submit(batch("ts-5", 1, call("c1", "echo", { big, huge, neg: -(2n ** 62n), small: 7 })), { signal: signal() });
  assert.equal(res.results[0].content[0].text, `{"big":${big},"huge":${huge},"neg":${-(2n ** 62n)},"small":7}`);
});

test("a submission over its client's rate is answered with its throttled refusal", async () => {
  // An engine of its own: a burst of 1 that does not refill within the test.
  const limited = await startEngine(join(repo, "clients/typescript/test/catalog.yaml"),
    ["--client-submit-rate", "0.0001", "--client-submit-burst", "1"]);
  const lc = await Client.connect({ servers: limited.url });
  try {
    const res = await lc.submit(batch("th-1", 1, call("c1", "echo", { n: 1 })), { signal: signal() });
    assert.deepEqual(texts(res), ['c1 ok {"n":1}']);
    const sent = await lc.send(batch("th-2", 1, call("c1", "echo", { n: 2 })));
    await assert.rejects(lc.answer(sent, { signal: signal() }),
      (e) => e instanceof Refusal && e.code === "throttled" && e.batchId === "th-2/1");
    const kinds = [];
    for await (const m of lc.watch("th-2", { signal: signal() })) {
      kinds.push(m.kind);
      if (m.pending === 0) break;
    }
    assert.deepEqual(kinds, ["throttled"]);
  } finally {
    await lc.close();
    await limited.stop();
  }
});

test("cancel ends the run; a submission refused locally publishes nothing", async () => {
  await c.send(batch("ts-6", 1, call("c1", "send_email", { to: "x@example.com" })));
  await nextTicket("ts-6");
  const ended = await c.cancel("ts-6", "changed my mind", { signal: signal() });
  assert.equal(ended.body.cause, "cancelled");
  await assert.rejects(c.submit(batch("ts-6", 2, call("c1", "echo", {})), { signal: signal() }),
    (e) => e instanceof Refusal && e.code === "run_ended");

  const before = await c.outLastSeq();
  for (const [s, code] of [
    [batch("ts-7", 1, call("c1", "echo", {}), call("c1", "echo", {})), "duplicate_call_id"],
    [batch("bad.run", 1), "invalid_id"],
    [{ ...batch("ts-7", 1), target: "sandbox" }, "forbidden_field"],
    [batch("ts-7", 1, { ...call("c1", "echo", {}), pool: "gpu" }), "forbidden_field"],
  ]) {
    assert.throws(() => checkSubmission(s), (e) => e instanceof Refusal && e.code === code);
    await assert.rejects(c.send(s), (e) => e instanceof Refusal && e.code === code);
  }
  assert.equal(await c.outLastSeq(), before);
});
