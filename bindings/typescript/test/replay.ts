// Fixture replay for the generated TypeScript binding: every file under schema/fixtures/ gets the
// verdict of its folder from ajv (JSON Schema 2020-12, the canonical schema), and every valid one
// decodes with the generated types and encodes back to the same JSON. Then unit tests of the edge
// semantics. Prints `N passed, N failed` and exits 1 on any failure.

import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import Ajv2020 from "ajv/dist/2020";
import type { ValidateFunction } from "ajv";
import * as p from "../src/protocol";

type Json = p.Json;

function findRoot(): string {
  let dir = __dirname;
  for (;;) {
    if (fs.existsSync(path.join(dir, "schema", "cc-agent-protocol.schema.json"))) return dir;
    const up = path.dirname(dir);
    if (up === dir) throw new Error("no schema/cc-agent-protocol.schema.json above " + __dirname);
    dir = up;
  }
}

const ROOT = findRoot();
const FIXTURES = path.join(ROOT, "schema", "fixtures");
const schema = JSON.parse(fs.readFileSync(path.join(ROOT, "schema", "cc-agent-protocol.schema.json"), "utf8")) as {
  $id: string;
  $defs: { [name: string]: unknown };
};

// The schema's own annotations are vocabulary, not typos; `strict: false` because the profile uses
// `const` without `type` and `required` inside `oneOf`, both plain 2020-12.
const ajv = new Ajv2020({ strict: false, allErrors: false });
ajv.addVocabulary(["x-tag", "x-unknown", "x-wire-version"]);
// Our `x-max-depth` (on ClientRequest): arrays and objects nest at most N levels, the instance
// itself being the first.
function nesting(v: unknown): number {
  if (Array.isArray(v)) return 1 + v.reduce((m: number, x: unknown) => Math.max(m, nesting(x)), 0);
  if (v !== null && typeof v === "object") {
    return 1 + Object.values(v as { [k: string]: unknown }).reduce((m: number, x: unknown) => Math.max(m, nesting(x)), 0);
  }
  return 0;
}
ajv.addKeyword({
  keyword: "x-max-depth",
  schemaType: "number",
  validate: (limit: number, data: unknown) => nesting(data) <= limit,
  errors: false,
});
ajv.addSchema(schema);
const validateMessage = ajv.getSchema(schema.$id) as ValidateFunction;
const definitionValidators = new Map<string, ValidateFunction>();
function definitionValidator(name: string): ValidateFunction | undefined {
  if (!Object.prototype.hasOwnProperty.call(schema.$defs, name)) return undefined;
  let v = definitionValidators.get(name);
  if (v === undefined) {
    v = ajv.compile({ $ref: schema.$id + "#/$defs/" + name });
    definitionValidators.set(name, v);
  }
  return v;
}

/**
 * The wire parser's rules on top of JSON.parse, as the server's parser applies them before any
 * schema: at most 127 nested containers and no lone UTF-16 surrogate.
 */
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;
function parseWire(text: string): Json {
  const value = JSON.parse(text) as Json;
  const check = (v: Json, depth: number): void => {
    if (typeof v === "string") {
      if (LONE_SURROGATE.test(v)) throw new Error("lone surrogate in a string");
      return;
    }
    if (v === null || typeof v !== "object") return;
    if (depth + 1 > 127) throw new Error("nesting deeper than 127 levels");
    if (Array.isArray(v)) {
      for (const x of v) check(x, depth + 1);
    } else {
      for (const k of Object.keys(v)) {
        if (LONE_SURROGATE.test(k)) throw new Error("lone surrogate in a key");
        check(v[k] as Json, depth + 1);
      }
    }
  };
  check(value, 0);
  return value;
}

function files(dir: string): string[] {
  if (!fs.existsSync(dir)) return [];
  return fs
    .readdirSync(dir)
    .filter((f) => f.endsWith(".json"))
    .sort()
    .map((f) => path.join(dir, f));
}

let passed = 0;
let failed = 0;
const failures: string[] = [];
function record(name: string, ok: boolean, why: string): void {
  if (ok) {
    passed++;
  } else {
    failed++;
    failures.push(name + ": " + why);
  }
}

function errorText(v: ValidateFunction): string {
  return JSON.stringify((v.errors ?? []).slice(0, 3).map((e) => [e.instancePath, e.message]));
}

function replay(file: string, expectValid: boolean, definition: boolean): void {
  const name = path.relative(FIXTURES, file);
  let raw: Json;
  try {
    raw = parseWire(fs.readFileSync(file, "utf8"));
  } catch (e) {
    const parseFixture = path.basename(file).startsWith("parse-");
    record(name, !expectValid && parseFixture, "does not parse: " + String(e));
    return;
  }
  if (path.basename(file).startsWith("parse-")) {
    record(name, false, "a parse- fixture parsed");
    return;
  }
  let validator: ValidateFunction | undefined = validateMessage;
  let instance: Json = raw;
  let defName = "";
  if (definition) {
    const wrapper = raw as { [key: string]: Json };
    const keys = wrapper !== null && typeof wrapper === "object" && !Array.isArray(wrapper) ? Object.keys(wrapper).sort() : [];
    if (keys.join(",") !== "definition,value" || typeof wrapper["definition"] !== "string") {
      record(name, !expectValid, "not a {definition, value} wrapper");
      return;
    }
    defName = wrapper["definition"];
    instance = wrapper["value"] as Json;
    validator = definitionValidator(defName);
    if (validator === undefined) {
      record(name, !expectValid, "unknown definition " + defName);
      return;
    }
  }
  const accepted = validator(instance) as boolean;
  if (!expectValid) {
    record(name, !accepted, "ajv accepted an invalid fixture");
    return;
  }
  if (!accepted) {
    record(name, false, "ajv refused a valid fixture: " + errorText(validator));
    return;
  }
  try {
    const back = definition ? p.roundtripDefinition(defName, instance) : p.encodeMessage(p.decodeMessage(instance));
    assert.deepStrictEqual(back, instance);
    record(name, true, "");
  } catch (e) {
    record(name, false, "round trip: " + String(e).split("\n").slice(0, 6).join(" "));
  }
}

for (const [sub, valid, def] of [
  ["valid", true, false],
  ["valid/definitions", true, true],
  ["invalid", false, false],
  ["invalid/definitions", false, true],
] as const) {
  for (const f of files(path.join(FIXTURES, sub))) replay(f, valid, def);
}
const fixtureCount = passed + failed;

// ---- Edge semantics -------------------------------------------------------------------------

function unit(name: string, body: () => void): void {
  try {
    body();
    record("unit: " + name, true, "");
  } catch (e) {
    record("unit: " + name, false, String(e));
  }
}

unit("missing, null and present stay distinct (ThreadListParams.cursor)", () => {
  const missing = p.decodeThreadListParams({});
  assert.equal("cursor" in missing, false);
  assert.deepEqual(p.encodeThreadListParams(missing), {});
  const isNull = p.decodeThreadListParams({ cursor: null });
  assert.equal(isNull.cursor, null);
  assert.deepEqual(p.encodeThreadListParams(isNull), { cursor: null });
  const present = p.decodeThreadListParams({ cursor: "c1" });
  assert.equal(present.cursor, "c1");
  assert.deepEqual(p.encodeThreadListParams(present), { cursor: "c1" });
});

unit("required nullable refuses a missing member (Turn.completedAt)", () => {
  const turn: Json = {
    id: "t1",
    threadId: "th1",
    status: "running",
    createdAt: "2026-01-01T00:00:00.000Z",
    completedAt: null,
    revision: 1,
    terminalEvidence: null,
  };
  const decoded = p.roundtripDefinition("Turn", turn);
  assert.deepEqual(decoded, turn);
  const { completedAt: _dropped, ...without } = turn as { [key: string]: Json };
  assert.throws(() => p.decodeTurn(without), p.DecodeError);
});

unit("an unknown ItemContent type is kept as Unknown(raw)", () => {
  const raw: Json = { type: "hologram", id: "i1", frames: [1, 2, 3] };
  const item = p.decodeItemContent(raw);
  assert.equal(item.type, undefined);
  assert.ok("unknown" in item);
  assert.deepEqual(item.unknown, raw);
  assert.deepEqual(p.encodeItemContent(item), raw);
  const known = p.decodeItemContent({ type: "agentMessage", id: "i2", text: "hi" });
  switch (known.type) {
    case "agentMessage":
      assert.equal(known.text, "hi");
      break;
    default:
      assert.fail("agentMessage did not narrow");
  }
});

unit("an unknown display enum value is kept (FileChangeKind)", () => {
  const change = p.decodeFileChange({ path: "a.txt", kind: "rename" });
  assert.deepEqual(change.kind, { unknown: "rename" });
  assert.deepEqual(p.encodeFileChange(change), { path: "a.txt", kind: "rename" });
});

unit("an unknown ApprovalDecision is refused", () => {
  assert.throws(() => p.decodeApprovalDecision({ kind: "acceptAlways" }), p.DecodeError);
  assert.throws(() => p.decodeApprovalDecision({}), p.DecodeError);
  // The answer before the published wire (nonce echoed, tag `decision`) is refused.
  assert.throws(() => p.decodeApprovalDecision({ nonce: "0".repeat(32), decision: { decision: "acceptOnce" } }), p.DecodeError);
  const ok = p.decodeApprovalDecision({ kind: "decline", reason: "no" });
  assert.equal(ok.kind, "decline");
});

unit("a strict struct refuses an unknown member", () => {
  assert.throws(() => p.decodeApprovalDecision({ kind: "acceptOnce", class: "x" }), p.DecodeError);
});

unit("keyword names survive (members and Metadata keys)", () => {
  // JSON.parse makes `__proto__` an own member, as the wire does.
  const wire = JSON.parse(
    '{"metadata": {"class": 1, "in": 2, "is": 3, "self": 4, "type": 5, "default": 6, "object": 7, "from": 8, "lambda": 9, "__proto__": {"x": 10}}}',
  ) as Json;
  const decoded = p.decodeThreadStartParams(wire);
  assert.deepEqual(p.encodeThreadStartParams(decoded), wire);
  const text = p.decodeUserInput({ type: "text", text: "hello" });
  assert.deepEqual(p.encodeUserInput(text), { type: "text", text: "hello" });
});

unit("unknown members of open structs survive", () => {
  const raw: Json = { name: "cli", version: "1", class: "beta", nested: { in: [1] } };
  assert.deepEqual(p.encodeClientInfo(p.decodeClientInfo(raw)), raw);
});

unit("the envelope dispatches by method, id, result and error", () => {
  assert.equal(p.decodeMessage({ jsonrpc: "2.0", id: 1, method: "thread/list" }).kind, "ClientRequest");
  const decide = parseWire(fs.readFileSync(path.join(FIXTURES, "valid", "approval-decide-request-minimal.json"), "utf8"));
  assert.equal(p.decodeMessage(decide).kind, "ServerRequest");
  assert.equal(p.decodeMessage({ jsonrpc: "2.0", method: "future/thing", params: {} }).kind, "ServerNotification");
  assert.equal(p.decodeMessage({ jsonrpc: "2.0", id: 1, result: {} }).kind, "ClientResponse");
  assert.throws(() => p.decodeMessage({ jsonrpc: "2.0", id: 1, method: "future/thing" }), p.DecodeError);
});

unit("string request ids decode and encode as written", () => {
  const request = p.decodeMessage({ jsonrpc: "2.0", id: "req-1", method: "thread/list" });
  assert.deepEqual(p.encodeMessage(request), { jsonrpc: "2.0", id: "req-1", method: "thread/list" });
  assert.throws(() => p.decodeMessage({ jsonrpc: "2.0", id: 1.5, method: "thread/list" }));
});

unit("the generated module carries the schema digest", () => {
  assert.match(p.SCHEMA_DIGEST, /^sha256:[0-9a-f]{64}$/);
  assert.equal(p.SCHEMA_ID, schema.$id);
  assert.deepEqual([...p.DEFINITION_NAMES], Object.keys(schema.$defs));
});

for (const f of failures) console.log("FAIL " + f);
console.log(`typescript replay: ${fixtureCount} fixture files, ${passed + failed - fixtureCount} unit tests`);
console.log(`${passed} passed, ${failed} failed`);
process.exitCode = failed === 0 ? 0 : 1;
