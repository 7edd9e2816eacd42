// `AppServerClient`: drives one `cc-app-server serve` child process over its stdin/stdout (wire v1
// JSON-RPC, one object per line) with the local bounds of the Rust client (core/src/client.rs):
// 256 requests in flight (one more is a local -32001), a 120 s request timeout (-32010, never read
// as success), the 1 MiB line cap (a longer request is refused before it is written), bounded
// inbound buffering (past `notificationCapacity` notifications nobody took, the client stops
// reading the child's stdout: backpressure, as the Rust client's pump waits), and approvals
// declined, and logged, when no handler is set.
//
// Every request takes and returns the generated wire types (./protocol.js, a copy of
// bindings/typescript/src/protocol.ts made at build time): params are encoded and results decoded
// by the generated codecs.

import { spawn as spawnChild, type ChildProcess } from "node:child_process";
import * as fs from "node:fs";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import * as p from "./protocol.js";
import type {
  ClientRequest,
  Feature,
  InitializeResult,
  Json,
  JsonObject,
  ServerNotification,
  Turn,
  TurnCompletedParams,
  UserInput,
} from "./protocol.js";
import { ApprovalRouter, type ApprovalHandler, type Logger } from "./approvals.js";
import {
  Closed,
  InvalidParams,
  KernelFailed,
  Overloaded,
  ProtocolError,
  ServerExited,
  Timeout,
  TurnInterrupted,
  fromWireError,
} from "./errors.js";

/** Requests in flight at once; one more is refused locally with `Overloaded` (-32001). */
export const MAX_PENDING_REQUESTS = 256;
/** A request unanswered this long fails with `Timeout` (-32010). */
export const DEFAULT_REQUEST_TIMEOUT_MS = 120_000;
/** The longest request line, in UTF-8 bytes without the newline (the server's own cap, inclusive). */
export const MAX_LINE_BYTES = 1_048_576;
/** The longest line accepted from the server; a longer one is a broken server and closes the client. */
export const DEFAULT_MAX_INBOUND_LINE_BYTES = 64 * 1_048_576;
/** Notifications held for the host before the client stops reading the server. */
export const DEFAULT_NOTIFICATION_CAPACITY = 4096;
/** How long an approval handler may take before the client declines. */
export const DEFAULT_APPROVAL_TIMEOUT_MS = 30_000;
/** Approvals being decided at once; one more is declined at once. */
export const DEFAULT_MAX_OUTSTANDING_APPROVALS = 64;
/** How long `close()` waits for the server to drain and exit before it kills it. */
export const DEFAULT_CLOSE_TIMEOUT_MS = 15_000;

/** The wire protocol version this client speaks. */
export const PROTOCOL_VERSION = 1;

/** Every feature this client can use, asked for in `initialize` (the server grants what it implements). */
export const CLIENT_FEATURES: readonly Feature[] = [
  "thread_turn_item",
  "structured_approval",
  "bounded_transport",
  "thread_compact",
  "typed_graph",
  "causal_messages",
  "graph_effect_receipts",
];

/** A wire v1 request method. */
export type Method = ClientRequest["method"];

/** The params of a request method: the generated `…Params` type (`undefined` allowed where the params are optional). */
export type ParamsOf<M extends Method> = Extract<ClientRequest, { method: M }>["params"];

/** The result of each request method: the generated `…Result` types. */
export interface ResultMap {
  initialize: p.InitializeResult;
  "thread/start": p.ThreadStartResult;
  "thread/read": p.ThreadReadResult;
  "thread/resume": p.ThreadResumeResult;
  "thread/fork": p.ThreadForkResult;
  "thread/list": p.ThreadListResult;
  "thread/archive": p.ThreadArchiveResult;
  "thread/compact": p.ThreadCompactResult;
  "turn/start": p.TurnStartResult;
  "turn/interrupt": p.TurnInterruptResult;
  "graph/validate": p.GraphValidateResult;
  "graph/run/start": p.GraphRunStartResult;
  "graph/run/read": p.GraphRunReadResult;
  "graph/run/cancel": p.GraphRunCancelResult;
}

/** The result of a request method. */
export type ResultOf<M extends Method> = ResultMap[M];

// ResultMap names exactly the generated ClientRequest methods: a method added to the schema and not
// here fails this line at compile time.
type Same<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false;
const methodsCovered: Same<keyof ResultMap, Method> = true;
void methodsCovered;

const RESULT_DECODERS: { [M in Method]: (raw: Json) => ResultMap[M] } = {
  initialize: (r) => p.decodeInitializeResult(r),
  "thread/start": (r) => p.decodeThreadStartResult(r),
  "thread/read": (r) => p.decodeThreadReadResult(r),
  "thread/resume": (r) => p.decodeThreadResumeResult(r),
  "thread/fork": (r) => p.decodeThreadForkResult(r),
  "thread/list": (r) => p.decodeThreadListResult(r),
  "thread/archive": (r) => p.decodeThreadArchiveResult(r),
  "thread/compact": (r) => p.decodeThreadCompactResult(r),
  "turn/start": (r) => p.decodeTurnStartResult(r),
  "turn/interrupt": (r) => p.decodeTurnInterruptResult(r),
  "graph/validate": (r) => p.decodeGraphValidateResult(r),
  "graph/run/start": (r) => p.decodeGraphRunStartResult(r),
  "graph/run/read": (r) => p.decodeGraphRunReadResult(r),
  "graph/run/cancel": (r) => p.decodeGraphRunCancelResult(r),
};

/** Per-request options. */
export interface RequestOptions {
  /** This request's timeout in ms (default: the client's `requestTimeoutMs`). */
  timeoutMs?: number;
}

/** How to start the server and the client's bounds. */
export interface SpawnOptions {
  /** The server's state directory (`serve --state-dir`; created 0700 if missing). */
  stateDir: string;
  /**
   * The `cc-app-server` executable. Default: `$CC_APP_SERVER_BIN`, else `bin/cc-app-server` in
   * this package's directory, else `cc-app-server` on `PATH`.
   */
  bin?: string;
  /** More `serve` arguments, after `serve --state-dir DIR` (e.g. `["--durability", "ephemeral"]`). */
  args?: readonly string[];
  /** Decides `approval/decide` requests. Without one every approval is declined (and logged). */
  approvals?: ApprovalHandler;
  /** Environment of the child, over this process's. */
  env?: Record<string, string | undefined>;
  /** Working directory of the child (the server's default `--workspace`). */
  cwd?: string;
  /** Default request timeout, ms (120,000). */
  requestTimeoutMs?: number;
  /** Requests in flight at once (256). */
  maxPendingRequests?: number;
  /** Longest request line, bytes (1,048,576). Keep it at or below the server's `--max-line-bytes`. */
  maxLineBytes?: number;
  /** Longest line accepted from the server, bytes (64 MiB). */
  maxInboundLineBytes?: number;
  /** Notifications held unread before the client stops reading the server (4,096). */
  notificationCapacity?: number;
  /** How long an approval handler may take, ms (30,000). */
  approvalTimeoutMs?: number;
  /** Approvals being decided at once (64). */
  maxOutstandingApprovals?: number;
  /** How long `close()` waits for the server to exit before killing it, ms (15,000). */
  closeTimeoutMs?: number;
  /** The `client` of `initialize` (default `cc-app-server-node` and this package's version). */
  clientInfo?: p.ClientInfo;
  /** The features asked for in `initialize` (default `CLIENT_FEATURES`). */
  features?: readonly Feature[];
  /** Where the client's diagnostics go (default: warnings and errors to stderr). */
  log?: Logger;
  /** The child's stderr: kept (its last 8 KiB go into `ServerExited` errors; default) or inherited. */
  stderr?: "capture" | "inherit";
}

/** Options of `turn()`: the generated `TurnStartParams` members besides the thread and the input. */
export type TurnOptions = Pick<p.TurnStartParams, "idempotencyKey" | "traceparent">;

const defaultLog: Logger = (level, message) => {
  if (level === "warn" || level === "error") process.stderr.write(`cc-app-server client ${level}: ${message}\n`);
};

const STDERR_TAIL = 8192;

function packageDir(): string {
  // dist/client.js -> the package root.
  return path.dirname(path.dirname(fileURLToPath(import.meta.url)));
}

function packageVersion(): string {
  try {
    const pkg = JSON.parse(fs.readFileSync(path.join(packageDir(), "package.json"), "utf8")) as { version?: unknown };
    return typeof pkg.version === "string" ? pkg.version : "0.0.0";
  } catch {
    return "0.0.0";
  }
}

const EXE = process.platform === "win32" ? "cc-app-server.exe" : "cc-app-server";

function isExecutable(file: string): boolean {
  try {
    fs.accessSync(file, fs.constants.X_OK);
    return fs.statSync(file).isFile();
  } catch {
    return false;
  }
}

function onPath(name: string, env: Record<string, string | undefined>): string | undefined {
  for (const dir of (env["PATH"] ?? "").split(path.delimiter)) {
    if (dir === "") continue;
    const file = path.join(dir, name);
    if (isExecutable(file)) return file;
  }
  return undefined;
}

/**
 * The executable `spawn` runs: `bin` (a path, or a bare name looked up on `PATH`), else
 * `$CC_APP_SERVER_BIN`, else `bin/cc-app-server` next to this package, else `cc-app-server` on
 * `PATH`. Throws `Closed` saying where it looked.
 */
export function resolveBinary(bin?: string, env: Record<string, string | undefined> = process.env): string {
  const given = bin ?? env["CC_APP_SERVER_BIN"];
  if (given !== undefined && given !== "") {
    if (given.includes("/") || given.includes(path.sep)) return path.resolve(given);
    const found = onPath(given, env);
    if (found === undefined) throw new Closed(`cannot find ${given} on PATH`);
    return found;
  }
  const bundled = path.join(packageDir(), "bin", EXE);
  if (isExecutable(bundled)) return bundled;
  const found = onPath(EXE, env);
  if (found !== undefined) return found;
  throw new Closed(
    `cannot find the ${EXE} executable: pass { bin }, set CC_APP_SERVER_BIN, put it in ${path.dirname(bundled)}, ` +
      `or put it on PATH (cargo build -p cc-app-server-cli --bin cc-app-server)`,
  );
}

function positive(name: string, value: number | undefined, fallback: number, max = Number.MAX_SAFE_INTEGER): number {
  if (value === undefined) return fallback;
  if (!Number.isInteger(value) || value < 1 || value > max) {
    throw new RangeError(`${name} must be a whole number from 1 to ${max} (got ${value})`);
  }
  return value;
}

/** The longest delay setTimeout keeps. */
const MAX_TIMER_MS = 2_147_483_647;

function isObject(v: Json | undefined): v is JsonObject {
  return v !== null && v !== undefined && typeof v === "object" && !Array.isArray(v);
}

/** The turn a notification belongs to: `params.turnId`, or `params.turn.id`. */
function turnOf(raw: JsonObject): string | undefined {
  const params = raw["params"];
  if (!isObject(params)) return undefined;
  const t = params["turnId"];
  if (typeof t === "string") return t;
  const turn = params["turn"];
  if (isObject(turn) && typeof turn["id"] === "string") return turn["id"];
  return undefined;
}

function threadOf(raw: JsonObject): string | undefined {
  const params = raw["params"];
  if (!isObject(params)) return undefined;
  const t = params["threadId"];
  return typeof t === "string" ? t : undefined;
}

/** A FIFO with O(1) shift. */
class Queue<T> {
  private items: (T | undefined)[] = [];
  private head = 0;
  get length(): number {
    return this.items.length - this.head;
  }
  push(item: T): void {
    this.items.push(item);
  }
  shift(): T | undefined {
    if (this.head >= this.items.length) return undefined;
    const item = this.items[this.head];
    this.items[this.head] = undefined;
    this.head += 1;
    if (this.head > 1024 && this.head * 2 > this.items.length) {
      this.items = this.items.slice(this.head);
      this.head = 0;
    }
    return item;
  }
  filter(keep: (item: T) => boolean): number {
    const before = this.length;
    this.items = (this.items.slice(this.head) as T[]).filter(keep);
    this.head = 0;
    return before - this.items.length;
  }
  some(test: (item: T) => boolean): boolean {
    for (let i = this.head; i < this.items.length; i++) if (test(this.items[i] as T)) return true;
    return false;
  }
}

interface Pending {
  method: Method;
  resolve: (value: unknown) => void;
  reject: (error: Error) => void;
  timer: ReturnType<typeof setTimeout>;
}

/** What one turn stream receives while subscribed to its thread. */
class TurnSub {
  readonly queue = new Queue<JsonObject>();
  turnId: string | undefined;
  /** Its `turn/completed` has arrived: it takes nothing more. */
  routed = true;
  constructor(readonly threadId: string) {}
}

/** Where a client's approval decisions come from (the pilot client's registered UI handler). */
export interface ApprovalSource {
  handler: () => ApprovalHandler | undefined;
  /** Said in the log when there is none. */
  hint: string;
}

/** The internals a turn stream and a pilot client use (not exported by the package). */
export interface ClientCore {
  request<M extends Method>(method: M, params: ParamsOf<M>, options?: RequestOptions): Promise<ResultOf<M>>;
  subscribe(threadId: string): TurnSub;
  setTurn(sub: TurnSub, turnId: string): void;
  take(sub: TurnSub): JsonObject | undefined;
  unsubscribe(sub: TurnSub): void;
  changed(): Promise<void>;
  ended(): Closed | "closed" | undefined;
  decode(raw: JsonObject): ServerNotification;
}

/**
 * A client of one `cc-app-server serve` child process. Start it with `AppServerClient.spawn`;
 * end it with `close()` (else the child keeps the Node process alive).
 */
const cores = new WeakMap<AppServerClient, ClientCore>();
let spawnInternal!: (options: SpawnOptions, approvals: ApprovalSource) => Promise<AppServerClient>;

/** The internals of `client` (for the pilot client; not exported by the package). */
export function clientCore(client: AppServerClient): ClientCore {
  const core = cores.get(client);
  if (core === undefined) throw new TypeError("not an AppServerClient");
  return core;
}

/** `AppServerClient.spawn` with approvals decided by `approvals` (not exported by the package). */
export function spawnWithApprovals(options: SpawnOptions, approvals: ApprovalSource): Promise<AppServerClient> {
  return spawnInternal(options, approvals);
}

export class AppServerClient {
  static {
    spawnInternal = async (options, approvals) => {
      const client = new AppServerClient(options, approvals);
      await client.#start();
      return client;
    };
  }

  readonly #options: SpawnOptions;
  readonly #log: Logger;
  readonly #requestTimeoutMs: number;
  readonly #maxPending: number;
  readonly #maxLineBytes: number;
  readonly #maxInboundLineBytes: number;
  readonly #capacity: number;
  readonly #closeTimeoutMs: number;
  readonly #approvals: ApprovalRouter;
  #child: ChildProcess | undefined;
  #nextId = 1;
  readonly #pending = new Map<number, Pending>();
  readonly #shared = new Queue<JsonObject>();
  readonly #subs = new Map<string, Set<TurnSub>>();
  #buffered = 0;
  #paused = false;
  #partial: Buffer[] = [];
  #partialBytes = 0;
  #stderrTail = "";
  #wake: (() => void) | undefined;
  #wakePromise: Promise<void> | undefined;
  /** close() was called. */
  #closing = false;
  /** Nothing more will arrive: why (`"closed"`: by close()). */
  #end: Closed | "closed" | undefined;
  #exit: { code: number | null; signal: string | null } | undefined;
  #exited!: Promise<void>;
  #closePromise: Promise<void> | undefined;
  #initialize: InitializeResult | undefined;

  private constructor(options: SpawnOptions, approvals: ApprovalSource) {
    this.#options = options;
    this.#log = options.log ?? defaultLog;
    this.#requestTimeoutMs = positive("requestTimeoutMs", options.requestTimeoutMs, DEFAULT_REQUEST_TIMEOUT_MS, MAX_TIMER_MS);
    this.#maxPending = positive("maxPendingRequests", options.maxPendingRequests, MAX_PENDING_REQUESTS);
    this.#maxLineBytes = positive("maxLineBytes", options.maxLineBytes, MAX_LINE_BYTES);
    this.#maxInboundLineBytes = positive("maxInboundLineBytes", options.maxInboundLineBytes, DEFAULT_MAX_INBOUND_LINE_BYTES);
    this.#capacity = positive("notificationCapacity", options.notificationCapacity, DEFAULT_NOTIFICATION_CAPACITY);
    this.#closeTimeoutMs = positive("closeTimeoutMs", options.closeTimeoutMs, DEFAULT_CLOSE_TIMEOUT_MS, MAX_TIMER_MS);
    const approvalTimeout = positive("approvalTimeoutMs", options.approvalTimeoutMs, DEFAULT_APPROVAL_TIMEOUT_MS, MAX_TIMER_MS);
    const maxApprovals = positive("maxOutstandingApprovals", options.maxOutstandingApprovals, DEFAULT_MAX_OUTSTANDING_APPROVALS);
    this.#approvals = new ApprovalRouter(
      approvals.handler,
      approvalTimeout,
      maxApprovals,
      (id, decision) => this.#send({ jsonrpc: "2.0", id, result: decision }),
      this.#log,
      approvals.hint,
    );
    cores.set(this, {
      request: (method, params, opts) => this.request(method, params, opts),
      subscribe: (threadId) => this.#subscribe(threadId),
      setTurn: (sub, turnId) => this.#setTurn(sub, turnId),
      take: (sub) => this.#take(sub.queue),
      unsubscribe: (sub) => this.#unsubscribe(sub),
      changed: () => this.#changed(),
      ended: () => this.#end ?? (this.#closing ? "closed" : undefined),
      decode: (raw) => this.#decode(raw),
    });
  }

  /**
   * Starts `cc-app-server serve --state-dir DIR [args]` and performs the `initialize` handshake
   * (protocol version 1, every feature in `features`). Rejects with `ServerExited` when the
   * server does not start (its stderr is in the error), `Closed` when it cannot be run.
   */
  static spawn(options: SpawnOptions): Promise<AppServerClient> {
    const handler = options.approvals;
    if (handler !== undefined && typeof handler !== "function") {
      return Promise.reject(new TypeError("approvals must be a function (request) => decision"));
    }
    return spawnInternal(options, {
      handler: () => handler,
      hint: "this client has no approval handler (pass { approvals } to AppServerClient.spawn)",
    });
  }

  /** The server's answer to `initialize` (protocol version, features, server, schema digest). */
  get initializeResult(): InitializeResult {
    if (this.#initialize === undefined) throw new Closed("the client is not initialized");
    return this.#initialize;
  }

  /** The child's process id. */
  get pid(): number | undefined {
    return this.#child?.pid;
  }

  /** Requests now waiting for an answer. */
  get pendingRequests(): number {
    return this.#pending.size;
  }

  /** True once closed: by `close()`, or because the server exited. */
  get closed(): boolean {
    return this.#end !== undefined || this.#closing;
  }

  async #start(): Promise<void> {
    const options = this.#options;
    if (typeof options.stateDir !== "string" || options.stateDir === "") {
      throw new TypeError("stateDir must be the path of the server's state directory");
    }
    const env = { ...process.env, ...(options.env ?? {}) };
    const bin = resolveBinary(options.bin, env);
    const args = ["serve", "--state-dir", path.resolve(options.stateDir), ...(options.args ?? [])];
    const child = spawnChild(bin, args, {
      cwd: options.cwd,
      env,
      stdio: ["pipe", "pipe", options.stderr === "inherit" ? "inherit" : "pipe"],
      windowsHide: true,
    });
    this.#child = child;
    let exitedResolve!: () => void;
    this.#exited = new Promise<void>((resolve) => (exitedResolve = resolve));
    let gone = false;
    const onGone = (reason: Closed): void => {
      if (gone) return;
      gone = true;
      this.#finish(reason);
      exitedResolve();
    };
    child.on("error", (e: Error) => {
      // Spawning failed (ENOENT, EACCES); a failed kill of a live child changes nothing.
      if (child.pid === undefined) onGone(new Closed(`cannot run ${bin}: ${e.message}`, { cause: e }));
    });
    child.stdin?.on("error", () => {
      // EPIPE once the server is gone: its exit is reported instead.
    });
    child.stdout?.on("data", (chunk: Buffer) => this.#onData(chunk));
    child.stderr?.on("data", (chunk: Buffer) => {
      this.#stderrTail = (this.#stderrTail + chunk.toString("utf8")).slice(-STDERR_TAIL);
    });
    const exited = (code: number | null, signal: string | null): void => {
      this.#exit ??= { code, signal };
      onGone(this.#exitError(code, signal));
    };
    // 'close' comes once stdout is drained too (every answer already written is delivered first);
    // 'exit' with a fallback, in case something else holds the pipes open.
    child.on("close", exited);
    child.on("exit", (code, signal) => {
      this.#exit ??= { code, signal };
      setTimeout(() => exited(code, signal), 2000).unref();
    });
    try {
      this.#initialize = await this.request("initialize", {
        protocolVersion: PROTOCOL_VERSION,
        minimumProtocolVersion: 1,
        client: options.clientInfo ?? { name: "cc-app-server-node", version: packageVersion() },
        features: [...(options.features ?? CLIENT_FEATURES)],
      });
    } catch (e) {
      // A server that does not answer the handshake is not left running.
      this.#closing = true;
      if (this.#exit === undefined && child.pid !== undefined) child.kill("SIGKILL");
      await this.#exited;
      throw e;
    }
    if (this.#initialize.schemaDigest !== p.SCHEMA_DIGEST) {
      this.#log(
        "warn",
        `the server speaks schema ${this.#initialize.schemaDigest}, this client was built from ${p.SCHEMA_DIGEST}; ` +
          `members either side does not know are kept as sent`,
      );
    }
  }

  #exitError(code: number | null, signal: string | null): ServerExited {
    const how = signal !== null ? `was killed by ${signal}` : `exited with code ${code}`;
    const stderr = this.#stderrTail.trim();
    const when = this.#initialize === undefined ? " before answering initialize" : "";
    const tail = stderr === "" ? "" : `; its stderr ends: ${stderr.slice(-2000)}`;
    return new ServerExited(`cc-app-server ${how}${when}${tail}`, code, signal, this.#stderrTail);
  }

  // -- requests ----------------------------------------------------------------------------------

  /**
   * Any request by its wire method, with the generated params and result types (prefer the
   * one-method-per-request helpers below).
   */
  request<M extends Method>(method: M, params: ParamsOf<M>, options?: RequestOptions): Promise<ResultOf<M>> {
    let timeoutMs: number;
    try {
      timeoutMs = positive("timeoutMs", options?.timeoutMs, this.#requestTimeoutMs, MAX_TIMER_MS);
    } catch (e) {
      return Promise.reject(e);
    }
    if (!Object.prototype.hasOwnProperty.call(RESULT_DECODERS, method)) {
      return Promise.reject(new ProtocolError(p.ErrorCode.methodNotFound, `${JSON.stringify(method)} is not a wire v1 request`));
    }
    if (this.#end !== undefined || this.#closing) {
      return Promise.reject(this.#closedError(method));
    }
    if (this.#pending.size >= this.#maxPending) {
      return Promise.reject(
        new Overloaded(10, `${this.#pending.size} requests are in flight (the client's limit); retry after 10 ms`),
      );
    }
    const id = this.#nextId++;
    const message = { jsonrpc: "2.0", id, method, params } as unknown as ClientRequest;
    if (params === undefined) delete (message as { params?: unknown }).params;
    let line: string;
    try {
      line = JSON.stringify(p.encodeClientRequest(message));
    } catch (e) {
      return Promise.reject(new InvalidParams(`cannot encode the params of ${method}: ${String(e)}`));
    }
    const size = Buffer.byteLength(line, "utf8");
    if (size > this.#maxLineBytes) {
      return Promise.reject(
        new ProtocolError(
          p.ErrorCode.invalidRequest,
          `request of ${size} bytes exceeds the ${this.#maxLineBytes}-byte limit (not sent)`,
          { size, max: this.#maxLineBytes },
        ),
      );
    }
    return new Promise<ResultOf<M>>((resolve, reject) => {
      const timer = setTimeout(() => {
        if (this.#pending.delete(id)) {
          reject(new Timeout(`no answer to ${method} within ${timeoutMs} ms (it may still take effect)`));
        }
      }, timeoutMs);
      this.#pending.set(id, { method, resolve: resolve as (v: unknown) => void, reject, timer });
      this.#write(line);
    });
  }

  /** `thread/start`: a new thread (your `threadId`, or one the server picks). */
  threadStart(params: p.ThreadStartParams = {}, options?: RequestOptions): Promise<p.ThreadStartResult> {
    return this.request("thread/start", params, options);
  }
  /** `thread/read`: the thread and a bounded page of its events after a cursor. */
  threadRead(params: p.ThreadReadParams, options?: RequestOptions): Promise<p.ThreadReadResult> {
    return this.request("thread/read", params, options);
  }
  /** `thread/resume`: events after a cursor plus the active turn, if any. */
  threadResume(params: p.ThreadResumeParams, options?: RequestOptions): Promise<p.ThreadResumeResult> {
    return this.request("thread/resume", params, options);
  }
  /** `thread/fork`: a new, independent thread from this one's history. */
  threadFork(params: p.ThreadForkParams, options?: RequestOptions): Promise<p.ThreadForkResult> {
    return this.request("thread/fork", params, options);
  }
  /** `thread/list`: a page of threads. */
  threadList(params: p.ThreadListParams = {}, options?: RequestOptions): Promise<p.ThreadListResult> {
    return this.request("thread/list", params, options);
  }
  /** `thread/archive` (-32009 while a turn is active). */
  threadArchive(params: p.ThreadArchiveParams, options?: RequestOptions): Promise<p.ThreadArchiveResult> {
    return this.request("thread/archive", params, options);
  }
  /** `thread/compact`: later turns see `summary` instead of the history before it. */
  threadCompact(params: p.ThreadCompactParams, options?: RequestOptions): Promise<p.ThreadCompactResult> {
    return this.request("thread/compact", params, options);
  }
  /** `turn/start`: returns at once; the turn reports through notifications (or use `turn()`). */
  turnStart(params: p.TurnStartParams, options?: RequestOptions): Promise<p.TurnStartResult> {
    return this.request("turn/start", params, options);
  }
  /** `turn/interrupt`: answers once the kernel has stopped (else the server's -32010). */
  turnInterrupt(params: p.TurnInterruptParams, options?: RequestOptions): Promise<p.TurnInterruptResult> {
    return this.request("turn/interrupt", params, options);
  }
  /** `graph/validate`: compiles a graph without running it. */
  graphValidate(params: p.GraphValidateParams, options?: RequestOptions): Promise<p.GraphValidateResult> {
    return this.request("graph/validate", params, options);
  }
  /** `graph/run/start`: compiles and starts a durable run (it reports through `graph/event`). */
  graphRunStart(params: p.GraphRunStartParams, options?: RequestOptions): Promise<p.GraphRunStartResult> {
    return this.request("graph/run/start", params, options);
  }
  /** `graph/run/read`: a run's state. */
  graphRunRead(params: p.GraphRunReadParams, options?: RequestOptions): Promise<p.GraphRunReadResult> {
    return this.request("graph/run/read", params, options);
  }
  /** `graph/run/cancel`: fences every outstanding attempt. */
  graphRunCancel(params: p.GraphRunCancelParams, options?: RequestOptions): Promise<p.GraphRunCancelResult> {
    return this.request("graph/run/cancel", params, options);
  }

  /**
   * Starts a turn and returns its stream: subscribed to the thread before `turn/start` is sent, so
   * nothing of the turn is missed. `for await (const n of client.turn(id, "text"))` yields that
   * turn's notifications and ends after its `turn/completed`. While the stream lasts, its thread's
   * notifications go to it, not to `notifications()`.
   */
  turn(threadId: string, input: string | UserInput[], options: TurnOptions = {}): TurnStream {
    return new TurnStream(clientCore(this), threadId, input, options);
  }

  /**
   * Every server notification, decoded into the generated `ServerNotification` union; a method
   * this version does not know (or a known one that does not decode) is kept raw as
   * `{ unknown: message }`. Buffered from the start, so nothing is missed before the first call.
   * Several iterators share one stream (each notification goes to one). Ends once `close()` is
   * called and what arrived before has been yielded; rejects with `ServerExited` when the server
   * went away on its own.
   */
  async *notifications(): AsyncGenerator<ServerNotification, void, undefined> {
    for (;;) {
      const raw = this.#take(this.#shared);
      if (raw !== undefined) {
        yield this.#decode(raw);
        continue;
      }
      const end = this.#end ?? (this.#closing ? "closed" : undefined);
      if (end !== undefined) {
        if (end === "closed") return;
        throw end;
      }
      await this.#changed();
    }
  }

  /**
   * Closes the client: requests in flight end with `Closed`, stdin is closed so the server drains
   * (its `--drain-timeout-ms`) and exits; after `closeTimeoutMs` it is killed. What had arrived
   * stays readable. Idempotent.
   */
  close(): Promise<void> {
    this.#closePromise ??= this.#close();
    return this.#closePromise;
  }

  async #close(): Promise<void> {
    this.#closing = true;
    this.#rejectPending((m) => new Closed(`the client was closed before ${m} was answered`));
    this.#approvals.stop();
    this.#notify();
    const child = this.#child;
    if (child === undefined || this.#exit !== undefined || this.#end !== undefined) {
      if (this.#end === undefined) this.#end = "closed";
      await this.#exited;
      return;
    }
    if (this.#paused) {
      this.#paused = false;
      child.stdout?.resume();
    }
    child.stdin?.end();
    const killer = setTimeout(() => {
      this.#log("warn", `cc-app-server did not exit within ${this.#closeTimeoutMs} ms of close(); killing it`);
      child.kill("SIGKILL");
    }, this.#closeTimeoutMs);
    await this.#exited;
    clearTimeout(killer);
  }

  // -- internals ---------------------------------------------------------------------------------

  #closedError(method: string): Closed {
    const end = this.#end;
    if (end instanceof ServerExited) {
      return new ServerExited(`${method} not sent: ${end.message}`, end.exitCode, end.signal, end.stderr);
    }
    if (end instanceof Closed && end.message !== "") return new Closed(`${method} not sent: ${end.message}`);
    return new Closed(`${method} not sent: the client is closed`);
  }

  #rejectPending(error: (method: string) => Error): void {
    const pending = [...this.#pending.values()];
    this.#pending.clear();
    for (const q of pending) {
      clearTimeout(q.timer);
      q.reject(error(q.method));
    }
  }

  /** The server is gone, or the client gave up on it: settle everything. */
  #finish(reason: Closed): void {
    if (this.#end !== undefined) return;
    this.#end = this.#closing ? "closed" : reason;
    if (!this.#closing) {
      if (this.#initialize !== undefined) this.#log("warn", reason.message);
      const exited = reason instanceof ServerExited ? reason : undefined;
      this.#rejectPending((m) =>
        exited !== undefined
          ? new ServerExited(`${m} got no answer: ${exited.message}`, exited.exitCode, exited.signal, exited.stderr)
          : new Closed(`${m} got no answer: ${reason.message}`),
      );
    }
    this.#approvals.stop();
    this.#notify();
  }

  #write(line: string): void {
    const stdin = this.#child?.stdin;
    if (stdin === null || stdin === undefined || stdin.destroyed || !stdin.writable) return;
    stdin.write(line + "\n");
  }

  #send(message: JsonObject): void {
    if (this.#closing || this.#end !== undefined) return;
    this.#write(JSON.stringify(message));
  }

  #onData(chunk: Buffer): void {
    let start = 0;
    for (;;) {
      const nl = chunk.indexOf(10, start);
      if (nl === -1) break;
      let line = chunk.subarray(start, nl);
      if (this.#partial.length > 0) {
        this.#partial.push(line);
        line = Buffer.concat(this.#partial, this.#partialBytes + line.length);
        this.#partial = [];
        this.#partialBytes = 0;
      }
      start = nl + 1;
      if (line.length > this.#maxInboundLineBytes) return this.#tooLong(line.length);
      this.#onLine(line);
    }
    if (start < chunk.length) {
      const rest = chunk.subarray(start);
      this.#partialBytes += rest.length;
      if (this.#partialBytes > this.#maxInboundLineBytes) return this.#tooLong(this.#partialBytes);
      this.#partial.push(rest);
    }
  }

  #tooLong(size: number): void {
    this.#partial = [];
    this.#partialBytes = 0;
    const reason = new Closed(
      `cc-app-server sent a line of more than ${this.#maxInboundLineBytes} bytes (${size} so far); the client closed the connection`,
    );
    this.#log("error", reason.message);
    this.#child?.stdout?.removeAllListeners("data");
    this.#child?.kill("SIGKILL");
    this.#finish(reason);
  }

  #onLine(line: Buffer): void {
    const text = line.toString("utf8");
    if (text.trim() === "") return;
    let message: Json;
    try {
      message = JSON.parse(text) as Json;
    } catch {
      this.#log("warn", `cc-app-server wrote a line that is not JSON; dropped: ${text.slice(0, 200)}`);
      return;
    }
    if (!isObject(message)) {
      this.#log("warn", `cc-app-server wrote JSON that is not a message; dropped: ${text.slice(0, 200)}`);
      return;
    }
    const hasMethod = Object.prototype.hasOwnProperty.call(message, "method");
    const hasId = Object.prototype.hasOwnProperty.call(message, "id");
    if (hasMethod && hasId) this.#onServerRequest(message);
    else if (hasMethod) this.#onNotification(message);
    else if (hasId) this.#onResponse(message);
    else this.#log("warn", `cc-app-server wrote an object that is not a JSON-RPC message; dropped: ${text.slice(0, 200)}`);
  }

  #onResponse(message: JsonObject): void {
    const id = message["id"];
    const q = typeof id === "number" ? this.#pending.get(id) : undefined;
    if (q === undefined) {
      if (id === null) {
        this.#log("warn", `the server refused a line it could not read: ${JSON.stringify(message["error"] ?? null)}`);
      } else {
        this.#log("debug", `an answer to request ${JSON.stringify(id)} came after it timed out or was closed; dropped`);
      }
      return;
    }
    this.#pending.delete(id as number);
    clearTimeout(q.timer);
    if (Object.prototype.hasOwnProperty.call(message, "error")) {
      q.reject(fromWireError(message["error"]));
      return;
    }
    const result = message["result"];
    try {
      q.resolve(RESULT_DECODERS[q.method](result === undefined ? null : result));
    } catch (e) {
      q.reject(
        new ProtocolError(p.ErrorCode.internal, `the result of ${q.method} does not decode: ${e instanceof Error ? e.message : String(e)}`),
      );
    }
  }

  #onServerRequest(message: JsonObject): void {
    if (this.#closing || this.#end !== undefined) return;
    const id = message["id"] === undefined ? null : (message["id"] as Json);
    if (message["method"] === "approval/decide") {
      this.#approvals.route(id, message["params"]);
      return;
    }
    this.#log("warn", `the server sent a request this client does not handle (${JSON.stringify(message["method"])}); refused`);
    this.#send({ jsonrpc: "2.0", id, error: { code: p.ErrorCode.methodNotFound, message: "the client does not handle this method" } });
  }

  #onNotification(message: JsonObject): void {
    if (this.#closing || this.#end !== undefined) return;
    const thread = threadOf(message);
    const subs = thread === undefined ? undefined : this.#subs.get(thread);
    if (subs !== undefined && subs.size > 0) {
      for (const sub of [...subs]) this.#offer(sub, message);
    } else {
      this.#shared.push(message);
      this.#buffered += 1;
    }
    this.#notify();
    if (this.#buffered >= this.#capacity && !this.#paused) {
      this.#paused = true;
      this.#child?.stdout?.pause();
      this.#log(
        "warn",
        `${this.#buffered} notifications wait unread (notificationCapacity ${this.#capacity}); the client stopped ` +
          `reading the server until some are taken (iterate client.notifications() and the turn streams)`,
      );
    }
  }

  #offer(sub: TurnSub, message: JsonObject): void {
    if (sub.turnId !== undefined && turnOf(message) !== sub.turnId) return; // another turn of the thread
    sub.queue.push(message);
    this.#buffered += 1;
    if (sub.turnId !== undefined && message["method"] === "turn/completed") this.#unroute(sub);
  }

  #unroute(sub: TurnSub): void {
    if (!sub.routed) return;
    sub.routed = false;
    const subs = this.#subs.get(sub.threadId);
    if (subs === undefined) return;
    subs.delete(sub);
    if (subs.size === 0) this.#subs.delete(sub.threadId);
  }

  #subscribe(threadId: string): TurnSub {
    const sub = new TurnSub(threadId);
    let subs = this.#subs.get(threadId);
    if (subs === undefined) this.#subs.set(threadId, (subs = new Set()));
    subs.add(sub);
    return sub;
  }

  #setTurn(sub: TurnSub, turnId: string): void {
    sub.turnId = turnId;
    this.#buffered -= sub.queue.filter((m) => turnOf(m) === turnId);
    if (sub.queue.some((m) => m["method"] === "turn/completed")) this.#unroute(sub);
    this.#resumeIfRoom();
  }

  #unsubscribe(sub: TurnSub): void {
    this.#unroute(sub);
    this.#buffered -= sub.queue.length;
    sub.queue.filter(() => false);
    this.#resumeIfRoom();
  }

  #take(queue: Queue<JsonObject>): JsonObject | undefined {
    const item = queue.shift();
    if (item !== undefined) {
      this.#buffered -= 1;
      this.#resumeIfRoom();
    }
    return item;
  }

  #resumeIfRoom(): void {
    if (this.#paused && this.#buffered <= this.#capacity / 2) {
      this.#paused = false;
      this.#child?.stdout?.resume();
    }
  }

  #decode(raw: JsonObject): ServerNotification {
    try {
      return p.decodeServerNotification(raw);
    } catch (e) {
      // A known method in a shape this version cannot read: kept rather than dropped.
      this.#log("warn", `a ${JSON.stringify(raw["method"])} notification does not decode, kept as { unknown }: ${String(e)}`);
      return { unknown: raw };
    }
  }

  #changed(): Promise<void> {
    this.#wakePromise ??= new Promise<void>((resolve) => (this.#wake = resolve));
    return this.#wakePromise;
  }

  #notify(): void {
    const wake = this.#wake;
    this.#wake = undefined;
    this.#wakePromise = undefined;
    wake?.();
  }
}

/** A turn stream dropped without being read to its end or closed gives its buffer back. */
const abandoned = new FinalizationRegistry<{ core: ClientCore; sub: TurnSub }>(({ core, sub }) => core.unsubscribe(sub));

/**
 * One turn's notifications (`client.turn(threadId, input)`): `for await` yields only this turn's
 * (same thread, same turn id) and ends after its `turn/completed`, inclusive. `turn/start` is sent
 * when the stream is made; if it fails, the first `next()` (and `started()`) rejects with its error.
 * Breaking out of the loop, or `close()`, stops following the turn (the turn itself goes on).
 */
export class TurnStream implements AsyncIterableIterator<ServerNotification> {
  readonly threadId: string;
  readonly #core: ClientCore;
  readonly #sub: TurnSub;
  readonly #started: Promise<Turn>;
  #turn: Turn | undefined;
  #texts: string[] = [];
  #completed: TurnCompletedParams | undefined;
  /** Still subscribed to the thread. */
  #following = true;
  /** `close()` or `return()` was called. */
  #stopped = false;

  /** @internal Made by `AppServerClient.turn` and `AppServerPilotClient.turn`. */
  constructor(core: ClientCore, threadId: string, input: string | UserInput[], options: TurnOptions) {
    this.threadId = threadId;
    this.#core = core;
    this.#sub = core.subscribe(threadId);
    abandoned.register(this, { core, sub: this.#sub }, this);
    const params: p.TurnStartParams = {
      threadId,
      input: typeof input === "string" ? [{ type: "text", text: input }] : input,
    };
    if (options.idempotencyKey !== undefined) params.idempotencyKey = options.idempotencyKey;
    if (options.traceparent !== undefined) params.traceparent = options.traceparent;
    this.#started = core.request("turn/start", params).then(
      (r) => {
        this.#turn = r.turn;
        if (this.#following) core.setTurn(this.#sub, r.turn.id);
        return r.turn;
      },
      (e: unknown) => {
        this.#end();
        throw e;
      },
    );
    // A stream nobody reads must not report an unhandled rejection; readers get the error.
    this.#started.catch(() => {});
  }

  /** The `Turn` that `turn/start` returned (waits for it). */
  started(): Promise<Turn> {
    return this.#started;
  }

  /** The turn, once `turn/start` has answered. */
  get turn(): Turn | undefined {
    return this.#turn;
  }

  [Symbol.asyncIterator](): this {
    return this;
  }

  async next(): Promise<IteratorResult<ServerNotification, undefined>> {
    const turn = await this.#started;
    for (;;) {
      if (this.#completed !== undefined || this.#stopped) return { done: true, value: undefined };
      const raw = this.#core.take(this.#sub);
      if (raw !== undefined) {
        const note = this.#core.decode(raw);
        this.#track(note);
        return { done: false, value: note };
      }
      const end = this.#core.ended();
      if (end !== undefined) {
        this.#end();
        const why = end === "closed" ? "the client was closed" : end.message;
        if (end instanceof ServerExited) {
          throw new ServerExited(`turn ${turn.id} did not complete: ${why}`, end.exitCode, end.signal, end.stderr);
        }
        throw new Closed(`turn ${turn.id} did not complete: ${why}`);
      }
      await this.#core.changed();
    }
  }

  async return(): Promise<IteratorResult<ServerNotification, undefined>> {
    this.close();
    return { done: true, value: undefined };
  }

  /** Stops following the turn (the turn goes on). Idempotent; done for you when the stream ends. */
  close(): void {
    this.#stopped = true;
    this.#end();
  }

  /** Reads the turn to its end and returns its `turn/completed` params, whatever the status. */
  async completion(): Promise<TurnCompletedParams> {
    for (;;) {
      const r = await this.next();
      if (r.done) break;
    }
    if (this.#completed === undefined) {
      throw new Closed(`the stream of turn ${this.#turn?.id ?? "?"} was closed before the turn completed`);
    }
    return this.#completed;
  }

  /**
   * Reads the turn to its end and returns the assistant's text (its `agentMessage` items, joined
   * with "\n"). A failed turn rejects with `KernelFailed`, an interrupted one with `TurnInterrupted`.
   */
  async text(): Promise<string> {
    const done = await this.completion();
    if (done.turn.status === "failed") {
      throw new KernelFailed(done.error?.code ?? "failed", done.error?.message ?? "the turn failed", done.turn.id);
    }
    if (done.turn.status === "interrupted") throw new TurnInterrupted(done.turn.id);
    return this.#texts.join("\n");
  }

  #track(note: ServerNotification): void {
    if (note.method === "item/completed") {
      const content = note.params.item.content;
      if (content.type === "agentMessage") this.#texts.push(content.text);
    } else if (note.method === "turn/completed") {
      this.#completed = note.params;
      this.#end();
    }
  }

  #end(): void {
    if (!this.#following) return;
    this.#following = false;
    abandoned.unregister(this);
    this.#core.unsubscribe(this.#sub);
  }
}
