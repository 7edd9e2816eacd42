//! Damage done by hand to real files: torn tails that must be repaired, corruption and
//! truncation that must be refused with the exact seq, and the third-party Python verifier run
//! against what the store wrote.

use cc_app_server::rollout::*;
use serde_json::{json, Map};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

struct Fixture {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
}

impl Fixture {
    /// A JSONL thread "x" with `n` events (header included), store closed.
    fn new(n: usize) -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state");
        let s = open_jsonl(&dir, StoreOptions::default()).unwrap();
        let mut meta = Map::new();
        meta.insert(
            "float".into(),
            json!([0.5, 1e-7, 0.00001, 1e21, -2.25, 12345.678]),
        );
        meta.insert(
            "text".into(),
            json!("tab\t nl\n quote\" nul\u{0} é 😀 \u{2028}"),
        );
        s.start(ThreadStart {
            thread_id: "x".into(),
            title: Some("T".into()),
            metadata: meta,
            forked_from: None,
        })
        .unwrap();
        for i in 1..n {
            s.append("x", vec![NewEvent::new(json!({"type": "itemDelta", "turnId": "t", "itemId": format!("i{i}"), "delta": {"type": "text", "text": format!("line {i}")}}))])
                .unwrap();
        }
        drop(s);
        Fixture { _tmp: tmp, dir }
    }
    fn log(&self) -> PathBuf {
        self.dir.join("threads/x.jsonl")
    }
    fn anchor(&self) -> PathBuf {
        self.dir.join("anchors/x.head")
    }
    fn open(&self) -> JsonlRolloutStore {
        open_jsonl(&self.dir, StoreOptions::default()).unwrap()
    }
    fn bytes(&self) -> Vec<u8> {
        fs::read(self.log()).unwrap()
    }
    /// Byte range of the line holding `seq`.
    fn line(&self, seq: usize) -> std::ops::Range<usize> {
        let b = self.bytes();
        let starts: Vec<usize> = std::iter::once(0)
            .chain(
                b.iter()
                    .enumerate()
                    .filter(|(_, c)| **c == b'\n')
                    .map(|(i, _)| i + 1),
            )
            .collect();
        starts[seq - 1]..starts[seq]
    }
    /// Appends `more` events and restores the anchor from before, as if the process died after
    /// the log was written but before the anchor moved: the legitimate lag after a crash.
    fn lagging_anchor(&self, more: usize) {
        let saved = fs::read(self.anchor()).unwrap();
        let s = self.open();
        s.append(
            "x",
            (0..more)
                .map(|i| NewEvent::new(json!({"type": "checkpoint", "label": format!("late {i}")})))
                .collect(),
        )
        .unwrap();
        drop(s);
        fs::write(self.anchor(), saved).unwrap();
    }
}

fn read_all(s: &dyn RolloutStore, id: &str) -> Result<Vec<StoredEvent>, StoreError> {
    let mut out = Vec::new();
    loop {
        let page = s.read(id, out.len() as u64, MAX_READ_LIMIT)?;
        out.extend(page.events);
        if !page.has_more {
            return Ok(out);
        }
    }
}

fn python_verify(log: &Path, anchor: Option<&Path>) -> (bool, String) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/verify_rollout.py");
    let mut cmd = Command::new("python3");
    cmd.arg(script).arg(log);
    if let Some(a) = anchor {
        cmd.arg(a);
    }
    let out = cmd.output().expect("python3 runs");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn lines_on_disk_have_the_schema_field_order_and_the_python_verifier_agrees() {
    let f = Fixture::new(4);
    let text = String::from_utf8(f.bytes()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4);
    assert!(text.ends_with('\n'));
    for (i, line) in lines.iter().enumerate() {
        let ev: StoredEvent = serde_json::from_str(line).unwrap();
        assert_eq!(ev.seq, i as u64 + 1);
        // Byte-exact: serde's field order is the schema's and nothing else is on the line.
        assert_eq!(*line, serde_json::to_string(&ev).unwrap());
        let want = format!("{{\"seq\":{},\"prevHash\":\"{}\",\"hash\":\"{}\",\"time\":\"{}\",\"traceId\":null,\"parentId\":null,\"idempotencyKey\":null,\"payload\":{{\"type\":", ev.seq, ev.prev_hash, ev.hash, ev.time);
        assert!(line.starts_with(&want), "{line}");
    }
    assert!(lines[0].contains(&format!("\"prevHash\":\"{ZERO_HASH}\"")));
    let (ok, out) = python_verify(&f.log(), Some(&f.anchor()));
    assert!(ok, "{out}");
    assert!(out.contains("ok: 4 events"), "{out}");
}

#[test]
fn python_verifier_names_the_first_bad_seq_of_a_tampered_file() {
    let f = Fixture::new(6);
    let original = f.bytes();
    let line4 = f.line(4);
    let mut b = f.bytes();
    let r = f.line(3);
    let pos = r.start
        + String::from_utf8_lossy(&b[r.clone()])
            .find("line 2")
            .unwrap()
        + 5;
    b[pos] = b'9';
    // A copy elsewhere, named after its thread (the verifier binds a log to its file name).
    fs::create_dir_all(f.dir.join("copy")).unwrap();
    let tampered = f.dir.join("copy/x.jsonl");
    fs::write(&tampered, &b).unwrap();
    let (ok, out) = python_verify(&tampered, None);
    assert!(!ok);
    assert!(out.contains("first bad seq 3: hash mismatch"), "{out}");
    // The store agrees on the seq.
    fs::write(f.log(), &b).unwrap();
    let s = f.open();
    let report = s.verify("x").unwrap();
    assert_eq!((report.first_bad_seq, report.events), (Some(3), 2));
    match read_all(&s, "x") {
        Err(StoreError::Corrupt { seq: 3, reason, .. }) => {
            assert!(reason.contains("hash"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    // A whole line dropped from the middle: the next seq is named.
    let mut b = original;
    b.drain(line4);
    fs::write(&tampered, &b).unwrap();
    let (ok, out) = python_verify(&tampered, None);
    assert!(!ok && out.contains("first bad seq 4: seq is 5"), "{out}");
}

#[test]
fn partial_last_line_is_cut_saved_and_recorded() {
    let f = Fixture::new(5);
    let garbage = br#"{"seq":6,"prevHash":"ab"#;
    let mut b = f.bytes();
    let good_len = b.len();
    b.extend_from_slice(garbage);
    fs::write(f.log(), &b).unwrap();
    let s = f.open();
    let sum = s.summary("x").unwrap();
    assert_eq!(sum.last_seq, 6);
    let ev = read_all(&s, "x").unwrap().pop().unwrap();
    assert_eq!(
        ev.payload,
        json!({"type": "repaired", "reason": "partial last line (no newline)", "truncatedBytes": garbage.len(), "brokenFile": "x.jsonl.broken"})
    );
    assert_eq!(
        fs::read(f.dir.join("threads/x.jsonl.broken")).unwrap(),
        garbage
    );
    let bytes = f.bytes();
    assert_eq!(&bytes[..good_len], &b[..good_len]);
    let report = s.verify("x").unwrap();
    assert!(report.ok(), "{report:?}");
    assert_eq!(report.repairs.len(), 1);
    assert!(
        report.repairs[0].contains("x.jsonl.broken"),
        "{:?}",
        report.repairs
    );
    drop(s);
    assert!(python_verify(&f.log(), Some(&f.anchor())).0);
    // A second torn tail gets a numbered broken file.
    let mut b = f.bytes();
    b.extend_from_slice(b"\0\0\0\0");
    fs::write(f.log(), &b).unwrap();
    let s = f.open();
    assert_eq!(s.summary("x").unwrap().last_seq, 7);
    assert_eq!(
        fs::read(f.dir.join("threads/x.jsonl.broken.1")).unwrap(),
        b"\0\0\0\0"
    );
}

#[test]
fn garbage_line_at_the_very_end_is_cut() {
    let f = Fixture::new(3);
    let mut b = f.bytes();
    b.extend_from_slice(b"not json at all\n");
    fs::write(f.log(), &b).unwrap();
    let s = f.open();
    let all = read_all(&s, "x").unwrap();
    assert_eq!(all.len(), 4);
    assert_eq!(all[3].kind(), "repaired");
    assert_eq!(all[3].payload["truncatedBytes"], json!(16));
}

#[test]
fn unanchored_last_line_with_a_bad_hash_is_cut_but_earlier_unanchored_events_stay() {
    let f = Fixture::new(5);
    f.lagging_anchor(3); // seqs 6, 7, 8 written, anchor still at 5
    let mut b = f.bytes();
    let r = f.line(8);
    let pos = r.start
        + String::from_utf8_lossy(&b[r.clone()])
            .find("late 2")
            .unwrap();
    b[pos] = b'L';
    fs::write(f.log(), &b).unwrap();
    let s = f.open();
    let all = read_all(&s, "x").unwrap();
    assert_eq!(all.len(), 8);
    assert_eq!(all[6].payload["label"], json!("late 1"));
    assert_eq!(
        (all[7].kind(), all[7].payload["reason"].clone()),
        ("repaired", json!("hash does not match the event's content"))
    );
    assert!(s.verify("x").unwrap().ok());
}

#[test]
fn truncation_mid_line_is_a_torn_tail_only_beyond_the_anchor() {
    // Beyond the anchor (the crash-time state): repaired.
    let f = Fixture::new(5);
    f.lagging_anchor(3);
    let r = f.line(8);
    fs::OpenOptions::new()
        .write(true)
        .open(f.log())
        .unwrap()
        .set_len((r.start + 10) as u64)
        .unwrap();
    let s = f.open();
    let all = read_all(&s, "x").unwrap();
    assert_eq!(
        (
            all.len(),
            all[7].kind(),
            all[7].payload["truncatedBytes"].clone()
        ),
        (8, "repaired", json!(10))
    );
    drop(s);
    // Inside the anchored (acknowledged) history: refused.
    let f = Fixture::new(5);
    let r = f.line(5);
    fs::OpenOptions::new()
        .write(true)
        .open(f.log())
        .unwrap()
        .set_len((r.start + 10) as u64)
        .unwrap();
    match open_jsonl(&f.dir, StoreOptions::default())
        .unwrap()
        .summary("x")
    {
        Err(StoreError::AnchorMismatch { reason, .. }) => {
            assert!(reason.contains("cut off"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn deleting_the_last_line_is_an_anchor_mismatch() {
    let f = Fixture::new(5);
    let r = f.line(5);
    let mut b = f.bytes();
    b.truncate(r.start);
    fs::write(f.log(), &b).unwrap();
    let s = f.open();
    let e = s.summary("x").unwrap_err();
    assert!(matches!(e, StoreError::AnchorMismatch { .. }), "{e}");
    assert!(e.to_string().contains("restore"), "{e}");
    assert!(matches!(
        s.append(
            "x",
            vec![NewEvent::new(json!({"type": "checkpoint", "label": "l"}))]
        ),
        Err(StoreError::AnchorMismatch { .. })
    ));
    // The log was left as found.
    assert_eq!(f.bytes(), b);
    let (ok, out) = python_verify(&f.log(), Some(&f.anchor()));
    assert!(!ok && out.contains("anchor seq 5"), "{out}");
}

#[test]
fn a_flipped_byte_in_the_middle_is_refused_with_its_seq_never_skipped() {
    let f = Fixture::new(8);
    let mut b = f.bytes();
    let r = f.line(3);
    let pos = r.start
        + String::from_utf8_lossy(&b[r.clone()])
            .find("line 2")
            .unwrap();
    b[pos] = b'L';
    fs::write(f.log(), &b).unwrap();
    let s = f.open();
    assert!(matches!(
        read_all(&s, "x"),
        Err(StoreError::Corrupt { seq: 3, .. })
    ));
    assert!(
        matches!(s.read("x", 5, 2), Err(StoreError::Corrupt { seq: 3, .. })),
        "the first read checks the whole chain"
    );
    let report = s.verify("x").unwrap();
    assert_eq!(report.first_bad_seq, Some(3));
    // Corruption inside the un-anchored region with good lines after it is not a torn tail.
    let f = Fixture::new(5);
    f.lagging_anchor(3);
    let mut b = f.bytes();
    let r = f.line(6);
    b[r.start + 3] = b'X';
    fs::write(f.log(), &b).unwrap();
    match f.open().summary("x") {
        Err(StoreError::Corrupt { seq: 6, reason, .. }) => {
            assert!(reason.contains("valid event line"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(f.bytes(), b, "refusal must not modify the log");
}

#[test]
fn a_replaced_file_is_detected_by_the_anchor() {
    let f = Fixture::new(5);
    let s = f.open();
    s.start(ThreadStart {
        thread_id: "y".into(),
        ..Default::default()
    })
    .unwrap();
    for _ in 0..6 {
        s.checkpoint("y", "other").unwrap();
    }
    drop(s);
    fs::copy(f.dir.join("threads/y.jsonl"), f.log()).unwrap();
    // Refused by name before the anchor is even consulted: the header says it is y's log.
    match f.open().summary("x") {
        Err(StoreError::Corrupt { seq: 1, reason, .. }) => {
            assert!(
                reason.contains("\"y\"") && reason.contains("another"),
                "{reason}"
            )
        }
        other => panic!("{other:?}"),
    }
    // The log vanished while its anchor stayed.
    fs::remove_file(f.log()).unwrap();
    assert!(matches!(
        f.open().summary("x"),
        Err(StoreError::AnchorMismatch { .. })
    ));
}

#[test]
fn a_missing_anchor_is_refused_and_rebuilt_only_when_accepted() {
    let f = Fixture::new(5);
    let before = fs::read(f.anchor()).unwrap();
    fs::remove_file(f.anchor()).unwrap();
    assert!(matches!(
        f.open().summary("x"),
        Err(StoreError::AnchorMismatch { .. })
    ));
    let s = open_jsonl(
        &f.dir,
        StoreOptions {
            accept_unanchored: true,
            ..StoreOptions::default()
        },
    )
    .unwrap();
    // The acceptance itself is recorded, as seq 6.
    assert_eq!(s.summary("x").unwrap().last_seq, 6);
    let report = s.verify("x").unwrap();
    assert!(
        report.ok() && report.warnings[0].contains("anchor file is missing"),
        "{report:?}"
    );
    drop(s);
    let a = fs::read(f.anchor()).unwrap();
    assert_eq!(a.len(), before.len());
    assert!(String::from_utf8_lossy(&a).contains("seq=6 "));
    assert!(f.open().verify("x").unwrap().ok());
}

#[test]
fn a_torn_header_without_an_anchor_means_the_start_never_happened() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    drop(open_jsonl(&dir, StoreOptions::default()).unwrap());
    fs::write(dir.join("threads/z.jsonl"), br#"{"seq":1,"prevHash":"00"#).unwrap();
    let s = open_jsonl(&dir, StoreOptions::default()).unwrap();
    assert!(matches!(s.summary("z"), Err(StoreError::NotFound(_))));
    assert!(dir.join("threads/z.jsonl.broken").exists());
    s.start(ThreadStart {
        thread_id: "z".into(),
        ..Default::default()
    })
    .unwrap();
    assert!(s.verify("z").unwrap().ok());
}

#[test]
fn anchor_slots_survive_a_torn_anchor_write() {
    let f = Fixture::new(5);
    let mut a = fs::read(f.anchor()).unwrap();
    // Tear the newest slot: the other one (one batch behind) is used, which is legal lag.
    let gen = |c: &[u8]| -> u64 {
        String::from_utf8_lossy(c)
            .split(' ')
            .find_map(|p| p.strip_prefix("gen=").map(|g| g.parse().unwrap_or(0)))
            .unwrap_or(0)
    };
    let newest = if gen(&a[..512]) > gen(&a[512..]) {
        0
    } else {
        1
    };
    for byte in &mut a[newest * 512 + 20..newest * 512 + 40] {
        *byte = b'#';
    }
    fs::write(f.anchor(), &a).unwrap();
    let s = f.open();
    // Served as it is, with the fallback recorded (seq 6) and reported.
    assert_eq!(s.summary("x").unwrap().last_seq, 6);
    let report = s.verify("x").unwrap();
    assert!(
        report.ok() && report.warnings[0].contains("fell back"),
        "{report:?}"
    );
}

#[test]
fn sqlite_refusals_match_jsonl() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    let s = open_sqlite(&dir, StoreOptions::default()).unwrap();
    s.start(ThreadStart {
        thread_id: "q".into(),
        ..Default::default()
    })
    .unwrap();
    for i in 0..6 {
        s.checkpoint("q", &format!("c{i}")).unwrap();
    }
    drop(s);
    let db = dir.join("rollout.sqlite3");
    let c = rusqlite::Connection::open(&db).unwrap();
    c.execute(
        "UPDATE events SET payload = replace(payload, 'c1', 'C1') WHERE seq = 3",
        [],
    )
    .unwrap();
    drop(c);
    let s = open_sqlite(&dir, StoreOptions::default()).unwrap();
    assert!(matches!(
        read_all(&s, "q"),
        Err(StoreError::Corrupt { seq: 3, .. })
    ));
    assert_eq!(s.verify("q").unwrap().first_bad_seq, Some(3));
    drop(s);
    let c = rusqlite::Connection::open(&db).unwrap();
    c.execute("DELETE FROM events WHERE seq = 7", []).unwrap();
    drop(c);
    let s = open_sqlite(&dir, StoreOptions::default()).unwrap();
    assert!(matches!(
        s.summary("q"),
        Err(StoreError::AnchorMismatch { .. })
    ));
}

#[test]
fn an_unopenable_sqlite_database_says_so_and_jsonl_elsewhere_still_works() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    fs::create_dir(&dir).unwrap();
    std::os::unix::fs::PermissionsExt::set_mode(
        &mut fs::metadata(&dir).unwrap().permissions(),
        0o700,
    );
    fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    fs::write(dir.join("rollout.sqlite3"), vec![0x42u8; 8192]).unwrap();
    match open_store(StoreKind::Sqlite, &dir, StoreOptions::default()) {
        Err(StoreError::Sqlite(m)) => {
            assert!(m.contains("rollout.sqlite3") && m.contains("JSONL"), "{m}");
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("opened a garbage database"),
    }
    let other = tmp.path().join("other");
    let s = open_store(StoreKind::Jsonl, &other, StoreOptions::default()).unwrap();
    s.start(ThreadStart {
        thread_id: "ok".into(),
        ..Default::default()
    })
    .unwrap();
    assert!(s.verify("ok").unwrap().ok());
}
