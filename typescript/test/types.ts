// Type tests of the public API, compiled with `tsc --strict` against the installed package by
// scripts/test-typescript-client.sh (never run). Each `@ts-expect-error` must be an error.

import {
  AppServerClient,
  AppServerPilotClient,
  NotFound,
  type ApprovalHandler,
  type ResultOf,
  type ServerNotification,
  type ThreadStartResult,
  type TurnStream,
} from "cc-app-server";
import * as protocol from "cc-app-server/protocol";

export async function check(client: AppServerClient, pilot: AppServerPilotClient): Promise<void> {
  const started: ThreadStartResult = await client.threadStart({ title: "t" });
  const same: protocol.ThreadStartResult = started; // "cc-app-server/protocol" is the same module
  const listed: ResultOf<"thread/list"> = await client.request("thread/list", { limit: 5 });
  const read: protocol.ThreadReadResult = await client.request("thread/read", { threadId: same.thread.id });
  void listed;
  void read;
  // @ts-expect-error params are the generated ones: no such member
  await client.threadStart({ titel: "typo" });
  // @ts-expect-error threadId is required
  await client.threadRead({});
  // @ts-expect-error not a wire v1 method
  await client.request("thread/delete", {});
  // @ts-expect-error the pilot has no generic request()
  void pilot.request;
  // @ts-expect-error nor thread/compact
  void pilot.threadCompact;
  // @ts-expect-error a pilot's approvals come only from registerApprovalHandler
  await AppServerPilotClient.spawn({ stateDir: "s", approvals: () => "acceptOnce" });

  const handler: ApprovalHandler = async (request) =>
    request.risk === "low" ? "acceptOnce" : { kind: "decline", reason: `not ${request.operation.tool}` };
  // @ts-expect-error not a decision
  const wrong: ApprovalHandler = () => "yes";
  void handler;
  void wrong;
  const unregister: () => void = pilot.registerApprovalHandler(() => "cancel");
  unregister();

  for await (const n of client.notifications()) {
    switch (n.method) {
      case "item/delta":
        if (n.params.delta.type === "text") console.log(n.params.delta.text);
        break;
      case "turn/completed":
        console.log(n.params.turn.status, n.params.error?.code);
        break;
      case undefined: {
        const raw: protocol.JsonObject = n.unknown; // an unknown method, kept raw
        void raw;
        break;
      }
    }
  }
  const stream: TurnStream = client.turn(started.thread.id, "x");
  for await (const n of stream) {
    const note: ServerNotification = n;
    void note;
  }
  const text: string = await pilot.turn(started.thread.id, [{ type: "text", text: "y" }]).text();
  void text;
  try {
    await client.threadRead({ threadId: "missing" });
  } catch (e) {
    if (e instanceof NotFound) console.log(e.code, e.serverMessage, e.data);
  }
}
