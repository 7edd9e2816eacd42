import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { AppServerClient, type ApprovalRequest, type Decision, type Json } from "cc-app-server";

// The built-in scripted kernel (docs/cli.md, "The script format"): one tool call, one message.
const script: Json = {
  steps: [
    { type: "tool", tool: "fs.write", arguments: { path: "hello.txt", text: "hi" } },
    { type: "message", text: "the tool was approved", chunks: 3 },
  ],
};

async function approve(request: ApprovalRequest): Promise<Decision> {
  return request.operation.tool === "fs.write" ? "acceptOnce" : "decline";
}

// `bin` is optional: $CC_APP_SERVER_BIN, bin/cc-app-server in the package, or PATH.
const client = await AppServerClient.spawn({ stateDir: mkdtempSync(join(tmpdir(), "cc-")), approvals: approve });
try {
  const { thread } = await client.threadStart({ title: "demo", agentOptions: { script } });
  for await (const n of client.turn(thread.id, "hello")) {
    // `n` is the generated ServerNotification union: narrowing on `method` types `params`.
    if (n.method === "item/delta" && n.params.delta.type === "text") process.stdout.write(n.params.delta.text);
    if (n.method === "turn/completed") console.log(`\n${n.params.turn.status}`);
  }
  console.log(await client.turn(thread.id, "again").text()); // the assistant's text, or KernelFailed/TurnInterrupted
} finally {
  await client.close();
}
