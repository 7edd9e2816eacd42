//! What both validation benches measure: the five typical messages.

use serde_json::{json, Value};
use std::path::Path;

/// The five typical messages: (name, value, Some(definition) when checked by name).
pub fn typical() -> Vec<(&'static str, Value, Option<&'static str>)> {
    let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": 1, "minimumProtocolVersion": 1,
        "client": {"name": "swift-host", "version": "0.1.0"},
        "features": ["thread_turn_item", "structured_approval", "bounded_transport"]}});
    let turn_start = json!({"jsonrpc": "2.0", "id": 7, "method": "turn/start", "params": {
        "threadId": "thr_01", "idempotencyKey": "turn-idem-7",
        "input": [{"type": "text", "text": "Run the tests and fix what fails."}]}});
    let item_delta = json!({"jsonrpc": "2.0", "method": "item/delta", "params": {
        "threadId": "thr_01", "eventSeq": 42, "turnId": "turn_01", "itemId": "item_02",
        "delta": {"type": "text", "text": "All 42 tests "}}});
    // The two larger messages come from the fixtures, so they follow the schema as it changes.
    let approval = fixture("valid/approval-decide-request-full.json");
    let thread_read = fixture("valid/definitions/thread-read-result-every-event-payload.json");
    let thread_read = thread_read["value"].clone();
    vec![
        ("initialize_request", initialize, None),
        ("turn_start_request", turn_start, None),
        ("item_delta_notification", item_delta, None),
        ("approval_decide_request", approval, None),
        ("thread_read_result", thread_read, Some("ThreadReadResult")),
    ]
}

fn fixture(path: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(path);
    serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("fixture JSON")
}
