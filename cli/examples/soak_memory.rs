//! The soak harness's small-device memory check (`scripts/test-memory.sh`; docs/bench/mobile.md,
//! "Memory"): what an open in-process server costs a host, on a state directory of many threads
//! with a few of them loaded, under each `ServerProfile`.
//!
//! The parent fills a state directory in a child process (so none of that work's memory is in
//! the figures), then runs one fresh child per profile. Each child reads its own resident memory
//! (`/proc/self/status`) before anything of the server exists — the host's baseline — then
//! opens the server through the same uniffi-facing API a phone app calls, connects a client,
//! lists every thread (all pages), resumes `--loaded` of them and runs one turn on each, and
//! reads its memory again once the server is quiet. The parent prints a CSV line per profile and
//! fails when the compact profile's growth passes the budget, or when a profile does not hold
//! the bounds it claims (loaded threads, tail cache bytes).
//!
//! Usage: `soak_memory [--threads N] [--loaded N] [--runs N] [--budget-kib N] [--dir DIR]`
//! (`--runs`: fresh children per profile, default 3; the median run is the profile's figure). Prints
//! `memory: N passed, N failed` last; exits 1 if any check failed.

use cc_app_server_ffi as ffi;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// 8 MiB: issue 26's target for 1,000 threads on disk and 10 loaded.
const DEFAULT_BUDGET_KIB: u64 = 8 * 1024;

struct Accept;

impl ffi::ApprovalHandler for Accept {
    fn decide(
        &self,
        _request: ffi::ApprovalRequest,
    ) -> Result<ffi::ApprovalDecision, ffi::HandlerError> {
        Ok(ffi::ApprovalDecision::AcceptOnce)
    }
}

fn request(client: &ffi::Client, method: &str, params: Value) -> Value {
    let text = client
        .request_blocking(method.into(), params.to_string())
        .unwrap_or_else(|e| panic!("{method}: {e:?}"));
    serde_json::from_str(&text).expect("a JSON result")
}

/// Waits for `turn/completed` of `thread_id`, skipping every other notification.
fn wait_turn(client: &ffi::Client, thread_id: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let Some(text) = client.next_notification(1000).expect("notifications") else {
            continue;
        };
        let m: Value = serde_json::from_str(&text).expect("a JSON notification");
        if m["method"] == "turn/completed" && m["params"]["threadId"] == thread_id {
            assert_eq!(m["params"]["turn"]["status"], "completed", "{m}");
            return;
        }
    }
    panic!("no turn/completed for {thread_id} within 60 s");
}

fn open(dir: &Path, profile: ffi::ServerProfile) -> (Arc<ffi::AppServer>, Arc<ffi::Client>) {
    let server = ffi::AppServer::open(
        ffi::ServerOptions {
            state_dir: dir.to_string_lossy().into(),
            profile: Some(profile),
            ..Default::default()
        },
        None,
        None,
    )
    .expect("open");
    let client =
        ffi::Client::connect(Arc::clone(&server), Some(Arc::new(Accept)), None).expect("connect");
    (server, client)
}

fn start_turn(client: &ffi::Client, thread_id: &str, text: &str) {
    request(
        client,
        "turn/start",
        json!({"threadId": thread_id, "input": [{"type": "text", "text": text}]}),
    );
    wait_turn(client, thread_id);
}

/// `--populate DIR N`: N threads with one finished turn each.
fn populate(dir: &Path, threads: usize) {
    let (server, client) = open(dir, ffi::ServerProfile::Standard);
    for i in 0..threads {
        let thread = request(&client, "thread/start", json!({}));
        let id = thread["thread"]["id"]
            .as_str()
            .expect("a thread id")
            .to_string();
        start_turn(&client, &id, &format!("thread {i}: hello"));
    }
    client.close();
    server.shutdown();
}

/// VmRSS, RssAnon, RssFile and Threads of this process (KiB, KiB, KiB, count).
fn status() -> [u64; 4] {
    let text = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let field = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{name} in /proc/self/status"))
    };
    [
        field("VmRSS:"),
        field("RssAnon:"),
        field("RssFile:"),
        field("Threads:"),
    ]
}

/// `--measure DIR PROFILE LOADED`: prints one `measure,…` line.
fn measure(dir: &Path, profile: &str, loaded: usize) {
    let profile_value = match profile {
        "standard" => ffi::ServerProfile::Standard,
        "compact" => ffi::ServerProfile::Compact,
        other => panic!("profile {other:?}"),
    };
    let before = status();
    let stage = |name: &str| {
        let now = status();
        eprintln!(
            "stage,{profile},{name},+{} KiB (anon +{}, file +{}), threads +{}",
            now[0].saturating_sub(before[0]),
            now[1].saturating_sub(before[1]),
            now[2].saturating_sub(before[2]),
            now[3].saturating_sub(before[3])
        );
    };
    let started = Instant::now();
    let (server, client) = open(dir, profile_value);
    stage("open+connect");
    let mut ids = Vec::new();
    let mut cursor = Value::Null;
    loop {
        let page = request(
            &client,
            "thread/list",
            json!({"cursor": cursor, "limit": 100}),
        );
        for t in page["threads"].as_array().expect("threads") {
            ids.push(t["id"].as_str().expect("an id").to_string());
        }
        cursor = page["nextCursor"].clone();
        if cursor.is_null() {
            break;
        }
    }
    stage("listed");
    for id in ids.iter().take(loaded) {
        request(&client, "thread/resume", json!({"threadId": id}));
        start_turn(&client, id, "one more");
    }
    stage("resumed+turns");
    let ready_ms = started.elapsed().as_millis();
    // Quiet: the turns' trailing work (commits, deliveries) is done.
    std::thread::sleep(Duration::from_millis(500));
    let after = status();
    let s = server.stats();
    println!(
        "measure,{profile},{},{},{},{},{},{},{},{},{},{},{},{}",
        ids.len(),
        loaded,
        before[0],
        after[0],
        after[0].saturating_sub(before[0]),
        after[1].saturating_sub(before[1]),
        after[2].saturating_sub(before[2]),
        after[3].saturating_sub(before[3]),
        s.threads_loaded,
        s.store_loaded_threads,
        s.tail_cache_bytes,
        ready_ms,
    );
    client.close();
    server.shutdown();
}

struct Measured {
    listed: u64,
    delta_kib: u64,
    threads_loaded: u64,
    store_loaded: u64,
    tail_cache_bytes: u64,
}

fn run_child(exe: &Path, args: &[String]) -> String {
    let out = Command::new(exe)
        .args(args)
        .output()
        .expect("spawn the child");
    assert!(out.status.success(), "{args:?} failed: {}", out.status);
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut threads, mut loaded, mut budget, mut dir) = (1000usize, 10usize, None, None);
    let mut runs = 3usize;
    while let Some(a) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--populate" => {
                let d = PathBuf::from(value());
                let n = value().parse().expect("--populate DIR N");
                return populate(&d, n);
            }
            "--measure" => {
                let d = PathBuf::from(value());
                let profile = value();
                let n = value().parse().expect("--measure DIR PROFILE LOADED");
                return measure(&d, &profile, n);
            }
            "--threads" => threads = value().parse().expect("--threads N"),
            "--loaded" => loaded = value().parse().expect("--loaded N"),
            "--budget-kib" => budget = Some(value().parse::<u64>().expect("--budget-kib N")),
            "--dir" => dir = Some(PathBuf::from(value())),
            "--runs" => runs = value().parse::<usize>().expect("--runs N").max(1),
            other => panic!("unknown argument {other:?}"),
        }
    }
    let budget = budget.unwrap_or(DEFAULT_BUDGET_KIB);
    let exe = std::env::current_exe().expect("this executable");
    let scratch = tempfile::tempdir().expect("a temporary directory");
    let dir = dir.unwrap_or_else(|| scratch.path().join("state"));
    let populated = Instant::now();
    run_child(
        &exe,
        &[
            "--populate".into(),
            dir.to_string_lossy().into(),
            threads.to_string(),
        ],
    );
    println!(
        "populated {threads} threads (one turn each) in {:.1} s: {}",
        populated.elapsed().as_secs_f64(),
        dir.display()
    );
    println!(
        "profile,threads_on_disk,loaded,baseline_kib,after_kib,delta_kib,anon_delta_kib,\
         file_delta_kib,os_threads_added,engine_loaded,store_loaded,tail_cache_bytes,ready_ms"
    );
    let (mut passed, mut failed) = (0, 0);
    let mut check = |ok: bool, what: String| {
        if ok {
            println!("ok {what}");
            passed += 1;
        } else {
            println!("FAILED {what}");
            failed += 1;
        }
    };
    // Each profile runs `runs` times in fresh children, interleaved (the machine is shared and
    // noisy); the run with the median growth stands for the profile.
    let mut runs_of: Vec<(&str, Vec<Measured>)> =
        vec![("standard", Vec::new()), ("compact", Vec::new())];
    for _ in 0..runs {
        for (profile, runs) in runs_of.iter_mut() {
            let out = run_child(
                &exe,
                &[
                    "--measure".into(),
                    dir.to_string_lossy().into(),
                    profile.to_string(),
                    loaded.to_string(),
                ],
            );
            let line = out
                .lines()
                .find(|l| l.starts_with("measure,"))
                .expect("a measure line");
            println!("{}", &line["measure,".len()..]);
            let f: Vec<u64> = line
                .split(',')
                .skip(2)
                .map(|n| n.parse().expect("a number"))
                .collect();
            runs.push(Measured {
                listed: f[0],
                delta_kib: f[4],
                threads_loaded: f[8],
                store_loaded: f[9],
                tail_cache_bytes: f[10],
            });
        }
    }
    let results: Vec<(&str, Measured)> = runs_of
        .into_iter()
        .map(|(profile, mut runs)| {
            runs.sort_by_key(|m| m.delta_kib);
            let median = runs.swap_remove(runs.len() / 2);
            println!("median,{profile},+{} KiB", median.delta_kib);
            (profile, median)
        })
        .collect();
    for (profile, m) in &results {
        check(
            m.listed == threads as u64,
            format!("{profile}: thread/list returned {} of {threads}", m.listed),
        );
    }
    let compact = &results[1].1;
    check(
        compact.threads_loaded <= 16 && compact.store_loaded <= 16,
        format!(
            "compact: {} engine / {} store threads loaded (bound 16)",
            compact.threads_loaded, compact.store_loaded
        ),
    );
    check(
        compact.tail_cache_bytes <= 512 << 10,
        format!(
            "compact: tail cache {} bytes (bound 512 KiB)",
            compact.tail_cache_bytes
        ),
    );
    check(
        compact.delta_kib <= budget,
        format!(
            "compact: +{} KiB resident over the host's baseline with {threads} threads on disk, \
             {loaded} loaded (budget {budget} KiB; standard: +{} KiB)",
            compact.delta_kib, results[0].1.delta_kib
        ),
    );
    println!("memory: {passed} passed, {failed} failed");
    if failed > 0 {
        std::process::exit(1);
    }
}
