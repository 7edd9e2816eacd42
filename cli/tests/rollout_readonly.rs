//! `rollout verify|list|show` and `graph inspect` are inspections: the real binary over real
//! state directories, which must come out byte for byte (and timestamp for timestamp) as they
//! went in, report damage with its seq and exit 1, and work on a read-only file system.

mod common;
#[path = "../../core/tests/readonly_support/mod.rs"]
mod readonly_support;

use common::*;
use readonly_support::*;
use serde_json::{json, Value};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A state directory a server wrote: thread alpha with one turn, thread beta.
fn served(store: &str) -> tempfile::TempDir {
    let dir = state_dir();
    let mut p = Proc::serve(dir.path(), &["--store", store]);
    p.init();
    p.req("thread/start", json!({"threadId": "alpha"}));
    p.req(
        "turn/start",
        json!({"threadId": "alpha", "input": [{"type": "text", "text": "hello"}]}),
    );
    p.wait_method("turn/completed");
    p.req("thread/start", json!({"threadId": "beta"}));
    p.close_stdin();
    assert!(p.wait_exit(TIMEOUT).success());
    dir
}

fn lines(path: &Path) -> u64 {
    fs::read_to_string(path).unwrap().lines().count() as u64
}

fn append(path: &Path, bytes: &[u8]) {
    fs::OpenOptions::new()
        .append(true)
        .open(path)
        .unwrap()
        .write_all(bytes)
        .unwrap();
}

#[test]
fn verify_reports_a_torn_tail_and_changes_nothing_until_asked_to_repair() {
    let dir = served("jsonl");
    let d = s(dir.path());
    let log = dir.path().join("threads/alpha.jsonl");
    let n = lines(&log);
    append(&log, b"{\"seq\":999,\"not\": an event}\n");
    let before = snapshot(dir.path());
    let (rc, out, err) = run(&["rollout", "verify", "--state-dir", d]);
    assert_eq!(rc, 1, "{out}{err}");
    assert!(
        out.contains(&format!("BAD  alpha  first bad seq {}: torn tail", n + 1)),
        "{out}"
    );
    assert!(out.contains("ok   beta"), "{out}");
    assert!(!out.contains("repaired"), "{out}");
    assert!(
        err.contains("not modified") && err.contains("--repair"),
        "{err}"
    );
    let (rc, out, _) = run(&["rollout", "verify", "--json", "--state-dir", d]);
    assert_eq!(rc, 1);
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["firstBad"]["threadId"], "alpha");
    assert_eq!(report["firstBad"]["seq"], n + 1);
    assert!(report["firstBad"]["reason"]
        .as_str()
        .unwrap()
        .contains("byte offset"));
    // list and show read the good prefix, and write nothing either.
    let (rc, out, _) = run(&["rollout", "list", "--json", "--state-dir", d]);
    assert_eq!(rc, 0, "{out}");
    let list: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(list[0]["lastSeq"], n);
    let (rc, out, _) = run(&["rollout", "show", "alpha", "--json", "--state-dir", d]);
    assert_eq!(rc, 0);
    assert_eq!(out.lines().count() as u64, n);
    assert_unchanged(&before, dir.path(), "verify, list and show");
    // Asked to: the repair a server makes, recorded; then it verifies.
    let (rc, out, err) = run(&["rollout", "verify", "--repair", "--state-dir", d]);
    assert_eq!(rc, 0, "{out}{err}");
    assert!(out.contains("repaired when opened: torn tail"), "{out}");
    assert!(dir.path().join("threads/alpha.jsonl.broken").exists());
    let (rc, out, _) = run(&["rollout", "verify", "--state-dir", d]);
    assert_eq!(rc, 0, "{out}");
}

fn port(name: &str, ty: &str) -> Value {
    json!({"name": name, "type": ty})
}

/// Runs a small graph (one tool node approved on stdin, one agent node, one join) as run `c1`.
fn graph_run(dir: &Path, store: &str) -> PathBuf {
    let def = json!({"graphVersion": 1, "id": "cli", "inputs": [port("topic", "text")], "outputs": [port("report", "object")],
        "nodes": [
            {"kind": "tool", "id": "fetch", "tool": "fetch", "inputs": [port("topic", "text")], "outputs": [port("result", "json")]},
            {"kind": "agent", "id": "write", "inputs": [port("data", "json")], "outputs": [port("text", "text")],
             "agentOptions": {"script": {"steps": [{"type": "message", "text": "written"}]}}},
            {"kind": "join", "id": "merge", "inputs": [port("t", "text"), port("r", "json")], "outputs": [port("both", "object")]}],
        "edges": [
            {"from": {"port": "topic"}, "to": {"node": "fetch", "port": "topic"}},
            {"from": {"node": "fetch", "port": "result"}, "to": {"node": "write", "port": "data"}},
            {"from": {"node": "write", "port": "text"}, "to": {"node": "merge", "port": "t"}},
            {"from": {"node": "fetch", "port": "result"}, "to": {"node": "merge", "port": "r"}},
            {"from": {"node": "merge", "port": "both"}, "to": {"port": "report"}}]});
    let file = dir.join("g.json");
    fs::write(&file, def.to_string()).unwrap();
    let state = dir.join("state");
    let mut child = Command::new(BIN)
        .args([
            "graph",
            "run",
            s(&file),
            "--state-dir",
            s(&state),
            "--store",
            store,
        ])
        .args(["--input", "topic=rust", "--run-id", "c1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"y\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    state
}

#[test]
fn graph_inspect_reports_a_bad_last_line_and_changes_nothing() {
    let tmp = state_dir();
    let state = graph_run(tmp.path(), "jsonl");
    let st = s(&state);
    let log = state.join("graph-runs/threads/c1.jsonl");
    let n = lines(&log);
    append(&log, b"not an event\n");
    let before = snapshot(&state);
    let (rc, out, err) = run(&["graph", "inspect", "c1", "--state-dir", st]);
    assert_eq!(rc, 1, "{out}{err}");
    assert!(
        out.contains(&format!("chain BROKEN at seq {}: torn tail", n + 1)),
        "{out}"
    );
    assert!(!out.contains("chain intact"), "{out}");
    let (rc, out, _) = run(&["graph", "inspect", "c1", "--state-dir", st, "--json"]);
    assert_eq!(rc, 1);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["chain"]["ok"], false);
    assert_eq!(v["chain"]["firstBadSeq"], n + 1);
    assert_unchanged(&before, &state, "graph inspect");
    assert!(!state.join("graph-runs/threads/c1.jsonl.broken").exists());
    // Damage inside the log (not at its end): named, exit 1, still nothing written.
    let text = fs::read_to_string(&log).unwrap();
    let mut all: Vec<&str> = text.lines().collect();
    all.pop();
    let changed = all[1].replacen("\"seq\":2", "\"seq\":7", 1);
    all[1] = &changed;
    fs::write(&log, all.join("\n") + "\n").unwrap();
    let before = snapshot(&state);
    let (rc, _, err) = run(&["graph", "inspect", "c1", "--state-dir", st]);
    assert_eq!(rc, 1, "{err}");
    assert!(err.contains("BROKEN at seq 2"), "{err}");
    assert_unchanged(&before, &state, "graph inspect, damaged middle");
}

#[test]
fn the_tools_work_on_a_read_only_file_system() {
    for store in ["jsonl", "sqlite"] {
        let tmp = state_dir();
        let state = graph_run(tmp.path(), store);
        // The main store too: a server's threads next to the graph runs.
        let mut p = Proc::serve(&state, &["--store", store]);
        p.init();
        p.req("thread/start", json!({"threadId": "alpha"}));
        p.close_stdin();
        assert!(p.wait_exit(TIMEOUT).success());
        let target = tmp.path().join("ro");
        let mount = ReadOnlyMount::new(&state, &target);
        let at = if mount.is_some() {
            assert!(
                fs::write(target.join("probe"), b"x").is_err(),
                "the mount is read-only, for root too"
            );
            target.clone()
        } else {
            chmod_read_only(&state);
            state.clone()
        };
        let before = snapshot(&state);
        let a = s(&at);
        let (rc, out, err) = run(&["rollout", "verify", "--state-dir", a]);
        assert_eq!(rc, 0, "{store}: {out}{err}");
        assert!(
            out.contains("all intact") && out.contains("ok   alpha"),
            "{out}"
        );
        let (rc, out, err) = run(&["rollout", "list", "--state-dir", a]);
        assert_eq!(rc, 0, "{store}: {out}{err}");
        let (rc, out, err) = run(&["rollout", "show", "alpha", "--state-dir", a]);
        assert_eq!(rc, 0, "{store}: {out}{err}");
        let (rc, out, err) = run(&["graph", "inspect", "c1", "--state-dir", a]);
        assert_eq!(rc, 0, "{store}: {out}{err}");
        assert!(out.contains("chain intact"), "{out}");
        assert_unchanged(&before, &state, store);
        // Writing is what fails, and says so (root ignores the fallback's permission bits).
        if writes_fail(&mount) {
            let (rc, _, err) = run(&["rollout", "verify", "--repair", "--state-dir", a]);
            assert_eq!(rc, 2, "{err}");
            assert!(err.contains("cannot open"), "{err}");
            assert_unchanged(&before, &state, store);
        }
        drop(mount);
    }
}
