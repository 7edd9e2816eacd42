//! The published platform clients' surface, against the built binary with real pipes and real
//! private state directories: `serve --app-server` with the `--app-server-*` aliases and the
//! script and kernel environment variables, and `agent --input-format stream-json
//! --output-format stream-json`, the NDJSON stream the published `AgentSession` drives (scripted
//! turns, approvals accepted, declined and failing closed, controls, EOF, refused formats).
//! Every stream line is checked for the structure the published stream schema requires; the
//! published validators themselves run in the published-client harness.

mod common;

use common::{initialize_params, state_dir, tool_script, Proc, ALL_FEATURES, BIN, TIMEOUT};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The 37 event types of the published stream (0.2.4's `CC_AGENT_STREAM_EVENT_TYPES`; 0.2.9 adds
/// 15 that 0.2.4 would refuse, so none of those may appear).
const STREAM_TYPES: [&str; 37] = [
    "approval_request",
    "approval_resolved",
    "checkpoint",
    "compaction",
    "compaction-degraded",
    "compaction_usage_unknown",
    "cost_budget_exhausted",
    "elicitation_complete",
    "elicitation_deferred",
    "feedback_ack",
    "hook_progress",
    "hook_response",
    "hook_started",
    "iteration_budget_exhausted",
    "iteration_warning",
    "plan_update",
    "question_request",
    "question_resolved",
    "question_response_rejected",
    "raw",
    "recovery_degraded",
    "remote_control",
    "result",
    "resume_ack",
    "session_error",
    "slash_command_result",
    "stream_event",
    "stream_retry",
    "structured_result",
    "subagent_completed",
    "subagent_progress",
    "subagent_started",
    "system",
    "token_usage",
    "tool_result",
    "tool_use",
    "user",
];

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn write_script(dir: &Path, script: &Value) -> std::path::PathBuf {
    let path = dir.join("script.json");
    std::fs::write(&path, script.to_string()).unwrap();
    path
}

/// A string member of at most `max` characters (and at least `min`).
fn check_str(e: &Value, key: &str, min: usize, max: usize, required: bool) {
    match e.get(key) {
        None if !required => {}
        Some(Value::String(v)) => {
            let n = v.chars().count();
            assert!((min..=max).contains(&n), "{key} has {n} characters: {e}");
        }
        other => panic!("{key} must be a string, got {other:?}: {e}"),
    }
}

fn check_bool(e: &Value, key: &str) {
    assert!(e[key].is_boolean(), "{key} must be a boolean: {e}");
}

/// What the published schema requires of each event this server emits (types, required members,
/// the bounded strings), and of every line: a known type, a positive seq, a safe trace id.
fn check_event(e: &Value) {
    let t = e["type"].as_str().unwrap_or_else(|| panic!("no type: {e}"));
    assert!(
        STREAM_TYPES.contains(&t),
        "not a published 0.2.4 stream type: {e}"
    );
    if let Some(seq) = e.get("seq") {
        assert!(seq.as_u64().is_some_and(|n| n >= 1), "seq: {e}");
    }
    if let Some(trace) = e.get("trace_id") {
        let trace = trace.as_str().unwrap_or_else(|| panic!("trace_id: {e}"));
        assert!(
            (1..=128).contains(&trace.len())
                && trace
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || ".:_-".contains(c)),
            "trace_id: {e}"
        );
    }
    check_str(e, "session_id", 0, 160, false);
    match t {
        "system" => {
            check_str(e, "subtype", 1, 64, true);
            if e["subtype"] == "init" {
                check_str(e, "session_id", 1, 160, true);
                check_str(e, "model", 0, 256, false);
                check_str(e, "permission_mode", 0, 64, false);
                assert!(
                    e["tools"].is_array() && e["slash_commands"].is_array(),
                    "{e}"
                );
            }
        }
        "stream_event" => {
            let delta = &e["event"]["delta"];
            match delta["type"].as_str() {
                Some("text_delta") => assert!(delta["text"].is_string(), "{e}"),
                Some("thinking_delta") => assert!(delta["thinking"].is_string(), "{e}"),
                _ => panic!("unexpected delta: {e}"),
            }
        }
        "tool_use" | "tool_result" => {
            check_str(e, "tool", 1, 256, true);
            check_str(e, "id", 0, 160, false);
            if let Some(turn) = e.get("turn") {
                assert!(turn.as_u64().is_some(), "{e}");
            }
            if t == "tool_result" {
                check_bool(e, "is_error");
                assert!(e["error"].is_null() || e["error"].is_string(), "{e}");
            }
        }
        "approval_request" => {
            check_str(e, "id", 1, 160, true);
            check_str(e, "binding", 1, 512, true);
            check_str(e, "tool", 0, 256, false);
            check_str(e, "command", 0, 4096, false);
            check_str(e, "reason", 0, 4096, false);
            check_str(e, "risk", 0, 64, false);
        }
        "approval_resolved" => {
            check_str(e, "id", 1, 160, true);
            check_bool(e, "approved");
            check_str(e, "via", 1, 64, true);
            if let Some(d) = e.get("decision") {
                let d = d.as_object().unwrap_or_else(|| panic!("decision: {e}"));
                let allowed: &[&str] = match d["kind"].as_str() {
                    Some("acceptOnce") => &["kind"],
                    Some("acceptForTurn" | "acceptForSession") => &["kind", "permissions"],
                    Some("decline" | "cancel") => &["kind", "reason"],
                    _ => panic!("decision kind: {e}"),
                };
                assert!(d.keys().all(|k| allowed.contains(&k.as_str())), "{e}");
            }
        }
        "result" => {
            check_str(e, "subtype", 1, 128, true);
            check_bool(e, "is_error");
            for k in ["result", "error"] {
                assert!(e.get(k).is_none_or(Value::is_string), "{k}: {e}");
            }
            for k in ["turn", "num_turns", "duration_ms", "tool_calls"] {
                assert!(e.get(k).is_none_or(|v| v.as_u64().is_some()), "{k}: {e}");
            }
        }
        "session_error" => {
            check_str(e, "error", 0, 4096, false);
            check_str(e, "message", 0, 4096, false);
        }
        "question_response_rejected" => {
            check_str(e, "id", 1, 160, true);
            check_str(e, "reason", 1, 256, true);
        }
        "slash_command_result" => {
            check_str(e, "request_id", 1, 160, true);
            check_str(e, "command", 1, 128, true);
            check_bool(e, "ok");
        }
        "compaction-degraded" => check_str(e, "reason", 1, 1024, true),
        "stream_retry"
        | "iteration_budget_exhausted"
        | "compaction"
        | "token_usage"
        | "user"
        | "raw"
        | "plan_update" => {}
        other => panic!("this server does not emit {other}: {e}"),
    }
}

/// A running `agent` process: NDJSON lines in, stream events out (each checked), stderr kept.
struct Agent {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    stderr: Arc<Mutex<String>>,
    last_seq: u64,
    events: Vec<Value>,
}

impl Agent {
    fn spawn(args: &[&str], env: &[(&str, &str)]) -> Agent {
        let mut cmd = Command::new(BIN);
        cmd.arg("agent")
            .args(args)
            .env("CC_APP_SERVER_LOG", "info")
            .env_remove("CC_APP_SERVER_SCRIPT")
            .env_remove("CC_APP_SERVER_KERNEL")
            .env_remove("CC_APPROVAL_TIMEOUT_MS")
            .env_remove("CC_TRACE_ID");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the binary starts");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = common::capture_stderr(&mut child);
        Agent {
            child,
            stdin,
            lines,
            stderr,
            last_seq: 0,
            events: Vec::new(),
        }
    }

    /// A session with the scripted kernel running `script`, in `dir`.
    fn scripted(dir: &Path, script: &Value, extra: &[&str]) -> Agent {
        let path = write_script(dir, script);
        let state = dir.join("state");
        let mut args = vec![
            "--input-format",
            "stream-json",
            "--output-format",
            "stream-json",
            "--state-dir",
            s(&state),
        ];
        args.extend_from_slice(extra);
        Agent::spawn(&args, &[("CC_APP_SERVER_SCRIPT", s(&path))])
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    fn send(&mut self, v: &Value) {
        let stdin = self.stdin.as_mut().expect("stdin is open");
        writeln!(stdin, "{v}").unwrap();
        stdin.flush().unwrap();
    }

    fn close_stdin(&mut self) {
        self.stdin.take();
    }

    /// The next event: one JSON object per line, checked, its seq above the last one.
    fn next(&mut self) -> Value {
        let line = self.lines.recv_timeout(TIMEOUT).unwrap_or_else(|_| {
            panic!(
                "no event within {TIMEOUT:?}; so far {:#?}\nstderr:\n{}",
                self.events,
                self.stderr()
            )
        });
        let e: Value = serde_json::from_str(&line)
            .unwrap_or_else(|err| panic!("stdout carried a non-JSON line ({err}): {line:?}"));
        check_event(&e);
        let seq = e["seq"].as_u64().expect("every line has a seq");
        assert!(seq > self.last_seq, "seq {seq} after {}", self.last_seq);
        self.last_seq = seq;
        self.events.push(e.clone());
        e
    }

    /// Events up to and including the first that matches `pred`.
    fn until(&mut self, pred: impl Fn(&Value) -> bool) -> Vec<Value> {
        let mut got = Vec::new();
        loop {
            let e = self.next();
            let stop = pred(&e);
            got.push(e);
            if stop {
                return got;
            }
        }
    }

    fn until_type(&mut self, t: &str) -> Vec<Value> {
        self.until(|e| e["type"] == t)
    }

    /// After stdin closed: the remaining events up to EOF on stdout, and the exit status.
    fn finish(&mut self) -> (Vec<Value>, ExitStatus) {
        let mut got = Vec::new();
        let deadline = Instant::now() + TIMEOUT;
        loop {
            match self
                .lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(line) => {
                    let e: Value = serde_json::from_str(&line).unwrap();
                    check_event(&e);
                    got.push(e);
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                Err(_) => panic!("stdout did not end; stderr:\n{}", self.stderr()),
            }
        }
        let status = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st;
            }
            assert!(Instant::now() < deadline, "the agent did not exit");
            std::thread::sleep(Duration::from_millis(10));
        };
        (got, status)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn of_type<'a>(events: &'a [Value], t: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["type"] == t).collect()
}

/// Two tools, then an answer streamed in two deltas.
fn two_tools_script() -> Value {
    json!({"steps": [
        {"type": "reasoning", "text": "two tools"},
        {"type": "tool", "tool": "fs.write", "arguments": {"path": "a.txt", "text": "x"}},
        {"type": "tool", "tool": "run_command", "arguments": {"argv": ["rm", "-rf", "build"]}},
        {"type": "message", "text": "done here", "chunks": 2}
    ]})
}

// ---------------------------------------------------------------------------------------------
// serve --app-server

fn serve_cmd(args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.arg("serve")
        .args(args)
        .env_remove("CC_APP_SERVER_SCRIPT")
        .env_remove("CC_APP_SERVER_KERNEL");
    cmd
}

fn initializes(mut p: Proc) {
    let r = p.req("initialize", initialize_params(ALL_FEATURES));
    assert!(r.get("result").is_some(), "{r}\n{}", p.stderr());
    p.close_stdin();
    let status = p.wait_exit(TIMEOUT);
    assert!(status.success(), "{status:?}: {}", p.stderr());
}

#[test]
fn the_app_server_aliases_launch_as_the_published_client_does_and_answer_initialize() {
    let tmp = state_dir();
    // The exact argv of AppServerClient with every option set (jsonl).
    let jsonl = tmp.path().join("jsonl");
    initializes(Proc::from_command(serve_cmd(&[
        "--app-server",
        "--app-server-store",
        "jsonl",
        "--app-server-state-dir",
        s(&jsonl),
        "--app-server-queue-cap",
        "8",
    ])));
    assert!(jsonl.join("threads").is_dir());
    // sqlite, located by the database file.
    let sqlite = tmp.path().join("sq");
    let db = sqlite.join("rollout.sqlite3");
    initializes(Proc::from_command(serve_cmd(&[
        "--app-server",
        "--app-server-store",
        "sqlite",
        "--app-server-state-path",
        s(&db),
    ])));
    assert!(db.is_file(), "the database is where the path says");
    // jsonl, located by the state path (the state directory itself).
    let by_path = tmp.path().join("by-path");
    initializes(Proc::from_command(serve_cmd(&[
        "--app-server",
        "--app-server-state-path",
        s(&by_path),
    ])));
    assert!(by_path.join("threads").is_dir());
}

#[test]
fn with_app_server_and_no_state_dir_the_per_user_default_is_used_and_made_private() {
    let tmp = state_dir();
    let home = tmp.path().join("home");
    let mut cmd = serve_cmd(&["--app-server"]);
    cmd.env("HOME", &home).env_remove("XDG_STATE_HOME");
    initializes(Proc::from_command(cmd));
    let dir = home.join(".local/state/cc-app-server");
    assert!(dir.join("threads").is_dir(), "{dir:?}");
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);

    let xdg = tmp.path().join("xdg");
    let mut cmd = serve_cmd(&["--app-server"]);
    cmd.env("HOME", &home).env("XDG_STATE_HOME", &xdg);
    initializes(Proc::from_command(cmd));
    assert!(xdg.join("cc-app-server/threads").is_dir());
}

#[test]
fn ambiguous_or_unservable_locations_are_refused_clearly() {
    let tmp = state_dir();
    let d = tmp.path().join("d");
    // Without --app-server a state directory is still required (a usage error).
    let (rc, _, err) = common::run(&["serve"]);
    assert_eq!(rc, 2, "{err}");
    assert!(err.contains("--state-dir"), "{err}");
    // The directory and the path are exclusive, as in the published client.
    let (rc, _, err) = common::run(&[
        "serve",
        "--app-server",
        "--app-server-state-dir",
        s(&d),
        "--app-server-state-path",
        s(&d),
    ]);
    assert_eq!(rc, 2, "{err}");
    assert!(err.contains("--app-server-state-path"), "{err}");
    // A SQLite file name this server does not use: refused, saying what to pass.
    let other = tmp.path().join("x").join("app.sqlite");
    let (rc, _, err) = common::run(&[
        "serve",
        "--app-server",
        "--app-server-store",
        "sqlite",
        "--app-server-state-path",
        s(&other),
    ]);
    assert_eq!(rc, 1, "{err}");
    assert!(err.contains("rollout.sqlite3"), "{err}");
    assert!(!other.exists() && !tmp.path().join("x").exists());
    // An unknown kernel in the environment is a startup failure, not a silent default.
    let out = serve_cmd(&["--app-server", "--app-server-state-dir", s(&d)])
        .env("CC_APP_SERVER_KERNEL", "gpt")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("CC_APP_SERVER_KERNEL"));
}

/// The answer to approval/decide in the shape the request implies: the published bare decision
/// for a published ApprovalRequest (it has `risk`), else the nonce-echoing answer.
fn accept(request: &Value) -> Value {
    let p = &request["params"];
    let result = if p.get("risk").is_some() {
        json!({"kind": "acceptOnce"})
    } else {
        json!({"nonce": p["binding"]["nonce"], "decision": {"decision": "acceptOnce"}})
    };
    json!({"jsonrpc": "2.0", "id": request["id"], "result": result})
}

#[test]
fn the_script_variable_drives_a_scripted_turn_with_an_approval_through_serve() {
    let tmp = state_dir();
    let script = write_script(tmp.path(), &tool_script());
    let dir = tmp.path().join("state");
    let mut cmd = serve_cmd(&["--app-server", "--app-server-state-dir", s(&dir)]);
    cmd.env("CC_APP_SERVER_SCRIPT", &script);
    let mut p = Proc::from_command(cmd);
    p.init();
    let r = p.req("thread/start", json!({"threadId": "env"}));
    assert!(r.get("result").is_some(), "{r}");
    let r = p.req(
        "turn/start",
        json!({"threadId": "env", "input": [{"type": "text", "text": "go"}]}),
    );
    assert!(r.get("result").is_some(), "{r}");
    let ask = p.wait_method("approval/decide");
    assert_eq!(ask["params"]["operation"]["tool"], "fs.write", "{ask}");
    p.send(&accept(&ask));
    let result = p.wait_method("tool/result");
    assert_eq!(result["params"]["result"]["status"], "ok", "{result}");
    let done = p.wait_method("turn/completed");
    assert_eq!(done["params"]["turn"]["status"], "completed", "{done}");
    p.close_stdin();
    assert!(p.wait_exit(TIMEOUT).success());

    // A file the variable names that cannot be read fails the start, as --script would.
    let mut cmd = serve_cmd(&["--app-server", "--app-server-state-dir", s(&dir)]);
    cmd.env("CC_APP_SERVER_SCRIPT", tmp.path().join("missing.json"));
    let out = cmd.stdin(Stdio::null()).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.json"));
}

// ---------------------------------------------------------------------------------------------
// agent --input-format stream-json --output-format stream-json

#[test]
fn agent_runs_a_scripted_turn_with_one_approval_accepted_and_one_declined() {
    let tmp = state_dir();
    let mut a = Agent::scripted(
        tmp.path(),
        &two_tools_script(),
        &["--include-partial-messages", "--interactive-approvals"],
    );
    let init = a.next();
    assert_eq!(
        (init["type"].as_str(), init["subtype"].as_str()),
        (Some("system"), Some("init"))
    );
    assert_eq!(init["input_format"], "stream-json");
    assert_eq!(init["permission_mode"], "default");
    let session = init["session_id"].as_str().unwrap().to_string();
    a.send(&json!({"type": "user", "text": "write a file and clean up"}));

    let mut events = a.until_type("approval_request");
    let first = events.last().unwrap().clone();
    assert_eq!(first["tool"], "fs.write");
    assert_eq!(first["session_id"], session.as_str());
    a.send(&json!({"type": "approval", "id": first["id"], "approve": true, "binding": first["binding"]}));
    events.extend(a.until_type("approval_request"));
    let second = events.last().unwrap().clone();
    assert_eq!(second["tool"], "run_command");
    assert_eq!(second["command"], "rm -rf build");
    assert_ne!(first["binding"], second["binding"]);
    a.send(
        &json!({"type": "approval", "id": second["id"], "approve": false,
        "decision": {"kind": "decline", "reason": "not now"}, "binding": second["binding"]}),
    );
    events.extend(a.until_type("result"));

    let order: Vec<&str> = events
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .filter(|t| *t != "stream_event")
        .collect();
    assert_eq!(
        order,
        [
            "tool_use",
            "approval_request",
            "approval_resolved",
            "tool_result",
            "tool_use",
            "approval_request",
            "approval_resolved",
            "tool_result",
            "result"
        ]
    );
    let uses = of_type(&events, "tool_use");
    let results = of_type(&events, "tool_result");
    for (u, r) in uses.iter().zip(&results) {
        assert_eq!(u["id"], r["id"], "a tool_result pairs with its tool_use");
    }
    assert_eq!(results[0]["is_error"], false);
    assert_eq!(results[0]["result"]["echo"]["path"], "a.txt");
    assert_eq!(results[1]["is_error"], true);
    assert_eq!(results[1]["permission_decision"]["approved"], false);
    let resolved = of_type(&events, "approval_resolved");
    assert_eq!(
        (
            &resolved[0]["approved"],
            &resolved[0]["via"],
            &resolved[0]["decision"]
        ),
        (&json!(true), &json!("user"), &json!({"kind": "acceptOnce"}))
    );
    assert_eq!(resolved[1]["approved"], false);
    assert_eq!(
        resolved[1]["decision"],
        json!({"kind": "decline", "reason": "not now"})
    );
    assert_eq!(resolved[0]["id"], first["id"]);
    let text: String = of_type(&events, "stream_event")
        .iter()
        .filter_map(|e| e["event"]["delta"]["text"].as_str())
        .collect();
    assert_eq!(text, "done here", "the deltas add up to the answer");
    assert!(of_type(&events, "stream_event")
        .iter()
        .any(|e| e["event"]["delta"]["thinking"] == "two tools"));
    let result = events.last().unwrap();
    assert_eq!(
        (&result["subtype"], &result["is_error"], &result["result"]),
        (&json!("success"), &json!(false), &json!("done here"))
    );
    assert_eq!(
        (result["tool_calls"].as_u64(), result["turn"].as_u64()),
        (Some(2), Some(1))
    );
    assert_eq!(result["denials"].as_array().unwrap().len(), 1);
    assert!(
        of_type(&a.events, "token_usage").is_empty(),
        "the scripted kernel reports no usage"
    );

    a.close_stdin();
    let (rest, status) = a.finish();
    assert!(status.success(), "{status:?}: {}", a.stderr());
    assert_eq!(
        rest,
        [json!({"type": "system", "subtype": "end", "turns": 1,
        "trace_id": init["trace_id"], "seq": a.last_seq + 1})]
    );

    // The turn is in the real JSONL rollout, and it verifies.
    let state = tmp.path().join("state");
    assert!(state
        .join("threads")
        .join(format!("{session}.jsonl"))
        .is_file());
    let (rc, out, err) = common::run(&["rollout", "verify", &session, "--state-dir", s(&state)]);
    assert_eq!(rc, 0, "{out}{err}");
}

#[test]
fn agent_without_interactive_approvals_fails_closed_at_once() {
    let tmp = state_dir();
    let mut a = Agent::scripted(tmp.path(), &tool_script(), &[]);
    a.next();
    a.send(&json!({"type": "user", "text": "go"}));
    let events = a.until_type("result");
    assert!(
        of_type(&events, "approval_request").is_empty(),
        "nobody is asked"
    );
    assert!(
        of_type(&events, "stream_event").is_empty(),
        "no partial messages"
    );
    let resolved = of_type(&events, "approval_resolved");
    assert_eq!(resolved.len(), 1);
    assert_eq!(
        (&resolved[0]["approved"], &resolved[0]["via"]),
        (&json!(false), &json!("non_interactive"))
    );
    assert_eq!(of_type(&events, "tool_result")[0]["is_error"], true);
    let result = events.last().unwrap();
    assert_eq!(
        (&result["subtype"], &result["result"]),
        (&json!("success"), &json!("done"))
    );
    a.close_stdin();
    assert!(a.finish().1.success());
}

#[test]
fn agent_permission_modes_decide_through_the_real_gate() {
    let tmp = state_dir();
    // acceptEdits: the file write runs unasked; the command is still asked (and declined here).
    let mut a = Agent::scripted(
        tmp.path(),
        &two_tools_script(),
        &[
            "--interactive-approvals",
            "--permission-mode",
            "acceptEdits",
        ],
    );
    assert_eq!(a.next()["permission_mode"], "acceptEdits");
    a.send(&json!({"type": "user", "text": "go"}));
    let mut events = a.until_type("approval_request");
    assert_eq!(events.last().unwrap()["tool"], "run_command");
    let ask = events.last().unwrap().clone();
    a.send(&json!({"type": "approval", "id": ask["id"], "approve": false}));
    events.extend(a.until_type("result"));
    let resolved = of_type(&events, "approval_resolved");
    assert_eq!(
        (&resolved[0]["approved"], &resolved[0]["via"]),
        (&json!(true), &json!("permission_mode"))
    );
    assert_eq!(
        (&resolved[1]["approved"], &resolved[1]["via"]),
        (&json!(false), &json!("user"))
    );
    let results = of_type(&events, "tool_result");
    assert_eq!(
        (&results[0]["is_error"], &results[1]["is_error"]),
        (&json!(false), &json!(true))
    );
    a.close_stdin();
    assert!(a.finish().1.success());

    // plan: the engine's deny-all policy; nothing is asked, nothing runs.
    let tmp = state_dir();
    let mut a = Agent::scripted(
        tmp.path(),
        &two_tools_script(),
        &["--interactive-approvals", "--permission-mode", "plan"],
    );
    a.next();
    a.send(&json!({"type": "user", "text": "go"}));
    let events = a.until_type("result");
    assert!(of_type(&events, "approval_request").is_empty());
    assert!(of_type(&events, "tool_result")
        .iter()
        .all(|r| r["is_error"] == true));
    a.close_stdin();
    assert!(a.finish().1.success());

    // bypassPermissions: the engine's auto-approve policy; everything runs unasked.
    let tmp = state_dir();
    let mut a = Agent::scripted(
        tmp.path(),
        &two_tools_script(),
        &["--permission-mode", "bypassPermissions"],
    );
    a.next();
    a.send(&json!({"type": "user", "text": "go"}));
    let events = a.until_type("result");
    assert!(of_type(&events, "approval_request").is_empty());
    assert!(of_type(&events, "tool_result")
        .iter()
        .all(|r| r["is_error"] == false));
    a.close_stdin();
    assert!(a.finish().1.success());
}

#[test]
fn unclear_late_or_missing_answers_fail_closed() {
    let tmp = state_dir();
    let write = |n: u32| json!({"type": "tool", "tool": "fs.write", "arguments": {"path": n.to_string(), "text": ""}});
    let script =
        json!({"steps": [write(1), write(2), write(3), {"type": "message", "text": "end"}]});
    let mut a = Agent::scripted(tmp.path(), &script, &["--interactive-approvals"]);
    a.next();
    a.send(&json!({"type": "user", "text": "go"}));
    // 1: an answer that names another binding.
    let ask = a.until_type("approval_request").pop().unwrap();
    a.send(
        &json!({"type": "approval", "id": ask["id"], "approve": true, "binding": "sha256:other"}),
    );
    let r = a.until_type("approval_resolved").pop().unwrap();
    assert_eq!(
        (&r["approved"], &r["via"]),
        (&json!(false), &json!("binding_mismatch"))
    );
    // 2: a decision that contradicts approve.
    let ask = a.until_type("approval_request").pop().unwrap();
    a.send(&json!({"type": "approval", "id": ask["id"], "approve": false, "decision": {"kind": "acceptOnce"}}));
    let r = a.until_type("approval_resolved").pop().unwrap();
    assert_eq!(
        (&r["approved"], &r["via"]),
        (&json!(false), &json!("invalid_response"))
    );
    // 3: an answer to an id nobody asked about is reported; then stdin closes while the real one
    // waits: declined, the turn finishes, the session ends cleanly.
    let ask = a.until_type("approval_request").pop().unwrap();
    a.send(&json!({"type": "approval", "id": "approval-nope", "approve": true}));
    assert_eq!(
        a.until_type("session_error").pop().unwrap()["error"],
        "unknown_approval"
    );
    a.close_stdin();
    let (rest, status) = a.finish();
    assert!(status.success(), "{}", a.stderr());
    let r = of_type(&rest, "approval_resolved");
    assert_eq!(
        (&r[0]["approved"], &r[0]["via"], &r[0]["id"]),
        (&json!(false), &json!("stdin_closed"), &ask["id"])
    );
    let result = of_type(&rest, "result");
    assert_eq!(
        (&result[0]["subtype"], &result[0]["result"]),
        (&json!("success"), &json!("end"))
    );
    assert_eq!(result[0]["denials"].as_array().unwrap().len(), 3);
    assert_eq!(rest.last().unwrap()["subtype"], "end");

    // An approval nobody answers in time is declined at the deadline; a late answer is ignored.
    let tmp = state_dir();
    let mut a = Agent::scripted(
        tmp.path(),
        &tool_script(),
        &["--interactive-approvals", "--approval-timeout-ms", "300"],
    );
    a.next();
    a.send(&json!({"type": "user", "text": "go"}));
    let ask = a.until_type("approval_request").pop().unwrap();
    let r = a.until_type("approval_resolved").pop().unwrap();
    assert_eq!(
        (&r["approved"], &r["via"]),
        (&json!(false), &json!("timeout"))
    );
    a.send(&json!({"type": "approval", "id": ask["id"], "approve": true}));
    let events = a.until_type("result");
    assert_eq!(of_type(&events, "tool_result")[0]["is_error"], true);
    assert!(
        of_type(&events, "session_error").is_empty(),
        "the late answer is ignored quietly"
    );
    a.close_stdin();
    assert!(a.finish().1.success());
}

#[test]
fn agent_handles_eof_cleanly() {
    // Nothing sent at all: init, end, exit 0.
    let tmp = state_dir();
    let mut a = Agent::scripted(tmp.path(), &json!({"steps": [{"type": "echo"}]}), &[]);
    a.close_stdin();
    let (events, status) = a.finish();
    assert!(status.success(), "{}", a.stderr());
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| e["subtype"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(kinds, ["init", "end"]);
    assert_eq!(events[1]["turns"], 0);

    // Messages piped and stdin closed at once (`echo … | cc-app-server agent`): every one runs,
    // in order, then the session ends.
    let tmp = state_dir();
    let mut a = Agent::scripted(tmp.path(), &json!({"steps": [{"type": "echo"}]}), &[]);
    a.send(&json!({"type": "user", "text": "one"}));
    a.send(&json!({"type": "user", "message": {"role": "user", "content": [{"type": "text", "text": "two"}]}}));
    a.close_stdin();
    let (events, status) = a.finish();
    assert!(status.success(), "{}", a.stderr());
    let results: Vec<&Value> = of_type(&events, "result");
    assert_eq!(results.len(), 2);
    assert_eq!(results[0]["result"], "You said: one");
    assert_eq!(results[1]["result"], "You said: two");
    assert_eq!(
        (
            results[1]["turn"].as_u64(),
            results[1]["num_turns"].as_u64()
        ),
        (Some(2), Some(2))
    );
    assert_eq!(events.last().unwrap()["turns"], 2);

    // A line without its newline at EOF is still read.
    let tmp = state_dir();
    let mut a = Agent::scripted(tmp.path(), &json!({"steps": [{"type": "echo"}]}), &[]);
    a.stdin
        .as_mut()
        .unwrap()
        .write_all(br#"{"type":"user","text":"last"}"#)
        .unwrap();
    a.close_stdin();
    let (events, status) = a.finish();
    assert!(status.success());
    assert_eq!(of_type(&events, "result")[0]["result"], "You said: last");
}

#[test]
fn agent_refuses_unknown_formats_with_a_clear_error() {
    for (flag, value) in [("--input-format", "text"), ("--output-format", "json")] {
        let out = Command::new(BIN)
            .args(["agent", flag, value])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{flag} {value}");
        assert!(out.stdout.is_empty(), "nothing on stdout");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(flag) && err.contains("stream-json"), "{err}");
    }
    let (rc, out, _) = common::run(&["agent", "--help"]);
    assert_eq!(rc, 0);
    for w in [
        "--input-format",
        "--include-partial-messages",
        "--interactive-approvals",
        "--resume",
        "--session",
        "--fork-session",
        "--permission-mode",
        "--model",
        "--provider",
    ] {
        assert!(out.contains(w), "agent --help lacks {w}");
    }
}

#[test]
fn agent_controls_interrupt_compact_slash_commands_and_questions() {
    let tmp = state_dir();
    let script = json!({"steps": [
        {"type": "message", "text": "working", "chunks": 1},
        {"type": "sleep", "ms": 20000},
        {"type": "message", "text": "never"}
    ]});
    let mut a = Agent::scripted(
        tmp.path(),
        &script,
        &["--include-partial-messages", "--replay-user-messages"],
    );
    let init = a.next();
    a.send(&json!({"type": "user", "text": "long job"}));
    let echo = a.until_type("user").pop().unwrap();
    assert_eq!(echo["message"]["content"][0]["text"], "long job");
    a.until_type("stream_event");
    let asked = Instant::now();
    a.send(&json!({"type": "interrupt"}));
    let result = a.until_type("result").pop().unwrap();
    assert!(
        asked.elapsed() < Duration::from_secs(10),
        "the interrupt did not wait out the sleep"
    );
    assert_eq!(
        (
            &result["subtype"],
            &result["is_error"],
            &result["interrupted"]
        ),
        (&json!("interrupted"), &json!(false), &json!(true))
    );

    // Inputs this engine has nothing for are answered, never silently dropped.
    a.send(&json!({"type": "answer", "id": "q-1", "answer": "dev"}));
    assert_eq!(a.next()["type"], "question_response_rejected");
    a.send(
        &json!({"type": "slash_command", "request_id": "r-1", "command": "/deploy", "args": ""}),
    );
    let r = a.next();
    assert_eq!(
        (&r["type"], &r["ok"]),
        (&json!("slash_command_result"), &json!(false))
    );
    for bad in [
        json!({"type": "feedback", "kind": "positive"}),
        json!({"type": "bogus"}),
        json!({"text": "x"}),
    ] {
        a.send(&bad);
        assert_eq!(a.next()["type"], "session_error", "{bad}");
    }
    a.send_raw_line(b"not json");
    assert_eq!(a.next()["type"], "session_error");
    a.send(&json!({"type": "user", "text": "with a picture", "images": ["/tmp/x.png"]}));
    let r = a.next();
    assert_eq!(
        (&r["type"], &r["is_error"]),
        (&json!("result"), &json!(true))
    );

    // Compaction: the scripted kernel cannot summarise (degraded); a given summary is recorded,
    // also through the /compact slash command.
    a.send(&json!({"type": "compact"}));
    assert_eq!(a.next()["type"], "compaction-degraded");
    a.send(&json!({"type": "compact", "summary": "the user started a long job and stopped it"}));
    let c = a.next();
    assert_eq!(c["type"], "compaction", "{c}");
    assert!(c["stats"]["event_seq"].as_u64().is_some());
    a.send(&json!({"type": "user", "text": "x"}));
    a.send(&json!({"type": "interrupt"}));
    a.until_type("result");
    a.send(&json!({"type": "slash_command", "request_id": "r-2", "command": "compact", "args": "short"}));
    let events = a.until_type("slash_command_result");
    assert_eq!(events.last().unwrap()["ok"], true, "{events:?}");

    // Capability negotiation narrows the additive fields.
    a.send(&json!({"type": "hello", "protocol_version": 1, "features": ["trace_id"]}));
    let line = a.lines.recv_timeout(TIMEOUT).unwrap();
    let n: Value = serde_json::from_str(&line).unwrap();
    check_event(&n);
    assert_eq!(
        (&n["subtype"], &n["ok"], &n["downgraded"]),
        (&json!("negotiated"), &json!(true), &json!(true))
    );
    assert!(
        n.get("seq").is_none(),
        "seq is off once the client declined event_seq"
    );
    assert_eq!(n["trace_id"], init["trace_id"]);
    a.close_stdin();
    let (_, status) = a.finish();
    assert!(status.success(), "{}", a.stderr());
}

impl Agent {
    fn send_raw_line(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(bytes).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
    }
}

#[test]
fn agent_sessions_resume_and_fork_from_the_rollout() {
    let tmp = state_dir();
    let script = json!({"steps": [{"type": "echo"}]});
    let mut a = Agent::scripted(tmp.path(), &script, &["--session", "sess-1"]);
    let init = a.next();
    assert_eq!(
        (&init["session_id"], &init["resumed_messages"]),
        (&json!("sess-1"), &json!(0))
    );
    a.send(&json!({"type": "user", "text": "remember me"}));
    a.until_type("result");
    a.close_stdin();
    assert!(a.finish().1.success());

    // --resume: the same session, its messages counted.
    let mut a = Agent::scripted(tmp.path(), &script, &["--resume", "sess-1"]);
    let init = a.next();
    assert_eq!(
        (&init["session_id"], &init["resumed_messages"]),
        (&json!("sess-1"), &json!(2))
    );
    a.close_stdin();
    assert!(a.finish().1.success());
    // --session of an existing thread resumes it too.
    let mut a = Agent::scripted(tmp.path(), &script, &["--session", "sess-1"]);
    assert_eq!(a.next()["resumed_messages"], 2);
    a.close_stdin();
    assert!(a.finish().1.success());

    // --fork-session: a new session that starts with the original's history.
    let mut a = Agent::scripted(
        tmp.path(),
        &script,
        &["--resume", "sess-1", "--fork-session"],
    );
    let init = a.next();
    assert_ne!(init["session_id"], "sess-1");
    assert_eq!(init["resumed_messages"], 2);
    a.close_stdin();
    assert!(a.finish().1.success());

    // A session that does not exist cannot be resumed: said on the stream and on exit.
    let mut a = Agent::scripted(tmp.path(), &script, &["--resume", "nope"]);
    let e = a.next();
    assert_eq!(
        (&e["type"], &e["error"]),
        (&json!("session_error"), &json!("startup_failed"))
    );
    a.close_stdin();
    let (_, status) = a.finish();
    assert_eq!(status.code(), Some(1));
}
