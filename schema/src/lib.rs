//! Wire v1 of CC App Server, defined once: the canonical JSON Schema, its digest, the runtime
//! validator, the v1 compatibility gate and the code generator all live here so that every
//! language's view of the protocol comes from one file.

mod check;
pub mod codegen;
pub mod compat;
pub mod jcs;
pub mod pattern;
pub mod validate;

pub use validate::{
    assert_approval_decision, validate_approval_decision, validate_protocol_definition,
    validate_protocol_message, ErrorClass, MessageKind, ValidationError, ValidationIssue,
};

use serde_json::Value;
use sha2::{Digest as _, Sha256};
use std::sync::OnceLock;

/// The canonical schema as checked in, without the whitespace between its tokens (build.rs): the
/// same document and digest in 61 % of the bytes every host library embeds.
pub const SCHEMA_JSON: &str = include_str!(concat!(env!("OUT_DIR"), "/schema.min.json"));

/// The wire version this schema defines.
pub const PROTOCOL_VERSION: u32 = 1;

/// The parsed canonical schema (parsed once per process).
pub fn schema() -> &'static Value {
    static SCHEMA: OnceLock<Value> = OnceLock::new();
    SCHEMA.get_or_init(|| serde_json::from_str(SCHEMA_JSON).expect("the checked-in schema is JSON"))
}

/// `sha256:` + 64 lowercase hex of the RFC 8785 form of `schema`.
pub fn digest_of(schema: &Value) -> String {
    format!("sha256:{}", sha256_hex(&jcs::canonical_bytes(schema)))
}

/// The digest of the canonical schema, computed once from a parse that is dropped afterwards (a
/// server that only answers `initialize` does not keep the schema's ~1 MiB of `Value`s).
pub fn schema_digest() -> &'static str {
    static DIGEST: OnceLock<String> = OnceLock::new();
    DIGEST.get_or_init(|| {
        let parsed: Value =
            serde_json::from_str(SCHEMA_JSON).expect("the checked-in schema is JSON");
        digest_of(&parsed)
    })
}

/// Lowercase hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex_lower(&Sha256::digest(bytes))
}

/// Lowercase hex of `bytes` (a table lookup per nibble: on the hot path of every sealed event,
/// where the `hex` crate's char iterator cost more than the SHA-256 itself).
pub fn hex_lower(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = Vec::with_capacity(bytes.len() * 2);
    for &b in bytes {
        out.push(DIGITS[(b >> 4) as usize]);
        out.push(DIGITS[(b & 15) as usize]);
    }
    String::from_utf8(out).expect("hex digits are ASCII")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_hex_is_lowercase_hex_of_the_digest() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let all: Vec<u8> = (0..=255).collect();
        let hex = hex_lower(&all);
        assert_eq!(hex.len(), 512);
        for (i, pair) in hex.as_bytes().chunks(2).enumerate() {
            assert_eq!(pair, format!("{i:02x}").as_bytes());
        }
    }

    #[test]
    fn the_embedded_schema_is_the_checked_in_one_without_its_whitespace() {
        let file = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/cc-agent-protocol.schema.json"
        ))
        .unwrap();
        let parsed: Value = serde_json::from_str(&file).unwrap();
        assert_eq!(schema(), &parsed);
        assert_eq!(SCHEMA_JSON, serde_json::to_string(&parsed).unwrap());
        assert!(
            SCHEMA_JSON.len() * 10 < file.len() * 7,
            "{}",
            SCHEMA_JSON.len()
        );
    }

    #[test]
    fn digest_ignores_formatting_and_key_order() {
        let compact = serde_json::to_string(schema()).unwrap();
        let reformatted: Value = serde_json::from_str(&compact).unwrap();
        assert_eq!(digest_of(&reformatted), schema_digest());
        // Same document with every object's keys reversed and different whitespace.
        fn reverse(v: &Value) -> Value {
            match v {
                Value::Object(m) => Value::Object(
                    m.iter()
                        .rev()
                        .map(|(k, v)| (k.clone(), reverse(v)))
                        .collect(),
                ),
                Value::Array(a) => Value::Array(a.iter().map(reverse).collect()),
                other => other.clone(),
            }
        }
        let reversed = serde_json::to_string_pretty(&reverse(schema())).unwrap();
        assert_ne!(reversed, SCHEMA_JSON);
        assert_eq!(
            digest_of(&serde_json::from_str(&reversed).unwrap()),
            schema_digest()
        );
    }

    #[test]
    fn digest_moves_on_a_semantic_change() {
        let mut changed = schema().clone();
        changed["$defs"]["Identifier"]["maxLength"] = Value::from(129);
        assert_ne!(digest_of(&changed), schema_digest());
        let mut described = schema().clone();
        described["$defs"]["Thread"]["description"] = Value::from("changed");
        assert_ne!(digest_of(&described), schema_digest());
    }

    #[test]
    fn digest_has_the_wire_form() {
        let d = schema_digest();
        assert!(d.starts_with("sha256:") && d.len() == 71, "{d}");
        assert!(d[7..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
    }
}
