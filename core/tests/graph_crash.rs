//! Real crashes of graph runs: a child process runs a graph full of effects (tool nodes, a tool
//! call inside an agent turn, a loop) and prints every node and run state it is told about; we
//! SIGKILL it at random moments, then the next child resumes the run from its log. After every
//! cut: the run's log verifies, every acknowledged state is in it at the seq it was announced
//! with, and the tool executor's ledger shows no idempotency key applied twice. At the end every
//! run completed and every effect was applied exactly once.
//!
//! `GRAPH_CRASH_CUTS` sets the cut points per store (default 200); `GRAPH_CRASH_SEED` replays.

use cc_app_server::graph::store::{for_each_event, open_runs};
use cc_app_server::graph::RunState;
use cc_app_server::rollout::{StoreKind, StoreOptions, StoredEvent};
use std::collections::HashMap;
use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn spawn(kind: &str, dir: &Path, run: &str) -> (Child, std::process::ChildStdout) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_graph-crash-child"))
        .args([
            kind,
            dir.join("state").to_str().unwrap(),
            dir.join("ledger").to_str().unwrap(),
            run,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"ready\n") {
        if out.read(&mut byte).unwrap() == 0 {
            panic!("child exited before ready: {:?}", child.wait());
        }
        buf.push(byte[0]);
    }
    (child, out)
}

/// What a child printed after `ready`, whole lines only (a line cut by the kill was never
/// acknowledged).
fn acknowledged(mut out: std::process::ChildStdout) -> Vec<String> {
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let complete = &rest[..rest.rfind('\n').map_or(0, |i| i + 1)];
    complete.lines().map(str::to_string).collect()
}

fn wire_status(st: &RunState, key: &str) -> String {
    let n = &st.nodes[key];
    serde_json::to_value(st.node_state(n).status)
        .unwrap()
        .as_str()
        .unwrap()
        .to_string()
}

/// The ledger: applied keys (with their count) and whether any key was asked for twice.
fn ledger(dir: &Path) -> (HashMap<String, usize>, Vec<String>) {
    let text = std::fs::read_to_string(dir.join("ledger")).unwrap_or_default();
    let mut applied: HashMap<String, usize> = HashMap::new();
    let mut dups = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("A ") {
            // A line the kill cut short (its JSON incomplete) was never applied: the child
            // returned no result for it, and reads it the same way.
            if let Some((key, json)) = rest.split_once(' ') {
                if serde_json::from_str::<serde_json::Value>(json).is_ok() {
                    *applied.entry(key.to_string()).or_default() += 1;
                }
            }
        } else if let Some(key) = line.strip_prefix("DUP ") {
            dups.push(key.to_string());
        }
    }
    (applied, dups)
}

fn events(kind: StoreKind, dir: &Path, run: &str) -> Vec<StoredEvent> {
    let store = open_runs(kind, &dir.join("state"), StoreOptions::default()).unwrap();
    let report = store.verify(run).unwrap();
    assert!(report.ok(), "run {run}: {report:?}");
    let mut out = Vec::new();
    for_each_event(&*store, run, |e| out.push(e.clone())).unwrap();
    out
}

/// Every acknowledged state is in the log, at the seq it was announced with: the log is
/// replayed once, and each state is compared when the replay reaches its seq.
fn check_acknowledged(cut: usize, run: &str, lines: &[String], log: &[StoredEvent]) {
    let mut due: Vec<(usize, Vec<&str>)> = lines
        .iter()
        .filter(|l| l.starts_with("N ") || l.starts_with("R "))
        .map(|l| {
            let parts: Vec<&str> = l.split(' ').collect();
            (parts[1].parse().unwrap(), parts)
        })
        .collect();
    due.sort_by_key(|d| d.0);
    if let Some((last, _)) = due.last() {
        assert!(
            log.len() >= *last,
            "cut {cut} run {run}: acknowledged seq {last} lost (log has {})",
            log.len()
        );
    }
    let mut st = RunState::new(run);
    let mut next = 0;
    for (i, e) in log.iter().enumerate() {
        st.apply(e);
        while next < due.len() && due[next].0 == i + 1 {
            let parts = &due[next].1;
            if parts[0] == "N" {
                assert_eq!(
                    wire_status(&st, parts[2]),
                    parts[3],
                    "cut {cut} run {run}: node {} at seq {}",
                    parts[2],
                    i + 1
                );
            } else {
                let s = serde_json::to_value(st.summary(false).status).unwrap();
                assert_eq!(
                    s,
                    parts[2],
                    "cut {cut} run {run}: run status at seq {}",
                    i + 1
                );
            }
            next += 1;
        }
    }
    assert!(st.anomalies.is_empty(), "cut {cut}: {:?}", st.anomalies);
}

/// Runs that have not completed are finished uninterrupted; then every run of the state
/// directory must have succeeded with every effect applied exactly once. Returns (runs,
/// resumptions, effects, receipts by source).
fn finish_and_verify(
    kind: StoreKind,
    name: &str,
    dir: &Path,
    runs: &[String],
    sources: &mut HashMap<String, usize>,
) -> (usize, usize) {
    let (mut child, out) = spawn(name, dir, runs.last().unwrap());
    let lines = acknowledged(out);
    assert!(child.wait().unwrap().success());
    assert_eq!(
        lines.last().map(String::as_str),
        Some("done succeeded"),
        "{lines:?}"
    );
    let (applied, dups) = ledger(dir);
    assert!(dups.is_empty());
    let (mut resumed, mut effects) = (0usize, 0usize);
    for id in runs {
        let log = events(kind, dir, id);
        let st = RunState::replay(id, &log);
        assert!(st.anomalies.is_empty(), "run {id}: {:?}", st.anomalies);
        assert_eq!(
            serde_json::to_value(st.summary(false).status).unwrap(),
            "succeeded",
            "run {id}: {:?}",
            st.error
        );
        resumed += log.iter().filter(|e| e.kind() == "graphRunResumed").count();
        for e in st.effects.values() {
            effects += 1;
            assert_eq!(
                applied.get(&e.key),
                Some(&1),
                "run {id}: effect {} applied {:?} times",
                e.key,
                applied.get(&e.key)
            );
            let source = e
                .receipt
                .as_ref()
                .map(|r| serde_json::to_value(r.source).unwrap());
            *sources
                .entry(source.map_or("none".into(), |s| s.as_str().unwrap().to_string()))
                .or_default() += 1;
        }
        assert_eq!(st.effects.len(), 7, "run {id}: every effect settled");
    }
    assert_eq!(
        applied.len(),
        effects,
        "the ledger holds exactly the runs' effects"
    );
    (resumed, effects)
}

/// Runs per state directory: a fresh one after that, so a child's start-up (which reads every
/// thread of the server) stays the same cost throughout the test.
const RUNS_PER_DIR: usize = 8;

fn crash_loop(kind: StoreKind) {
    let cuts: usize = std::env::var("GRAPH_CRASH_CUTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let seed = std::env::var("GRAPH_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| cc_app_server::time::now_unix_millis() as u64 | 1);
    let name = if kind == StoreKind::Sqlite {
        "sqlite"
    } else {
        "jsonl"
    };
    eprintln!("graph crash test {name}: {cuts} cuts, seed {seed} (GRAPH_CRASH_SEED to replay)");
    let mut rng = Rng(seed);
    let mut tmp = tempfile::tempdir().unwrap();
    // How long one uninterrupted run takes here (from ready to done), so cuts spread over it.
    let (mut child, out) = spawn(name, tmp.path(), "calibrate");
    let t = Instant::now();
    let lines = acknowledged(out);
    assert!(child.wait().unwrap().success());
    assert_eq!(
        lines.last().map(String::as_str),
        Some("done succeeded"),
        "{lines:?}"
    );
    // Adapted as the test goes: the machine's speed drifts (other builds come and go), and a
    // span calibrated under load would put every cut after the run had finished.
    let mut span_us = (t.elapsed().as_micros() as u64).max(20_000) * 6 / 5;
    let mut runs = vec!["calibrate".to_string()];
    let (mut run, mut total_runs, mut acked_total, mut resumed, mut effects) =
        (0usize, 0usize, 0usize, 0usize, 0usize);
    let mut sources = HashMap::new();
    let mut cut_mid_run = 0usize;
    for cut in 0..cuts {
        let id = format!("run{run}");
        if runs.last() != Some(&id) {
            runs.push(id.clone());
        }
        let dir = tmp.path().to_path_buf();
        let (mut child, out) = spawn(name, &dir, &id);
        std::thread::sleep(Duration::from_micros(rng.next() % span_us));
        let _ = child.kill(); // SIGKILL (or the child already finished)
        let lines = acknowledged(out);
        child.wait().unwrap();
        acked_total += lines.len();
        check_acknowledged(cut, &id, &lines, &events(kind, &dir, &id));
        let (applied, dups) = ledger(&dir);
        assert!(
            dups.is_empty(),
            "cut {cut}: effects asked for again: {dups:?}"
        );
        assert!(
            applied.values().all(|&n| n == 1),
            "cut {cut}: a key applied twice"
        );
        if !lines.iter().any(|l| l.starts_with("done")) {
            cut_mid_run += 1;
            // Cut before anything was acknowledged: the run is slower than the span says.
            if lines.is_empty() {
                span_us = span_us * 11 / 10;
            }
            continue;
        }
        // The run finished before the cut: aim earlier next time.
        span_us = (span_us * 4 / 5).max(5_000);
        run += 1;
        if run >= RUNS_PER_DIR {
            // All of this directory's runs completed: check them, then start afresh.
            let (r, e) = finish_and_verify(kind, name, &dir, &runs, &mut sources);
            (resumed, effects, total_runs) = (resumed + r, effects + e, total_runs + runs.len());
            tmp = tempfile::tempdir().unwrap();
            runs = Vec::new();
            run = 0;
        }
    }
    if !runs.is_empty() {
        let (r, e) = finish_and_verify(kind, name, tmp.path(), &runs, &mut sources);
        (resumed, effects, total_runs) = (resumed + r, effects + e, total_runs + runs.len());
    }
    eprintln!(
        "graph crash test {name}: {cuts} cuts ({cut_mid_run} inside a run) over {total_runs} runs, {acked_total} acknowledged states all in their logs, {resumed} resumptions, {effects} effects each applied once; receipts by source: {sources:?}"
    );
    assert!(
        resumed > 0 && cut_mid_run * 3 >= cuts,
        "the cuts barely landed inside runs; the test proves nothing"
    );
}

#[test]
fn sigkill_graph_runs_at_random_points_jsonl() {
    crash_loop(StoreKind::Jsonl);
}

#[test]
fn sigkill_graph_runs_at_random_points_sqlite() {
    crash_loop(StoreKind::Sqlite);
}
