//! The server's own paths inside the workspace (its state directory, its rollout key) are
//! refused by every tool, whatever name, symlink, hard link, `..` or absolute path leads there,
//! and nothing in them is read, changed or created.
#![cfg(unix)]

use cc_app_server::kernel::ToolExecutor;
use cc_app_server::protocol::{ToolCall, ToolResult};
use cc_app_server::workspace_tools::WorkspaceTools;
use serde_json::{json, Value};
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

fn call(t: &WorkspaceTools, tool: &str, args: Value) -> ToolResult {
    t.execute(
        "t1",
        &ToolCall {
            tool: tool.into(),
            arguments: args,
        },
    )
}

fn ok(r: ToolResult) -> Value {
    match r {
        ToolResult::Ok(o) => o.output,
        other => panic!("expected ok, got {other:?}"),
    }
}

fn refused(r: ToolResult, what: &str) {
    match r {
        ToolResult::Error(e) => assert!(
            e.message.ends_with("refused") && e.message.contains("the server"),
            "{what}: {}",
            e.message
        ),
        other => panic!("{what}: expected a refusal, got {other:?}"),
    }
}

struct Ws {
    _dir: tempfile::TempDir,
    ws: PathBuf,
}

/// A workspace holding the server's state directory and key file, as `serve --state-dir
/// ./.cc-state` from the workspace would.
fn workspace() -> Ws {
    let dir = tempfile::tempdir().unwrap();
    let ws = fs::canonicalize(dir.path()).unwrap();
    fs::create_dir_all(ws.join(".cc-state/threads")).unwrap();
    fs::write(ws.join(".cc-state/threads/t1.jsonl"), "live rollout\n").unwrap();
    fs::write(ws.join("rollout.key"), "KEY-BYTES").unwrap();
    fs::write(ws.join("hello.txt"), "hello").unwrap();
    fs::create_dir(ws.join("sub")).unwrap();
    Ws { _dir: dir, ws }
}

fn protected(ws: &Path) -> WorkspaceTools {
    WorkspaceTools::new(ws)
        .unwrap()
        .with_protected(vec![ws.join(".cc-state"), ws.join("rollout.key")])
        .unwrap()
}

fn unchanged(ws: &Path) {
    assert_eq!(
        fs::read_to_string(ws.join(".cc-state/threads/t1.jsonl")).unwrap(),
        "live rollout\n"
    );
    assert_eq!(
        fs::read_to_string(ws.join("rollout.key")).unwrap(),
        "KEY-BYTES"
    );
    let mut names: Vec<_> = fs::read_dir(ws.join(".cc-state/threads"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(names, ["t1.jsonl"]);
}

#[test]
fn every_tool_refuses_the_state_directory_and_the_key_by_every_route() {
    let s = workspace();
    let ws = &s.ws;
    symlink(".cc-state", ws.join("state_link")).unwrap();
    symlink("../rollout.key", ws.join("sub/key_link")).unwrap();
    symlink(ws.join(".cc-state/threads"), ws.join("abs_link")).unwrap();
    fs::hard_link(ws.join("rollout.key"), ws.join("sub/key_hard")).unwrap();
    let t = protected(ws);
    let abs_rollout = ws.join(".cc-state/threads/t1.jsonl");
    let files = [
        "rollout.key",
        "./rollout.key",
        "sub/../rollout.key",
        "sub/key_link",
        "sub/key_hard",
        ".cc-state/threads/t1.jsonl",
        "state_link/threads/t1.jsonl",
        "abs_link/t1.jsonl",
        "sub/../.cc-state/threads/../threads/t1.jsonl",
        abs_rollout.to_str().unwrap(),
    ];
    for p in files {
        refused(
            call(&t, "read_file", json!({"path": p})),
            &format!("read {p}"),
        );
        refused(
            call(&t, "write_file", json!({"path": p, "content": "pwned"})),
            &format!("write {p}"),
        );
    }
    for p in [
        ".cc-state/new.jsonl",
        ".cc-state/threads/t2.jsonl",
        "state_link/deep/x/y.txt",
        "abs_link/t9.jsonl",
    ] {
        refused(
            call(&t, "write_file", json!({"path": p, "content": "x"})),
            &format!("write {p}"),
        );
    }
    for p in [
        ".cc-state",
        ".cc-state/threads",
        "state_link",
        "abs_link",
        "sub/../.cc-state/.",
    ] {
        refused(
            call(&t, "list_directory", json!({"path": p})),
            &format!("list {p}"),
        );
        refused(
            call(&t, "read_file", json!({"path": p})),
            &format!("read dir {p}"),
        );
    }
    unchanged(ws);
    assert!(!ws.join(".cc-state/deep").exists());
    assert_eq!(
        fs::read_to_string(ws.join("sub/key_hard")).unwrap(),
        "KEY-BYTES"
    );
    // Everything else works as before; the root's listing still names the state directory.
    assert_eq!(
        ok(call(&t, "read_file", json!({"path": "hello.txt"})))["content"],
        "hello"
    );
    ok(call(
        &t,
        "write_file",
        json!({"path": "sub/new.txt", "content": "n"}),
    ));
    let l = ok(call(&t, "list_directory", json!({"path": "."})));
    assert!(l["entries"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["name"] == ".cc-state"));
}

/// A protected path that does not exist yet is refused by name (the model cannot plant the
/// state directory before the server makes it), and by identity once it exists.
#[test]
fn a_protected_path_that_does_not_exist_yet_is_refused_by_name() {
    let s = workspace();
    let ws = &s.ws;
    let t = WorkspaceTools::new(ws)
        .unwrap()
        .with_protected(vec![ws.join(".state")])
        .unwrap();
    for p in [".state", ".state/threads/t1.jsonl", "sub/../.state/x"] {
        refused(
            call(&t, "write_file", json!({"path": p, "content": "x"})),
            &format!("write {p}"),
        );
    }
    assert!(!ws.join(".state").exists());
    // A lookalike name is not protected.
    ok(call(
        &t,
        "write_file",
        json!({"path": ".state2/x", "content": "x"}),
    ));
    fs::create_dir_all(ws.join(".state/threads")).unwrap();
    fs::write(ws.join(".state/threads/t1.jsonl"), "live").unwrap();
    symlink(".state", ws.join("later_link")).unwrap();
    refused(
        call(
            &t,
            "read_file",
            json!({"path": "later_link/threads/t1.jsonl"}),
        ),
        "read through a link made later",
    );
    refused(
        call(
            &t,
            "write_file",
            json!({"path": ".state/threads/t1.jsonl", "content": "x"}),
        ),
        "write once it exists",
    );
    assert_eq!(
        fs::read_to_string(ws.join(".state/threads/t1.jsonl")).unwrap(),
        "live"
    );
}

/// A key kept outside the workspace is out of reach anyway, but a hard link to it inside (same
/// file system) is the same file, and is refused.
#[test]
fn a_hard_link_to_a_protected_file_outside_the_workspace_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let base = fs::canonicalize(dir.path()).unwrap();
    fs::create_dir(base.join("ws")).unwrap();
    fs::write(base.join("rollout.key"), "KEY").unwrap();
    fs::hard_link(base.join("rollout.key"), base.join("ws/innocent.txt")).unwrap();
    fs::write(base.join("ws/other.txt"), "other").unwrap();
    let t = WorkspaceTools::new(base.join("ws"))
        .unwrap()
        .with_protected(vec![base.join("rollout.key"), base.join("state")])
        .unwrap();
    refused(
        call(&t, "read_file", json!({"path": "innocent.txt"})),
        "read the hard link",
    );
    refused(
        call(
            &t,
            "write_file",
            json!({"path": "innocent.txt", "content": "x"}),
        ),
        "write the hard link",
    );
    assert_eq!(fs::read_to_string(base.join("rollout.key")).unwrap(), "KEY");
    assert_eq!(
        ok(call(&t, "read_file", json!({"path": "other.txt"})))["content"],
        "other"
    );
}

/// A workspace inside the state directory would refuse everything: it is a configuration error.
#[test]
fn a_workspace_inside_a_protected_directory_is_a_configuration_error() {
    let dir = tempfile::tempdir().unwrap();
    let state = fs::canonicalize(dir.path()).unwrap();
    fs::create_dir(state.join("ws")).unwrap();
    for p in [state.clone(), state.join("ws"), state.join("ws/../ws")] {
        let e = WorkspaceTools::new(state.join("ws"))
            .unwrap()
            .with_protected(vec![p.clone()])
            .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{p:?}");
        assert!(
            e.to_string().contains("inside the protected directory"),
            "{e}"
        );
    }
    // Protecting `/` protects every workspace.
    let e = WorkspaceTools::new(state.join("ws"))
        .unwrap()
        .with_protected(vec![PathBuf::from("/")])
        .unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
}
