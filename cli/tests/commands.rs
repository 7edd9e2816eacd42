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
