//! The non-serving commands as a user runs them: `rollout list|show|verify` (readable and
//! `--json`, tamper detection naming the first bad seq, a locked or missing directory), `demo`,
//! `schema digest`, and `--help` everywhere.

mod common;

use common::*;
use serde_json::{json, Value};
use std::path::Path;

/// A state directory with two threads (one forked, one archived) written by a real server.
fn populated(store: &str) -> tempfile::TempDir {
    let dir = state_dir();
    let mut p = Proc::serve(dir.path(), &["--store", store]);
    p.init();
    p.req(
        "thread/start",
        json!({"threadId": "alpha", "title": "First thread"}),
    );
    p.req(
        "turn/start",
        json!({"threadId": "alpha", "input": [{"type": "text", "text": "hello there"}]}),
    );
    p.wait_method("turn/completed");
    p.req(
        "thread/fork",
        json!({"threadId": "alpha", "newThreadId": "beta"}),
    );
    p.req("thread/archive", json!({"threadId": "beta"}));
    p.close_stdin();
    assert!(p.wait_exit(TIMEOUT).success());
    dir
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn rollout_list_show_verify_read_well_and_as_json() {
    for store in ["jsonl", "sqlite"] {
        let dir = populated(store);
        let d = s(dir.path());
        // The store kind is detected from the directory.
        let (rc, out, err) = run(&["rollout", "list", "--state-dir", d]);
        assert_eq!(rc, 0, "{err}");
        assert!(out.starts_with("THREAD"), "{out}");
        assert!(
            out.contains("alpha") && out.contains("First thread"),
            "{out}"
        );
        assert!(
            out.contains("archived") && out.contains("fork of alpha"),
            "{out}"
        );
        let (rc, out, _) = run(&["rollout", "list", "--json", "--state-dir", d]);
        assert_eq!(rc, 0);
        let list: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(list[0]["threadId"], "alpha");
        assert_eq!(list[1]["archived"], true);
        let alpha_seq = list[0]["lastSeq"].as_u64().unwrap();

        let (rc, out, _) = run(&["rollout", "show", "alpha", "--state-dir", d]);
        assert_eq!(rc, 0);
        assert!(
            out.contains("threadStarted") && out.contains("\"First thread\""),
            "{out}"
        );
        assert!(out.contains("input \"hello there\""), "{out}");
        assert!(out.contains("turnCompleted"), "{out}");
        let (rc, out, _) = run(&[
            "rollout",
            "show",
            "alpha",
            "--json",
            "--after",
            "1",
            "--limit",
            "2",
            "--state-dir",
            d,
        ]);
        assert_eq!(rc, 0);
        let lines: Vec<Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["seq"], 2);
        let (rc, _, err) = run(&["rollout", "show", "nope", "--state-dir", d]);
        assert_eq!(rc, 1);
        assert!(err.contains("not found"), "{err}");

        let (rc, out, _) = run(&["rollout", "verify", "--state-dir", d]);
        assert_eq!(rc, 0, "{out}");
        assert!(out.contains("all intact: 2 thread(s)"), "{out}");
        let (rc, out, _) = run(&["rollout", "verify", "alpha", "--json", "--state-dir", d]);
        assert_eq!(rc, 0);
        let report: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(report["ok"], true);
        assert_eq!(report["threads"][0]["events"], alpha_seq);
    }
}

#[test]
fn verify_names_the_first_bad_seq_of_a_tampered_rollout() {
    let dir = populated("jsonl");
    let d = s(dir.path());
    let log = dir.path().join("threads/alpha.jsonl");
    let text = std::fs::read_to_string(&log).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    assert!(lines.len() >= 5);
    // Change what the user said at seq 2, keeping the line valid JSON.
    lines[1] = lines[1].replace("hello there", "hello THERE");
    std::fs::write(&log, lines.join("\n") + "\n").unwrap();
    let (rc, out, err) = run(&["rollout", "verify", "--state-dir", d]);
    assert_eq!(rc, 1, "{out}{err}");
    assert!(out.contains("BAD  alpha  first bad seq 2"), "{out}");
    assert!(
        out.contains("FAILED") && out.contains("first bad seq 2"),
        "{out}"
    );
    assert!(
        out.contains("ok   beta"),
        "the other thread is still checked: {out}"
    );
    assert!(err.contains("not modified"), "{err}");
    let (rc, out, _) = run(&["rollout", "verify", "--json", "--state-dir", d]);
    assert_eq!(rc, 1);
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["ok"], false);
    assert_eq!(report["firstBad"]["threadId"], "alpha");
    assert_eq!(report["firstBad"]["seq"], 2);
    // The tampered file was left as it was.
    assert!(std::fs::read_to_string(&log)
        .unwrap()
        .contains("hello THERE"));
}

#[test]
fn rollout_tools_explain_a_missing_or_busy_directory() {
    let dir = state_dir();
    let missing = dir.path().join("nowhere");
    let (rc, _, err) = run(&["rollout", "list", "--state-dir", s(&missing)]);
    assert_eq!(rc, 2);
    assert!(err.contains("no state directory"), "{err}");
    assert!(!missing.exists(), "a read-only tool creates nothing");
    // While a server holds the directory, the tools say so instead of racing it.
    let mut p = Proc::serve(dir.path(), &[]);
    p.init();
    let (rc, _, err) = run(&["rollout", "verify", "--state-dir", s(dir.path())]);
    assert_eq!(rc, 2, "{err}");
    assert!(err.contains("in use by another"), "{err}");
    p.close_stdin();
    assert!(p.wait_exit(TIMEOUT).success());
    // An unsafe directory: serve refuses to start and says how to fix it.
    use std::os::unix::fs::PermissionsExt;
    let open = dir.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = std::process::Command::new(BIN)
        .args(["serve", "--state-dir", s(&open)])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("chmod 700"), "{err}");
    assert!(out.stdout.is_empty(), "stdout carries only protocol");
}

#[test]
fn demo_runs_end_to_end_and_verifies() {
    let dir = state_dir();
    let demo_dir = dir.path().join("demo-state");
    let (rc, out, err) = run(&["demo", "--state-dir", s(&demo_dir)]);
    assert_eq!(rc, 0, "{out}\n{err}");
    for expected in [
        "approval/decide",
        "operation  sha256:",
        "recomputed from the operation: matches",
        "nonce",
        "expires",
        "decision   acceptOnce",
        "item/delta",
        "turn/completed",
        "store verify:",
        "demo passed",
    ] {
        assert!(out.contains(expected), "missing {expected:?} in:\n{out}");
    }
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&demo_dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
    // Run again: the directory is wiped and recreated; cancel takes the interrupted path.
    let (rc, out, _) = run(&["demo", "--decision", "cancel", "--state-dir", s(&demo_dir)]);
    assert_eq!(rc, 0, "{out}");
    assert!(
        out.contains("ended interrupted") && out.contains("ran 0 time(s)"),
        "{out}"
    );
    // A directory that is not a store is never wiped.
    std::fs::write(demo_dir.join("notes.txt"), "mine").unwrap();
    let (rc, _, err) = run(&["demo", "--state-dir", s(&demo_dir)]);
    assert_eq!(rc, 1);
    assert!(err.contains("refusing to wipe"), "{err}");
    assert!(demo_dir.join("notes.txt").exists());
}

#[test]
fn schema_digest_matches_the_library() {
    let (rc, out, _) = run(&["schema", "digest"]);
    assert_eq!(rc, 0);
    assert_eq!(out.trim(), cc_agent_protocol::schema_digest());
}

#[test]
fn serve_refuses_a_script_with_an_unknown_step_before_it_starts() {
    let dir = state_dir();
    let script = dir.path().join("script.json");
    std::fs::write(
        &script,
        r#"{"steps": [{"type": "echo"}, {"type": "mesage", "text": "typo"}]}"#,
    )
    .unwrap();
    let out = std::process::Command::new(BIN)
        .args([
            "serve",
            "--state-dir",
            s(&dir.path().join("state")),
            "--script",
            s(&script),
        ])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("script step 1: unknown step type \"mesage\""),
        "{err}"
    );
    assert!(out.stdout.is_empty(), "stdout carries only protocol");
}

#[test]
fn help_reads_well_on_every_command() {
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["--help"],
            &["serve", "rollout", "demo", "schema", "CC_APP_SERVER_LOG"],
        ),
        (
            &["serve", "--help"],
            &[
                "--state-dir",
                "--queue-cap",
                "--durability",
                "--script",
                "--workspace",
                "backpressure",
                "exits 3",
            ],
        ),
        (&["rollout", "--help"], &["list", "show", "verify"]),
        (&["rollout", "list", "--help"], &["--json", "--state-dir"]),
        (
            &["rollout", "show", "--help"],
            &["THREAD", "--after", "--limit"],
        ),
        (
            &["rollout", "verify", "--help"],
            &["first bad seq", "torn tail"],
        ),
        (
            &["demo", "--help"],
            &["--state-dir", "--decision", "verify_rollout.py"],
        ),
        (&["schema", "digest", "--help"], &["RFC 8785"]),
    ];
    for (args, words) in cases {
        let (rc, out, err) = run(args);
        assert_eq!(rc, 0, "{args:?}: {err}");
        for w in *words {
            assert!(out.contains(w), "{args:?} --help lacks {w:?}:\n{out}");
        }
    }
    let (rc, _, err) = run(&["serve"]);
    assert_eq!(rc, 2);
    assert!(err.contains("--state-dir"), "{err}");
}

#[test]
fn the_tail_cache_budget_is_bounded_and_zero_turns_it_off() {
    let dir = state_dir();
    let d = s(dir.path());
    let (rc, _, err) = run(&["serve", "--state-dir", d, "--tail-cache-mib", "4097"]);
    assert_eq!(rc, 2, "{err}");
    assert!(err.contains("--tail-cache-mib"), "{err}");
    // At the edge and with the cache off, reads are still answered (from the rollout).
    for mib in ["4096", "0"] {
        let mut p = Proc::serve(dir.path(), &["--tail-cache-mib", mib]);
        p.init();
        let id = format!("t{mib}");
        p.req("thread/start", json!({"threadId": id}));
        let read = p.req("thread/read", json!({"threadId": id}));
        assert_eq!(read["result"]["thread"]["id"], json!(id), "{read}");
        assert_eq!(read["result"]["events"][0]["seq"], json!(1), "{read}");
        p.close_stdin();
        assert!(p.wait_exit(TIMEOUT).success());
    }
}

#[test]
fn verify_draws_a_progress_bar_only_on_a_terminal() {
    let dir = state_dir();
    let d = s(dir.path());
    let mut p = Proc::serve(dir.path(), &["--durability", "buffered"]);
    p.init();
    for i in 0..60 {
        p.req("thread/start", json!({"threadId": format!("t{i:02}")}));
    }
    p.close_stdin();
    assert!(p.wait_exit(TIMEOUT).success());
    // Through pipes: no bar.
    let (rc, out, err) = run(&["rollout", "verify", "--state-dir", d]);
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("all intact: 60 thread(s)"), "{out}");
    assert!(!err.contains("verifying ["), "{err}");
    // On a terminal (util-linux `script` gives the command a pty), the bar is drawn.
    let Ok(tty) = std::process::Command::new("script")
        .args([
            "-qec",
            &format!("{BIN} rollout verify --state-dir {d}"),
            "/dev/null",
        ])
        .output()
    else {
        eprintln!("skipping the terminal half: `script` is not available");
        return;
    };
    let all = String::from_utf8_lossy(&tty.stdout);
    assert!(tty.status.success(), "{all}");
    assert!(
        all.contains("verifying [") && all.contains("60/60 threads"),
        "{all}"
    );
    assert!(all.contains("all intact: 60 thread(s)"), "{all}");
}

// ---- Issue 11: verification that never fails open ----------------------------------------

fn lines_of(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

fn write_lines(path: &Path, lines: &[String]) {
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(path, text).unwrap();
}

/// Runs SQL on a state dir's database through Python's sqlite3 (a real SQLite, no test hooks).
fn sql(dir: &Path, statements: &str) {
    let db = dir.join("rollout.sqlite3");
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.executescript(sys.argv[2]); c.commit()",
            s(&db),
            statements,
        ])
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn damage(store: &str, case: &str, dir: &Path) {
    let log = dir.join("threads/alpha.jsonl");
    match (store, case) {
        ("jsonl", "last line deleted") => {
            let l = lines_of(&log);
            write_lines(&log, &l[..l.len() - 1]);
        }
        ("jsonl", "cut mid-line") => {
            let b = std::fs::read(&log).unwrap();
            std::fs::write(&log, &b[..b.len() - 30]).unwrap();
        }
        ("jsonl", "emptied log") => std::fs::write(&log, b"").unwrap(),
        ("jsonl", "log deleted, anchor left") => std::fs::remove_file(&log).unwrap(),
        ("jsonl", "older log restored under a newer anchor") => {
            let l = lines_of(&log);
            write_lines(&log, &l[..3]);
        }
        ("sqlite", "last row deleted") => sql(
            dir,
            "DELETE FROM events WHERE thread_id='alpha' AND seq=(SELECT max(seq) FROM events WHERE thread_id='alpha');",
        ),
        ("sqlite", "thread row deleted") => sql(dir, "DELETE FROM threads WHERE thread_id='alpha';"),
        ("sqlite", "every event row deleted") => {
            sql(dir, "DELETE FROM events WHERE thread_id='alpha';")
        }
        other => panic!("no such case {other:?}"),
    }
}

#[test]
fn verify_all_and_list_name_every_thread_that_cannot_be_read() {
    for (store, cases) in [
        (
            "jsonl",
            &[
                "last line deleted",
                "cut mid-line",
                "emptied log",
                "log deleted, anchor left",
                "older log restored under a newer anchor",
            ][..],
        ),
        (
            "sqlite",
            &[
                "last row deleted",
                "thread row deleted",
                "every event row deleted",
            ][..],
        ),
    ] {
        let dir = populated(store);
        let d = s(dir.path());
        for case in cases {
            let copy = state_dir();
            copy_dir(dir.path(), copy.path());
            damage(store, case, copy.path());
            let c = s(copy.path());
            let (rc, out, err) = run(&["rollout", "verify", "--state-dir", c]);
            assert_eq!(rc, 1, "{store} {case}: {out}{err}");
            assert!(
                out.contains("BAD  alpha") && out.contains("FAILED"),
                "{case}: {out}"
            );
            assert!(out.contains("ok   beta"), "{case}: {out}");
            let (rc, out, _) = run(&["rollout", "verify", "--json", "--state-dir", c]);
            assert_eq!(rc, 1, "{case}");
            let report: Value = serde_json::from_str(&out).unwrap();
            assert_eq!(report["ok"], false);
            assert_eq!(report["firstBad"]["threadId"], "alpha", "{case}: {report}");
            let (rc, out, err) = run(&["rollout", "list", "--state-dir", c]);
            assert_eq!(rc, 1, "{case}: {out}{err}");
            assert!(
                out.lines()
                    .any(|l| l.starts_with("alpha") && l.contains("UNREADABLE")),
                "{case}: {out}"
            );
            let (rc, out, _) = run(&["rollout", "list", "--json", "--state-dir", c]);
            assert_eq!(rc, 1);
            let list: Value = serde_json::from_str(&out).unwrap();
            assert_eq!(list[0]["threadId"], "alpha");
            assert_eq!(list[0]["status"], "unreadable", "{case}: {list}");
            assert!(list[0]["reason"].as_str().is_some_and(|r| !r.is_empty()));
            assert_eq!(list[1]["status"], "archived");
        }
        // The undamaged original still verifies.
        assert_eq!(run(&["rollout", "verify", "--state-dir", d]).0, 0);
    }
}

fn copy_dir(from: &Path, to: &Path) {
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            std::fs::create_dir_all(&target).unwrap();
            copy_dir(&e.path(), &target);
        } else if e.file_name() != "LOCK" {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}

#[test]
fn a_copied_or_swapped_history_is_refused_by_name_and_still_checked() {
    let dir = populated("jsonl");
    let d = s(dir.path());
    let (t, a) = (dir.path().join("threads"), dir.path().join("anchors"));
    std::fs::copy(t.join("alpha.jsonl"), t.join("delta.jsonl")).unwrap();
    std::fs::copy(a.join("alpha.head"), a.join("delta.head")).unwrap();
    let (rc, out, _) = run(&["rollout", "list", "--json", "--state-dir", d]);
    assert_eq!(rc, 1);
    let list: Value = serde_json::from_str(&out).unwrap();
    let heads = list
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["headHash"] == list[0]["headHash"])
        .count();
    assert_eq!(heads, 1, "alpha's history is listed once: {list}");
    assert_eq!(list[2]["threadId"], "delta");
    assert_eq!(list[2]["status"], "unreadable");
    // A flipped byte inside the copy is found too: verify-all looks at delta.jsonl.
    let mut b = std::fs::read(t.join("delta.jsonl")).unwrap();
    let at = b.len() / 2;
    b[at] ^= 1;
    std::fs::write(t.join("delta.jsonl"), b).unwrap();
    let (rc, out, _) = run(&["rollout", "verify", "--state-dir", d]);
    assert_eq!(rc, 1, "{out}");
    assert!(out.contains("BAD  delta"), "{out}");
    std::fs::remove_file(t.join("delta.jsonl")).unwrap();
    std::fs::remove_file(a.join("delta.head")).unwrap();
    // Swapped logs and anchors: neither history is served under the other's id.
    for name in ["threads/alpha.jsonl", "anchors/alpha.head"] {
        let other = name.replace("alpha", "beta");
        let (x, y) = (dir.path().join(name), dir.path().join(&other));
        let tmp = dir.path().join("tmp");
        std::fs::rename(&x, &tmp).unwrap();
        std::fs::rename(&y, &x).unwrap();
        std::fs::rename(&tmp, &y).unwrap();
    }
    let (rc, out, _) = run(&["rollout", "verify", "--state-dir", d]);
    assert_eq!(rc, 1, "{out}");
    assert!(
        out.contains("BAD  alpha") && out.contains("BAD  beta"),
        "{out}"
    );
    let (rc, _, err) = run(&["rollout", "show", "alpha", "--state-dir", d]);
    assert_eq!(rc, 1);
    assert!(err.contains("another thread"), "{err}");
    // SQLite: the same copy, made with SQL.
    let dir = populated("sqlite");
    sql(
        dir.path(),
        "INSERT INTO events SELECT 'delta', seq, prev_hash, hash, time, trace_id, parent_id, idempotency_key, payload, turn_completed FROM events WHERE thread_id='alpha';
         INSERT INTO threads SELECT 'delta', head_seq, head_hash, archived, format_version, compacted_through, last_compaction_seq, mac, key_id FROM threads WHERE thread_id='alpha';",
    );
    let (rc, out, _) = run(&["rollout", "verify", "--state-dir", s(dir.path())]);
    assert_eq!(rc, 1, "{out}");
    assert!(
        out.contains("BAD  delta") && out.contains("ok   alpha"),
        "{out}"
    );
}

#[test]
fn anchors_that_cannot_vouch_fail_unless_accepted_and_say_what_is_unvouched() {
    let dir = populated("jsonl");
    let d = s(dir.path());
    let log = dir.path().join("threads/alpha.jsonl");
    let lines = lines_of(&log);
    let n = lines.len();
    // The last event cut and the newest anchor slot damaged: the older slot would agree.
    write_lines(&log, &lines[..n - 1]);
    let anchor = dir.path().join("anchors/alpha.head");
    let mut a = std::fs::read(&anchor).unwrap();
    let gen = |slot: &[u8]| -> u64 {
        String::from_utf8_lossy(slot)
            .split(' ')
            .find_map(|p| p.strip_prefix("gen=").and_then(|g| g.parse().ok()))
            .unwrap_or(0)
    };
    let newest = if gen(&a[..512]) > gen(&a[512..]) {
        0
    } else {
        1
    };
    let text = String::from_utf8_lossy(&a[newest * 512..]).into_owned();
    let at = newest * 512 + text.find("hash=").unwrap() + 9;
    a[at] ^= 1;
    std::fs::write(&anchor, &a).unwrap();
    let (rc, out, _) = run(&["rollout", "verify", "--state-dir", d]);
    assert_eq!(rc, 1, "{out}");
    let lost = format!("acknowledged events {n}..={n} are gone");
    assert!(out.contains(&lost), "{out}");
    let (rc, out, _) = run(&["rollout", "verify", "--accept-unanchored", "--state-dir", d]);
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("WARNING") && out.contains(&lost), "{out}");
    // The anchor deleted and 3 lines cut: refused, then accepted with the range named.
    let dir = populated("jsonl");
    let d = s(dir.path());
    let log = dir.path().join("threads/alpha.jsonl");
    let lines = lines_of(&log);
    write_lines(&log, &lines[..lines.len() - 3]);
    std::fs::remove_file(dir.path().join("anchors/alpha.head")).unwrap();
    let (rc, out, _) = run(&["rollout", "verify", "--state-dir", d]);
    assert_eq!(rc, 1, "{out}");
    assert!(out.contains("--accept-unanchored"), "{out}");
    let (rc, out, _) = run(&[
        "rollout",
        "verify",
        "--json",
        "--accept-unanchored",
        "--state-dir",
        d,
    ]);
    assert_eq!(rc, 0, "{out}");
    let report: Value = serde_json::from_str(&out).unwrap();
    let alpha = &report["threads"][0];
    assert!(
        alpha["warnings"][0]
            .as_str()
            .unwrap()
            .contains("nothing vouches that its last event is the last one acknowledged"),
        "{report}"
    );
    // Recorded and re-anchored: the next plain verify passes.
    assert_eq!(run(&["rollout", "verify", "--state-dir", d]).0, 0);
    // Entries no thread can own fail verify-all too.
    std::fs::write(dir.path().join("threads/notes.txt"), b"hello").unwrap();
    let (rc, out, _) = run(&["rollout", "verify", "--state-dir", d]);
    assert_eq!(rc, 1, "{out}");
    assert!(
        out.contains("threads/notes.txt") && out.contains("not a thread log"),
        "{out}"
    );
}

#[test]
fn a_key_file_turns_on_keyed_verification() {
    use std::os::unix::fs::PermissionsExt;
    let dir = populated("jsonl");
    let d = s(dir.path());
    let keys = state_dir();
    let key = keys.path().join("rollout.key");
    std::fs::write(&key, format!("{}\n", "ab".repeat(32))).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let k = s(&key);
    // Written unkeyed: the key refuses it until it is adopted.
    let (rc, out, _) = run(&["rollout", "verify", "--key-file", k, "--state-dir", d]);
    assert_eq!(rc, 1, "{out}");
    assert!(out.contains("no MAC"), "{out}");
    let (rc, out, _) = run(&[
        "rollout",
        "verify",
        "--key-file",
        k,
        "--accept-unanchored",
        "--state-dir",
        d,
    ]);
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("adopted"), "{out}");
    let (rc, out, _) = run(&["rollout", "verify", "--key-file", k, "--state-dir", d]);
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("(keyed)") && out.contains(", keyed"), "{out}");
    // Without the key: read, reported "unkeyed", nothing written.
    let (rc, out, _) = run(&["rollout", "verify", "--state-dir", d]);
    assert_eq!(rc, 0, "{out}");
    assert!(
        out.contains("(unkeyed)") && out.contains("WARNING: unkeyed"),
        "{out}"
    );
    // Another key is named as such; a key file others can read, or of the wrong size, is refused.
    let other = keys.path().join("other.key");
    std::fs::write(&other, [9u8; 32]).unwrap();
    std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (rc, out, _) = run(&[
        "rollout",
        "verify",
        "--key-file",
        s(&other),
        "--state-dir",
        d,
    ]);
    assert_eq!(rc, 1);
    assert!(out.contains("another rollout key"), "{out}");
    std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (rc, _, err) = run(&["rollout", "list", "--key-file", s(&other), "--state-dir", d]);
    assert_eq!(rc, 2);
    assert!(err.contains("chmod 600"), "{err}");
    std::fs::write(&other, [9u8; 31]).unwrap();
    std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (rc, _, err) = run(&["rollout", "list", "--key-file", s(&other), "--state-dir", d]);
    assert_eq!(rc, 2);
    assert!(err.contains("32 raw bytes or 64 hex digits"), "{err}");
    let hex = "ab".repeat(32);
    for entry in walk(dir.path()) {
        let text = String::from_utf8_lossy(&std::fs::read(&entry).unwrap()).into_owned();
        assert!(
            !text.contains(&hex),
            "the key leaked into {}",
            entry.display()
        );
    }
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn serve_writes_keyed_threads_with_a_key_file() {
    use std::os::unix::fs::PermissionsExt;
    let dir = state_dir();
    let keys = state_dir();
    let key = keys.path().join("rollout.key");
    std::fs::write(&key, [7u8; 32]).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let k = s(&key);
    let mut p = Proc::serve(dir.path(), &["--key-file", k]);
    p.init();
    p.req("thread/start", json!({"threadId": "keyed"}));
    p.req(
        "turn/start",
        json!({"threadId": "keyed", "input": [{"type": "text", "text": "hi"}]}),
    );
    p.wait_method("turn/completed");
    p.close_stdin();
    assert!(p.wait_exit(std::time::Duration::from_secs(20)).success());
    let d = s(dir.path());
    let (rc, out, _) = run(&["rollout", "verify", "--key-file", k, "--state-dir", d]);
    assert_eq!(rc, 0, "{out}");
    assert!(
        out.contains("(keyed)"),
        "the key vouches for what serve wrote: {out}"
    );
    let (rc, out, _) = run(&["rollout", "verify", "--state-dir", d]);
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("WARNING: unkeyed"), "{out}");
    // A server without the key cannot extend a keyed thread.
    let mut p = Proc::serve(dir.path(), &[]);
    p.init();
    let answer = p.req(
        "turn/start",
        json!({"threadId": "keyed", "input": [{"type": "text", "text": "again"}]}),
    );
    assert!(answer.get("error").is_some(), "{answer}");
    p.close_stdin();
    p.wait_exit(std::time::Duration::from_secs(20));
}
