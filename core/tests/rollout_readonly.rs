//! Read-only stores (`StoreOptions::read_only`): inspection changes no byte of the state
//! directory (every file and directory hashed with its mode, size and timestamps before and
//! after), reports what a writable open would repair as damage with its seq and byte offset,
//! refuses every write, and works on a real read-only file system (a read-only bind mount).

#[path = "readonly_support/mod.rs"]
mod readonly_support;
mod rollout_util;

use cc_app_server::rollout::*;
use readonly_support::*;
use rollout_util::*;
use serde_json::json;
use std::fs;
use std::path::{Path, PathBuf};

fn read_only(keyed: bool) -> StoreOptions {
    StoreOptions {
        read_only: true,
        ..options(keyed)
    }
}

/// A closed store in `<tmp>/state` with threads alpha (12 events) and bravo (4).
fn fixture(kind: StoreKind, keyed: bool) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    let s = open(kind, &dir, keyed).unwrap();
    thread(&*s, "alpha", 12);
    thread(&*s, "bravo", 4);
    s.close().unwrap();
    (tmp, dir)
}

fn append_bytes(path: &Path, bytes: &[u8]) {
    use std::io::Write;
    fs::OpenOptions::new()
        .append(true)
        .open(path)
        .unwrap()
        .write_all(bytes)
        .unwrap();
}

/// Every write is refused as such (`threads`: alpha and bravo exist).
fn refuses_writes(s: &dyn RolloutStore, threads: bool) {
    let mut refusals = vec![s
        .start(ThreadStart {
            thread_id: "new".into(),
            ..Default::default()
        })
        .err()];
    if threads {
        refusals.extend([
            s.append("alpha", vec![delta(99)]).err(),
            s.checkpoint("bravo", "c").err(),
            s.set_archived("bravo", true).err(),
            s.fork("bravo", None, "fork", None).err(),
            s.compact("bravo", "summary", 2).err(),
        ]);
    }
    for e in refusals {
        let e = e.expect("a read-only store refuses every write");
        assert!(
            matches!(&e, StoreError::InvalidArgument(m) if m.contains("read-only")),
            "{e}"
        );
    }
    s.flush().unwrap();
}

#[test]
fn a_bad_last_line_is_reported_with_its_seq_and_offset_and_nothing_is_cut() {
    for (case, tail) in [
        (
            "garbage line",
            &b"{\"seq\":13,\"this is\": not an event}\n"[..],
        ),
        ("partial line", &b"{\"seq\":13,\"prevHash\":\"00"[..]),
    ] {
        let (_t, dir) = fixture(StoreKind::Jsonl, false);
        let len = fs::metadata(log(&dir, "alpha")).unwrap().len();
        append_bytes(&log(&dir, "alpha"), tail);
        let before = snapshot(&dir);
        {
            let s = open_store(StoreKind::Jsonl, &dir, read_only(false)).unwrap();
            let (ok, bad) = list_all(&*s).unwrap();
            assert_eq!((ok.len(), bad.len()), (2, 0), "{case}: {bad:?}");
            let r = s.verify("alpha").unwrap();
            assert!(!r.ok(), "{case}: {r:?}");
            assert_eq!(r.first_bad_seq, Some(13), "{case}: {r:?}");
            let why = r.reason.clone().unwrap();
            assert!(
                why.contains("torn tail at seq 13")
                    && why.contains(&format!("from byte offset {len}"))
                    && why.contains(&format!("{} byte(s)", tail.len()))
                    && why.contains("alpha.jsonl.broken"),
                "{case}: {why}"
            );
            assert!(r.repairs.is_empty(), "{case}: nothing was repaired");
            assert!(s.verify("bravo").unwrap().ok());
            // The good prefix is served as it is.
            assert_eq!(read_all(&*s, "alpha").unwrap().len(), 12);
            assert_eq!(s.summary("alpha").unwrap().last_seq, 12);
            refuses_writes(&*s, true);
        }
        assert_unchanged(&before, &dir, case);
        // A writable open repairs it as before (and only then).
        let s = open(StoreKind::Jsonl, &dir, false).unwrap();
        let r = s.verify("alpha").unwrap();
        assert!(r.ok() && r.repairs.len() == 1, "{case}: {r:?}");
        assert!(dir.join("threads/alpha.jsonl.broken").exists());
    }
}

#[test]
fn unauthenticated_keyed_events_and_an_unfinished_start_are_damage_not_repairs() {
    // Keyed: an event appended with every hash recomputed but no seal after the anchor.
    let (_t, dir) = fixture(StoreKind::Jsonl, true);
    let mut evs = jsonl_events(&dir, "alpha");
    let mut extra = evs[evs.len() - 2].clone();
    extra.payload["delta"]["text"] = json!("FORGED");
    evs.push(extra);
    rechain(&mut evs);
    write_events(StoreKind::Jsonl, &dir, "alpha", &evs);
    let n = evs.len() as u64;
    // A thread whose start was torn: its header line alone, incomplete, nothing anchored.
    fs::write(log(&dir, "torn"), b"{\"seq\":1,\"prevHash\":\"000").unwrap();
    let before = snapshot(&dir);
    {
        let s = open_store(StoreKind::Jsonl, &dir, read_only(true)).unwrap();
        let r = s.verify("alpha").unwrap();
        assert_eq!(r.first_bad_seq, Some(n), "{r:?}");
        let why = r.reason.unwrap();
        assert!(
            why.contains(&format!("seq {n}..={n}")) && why.contains("without authentication"),
            "{why}"
        );
        assert_eq!(read_all(&*s, "alpha").unwrap().len() as u64, n - 1);
        match s.verify("torn") {
            Err(StoreError::Corrupt { seq: 1, reason, .. }) => {
                assert!(reason.contains("start never completed"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
        let (_, bad) = list_all(&*s).unwrap();
        assert_eq!(bad.len(), 1, "{bad:?}");
        assert_eq!(bad[0].0, "torn");
    }
    assert_unchanged(&before, &dir, "keyed");
}

#[test]
fn read_only_never_creates_anything_not_even_a_lock_file() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("nowhere");
    for kind in kinds() {
        assert!(open_store(kind, &missing, read_only(false)).is_err());
        assert!(!missing.exists());
    }
    // An empty directory opens as an empty store and stays empty.
    let empty = tmp.path().join("empty");
    fs::create_dir(&empty).unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&empty, fs::Permissions::from_mode(0o700)).unwrap();
    for kind in kinds() {
        for keyed in [false, true] {
            let before = snapshot(&empty);
            {
                let s = open_store(kind, &empty, read_only(keyed)).unwrap();
                assert_eq!(list_all(&*s).unwrap(), (vec![], vec![]));
                assert!(matches!(s.verify("alpha"), Err(StoreError::NotFound(_))));
                refuses_writes(&*s, false);
            }
            assert_unchanged(&before, &empty, "empty");
            assert_eq!(fs::read_dir(&empty).unwrap().count(), 0);
        }
    }
}

#[test]
fn sqlite_is_read_without_writing_with_or_without_a_wal_to_replay() {
    for keyed in [false, true] {
        let (_t, dir) = fixture(StoreKind::Sqlite, keyed);
        // Closed cleanly: no WAL; everything is in the database file.
        assert!(!dir.join("rollout.sqlite3-wal").exists());
        let before = snapshot(&dir);
        {
            let s = open_store(StoreKind::Sqlite, &dir, read_only(keyed)).unwrap();
            for id in ["alpha", "bravo"] {
                let r = s.verify(id).unwrap();
                assert!(r.ok() && r.keyed == keyed, "{r:?}");
            }
            assert_eq!(read_all(&*s, "alpha").unwrap().len(), 12 + keyed as usize);
            refuses_writes(&*s, true);
        }
        assert_unchanged(&before, &dir, "sqlite, no WAL");
    }
    // A copy taken while a writer runs (or after it crashed): the newest events are in the WAL.
    let tmp = tempfile::tempdir().unwrap();
    let live = tmp.path().join("live");
    let s = open(StoreKind::Sqlite, &live, true).unwrap();
    thread(&*s, "alpha", 30);
    let snap = tmp.path().join("snap");
    fs::create_dir(&snap).unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&snap, fs::Permissions::from_mode(0o700)).unwrap();
    for e in fs::read_dir(&live).unwrap() {
        let e = e.unwrap();
        fs::copy(e.path(), snap.join(e.file_name())).unwrap();
    }
    let expected = read_all(&*s, "alpha").unwrap();
    drop(s);
    assert!(
        fs::metadata(snap.join("rollout.sqlite3-wal"))
            .unwrap()
            .len()
            > 0,
        "the copy must hold a WAL to replay"
    );
    let before = snapshot(&snap);
    {
        let s = open_store(StoreKind::Sqlite, &snap, read_only(true)).unwrap();
        assert_eq!(read_all(&*s, "alpha").unwrap(), expected);
        assert!(s.verify("alpha").unwrap().ok());
    }
    assert_unchanged(&before, &snap, "sqlite, hot WAL");
}

#[test]
fn readers_share_the_directory_and_exclude_writers() {
    for kind in kinds() {
        let (_t, dir) = fixture(kind, false);
        let a = open_store(kind, &dir, read_only(false)).unwrap();
        let b = open_store(kind, &dir, read_only(false)).unwrap();
        assert!(matches!(
            open(kind, &dir, false),
            Err(StoreError::Locked(_))
        ));
        drop(a);
        // One reader closing must not drop the lock the other still relies on.
        assert!(matches!(
            open(kind, &dir, false),
            Err(StoreError::Locked(_))
        ));
        assert!(b.verify("alpha").unwrap().ok());
        drop(b);
        let w = open(kind, &dir, false).unwrap();
        assert!(matches!(
            open_store(kind, &dir, read_only(false)),
            Err(StoreError::Locked(_))
        ));
        drop(w);
        open_store(kind, &dir, read_only(false)).unwrap();
    }
}

#[test]
fn both_stores_verify_on_a_read_only_file_system() {
    for kind in kinds() {
        for keyed in [false, true] {
            let (t, dir) = fixture(kind, keyed);
            if kind == StoreKind::Jsonl {
                append_bytes(&log(&dir, "bravo"), b"{\"torn");
            }
            let target = t.path().join("ro");
            let mount = ReadOnlyMount::new(&dir, &target);
            let at = if mount.is_some() {
                // Proof that it is read-only for us, root included.
                assert!(fs::write(target.join("probe"), b"x").is_err());
                target.clone()
            } else {
                chmod_read_only(&dir);
                dir.clone()
            };
            let before = snapshot(&dir);
            {
                let s = open_store(kind, &at, read_only(keyed)).unwrap();
                let r = s.verify("alpha").unwrap();
                assert!(r.ok() && r.keyed == keyed, "{kind:?} {keyed}: {r:?}");
                let r = s.verify("bravo").unwrap();
                if kind == StoreKind::Jsonl {
                    assert_eq!(r.first_bad_seq, Some(5), "{r:?}");
                    assert!(r.reason.unwrap().contains("torn tail"));
                } else {
                    assert!(r.ok(), "{r:?}");
                }
                refuses_writes(&*s, true);
            }
            // A writable open is refused by the file system, not half done (root ignores the
            // permission bits of the fallback).
            if writes_fail(&mount) {
                assert!(open(kind, &at, keyed).is_err());
            }
            assert_unchanged(&before, &dir, "read-only mount");
            drop(mount);
        }
    }
}
