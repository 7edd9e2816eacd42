// Approval handlers. The server asks `approval/decide` with the published `ApprovalRequest`; the
// client answers with the bare published `ApprovalDecision` (the server holds the binding against
// the request id). Anything but a decision in time fails closed, as in the Rust client: no handler,
// a handler that throws or rejects, a value that is not a decision, no answer within the approval
// timeout, too many approvals at once. Each decline says why, in its `reason` (which the denied
// tool result carries) and in the client's log.

import {
  decodeApprovalDecision,
  decodeApprovalRequest,
  encodeApprovalDecision,
  type ApprovalDecision,
  type ApprovalRequest,
  type Json,
} from "./protocol.js";

/** A decision by its wire `kind`: `"acceptOnce"`, `"acceptForTurn"`, `"acceptForSession"`, `"decline"`, `"cancel"`. */
export type DecisionName = ApprovalDecision["kind"];

/** What a handler returns: a decision's `kind`, or the whole generated `ApprovalDecision` (a `Decline` with its `reason`, grants...). */
export type Decision = DecisionName | ApprovalDecision;

/**
 * Decides one `approval/decide` request: gets the generated `ApprovalRequest` (id, binding,
 * operation, risk, reason) and returns (or resolves to) a decision.
 */
export type ApprovalHandler = (request: ApprovalRequest) => Decision | Promise<Decision>;

/** Where the client's diagnostics go (default: warnings and errors to stderr). */
export type Logger = (level: "debug" | "info" | "warn" | "error", message: string) => void;

/** The decline reason when a client has no handler: the Rust client's own words. */
export const NO_HANDLER = "no approval handler is configured on this client";
const TOO_SLOW = "the approval handler did not answer in time";
const NO_ROOM = "the client's approval handlers are all busy and its queue is full";
/** The published reason holds 2,048 characters; a handler's error text gets at most 1,900. */
const MAX_REASON = 1900;

const NAMES: ReadonlySet<string> = new Set<DecisionName>([
  "acceptOnce",
  "acceptForTurn",
  "acceptForSession",
  "decline",
  "cancel",
]);

function decline(reason: string): ApprovalDecision {
  return { kind: "decline", reason };
}

/** The decision `value` stands for, or `undefined` when it is none. */
export function toDecision(value: unknown): ApprovalDecision | undefined {
  if (typeof value === "string") {
    return NAMES.has(value) ? decodeApprovalDecision({ kind: value }) : undefined;
  }
  if (value === null || typeof value !== "object") return undefined;
  try {
    // Through JSON and the generated decoder: a decision this version would not send is refused.
    return decodeApprovalDecision(JSON.parse(JSON.stringify(value)) as Json);
  } catch {
    return undefined;
  }
}

function describe(request: ApprovalRequest): string {
  const b = request.binding;
  return `'${request.operation.tool}' (risk ${request.risk}, thread ${b.threadId}, turn ${b.turnId}, item ${b.itemId})`;
}

function show(value: unknown): string {
  try {
    return typeof value === "string" ? JSON.stringify(value) : String(JSON.stringify(value) ?? value);
  } catch {
    return String(value);
  }
}

/**
 * Runs the handler for each approval/decide, at most `maxOutstanding` at once, and answers each
 * exactly once through `answer`.
 */
export class ApprovalRouter {
  private outstanding = 0;
  private readonly timers = new Set<ReturnType<typeof setTimeout>>();

  constructor(
    private readonly handler: () => ApprovalHandler | undefined,
    private readonly timeoutMs: number,
    private readonly maxOutstanding: number,
    private readonly answer: (id: Json, decision: Json) => void,
    private readonly log: Logger,
    private readonly noHandlerHint: string,
  ) {}

  route(id: Json, params: Json | undefined): void {
    let request: ApprovalRequest;
    try {
      request = decodeApprovalRequest(params === undefined ? null : params);
    } catch (e) {
      this.log("error", `an approval request does not match the published ApprovalRequest (${String(e)}); declined`);
      this.answer(id, encodeApprovalDecision(decline("the approval request does not match the published ApprovalRequest")));
      return;
    }
    const what = describe(request);
    const handler = this.handler();
    if (handler === undefined) {
      this.log("warn", `approval requested for ${what} but ${this.noHandlerHint}; declined`);
      this.answer(id, encodeApprovalDecision(decline(NO_HANDLER)));
      return;
    }
    if (this.outstanding >= this.maxOutstanding) {
      this.log("warn", `approval requested for ${what} while ${this.outstanding} are being decided; declined`);
      this.answer(id, encodeApprovalDecision(decline(NO_ROOM)));
      return;
    }
    this.outstanding += 1;
    let done = false;
    const finish = (decision: ApprovalDecision): void => {
      if (done) return;
      done = true;
      this.outstanding -= 1;
      clearTimeout(timer);
      this.timers.delete(timer);
      this.answer(id, encodeApprovalDecision(decision));
    };
    const timer = setTimeout(() => {
      this.log("warn", `the approval handler did not answer ${what} within ${this.timeoutMs} ms; declined`);
      finish(decline(TOO_SLOW));
    }, this.timeoutMs);
    this.timers.add(timer);
    let result: Decision | Promise<Decision>;
    try {
      result = handler(request);
    } catch (e) {
      this.failed(what, e, finish);
      return;
    }
    Promise.resolve(result).then(
      (value) => {
        if (done) {
          this.log("warn", `the approval handler answered ${what} after its ${this.timeoutMs} ms deadline; it was already declined`);
          return;
        }
        const decision = toDecision(value);
        if (decision === undefined) {
          this.log(
            "error",
            `the approval handler returned ${show(value)} for ${what}; expected one of 'acceptOnce', 'acceptForTurn', ` +
              `'acceptForSession', 'decline', 'cancel' or an ApprovalDecision object; declined`,
          );
          finish(decline(`the approval handler failed: it returned ${show(value).slice(0, MAX_REASON)}, not a decision`));
          return;
        }
        finish(decision);
      },
      (e: unknown) => this.failed(what, e, finish),
    );
  }

  private failed(what: string, e: unknown, finish: (d: ApprovalDecision) => void): void {
    const text = e instanceof Error ? `${e.name}: ${e.message}` : String(e);
    this.log("error", `the approval handler failed for ${what}; declined: ${text}`);
    finish(decline(`the approval handler failed: ${text.slice(0, MAX_REASON)}`));
  }

  /** Stops every deadline (the connection is gone; nothing can be answered any more). */
  stop(): void {
    for (const t of this.timers) clearTimeout(t);
    this.timers.clear();
  }
}
