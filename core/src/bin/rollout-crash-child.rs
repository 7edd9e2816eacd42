//! Crash-test child: appends to one thread under load and prints every acknowledged seq, so a
//! parent can SIGKILL it at a random moment and check that nothing acknowledged was lost.
//!
//! Usage: `rollout-crash-child <jsonl|sqlite> <state-dir> <thread-id> <seed> [writers] [keyed]`
//! (`keyed`: keyed mode under the fixed test key `CRASH_TEST_KEY`).

use cc_app_server::rollout::{
    open_store, NewEvent, RolloutKey, StoreError, StoreKind, StoreOptions, ThreadStart,
};

/// The key keyed crash runs use (tests only; a real key comes from the host).
const CRASH_TEST_KEY: [u8; 32] = [0x42; 32];
use serde_json::json;
use std::io::Write;
use std::sync::{Arc, Mutex};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 5 {
        eprintln!(
            "usage: rollout-crash-child <jsonl|sqlite> <state-dir> <thread-id> <seed> [writers] [keyed]"
        );
        std::process::exit(2);
    }
    let kind = if args[1] == "sqlite" {
        StoreKind::Sqlite
    } else {
        StoreKind::Jsonl
    };
    let keyed = args.get(6).is_some_and(|a| a == "keyed");
    let store = open_store(
        kind,
        std::path::Path::new(&args[2]),
        StoreOptions {
            key: keyed.then(|| RolloutKey::from_bytes(CRASH_TEST_KEY)),
            // Small, so kills land between seals as well as on them.
            seal_every: if keyed { 16 } else { 256 },
            ..StoreOptions::default()
        },
    )
    .expect("open store");
    let id = args[3].clone();
    let seed: u64 = args[4].parse().expect("seed");
    let writers: usize = args.get(5).map_or(3, |w| w.parse().expect("writers"));
    match store.start(ThreadStart {
        thread_id: id.clone(),
        ..Default::default()
    }) {
        Ok(_) | Err(StoreError::AlreadyExists(_)) => {}
        Err(e) => panic!("start: {e}"),
    }
    let out = Arc::new(Mutex::new(std::io::stdout()));
    writeln!(out.lock().unwrap(), "ready").unwrap();
    let handles: Vec<_> = (0..writers)
        .map(|w| {
            let (store, id, out) = (store.clone(), id.clone(), out.clone());
            std::thread::spawn(move || {
                // xorshift: deterministic per seed, no dependency.
                let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (w as u64 + 1);
                let mut next = move || {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x
                };
                loop {
                    let n = 1 + (next() % 40) as usize;
                    // Now and then a multi-megabyte batch: the kernel copies a write page by page
                    // and stops at a pending SIGKILL, so only long writes can really be torn.
                    let big = next() % 4 == 0;
                    let events: Vec<NewEvent> = (0..n)
                        .map(|i| {
                            // Varied sizes so batches span several pages and a kill can tear one.
                            let pad = "x".repeat((next() % if big { 100_000 } else { 600 }) as usize);
                            NewEvent::new(json!({"type": "itemDelta", "turnId": "t", "itemId": format!("w{w}i{i}"), "delta": {"type": "text", "text": pad}}))
                        })
                        .collect();
                    let stored = store.append(&id, events).expect("append");
                    let mut o = out.lock().unwrap();
                    for ev in stored {
                        writeln!(o, "{} {}", ev.seq, ev.hash).unwrap();
                    }
                    o.flush().unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}
