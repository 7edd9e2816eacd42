//! Regressions from the overload soak and the fuzz targets (docs/fuzzing.md, docs/bench/soak.md)
//! that need the real `cc-app-server serve` child: each test is the smallest reproducer of one
//! finding. Findings whose fix belongs to another change are `#[ignore]`d with the finding in
//! one line; run them with `cargo test -p cc-app-server-cli --test fuzz_regressions -- --ignored`.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_cc-app-server");

fn state_dir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    dir
}

fn request(id: u64, method: &str, params: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string() + "\n"
}

fn initialize() -> String {
    request(
        1,
        "initialize",
        json!({"protocolVersion": 1, "minimumProtocolVersion": 1,
               "client": {"name": "regression", "version": "1"},
               "features": ["thread_turn_item", "structured_approval"]}),
    )
}

fn serve(dir: &std::path::Path) -> Child {
    serve_with(dir, &[])
}

fn serve_with(dir: &std::path::Path, extra: &[&str]) -> Child {
    Command::new(BIN)
        .args(["serve", "--state-dir"])
        .arg(dir)
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the binary starts")
}

/// Waits for the child up to `limit`, killing it after that.
fn wait(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let until = Instant::now() + limit;
    loop {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        if Instant::now() >= until {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Soak, stdio slow reader: 2,000 pipelined requests read back at 1 ms per line. docs/cli.md
/// promises backpressure: a client that keeps reading is never cut off.
#[test]
fn a_slow_reader_that_keeps_reading_gets_every_answer() {
    let dir = state_dir();
    let mut child = serve(dir.path());
    let mut stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut text = initialize();
    for id in 2..=2000u64 {
        text.push_str(&request(id, "thread/list", json!({"limit": 1})));
    }
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(text.as_bytes());
    });
    let mut answered = 0;
    for line in BufReader::new(stdout).lines() {
        let Ok(line) = line else { break };
        std::thread::sleep(Duration::from_millis(1));
        let v: Value = serde_json::from_str(&line).unwrap();
        if v.get("method").is_none() {
            answered += 1;
        }
    }
    writer.join().unwrap();
    let status = wait(&mut child, Duration::from_secs(60));
    assert_eq!(
        answered, 2000,
        "answers received by a client that never stopped reading"
    );
    assert_eq!(status.and_then(|s| s.code()), Some(0));
}

/// Soak, stdio interrupt storm: 2,000 pipelined `turn/interrupt` on a turn whose kernel does not
/// stop for 1.5 s. Every one is answered, and the server's OS thread count stays bounded.
#[test]
fn an_interrupt_storm_keeps_the_server_thread_count_bounded() {
    let dir = state_dir();
    let mut child = serve(dir.path());
    let pid = child.id();
    let mut stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let script = json!({"steps": [{"type": "ignoreCancel", "ms": 1500}]});
    let head = initialize()
        + &request(
            2,
            "thread/start",
            json!({"threadId": "storm", "agentOptions": {"script": script}}),
        )
        + &request(
            3,
            "turn/start",
            json!({"threadId": "storm", "input": [{"type": "text", "text": "x"}]}),
        );
    stdin.write_all(head.as_bytes()).unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let turn = loop {
        let v: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
        if v["id"] == 3 {
            break v["result"]["turn"]["id"].as_str().unwrap().to_string();
        }
    };
    let mut storm = String::new();
    for id in 4..2004u64 {
        storm.push_str(&request(
            id,
            "turn/interrupt",
            json!({"threadId": "storm", "turnId": turn}),
        ));
    }
    let reader = std::thread::spawn(move || {
        let mut answered = 0;
        for line in lines {
            let Ok(line) = line else { break };
            let v: Value = serde_json::from_str(&line).unwrap();
            if v.get("method").is_none() {
                answered += 1;
            }
        }
        answered
    });
    stdin.write_all(storm.as_bytes()).unwrap();
    drop(stdin);
    let mut peak = 0;
    let until = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() && Instant::now() < until {
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
            peak = peak.max(tasks.count());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let status = wait(&mut child, Duration::from_secs(5));
    let answered = reader.join().unwrap();
    assert_eq!(answered, 2000, "every interrupt is answered");
    assert_eq!(status.and_then(|s| s.code()), Some(0));
    assert!(
        peak <= 64,
        "the server ran {peak} OS threads for one turn and its interrupts"
    );
}

/// Soak, stdio flood: when serve gives up on a reader that stopped reading (exit 3), a line it
/// was in the middle of writing cannot be finished (the reader is not reading) nor taken back.
/// The contract (docs/cli.md) is that of JSON lines: a line counts once its newline is written.
/// Every newline-terminated line parses; only a final fragment without a newline may be cut.
#[test]
fn after_a_stall_cut_off_every_complete_line_parses() {
    use std::io::Read;
    let dir = state_dir();
    let mut child = serve_with(dir.path(), &["--stall-timeout-ms", "1000"]);
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    // One thread whose header carries ~60 KiB of metadata: every thread/read answer is that big.
    let metadata: serde_json::Map<String, Value> = (0..60)
        .map(|i| (format!("k{i}"), json!("x".repeat(1000))))
        .collect();
    let mut text = initialize()
        + &request(
            2,
            "thread/start",
            json!({"threadId": "big", "metadata": metadata}),
        );
    for id in 3..1200u64 {
        text.push_str(&request(
            id,
            "thread/read",
            json!({"threadId": "big", "limit": 1}),
        ));
    }
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(text.as_bytes());
    });
    let status = wait(&mut child, Duration::from_secs(60));
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(3),
        "a client that stops reading is cut off"
    );
    let mut out = Vec::new();
    stdout.read_to_end(&mut out).unwrap();
    let _ = writer.join();
    assert!(!out.is_empty());
    let complete = match out.iter().rposition(|b| *b == b'\n') {
        Some(end) => &out[..=end],
        None => &out[..0],
    };
    let mut lines = 0;
    for line in complete.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        serde_json::from_slice::<Value>(line).unwrap_or_else(|e| {
            panic!(
                "a complete stdout line does not parse ({e}); it ends with {:?}",
                String::from_utf8_lossy(&line[line.len().saturating_sub(40)..])
            )
        });
        lines += 1;
    }
    assert!(
        lines >= 1,
        "the answers written before the stall are whole lines"
    );
}
