//! What an attacker (or an accident) does to a state directory, done to real files and real
//! SQLite rows: shared by the integrity tests and the tamper matrix. Forgeries recompute every
//! SHA-256 the plain chain has, as someone with write access but without the host's key would.
#![allow(dead_code)]

use cc_app_server::rollout::*;
use serde_json::{json, Value};
use std::fs;
use std::path::{Path, PathBuf};

pub const KEY: [u8; 32] = [0x5a; 32];

pub fn key() -> RolloutKey {
    RolloutKey::from_bytes(KEY)
}

pub fn kinds() -> [StoreKind; 2] {
    [StoreKind::Jsonl, StoreKind::Sqlite]
}

pub fn options(keyed: bool) -> StoreOptions {
    StoreOptions {
        key: keyed.then(key),
        seal_every: 8,
        ..StoreOptions::default()
    }
}

pub fn open(
    kind: StoreKind,
    dir: &Path,
    keyed: bool,
) -> Result<std::sync::Arc<dyn RolloutStore>, StoreError> {
    open_store(kind, dir, options(keyed))
}

pub fn accepting(kind: StoreKind, dir: &Path, keyed: bool) -> std::sync::Arc<dyn RolloutStore> {
    open_store(
        kind,
        dir,
        StoreOptions {
            accept_unanchored: true,
            ..options(keyed)
        },
    )
    .expect("open store")
}

pub fn delta(i: usize) -> NewEvent {
    NewEvent::new(
        json!({"type": "itemDelta", "turnId": "t1", "itemId": format!("i{i}"), "delta": {"type": "text", "text": format!("chunk {i}")}}),
    )
}

/// The approval a forger wants to flip: declined by the host.
pub fn declined() -> NewEvent {
    NewEvent::new(json!({
        "type": "approvalResolved", "turnId": "t1", "itemId": "tool-1",
        "nonce": "0123456789abcdef0123456789abcdef", "outcome": "declined",
        "decision": {"kind": "decline"}, "failure": null
    }))
}

/// Starts `id` and appends `n - 1` more events one commit each (so Sync anchors every one).
pub fn thread(store: &dyn RolloutStore, id: &str, n: usize) {
    store
        .start(ThreadStart {
            thread_id: id.into(),
            title: Some(format!("Thread {id}")),
            ..Default::default()
        })
        .expect("start");
    for i in 1..n {
        let ev = if i == n / 2 { declined() } else { delta(i) };
        store.append(id, vec![ev]).expect("append");
    }
}

pub fn read_all(store: &dyn RolloutStore, id: &str) -> Result<Vec<StoredEvent>, StoreError> {
    let mut out = Vec::new();
    loop {
        let page = store.read(id, out.len() as u64, MAX_READ_LIMIT)?;
        out.extend(page.events);
        if !page.has_more {
            return Ok(out);
        }
    }
}

/// Readable ids, and unreadable (id, reason).
pub type Listing = (Vec<String>, Vec<(String, String)>);

/// Every page of `list` (archived included).
pub fn list_all(store: &dyn RolloutStore) -> Result<Listing, StoreError> {
    let (mut ok, mut bad) = (Vec::new(), Vec::new());
    let mut cursor = None;
    loop {
        let p = store.list(&ListQuery {
            include_archived: true,
            cursor,
            limit: MAX_LIST_LIMIT,
        })?;
        ok.extend(p.threads.into_iter().map(|t| t.thread_id));
        bad.extend(p.unreadable);
        match p.next_cursor {
            Some(c) => cursor = Some(c),
            None => return Ok((ok, bad)),
        }
    }
}

pub fn log(dir: &Path, id: &str) -> PathBuf {
    layout::thread_log(dir, id)
}

pub fn anchor(dir: &Path, id: &str) -> PathBuf {
    layout::anchor(dir, id)
}

pub fn db(dir: &Path) -> rusqlite::Connection {
    rusqlite::Connection::open(dir.join(layout::SQLITE_FILE)).expect("open the database")
}

/// The events of a JSONL log, parsed without any check.
pub fn jsonl_events(dir: &Path, id: &str) -> Vec<StoredEvent> {
    fs::read_to_string(log(dir, id))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The events of a SQLite thread, parsed without any check.
pub fn sqlite_events(dir: &Path, id: &str) -> Vec<StoredEvent> {
    let c = db(dir);
    let mut st = c
        .prepare("SELECT seq, prev_hash, hash, time, trace_id, parent_id, idempotency_key, payload FROM events WHERE thread_id = ?1 ORDER BY seq")
        .unwrap();
    let rows = st
        .query_map([id], |r| {
            let payload: String = r.get(7)?;
            Ok(StoredEvent {
                seq: r.get::<_, i64>(0)? as u64,
                prev_hash: r.get(1)?,
                hash: r.get(2)?,
                time: r.get(3)?,
                trace_id: r.get(4)?,
                parent_id: r.get(5)?,
                idempotency_key: r.get(6)?,
                payload: serde_json::from_str(&payload).unwrap_or(Value::Null),
            })
        })
        .unwrap();
    rows.map(Result::unwrap).collect()
}

pub fn events(kind: StoreKind, dir: &Path, id: &str) -> Vec<StoredEvent> {
    match kind {
        StoreKind::Jsonl => jsonl_events(dir, id),
        StoreKind::Sqlite => sqlite_events(dir, id),
    }
}

/// Re-numbers and re-chains `events` from seq 1, recomputing every hash (what a forger without
/// the key can always do).
pub fn rechain(events: &mut [StoredEvent]) {
    let mut prev = ZERO_HASH.to_string();
    for (i, ev) in events.iter_mut().enumerate() {
        ev.seq = i as u64 + 1;
        ev.prev_hash = prev.clone();
        ev.hash = ev.compute_hash();
        prev = ev.hash.clone();
    }
}

/// Writes `events` as thread `id`'s whole history, replacing what was there, without touching
/// its anchor (JSONL) or its `threads` row (SQLite).
pub fn write_events(kind: StoreKind, dir: &Path, id: &str, events: &[StoredEvent]) {
    match kind {
        StoreKind::Jsonl => {
            let mut text = String::new();
            for ev in events {
                text.push_str(&serde_json::to_string(ev).unwrap());
                text.push('\n');
            }
            fs::write(log(dir, id), text).unwrap();
        }
        StoreKind::Sqlite => {
            let c = db(dir);
            c.execute("DELETE FROM events WHERE thread_id = ?1", [id])
                .unwrap();
            for ev in events {
                c.execute(
                    "INSERT INTO events (thread_id, seq, prev_hash, hash, time, trace_id, parent_id, idempotency_key, payload, turn_completed) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, NULL)",
                    rusqlite::params![id, ev.seq as i64, ev.prev_hash, ev.hash, ev.time, ev.trace_id, ev.parent_id, ev.idempotency_key, ev.payload.to_string()],
                )
                .unwrap();
            }
        }
    }
}

/// Points the head anchor at the last of `events` as a forger without the key would: an
/// anchor (JSONL slot / SQLite row) with every unkeyed field recomputed and no valid MAC.
pub fn forge_anchor(kind: StoreKind, dir: &Path, id: &str, events: &[StoredEvent]) {
    let last = events.last().expect("at least the header");
    match kind {
        StoreKind::Jsonl => {
            let bytes = fs::read(log(dir, id)).unwrap();
            let gen = fs::read(anchor(dir, id))
                .ok()
                .and_then(|b| {
                    b.chunks(ANCHOR_SLOT)
                        .filter_map(Anchor::decode)
                        .map(|a| a.gen)
                        .max()
                })
                .unwrap_or(0)
                + 1;
            let a = Anchor {
                seq: last.seq,
                hash: last.hash.clone(),
                offset: bytes.len() as u64,
                gen,
                archived: false,
                format: 1,
                compacted_through: 0,
                last_compaction_seq: None,
                thread: None,
                key_id: None,
                mac: None,
            };
            let mut file = fs::read(anchor(dir, id)).unwrap_or_default();
            file.resize(2 * ANCHOR_SLOT, 0);
            let at = (gen % 2) as usize * ANCHOR_SLOT;
            file[at..at + ANCHOR_SLOT].copy_from_slice(&a.encode(id, None));
            fs::write(anchor(dir, id), file).unwrap();
        }
        StoreKind::Sqlite => {
            db(dir)
                .execute(
                    "UPDATE threads SET head_seq = ?2, head_hash = ?3, mac = NULL, key_id = NULL WHERE thread_id = ?1",
                    rusqlite::params![id, last.seq as i64, last.hash],
                )
                .unwrap();
        }
    }
}

/// Like `forge_anchor`, but keeping the old MAC fields (a forger who leaves them in place).
pub fn forge_anchor_keep_mac(kind: StoreKind, dir: &Path, id: &str, events: &[StoredEvent]) {
    let last = events.last().expect("at least the header");
    match kind {
        StoreKind::Jsonl => {
            let file = fs::read(anchor(dir, id)).unwrap();
            let newest = file
                .chunks(ANCHOR_SLOT)
                .filter_map(Anchor::decode)
                .max_by_key(|a| a.gen)
                .unwrap();
            let bytes = fs::read(log(dir, id)).unwrap();
            // Rewrite the text by hand with the old kid/mac and a fresh check field.
            let body = format!(
                "ccanchor1 seq={} hash={} offset={} gen={} archived=0 format=1 compactedThrough=0 lastCompaction=- thread={id} kid={} mac={}",
                last.seq,
                last.hash,
                bytes.len(),
                newest.gen + 1,
                newest.key_id.clone().unwrap_or_default(),
                newest.mac.clone().unwrap_or_default()
            );
            let check = &cc_agent_protocol::sha256_hex(body.as_bytes())[..16];
            let mut slot = format!("{body} check={check}").into_bytes();
            slot.resize(ANCHOR_SLOT - 1, b' ');
            slot.push(b'\n');
            let mut file = file;
            file.resize(2 * ANCHOR_SLOT, 0);
            let at = ((newest.gen + 1) % 2) as usize * ANCHOR_SLOT;
            file[at..at + ANCHOR_SLOT].copy_from_slice(&slot);
            fs::write(anchor(dir, id), file).unwrap();
        }
        StoreKind::Sqlite => {
            db(dir)
                .execute(
                    "UPDATE threads SET head_seq = ?2, head_hash = ?3 WHERE thread_id = ?1",
                    rusqlite::params![id, last.seq as i64, last.hash],
                )
                .unwrap();
        }
    }
}

/// Removes the thread's last event the way each store allows.
pub fn cut_last(kind: StoreKind, dir: &Path, id: &str) {
    match kind {
        StoreKind::Jsonl => {
            let text = fs::read_to_string(log(dir, id)).unwrap();
            let lines: Vec<&str> = text.lines().collect();
            fs::write(log(dir, id), lines[..lines.len() - 1].join("\n") + "\n").unwrap();
        }
        StoreKind::Sqlite => {
            db(dir)
                .execute(
                    "DELETE FROM events WHERE thread_id = ?1 AND seq = (SELECT max(seq) FROM events WHERE thread_id = ?1)",
                    [id],
                )
                .unwrap();
        }
    }
}

/// Removes the head anchor (JSONL file / SQLite `threads` row).
pub fn remove_anchor(kind: StoreKind, dir: &Path, id: &str) {
    match kind {
        StoreKind::Jsonl => fs::remove_file(anchor(dir, id)).unwrap(),
        StoreKind::Sqlite => {
            db(dir)
                .execute("DELETE FROM threads WHERE thread_id = ?1", [id])
                .unwrap();
        }
    }
}

/// Copies thread `from`'s whole history (log and anchor, or rows) under the id `to`.
pub fn copy_thread(kind: StoreKind, dir: &Path, from: &str, to: &str) {
    match kind {
        StoreKind::Jsonl => {
            fs::copy(log(dir, from), log(dir, to)).unwrap();
            fs::copy(anchor(dir, from), anchor(dir, to)).unwrap();
        }
        StoreKind::Sqlite => {
            let c = db(dir);
            c.execute(
                "INSERT INTO events SELECT ?2, seq, prev_hash, hash, time, trace_id, parent_id, idempotency_key, payload, turn_completed FROM events WHERE thread_id = ?1",
                [from, to],
            )
            .unwrap();
            c.execute(
                "INSERT INTO threads SELECT ?2, head_seq, head_hash, archived, format_version, compacted_through, last_compaction_seq, mac, key_id FROM threads WHERE thread_id = ?1",
                [from, to],
            )
            .unwrap();
        }
    }
}

/// Swaps two threads' whole histories (logs and anchors, or rows).
pub fn swap_threads(kind: StoreKind, dir: &Path, a: &str, b: &str) {
    match kind {
        StoreKind::Jsonl => {
            for path in [log as fn(&Path, &str) -> PathBuf, anchor] {
                let tmp = dir.join("swap.tmp");
                fs::rename(path(dir, a), &tmp).unwrap();
                fs::rename(path(dir, b), path(dir, a)).unwrap();
                fs::rename(&tmp, path(dir, b)).unwrap();
            }
        }
        StoreKind::Sqlite => {
            let c = db(dir);
            for table in ["events", "threads"] {
                for (from, to) in [(a, "swap-tmp"), (b, a), ("swap-tmp", b)] {
                    c.execute(
                        &format!("UPDATE {table} SET thread_id = ?2 WHERE thread_id = ?1"),
                        [from, to],
                    )
                    .unwrap();
                }
            }
        }
    }
}

/// Runs scripts/verify_rollout.py (the independent verifier) with `args`: (exit code, stdout +
/// stderr). A traceback is a failure of the verifier itself.
pub fn verify_rollout_py(args: &[&str]) -> (i32, String) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/verify_rollout.py");
    let out = std::process::Command::new("python3")
        .arg(script)
        .args(args)
        .output()
        .expect("python3 runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!text.contains("Traceback"), "the verifier crashed: {text}");
    (out.status.code().unwrap_or(-1), text)
}
