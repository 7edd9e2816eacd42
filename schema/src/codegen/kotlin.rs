//! The Kotlin target: plain data classes, enums and sealed interfaces with explicit `org.json`
//! decoders and encoders (no reflection, no compiler plugin), so an Android or JVM host gets the
//! schema's own checks — required, const, tag, enum, strict members, string length and pattern,
//! integer and array bounds — without a schema validator at run time.
//!
//! Kotlin and Swift both need constraints the language-neutral model does not carry (lengths,
//! patterns, bounds); [`schema_info`] reads them from the canonical schema the model was built from.

use super::model::{pascal, Def, DefKind, Field, Model, Ty};
use super::GeneratedFile;
use std::fmt::Write;
use std::path::PathBuf;

/// Constraint facts read from the raw schema, shared by the Kotlin and Swift targets.
pub(super) mod schema_info {
    use super::super::model::Model;
    use serde_json::Value;

    /// The canonical schema when `model` was built from it (matched by digest), so a model built
    /// from some other document never borrows the canonical schema's constraints.
    pub fn raw(model: &Model) -> Option<&'static Value> {
        (crate::schema_digest() == model.digest).then(crate::schema)
    }

    pub fn def_node<'a>(raw: Option<&'a Value>, def: &str) -> Option<&'a Value> {
        raw?.get("$defs")?.get(def)
    }

    /// The node of property `wire` of `def`, with a `oneOf [X, null]` wrapper removed.
    pub fn prop_node<'a>(raw: Option<&'a Value>, def: &str, wire: &str) -> Option<&'a Value> {
        let node = def_node(raw, def)?.get("properties")?.get(wire)?;
        Some(strip_nullable(node))
    }

    pub fn strip_nullable(node: &Value) -> &Value {
        match node.get("oneOf").and_then(Value::as_array) {
            Some(b) if b.len() == 2 && b[1] == serde_json::json!({"type": "null"}) => &b[0],
            _ => node,
        }
    }

    pub fn child<'a>(node: Option<&'a Value>, key: &str) -> Option<&'a Value> {
        node?.get(key)
    }

    /// Bounds and pattern of one schema node (absent when the node has none).
    #[derive(Debug, Default, Clone, PartialEq)]
    pub struct Bounds {
        pub min_length: Option<u64>,
        pub max_length: Option<u64>,
        pub pattern: Option<String>,
        pub minimum: Option<i64>,
        pub maximum: Option<i64>,
        pub min_items: Option<u64>,
        pub max_items: Option<u64>,
        pub max_properties: Option<u64>,
        pub key_min_length: Option<u64>,
        pub key_max_length: Option<u64>,
    }

    pub fn bounds(node: Option<&Value>) -> Bounds {
        let Some(n) = node else {
            return Bounds::default();
        };
        let u = |k: &str| n.get(k).and_then(Value::as_u64);
        let keys = n.get("propertyNames");
        Bounds {
            min_length: u("minLength").filter(|&m| m > 0),
            max_length: u("maxLength"),
            pattern: n.get("pattern").and_then(Value::as_str).map(str::to_string),
            minimum: n.get("minimum").and_then(Value::as_i64),
            maximum: n.get("maximum").and_then(Value::as_i64),
            min_items: u("minItems").filter(|&m| m > 0),
            max_items: u("maxItems"),
            max_properties: u("maxProperties"),
            key_min_length: keys
                .and_then(|k| k.get("minLength"))
                .and_then(Value::as_u64)
                .filter(|&m| m > 0),
            key_max_length: keys
                .and_then(|k| k.get("maxLength"))
                .and_then(Value::as_u64),
        }
    }

    /// ECMA-262 `$` (no multiline flag) matches only at the very end; Java's and ICU's `$` also
    /// match before a final line terminator, so `"id\n"` would pass `^…$`. `\z` means what the
    /// schema means in both engines.
    pub fn end_anchored(pattern: &str) -> String {
        match pattern.strip_suffix('$') {
            Some(head) if !head.ends_with('\\') => format!("{head}\\z"),
            _ => pattern.to_string(),
        }
    }

    /// One branch of an object's own untagged `oneOf` (`{"required": [..], "properties": {..}}`):
    /// the members it requires and the definitions it narrows members to when it applies.
    pub struct RequiredBranch {
        pub required: Vec<String>,
        /// (member, definition) from the branch's `properties` `$ref`s.
        pub narrows: Vec<(String, String)>,
    }

    /// `oneOf: [{"required": [..]}, ..]` on an object: exactly one of these member sets, each
    /// possibly narrowing some members (JSON-RPC: a `result` response has a non-null `id`).
    pub fn exactly_one_of(raw: Option<&Value>, def: &str) -> Vec<RequiredBranch> {
        let Some(node) = def_node(raw, def) else {
            return Vec::new();
        };
        if node.get("x-tag").is_some() {
            return Vec::new();
        }
        let Some(branches) = node.get("oneOf").and_then(Value::as_array) else {
            return Vec::new();
        };
        branches
            .iter()
            .map(|b| {
                let obj = b.as_object().expect("a oneOf branch is an object");
                for key in obj.keys() {
                    assert!(
                        key == "required" || key == "properties",
                        "codegen: {def}: untagged oneOf branch keyword {key:?} is not supported"
                    );
                }
                let required = obj
                    .get("required")
                    .and_then(Value::as_array)
                    .map(|r| r.iter().filter_map(Value::as_str).map(str::to_string).collect())
                    .unwrap_or_default();
                let narrows = obj
                    .get("properties")
                    .and_then(Value::as_object)
                    .map(|props| {
                        props
                            .iter()
                            .map(|(k, v)| {
                                let target = v
                                    .get("$ref")
                                    .and_then(Value::as_str)
                                    .and_then(|r| r.strip_prefix("#/$defs/"))
                                    .unwrap_or_else(|| panic!("codegen: {def}: oneOf branch property {k:?} must be a $ref"));
                                (k.clone(), target.to_string())
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                RequiredBranch { required, narrows }
            })
            .collect()
    }

    /// The JSON-RPC envelope of DESIGN §4: (request unions, notification union, response struct).
    pub struct Envelope {
        pub requests: Vec<String>,
        pub notifications: String,
        pub response: String,
    }

    pub fn envelope(model: &Model) -> Option<Envelope> {
        let has = |n: &str| model.def(n).is_some();
        (has("ClientRequest")
            && has("ServerRequest")
            && has("ServerNotification")
            && has("ClientResponse"))
        .then(|| Envelope {
            requests: vec!["ClientRequest".into(), "ServerRequest".into()],
            notifications: "ServerNotification".into(),
            response: "ClientResponse".into(),
        })
    }
}

use schema_info::{bounds, child};

const PACKAGE: &str = "com.chainlesschain.appserver.protocol";
const DIR: &str = "bindings/kotlin/src/main/kotlin/com/chainlesschain/appserver/protocol";

/// Kotlin hard keywords: never usable as plain identifiers.
const KEYWORDS: &[&str] = &[
    "as",
    "break",
    "class",
    "continue",
    "do",
    "else",
    "false",
    "for",
    "fun",
    "if",
    "in",
    "interface",
    "is",
    "null",
    "object",
    "package",
    "return",
    "super",
    "this",
    "throw",
    "true",
    "try",
    "typealias",
    "typeof",
    "val",
    "var",
    "when",
    "while",
];

/// lowerCamelCase property name for a wire name; keywords get a `_` suffix (`class` → `class_`)
/// rather than backticks, because a backticked `class` would compile to a JVM getter `getClass()`
/// that clashes with `Object.getClass()`.
pub fn property_ident(wire: &str) -> String {
    let mut out = String::new();
    let mut upper = false;
    for c in wire.chars() {
        if c.is_ascii_alphanumeric() {
            if upper && !out.is_empty() {
                out.push(c.to_ascii_uppercase());
            } else {
                out.push(c);
            }
            upper = false;
        } else {
            upper = true;
        }
    }
    if out.is_empty() || out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    if let Some(first) = out.chars().next() {
        if first.is_ascii_uppercase() && wire.chars().nth(1).is_some_and(|c| c.is_lowercase()) {
            out.replace_range(0..1, &first.to_ascii_lowercase().to_string());
        }
    }
    if KEYWORDS.contains(&out.as_str()) || out == "extra" {
        out.push('_');
    }
    out
}

/// A Kotlin string literal; `$` is escaped so it is never a template.
pub fn string_literal(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '$' => out.push_str("\\$"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || (c as u32) > 0x7e => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn literal(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => string_literal(s),
        serde_json::Value::Bool(b) => b.to_string(),
        serde_json::Value::Number(n) if n.is_i64() || n.is_u64() => {
            long_literal(n.as_i64().unwrap_or(i64::MAX))
        }
        serde_json::Value::Number(n) => format!("{}", n.as_f64().unwrap_or(0.0)),
        other => string_literal(&other.to_string()),
    }
}

fn long_literal(v: i64) -> String {
    if v == i64::MIN {
        "Long.MIN_VALUE".into()
    } else {
        format!("{v}L")
    }
}

fn doc(out: &mut String, indent: &str, text: Option<&str>) {
    let Some(text) = text else { return };
    let text = text.replace("*/", "*&#47;");
    let _ = writeln!(out, "{indent}/**");
    for line in text.lines() {
        let _ = writeln!(
            out,
            "{indent} *{}{}",
            if line.is_empty() { "" } else { " " },
            line.trim_end()
        );
    }
    let _ = writeln!(out, "{indent} */");
}

fn header(model: &Model) -> String {
    format!(
        "// AUTO-GENERATED by `cc-agent-protocol generate` from schema/cc-agent-protocol.schema.json.\n// DO NOT EDIT: change the schema and regenerate.\n// Schema digest: {}\n\n",
        model.digest
    )
}

fn ty(t: &Ty) -> String {
    match t {
        Ty::String => "String".into(),
        Ty::Integer { .. } => "Long".into(),
        Ty::Number => "Double".into(),
        Ty::Boolean => "Boolean".into(),
        // A Long or a String.
        Ty::IntegerOrString => "Any".into(),
        Ty::Json => "Any".into(),
        Ty::Named(n) => n.clone(),
        Ty::Array(inner) => format!("List<{}>", ty(inner)),
        Ty::Map(inner) => format!("Map<String, {}>", ty(inner)),
    }
}

/// Regexes are compiled once, as private top-level values, numbered in order of first use.
#[derive(Default)]
struct Patterns(Vec<String>);

impl Patterns {
    fn name(&mut self, pattern: &str) -> String {
        let i = match self.0.iter().position(|p| p == pattern) {
            Some(i) => i,
            None => {
                self.0.push(pattern.to_string());
                self.0.len() - 1
            }
        };
        format!("PATTERN_{i}")
    }
}

struct Gen<'m> {
    model: &'m Model,
    raw: Option<&'static serde_json::Value>,
    patterns: Patterns,
}

impl Gen<'_> {
    /// An expression decoding `j` (a JSON value at pointer `at`) as `t`, checking `node`'s bounds.
    fn dec(
        &mut self,
        t: &Ty,
        node: Option<&serde_json::Value>,
        j: &str,
        at: &str,
        depth: usize,
    ) -> String {
        let b = bounds(node);
        let expr = match t {
            Ty::Named(n) => format!("decode{n}({j}, {at}, mode)"),
            Ty::String => {
                let mut args = vec![j.to_string(), at.to_string()];
                if let Some(m) = b.min_length {
                    args.push(format!("minLength = {m}"));
                }
                if let Some(m) = b.max_length {
                    args.push(format!("maxLength = {m}"));
                }
                if let Some(p) = &b.pattern {
                    args.push(format!("pattern = {}", self.patterns.name(p)));
                }
                format!("readString({})", args.join(", "))
            }
            Ty::Integer { .. } => {
                let mut args = vec![j.to_string(), at.to_string()];
                if let Some(m) = b.minimum {
                    args.push(format!("minimum = {}", long_literal(m)));
                }
                if let Some(m) = b.maximum {
                    args.push(format!("maximum = {}", long_literal(m)));
                }
                format!("readLong({})", args.join(", "))
            }
            Ty::Number => format!("readNumber({j}, {at})"),
            Ty::Boolean => format!("readBoolean({j}, {at})"),
            Ty::IntegerOrString => {
                let mut args = vec![j.to_string(), at.to_string()];
                if let Some(m) = b.minimum {
                    args.push(format!("minimum = {}", long_literal(m)));
                }
                if let Some(m) = b.maximum {
                    args.push(format!("maximum = {}", long_literal(m)));
                }
                if let Some(m) = b.max_length {
                    args.push(format!("maxLength = {m}"));
                }
                format!("readLongOrString({})", args.join(", "))
            }
            Ty::Json => format!("readJson({j}, {at})"),
            Ty::Array(inner) => {
                let mut args = vec![j.to_string(), at.to_string()];
                if let Some(m) = b.min_items {
                    args.push(format!("minItems = {m}"));
                }
                if let Some(m) = b.max_items {
                    args.push(format!("maxItems = {m}"));
                }
                let (jn, an) = (format!("j{depth}"), format!("at{depth}"));
                let item_node = child(node, "items").map(schema_info::strip_nullable);
                let inner = self.dec(inner, item_node, &jn, &an, depth + 1);
                format!("readList({}) {{ {jn}, {an} -> {inner} }}", args.join(", "))
            }
            Ty::Map(inner) => {
                let mut args = vec![j.to_string(), at.to_string()];
                if let Some(m) = b.max_properties {
                    args.push(format!("maxProperties = {m}"));
                }
                if let Some(m) = b.key_min_length {
                    args.push(format!("keyMinLength = {m}"));
                }
                if let Some(m) = b.key_max_length {
                    args.push(format!("keyMaxLength = {m}"));
                }
                let (jn, an) = (format!("j{depth}"), format!("at{depth}"));
                let value_node = child(node, "additionalProperties")
                    .filter(|v| v.is_object())
                    .map(schema_info::strip_nullable);
                let inner = self.dec(inner, value_node, &jn, &an, depth + 1);
                format!("readMap({}) {{ {jn}, {an} -> {inner} }}", args.join(", "))
            }
        };
        match node.and_then(|n| n.get("const")) {
            Some(c) => format!("checkConst({expr}, {}, {at})", literal(c)),
            None => expr,
        }
    }

    fn def(&mut self, out: &mut String, d: &Def) {
        doc(out, "", d.description.as_deref());
        let name = &d.name;
        match &d.kind {
            DefKind::Alias(t) => {
                let node = schema_info::def_node(self.raw, name);
                let kt = ty(t);
                let _ = writeln!(out, "typealias {name} = {kt}\n");
                let dec = self.dec(t, node, "j", "at", 1);
                let _ = writeln!(
                    out,
                    "internal fun decode{name}(j: Any?, at: String, mode: DecodeMode): {name} = {dec}\n"
                );
                let enc = enc(t, "v", 1);
                let _ = writeln!(out, "internal fun encode{name}(v: {name}): Any = {enc}\n");
            }
            DefKind::StringEnum {
                values,
                keep_unknown,
            } => self.string_enum(out, name, values, *keep_unknown),
            DefKind::Struct { fields, strict, .. } => self.structure(out, d, fields, *strict),
            DefKind::Union {
                tag,
                branches,
                keep_unknown,
            } => {
                let unknown = unknown_case(branches.iter().map(|b| b.variant.as_str()));
                let _ = writeln!(out, "sealed interface {name} {{");
                let _ = writeln!(out, "    fun toJson(): JSONObject = encode{name}(this)\n");
                for b in branches {
                    let _ = writeln!(
                        out,
                        "    data class {}(val value: {PACKAGE}.{}) : {name}",
                        b.variant, b.def
                    );
                }
                if *keep_unknown {
                    let _ = writeln!(
                        out,
                        "\n    /** A `{tag}` this version does not know, kept as sent (receive mode only). */\n    data class {unknown}(val raw: JSONObject) : {name}"
                    );
                }
                let _ = writeln!(
                    out,
                    "\n    companion object {{\n        fun fromJson(json: Any?, mode: DecodeMode = DecodeMode.Receive): {name} = decode{name}(json, \"\", mode)\n    }}\n}}\n"
                );
                let _ = writeln!(
                    out,
                    "internal fun decode{name}(j: Any?, at: String, mode: DecodeMode): {name} {{\n    val o = readObject(j, at){depth}\n    val t = requireMember(o, {tl}, at)\n    return when {{",
                    tl = string_literal(tag),
                    depth = max_depth(self.raw, name)
                        .map(|n| format!("\n    checkDepth(o, at, {n})"))
                        .unwrap_or_default()
                );
                for b in branches {
                    let _ = writeln!(
                        out,
                        "        tagIs(t, {}) -> {name}.{}(decode{}(o, at, mode))",
                        literal(&b.tag_value),
                        b.variant,
                        b.def
                    );
                }
                let refuse = format!(
                    "fail(ptr(at, {tl}), \"unknown {tg} \" + describeValue(t) + \" for {name}\")",
                    tl = string_literal(tag),
                    tg = tag.replace(['"', '\\', '$'], "")
                );
                if *keep_unknown {
                    let _ = writeln!(
                        out,
                        "        mode == DecodeMode.Receive -> {name}.{unknown}(o)\n        else -> {refuse}"
                    );
                } else {
                    let _ = writeln!(out, "        else -> {refuse}");
                }
                let _ = writeln!(out, "    }}\n}}\n");
                let _ = writeln!(
                    out,
                    "internal fun encode{name}(v: {name}): JSONObject = when (v) {{"
                );
                for b in branches {
                    let _ = writeln!(
                        out,
                        "    is {name}.{} -> encode{}(v.value)",
                        b.variant, b.def
                    );
                }
                if *keep_unknown {
                    let _ = writeln!(out, "    is {name}.{unknown} -> v.raw");
                }
                let _ = writeln!(out, "}}\n");
            }
        }
    }

    fn string_enum(&mut self, out: &mut String, name: &str, values: &[String], keep_unknown: bool) {
        let cases: Vec<String> = values.iter().map(|v| enum_case(v)).collect();
        if keep_unknown {
            let unknown = unknown_case(cases.iter().map(String::as_str));
            let _ = writeln!(out, "sealed class {name}(val wire: String) {{");
            for (v, c) in values.iter().zip(&cases) {
                let _ = writeln!(out, "    object {c} : {name}({})", string_literal(v));
            }
            let _ = writeln!(
                out,
                "\n    /** A value this version does not know, kept as sent (receive mode only). */\n    class {unknown}(raw: String) : {name}(raw)\n\n    override fun equals(other: Any?): Boolean = other is {name} && other.wire == wire\n\n    override fun hashCode(): Int = wire.hashCode()\n\n    override fun toString(): String = \"{name}(\" + wire + \")\"\n}}\n"
            );
            let _ = writeln!(
                out,
                "internal fun decode{name}(j: Any?, at: String, mode: DecodeMode): {name} = when (val s = readString(j, at)) {{"
            );
            for (v, c) in values.iter().zip(&cases) {
                let _ = writeln!(out, "    {} -> {name}.{c}", string_literal(v));
            }
            let _ = writeln!(
                out,
                "    else -> if (mode == DecodeMode.Receive) {name}.{unknown}(s) else fail(at, \"unknown {name} \" + describeValue(s))\n}}\n"
            );
        } else {
            let _ = writeln!(out, "enum class {name}(val wire: String) {{");
            for (v, c) in values.iter().zip(&cases) {
                let _ = writeln!(out, "    {c}({}),", string_literal(v));
            }
            let _ = writeln!(out, "}}\n");
            let _ = writeln!(
                out,
                "internal fun decode{name}(j: Any?, at: String, mode: DecodeMode): {name} = when (val s = readString(j, at)) {{"
            );
            for (v, c) in values.iter().zip(&cases) {
                let _ = writeln!(out, "    {} -> {name}.{c}", string_literal(v));
            }
            let _ = writeln!(
                out,
                "    else -> fail(at, \"unknown {name} \" + describeValue(s))\n}}\n"
            );
        }
        let _ = writeln!(out, "internal fun encode{name}(v: {name}): Any = v.wire\n");
    }

    fn structure(&mut self, out: &mut String, d: &Def, fields: &[Field], strict: bool) {
        let name = &d.name;
        let idents = unique_idents(fields.iter().map(|f| f.wire.as_str()));
        let members: Vec<(&Field, &String)> = fields
            .iter()
            .zip(&idents)
            .filter(|(f, _)| !f.is_tag)
            .collect();
        let empty = members.is_empty() && strict;
        if empty {
            // Kotlin has no empty data class: a plain class, equal to every other instance.
            let _ = writeln!(
                out,
                "class {name} {{\n    override fun equals(other: Any?): Boolean = other is {name}\n\n    override fun hashCode(): Int = {}\n\n    override fun toString(): String = \"{name}()\"\n",
                name.len()
            );
        } else {
            let _ = writeln!(out, "data class {name}(");
        }
        for (f, id) in &members {
            doc(out, "    ", f.description.as_deref());
            let base = ty(&f.ty);
            let (full, default) = match (f.required, f.nullable) {
                (true, false) => (base, f.constant.as_ref().map(literal)),
                (true, true) => (format!("{base}?"), None),
                (false, false) => (format!("{base}?"), Some("null".to_string())),
                (false, true) => (
                    format!("JsonField<{base}>"),
                    Some("JsonField.Absent".to_string()),
                ),
            };
            match default {
                Some(d) => {
                    let _ = writeln!(out, "    val {id}: {full} = {d},");
                }
                None => {
                    let _ = writeln!(out, "    val {id}: {full},");
                }
            }
        }
        if !strict {
            let _ = writeln!(
                out,
                "    /** Members this version does not know, kept so they survive a round trip. */\n    val extra: Map<String, Any> = emptyMap(),"
            );
        }
        if !empty {
            out.push_str(") {\n");
        }
        let _ = writeln!(
            out,
            "    fun toJson(): JSONObject = encode{name}(this)\n\n    companion object {{\n        fun fromJson(json: Any?, mode: DecodeMode = DecodeMode.Receive): {name} = decode{name}(json, \"\", mode)\n    }}\n}}\n"
        );

        // Decoder.
        let known: Vec<String> = fields.iter().map(|f| string_literal(&f.wire)).collect();
        let _ = writeln!(
            out,
            "private val MEMBERS_{name}: Set<String> = setOf({})\n",
            known.join(", ")
        );
        let _ = writeln!(
            out,
            "internal fun decode{name}(j: Any?, at: String, mode: DecodeMode): {name} {{\n    val o = readObject(j, at)"
        );
        if strict {
            let _ = writeln!(out, "    refuseUnknownMembers(o, at, MEMBERS_{name})");
        }
        let sets = schema_info::exactly_one_of(self.raw, name);
        if !sets.is_empty() {
            let lists: Vec<String> = sets
                .iter()
                .map(|s| {
                    format!(
                        "listOf({})",
                        s.required
                            .iter()
                            .map(|m| string_literal(m))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                })
                .collect();
            let _ = writeln!(
                out,
                "    requireExactlyOne(o, at, listOf({}))",
                lists.join(", ")
            );
            for s in &sets {
                let cond: Vec<String> = s
                    .required
                    .iter()
                    .map(|m| format!("o.has({})", string_literal(m)))
                    .collect();
                for (member, target) in &s.narrows {
                    let ml = string_literal(member);
                    let _ = writeln!(
                        out,
                        "    if ({} && o.has({ml})) decode{target}(o.opt({ml}), ptr(at, {ml}), mode)",
                        if cond.is_empty() { "true".to_string() } else { cond.join(" && ") }
                    );
                }
            }
        }
        for f in fields.iter().filter(|f| f.is_tag) {
            let node = schema_info::prop_node(self.raw, name, &f.wire);
            let wl = string_literal(&f.wire);
            let tag = f
                .constant
                .as_ref()
                .map(literal)
                .unwrap_or_else(|| "null".into());
            let _ = node;
            let _ = writeln!(
                out,
                "    checkConst(requireMember(o, {wl}, at), {tag}, ptr(at, {wl}))"
            );
        }
        let _ = writeln!(out, "    return {name}(");
        for (f, id) in &members {
            let node = schema_info::prop_node(self.raw, name, &f.wire);
            let wl = string_literal(&f.wire);
            let at = format!("ptr(at, {wl})");
            let line = match (f.required, f.nullable) {
                (true, false) => {
                    let inner =
                        self.dec(&f.ty, node, &format!("requireMember(o, {wl}, at)"), &at, 1);
                    inner
                }
                (true, true) => {
                    let inner = self.dec(&f.ty, node, "m", &at, 1);
                    format!("nullOr(requireMember(o, {wl}, at)) {{ m -> {inner} }}")
                }
                (false, false) => {
                    let inner = self.dec(&f.ty, node, "m", &at, 1);
                    format!("optional(o, {wl}) {{ m -> {inner} }}")
                }
                (false, true) => {
                    let inner = self.dec(&f.ty, node, "m", &at, 1);
                    format!("optionalNullable(o, {wl}) {{ m -> {inner} }}")
                }
            };
            let _ = writeln!(out, "        {id} = {line},");
        }
        if !strict {
            let _ = writeln!(out, "        extra = extraMembers(o, MEMBERS_{name}),");
        }
        let _ = writeln!(out, "    )\n}}\n");

        // Encoder: unknown members first, so a known member always wins.
        let _ = writeln!(
            out,
            "internal fun encode{name}(v: {name}): JSONObject {{\n    val o = JSONObject()"
        );
        if !strict {
            let _ = writeln!(out, "    for ((k, x) in v.extra) o.put(k, x)");
        }
        for (f, id) in fields.iter().zip(&idents) {
            let wl = string_literal(&f.wire);
            if f.is_tag {
                let tag = f
                    .constant
                    .as_ref()
                    .map(literal)
                    .unwrap_or_else(|| "null".into());
                let _ = writeln!(out, "    o.put({wl}, {tag})");
                continue;
            }
            match (f.required, f.nullable) {
                (true, false) => {
                    let _ = writeln!(
                        out,
                        "    o.put({wl}, {})",
                        enc(&f.ty, &format!("v.{id}"), 1)
                    );
                }
                (true, true) => {
                    let e = enc(&f.ty, &format!("v.{id}"), 1);
                    let _ = writeln!(
                        out,
                        "    o.put({wl}, if (v.{id} == null) JSONObject.NULL else {e})"
                    );
                }
                (false, false) => {
                    let e = enc(&f.ty, &format!("v.{id}"), 1);
                    let _ = writeln!(out, "    if (v.{id} != null) o.put({wl}, {e})");
                }
                (false, true) => {
                    let e = enc(&f.ty, "f.value", 1);
                    let _ = writeln!(
                        out,
                        "    when (val f = v.{id}) {{\n        is JsonField.Value -> o.put({wl}, {e})\n        JsonField.Null -> o.put({wl}, JSONObject.NULL)\n        JsonField.Absent -> Unit\n    }}"
                    );
                }
            }
        }
        let _ = writeln!(out, "    return o\n}}\n");
    }

    fn envelope(&mut self, out: &mut String) {
        let Some(env) = schema_info::envelope(self.model) else {
            return;
        };
        out.push_str(
            "/** One wire message, told apart the JSON-RPC way: `method` + `id` (request), `method` alone\n * (notification), neither (response, matched to its request by id). */\nsealed interface ProtocolMessage {\n    fun toJson(): JSONObject\n\n",
        );
        for r in &env.requests {
            let _ = writeln!(
                out,
                "    data class {r}Message(val value: {PACKAGE}.{r}) : ProtocolMessage {{\n        override fun toJson(): JSONObject = encode{r}(value)\n    }}\n"
            );
        }
        let n = &env.notifications;
        let resp = &env.response;
        let _ = writeln!(
            out,
            "    data class {n}Message(val value: {PACKAGE}.{n}) : ProtocolMessage {{\n        override fun toJson(): JSONObject = encode{n}(value)\n    }}\n\n    data class {resp}Message(val value: {PACKAGE}.{resp}) : ProtocolMessage {{\n        override fun toJson(): JSONObject = encode{resp}(value)\n    }}\n}}\n"
        );
        for r in &env.requests {
            let methods: Vec<String> = match self.model.def(r).map(|d| &d.kind) {
                Some(DefKind::Union { branches, .. }) => {
                    branches.iter().map(|b| literal(&b.tag_value)).collect()
                }
                _ => Vec::new(),
            };
            let _ = writeln!(
                out,
                "private val METHODS_{r}: Set<Any> = setOf({})\n",
                methods.join(", ")
            );
        }
        let _ = writeln!(
            out,
            "/**\n * Decodes one wire message. [DecodeMode.Receive] keeps unknown notifications and display values\n * as `Unknown`; [DecodeMode.Conformance] refuses everything the schema refuses.\n */\nfun decodeMessage(json: Any?, mode: DecodeMode = DecodeMode.Receive): ProtocolMessage {{\n    val o = readObject(json, \"\")\n    if (!o.has(\"method\")) return ProtocolMessage.{resp}Message(decode{resp}(o, \"\", mode))\n    val method = o.opt(\"method\") as? String ?: fail(\"/method\", \"method must be a string\")\n    if (o.has(\"id\")) {{"
        );
        for r in &env.requests {
            let _ = writeln!(
                out,
                "        if (method in METHODS_{r}) return ProtocolMessage.{r}Message(decode{r}(o, \"\", mode))"
            );
        }
        let _ = writeln!(
            out,
            "        fail(\"/method\", \"unknown method \" + describeValue(method))\n    }}\n    return ProtocolMessage.{n}Message(decode{n}(o, \"\", mode))\n}}\n"
        );
    }

    fn dispatch(&self, out: &mut String) {
        out.push_str(
            "/** The names of every definition, in schema order. */\nval DEFINITION_NAMES: List<String> = listOf(\n",
        );
        for d in &self.model.defs {
            let _ = writeln!(out, "    {},", string_literal(&d.name));
        }
        out.push_str(")\n\n");
        out.push_str(
            "/** Decodes `json` as the named definition; `null` when wire v1 has no definition of that name. */\nfun decodeDefinition(name: String, json: Any?, mode: DecodeMode = DecodeMode.Receive): Any? = when (name) {\n",
        );
        for d in &self.model.defs {
            let _ = writeln!(
                out,
                "    {} -> decode{}(json, \"\", mode)",
                string_literal(&d.name),
                d.name
            );
        }
        out.push_str("    else -> null\n}\n\n");
        out.push_str(
            "/** Decodes `json` as the named definition and encodes it again (conformance replay); `null`\n * when wire v1 has no definition of that name. */\nfun roundtripDefinition(name: String, json: Any?, mode: DecodeMode = DecodeMode.Receive): Any? = when (name) {\n",
        );
        for d in &self.model.defs {
            let _ = writeln!(
                out,
                "    {} -> encode{}(decode{}(json, \"\", mode))",
                string_literal(&d.name),
                d.name,
                d.name
            );
        }
        out.push_str("    else -> null\n}\n");
    }
}

/// An expression encoding the Kotlin value `v` of type `t` as an org.json value.
/// A definition's `x-max-depth` (nesting bound), if it has one.
fn max_depth(raw: Option<&'static serde_json::Value>, name: &str) -> Option<u64> {
    schema_info::def_node(raw, name)?
        .get("x-max-depth")?
        .as_u64()
}

fn enc(t: &Ty, v: &str, depth: usize) -> String {
    match t {
        Ty::Named(n) => format!("encode{n}({v})"),
        Ty::Array(inner) => {
            let x = format!("x{depth}");
            format!("encodeList({v}) {{ {x} -> {} }}", enc(inner, &x, depth + 1))
        }
        Ty::Map(inner) => {
            let x = format!("x{depth}");
            format!("encodeMap({v}) {{ {x} -> {} }}", enc(inner, &x, depth + 1))
        }
        _ => v.to_string(),
    }
}

fn enum_case(wire: &str) -> String {
    let p = pascal(wire);
    if p.is_empty() || p.starts_with(|c: char| c.is_ascii_digit()) {
        format!("V{p}")
    } else {
        p
    }
}

/// `Unknown`, unless a real case already has that name.
fn unknown_case<'a>(mut cases: impl Iterator<Item = &'a str>) -> &'static str {
    if cases.any(|c| c == "Unknown") {
        "UnknownValue"
    } else {
        "Unknown"
    }
}

/// Property identifiers for a struct's wire names, made unique in schema order.
fn unique_idents<'a>(wires: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for w in wires {
        let mut id = property_ident(w);
        while out.contains(&id) {
            id.push('_');
        }
        out.push(id);
    }
    out
}

/// The Kotlin runtime (`ProtocolRuntime.kt`): a real source file so it reads, diffs and lints as Kotlin.
/// The generator only prepends the AUTO-GENERATED header; the bytes that follow are the file's, so
/// `scripts/test-kotlin.sh` compiles this very source (with `-Werror`) in the same kotlinc run that
/// checks the generated types.
const RUNTIME: &str = include_str!("runtime/ProtocolRuntime.kt");

/// Every Kotlin file the generator writes.
pub fn generate(model: &Model) -> Vec<GeneratedFile> {
    let mut gen = Gen {
        model,
        raw: schema_info::raw(model),
        patterns: Patterns::default(),
    };
    let mut body = String::new();
    for d in &model.defs {
        gen.def(&mut body, d);
    }
    gen.envelope(&mut body);
    gen.dispatch(&mut body);

    let mut types = header(model);
    let _ = writeln!(
        types,
        "@file:Suppress(\"UNUSED_PARAMETER\", \"RedundantVisibilityModifier\")\n\npackage {PACKAGE}\n\nimport org.json.JSONObject\n"
    );
    let _ = writeln!(
        types,
        "/** The digest of the schema these types were generated from. */\nconst val SCHEMA_DIGEST: String = {}\n\n/** The schema's `$id`. */\nconst val SCHEMA_ID: String = {}\n",
        string_literal(&model.digest),
        string_literal(&model.schema_id)
    );
    for (i, p) in gen.patterns.0.iter().enumerate() {
        let _ = writeln!(
            types,
            "private val PATTERN_{i}: Regex = Regex({})",
            string_literal(&schema_info::end_anchored(p))
        );
    }
    if !gen.patterns.0.is_empty() {
        types.push('\n');
    }
    types.push_str(&body);

    let mut runtime = header(model);
    runtime.push_str(RUNTIME);
    vec![
        GeneratedFile {
            path: PathBuf::from(format!("{DIR}/ProtocolRuntime.kt")),
            contents: runtime,
        },
        GeneratedFile {
            path: PathBuf::from(format!("{DIR}/ProtocolTypes.kt")),
            contents: types,
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codegen::model::{Branch, Def, Field};

    fn field(wire: &str, required: bool, nullable: bool) -> Field {
        Field {
            wire: wire.into(),
            ty: Ty::String,
            required,
            nullable,
            constant: None,
            is_tag: false,
            description: None,
        }
    }

    fn keyword_model() -> Model {
        Model {
            digest: "sha256:test".into(),
            schema_id: "test".into(),
            defs: vec![
                Def {
                    name: "Odd".into(),
                    description: Some("has */ inside".into()),
                    kind: DefKind::Struct {
                        fields: [
                            "class",
                            "fun",
                            "in",
                            "is",
                            "object",
                            "val",
                            "when",
                            "typealias",
                            "interface",
                            "extra",
                            "retry_after_ms",
                            "default",
                            "self",
                            "Type",
                        ]
                        .iter()
                        .map(|w| field(w, true, false))
                        .chain([field("maybe", false, true)])
                        .collect(),
                        strict: false,
                        tag: None,
                    },
                },
                Def {
                    name: "Pick".into(),
                    description: None,
                    kind: DefKind::StringEnum {
                        values: vec!["unknown".into(), "a$b".into()],
                        keep_unknown: true,
                    },
                },
                Def {
                    name: "Box".into(),
                    description: None,
                    kind: DefKind::Union {
                        tag: "type".into(),
                        branches: vec![Branch {
                            tag_value: "odd".into(),
                            def: "Odd".into(),
                            variant: "Odd".into(),
                        }],
                        keep_unknown: true,
                    },
                },
            ],
        }
    }

    #[test]
    fn keywords_change_the_identifier_not_the_wire_name() {
        for (wire, id) in [
            ("class", "class_"),
            ("fun", "fun_"),
            ("in", "in_"),
            ("is", "is_"),
            ("object", "object_"),
            ("typealias", "typealias_"),
            ("retry_after_ms", "retryAfterMs"),
            ("threadId", "threadId"),
            ("default", "default"),
            ("extra", "extra_"),
        ] {
            assert_eq!(property_ident(wire), id, "{wire}");
        }
        let files = generate(&keyword_model());
        let types = &files[1].contents;
        assert!(types.contains("    val class_: String,"), "{types}");
        assert!(types.contains("o.put(\"class\", v.class_)"));
        assert!(types
            .contains("class_ = readString(requireMember(o, \"class\", at), ptr(at, \"class\")),"));
        assert!(types.contains("val maybe: JsonField<String> = JsonField.Absent,"));
        assert!(types.contains("object Unknown : Pick(\"unknown\")"));
        assert!(types.contains("class UnknownValue(raw: String) : Pick(raw)"));
        assert!(types.contains("\"a\\$b\" -> Pick.AB"));
        assert!(!types.contains("has */ inside"));
    }

    #[test]
    fn runtime_source_is_emitted_as_is_under_the_header() {
        // The runtime file names its package itself (it must stay a valid Kotlin file), so it has
        // to agree with the package the generated types are written to.
        assert!(RUNTIME.contains(&format!("\npackage {PACKAGE}\n")));
        let model = crate::codegen::model::build(crate::schema());
        let files = generate(&model);
        assert_eq!(files[0].contents, format!("{}{RUNTIME}", header(&model)));
        assert!(files[0].path.ends_with("ProtocolRuntime.kt"));
    }

    #[test]
    fn output_is_byte_identical_across_runs() {
        let schema = crate::schema();
        let a = generate(&crate::codegen::model::build(schema));
        let b = generate(&crate::codegen::model::build(schema));
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x.path, y.path);
            assert_eq!(x.contents, y.contents);
        }
        assert!(a
            .iter()
            .all(|f| f.contents.contains(crate::schema_digest())));
    }

    #[test]
    fn schema_constraints_reach_the_decoders() {
        let files = generate(&crate::codegen::model::build(crate::schema()));
        let types = &files[1].contents;
        assert!(types
            .contains("readString(j, at, minLength = 1, maxLength = 128, pattern = PATTERN_0)"));
        assert!(types.contains("Regex(\"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}\\\\z\")"));
        assert!(types
            .contains("requireExactlyOne(o, at, listOf(listOf(\"result\"), listOf(\"error\")))"));
        assert!(types.contains("refuseUnknownMembers(o, at, MEMBERS_ApprovalBinding)"));
    }
}
