// Shared by the suite: every test drives the real `cc-app-server serve` ($CC_APP_SERVER_BIN),
// each on its own private state directory. scripts/test-typescript-client.sh runs these files
// from a fresh directory where the packed tarball is installed, so `cc-app-server` here is the
// package as a user gets it.

import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { AppServerClient } from "cc-app-server";

export const BIN = process.env.CC_APP_SERVER_BIN ?? "";
if (BIN === "") throw new Error("set CC_APP_SERVER_BIN to the cc-app-server binary");

/** Fast and short-lived servers: nothing to keep after the test. */
export const SERVE_ARGS = ["--durability", "ephemeral", "--drain-timeout-ms", "500"];

const dirs = [];
process.on("exit", () => {
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
});

/** A fresh 0700 directory. */
export function tempDir(prefix = "cc-ts-") {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
  dirs.push(d);
  return d;
}

/** A logger that keeps what it is told. */
export function captureLog() {
  const lines = [];
  const log = (level, message) => lines.push({ level, message });
  log.lines = lines;
  log.text = () => lines.map((l) => `${l.level}: ${l.message}`).join("\n");
  return log;
}

/** A client on a fresh state dir; `options` override the defaults. */
export async function spawnClient(options = {}) {
  const log = options.log ?? captureLog();
  const client = await AppServerClient.spawn({
    stateDir: tempDir(),
    bin: BIN,
    args: SERVE_ARGS,
    log,
    ...options,
  });
  return { client, log };
}

/** The scripted kernel: one tool call through the approval gate, then a message. */
export const TOOL_SCRIPT = {
  steps: [
    { type: "tool", tool: "fs.write", arguments: { path: "a.txt", text: "hi" } },
    { type: "message", text: "done", chunks: 2 },
  ],
};

export function script(...steps) {
  return { script: { steps } };
}

/** Every notification of a turn stream, in order. */
export async function collect(stream) {
  const out = [];
  for await (const n of stream) out.push(n);
  return out;
}

export function byMethod(notes, method) {
  return notes.filter((n) => n.method === method);
}

/** Rejects after `ms` (so a hang fails the test instead of stalling the suite). */
export function within(ms, promise, what = "the operation") {
  let timer;
  const limit = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} did not settle within ${ms} ms`)), ms);
  });
  return Promise.race([promise, limit]).finally(() => clearTimeout(timer));
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Stops the server (SIGSTOP) and waits until it is stopped, so it answers nothing from then on. */
export async function stop(pid) {
  process.kill(pid, "SIGSTOP");
  const stat = `/proc/${pid}/stat`;
  if (!fs.existsSync(stat)) return sleep(100);
  for (let waited = 0; waited < 5000; waited += 5) {
    // The state is the field after the parenthesised command name.
    const state = fs.readFileSync(stat, "utf8").replace(/^.*\) /s, "")[0];
    if (state === "T" || state === "t") return;
    await sleep(5);
  }
  throw new Error(`process ${pid} did not stop`);
}
