//! Verification that never fails open (issue 11): every finding of the adversarial probe as a
//! regression test on real files and real SQLite rows, each run against both stores.
//!
//! - fail closed: a thread the disk holds evidence of is listed (as unreadable if need be), never
//!   hidden, and unreadable entries count towards a page;
//! - identity: a log is bound to its thread, so copies and swaps are refused by name;
//! - anchors: a fallback that hides loss, a missing or unreadable anchor, fail unless accepted;
//! - keyed mode: appended, rewritten and transplanted history with every hash recomputed is
//!   refused with the key and (by design, see docs/rollout-format.md) served without it;
//! - schema: a hash-valid but schema-invalid event is refused with its seq, never served;
//! - pinning: re-pointing a symlinked state dir mid-run changes nothing.

mod rollout_util;

use cc_app_server::rollout::*;
use rollout_util::*;
use serde_json::json;
use std::fs;
use std::path::{Path, PathBuf};

/// A closed state dir with "alpha" (35 events, a declined approval at seq 18) and "bravo" (10).
fn fixture(kind: StoreKind, keyed: bool) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    let s = open(kind, &dir, keyed).unwrap();
    thread(&*s, "alpha", 35);
    thread(&*s, "bravo", 10);
    s.close().unwrap();
    (tmp, dir)
}

fn unreadable_reason<'a>(bad: &'a [(String, String)], id: &str) -> &'a str {
    &bad.iter()
        .find(|(i, _)| i == id)
        .unwrap_or_else(|| panic!("{id} is not listed as unreadable: {bad:?}"))
        .1
}

fn refused<T: std::fmt::Debug>(r: Result<T, StoreError>) -> String {
    match r {
        Err(e @ (StoreError::Corrupt { .. } | StoreError::AnchorMismatch { .. })) => e.to_string(),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

// ---- 1. Fail closed: what is on disk is listed, whether or not it opens -------------------

fn a_thread_whose_history_is_gone_but_whose_anchor_remains_is_listed(kind: StoreKind) {
    let (_t, dir) = fixture(kind, false);
    match kind {
        StoreKind::Jsonl => fs::remove_file(log(&dir, "alpha")).unwrap(),
        StoreKind::Sqlite => {
            db(&dir)
                .execute("DELETE FROM events WHERE thread_id = 'alpha'", [])
                .unwrap();
        }
    }
    let s = open(kind, &dir, false).unwrap();
    let (ok, bad) = list_all(&*s).unwrap();
    assert_eq!(ok, vec!["bravo"]);
    let why = unreadable_reason(&bad, "alpha");
    assert!(why.contains("seq 35"), "{why}");
    refused(s.verify("alpha"));
}

fn events_whose_anchor_is_gone_are_listed(kind: StoreKind) {
    let (_t, dir) = fixture(kind, false);
    remove_anchor(kind, &dir, "alpha");
    let s = open(kind, &dir, false).unwrap();
    let (ok, bad) = list_all(&*s).unwrap();
    assert_eq!(ok, vec!["bravo"]);
    assert!(unreadable_reason(&bad, "alpha").contains("accept_unanchored"));
}

fn a_thread_cut_short_is_listed_unreadable_by_name(kind: StoreKind) {
    let cases: &[&str] = match kind {
        StoreKind::Jsonl => &["last line", "mid-line cut", "emptied log"],
        StoreKind::Sqlite => &["last row"],
    };
    for case in cases {
        let (_t, dir) = fixture(kind, false);
        match *case {
            "mid-line cut" => {
                let b = fs::read(log(&dir, "alpha")).unwrap();
                fs::write(log(&dir, "alpha"), &b[..b.len() - 40]).unwrap();
            }
            "emptied log" => fs::write(log(&dir, "alpha"), b"").unwrap(),
            _ => cut_last(kind, &dir, "alpha"),
        }
        let s = open(kind, &dir, false).unwrap();
        let (ok, bad) = list_all(&*s).unwrap();
        assert_eq!(ok, vec!["bravo"], "{case}");
        unreadable_reason(&bad, "alpha");
        refused(s.summary("alpha"));
    }
}

fn unreadable_threads_count_towards_the_page_limit(kind: StoreKind) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    let s = open(kind, &dir, false).unwrap();
    for i in 0..6 {
        thread(&*s, &format!("t{i}"), 3);
    }
    drop(s);
    cut_last(kind, &dir, "t1");
    remove_anchor(kind, &dir, "t3");
    cut_last(kind, &dir, "t4");
    let s = open(kind, &dir, false).unwrap();
    let (mut seen, mut bad_seen) = (Vec::new(), Vec::new());
    let mut cursor = None;
    loop {
        let p = s
            .list(&ListQuery {
                include_archived: true,
                cursor,
                limit: 2,
            })
            .unwrap();
        assert!(p.threads.len() + p.unreadable.len() <= 2, "{p:?}");
        seen.extend(p.threads.iter().map(|t| t.thread_id.clone()));
        bad_seen.extend(p.unreadable.iter().map(|(id, _)| id.clone()));
        match p.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    assert_eq!(seen, vec!["t0", "t2", "t5"]);
    assert_eq!(bad_seen, vec!["t1", "t3", "t4"]);
}

// ---- 2. Identity: a history is bound to its thread ----------------------------------------

fn a_copied_history_is_refused_under_its_new_name(kind: StoreKind) {
    let (_t, dir) = fixture(kind, false);
    copy_thread(kind, &dir, "alpha", "delta");
    let s = open(kind, &dir, false).unwrap();
    let (ok, bad) = list_all(&*s).unwrap();
    assert_eq!(ok, vec!["alpha", "bravo"], "alpha is listed once");
    let why = unreadable_reason(&bad, "delta");
    assert!(
        why.contains("\"alpha\"") && why.contains("another"),
        "{why}"
    );
    assert!(matches!(
        s.summary("delta"),
        Err(StoreError::Corrupt { seq: 1, .. }) | Err(StoreError::AnchorMismatch { .. })
    ));
    assert!(s.read("delta", 0, 10).is_err());
}

fn swapped_histories_are_served_under_neither_id(kind: StoreKind) {
    let (_t, dir) = fixture(kind, false);
    swap_threads(kind, &dir, "alpha", "bravo");
    let s = open(kind, &dir, false).unwrap();
    refused(s.summary("alpha"));
    refused(s.summary("bravo"));
    assert!(read_all(&*s, "alpha").is_err() && read_all(&*s, "bravo").is_err());
    let (ok, bad) = list_all(&*s).unwrap();
    assert!(ok.is_empty() && bad.len() == 2, "{ok:?} {bad:?}");
}

// ---- 3. Anchors that cannot hide loss ---------------------------------------------------

/// The newest anchor slot (index, bytes) of a JSONL thread.
fn newest_slot(dir: &Path, id: &str) -> (usize, Anchor) {
    let a = fs::read(anchor(dir, id)).unwrap();
    (0..2)
        .filter_map(|i| Anchor::decode(&a[i * ANCHOR_SLOT..(i + 1) * ANCHOR_SLOT]).map(|x| (i, x)))
        .max_by_key(|(_, x)| x.gen)
        .unwrap()
}

/// Flips one byte inside the newest slot's `hash=` value (its `seq=` stays readable).
fn damage_newest_slot(dir: &Path, id: &str) {
    let (i, _) = newest_slot(dir, id);
    let mut a = fs::read(anchor(dir, id)).unwrap();
    let text = String::from_utf8_lossy(&a[i * ANCHOR_SLOT..]).into_owned();
    let at = i * ANCHOR_SLOT + text.find("hash=").unwrap() + 10;
    a[at] ^= 0x01;
    fs::write(anchor(dir, id), a).unwrap();
}

#[test]
fn a_cut_event_hidden_by_a_damaged_anchor_slot_is_refused_naming_the_lost_seq() {
    let (_t, dir) = fixture(StoreKind::Jsonl, false);
    cut_last(StoreKind::Jsonl, &dir, "alpha");
    damage_newest_slot(&dir, "alpha");
    let s = open(StoreKind::Jsonl, &dir, false).unwrap();
    let why = refused(s.summary("alpha"));
    assert!(
        why.contains("appears to record seq 35") && why.contains("35..=35"),
        "{why}"
    );
    drop(s);
    // Accepted: served as it is, and the loss is recorded in the log for every later reader.
    let s = accepting(StoreKind::Jsonl, &dir, false);
    let r = s.verify("alpha").unwrap();
    assert!(r.ok(), "{r:?}");
    assert!(
        r.warnings.iter().any(|w| w.contains("35..=35")),
        "{:?}",
        r.warnings
    );
    let evs = read_all(&*s, "alpha").unwrap();
    let last = evs.last().unwrap();
    assert_eq!((last.seq, last.kind()), (35, "repaired"));
    assert!(last.payload["reason"].as_str().unwrap().contains("35..=35"));
    drop(s);
    assert_eq!(
        open(StoreKind::Jsonl, &dir, false)
            .unwrap()
            .summary("alpha")
            .unwrap()
            .last_seq,
        35
    );
}

#[test]
fn a_torn_newest_anchor_slot_is_a_warning_naming_what_nothing_vouches_for() {
    let (_t, dir) = fixture(StoreKind::Jsonl, false);
    damage_newest_slot(&dir, "alpha");
    let s = open(StoreKind::Jsonl, &dir, false).unwrap();
    let r = s.verify("alpha").unwrap();
    assert!(r.ok(), "{r:?}");
    assert!(
        r.warnings
            .iter()
            .any(|w| w.contains("fell back") && w.contains("after seq 34")),
        "{:?}",
        r.warnings
    );
    // Recorded: the damaged slot is rewritten, the evidence is kept in the log.
    let evs = read_all(&*s, "alpha").unwrap();
    assert_eq!(evs.len(), 36);
    assert_eq!(evs[35].kind(), "repaired");
}

fn a_missing_anchor_fails_unless_accepted(kind: StoreKind) {
    let (_t, dir) = fixture(kind, false);
    remove_anchor(kind, &dir, "alpha");
    for _ in 0..10 {
        cut_last(kind, &dir, "alpha");
    }
    let s = open(kind, &dir, false).unwrap();
    let why = refused(s.summary("alpha"));
    assert!(why.contains("accept_unanchored"), "{why}");
    assert!(s.verify("alpha").is_err());
    drop(s);
    let s = accepting(kind, &dir, false);
    let r = s.verify("alpha").unwrap();
    assert!(r.ok(), "{r:?}");
    assert!(
        r.warnings.iter().any(|w| w.contains("nothing vouches")),
        "{:?}",
        r.warnings
    );
    assert_eq!(
        s.summary("alpha").unwrap().last_seq,
        26,
        "25 left + the record"
    );
    drop(s);
    // Re-anchored: an ordinary open now works, and the acceptance stays in the history.
    let s = open(kind, &dir, false).unwrap();
    let evs = read_all(&*s, "alpha").unwrap();
    assert_eq!(evs.last().unwrap().kind(), "repaired");
    assert!(s.verify("alpha").unwrap().ok());
}

#[test]
fn both_anchor_slots_damaged_fails_unless_accepted() {
    let (_t, dir) = fixture(StoreKind::Jsonl, false);
    let mut a = fs::read(anchor(&dir, "alpha")).unwrap();
    a[20] ^= 1;
    a[ANCHOR_SLOT + 20] ^= 1;
    fs::write(anchor(&dir, "alpha"), &a).unwrap();
    let why = refused(
        open(StoreKind::Jsonl, &dir, false)
            .unwrap()
            .summary("alpha"),
    );
    assert!(why.contains("neither head anchor slot"), "{why}");
    let s = accepting(StoreKind::Jsonl, &dir, false);
    assert_eq!(s.summary("alpha").unwrap().last_seq, 36);
    drop(s);
    // The rebuilt anchor file has no damaged slot left to warn about.
    let r = open(StoreKind::Jsonl, &dir, false)
        .unwrap()
        .verify("alpha")
        .unwrap();
    assert!(r.ok() && r.warnings.is_empty(), "{r:?}");
}

// ---- 4. Keyed mode ------------------------------------------------------------------------

/// alpha's history with one more event (a copy of its last delta), re-chained.
fn appended(kind: StoreKind, dir: &Path) -> Vec<StoredEvent> {
    let mut evs = events(kind, dir, "alpha");
    let mut extra = evs[evs.len() - 2].clone();
    extra.payload["delta"]["text"] = json!("FORGED");
    evs.push(extra);
    rechain(&mut evs);
    evs
}

fn served_text(s: &dyn RolloutStore, id: &str) -> String {
    read_all(s, id)
        .unwrap()
        .iter()
        .map(|e| e.payload.to_string())
        .collect()
}

fn keyed_mode_refuses_an_appended_event_with_recomputed_hashes(kind: StoreKind) {
    // Log only (anchor untouched): JSONL keeps it out of what is served; SQLite's row disagrees.
    let (_t, dir) = fixture(kind, true);
    let evs = appended(kind, &dir);
    let forged = format!("seq {0}..={0}", evs.len());
    write_events(kind, &dir, "alpha", &evs);
    let s = open(kind, &dir, true).unwrap();
    match kind {
        StoreKind::Jsonl => {
            assert!(!served_text(&*s, "alpha").contains("FORGED"));
            let r = s.verify("alpha").unwrap();
            assert!(
                r.warnings
                    .iter()
                    .any(|w| w.contains(&forged) && w.contains("without authentication")),
                "{r:?}"
            );
        }
        StoreKind::Sqlite => {
            refused(s.summary("alpha"));
        }
    }
    drop(s);
    // Log and anchor, both forged: the anchor's MAC cannot be made without the key.
    for keep_mac in [false, true] {
        let (_t, dir) = fixture(kind, true);
        let evs = appended(kind, &dir);
        write_events(kind, &dir, "alpha", &evs);
        if keep_mac {
            forge_anchor_keep_mac(kind, &dir, "alpha", &evs);
        } else {
            forge_anchor(kind, &dir, "alpha", &evs);
        }
        let s = open(kind, &dir, true).unwrap();
        let why = refused(s.summary("alpha"));
        assert!(why.contains("MAC"), "{why}");
        assert!(s.read("alpha", 0, 100).is_err());
    }
    // Unkeyed, the same forgery is indistinguishable from real history (docs: threat model).
    let (_t, dir) = fixture(kind, false);
    let evs = appended(kind, &dir);
    write_events(kind, &dir, "alpha", &evs);
    forge_anchor(kind, &dir, "alpha", &evs);
    let s = open(kind, &dir, false).unwrap();
    assert!(served_text(&*s, "alpha").contains("FORGED"));
    assert!(!s.verify("alpha").unwrap().keyed);
}

fn keyed_mode_refuses_a_rewritten_decision(kind: StoreKind) {
    for keyed in [true, false] {
        let (_t, dir) = fixture(kind, keyed);
        let mut evs = events(kind, &dir, "alpha");
        let i = evs
            .iter()
            .position(|e| e.kind() == "approvalResolved")
            .unwrap();
        evs[i].payload["outcome"] = json!("approved");
        evs[i].payload["decision"] = json!({"kind": "acceptOnce"});
        rechain(&mut evs);
        write_events(kind, &dir, "alpha", &evs);
        forge_anchor(kind, &dir, "alpha", &evs);
        let s = open(kind, &dir, keyed).unwrap();
        if keyed {
            refused(s.summary("alpha"));
        } else {
            assert!(served_text(&*s, "alpha").contains("acceptOnce"));
        }
    }
}

fn keyed_mode_refuses_a_transplanted_history(kind: StoreKind) {
    for keyed in [true, false] {
        let (_t, dir) = fixture(kind, keyed);
        let mut evs = events(kind, &dir, "bravo");
        evs[0].payload["threadId"] = json!("alpha");
        // Bravo's seals name bravo; a forger drops them.
        evs.retain(|e| e.kind() != "sealed");
        rechain(&mut evs);
        write_events(kind, &dir, "alpha", &evs);
        forge_anchor(kind, &dir, "alpha", &evs);
        let s = open(kind, &dir, keyed).unwrap();
        if keyed {
            refused(s.summary("alpha"));
        } else {
            assert_eq!(
                s.summary("alpha").unwrap().title.as_deref(),
                Some("Thread bravo")
            );
        }
    }
}

fn a_keyed_thread_opened_without_its_key_is_read_unkeyed_and_never_written(kind: StoreKind) {
    let (_t, dir) = fixture(kind, true);
    let s = open(kind, &dir, false).unwrap();
    assert_eq!(
        read_all(&*s, "alpha").unwrap().len(),
        events(kind, &dir, "alpha").len()
    );
    let r = s.verify("alpha").unwrap();
    assert!(r.ok() && !r.keyed, "{r:?}");
    assert!(r.warnings.iter().any(|w| w.starts_with("unkeyed")), "{r:?}");
    match s.append("alpha", vec![delta(99)]) {
        Err(StoreError::InvalidArgument(m)) => assert!(m.contains("rollout key"), "{m}"),
        other => panic!("{other:?}"),
    }
    drop(s);
    let r = open(kind, &dir, true).unwrap().verify("alpha").unwrap();
    assert!(r.ok() && r.keyed && r.warnings.is_empty(), "{r:?}");
}

fn another_key_is_named_as_another_key(kind: StoreKind) {
    let (_t, dir) = fixture(kind, true);
    let s = open_store(
        kind,
        &dir,
        StoreOptions {
            key: Some(RolloutKey::from_bytes([7; 32])),
            ..StoreOptions::default()
        },
    )
    .unwrap();
    let why = refused(s.summary("alpha"));
    assert!(why.contains("another rollout key"), "{why}");
}

fn an_unkeyed_thread_is_adopted_under_a_key_only_when_accepted(kind: StoreKind) {
    let (_t, dir) = fixture(kind, false);
    let why = refused(open(kind, &dir, true).unwrap().summary("alpha"));
    assert!(why.contains("no MAC"), "{why}");
    let s = accepting(kind, &dir, true);
    let r = s.verify("alpha").unwrap();
    assert!(r.ok() && r.keyed, "{r:?}");
    assert!(r.warnings.iter().any(|w| w.contains("adopted")), "{r:?}");
    drop(s);
    let r = open(kind, &dir, true).unwrap().verify("alpha").unwrap();
    assert!(r.ok() && r.keyed, "{r:?}");
    assert_eq!(r.authenticated_through, Some(r.head_seq));
}

fn seals_follow_every_n_events_and_a_forged_seal_is_refused(kind: StoreKind) {
    let (_t, dir) = fixture(kind, true);
    let evs = events(kind, &dir, "alpha");
    let seals: Vec<&StoredEvent> = evs.iter().filter(|e| e.kind() == "sealed").collect();
    assert!(
        seals.len() >= 4,
        "seal_every 8 over 35 events: {}",
        seals.len()
    );
    for s in &seals {
        assert_eq!(s.payload["sealedSeq"], json!(s.seq - 1));
        assert_eq!(s.payload["sealedHash"], json!(s.prev_hash));
        assert_eq!(s.payload["keyId"], json!(key().key_id()));
    }
    // A forged MAC on the first seal, the chain and the anchor recomputed around it.
    let mut forged = evs.clone();
    let i = forged.iter().position(|e| e.kind() == "sealed").unwrap();
    forged[i].payload["mac"] = json!("0".repeat(64));
    rechain(&mut forged);
    write_events(kind, &dir, "alpha", &forged);
    forge_anchor_keep_mac(kind, &dir, "alpha", &forged);
    let s = open(kind, &dir, true).unwrap();
    refused(s.summary("alpha"));
    let r = s.verify("alpha");
    assert!(r.is_err() || !r.unwrap().ok());
}

fn the_key_never_reaches_the_state_dir_or_a_message(kind: StoreKind) {
    let (_t, dir) = fixture(kind, true);
    let hex_key = hex::encode(KEY);
    let mut stack = vec![dir.clone()];
    let mut files = 0;
    while let Some(p) = stack.pop() {
        for e in fs::read_dir(&p).unwrap() {
            let path = e.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let bytes = fs::read(&path).unwrap();
            files += 1;
            assert!(
                !bytes.windows(32).any(|w| w == KEY),
                "raw key in {}",
                path.display()
            );
            assert!(
                !String::from_utf8_lossy(&bytes).contains(&hex_key),
                "hex key in {}",
                path.display()
            );
        }
    }
    assert!(files >= 2);
    let shown = format!("{:?}", options(true));
    assert!(
        shown.contains("<redacted>") && !shown.contains(&hex_key[..16]),
        "{shown}"
    );
    let other = open_store(
        kind,
        &dir,
        StoreOptions {
            key: Some(RolloutKey::from_bytes([7; 32])),
            ..StoreOptions::default()
        },
    )
    .unwrap();
    let msg = refused(other.summary("alpha"));
    assert!(!msg.contains(&hex_key[..16]) && !msg.contains(&hex::encode([7u8; 32])[..16]));
}

fn a_fork_of_a_keyed_thread_carries_no_foreign_seals(kind: StoreKind) {
    let (_t, dir) = fixture(kind, true);
    let s = open(kind, &dir, true).unwrap();
    s.fork("alpha", None, "gamma", None).unwrap();
    drop(s);
    let s = open(kind, &dir, true).unwrap();
    let r = s.verify("gamma").unwrap();
    assert!(r.ok() && r.keyed, "{r:?}");
    for e in read_all(&*s, "gamma").unwrap() {
        if e.kind() == "sealed" {
            assert_eq!(e.payload["sealedSeq"], json!(e.seq - 1));
        }
    }
}

// ---- 5. Validate on read --------------------------------------------------------------------

fn a_hash_valid_schema_invalid_event_is_refused_with_its_seq(kind: StoreKind) {
    // The header: a 300-character title (the schema's Title is at most 256).
    let (_t, dir) = fixture(kind, false);
    let mut evs = events(kind, &dir, "alpha");
    evs[0].payload["title"] = json!("t".repeat(300));
    rechain(&mut evs);
    write_events(kind, &dir, "alpha", &evs);
    forge_anchor(kind, &dir, "alpha", &evs);
    let s = open(kind, &dir, false).unwrap();
    match s.summary("alpha") {
        Err(StoreError::Corrupt { seq: 1, reason, .. }) => {
            assert!(reason.contains("schema"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    let (ok, bad) = list_all(&*s).unwrap();
    assert_eq!(ok, vec!["bravo"]);
    unreadable_reason(&bad, "alpha");
    drop(s);
    // In the middle: an item delta of a type the schema does not know.
    let (_t, dir) = fixture(kind, false);
    let mut evs = events(kind, &dir, "alpha");
    evs[9].payload["delta"] = json!({"type": "bogus", "text": "x"});
    rechain(&mut evs);
    write_events(kind, &dir, "alpha", &evs);
    forge_anchor(kind, &dir, "alpha", &evs);
    let s = open(kind, &dir, false).unwrap();
    assert!(matches!(
        read_all(&*s, "alpha"),
        Err(StoreError::Corrupt { seq: 10, .. })
    ));
    // JSONL checks the whole chain on the first read; SQLite checks each page it reads. Either
    // way the invalid event itself is never served.
    match (kind, s.read("alpha", 0, 5)) {
        (StoreKind::Jsonl, Err(StoreError::Corrupt { seq: 10, .. })) => {}
        (StoreKind::Sqlite, Ok(p)) => assert_eq!(p.events.len(), 5),
        (_, other) => panic!("{other:?}"),
    }
    assert!(matches!(
        s.read("alpha", 9, 1),
        Err(StoreError::Corrupt { seq: 10, .. })
    ));
    let r = s.verify("alpha").unwrap();
    assert_eq!(r.first_bad_seq, Some(10), "{r:?}");
}

fn what_the_schema_refuses_is_never_written(kind: StoreKind) {
    let tmp = tempfile::tempdir().unwrap();
    let s = open(kind, &tmp.path().join("s"), false).unwrap();
    thread(&*s, "a", 2);
    for bad in [
        json!({"type": "itemDelta", "turnId": "t1"}),
        json!({"type": "noSuchEvent"}),
        json!({"type": "sealed", "sealedSeq": 2, "sealedHash": ZERO_HASH, "keyId": "0000000000000000", "mac": ZERO_HASH}),
    ] {
        assert!(
            matches!(
                s.append("a", vec![NewEvent::new(bad.clone())]),
                Err(StoreError::InvalidArgument(_))
            ),
            "{bad}"
        );
    }
    assert_eq!(s.summary("a").unwrap().last_seq, 2);
}

// ---- 6. The state dir is pinned at open ---------------------------------------------------

fn repointing_a_symlinked_state_dir_mid_run_changes_nothing(kind: StoreKind) {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b, link) = (
        tmp.path().join("a"),
        tmp.path().join("b"),
        tmp.path().join("state"),
    );
    for d in [&a, &b] {
        fs::create_dir(d).unwrap();
        fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    }
    std::os::unix::fs::symlink(&a, &link).unwrap();
    let s = open(kind, &link, false).unwrap();
    thread(&*s, "before", 3);
    fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink(&b, &link).unwrap();
    thread(&*s, "after", 3);
    s.append("before", vec![delta(7)]).unwrap();
    s.fork("before", None, "forked", None).unwrap();
    s.close().unwrap();
    drop(s);
    let names = |d: &Path| -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert!(
        names(&b).is_empty(),
        "nothing may land in the new target: {:?}",
        names(&b)
    );
    let s = open(kind, &a, false).unwrap();
    let (ok, bad) = list_all(&*s).unwrap();
    assert_eq!(
        (ok, bad),
        (
            vec!["after".to_string(), "before".into(), "forked".into()],
            vec![]
        )
    );
    assert_eq!(s.summary("before").unwrap().last_seq, 4);
}

// ---- 7. The independent verifier agrees -------------------------------------------------

fn key_file(dir: &Path) -> String {
    let path = dir.join("key");
    fs::write(&path, KEY).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn the_python_verifier_checks_slots_identity_and_keys_and_never_crashes() {
    let (_t, dir) = fixture(StoreKind::Jsonl, false);
    let d = dir.to_str().unwrap();
    let (rc, out) = verify_rollout_py(&["--state-dir", d]);
    assert_eq!(rc, 0, "{out}");
    assert!(
        out.contains("alpha ok: 35 events") && out.contains("(unkeyed)"),
        "{out}"
    );
    // A damaged newest slot: a warning; with the last event cut as well: the lost seq named.
    damage_newest_slot(&dir, "alpha");
    let (rc, out) = verify_rollout_py(&["--state-dir", d]);
    assert_eq!(rc, 0, "{out}");
    assert!(
        out.contains("warning: the other head anchor slot is damaged"),
        "{out}"
    );
    cut_last(StoreKind::Jsonl, &dir, "alpha");
    let (rc, out) = verify_rollout_py(&["--state-dir", d]);
    assert_eq!(rc, 1, "{out}");
    assert!(
        out.contains("acknowledged events 35..=35 are gone"),
        "{out}"
    );
    let (rc, _) = verify_rollout_py(&["--state-dir", d, "--accept-unanchored"]);
    assert_eq!(rc, 0);
    // Every single-byte flip of the anchor file is reported or harmless, never a crash.
    let a = fs::read(anchor(&dir, "bravo")).unwrap();
    for i in (0..a.len()).step_by(13) {
        let mut b = a.clone();
        b[i] ^= 0x01;
        fs::write(anchor(&dir, "bravo"), &b).unwrap();
        let (rc, out) = verify_rollout_py(&[
            log(&dir, "bravo").to_str().unwrap(),
            anchor(&dir, "bravo").to_str().unwrap(),
        ]);
        assert!(rc == 1 || out.contains("warning"), "flip at {i}: {out}");
    }
    fs::write(anchor(&dir, "bravo"), &a).unwrap();
    // A copy under another name is another thread's log.
    copy_thread(StoreKind::Jsonl, &dir, "bravo", "delta");
    let (rc, out) = verify_rollout_py(&["--state-dir", d, "--accept-unanchored"]);
    assert_eq!(rc, 1, "{out}");
    assert!(
        out.contains("delta: the head anchor belongs to thread 'bravo'"),
        "{out}"
    );
    fs::remove_file(anchor(&dir, "delta")).unwrap();
    let (_, out) = verify_rollout_py(&["--state-dir", d, "--accept-unanchored"]);
    assert!(
        out.contains("delta: first bad seq 1: the header names thread 'bravo'"),
        "{out}"
    );
    fs::write(dir.join("threads/stray.txt"), b"x").unwrap();
    let (_, out) = verify_rollout_py(&["--state-dir", d, "--accept-unanchored"]);
    assert!(
        out.contains("threads/stray.txt: not a thread's log"),
        "{out}"
    );
}

#[test]
fn the_python_verifier_checks_keyed_anchors_and_seals_on_both_stores() {
    for kind in kinds() {
        let (t, dir) = fixture(kind, true);
        let (d, k) = (dir.to_str().unwrap(), key_file(t.path()));
        let (rc, out) = verify_rollout_py(&["--state-dir", d, "--key-file", &k]);
        assert_eq!(rc, 0, "{kind:?}: {out}");
        assert!(out.contains("alpha ok") && out.contains("(keyed)"), "{out}");
        let (rc, out) = verify_rollout_py(&["--state-dir", d]);
        assert_eq!(rc, 0, "{out}");
        if kind == StoreKind::Jsonl {
            assert!(out.contains("warning: unkeyed"), "{out}");
        }
        let other = t.path().join("other");
        fs::write(&other, [7u8; 32]).unwrap();
        let (rc, out) =
            verify_rollout_py(&["--state-dir", d, "--key-file", other.to_str().unwrap()]);
        assert_eq!(rc, 1, "{out}");
        // Appended with every hash recomputed and the anchor forged: the MAC gives it away.
        let evs = appended(kind, &dir);
        write_events(kind, &dir, "alpha", &evs);
        forge_anchor_keep_mac(kind, &dir, "alpha", &evs);
        let (rc, out) = verify_rollout_py(&["--state-dir", d, "--key-file", &k]);
        assert_eq!(rc, 1, "{kind:?}: {out}");
        assert!(out.contains("alpha: the") && out.contains("MAC"), "{out}");
        // Without the key the same forgery passes: what only the keyed mode detects.
        assert_eq!(verify_rollout_py(&["--state-dir", d]).0, 0);
    }
}

macro_rules! both_stores {
    ($($name:ident),* $(,)?) => {
        mod jsonl {
            $(#[test] fn $name() { super::$name(cc_app_server::rollout::StoreKind::Jsonl) })*
        }
        mod sqlite {
            $(#[test] fn $name() { super::$name(cc_app_server::rollout::StoreKind::Sqlite) })*
        }
    };
}

both_stores!(
    a_thread_whose_history_is_gone_but_whose_anchor_remains_is_listed,
    events_whose_anchor_is_gone_are_listed,
    a_thread_cut_short_is_listed_unreadable_by_name,
    unreadable_threads_count_towards_the_page_limit,
    a_copied_history_is_refused_under_its_new_name,
    swapped_histories_are_served_under_neither_id,
    a_missing_anchor_fails_unless_accepted,
    keyed_mode_refuses_an_appended_event_with_recomputed_hashes,
    keyed_mode_refuses_a_rewritten_decision,
    keyed_mode_refuses_a_transplanted_history,
    a_keyed_thread_opened_without_its_key_is_read_unkeyed_and_never_written,
    another_key_is_named_as_another_key,
    an_unkeyed_thread_is_adopted_under_a_key_only_when_accepted,
    seals_follow_every_n_events_and_a_forged_seal_is_refused,
    the_key_never_reaches_the_state_dir_or_a_message,
    a_fork_of_a_keyed_thread_carries_no_foreign_seals,
    a_hash_valid_schema_invalid_event_is_refused_with_its_seq,
    what_the_schema_refuses_is_never_written,
    repointing_a_symlinked_state_dir_mid_run_changes_nothing,
);
