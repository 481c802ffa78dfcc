// Adapters between the providers' message formats and toolbatch's, as the
// Go client's (docs/adapters.md says what each keeps and loses).

function submission(turn, id, content) {
  return { run_id: turn.runId, thread_id: turn.threadId, step: turn.step, assistant: { id: id ?? "", content } };
}

/** An Anthropic Messages API response (the assistant message) as a submission: its content as it is. */
export function fromAnthropic(turn, message) {
  if (message.role !== undefined && message.role !== "assistant") {
    throw new Error(`anthropic message: role "${message.role}", want assistant`);
  }
  return submission(turn, message.id, message.content ?? []);
}

function renderBlock(b) {
  if (b.type === "json") return JSON.stringify(b.value ?? null, bigintSafe);
  return JSON.stringify(b, bigintSafe);
}

function bigintSafe(_, v) {
  return typeof v === "bigint" ? (Number.isSafeInteger(Number(v)) ? Number(v) : v.toString()) : v;
}

/** The user message that answers a batch: one tool_result per call, in model order, is_error kept. */
export function toAnthropic(results) {
  return {
    role: "user",
    content: results.results.map((r) => {
      const block = {
        type: "tool_result",
        tool_use_id: r.tool_use_id,
        content: (r.content ?? []).map((c) => {
          if (c.type === "text") return { type: "text", text: c.text };
          if (c.type === "image") return { type: "image", source: c.source };
          return { type: "text", text: renderBlock(c) };
        }),
      };
      if (r.is_error) block.is_error = true;
      return block;
    }),
  };
}

function toolUse(id, name, args) {
  let input;
  if ((args ?? "").trim() === "") {
    input = {};
  } else {
    try {
      input = JSON.parse(args);
    } catch {
      input = args; // a string: the engine answers this call with invalid_arguments
    }
  }
  return { type: "tool_use", id, name, input };
}

function chatText(content) {
  if (content === null || content === undefined) return "";
  if (typeof content === "string") return content;
  return content.filter((p) => p.type === "text" || p.type === "output_text").map((p) => p.text).join("\n");
}

/** An OpenAI Chat Completions assistant message as a submission (id: the completion's). */
export function fromOpenAIChat(turn, id, message) {
  if (message.role !== undefined && message.role !== "assistant") {
    throw new Error(`openai message: role "${message.role}", want assistant`);
  }
  const content = [];
  const text = chatText(message.content);
  if (text !== "") content.push({ type: "text", text });
  (message.tool_calls ?? []).forEach((c, i) => {
    if (c.type !== undefined && c.type !== "function") {
      throw new Error(`openai message: tool_calls[${i}]: type "${c.type}" is not a function call`);
    }
    content.push(toolUse(c.id, c.function.name, c.function.arguments));
  });
  return submission(turn, id, content);
}

function resultText(r) {
  const text = (r.content ?? []).map((c) => {
    if (c.type === "text") return c.text;
    if (c.type === "image") return `[image: ${c.source?.media_type ?? ""}${c.source?.url ?? ""}]`;
    return renderBlock(c);
  }).join("\n\n");
  return r.is_error ? "Error: " + text : text;
}

/** The tool messages that answer a batch, one per call, in model order. */
export function toOpenAIChat(results) {
  return results.results.map((r) => ({ role: "tool", tool_call_id: r.tool_use_id, content: resultText(r) }));
}

/** An OpenAI Responses API turn (the response's id and output items) as a submission. */
export function fromOpenAIResponses(turn, id, output) {
  return submission(turn, id, output.map((item) =>
    item.type === "function_call" ? toolUse(item.call_id, item.name, item.arguments) : item));
}

/** The function_call_output items that answer a batch, one per call, in model order. */
export function toOpenAIResponses(results) {
  return results.results.map((r) => ({ type: "function_call_output", call_id: r.tool_use_id, output: resultText(r) }));
}
