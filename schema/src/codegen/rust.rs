//! The Rust target: serde types for core, written so that optional (`Option` + skip), nullable
//! (`Option` that must be present) and optional-nullable (`Option<Option>`) survive a round trip as
//! themselves, and every tagged union is an enum whose tag lives only in the enum.

use super::emit::{error_codes, screaming, slash_doc as doc, snake, Presence, TypeNames};
use super::model::{pascal, Def, DefKind, Field, Model, Ty};
use std::fmt::Write;

const KEYWORDS: &[&str] = &[
    "as", "async", "await", "break", "const", "continue", "crate", "dyn", "else", "enum", "extern",
    "false", "fn", "for", "if", "impl", "in", "let", "loop", "match", "mod", "move", "mut", "pub",
    "ref", "return", "self", "Self", "static", "struct", "super", "trait", "true", "type",
    "unsafe", "use", "where", "while", "abstract", "become", "box", "do", "final", "macro",
    "override", "priv", "typeof", "unsized", "virtual", "yield", "try", "gen",
];

/// snake_case identifier for a wire name, with `_` appended to keywords (`type` → `type_`).
pub fn field_ident(wire: &str) -> String {
    let mut out = snake(wire);
    if KEYWORDS.contains(&out.as_str()) || out.starts_with(|c: char| c.is_ascii_digit()) {
        out.push('_');
    }
    out
}

/// How this target spells each type expression.
const TYPES: TypeNames = TypeNames {
    string: "String",
    signed: "i64",
    unsigned: "u64",
    number: "f64",
    boolean: "bool",
    integer_or_string: "IntegerOrString",
    json: "Value",
    array: ["Vec<", ">"],
    map: ["Map<String, ", ">"],
};

fn ty(t: &Ty) -> String {
    TYPES.spell(t)
}

fn rust_literal(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => format!("{s:?}"),
        other => format!("{other}i64"),
    }
}

fn field(out: &mut String, f: &Field, model: &Model) {
    doc(out, "    ", f.description.as_deref());
    let ident = field_ident(&f.wire);
    if ident != f.wire {
        let _ = writeln!(out, "    #[serde(rename = {:?})]", f.wire);
    }
    let base = ty(&f.ty);
    let (attr, full) = match Presence::of(f) {
        Presence::Required => (None, base),
        Presence::Nullable => (Some("deserialize_with = \"nullable\""), format!("Option<{base}>")),
        // `null` is a value of a free JSON member, so it must stay present rather than collapse
        // into "missing".
        Presence::Optional if is_free_json(&f.ty, model) => (
            Some("default, skip_serializing_if = \"Option::is_none\", deserialize_with = \"present\""),
            format!("Option<{base}>"),
        ),
        Presence::Optional => (Some("default, skip_serializing_if = \"Option::is_none\""), format!("Option<{base}>")),
        Presence::OptionalNullable => (
            Some("default, skip_serializing_if = \"Option::is_none\", deserialize_with = \"optional_nullable\""),
            format!("Option<Option<{base}>>"),
        ),
    };
    if let Some(attr) = attr {
        let _ = writeln!(out, "    #[serde({attr})]");
    }
    let _ = writeln!(out, "    pub {ident}: {full},");
}

/// True for `Ty::Json` or an alias of it (`JsonValue`).
fn is_free_json(t: &Ty, model: &Model) -> bool {
    match t {
        Ty::Json => true,
        Ty::Named(n) => matches!(
            model.def(n).map(|d| &d.kind),
            Some(DefKind::Alias(Ty::Json))
        ),
        _ => false,
    }
}

fn def(out: &mut String, d: &Def, model: &Model) {
    doc(out, "", d.description.as_deref());
    match &d.kind {
        DefKind::Alias(t) => {
            let _ = writeln!(out, "pub type {} = {};", d.name, ty(t));
        }
        DefKind::StringEnum {
            values,
            keep_unknown,
        } => {
            let derives = if *keep_unknown {
                "Debug, Clone, PartialEq, Eq, Hash"
            } else {
                "Debug, Clone, Copy, PartialEq, Eq, Hash"
            };
            let _ = writeln!(
                out,
                "#[derive({derives}, Serialize, Deserialize)]\npub enum {} {{",
                d.name
            );
            for v in values {
                let _ = writeln!(out, "    #[serde(rename = {v:?})]\n    {},", pascal(v));
            }
            if *keep_unknown {
                let _ = writeln!(out, "    /// A value this version does not know, kept as sent.\n    #[serde(untagged)]\n    Unknown(String),");
            }
            let _ = writeln!(out, "}}");
        }
        DefKind::Struct { fields, strict, .. } => {
            let _ = writeln!(
                out,
                "#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]\npub struct {} {{",
                d.name
            );
            for f in fields.iter().filter(|f| !f.is_tag) {
                field(out, f, model);
            }
            if !strict {
                let _ = writeln!(out, "    /// Members this version does not know, kept so they survive a round trip.\n    #[serde(flatten)]\n    pub extra: Map<String, Value>,");
            }
            let _ = writeln!(out, "}}");
        }
        DefKind::Union {
            tag,
            branches,
            keep_unknown,
        } => {
            let _ = writeln!(
                out,
                "#[derive(Debug, Clone, PartialEq)]\npub enum {} {{",
                d.name
            );
            for b in branches {
                let _ = writeln!(out, "    {}({}),", b.variant, b.def);
            }
            if *keep_unknown {
                let _ = writeln!(out, "    /// A `{tag}` this version does not know, kept as sent.\n    Unknown(Value),");
            }
            let _ = writeln!(out, "}}\n");
            // Serialize: the tag first, then the branch's members.
            let _ = writeln!(out, "impl Serialize for {} {{\n    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {{\n        let (tag, body) = match self {{", d.name);
            for b in branches {
                let _ = writeln!(
                    out,
                    "            Self::{}(v) => (Value::from({}), serde_json::to_value(v).map_err(serde::ser::Error::custom)?),",
                    b.variant,
                    rust_literal(&b.tag_value)
                );
            }
            if *keep_unknown {
                let _ = writeln!(
                    out,
                    "            Self::Unknown(raw) => return raw.serialize(serializer),"
                );
            }
            let _ = writeln!(out, "        }};\n        with_tag({tag:?}, tag, body).serialize(serializer)\n    }}\n}}\n");
            // Deserialize: read the tag, strip it, decode the branch.
            let _ = writeln!(
                out,
                "impl<'de> Deserialize<'de> for {} {{\n    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {{\n        let raw = Value::deserialize(deserializer)?;\n        let tag = raw.get({tag:?}).cloned();",
                d.name
            );
            let _ = writeln!(out, "        match tag {{");
            for b in branches {
                let _ = writeln!(
                    out,
                    "            Some(t) if t == {} => without_tag({tag:?}, raw).map(Self::{}).map_err(serde::de::Error::custom),",
                    rust_literal(&b.tag_value),
                    b.variant
                );
            }
            if *keep_unknown {
                let _ = writeln!(out, "            _ => Ok(Self::Unknown(raw)),");
            } else {
                let _ = writeln!(
                    out,
                    "            Some(t) => Err(serde::de::Error::custom(format_args!(\"unknown {} {{t}} for {}\"))),\n            None => Err(serde::de::Error::custom(\"missing tag `{tag}` for {}\")),",
                    tag, d.name, d.name
                );
            }
            let _ = writeln!(out, "        }}\n    }}\n}}");
        }
    }
    out.push('\n');
}

/// The whole generated Rust module.
pub fn generate(model: &Model) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "// AUTO-GENERATED by `cc-agent-protocol generate` from schema/cc-agent-protocol.schema.json.\n// DO NOT EDIT: change the schema and regenerate.\n// Schema digest: {}\n",
        model.digest
    );
    out.push_str(
        "//! Wire v1 protocol types, generated from the canonical schema.\n\n\
         #![allow(clippy::large_enum_variant, clippy::enum_variant_names)]\n\n\
         use serde::{Deserialize, Deserializer, Serialize, Serializer};\n\
         use serde_json::{Map, Value};\n\n",
    );
    let _ = writeln!(out, "/// The digest of the schema these types were generated from.\npub const SCHEMA_DIGEST: &str = {:?};\n", model.digest);
    let _ = writeln!(
        out,
        "/// The schema's `$id`.\npub const SCHEMA_ID: &str = {:?};\n",
        model.schema_id
    );
    out.push_str("/// The wire's error codes, one per error class of the schema's `ErrorObject`.\npub mod error_code {\n");
    for (name, code, _) in error_codes(model) {
        let _ = writeln!(
            out,
            "    /// `{name}Error`.\n    pub const {}: i64 = {code};",
            screaming(&name)
        );
    }
    out.push_str("}\n\n");
    out.push_str(
        "/// A required member that may be `null`: present on the wire, `None` for null.\n\
         fn nullable<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {\n    Option::<T>::deserialize(d)\n}\n\n\
         /// An optional free JSON member: `None` when missing, `Some(Value::Null)` for null.\n\
         #[allow(dead_code)]\n\
         fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {\n    T::deserialize(d).map(Some)\n}\n\n\
         /// An optional member that may be `null`: `None` when missing, `Some(None)` for null.\n\
         fn optional_nullable<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<Option<T>>, D::Error> {\n    Option::<T>::deserialize(d).map(Some)\n}\n\n\
         /// A non-negative integer or a string: what a JSON-RPC request id can be.\n\
         #[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]\n\
         #[serde(untagged)]\n\
         pub enum IntegerOrString {\n    Integer(u64),\n    String(String),\n}\n\n\
         impl From<u64> for IntegerOrString {\n    fn from(n: u64) -> Self {\n        IntegerOrString::Integer(n)\n    }\n}\n\n\
         fn with_tag(name: &str, tag: Value, body: Value) -> Value {\n    let mut map = Map::new();\n    map.insert(name.to_string(), tag);\n    if let Value::Object(members) = body {\n        map.extend(members);\n    }\n    Value::Object(map)\n}\n\n\
         fn without_tag<T: serde::de::DeserializeOwned>(name: &str, mut raw: Value) -> Result<T, serde_json::Error> {\n    if let Value::Object(members) = &mut raw {\n        members.remove(name);\n    }\n    serde_json::from_value(raw)\n}\n\n",
    );
    for d in &model.defs {
        def(&mut out, d, model);
    }
    out.push_str(
        "/// Decodes `value` as the named definition and encodes it again (for conformance tests).\n\
         /// `None` when no definition has that name.\n\
         pub fn roundtrip_definition(name: &str, value: &Value) -> Option<Result<Value, serde_json::Error>> {\n\
         \x20   fn rt<T: Serialize + serde::de::DeserializeOwned>(v: &Value) -> Result<Value, serde_json::Error> {\n\
         \x20       serde_json::to_value(serde_json::from_value::<T>(v.clone())?)\n    }\n    Some(match name {\n",
    );
    for d in &model.defs {
        let _ = writeln!(out, "        {:?} => rt::<{}>(value),", d.name, d.name);
    }
    out.push_str("        _ => return None,\n    })\n}\n");
    out
}
