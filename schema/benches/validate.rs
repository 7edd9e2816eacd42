//! Validation cost per message, and parse + validate throughput over the shared valid fixtures.
//!
//! Run: `cargo bench -p cc-agent-protocol --bench validate -- --measurement-time 3 --warm-up-time 1`
//! (results are recorded in docs/bench/validation.md).

use cc_agent_protocol::{validate_protocol_definition, validate_protocol_message};
use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use serde_json::{json, Value};
use std::path::Path;

const NONCE: &str = "0123456789abcdef0123456789abcdef";
const TS: &str = "2026-01-02T03:04:05.678Z";

fn digest(byte: &str) -> String {
    format!("sha256:{}", byte.repeat(32))
}

fn thread() -> Value {
    json!({"id": "thr_01", "title": "Refactor the parser", "status": "idle", "archived": false,
           "createdAt": TS, "updatedAt": TS, "lastEventSeq": 12,
           "forkedFrom": null, "metadata": {"project": "cc"}})
}

fn event(seq: u64, payload: Value) -> Value {
    json!({"seq": seq, "prevHash": format!("{:064x}", seq - 1), "hash": format!("{seq:064x}"),
           "time": TS, "traceId": null, "parentId": null, "idempotencyKey": null, "payload": payload})
}

/// The five typical messages: (name, value, Some(definition) when checked by name).
fn typical() -> Vec<(&'static str, Value, Option<&'static str>)> {
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
    let approval = json!({"jsonrpc": "2.0", "id": 9, "method": "approval/decide", "params": {
        "binding": {"threadId": "thr_01", "turnId": "turn_01", "itemId": "item_03",
                    "operationDigest": digest("a1"), "policyDigest": digest("b2"),
                    "workspaceDigest": digest("c3"), "nonce": NONCE, "expiresAt": TS},
        "operation": {"tool": "shell.exec", "arguments": {"command": ["cargo", "test"]}},
        "reason": "runs a command in the workspace"}});
    let events = vec![
        event(
            1,
            json!({"type": "threadStarted", "formatVersion": 1, "threadId": "thr_01",
                        "title": null, "metadata": {}, "forkedFrom": null}),
        ),
        event(
            2,
            json!({"type": "turnStarted", "turnId": "turn_01",
                        "input": [{"type": "text", "text": "Run the tests"}]}),
        ),
        event(
            3,
            json!({"type": "itemStarted", "turnId": "turn_01",
                        "item": {"type": "agentMessage", "id": "item_02", "text": ""}}),
        ),
        event(
            4,
            json!({"type": "itemDelta", "turnId": "turn_01", "itemId": "item_02",
                        "delta": {"type": "text", "text": "All 42 tests pass."}}),
        ),
        event(
            5,
            json!({"type": "itemCompleted", "turnId": "turn_01",
                        "item": {"type": "agentMessage", "id": "item_02", "text": "All 42 tests pass."}}),
        ),
        event(
            6,
            json!({"type": "turnCompleted", "turnId": "turn_01", "status": "completed",
                        "error": null, "physicallySettled": true}),
        ),
    ];
    let thread_read = json!({"thread": thread(), "events": events, "hasMore": false});
    vec![
        ("initialize_request", initialize, None),
        ("turn_start_request", turn_start, None),
        ("item_delta_notification", item_delta, None),
        ("approval_decide_request", approval, None),
        ("thread_read_result", thread_read, Some("ThreadReadResult")),
    ]
}

fn check(value: &Value, definition: Option<&str>) -> bool {
    match definition {
        Some(name) => validate_protocol_definition(name, value).is_ok(),
        None => validate_protocol_message(value).is_ok(),
    }
}

/// Every valid fixture as compact JSON text: (text, definition name for definition fixtures).
fn valid_fixture_batch() -> Vec<(String, Option<String>)> {
    fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("fixtures folder") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "json") {
                out.push(path);
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/valid");
    let mut paths = Vec::new();
    walk(&root, &mut paths);
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).expect("fixture text");
            let value: Value = serde_json::from_str(&text).expect("valid fixtures parse");
            if path.parent().is_some_and(|p| p.ends_with("definitions")) {
                let name = value["definition"]
                    .as_str()
                    .expect("definition name")
                    .to_string();
                (value["value"].to_string(), Some(name))
            } else {
                (value.to_string(), None)
            }
        })
        .collect()
}

fn per_message(c: &mut Criterion) {
    let mut group = c.benchmark_group("validate");
    for (name, value, definition) in typical() {
        assert!(check(&value, definition), "{name} must be valid");
        group.throughput(Throughput::Elements(1));
        group.bench_function(name, |b| b.iter(|| check(black_box(&value), definition)));
    }
    group.finish();
}

fn batch(c: &mut Criterion) {
    let batch = valid_fixture_batch();
    let bytes: usize = batch.iter().map(|(text, _)| text.len()).sum();
    let run = |batch: &[(String, Option<String>)]| {
        let mut ok = 0usize;
        for (text, definition) in batch {
            let value: Value = serde_json::from_str(black_box(text)).expect("parses");
            ok += usize::from(check(&value, definition.as_deref()));
        }
        ok
    };
    assert_eq!(run(&batch), batch.len(), "every valid fixture validates");
    let mut group = c.benchmark_group("parse_validate_valid_fixtures");
    group.throughput(Throughput::Bytes(bytes as u64));
    group.bench_function("bytes", |b| b.iter(|| run(&batch)));
    group.throughput(Throughput::Elements(batch.len() as u64));
    group.bench_function("messages", |b| b.iter(|| run(&batch)));
    group.finish();
}

criterion_group!(benches, per_message, batch);
criterion_main!(benches);
