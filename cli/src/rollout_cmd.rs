//! `cc-app-server rollout list|show|verify`: a person's (and a script's, with `--json`) view of the
//! durable logs in a state directory, through the same `RolloutStore` the server writes with, so
//! what these tools accept is exactly what a server would resume from.

use crate::render;
use crate::{StateArgs, StoreArg};
use cc_app_server::rollout::{
    layout, open_store, ListQuery, RolloutStore, StoreError, StoreKind, StoreOptions,
    ThreadSummary, VerifyReport, MAX_LIST_LIMIT, MAX_READ_LIMIT,
};
use clap::Args;
use serde_json::{json, Value};
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::sync::Arc;

/// Exit codes: 1 = the data is bad or missing, 2 = the store cannot be opened.
const BAD_DATA: u8 = 1;
const CANNOT_OPEN: u8 = 2;

#[derive(Args, Debug)]
pub struct ListArgs {
    #[command(flatten)]
    state: StateArgs,
    /// One JSON array of thread summaries instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub struct ShowArgs {
    #[command(flatten)]
    state: StateArgs,
    /// The thread id (see `rollout list`).
    thread: String,
    /// Start after this seq.
    #[arg(long, value_name = "SEQ", default_value_t = 0)]
    after: u64,
    /// Print at most this many events.
    #[arg(long, value_name = "N")]
    limit: Option<u64>,
    /// The stored events as JSON lines, exactly as the rollout holds them.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub struct VerifyArgs {
    #[command(flatten)]
    state: StateArgs,
    /// Threads to check [default: every thread, archived included].
    #[arg(value_name = "THREAD")]
    threads: Vec<String>,
    /// One JSON report instead of text.
    #[arg(long)]
    json: bool,
}

fn open(state: &StateArgs) -> Result<Arc<dyn RolloutStore>, String> {
    let dir = &state.state_dir;
    if !dir.is_dir() {
        return Err(format!(
            "no state directory at {}; pass the --state-dir a server or the demo wrote",
            dir.display()
        ));
    }
    let kind = match state.store {
        Some(StoreArg::Jsonl) => StoreKind::Jsonl,
        Some(StoreArg::Sqlite) => StoreKind::Sqlite,
        None if !dir.join(layout::THREADS_DIR).exists()
            && dir.join(layout::SQLITE_FILE).exists() =>
        {
            StoreKind::Sqlite
        }
        None => StoreKind::Jsonl,
    };
    open_store(kind, dir, StoreOptions::default()).map_err(|e| {
        format!(
            "cannot open the {} rollout store in {}: {e}",
            if kind == StoreKind::Jsonl {
                "JSONL"
            } else {
                "SQLite"
            },
            dir.display()
        )
    })
}

fn fail(message: impl std::fmt::Display, code: u8) -> u8 {
    eprintln!("cc-app-server: {message}");
    code
}

/// Every thread, archived included, in id order.
fn all_threads(store: &dyn RolloutStore) -> Result<Vec<ThreadSummary>, StoreError> {
    let mut out = Vec::new();
    let mut cursor = None;
    loop {
        let page = store.list(&ListQuery {
            include_archived: true,
            cursor,
            limit: MAX_LIST_LIMIT,
        })?;
        out.extend(page.threads);
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => return Ok(out),
        }
    }
}

/// Thread ids from the JSONL file names, for when a damaged thread makes `list` refuse.
fn ids_from_files(dir: &Path) -> Vec<String> {
    let mut ids: Vec<String> = std::fs::read_dir(dir.join(layout::THREADS_DIR))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(".jsonl"))
                .map(str::to_string)
        })
        .collect();
    ids.sort();
    ids
}

fn summary_json(s: &ThreadSummary) -> Value {
    json!({
        "threadId": s.thread_id, "title": s.title, "lastSeq": s.last_seq, "headHash": s.head_hash,
        "createdAt": s.created_at, "updatedAt": s.updated_at, "archived": s.archived,
        "forkedFrom": s.forked_from, "formatVersion": s.format_version, "metadata": s.metadata,
    })
}

pub fn list(args: ListArgs) -> u8 {
    let store = match open(&args.state) {
        Ok(s) => s,
        Err(e) => return fail(e, CANNOT_OPEN),
    };
    let threads = match all_threads(&*store) {
        Ok(t) => t,
        Err(e) => {
            return fail(
                format!("cannot list threads: {e}; run `cc-app-server rollout verify` to find the damaged one"),
                BAD_DATA,
            )
        }
    };
    if args.json {
        let all: Vec<Value> = threads.iter().map(summary_json).collect();
        println!("{}", Value::Array(all));
        return 0;
    }
    if threads.is_empty() {
        println!("no threads in {}", args.state.state_dir.display());
        return 0;
    }
    let width = threads
        .iter()
        .map(|t| t.thread_id.len())
        .max()
        .unwrap_or(6)
        .max(6);
    println!(
        "{:<width$}  {:>7}  {:<24}  {:<8}  TITLE",
        "THREAD", "EVENTS", "UPDATED", "STATUS"
    );
    for t in &threads {
        let mut title = t.title.as_deref().map(render::shorten).unwrap_or_default();
        if let Some(f) = &t.forked_from {
            title.push_str(&format!(
                " (fork of {} at seq {})",
                f.thread_id, f.event_seq
            ));
        }
        println!(
            "{:<width$}  {:>7}  {:<24}  {:<8}  {}",
            t.thread_id,
            t.last_seq,
            t.updated_at,
            if t.archived { "archived" } else { "live" },
            title
        );
    }
    println!(
        "{} thread(s) in {}",
        threads.len(),
        args.state.state_dir.display()
    );
    0
}

pub fn show(args: ShowArgs) -> u8 {
    let store = match open(&args.state) {
        Ok(s) => s,
        Err(e) => return fail(e, CANNOT_OPEN),
    };
    let summary = match store.summary(&args.thread) {
        Ok(s) => s,
        Err(e) => return fail(e, BAD_DATA),
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    if !args.json {
        let _ = writeln!(
            out,
            "thread {}{}: {} events, head seq {} hash {}{}",
            summary.thread_id,
            summary
                .title
                .as_deref()
                .map(|t| format!(" {}", render::quote(t)))
                .unwrap_or_default(),
            summary.last_seq,
            summary.last_seq,
            summary.head_hash,
            if summary.archived { " (archived)" } else { "" }
        );
    }
    let mut after = args.after;
    let mut left = args.limit.unwrap_or(u64::MAX);
    while left > 0 {
        let n = left.min(MAX_READ_LIMIT as u64) as usize;
        let page = match store.read(&args.thread, after, n) {
            Ok(p) => p,
            Err(e) => {
                let _ = out.flush();
                return fail(e, BAD_DATA);
            }
        };
        for ev in &page.events {
            let line = if args.json {
                ev.to_json().to_string()
            } else {
                render::event_line(ev)
            };
            if writeln!(out, "{line}").is_err() {
                return 0; // stdout closed (e.g. piped into `head`): nothing left to say.
            }
            after = ev.seq;
            left -= 1;
        }
        if !page.has_more || page.events.is_empty() {
            break;
        }
    }
    let _ = out.flush();
    0
}

/// A verdict for one thread.
struct Verdict {
    thread_id: String,
    report: Option<VerifyReport>,
    first_bad_seq: Option<u64>,
    reason: Option<String>,
}

impl Verdict {
    fn ok(&self) -> bool {
        self.reason.is_none()
    }

    fn json(&self) -> Value {
        let r = self.report.as_ref();
        json!({
            "threadId": self.thread_id, "ok": self.ok(),
            "events": r.map(|r| r.events), "headSeq": r.map(|r| r.head_seq),
            "headHash": r.map(|r| r.head_hash.clone()),
            "firstBadSeq": self.first_bad_seq, "reason": self.reason,
            "repairs": r.map(|r| r.repairs.clone()).unwrap_or_default(),
        })
    }
}

fn verify_one(store: &dyn RolloutStore, id: &str) -> Verdict {
    let (report, first_bad_seq, reason) = match store.verify(id) {
        Ok(r) if r.ok() => (Some(r), None, None),
        Ok(r) => {
            let reason = r
                .reason
                .clone()
                .unwrap_or_else(|| "the chain does not check out".into());
            (Some(r.clone()), r.first_bad_seq, Some(reason))
        }
        Err(StoreError::Corrupt { seq, reason, .. }) => (None, Some(seq), Some(reason)),
        Err(e) => (None, None, Some(e.to_string())),
    };
    Verdict {
        thread_id: id.to_string(),
        report,
        first_bad_seq,
        reason,
    }
}

pub fn verify(args: VerifyArgs) -> u8 {
    let store = match open(&args.state) {
        Ok(s) => s,
        Err(e) => return fail(e, CANNOT_OPEN),
    };
    // Ids and (where known) sizes, for the progress bar.
    let targets: Vec<(String, u64)> = if args.threads.is_empty() {
        match all_threads(&*store) {
            Ok(all) => all.into_iter().map(|t| (t.thread_id, t.last_seq)).collect(),
            Err(e) => {
                warn!("listing threads failed ({e}); checking every thread file instead");
                ids_from_files(&args.state.state_dir)
                    .into_iter()
                    .map(|id| (id, 0))
                    .collect()
            }
        }
    } else {
        args.threads.iter().map(|id| (id.clone(), 0)).collect()
    };
    let total_events: u64 = targets.iter().map(|(_, n)| n).sum();
    let mut progress = Progress::new(targets.len() as u64, total_events);
    let mut verdicts = Vec::with_capacity(targets.len());
    for (id, events) in &targets {
        let verdict = verify_one(&*store, id);
        progress.advance(*events);
        if !args.json {
            progress.suspend(|| print_verdict(&verdict));
        }
        verdicts.push(verdict);
    }
    progress.finish();
    let first_bad = verdicts.iter().find(|v| !v.ok());
    let events: u64 = verdicts
        .iter()
        .filter_map(|v| v.report.as_ref().map(|r| r.events))
        .sum();
    if args.json {
        let report = json!({
            "ok": first_bad.is_none(), "threads": verdicts.iter().map(Verdict::json).collect::<Vec<_>>(),
            "firstBad": first_bad.map(|v| json!({"threadId": v.thread_id, "seq": v.first_bad_seq, "reason": v.reason})),
        });
        println!("{report}");
    } else {
        match first_bad {
            None => println!(
                "all intact: {} thread(s), {events} event(s) checked",
                verdicts.len()
            ),
            Some(v) => {
                let bad = verdicts.iter().filter(|v| !v.ok()).count();
                let at = v
                    .first_bad_seq
                    .map(|s| format!("first bad seq {s}"))
                    .unwrap_or_else(|| "no single bad seq".into());
                println!(
                    "FAILED: {bad} of {} thread(s) do not verify; thread {} {at}: {}",
                    verdicts.len(),
                    v.thread_id,
                    v.reason.as_deref().unwrap_or("")
                );
                eprintln!(
                    "cc-app-server: the log was not modified; restore the thread from a backup, \
                     or fork it from a seq before the first bad one"
                );
            }
        }
    }
    if first_bad.is_some() {
        BAD_DATA
    } else {
        0
    }
}

fn print_verdict(v: &Verdict) {
    match (&v.report, v.ok()) {
        (Some(r), true) => println!(
            "ok   {}  {} events  head seq {} {}",
            v.thread_id, r.events, r.head_seq, r.head_hash
        ),
        _ => println!(
            "BAD  {}  {}: {}",
            v.thread_id,
            v.first_bad_seq
                .map(|s| format!("first bad seq {s}"))
                .unwrap_or_else(|| "not verifiable".into()),
            v.reason.as_deref().unwrap_or("")
        ),
    }
    for repair in v.report.iter().flat_map(|r| &r.repairs) {
        println!("     repaired when opened: {repair}");
    }
}

/// A progress bar on stderr, only when stderr is a terminal and the job is large enough to wait
/// for; otherwise it does nothing (pipes and logs stay clean).
struct Progress {
    enabled: bool,
    threads: (u64, u64),
    events: (u64, u64),
    drawn: bool,
}

impl Progress {
    const MIN_THREADS: u64 = 50;
    const MIN_EVENTS: u64 = 20_000;

    fn new(threads: u64, events: u64) -> Progress {
        let big = threads >= Self::MIN_THREADS || events >= Self::MIN_EVENTS;
        Progress {
            enabled: big && std::io::stderr().is_terminal(),
            threads: (0, threads),
            events: (0, events),
            drawn: false,
        }
    }

    fn advance(&mut self, events: u64) {
        self.threads.0 += 1;
        self.events.0 += events;
        if self.enabled {
            self.draw();
        }
    }

    fn draw(&mut self) {
        let (done, total) = if self.events.1 > 0 {
            self.events
        } else {
            self.threads
        };
        eprint!("\r{}", bar_line(done, total, self.threads));
        self.drawn = true;
    }

    /// Runs `f` (which prints to stdout) with the bar taken off the terminal line.
    fn suspend(&mut self, f: impl FnOnce()) {
        if self.enabled && self.drawn {
            eprint!("\r\x1b[2K");
            f();
            self.draw();
        } else {
            f();
        }
    }

    fn finish(&mut self) {
        if self.enabled && self.drawn {
            eprint!("\r\x1b[2K");
        }
    }
}

/// `[#####.....]  50%  12/24 threads`
fn bar_line(done: u64, total: u64, threads: (u64, u64)) -> String {
    const WIDTH: u64 = 30;
    let fraction = if total == 0 {
        1.0
    } else {
        done as f64 / total as f64
    };
    let filled = ((fraction.min(1.0)) * WIDTH as f64) as u64;
    format!(
        "verifying [{}{}] {:>3}%  {}/{} threads",
        "#".repeat(filled as usize),
        ".".repeat((WIDTH - filled) as usize),
        (fraction.min(1.0) * 100.0) as u64,
        threads.0,
        threads.1
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bar_fills_with_progress() {
        let half = bar_line(50, 100, (1, 2));
        assert!(
            half.contains("[###############...............]  50%  1/2 threads"),
            "{half}"
        );
        assert!(bar_line(0, 0, (0, 0)).contains("100%"));
    }
}
