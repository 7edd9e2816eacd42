/** Any JSON value. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** A JSON object. */
export type JsonObject = { [key: string]: Json };

/**
 * A display union's case this version does not know, kept as sent. Its tag reads as `undefined`,
 * so a `switch` on the tag leaves it in `default`.
 */
export type UnknownCase<Tag extends string> = { [K in Tag]?: undefined } & { unknown: JsonObject };

/** A display enum's value this version does not know, kept as sent. */
export interface UnknownValue {
  unknown: string;
}

/** A value that does not have the shape its type needs; `path` points at it. */
export class DecodeError extends Error {
  readonly path: string;
  constructor(path: string, message: string) {
    super(path + ": " + message);
    this.name = "DecodeError";
    this.path = path;
  }
}

function memberPath(path: string, key: string): string {
  return /^[A-Za-z_$][A-Za-z0-9_$]*$/.test(key) ? path + "." + key : path + "[" + JSON.stringify(key) + "]";
}

/** Sets a member even when its name is `__proto__`. */
function setMember(target: { [key: string]: unknown }, key: string, value: unknown): void {
  Object.defineProperty(target, key, { value, enumerable: true, writable: true, configurable: true });
}

function kindOf(raw: Json): string {
  return raw === null ? "null" : Array.isArray(raw) ? "array" : typeof raw;
}

function decObject(raw: Json, path: string): JsonObject {
  if (raw === null || typeof raw !== "object" || Array.isArray(raw)) {
    throw new DecodeError(path, "expected an object, got " + kindOf(raw));
  }
  return raw;
}

function requireMembers(o: JsonObject, path: string, names: string[]): void {
  for (const n of names) {
    if (!Object.prototype.hasOwnProperty.call(o, n)) {
      throw new DecodeError(memberPath(path, n), "missing");
    }
  }
}

function decString(raw: Json, path: string): string {
  if (typeof raw !== "string") throw new DecodeError(path, "expected a string, got " + kindOf(raw));
  return raw;
}

function decNumber(raw: Json, path: string): number {
  if (typeof raw !== "number") throw new DecodeError(path, "expected a number, got " + kindOf(raw));
  return raw;
}

function decInteger(raw: Json, path: string): number {
  const n = decNumber(raw, path);
  if (!Number.isInteger(n)) throw new DecodeError(path, "expected an integer");
  return n;
}

function decUnsigned(raw: Json, path: string): number {
  const n = decInteger(raw, path);
  if (n < 0) throw new DecodeError(path, "expected an integer >= 0");
  return n;
}

function decUnsignedOrString(raw: Json, path: string): number | string {
  if (typeof raw === "string") return raw;
  return decUnsigned(raw, path);
}

function decBoolean(raw: Json, path: string): boolean {
  if (typeof raw !== "boolean") throw new DecodeError(path, "expected a boolean, got " + kindOf(raw));
  return raw;
}

function decJson(raw: Json, _path: string): Json {
  return raw;
}

function decConst<T extends Json>(raw: Json, path: string, expected: T): T {
  if (raw !== expected) throw new DecodeError(path, "expected " + JSON.stringify(expected));
  return expected;
}

function decArray<T>(raw: Json, path: string, item: (raw: Json, path: string) => T): T[] {
  if (!Array.isArray(raw)) throw new DecodeError(path, "expected an array, got " + kindOf(raw));
  return raw.map((v, i) => item(v, path + "[" + i + "]"));
}

function decMap<T>(raw: Json, path: string, item: (raw: Json, path: string) => T): { [key: string]: T } {
  const o = decObject(raw, path);
  const out: { [key: string]: T } = {};
  for (const k of Object.keys(o)) {
    Object.defineProperty(out, k, {
      value: item(o[k] as Json, memberPath(path, k)),
      enumerable: true,
      writable: true,
      configurable: true,
    });
  }
  return out;
}

function encPlain(value: Json): Json {
  return value;
}

function encArray<T>(value: T[], item: (value: T) => Json): Json {
  return value.map(item);
}

function encMap<T>(value: { [key: string]: T }, item: (value: T) => Json): Json {
  const out: JsonObject = {};
  for (const k of Object.keys(value)) {
    setMember(out, k, item(value[k] as T));
  }
  return out;
}

