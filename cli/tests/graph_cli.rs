//! `cc-app-server graph validate|run|inspect|list` as a user runs them: the real binary, real
//! files, real state directories.

mod common;

use common::*;
use serde_json::{json, Value};
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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

/// Runs the binary with no input; kills it (and fails the test) if it has not ended in
/// `limit` — a run waiting forever is the bug this guards against.
fn run_bounded(args: &[&str], limit: Duration) -> (i32, String, String) {
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "`{}` did not end within {limit:?}:\n{}\n{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A real run killed (SIGKILL) while its one tool call waits for approval: the call's effect is
/// intended durably, and nothing ever recorded whether it happened.
fn killed_at_the_approval(def: &str, state: &str, run: &str) {
    let mut child = Command::new(BIN)
        .args(["graph", "run", def, "--state-dir", state, "--run-id", run])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut seen = Vec::new();
    let mut byte = [0u8; 1];
    while !String::from_utf8_lossy(&seen).contains("approve? [y]") {
        let n = std::io::Read::read(&mut out, &mut byte).unwrap();
        assert!(
            n > 0,
            "the run ended before asking: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.push(byte[0]);
    }
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn a_run_left_in_reconcile_stops_with_exit_3_and_is_resolved_from_the_command_line() {
    let dir = state_dir();
    let g = json!({"graphVersion": 1, "id": "rc", "outputs": [port("r", "json")],
        "nodes": [{"kind": "tool", "id": "t", "tool": "publish", "arguments": {"what": "notes"},
                   "outputs": [port("r", "json")]}],
        "edges": [{"from": {"node": "t", "port": "r"}, "to": {"port": "r"}}]});
    let def = file(dir.path(), "g.json", &g);
    let state = dir.path().join("state");
    let s = state.to_str().unwrap();
    let limit = Duration::from_secs(90);
    // Applied: the host says the call happened, with this output; the node gets it without
    // the call running (or being asked about) again.
    killed_at_the_approval(&def, s, "r1");
    let (rc, out, err) = run_bounded(
        &["graph", "run", &def, "--state-dir", s, "--run-id", "r1"],
        limit,
    );
    assert_eq!(rc, 3, "{out}\n{err}");
    assert!(err.contains("node t effect fx-"), "{err}");
    assert!(err.contains("(tool publish, attempt 1)"), "{err}");
    assert!(
        err.contains("--resolve t=applied[:JSON]") && err.contains("--resolve t=not-applied"),
        "{err}"
    );
    // Still waiting, still exit 3, nothing decided behind the host's back.
    let (rc, _, _) = run_bounded(
        &["graph", "run", &def, "--state-dir", s, "--run-id", "r1"],
        limit,
    );
    assert_eq!(rc, 3);
    let (rc, out, err) = run_bounded(
        &[
            "graph",
            "run",
            &def,
            "--state-dir",
            s,
            "--run-id",
            "r1",
            "--resolve",
            r#"t=applied:{"published":true}"#,
        ],
        limit,
    );
    assert_eq!(rc, 0, "{out}\n{err}");
    assert!(out.contains("resolved: applied"), "{out}");
    assert!(!out.contains("approval needed"), "{out}");
    assert!(out.contains("\"published\": true"), "{out}");
    let (rc, out, _) = run(&["graph", "inspect", "r1", "--state-dir", s, "--json"]);
    assert_eq!(rc, 0);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["effects"][0]["receipt"]["source"], "host", "{v}");
    assert_eq!(v["effects"][0]["applied"], true);
    // Not applied: the node makes the call again (here approved by the policy).
    killed_at_the_approval(&def, s, "r2");
    let (rc, out, err) = run_bounded(
        &[
            "graph",
            "run",
            &def,
            "--state-dir",
            s,
            "--run-id",
            "r2",
            "--resolve",
            "t=not-applied",
            "--approval-policy",
            "auto",
        ],
        limit,
    );
    assert_eq!(rc, 0, "{out}\n{err}");
    assert!(out.contains("resolved: not applied"), "{out}");
    assert!(
        out.contains("\"what\": \"notes\""),
        "the echo tool ran: {out}"
    );
    let (_, out, _) = run(&["graph", "inspect", "r2", "--state-dir", s, "--json"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    let effects = v["effects"].as_array().unwrap();
    assert_eq!(
        effects.len(),
        1,
        "the key ran once more, under the same key: {v}"
    );
    assert_eq!(effects[0]["receipt"]["source"], "executed");
    // Wrong decisions are refused (exit 2), deciding nothing.
    killed_at_the_approval(&def, s, "r3");
    for (arg, says) in [
        ("t=maybe", "expected NODE=applied"),
        ("t=applied:{nope", "is not JSON"),
        ("nobody=not-applied", "no effect of run r3"),
    ] {
        let (rc, _, err) = run_bounded(
            &[
                "graph",
                "run",
                &def,
                "--state-dir",
                s,
                "--run-id",
                "r3",
                "--resolve",
                arg,
            ],
            limit,
        );
        assert_eq!(rc, 2, "{arg}: {err}");
        assert!(err.contains(says), "{arg}: {err}");
    }
    let (rc, _, err) = run_bounded(
        &["graph", "run", &def, "--state-dir", s, "--run-id", "r3"],
        limit,
    );
    assert_eq!(rc, 3, "{err}");
    // A decision for an effect that is not waiting: refused too.
    let (rc, _, err) = run_bounded(
        &[
            "graph",
            "run",
            &def,
            "--state-dir",
            s,
            "--run-id",
            "r1",
            "--resolve",
            "t=not-applied",
        ],
        limit,
    );
    assert_eq!(rc, 2, "{err}");
    assert!(err.contains("no effect of run r1"), "{err}");
}
