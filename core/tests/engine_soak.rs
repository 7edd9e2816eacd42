//! Memory soak (ignored by default; `scripts/soak-memory.sh` runs it in release mode): 100,000
//! threads with one turn each, then 100,000 more turns on a few threads, printing RSS as it goes.
//! What the engine keeps per thread and per turn is bounded (loaded threads, followed threads,
//! recent turns, idempotency entries, used nonces), so the engine's share stays flat; the figures
//! and the store's own share are in docs/engine.md.

use cc_app_server::approval::ApprovalPolicy;
use cc_app_server::engine::{AppServer, Connection, Limits, SendError, ServerConfig};
use cc_app_server::rollout::{Durability, StoreKind};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

fn send(conn: &Connection, text: &str) {
    loop {
        match conn.send(text) {
            Ok(()) => return,
            Err(SendError::Overloaded { .. }) => std::thread::sleep(Duration::from_micros(100)),
            Err(e) => panic!("{e}"),
        }
    }
}

/// Sends requests with ids `from..to` built by `make` (each step ends with one turn/start),
/// keeping at most `window` unanswered and 48 turns unfinished, answering approvals, until every
/// request is answered and every turn completed.
fn pump(conn: &Connection, from: u64, to: u64, make: impl Fn(u64) -> Vec<Value>) -> u64 {
    let mut answered = 0u64;
    let mut sent = 0u64;
    let mut completed = 0u64;
    let window = 200;
    let mut next = from;
    let expected_per = make(from).len() as u64;
    let total = (to - from) * expected_per;
    // At most 48 turns in flight: under the runner pool's bound, so nothing is refused.
    while answered < total || completed < (to - from) {
        while next < to && sent - answered < window && (next - from) - completed < 48 {
            for m in make(next) {
                send(conn, &m.to_string());
                sent += 1;
            }
            next += 1;
        }
        let Ok(text) = conn.recv(Some(Duration::from_secs(30))) else {
            panic!("stalled at {answered} of {total}");
        };
        let v: Value = serde_json::from_str(&text).unwrap();
        if v["method"] == "approval/decide" {
            send(
                conn,
                &json!({"jsonrpc": "2.0", "id": v["id"], "result": {"kind": "acceptOnce"}})
                    .to_string(),
            );
            continue;
        }
        if v.get("method").is_none() {
            assert!(v.get("result").is_some(), "{v}");
            answered += 1;
        } else if v["method"] == "turn/completed" {
            completed += 1;
        }
    }
    completed
}

#[test]
#[ignore = "a long soak: run scripts/soak-memory.sh"]
fn soak_100k_threads_and_100k_turns_keeps_engine_memory_flat() {
    let threads: u64 = std::env::var("CC_SOAK_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let dir = tempfile::tempdir().unwrap();
    let mut config = ServerConfig::new(dir.path());
    config.store = StoreKind::Sqlite;
    config.store_options.durability = Durability::Buffered;
    // Every tool asks; the soak answers acceptOnce, so each turn uses a nonce, forgotten once
    // its binding expires (2 s + 1 s grace).
    config.policy = ApprovalPolicy::AskEveryTime;
    config.approval_timeout = Duration::from_secs(2);
    config.limits = Limits::default();
    let server = AppServer::open(config).unwrap();
    let conn = server.connect().unwrap();
    send(&conn, &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1, "minimumProtocolVersion": 1, "client": {"name": "soak", "version": "1"}, "features": ["structured_approval"]}}).to_string());
    conn.recv(Some(Duration::from_secs(10))).unwrap();
    let script = json!({"steps": [{"type": "tool", "tool": "t", "arguments": {"x": 1}}, {"type": "message", "text": "ok", "chunks": 2}]});
    let started = Instant::now();
    println!("phase,count,rss_kib,threads_loaded,idempotency_entries,used_nonces,elapsed_s");
    let report = |phase: &str, n: u64| {
        let s = server.stats_snapshot();
        println!(
            "{phase},{n},{},{},{},{},{:.1}",
            rss_kib(),
            s.threads_loaded,
            s.idempotency_entries,
            s.used_nonces,
            started.elapsed().as_secs_f64()
        );
        s
    };
    report("start", 0);
    // Phase 1: a thread and a turn (with a tool) per step, each with idempotency keys.
    let step = threads / 10;
    let mut done = 0;
    while done < threads {
        let to = done + step;
        pump(&conn, done, to, |i| {
            vec![
                json!({"jsonrpc": "2.0", "id": 1 + 2 * i, "method": "thread/start", "params": {"threadId": format!("s{i}"), "idempotencyKey": format!("k{i}"), "agentOptions": {"script": script}}}),
                json!({"jsonrpc": "2.0", "id": 2 + 2 * i, "method": "turn/start", "params": {"threadId": format!("s{i}"), "idempotencyKey": format!("u{i}"), "input": [{"type": "text", "text": "go"}]}}),
            ]
        });
        done = to;
        let s = report("threads", done);
        assert!(s.threads_loaded <= Limits::default().max_loaded_threads as u64 + 64);
        assert!(s.idempotency_entries <= Limits::default().idempotency_entries as u64);
    }
    // Phase 2: as many turns again, on 16 threads (sequential per thread).
    let base = 10 * threads;
    let mut done = 0;
    while done < threads {
        let to = done + step;
        // One turn per thread at a time: a batch of 16 runs to completion before the next.
        let mut i = done;
        while i < to {
            let batch = (to - i).min(16);
            pump(&conn, i, i + batch, |k| {
                vec![
                    json!({"jsonrpc": "2.0", "id": base + k, "method": "turn/start", "params": {"threadId": format!("s{}", k % 16), "input": [{"type": "text", "text": "again"}]}}),
                ]
            });
            i += batch;
        }
        done = to;
        report("turns", done);
    }
}

/// The same 100,000 threads created through the store alone (no engine): what the store keeps
/// per thread, measured the same way, so the soak's per-thread growth can be attributed.
#[test]
#[ignore = "a long soak: run scripts/soak-memory.sh"]
fn soak_store_alone_per_thread_baseline() {
    use cc_app_server::rollout::{open_store, StoreOptions, ThreadStart};
    let threads: u64 = std::env::var("CC_SOAK_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions {
        durability: Durability::Buffered,
        ..StoreOptions::default()
    };
    let store = open_store(StoreKind::Sqlite, dir.path(), options).unwrap();
    println!("phase,count,rss_kib");
    println!("store-start,0,{}", rss_kib());
    for i in 0..threads {
        store
            .start(ThreadStart {
                thread_id: format!("s{i}"),
                ..ThreadStart::default()
            })
            .unwrap();
        if (i + 1) % (threads / 10) == 0 {
            println!("store-threads,{},{}", i + 1, rss_kib());
        }
    }
}
