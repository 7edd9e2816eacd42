//! Constraint facts read from the raw schema (lengths, patterns, bounds, untagged `oneOf`s, the
//! envelope) that the language-neutral model does not carry; the checking targets (Kotlin, Swift)
//! and the shared reader expressions in [`super::emit`] use them.

use super::model::Model;
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

/// The JSON-RPC envelope of the schema profile (docs/schema.md): (request unions, notification union, response struct).
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
