//! Store open and recovery on arbitrary bytes: the input becomes a JSONL thread log (plus,
//! optionally, its head anchor) or a SQLite database file in a fresh private state dir, which is
//! then opened as a store, listed, read, verified, appended to, reopened, and finally opened by
//! a whole `AppServer` (restart recovery). It must never panic or hang, and what it accepts must
//! hold together:
//! - a thread that verifies reads back as an unbroken chain (seq 1..n, prevHash links, hashes
//!   recomputed here, the zero hash first);
//! - an append keeps a verifying thread verifying — across a reopen and a server's recovery
//!   too — and never hides damage already there (the first bad seq stays where it was).
//!
//! Input layout (what scripts/fuzz.sh seeds from real state dirs): byte 0 = flags (bit 0:
//! SQLite, bit 1: write an anchor, bit 2: buffered durability), bytes 1-2 = anchor length (big
//! endian), then the anchor bytes, then the log (or database) bytes.
#![no_main]

use cc_app_server::engine::AppServer;
use cc_app_server::rollout::{
    layout, open_store, Durability, ListQuery, RolloutStore, StoreError, StoreKind, StoreOptions,
    ZERO_HASH,
};
use cc_app_server_fuzz::engine::{fuzz_config, temp_state_root};
use libfuzzer_sys::fuzz_target;
use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

const THREAD: &str = "fz";

fn write_private(path: &Path, bytes: &[u8]) {
    if let Some(parent) = path.parent() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .unwrap();
    }
    let mut f = fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .unwrap();
    f.write_all(bytes).unwrap();
}

/// Every thread's verify verdict and head after listing, reading and verifying all of them.
fn survey(store: &dyn RolloutStore) -> BTreeMap<String, (bool, u64, Option<u64>)> {
    let mut out = BTreeMap::new();
    let Ok(page) = store.list(&ListQuery {
        include_archived: true,
        cursor: None,
        limit: 1000,
    }) else {
        return out;
    };
    let mut ids: Vec<String> = page.threads.iter().map(|s| s.thread_id.clone()).collect();
    ids.extend(page.unreadable.iter().map(|(id, _)| id.clone()));
    if !ids.iter().any(|i| i == THREAD) {
        ids.push(THREAD.into());
    }
    for id in ids {
        let _ = store.summary(&id);
        let Ok(report) = store.verify(&id) else {
            continue;
        };
        if report.ok() {
            check_chain(store, &id, report.head_seq, &report.head_hash);
        }
        out.insert(id, (report.ok(), report.head_seq, report.first_bad_seq));
    }
    out
}

/// Reads the whole thread and checks the chain independently of the store's own verifier.
fn check_chain(store: &dyn RolloutStore, id: &str, head_seq: u64, head_hash: &str) {
    let mut prev = ZERO_HASH.to_string();
    let mut seq = 0;
    loop {
        let page = store
            .read(id, seq, 1000)
            .unwrap_or_else(|e| panic!("{id} verifies but cannot be read after seq {seq}: {e}"));
        for e in &page.events {
            seq += 1;
            assert_eq!(e.seq, seq, "{id}: seq gap in a verified thread");
            assert_eq!(
                e.prev_hash, prev,
                "{id}#{seq}: prevHash does not link in a verified thread"
            );
            assert_eq!(
                e.compute_hash(),
                e.hash,
                "{id}#{seq}: hash does not match in a verified thread"
            );
            prev.clone_from(&e.hash);
        }
        if !page.has_more {
            break;
        }
        assert!(!page.events.is_empty(), "{id}: hasMore with an empty page");
    }
    assert_eq!(
        seq, head_seq,
        "{id}: verify's head is not the last event read"
    );
    if seq > 0 {
        assert_eq!(
            prev, head_hash,
            "{id}: verify's head hash is not the last event's"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let flags = data[0];
    let anchor_len = u16::from_be_bytes([data[1], data[2]]) as usize;
    let rest = &data[3..];
    let (anchor, body) = rest.split_at(anchor_len.min(rest.len()));
    let kind = if flags & 1 == 1 {
        StoreKind::Sqlite
    } else {
        StoreKind::Jsonl
    };
    let durability = if flags & 4 == 4 {
        Durability::Buffered
    } else {
        Durability::Sync
    };
    let root = temp_state_root();
    let dir = root.path().join("state");
    fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
    match kind {
        StoreKind::Jsonl => {
            write_private(&layout::thread_log(&dir, THREAD), body);
            if flags & 2 == 2 {
                write_private(&layout::anchor(&dir, THREAD), anchor);
            }
        }
        StoreKind::Sqlite => write_private(&dir.join(layout::SQLITE_FILE), body),
    }
    let options = StoreOptions {
        durability,
        ..StoreOptions::default()
    };
    let before = {
        let Ok(store) = open_store(kind, &dir, options.clone()) else {
            return;
        };
        let before = survey(&*store);
        for (id, (ok, head, bad)) in &before {
            if let Ok(ev) = store.checkpoint(id, "fuzz") {
                let report = store.verify(id).expect("verify after append");
                if *ok {
                    assert_eq!(
                        ev.seq,
                        head + 1,
                        "{id}: the append did not land after the head"
                    );
                    assert!(report.ok(), "{id}: the append broke the chain: {report:?}");
                } else {
                    // Opening reads only the tail past the anchor (docs/rollout-format.md), so
                    // damage further back may not stop an append; it must still be reported
                    // at the same seq afterwards, never covered up.
                    assert_eq!(
                        report.first_bad_seq, *bad,
                        "{id}: an append moved the reported damage: {report:?}"
                    );
                }
            }
        }
        let _ = store.close();
        before
    };
    // Reopen: what verified still verifies — or, for a fuzzed SQLite image, the whole database is
    // refused as corrupt: SQLite reads pages lazily, so damage in pages the first session never
    // read (its summary index is built in the background) is found by a later open, which fails
    // closed rather than serving part of it. Anything else is a finding.
    let after = match open_store(kind, &dir, options) {
        Ok(store) => {
            let after = survey(&*store);
            drop(store);
            after
        }
        Err(StoreError::Sqlite(m))
            if kind == StoreKind::Sqlite
                && (m.contains("malformed") || m.contains("not a database")) =>
        {
            return;
        }
        Err(e) => panic!("a store that opened once reopens: {e:?}"),
    };
    for (id, (ok, _, _)) in &before {
        if *ok {
            assert!(
                after.get(id).is_some_and(|a| a.0),
                "{id} verified, then not after a reopen: {after:?}"
            );
        }
    }
    // Restart recovery over the same directory.
    let server = AppServer::open(fuzz_config(&dir, kind, durability));
    if let Ok(server) = server {
        for (id, (ok, _, _)) in &after {
            if *ok {
                let report = server.store().verify(id).expect("verify after recovery");
                assert!(report.ok(), "{id}: recovery broke the chain: {report:?}");
            }
        }
        server.shutdown();
    }
});
