//! `cc-app-server graph validate|run|inspect|list` as a user runs them: the real binary, real
//! files, real state directories.

mod common;

use common::*;
use serde_json::{json, Value};
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

fn port(name: &str, ty: &str) -> Value {
    json!({"name": name, "type": ty})
}

fn graph() -> Value {
    json!({"graphVersion": 1, "id": "cli", "inputs": [port("topic", "text")], "outputs": [port("report", "object")],
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
            {"from": {"node": "merge", "port": "both"}, "to": {"port": "report"}}]})
}

fn file(dir: &Path, name: &str, v: &Value) -> String {
    let p = dir.join(name);
    std::fs::write(&p, serde_json::to_string_pretty(v).unwrap()).unwrap();
    p.to_str().unwrap().to_string()
}

/// Runs the binary with `stdin` as its input.
fn run_with_input(args: &[&str], stdin: &str) -> (i32, String, String) {
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn validate_reports_the_digest_or_every_error() {
    let dir = state_dir();
    let good = file(dir.path(), "good.json", &graph());
    let (rc, out, err) = run(&["graph", "validate", &good]);
    assert_eq!(rc, 0, "{err}");
    assert!(
        out.starts_with("valid: graph cli with 3 node(s), plan sha256:"),
        "{out}"
    );
    let (rc, out, _) = run(&["graph", "validate", &good, "--json"]);
    assert_eq!(rc, 0);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (v["valid"].as_bool(), v["nodeCount"].as_u64()),
        (Some(true), Some(3))
    );
    // A grant without tools: the tool node's implied capability is missing.
    let (rc, out, _) = run(&["graph", "validate", &good, "--grant", "agent"]);
    assert_eq!(rc, 1);
    assert!(out.contains("capabilityNotGranted at /nodes/0"), "{out}");
    let mut bad = graph();
    bad["edges"][0]["to"]["port"] = json!("nope");
    bad["nodes"][2]["outputs"] = json!([port("o", "text")]);
    let bad = file(dir.path(), "bad.json", &bad);
    let (rc, out, _) = run(&["graph", "validate", &bad]);
    assert_eq!(rc, 1);
    assert!(out.contains("danglingPort at /edges/0/to/port"), "{out}");
    assert!(out.contains("invalidPorts at /nodes/2"), "{out}");
    assert!(out.contains("danglingPort at /edges/4/from/port"), "{out}");
    assert!(out.contains("invalid: 3 error(s)"), "{out}");
    std::fs::write(dir.path().join("junk.json"), "{not json").unwrap();
    let (rc, _, err) = run(&[
        "graph",
        "validate",
        dir.path().join("junk.json").to_str().unwrap(),
    ]);
    assert_eq!(rc, 2);
    assert!(err.contains("is not JSON"), "{err}");
}

#[test]
fn run_inspect_and_list_a_graph() {
    for store in ["jsonl", "sqlite"] {
        let dir = state_dir();
        let def = file(dir.path(), "g.json", &graph());
        let state = dir.path().join("state");
        let s = state.to_str().unwrap();
        let (rc, out, err) = run_with_input(
            &[
                "graph",
                "run",
                &def,
                "--state-dir",
                s,
                "--store",
                store,
                "--input",
                "topic=rust",
                "--run-id",
                "c1",
            ],
            "y\n",
        );
        assert_eq!(rc, 0, "{out}\n{err}");
        assert!(
            out.contains("approval needed") && out.contains("tool:      fetch"),
            "{out}"
        );
        assert!(
            out.contains("node merge") && out.contains("run c1 succeeded"),
            "{out}"
        );
        assert!(out.contains("\"t\": \"written\""), "{out}");
        // Inspect: content hidden unless asked for.
        let (rc, out, err) = run(&["graph", "inspect", "c1", "--state-dir", s]);
        assert_eq!(rc, 0, "{err}");
        assert!(
            out.contains(": succeeded") && out.contains("chain intact"),
            "{out}"
        );
        assert!(
            out.contains("fetch") && out.contains("graph-c1-a1"),
            "{out}"
        );
        assert!(
            out.contains("(hidden; --include-content)") && !out.contains("written"),
            "{out}"
        );
        let (rc, out, _) = run(&[
            "graph",
            "inspect",
            "c1",
            "--state-dir",
            s,
            "--include-content",
        ]);
        assert_eq!(rc, 0);
        assert!(
            out.contains("\"written\"") && out.contains("outputs:"),
            "{out}"
        );
        let (rc, out, _) = run(&["graph", "inspect", "c1", "--state-dir", s, "--json"]);
        assert_eq!(rc, 0);
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["nodes"].as_array().unwrap().len(), 3);
        assert_eq!(v["chain"]["ok"], true);
        assert_eq!(v["effects"][0]["receipt"]["source"], "executed");
        assert!(v["messages"][0].get("value").is_none());
        let (rc, out, _) = run(&["graph", "list", "--state-dir", s]);
        assert_eq!(rc, 0);
        assert!(out.contains("c1") && out.contains("finished"), "{out}");
        // The same file and run id again joins the finished run instead of running it twice.
        let (rc, out, _) = run_with_input(
            &[
                "graph",
                "run",
                &def,
                "--state-dir",
                s,
                "--store",
                store,
                "--input",
                "topic=rust",
                "--run-id",
                "c1",
            ],
            "",
        );
        assert_eq!(rc, 0, "{out}");
        assert!(!out.contains("approval needed"), "{out}");
        // Another run id with the same store: a declined approval fails the run (exit 1).
        let (rc, out, _) = run_with_input(
            &[
                "graph",
                "run",
                &def,
                "--state-dir",
                s,
                "--store",
                store,
                "--input",
                "topic=x",
                "--run-id",
                "c2",
            ],
            "n\n",
        );
        assert_eq!(rc, 1, "{out}");
        assert!(out.contains("toolDenied"), "{out}");
    }
}

#[test]
fn run_refuses_what_cannot_run_and_inspect_what_is_not_there() {
    let dir = state_dir();
    let def = file(dir.path(), "g.json", &graph());
    let s = dir.path().join("state");
    let s = s.to_str().unwrap();
    // Missing input: refused before anything is recorded.
    let (rc, _, err) = run_with_input(&["graph", "run", &def, "--state-dir", s], "");
    assert_eq!(rc, 2, "{err}");
    assert!(err.contains("inputs.topic"), "{err}");
    // Not compiling: exit 2 with every error.
    let (rc, _, err) = run_with_input(
        &[
            "graph",
            "run",
            &def,
            "--state-dir",
            s,
            "--grant",
            "agent",
            "--input",
            "topic=a",
        ],
        "",
    );
    assert_eq!(rc, 2);
    assert!(err.contains("capabilityNotGranted"), "{err}");
    // With the deny policy the tool never runs.
    let (rc, out, _) = run_with_input(
        &[
            "graph",
            "run",
            &def,
            "--state-dir",
            s,
            "--input",
            "topic=a",
            "--approval-policy",
            "deny",
        ],
        "",
    );
    assert_eq!(rc, 1);
    assert!(out.contains("toolDenied"), "{out}");
    let (rc, _, err) = run(&["graph", "inspect", "nope", "--state-dir", s]);
    assert_eq!(rc, 2);
    assert!(err.contains("nope"), "{err}");
    let empty = state_dir();
    let (rc, _, err) = run(&[
        "graph",
        "list",
        "--state-dir",
        empty.path().to_str().unwrap(),
    ]);
    assert_eq!(rc, 2);
    assert!(err.contains("no graph runs"), "{err}");
}
