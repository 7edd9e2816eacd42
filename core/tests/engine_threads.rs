//! OS threads the engine creates, counted from /proc: an interrupt storm on a kernel that will not
//! settle creates none (before the fix: one per interrupt, 8,422 for 20,000), and a thousand turns
//! run on at most `max_running_turns` runner threads (before: one thread per turn). One test per
//! process (this file), so no other test's threads blur the count.

use cc_app_server::engine::{AppServer, Limits, SendError, ServerConfig};
use serde_json::{json, Value};
use std::collections::HashSet;
use std::time::{Duration, Instant};

fn os_threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

fn send(conn: &cc_app_server::engine::Connection, text: &str) {
    loop {
        match conn.send(text) {
            Ok(()) => return,
            Err(SendError::Overloaded { .. }) => std::thread::sleep(Duration::from_micros(200)),
            Err(e) => panic!("{e}"),
        }
    }
}

#[test]
fn interrupt_storms_and_many_turns_use_a_bounded_number_of_threads() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = ServerConfig::new(dir.path());
    config.settle_deadline = Duration::from_millis(300);
    // Thread counts do not depend on the store: one SQLite file without a sync per append keeps
    // 1,000 threads quick to create and to flush.
    config.store = cc_app_server::rollout::StoreKind::Sqlite;
    config.store_options.durability = cc_app_server::rollout::Durability::Buffered;
    config.limits = Limits {
        max_running_turns: 8,
        max_queued_turns: 1000,
        ..Limits::default()
    };
    let server = AppServer::open(config).unwrap();
    let conn = server.connect().unwrap();
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1, "minimumProtocolVersion": 1, "client": {"name": "t", "version": "1"}, "features": []}});
    send(&conn, &init.to_string());
    // A kernel stuck in a blocking call for 2 s: deaf to cancellation.
    let stuck = json!({"steps": [{"type": "ignoreCancel", "ms": 2000}]});
    send(&conn, &json!({"jsonrpc": "2.0", "id": 1, "method": "thread/start", "params": {"threadId": "stuck", "agentOptions": {"script": stuck}}}).to_string());
    send(&conn, &json!({"jsonrpc": "2.0", "id": 2, "method": "turn/start", "params": {"threadId": "stuck", "input": [{"type": "text", "text": "go"}]}}).to_string());
    let mut turn_id = Value::Null;
    while turn_id.is_null() {
        let m: Value =
            serde_json::from_str(&conn.recv(Some(Duration::from_secs(10))).unwrap()).unwrap();
        if m["id"] == 2 {
            turn_id = m["result"]["turn"]["id"].clone();
        }
    }
    let baseline = os_threads();
    // 20,000 pipelined interrupts, read by another thread so nothing backs up.
    const STORM: u64 = 20_000;
    let answers = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Value>::new()));
    let sink = std::sync::Arc::clone(&answers);
    let mut peak = baseline;
    let conn = std::sync::Arc::new(conn);
    let rx_conn = std::sync::Arc::clone(&conn);
    let receiver = std::thread::spawn(move || {
        let mut got = 0u64;
        while got < STORM {
            let Ok(text) = rx_conn.recv(Some(Duration::from_secs(30))) else {
                break;
            };
            let m: Value = serde_json::from_str(&text).unwrap();
            if m.get("method").is_none() && m["id"].as_u64().is_some_and(|i| i >= 1000) {
                got += 1;
                sink.lock().unwrap().push(m);
            }
        }
    });
    for i in 0..STORM {
        let m = json!({"jsonrpc": "2.0", "id": 1000 + i, "method": "turn/interrupt", "params": {"threadId": "stuck", "turnId": turn_id}});
        send(&conn, &m.to_string());
        if i % 500 == 0 {
            peak = peak.max(os_threads());
        }
    }
    receiver.join().unwrap();
    peak = peak.max(os_threads());
    let answers = answers.lock().unwrap();
    assert_eq!(answers.len() as u64, STORM, "every interrupt is answered");
    let ids: HashSet<u64> = answers.iter().map(|m| m["id"].as_u64().unwrap()).collect();
    assert_eq!(ids.len() as u64, STORM, "each exactly once");
    let mut kinds = std::collections::BTreeMap::<String, usize>::new();
    for m in answers.iter() {
        let k = match (m.get("result"), m["error"]["code"].as_i64()) {
            (Some(r), _) => {
                assert_eq!(r["physicallySettled"], true);
                "settled".to_string()
            }
            (None, Some(c)) => c.to_string(),
            _ => panic!("{m}"),
        };
        *kinds.entry(k).or_default() += 1;
    }
    for k in kinds.keys() {
        assert!(
            ["settled", "-32010", "-32001"].contains(&k.as_str()),
            "{kinds:?}"
        );
    }
    assert!(
        peak <= baseline + 2,
        "the storm created threads: {baseline} before, peak {peak} ({kinds:?})"
    );
    drop(answers);

    // A thousand short turns on a thousand threads: at most 8 runners at once.
    let start = os_threads();
    let mut peak = start;
    for i in 0..1000u64 {
        send(&conn, &json!({"jsonrpc": "2.0", "id": 100_000 + 2 * i, "method": "thread/start", "params": {"threadId": format!("t{i}"), "agentOptions": {"script": {"steps": [{"type": "sleep", "ms": 20}]}}}}).to_string());
        send(&conn, &json!({"jsonrpc": "2.0", "id": 100_001 + 2 * i, "method": "turn/start", "params": {"threadId": format!("t{i}"), "input": [{"type": "text", "text": "go"}]}}).to_string());
        while conn.try_recv().is_some() {}
        if i % 50 == 0 {
            peak = peak.max(os_threads());
        }
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        while conn.try_recv().is_some() {}
        let s = server.stats_snapshot();
        peak = peak.max(os_threads());
        if s.turns_running == 0 && s.turns_queued == 0 {
            break;
        }

        assert!(Instant::now() < deadline, "{s:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        peak <= start + 8,
        "1,000 turns ran on more than 8 runner threads: {start} before, peak {peak}"
    );
    let s = server.stats_snapshot();
    assert!(s.runner_threads <= 8, "{s:?}");
    assert_eq!(s.turns_refused_overloaded, 0, "{s:?}");
}
