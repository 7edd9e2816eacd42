//! run_command's containment with real child processes (Linux): whatever a command starts — a
//! `setsid` grandchild, a double-forked daemon, a process that keeps stdout open, a fork loop —
//! is killed at the deadline, when the command exits, on interrupt and when the server dies, and
//! the call returns within the deadline plus a small grace whoever still holds the pipes.
#![cfg(target_os = "linux")]

use cc_app_server::kernel::ToolExecutor;
use cc_app_server::protocol::{ToolCall, ToolResult};
use cc_app_server::workspace_tools::{WorkspaceLimits, WorkspaceTools};
use serde_json::{json, Value};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn tools(ws: &Path) -> WorkspaceTools {
    WorkspaceTools::with_limits(
        ws,
        WorkspaceLimits {
            default_timeout: Duration::from_secs(20),
            max_timeout: Duration::from_secs(60),
            ..WorkspaceLimits::default()
        },
    )
    .unwrap()
}

fn run(t: &WorkspaceTools, script: &str, timeout_ms: u64) -> (Value, Duration) {
    let started = Instant::now();
    let r = t.execute(
        "t1",
        &ToolCall {
            tool: "run_command".into(),
            arguments: json!({"argv": ["sh", "-c", script], "timeout_ms": timeout_ms}),
        },
    );
    match r {
        ToolResult::Ok(o) => (o.output, started.elapsed()),
        other => panic!("expected ok, got {other:?}"),
    }
}

/// Alive and not a zombie (a zombie has been killed; its parent just has not reaped it yet).
fn running(pid: i32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            let state = s.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z') && !state.starts_with('X')
        })
        .unwrap_or(false)
}

/// Waits up to 2 s for `pid` to die (SIGKILL is delivered asynchronously).
fn dies(pid: i32) -> bool {
    for _ in 0..200 {
        if !running(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

fn pids(file: &Path) -> Vec<i32> {
    fs::read_to_string(file)
        .unwrap_or_default()
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect()
}

fn wait_for_file(file: &Path) {
    for _ in 0..1000 {
        if fs::read_to_string(file).is_ok_and(|s| s.ends_with('\n')) {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("{} never appeared", file.display());
}

fn workspace() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let ws = fs::canonicalize(dir.path()).unwrap();
    (dir, ws)
}

/// The grandchild leaves the process group (and the session) and keeps stdout and stderr open;
/// the deadline still ends the call and kills it.
#[test]
fn a_setsid_grandchild_dies_at_the_deadline_and_the_call_returns_on_time() {
    let (_d, ws) = workspace();
    let t = tools(&ws);
    let (r, took) = run(&t, "setsid sleep 60 & echo $! > bg.pid; sleep 30", 1500);
    assert!(took < Duration::from_secs(4), "returned after {took:?}");
    assert_eq!(r["timedOut"], true, "{r}");
    assert_eq!(r["signal"], 9, "{r}");
    let pid = pids(&ws.join("bg.pid"))[0];
    assert!(
        dies(pid),
        "the setsid'd grandchild {pid} survived the deadline"
    );
}

/// The command exits at once but leaves a grandchild in its own session holding the pipes: the
/// call returns when the command exits (not when the grandchild would) and the grandchild dies.
#[test]
fn a_grandchild_holding_the_pipes_does_not_outlive_the_command() {
    let (_d, ws) = workspace();
    let t = tools(&ws);
    let (r, took) = run(
        &t,
        "setsid sleep infinity & echo $! > bg.pid; echo done",
        20_000,
    );
    assert!(took < Duration::from_secs(4), "returned after {took:?}");
    assert_eq!(r["timedOut"], false, "{r}");
    assert_eq!(r["exitCode"], 0, "{r}");
    assert_eq!(r["stdout"], "done\n", "{r}");
    let pid = pids(&ws.join("bg.pid"))[0];
    assert!(dies(pid), "the grandchild {pid} survived its command");
}

/// The classic daemon: fork, setsid, fork again, parents exit, stdio to /dev/null. It holds no
/// pipe, so nothing waits for it, and it still dies with the command.
#[test]
fn a_double_forked_daemon_dies_with_its_command() {
    let (_d, ws) = workspace();
    let t = tools(&ws);
    let daemon = "(setsid sh -c 'sleep 60 </dev/null >/dev/null 2>&1 & echo $! > d.pid' &); \
                  while [ ! -s d.pid ]; do sleep 0.01; done; exit 7";
    let (r, took) = run(&t, daemon, 20_000);
    assert!(took < Duration::from_secs(4), "returned after {took:?}");
    assert_eq!(r["exitCode"], 7, "{r}");
    let pid = pids(&ws.join("d.pid"))[0];
    assert!(dies(pid), "the daemon {pid} survived its command");
}

/// A writer outside the command's process tree (this test, through /proc/PID/fd/1) keeps the
/// stdout pipe open after everything the command started is dead: the call still returns at the
/// deadline plus the grace, instead of reading until that writer closes.
#[test]
fn output_is_not_read_past_the_deadline_whoever_holds_the_pipe() {
    let (_d, ws) = workspace();
    let t = tools(&ws);
    let pidfile = ws.join("cmd.pid");
    let holder = {
        let pidfile = pidfile.clone();
        std::thread::spawn(move || {
            wait_for_file(&pidfile);
            let pid = pids(&pidfile)[0];
            fs::OpenOptions::new()
                .write(true)
                .open(format!("/proc/{pid}/fd/1"))
                .unwrap()
        })
    };
    let (r, took) = run(&t, "echo $$ > cmd.pid; echo hi; sleep 30", 1000);
    let held = holder.join().unwrap();
    assert!(took < Duration::from_secs(4), "returned after {took:?}");
    assert_eq!(r["timedOut"], true, "{r}");
    assert_eq!(r["stdout"], "hi\n", "{r}");
    drop(held);
}

/// When the server dies (SIGKILL: no destructor runs), the command and everything it started
/// die too. The "server" is this test binary run again as a helper (see `helper_server`).
#[test]
fn the_commands_die_with_the_server() {
    let (_d, ws) = workspace();
    let mut helper = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "helper_server",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("CC_WORKSPACE_HELPER", &ws)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for_file(&ws.join("bg.pid"));
    wait_for_file(&ws.join("cmd.pid"));
    let bg = pids(&ws.join("bg.pid"))[0];
    let cmd = pids(&ws.join("cmd.pid"))[0];
    assert!(running(bg) && running(cmd));
    helper.kill().unwrap();
    helper.wait().unwrap();
    assert!(dies(cmd), "the command {cmd} survived the server");
    assert!(dies(bg), "the setsid'd grandchild {bg} survived the server");
}

/// The helper for `the_commands_die_with_the_server`: a no-op unless CC_WORKSPACE_HELPER names
/// a workspace; then it runs a long command there and is killed while it runs.
#[test]
fn helper_server() {
    let Some(ws) = std::env::var_os("CC_WORKSPACE_HELPER") else {
        return;
    };
    let t = tools(Path::new(&ws));
    run(
        &t,
        "setsid sleep 60 & echo $! > bg.pid; echo $$ > cmd.pid; sleep 60",
        60_000,
    );
}

fn bounded(ws: &Path, max_processes: usize) -> WorkspaceTools {
    WorkspaceTools::with_limits(
        ws,
        WorkspaceLimits {
            max_processes,
            default_timeout: Duration::from_secs(20),
            max_timeout: Duration::from_secs(60),
            ..WorkspaceLimits::default()
        },
    )
    .unwrap()
}

/// The bound counts the command and everything below it at once: `sh` plus four `sleep`s is five
/// and runs to its end under a bound of 5; a fifth `sleep` (six) kills the whole tree.
#[test]
fn the_process_bound_at_its_edge() {
    let (_d, ws) = workspace();
    let t = bounded(&ws, 5);
    let (r, _) = run(&t, "for i in 1 2 3 4; do sleep 1 & done; wait", 20_000);
    assert_eq!(r["exitCode"], 0, "{r}");
    assert_eq!(r["processLimitExceeded"], false, "{r}");
    assert_eq!(r["maxProcesses"], 5, "{r}");
    let (r, took) = run(
        &t,
        "for i in 1 2 3 4 5; do sleep 3 & echo $! >> pids; done; wait",
        20_000,
    );
    assert_eq!(r["processLimitExceeded"], true, "{r}");
    assert_eq!(r["signal"], 9, "{r}");
    assert_eq!(r["timedOut"], false, "{r}");
    assert!(took < Duration::from_secs(3), "the tree ran {took:?}");
    for pid in pids(&ws.join("pids")) {
        assert!(dies(pid), "{pid} survived the process bound");
    }
    // The bound's own range: 1 to MAX_PROCESSES_CAP.
    use cc_app_server::workspace_tools::MAX_PROCESSES_CAP;
    for (n, fine) in [
        (0, false),
        (1, true),
        (MAX_PROCESSES_CAP, true),
        (MAX_PROCESSES_CAP + 1, false),
    ] {
        let limits = WorkspaceLimits {
            max_processes: n,
            ..WorkspaceLimits::default()
        };
        let made = WorkspaceTools::with_limits(&ws, limits);
        assert_eq!(made.is_ok(), fine, "max_processes {n}");
        if let Err(e) = made {
            assert!(e.to_string().contains("max_processes"), "{e}");
        }
    }
}

/// A fork loop is stopped by the bound long before its deadline, and nothing it started lives.
#[test]
fn a_fork_loop_hits_the_process_bound() {
    let (_d, ws) = workspace();
    let t = bounded(&ws, 20);
    let (r, took) = run(
        &t,
        "while :; do setsid sleep 30 & echo $! >> pids; done",
        20_000,
    );
    assert_eq!(r["processLimitExceeded"], true, "{r}");
    assert_eq!(r["timedOut"], false, "{r}");
    assert!(took < Duration::from_secs(5), "the loop ran {took:?}");
    let started = pids(&ws.join("pids"));
    assert!(started.len() >= 19, "{} started", started.len());
    eprintln!(
        "the fork loop started {} processes under a bound of 20",
        started.len()
    );
    for pid in started {
        assert!(dies(pid), "{pid} survived the process bound");
    }
}

/// `interrupt` stops the commands of one thread: the call returns at once, interrupted, with the
/// whole tree dead; other threads' commands are not touched.
#[test]
fn interrupt_kills_the_tree_of_that_threads_command() {
    let (_d, ws) = workspace();
    let t = tools(&ws);
    std::thread::scope(|s| {
        let call = s.spawn(|| {
            let started = Instant::now();
            let r = t.execute(
                "t9",
                &ToolCall {
                    tool: "run_command".into(),
                    arguments: json!({"argv": ["sh", "-c", "setsid sleep 60 & echo $! > bg.pid; sleep 60"], "timeout_ms": 30_000}),
                },
            );
            (r, started)
        });
        wait_for_file(&ws.join("bg.pid"));
        assert_eq!(t.interrupt("other"), 0);
        let asked = Instant::now();
        assert_eq!(t.interrupt("t9"), 1);
        let (r, _) = call.join().unwrap();
        assert!(
            asked.elapsed() < Duration::from_secs(3),
            "{:?}",
            asked.elapsed()
        );
        let ToolResult::Ok(o) = r else {
            panic!("{r:?}")
        };
        assert_eq!(o.output["interrupted"], true, "{}", o.output);
        assert_eq!(o.output["timedOut"], false, "{}", o.output);
        assert_eq!(o.output["signal"], 9, "{}", o.output);
    });
    let bg = pids(&ws.join("bg.pid"))[0];
    assert!(dies(bg), "the grandchild {bg} survived the interrupt");
    assert_eq!(t.interrupt("t9"), 0);
}
