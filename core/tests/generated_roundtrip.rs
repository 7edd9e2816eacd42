//! Every valid shared fixture decodes into the generated Rust types and encodes back to the same
//! JSON value, and the three shapes of "absent" (missing, null, present) stay themselves.

use cc_agent_protocol::{validate_protocol_message, MessageKind};
use cc_app_server::protocol::*;
use serde_json::{json, Value};
use std::path::PathBuf;

fn fixtures(dir: &str) -> Vec<(PathBuf, Value)> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../schema/fixtures")
        .join(dir);
    let mut out = Vec::new();
    let mut stack = vec![root];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "json") {
                let text = std::fs::read_to_string(&path).unwrap();
                out.push((path, serde_json::from_str(&text).unwrap()));
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// JSON Schema compares numbers by value (`3.0` is the integer 3); the Rust types hold integers as
/// integers, so integral floats are read as the integers they are before decoding.
fn integral_floats_as_integers(v: &Value) -> Value {
    match v {
        Value::Number(n) if n.is_f64() => {
            let f = n.as_f64().unwrap();
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

#[test]
fn every_valid_fixture_round_trips_through_the_generated_types() {
    let all = fixtures("valid");
    assert!(!all.is_empty(), "no valid fixtures found");
    let mut failures = Vec::new();
    for (path, value) in &all {
        let (name, instance) = match (value.get("definition"), value.get("value")) {
            (Some(Value::String(def)), Some(v)) if value.as_object().unwrap().len() == 2 => {
                (def.clone(), v.clone())
            }
            _ => {
                let kind = validate_protocol_message(value)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                let name = match kind {
                    MessageKind::ClientRequest { .. } => "ClientRequest",
                    MessageKind::ServerRequest { .. } => "ServerRequest",
                    MessageKind::Notification { .. } => "ServerNotification",
                    MessageKind::Response => "ClientResponse",
                };
                (name.to_string(), value.clone())
            }
        };
        let instance = integral_floats_as_integers(&instance);
        match roundtrip_definition(&name, &instance) {
            Some(Ok(back)) if back == instance => {}
            Some(Ok(back)) => failures.push(format!(
                "{}: {name} changed:\n  in:  {instance}\n  out: {back}",
                path.display()
            )),
            Some(Err(e)) => {
                failures.push(format!("{}: {name} did not decode: {e}", path.display()))
            }
            None => failures.push(format!("{}: no generated type {name}", path.display())),
        }
    }
    println!(
        "{} passed, {} failed",
        all.len() - failures.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn optional_nullable_and_missing_stay_distinct() {
    for params in [json!({}), json!({"cursor": null}), json!({"cursor": "c1"})] {
        let decoded: ThreadListParams = serde_json::from_value(params.clone()).unwrap();
        assert_eq!(serde_json::to_value(&decoded).unwrap(), params);
    }
    let missing: ThreadListParams = serde_json::from_value(json!({})).unwrap();
    let null: ThreadListParams = serde_json::from_value(json!({"cursor": null})).unwrap();
    assert_eq!(missing.cursor, None);
    assert_eq!(null.cursor, Some(None));

    // Required-nullable: null is a value, missing is an error.
    let turn = json!({"id": "u1", "threadId": "t1", "status": "running", "createdAt": "2026-01-01T00:00:00.000Z", "completedAt": null, "revision": 1, "terminalEvidence": null});
    let decoded: Turn = serde_json::from_value(turn.clone()).unwrap();
    assert_eq!(decoded.completed_at, None);
    assert_eq!(serde_json::to_value(&decoded).unwrap(), turn);
    let mut missing = turn.clone();
    missing.as_object_mut().unwrap().remove("completedAt");
    let err = serde_json::from_value::<Turn>(missing).unwrap_err();
    assert!(err.to_string().contains("completedAt"), "{err}");
}

#[test]
fn display_unions_keep_unknown_values_and_security_unions_refuse_them() {
    let future_item = json!({"type": "hologram", "id": "i1", "depth": 3});
    let item: ItemContent = serde_json::from_value(future_item.clone()).unwrap();
    assert_eq!(item, ItemContent::Unknown(future_item.clone()));
    assert_eq!(serde_json::to_value(&item).unwrap(), future_item);

    let status: ItemStatus = serde_json::from_value(json!("paused")).unwrap();
    assert_eq!(status, ItemStatus::Unknown("paused".into()));

    for bad in [
        json!({"kind": "acceptAlways"}),
        json!({}),
        json!({"kind": 1}),
    ] {
        assert!(
            serde_json::from_value::<ApprovalDecision>(bad.clone()).is_err(),
            "{bad}"
        );
    }
    assert!(serde_json::from_value::<TurnStatus>(json!("paused")).is_err());
    let decision: ApprovalDecision =
        serde_json::from_value(json!({"kind": "decline", "reason": "no"})).unwrap();
    assert_eq!(
        decision,
        ApprovalDecision::Decline(Decline {
            reason: Some("no".into())
        })
    );
}

#[test]
fn tags_are_written_first_and_keywords_keep_their_wire_names() {
    let item = ItemContent::AgentMessage(AgentMessageItem {
        id: "i1".into(),
        text: "hi".into(),
        extra: Default::default(),
    });
    assert_eq!(
        serde_json::to_string(&item).unwrap(),
        r#"{"type":"agentMessage","id":"i1","text":"hi"}"#
    );
    let err = ErrorObject::OverloadedError(OverloadedError {
        message: "busy".into(),
        data: OverloadedData {
            retry_after_ms: 50,
            extra: Default::default(),
        },
    });
    assert_eq!(
        serde_json::to_value(&err).unwrap(),
        json!({"code": -32001, "message": "busy", "data": {"retry_after_ms": 50}})
    );
}

#[test]
fn generated_digest_matches_the_schema() {
    assert_eq!(SCHEMA_DIGEST, cc_agent_protocol::schema_digest());
}
