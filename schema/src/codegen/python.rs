//! The Python target: one package, `bindings/python/cc_agent_protocol/`, of frozen dataclasses
//! (keyword-only, so schema order is kept) with a `decode_<Name>` and an `encode_<Name>` function per
//! definition; `mypy --strict` clean.
//!
//! - required → `name: T`; nullable → `name: T | None`; optional and optional-nullable →
//!   `name: T | None = None`: an absent member reads as `None`, and `None` is not sent. A decoded
//!   optional-nullable member that was an explicit `null` is remembered (`_nulls`, outside the
//!   fields, so equality ignores it) and encoded as `null` again: a round trip keeps the JSON.
//! - a tagged union is a `TypeAlias` of its branch classes; each branch class carries its tag as a
//!   `Literal` field with that value as default. A display (`keep_unknown`) union adds
//!   `UnknownCase` (the raw object), a display enum adds `UnknownValue` (the raw string); strict ones
//!   raise `DecodeError` on a value they do not know.
//! - string enums are `Literal` aliases of their exact wire values.
//! - open structs keep members this version does not know in `extra`; strict structs refuse them.
//! - identifiers are snake_case; a Python keyword, soft keyword, a builtin the class body needs or
//!   one of the runtime's own names gets a trailing `_` (`type` → `type_`, `class` → `class_`). The
//!   wire name never changes.

use super::emit::{
    assert_no_clash, error_codes, per_def, screaming, snake, union_tags, walk, Presence, Target,
    TypeNames, UnionDef,
};
use super::model::{Def, DefKind, Field, Model, Ty};
use super::GeneratedFile;
use serde_json::Value;
use std::fmt::Write;
use std::path::PathBuf;

/// The package directory.
pub const PACKAGE: &str = "bindings/python/cc_agent_protocol";

/// Python keywords and soft keywords, plus the names a generated class body or `__init__` uses
/// (builtins in annotations, `field`, `self`) and the field the runtime adds (`extra`).
const RESERVED: &[&str] = &[
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
    "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while",
    "with", "yield", "_", "case", "match", "type", "self", "cls", "object", "default", "extra",
    "field", "str", "int", "float", "bool", "list", "dict", "bytes",
];

/// Names the runtime part of the module defines; no definition may use them.
const RUNTIME_NAMES: &[&str] = &[
    "Json",
    "JsonObject",
    "Missing",
    "MISSING",
    "DecodeError",
    "UnknownCase",
    "UnknownValue",
    "Message",
    "SCHEMA_DIGEST",
    "SCHEMA_ID",
    "DEFINITION_NAMES",
    "ErrorCode",
];

/// The error path of member `wire` of the object at `path`: the same text `_member_path` builds,
/// spelled out at generation time when the name is an ASCII identifier (no call per member).
fn member_path(wire: &str) -> String {
    let ident = wire.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && wire.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ident {
        format!("path + {}", json_string(&format!(".{wire}")))
    } else {
        format!("_member_path(path, {})", json_string(wire))
    }
}

/// The envelope's parts, as the schema profile (docs/schema.md) names them.
const ENVELOPE: &[&str] = &[
    "ClientRequest",
    "ClientResponse",
    "ServerRequest",
    "ServerNotification",
];

/// The Python identifier for a wire name: snake_case, `_` appended to reserved words, `f_`
/// prefixed when it would start with a digit.
pub fn field_ident(wire: &str) -> String {
    let mut out = snake(wire);
    if out.is_empty() || out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert_str(0, "f_");
    }
    if RESERVED.contains(&out.as_str()) {
        out.push('_');
    }
    out
}

fn json_string(s: &str) -> String {
    serde_json::to_string(s).expect("a string serializes")
}

/// A Python literal for a JSON scalar.
fn literal(v: &Value) -> String {
    match v {
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        other => serde_json::to_string(other).expect("a const serializes"),
    }
}

/// How this target spells each type expression.
const TYPES: TypeNames = TypeNames {
    string: "str",
    signed: "int",
    unsigned: "int",
    number: "float",
    boolean: "bool",
    integer_or_string: "int | str",
    json: "Json",
    array: ["list[", "]"],
    map: ["dict[str, ", "]"],
};

fn ty(t: &Ty) -> String {
    TYPES.spell(t)
}

/// An expression decoding `raw` (a `Json` expression) found at `path` (a `str` expression).
fn dec(t: &Ty, raw: &str, path: &str, depth: usize) -> String {
    match t {
        Ty::String => format!("_str({raw}, {path})"),
        Ty::Integer { signed: true } => format!("_int({raw}, {path})"),
        Ty::Integer { signed: false } => format!("_uint({raw}, {path})"),
        Ty::Number => format!("_float({raw}, {path})"),
        Ty::Boolean => format!("_bool({raw}, {path})"),
        Ty::IntegerOrString => format!("_uint_or_str({raw}, {path})"),
        Ty::Json => raw.to_string(),
        Ty::Named(n) => format!("decode_{n}({raw}, {path})"),
        Ty::Array(inner) => {
            let (i, r) = (format!("i{depth}"), format!("r{depth}"));
            format!(
                "[{} for {i}, {r} in enumerate(_list({raw}, {path}))]",
                dec(inner, &r, &format!("_index_path({path}, {i})"), depth + 1)
            )
        }
        Ty::Map(inner) => {
            let (k, r) = (format!("k{depth}"), format!("r{depth}"));
            format!(
                "{{{k}: {} for {k}, {r} in _object({raw}, {path}).items()}}",
                dec(inner, &r, &format!("_member_path({path}, {k})"), depth + 1)
            )
        }
    }
}

/// An expression encoding `value` (of type `t`) as `Json`.
fn enc(t: &Ty, value: &str, depth: usize) -> String {
    match t {
        Ty::String
        | Ty::Integer { .. }
        | Ty::Number
        | Ty::Boolean
        | Ty::IntegerOrString
        | Ty::Json => value.to_string(),
        Ty::Named(n) => format!("encode_{n}({value})"),
        Ty::Array(inner) => {
            let x = format!("x{depth}");
            format!("[{} for {x} in {value}]", enc(inner, &x, depth + 1))
        }
        Ty::Map(inner) => {
            let (k, x) = (format!("k{depth}"), format!("x{depth}"));
            format!(
                "{{{k}: {} for {k}, {x} in {value}.items()}}",
                enc(inner, &x, depth + 1)
            )
        }
    }
}

fn comment(out: &mut String, indent: &str, text: Option<&str>) {
    if let Some(text) = text {
        for line in text.lines() {
            let line = line.trim_end();
            let _ = writeln!(
                out,
                "{indent}#{}{line}",
                if line.is_empty() { "" } else { " " }
            );
        }
    }
}

/// A required, non-null constant: typed as its `Literal`, defaulted, checked by the decoder.
fn fixed(f: &Field) -> Option<&Value> {
    f.constant
        .as_ref()
        .filter(|_| Presence::of(f) == Presence::Required)
}

/// Whether a member of type `t` can hold JSON `null` itself (free-form JSON, or an alias of it).
fn holds_null(t: &Ty, json_aliases: &[String]) -> bool {
    match t {
        Ty::Json => true,
        Ty::Named(n) => json_aliases.contains(n),
        _ => false,
    }
}

/// The names of the aliases of free-form JSON.
fn json_aliases(model: &Model) -> Vec<String> {
    model
        .defs
        .iter()
        .filter(|d| matches!(d.kind, DefKind::Alias(Ty::Json)))
        .map(|d| d.name.clone())
        .collect()
}

fn struct_def(out: &mut String, d: &Def, fields: &[Field], strict: bool, json_aliases: &[String]) {
    let name = &d.name;
    let idents: Vec<String> = fields.iter().map(|f| field_ident(&f.wire)).collect();
    for (i, a) in idents.iter().enumerate() {
        assert!(
            !idents[..i].contains(a),
            "{name}: two members map to the Python identifier {a}"
        );
    }
    let _ = writeln!(out, "@dataclass(frozen=True, kw_only=True)\nclass {name}:");
    if fields.is_empty() && strict {
        let _ = writeln!(out, "    pass");
    }
    for (f, ident) in fields.iter().zip(&idents) {
        comment(out, "    ", f.description.as_deref());
        if ident != &f.wire {
            let _ = writeln!(out, "    # wire name: {}", json_string(&f.wire));
        }
        if let Some(c) = fixed(f) {
            let lit = literal(c);
            let _ = writeln!(out, "    {ident}: Literal[{lit}] = {lit}");
            continue;
        }
        let base = ty(&f.ty);
        let line = match Presence::of(f) {
            Presence::Required => format!("{ident}: {base}"),
            Presence::Nullable => format!("{ident}: {base} | None"),
            Presence::Optional | Presence::OptionalNullable => {
                format!("{ident}: {base} | None = None")
            }
        };
        let _ = writeln!(out, "    {line}");
    }
    if !strict {
        let _ = writeln!(
            out,
            "    # Members this version does not know, kept so they survive a round trip.\n    extra: JsonObject = field(default_factory=dict)"
        );
    }
    out.push('\n');

    // The members this struct names.
    let members: Vec<String> = fields.iter().map(|f| json_string(&f.wire)).collect();
    let _ = writeln!(
        out,
        "\n_{name}_MEMBERS: Final = frozenset(({}{}))\n",
        members.join(", "),
        if members.len() == 1 { "," } else { "" }
    );

    // Decoder.
    let _ = writeln!(
        out,
        "\ndef decode_{name}(raw: Json, path: str = \"$\") -> {name}:\n    o = _object(raw, path)"
    );
    let required: Vec<String> = fields
        .iter()
        .filter(|f| f.required)
        .map(|f| json_string(&f.wire))
        .collect();
    if !required.is_empty() {
        let _ = writeln!(
            out,
            "    _require(o, path, ({}{}))",
            required.join(", "),
            if required.len() == 1 { "," } else { "" }
        );
    }
    if strict {
        let _ = writeln!(
            out,
            "    _only(o, path, _{name}_MEMBERS, {})",
            json_string(name)
        );
    }
    for f in fields {
        if let Some(c) = &f.constant {
            let w = json_string(&f.wire);
            let check = match c {
                // A string constant (a `type` or `method` tag): compared inline, as `_const` would.
                Value::String(_) => format!(
                    "if not (isinstance(o[{w}], str) and o[{w}] == {lit}):\n        raise DecodeError({}, \"expected \" + repr({lit}))",
                    member_path(&f.wire),
                    lit = literal(c)
                ),
                _ => format!("_const(o[{w}], {}, {})", member_path(&f.wire), literal(c)),
            };
            if Presence::of(f) == Presence::Required {
                let _ = writeln!(out, "    {check}");
            } else {
                let check = check.replace("\n        ", "\n            ");
                let _ = writeln!(
                    out,
                    "    if {w} in o and o[{w}] is not None:\n        {check}"
                );
            }
        }
    }
    let nullables: Vec<&Field> = fields
        .iter()
        .filter(|f| match Presence::of(f) {
            Presence::OptionalNullable => true,
            Presence::Optional => holds_null(&f.ty, json_aliases),
            _ => false,
        })
        .collect();
    let _ = writeln!(out, "    return _build({name}, {{");
    for (f, ident) in fields.iter().zip(&idents) {
        if let Some(c) = fixed(f) {
            let _ = writeln!(out, "        {}: {},", json_string(ident), literal(c));
            continue;
        }
        let w = json_string(&f.wire);
        let value = dec(&f.ty, &format!("o[{w}]"), &member_path(&f.wire), 0);
        let expr = match Presence::of(f) {
            Presence::Required => value,
            Presence::Nullable => format!("None if o[{w}] is None else {value}"),
            Presence::Optional => format!("{value} if {w} in o else None"),
            Presence::OptionalNullable => format!("None if o.get({w}) is None else {value}"),
        };
        let _ = writeln!(out, "        {}: ({expr}),", json_string(ident));
    }
    if !strict {
        let _ = writeln!(
            out,
            "        \"extra\": ({{}} if o.keys() <= _{name}_MEMBERS else {{k: v for k, v in o.items() if k not in _{name}_MEMBERS}}),"
        );
    }
    if !nullables.is_empty() {
        let names: Vec<String> = nullables.iter().map(|f| json_string(&f.wire)).collect();
        let _ = writeln!(
            out,
            "    }}, _nulls(o, ({}{})))\n",
            names.join(", "),
            if names.len() == 1 { "," } else { "" }
        );
    } else {
        let _ = writeln!(out, "    }})\n");
    }

    // Encoder: the schema's order, then the members this version does not know.
    let _ = writeln!(
        out,
        "\ndef encode_{name}(value: {name}) -> Json:\n    out: JsonObject = {{}}"
    );
    for (f, ident) in fields.iter().zip(&idents) {
        let w = json_string(&f.wire);
        if let Some(c) = fixed(f) {
            let _ = writeln!(out, "    out[{w}] = {}", literal(c));
            continue;
        }
        let v = format!("value.{ident}");
        match Presence::of(f) {
            Presence::Required => {
                let _ = writeln!(out, "    out[{w}] = {}", enc(&f.ty, &v, 0));
            }
            Presence::Nullable => {
                let _ = writeln!(
                    out,
                    "    out[{w}] = None if {v} is None else {}",
                    enc(&f.ty, &v, 0)
                );
            }
            Presence::Optional if !holds_null(&f.ty, json_aliases) => {
                let _ = writeln!(
                    out,
                    "    if {v} is not None:\n        out[{w}] = {}",
                    enc(&f.ty, &v, 0)
                );
            }
            Presence::Optional | Presence::OptionalNullable => {
                let _ = writeln!(
                    out,
                    "    if {v} is not None:\n        out[{w}] = {}\n    elif {w} in value.__dict__.get(\"_nulls\", ()):\n        out[{w}] = None",
                    enc(&f.ty, &v, 0)
                );
            }
        }
    }
    if !strict {
        let _ = writeln!(
            out,
            "    for k, v in value.extra.items():\n        if k not in _{name}_MEMBERS:\n            out[k] = v"
        );
    }
    let _ = writeln!(out, "    return out\n");
}

/// Python's spellings of each kind of definition, called by [`walk`] in schema order.
struct Python {
    json_aliases: Vec<String>,
}

impl Target for Python {
    fn before_def(&mut self, out: &mut String, d: &Def) {
        comment(out, "", d.description.as_deref());
    }

    fn after_def(&mut self, out: &mut String, _d: &Def) {
        out.push('\n');
    }

    fn alias(&mut self, out: &mut String, d: &Def, t: &Ty) {
        let name = &d.name;
        let _ = writeln!(out, "{name}: TypeAlias = {}\n", json_string(&ty(t)));
        let _ = writeln!(
            out,
            "\ndef decode_{name}(raw: Json, path: str = \"$\") -> {name}:\n    return {}\n",
            dec(t, "raw", "path", 0)
        );
        let _ = writeln!(
            out,
            "\ndef encode_{name}(value: {name}) -> Json:\n    return {}\n",
            enc(t, "value", 0)
        );
    }

    fn string_enum(&mut self, out: &mut String, d: &Def, values: &[String], keep_unknown: bool) {
        let name = &d.name;
        let known: Vec<String> = values.iter().map(|v| json_string(v)).collect();
        let alias = format!(
            "Literal[{}]{}",
            known.join(", "),
            if keep_unknown { " | UnknownValue" } else { "" }
        );
        let _ = writeln!(out, "{name}: TypeAlias = {}\n", json_string(&alias));
        let _ = writeln!(
            out,
            "\ndef decode_{name}(raw: Json, path: str = \"$\") -> {name}:\n    s = _str(raw, path)"
        );
        for v in &known {
            let _ = writeln!(out, "    if s == {v}:\n        return {v}");
        }
        if keep_unknown {
            let _ = writeln!(out, "    return UnknownValue(raw=s)\n");
        } else {
            let _ = writeln!(
                out,
                "    raise DecodeError(path, \"unknown {name} \" + repr(s))\n"
            );
        }
        let body = if keep_unknown {
            "value.raw if isinstance(value, UnknownValue) else value"
        } else {
            "value"
        };
        let _ = writeln!(
            out,
            "\ndef encode_{name}(value: {name}) -> Json:\n    return {body}\n"
        );
    }

    fn structure(&mut self, out: &mut String, d: &Def, fields: &[Field], strict: bool) {
        struct_def(out, d, fields, strict, &self.json_aliases);
    }

    fn union(&mut self, out: &mut String, d: &Def, u: UnionDef<'_>) {
        let (tag, branches, keep_unknown) = (u.tag, u.branches, u.keep_unknown);
        let name = &d.name;
        let mut cases: Vec<String> = branches.iter().map(|b| b.def.clone()).collect();
        if keep_unknown {
            cases.push("UnknownCase".into());
        }
        let _ = writeln!(
            out,
            "{name}: TypeAlias = {}\n",
            json_string(&cases.join(" | "))
        );
        let t = json_string(tag);
        let _ = writeln!(
            out,
            "\ndef decode_{name}(raw: Json, path: str = \"$\") -> {name}:\n    o = _object(raw, path)\n    tag = o.get({t}, MISSING)"
        );
        if branches.iter().all(|b| b.tag_value.is_string()) {
            // String tags (the common case: every notification): one type check, then plain
            // comparisons — what `_is_tag` decides, without a call per branch.
            let _ = writeln!(out, "    if isinstance(tag, str):");
            for b in branches {
                let _ = writeln!(
                    out,
                    "        if tag == {}:\n            return decode_{}(o, path)",
                    literal(&b.tag_value),
                    b.def
                );
            }
        } else {
            for b in branches {
                let _ = writeln!(
                    out,
                    "    if _is_tag(tag, {}):\n        return decode_{}(o, path)",
                    literal(&b.tag_value),
                    b.def
                );
            }
        }
        if keep_unknown {
            let _ = writeln!(out, "    return UnknownCase(raw=o)\n");
        } else {
            let _ = writeln!(
                out,
                "    if isinstance(tag, Missing):\n        raise DecodeError(_member_path(path, {t}), \"missing tag of {name}\")\n    raise DecodeError(_member_path(path, {t}), \"unknown {tag} \" + repr(tag) + \" of {name}\")\n"
            );
        }
        let _ = writeln!(out, "\ndef encode_{name}(value: {name}) -> Json:");
        for b in branches {
            let _ = writeln!(
                out,
                "    if isinstance(value, {d}):\n        return encode_{d}(value)",
                d = b.def
            );
        }
        if keep_unknown {
            let _ = writeln!(out, "    return value.raw\n");
        } else {
            let _ = writeln!(out, "    _assert_never(value)\n");
        }
    }

    fn envelope(&mut self, out: &mut String, model: &Model) {
        envelope(out, model);
    }

    fn dispatch(&mut self, out: &mut String, model: &Model) {
        dispatch(out, model);
    }
}

fn envelope(out: &mut String, model: &Model) {
    if ENVELOPE.iter().any(|n| model.def(n).is_none()) {
        return;
    }
    let tags = |n: &str| -> Vec<String> { union_tags(model, n).into_iter().map(literal).collect() };
    let _ = writeln!(
        out,
        "# Any wire v1 message, told apart the JSON-RPC way: `method` + `id` is a request (the client's\n# or the server's, by method), `method` alone a notification, `result` or `error` a response.\nMessage: TypeAlias = {}\n",
        json_string(&ENVELOPE.join(" | "))
    );
    out.push_str("\ndef decode_message(raw: Json, path: str = \"$\") -> Message:\n    o = _object(raw, path)\n    if \"method\" in o:\n        if \"id\" not in o:\n            return decode_ServerNotification(o, path)\n        method = o[\"method\"]\n");
    for n in ["ClientRequest", "ServerRequest"] {
        let t = tags(n);
        let _ = writeln!(
            out,
            "        if isinstance(method, str) and method in ({}{}):\n            return decode_{n}(o, path)",
            t.join(", "),
            if t.len() == 1 { "," } else { "" }
        );
    }
    out.push_str("        raise DecodeError(_member_path(path, \"method\"), \"unknown method \" + repr(method))\n    return decode_ClientResponse(o, path)\n\n");
    out.push_str("\ndef encode_message(value: Message) -> Json:\n");
    let mut unknown_claimed = false;
    for n in ENVELOPE {
        let classes: Vec<String> = match model.def(n).map(|d| &d.kind) {
            Some(DefKind::Union {
                branches,
                keep_unknown,
                ..
            }) => {
                let mut c: Vec<String> = branches.iter().map(|b| b.def.clone()).collect();
                if *keep_unknown && !unknown_claimed {
                    unknown_claimed = true;
                    c.push("UnknownCase".into());
                }
                c
            }
            _ => vec![n.to_string()],
        };
        let _ = writeln!(
            out,
            "    if isinstance(value, ({}{})):\n        return encode_{n}(value)",
            classes.join(", "),
            if classes.len() == 1 { "," } else { "" }
        );
    }
    out.push_str("    _assert_never(value)\n\n");
}

fn dispatch(out: &mut String, model: &Model) {
    per_def(
        out,
        model,
        "# Every definition's name, in schema order.\nDEFINITION_NAMES: Final = (\n",
        |n| format!("    {},", json_string(n)),
        ")\n\n\n",
    );
    per_def(
        out,
        model,
        "def roundtrip_definition(name: str, raw: Json) -> Json:\n    \"\"\"Decodes `raw` as the named definition and encodes it again (for conformance tests).\n\n    Raises `KeyError` when no definition has that name and `DecodeError` when `raw` does not decode.\n    \"\"\"\n",
        |n| format!("    if name == {}:\n        return encode_{n}(decode_{n}(raw))", json_string(n)),
        "    raise KeyError(name)\n",
    );
}

/// The Python runtime: a real, importable Python file (`DecodeError`, `UnknownCase`, the decode helpers) that
/// the generator splices into `__init__.py` between the header and the generated types.
const RUNTIME: &str = include_str!("runtime/protocol_runtime.py");

/// The generated package's `__init__.py`.
pub fn module(model: &Model) -> String {
    assert_no_clash(model, RUNTIME_NAMES, "Python");
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# AUTO-GENERATED by `cc-agent-protocol generate` from schema/cc-agent-protocol.schema.json.\n# DO NOT EDIT: change the schema and regenerate.\n# Schema digest: {}\n\"\"\"Wire v1 protocol types and codecs, generated from the canonical schema.\"\"\"\n",
        model.digest
    );
    out.push_str(RUNTIME);
    let _ = writeln!(
        out,
        "# The digest of the schema these types were generated from.\nSCHEMA_DIGEST: Final = {}\n# The schema's `$id`.\nSCHEMA_ID: Final = {}\n\n",
        json_string(&model.digest),
        json_string(&model.schema_id)
    );
    out.push_str("class ErrorCode:\n    \"\"\"The wire's error codes, one per error class of the schema's `ErrorObject`.\"\"\"\n\n");
    for (name, code, _) in error_codes(model) {
        let _ = writeln!(out, "    {}: Final = {code}", screaming(&name));
    }
    out.push_str("\n\n");
    let mut target = Python {
        json_aliases: json_aliases(model),
    };
    walk(model, &mut target, &mut out);
    out
}

/// Every Python file the generator writes.
pub fn generate(model: &Model) -> Vec<GeneratedFile> {
    vec![
        GeneratedFile {
            path: PathBuf::from(PACKAGE).join("__init__.py"),
            contents: module(model),
        },
        GeneratedFile {
            path: PathBuf::from(PACKAGE).join("py.typed"),
            contents: format!(
                "# AUTO-GENERATED by `cc-agent-protocol generate`: PEP 561 marker, the package is typed.\n# Schema digest: {}\n",
                model.digest
            ),
        },
    ]
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
            assert!(x
                .contents
                .starts_with("# AUTO-GENERATED by `cc-agent-protocol generate`"));
            assert!(x.contents.contains(crate::schema_digest()));
        }
    }

    #[test]
    fn keywords_change_only_the_identifier() {
        for (wire, ident) in [
            ("class", "class_"),
            ("in", "in_"),
            ("is", "is_"),
            ("self", "self_"),
            ("type", "type_"),
            ("default", "default_"),
            ("object", "object_"),
            ("from", "from_"),
            ("lambda", "lambda_"),
            ("match", "match_"),
            ("extra", "extra_"),
            ("threadId", "thread_id"),
            ("retry_after_ms", "retry_after_ms"),
            ("9lives", "f_9lives"),
        ] {
            assert_eq!(field_ident(wire), ident, "{wire}");
        }
        // The wire name stays in the decoder and the encoder.
        let text = module(&model());
        assert!(text.contains("    type_: Literal[\"userMessage\"] = \"userMessage\""));
        assert!(text.contains("    out[\"type\"] = \"userMessage\""));
    }

    #[test]
    fn absent_optional_members_read_as_none() {
        let text = module(&model());
        assert!(text.contains("    title: Title | None\n"));
        assert!(text.contains("    title: Title | None = None\n"));
        assert!(text.contains("    diff: Text | None = None\n"));
        assert!(!text.contains("| Missing = MISSING"));
        // An explicit null of an optional-nullable member survives a round trip.
        assert!(text.contains("_nulls(o, (\"diff\",))"));
    }
}
