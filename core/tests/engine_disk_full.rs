//! Disk full mid-turn, for real: the process's file-size limit (RLIMIT_FSIZE, with SIGXFSZ
//! ignored) makes the kernel refuse writes past a size with EFBIG, exactly as a full disk refuses
//! them with ENOSPC — the store sees a failed write either way. The turn whose events cannot be
//! written ends with `turn/completed` failed/recordingFailed at once (before the fix: nothing,
//! and a stdio server then waited out its whole drain timeout), and the terminal event is
//! recorded as soon as writes succeed again. One test per process: the limit is process-wide.

use cc_app_server::engine::{AppServer, ServerConfig};
use cc_app_server::rollout::layout;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

#[path = "fsize_support/mod.rs"]
mod fsize_support;
use fsize_support::FileSizeLimit;

fn recv(conn: &cc_app_server::engine::Connection) -> Value {
    let text = conn.recv(Some(Duration::from_secs(20))).expect("a message");
    let v: Value = serde_json::from_str(&text).unwrap();
    cc_agent_protocol::validate_protocol_message(&v).unwrap();
    v
}

fn req(conn: &cc_app_server::engine::Connection, id: u64, method: &str, params: Value) -> Value {
    conn.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string())
        .unwrap();
    loop {
        let m = recv(conn);
        if m.get("method").is_none() && m["id"] == id {
            return m;
        }
    }
}

#[test]
fn a_turn_that_cannot_be_recorded_ends_visibly_and_is_recorded_once_writes_succeed() {
    let dir = tempfile::tempdir().unwrap();
    // One event in flight at a time, so each delta is committed (and refused) on its own: a
    // batch of many is refused whole and cut back, which can leave room for the terminal
    // event, and this test is about the turn whose terminal event does not fit either.
    let mut config = ServerConfig::new(dir.path());
    config.limits.max_inflight_events = 1;
    let server = AppServer::open(config).unwrap();
    let conn = server.connect().unwrap();
    let init = json!({"protocolVersion": 1, "minimumProtocolVersion": 1, "client": {"name": "t", "version": "1"}, "features": []});
    assert!(req(&conn, 1, "initialize", init)["result"].is_object());
    // One character per delta: each delta event is smaller than the failed turn's terminal event,
    // so once a delta no longer fits, the terminal event does not either.
    let script = json!({"steps": [{"type": "message", "text": "x".repeat(400), "chunks": 400}]});
    req(
        &conn,
        2,
        "thread/start",
        json!({"threadId": "full", "agentOptions": {"script": script}}),
    );
    let log = layout::thread_log(dir.path(), "full");
    let size = std::fs::metadata(&log).unwrap().len();

    let limit = FileSizeLimit::set(size + 16 * 1024);
    let started = Instant::now();
    let t = req(
        &conn,
        3,
        "turn/start",
        json!({"threadId": "full", "input": [{"type": "text", "text": "go"}]}),
    );
    let turn_id = t["result"]["turn"]["id"].clone();
    let done = loop {
        let m = recv(&conn);
        if m["method"] == "turn/completed" {
            break m;
        }
    };
    let waited = started.elapsed();
    let turn = &done["params"]["turn"];
    assert_eq!(turn["id"], turn_id);
    assert_eq!(turn["status"], "failed", "{done}");
    assert_eq!(done["params"]["error"]["code"], "recordingFailed", "{done}");
    assert_eq!(
        turn["terminalEvidence"],
        Value::Null,
        "no evidence before it is durable"
    );
    assert!(
        waited < Duration::from_secs(10),
        "ended at once, not at a timeout: {waited:?}"
    );
    // Its eventSeq is the last seq that is durable; nothing past the limit is on disk.
    let on_disk = std::fs::read_to_string(&log).unwrap();
    let last: Value = serde_json::from_str(on_disk.lines().last().unwrap()).unwrap();
    assert_eq!(done["params"]["eventSeq"], last["seq"], "{done}");
    assert!(!on_disk.contains("turnCompleted"));
    let s = server.stats_snapshot();
    assert_eq!(s.unrecorded_terminals, 1, "{s:?}");
    assert!(s.recording_failures >= 1, "{s:?}");
    // The thread is free, but while writes still fail nothing can start on it: a clear -32603.
    let r = req(
        &conn,
        4,
        "turn/start",
        json!({"threadId": "full", "input": [{"type": "text", "text": "again"}]}),
    );
    assert_eq!(r["error"]["code"], -32603, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("disk full"),
        "{r}"
    );

    // The disk frees: the next turn/start records the failed turn's end first, then runs.
    limit.lift();
    let r = req(
        &conn,
        5,
        "turn/start",
        json!({"threadId": "full", "input": [{"type": "text", "text": "again"}]}),
    );
    assert!(r["result"].is_object(), "{r}");
    loop {
        let m = recv(&conn);
        if m["method"] == "turn/completed" {
            assert_eq!(m["params"]["turn"]["status"], "completed", "{m}");
            break;
        }
    }
    let read = req(
        &conn,
        6,
        "thread/read",
        json!({"threadId": "full", "limit": 1000}),
    );
    let events = read["result"]["events"].as_array().unwrap();
    let ends: Vec<&Value> = events
        .iter()
        .filter(|e| e["payload"]["type"] == "turnCompleted" && e["payload"]["turnId"] == turn_id)
        .collect();
    assert_eq!(
        ends.len(),
        1,
        "exactly one terminal event for the failed turn"
    );
    assert_eq!(ends[0]["payload"]["status"], "failed");
    assert_eq!(ends[0]["payload"]["error"]["code"], "recordingFailed");
    let end_seq = ends[0]["seq"].as_u64().unwrap();
    let next_start = events
        .iter()
        .find(|e| e["payload"]["type"] == "turnStarted" && e["payload"]["turnId"] != turn_id)
        .unwrap();
    assert!(
        end_seq < next_start["seq"].as_u64().unwrap(),
        "recorded before the next turn"
    );
    assert!(server.store().verify("full").unwrap().ok());
    drop(conn);
    server.shutdown();
    drop(server);
    // A restart finds nothing left open (no serverRestarted evidence is added).
    let server = AppServer::open(ServerConfig::new(dir.path())).unwrap();
    let page = server.store().read("full", 0, 1000).unwrap();
    assert!(page
        .events
        .iter()
        .all(|e| e.payload["error"]["code"] != "serverRestarted"));
}
