//! The TypeScript target: one module, `bindings/typescript/src/protocol.ts`, of interfaces that keep
//! every wire name as the property name, plus a decoder and an encoder per definition.
//!
//! - optional → `field?: T`, nullable → `field: T | null`, optional-nullable → `field?: T | null`;
//!   the decoders copy only the members that are there, so missing never turns into `undefined`
//!   or `null` on the way back out.
//! - a tagged union is a discriminated union on its tag: every branch interface carries its tag as
//!   a literal type. A display (`keep_unknown`) union adds `UnknownCase<"tag">` (the raw object,
//!   whose tag reads as `undefined`, so a `switch` on the tag narrows the known branches and leaves
//!   the unknown one in `default`); a display enum adds `UnknownValue` (the raw string). Strict
//!   unions and enums throw `DecodeError` on a value they do not know.
//! - open structs (`additionalProperties: true`) keep members this version does not know on the
//!   decoded object, so they survive a round trip; strict structs refuse them.
//! - the decoders check shapes (types, presence, null, constants, tags); lengths, patterns and
//!   ranges are the schema validator's job.

use super::emit::{
    assert_no_clash, camel_from_pascal, error_codes, per_def, union_tags, walk, Target, TypeNames,
    UnionDef,
};
use super::model::{Def, Field, Model, Ty};
use super::GeneratedFile;
use serde_json::Value;
use std::fmt::Write;
use std::path::PathBuf;

/// Where the generated module goes.
pub const PATH: &str = "bindings/typescript/src/protocol.ts";

/// Names the runtime part of the module defines; no definition may use them.
const RESERVED: &[&str] = &[
    "Json",
    "JsonObject",
    "DecodeError",
    "UnknownCase",
    "UnknownValue",
    "Message",
    "SCHEMA_DIGEST",
    "SCHEMA_ID",
    "DEFINITION_NAMES",
    "ErrorCode",
];

/// The envelope's parts, as the schema profile (docs/schema.md) names them.
const ENVELOPE: &[&str] = &[
    "ClientRequest",
    "ClientResponse",
    "ServerRequest",
    "ServerNotification",
];

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == '$')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
}

/// A property name: plain when it is an identifier (reserved words are legal property names),
/// a JSON-quoted string otherwise.
pub fn property_name(wire: &str) -> String {
    if is_identifier(wire) {
        wire.to_string()
    } else {
        json_string(wire)
    }
}

fn json_string(s: &str) -> String {
    serde_json::to_string(s).expect("a string serializes")
}

/// How this target spells each type expression.
const TYPES: TypeNames = TypeNames {
    string: "string",
    signed: "number",
    unsigned: "number",
    number: "number",
    boolean: "boolean",
    integer_or_string: "number | string",
    json: "Json",
    array: ["Array<", ">"],
    map: ["{ [key: string]: ", " }"],
};

fn ty(t: &Ty) -> String {
    TYPES.spell(t)
}

/// An expression of type `(raw: Json, path: string) => T`.
fn decoder(t: &Ty) -> String {
    match t {
        Ty::String => "decString".into(),
        Ty::Integer { signed: true } => "decInteger".into(),
        Ty::Integer { signed: false } => "decUnsigned".into(),
        Ty::Number => "decNumber".into(),
        Ty::Boolean => "decBoolean".into(),
        Ty::IntegerOrString => "decUnsignedOrString".into(),
        Ty::Json => "decJson".into(),
        Ty::Named(n) => format!("decode{n}"),
        Ty::Array(inner) => format!("(r: Json, p: string) => decArray(r, p, {})", decoder(inner)),
        Ty::Map(inner) => format!("(r: Json, p: string) => decMap(r, p, {})", decoder(inner)),
    }
}

/// An expression of type `(value: T) => Json`.
fn encoder(t: &Ty) -> String {
    match t {
        Ty::String
        | Ty::Integer { .. }
        | Ty::Number
        | Ty::Boolean
        | Ty::IntegerOrString
        | Ty::Json => "encPlain".into(),
        Ty::Named(n) => format!("encode{n}"),
        Ty::Array(inner) => format!("(v: {}) => encArray(v, {})", ty(t), encoder(inner)),
        Ty::Map(inner) => format!("(v: {}) => encMap(v, {})", ty(t), encoder(inner)),
    }
}

/// A function expression in call position: arrow functions need parentheses.
fn call(f: String) -> String {
    if f.contains("=>") {
        format!("({f})")
    } else {
        f
    }
}

fn literal(v: &Value) -> String {
    // JSON literals are TypeScript literals for strings, numbers and booleans.
    serde_json::to_string(v).expect("a const serializes")
}

fn doc(out: &mut String, indent: &str, text: Option<&str>) {
    if let Some(text) = text {
        let _ = writeln!(out, "{indent}/**");
        for line in text.lines() {
            let line = line.trim_end().replace("*/", "*\\/");
            let _ = writeln!(
                out,
                "{indent} *{}{line}",
                if line.is_empty() { "" } else { " " }
            );
        }
        let _ = writeln!(out, "{indent} */");
    }
}

fn field_type(f: &Field) -> String {
    match &f.constant {
        Some(c) => literal(c),
        None => ty(&f.ty),
    }
}

fn interface(out: &mut String, d: &Def, fields: &[Field], strict: bool) {
    let _ = writeln!(out, "export interface {} {{", d.name);
    for f in fields {
        doc(out, "  ", f.description.as_deref());
        let _ = writeln!(
            out,
            "  {}{}: {}{};",
            property_name(&f.wire),
            if f.required { "" } else { "?" },
            field_type(f),
            if f.nullable { " | null" } else { "" }
        );
    }
    let _ = writeln!(out, "}}");
    if !strict {
        let _ = writeln!(
            out,
            "// {} is open: members this version does not know stay on the decoded object.",
            d.name
        );
    }
    out.push('\n');
}

fn struct_codec(out: &mut String, d: &Def, fields: &[Field], strict: bool) {
    let name = &d.name;
    let _ = writeln!(
        out,
        "export function decode{name}(raw: Json, path: string = \"$\"): {name} {{\n  const o = decObject(raw, path);"
    );
    let required: Vec<String> = fields
        .iter()
        .filter(|f| f.required)
        .map(|f| json_string(&f.wire))
        .collect();
    if !required.is_empty() {
        let _ = writeln!(out, "  requireMembers(o, path, [{}]);", required.join(", "));
    }
    let _ = writeln!(
        out,
        "  const out: {{ [key: string]: unknown }} = {{}};\n  for (const k of Object.keys(o)) {{\n    const v = o[k] as Json;\n    const p = memberPath(path, k);\n    switch (k) {{"
    );
    for f in fields {
        let value = match &f.constant {
            Some(c) => format!("decConst(v, p, {})", literal(c)),
            None => format!("{}(v, p)", call(decoder(&f.ty))),
        };
        let value = if f.nullable {
            format!("v === null ? null : {value}")
        } else {
            value
        };
        let _ = writeln!(
            out,
            "      case {}:\n        setMember(out, k, {value});\n        break;",
            json_string(&f.wire)
        );
    }
    if strict {
        let _ = writeln!(
            out,
            "      default:\n        throw new DecodeError(p, \"unknown member of {name}\");"
        );
    } else {
        let _ = writeln!(out, "      default:\n        setMember(out, k, v);");
    }
    let _ = writeln!(
        out,
        "    }}\n  }}\n  return out as unknown as {name};\n}}\n"
    );

    let _ = writeln!(
        out,
        "export function encode{name}(value: {name}): Json {{\n  const members = value as unknown as {{ [key: string]: unknown }};\n  const out: JsonObject = {{}};\n  for (const k of Object.keys(members)) {{\n    const v = members[k];\n    if (v === undefined) continue;\n    switch (k) {{"
    );
    for f in fields {
        let value = match &f.constant {
            Some(_) => "v as Json".to_string(),
            None => format!("{}(v as {})", call(encoder(&f.ty)), ty(&f.ty)),
        };
        let value = if f.nullable {
            format!("v === null ? null : {value}")
        } else {
            value
        };
        let _ = writeln!(
            out,
            "      case {}:\n        setMember(out, k, {value});\n        break;",
            json_string(&f.wire)
        );
    }
    let _ = writeln!(
        out,
        "      default:\n        setMember(out, k, v as Json);\n    }}\n  }}\n  return out;\n}}\n"
    );
}

/// TypeScript's spellings of each kind of definition, called by [`walk`] in schema order.
struct TypeScript;

impl Target for TypeScript {
    fn before_def(&mut self, out: &mut String, d: &Def) {
        doc(out, "", d.description.as_deref());
    }

    fn alias(&mut self, out: &mut String, d: &Def, t: &Ty) {
        let name = &d.name;
        let _ = writeln!(out, "export type {name} = {};\n", ty(t));
        let _ = writeln!(
            out,
            "export function decode{name}(raw: Json, path: string = \"$\"): {name} {{\n  return {}(raw, path);\n}}\n",
            call(decoder(t))
        );
        let _ = writeln!(
            out,
            "export function encode{name}(value: {name}): Json {{\n  return {}(value);\n}}\n",
            call(encoder(t))
        );
    }

    fn string_enum(&mut self, out: &mut String, d: &Def, values: &[String], keep_unknown: bool) {
        let name = &d.name;
        let known: Vec<String> = values.iter().map(|v| json_string(v)).collect();
        let _ = writeln!(
            out,
            "export type {name} = {}{};\n",
            known.join(" | "),
            if keep_unknown { " | UnknownValue" } else { "" }
        );
        let _ = writeln!(
            out,
            "export function decode{name}(raw: Json, path: string = \"$\"): {name} {{\n  const s = decString(raw, path);\n  switch (s) {{"
        );
        for v in &known {
            let _ = writeln!(out, "    case {v}:");
        }
        let _ = writeln!(out, "      return s;\n  }}");
        if keep_unknown {
            let _ = writeln!(out, "  return {{ unknown: s }};\n}}\n");
        } else {
            let _ = writeln!(
                out,
                "  throw new DecodeError(path, \"unknown {name} \" + JSON.stringify(s));\n}}\n"
            );
        }
        let body = if keep_unknown {
            "typeof value === \"string\" ? value : value.unknown"
        } else {
            "value"
        };
        let _ = writeln!(
            out,
            "export function encode{name}(value: {name}): Json {{\n  return {body};\n}}\n"
        );
    }

    fn structure(&mut self, out: &mut String, d: &Def, fields: &[Field], strict: bool) {
        interface(out, d, fields, strict);
        struct_codec(out, d, fields, strict);
    }

    fn union(&mut self, out: &mut String, d: &Def, u: UnionDef<'_>) {
        let (tag, branches, keep_unknown) = (u.tag, u.branches, u.keep_unknown);
        let name = &d.name;
        let mut cases: Vec<String> = branches.iter().map(|b| b.def.clone()).collect();
        if keep_unknown {
            cases.push(format!("UnknownCase<{}>", json_string(tag)));
        }
        let _ = writeln!(out, "export type {name} =\n  | {};\n", cases.join("\n  | "));
        let tag_lit = json_string(tag);
        let _ = writeln!(
            out,
            "export function decode{name}(raw: Json, path: string = \"$\"): {name} {{\n  const o = decObject(raw, path);\n  const tag = Object.prototype.hasOwnProperty.call(o, {tag_lit}) ? o[{tag_lit}] : undefined;\n  switch (tag) {{"
        );
        for b in branches {
            let _ = writeln!(
                out,
                "    case {}:\n      return decode{}(raw, path);",
                literal(&b.tag_value),
                b.def
            );
        }
        let _ = writeln!(out, "  }}");
        if keep_unknown {
            let _ = writeln!(out, "  return {{ unknown: o }};\n}}\n");
        } else {
            let _ = writeln!(
                out,
                "  throw new DecodeError(memberPath(path, {tag_lit}), tag === undefined ? \"missing tag {tag} of {name}\" : \"unknown {tag} \" + JSON.stringify(tag) + \" of {name}\");\n}}\n"
            );
        }
        let access = if is_identifier(tag) {
            format!("value.{tag}")
        } else {
            format!("value[{tag_lit}]")
        };
        let _ = writeln!(
            out,
            "export function encode{name}(value: {name}): Json {{\n  switch ({access}) {{"
        );
        for b in branches {
            let _ = writeln!(
                out,
                "    case {}:\n      return encode{}(value);",
                literal(&b.tag_value),
                b.def
            );
        }
        let _ = writeln!(out, "  }}");
        if keep_unknown {
            let _ = writeln!(out, "  return value.unknown;\n}}\n");
        } else {
            let _ = writeln!(
                out,
                "  const never: never = {};\n  throw new Error(\"not a {name}: \" + JSON.stringify(never));\n}}\n",
                // A one-branch union is no TypeScript union: only its tag narrows to never.
                if branches.len() == 1 { access.as_str() } else { "value" }
            );
        }
    }

    fn envelope(&mut self, out: &mut String, model: &Model) {
        envelope(out, model);
    }

    fn dispatch(&mut self, out: &mut String, model: &Model) {
        dispatch(out, model);
    }
}

/// The tag values of a union definition, as TypeScript literals.
fn tags_of(model: &Model, union: &str) -> Vec<String> {
    union_tags(model, union).into_iter().map(literal).collect()
}

fn envelope(out: &mut String, model: &Model) {
    if ENVELOPE.iter().any(|n| model.def(n).is_none()) {
        return;
    }
    out.push_str(
        "/**\n * Any wire v1 message, told apart the JSON-RPC way: `method` + `id` is a request (the\n * client's or the server's, by method), `method` alone a notification, `result` or `error` a\n * response.\n */\nexport type Message =\n",
    );
    for n in ENVELOPE {
        let _ = writeln!(out, "  | {{ kind: {}; message: {n} }}", json_string(n));
    }
    out.push_str(";\n\n");
    out.push_str(
        "export function decodeMessage(raw: Json, path: string = \"$\"): Message {\n  const o = decObject(raw, path);\n  const has = (k: string): boolean => Object.prototype.hasOwnProperty.call(o, k);\n  if (has(\"method\")) {\n    if (!has(\"id\")) {\n      return { kind: \"ServerNotification\", message: decodeServerNotification(raw, path) };\n    }\n    switch (o[\"method\"]) {\n",
    );
    for n in ["ClientRequest", "ServerRequest"] {
        for t in tags_of(model, n) {
            let _ = writeln!(out, "      case {t}:");
        }
        let _ = writeln!(
            out,
            "        return {{ kind: {}, message: decode{n}(raw, path) }};",
            json_string(n)
        );
    }
    out.push_str(
        "    }\n    throw new DecodeError(memberPath(path, \"method\"), \"unknown method \" + JSON.stringify(o[\"method\"]));\n  }\n  return { kind: \"ClientResponse\", message: decodeClientResponse(raw, path) };\n}\n\n",
    );
    out.push_str(
        "export function encodeMessage(value: Message): Json {\n  switch (value.kind) {\n",
    );
    for n in ENVELOPE {
        let _ = writeln!(
            out,
            "    case {}:\n      return encode{n}(value.message);",
            json_string(n)
        );
    }
    out.push_str("  }\n}\n\n");
}

fn dispatch(out: &mut String, model: &Model) {
    per_def(
        out,
        model,
        "/** Every definition's name, in schema order. */\nexport const DEFINITION_NAMES: readonly string[] = [\n",
        |n| format!("  {},", json_string(n)),
        "];\n\n",
    );
    per_def(
        out,
        model,
        "/**\n * Decodes `raw` as the named definition and encodes it again (for conformance tests).\n * `undefined` when no definition has that name; throws `DecodeError` when `raw` does not decode.\n */\nexport function roundtripDefinition(name: string, raw: Json): Json | undefined {\n  switch (name) {\n",
        |n| format!("    case {}:\n      return encode{n}(decode{n}(raw));", json_string(n)),
        "  }\n  return undefined;\n}\n",
    );
}

/// The TypeScript runtime: a real TypeScript file (`Json`, `DecodeError`, decode helpers) that the
/// generator splices into `protocol.ts` after the digest constants.
const RUNTIME: &str = include_str!("runtime/protocol_runtime.ts");

/// The whole generated module.
pub fn module(model: &Model) -> String {
    assert_no_clash(model, RESERVED, "TypeScript");
    let mut out = String::new();
    let _ = writeln!(
        out,
        "// AUTO-GENERATED by `cc-agent-protocol generate` from schema/cc-agent-protocol.schema.json.\n// DO NOT EDIT: change the schema and regenerate.\n// Schema digest: {}\n",
        model.digest
    );
    out.push_str("/* eslint-disable */\n// Wire v1 protocol types and codecs, generated from the canonical schema.\n\n");
    let _ = writeln!(
        out,
        "/** The digest of the schema these types were generated from. */\nexport const SCHEMA_DIGEST = {};\n",
        json_string(&model.digest)
    );
    let _ = writeln!(
        out,
        "/** The schema's `$id`. */\nexport const SCHEMA_ID = {};\n",
        json_string(&model.schema_id)
    );
    out.push_str("/** The wire's error codes, one per error class of the schema's `ErrorObject`. */\nexport const ErrorCode = {\n");
    for (name, code, _) in error_codes(model) {
        let _ = writeln!(out, "  {}: {code},", camel_from_pascal(&name));
    }
    out.push_str("} as const;\n\n");
    out.push_str(RUNTIME);
    walk(model, &mut TypeScript, &mut out);
    out
}

/// Every TypeScript file the generator writes.
pub fn generate(model: &Model) -> Vec<GeneratedFile> {
    vec![GeneratedFile {
        path: PathBuf::from(PATH),
        contents: module(model),
    }]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> Model {
        super::super::model::build(crate::schema())
    }

    #[test]
    fn generating_twice_gives_the_same_bytes() {
        let a = generate(&model());
        let b = generate(&model());
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x.path, y.path);
            assert_eq!(x.contents, y.contents);
        }
        assert!(a[0]
            .contents
            .starts_with("// AUTO-GENERATED by `cc-agent-protocol generate`"));
        assert!(a[0].contents.contains(crate::schema_digest()));
    }

    #[test]
    fn wire_names_stay_property_names() {
        for w in [
            "class", "in", "is", "self", "type", "default", "object", "from", "lambda",
        ] {
            assert_eq!(property_name(w), w);
        }
        assert_eq!(property_name("retry_after_ms"), "retry_after_ms");
        assert_eq!(property_name("content-type"), "\"content-type\"");
        assert_eq!(property_name("9lives"), "\"9lives\"");
        assert_eq!(property_name("__proto__"), "__proto__");
    }

    #[test]
    fn optional_nullable_and_missing_stay_distinct() {
        let text = module(&model());
        // Thread.title is required and nullable, ThreadStartParams.title optional,
        // FileChange.diff optional and nullable.
        assert!(text.contains("  title: Title | null;"));
        assert!(text.contains("  title?: Title;"));
        assert!(text.contains("  diff?: Text | null;"));
    }
}
