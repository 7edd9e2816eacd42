//! Engine benchmarks: the in-process thread/read round trip (median and p99), and a turn with
//! 10k deltas end to end to a Rust consumer, per durability mode. A plain timing harness (not
//! criterion) because p99 and one-shot end-to-end figures are what we report.
//!
//! Run: `cargo bench -p cc-app-server --bench engine` (add `-- quick` for a short run).

use cc_app_server::engine::{AppServer, ServerConfig};
use cc_app_server::rollout::{Durability, StoreKind};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn open(dir: &std::path::Path, store: StoreKind, durability: Durability) -> AppServer {
    let mut config = ServerConfig::new(dir);
    config.store = store;
    config.store_options.durability = durability;
    AppServer::open(config).unwrap()
}

fn round_trip(
    conn: &cc_app_server::engine::Connection,
    id: u64,
    method: &str,
    params: &Value,
) -> Value {
    conn.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string())
        .unwrap();
    loop {
        let m: Value =
            serde_json::from_str(&conn.recv(Some(Duration::from_secs(60))).unwrap()).unwrap();
        if m["id"] == json!(id) && m.get("method").is_none() {
            return m;
        }
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn thread_read_latency(samples: usize) {
    let dir = tempfile::tempdir().unwrap();
    let server = open(dir.path(), StoreKind::Jsonl, Durability::Sync);
    let conn = server.connect().unwrap();
    round_trip(
        &conn,
        1,
        "initialize",
        &json!({"protocolVersion": 1, "minimumProtocolVersion": 1, "client": {"name": "bench", "version": "1"}, "features": []}),
    );
    round_trip(&conn, 2, "thread/start", &json!({"threadId": "bench"}));
    let params = json!({"threadId": "bench", "limit": 10});
    for i in 0..1000 {
        round_trip(&conn, 10 + i, "thread/read", &params);
    }
    let mut times = Vec::with_capacity(samples);
    for i in 0..samples as u64 {
        let t = Instant::now();
        round_trip(&conn, 10_000 + i, "thread/read", &params);
        times.push(t.elapsed());
    }
    times.sort();
    println!(
        "thread/read round trip (in-process, JSONL, {samples} samples): median {:.1} µs, p99 {:.1} µs",
        percentile(&times, 0.5).as_secs_f64() * 1e6,
        percentile(&times, 0.99).as_secs_f64() * 1e6
    );
}

fn deltas_end_to_end(store: StoreKind, durability: Durability, deltas: usize) {
    let dir = tempfile::tempdir().unwrap();
    let server = open(dir.path(), store, durability);
    let client = cc_app_server::client::Client::connect(&server, None, Default::default()).unwrap();
    let text = "x".repeat(deltas);
    let script = json!({"steps": [{"type": "message", "text": text, "chunks": deltas}]});
    client
        .request(
            "thread/start",
            json!({"threadId": "d", "agentOptions": {"script": script}}),
        )
        .unwrap();
    let start = Instant::now();
    client
        .request(
            "turn/start",
            json!({"threadId": "d", "input": [{"type": "text", "text": "go"}]}),
        )
        .unwrap();
    let mut notifications = 0u64;
    let mut delta_count = 0usize;
    loop {
        let n = client
            .next_notification(Duration::from_secs(600))
            .expect("the turn keeps going");
        notifications += 1;
        if n["method"] == "item/delta" {
            delta_count += 1;
        }
        if n["method"] == "turn/completed" {
            break;
        }
    }
    let elapsed = start.elapsed();
    assert_eq!(delta_count, deltas);
    println!(
        "turn with {deltas} deltas ({store:?}, {durability:?}): {:.2} s end to end, {:.0} notifications/s",
        elapsed.as_secs_f64(),
        notifications as f64 / elapsed.as_secs_f64()
    );
}

fn main() {
    // `cargo bench` passes `--bench`; anything else containing "quick" shortens the run.
    let quick = std::env::args().any(|a| a == "quick");
    let (samples, deltas) = if quick {
        (2_000, 1_000)
    } else {
        (20_000, 10_000)
    };
    thread_read_latency(samples);
    for store in [StoreKind::Jsonl, StoreKind::Sqlite] {
        for durability in [Durability::Buffered, Durability::Sync] {
            deltas_end_to_end(store, durability, deltas);
        }
    }
}
