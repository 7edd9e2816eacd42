//! The validator and the parser the engine uses (`serde_json::from_str` into a `Value`, then
//! `cc_agent_protocol::validate_protocol_message`), plus the RFC 8785 form every digest and
//! rollout hash is computed from. Invariants, beyond "never panics":
//! - a verdict is deterministic and survives a re-serialisation of the message;
//! - a refusal has a JSON-RPC code of its class and at least one issue whose pointer resolves in
//!   the instance (schema/fixtures/README.md), and a message the engine can put on the wire;
//! - a valid request/notification decodes into the generated Rust types and encodes back to
//!   the same value;
//! - the canonical form is idempotent, independent of key order, and parses back.
#![no_main]

use cc_agent_protocol::jcs::canonicalize;
use cc_agent_protocol::{validate_protocol_message, MessageKind};
use cc_app_server::protocol::{ClientRequest, ServerNotification, ServerRequest};
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};

fn integral_floats_as_integers(v: &Value) -> Value {
    match v {
        Value::Number(n) if n.is_f64() => {
            let f = n.as_f64().unwrap_or(0.5);
            if f.fract() == 0.0 && f.abs() <= 9_007_199_254_740_991.0 {
                json!(f as i64)
            } else {
                v.clone()
            }
        }
        Value::Array(a) => Value::Array(a.iter().map(integral_floats_as_integers).collect()),
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| (k.clone(), integral_floats_as_integers(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

fn reversed(v: &Value) -> Value {
    match v {
        Value::Array(a) => Value::Array(a.iter().map(reversed).collect()),
        Value::Object(m) => Value::Object(
            m.iter()
                .rev()
                .map(|(k, v)| (k.clone(), reversed(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

fn roundtrip<T>(v: &Value)
where
    T: serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let instance = integral_floats_as_integers(v);
    let typed: T = serde_json::from_value(instance.clone()).unwrap_or_else(|e| {
        panic!("a valid message does not decode into the generated type: {e}\n{instance}")
    });
    let back = serde_json::to_value(&typed).expect("generated types encode");
    assert_eq!(back, instance, "the generated type changed a valid message");
}

fn check_jcs(v: &Value) {
    let canon = canonicalize(v);
    assert_eq!(
        canonicalize(&reversed(v)),
        canon,
        "JCS depends on key order"
    );
    let again: Value = serde_json::from_str(&canon)
        .unwrap_or_else(|e| panic!("the canonical form does not parse: {e}\n{canon}"));
    assert_eq!(canonicalize(&again), canon, "JCS is not idempotent");
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(value) = serde_json::from_str::<Value>(text) else {
        return;
    };
    check_jcs(&value);
    let verdict = validate_protocol_message(&value);
    let again: Value = serde_json::from_str(&value.to_string()).expect("a parsed value re-parses");
    assert_eq!(
        validate_protocol_message(&again),
        verdict,
        "the verdict moved on re-serialisation"
    );
    match &verdict {
        Ok(MessageKind::ClientRequest { method, .. }) => {
            assert_eq!(value["method"], Value::from(method.as_str()));
            roundtrip::<ClientRequest>(&value);
        }
        Ok(MessageKind::ServerRequest { method, .. }) => {
            assert_eq!(value["method"], Value::from(method.as_str()));
            roundtrip::<ServerRequest>(&value);
        }
        Ok(MessageKind::Notification { method, .. }) => {
            assert_eq!(value["method"], Value::from(method.as_str()));
            assert!(value.get("id").is_none());
            roundtrip::<ServerNotification>(&value);
        }
        Ok(MessageKind::Response) => assert!(value.get("method").is_none()),
        Err(e) => {
            assert!(matches!(e.class.code(), -32600 | -32601 | -32602));
            assert!(!e.issues.is_empty(), "a refusal without an issue");
            assert!(
                e.issues.iter().any(|i| value.pointer(&i.pointer).is_some()),
                "no issue pointer resolves in the instance: {e}\n{value}"
            );
            // What dispatch answers with must itself be a valid wire message.
            let text = e.to_string();
            let answer = json!({"jsonrpc": "2.0", "id": null,
                "error": {"code": e.class.code(), "message": text.chars().take(500).collect::<String>(),
                          "data": {"pointer": e.pointer().chars().take(1000).collect::<String>()}}});
            if let Err(bad) = validate_protocol_message(&answer) {
                panic!("the refusal is not a valid error response: {bad}\n{answer}");
            }
        }
    }
});
