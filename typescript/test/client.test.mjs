// AppServerClient against the real server: the handshake, typed requests and their error classes,
// the per-turn stream, the notification stream (unknown methods kept raw), close, and start-up
// failures.

import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import {
  AppServerClient,
  AppServerError,
  Closed,
  Conflict,
  ErrorCode,
  InvalidParams,
  KernelFailed,
  NotFound,
  ProtocolError,
  SCHEMA_DIGEST,
  ServerExited,
  TurnInterrupted,
  decodeThread,
  resolveBinary,
} from "cc-app-server";
import { BIN, SERVE_ARGS, byMethod, captureLog, collect, script, spawnClient, tempDir, within } from "./helpers.mjs";

test("spawn performs the handshake: protocol 1, the features asked for, the same schema", async () => {
  const { client } = await spawnClient();
  try {
    const init = client.initializeResult;
    assert.equal(init.protocolVersion, 1);
    assert.equal(init.downgraded, false);
    assert.ok(init.features.includes("structured_approval"), init.features.join());
    assert.ok(init.features.includes("thread_turn_item"));
    assert.equal(init.schemaDigest, SCHEMA_DIGEST, "the package's generated module is the server's schema");
    assert.equal(typeof client.pid, "number");
    assert.equal(client.pendingRequests, 0);
    assert.equal(client.closed, false);
  } finally {
    await client.close();
  }
});

test("one method per request, the generated params and results", async () => {
  const { client } = await spawnClient();
  try {
    const { thread } = await client.threadStart({ title: "first", threadId: "t-1", metadata: { k: "v" } });
    assert.equal(thread.id, "t-1");
    assert.equal(thread.title, "first");
    assert.deepEqual(thread.metadata, { k: "v" });
    assert.deepEqual(decodeThread(thread), thread, "results are decoded by the generated codecs");
    const list = await client.threadList();
    assert.deepEqual(
      list.threads.map((t) => t.id),
      ["t-1"],
    );
    const read = await client.threadRead({ threadId: "t-1" });
    assert.equal(read.thread.id, "t-1");
    assert.equal(read.events[0].payload.type, "threadStarted");
    const resumed = await client.threadResume({ threadId: "t-1" });
    assert.equal(resumed.activeTurn, null);
    const fork = await client.threadFork({ threadId: "t-1", newThreadId: "t-2", title: "fork" });
    assert.equal(fork.thread.parentThreadId, "t-1");
    const archived = await client.threadArchive({ threadId: "t-2" });
    assert.equal(archived.thread.status, "archived");
    const generic = await client.request("thread/list", { includeArchived: true });
    assert.deepEqual(generic.threads.map((t) => t.id).sort(), ["t-1", "t-2"]);
    const compact = await client.threadCompact({ threadId: "t-1", summary: "nothing yet" });
    assert.equal(compact.summary, "nothing yet");
  } finally {
    await client.close();
  }
});

test("server errors arrive as the cross-SDK classes with their codes", async () => {
  const { client } = await spawnClient();
  try {
    const missing = await client.threadRead({ threadId: "nope" }).catch((e) => e);
    assert.ok(missing instanceof NotFound && missing instanceof ProtocolError && missing instanceof AppServerError);
    assert.equal(missing.code, ErrorCode.notFound);
    assert.match(missing.serverMessage, /not found/);

    const bad = await client.threadList({ limit: 0 }).catch((e) => e);
    assert.ok(bad instanceof InvalidParams, String(bad));
    assert.equal(bad.code, -32602);
    assert.deepEqual(bad.data, { pointer: "/params/limit" });

    const badId = await client.threadStart({ threadId: "../escape" }).catch((e) => e);
    assert.ok(badId instanceof InvalidParams, String(badId));

    const again = await client
      .request("initialize", { protocolVersion: 1, minimumProtocolVersion: 1, client: { name: "x", version: "1" } })
      .catch((e) => e);
    assert.ok(again instanceof Conflict, String(again));
    assert.equal(again.code, -32009);

    const { thread } = await client.threadStart({ agentOptions: script({ type: "sleep", ms: 5000 }) });
    const first = client.turn(thread.id, "one");
    const turn = await first.started();
    const busy = await client.turnStart({ threadId: thread.id, input: [{ type: "text", text: "two" }] }).catch((e) => e);
    assert.ok(busy instanceof Conflict, String(busy));
    const interrupted = await client.turnInterrupt({ threadId: thread.id, turnId: turn.id });
    assert.equal(interrupted.turn.status, "interrupted");
    assert.equal(interrupted.physicallySettled, true);
    const err = await first.text().catch((e) => e);
    assert.ok(err instanceof TurnInterrupted, String(err));
    assert.equal(err.turnId, turn.id);
    assert.equal(err.code, -32010);
  } finally {
    await client.close();
  }
});

test("turn() streams one turn and ends after its turn/completed", async () => {
  const { client } = await spawnClient();
  try {
    const steps = [{ type: "reasoning", text: "think" }, { type: "message", text: "streamed in four", chunks: 4 }];
    const { thread } = await client.threadStart({ title: "s", agentOptions: { script: { steps } } });
    const stream = client.turn(thread.id, "hello");
    const notes = await collect(stream);
    const turn = stream.turn;
    assert.ok(turn !== undefined);
    assert.equal(notes[0].method, "turn/started");
    assert.equal(notes.at(-1).method, "turn/completed", "inclusive of turn/completed, nothing after");
    assert.equal(notes.at(-1).params.turn.status, "completed");
    for (const n of notes) {
      const id = n.params.turnId ?? n.params.turn.id;
      assert.equal(id, turn.id, `only this turn's notifications: ${n.method}`);
    }
    const deltas = byMethod(notes, "item/delta").map((n) => n.params.delta.text);
    assert.equal(deltas.length, 4);
    assert.equal(deltas.join(""), "streamed in four");
    // The next turn: text() joins the agent messages; the default kernel-less thread echoes.
    assert.equal(await client.turn(thread.id, "again").text(), "streamed in four");
    const echo = await client.threadStart({});
    assert.equal(await client.turn(echo.thread.id, [{ type: "text", text: "hi" }]).text(), "You said: hi");
  } finally {
    await client.close();
  }
});

test("a failed turn: the stream says so, text() rejects with KernelFailed", async () => {
  const { client } = await spawnClient();
  try {
    const { thread } = await client.threadStart({ agentOptions: script({ type: "fail", message: "the kernel gave up" }) });
    const done = await client.turn(thread.id, "go").completion();
    assert.equal(done.turn.status, "failed");
    const err = await client.turn(thread.id, "go").text().catch((e) => e);
    assert.ok(err instanceof KernelFailed, String(err));
    assert.equal(err.reason, done.error.code);
    assert.match(err.message, /the kernel gave up/);
  } finally {
    await client.close();
  }
});

test("turn() on a missing thread rejects on the first read, and subscribes nothing", async () => {
  const { client } = await spawnClient();
  try {
    const stream = client.turn("nope", "hi");
    await assert.rejects(collect(stream), NotFound);
    await assert.rejects(stream.started(), NotFound);
  } finally {
    await client.close();
  }
});

test("notifications(): every notification, decoded, from the start", async () => {
  const { client } = await spawnClient();
  try {
    const { thread } = await client.threadStart({ agentOptions: script({ type: "message", text: "abc", chunks: 3 }) });
    const { turn } = await client.turnStart({ threadId: thread.id, input: [{ type: "text", text: "go" }] });
    const seen = [];
    for await (const n of client.notifications()) {
      seen.push(n);
      if (n.method === "turn/completed") break;
    }
    assert.deepEqual(
      seen.map((n) => n.method),
      ["turn/started", "item/started", "item/delta", "item/delta", "item/delta", "item/completed", "turn/completed"],
    );
    assert.ok(seen.every((n) => n.params.threadId === thread.id));
    assert.equal(seen.at(-1).params.turn.id, turn.id);
    const item = byMethod(seen, "item/completed")[0].params.item;
    assert.equal(item.kind, "assistant_message");
    assert.equal(item.content.type, "agentMessage");
    assert.equal(item.content.text, "abc");
    // Breaking out lost nothing: the archive's thread/updated comes to the next loop.
    await client.threadArchive({ threadId: thread.id });
    for await (const n of client.notifications()) {
      assert.equal(n.method, "thread/updated");
      assert.equal(n.params.thread.status, "archived");
      break;
    }
  } finally {
    await client.close();
  }
});

test("an unknown notification method is kept raw; a known one that does not decode too", async () => {
  // A wrapper around the real server that writes two extra lines first.
  const dir = tempDir();
  const wrapper = path.join(dir, "wrapped-server");
  fs.writeFileSync(
    wrapper,
    "#!/bin/sh\n" +
      `printf '%s\\n' '{"jsonrpc":"2.0","method":"future/thing","params":{"threadId":"x","n":1}}' ` +
      `'{"jsonrpc":"2.0","method":"turn/started","params":{"bogus":true}}'\n` +
      'exec "$REAL_BIN" "$@"\n',
    { mode: 0o755 },
  );
  const { client, log } = await spawnClient({ bin: wrapper, env: { REAL_BIN: BIN } });
  try {
    const it = client.notifications();
    const first = (await it.next()).value;
    assert.equal(first.method, undefined, "an unknown method has no known tag");
    assert.deepEqual(first.unknown, { jsonrpc: "2.0", method: "future/thing", params: { threadId: "x", n: 1 } });
    const second = (await it.next()).value;
    assert.deepEqual(second.unknown, { jsonrpc: "2.0", method: "turn/started", params: { bogus: true } });
    assert.match(log.text(), /"turn\/started" notification does not decode, kept as \{ unknown \}/);
    await it.return();
    // The client still works.
    const { thread } = await client.threadStart({});
    assert.equal(await client.turn(thread.id, "ok").text(), "You said: ok");
  } finally {
    await client.close();
  }
});

test("close(): idempotent, in-flight requests end Closed, later requests are refused, iterators end", async () => {
  const { client } = await spawnClient();
  const iterating = collect(client.notifications());
  const { thread } = await client.threadStart({ agentOptions: script({ type: "sleep", ms: 200 }) });
  const stream = client.turn(thread.id, "go");
  await stream.started();
  const inFlight = client.threadRead({ threadId: thread.id });
  const closing = client.close();
  assert.equal(client.close(), closing, "one close");
  await assert.rejects(inFlight, (e) => e instanceof Closed && /closed before thread\/read was answered/.test(e.message));
  await within(5000, closing, "close()");
  assert.equal(client.closed, true);
  await assert.rejects(client.threadList(), Closed);
  assert.deepEqual(await within(2000, iterating, "notifications() after close"), []);
  await assert.rejects(collect(stream), (e) => e instanceof Closed && /did not complete/.test(e.message));
});

test("start-up failures: a state dir the server refuses, a binary that is not there", async () => {
  const open = tempDir();
  fs.chmodSync(open, 0o777);
  const err = await AppServerClient.spawn({ stateDir: open, bin: BIN, args: SERVE_ARGS, log: captureLog() }).catch((e) => e);
  assert.ok(err instanceof ServerExited && err instanceof Closed, String(err));
  assert.equal(err.exitCode, 1);
  assert.match(err.message, /before answering initialize/);
  assert.match(err.stderr, /chmod/, "the server's own diagnostic is in the error");

  const missing = await AppServerClient.spawn({ stateDir: tempDir(), bin: "/nonexistent/cc-app-server" }).catch((e) => e);
  assert.ok(missing instanceof Closed, String(missing));
  assert.match(missing.message, /ENOENT/);

  await assert.rejects(AppServerClient.spawn({ stateDir: tempDir(), bin: BIN, requestTimeoutMs: 0 }), RangeError);
});

test("the binary is found from bin, CC_APP_SERVER_BIN, or PATH", async () => {
  const dir = path.dirname(BIN);
  assert.equal(resolveBinary(undefined, { PATH: `/nonexistent:${dir}` }), path.join(dir, "cc-app-server"));
  assert.equal(resolveBinary(undefined, { CC_APP_SERVER_BIN: BIN, PATH: "" }), path.resolve(BIN));
  assert.equal(resolveBinary("cc-app-server", { PATH: dir }), path.join(dir, "cc-app-server"));
  assert.throws(() => resolveBinary(undefined, { PATH: "/nonexistent" }), (e) => e instanceof Closed && /PATH/.test(e.message));
  // And spawn uses it: no bin, found on PATH.
  const { client } = await spawnClient({ bin: undefined, env: { PATH: `${dir}:${process.env.PATH ?? ""}`, CC_APP_SERVER_BIN: "" } });
  await client.close();
});
