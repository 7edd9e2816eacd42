//! The JSONL store's deferred anchor (issue 14, "thread/start stays at the floor"): a thread
//! created with its header alone is one durable file, and its anchor (seq 0) is durable before
//! anything more reaches the log. Each crash window is laid out as bytes on disk and opened
//! again; what is outside the rule (anything past the header without an anchor, keyed stores)
//! is refused as before. docs/rollout-format.md, "Durable before anything past the header".

mod rollout_util;

use cc_app_server::rollout::*;
use rollout_util::*;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

fn state() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    (tmp, dir)
}

fn open_with(dir: &Path, durability: Durability) -> std::sync::Arc<dyn RolloutStore> {
    open_store(
        StoreKind::Jsonl,
        dir,
        StoreOptions {
            durability,
            ..options(false)
        },
    )
    .expect("open store")
}

fn lines(dir: &Path, id: &str) -> usize {
    fs::read(log(dir, id))
        .unwrap()
        .iter()
        .filter(|b| **b == b'\n')
        .count()
}

fn tmp_anchor(dir: &Path, id: &str) -> PathBuf {
    let mut p = anchor(dir, id).into_os_string();
    p.push(".tmp");
    PathBuf::from(p)
}

fn refused<T: std::fmt::Debug>(r: Result<T, StoreError>) -> String {
    match r {
        Err(e @ (StoreError::Corrupt { .. } | StoreError::AnchorMismatch { .. })) => e.to_string(),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn python_verify(dir: &Path) -> (i32, String) {
    verify_rollout_py(&["--state-dir", dir.to_str().unwrap()])
}

/// Closes `s` and opens its state dir again (Sync).
fn reopen(s: std::sync::Arc<dyn RolloutStore>, dir: &Path) -> std::sync::Arc<dyn RolloutStore> {
    s.close().unwrap();
    drop(s);
    open_with(dir, Durability::Sync)
}

/// A closed state dir holding thread "a", started and nothing more.
fn started() -> (tempfile::TempDir, PathBuf) {
    let (t, dir) = state();
    let s = open_with(&dir, Durability::Sync);
    thread(&*s, "a", 1);
    s.close().unwrap();
    (t, dir)
}

#[test]
fn a_started_thread_is_one_durable_file_and_opens_again_with_no_warning() {
    for durability in [
        Durability::Sync,
        Durability::Buffered,
        Durability::Ephemeral,
    ] {
        let (_t, dir) = state();
        let s = open_with(&dir, durability);
        thread(&*s, "a", 1);
        s.flush().unwrap();
        assert!(
            !anchor(&dir, "a").exists(),
            "{durability:?}: no anchor before anything follows the header"
        );
        assert_eq!(lines(&dir, "a"), 1, "{durability:?}");
        s.close().unwrap();
        drop(s);

        let s = open_with(&dir, durability);
        let (ok, bad) = list_all(&*s).unwrap();
        assert_eq!(
            (ok, bad.len()),
            (vec!["a".to_string()], 0),
            "{durability:?}"
        );
        assert_eq!(s.summary("a").unwrap().last_seq, 1);
        let r = s.verify("a").unwrap();
        assert!(r.ok() && r.warnings.is_empty(), "{durability:?}: {r:?}");
        assert!(s.stray_entries().unwrap().is_empty());
        // Opening it wrote nothing: still one line, still no anchor.
        assert_eq!(lines(&dir, "a"), 1);
        assert!(!anchor(&dir, "a").exists());
        s.close().unwrap();
        let (rc, out) = python_verify(&dir);
        assert_eq!(rc, 0, "{out}");
        assert!(out.contains("a ok: 1 events"), "{out}");
    }
}

#[test]
fn the_anchor_is_durable_before_the_second_event_and_its_loss_is_refused_as_before() {
    let (_t, dir) = state();
    let s = open_with(&dir, Durability::Sync);
    thread(&*s, "a", 1);
    s.append("a", vec![delta(1)]).unwrap();
    assert!(anchor(&dir, "a").exists());
    assert!(!tmp_anchor(&dir, "a").exists());
    assert_eq!(lines(&dir, "a"), 2);
    s.append("a", vec![delta(2)]).unwrap();
    let s = reopen(s, &dir);
    assert_eq!(s.summary("a").unwrap().last_seq, 3);
    assert!(s.verify("a").unwrap().ok());
    drop(s);

    fs::remove_file(anchor(&dir, "a")).unwrap();
    let s = open_with(&dir, Durability::Sync);
    let why = refused(s.summary("a"));
    assert!(why.contains("accept_unanchored"), "{why}");
    assert!(s.verify("a").map_or(true, |r| !r.ok()));
    drop(s);
    let (rc, out) = python_verify(&dir);
    assert_ne!(rc, 0, "{out}");
    assert!(out.contains("the head anchor file is missing"), "{out}");
}

#[test]
fn a_thread_opened_again_gets_its_anchor_before_its_next_event() {
    let (_t, dir) = started();
    let s = open_with(&dir, Durability::Sync);
    s.append("a", vec![delta(1)]).unwrap();
    assert!(anchor(&dir, "a").exists());
    let s = reopen(s, &dir);
    assert_eq!(read_all(&*s, "a").unwrap().len(), 2);
    let r = s.verify("a").unwrap();
    assert!(r.ok() && r.warnings.is_empty(), "{r:?}");
}

#[test]
fn a_crash_inside_the_anchor_write_leaves_a_created_thread_and_the_debris_is_removed() {
    let (_t, dir) = started();
    // Killed between creating the temporary anchor and renaming it: a part of a slot.
    fs::write(tmp_anchor(&dir, "a"), b"ccanchor1 seq=0 ha").unwrap();
    let s = open_with(&dir, Durability::Sync);
    assert_eq!(s.summary("a").unwrap().last_seq, 1);
    assert!(!tmp_anchor(&dir, "a").exists(), "removed when opened");
    s.append("a", vec![delta(1)]).unwrap();
    let s = reopen(s, &dir);
    assert!(s.verify("a").unwrap().ok());
    assert!(s.stray_entries().unwrap().is_empty());
    assert_eq!(s.summary("a").unwrap().last_seq, 2);
}

#[test]
fn anything_past_the_header_without_an_anchor_is_refused() {
    for tail in [
        &b"{\"seq\":2,\"prevHa"[..], // a torn second line
        &b"\n"[..],                  // an empty line
    ] {
        let (_t, dir) = started();
        fs::OpenOptions::new()
            .append(true)
            .open(log(&dir, "a"))
            .unwrap()
            .write_all(tail)
            .unwrap();
        let s = open_with(&dir, Durability::Sync);
        let why = refused(s.summary("a"));
        assert!(why.contains("anchor"), "{why}");
        assert!(s.verify("a").map_or(true, |r| !r.ok()));
    }
    // A whole second event, re-chained, and no anchor: refused (the anchor was removed).
    let (_t, dir) = state();
    let s = open_with(&dir, Durability::Sync);
    thread(&*s, "a", 2);
    s.close().unwrap();
    drop(s);
    fs::remove_file(anchor(&dir, "a")).unwrap();
    let s = open_with(&dir, Durability::Sync);
    assert!(refused(s.summary("a")).contains("accept_unanchored"));
}

#[test]
fn keyed_stores_and_forks_with_history_write_the_anchor_first() {
    let (_t, dir) = state();
    let s = open(StoreKind::Jsonl, &dir, true).unwrap();
    thread(&*s, "k", 1);
    assert!(
        anchor(&dir, "k").exists(),
        "keyed: the anchor carries the MAC"
    );
    s.close().unwrap();
    drop(s);
    // Keyed, a header without its anchor is refused: the key is what answers deliberate edits.
    fs::remove_file(anchor(&dir, "k")).unwrap();
    let s = open(StoreKind::Jsonl, &dir, true).unwrap();
    refused(s.summary("k"));
    drop(s);

    let s = open_with(&dir.with_file_name("plain"), Durability::Sync);
    let dir = dir.with_file_name("plain");
    thread(&*s, "src", 3);
    s.fork("src", None, "copy", None).unwrap();
    assert!(anchor(&dir, "copy").exists(), "a fork carries history");
    s.fork("src", Some(1), "bare", None).unwrap();
    assert!(!anchor(&dir, "bare").exists(), "a fork of the header alone");
    assert_eq!(lines(&dir, "bare"), 1);
}

#[test]
fn a_second_start_of_the_same_id_is_refused_and_changes_nothing() {
    let (_t, dir) = state();
    let s = open_with(&dir, Durability::Sync);
    thread(&*s, "a", 1);
    let before = fs::read(log(&dir, "a")).unwrap();
    let again = s.start(ThreadStart {
        thread_id: "a".into(),
        ..Default::default()
    });
    assert!(
        matches!(again, Err(StoreError::AlreadyExists(_))),
        "{again:?}"
    );
    s.close().unwrap();
    drop(s);
    // Also across a reopen, where the id is known only from the disk.
    let s = open_with(&dir, Durability::Sync);
    let again = s.start(ThreadStart {
        thread_id: "a".into(),
        ..Default::default()
    });
    assert!(
        matches!(again, Err(StoreError::AlreadyExists(_))),
        "{again:?}"
    );
    assert_eq!(fs::read(log(&dir, "a")).unwrap(), before);
    assert!(!anchor(&dir, "a").exists());
}
