// The client's local bounds at their edges, against the real server: 256 requests in flight and
// the 257th refused (-32001), the request timeout (-32010), the 1 MiB line cap (inclusive), bounded
// notification buffering (backpressure, nothing lost), and a server that dies mid-turn (everything
// pending rejected with a clear error, nothing hangs). A stopped server (SIGSTOP) is one that does
// not answer.

import { test } from "node:test";
import assert from "node:assert/strict";
import {
  Closed,
  DEFAULT_REQUEST_TIMEOUT_MS,
  ErrorCode,
  MAX_LINE_BYTES,
  MAX_PENDING_REQUESTS,
  Overloaded,
  ProtocolError,
  ServerExited,
  Timeout,
} from "cc-app-server";
import { collect, script, sleep, spawnClient, stop, within } from "./helpers.mjs";

/** Runs `body` with the server stopped, and always lets it go on again. */
async function whileStopped(client, body) {
  await stop(client.pid);
  try {
    return await body();
  } finally {
    process.kill(client.pid, "SIGCONT");
  }
}

test("the defaults are the Rust client's", () => {
  assert.equal(MAX_PENDING_REQUESTS, 256);
  assert.equal(DEFAULT_REQUEST_TIMEOUT_MS, 120_000);
  assert.equal(MAX_LINE_BYTES, 1_048_576);
});

test("256 requests in flight are accepted; the 257th is refused locally with -32001, then all 256 are answered", async () => {
  const { client } = await spawnClient();
  try {
    const { answers, refused } = await whileStopped(client, async () => {
      const answers = [];
      for (let i = 0; i < 256; i++) answers.push(client.threadList());
      assert.equal(client.pendingRequests, 256);
      const refused = await client.threadList().catch((e) => e);
      assert.equal(client.pendingRequests, 256, "the refused one was never pending");
      return { answers, refused };
    });
    assert.ok(refused instanceof Overloaded, String(refused));
    assert.equal(refused.code, ErrorCode.overloaded);
    assert.equal(refused.code, -32001);
    assert.equal(refused.retryAfterMs, 10);
    const results = await within(20_000, Promise.all(answers), "256 answers");
    assert.equal(results.length, 256);
    assert.ok(results.every((r) => Array.isArray(r.threads)));
    assert.equal(client.pendingRequests, 0);
    // And there is room again.
    await client.threadList();
  } finally {
    await client.close();
  }
});

test("a request unanswered within the timeout fails with Timeout (-32010); its late answer is dropped", async () => {
  const { client } = await spawnClient({ requestTimeoutMs: 300 });
  try {
    await whileStopped(client, async () => {
      const started = Date.now();
      const err = await client.threadList().catch((e) => e);
      const took = Date.now() - started;
      assert.ok(err instanceof Timeout, String(err));
      assert.equal(err.code, ErrorCode.interrupted);
      assert.equal(err.code, -32010);
      assert.ok(took >= 290 && took < 3000, `timed out after ${took} ms`);
      assert.equal(client.pendingRequests, 0);
      // Per request, too.
      const one = await client.threadList({}, { timeoutMs: 50 }).catch((e) => e);
      assert.ok(one instanceof Timeout);
    });
    // The late answers arrive and are dropped; the next request gets its own.
    const { threads } = await client.threadList({}, { timeoutMs: 10_000 });
    assert.deepEqual(threads, []);
  } finally {
    await client.close();
  }
});

test("the line cap: a request of exactly 1 MiB is sent and served; one byte more is refused locally (-32600)", async () => {
  const { client } = await spawnClient();
  try {
    const big = (n) => ({ metadata: { pad: "x".repeat(n) } });
    // Ids are 2, 3, 4 (initialize was 1): one digit each, so the envelope is the same size.
    const probe = await client.threadStart(big(MAX_LINE_BYTES)).catch((e) => e);
    assert.ok(probe instanceof ProtocolError, String(probe));
    assert.equal(probe.code, ErrorCode.invalidRequest);
    const envelope = probe.data.size - MAX_LINE_BYTES;
    assert.equal(probe.data.max, MAX_LINE_BYTES);

    const atCap = await client.threadStart(big(MAX_LINE_BYTES - envelope));
    assert.equal(atCap.thread.metadata.pad.length, MAX_LINE_BYTES - envelope, "served: the cap is inclusive");

    const over = await client.threadStart(big(MAX_LINE_BYTES - envelope + 1)).catch((e) => e);
    assert.ok(over instanceof ProtocolError, String(over));
    assert.equal(over.code, -32600);
    assert.deepEqual(over.data, { size: MAX_LINE_BYTES + 1, max: MAX_LINE_BYTES });
    assert.match(over.message, /not sent/);
    assert.equal(client.pendingRequests, 0);
    // Multi-byte text counts in UTF-8 bytes.
    const wide = await client.threadStart({ metadata: { pad: "é".repeat(MAX_LINE_BYTES / 2) } }).catch((e) => e);
    assert.ok(wide instanceof ProtocolError && wide.data.size > MAX_LINE_BYTES);
    assert.equal((await client.threadList()).threads.length, 1);
  } finally {
    await client.close();
  }
});

test("a line from the server over maxInboundLineBytes closes the client with a clear error", async () => {
  const { client, log } = await spawnClient({ maxInboundLineBytes: 4096 });
  // Its result (about 3.3 KB) fits; thread/read's (the metadata twice) does not.
  const { thread } = await client.threadStart({ metadata: { pad: "z".repeat(3000) } });
  const err = await client.threadRead({ threadId: thread.id }).catch((e) => e);
  assert.ok(err instanceof Closed, String(err));
  assert.match(err.message, /got no answer: cc-app-server sent a line of more than 4096 bytes/);
  assert.equal(client.closed, true);
  assert.match(log.text(), /more than 4096 bytes/);
  await within(2000, client.close(), "close()");
});

test("notifications nobody reads are bounded: the client stops reading the server, then delivers all in order", async () => {
  const { client, log } = await spawnClient({ notificationCapacity: 8 });
  try {
    const deltas = 200;
    const { thread } = await client.threadStart({
      agentOptions: script({ type: "message", text: "y".repeat(deltas), chunks: deltas }),
    });
    await client.turnStart({ threadId: thread.id, input: [{ type: "text", text: "go" }] });
    for (let waited = 0; !/notifications wait unread/.test(log.text()); waited += 20) {
      assert.ok(waited < 10_000, "the client never stopped reading");
      await sleep(20);
    }
    assert.match(log.text(), /notifications wait unread \(notificationCapacity 8\)/);
    let text = "";
    let lastSeq = 0;
    for await (const n of client.notifications()) {
      assert.ok(n.params.eventSeq > lastSeq, "in order");
      lastSeq = n.params.eventSeq;
      if (n.method === "item/delta") text += n.params.delta.text;
      if (n.method === "turn/completed") break;
    }
    assert.equal(text, "y".repeat(deltas), "nothing lost");
    await client.threadList();
  } finally {
    await client.close();
  }
});

test("the server dies mid-turn: every pending request and stream rejects with ServerExited; nothing hangs", async () => {
  const { client, log } = await spawnClient();
  const { thread } = await client.threadStart({ agentOptions: script({ type: "sleep", ms: 30_000 }) });
  const stream = client.turn(thread.id, "go");
  const first = await stream.next();
  assert.equal(first.value.method, "turn/started");
  const everything = collect(client.notifications());
  await stop(client.pid);
  const pending = [client.threadRead({ threadId: thread.id }), client.threadList(), client.threadResume({ threadId: thread.id })];
  assert.equal(client.pendingRequests, 3);
  process.kill(client.pid, "SIGKILL");

  const results = await within(5000, Promise.allSettled(pending), "the pending requests");
  for (const r of results) {
    assert.equal(r.status, "rejected");
    assert.ok(r.reason instanceof ServerExited && r.reason instanceof Closed, String(r.reason));
    assert.equal(r.reason.signal, "SIGKILL");
    assert.match(r.reason.message, /got no answer: cc-app-server was killed by SIGKILL/);
  }
  const streamErr = await within(5000, collect(stream).catch((e) => e), "the turn stream");
  assert.ok(streamErr instanceof ServerExited, String(streamErr));
  assert.match(streamErr.message, /did not complete/);
  const iterErr = await within(5000, everything.catch((e) => e), "notifications()");
  assert.ok(iterErr instanceof ServerExited, String(iterErr));
  assert.equal(client.closed, true);
  assert.equal(client.pendingRequests, 0);
  const late = await client.threadList().catch((e) => e);
  assert.ok(late instanceof ServerExited && /not sent/.test(late.message), String(late));
  assert.match(log.text(), /killed by SIGKILL/);
  await within(2000, client.close(), "close() after the crash");
});
