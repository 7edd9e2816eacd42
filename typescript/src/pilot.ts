// `AppServerPilotClient`: a client with a fixed set of capabilities, the object an extension hands
// to a webview. It can start, resume, fork, read, list and archive threads and start and interrupt
// turns, read notifications and follow a turn; nothing else (no generic request(), no compact, no
// graphs, no handle on the full client or the process). The full client is held in a private
// field, and instances and the prototype are frozen, so code that holds a pilot cannot reach
// further. Approval requests fail closed (declined, and logged) while no approval UI handler is
// registered.

import type * as p from "./protocol.js";
import type { ServerNotification, UserInput } from "./protocol.js";
import type { ApprovalHandler } from "./approvals.js";
import {
  AppServerClient,
  TurnStream,
  clientCore,
  spawnWithApprovals,
  type ClientCore,
  type RequestOptions,
  type SpawnOptions,
  type TurnOptions,
} from "./client.js";

/** `SpawnOptions` without `approvals`: a pilot's approvals come from `registerApprovalHandler`. */
export type PilotSpawnOptions = Omit<SpawnOptions, "approvals">;

/** The requests a pilot client may make. */
export const PILOT_METHODS = [
  "thread/start",
  "thread/resume",
  "thread/fork",
  "thread/read",
  "thread/list",
  "thread/archive",
  "turn/start",
  "turn/interrupt",
] as const;

export class AppServerPilotClient {
  readonly #client: AppServerClient;
  readonly #core: ClientCore;
  readonly #slot: { handler: ApprovalHandler | undefined };

  private constructor(client: AppServerClient, slot: { handler: ApprovalHandler | undefined }) {
    this.#client = client;
    this.#core = clientCore(client);
    this.#slot = slot;
    Object.freeze(this);
  }

  /**
   * Starts its own `cc-app-server serve` (as `AppServerClient.spawn`) and returns the pilot over
   * it; closing the pilot closes the server.
   */
  static async spawn(options: PilotSpawnOptions): Promise<AppServerPilotClient> {
    const slot: { handler: ApprovalHandler | undefined } = { handler: undefined };
    const rest: SpawnOptions & { approvals?: unknown } = { ...options };
    delete rest.approvals;
    const client = await spawnWithApprovals(rest, {
      handler: () => slot.handler,
      hint: "no approval UI handler is registered on this pilot client (registerApprovalHandler)",
    });
    return new AppServerPilotClient(client, slot);
  }

  /**
   * Registers the approval UI: `approval/decide` requests go to `handler` until the returned
   * function is called (or another handler is registered). Without one, every approval is
   * declined.
   */
  registerApprovalHandler(handler: ApprovalHandler): () => void {
    if (typeof handler !== "function") throw new TypeError("the approval handler must be a function");
    this.#slot.handler = handler;
    return () => {
      if (this.#slot.handler === handler) this.#slot.handler = undefined;
    };
  }

  /** True while an approval UI handler is registered. */
  get hasApprovalHandler(): boolean {
    return this.#slot.handler !== undefined;
  }

  threadStart(params: p.ThreadStartParams = {}, options?: RequestOptions): Promise<p.ThreadStartResult> {
    return this.#core.request("thread/start", params, options);
  }
  threadResume(params: p.ThreadResumeParams, options?: RequestOptions): Promise<p.ThreadResumeResult> {
    return this.#core.request("thread/resume", params, options);
  }
  threadFork(params: p.ThreadForkParams, options?: RequestOptions): Promise<p.ThreadForkResult> {
    return this.#core.request("thread/fork", params, options);
  }
  threadRead(params: p.ThreadReadParams, options?: RequestOptions): Promise<p.ThreadReadResult> {
    return this.#core.request("thread/read", params, options);
  }
  threadList(params: p.ThreadListParams = {}, options?: RequestOptions): Promise<p.ThreadListResult> {
    return this.#core.request("thread/list", params, options);
  }
  threadArchive(params: p.ThreadArchiveParams, options?: RequestOptions): Promise<p.ThreadArchiveResult> {
    return this.#core.request("thread/archive", params, options);
  }
  turnStart(params: p.TurnStartParams, options?: RequestOptions): Promise<p.TurnStartResult> {
    return this.#core.request("turn/start", params, options);
  }
  turnInterrupt(params: p.TurnInterruptParams, options?: RequestOptions): Promise<p.TurnInterruptResult> {
    return this.#core.request("turn/interrupt", params, options);
  }

  /** As `AppServerClient.turn`. */
  turn(threadId: string, input: string | UserInput[], options: TurnOptions = {}): TurnStream {
    return new TurnStream(this.#core, threadId, input, options);
  }

  /** As `AppServerClient.notifications`. */
  notifications(): AsyncGenerator<ServerNotification, void, undefined> {
    return this.#client.notifications();
  }

  /** True once closed. */
  get closed(): boolean {
    return this.#client.closed;
  }

  /** Closes the pilot and its server (as `AppServerClient.close`). */
  close(): Promise<void> {
    return this.#client.close();
  }
}

Object.freeze(AppServerPilotClient.prototype);
Object.freeze(AppServerPilotClient);
