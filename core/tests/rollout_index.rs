//! The store's in-memory index and caches (issue 14), on both stores: the summary index stays
//! exactly what the disk says after every kind of mutation and after a reopen; it is rebuilt
//! from the directory at every open (so changes made while no store had it open show up, and
//! nothing stale is trusted); the loaded-slot bound holds at its edge; the tail cache serves
//! recent reads and the backward reader checks the chain it walks; the lookups the engine uses
//! instead of replaying history (header, idempotency keys) answer from what the log records.

mod rollout_util;

use cc_app_server::rollout::*;
use rollout_util::*;
use serde_json::json;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

fn state(tmp: &tempfile::TempDir) -> std::path::PathBuf {
    tmp.path().join("state")
}

fn opened(kind: StoreKind, dir: &Path, max_loaded: usize) -> Arc<dyn RolloutStore> {
    open_store(
        kind,
        dir,
        StoreOptions {
            max_loaded_threads: max_loaded,
            ..StoreOptions::default()
        },
    )
    .expect("open store")
}

/// Every summary `list` gives (archived included), in order.
fn listed(store: &dyn RolloutStore) -> Vec<ThreadSummary> {
    let mut out = Vec::new();
    let mut cursor = None;
    loop {
        let p = store
            .list(&ListQuery {
                include_archived: true,
                cursor,
                limit: 3,
            })
            .unwrap();
        assert!(p.unreadable.is_empty(), "{:?}", p.unreadable);
        out.extend(p.threads);
        match p.next_cursor {
            Some(c) => cursor = Some(c),
            None => return out,
        }
    }
}

/// What the log itself says: the last event's seq and hash, and the derived flags, by a full
/// read (not through the index).
fn from_log(store: &dyn RolloutStore, id: &str) -> (u64, String, bool, Option<u64>, u64) {
    let events = read_all(store, id).unwrap();
    let last = events.last().unwrap();
    let mut archived = false;
    let (mut lcs, mut through) = (None, 0);
    for e in &events {
        match e.kind() {
            "threadArchived" => archived = e.payload["archived"].as_bool().unwrap(),
            "compacted" => {
                lcs = Some(e.seq);
                through = e.payload["toSeq"].as_u64().unwrap();
            }
            _ => {}
        }
    }
    (last.seq, last.hash.clone(), archived, lcs, through)
}

fn assert_index_matches_logs(store: &dyn RolloutStore, step: &str) {
    for s in listed(store) {
        assert_eq!(
            (
                s.last_seq,
                s.head_hash.clone(),
                s.archived,
                s.last_compaction_seq,
                s.compacted_through
            ),
            from_log(store, &s.thread_id),
            "{step}: {}",
            s.thread_id
        );
        assert_eq!(store.summary(&s.thread_id).unwrap(), s, "{step}");
    }
}

fn index_follows_every_mutation_and_a_reopen(kind: StoreKind) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = state(&tmp);
    let store = opened(kind, &dir, 1024);
    let step = |store: &dyn RolloutStore, name: &str| assert_index_matches_logs(store, name);
    thread(&*store, "b", 4);
    step(&*store, "start + appends");
    store
        .start_recorded(
            ThreadStart {
                thread_id: "a".into(),
                title: Some("A".into()),
                metadata: json!({"k": "v"}).as_object().unwrap().clone(),
                forked_from: None,
            },
            HeaderExtra {
                agent_options: Some(json!({"model": "m"})),
                idempotency_key: Some("key-a".into()),
                ..Default::default()
            },
        )
        .unwrap();
    step(&*store, "start with a key");
    store.checkpoint("a", "cp").unwrap();
    step(&*store, "checkpoint");
    store.compact("b", "summary", 3).unwrap();
    step(&*store, "compact");
    store.fork("b", Some(4), "c", Some("C".into())).unwrap();
    step(&*store, "fork");
    store.set_archived("c", true).unwrap();
    step(&*store, "archive");
    store.set_archived("c", false).unwrap();
    step(&*store, "unarchive");
    store.set_archived("a", true).unwrap();
    let batch = store.append_batch(vec![
        (
            "b".into(),
            vec![
                CheckedEvent::new(delta(90)).unwrap(),
                CheckedEvent::new(delta(91)).unwrap(),
            ],
        ),
        ("c".into(), vec![CheckedEvent::new(delta(92)).unwrap()]),
        (
            "missing".into(),
            vec![CheckedEvent::new(delta(93)).unwrap()],
        ),
    ]);
    assert!(
        matches!(batch[2], Err(StoreError::NotFound(_))),
        "{batch:?}"
    );
    let b = batch[0].as_ref().unwrap();
    assert_eq!(b.len(), 2);
    // Each appended event comes back as the exact line the store keeps.
    for e in b {
        let parsed: StoredEvent = serde_json::from_str(&e.line).unwrap();
        assert_eq!((parsed.seq, parsed.time.clone()), (e.seq, e.time.clone()));
        assert_eq!(parsed.hash, parsed.compute_hash());
        assert!(
            e.payload_json().starts_with("{\"type\":\"itemDelta\","),
            "{}",
            e.payload_json()
        );
    }
    step(&*store, "append_batch");
    let before = listed(&*store);
    assert_eq!(
        before
            .iter()
            .map(|s| s.thread_id.as_str())
            .collect::<Vec<_>>(),
        ["a", "b", "c"]
    );
    // Hidden unless asked for.
    let visible = store.list(&ListQuery::default()).unwrap();
    assert_eq!(visible.threads.len(), 2);
    store.close().unwrap();
    drop(store);
    let store = opened(kind, &dir, 1024);
    assert_eq!(listed(&*store), before, "after a reopen");
    step(&*store, "reopened");
    assert_eq!(
        store.thread_by_start_key("key-a").unwrap().as_deref(),
        Some("a")
    );
    assert_eq!(store.thread_by_start_key("nobody's").unwrap(), None);
}

/// The index is the directory's, read at every open: what changed while no store had the
/// directory (a thread added, one removed, one damaged) is what the next open lists.
fn the_index_is_rebuilt_from_the_directory_at_open(kind: StoreKind) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = state(&tmp);
    {
        let store = opened(kind, &dir, 1024);
        for id in ["keep", "gone"] {
            thread(&*store, id, 3);
        }
        thread(&*store, "broken", 4); // seq 2 is a delta ("chunk 1")
        store.close().unwrap();
    }
    {
        // Another session adds a thread and appends to one.
        let store = opened(kind, &dir, 1024);
        thread(&*store, "added", 2);
        store.append("keep", vec![delta(7)]).unwrap();
        store.close().unwrap();
    }
    // Behind every store's back: one thread removed, one damaged in the middle of its log.
    match kind {
        StoreKind::Jsonl => {
            std::fs::remove_file(log(&dir, "gone")).unwrap();
            std::fs::remove_file(anchor(&dir, "gone")).unwrap();
            let mut lines: Vec<String> = std::fs::read_to_string(log(&dir, "broken"))
                .unwrap()
                .lines()
                .map(str::to_string)
                .collect();
            lines[1] = lines[1].replace("chunk", "chunK");
            std::fs::write(log(&dir, "broken"), lines.join("\n") + "\n").unwrap();
            // Opening reads the anchor and the anchored line only; the corruption is in the
            // middle, found when the history is read.
        }
        StoreKind::Sqlite => {
            let db = db(&dir);
            db.execute("DELETE FROM events WHERE thread_id = 'gone'", [])
                .unwrap();
            db.execute("DELETE FROM threads WHERE thread_id = 'gone'", [])
                .unwrap();
            db.execute(
                "UPDATE events SET payload = replace(payload, 'chunk', 'chunK') WHERE thread_id = 'broken' AND seq = 2",
                [],
            )
            .unwrap();
        }
    }
    let store = opened(kind, &dir, 1024);
    let (ok, bad) = list_all(&*store).unwrap();
    assert!(!ok.contains(&"gone".to_string()) && !bad.iter().any(|(id, _)| id == "gone"));
    assert!(ok.contains(&"added".to_string()), "{ok:?}");
    assert_eq!(store.summary("keep").unwrap().last_seq, 4);
    // The damaged thread: refused with its seq on the first full read, and from then on
    // listed as unreadable, not served.
    let e = read_all(&*store, "broken").unwrap_err();
    assert!(matches!(e, StoreError::Corrupt { seq: 2, .. }), "{e}");
    let (_, bad) = list_all(&*store).unwrap();
    if kind == StoreKind::Sqlite {
        // SQLite checks the head row at open; the middle row is found by the read above.
        assert!(
            bad.is_empty() || bad.iter().any(|(id, _)| id == "broken"),
            "{bad:?}"
        );
    }
}

/// `warm` summarises, without writing, every thread that needs nothing done to open; a thread
/// whose log has a torn tail is left to a full load, which repairs it (and records it) when
/// `list` reaches it.
fn warm_reads_only_and_leaves_repairs_to_a_full_load(kind: StoreKind) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = state(&tmp);
    {
        let store = opened(kind, &dir, 1024);
        for i in 0..20 {
            thread(&*store, &format!("t{i:02}"), 3);
        }
        store.close().unwrap();
    }
    if kind == StoreKind::Jsonl {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(log(&dir, "t07"))
            .unwrap();
        std::io::Write::write_all(&mut f, b"{\"seq\":4,\"torn").unwrap();
    }
    let bytes_before = std::fs::read(log(&dir, "t07")).ok();
    let store = opened(kind, &dir, 1024);
    let stats = store.stats();
    assert_eq!(
        (stats.indexed_threads, stats.unsummarised_threads),
        (20, 20)
    );
    store.warm(&AtomicBool::new(false));
    let stats = store.stats();
    let expect_unknown = if kind == StoreKind::Jsonl { 1 } else { 0 };
    assert_eq!(stats.unsummarised_threads, expect_unknown, "{stats:?}");
    assert_eq!(stats.loaded_threads, 0, "warm loads no slot: {stats:?}");
    if kind == StoreKind::Jsonl {
        assert_eq!(
            std::fs::read(log(&dir, "t07")).ok(),
            bytes_before,
            "warm wrote nothing"
        );
    }
    let all = listed(&*store);
    assert_eq!(all.len(), 20);
    assert_eq!(store.stats().unsummarised_threads, 0);
    if kind == StoreKind::Jsonl {
        let last = read_all(&*store, "t07").unwrap().pop().unwrap();
        assert_eq!(
            last.kind(),
            "repaired",
            "the torn tail was cut and recorded"
        );
    }
    // A stopped warm-up stops.
    let store2_dir = state(&tmp).join("..").join("other");
    let store2 = opened(kind, &store2_dir, 1024);
    store2.warm(&AtomicBool::new(true));
}

/// `max_loaded_threads` at its edge: that many loaded threads stay; one more unloads the least
/// recently used idle one, whose summary stays in the index and which loads again on use.
fn the_loaded_slot_bound_holds_at_its_edge(kind: StoreKind) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = state(&tmp);
    {
        let store = opened(kind, &dir, 1024);
        for i in 0..5 {
            thread(&*store, &format!("s{i}"), 2);
        }
        store.close().unwrap();
    }
    let store = opened(kind, &dir, 4);
    for i in 0..4 {
        store.append(&format!("s{i}"), vec![delta(1)]).unwrap();
    }
    let s = store.stats();
    assert_eq!(
        (s.loaded_threads, s.unloaded_threads),
        (4, 0),
        "at the bound"
    );
    store.append("s4", vec![delta(1)]).unwrap();
    let s = store.stats();
    assert_eq!(
        (s.loaded_threads, s.unloaded_threads),
        (4, 1),
        "one past it"
    );
    // s0 was the least recently used: unloaded, still listed, and it loads again.
    assert_eq!(store.summary("s0").unwrap().last_seq, 3);
    store.append("s0", vec![delta(2)]).unwrap();
    assert_eq!(read_all(&*store, "s0").unwrap().len(), 4);
    assert_eq!(listed(&*store).len(), 5);
    assert!(store.verify("s0").unwrap().ok());
}

/// Reading back from the head serves the newest events without the history, checks the chain
/// it walks (a changed event before the anchor is found), and pages on with `has_more`.
fn reading_back_checks_the_chain_it_walks(kind: StoreKind) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = state(&tmp);
    {
        let store = opened(kind, &dir, 1024);
        thread(&*store, "r", 600);
        store.close().unwrap();
    }
    // A store without a cache reads back from disk.
    let no_cache = StoreOptions {
        tail_cache_events: 0,
        ..StoreOptions::default()
    };
    let store = open_store(kind, &dir, no_cache.clone()).unwrap();
    let all = read_all(&*store, "r").unwrap();
    drop(store);
    let store = open_store(kind, &dir, no_cache.clone()).unwrap();
    let mut before = None;
    let mut got = Vec::new();
    loop {
        let page = store.read_back("r", before, 256).unwrap();
        got.splice(0..0, page.events.iter().cloned());
        match page.events.first() {
            Some(f) if page.has_more => before = Some(f.seq),
            _ => break,
        }
    }
    assert_eq!(got, all);
    assert_eq!(store.header("r").unwrap(), all[0]);
    drop(store);
    // The same walk over a log whose event 100 was changed (its hash recomputed, so the line
    // passes on its own): the chain from the head is broken there.
    if kind == StoreKind::Jsonl {
        let text = std::fs::read_to_string(log(&dir, "r")).unwrap();
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        let mut ev: StoredEvent = serde_json::from_str(&lines[99]).unwrap();
        // Same length, so the anchor's offset still matches: only the chain can tell.
        ev.payload["delta"]["text"] = json!("CHUNK 99");
        ev.hash = ev.compute_hash();
        lines[99] = serde_json::to_string(&ev).unwrap();
        std::fs::write(log(&dir, "r"), lines.join("\n") + "\n").unwrap();
        let store = open_store(kind, &dir, no_cache).unwrap();
        let mut before = None;
        let err = loop {
            match store.read_back("r", before, 256) {
                Ok(p) => before = Some(p.events.first().unwrap().seq),
                Err(e) => break e,
            }
        };
        assert!(matches!(err, StoreError::Corrupt { seq: 100, .. }), "{err}");
    }
}

/// What the engine asks instead of replaying: the recent tail from the cache after a read
/// brought it in, and the event that recorded an idempotency key.
fn the_tail_cache_and_key_lookups_answer_without_the_history(kind: StoreKind) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = state(&tmp);
    let store = opened(kind, &dir, 1024);
    thread(&*store, "k", 5);
    let mut keyed = delta(50);
    keyed.idempotency_key = Some("turn-key-1".into());
    let ev = store.append("k", vec![keyed]).unwrap().pop().unwrap();
    store.append("k", vec![delta(51)]).unwrap();
    assert_eq!(
        store.find_by_idempotency_key("k", "turn-key-1").unwrap(),
        Some(ev.clone())
    );
    assert_eq!(store.find_by_idempotency_key("k", "other").unwrap(), None);
    let s = store.stats();
    assert_eq!(s.cached_threads, 1);
    let json = store.read_json("k", 4, 10).unwrap();
    assert_eq!(json.events.len(), 3);
    let parsed: StoredEvent = serde_json::from_str(&json.events[1]).unwrap();
    assert_eq!(parsed, ev);
    store.close().unwrap();
    drop(store);
    let store = opened(kind, &dir, 1024);
    assert_eq!(store.stats().cached_bytes, 0);
    assert_eq!(
        store.find_by_idempotency_key("k", "turn-key-1").unwrap(),
        Some(ev)
    );
    // A read of the newest events brings them in; the same read is then a cache hit that
    // equals the disk's answer.
    let first = store.read("k", 4, 10).unwrap();
    assert!(store.stats().cached_bytes > 0);
    assert_eq!(store.read("k", 4, 10).unwrap(), first);
}

macro_rules! both {
    ($($name:ident),* $(,)?) => {
        mod jsonl {
            $(#[test] fn $name() { super::$name(cc_app_server::rollout::StoreKind::Jsonl) })*
        }
        mod sqlite {
            $(#[test] fn $name() { super::$name(cc_app_server::rollout::StoreKind::Sqlite) })*
        }
    };
}

both!(
    index_follows_every_mutation_and_a_reopen,
    the_index_is_rebuilt_from_the_directory_at_open,
    warm_reads_only_and_leaves_repairs_to_a_full_load,
    the_loaded_slot_bound_holds_at_its_edge,
    reading_back_checks_the_chain_it_walks,
    the_tail_cache_and_key_lookups_answer_without_the_history,
);
