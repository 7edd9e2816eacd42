//! Engine benchmarks (issue 14): every figure beside its floor, measured in one run on the same
//! machine, with the ratio. A plain harness (not criterion): medians, p99s and one-shot
//! end-to-end figures are what is reported, and the floors must run interleaved with what they
//! bound.
//!
//! Floors:
//! - echo: the host sends the request line over a bounded queue (the engine's own queue type)
//!   to a worker thread, which parses it and answers `{"jsonrpc":"2.0","id":…,"result":{}}` over
//!   a second one: what any in-process request costs before the engine does anything.
//! - sized echo: the same, answering with a result as long as the real answer (the bytes
//!   prebuilt): what handing that many bytes across costs.
//! - durable create: create a file, write 300 bytes, fdatasync, fsync the directory — what a
//!   durable thread/start cannot go below.
//! - directory listing: readdir of `threads/` and `anchors/` — what opening cannot go below.
//!
//! Run: `cargo bench -p cc-app-server --bench engine` (all sections, ~10 min on the shared
//! 2-core VM), `-- quick` (smaller sizes), or name sections: `-- list read start turns many
//! startup memory cold`. `scripts/bench.sh` runs it in release mode with the machine's load noted.

use cc_app_server::client::{Client, ClientConfig};
use cc_app_server::engine::queue::BoundedQueue;
use cc_app_server::engine::{AppServer, Connection, Limits, ServerConfig};
use cc_app_server::rollout::{
    event_hash, Anchor, Durability, StoreKind, StoredEvent, ANCHOR_SLOT, ZERO_HASH,
};
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------------
// Reporting

struct Row {
    what: String,
    value: String,
    floor: String,
    ratio: String,
    target: &'static str,
}

#[derive(Default)]
struct Report {
    rows: Vec<Row>,
}

impl Report {
    fn add(
        &mut self,
        what: impl Into<String>,
        value: String,
        floor: String,
        ratio: Option<f64>,
        target: &'static str,
    ) {
        let row = Row {
            what: what.into(),
            value,
            floor,
            ratio: ratio.map_or("-".into(), |r| format!("{r:.2}x")),
            target,
        };
        println!(
            "  {:<58} {:>16}   floor {:>16}   ratio {:>7}   target {}",
            row.what, row.value, row.floor, row.ratio, row.target
        );
        self.rows.push(row);
    }

    fn print(&self) {
        println!(
            "\n| measure | value | floor | ratio | target |\n| --- | ---: | ---: | ---: | --- |"
        );
        for r in &self.rows {
            println!(
                "| {} | {} | {} | {} | {} |",
                r.what, r.value, r.floor, r.ratio, r.target
            );
        }
    }
}

fn us(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn p99(v: &mut [Duration]) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * 0.99).round() as usize]
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

// ---------------------------------------------------------------------------------------------
// Floors

/// A worker thread that echoes requests over two bounded queues (the engine's queue type).
struct Echo {
    to: Arc<BoundedQueue>,
    from: Arc<BoundedQueue>,
    stop: Arc<AtomicBool>,
    worker: Option<std::thread::JoinHandle<()>>,
}

impl Echo {
    /// `result`: the result text the worker answers with (prebuilt).
    fn new(result: String) -> Echo {
        let to = BoundedQueue::new(256, 4 << 20);
        let from = BoundedQueue::new(512, 8 << 20);
        let stop = Arc::new(AtomicBool::new(false));
        let (t, f) = (Arc::clone(&to), Arc::clone(&from));
        let worker = std::thread::spawn(move || {
            while let Ok(line) = t.recv(None) {
                let v: Value = serde_json::from_str(&line).expect("JSON");
                let id = v["id"].to_string();
                let reply = format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{result}}}");
                if f.try_push(reply).is_err() {
                    break;
                }
            }
        });
        Echo {
            to,
            from,
            stop,
            worker: Some(worker),
        }
    }

    fn round_trip(&self, line: &str) -> usize {
        self.to.try_push(line.to_string()).unwrap();
        self.from.recv(None).unwrap().len()
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.to.close();
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

fn request(id: u64, method: &str, params: &Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string()
}

/// Sends `line` and waits for the answer to `id` (skipping notifications).
fn round_trip(conn: &Connection, line: &str, id: u64) -> String {
    conn.send(line).unwrap();
    let idtext = format!("\"id\":{id},");
    loop {
        let m = conn.recv(Some(Duration::from_secs(120))).unwrap();
        if m.contains(&idtext) && !m.starts_with("{\"jsonrpc\":\"2.0\",\"method\"") {
            return m;
        }
    }
}

/// Medians of the engine round trip and of both echo floors, plus the engine's p99. Measured
/// in `TRIALS` trials, each on a fresh connection (a fresh worker thread) and fresh echo threads,
/// blocks interleaved within a trial, and the median of the trials' medians taken: on a shared
/// VM a thread pair's wake-up cost depends on where the scheduler happens to place it (the same
/// vCPU or not: ~5 µs or ~40 µs), and both sides must be sampled over placements alike.
fn versus_floor(
    server: &AppServer,
    method: &str,
    params: &Value,
    samples: usize,
    next_id: &AtomicU64,
) -> (Duration, Duration, Duration, Duration) {
    const TRIALS: usize = 5;
    let (mut tm, mut t0, mut t1, mut all) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..TRIALS {
        let conn = server.connect().unwrap();
        init(&conn);
        let probe_id = next_id.fetch_add(1, Ordering::Relaxed);
        let answer = round_trip(&conn, &request(probe_id, method, params), probe_id);
        let v: Value = serde_json::from_str(&answer).unwrap();
        assert!(v.get("result").is_some(), "{method}: {answer}");
        let bare = Echo::new("{}".into());
        let sized = Echo::new(v["result"].to_string());
        let line = request(1, method, params);
        let (mut eng, mut e0, mut e1) = (Vec::new(), Vec::new(), Vec::new());
        let block = 100;
        for _ in 0..100 {
            let id = next_id.fetch_add(1, Ordering::Relaxed);
            round_trip(&conn, &request(id, method, params), id);
            bare.round_trip(&line);
            sized.round_trip(&line);
        }
        while eng.len() < samples / TRIALS {
            for _ in 0..block {
                let id = next_id.fetch_add(1, Ordering::Relaxed);
                let l = request(id, method, params);
                let t = Instant::now();
                round_trip(&conn, &l, id);
                eng.push(t.elapsed());
            }
            for _ in 0..block {
                let t = Instant::now();
                bare.round_trip(&line);
                e0.push(t.elapsed());
            }
            for _ in 0..block {
                let t = Instant::now();
                sized.round_trip(&line);
                e1.push(t.elapsed());
            }
        }
        tm.push(median(&mut eng));
        t0.push(median(&mut e0));
        t1.push(median(&mut e1));
        all.extend(eng);
    }
    let p = p99(&mut all);
    (median(&mut tm), p, median(&mut t0), median(&mut t1))
}

// ---------------------------------------------------------------------------------------------
// Fixtures

fn bench_root() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/bench-engine");
    std::fs::create_dir_all(&root).unwrap();
    root
}

fn fresh_dir(name: &str) -> PathBuf {
    let d = bench_root().join(name);
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// `n` JSONL threads of `events` events each, written directly in the documented format
/// (docs/rollout-format.md): creating them through the store would spend the run in per-file
/// fsyncs that are not what is measured. Every tenth is archived. Clean anchors, as a clean
/// shutdown leaves them.
fn forge_threads(dir: &Path, n: usize, events: usize) {
    drop(cc_app_server::rollout::open_jsonl(dir, Default::default()).unwrap());
    let time = "2026-01-01T00:00:00.000Z";
    let mut buf = Vec::new();
    for i in 0..n {
        let id = format!("t{i:07}");
        buf.clear();
        let mut prev = ZERO_HASH.to_string();
        let mut last_hash = String::new();
        for seq in 1..=events as u64 {
            let payload = if seq == 1 {
                json!({"type": "threadStarted", "formatVersion": 1, "threadId": id, "title": format!("Thread {i}"), "metadata": {}, "forkedFrom": null})
            } else if seq == events as u64 && i % 10 == 0 {
                json!({"type": "threadArchived", "archived": true})
            } else {
                json!({"type": "checkpoint", "label": format!("c{seq}")})
            };
            let hash = event_hash(seq, &prev, time, None, None, None, &payload);
            let ev = StoredEvent {
                seq,
                prev_hash: prev.clone(),
                hash: hash.clone(),
                time: time.into(),
                trace_id: None,
                parent_id: None,
                idempotency_key: None,
                payload,
            };
            serde_json::to_writer(&mut buf, &ev).unwrap();
            buf.push(b'\n');
            prev = hash.clone();
            last_hash = hash;
        }
        std::fs::write(dir.join(format!("threads/{id}.jsonl")), &buf).unwrap();
        let a = Anchor {
            seq: events as u64,
            hash: last_hash,
            offset: buf.len() as u64,
            gen: 1,
            archived: i % 10 == 0 && events > 1,
            format: 1,
            compacted_through: 0,
            last_compaction_seq: None,
            thread: None,
            key_id: None,
            mac: None,
        };
        let mut slots = vec![0u8; ANCHOR_SLOT];
        slots.extend_from_slice(&a.encode(&id, None));
        std::fs::write(dir.join(format!("anchors/{id}.head")), slots).unwrap();
    }
    // Let the kernel finish writing back the fixture (and the deletions before it) now, not
    // beside the timed requests on a 2-core machine.
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
}

fn open(dir: &Path, store: StoreKind, durability: Durability, limits: Limits) -> AppServer {
    let mut config = ServerConfig::new(dir);
    config.store = store;
    config.store_options.durability = durability;
    config.limits = limits;
    AppServer::open(config).unwrap()
}

fn init(conn: &Connection) {
    round_trip(
        conn,
        &request(
            0,
            "initialize",
            &json!({"protocolVersion": 1, "minimumProtocolVersion": 1, "client": {"name": "bench", "version": "1"}, "features": ["thread_turn_item", "structured_approval"]}),
        ),
        0,
    );
}

fn wait_warm(server: &AppServer) -> Duration {
    let t = Instant::now();
    while server.stats_snapshot().store_unsummarised_threads > 0 {
        std::thread::sleep(Duration::from_millis(5));
    }
    t.elapsed()
}

/// readdir of both directories, as `ls` would: the floor of opening.
fn list_dirs(dir: &Path) -> Duration {
    let t = Instant::now();
    let mut n = 0;
    for sub in ["threads", "anchors"] {
        for e in std::fs::read_dir(dir.join(sub)).unwrap() {
            n += e.unwrap().file_name().len();
        }
    }
    assert!(n > 0);
    t.elapsed()
}

// ---------------------------------------------------------------------------------------------
// Sections

fn section_list(r: &mut Report, quick: bool) {
    println!("\n== thread/list (limit 100), in-process, JSONL");
    let samples = if quick { 2_000 } else { 10_000 };
    for n in [100usize, if quick { 10_000 } else { 100_000 }] {
        let dir = fresh_dir("list");
        forge_threads(&dir, n, 3);
        let server = open(&dir, StoreKind::Jsonl, Durability::Sync, Limits::default());
        wait_warm(&server);
        let conn = server.connect().unwrap();
        init(&conn);
        let ids = AtomicU64::new(10);
        let (m, p, e0, e1) = versus_floor(
            &server,
            "thread/list",
            &json!({"limit": 100}),
            samples,
            &ids,
        );
        r.add(
            format!(
                "thread/list, {n} threads, first page: median (p99 {})",
                us(p)
            ),
            us(m),
            format!("echo {}", us(e0)),
            Some(m.as_secs_f64() / e0.as_secs_f64()),
            "<= 3x echo",
        );
        r.add(
            format!("  same, against an echo of the same {}-byte answer", {
                let a = round_trip(&conn, &request(7, "thread/list", &json!({"limit": 100})), 7);
                a.len()
            }),
            us(m),
            format!("sized echo {}", us(e1)),
            Some(m.as_secs_f64() / e1.as_secs_f64()),
            "-",
        );
        // Every page once (no thread is opened: the index is complete), untimed, for the
        // cursors; then the page in the middle of the index and the last one, timed as above.
        let mut cursors = Vec::new();
        let mut cursor = Value::Null;
        loop {
            let id = ids.fetch_add(1, Ordering::Relaxed);
            let a = round_trip(
                &conn,
                &request(id, "thread/list", &json!({"limit": 100, "cursor": cursor})),
                id,
            );
            let v: Value = serde_json::from_str(&a).unwrap();
            assert!(v["result"]["threads"].is_array(), "{a}");
            cursor = v["result"]["nextCursor"].clone();
            if cursor.is_null() {
                break;
            }
            cursors.push(cursor.clone());
        }
        let pages = cursors.len() + 1;
        for (name, c) in [
            ("middle", cursors.get(cursors.len() / 2)),
            ("last", cursors.last()),
        ] {
            let Some(c) = c else { continue };
            let (m, p, e0, _) = versus_floor(
                &server,
                "thread/list",
                &json!({"limit": 100, "cursor": c}),
                samples / 2,
                &ids,
            );
            r.add(
                format!(
                    "thread/list, {n} threads, the {name} of {pages} pages: median (p99 {})",
                    us(p)
                ),
                us(m),
                format!("echo {}", us(e0)),
                Some(m.as_secs_f64() / e0.as_secs_f64()),
                "<= 3x echo",
            );
        }
        server.shutdown();
    }
}

fn section_read(r: &mut Report, quick: bool) {
    println!("\n== thread/read and thread/resume of recent events (limit 10), in-process, JSONL");
    let samples = if quick { 2_000 } else { 10_000 };
    let dir = fresh_dir("read");
    let server = open(&dir, StoreKind::Jsonl, Durability::Sync, Limits::default());
    let client = Client::connect(&server, None, ClientConfig::default()).unwrap();
    for (id, chunks) in [("short", 1), ("long", 994)] {
        let script =
            json!({"steps": [{"type": "message", "text": "x".repeat(chunks), "chunks": chunks}]});
        client
            .request(
                "thread/start",
                json!({"threadId": id, "agentOptions": {"script": script}}),
            )
            .unwrap();
        client
            .request(
                "turn/start",
                json!({"threadId": id, "input": [{"type": "text", "text": "go"}]}),
            )
            .unwrap();
        while client
            .next_notification(Duration::from_secs(60))
            .expect("turn")["method"]
            != "turn/completed"
        {}
    }
    let conn = server.connect().unwrap();
    init(&conn);
    let ids = AtomicU64::new(10);
    let long_last = {
        let a = round_trip(
            &conn,
            &request(5, "thread/read", &json!({"threadId": "long", "limit": 1})),
            5,
        );
        serde_json::from_str::<Value>(&a).unwrap()["result"]["thread"]["revision"]
            .as_u64()
            .unwrap()
    };
    for (what, method, params) in [
        (
            "thread/read, 6-event thread, from seq 1",
            "thread/read",
            json!({"threadId": "short", "limit": 10}),
        ),
        (
            "thread/read, last 10 of a 1,000-event thread",
            "thread/read",
            json!({"threadId": "long", "afterEventSeq": long_last - 10, "limit": 10}),
        ),
        (
            "thread/resume, last 10 of a 1,000-event thread",
            "thread/resume",
            json!({"threadId": "long", "afterEventSeq": long_last - 10, "limit": 10}),
        ),
    ] {
        let (m, p, e0, e1) = versus_floor(&server, method, &params, samples, &ids);
        r.add(
            format!("{what}: median (p99 {})", us(p)),
            us(m),
            format!("echo {}", us(e0)),
            Some(m.as_secs_f64() / e0.as_secs_f64()),
            "<= 2x echo",
        );
        r.add(
            "  same, against an echo of the same answer",
            us(m),
            format!("sized echo {}", us(e1)),
            Some(m.as_secs_f64() / e1.as_secs_f64()),
            "-",
        );
    }
    drop(client);
    server.shutdown();
}

/// create + write 300 bytes + fdatasync + fsync of the directory.
fn durable_create(dir: &Path, i: u64) -> Duration {
    let t = Instant::now();
    let path = dir.join(format!("f{i}"));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .unwrap();
    f.write_all(&[b'x'; 300]).unwrap();
    f.sync_data().unwrap();
    std::fs::File::open(dir).unwrap().sync_all().unwrap();
    t.elapsed()
}

fn section_start(r: &mut Report, quick: bool) {
    println!("\n== thread/start (durable), in-process, JSONL Sync");
    let rounds = if quick { 60 } else { 300 };
    let dir = fresh_dir("start");
    let floor_dir = bench_root().join("start-floor");
    let _ = std::fs::remove_dir_all(&floor_dir);
    std::fs::create_dir_all(&floor_dir).unwrap();
    let server = open(&dir, StoreKind::Jsonl, Durability::Sync, Limits::default());
    let conn = server.connect().unwrap();
    init(&conn);
    let (mut eng, mut floor) = (Vec::new(), Vec::new());
    for i in 0..rounds {
        let id = 100 + i;
        let line = request(
            id,
            "thread/start",
            &json!({"threadId": format!("s{i}"), "title": "t"}),
        );
        let t = Instant::now();
        round_trip(&conn, &line, id);
        eng.push(t.elapsed());
        floor.push(durable_create(&floor_dir, i));
    }
    let (m, f) = (median(&mut eng), median(&mut floor));
    r.add(
        format!("thread/start: median (p99 {})", us(p99(&mut eng))),
        us(m),
        format!("create+write+fdatasync+dir fsync {}", us(f)),
        Some(m.as_secs_f64() / f.as_secs_f64()),
        "<= 1x",
    );
    server.shutdown();
}

/// One turn of `deltas` deltas to a Rust host (the Rust client): notifications per second,
/// from turn/start to turn/completed.
fn one_turn(store: StoreKind, durability: Durability, deltas: usize) -> (f64, Duration, u64) {
    let dir = fresh_dir("turn");
    let server = open(&dir, store, durability, Limits::default());
    let client = Client::connect(
        &server,
        None,
        ClientConfig {
            notification_capacity: 65_536,
            ..ClientConfig::default()
        },
    )
    .unwrap();
    let script =
        json!({"steps": [{"type": "message", "text": "x".repeat(deltas), "chunks": deltas}]});
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
    let mut delta_count = 0;
    loop {
        let n = client
            .next_notification(Duration::from_secs(600))
            .expect("the turn keeps going");
        notifications += 1;
        if n["method"] == "item/delta" {
            delta_count += 1;
        }
        if n["method"] == "turn/completed" {
            assert_eq!(n["params"]["turn"]["status"], "completed", "{n}");
            break;
        }
    }
    let elapsed = start.elapsed();
    assert_eq!(delta_count, deltas);
    let waits = server.stats_snapshot().pipeline_waits;
    drop(client);
    server.shutdown();
    (notifications as f64 / elapsed.as_secs_f64(), elapsed, waits)
}

/// `one_turn` to a host that takes the texts off the connection and only looks at their
/// method (no parse): what the engine itself delivers.
fn one_turn_raw(durability: Durability, deltas: usize) -> f64 {
    let dir = fresh_dir("turn");
    let server = open(&dir, StoreKind::Jsonl, durability, Limits::default());
    let conn = server.connect().unwrap();
    init(&conn);
    let script =
        json!({"steps": [{"type": "message", "text": "x".repeat(deltas), "chunks": deltas}]});
    round_trip(
        &conn,
        &request(
            1,
            "thread/start",
            &json!({"threadId": "d", "agentOptions": {"script": script}}),
        ),
        1,
    );
    let start = Instant::now();
    conn.send(&request(
        2,
        "turn/start",
        &json!({"threadId": "d", "input": [{"type": "text", "text": "go"}]}),
    ))
    .unwrap();
    let (mut n, mut d) = (0u64, 0usize);
    loop {
        let m = conn.recv(Some(Duration::from_secs(600))).unwrap();
        n += 1;
        if m.starts_with("{\"jsonrpc\":\"2.0\",\"method\":\"item/delta\"") {
            d += 1;
        } else if m.contains("\"method\":\"turn/completed\"") {
            break;
        }
    }
    let rate = n as f64 / start.elapsed().as_secs_f64();
    assert_eq!(d, deltas);
    server.shutdown();
    rate
}

/// The host's floor: ready-made delta notifications pushed through the engine's outbound queue
/// to the Rust client's pump pattern (take what is queued, tell notifications from the rest
/// without building a Value, hand them over in batches to the host thread, which parses each and
/// looks at its method) — no engine, no store: how fast the host side alone can take a turn's
/// notifications.
fn host_floor(deltas: usize) -> f64 {
    #[derive(serde::Deserialize)]
    struct Head {
        #[serde(default)]
        method: Option<serde::de::IgnoredAny>,
        #[serde(default)]
        id: Option<serde::de::IgnoredAny>,
    }
    let q = BoundedQueue::new(512, 8 << 20);
    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<String>>(256);
    let pump = {
        let q = Arc::clone(&q);
        std::thread::spawn(move || {
            while let Ok(first) = q.recv(None) {
                let mut batch = vec![first];
                while batch.len() < 256 {
                    match q.try_recv() {
                        Some(m) => batch.push(m),
                        None => break,
                    }
                }
                batch.retain(|m| {
                    matches!(serde_json::from_str::<Head>(m), Ok(h) if h.method.is_some() && h.id.is_none())
                });
                if tx.send(batch).is_err() {
                    break;
                }
            }
        })
    };
    let producer = {
        let q = Arc::clone(&q);
        std::thread::spawn(move || {
            for i in 0..deltas {
                let text = format!("{{\"jsonrpc\":\"2.0\",\"method\":\"item/delta\",\"params\":{{\"threadId\":\"d\",\"eventSeq\":{},\"delta\":{{\"text\":\"x\",\"type\":\"text\"}},\"itemId\":\"tu-12345678901234567890-i1\",\"turnId\":\"tu-12345678901234567890\"}}}}", i + 4);
                q.push_waiting(text, Duration::from_secs(30)).unwrap();
            }
            q.close();
        })
    };
    let t = Instant::now();
    let mut n = 0;
    while let Ok(batch) = rx.recv() {
        for m in batch {
            let v: Value = serde_json::from_str(&m).unwrap();
            if v["method"] == "item/delta" {
                n += 1;
            }
        }
    }
    let rate = n as f64 / t.elapsed().as_secs_f64();
    producer.join().unwrap();
    pump.join().unwrap();
    rate
}

fn section_turns(r: &mut Report, quick: bool) {
    let deltas = if quick { 20_000 } else { 100_000 };
    let trials = if quick { 1 } else { 3 };
    println!("\n== one turn of {deltas} deltas to a Rust host (the Rust client), median of {trials} interleaved trials");
    let parsed = [
        (StoreKind::Jsonl, Durability::Sync, ">= 50k/s"),
        (StoreKind::Jsonl, Durability::Buffered, ">= 500k/s"),
        (StoreKind::Jsonl, Durability::Ephemeral, ">= 1M/s"),
        (StoreKind::Sqlite, Durability::Sync, "-"),
        (StoreKind::Sqlite, Durability::Buffered, "-"),
    ];
    let raw = [
        (Durability::Sync, ">= 50k/s"),
        (Durability::Buffered, ">= 500k/s"),
        (Durability::Ephemeral, ">= 1M/s"),
    ];
    // Every configuration once per trial, so a noisy minute hits them all alike.
    let mut rates = vec![Vec::new(); parsed.len() + raw.len() + 1];
    for _ in 0..trials {
        for (i, (store, durability, _)) in parsed.iter().enumerate() {
            rates[i].push(one_turn(*store, *durability, deltas).0);
        }
        for (i, (durability, _)) in raw.iter().enumerate() {
            rates[parsed.len() + i].push(one_turn_raw(*durability, deltas));
        }
        rates[parsed.len() + raw.len()].push(host_floor(deltas));
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let floor = med(&mut rates[parsed.len() + raw.len()]);
    for (i, (store, durability, target)) in parsed.iter().enumerate() {
        let rate = med(&mut rates[i]);
        r.add(
            format!("turn, {store:?} {durability:?}"),
            format!("{rate:.0}/s"),
            format!("host floor {floor:.0}/s"),
            Some(rate / floor),
            target,
        );
    }
    for (i, (durability, target)) in raw.iter().enumerate() {
        let rate = med(&mut rates[parsed.len() + i]);
        r.add(
            format!("turn, Jsonl {durability:?}, to a host that does not parse"),
            format!("{rate:.0}/s"),
            "-".into(),
            None,
            target,
        );
    }
    r.add(
        "host floor: the client's pump pattern alone, ready-made deltas",
        format!("{floor:.0}/s"),
        "-".into(),
        None,
        "(bounds every parsed row)",
    );
    // The per-event CPU floor: what recording one delta costs without any I/O or thread hop
    // (payload → schema check → JCS + SHA-256 → line), for reading the figures above.
    let payload = json!({"type": "itemDelta", "turnId": "tu-1", "itemId": "tu-1-i1", "delta": {"type": "text", "text": "x"}});
    let n = 200_000;
    let t = Instant::now();
    for i in 0..n {
        let ev = cc_app_server::rollout::NewEvent::new(payload.clone());
        let c = cc_app_server::rollout::CheckedEvent::new(ev).unwrap();
        let h = event_hash(
            i,
            ZERO_HASH,
            "2026-01-01T00:00:00.000Z",
            None,
            None,
            None,
            &c.event().payload,
        );
        std::hint::black_box(h);
    }
    let per = t.elapsed() / n as u32;
    r.add(
        "per event of any kind, CPU only: schema check + JCS + SHA-256 (a plain text delta skips the schema walk)",
        us(per),
        "-".into(),
        None,
        "(bounds one core)",
    );
}

fn section_many(r: &mut Report, quick: bool) {
    let (conns, per_conn, deltas) = if quick { (16, 4, 100) } else { (64, 8, 200) };
    println!(
        "\n== {conns} connections x {per_conn} concurrent turns ({deltas} deltas each), JSONL Sync"
    );
    for runners in [64usize, 512] {
        let dir = fresh_dir("many");
        let limits = Limits {
            max_running_turns: runners,
            max_queued_turns: conns * per_conn,
            ..Limits::default()
        };
        let server = open(&dir, StoreKind::Jsonl, Durability::Sync, limits);
        let script =
            json!({"steps": [{"type": "message", "text": "y".repeat(deltas), "chunks": deltas}]});
        let clients: Vec<Client> = (0..conns)
            .map(|_| {
                Client::connect(
                    &server,
                    None,
                    ClientConfig {
                        notification_capacity: 65_536,
                        ..ClientConfig::default()
                    },
                )
                .unwrap()
            })
            .collect();
        for (c, client) in clients.iter().enumerate() {
            for t in 0..per_conn {
                client
                    .request("thread/start", json!({"threadId": format!("c{c}t{t}"), "agentOptions": {"script": script}}))
                    .unwrap();
            }
        }
        let total = Arc::new(AtomicU64::new(0));
        let start = Instant::now();
        let workers: Vec<_> = clients
            .into_iter()
            .enumerate()
            .map(|(c, client)| {
                let total = Arc::clone(&total);
                std::thread::spawn(move || {
                    let mut latencies = Vec::new();
                    for t in 0..per_conn {
                        let s = Instant::now();
                        client
                            .request("turn/start", json!({"threadId": format!("c{c}t{t}"), "input": [{"type": "text", "text": "go"}]}))
                            .unwrap();
                        latencies.push(s.elapsed());
                    }
                    let mut done = 0;
                    let mut n = 0u64;
                    let mut probes = 0;
                    while done < per_conn {
                        // A cheap request now and then: its latency under the load.
                        if n.is_multiple_of(97) && probes < 20 {
                            probes += 1;
                            let s = Instant::now();
                            client
                                .request("thread/read", json!({"threadId": format!("c{c}t0"), "afterEventSeq": 1, "limit": 1}))
                                .unwrap();
                            latencies.push(s.elapsed());
                        }
                        let m = client
                            .next_notification(Duration::from_secs(600))
                            .expect("turns keep going");
                        n += 1;
                        if m["method"] == "turn/completed" {
                            done += 1;
                        }
                    }
                    total.fetch_add(n, Ordering::Relaxed);
                    latencies
                })
            })
            .collect();
        let mut lat: Vec<Duration> = workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect();
        let elapsed = start.elapsed();
        let rate = total.load(Ordering::Relaxed) as f64 / elapsed.as_secs_f64();
        let threads_now = std::fs::read_dir("/proc/self/task")
            .map(|d| d.count())
            .unwrap_or(0);
        r.add(
            format!("{conns}x{per_conn} turns, {runners} runners: aggregate notifications ({:.2} s, {threads_now} OS threads)", elapsed.as_secs_f64()),
            format!("{rate:.0}/s"),
            "-".into(),
            None,
            "reported",
        );
        r.add(
            format!("  request latency under that load (turn/start, thread/read), {} samples: p99 (median {})", lat.len(), ms(median(&mut lat))),
            ms(p99(&mut lat)),
            "-".into(),
            None,
            "reported",
        );
        server.shutdown();
    }
}

fn section_startup(r: &mut Report, quick: bool) {
    println!("\n== opening a state directory (JSONL)");
    let sizes: &[(usize, usize)] = if quick {
        &[(10_000, 10), (1_000, 1_000)]
    } else {
        &[(100_000, 10), (10_000, 1_000), (100, 100_000)]
    };
    for &(threads, events) in sizes {
        let dir = fresh_dir("startup");
        let t = Instant::now();
        forge_threads(&dir, threads, events);
        println!(
            "  (fixture: {threads} threads x {events} events written in {:.1} s)",
            t.elapsed().as_secs_f64()
        );
        // Interleave: listing the directory, then opening, three times; medians.
        let (mut floor, mut opened, mut warmed) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..3 {
            floor.push(list_dirs(&dir));
            let t = Instant::now();
            let server = open(&dir, StoreKind::Jsonl, Durability::Sync, Limits::default());
            opened.push(t.elapsed());
            warmed.push(wait_warm(&server) + opened[opened.len() - 1]);
            server.shutdown();
        }
        let (f, o, w) = (median(&mut floor), median(&mut opened), median(&mut warmed));
        r.add(
            format!("open, {threads} threads x {events} events"),
            ms(o),
            format!("readdir {}", ms(f)),
            Some(o.as_secs_f64() / f.as_secs_f64()),
            "<= 2x",
        );
        r.add(
            "  until the index is complete (background, server usable meanwhile)",
            ms(w),
            format!("readdir {}", ms(f)),
            Some(w.as_secs_f64() / f.as_secs_f64()),
            "-",
        );
    }
}

/// Cold start as a host sees it: from `AppServer::open` to the first answered `thread/list`
/// (connect, initialize, one page), on a state directory written before the process opened it
/// (page cache warm: the files were just written; a phone that was asleep pays its flash reads on
/// top). The same 1,000 threads with 10 and with 1,000 events each show that nothing on the path
/// is O(events).
fn section_cold(r: &mut Report, quick: bool) {
    println!("\n== cold start: open to the first answered thread/list (JSONL)");
    let sizes: &[(usize, usize, &'static str)] = if quick {
        &[
            (1_000, 10, "<= 50 ms"),
            (1_000, 1_000, "<= 50 ms"),
            (10_000, 10, "reported"),
        ]
    } else {
        &[
            (1_000, 10, "<= 50 ms"),
            (1_000, 1_000, "<= 50 ms"),
            (100_000, 10, "reported"),
        ]
    };
    for &(threads, events, target) in sizes {
        let dir = fresh_dir("cold");
        forge_threads(&dir, threads, events);
        let (mut floor, mut cold) = (Vec::new(), Vec::new());
        for run in 0..5 {
            floor.push(list_dirs(&dir));
            let t = Instant::now();
            let server = open(&dir, StoreKind::Jsonl, Durability::Sync, Limits::default());
            let conn = server.connect().unwrap();
            init(&conn);
            let page = round_trip(&conn, &request(1, "thread/list", &json!({"limit": 50})), 1);
            cold.push(t.elapsed());
            assert!(page.contains("\"threads\":[{"), "run {run}: {page}");
            drop(conn);
            server.shutdown();
        }
        let (f, c) = (median(&mut floor), median(&mut cold));
        r.add(
            format!(
                "cold start to the first thread/list page, {threads} threads x {events} events"
            ),
            ms(c),
            format!("readdir {}", ms(f)),
            Some(c.as_secs_f64() / f.as_secs_f64()),
            target,
        );
        // The same from a dropped page cache (root only): what a device that evicted the files
        // pays, storage reads included. The floor is a readdir from a dropped cache too.
        let (mut floor, mut cold) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            if !drop_page_cache() {
                break;
            }
            floor.push(list_dirs(&dir));
            drop_page_cache();
            let t = Instant::now();
            let server = open(&dir, StoreKind::Jsonl, Durability::Sync, Limits::default());
            let conn = server.connect().unwrap();
            init(&conn);
            round_trip(&conn, &request(1, "thread/list", &json!({"limit": 50})), 1);
            cold.push(t.elapsed());
            drop(conn);
            server.shutdown();
        }
        if !cold.is_empty() {
            let (f, c) = (median(&mut floor), median(&mut cold));
            r.add(
                "  the same with the page cache dropped first",
                ms(c),
                format!("readdir {}", ms(f)),
                Some(c.as_secs_f64() / f.as_secs_f64()),
                "reported",
            );
        }
    }
}

/// Writes back and drops the page cache; false where that is not allowed (not root).
fn drop_page_cache() -> bool {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

fn section_memory(r: &mut Report, quick: bool) {
    let n = if quick { 10_000 } else { 100_000 };
    println!("\n== memory, {n} threads (JSONL)");
    let dir = fresh_dir("memory");
    forge_threads(&dir, n, 3);
    let before = rss_bytes();
    let server = open(&dir, StoreKind::Jsonl, Durability::Sync, Limits::default());
    let opened = rss_bytes();
    wait_warm(&server);
    let indexed = rss_bytes();
    let conn = server.connect().unwrap();
    init(&conn);
    // Touch every thread once (loaded, read, then unloaded as the loaded set stays bounded).
    for i in 0..n {
        let id = 10 + i as u64;
        round_trip(
            &conn,
            &request(
                id,
                "thread/read",
                &json!({"threadId": format!("t{i:07}"), "limit": 3}),
            ),
            id,
        );
    }
    let touched = rss_bytes();
    let s = server.stats_snapshot();
    let per_k = |b: u64| format!("{:.0} KiB", b as f64 / 1024.0 / (n as f64 / 1000.0));
    r.add(
        format!("index of {n} thread summaries, per 1k threads (RSS)"),
        per_k(indexed.saturating_sub(before)),
        "-".into(),
        None,
        "reported",
    );
    r.add(
        format!(
            "after touching all {n} ({} loaded, {} KiB tail cache), per idle thread",
            s.threads_loaded + s.store_loaded_threads,
            s.tail_cache_bytes / 1024
        ),
        format!("{:.0} B", touched.saturating_sub(before) as f64 / n as f64),
        "-".into(),
        None,
        "<= 2 KiB",
    );
    let _ = opened;
    server.shutdown();
}

/// Not a figure: a long loop of one request, for a profiler (`-- loop-list`, `-- loop-read`).
fn section_loop(method: &str) {
    let dir = fresh_dir("loop");
    forge_threads(&dir, 1000, 3);
    let server = open(&dir, StoreKind::Jsonl, Durability::Sync, Limits::default());
    wait_warm(&server);
    let conn = server.connect().unwrap();
    init(&conn);
    let params = if method == "thread/list" {
        json!({"limit": 100})
    } else {
        json!({"threadId": "t0000001", "limit": 10})
    };
    let t = Instant::now();
    for i in 0..200_000u64 {
        round_trip(&conn, &request(10 + i, method, &params), 10 + i);
    }
    println!("{method}: {:?} per round trip", t.elapsed() / 200_000);
    server.shutdown();
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let quick = args.iter().any(|a| a == "quick");
    let all = !args.iter().any(|a| {
        [
            "list", "read", "start", "turns", "many", "startup", "memory", "cold",
        ]
        .contains(&a.as_str())
    });
    let on = |s: &str| all || args.iter().any(|a| a == s);
    if args.iter().any(|a| a == "loop-list") {
        return section_loop("thread/list");
    }
    if args.iter().any(|a| a == "loop-read") {
        return section_loop("thread/read");
    }
    for (arg, d) in [
        ("loop-raw-ephemeral", Durability::Ephemeral),
        ("loop-raw-buffered", Durability::Buffered),
    ] {
        if args.iter().any(|a| a == arg) {
            println!("{arg}: {:.0}/s", one_turn_raw(d, 200_000));
            return;
        }
    }
    for (arg, d) in [
        ("loop-ephemeral", Durability::Ephemeral),
        ("loop-buffered", Durability::Buffered),
        ("loop-sync", Durability::Sync),
    ] {
        if args.iter().any(|a| a == arg) {
            let (rate, elapsed, waits) = one_turn(StoreKind::Jsonl, d, 200_000);
            println!("{arg}: {rate:.0}/s in {elapsed:?}, {waits} waits");
            return;
        }
    }
    let mut r = Report::default();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("engine bench: load average at start {}", load.trim());
    if on("memory") {
        section_memory(&mut r, quick);
    }
    if on("list") {
        section_list(&mut r, quick);
    }
    if on("read") {
        section_read(&mut r, quick);
    }
    if on("start") {
        section_start(&mut r, quick);
    }
    if on("turns") {
        section_turns(&mut r, quick);
    }
    if on("many") {
        section_many(&mut r, quick);
    }
    if on("startup") {
        section_startup(&mut r, quick);
    }
    if on("cold") {
        section_cold(&mut r, quick);
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("\nload average at end {}", load.trim());
    r.print();
    let _ = std::fs::remove_dir_all(bench_root());
}
