// The error classes a host catches, one per error class of docs/errors.md, named as the other SDKs
// name them (Python `cc_app_server.NotFound`, Kotlin `AppServerException.NotFound`, ...). Every one
// carries the JSON-RPC `code` it stands for, so a host never parses a message.

import { ErrorCode, type Json } from "./protocol.js";

/** The base of every error this package raises. `code` is the JSON-RPC code it stands for. */
export class AppServerError extends Error {
  readonly code: number;
  constructor(message: string, code: number = ErrorCode.internal, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
    this.code = code;
  }
}

/**
 * The server answered with a JSON-RPC error (or the request was refused locally for the same
 * reason): `code`, `serverMessage` and `data` as on the wire. `NotFound`, `Conflict` and
 * `InvalidParams` are its subclasses; any other code is a plain `ProtocolError` (a line over the
 * 1 MiB cap is one with code -32600 and `data: { size, max }`).
 */
export class ProtocolError extends AppServerError {
  /** The error's `message` member as the server wrote it. */
  readonly serverMessage: string;
  /** The error's `data` member (`null` when absent). */
  readonly data: Json;
  constructor(code: number, serverMessage: string, data: Json = null) {
    super(`server error ${code}: ${serverMessage}`, code);
    this.serverMessage = serverMessage;
    this.data = data;
  }
}

/** No such thread, turn, run or item (-32004). */
export class NotFound extends ProtocolError {
  constructor(serverMessage: string, data: Json = null) {
    super(ErrorCode.notFound, serverMessage, data);
  }
}

/**
 * The request conflicts with the current state (-32009): a turn already running on the thread, an
 * idempotency key reused with other params, a second `initialize`.
 */
export class Conflict extends ProtocolError {
  constructor(serverMessage: string, data: Json = null) {
    super(ErrorCode.conflict, serverMessage, data);
  }
}

/** The params were refused (-32602), by the server (`data.pointer` names the member) or locally. */
export class InvalidParams extends ProtocolError {
  constructor(serverMessage: string, data: Json = null) {
    super(ErrorCode.invalidParams, serverMessage, data);
  }
}

/**
 * Too many requests in flight (locally: 256 pending, `retryAfterMs` 10) or a full queue on the
 * server (-32001): wait `retryAfterMs`, then retry.
 */
export class Overloaded extends AppServerError {
  readonly retryAfterMs: number;
  constructor(retryAfterMs: number, message?: string) {
    super(message ?? `overloaded; retry after ${retryAfterMs} ms`, ErrorCode.overloaded);
    this.retryAfterMs = retryAfterMs;
  }
}

/**
 * No answer within the request timeout (-32010; 120 s unless configured). Never read this as
 * success or failure: the request may still have taken effect.
 */
export class Timeout extends AppServerError {
  constructor(message: string) {
    super(message, ErrorCode.interrupted);
  }
}

/** The client or the server is closed: nothing more will arrive (-32603). */
export class Closed extends AppServerError {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, ErrorCode.internal, options);
  }
}

/**
 * The `cc-app-server` process ended on its own (a crash, a kill, a failed start): a `Closed` that
 * says how (`exitCode` or `signal`) and what it last wrote on stderr.
 */
export class ServerExited extends Closed {
  readonly exitCode: number | null;
  readonly signal: string | null;
  /** The end of the process's stderr (at most 8 KiB), where its own diagnostics are. */
  readonly stderr: string;
  constructor(message: string, exitCode: number | null, signal: string | null, stderr: string) {
    super(message);
    this.exitCode = exitCode;
    this.signal = signal;
    this.stderr = stderr;
  }
}

/**
 * A turn ended `failed` (raised by a turn stream's `text()`): `reason` is the turn error's code
 * (`kernelFailed`, `kernelPanicked`, `recordingFailed`, `outputLimitExceeded`, ...).
 */
export class KernelFailed extends AppServerError {
  readonly reason: string;
  readonly turnId: string;
  constructor(reason: string, message: string, turnId: string) {
    super(`turn ${turnId} failed (${reason}): ${message}`, ErrorCode.internal);
    this.reason = reason;
    this.turnId = turnId;
  }
}

/** A turn ended `interrupted` (raised by a turn stream's `text()`): `turnInterrupt`, a shutdown, or a cancel at an approval. */
export class TurnInterrupted extends AppServerError {
  readonly turnId: string;
  constructor(turnId: string, message?: string) {
    super(message ?? `turn ${turnId} was interrupted`, ErrorCode.interrupted);
    this.turnId = turnId;
  }
}

function isObject(v: Json | undefined): v is { [key: string]: Json } {
  return v !== null && v !== undefined && typeof v === "object" && !Array.isArray(v);
}

/** The class of a JSON-RPC error the server answered, by its code. */
export function fromWireError(error: Json | undefined): AppServerError {
  const e = isObject(error) ? error : {};
  const code = typeof e["code"] === "number" ? e["code"] : ErrorCode.internal;
  const message = typeof e["message"] === "string" ? e["message"] : "";
  const data = e["data"] === undefined ? null : e["data"];
  switch (code) {
    case ErrorCode.notFound:
      return new NotFound(message, data);
    case ErrorCode.conflict:
      return new Conflict(message, data);
    case ErrorCode.invalidParams:
      return new InvalidParams(message, data);
    case ErrorCode.overloaded: {
      const retry = isObject(data) ? data["retry_after_ms"] : undefined;
      return new Overloaded(typeof retry === "number" ? retry : 100, `server overloaded: ${message}`);
    }
  }
  return new ProtocolError(code, message, data);
}
