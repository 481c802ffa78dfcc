// Types of the toolbatch client (docs/protocol.md). Integers that may
// exceed 2^53 (arguments, outputs, sequences) are bigint when the engine
// sent them as 64-bit integers.

import type { NatsConnection, ConnectionOptions } from "@nats-io/transport-node";

export declare const DEFAULT_PREFIX: "toolbatch";

export interface Limits {
  maxCalls: number;
  maxArgumentBytes: number;
  maxOutputBytes: number;
  maxSubmitBytes: number;
  maxBlockBytes: number;
}
export declare const DEFAULT_LIMITS: Readonly<Limits>;

/** A content block: the engine interprets these types; any other is kept as it is. */
export type ContentBlock =
  | { type: "text"; text: string; [key: string]: unknown }
  | { type: "image"; source: { type: "base64"; media_type: string; data: string } | { type: "url"; url: string }; [key: string]: unknown }
  | { type: "tool_use"; id: string; name: string; input?: unknown; [key: string]: unknown }
  | { type: "tool_result"; tool_use_id: string; content?: ContentBlock[]; is_error?: boolean; [key: string]: unknown }
  | { type: "json"; value?: unknown; [key: string]: unknown }
  | { type: string; [key: string]: unknown };

export interface Submission {
  run_id: string;
  thread_id: string;
  step: number | bigint;
  assistant: { id?: string; content?: ContentBlock[] };
  narrowing?: "configured" | "deny_all";
}

export interface Command {
  scope: "thread" | "run";
  key: string;
  merge: "disjoint" | "exclusive";
  action: "set" | "remove";
  value?: unknown;
}

export interface ToolOutput {
  content?: ContentBlock[];
  is_error?: boolean;
  state?: Command[];
}

export interface SubmissionRef {
  msg_id?: string;
  inbox_seq?: number | bigint;
  digest?: string;
}

export interface ResultsOut {
  batch_id: string;
  step: number | bigint;
  results: Array<{ type: "tool_result"; tool_use_id: string; content: ContentBlock[]; is_error: boolean }>;
  state: Command[];
  submission?: SubmissionRef;
}

export interface AwaitingOut {
  correlation_id: string;
  run_id: string;
  thread_id: string;
  batch_id: string;
  call_id: string;
  tool_id: string;
  arguments: unknown;
  reason: "permission" | "external_result" | "scheduled_action" | "delegation";
  snapshot_id: string;
  deadline?: string;
  due?: string;
  action_kind?: string;
}

export interface OutMessage {
  /** throttled: a submission refused by its client's limits (the body is a rejected one, code throttled). */
  kind: "disposition" | "results" | "awaiting" | "rejected" | "refused" | "ended" | "throttled";
  subject: string;
  seq: number;
  /** Messages of the watch still in the stream after this one: 0 means caught up. */
  pending: number;
  headers?: { get(key: string): string };
  body: any;
}

export interface Sent {
  runId: string;
  batchId: string;
  msgID: string;
  inboxSeq: number;
  duplicate: boolean;
}

export declare class Refusal extends Error {
  code: string;
  reason: string;
  batchId?: string;
  correlationId?: string;
}

export declare function encode(value: unknown): Uint8Array;
export declare function decode(bytes: Uint8Array): unknown;
export declare function checkSubmission(s: Submission, limits?: Limits): void;
export declare function names(prefix?: string): {
  prefix: string;
  inboxStream: string;
  outStream: string;
  submit(run: string, client?: string): string;
  resume(run: string, principal?: string): string;
  control(run: string): string;
  out(run: string, kind: string): string;
};

export interface WaitOptions {
  signal?: AbortSignal;
}

export declare class Client {
  constructor(nc: NatsConnection, opts?: { prefix?: string; limits?: Partial<Limits>; submitter?: string });
  static connect(opts?: { servers?: string | string[]; prefix?: string; limits?: Partial<Limits>; submitter?: string; nats?: ConnectionOptions }): Promise<Client>;
  readonly nc: NatsConnection;
  close(): Promise<void>;
  send(s: Submission, opts?: { msgID?: string; traceparent?: string }): Promise<Sent>;
  answer(sent: Sent, opts?: WaitOptions): Promise<ResultsOut>;
  submit(s: Submission, opts?: WaitOptions & { msgID?: string; traceparent?: string }): Promise<ResultsOut>;
  watch(runId: string, opts?: WaitOptions & { kinds?: string[]; startSeq?: number }): AsyncGenerator<OutMessage>;
  outLastSeq(): Promise<number>;
  resume(ticket: AwaitingOut, result: object, opts?: WaitOptions & { principal?: string }): Promise<OutMessage>;
  approve(ticket: AwaitingOut, opts?: WaitOptions & { principal?: string; note?: string }): Promise<OutMessage>;
  deny(ticket: AwaitingOut, opts?: WaitOptions & { principal?: string; reason?: string }): Promise<OutMessage>;
  toolResult(ticket: AwaitingOut, output: ToolOutput, opts?: WaitOptions & { principal?: string }): Promise<OutMessage>;
  input(ticket: AwaitingOut, text: string, opts?: WaitOptions & { principal?: string }): Promise<OutMessage>;
  perform(ticket: AwaitingOut, opts?: WaitOptions): Promise<OutMessage>;
  cancel(runId: string, reason?: string, opts?: WaitOptions): Promise<OutMessage>;
  interrupt(runId: string, reason?: string, opts?: WaitOptions): Promise<OutMessage>;
}

export interface Turn {
  runId: string;
  threadId: string;
  step: number;
}

export declare function fromAnthropic(turn: Turn, message: { id?: string; role?: string; content?: ContentBlock[] }): Submission;
export declare function toAnthropic(results: ResultsOut): { role: "user"; content: ContentBlock[] };
export declare function fromOpenAIChat(turn: Turn, id: string, message: object): Submission;
export declare function toOpenAIChat(results: ResultsOut): Array<{ role: "tool"; tool_call_id: string; content: string }>;
export declare function fromOpenAIResponses(turn: Turn, id: string, output: object[]): Submission;
export declare function toOpenAIResponses(results: ResultsOut): Array<{ type: "function_call_output"; call_id: string; output: string }>;
