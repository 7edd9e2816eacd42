//! Regressions from the fuzz targets and the overload soak (docs/fuzzing.md,
//! docs/bench/soak.md) that show in-process: each test is the smallest reproducer of one
//! finding. Findings whose fix belongs to another change are `#[ignore]`d with the finding in
//! one line; run them with `cargo test -p cc-app-server --test fuzz_regressions -- --ignored`.

use cc_app_server::engine::{AppServer, Connection, ServerConfig};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn request(id: u64, method: &str, params: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string()
}

fn os_threads() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
}

/// Sends `line` (retrying while the inbound queue is full) and returns the answer to `id`,
/// collecting everything else into `other`.
fn call(conn: &Connection, id: u64, line: &str, other: &mut Vec<Value>) -> Value {
    while conn.send(line).is_err() {
        std::thread::sleep(Duration::from_millis(1));
    }
    let until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < until {
        if let Ok(text) = conn.recv(Some(Duration::from_millis(50))) {
            let v: Value = serde_json::from_str(&text).unwrap();
            if v["id"] == id && v.get("method").is_none() {
                return v;
            }
            other.push(v);
        }
    }
    panic!("no answer to request {id}");
}

/// Soak, in-process interrupt storm: 300 `turn/interrupt` on a turn whose kernel does not stop
/// for a second. Each one is answered, and the process does not gain an OS thread per request.
#[test]
fn an_interrupt_storm_does_not_cost_a_thread_per_request() {
    let dir = tempfile::tempdir().unwrap();
    let server = AppServer::open(ServerConfig::new(dir.path().join("state"))).unwrap();
    let conn = server.connect().unwrap();
    let mut other = Vec::new();
    let init = json!({"protocolVersion": 1, "minimumProtocolVersion": 1,
        "client": {"name": "regression", "version": "1"}, "features": ["thread_turn_item"]});
    call(&conn, 1, &request(1, "initialize", init), &mut other);
    let script = json!({"steps": [{"type": "ignoreCancel", "ms": 1000}]});
    let started = call(
        &conn,
        2,
        &request(
            2,
            "thread/start",
            json!({"threadId": "storm", "agentOptions": {"script": script}}),
        ),
        &mut other,
    );
    assert!(started.get("result").is_some(), "{started}");
    let turn = call(
        &conn,
        3,
        &request(
            3,
            "turn/start",
            json!({"threadId": "storm", "input": [{"type": "text", "text": "x"}]}),
        ),
        &mut other,
    );
    let turn_id = turn["result"]["turn"]["id"].as_str().unwrap().to_string();
    let before = os_threads();
    let mut peak = before;
    let mut answered = 0;
    let mut next = 4u64;
    let until = Instant::now() + Duration::from_secs(30);
    while answered < 300 && Instant::now() < until {
        while next < 304 {
            let line = request(
                next,
                "turn/interrupt",
                json!({"threadId": "storm", "turnId": turn_id}),
            );
            if conn.send(&line).is_err() {
                break;
            }
            next += 1;
        }
        while let Some(text) = conn.try_recv() {
            let v: Value = serde_json::from_str(&text).unwrap();
            if v.get("method").is_none() {
                answered += 1;
            }
        }
        peak = peak.max(os_threads());
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(answered, 300, "every interrupt is answered");
    assert!(
        peak <= before + 16,
        "{} OS threads appeared for 300 interrupts of one turn",
        peak - before
    );
    server.shutdown();
}
