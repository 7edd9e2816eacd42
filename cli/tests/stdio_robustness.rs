//! Issue 10's stdio findings against the real binary, real pipes and real process limits: the
//! drain stays in sync after response-shaped lines the engine cannot parse; a slow reader is
//! never cut off; a turn whose runner thread cannot be created fails, recorded, and frees its
//! thread; a turn whose events cannot be written (file-size limit, the kernel's EFBIG) ends
//! visibly at once and is closed on disk by the next start.

mod common;

use common::*;
use serde_json::{json, Value};
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::{Duration, Instant};

/// Sets `resource` of a running process (prlimit(2) on our own child).
fn set_limit(pid: i32, resource: libc::__rlimit_resource_t, soft: u64) {
    // SAFETY: prlimit on our child with a valid rlimit; the old value is not wanted.
    unsafe {
        let mut old: libc::rlimit = std::mem::zeroed();
        assert_eq!(libc::prlimit(pid, resource, std::ptr::null(), &mut old), 0);
        let new = libc::rlimit {
            rlim_cur: soft,
            rlim_max: old.rlim_max,
        };
        assert_eq!(
            libc::prlimit(pid, resource, &new, std::ptr::null_mut()),
            0,
            "prlimit: {}",
            std::io::Error::last_os_error()
        );
    }
}

fn vm_size_bytes(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmSize:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmSize in /proc/PID/status");
    kib * 1024
}

fn turn_done(p: &mut Proc, turn_id: &Value) -> Value {
    let id = turn_id.clone();
    p.wait(move |m| m["method"] == "turn/completed" && m["params"]["turn"]["id"] == id)["params"]
        .clone()
}

/// A response-shaped line the engine cannot parse (a number out of range, a lone surrogate, 200
/// levels of nesting) is answered with -32700 like any other unparsable line, and the drain
/// counts it: at EOF all 203 lines are answered (before the fix: 0 of the 200 that followed).
#[test]
fn unparsable_response_shaped_lines_keep_the_drain_in_sync() {
    let dir = state_dir();
    let mut p = Proc::serve(dir.path(), &["--drain-timeout-ms", "30000"]);
    p.init();
    let deep = format!(
        r#"{{"jsonrpc":"2.0","id":3,"result":{}1{}}}"#,
        "[".repeat(200),
        "]".repeat(200)
    );
    let mut lines = vec![
        r#"{"jsonrpc":"2.0","id":1,"result":1e400}"#.to_string(),
        r#"{"jsonrpc":"2.0","id":2,"result":"\ud800"}"#.to_string(),
        deep,
    ];
    for i in 0..200 {
        lines.push(
            json!({"jsonrpc": "2.0", "id": 1000 + i, "method": "thread/list", "params": {}})
                .to_string(),
        );
    }
    let mut all = lines.join("\n");
    all.push('\n');
    p.send_raw(all.as_bytes());
    p.close_stdin();
    let started = Instant::now();
    let mut parse_errors = 0;
    let mut answered = std::collections::BTreeSet::new();
    while let Some(line) = p.recv_line(TIMEOUT) {
        let m: Value = serde_json::from_str(&line).unwrap();
        match m["id"].as_u64() {
            Some(id) if id >= 1000 => {
                assert!(m["result"].is_object(), "{m}");
                answered.insert(id);
            }
            _ if m["error"]["code"] == -32700 => parse_errors += 1,
            _ => panic!("unexpected {m}"),
        }
    }
    assert_eq!(parse_errors, 3, "one -32700 per unparsable line");
    assert_eq!(answered.len(), 200, "every request after them is answered");
    assert_eq!(p.wait_exit(TIMEOUT).code(), Some(0), "{}", p.stderr());
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "no wait for the drain deadline"
    );
}

/// A client that keeps reading, 1 ms per line, with 2,000 requests pipelined, is answered in full
/// and the server exits 0; the stall deadline (1 s here) is far shorter than the whole read, so
/// only a reader that stops for 1 s could be cut off (before the fix: exit 3 after ~1,046).
#[test]
fn a_slow_reader_is_never_cut_off() {
    let dir = state_dir();
    let mut p = Proc::serve(
        dir.path(),
        &["--stall-timeout-ms", "1000", "--outbound-cap", "64"],
    );
    p.init();
    let mut stdin = p.take_stdin();
    const N: u64 = 2000;
    let writer = std::thread::spawn(move || {
        for i in 0..N {
            let m = json!({"jsonrpc": "2.0", "id": 10 + i, "method": "thread/list", "params": {}});
            writeln!(stdin, "{m}").expect("the server keeps reading stdin");
        }
        // stdin closes here: EOF after the last request.
    });
    let started = Instant::now();
    let mut next = 10;
    while next < 10 + N {
        let line = p
            .recv_line(TIMEOUT)
            .unwrap_or_else(|| panic!("answer {next} did not come; stderr:\n{}", p.stderr()));
        let m: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(m["id"], next, "answers come in order");
        next += 1;
        std::thread::sleep(Duration::from_millis(1));
    }
    writer.join().unwrap();
    assert!(
        started.elapsed() > Duration::from_secs(2),
        "the reader was slower than the stall deadline overall"
    );
    assert_eq!(p.wait_exit(TIMEOUT).code(), Some(0), "{}", p.stderr());
    assert!(!p.stderr().contains("stopped reading"), "{}", p.stderr());
}

/// The OS refuses to create the turn's runner thread (address space limit; every thread needs a
/// 1 GiB stack here): the turn ends failed/runnerUnavailable, recorded, the connection keeps
/// answering, later turn/start calls are not blocked (-32009), and once threads can be created
/// again turns run. Before the fix the failed spawn panicked the connection worker.
#[test]
fn a_runner_that_cannot_start_fails_the_turn_and_frees_the_thread() {
    let dir = state_dir();
    let mut p = Proc::serve_with_env(dir.path(), &[], &[("RUST_MIN_STACK", "1073741824")]);
    p.init();
    p.req("thread/start", json!({"threadId": "t"}));
    let pid = p.pid();
    set_limit(pid, libc::RLIMIT_AS, vm_size_bytes(pid) + (256 << 20));
    for _ in 0..3 {
        let r = p.req(
            "turn/start",
            json!({"threadId": "t", "input": [{"type": "text", "text": "go"}]}),
        );
        assert!(r["result"].is_object(), "never -32009: {r}");
        let done = turn_done(&mut p, &r["result"]["turn"]["id"]);
        assert_eq!(done["turn"]["status"], "failed", "{done}");
        assert_eq!(done["error"]["code"], "runnerUnavailable", "{done}");
    }
    assert!(p.req("thread/list", json!({}))["result"].is_object());
    set_limit(pid, libc::RLIMIT_AS, libc::RLIM_INFINITY);
    let r = p.req(
        "turn/start",
        json!({"threadId": "t", "input": [{"type": "text", "text": "go"}]}),
    );
    let done = turn_done(&mut p, &r["result"]["turn"]["id"]);
    assert_eq!(done["turn"]["status"], "completed", "{done}");
    let read = p.req("thread/read", json!({"threadId": "t", "limit": 1000}));
    let ends = read["result"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["payload"]["type"] == "turnCompleted")
        .count();
    assert_eq!(ends, 4, "each turn ended exactly once, on disk");
    p.close_stdin();
    assert_eq!(p.wait_exit(TIMEOUT).code(), Some(0), "{}", p.stderr());
    assert!(
        p.stderr().contains("could not start a turn runner thread"),
        "{}",
        p.stderr()
    );
}

/// The rollout cannot grow (RLIMIT_FSIZE on the server, SIGXFSZ ignored: writes fail with EFBIG
/// as they would with ENOSPC): the turn ends at once with turn/completed failed/recordingFailed,
/// EOF does not wait for the drain deadline, and the next start (with room again) closes the
/// turn on disk. Before the fix: no turn/completed, no error, and a full drain-timeout wait.
#[test]
fn a_turn_whose_events_cannot_be_written_ends_visibly_over_stdio() {
    let dir = state_dir();
    let mut cmd = Command::new(BIN);
    cmd.arg("serve")
        .arg("--state-dir")
        .arg(dir.path())
        .args(["--drain-timeout-ms", "60000"]);
    // SAFETY: only async-signal-safe calls between fork and exec; an ignored signal stays ignored
    // across exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            Ok(())
        });
    }
    let mut p = Proc::from_command(cmd);
    p.init();
    let script = json!({"steps": [{"type": "message", "text": "y".repeat(300), "chunks": 300}]});
    p.req(
        "thread/start",
        json!({"threadId": "disk", "agentOptions": {"script": script}}),
    );
    let log = dir.path().join("threads/disk.jsonl");
    let size = std::fs::metadata(&log).unwrap().len();
    set_limit(p.pid(), libc::RLIMIT_FSIZE, size + 12 * 1024);
    let started = Instant::now();
    let r = p.req(
        "turn/start",
        json!({"threadId": "disk", "input": [{"type": "text", "text": "go"}]}),
    );
    let turn_id = r["result"]["turn"]["id"].clone();
    let done = turn_done(&mut p, &turn_id);
    assert_eq!(done["turn"]["status"], "failed", "{done}");
    assert_eq!(done["error"]["code"], "recordingFailed", "{done}");
    p.close_stdin();
    assert_eq!(p.wait_exit(TIMEOUT).code(), Some(0), "{}", p.stderr());
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "no wait for the 60 s drain deadline: {:?}",
        started.elapsed()
    );
    assert!(p.stderr().contains("could not record"), "{}", p.stderr());
    drop(p);
    // With room again, the next start closes the turn on disk, exactly once.
    let mut p = Proc::serve(dir.path(), &[]);
    p.init();
    let read = p.req("thread/read", json!({"threadId": "disk", "limit": 1000}));
    let ends: Vec<Value> = read["result"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["payload"]["type"] == "turnCompleted")
        .cloned()
        .collect();
    assert_eq!(ends.len(), 1, "{read}");
    assert_eq!(ends[0]["payload"]["turnId"], turn_id);
    assert_eq!(ends[0]["payload"]["status"], "failed");
    p.close_stdin();
    assert_eq!(p.wait_exit(TIMEOUT).code(), Some(0));
    let (rc, out, err) = run(&[
        "rollout",
        "verify",
        "--state-dir",
        dir.path().to_str().unwrap(),
    ]);
    assert_eq!(rc, 0, "{out}{err}");
}
