// The TypeScript (JavaScript, ESM) client of the toolbatch engine, written
// from docs/protocol.md: it speaks NATS JetStream only, as any client does.
// Types: index.d.ts.

import { createHash } from "node:crypto";
import { connect as natsConnect, headers as natsHeaders } from "@nats-io/transport-node";
import { jetstream, jetstreamManager, DeliverPolicy } from "@nats-io/jetstream";
import { encode as mpEncode, decode as mpDecode } from "@msgpack/msgpack";

export * from "./adapters.js";

export const DEFAULT_PREFIX = "toolbatch";

/** The engine's default limits (docs/protocol.md, section 4). */
export const DEFAULT_LIMITS = Object.freeze({
  maxCalls: 128,
  maxArgumentBytes: 256 << 10,
  maxOutputBytes: 1 << 20,
  maxSubmitBytes: 4 << 20,
  maxBlockBytes: 1 << 20,
});

const RUN_ID = /^[A-Za-z0-9_-]{1,64}$/;
const CALL_ID = /^[A-Za-z0-9_-]{1,128}$/;
const FORBIDDEN = ["target", "kind", "pool", "recovery", "capability"];
const OUT_KINDS = ["disposition", "results", "awaiting", "rejected", "refused", "ended", "throttled"];

/** A refusal by the engine (or by this client's checks, before publishing). */
export class Refusal extends Error {
  constructor(code, reason, extra = {}) {
    super(`${code}: ${reason}`);
    this.name = "Refusal";
    this.code = code;
    this.reason = reason;
    Object.assign(this, extra);
  }
}

const encoder = { ignoreUndefined: true, useBigInt64: true };
const decoder = { useBigInt64: true };

/** msgpack as the engine reads it: 64-bit integers as BigInt both ways. */
export function encode(value) {
  return mpEncode(value, encoder);
}
export function decode(bytes) {
  return mpDecode(bytes, decoder);
}

function upper(prefix) {
  return prefix.replace(/[a-z]/g, (c) => c.toUpperCase()).replace(/[^A-Z0-9]/g, "_");
}

/** The names of docs/protocol.md, section 2, for a prefix. */
export function names(prefix = DEFAULT_PREFIX) {
  return {
    prefix,
    inboxStream: `${upper(prefix)}_INBOX`,
    outStream: `${upper(prefix)}_OUT`,
    submit: (run, client) => (client ? `${prefix}.submit.${run}.${client}` : `${prefix}.submit.${run}`),
    resume: (run, principal) => (principal ? `${prefix}.resume.${run}.${principal}` : `${prefix}.resume.${run}`),
    control: (run) => `${prefix}.control.${run}`,
    out: (run, kind) => `${prefix}.out.${run}.${kind}`,
  };
}

function refuse(code, reason) {
  throw new Refusal(code, reason);
}

function only(obj, path, allowed) {
  for (const k of Object.keys(obj)) {
    if (obj[k] !== undefined && !allowed.includes(k)) {
      refuse("forbidden_field", `${path}: unknown field "${k}" (allowed: ${allowed.join(", ")})`);
    }
  }
}

function isObject(v) {
  return v !== null && typeof v === "object" && !Array.isArray(v);
}

function jsonBytes(v) {
  return Buffer.byteLength(JSON.stringify(v, (_, x) => (typeof x === "bigint" ? x.toString() : x)) ?? "null");
}

/**
 * Checks a submission as the engine does before it publishes anything:
 * strict keys of the submit and its assistant message, ids, limits,
 * duplicate call ids. Content blocks are the provider's and are kept as
 * they are; only tool_use blocks are calls, and they may not choose
 * placement or recovery. A call whose name is no tool id or whose input
 * is not an object is not refused: the engine answers that call.
 */
export function checkSubmission(s, limits = DEFAULT_LIMITS) {
  if (!isObject(s)) refuse("undecodable", "submit: want an object");
  for (const f of FORBIDDEN) {
    if (s[f] !== undefined) refuse("forbidden_field", `submit.${f}: a submission cannot choose placement or recovery`);
  }
  only(s, "submit", ["run_id", "thread_id", "step", "assistant", "narrowing"]);
  if (typeof s.run_id !== "string") refuse("undecodable", "submit.run_id: want a string");
  if (typeof s.thread_id !== "string") refuse("undecodable", "submit.thread_id: want a string");
  if (!(Number.isInteger(s.step) || typeof s.step === "bigint")) refuse("undecodable", "submit.step: want an integer");
  if (!isObject(s.assistant)) refuse("undecodable", "submit.assistant: want an object");
  only(s.assistant, "submit.assistant", ["id", "content"]);
  const content = s.assistant.content ?? [];
  if (!Array.isArray(content)) refuse("undecodable", "submit.assistant.content: want an array of content blocks");
  if (!RUN_ID.test(s.run_id)) refuse("invalid_id", `run_id "${s.run_id}" must match [A-Za-z0-9_-]{1,64}`);
  if (!CALL_ID.test(s.thread_id)) refuse("invalid_id", `thread_id "${s.thread_id}" must match [A-Za-z0-9_-]{1,128}`);
  if (s.step < 0) refuse("undecodable", `step ${s.step} must not be negative`);
  if (s.narrowing !== undefined && s.narrowing !== "configured" && s.narrowing !== "deny_all") {
    refuse("undecodable", `narrowing "${s.narrowing}" must be configured or deny_all`);
  }
  const seen = new Set();
  let calls = 0;
  content.forEach((b, i) => {
    const path = `submit.assistant.content[${i}]`;
    if (!isObject(b)) refuse("undecodable", `${path}: want an object`);
    if (typeof b.type !== "string" || b.type === "") refuse("undecodable", `${path}.type: missing`);
    if (jsonBytes(b) > limits.maxBlockBytes) refuse("limit_exceeded", `assistant.content[${i}]: a ${b.type} block over ${limits.maxBlockBytes} bytes`);
    if (b.type !== "tool_use") return;
    for (const f of FORBIDDEN) {
      if (b[f] !== undefined) refuse("forbidden_field", `${path}.${f}: a call cannot choose placement or recovery`);
    }
    if (typeof b.id !== "string") refuse("undecodable", `${path}.id: missing`);
    if (typeof b.name !== "string") refuse("undecodable", `${path}.name: missing`);
    if (!CALL_ID.test(b.id)) refuse("invalid_id", `call ${calls}: call_id "${b.id}" must match [A-Za-z0-9_-]{1,128}`);
    if (seen.has(b.id)) refuse("duplicate_call_id", `call_id "${b.id}" appears twice`);
    seen.add(b.id);
    if (jsonBytes(b.input ?? null) > limits.maxArgumentBytes) {
      refuse("limit_exceeded", `call ${b.id}: arguments over ${limits.maxArgumentBytes} bytes`);
    }
    calls++;
  });
  if (calls > limits.maxCalls) refuse("limit_exceeded", `${calls} calls in one batch, at most ${limits.maxCalls}`);
}

function sha256hex(bytes) {
  return createHash("sha256").update(bytes).digest("hex");
}

/** A client of one engine (one prefix) on one NATS connection. */
export class Client {
  /**
   * @param {import("@nats-io/transport-node").NatsConnection} nc
   * @param {{prefix?: string, limits?: object, submitter?: string}} [opts]
   */
  constructor(nc, opts = {}) {
    this.nc = nc;
    this.names = names(opts.prefix ?? DEFAULT_PREFIX);
    this.limits = { ...DEFAULT_LIMITS, ...(opts.limits ?? {}) };
    this.submitter = opts.submitter;
    this.js = jetstream(nc);
  }

  /** Connects to NATS (servers as nats.js takes them) and returns a client. */
  static async connect(opts = {}) {
    const nc = await natsConnect({ servers: opts.servers ?? "nats://127.0.0.1:4222", ...(opts.nats ?? {}) });
    return new Client(nc, opts);
  }

  async close() {
    await this.nc.close();
  }

  /**
   * Publishes a submission (checked first; nothing is published when it
   * is refused) and returns what names it in its answer: the message id
   * (`<run_id>/<step>/<first 16 hex digits of the SHA-256 of the body>`,
   * so that a retry of the same body is deduplicated by the stream) and
   * the inbox sequence of the stream's acknowledgement.
   */
  async send(s, opts = {}) {
    checkSubmission(s, this.limits);
    const body = encode(s);
    if (body.length > this.limits.maxSubmitBytes) refuse("limit_exceeded", `the submission is ${body.length} bytes, at most ${this.limits.maxSubmitBytes}`);
    const msgID = opts.msgID ?? `${s.run_id}/${s.step}/${sha256hex(body).slice(0, 16)}`;
    const h = natsHeaders();
    if (opts.traceparent) h.set("traceparent", opts.traceparent);
    const ack = await this.js.publish(this.names.submit(s.run_id, this.submitter), body, { msgID, headers: h });
    return { runId: s.run_id, batchId: `${s.run_id}/${s.step}`, msgID, inboxSeq: ack.seq, duplicate: ack.duplicate };
  }

  /** Sends a submission and waits for its answer (answer()). */
  async submit(s, opts = {}) {
    return this.answer(await this.send(s, opts), opts);
  }

  /**
   * Waits for the answer to a sent submission: the results that name it
   * (by inbox sequence, or message id without one), or its own refusal (a
   * Refusal). The run's end is not an answer: a submission to an ended
   * run is refused (run_ended), and a batch open when the run ends still
   * gets its results. A refusal is the answer once the watch has caught
   * up with the stream and no results naming the submission followed it.
   */
  async answer(sent, opts = {}) {
    // The inbox sequence names this submission alone; the message id also an
    // earlier one of the same content, so it counts only without a sequence.
    const names = (m) => m.submission && (sent.inboxSeq
      ? m.submission.inbox_seq !== undefined && BigInt(m.submission.inbox_seq) === BigInt(sent.inboxSeq)
      : m.submission.msg_id === sent.msgID);
    let verdict;
    for await (const m of this.watch(sent.runId, { ...opts, kinds: ["results", "rejected", "throttled"] })) {
      if (m.kind === "results" && names(m.body)) return m.body;
      // throttled: refused by the client's limits before any work on the run
      if ((m.kind === "rejected" || m.kind === "throttled") && names(m.body)) {
        verdict = new Refusal(m.body.code, m.body.reason, { batchId: m.body.batch_id });
      }
      if (verdict && m.pending === 0) throw verdict;
    }
    throw opts.signal?.reason ?? new Error("watch ended");
  }

  /**
   * The run's out messages, in stream order, from the first the stream
   * holds (or from startSeq), as an async iterator of {kind, subject, seq,
   * pending, body}; stop it with opts.signal or by leaving the loop.
   */
  async *watch(runId, opts = {}) {
    const kinds = opts.kinds ?? OUT_KINDS;
    const filterSubjects = kinds.map((k) => this.names.out(runId, k));
    const cfg = opts.startSeq
      ? { filter_subjects: filterSubjects, deliver_policy: DeliverPolicy.StartSequence, opt_start_seq: opts.startSeq }
      : { filter_subjects: filterSubjects, deliver_policy: DeliverPolicy.All };
    const consumer = await this.js.consumers.get(this.names.outStream, cfg);
    const messages = await consumer.consume();
    const stop = () => messages.stop();
    opts.signal?.addEventListener("abort", stop, { once: true });
    try {
      if (opts.signal?.aborted) return;
      for await (const m of messages) {
        const kind = m.subject.slice(m.subject.lastIndexOf(".") + 1);
        yield { kind, subject: m.subject, seq: m.seq, pending: m.info.pending, headers: m.headers, body: decode(m.data) };
      }
    } finally {
      opts.signal?.removeEventListener("abort", stop);
      stop();
    }
  }

  /** The last sequence of the out stream: where messages after now begin. */
  async outLastSeq() {
    const jsm = await jetstreamManager(this.nc);
    const info = await jsm.streams.info(this.names.outStream);
    return info.state.last_seq;
  }

  /**
   * Publishes a resume for a ticket (an awaiting message) and waits for
   * its effect: the ticket is no longer what the run awaits (an awaiting
   * of another ticket, the batch's results, the run's end), or the
   * engine's refusal of exactly this resume (a Refusal).
   */
  async resume(ticket, result, opts = {}) {
    const body = {
      correlation_id: ticket.correlation_id, run_id: ticket.run_id, thread_id: ticket.thread_id,
      call_id: ticket.call_id, snapshot_id: ticket.snapshot_id, result,
    };
    const subject = this.names.resume(ticket.run_id, opts.principal);
    const msgID = `resume/${ticket.run_id}/${ticket.correlation_id}/${result.kind}/${result.allow ?? ""}/${sha256hex(subject + "\0" + JSON.stringify(result)).slice(0, 16)}`;
    return this.#publishAndWatch(ticket.run_id, subject, encode(body), msgID, (m) => {
      if (m.kind === "awaiting" && m.body.correlation_id !== ticket.correlation_id) return "done";
      if (m.kind === "results" && m.body.batch_id === ticket.batch_id) return "done";
      if (m.kind === "ended") return "done";
      return undefined;
    }, opts);
  }

  approve(ticket, opts = {}) {
    return this.resume(ticket, { kind: "permission", allow: true, note: opts.note }, opts);
  }

  deny(ticket, opts = {}) {
    return this.resume(ticket, { kind: "permission", allow: false, reason: opts.reason }, opts);
  }

  /** Answers an external_result ticket with a ToolOutput ({content, is_error, state}). */
  toolResult(ticket, output, opts = {}) {
    return this.resume(ticket, { kind: "tool_result", output: { call_id: ticket.call_id, ...output } }, opts);
  }

  input(ticket, text, opts = {}) {
    return this.resume(ticket, { kind: "input", text }, opts);
  }

  /** Performs a scheduled_action ticket now. */
  perform(ticket, opts = {}) {
    return this.#control(ticket.run_id, { action: "perform", correlation_id: ticket.correlation_id }, (m) => {
      if (m.kind === "awaiting" && m.body.correlation_id !== ticket.correlation_id) return "done";
      if (m.kind === "results" && m.body.batch_id === ticket.batch_id) return "done";
      if (m.kind === "ended") return "done";
      return undefined;
    }, opts);
  }

  /** Cancels the run; resolves once it has ended. */
  cancel(runId, reason, opts = {}) {
    return this.#control(runId, { action: "cancel", reason }, (m) => (m.kind === "ended" ? "done" : undefined), opts);
  }

  /** Interrupts the run; resolves once it has ended. */
  interrupt(runId, reason, opts = {}) {
    return this.#control(runId, { action: "interrupt", reason }, (m) => (m.kind === "ended" ? "done" : undefined), opts);
  }

  #control(runId, body, effect, opts) {
    const msgID = `control/${runId}/${body.action}/${body.correlation_id ?? ""}`;
    return this.#publishAndWatch(runId, this.names.control(runId), encode(body), msgID, effect, opts);
  }

  // publishAndWatch publishes a command and reads the run's out messages
  // published after it: the engine's refusal of this very message (a
  // refused whose Nats-Msg-Id is refused/<its inbox sequence>) rejects,
  // effect(m) === "done" resolves with m.
  async #publishAndWatch(runId, subject, body, msgID, effect, opts) {
    const startSeq = (await this.outLastSeq()) + 1;
    const ack = await this.js.publish(subject, body, { msgID });
    const controller = new AbortController();
    const signal = opts.signal ? AbortSignal.any([opts.signal, controller.signal]) : controller.signal;
    try {
      for await (const m of this.watch(runId, { startSeq, signal })) {
        if (m.kind === "refused" && m.headers?.get("Nats-Msg-Id") === `refused/${ack.seq}`) {
          throw new Refusal(m.body.code, m.body.reason, { correlationId: m.body.correlation_id });
        }
        if (effect(m) === "done") return m;
      }
      throw opts.signal?.reason ?? new Error("watch ended");
    } finally {
      controller.abort();
    }
  }
}
