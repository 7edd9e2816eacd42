//! The workspace tool set against a real directory tree: what each tool does, every way a path
//! might leave the workspace (each refused, nothing outside touched), and run_command's timeout,
//! process-group kill, environment scrubbing and output cap at their edges.

use cc_app_server::kernel::ToolExecutor;
use cc_app_server::protocol::{ToolCall, ToolResult};
use cc_app_server::workspace_tools::{WorkspaceLimits, WorkspaceTools};
use serde_json::{json, Value};
use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

struct Setup {
    _dir: tempfile::TempDir,
    ws: std::path::PathBuf,
    outside: std::path::PathBuf,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let outside = dir.path().join("outside");
    fs::create_dir_all(ws.join("sub")).unwrap();
    fs::create_dir_all(&outside).unwrap();
    fs::write(outside.join("secret.txt"), "top secret").unwrap();
    fs::write(ws.join("hello.txt"), "hello").unwrap();
    Setup {
        ws: fs::canonicalize(&ws).unwrap(),
        outside: fs::canonicalize(&outside).unwrap(),
        _dir: dir,
    }
}

fn call(tools: &WorkspaceTools, tool: &str, args: Value) -> ToolResult {
    tools.execute(
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

fn err(r: ToolResult) -> String {
    match r {
        ToolResult::Error(e) => e.message,
        other => panic!("expected an error, got {other:?}"),
    }
}

fn small(ws: &Path) -> WorkspaceTools {
    WorkspaceTools::with_limits(
        ws,
        WorkspaceLimits {
            max_read_bytes: 10,
            max_write_bytes: 10,
            max_entries: 3,
            max_output_bytes: 100,
            default_timeout: Duration::from_secs(10),
            max_timeout: Duration::from_secs(20),
            max_processes: 256,
        },
    )
    .unwrap()
}

#[test]
fn read_write_list_inside_the_workspace() {
    let s = setup();
    let t = WorkspaceTools::new(&s.ws).unwrap();
    assert_eq!(
        ok(call(&t, "read_file", json!({"path": "hello.txt"})))["content"],
        "hello"
    );
    let w = ok(call(
        &t,
        "write_file",
        json!({"path": "new/deep/a.txt", "content": "A"}),
    ));
    assert_eq!(w["kind"], "add");
    assert_eq!(
        fs::read_to_string(s.ws.join("new/deep/a.txt")).unwrap(),
        "A"
    );
    let w = ok(call(
        &t,
        "write_file",
        json!({"path": "new/deep/a.txt", "content": "B"}),
    ));
    assert_eq!(w["kind"], "update");
    assert_eq!(
        fs::read_to_string(s.ws.join("new/deep/a.txt")).unwrap(),
        "B"
    );
    // An absolute path inside the workspace is fine.
    let abs = s.ws.join("hello.txt");
    assert_eq!(
        ok(call(
            &t,
            "read_file",
            json!({"path": abs.to_str().unwrap()})
        ))["content"],
        "hello"
    );
    let l = ok(call(&t, "list_directory", json!({"path": "."})));
    let names: Vec<&str> = l["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["hello.txt", "new", "sub"]);
    assert_eq!(l["entries"][1]["type"], "directory");
    // `..` that stays inside is fine.
    assert_eq!(
        ok(call(&t, "read_file", json!({"path": "sub/../hello.txt"})))["content"],
        "hello"
    );
    assert!(err(call(&t, "read_file", json!({"path": "sub"}))).contains("directory"));
    assert!(err(call(&t, "read_file", json!({"path": "missing.txt"}))).contains("missing.txt"));
    assert!(err(call(&t, "rm_rf", json!({}))).contains("unknown tool"));
    assert!(err(call(&t, "read_file", json!({}))).contains("path"));
}

#[cfg(unix)]
#[test]
fn every_fs_tool_refuses_every_escape_and_touches_nothing_outside() {
    use std::os::unix::fs::symlink;
    let s = setup();
    symlink(&s.outside, s.ws.join("out_dir")).unwrap();
    symlink(s.outside.join("secret.txt"), s.ws.join("out_file")).unwrap();
    symlink("../outside", s.ws.join("rel_out")).unwrap();
    symlink(s.outside.join("new.txt"), s.ws.join("dangling_out")).unwrap();
    // A chain that stays inside, and one that leaves at the end.
    symlink("sub", s.ws.join("in_dir")).unwrap();
    symlink("in_dir/../rel_out", s.ws.join("chain_out")).unwrap();
    let t = WorkspaceTools::new(&s.ws).unwrap();
    let escapes = [
        "../outside/secret.txt",
        "sub/../../outside/secret.txt",
        s.outside
            .join("secret.txt")
            .to_str()
            .unwrap()
            .to_string()
            .leak(),
        "/etc/passwd",
        "out_dir/secret.txt",
        "out_file",
        "rel_out/secret.txt",
        "chain_out/secret.txt",
        "dangling_out",
        "..",
    ];
    for p in escapes {
        let m = err(call(&t, "read_file", json!({"path": p})));
        assert!(m.contains("outside the workspace"), "read {p}: {m}");
        let m = err(call(
            &t,
            "write_file",
            json!({"path": p, "content": "pwned"}),
        ));
        assert!(m.contains("outside the workspace"), "write {p}: {m}");
        let m = err(call(&t, "list_directory", json!({"path": p})));
        assert!(
            m.contains("outside the workspace") || m.contains("not a directory"),
            "list {p}: {m}"
        );
    }
    for p in ["out_dir/x/y.txt", "rel_out/new.txt", "../new.txt"] {
        let m = err(call(
            &t,
            "write_file",
            json!({"path": p, "content": "pwned"}),
        ));
        assert!(m.contains("outside the workspace"), "write {p}: {m}");
    }
    // Nothing outside changed or appeared.
    assert_eq!(
        fs::read_to_string(s.outside.join("secret.txt")).unwrap(),
        "top secret"
    );
    let mut outside: Vec<_> = fs::read_dir(&s.outside)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    outside.sort();
    assert_eq!(outside, ["secret.txt"]);
    assert!(!s.ws.parent().unwrap().join("new.txt").exists());
    // Symlinks that stay inside work.
    assert_eq!(
        ok(call(
            &t,
            "write_file",
            json!({"path": "in_dir/x.txt", "content": "x"})
        ))["kind"],
        "add"
    );
    assert_eq!(fs::read_to_string(s.ws.join("sub/x.txt")).unwrap(), "x");
    let l = ok(call(&t, "list_directory", json!({"path": "."})));
    let kinds: Vec<(&str, &str)> = l["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap(), e["type"].as_str().unwrap()))
        .collect();
    assert!(kinds.contains(&("out_dir", "symlink")), "{kinds:?}");
}

#[test]
fn read_write_and_list_bounds_at_their_edges() {
    let s = setup();
    let t = small(&s.ws);
    fs::write(s.ws.join("ten.txt"), "0123456789").unwrap();
    fs::write(s.ws.join("eleven.txt"), "0123456789X").unwrap();
    let r = ok(call(&t, "read_file", json!({"path": "ten.txt"})));
    assert_eq!(
        (r["content"].as_str(), r["truncated"].as_bool()),
        (Some("0123456789"), Some(false))
    );
    let r = ok(call(&t, "read_file", json!({"path": "eleven.txt"})));
    assert_eq!(
        (r["content"].as_str(), r["truncated"].as_bool()),
        (Some("0123456789"), Some(true))
    );
    ok(call(
        &t,
        "write_file",
        json!({"path": "w.txt", "content": "0123456789"}),
    ));
    let m = err(call(
        &t,
        "write_file",
        json!({"path": "w2.txt", "content": "0123456789X"}),
    ));
    assert!(m.contains("at most 10"), "{m}");
    assert!(!s.ws.join("w2.txt").exists());
    // Now 5 entries at the root (hello, sub, ten, eleven, w) with max_entries 3.
    let l = ok(call(&t, "list_directory", json!({"path": "."})));
    assert_eq!(l["entries"].as_array().unwrap().len(), 3);
    assert_eq!(
        (l["total"].as_u64(), l["truncated"].as_bool()),
        (Some(5), Some(true))
    );
    fs::create_dir(s.ws.join("three")).unwrap();
    for n in ["a", "b", "c"] {
        fs::write(s.ws.join("three").join(n), n).unwrap();
    }
    let l = ok(call(&t, "list_directory", json!({"path": "three"})));
    assert_eq!(
        (l["total"].as_u64(), l["truncated"].as_bool()),
        (Some(3), Some(false))
    );
}

#[cfg(unix)]
#[test]
fn run_command_runs_without_a_shell_in_the_workspace_with_a_scrubbed_env() {
    let s = setup();
    let t = WorkspaceTools::new(&s.ws).unwrap();
    std::env::set_var("CC_APP_SERVER_API_KEY", "sk-should-never-leak");
    let r = ok(call(
        &t,
        "run_command",
        json!({"argv": ["sh", "-c", "pwd; env; exit 3"]}),
    ));
    assert_eq!(r["exitCode"], 3);
    let out = r["stdout"].as_str().unwrap();
    assert!(out.starts_with(s.ws.to_str().unwrap()), "{out}");
    assert!(
        !out.contains("sk-should-never-leak"),
        "the env was not scrubbed: {out}"
    );
    assert!(out.contains("PATH="), "{out}");
    // No shell: `$HOME` and `;` are passed literally.
    let r = ok(call(
        &t,
        "run_command",
        json!({"argv": ["echo", "$HOME;", "*"]}),
    ));
    assert_eq!(r["stdout"], "$HOME; *\n");
    assert_eq!(r["exitCode"], 0);
    let m = err(call(
        &t,
        "run_command",
        json!({"argv": ["definitely-not-a-program-xyz"]}),
    ));
    assert!(m.contains("cannot start"), "{m}");
    assert!(err(call(&t, "run_command", json!({"argv": []}))).contains("argv"));
    assert!(err(call(&t, "run_command", json!({"argv": "ls -la"}))).contains("argv"));
}

#[cfg(target_os = "linux")]
#[test]
fn run_command_timeout_kills_the_whole_process_group() {
    let s = setup();
    let t = small(&s.ws);
    let started = Instant::now();
    // The shell starts a grandchild that would outlive a kill of the shell alone.
    let r = ok(call(
        &t,
        "run_command",
        json!({"argv": ["sh", "-c", "sleep 30 & echo $! > bg.pid; wait"], "timeout_ms": 300}),
    ));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(r["timedOut"], true);
    assert_eq!(r["exitCode"], Value::Null);
    assert_eq!(r["signal"], 9);
    let pid: i32 = fs::read_to_string(s.ws.join("bg.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // Killed but not yet reaped (its parent died; whoever adopted it reaps) counts as dead.
    let running = |pid: i32| {
        fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                let state = s.rsplit(')').next().unwrap_or("").trim_start();
                !state.starts_with('Z') && !state.starts_with('X')
            })
            .unwrap_or(false)
    };
    let mut alive = true;
    for _ in 0..100 {
        alive = running(pid);
        if !alive {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!alive, "the grandchild {pid} survived the timeout");
    // timeout_ms bounds: the max is accepted, max+1 and 0 are refused.
    let ok20 = ok(call(
        &t,
        "run_command",
        json!({"argv": ["true"], "timeout_ms": 20000}),
    ));
    assert_eq!(ok20["timeoutMs"], 20000);
    for bad in [json!(20001), json!(0), json!("5")] {
        let m = err(call(
            &t,
            "run_command",
            json!({"argv": ["true"], "timeout_ms": bad}),
        ));
        assert!(m.contains("from 1 to 20000"), "{m}");
    }
}

#[cfg(unix)]
#[test]
fn run_command_caps_output_and_reports_the_cap() {
    let s = setup();
    let t = small(&s.ws);
    let r = ok(call(
        &t,
        "run_command",
        json!({"argv": ["head", "-c", "100", "/dev/zero"]}),
    ));
    assert_eq!(r["stdout"].as_str().unwrap().len(), 100);
    assert_eq!(
        (r["stdoutBytes"].as_u64(), r["stdoutTruncated"].as_bool()),
        (Some(100), Some(false))
    );
    let r = ok(call(
        &t,
        "run_command",
        json!({"argv": ["head", "-c", "101", "/dev/zero"]}),
    ));
    assert_eq!(r["stdout"].as_str().unwrap().len(), 100);
    assert_eq!(
        (r["stdoutBytes"].as_u64(), r["stdoutTruncated"].as_bool()),
        (Some(101), Some(true))
    );
    assert_eq!(r["outputCapBytes"], 100);
    // A flood far past the cap is drained (the command is not blocked on a full pipe).
    let r = ok(call(
        &t,
        "run_command",
        json!({"argv": ["sh", "-c", "head -c 5000000 /dev/zero; head -c 300 /dev/zero >&2"]}),
    ));
    assert_eq!(r["exitCode"], 0);
    assert_eq!(r["stdoutBytes"], 5_000_000);
    assert_eq!(
        (r["stderrBytes"].as_u64(), r["stderrTruncated"].as_bool()),
        (Some(300), Some(true))
    );
}

#[test]
fn the_tool_specs_name_every_tool_with_an_object_schema() {
    let s = setup();
    let t = WorkspaceTools::new(&s.ws).unwrap();
    let names: Vec<String> = t.tool_specs().into_iter().map(|s| s.name).collect();
    assert_eq!(
        names,
        ["read_file", "write_file", "list_directory", "run_command"]
    );
    for spec in t.tool_specs() {
        assert_eq!(spec.parameters["type"], "object");
    }
    assert!(WorkspaceTools::new(s.ws.join("hello.txt")).is_err());
    assert!(WorkspaceTools::new(s.ws.join("nope")).is_err());
}
