//! `cc-app-server serve --kernel openai` end to end: a child process speaking wire v1 on its
//! stdio, a real model server on loopback, the workspace tools behind the approval gate.

#[path = "../../core/tests/openai_support/mod.rs"]
mod openai_support;

use openai_support::*;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

#[test]
fn serve_runs_a_tool_turn_against_an_openai_compatible_server() {
    let model = MockModel::start(vec![
        tool_calls(&[(
            "call_1",
            "write_file",
            r#"{"path":"hello.txt","content":"hi from the model"}"#,
        )]),
        answer(&["Wrote ", "hello.txt."]),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_cc-app-server"))
        .args(["serve", "--state-dir"])
        .arg(dir.path().join("state"))
        .args([
            "--kernel",
            "openai",
            "--base-url",
            &model.base_url,
            "--model",
            "llama3.2",
            "--workspace",
        ])
        .arg(&ws)
        .env("CC_APP_SERVER_API_KEY", "sk-e2e-secret-key")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let (tx, rx) = mpsc::channel::<Value>();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let v: Value = serde_json::from_str(&line).expect("stdout carries only JSON lines");
            if tx.send(v).is_err() {
                break;
            }
        }
    });
    let mut send = |v: Value| {
        writeln!(stdin, "{v}").unwrap();
        stdin.flush().unwrap();
    };
    send(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1,
        "minimumProtocolVersion": 1, "client": {"name": "e2e", "version": "1"},
        "features": ["thread_turn_item", "structured_approval"]}}),
    );
    send(
        json!({"jsonrpc": "2.0", "id": 2, "method": "thread/start", "params": {"threadId": "e2e"}}),
    );
    send(
        json!({"jsonrpc": "2.0", "id": 3, "method": "turn/start", "params": {"threadId": "e2e",
        "input": [{"type": "text", "text": "write hello.txt"}]}}),
    );
    let mut seen = Vec::new();
    let done = loop {
        let m = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the turn ends in time");
        cc_agent_protocol::validate_protocol_message(&m).unwrap();
        if m["method"] == "approval/decide" {
            assert_eq!(m["params"]["operation"]["tool"], "write_file");
            send(json!({"jsonrpc": "2.0", "id": m["id"], "result": {"kind": "acceptOnce"}}));
        }
        if m["method"] == "turn/completed" {
            break m;
        }
        seen.push(m);
    };
    assert_eq!(done["params"]["turn"]["status"], "completed", "{done}");
    assert_eq!(
        std::fs::read_to_string(ws.join("hello.txt")).unwrap(),
        "hi from the model"
    );
    let answer = seen
        .iter()
        .find(|m| {
            m["method"] == "item/completed"
                && m["params"]["item"]["content"]["type"] == "agentMessage"
        })
        .unwrap();
    assert_eq!(
        answer["params"]["item"]["content"]["text"],
        "Wrote hello.txt."
    );
    assert_eq!(answer["params"]["item"]["kind"], "assistant_message");
    let reqs = model.requests();
    assert_eq!(reqs[0].body["model"], "llama3.2");
    assert_eq!(
        reqs[0].header("authorization"),
        Some("Bearer sk-e2e-secret-key")
    );
    assert_eq!(
        reqs[1].body["messages"].as_array().unwrap().last().unwrap()["tool_call_id"],
        "call_1"
    );
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("sk-e2e-secret-key"), "{stderr}");
    let log = std::fs::read_to_string(dir.path().join("state/threads/e2e.jsonl")).unwrap();
    assert!(!log.contains("sk-e2e-secret-key"));
}

#[test]
fn serve_refuses_an_openai_kernel_without_a_model_and_says_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_cc-app-server"))
        .args(["serve", "--state-dir"])
        .arg(dir.path())
        .args(["--kernel", "openai", "--base-url", "http://127.0.0.1:9/v1"])
        .env_remove("CC_APP_SERVER_MODEL")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--model"), "{stderr}");
}
