//! `cc-app-server rollout list|show|verify`: a person's (and a script's, with `--json`) view of the
//! durable logs in a state directory, through the same `RolloutStore` the server writes with, so
//! what these tools accept is exactly what a server would resume from.
//!
//! They fail closed: every thread the directory holds evidence of (a log, an anchor, a row) is
//! listed and verified, and one that cannot be opened is reported by name and fails the command.
//!
//! They are read-only: the store is opened with `StoreOptions::read_only`, so no byte of the
//! state directory changes (read-only snapshots and mounts verify too), and what a server would
//! repair when it opens a thread (a torn tail, …) is reported as damage. Only `verify --repair`
//! and `verify --accept-unanchored` write, because repairing and accepting are recorded.

use crate::render;
use crate::{StateArgs, StoreArg};
use cc_app_server::rollout::{
    layout, open_store, ListQuery, RolloutKey, RolloutStore, StoreError, StoreKind, StoreOptions,
    ThreadSummary, VerifyReport, MAX_LIST_LIMIT, MAX_READ_LIMIT,
};
use clap::Args;
use serde_json::{json, Value};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;

/// Exit codes: 1 = the data is bad or missing, 2 = the store cannot be opened.
const BAD_DATA: u8 = 1;
const CANNOT_OPEN: u8 = 2;

/// The host key of keyed mode, for the tools.
#[derive(Args, Debug, Clone, Default)]
pub struct KeyArgs {
    /// Rollout key (keyed mode): a file of exactly 32 raw bytes or 64 hex digits, readable by
    /// its owner only. With it, anchors and seals are checked against the key; without it only
    /// the plain hash chain is ("unkeyed") and keyed threads cannot be written.
    #[arg(long, value_name = "FILE")]
    key_file: Option<PathBuf>,
}

impl KeyArgs {
    /// The key from `--key-file`, if given (for any command that opens a store, `serve` too:
    /// `config.store_options.key = args.key.key()?`).
    pub fn key(&self) -> Result<Option<RolloutKey>, String> {
        self.key_file
            .as_deref()
            .map(RolloutKey::from_file)
            .transpose()
    }

    /// The key file named, if any (the workspace tools refuse it).
    pub fn key_file(&self) -> Option<&std::path::Path> {
        self.key_file.as_deref()
    }
}

#[derive(Args, Debug)]
pub struct ListArgs {
    #[command(flatten)]
    state: StateArgs,
    #[command(flatten)]
    key: KeyArgs,
    /// One JSON array of thread summaries instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub struct ShowArgs {
    #[command(flatten)]
    state: StateArgs,
    #[command(flatten)]
    key: KeyArgs,
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
    #[command(flatten)]
    key: KeyArgs,
    /// Threads to check [default: every thread, archived included, and every stray file].
    #[arg(value_name = "THREAD")]
    threads: Vec<String>,
    /// Accept threads whose head anchor is missing or unreadable (or, with a key, carries no
    /// MAC or is not bound to this store) as they are: they are re-anchored, the acceptance is
    /// recorded in the log, and the report says which acknowledged seqs nothing vouches for.
    /// Without it they fail. Implies --repair (it writes).
    #[arg(long)]
    accept_unanchored: bool,
    /// Open the store writable and make the repairs a server makes when it opens a thread (a
    /// torn tail cut into <thread>.jsonl.broken, unauthenticated keyed events moved aside, an
    /// unfinished thread/start removed), each recorded in the thread's log. Without it verify
    /// changes nothing in the state directory and reports each of them as damage (exit 1).
    #[arg(long)]
    repair: bool,
    /// One JSON report instead of text.
    #[arg(long)]
    json: bool,
}

fn open(
    state: &StateArgs,
    key: &KeyArgs,
    accept_unanchored: bool,
    read_only: bool,
) -> Result<Arc<dyn RolloutStore>, String> {
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
    let options = StoreOptions {
        key: key.key()?,
        accept_unanchored,
        read_only,
        ..StoreOptions::default()
    };
    open_store(kind, dir, options).map_err(|e| {
        format!(
            "cannot open the {} rollout store in {}{}: {e}",
            if kind == StoreKind::Jsonl {
                "JSONL"
            } else {
                "SQLite"
            },
            dir.display(),
            if read_only { " (read-only)" } else { "" }
        )
    })
}

fn fail(message: impl std::fmt::Display, code: u8) -> u8 {
    eprintln!("cc-app-server: {message}");
    code
}

/// Readable threads, and (id, reason) of those that cannot be read.
type Listing = (Vec<ThreadSummary>, Vec<(String, String)>);

/// Every thread, archived included, in id order, and every one that cannot be read.
fn all_threads(store: &dyn RolloutStore) -> Result<Listing, StoreError> {
    let (mut out, mut bad) = (Vec::new(), Vec::new());
    let mut cursor = None;
    loop {
        let page = store.list(&ListQuery {
            include_archived: true,
            cursor,
            limit: MAX_LIST_LIMIT,
        })?;
        out.extend(page.threads);
        bad.extend(page.unreadable);
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => return Ok((out, bad)),
        }
    }
}

fn summary_json(s: &ThreadSummary) -> Value {
    json!({
        "threadId": s.thread_id, "status": if s.archived { "archived" } else { "live" },
        "title": s.title, "lastSeq": s.last_seq, "headHash": s.head_hash,
        "createdAt": s.created_at, "updatedAt": s.updated_at, "archived": s.archived,
        "forkedFrom": s.forked_from, "formatVersion": s.format_version, "metadata": s.metadata,
    })
}

/// One row of `rollout list`: a readable thread or one that is not.
enum Entry {
    Ok(Box<ThreadSummary>),
    Unreadable(String, String),
}

impl Entry {
    fn id(&self) -> &str {
        match self {
            Entry::Ok(s) => &s.thread_id,
            Entry::Unreadable(id, _) => id,
        }
    }
}

pub fn list(args: ListArgs) -> u8 {
    let store = match open(&args.state, &args.key, false, true) {
        Ok(s) => s,
        Err(e) => return fail(e, CANNOT_OPEN),
    };
    let (threads, unreadable) = match all_threads(&*store) {
        Ok(t) => t,
        Err(e) => return fail(format!("cannot list threads: {e}"), BAD_DATA),
    };
    let bad = unreadable.len();
    let mut entries: Vec<Entry> = threads
        .into_iter()
        .map(|t| Entry::Ok(Box::new(t)))
        .chain(
            unreadable
                .into_iter()
                .map(|(id, r)| Entry::Unreadable(id, r)),
        )
        .collect();
    entries.sort_by(|a, b| a.id().cmp(b.id()));
    let code = if bad > 0 { BAD_DATA } else { 0 };
    if args.json {
        let all: Vec<Value> = entries
            .iter()
            .map(|e| match e {
                Entry::Ok(s) => summary_json(s),
                Entry::Unreadable(id, reason) => {
                    json!({"threadId": id, "status": "unreadable", "reason": reason})
                }
            })
            .collect();
        println!("{}", Value::Array(all));
        return code;
    }
    if entries.is_empty() {
        println!("no threads in {}", args.state.state_dir.display());
        return 0;
    }
    let width = entries
        .iter()
        .map(|t| t.id().len())
        .max()
        .unwrap_or(6)
        .max(6);
    println!(
        "{:<width$}  {:>7}  {:<24}  {:<10}  TITLE",
        "THREAD", "EVENTS", "UPDATED", "STATUS"
    );
    for e in &entries {
        match e {
            Entry::Ok(t) => {
                let mut title = t.title.as_deref().map(render::shorten).unwrap_or_default();
                if let Some(f) = &t.forked_from {
                    title.push_str(&format!(
                        " (fork of {} at seq {})",
                        f.thread_id, f.event_seq
                    ));
                }
                println!(
                    "{:<width$}  {:>7}  {:<24}  {:<10}  {}",
                    t.thread_id,
                    t.last_seq,
                    t.updated_at,
                    if t.archived { "archived" } else { "live" },
                    title
                );
            }
            Entry::Unreadable(id, reason) => println!(
                "{:<width$}  {:>7}  {:<24}  {:<10}  {}",
                id,
                "-",
                "-",
                "UNREADABLE",
                render::shorten(reason)
            ),
        }
    }
    println!(
        "{} thread(s) in {}",
        entries.len(),
        args.state.state_dir.display()
    );
    if bad > 0 {
        eprintln!(
            "cc-app-server: {bad} thread(s) cannot be read; run `cc-app-server rollout verify` for the reasons"
        );
    }
    code
}

pub fn show(args: ShowArgs) -> u8 {
    let store = match open(&args.state, &args.key, false, true) {
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

/// A verdict for one thread (or one stray entry, which no thread owns).
struct Verdict {
    thread_id: String,
    stray: bool,
    report: Option<VerifyReport>,
    first_bad_seq: Option<u64>,
    reason: Option<String>,
}

impl Verdict {
    fn ok(&self) -> bool {
        self.reason.is_none()
    }

    fn warnings(&self) -> &[String] {
        self.report.as_ref().map_or(&[], |r| &r.warnings)
    }

    fn json(&self) -> Value {
        let r = self.report.as_ref();
        json!({
            "threadId": (!self.stray).then_some(&self.thread_id),
            "entry": self.stray.then_some(&self.thread_id),
            "ok": self.ok(),
            "events": r.map(|r| r.events), "headSeq": r.map(|r| r.head_seq),
            "headHash": r.map(|r| r.head_hash.clone()),
            "firstBadSeq": self.first_bad_seq, "reason": self.reason,
            "repairs": r.map(|r| r.repairs.clone()).unwrap_or_default(),
            "warnings": self.warnings(),
            "authentication": r.map(|r| if r.keyed { "keyed" } else { "unkeyed" }),
            "authenticatedThrough": r.and_then(|r| r.authenticated_through),
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
        stray: false,
        report,
        first_bad_seq,
        reason,
    }
}

pub fn verify(args: VerifyArgs) -> u8 {
    let writable = args.repair || args.accept_unanchored;
    let store = match open(&args.state, &args.key, args.accept_unanchored, !writable) {
        Ok(s) => s,
        Err(e) => return fail(e, CANNOT_OPEN),
    };
    // Ids and (where known) sizes, for the progress bar. With no thread named, everything the
    // directory holds: readable threads, unreadable ones, and entries no thread owns.
    let mut strays = Vec::new();
    let targets: Vec<(String, u64)> = if args.threads.is_empty() {
        let (all, unreadable) = match all_threads(&*store) {
            Ok(t) => t,
            Err(e) => return fail(format!("cannot list threads: {e}"), BAD_DATA),
        };
        strays = match store.stray_entries() {
            Ok(s) => s,
            Err(e) => return fail(format!("cannot list the store's entries: {e}"), BAD_DATA),
        };
        let mut t: Vec<(String, u64)> = all
            .into_iter()
            .map(|t| (t.thread_id, t.last_seq))
            .chain(unreadable.into_iter().map(|(id, _)| (id, 0)))
            .collect();
        t.sort();
        t
    } else {
        args.threads.iter().map(|id| (id.clone(), 0)).collect()
    };
    let total_events: u64 = targets.iter().map(|(_, n)| n).sum();
    let mut progress = Progress::new(targets.len() as u64, total_events);
    let mut verdicts = Vec::with_capacity(targets.len() + strays.len());
    for (id, events) in &targets {
        let verdict = verify_one(&*store, id);
        progress.advance(*events);
        if !args.json {
            progress.suspend(|| print_verdict(&verdict));
        }
        verdicts.push(verdict);
    }
    progress.finish();
    for (entry, reason) in strays {
        let verdict = Verdict {
            thread_id: entry,
            stray: true,
            report: None,
            first_bad_seq: None,
            reason: Some(reason),
        };
        if !args.json {
            print_verdict(&verdict);
        }
        verdicts.push(verdict);
    }
    let first_bad = verdicts.iter().find(|v| !v.ok());
    let events: u64 = verdicts
        .iter()
        .filter_map(|v| v.report.as_ref().map(|r| r.events))
        .sum();
    let warnings: usize = verdicts.iter().map(|v| v.warnings().len()).sum();
    let keyed = verdicts
        .iter()
        .filter_map(|v| v.report.as_ref())
        .all(|r| r.keyed);
    if args.json {
        let report = json!({
            "ok": first_bad.is_none(), "threads": verdicts.iter().map(Verdict::json).collect::<Vec<_>>(),
            "firstBad": first_bad.map(|v| json!({"threadId": v.thread_id, "seq": v.first_bad_seq, "reason": v.reason})),
            "warnings": warnings,
        });
        println!("{report}");
    } else {
        match first_bad {
            None => println!(
                "all intact: {} thread(s), {events} event(s) checked, {}{}",
                verdicts.len(),
                if keyed && !verdicts.is_empty() {
                    "keyed"
                } else {
                    "unkeyed"
                },
                if warnings > 0 {
                    format!("; {warnings} warning(s) above")
                } else {
                    String::new()
                }
            ),
            Some(v) => {
                let bad = verdicts.iter().filter(|v| !v.ok()).count();
                let at = v
                    .first_bad_seq
                    .map(|s| format!("first bad seq {s}"))
                    .unwrap_or_else(|| "no single bad seq".into());
                println!(
                    "FAILED: {bad} of {} thread(s) do not verify; {} {} {at}: {}",
                    verdicts.len(),
                    if v.stray { "entry" } else { "thread" },
                    v.thread_id,
                    v.reason.as_deref().unwrap_or("")
                );
                if writable {
                    eprintln!(
                        "cc-app-server: the log was not modified; restore the thread from a backup, \
                         or fork it from a seq before the first bad one"
                    );
                } else {
                    eprintln!(
                        "cc-app-server: the state directory was not modified (verify is read-only); \
                         `rollout verify --repair` makes the repairs a server would make (torn tails cut \
                         into .broken files, recorded in the log); anything else: restore the thread \
                         from a backup, or fork it from a seq before the first bad one"
                    );
                }
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
            "ok   {}  {} events  head seq {} {}  ({})",
            v.thread_id,
            r.events,
            r.head_seq,
            r.head_hash,
            if r.keyed { "keyed" } else { "unkeyed" }
        ),
        _ if v.stray => println!(
            "BAD  {}  {}",
            v.thread_id,
            v.reason.as_deref().unwrap_or("")
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
    for warning in v.warnings() {
        println!("     WARNING: {warning}");
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
