//! What the stdio child process costs next to the in-process engine: the same thread/read round
//! trip both ways in one run (and their ratio), and pipelined messages per second through stdio.
//!
//! Run: `cargo bench -p cc-app-server-cli --bench stdio` (figures go in docs/bench/stdio.md).

use cc_app_server::engine::{AppServer, Connection, ServerConfig};
use criterion::{criterion_group, Criterion, Throughput};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc::{channel, Sender};
use std::time::Duration;

const THREAD: &str = "bench";
/// Requests per pipelined batch in the throughput measurement.
const BATCH: u64 = 1000;

fn private_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    dir
}

fn request(id: u64, method: &str, params: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string()
}

fn read_request(id: u64, limit: u64) -> String {
    request(
        id,
        "thread/read",
        json!({"threadId": THREAD, "limit": limit}),
    )
}

/// The messages every setup sends: handshake, a thread, one finished turn (so reads return events).
fn setup_messages() -> Vec<String> {
    vec![
        request(
            1,
            "initialize",
            json!({"protocolVersion": 1, "minimumProtocolVersion": 1, "client": {"name": "bench", "version": "1"}, "features": []}),
        ),
        request(2, "thread/start", json!({"threadId": THREAD})),
        request(
            3,
            "turn/start",
            json!({"threadId": THREAD, "input": [{"type": "text", "text": "hello"}]}),
        ),
    ]
}

fn is_response_to(line: &str, id: u64) -> bool {
    let v: Value = serde_json::from_str(line).expect("JSON from the server");
    v.get("method").is_none() && v["id"] == id
}

fn is_turn_completed(line: &str) -> bool {
    line.contains("\"method\":\"turn/completed\"")
}

struct InProcess {
    _dir: tempfile::TempDir,
    server: AppServer,
    conn: Connection,
    next: u64,
}

impl InProcess {
    fn new() -> Self {
        let dir = private_dir();
        let server = AppServer::open(ServerConfig::new(dir.path())).unwrap();
        let conn = server.connect().unwrap();
        let me = InProcess {
            _dir: dir,
            server,
            conn,
            next: 100,
        };
        for m in setup_messages() {
            me.conn.send(&m).unwrap();
        }
        me.wait(is_turn_completed);
        me
    }

    fn wait(&self, pred: impl Fn(&str) -> bool) {
        loop {
            let line = self.conn.recv(Some(Duration::from_secs(10))).unwrap();
            if pred(&line) {
                return;
            }
        }
    }

    fn round_trip(&mut self) {
        self.next += 1;
        let id = self.next;
        self.conn.send(&read_request(id, 10)).unwrap();
        self.wait(|l| is_response_to(l, id));
    }
}

struct StdioChild {
    _dir: tempfile::TempDir,
    child: Child,
    /// Lines to write, handed to a writer thread so pipelined batches never deadlock on the pipes.
    to_stdin: Option<Sender<Vec<u8>>>,
    stdout: BufReader<ChildStdout>,
    line: String,
    next: u64,
}

impl StdioChild {
    fn new() -> Self {
        let dir = private_dir();
        let mut child = Command::new(env!("CARGO_BIN_EXE_cc-app-server"))
            .args(["serve", "--state-dir"])
            .arg(dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut stdin: ChildStdin = child.stdin.take().unwrap();
        let (tx, rx) = channel::<Vec<u8>>();
        std::thread::spawn(move || {
            for bytes in rx {
                if stdin
                    .write_all(&bytes)
                    .and_then(|()| stdin.flush())
                    .is_err()
                {
                    return;
                }
            }
        });
        let mut me = StdioChild {
            _dir: dir,
            stdout: BufReader::new(child.stdout.take().unwrap()),
            child,
            to_stdin: Some(tx),
            line: String::new(),
            next: 100,
        };
        me.send(setup_messages().join("\n") + "\n");
        me.wait(is_turn_completed);
        me
    }

    fn send(&self, text: String) {
        self.to_stdin
            .as_ref()
            .unwrap()
            .send(text.into_bytes())
            .unwrap();
    }

    fn wait(&mut self, pred: impl Fn(&str) -> bool) {
        loop {
            self.line.clear();
            let n = self.stdout.read_line(&mut self.line).unwrap();
            assert!(n > 0, "the server closed stdout");
            if pred(self.line.trim_end()) {
                return;
            }
        }
    }

    fn round_trip(&mut self) {
        self.next += 1;
        let id = self.next;
        self.send(read_request(id, 10) + "\n");
        self.wait(|l| is_response_to(l, id));
    }

    /// BATCH thread/read requests written at once; returns when the last is answered.
    fn pipelined_batch(&mut self) {
        let first = self.next + 1;
        let mut all = String::new();
        for i in 0..BATCH {
            all.push_str(&read_request(first + i, 1));
            all.push('\n');
        }
        self.next += BATCH;
        let last = self.next;
        self.send(all);
        self.wait(|l| is_response_to(l, last));
    }
}

impl Drop for StdioChild {
    fn drop(&mut self) {
        self.to_stdin.take(); // EOF: the server drains and exits 0
        let _ = self.child.wait();
    }
}

fn benches(c: &mut Criterion) {
    let mut group = c.benchmark_group("thread_read_round_trip");
    let mut local = InProcess::new();
    group.bench_function("in_process", |b| b.iter(|| local.round_trip()));
    let mut child = StdioChild::new();
    group.bench_function("stdio_child", |b| b.iter(|| child.round_trip()));
    group.finish();
    local.server.shutdown();

    let mut group = c.benchmark_group("stdio_throughput");
    group.throughput(Throughput::Elements(BATCH));
    group.sample_size(20);
    group.bench_function("pipelined_thread_read_x1000", |b| {
        b.iter(|| child.pipelined_batch())
    });
    group.finish();
}

criterion_group! {
    name = stdio;
    config = Criterion::default().sample_size(50).measurement_time(Duration::from_secs(5));
    targets = benches
}

/// Median (ns) of a finished benchmark, from criterion's own estimates.
fn median_ns(group: &str, name: &str) -> Option<f64> {
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).parent()?;
    let file = target
        .join("criterion")
        .join(group)
        .join(name)
        .join("new/estimates.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(file).ok()?).ok()?;
    v["median"]["point_estimate"].as_f64()
}

/// Round trips alternated in short blocks, so load drift on a shared machine hits both sides
/// alike: (median in-process µs, median stdio µs, median of per-block ratios).
fn interleaved(blocks: usize, per_block: usize) -> (f64, f64, f64) {
    let mut local = InProcess::new();
    let mut child = StdioChild::new();
    let time = |f: &mut dyn FnMut()| {
        let start = std::time::Instant::now();
        for _ in 0..per_block {
            f();
        }
        start.elapsed().as_secs_f64() * 1e6 / per_block as f64
    };
    let (mut a, mut b, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..blocks {
        let x = time(&mut || local.round_trip());
        let y = time(&mut || child.round_trip());
        a.push(x);
        b.push(y);
        ratios.push(y / x);
    }
    local.server.shutdown();
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|p, q| p.total_cmp(q));
        v[v.len() / 2]
    };
    (median(&mut a), median(&mut b), median(&mut ratios))
}

fn main() {
    stdio();
    Criterion::default().configure_from_args().final_summary();
    let local = median_ns("thread_read_round_trip", "in_process");
    let child = median_ns("thread_read_round_trip", "stdio_child");
    let batch = median_ns("stdio_throughput", "pipelined_thread_read_x1000");
    if let (Some(local), Some(child)) = (local, child) {
        println!(
            "\nthread/read round trip, medians: in-process {:.1} µs, stdio child {:.1} µs, ratio {:.2}x",
            local / 1e3,
            child / 1e3,
            child / local
        );
    }
    let (a, b, r) = interleaved(40, 500);
    println!(
        "interleaved (40 blocks of 500 each, alternating): in-process {a:.1} µs, stdio child {b:.1} µs, median ratio {r:.2}x"
    );
    if let Some(batch) = batch {
        println!(
            "stdio pipelined thread/read: {:.0} messages/s (median of {BATCH}-request batches)",
            BATCH as f64 / (batch / 1e9)
        );
    }
}
