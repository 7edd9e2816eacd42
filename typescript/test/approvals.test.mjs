// The approval flow end to end: the server asks approval/decide, the handler gets the generated
// ApprovalRequest, the client answers with the bare decision, and the tool runs or not. Every way
// a decision can fail to arrive declines, says why in the decline's reason, and is logged.

import { test } from "node:test";
import assert from "node:assert/strict";
import { NO_HANDLER, TurnInterrupted } from "cc-app-server";
import { TOOL_SCRIPT, byMethod, captureLog, collect, spawnClient } from "./helpers.mjs";

/** Runs one tool turn with `approvals` and returns its notifications. */
async function toolTurn(options) {
  const { client, log } = await spawnClient(options);
  try {
    const { thread } = await client.threadStart({ title: "tool", agentOptions: { script: TOOL_SCRIPT } });
    const stream = client.turn(thread.id, "write it");
    const notes = await collect(stream);
    return { notes, log, thread, turn: stream.turn };
  } finally {
    await client.close();
  }
}

function toolResult(notes) {
  const results = byMethod(notes, "tool/result");
  assert.equal(results.length, 1);
  return results[0].params.result;
}

function resolved(notes) {
  const r = byMethod(notes, "approval/resolved");
  assert.equal(r.length, 1);
  return r[0].params;
}

test("acceptOnce: the handler gets the published ApprovalRequest, the tool runs, the turn completes", async () => {
  const asked = [];
  const { notes, thread, turn } = await toolTurn({
    approvals: async (request) => {
      asked.push(request);
      return "acceptOnce";
    },
  });
  assert.equal(asked.length, 1);
  const request = asked[0];
  assert.match(request.id, /^approval-/);
  assert.equal(request.operation.tool, "fs.write");
  assert.deepEqual(request.operation.arguments, { path: "a.txt", text: "hi" });
  assert.equal(request.risk, "medium");
  assert.equal(request.binding.threadId, thread.id);
  assert.equal(request.binding.turnId, turn.id);
  assert.equal(request.id, `approval-${request.binding.nonce}`);
  assert.deepEqual(
    notes.map((n) => n.method),
    [
      "turn/started",
      "item/started",
      "tool/requested",
      "approval/requested",
      "approval/resolved",
      "tool/result",
      "item/completed",
      "item/started",
      "item/delta",
      "item/delta",
      "item/completed",
      "turn/completed",
    ],
  );
  const r = resolved(notes);
  assert.equal(r.outcome, "approved");
  assert.deepEqual(r.decision, { kind: "acceptOnce" });
  assert.equal(r.failure, null);
  assert.equal(toolResult(notes).status, "ok");
  assert.equal(notes.at(-1).params.turn.status, "completed");
});

test("a decision object: a Decline with a reason the tool result carries", async () => {
  const { notes } = await toolTurn({ approvals: () => ({ kind: "decline", reason: "not on a Friday" }) });
  const r = resolved(notes);
  assert.equal(r.outcome, "declined");
  assert.deepEqual(r.decision, { kind: "decline", reason: "not on a Friday" });
  const result = toolResult(notes);
  assert.equal(result.status, "denied");
  assert.match(result.reason, /not on a Friday/);
  assert.equal(notes.at(-1).params.turn.status, "completed", "a decline lets the turn go on");
});

test("no handler: declined by default, with the Rust client's reason, and logged", async () => {
  const log = captureLog();
  const { notes } = await toolTurn({ log });
  const r = resolved(notes);
  assert.equal(r.outcome, "declined");
  assert.deepEqual(r.decision, { kind: "decline", reason: NO_HANDLER });
  assert.equal(toolResult(notes).status, "denied");
  const warned = log.lines.filter((l) => l.level === "warn" && /no approval handler/.test(l.message));
  assert.equal(warned.length, 1, log.text());
  assert.match(warned[0].message, /'fs\.write' \(risk medium/);
});

test("a handler that throws, rejects, or returns something that is not a decision: declined, logged", async () => {
  const cases = [
    [() => { throw new Error("boom"); }, /the approval handler failed: Error: boom/],
    [async () => { throw new TypeError("async boom"); }, /the approval handler failed: TypeError: async boom/],
    [() => "yes please", /it returned "yes please", not a decision/],
    [() => ({ kind: "acceptTwice" }), /not a decision/],
  ];
  for (const [approvals, reason] of cases) {
    const log = captureLog();
    const { notes } = await toolTurn({ approvals, log });
    const r = resolved(notes);
    assert.equal(r.outcome, "declined");
    assert.match(r.decision.reason, reason);
    assert.equal(toolResult(notes).status, "denied");
    assert.ok(log.lines.some((l) => l.level === "error"), log.text());
  }
});

test("a handler slower than approvalTimeoutMs: declined at the deadline; its late answer is ignored", async () => {
  const log = captureLog();
  const started = Date.now();
  const { notes } = await toolTurn({
    approvalTimeoutMs: 300,
    log,
    approvals: () => new Promise((resolve) => setTimeout(() => resolve("acceptOnce"), 900)),
  });
  assert.ok(Date.now() - started < 5000);
  const r = resolved(notes);
  assert.equal(r.outcome, "declined");
  assert.equal(r.decision.reason, "the approval handler did not answer in time");
  assert.equal(toolResult(notes).status, "denied");
  assert.match(log.text(), /did not answer .* within 300 ms/);
});

test("cancel: the tool does not run and the turn is interrupted", async () => {
  const { client } = await spawnClient({ approvals: () => ({ kind: "cancel", reason: "stop" }) });
  try {
    const { thread } = await client.threadStart({ agentOptions: { script: TOOL_SCRIPT } });
    const err = await client.turn(thread.id, "go").text().catch((e) => e);
    assert.ok(err instanceof TurnInterrupted, String(err));
  } finally {
    await client.close();
  }
});

test("acceptForSession: asked once, later identical calls in the session run without asking", async () => {
  let asked = 0;
  const { client } = await spawnClient({
    approvals: () => {
      asked += 1;
      return "acceptForSession";
    },
  });
  try {
    const { thread } = await client.threadStart({ agentOptions: { script: TOOL_SCRIPT } });
    assert.equal(await client.turn(thread.id, "one").text(), "done");
    assert.equal(await client.turn(thread.id, "two").text(), "done");
    assert.equal(asked, 1);
  } finally {
    await client.close();
  }
});
