// AppServerPilotClient: exactly the fixed capabilities (thread start/resume/fork/read/list/archive,
// turn start/interrupt, the notification and turn streams), nothing to reach the full client by,
// and approvals that fail closed unless an approval UI handler is registered.

import { test } from "node:test";
import assert from "node:assert/strict";
import { AppServerPilotClient, NO_HANDLER, PILOT_METHODS } from "cc-app-server";
import { BIN, SERVE_ARGS, TOOL_SCRIPT, byMethod, captureLog, collect, tempDir } from "./helpers.mjs";

async function spawnPilot(log = captureLog()) {
  const pilot = await AppServerPilotClient.spawn({ stateDir: tempDir(), bin: BIN, args: SERVE_ARGS, log });
  return { pilot, log };
}

test("a fixed surface: only the pilot's requests, no generic request(), nothing to reach further", async () => {
  const { pilot } = await spawnPilot();
  try {
    const names = Object.getOwnPropertyNames(AppServerPilotClient.prototype).filter((n) => n !== "constructor").sort();
    assert.deepEqual(names, [
      "close",
      "closed",
      "hasApprovalHandler",
      "notifications",
      "registerApprovalHandler",
      "threadArchive",
      "threadFork",
      "threadList",
      "threadRead",
      "threadResume",
      "threadStart",
      "turn",
      "turnInterrupt",
      "turnStart",
    ]);
    assert.deepEqual([...PILOT_METHODS], [
      "thread/start", "thread/resume", "thread/fork", "thread/read", "thread/list", "thread/archive", "turn/start", "turn/interrupt",
    ]);
    for (const absent of ["request", "threadCompact", "graphRunStart", "graphValidate", "pid", "client"]) {
      assert.equal(pilot[absent], undefined, absent);
    }
    assert.deepEqual(Object.keys(pilot), [], "no own properties: the client is in a private field");
    assert.ok(Object.isFrozen(pilot) && Object.isFrozen(AppServerPilotClient.prototype));
    assert.throws(() => {
      AppServerPilotClient.prototype.request = () => {};
    }, TypeError);

    const { thread } = await pilot.threadStart({ title: "webview" });
    assert.equal((await pilot.threadRead({ threadId: thread.id })).thread.title, "webview");
    assert.equal((await pilot.threadResume({ threadId: thread.id })).activeTurn, null);
    const fork = await pilot.threadFork({ threadId: thread.id });
    assert.equal((await pilot.threadList()).threads.length, 2);
    assert.equal((await pilot.threadArchive({ threadId: fork.thread.id })).thread.status, "archived");
    assert.equal(await pilot.turn(thread.id, "hi").text(), "You said: hi");
    const { turn } = await pilot.turnStart({ threadId: thread.id, input: [{ type: "text", text: "again" }] });
    for await (const n of pilot.notifications()) {
      if (n.method === "turn/completed" && n.params.turn.id === turn.id) break;
    }
  } finally {
    await pilot.close();
  }
  assert.equal(pilot.closed, true);
});

test("approvals fail closed until an approval UI handler is registered, and again once it is removed", async () => {
  const { pilot, log } = await spawnPilot();
  try {
    const { thread } = await pilot.threadStart({ agentOptions: { script: TOOL_SCRIPT } });
    const resolvedOf = async () => {
      const notes = await collect(pilot.turn(thread.id, "write"));
      return byMethod(notes, "approval/resolved")[0].params;
    };

    assert.equal(pilot.hasApprovalHandler, false);
    const before = await resolvedOf();
    assert.equal(before.outcome, "declined");
    assert.deepEqual(before.decision, { kind: "decline", reason: NO_HANDLER });
    assert.match(log.text(), /no approval UI handler is registered on this pilot client/);

    const asked = [];
    const unregister = pilot.registerApprovalHandler(async (request) => {
      asked.push(request.operation.tool);
      return "acceptOnce";
    });
    assert.equal(pilot.hasApprovalHandler, true);
    const during = await resolvedOf();
    assert.equal(during.outcome, "approved");
    assert.deepEqual(asked, ["fs.write"]);

    unregister();
    assert.equal(pilot.hasApprovalHandler, false);
    const after = await resolvedOf();
    assert.equal(after.outcome, "declined");
    assert.deepEqual(asked, ["fs.write"], "the removed handler is not asked");
    assert.throws(() => pilot.registerApprovalHandler("acceptOnce"), TypeError);
  } finally {
    await pilot.close();
  }
});

test("a pilot cannot be given an approval handler at spawn", async () => {
  const pilot = await AppServerPilotClient.spawn({
    stateDir: tempDir(),
    bin: BIN,
    args: SERVE_ARGS,
    log: captureLog(),
    approvals: () => "acceptOnce",
  });
  try {
    const { thread } = await pilot.threadStart({ agentOptions: { script: TOOL_SCRIPT } });
    const notes = await collect(pilot.turn(thread.id, "write"));
    assert.equal(byMethod(notes, "approval/resolved")[0].params.outcome, "declined");
  } finally {
    await pilot.close();
  }
});
