//! Overload soak (`scripts/soak.sh SECONDS`): drives an in-process `AppServer` and a
//! `cc-app-server serve` child at ten times their queue capacity for a given time — request
//! floods past the inbound queue, slow readers, interrupt storms against a kernel that will not
//! stop, approvals, and many threads with many turns — and checks, while it runs and at the end:
//!
//! - every request is answered exactly once, or refused with `Overloaded { retry_after_ms }`
//!   in-process; over stdio nothing is refused and the pipe itself pushes back (docs/engine.md,
//!   docs/cli.md); a host that keeps reading is never disconnected;
//! - nothing is lost: every notification a host received names an event of the same type in the
//!   rollout, every turn has exactly one terminal event, and every thread verifies (in-process
//!   through the store; for the child with `rollout verify` after it exits 0);
//! - RSS, sampled every second, stays within 10% after the warm-up, beyond the 2 KiB per thread
//!   on disk the engine is documented to keep (its summary index; docs/engine.md, "Memory"), and
//!   the OS thread count stays under a fixed bound. The tail cache is given a small budget
//!   (`CC_SOAK_TAIL_CACHE_MIB`, 2 MiB) so it is full before the warm-up ends: a bounded cache
//!   still filling is not growth.
//!
//! Usage: `soak --seconds N --server-bin PATH [--report FILE] [--max-threads N]`. Prints one
//! line per second and a summary; exits 1 if any check failed.

use cc_app_server::engine::{AppServer, Connection, RecvError, SendError, ServerConfig};
use cc_app_server::rollout::{open_store, StoreKind, StoreOptions};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// The default inbound queue (docs/engine.md); the floods aim at ten times it.
const INBOUND_CAP: usize = 256;
const OVERLOAD: usize = 10 * INBOUND_CAP;

#[derive(Default)]
struct Counters {
    sent: AtomicU64,
    answered: AtomicU64,
    overloaded: AtomicU64,
    turns: AtomicU64,
    interrupts: AtomicU64,
    approvals: AtomicU64,
    threads_checked: AtomicU64,
    stdio_lines: AtomicU64,
}

struct Soak {
    stop: AtomicBool,
    failures: Mutex<Vec<String>>,
    known: Mutex<Vec<String>>,
    c: Counters,
}

/// Checks named in `CC_SOAK_ALLOW` (comma-separated tags) that fail are reported as KNOWN.
fn allowed(tag: &str) -> bool {
    std::env::var("CC_SOAK_ALLOW").is_ok_and(|v| v.split(',').any(|t| t.trim() == tag))
}

impl Soak {
    fn fail(&self, what: String) {
        eprintln!("FAIL: {what}");
        let mut f = self.failures.lock().unwrap();
        if f.len() < 50 {
            f.push(what);
        }
    }

    /// A failure of a check that issue 10 already tracks under `tag`.
    fn fail_tagged(&self, tag: &str, what: String) {
        if allowed(tag) {
            println!("KNOWN ({tag}, issue 10): {what}");
            self.known.lock().unwrap().push(format!("{tag}: {what}"));
        } else {
            self.fail(format!("[{tag}] {what}"));
        }
    }
    fn running(&self) -> bool {
        !self.stop.load(Ordering::Relaxed)
    }
}

fn event_type_of(method: &str) -> Option<&'static str> {
    Some(match method {
        "turn/started" => "turnStarted",
        "turn/completed" => "turnCompleted",
        "item/started" => "itemStarted",
        "item/delta" => "itemDelta",
        "item/completed" => "itemCompleted",
        "tool/requested" => "toolRequested",
        "tool/result" => "toolResult",
        "approval/requested" => "approvalRequested",
        "approval/resolved" => "approvalResolved",
        _ => return None,
    })
}

fn request(id: u64, method: &str, params: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string()
}

fn initialize(id: u64) -> String {
    request(
        id,
        "initialize",
        json!({"protocolVersion": 1, "minimumProtocolVersion": 1,
               "client": {"name": "soak", "version": "1"},
               "features": ["thread_turn_item", "structured_approval", "bounded_transport"]}),
    )
}

fn scripts() -> [Value; 3] {
    [
        json!({"steps": [{"type": "message", "text": "streamed in chunks", "chunks": 4}]}),
        json!({"steps": [{"type": "tool", "tool": "fs.write", "arguments": {"path": "x"}}, {"type": "echo"}]}),
        json!({"steps": [{"type": "reasoning", "text": "think"}, {"type": "sleep", "ms": 5}, {"type": "echo"}]}),
    ]
}

/// Everything one host saw on one connection, for the end-of-thread comparison.
#[derive(Default)]
struct Seen {
    /// (thread, seq) → notification method.
    notified: BTreeMap<(String, u64), String>,
    completed: HashMap<String, u32>,
}

/// A host on one in-process connection: sends with retry on Overloaded, answers approvals,
/// records notifications, and waits for specific answers.
struct Host<'a> {
    soak: &'a Soak,
    conn: Connection,
    next_id: u64,
    answers: HashMap<u64, Value>,
    seen: Seen,
    name: String,
}

impl<'a> Host<'a> {
    fn new(soak: &'a Soak, server: &AppServer, name: String) -> Option<Host<'a>> {
        let conn = server.connect().ok()?;
        let mut h = Host {
            soak,
            conn,
            next_id: 0,
            answers: HashMap::new(),
            seen: Seen::default(),
            name,
        };
        let r = h.call("initialize", Value::Null)?;
        if r.get("error").is_some() {
            soak.fail(format!("{}: initialize refused: {r}", h.name));
            return None;
        }
        Some(h)
    }

    /// Queues one line; on Overloaded waits the advised time (reading meanwhile) and retries.
    fn send_line(&mut self, line: &str) -> bool {
        loop {
            match self.conn.send(line) {
                Ok(()) => {
                    self.soak.c.sent.fetch_add(1, Ordering::Relaxed);
                    return true;
                }
                Err(SendError::Overloaded { retry_after_ms }) => {
                    self.soak.c.overloaded.fetch_add(1, Ordering::Relaxed);
                    if retry_after_ms == 0 {
                        self.soak
                            .fail(format!("{}: Overloaded with retry_after_ms 0", self.name));
                    }
                    self.pump(Duration::from_millis(retry_after_ms.clamp(1, 50)));
                }
                Err(e) => {
                    self.soak
                        .fail(format!("{}: send failed on a reading host: {e}", self.name));
                    return false;
                }
            }
        }
    }

    fn send(&mut self, method: &str, params: Value) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        let line = if method == "initialize" {
            initialize(id)
        } else {
            request(id, method, params)
        };
        self.send_line(&line);
        id
    }

    fn call(&mut self, method: &str, params: Value) -> Option<Value> {
        let id = self.send(method, params);
        self.wait(id, Duration::from_secs(30))
    }

    fn wait(&mut self, id: u64, limit: Duration) -> Option<Value> {
        let until = Instant::now() + limit;
        loop {
            if let Some(v) = self.answers.remove(&id) {
                return Some(v);
            }
            if Instant::now() >= until {
                self.soak.fail(format!(
                    "{}: request {id} unanswered after {limit:?}",
                    self.name
                ));
                return None;
            }
            if !self.pump(Duration::from_millis(20)) {
                return None;
            }
        }
    }

    /// Reads what is queued (waiting up to `wait` for the first); false once the connection is gone.
    fn pump(&mut self, wait: Duration) -> bool {
        let mut first = true;
        loop {
            let msg = if first {
                first = false;
                self.conn.recv(Some(wait))
            } else {
                self.conn.try_recv().ok_or(RecvError::Timeout)
            };
            match msg {
                Ok(text) => self.observe(&text),
                Err(RecvError::Timeout) => return true,
                Err(RecvError::Closed) => {
                    self.soak.fail(format!(
                        "{}: the engine closed a connection that was reading",
                        self.name
                    ));
                    return false;
                }
            }
        }
    }

    fn observe(&mut self, text: &str) {
        let v: Value = match serde_json::from_str(text) {
            Ok(v) => v,
            Err(e) => {
                return self
                    .soak
                    .fail(format!("{}: unparseable output ({e})", self.name))
            }
        };
        match v.get("method").and_then(Value::as_str) {
            None => {
                self.soak.c.answered.fetch_add(1, Ordering::Relaxed);
                if let Some(id) = v["id"].as_u64() {
                    if self.answers.insert(id, v).is_some() {
                        self.soak
                            .fail(format!("{}: request {id} answered twice", self.name));
                    }
                }
            }
            Some("approval/decide") => {
                self.soak.c.approvals.fetch_add(1, Ordering::Relaxed);
                let answer =
                    json!({"jsonrpc": "2.0", "id": v["id"], "result": {"kind": "acceptOnce"}});
                self.send_line(&answer.to_string());
            }
            Some(method) => {
                let p = &v["params"];
                if method == "turn/completed" {
                    let turn = p["turn"]["id"].as_str().unwrap_or("").to_string();
                    *self.seen.completed.entry(turn).or_default() += 1;
                }
                if let (Some(t), Some(seq)) = (p["threadId"].as_str(), p["eventSeq"].as_u64()) {
                    self.seen
                        .notified
                        .insert((t.to_string(), seq), method.to_string());
                }
            }
        }
    }

    /// Waits until `turn` has completed (or `limit`).
    fn wait_turn(&mut self, turn: &str, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        while !self.seen.completed.contains_key(turn) {
            if Instant::now() >= until || !self.pump(Duration::from_millis(20)) {
                self.soak.fail(format!(
                    "{}: turn {turn} did not complete within {limit:?}",
                    self.name
                ));
                return false;
            }
        }
        true
    }

    /// Compares what this host was told about `thread` with its rollout, then forgets it.
    fn check_thread(&mut self, server: &AppServer, thread: &str) {
        let store = server.store();
        match store.verify(thread) {
            Ok(r) if r.ok() => {}
            Ok(r) => self.soak.fail(format!("{thread} does not verify: {r:?}")),
            Err(e) => self.soak.fail(format!("{thread}: verify failed: {e}")),
        }
        let mut events = HashMap::new();
        let mut started = HashMap::<String, u32>::new();
        let mut completed = HashMap::<String, u32>::new();
        let mut after = 0;
        loop {
            let Ok(page) = store.read(thread, after, 1000) else {
                return self.soak.fail(format!("{thread}: read failed"));
            };
            for e in &page.events {
                after = e.seq;
                let kind = e.kind().to_string();
                let turn = e.payload["turnId"].as_str().unwrap_or("").to_string();
                match kind.as_str() {
                    "turnStarted" => *started.entry(turn).or_default() += 1,
                    "turnCompleted" => *completed.entry(turn).or_default() += 1,
                    _ => {}
                }
                events.insert(e.seq, kind);
            }
            if !page.has_more {
                break;
            }
        }
        for (turn, n) in &started {
            if *n != 1 || completed.get(turn) != Some(&1) {
                self.soak.fail(format!(
                    "{thread}: turn {turn} started {n}x, completed {:?}x",
                    completed.get(turn)
                ));
            }
        }
        let keys: Vec<(String, u64)> = self
            .seen
            .notified
            .range((thread.to_string(), 0)..=(thread.to_string(), u64::MAX))
            .map(|(k, _)| k.clone())
            .collect();
        for key in keys {
            let method = self.seen.notified.remove(&key).unwrap_or_default();
            let want = event_type_of(&method);
            match (events.get(&key.1), want) {
                (None, _) => self.soak.fail(format!(
                    "{method} for {}#{} is not in the rollout",
                    key.0, key.1
                )),
                (Some(got), Some(want)) if got != want => self.soak.fail(format!(
                    "{method} for {}#{} names a {got} event",
                    key.0, key.1
                )),
                _ => {}
            }
        }
        self.soak.c.threads_checked.fetch_add(1, Ordering::Relaxed);
    }
}

/// Many threads, many turns: start a thread, run three turns on it (one with an approval),
/// check it against the rollout, move on.
fn turns_worker(soak: &Soak, server: &AppServer, w: usize) {
    let Some(mut h) = Host::new(soak, server, format!("turns-{w}")) else {
        return;
    };
    let mut n = 0u64;
    while soak.running() {
        n += 1;
        let thread = format!("w{w}-{n}");
        let script = scripts()[(n as usize) % 3].clone();
        let Some(r) = h.call(
            "thread/start",
            json!({"threadId": thread, "agentOptions": {"script": script}}),
        ) else {
            return;
        };
        if r.get("error").is_some() {
            return soak.fail(format!("thread/start refused: {r}"));
        }
        for _ in 0..3 {
            let Some(r) = h.call(
                "turn/start",
                json!({"threadId": thread, "input": [{"type": "text", "text": "go"}]}),
            ) else {
                return;
            };
            let Some(turn) = r["result"]["turn"]["id"].as_str().map(str::to_string) else {
                return soak.fail(format!("turn/start refused: {r}"));
            };
            soak.c.turns.fetch_add(1, Ordering::Relaxed);
            if !h.wait_turn(&turn, Duration::from_secs(60)) {
                return;
            }
        }
        h.check_thread(server, &thread);
    }
}

/// Floods one connection with cheap requests, keeping up to ten times the inbound queue
/// in flight; every refusal must be Overloaded, every accepted request answered.
fn flood_worker(soak: &Soak, server: &AppServer, w: usize) {
    let Some(mut h) = Host::new(soak, server, format!("flood-{w}")) else {
        return;
    };
    let _ = h.call("thread/start", json!({"threadId": format!("flood-{w}")}));
    let mut pending: Vec<u64> = Vec::new();
    while soak.running() {
        while pending.len() < OVERLOAD {
            h.next_id += 1;
            let id = h.next_id;
            let line = if id % 2 == 0 {
                request(
                    id,
                    "thread/read",
                    json!({"threadId": format!("flood-{w}"), "limit": 5}),
                )
            } else {
                request(id, "thread/list", json!({"limit": 5}))
            };
            match h.conn.send(&line) {
                Ok(()) => {
                    soak.c.sent.fetch_add(1, Ordering::Relaxed);
                    pending.push(id);
                    // A host that floods still reads (docs/engine.md: one that stops is closed).
                    if pending.len().is_multiple_of(64) && !h.pump(Duration::ZERO) {
                        return;
                    }
                }
                Err(SendError::Overloaded { retry_after_ms }) => {
                    soak.c.overloaded.fetch_add(1, Ordering::Relaxed);
                    if retry_after_ms == 0 {
                        soak.fail("Overloaded with retry_after_ms 0".into());
                    }
                    break;
                }
                Err(e) => return soak.fail(format!("flood-{w}: send failed: {e}")),
            }
        }
        if !h.pump(Duration::from_millis(1)) {
            return;
        }
        pending.retain(|id| h.answers.remove(id).is_none());
    }
    let until = Instant::now() + Duration::from_secs(30);
    while !pending.is_empty() && Instant::now() < until {
        h.pump(Duration::from_millis(20));
        pending.retain(|id| h.answers.remove(id).is_none());
    }
    if !pending.is_empty() {
        soak.fail(format!(
            "flood-{w}: {} accepted requests never answered",
            pending.len()
        ));
    }
}

/// A host that reads, but slowly (1 ms per message), with many requests pipelined within the
/// outbound bound: it must never be cut off.
fn slow_reader_worker(soak: &Soak, server: &AppServer) {
    let Some(mut h) = Host::new(soak, server, "slow-reader".into()) else {
        return;
    };
    while soak.running() {
        let ids: Vec<u64> = (0..400)
            .map(|_| h.send("thread/list", json!({"limit": 1})))
            .collect();
        for id in ids {
            thread::sleep(Duration::from_millis(1));
            if h.wait(id, Duration::from_secs(30)).is_none() {
                return;
            }
        }
    }
}

/// Interrupt storms: a turn whose kernel ignores cancellation for a while, hit by bursts of
/// turn/interrupt, each of which must be answered (-32010 or the settled turn).
fn interrupt_worker(soak: &Soak, server: &AppServer) {
    let Some(mut h) = Host::new(soak, server, "interrupts".into()) else {
        return;
    };
    let mut n = 0;
    while soak.running() {
        n += 1;
        let thread = format!("storm-{n}");
        let script = json!({"steps": [{"type": "ignoreCancel", "ms": 300}]});
        let _ = h.call(
            "thread/start",
            json!({"threadId": thread, "agentOptions": {"script": script}}),
        );
        let Some(r) = h.call(
            "turn/start",
            json!({"threadId": thread, "input": [{"type": "text", "text": "x"}]}),
        ) else {
            return;
        };
        let Some(turn) = r["result"]["turn"]["id"].as_str().map(str::to_string) else {
            return soak.fail(format!("storm turn/start refused: {r}"));
        };
        let ids: Vec<u64> = (0..200)
            .map(|_| {
                h.send(
                    "turn/interrupt",
                    json!({"threadId": thread, "turnId": turn}),
                )
            })
            .collect();
        soak.c
            .interrupts
            .fetch_add(ids.len() as u64, Ordering::Relaxed);
        for id in ids {
            if let Some(r) = h.wait(id, Duration::from_secs(30)) {
                let ok = r["result"]["physicallySettled"] == true || r["error"]["code"] == -32010;
                if !ok {
                    soak.fail(format!(
                        "turn/interrupt answered neither settled nor -32010: {r}"
                    ));
                }
            }
        }
        if h.wait_turn(&turn, Duration::from_secs(30)) {
            h.check_thread(server, &thread);
        }
    }
}

/// What a reader thread learned from a serve child's stdout, kept compact so a 30-minute run
/// stays small: answers are checked for order as they arrive, notifications kept as
/// (thread index, seq, method index).
#[derive(Default)]
struct StdioSeen {
    next_id: u64,
    answered: u64,
    problems: Vec<String>,
    threads: HashMap<String, u32>,
    thread_names: Vec<String>,
    notified: Vec<(u32, u64, u8)>,
    /// Answers whose ids were asked for (`watch`), by id.
    watched: HashMap<u64, Value>,
    watch: Vec<u64>,
}

const METHODS: [&str; 9] = [
    "turn/started",
    "turn/completed",
    "item/started",
    "item/delta",
    "item/completed",
    "tool/requested",
    "tool/result",
    "approval/requested",
    "approval/resolved",
];

impl StdioSeen {
    fn observe(&mut self, v: Value, ordered: bool) {
        if v.get("method").is_none() {
            self.answered += 1;
            let id = v["id"].as_u64();
            if ordered && id != Some(self.next_id + 1) && self.problems.len() < 20 {
                self.problems.push(format!(
                    "answer out of order (wanted id {}): {v}",
                    self.next_id + 1
                ));
            }
            if let Some(id) = id {
                self.next_id = self.next_id.max(id);
                if self.watch.contains(&id) {
                    self.watched.insert(id, v.clone());
                }
            }
            if v["error"]["code"] == -32001 && self.problems.len() < 20 {
                self.problems.push(format!(
                    "-32001 on stdio, where overload is backpressure: {v}"
                ));
            }
        } else if let (Some(t), Some(seq), Some(m)) = (
            v["params"]["threadId"].as_str(),
            v["params"]["eventSeq"].as_u64(),
            v["method"].as_str(),
        ) {
            if let Some(mi) = METHODS.iter().position(|x| *x == m) {
                let next = self.thread_names.len() as u32;
                let ti = *self.threads.entry(t.to_string()).or_insert(next);
                if ti == next {
                    self.thread_names.push(t.to_string());
                }
                self.notified.push((ti, seq, mi as u8));
            }
        }
    }
}

/// A `cc-app-server serve` child with a reader thread checking its stdout as it arrives.
struct ServeChild {
    child: Child,
    stdin: Option<std::process::ChildStdin>,
    seen: Arc<Mutex<StdioSeen>>,
    reader: thread::JoinHandle<()>,
}

fn spawn_serve(
    bin: &Path,
    state: &Path,
    slow_ms: u64,
    ordered: bool,
    watch: Vec<u64>,
    soak: &Arc<Soak>,
    extra: &[String],
) -> std::io::Result<ServeChild> {
    let mut child = Command::new(bin)
        .args(["serve", "--state-dir"])
        .arg(state)
        .args(["--drain-timeout-ms", "20000", "--approval-policy", "auto"])
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let stdin = child.stdin.take();
    let stdout = child.stdout.take().expect("piped");
    let seen = Arc::new(Mutex::new(StdioSeen {
        watch,
        ..StdioSeen::default()
    }));
    let reader = {
        let (seen, soak) = (Arc::clone(&seen), Arc::clone(soak));
        thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = Vec::new();
            loop {
                line.clear();
                match reader.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                if slow_ms > 0 {
                    thread::sleep(Duration::from_millis(slow_ms));
                }
                soak.c.stdio_lines.fetch_add(1, Ordering::Relaxed);
                if line.last() != Some(&b'\n') {
                    // The stream ended inside a line: the cut-off writer tore it.
                    soak.fail_tagged(
                        "torn-line",
                        format!(
                            "stdio: stdout ended mid-line after {} bytes of its last line",
                            line.len()
                        ),
                    );
                    break;
                }
                match serde_json::from_slice::<Value>(&line) {
                    Ok(v) => seen.lock().unwrap().observe(v, ordered),
                    Err(e) => soak.fail(format!("stdio: unparseable output ({e})")),
                }
            }
        })
    };
    Ok(ServeChild {
        child,
        stdin,
        seen,
        reader,
    })
}

fn rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn os_threads(pid: u32) -> Option<usize> {
    Some(std::fs::read_dir(format!("/proc/{pid}/task")).ok()?.count())
}

/// Over stdio: a flood of pipelined requests (turns included) written as fast as the pipe takes
/// them while a reader keeps reading; then EOF, exit 0, every request answered in order, every
/// notification's event in the rollout, `rollout verify` passing.
/// Floods serve children until `seconds` have passed: a child that cuts its reader off (exit 3,
/// the slow-reader finding) is checked for what it acknowledged and replaced by a new one on a
/// fresh state dir, so the run keeps its load. `CC_SOAK_STDIO_ARGS` adds serve flags (e.g.
/// `--outbound-cap 100000` to measure memory past that finding).
fn stdio_flood(soak: &Arc<Soak>, bin: &Path, root: &Path, seconds: f64, pid_file: Option<&Path>) {
    let mut extra = vec!["--tail-cache-mib".to_string(), tail_cache_mib().to_string()];
    extra.extend(
        std::env::var("CC_SOAK_STDIO_ARGS")
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_string),
    );
    let until = Instant::now() + Duration::from_secs_f64(seconds);
    let mut generation = 0;
    while Instant::now() < until && soak.running() {
        generation += 1;
        let state = root.join(format!("stdio-flood-{generation}"));
        let left = until
            .saturating_duration_since(Instant::now())
            .as_secs_f64();
        if !stdio_flood_once(soak, bin, &state, left, pid_file, &extra) {
            thread::sleep(Duration::from_secs(2));
        }
    }
    println!("stdio flood: {generation} serve process(es)");
}

/// One flood generation; false when the child cut its reader off.
fn stdio_flood_once(
    soak: &Arc<Soak>,
    bin: &Path,
    state: &Path,
    seconds: f64,
    pid_file: Option<&Path>,
    extra: &[String],
) -> bool {
    let mut c = match spawn_serve(bin, state, 0, true, Vec::new(), soak, extra) {
        Ok(c) => c,
        Err(e) => {
            soak.fail(format!("cannot start {}: {e}", bin.display()));
            return false;
        }
    };
    if let Some(f) = pid_file {
        let _ = std::fs::write(f.with_extension("threads"), "0");
        let _ = std::fs::write(f, c.child.id().to_string());
    }
    let mut stdin = c.stdin.take().expect("piped");
    let mut id = 1u64;
    let mut out = initialize(id) + "\n";
    let until = Instant::now() + Duration::from_secs_f64(seconds);
    let mut max_stall = Duration::ZERO;
    let mut n = 0u64;
    while Instant::now() < until && soak.running() {
        n += 1;
        if n.is_multiple_of(16) {
            // How many threads this child holds, for the RSS judgement (one write per 16).
            if let Some(f) = pid_file {
                let _ = std::fs::write(f.with_extension("threads"), n.to_string());
            }
        }
        let thread = format!("s{n}");
        let script = &scripts()[(n as usize) % 3];
        id += 1;
        out.push_str(&request(
            id,
            "thread/start",
            json!({"threadId": thread, "agentOptions": {"script": script}}),
        ));
        out.push('\n');
        for _ in 0..2 {
            id += 1;
            out.push_str(&request(
                id,
                "turn/start",
                json!({"threadId": thread, "input": [{"type": "text", "text": "go"}]}),
            ));
            out.push('\n');
        }
        // Ten times the inbound queue of cheap requests behind the turns, every 10 threads.
        let cheap = if n.is_multiple_of(10) { OVERLOAD } else { 8 };
        for k in 0..cheap {
            id += 1;
            let line = if k % 2 == 0 {
                request(id, "thread/read", json!({"threadId": thread, "limit": 3}))
            } else {
                request(id, "thread/list", json!({"limit": 3}))
            };
            out.push_str(&line);
            out.push('\n');
        }
        let t = Instant::now();
        if stdin.write_all(out.as_bytes()).is_err() {
            // The child has gone; its exit status below says why.
            break;
        }
        max_stall = max_stall.max(t.elapsed());
        soak.c
            .sent
            .fetch_add(out.matches('\n').count() as u64, Ordering::Relaxed);
        out.clear();
    }
    drop(stdin);
    let status = wait_child(&mut c.child, Duration::from_secs(60));
    if let Some(f) = pid_file {
        let _ = std::fs::remove_file(f);
    }
    let _ = c.reader.join();
    println!("stdio flood: {id} requests written on {n} threads, longest write stall {:.0} ms (backpressure)", max_stall.as_secs_f64() * 1e3);
    let seen = std::mem::take(&mut *c.seen.lock().unwrap());
    match status.and_then(|s| s.code()) {
        Some(0) => {
            check_stdio(soak, "stdio flood", seen, id, state, bin);
            true
        }
        Some(3) => {
            soak.fail_tagged(
                "slow-reader",
                format!(
                    "stdio flood: serve cut off a reader that never stopped reading (exit 3) after {} of {id} answers",
                    seen.answered
                ),
            );
            // What it did answer must still be durable and consistent.
            let answered = seen.answered;
            check_stdio(soak, "stdio flood (cut off)", seen, answered, state, bin);
            false
        }
        _ => {
            soak.fail(format!(
                "stdio flood: serve ended with {status:?}, expected exit 0"
            ));
            false
        }
    }
}

fn wait_child(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
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
        thread::sleep(Duration::from_millis(20));
    }
}

/// Every id 1..=last answered once and in order; every notification backed by the rollout.
fn check_stdio(soak: &Soak, what: &str, seen: StdioSeen, last: u64, state: &Path, bin: &Path) {
    for p in &seen.problems {
        soak.fail(format!("{what}: {p}"));
    }
    if seen.answered != last || seen.next_id != last {
        soak.fail(format!(
            "{what}: {} answers for {last} requests",
            seen.answered
        ));
    }
    match Command::new(bin)
        .args(["rollout", "verify", "--state-dir"])
        .arg(state)
        .output()
    {
        Ok(o) if o.status.success() => {}
        Ok(o) => soak.fail(format!(
            "{what}: rollout verify failed: {}",
            String::from_utf8_lossy(&o.stdout)
        )),
        Err(e) => soak.fail(format!("{what}: cannot run rollout verify: {e}")),
    }
    let store = match open_store(StoreKind::Jsonl, state, StoreOptions::default()) {
        Ok(s) => s,
        Err(e) => return soak.fail(format!("{what}: cannot open the child's store: {e}")),
    };
    let mut by_thread: BTreeMap<u32, Vec<(u64, u8)>> = BTreeMap::new();
    for (t, seq, m) in seen.notified {
        by_thread.entry(t).or_default().push((seq, m));
    }
    let mut missing = 0u64;
    for (t, notes) in by_thread {
        let thread = &seen.thread_names[t as usize];
        let mut events = HashMap::new();
        let mut after = 0;
        while let Ok(p) = store.read(thread, after, 1000) {
            for e in &p.events {
                after = e.seq;
                events.insert(e.seq, e.kind().to_string());
            }
            if !p.has_more {
                break;
            }
        }
        for (seq, m) in notes {
            let method = METHODS[m as usize];
            let want = event_type_of(method).unwrap_or("");
            if events.get(&seq).map(String::as_str) != Some(want) {
                missing += 1;
                if missing <= 5 {
                    soak.fail(format!("{what}: {method} for {thread}#{seq} has no {want} event in the rollout (found {:?})", events.get(&seq)));
                }
            }
        }
    }
}

/// Over stdio: 2,000 pipelined requests read back at 1 ms per line. A reader that keeps
/// reading must get every answer (docs/cli.md: only a reader that stops is cut off).
fn stdio_slow_reader(soak: &Arc<Soak>, bin: &Path, state: &Path) {
    let mut c = match spawn_serve(bin, state, 1, true, Vec::new(), soak, &[]) {
        Ok(c) => c,
        Err(e) => return soak.fail(format!("cannot start {}: {e}", bin.display())),
    };
    let mut stdin = c.stdin.take().expect("piped");
    let mut text = initialize(1) + "\n";
    for id in 2..=2000u64 {
        text.push_str(&request(id, "thread/list", json!({"limit": 1})));
        text.push('\n');
    }
    let _ = stdin.write_all(text.as_bytes());
    drop(stdin);
    let status = wait_child(&mut c.child, Duration::from_secs(120));
    let _ = c.reader.join();
    let answered = c.seen.lock().unwrap().answered;
    println!("stdio slow reader: {answered} of 2000 answered, serve ended with {status:?}");
    if answered != 2000 || !status.is_some_and(|s| s.success()) {
        soak.fail_tagged("slow-reader", format!(
            "stdio slow reader: a client reading 1 line/ms got {answered} of 2000 answers and serve ended with {status:?} (docs/cli.md: a reader that is reading is never cut off)"
        ));
    }
}

/// Over stdio: a turn that ignores cancellation, hit by 5,000 pipelined turn/interrupt; every
/// one answered, the child's OS thread count sampled meanwhile.
fn stdio_interrupt_storm(soak: &Arc<Soak>, bin: &Path, state: &Path, max_threads: usize) {
    let mut c = match spawn_serve(bin, state, 0, false, vec![3], soak, &[]) {
        Ok(c) => c,
        Err(e) => return soak.fail(format!("cannot start {}: {e}", bin.display())),
    };
    let pid = c.child.id();
    let mut stdin = c.stdin.take().expect("piped");
    let script = json!({"steps": [{"type": "ignoreCancel", "ms": 1500}]});
    let head = format!(
        "{}\n{}\n{}\n",
        initialize(1),
        request(
            2,
            "thread/start",
            json!({"threadId": "storm", "agentOptions": {"script": script}})
        ),
        request(
            3,
            "turn/start",
            json!({"threadId": "storm", "input": [{"type": "text", "text": "x"}]})
        )
    );
    let _ = stdin.write_all(head.as_bytes());
    let until = Instant::now() + Duration::from_secs(10);
    let turn = loop {
        let found = c.seen.lock().unwrap().watched.get(&3).cloned();
        if let Some(v) = found {
            break v["result"]["turn"]["id"].as_str().unwrap_or("").to_string();
        }
        if Instant::now() >= until {
            return soak.fail("stdio storm: turn/start unanswered".into());
        }
        thread::sleep(Duration::from_millis(5));
    };
    let mut text = String::new();
    for id in 4..5004u64 {
        text.push_str(&request(
            id,
            "turn/interrupt",
            json!({"threadId": "storm", "turnId": turn}),
        ));
        text.push('\n');
    }
    let stop = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (s, m) = (Arc::clone(&stop), Arc::clone(&peak));
        thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                if let Some(n) = os_threads(pid) {
                    m.fetch_max(n as u64, Ordering::Relaxed);
                }
                thread::sleep(Duration::from_millis(10));
            }
        })
    };
    let _ = stdin.write_all(text.as_bytes());
    drop(stdin);
    let status = wait_child(&mut c.child, Duration::from_secs(60));
    stop.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    let _ = c.reader.join();
    let peak = peak.load(Ordering::Relaxed);
    let answered = c.seen.lock().unwrap().answered.saturating_sub(3);
    println!("stdio interrupt storm: {answered} of 5000 interrupts answered, peak {peak} OS threads, serve ended with {status:?}");
    soak.c.interrupts.fetch_add(5000, Ordering::Relaxed);
    if status.and_then(|s| s.code()) == Some(3) {
        soak.fail_tagged(
            "slow-reader",
            format!("stdio storm: serve cut off a reader that never stopped reading (exit 3) after {answered} of 5000 interrupt answers"),
        );
    } else {
        if answered != 5000 {
            soak.fail(format!(
                "stdio storm: {answered} of 5000 interrupts answered"
            ));
        }
        if !status.is_some_and(|s| s.success()) {
            soak.fail(format!("stdio storm: serve ended with {status:?}"));
        }
    }
    if peak as usize > max_threads {
        soak.fail_tagged(
            "threads",
            format!("stdio storm: {peak} OS threads in the server (bound {max_threads})"),
        );
    }
}

/// One second: (t, in-process RSS KiB, in-process threads, child RSS KiB, child threads, child pid,
/// threads on disk in-process, threads the child was asked to create).
type Sample = (
    f64,
    u64,
    usize,
    Option<u64>,
    Option<usize>,
    Option<u32>,
    u64,
    Option<u64>,
);

/// What the engine may keep per thread on disk (its summary index and what an unloaded thread
/// leaves behind): docs/engine.md, "Memory", measured by `scripts/bench.sh memory`.
const PER_THREAD_KIB: f64 = 2.0;

/// The tail cache's budget in the soak (MiB; `CC_SOAK_TAIL_CACHE_MIB`).
fn tail_cache_mib() -> usize {
    std::env::var("CC_SOAK_TAIL_CACHE_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2)
}

/// RSS growth after the warm-up beyond `PER_THREAD_KIB` per thread created since its first
/// sample, as a share of that sample: (first KiB, last KiB, threads created, share).
fn growth(v: &[(u64, u64)]) -> Option<(u64, u64, u64, f64)> {
    let (rss0, n0) = *v.first()?;
    let worst = v
        .iter()
        .map(|&(rss, n)| rss as f64 - rss0 as f64 - PER_THREAD_KIB * n.saturating_sub(n0) as f64)
        .fold(0.0f64, f64::max);
    let (last, n_last) = *v.last()?;
    Some((
        rss0,
        last,
        n_last.saturating_sub(n0),
        worst / rss0.max(1) as f64,
    ))
}

/// The stdio half, run as its own process (`--stdio-part`) so its bookkeeping never counts
/// towards the in-process server's RSS.
fn stdio_part(
    seconds: f64,
    bin: PathBuf,
    root: PathBuf,
    pid_file: PathBuf,
    max_threads: usize,
) -> i32 {
    let soak = Arc::new(Soak {
        stop: AtomicBool::new(false),
        failures: Mutex::new(Vec::new()),
        known: Mutex::new(Vec::new()),
        c: Counters::default(),
    });
    let flood = {
        let (soak, bin, root) = (Arc::clone(&soak), bin.clone(), root.clone());
        let secs = (seconds - 10.0).max(5.0);
        thread::spawn(move || stdio_flood(&soak, &bin, &root, secs, Some(&pid_file)))
    };
    stdio_slow_reader(&soak, &bin, &root.join("stdio-slow"));
    stdio_interrupt_storm(&soak, &bin, &root.join("stdio-storm"), max_threads);
    let _ = flood.join();
    let failures = soak.failures.lock().unwrap().clone();
    println!(
        "stdio part: {} lines read, {} failure(s)",
        soak.c.stdio_lines.load(Ordering::Relaxed),
        failures.len()
    );
    if failures.is_empty() {
        0
    } else {
        1
    }
}

fn main() {
    let mut seconds = 60.0f64;
    let mut bin = None;
    let mut report = None;
    let mut max_threads = 256usize;
    let mut part: Option<(PathBuf, PathBuf)> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--seconds" => {
                seconds = args
                    .next()
                    .and_then(|s| s.parse().ok())
                    .expect("--seconds N")
            }
            "--server-bin" => bin = args.next().map(PathBuf::from),
            "--report" => report = args.next().map(PathBuf::from),
            "--max-threads" => {
                max_threads = args
                    .next()
                    .and_then(|s| s.parse().ok())
                    .expect("--max-threads N")
            }
            "--stdio-part" => {
                let root = args
                    .next()
                    .map(PathBuf::from)
                    .expect("--stdio-part ROOT PIDFILE");
                let pid = args
                    .next()
                    .map(PathBuf::from)
                    .expect("--stdio-part ROOT PIDFILE");
                part = Some((root, pid));
            }
            other => panic!("unknown argument {other}; see the module docs"),
        }
    }
    let bin = bin.expect("--server-bin PATH (the cc-app-server binary)");
    if let Some((root, pid_file)) = part {
        std::process::exit(stdio_part(seconds, bin, root, pid_file, max_threads));
    }
    let root = tempfile::tempdir().expect("temp dir");
    let soak = Arc::new(Soak {
        stop: AtomicBool::new(false),
        failures: Mutex::new(Vec::new()),
        known: Mutex::new(Vec::new()),
        c: Counters::default(),
    });
    let mut config = ServerConfig::new(root.path().join("inproc"));
    config.store_options.tail_cache_bytes = tail_cache_mib() << 20;
    let server = AppServer::open(config).expect("open the in-process server");
    let me = std::process::id();
    let started = Instant::now();
    let warmup = (seconds * 0.25).clamp(5.0, 120.0);
    println!("soak: {seconds:.0} s (warm-up {warmup:.0} s), in-process + stdio, 10x the {INBOUND_CAP}-message inbound queue, thread bound {max_threads}");
    let pid_file = root.path().join("serve.pid");
    let mut stdio = Command::new(std::env::current_exe().expect("own path"))
        .args([
            "--seconds",
            &seconds.to_string(),
            "--max-threads",
            &max_threads.to_string(),
            "--server-bin",
        ])
        .arg(&bin)
        .arg("--stdio-part")
        .arg(root.path())
        .arg(&pid_file)
        .spawn()
        .expect("start the stdio part");

    let mut handles = Vec::new();
    for w in 0..24 {
        let (soak, server) = (Arc::clone(&soak), server.clone());
        handles.push(thread::spawn(move || turns_worker(&soak, &server, w)));
    }
    for w in 0..4 {
        let (soak, server) = (Arc::clone(&soak), server.clone());
        handles.push(thread::spawn(move || flood_worker(&soak, &server, w)));
    }
    {
        let (soak, server) = (Arc::clone(&soak), server.clone());
        handles.push(thread::spawn(move || slow_reader_worker(&soak, &server)));
    }
    {
        let (soak, server) = (Arc::clone(&soak), server.clone());
        handles.push(thread::spawn(move || interrupt_worker(&soak, &server)));
    }
    let mut samples: Vec<Sample> = Vec::new();
    while started.elapsed().as_secs_f64() < seconds {
        thread::sleep(Duration::from_secs(1));
        let t = started.elapsed().as_secs_f64();
        let child = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|p| p.trim().parse::<u32>().ok());
        // What the engine holds, so RSS growth can be told apart from its bounded caches and its
        // index of every thread on disk (docs/engine.md, "Memory").
        let e = server.stats_snapshot();
        let child_created = std::fs::read_to_string(pid_file.with_extension("threads"))
            .ok()
            .and_then(|p| p.trim().parse::<u64>().ok());
        let s = (
            t,
            rss_kib(me).unwrap_or(0),
            os_threads(me).unwrap_or(0),
            child.and_then(rss_kib),
            child.and_then(os_threads),
            child,
            e.store_indexed_threads,
            child_created,
        );
        let c = &soak.c;
        println!(
            "t={t:5.0}s rss={} MiB threads={} child_rss={} child_threads={} sent={} answered={} overloaded={} turns={} interrupts={} approvals={} threads_checked={} indexed={} loaded={}/{} tail_cache={} KiB",
            s.1 / 1024,
            s.2,
            s.3.map_or("-".into(), |r| (r / 1024).to_string()),
            s.4.map_or("-".into(), |n| n.to_string()),
            c.sent.load(Ordering::Relaxed),
            c.answered.load(Ordering::Relaxed),
            c.overloaded.load(Ordering::Relaxed),
            c.turns.load(Ordering::Relaxed),
            c.interrupts.load(Ordering::Relaxed),
            c.approvals.load(Ordering::Relaxed),
            c.threads_checked.load(Ordering::Relaxed),
            e.store_indexed_threads,
            e.threads_loaded,
            e.store_loaded_threads,
            e.tail_cache_bytes / 1024,
        );
        samples.push(s);
    }
    soak.stop.store(true, Ordering::SeqCst);
    for h in handles {
        let _ = h.join();
    }
    server.shutdown();
    let store = server.store();
    match store.list(&cc_app_server::rollout::ListQuery {
        include_archived: true,
        cursor: None,
        limit: 1000,
    }) {
        Ok(page) if page.unreadable.is_empty() => {}
        Ok(page) => soak.fail(format!(
            "in-process: unreadable threads after the run: {:?}",
            page.unreadable
        )),
        Err(e) => soak.fail(format!("in-process: list after the run failed: {e}")),
    }
    match stdio.wait() {
        Ok(s) if s.success() => {}
        other => soak.fail(format!(
            "the stdio part failed ({other:?}); see its lines above"
        )),
    }

    let after: Vec<_> = samples.iter().filter(|s| s.0 > warmup).collect();
    let spread = |v: Vec<u64>| -> Option<(u64, u64, f64)> {
        let (min, max) = (*v.iter().min()?, *v.iter().max()?);
        Some((min, max, (max - min) as f64 / min.max(1) as f64))
    };
    let inproc_raw = spread(after.iter().map(|s| s.1).collect());
    let inproc = growth(&after.iter().map(|s| (s.1, s.6)).collect::<Vec<_>>());
    // The flood's serve child is replaced when it cuts its reader off; judge the one that
    // lived longest.
    let mut lives: HashMap<u32, usize> = HashMap::new();
    for s in &after {
        if let Some(pid) = s.5 {
            *lives.entry(pid).or_default() += 1;
        }
    }
    let longest = lives.iter().max_by_key(|(_, n)| **n).map(|(p, _)| *p);
    let mut of_longest: Vec<(u64, u64)> = after
        .iter()
        .filter(|s| s.5.is_some() && s.5 == longest)
        .filter_map(|s| Some((s.3?, s.7.unwrap_or(0))))
        .collect();
    // Its last samples catch it shutting down; and a child that lived under 10 s is not judged.
    of_longest.truncate(of_longest.len().saturating_sub(2));
    let child_raw = spread(of_longest.iter().map(|s| s.0).collect());
    let child = if of_longest.len() >= 10 {
        growth(&of_longest)
    } else {
        None
    };
    for (who, raw, judged) in [
        ("in-process", inproc_raw, inproc),
        ("stdio child", child_raw, child),
    ] {
        let (Some((min, max, r)), Some((first, last, created, g))) = (raw, judged) else {
            continue;
        };
        println!(
            "{who} RSS after warm-up: {} .. {} MiB ({:+.1}%); {first} -> {last} KiB with {created} threads created: {:+.1}% beyond {PER_THREAD_KIB} KiB each",
            min / 1024,
            max / 1024,
            r * 100.0,
            g * 100.0
        );
        if g > 0.10 {
            soak.fail_tagged(
                "rss",
                format!(
                    "{who} RSS grew {:.1}% after warm-up beyond {PER_THREAD_KIB} KiB per thread created ({first} -> {last} KiB, {created} threads)",
                    g * 100.0
                ),
            );
        }
    }
    let peak_threads = samples.iter().map(|s| s.2).max().unwrap_or(0);
    let peak_child_threads = samples.iter().filter_map(|s| s.4).max().unwrap_or(0);
    println!("peak OS threads: in-process {peak_threads}, stdio child {peak_child_threads} (bound {max_threads})");
    if peak_threads > max_threads {
        soak.fail_tagged(
            "threads",
            format!("in-process: {peak_threads} OS threads (bound {max_threads})"),
        );
    }
    let failures = soak.failures.lock().unwrap().clone();
    let c = &soak.c;
    let summary = json!({
        "seconds": seconds, "warmupSeconds": warmup,
        "sent": c.sent.load(Ordering::Relaxed), "answered": c.answered.load(Ordering::Relaxed),
        "overloaded": c.overloaded.load(Ordering::Relaxed), "turns": c.turns.load(Ordering::Relaxed),
        "interrupts": c.interrupts.load(Ordering::Relaxed), "approvals": c.approvals.load(Ordering::Relaxed),
        "threadsChecked": c.threads_checked.load(Ordering::Relaxed), "stdioLines": c.stdio_lines.load(Ordering::Relaxed),
        "inprocRssKiB": inproc_raw.map(|(a, b, r)| json!({"min": a, "max": b, "spread": r})),
        "childRssKiB": child_raw.map(|(a, b, r)| json!({"min": a, "max": b, "spread": r})),
        "inprocGrowth": inproc.map(|(a, b, n, g)| json!({"first": a, "last": b, "threadsCreated": n, "beyondPerThread": g})),
        "childGrowth": child.map(|(a, b, n, g)| json!({"first": a, "last": b, "threadsCreated": n, "beyondPerThread": g})),
        "peakThreads": peak_threads, "peakChildThreads": peak_child_threads, "maxThreads": max_threads,
        "samples": samples.iter().map(|s| json!([s.0.round(), s.1, s.2, s.3, s.4, s.5, s.6, s.7])).collect::<Vec<_>>(),
        "failures": failures,
        "known": soak.known.lock().unwrap().clone(),
    });
    if let Some(path) = report {
        let _ = std::fs::write(path, serde_json::to_string_pretty(&summary).unwrap());
    }
    if failures.is_empty() {
        println!("soak: all checks passed");
    } else {
        println!("soak: {} check(s) FAILED:", failures.len());
        for f in &failures {
            println!("  - {f}");
        }
        std::process::exit(1);
    }
}
