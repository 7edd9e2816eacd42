//! A hostile model server on loopback driving `cc-app-server serve --kernel openai --workspace`:
//! an endless answer or reasoning stream, a command that escapes into its own session, a stream
//! kept alive with comments and nothing else. Each ends in a clean, specific failure (or a
//! contained result) in bounded time, with the server's memory sampled throughout. The chat
//! prompt spoofing of the same model is `cli/tests/chat.rs`
//! (`chat_shows_model_escapes_visibly_and_the_real_prompt_cannot_be_disguised`).

#[path = "../../core/tests/openai_support/mod.rs"]
mod openai_support;

mod common;

use common::Proc;
use openai_support::*;
use serde_json::{json, Value};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The largest resident set of `pid` while it lives or until stopped, sampled every 10 ms.
struct RssSampler {
    max_kib: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl RssSampler {
    fn start(pid: i32) -> RssSampler {
        let (max_kib, stop) = (
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let (m, s) = (Arc::clone(&max_kib), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
                    return;
                };
                if let Some(kib) = status
                    .lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                {
                    m.fetch_max(kib, Ordering::SeqCst);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        RssSampler { max_kib, stop }
    }

    fn max_mib(&self) -> u64 {
        self.stop.store(true, Ordering::SeqCst);
        self.max_kib.load(Ordering::SeqCst) / 1024
    }
}

/// Memory the debug server may reach in these tests: its idle size plus a few MiB, far below
/// what an unbounded stream reaches in the same seconds (gigabytes).
const RSS_CEILING_MIB: u64 = 160;

fn serve(model: &MockModel, dir: &Path, extra: &[&str]) -> Proc {
    let ws = dir.join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let mut args = vec![
        "--kernel",
        "openai",
        "--base-url",
        &model.base_url,
        "--model",
        "m",
        "--approval-policy",
        "auto",
        "--workspace",
        ws.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let mut p = Proc::serve(&dir.join("state"), &args);
    let r = p.req(
        "initialize",
        common::initialize_params(&["thread_turn_item", "structured_approval", "thread_compact"]),
    );
    assert!(r.get("result").is_some(), "{r}");
    let r = p.req("thread/start", json!({"threadId": "t1"}));
    assert!(r.get("result").is_some(), "{r}");
    p
}

/// Starts a turn and returns its turn/completed params, and how long it took.
fn turn(p: &mut Proc, text: &str) -> (Value, Duration) {
    let started = Instant::now();
    let r = p.req(
        "turn/start",
        json!({"threadId": "t1", "input": [{"type": "text", "text": text}]}),
    );
    assert!(r.get("result").is_some(), "{r}");
    let done = p.wait_method("turn/completed");
    (done["params"].clone(), started.elapsed())
}

fn rollout_bytes(dir: &Path) -> u64 {
    std::fs::metadata(dir.join("state/threads/t1.jsonl"))
        .map(|m| m.len())
        .unwrap_or(0)
}

#[test]
fn an_endless_answer_is_cut_at_the_output_bound_with_bounded_memory_and_rollout() {
    let model = MockModel::start(vec![Reply::Endless {
        gap: Duration::ZERO,
    }]);
    let dir = tempfile::tempdir().unwrap();
    let mut p = serve(&model, dir.path(), &["--max-turn-output-bytes", "262144"]);
    let rss = RssSampler::start(p.pid());
    let (done, took) = turn(&mut p, "talk forever");
    assert_eq!(done["turn"]["status"], "failed", "{done}");
    assert_eq!(done["error"]["code"], "outputLimitExceeded", "{done}");
    assert!(took < Duration::from_secs(15), "stopped after {took:?}");
    // What was accepted is recorded: at most the bound of text, plus the events' own overhead.
    let delivered: usize = p
        .seen
        .iter()
        .filter(|m| m["method"] == "item/delta")
        .map(|m| m["params"]["delta"]["text"].as_str().unwrap_or("").len())
        .sum();
    assert!(delivered > 0 && delivered <= 262_144, "{delivered}");
    let on_disk = rollout_bytes(dir.path());
    assert!(on_disk < 4 << 20, "rollout grew to {on_disk} bytes");
    let max = rss.max_mib();
    assert!(max < RSS_CEILING_MIB, "server RSS reached {max} MiB");
    // The model's connection was dropped when the stream was stopped.
    let deadline = Instant::now() + Duration::from_secs(10);
    while model.client_gone.lock().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "the server kept reading the stream"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    p.close_stdin();
    assert!(p.wait_exit(Duration::from_secs(10)).success());
}

#[test]
fn an_endless_reasoning_stream_is_cut_too() {
    let mut pieces = vec![chunk(&json!({"role": "assistant", "content": null}), None)];
    let thought = "hmm ".repeat(256); // 1 KiB per chunk
    for _ in 0..20_000 {
        pieces.push(chunk(&json!({"reasoning_content": thought}), None));
    }
    let model = MockModel::start(vec![Reply::Sse {
        pieces,
        gap: Duration::ZERO,
        end: End::Complete,
    }]);
    let dir = tempfile::tempdir().unwrap();
    let mut p = serve(&model, dir.path(), &["--max-turn-output-bytes", "524288"]);
    let rss = RssSampler::start(p.pid());
    let (done, _) = turn(&mut p, "think forever");
    assert_eq!(done["error"]["code"], "outputLimitExceeded", "{done}");
    assert!(rollout_bytes(dir.path()) < 4 << 20);
    let max = rss.max_mib();
    assert!(max < RSS_CEILING_MIB, "server RSS reached {max} MiB");
}

/// `setsid` takes a process out of the command's process group and session: the tool must
/// still stop it at the deadline, and the turn must not wait for the pipes it holds.
#[test]
fn a_command_that_escapes_into_its_own_session_is_still_contained() {
    let script = "setsid sleep 60 & echo $! > bg.pid; sleep 30";
    let args = json!({"argv": ["sh", "-c", script], "timeout_ms": 1500}).to_string();
    let model = MockModel::start(vec![
        tool_calls(&[("c1", "run_command", &args)]),
        answer(&["done"]),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let mut p = serve(&model, dir.path(), &[]);
    let (done, took) = turn(&mut p, "run it");
    assert_eq!(done["turn"]["status"], "completed", "{done}");
    assert!(took < Duration::from_secs(15), "the turn took {took:?}");
    let result = p
        .seen
        .iter()
        .find(|m| m["method"] == "tool/result")
        .expect("a tool result")
        .clone();
    assert_eq!(
        result["params"]["result"]["output"]["timedOut"], true,
        "{result}"
    );
    let pid: i32 = std::fs::read_to_string(dir.path().join("ws/bg.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // SAFETY: signal 0 only checks whether the process exists.
    let alive = unsafe { libc::kill(pid, 0) } == 0;
    assert!(!alive, "the setsid'd sleep {pid} survived the command");
    let closed = Instant::now();
    p.close_stdin();
    assert!(p.wait_exit(Duration::from_secs(10)).success());
    assert!(closed.elapsed() < Duration::from_secs(10));
}

/// SSE comments are not progress: a stream that sends nothing but keep-alives fails at the idle
/// deadline, and so does a compaction against it, which then frees the thread's compaction slot.
#[test]
fn a_stream_kept_alive_with_comments_fails_at_the_idle_deadline() {
    let keepalive = || Reply::Sse {
        pieces: std::iter::repeat_n(": keep-alive\n\n".to_string(), 600).collect(),
        gap: Duration::from_millis(50),
        end: End::Complete,
    };
    let model = MockModel::start(vec![keepalive(), keepalive(), answer(&["summary"])]);
    let dir = tempfile::tempdir().unwrap();
    let mut p = serve(
        &model,
        dir.path(),
        &[
            "--model-idle-timeout-secs",
            "1",
            "--request-timeout-secs",
            "20",
        ],
    );
    let rss = RssSampler::start(p.pid());
    let (done, took) = turn(&mut p, "hello");
    assert_eq!(done["turn"]["status"], "failed", "{done}");
    assert_eq!(done["error"]["code"], "modelStalled", "{done}");
    assert!(took < Duration::from_secs(10), "failed after {took:?}");
    let started = Instant::now();
    let r = p.req("thread/compact", json!({"threadId": "t1"}));
    assert!(r.get("error").is_some(), "compaction must fail: {r}");
    assert!(started.elapsed() < Duration::from_secs(10));
    // The slot is free again: the next compaction runs (and succeeds).
    let r = p.req("thread/compact", json!({"threadId": "t1"}));
    assert!(r.get("result").is_some(), "{r}");
    let max = rss.max_mib();
    assert!(max < RSS_CEILING_MIB, "server RSS reached {max} MiB");
}

/// The server's environment (where the API key usually is) and memory are not readable by the
/// commands it runs, which run as the same user: `/proc/PID/environ` of a non-dumpable process
/// is refused to every other process of that user. As root (CI) the server and the reader run as
/// `nobody`, since root may read any process; the binary is copied where `nobody` can run it.
#[test]
fn the_servers_environment_is_unreadable_to_processes_of_its_user() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    // SAFETY: geteuid has no preconditions.
    let as_nobody = unsafe { libc::geteuid() } == 0;
    let bin = if as_nobody {
        let copy = dir.path().join("cc-app-server");
        std::fs::copy(common::BIN, &copy).unwrap();
        std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
        copy
    } else {
        common::BIN.into()
    };
    let drop_to_nobody = |cmd: &mut std::process::Command| {
        if as_nobody {
            // SAFETY: setgid/setuid in the child before exec; both are async-signal-safe.
            unsafe {
                cmd.pre_exec(|| {
                    if libc::setgid(65534) != 0 || libc::setuid(65534) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
    };
    let mut server = std::process::Command::new(&bin);
    server
        .args(["serve", "--state-dir"])
        .arg(dir.path().join("state"))
        .env("CC_APP_SERVER_API_KEY", "sk-never-readable")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped());
    drop_to_nobody(&mut server);
    let mut p = Proc::from_command(server);
    let r = p.req(
        "initialize",
        common::initialize_params(&["thread_turn_item"]),
    );
    assert!(r.get("result").is_some(), "{r}");
    let mut reader = std::process::Command::new("cat");
    reader.arg(format!("/proc/{}/environ", p.pid()));
    drop_to_nobody(&mut reader);
    let out = reader.output().unwrap();
    assert!(!out.status.success(), "the environment was readable");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("sk-never-readable"),
        "the key was readable"
    );
    p.close_stdin();
    assert!(p.wait_exit(Duration::from_secs(10)).success());
}

/// The key can come from a file instead of the environment (where approved commands of other
/// servers, shells and crash reporters may see it): the file wins over the variable, and an
/// empty or missing file is refused at start-up, naming the file.
#[test]
fn the_api_key_is_read_from_a_key_file_before_the_environment() {
    let model = MockModel::start(vec![answer(&["hi"])]);
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("api.key");
    std::fs::write(&key, "sk-from-the-file\n").unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let flags = |key: &Path| {
        vec![
            "--kernel".to_string(),
            "openai".into(),
            "--base-url".into(),
            model.base_url.clone(),
            "--model".into(),
            "m".into(),
            "--workspace".into(),
            ws.to_str().unwrap().into(),
            "--api-key-file".into(),
            key.to_str().unwrap().into(),
        ]
    };
    let args = flags(&key);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut p = Proc::serve_with_env(
        &dir.path().join("state"),
        &args,
        &[("CC_APP_SERVER_API_KEY", "sk-from-the-environment")],
    );
    let r = p.req(
        "initialize",
        common::initialize_params(&["thread_turn_item"]),
    );
    assert!(r.get("result").is_some(), "{r}");
    let r = p.req("thread/start", json!({"threadId": "t1"}));
    assert!(r.get("result").is_some(), "{r}");
    let (done, _) = turn(&mut p, "hello");
    assert_eq!(done["turn"]["status"], "completed", "{done}");
    let seen = model.requests();
    assert_eq!(
        seen[0].header("authorization"),
        Some("Bearer sk-from-the-file")
    );
    p.close_stdin();
    assert!(p.wait_exit(Duration::from_secs(10)).success());

    for (name, text) in [("empty.key", Some("\n")), ("missing.key", None)] {
        let path = dir.path().join(name);
        if let Some(text) = text {
            std::fs::write(&path, text).unwrap();
        }
        let args = flags(&path);
        let out = std::process::Command::new(common::BIN)
            .args(["serve", "--state-dir"])
            .arg(dir.path().join("state2"))
            .args(&args)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{name}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(name), "{name}: {stderr}");
    }
}

/// The state directory and the rollout key inside the workspace (`./.cc-state`, a common
/// layout): the model's read_file of the key and write_file over the live rollout are refused
/// as tool errors under the auto policy, the key never reaches the model or the rollout, and the
/// thread still verifies.
#[test]
fn the_state_dir_and_key_inside_the_workspace_are_out_of_the_tools_reach() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let state = ws.join(".cc-state");
    std::fs::create_dir_all(&ws).unwrap();
    let key = ws.join("rollout.key");
    let secret = "ab".repeat(32);
    std::fs::write(&key, &secret).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let model = MockModel::start(vec![
        tool_calls(&[
            ("c1", "read_file", r#"{"path":"rollout.key"}"#),
            (
                "c2",
                "write_file",
                r#"{"path":".cc-state/threads/t1.jsonl","content":"gone"}"#,
            ),
            (
                "c3",
                "read_file",
                r#"{"path":"./.cc-state/../rollout.key"}"#,
            ),
        ]),
        answer(&["ok"]),
    ]);
    let mut p = Proc::serve(
        &state,
        &[
            "--kernel",
            "openai",
            "--base-url",
            &model.base_url,
            "--model",
            "m",
            "--approval-policy",
            "auto",
            "--workspace",
            ws.to_str().unwrap(),
            "--key-file",
            key.to_str().unwrap(),
        ],
    );
    let r = p.req(
        "initialize",
        common::initialize_params(&["thread_turn_item", "structured_approval"]),
    );
    assert!(r.get("result").is_some(), "{r}");
    let r = p.req("thread/start", json!({"threadId": "t1"}));
    assert!(r.get("result").is_some(), "{r}");
    let before = std::fs::read(state.join("threads/t1.jsonl")).unwrap();
    let (done, _) = turn(&mut p, "steal the key");
    assert_eq!(done["turn"]["status"], "completed", "{done}");
    let results: Vec<&Value> = p
        .seen
        .iter()
        .filter(|m| m["method"] == "tool/result")
        .collect();
    assert_eq!(results.len(), 3, "{results:?}");
    for r in &results {
        assert_eq!(
            r["params"]["result"]["status"], "error",
            "a protected path was served: {r}"
        );
    }
    p.close_stdin();
    assert!(p.wait_exit(Duration::from_secs(10)).success());
    // Nothing of the key went to the model or into the log; the log only grew.
    for seen in model.requests() {
        assert!(!seen.body.to_string().contains(&secret));
    }
    let after = std::fs::read(state.join("threads/t1.jsonl")).unwrap();
    assert!(after.starts_with(&before), "the live rollout was rewritten");
    assert!(!String::from_utf8_lossy(&after).contains(&secret));
    let out = std::process::Command::new(common::BIN)
        .args(["rollout", "verify", "--state-dir"])
        .arg(&state)
        .arg("--key-file")
        .arg(&key)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// Waits until `path` exists (a command's marker file).
fn wait_for(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn dead(pid_file: &Path) -> bool {
    let pid: i32 = std::fs::read_to_string(pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        // SAFETY: signal 0 only checks whether the process exists.
        if unsafe { libc::kill(pid, 0) } != 0 {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// turn/interrupt during a command that left its session is answered (not -32010 at the settle
/// deadline), the escaped process dies, and so does the whole tree when stdin closes mid-command:
/// the server exits at its drain deadline (1 s here) instead of waiting for the command.
#[test]
fn interrupt_and_shutdown_stop_a_command_that_left_its_session() {
    let script = "setsid sleep 120 & echo $! > bg.pid; sleep 120";
    let args = json!({"argv": ["sh", "-c", script], "timeout_ms": 100_000}).to_string();
    let model = MockModel::start(vec![tool_calls(&[("c1", "run_command", &args)])]);
    let dir = tempfile::tempdir().unwrap();
    let mut p = serve(&model, dir.path(), &["--drain-timeout-ms", "1000"]);
    let r = p.req(
        "turn/start",
        json!({"threadId": "t1", "input": [{"type": "text", "text": "run it"}]}),
    );
    let turn_id = r["result"]["turn"]["id"].as_str().unwrap().to_string();
    wait_for(&dir.path().join("ws/bg.pid"));
    let asked = Instant::now();
    let r = p.req(
        "turn/interrupt",
        json!({"threadId": "t1", "turnId": turn_id}),
    );
    assert!(r.get("result").is_some(), "{r}");
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "{:?}",
        asked.elapsed()
    );
    assert!(
        dead(&dir.path().join("ws/bg.pid")),
        "the setsid'd sleep survived"
    );

    // Again, and this time the host goes away mid-command.
    std::fs::remove_file(dir.path().join("ws/bg.pid")).unwrap();
    model.push(tool_calls(&[("c2", "run_command", &args)]));
    let r = p.req(
        "turn/start",
        json!({"threadId": "t1", "input": [{"type": "text", "text": "again"}]}),
    );
    assert!(r.get("result").is_some(), "{r}");
    wait_for(&dir.path().join("ws/bg.pid"));
    let closed = Instant::now();
    p.close_stdin();
    assert!(p.wait_exit(Duration::from_secs(15)).success());
    assert!(
        closed.elapsed() < Duration::from_secs(10),
        "{:?}",
        closed.elapsed()
    );
    assert!(
        dead(&dir.path().join("ws/bg.pid")),
        "the command outlived the server"
    );
}
