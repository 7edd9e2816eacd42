//! Zero idle wake-ups (docs/engine.md, "Idle"): an embedded server that has nothing to do must not
//! wake the CPU. Two measurements over one window (`CC_IDLE_SECS`, default 30 s):
//!
//! - in this process, through the host boundary a mobile app uses (the uniffi-facing Rust API and
//!   the C ABI): a log listener, a client with an approval handler and a notification listener, a
//!   raw connection with a message listener, a C client with a notification callback, a loaded
//!   thread whose tool turn (with an approval) has finished, and a graph run whose agent waits
//!   under a one-hour lease. Budget: 0 context switches over the window in every engine thread.
//! - a `cc-app-server serve` child idling on stdio with a loaded thread. Budget: 1 per second.
//!
//! The counts are `voluntary_ctxt_switches + nonvoluntary_ctxt_switches` of every thread in
//! `/proc/<pid>/task/*/status`, taken before and after the window (a thread started inside the
//! window counts from zero). Prints each thread's count and `idle: N passed, N failed`.
//!
//! Run: `cargo test -p cc-app-server-cli --test idle` (`scripts/test-idle.sh`).

use cc_app_server_ffi as ffi;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::ffi::{c_char, c_void, CString};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// tid → (thread name, switches so far).
type Counts = BTreeMap<String, (String, u64)>;

fn switches(pid: &str) -> Counts {
    let mut out = Counts::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in dir.flatten() {
        let tid = task.file_name().to_string_lossy().to_string();
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
            continue; // exited meanwhile
        };
        let mut name = String::new();
        let mut n = 0;
        for line in status.lines() {
            if let Some(v) = line.strip_prefix("Name:") {
                name = v.trim().to_string();
            }
            if let Some(v) = line
                .strip_prefix("voluntary_ctxt_switches:")
                .or_else(|| line.strip_prefix("nonvoluntary_ctxt_switches:"))
            {
                n += v.trim().parse::<u64>().unwrap_or(0);
            }
        }
        out.insert(tid, (name, n));
    }
    out
}

/// Per-thread switches between two snapshots, leaving out `skip` (the measuring thread).
fn delta(before: &Counts, after: &Counts, skip: &str) -> Vec<(String, u64)> {
    after
        .iter()
        .filter(|(tid, _)| tid.as_str() != skip)
        .map(|(tid, (name, n))| {
            let was = before.get(tid).map_or(0, |(_, b)| *b);
            (format!("{name} ({tid})"), n.saturating_sub(was))
        })
        .collect()
}

fn report(what: &str, rows: &[(String, u64)], secs: f64, budget_per_s: f64) -> bool {
    let total: u64 = rows.iter().map(|(_, n)| n).sum();
    let rate = total as f64 / secs;
    println!(
        "{what}: {total} wake-ups in {secs:.0} s over {} threads ({rate:.2}/s, budget {budget_per_s}/s)",
        rows.len()
    );
    for (name, n) in rows {
        println!("    {n:>6}  {name}");
    }
    rate <= budget_per_s
}

struct Quiet;
impl ffi::LogListener for Quiet {
    fn on_log(&self, _: ffi::LogRecord) -> Result<(), ffi::ListenerError> {
        Ok(())
    }
}

struct Accept;
impl ffi::ApprovalHandler for Accept {
    fn decide(&self, _: ffi::ApprovalRequest) -> Result<ffi::ApprovalDecision, ffi::HandlerError> {
        Ok(ffi::ApprovalDecision::AcceptOnce)
    }
}

/// Keeps every notification, so the test can wait for the ones it needs before the window.
#[derive(Default)]
struct Seen(Mutex<Vec<Value>>);
impl ffi::NotificationListener for Seen {
    fn on_notifications(&self, messages: Vec<String>) -> Result<(), ffi::ListenerError> {
        let mut seen = self.0.lock().unwrap();
        seen.extend(messages.iter().filter_map(|m| serde_json::from_str(m).ok()));
        Ok(())
    }
    fn on_closed(&self) -> Result<(), ffi::ListenerError> {
        Ok(())
    }
}

impl Seen {
    fn wait_for(&self, what: &str, test: impl Fn(&Value) -> bool) {
        let until = Instant::now() + Duration::from_secs(30);
        while Instant::now() < until {
            if self.0.lock().unwrap().iter().any(&test) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("no {what} within 30 s: {:#?}", self.0.lock().unwrap());
    }
}

struct Messages(AtomicU64);
impl ffi::MessageListener for Messages {
    fn on_messages(&self, m: Vec<String>) -> Result<(), ffi::ListenerError> {
        self.0.fetch_add(m.len() as u64, Ordering::SeqCst);
        Ok(())
    }
    fn on_closed(&self) -> Result<(), ffi::ListenerError> {
        Ok(())
    }
}

static C_NOTIFICATIONS: AtomicU64 = AtomicU64::new(0);
unsafe extern "C" fn c_notified(_: *mut c_void, message: *const c_char) {
    if !message.is_null() {
        C_NOTIFICATIONS.fetch_add(1, Ordering::SeqCst);
    }
}

fn request(client: &ffi::Client, method: &str, params: Value) -> Value {
    let text = client
        .request_blocking(method.into(), params.to_string())
        .unwrap_or_else(|e| panic!("{method}: {e:?}"));
    serde_json::from_str(&text).unwrap()
}

/// What the in-process part keeps alive through the window.
struct InProcess {
    _dir: tempfile::TempDir,
    server: Arc<ffi::AppServer>,
    client: Arc<ffi::Client>,
    listening: Arc<ffi::TaskHandle>,
    conn: Arc<ffi::Connection>,
    conn_listening: Arc<ffi::TaskHandle>,
    c_server: *mut ffi::capi::cc_server,
    c_client: *mut ffi::capi::cc_client,
    thread_id: String,
}

fn in_process() -> InProcess {
    let dir = tempfile::tempdir().unwrap();
    ffi::log::set_log_listener(Some(Arc::new(Quiet)), ffi::LogLevel::Info);
    let server = ffi::AppServer::open(
        ffi::ServerOptions {
            state_dir: dir.path().join("state").to_string_lossy().into(),
            policy: Some(ffi::ApprovalPolicy::AskEveryTime),
            ..Default::default()
        },
        None,
        None,
    )
    .unwrap();
    let client = ffi::Client::connect(Arc::clone(&server), Some(Arc::new(Accept)), None).unwrap();
    let seen = Arc::new(Seen::default());
    let listening = client.listen(seen.clone()).unwrap();

    // A loaded thread whose tool turn, with an approval, has finished.
    let script = json!({"steps": [
        {"type": "tool", "tool": "fs.write", "arguments": {"path": "a.txt", "content": "x"}},
        {"type": "message", "text": "done"}]});
    let thread = request(
        &client,
        "thread/start",
        json!({"agentOptions": {"script": script}}),
    );
    let thread_id = thread["thread"]["id"].as_str().unwrap().to_string();
    request(
        &client,
        "turn/start",
        json!({"threadId": thread_id, "input": [{"type": "text", "text": "go"}]}),
    );
    seen.wait_for("turn/completed", |m| m["method"] == "turn/completed");
    assert!(
        seen.0
            .lock()
            .unwrap()
            .iter()
            .any(|m| m["method"] == "approval/resolved"),
        "the turn asked for an approval"
    );

    // A graph run whose agent waits (one hour) under a one-hour lease.
    let port = |name: &str, ty: &str| json!({"name": name, "type": ty});
    let definition = json!({"graphVersion": 1, "id": "idle", "inputs": [port("topic", "text")],
        "outputs": [port("text", "text")],
        "nodes": [{"kind": "agent", "id": "wait", "inputs": [port("topic", "text")],
                   "outputs": [port("text", "text")],
                   "agentOptions": {"script": {"steps": [{"type": "sleep", "ms": 3_600_000}]}}}],
        "edges": [{"from": {"port": "topic"}, "to": {"node": "wait", "port": "topic"}},
                  {"from": {"node": "wait", "port": "text"}, "to": {"port": "text"}}]});
    let run = request(
        &client,
        "graph/run/start",
        json!({"runId": "idle-run", "definition": definition, "inputs": {"topic": "t"},
               "grant": {"capabilities": ["agent"]}, "options": {"leaseMs": 3_600_000}}),
    );
    assert_eq!(run["run"]["status"], "running", "{run}");
    seen.wait_for("the agent node running", |m| {
        m["params"]["type"] == "nodeUpdated"
            && m["params"]["runId"] == "idle-run"
            && m["params"]["node"]["status"] == "running"
    });

    // A raw connection with a message listener, initialized.
    let conn = server.connect().unwrap();
    let messages = Arc::new(Messages(AtomicU64::new(0)));
    let conn_listening = Arc::clone(&conn).listen(messages.clone()).unwrap();
    conn.send(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": 1, "minimumProtocolVersion": 1,
            "client": {"name": "idle", "version": "1"}, "features": ["thread_turn_item"]}})
        .to_string(),
    )
    .unwrap();

    // A C client with a notification callback.
    let config =
        CString::new(json!({"stateDir": dir.path().join("c").to_string_lossy()}).to_string())
            .unwrap();
    let mut c_server = std::ptr::null_mut();
    let mut c_client = std::ptr::null_mut();
    // SAFETY: valid pointers as the header documents; freed below.
    unsafe {
        let code = ffi::capi::cc_server_open(
            config.as_ptr(),
            std::ptr::null(),
            &mut c_server,
            std::ptr::null_mut(),
            0,
        );
        assert_eq!(code as i32, 0, "cc_server_open");
        let code =
            ffi::capi::cc_client_connect(c_server, None, std::ptr::null_mut(), 0, &mut c_client);
        assert_eq!(code as i32, 0, "cc_client_connect");
        let code = ffi::capi::cc_client_set_notification_callback(
            c_client,
            Some(c_notified),
            std::ptr::null_mut(),
        );
        assert_eq!(code as i32, 0, "cc_client_set_notification_callback");
    }

    assert!(
        messages.0.load(Ordering::SeqCst) >= 1 || wait_answer(&messages),
        "initialize answered"
    );
    InProcess {
        _dir: dir,
        server,
        client,
        listening,
        conn,
        conn_listening,
        c_server,
        c_client,
        thread_id,
    }
}

fn wait_answer(messages: &Messages) -> bool {
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until && messages.0.load(Ordering::SeqCst) == 0 {
        std::thread::sleep(Duration::from_millis(10));
    }
    messages.0.load(Ordering::SeqCst) >= 1
}

impl InProcess {
    /// Everything still works after the idle window, and stops when asked.
    fn finish(self) {
        let list = request(&self.client, "thread/list", json!({}));
        assert!(
            list["threads"]
                .as_array()
                .is_some_and(|d| d.iter().any(|t| t["id"] == self.thread_id.as_str())),
            "{list}"
        );
        self.conn_listening.cancel();
        self.listening.cancel();
        assert!(self.listening.is_finished() && self.conn_listening.is_finished());
        // SAFETY: the handles from `in_process`, freed once.
        unsafe {
            ffi::capi::cc_client_free(self.c_client);
            ffi::capi::cc_server_free(self.c_server);
        }
        self.conn.close();
        self.client.close();
        self.server.shutdown();
        ffi::log::set_log_listener(None, ffi::LogLevel::Info);
    }
}

/// The `serve` child, initialized, with a loaded thread.
struct Child {
    _dir: tempfile::TempDir,
    process: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: BufReader<std::process::ChildStdout>,
}

impl Child {
    fn ask(&mut self, id: u64, method: &str, params: Value) -> Value {
        let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
        loop {
            let mut text = String::new();
            assert!(self.stdout.read_line(&mut text).unwrap() > 0, "serve ended");
            let v: Value = serde_json::from_str(&text).unwrap();
            if v["id"] == id {
                return v;
            }
        }
    }

    /// Still answering after the window, then a clean end on EOF.
    fn finish(mut self) {
        let listed = self.ask(3, "thread/list", json!({}));
        assert!(listed["result"]["threads"].is_array(), "{listed}");
        drop(self.stdin);
        let status = self.process.wait().unwrap();
        assert!(status.success(), "serve exited with {status}");
    }
}

fn child() -> Child {
    let dir = tempfile::tempdir().unwrap();
    let mut process = Command::new(env!("CARGO_BIN_EXE_cc-app-server"))
        .arg("serve")
        .arg("--state-dir")
        .arg(dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdin = process.stdin.take().unwrap();
    let stdout = BufReader::new(process.stdout.take().unwrap());
    let mut c = Child {
        _dir: dir,
        process,
        stdin,
        stdout,
    };
    c.ask(
        1,
        "initialize",
        json!({"protocolVersion": 1, "minimumProtocolVersion": 1,
               "client": {"name": "idle", "version": "1"}, "features": ["thread_turn_item"]}),
    );
    let started = c.ask(2, "thread/start", json!({}));
    assert!(started["result"]["thread"]["id"].is_string(), "{started}");
    c
}

fn main() {
    if !std::path::Path::new("/proc/self/task").exists() {
        println!("idle: 0 passed, 0 failed (no /proc: not measured on this platform)");
        return;
    }
    let secs: u64 = std::env::var("CC_IDLE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let here = in_process();
    let child = child();
    // Let everything settle, then measure both over one window.
    std::thread::sleep(Duration::from_millis(500));
    let me = std::process::id().to_string();
    let child_pid = child.process.id().to_string();
    let (before, child_before) = (switches(&me), switches(&child_pid));
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(secs));
    let (after, child_after) = (switches(&me), switches(&child_pid));
    let elapsed = started.elapsed().as_secs_f64();
    // The measuring thread is this one (the main thread: its one sleep), not the engine's.
    let results = [
        report("in-process", &delta(&before, &after, &me), elapsed, 0.0),
        report(
            "serve child",
            &delta(&child_before, &child_after, ""),
            elapsed,
            1.0,
        ),
    ];
    println!(
        "    (the C callback saw {} notifications)",
        C_NOTIFICATIONS.load(Ordering::SeqCst)
    );
    here.finish();
    child.finish();
    let passed = results.iter().filter(|ok| **ok).count();
    let failed = results.len() - passed;
    println!("idle: {passed} passed, {failed} failed");
    if failed > 0 {
        std::process::exit(1);
    }
}
