//! Rollout store benchmarks: append throughput per durability mode and batch size against raw
//! write/fdatasync on the same disk, resume cost against thread length, and list over 100k
//! threads. Results and commands: docs/bench/rollout.md.

use cc_app_server::rollout::*;
use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use serde_json::json;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

fn delta(i: usize) -> NewEvent {
    NewEvent::new(
        json!({"type": "itemDelta", "turnId": "turn-1", "itemId": "item-1", "delta": {"type": "text", "text": format!("token {i} of a streamed answer")}}),
    )
}

/// Benchmarks live next to the target dir, on the same disk as a real state dir.
fn bench_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("rollout-bench")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap()
}

/// `ROLLOUT_BENCH_GROUPS=integrity,append` runs only those groups' setup and benchmarks (the
/// resume and list groups build 1M-event and 100k-thread stores first, which a criterion name
/// filter alone does not skip). Unset: every group.
fn wanted(group: &str) -> bool {
    std::env::var("ROLLOUT_BENCH_GROUPS")
        .map(|v| v.split(',').any(|g| g.trim() == group))
        .unwrap_or(true)
}

fn kinds() -> [(StoreKind, &'static str); 2] {
    [(StoreKind::Jsonl, "jsonl"), (StoreKind::Sqlite, "sqlite")]
}

fn append(c: &mut Criterion) {
    if !wanted("append") {
        return;
    }
    let mut g = c.benchmark_group("append");
    g.warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2))
        .sample_size(10);
    // The references: what the disk does with no store in the way.
    let line = serde_json::to_vec(&json!({"seq": 1, "prevHash": ZERO_HASH, "hash": ZERO_HASH, "time": "2026-01-01T00:00:00.000Z", "traceId": null, "parentId": null, "idempotencyKey": null, "payload": delta(1).payload})).unwrap();
    for batch in [1usize, 16, 256] {
        let tmp = bench_dir();
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(tmp.path().join("raw.log"))
            .unwrap();
        g.throughput(Throughput::Elements(batch as u64));
        g.bench_function(BenchmarkId::new("raw-write+fdatasync", batch), |b| {
            b.iter(|| {
                let mut buf = Vec::with_capacity(batch * (line.len() + 1));
                for _ in 0..batch {
                    buf.extend_from_slice(&line);
                    buf.push(b'\n');
                }
                f.write_all(&buf).unwrap();
                f.sync_data().unwrap();
            })
        });
    }
    for (kind, name) in kinds() {
        for (mode, mname) in [
            (Durability::Sync, "sync"),
            (Durability::Buffered, "buffered"),
            (Durability::Ephemeral, "ephemeral"),
        ] {
            for batch in [1usize, 16, 256] {
                let tmp = bench_dir();
                let store = open_store(
                    kind,
                    &tmp.path().join("s"),
                    StoreOptions {
                        durability: mode,
                        ..Default::default()
                    },
                )
                .unwrap();
                store
                    .start(ThreadStart {
                        thread_id: "b".into(),
                        ..Default::default()
                    })
                    .unwrap();
                g.throughput(Throughput::Elements(batch as u64));
                g.bench_function(BenchmarkId::new(format!("{name}-{mname}"), batch), |b| {
                    b.iter_batched(
                        || (0..batch).map(delta).collect::<Vec<_>>(),
                        |evs| store.append("b", evs).unwrap(),
                        BatchSize::SmallInput,
                    )
                });
            }
        }
        // Group commit: 8 callers appending one event each at the same time share fsyncs.
        let tmp = bench_dir();
        let store = open_store(kind, &tmp.path().join("s"), StoreOptions::default()).unwrap();
        store
            .start(ThreadStart {
                thread_id: "b".into(),
                ..Default::default()
            })
            .unwrap();
        g.throughput(Throughput::Elements(8 * 16));
        g.bench_function(BenchmarkId::new(format!("{name}-sync-8-callers"), 1), |b| {
            b.iter(|| {
                std::thread::scope(|s| {
                    for _ in 0..8 {
                        let store = store.clone();
                        s.spawn(move || {
                            for i in 0..16 {
                                store.append("b", vec![delta(i)]).unwrap();
                            }
                        });
                    }
                })
            })
        });
    }
    g.finish();
}

fn build_thread(kind: StoreKind, dir: &Path, n: usize) {
    let store = open_store(
        kind,
        dir,
        StoreOptions {
            durability: Durability::Buffered,
            ..Default::default()
        },
    )
    .unwrap();
    store
        .start(ThreadStart {
            thread_id: "long".into(),
            ..Default::default()
        })
        .unwrap();
    let mut left = n - 1;
    while left > 0 {
        let k = left.min(MAX_BATCH_EVENTS);
        store.append("long", (0..k).map(delta).collect()).unwrap();
        left -= k;
    }
    store.close().unwrap();
}

fn resume(c: &mut Criterion) {
    if !wanted("resume") {
        return;
    }
    let mut g = c.benchmark_group("resume");
    g.warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2))
        .sample_size(10);
    for (kind, name) in kinds() {
        let sizes: &[usize] = if kind == StoreKind::Jsonl {
            &[1_000, 100_000, 1_000_000]
        } else {
            &[1_000, 100_000]
        };
        for &n in sizes {
            let tmp = bench_dir();
            let dir = tmp.path().join("s");
            build_thread(kind, &dir, n);
            // Open the store and bring the thread's head back: what a resumer pays before the
            // first new append.
            g.bench_function(BenchmarkId::new(format!("{name}-open+summary"), n), |b| {
                b.iter(|| {
                    let s = open_store(kind, &dir, StoreOptions::default()).unwrap();
                    assert_eq!(s.summary("long").unwrap().last_seq, n as u64);
                })
            });
            g.bench_function(BenchmarkId::new(format!("{name}-open+append1"), n), |b| {
                b.iter(|| {
                    let s = open_store(
                        kind,
                        &dir,
                        StoreOptions {
                            durability: Durability::Buffered,
                            ..Default::default()
                        },
                    )
                    .unwrap();
                    s.append("long", vec![delta(0)]).unwrap();
                })
            });
        }
    }
    g.finish();
}

/// 100k JSONL threads written directly in the documented format (creating them through the
/// store would spend minutes in per-file fsyncs that are not what is measured here).
fn forge_jsonl_threads(dir: &Path, n: usize) {
    drop(open_jsonl(dir, StoreOptions::default()).unwrap());
    for i in 0..n {
        let id = format!("thread{i:06}");
        let payload = json!({"type": "threadStarted", "formatVersion": 1, "threadId": id, "title": format!("Thread {i}"), "metadata": {}, "forkedFrom": null});
        let time = "2026-01-01T00:00:00.000Z";
        let hash = event_hash(1, ZERO_HASH, time, None, None, None, &payload);
        let ev = StoredEvent {
            seq: 1,
            prev_hash: ZERO_HASH.into(),
            hash: hash.clone(),
            time: time.into(),
            trace_id: None,
            parent_id: None,
            idempotency_key: None,
            payload,
        };
        let mut line = serde_json::to_vec(&ev).unwrap();
        line.push(b'\n');
        std::fs::write(dir.join(format!("threads/{id}.jsonl")), &line).unwrap();
        let a = Anchor {
            seq: 1,
            hash,
            offset: line.len() as u64,
            gen: 1,
            archived: i % 10 == 0,
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
}

fn list(c: &mut Criterion) {
    if !wanted("list") {
        return;
    }
    let mut g = c.benchmark_group("list-100k");
    g.warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2))
        .sample_size(10);
    let n = 100_000;
    for (kind, name) in kinds() {
        let tmp = bench_dir();
        let dir = tmp.path().join("s");
        if kind == StoreKind::Jsonl {
            forge_jsonl_threads(&dir, n);
        } else {
            let s = open_store(
                kind,
                &dir,
                StoreOptions {
                    durability: Durability::Buffered,
                    ..Default::default()
                },
            )
            .unwrap();
            for i in 0..n {
                let id = format!("thread{i:06}");
                s.start(ThreadStart {
                    thread_id: id.clone(),
                    title: Some(format!("Thread {i}")),
                    ..Default::default()
                })
                .unwrap();
                if i % 10 == 0 {
                    s.set_archived(&id, true).unwrap();
                }
            }
            s.close().unwrap();
        }
        g.bench_function(
            BenchmarkId::new(format!("{name}-cold-open+first-page"), 100),
            |b| {
                b.iter(|| {
                    let s = open_store(kind, &dir, StoreOptions::default()).unwrap();
                    assert_eq!(
                        s.list(&ListQuery {
                            limit: 100,
                            ..Default::default()
                        })
                        .unwrap()
                        .threads
                        .len(),
                        100
                    );
                })
            },
        );
        let s = open_store(kind, &dir, StoreOptions::default()).unwrap();
        let mut cursor: Option<String> = None;
        g.bench_function(BenchmarkId::new(format!("{name}-next-page"), 100), |b| {
            b.iter(|| {
                let p = s
                    .list(&ListQuery {
                        include_archived: false,
                        cursor: cursor.clone(),
                        limit: 100,
                    })
                    .unwrap();
                cursor = p.next_cursor;
            })
        });
        g.bench_function(
            BenchmarkId::new(format!("{name}-warm-first-page"), 100),
            |b| {
                b.iter(|| {
                    s.list(&ListQuery {
                        limit: 100,
                        ..Default::default()
                    })
                    .unwrap()
                })
            },
        );
    }
    g.finish();
}

/// Issue 11's costs, key off and on side by side in one run: thread start, a Sync append of one
/// event, open + summary of a 1,000-event thread; and the schema check every event read from
/// disk now passes, against the parse + hash it already paid.
fn integrity(c: &mut Criterion) {
    if !wanted("integrity") {
        return;
    }
    let mut g = c.benchmark_group("integrity");
    g.warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2))
        .sample_size(10);
    // The disk's own cost in the same run: Sync appends are fdatasync-bound, so the rest is
    // read as multiples of this.
    {
        let tmp = bench_dir();
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(tmp.path().join("raw.log"))
            .unwrap();
        g.bench_function("raw-write+fdatasync", |b| {
            b.iter(|| {
                f.write_all(&[b'x'; 300]).unwrap();
                f.sync_data().unwrap();
            })
        });
    }
    let options = |keyed: bool, durability: Durability| StoreOptions {
        durability,
        key: keyed.then(|| RolloutKey::from_bytes([0x5a; 32])),
        ..Default::default()
    };
    for (kind, name) in kinds() {
        for keyed in [false, true] {
            let label = format!("{name}-{}", if keyed { "keyed" } else { "unkeyed" });
            let tmp = bench_dir();
            let store = open_store(
                kind,
                &tmp.path().join("s"),
                options(keyed, Durability::Sync),
            )
            .unwrap();
            let mut n = 0u64;
            g.bench_function(BenchmarkId::new("start", &label), |b| {
                b.iter(|| {
                    n += 1;
                    store
                        .start(ThreadStart {
                            thread_id: format!("t{n}"),
                            ..Default::default()
                        })
                        .unwrap()
                })
            });
            store
                .start(ThreadStart {
                    thread_id: "b".into(),
                    ..Default::default()
                })
                .unwrap();
            g.bench_function(BenchmarkId::new("append-sync-1", &label), |b| {
                b.iter_batched(
                    || vec![delta(1)],
                    |evs| store.append("b", evs).unwrap(),
                    BatchSize::SmallInput,
                )
            });
            drop(store);
            let dir = tmp.path().join("long");
            {
                let s = open_store(kind, &dir, options(keyed, Durability::Buffered)).unwrap();
                s.start(ThreadStart {
                    thread_id: "long".into(),
                    ..Default::default()
                })
                .unwrap();
                s.append("long", (1..1000).map(delta).collect()).unwrap();
                s.close().unwrap();
            }
            g.bench_function(BenchmarkId::new("open+summary-1k", &label), |b| {
                b.iter(|| {
                    let s = open_store(kind, &dir, options(keyed, Durability::Sync)).unwrap();
                    s.summary("long").unwrap().last_seq
                })
            });
        }
    }
    // Per event: what a read already paid (parse + JCS + SHA-256) and the schema check on top.
    let payload = delta(7).payload;
    let time = "2026-01-01T00:00:00.000Z";
    let ev = StoredEvent {
        seq: 7,
        prev_hash: ZERO_HASH.into(),
        hash: event_hash(7, ZERO_HASH, time, None, None, None, &payload),
        time: time.into(),
        trace_id: None,
        parent_id: None,
        idempotency_key: None,
        payload,
    };
    let line = serde_json::to_vec(&ev).unwrap();
    g.throughput(Throughput::Elements(1));
    g.bench_function("event-check/parse+hash", |b| {
        b.iter(|| {
            let e: StoredEvent = serde_json::from_slice(&line).unwrap();
            assert_eq!(e.compute_hash(), e.hash);
        })
    });
    g.bench_function("event-check/parse+hash+schema", |b| {
        b.iter(|| {
            let e: StoredEvent = serde_json::from_slice(&line).unwrap();
            assert_eq!(e.compute_hash(), e.hash);
            validate_stored_event(&e).unwrap();
        })
    });
    g.bench_function("event-check/schema-only", |b| {
        b.iter(|| validate_stored_event(&ev).unwrap())
    });
    g.finish();
}

criterion_group!(benches, append, resume, list, integrity);
criterion_main!(benches);
