//! Store identity (`STORE_ID`): a keyed thread copied into another store that uses the same key
//! is refused by name, while the store itself, a copy of its whole state directory and a reopen
//! still verify; stores written before store ids keep verifying as they were written and can be
//! bound; on both stores, and what the independent verifier reads is unchanged.

mod rollout_util;

use cc_app_server::rollout::*;
use hmac::{Hmac, Mac};
use rollout_util::*;
use sha2::Sha256;
use std::fs;
use std::path::{Path, PathBuf};

fn store_id(dir: &Path) -> String {
    let text = fs::read_to_string(dir.join(layout::STORE_ID_FILE)).unwrap();
    let id = text.strip_suffix('\n').unwrap().to_string();
    assert!(is_store_id(&id), "{text:?}");
    id
}

/// A closed keyed store at `<tmp>/<name>` holding thread `id` (12 events).
fn keyed_store(tmp: &Path, name: &str, kind: StoreKind, id: &str) -> PathBuf {
    let dir = tmp.join(name);
    let s = open(kind, &dir, true).unwrap();
    thread(&*s, id, 12);
    s.close().unwrap();
    dir
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else if e.file_name() != layout::LOCK_FILE {
            fs::copy(e.path(), &target).unwrap();
        }
    }
}

/// Copies thread `id` from one state directory into another (files, or rows with SQL).
fn transplant(kind: StoreKind, from: &Path, to: &Path, id: &str, with_binding: bool) {
    match kind {
        StoreKind::Jsonl => {
            fs::copy(log(from, id), log(to, id)).unwrap();
            fs::copy(anchor(from, id), anchor(to, id)).unwrap();
        }
        StoreKind::Sqlite => {
            let c = db(to);
            c.execute(
                "ATTACH DATABASE ?1 AS src",
                [from.join(layout::SQLITE_FILE).to_str().unwrap()],
            )
            .unwrap();
            let mut tables = vec!["events", "threads"];
            if with_binding {
                tables.push("store_bindings");
            }
            for t in tables {
                c.execute(
                    &format!("INSERT INTO main.{t} SELECT * FROM src.{t} WHERE thread_id = ?1"),
                    [id],
                )
                .unwrap();
            }
        }
    }
}

fn verdict(s: &dyn RolloutStore, id: &str) -> Result<VerifyReport, String> {
    s.verify(id).map_err(|e| e.to_string())
}

#[test]
fn a_keyed_thread_copied_into_another_store_is_refused_by_name() {
    for kind in kinds() {
        let tmp = tempfile::tempdir().unwrap();
        let a = keyed_store(tmp.path(), "a", kind, "alpha");
        let b = keyed_store(tmp.path(), "b", kind, "bravo");
        let (ida, idb) = (store_id(&a), store_id(&b));
        assert_ne!(ida, idb);
        transplant(kind, &a, &b, "alpha", true);
        let s = open(kind, &b, true).unwrap();
        let why = verdict(&*s, "alpha").unwrap_err();
        assert!(
            why.contains(&format!("thread was written by another store (id {ida})"))
                && why.contains(&format!("this store is id {idb}")),
            "{kind:?}: {why}"
        );
        let (ok, bad) = list_all(&*s).unwrap();
        assert_eq!(ok, vec!["bravo".to_string()]);
        assert!(bad[0].1.contains("another store"), "{bad:?}");
        assert!(verdict(&*s, "bravo").unwrap().ok());
        drop(s);
        // Accepting unanchored threads does not adopt another store's thread.
        let s = accepting(kind, &b, true);
        assert!(verdict(&*s, "alpha")
            .unwrap_err()
            .contains("written by another store"));
        drop(s);
        // The store itself, reopened, and a copy of its whole state directory still verify.
        let c = tmp.path().join("c");
        copy_dir(&a, &c);
        for dir in [&a, &c] {
            let s = open(kind, dir, true).unwrap();
            let r = verdict(&*s, "alpha").unwrap();
            assert!(
                r.ok() && r.keyed && r.warnings.is_empty(),
                "{kind:?}: {r:?}"
            );
            s.append("alpha", vec![delta(50)]).unwrap();
            drop(s);
            let s = open(kind, dir, true).unwrap();
            assert!(verdict(&*s, "alpha").unwrap().ok());
        }
        assert_eq!(store_id(&c), ida);
        // The independent verifier reads the bound anchors as it read unbound ones.
        let key = tmp.path().join("key");
        fs::write(&key, KEY).unwrap();
        let (rc, out) = verify_rollout_py(&[
            "--state-dir",
            a.to_str().unwrap(),
            "--key-file",
            key.to_str().unwrap(),
        ]);
        assert_eq!(rc, 0, "{kind:?}: {out}");
        assert!(out.contains("alpha ok") && out.contains("(keyed)"), "{out}");
    }
}

#[test]
fn a_copy_that_lost_its_binding_or_its_store_id_is_refused_and_says_why() {
    // SQLite: the rows copied without their store_bindings row.
    let tmp = tempfile::tempdir().unwrap();
    let a = keyed_store(tmp.path(), "a", StoreKind::Sqlite, "alpha");
    let b = keyed_store(tmp.path(), "b", StoreKind::Sqlite, "bravo");
    transplant(StoreKind::Sqlite, &a, &b, "alpha", false);
    let s = open(StoreKind::Sqlite, &b, true).unwrap();
    let why = verdict(&*s, "alpha").unwrap_err();
    assert!(
        why.contains(&format!("not bound to this store (id {})", store_id(&b)))
            && why.contains("accept_unanchored"),
        "{why}"
    );
    drop(s);
    // A binding whose MAC does not verify (its store id rewritten by hand) is a forgery.
    let c = db(&a);
    c.execute(
        "UPDATE store_bindings SET store_id = ?1 WHERE thread_id = 'alpha'",
        [store_id(&b)],
    )
    .unwrap();
    drop(c);
    let s = open(StoreKind::Sqlite, &a, true).unwrap();
    let why = verdict(&*s, "alpha").unwrap_err();
    assert!(
        why.contains("store binding") && why.contains("does not verify"),
        "{why}"
    );
    drop(s);
    // The store id file lost: the thread names the store it belongs to.
    for kind in kinds() {
        let a = keyed_store(tmp.path(), &format!("lost-{kind:?}"), kind, "alpha");
        let id = store_id(&a);
        fs::remove_file(a.join(layout::STORE_ID_FILE)).unwrap();
        let s = open(kind, &a, true).unwrap();
        let why = verdict(&*s, "alpha").unwrap_err();
        assert!(
            why.contains(&format!("written by another store (id {id})"))
                && why.contains(&format!("it must read {id}")),
            "{kind:?}: {why}"
        );
        drop(s);
        // No new id replaces it: the directory holds keyed threads.
        assert!(!a.join(layout::STORE_ID_FILE).exists());
        fs::write(a.join(layout::STORE_ID_FILE), format!("{id}\n")).unwrap();
        let s = open(kind, &a, true).unwrap();
        assert!(verdict(&*s, "alpha").unwrap().ok());
        drop(s);
        // A damaged id file is refused in keyed mode, ignored unkeyed.
        fs::write(a.join(layout::STORE_ID_FILE), b"not an id\n").unwrap();
        let e = open(kind, &a, true).err().expect("refused").to_string();
        assert!(e.contains("STORE_ID") && e.contains("damaged"), "{e}");
        open(kind, &a, false).unwrap();
    }
}

type HmacSha256 = Hmac<Sha256>;

/// Rewrites both slots of a keyed JSONL anchor the way a store written before store ids wrote
/// them: no `store=`, the MAC and the check field recomputed with the key.
fn unbind_anchor(path: &Path, id: &str) {
    let mut file = fs::read(path).unwrap();
    for slot in file.chunks_mut(ANCHOR_SLOT) {
        let text = String::from_utf8_lossy(slot).trim_end().to_string();
        let Some((body, _)) = text.rsplit_once(" check=") else {
            continue;
        };
        let (signed, _) = body.split_once(" mac=").unwrap();
        let signed: String = signed
            .split(' ')
            .filter(|p| !p.starts_with("store="))
            .collect::<Vec<_>>()
            .join(" ");
        let mut m = HmacSha256::new_from_slice(&KEY).unwrap();
        m.update(b"cc-rollout-v1 anchor\n");
        m.update(format!("{id}\n{signed}").as_bytes());
        let mac = hex::encode(m.finalize().into_bytes());
        let body = format!("{signed} mac={mac}");
        let check = &cc_agent_protocol::sha256_hex(body.as_bytes())[..16];
        let mut out = format!("{body} check={check}").into_bytes();
        out.resize(ANCHOR_SLOT - 1, b' ');
        out.push(b'\n');
        slot.copy_from_slice(&out);
    }
    fs::write(path, file).unwrap();
}

/// Turns a keyed store into one written before store ids: no id file, no binding anywhere.
fn make_legacy(kind: StoreKind, dir: &Path, ids: &[&str]) {
    fs::remove_file(dir.join(layout::STORE_ID_FILE)).unwrap();
    match kind {
        StoreKind::Jsonl => {
            for id in ids {
                unbind_anchor(&anchor(dir, id), id);
            }
        }
        StoreKind::Sqlite => {
            db(dir).execute("DELETE FROM store_bindings", []).unwrap();
        }
    }
}

#[test]
fn stores_written_before_store_ids_keep_verifying_and_can_be_bound() {
    for kind in kinds() {
        let tmp = tempfile::tempdir().unwrap();
        let old = keyed_store(tmp.path(), "old", kind, "alpha");
        make_legacy(kind, &old, &["alpha"]);
        // It keeps verifying (said to be unbound), and keeps being written as it was.
        for round in 0..2 {
            let s = open(kind, &old, true).unwrap();
            let r = verdict(&*s, "alpha").unwrap();
            assert!(r.ok() && r.keyed, "{kind:?}: {r:?}");
            assert!(
                r.warnings.iter().any(|w| w.contains("no store id")),
                "{kind:?}: {r:?}"
            );
            if round == 0 {
                s.append("alpha", vec![delta(70)]).unwrap();
            }
            drop(s);
            assert!(!old.join(layout::STORE_ID_FILE).exists());
        }
        // Its threads are refused by a store with an id...
        let new = keyed_store(tmp.path(), "new", kind, "bravo");
        transplant(kind, &old, &new, "alpha", false);
        let s = open(kind, &new, true).unwrap();
        let why = verdict(&*s, "alpha").unwrap_err();
        assert!(
            why.contains("not bound to this store") && why.contains("without a store id"),
            "{kind:?}: {why}"
        );
        drop(s);
        // ...and adopted by it only when accepted, bound from then on.
        let s = accepting(kind, &new, true);
        let r = verdict(&*s, "alpha").unwrap();
        assert!(r.ok(), "{r:?}");
        assert!(
            r.warnings
                .iter()
                .any(|w| w.contains("adopted into this store")),
            "{r:?}"
        );
        drop(s);
        let s = open(kind, &new, true).unwrap();
        let r = verdict(&*s, "alpha").unwrap();
        assert!(r.ok() && r.warnings.is_empty(), "{kind:?}: {r:?}");
        drop(s);
        // Binding the old store itself: write an id, then accept its threads once.
        fs::write(old.join(layout::STORE_ID_FILE), "0123456789abcdef\n").unwrap();
        let s = open(kind, &old, true).unwrap();
        assert!(verdict(&*s, "alpha").is_err());
        drop(s);
        let s = accepting(kind, &old, true);
        assert!(verdict(&*s, "alpha").unwrap().ok());
        drop(s);
        let s = open(kind, &old, true).unwrap();
        let r = verdict(&*s, "alpha").unwrap();
        assert!(r.ok() && r.warnings.is_empty(), "{kind:?}: {r:?}");
        if kind == StoreKind::Jsonl {
            let text =
                String::from_utf8_lossy(&fs::read(anchor(&old, "alpha")).unwrap()).into_owned();
            assert!(text.contains("store=0123456789abcdef"), "{text}");
        }
    }
}

#[test]
fn the_store_id_is_made_once_by_a_keyed_store_and_only_then() {
    use std::os::unix::fs::PermissionsExt;
    for kind in kinds() {
        let tmp = tempfile::tempdir().unwrap();
        // Unkeyed stores need none and make none.
        let plain = tmp.path().join("plain");
        let s = open(kind, &plain, false).unwrap();
        thread(&*s, "alpha", 3);
        drop(s);
        assert!(!plain.join(layout::STORE_ID_FILE).exists());
        // The first keyed open of a directory without keyed threads makes one (a stale
        // temporary file from a crash is replaced), exactly 16 hex digits and a newline, 0600.
        fs::write(plain.join("STORE_ID.tmp"), b"torn").unwrap();
        let s = open(kind, &plain, true).unwrap();
        drop(s);
        let raw = fs::read(plain.join(layout::STORE_ID_FILE)).unwrap();
        assert_eq!(raw.len(), 17);
        let id = store_id(&plain);
        assert!(!plain.join("STORE_ID.tmp").exists());
        let mode = fs::metadata(plain.join(layout::STORE_ID_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        // Its unkeyed threads are adopted into it only when accepted (as before), bound then.
        let s = open(kind, &plain, true).unwrap();
        assert!(verdict(&*s, "alpha").unwrap_err().contains("no MAC"));
        drop(s);
        let s = accepting(kind, &plain, true);
        assert!(verdict(&*s, "alpha").unwrap().ok());
        drop(s);
        for _ in 0..2 {
            let s = open(kind, &plain, true).unwrap();
            let r = verdict(&*s, "alpha").unwrap();
            assert!(
                r.ok() && r.keyed && r.warnings.is_empty(),
                "{kind:?}: {r:?}"
            );
            drop(s);
            assert_eq!(store_id(&plain), id, "reopening keeps the id");
        }
        // A read-only open makes none, keyed or not.
        let fresh = tmp.path().join("fresh");
        fs::create_dir(&fresh).unwrap();
        fs::set_permissions(&fresh, fs::Permissions::from_mode(0o700)).unwrap();
        let ro = StoreOptions {
            read_only: true,
            ..options(true)
        };
        drop(open_store(kind, &fresh, ro).unwrap());
        assert_eq!(fs::read_dir(&fresh).unwrap().count(), 0);
    }
}

#[test]
fn the_longest_thread_id_still_fits_a_bound_anchor_slot() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("s");
    let id = "a".repeat(MAX_ID_LEN);
    let s = open(StoreKind::Jsonl, &dir, true).unwrap();
    thread(&*s, &id, 20);
    drop(s);
    let raw = fs::read(anchor(&dir, &id)).unwrap();
    let text = String::from_utf8_lossy(&raw[..ANCHOR_SLOT]).into_owned();
    assert!(text.contains(" store=") && text.ends_with('\n'), "{text}");
    let used = text.trim_end().len();
    // Room left for the numbers to grow: seq, offset, generation and the compaction fields
    // each gain a digit per tenfold; 160-character ids leave this many bytes for that.
    let spare = ANCHOR_SLOT - 1 - used;
    assert!(spare >= 20, "{used} bytes used, {spare} spare: {text}");
    let s = open(StoreKind::Jsonl, &dir, true).unwrap();
    assert!(verdict(&*s, &id).unwrap().ok());
}
