//! The JSONL backend (the default store): one append-only file per thread plus a small head
//! anchor beside it, because a plain text log is what a third party can verify and repair by hand.
//!
//! Opening a thread reads its header line, its anchor and the bytes after the anchored event
//! only, so resume cost depends on the un-anchored tail, never on the history.
//!
//! A log without an anchor never happens by accident past its header: it means the anchor was
//! removed, and the thread is refused unless the host accepts it
//! (`StoreOptions::accept_unanchored`). A thread created with its header alone (`thread/start`,
//! unkeyed) gets its anchor (at seq 0, durably) just before anything more is written to its
//! log, so creation is one durable point; a log that is exactly one header line and has no
//! anchor is such a thread. Keyed stores and forks write the anchor before the log, as always.

use super::fsutil::{fdatasync, Dir, Open};
use super::keyed::mac_eq;
use super::store::{check_event, parse_line, Backend, Head, Loaded, Repair, Sealed, WriteSet};
use super::{
    layout, validate_thread_id, ChainCtx, RolloutKey, StoreError, StoreOptions, StoredEvent,
    VerifyReport, MAX_EVENT_BYTES, ZERO_HASH,
};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// Bytes per anchor slot; the anchor file holds two so a torn anchor write leaves the other.
pub const ANCHOR_SLOT: usize = 512;

/// The JSONL backend. Files: `<state>/threads/<id>.jsonl`, `<state>/anchors/<id>.head`, all
/// reached through descriptors of the directories opened once at `open`.
pub struct JsonlBackend {
    threads: Dir,
    anchors: Dir,
    /// Held so the state directory stays the one that was opened (and for messages).
    _state: Dir,
    key: Option<RolloutKey>,
    accept_unanchored: bool,
    /// Opened for inspection (`StoreOptions::read_only`): nothing is written, what a writable
    /// open would repair is reported as damage.
    read_only: bool,
    catalog: Mutex<Option<BTreeSet<String>>>,
    dirty_logs: Mutex<HashSet<String>>,
    dirty_anchors: Mutex<HashSet<String>>,
}

/// Per-thread state: committed length, anchor generation, the lazily built offset index, and
/// how far back from the head reading backwards has checked the chain.
pub struct JsonlTx {
    len: u64,
    anchor_gen: u64,
    /// Created with its header alone and no anchor yet: the anchor (seq 0) must be durable
    /// before anything more is written to the log.
    anchor_deferred: bool,
    index: Option<Index>,
    back: Option<Back>,
}

/// Built by one full scan on the first `read`/`terminal_evidence`/key lookup; kept up to date
/// by appends.
struct Index {
    /// `offsets[i]` is where seq `i + 1` starts.
    offsets: Vec<u64>,
    turns: HashMap<String, u64>,
    /// idempotencyKey → the first seq recorded with it.
    keys: HashMap<String, u64>,
}

/// The oldest event reading backwards from the head has reached and checked: its seq, the byte
/// it starts at, and its prevHash (what the event before it must hash to).
#[derive(Clone)]
struct Back {
    seq: u64,
    offset: u64,
    prev_hash: String,
}

/// The decoded anchor: the head the log must still contain, plus derived state so opening
/// does not need the history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Anchor {
    /// 0 for the anchor written when the thread is created, before its log exists.
    pub seq: u64,
    pub hash: String,
    /// Byte offset just after the anchored event's '\n' (0 at seq 0).
    pub offset: u64,
    pub gen: u64,
    pub archived: bool,
    pub format: u16,
    pub compacted_through: u64,
    pub last_compaction_seq: Option<u64>,
    /// The thread the anchor belongs to (absent in anchors written before it was recorded).
    pub thread: Option<String>,
    /// Keyed mode: the key's id and the MAC over the thread id and the anchor text before it.
    pub key_id: Option<String>,
    pub mac: Option<String>,
}

impl Anchor {
    /// `ccanchor1 k=v ... [store=<16 hex>] [kid=<16 hex> mac=<64 hex>] check=<16 hex of sha256 of
    /// the text before " check=">`, padded to one slot. `thread_id` is recorded; a key adds `kid`
    /// and `mac`, and `store` when the key is bound to a store with an id.
    pub fn encode(&self, thread_id: &str, key: Option<&RolloutKey>) -> Vec<u8> {
        let text = self.text(thread_id, key);
        debug_assert!(text.len() < ANCHOR_SLOT, "an anchor always fits its slot");
        pad_slot(text)
    }

    /// `encode`, refusing an anchor whose text does not fit its slot (the store writes only
    /// these): with a 160-byte thread id and a store id that is when seq, generation or a
    /// compaction seq reaches 10^10 (offset 10^13), far beyond any real thread.
    pub(crate) fn encode_checked(
        &self,
        thread_id: &str,
        key: Option<&RolloutKey>,
    ) -> io::Result<Vec<u8>> {
        let text = self.text(thread_id, key);
        if text.len() >= ANCHOR_SLOT {
            return Err(io_other(format!(
                "the head anchor of thread {thread_id:?} would be {} bytes, more than its {} byte slot holds (seq {}); fork the thread to continue it",
                text.len() + 1,
                ANCHOR_SLOT,
                self.seq
            )));
        }
        Ok(pad_slot(text))
    }

    fn text(&self, thread_id: &str, key: Option<&RolloutKey>) -> String {
        let mut body = format!(
            "ccanchor1 seq={} hash={} offset={} gen={} archived={} format={} compactedThrough={} lastCompaction={} thread={thread_id}",
            self.seq,
            self.hash,
            self.offset,
            self.gen,
            self.archived as u8,
            self.format,
            self.compacted_through,
            self.last_compaction_seq.map_or("-".to_string(), |s| s.to_string())
        );
        if let Some(k) = key {
            if let Some(store) = k.store_id() {
                body.push_str(&format!(" store={store}"));
            }
            body.push_str(&format!(" kid={}", k.key_id()));
            let mac = k.anchor_mac(thread_id, &body);
            body.push_str(&format!(" mac={mac}"));
        }
        let check = &cc_agent_protocol::sha256_hex(body.as_bytes())[..16];
        format!("{body} check={check}")
    }

    /// A slot whose check field verifies, else None.
    pub fn decode(slot: &[u8]) -> Option<Anchor> {
        match decode_slot(slot) {
            Slot::Valid(a) => Some(a),
            _ => None,
        }
    }
}

/// An anchor's text as its slot: space padding and a '\n'.
fn pad_slot(text: String) -> Vec<u8> {
    let mut out = text.into_bytes();
    out.resize(ANCHOR_SLOT - 1, b' ');
    out.push(b'\n');
    out
}

/// What one 512-byte anchor slot holds.
#[derive(Debug, Clone)]
enum Slot {
    /// Never written (zeros, or beyond the end of the file).
    Empty,
    /// Written but its check field fails; what it appears to say, for the report.
    Damaged {
        seq: Option<u64>,
    },
    Valid(Anchor),
}

fn decode_slot(slot: &[u8]) -> Slot {
    if slot.iter().all(|b| *b == 0) {
        return Slot::Empty;
    }
    let damaged = || {
        // Best effort, unverified: what the damaged slot seems to record.
        let text = String::from_utf8_lossy(slot);
        let field = |name: &str| {
            text.split(' ')
                .find_map(|p| p.strip_prefix(name))
                .and_then(|v| v.parse::<u64>().ok())
        };
        Slot::Damaged { seq: field("seq=") }
    };
    // Exactly one slot: the text, space padding, '\n'. Nothing else passes, so every changed
    // byte of a slot is noticed.
    if slot.len() != ANCHOR_SLOT || slot.last() != Some(&b'\n') {
        return damaged();
    }
    let Ok(text) = std::str::from_utf8(&slot[..ANCHOR_SLOT - 1]) else {
        return damaged();
    };
    let text = text.trim_end_matches(' ');
    let Some((body, check)) = text.rsplit_once(" check=") else {
        return damaged();
    };
    if cc_agent_protocol::sha256_hex(body.as_bytes())[..16] != *check {
        return damaged();
    }
    let mut parts = body.split(' ');
    if parts.next() != Some("ccanchor1") {
        return damaged();
    }
    let kv: HashMap<&str, &str> = parts.filter_map(|p| p.split_once('=')).collect();
    let parsed = (|| {
        Some(Anchor {
            seq: kv.get("seq")?.parse().ok()?,
            hash: kv.get("hash")?.to_string(),
            offset: kv.get("offset")?.parse().ok()?,
            gen: kv.get("gen")?.parse().ok()?,
            archived: *kv.get("archived")? == "1",
            format: kv.get("format")?.parse().ok()?,
            compacted_through: kv.get("compactedThrough")?.parse().ok()?,
            last_compaction_seq: match *kv.get("lastCompaction")? {
                "-" => None,
                s => Some(s.parse().ok()?),
            },
            thread: kv.get("thread").map(|s| s.to_string()),
            key_id: kv.get("kid").map(|s| s.to_string()),
            mac: kv.get("mac").map(|s| s.to_string()),
        })
    })();
    match parsed {
        Some(a) => Slot::Valid(a),
        None => damaged(),
    }
}

/// The text a keyed anchor's MAC covers: everything before " mac=".
fn mac_body(slot: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(slot).ok()?;
    Some(text.split_once(" mac=")?.0)
}

/// The value of `name=` in an anchor's text (e.g. `store`), if present.
fn text_field<'a>(body: &'a str, name: &str) -> Option<&'a str> {
    body.split(' ')
        .find_map(|p| p.strip_prefix(name)?.strip_prefix('='))
}

/// Judges the store a MAC-verified keyed anchor (or SQLite binding) names against the store
/// opening it: `Ok(None)` bound to this store (or neither has an id: a store written before
/// store ids), `Ok(Some(why))` not bound to any store while this one has an id (adoptable with
/// accept_unanchored), `Err(why)` written by another store (never adopted).
pub(crate) fn judge_store(
    named: Option<&str>,
    ours: Option<&str>,
    what: &str,
) -> Result<Option<String>, String> {
    match (named, ours) {
        (Some(n), Some(o)) if n == o => Ok(None),
        (None, None) => Ok(None),
        (Some(n), Some(o)) => Err(format!(
            "thread was written by another store (id {n}); this store is id {o}: {what} binds a keyed thread to the store that wrote it, so a copy moved between stores is refused; put it back in its own store, or restore this store's own copy from a backup"
        )),
        (Some(n), None) => Err(format!(
            "thread was written by another store (id {n}); this state directory has no store id ({}): if its id file was lost, restore it from a backup (it must read {n})",
            super::identity::STORE_ID_FILE
        )),
        (None, Some(o)) => Ok(Some(format!(
            "{what} is not bound to this store (id {o}): the thread was written by another store, one without a store id (created before store ids), or its binding was removed"
        ))),
    }
}

/// Both slots of an anchor file: what each holds, and its raw bytes (for the MAC check).
type Slots = [(Slot, Vec<u8>); 2];

/// An anchor slot that may have held a newer head than the one relied on.
struct Fallback {
    text: String,
    /// What the damaged slot appears to record (unverified).
    claimed_seq: Option<u64>,
    anchored_seq: u64,
}

impl Fallback {
    /// Judges the fallback against the log's last complete event: a damaged slot naming a seq
    /// the log no longer has is loss (a crash never causes it: the log is durable before its
    /// anchor is written), so it is refused unless accepted; otherwise it is a warning that names
    /// the seqs nothing vouches for.
    fn judge(&self, log_last: u64, accept: bool) -> Result<String, String> {
        match self.claimed_seq {
            Some(c) if c > log_last && !accept => Err(format!(
                "{}, but the log ends at seq {log_last}: acknowledged events {}..={c} are gone; restore the log from a backup, or accept it as it is with accept_unanchored (--accept-unanchored)",
                self.text,
                log_last + 1
            )),
            Some(c) if c > log_last => Ok(format!(
                "{}, but the log ends at seq {log_last}: acknowledged events {}..={c} are gone (accepted with accept_unanchored)",
                self.text,
                log_last + 1
            )),
            _ => Ok(format!(
                "{}: nothing vouches for acknowledged events after seq {} (the log continues to seq {log_last}; any later ones cannot be accounted for)",
                self.text, self.anchored_seq
            )),
        }
    }
}

/// Which anchor opening a thread relies on.
enum AnchorChoice {
    /// The newest valid slot, and a warning if the other slot looks like a newer one was lost.
    Anchored {
        anchor: Anchor,
        fallback: Option<Fallback>,
        /// Keyed anchor read without the key: the thread may be read, not written.
        read_only: Option<String>,
    },
    /// No anchor file, or no valid slot in it: nothing vouches for the log's end.
    Unanchored { why: String },
    /// Keyed mode, and the anchor carries no MAC (written unkeyed, or the MAC stripped).
    Unkeyed { anchor: Anchor },
    /// Keyed mode: the anchor's MAC verifies but it names no store while this store has an id
    /// (written by a store without one, or the binding stripped).
    Unbound { anchor: Anchor, why: String },
}

/// What a forward scan over lines found.
struct Scan {
    offsets: Vec<u64>,
    turns: HashMap<String, u64>,
    keys: HashMap<String, u64>,
    last: Option<StoredEvent>,
    count: u64,
    end: u64,
    bad: Option<Bad>,
    /// The last `sealed` event met: (byte offset just after it, events up to and including it,
    /// the folded head at that point if folding).
    last_seal: Option<(u64, u64, Option<Head>)>,
}

struct Bad {
    seq: u64,
    offset: u64,
    reason: String,
    /// Nothing complete follows the bad line (so it may be a torn tail).
    at_tail: bool,
}

fn io_other(msg: String) -> io::Error {
    io::Error::other(msg)
}

/// Checks lines from `from` until `upto`, each linking to the one before.
#[allow(clippy::too_many_arguments)]
fn scan(
    file: &File,
    from: u64,
    upto: u64,
    first_seq: u64,
    prev_hash: &str,
    ctx: ChainCtx<'_>,
    index: bool,
    mut fold: Option<&mut Head>,
) -> io::Result<Scan> {
    let mut f = file.try_clone()?;
    f.seek(SeekFrom::Start(from))?;
    let mut r = BufReader::with_capacity(1 << 16, f.take(upto - from));
    let mut s = Scan {
        offsets: Vec::new(),
        turns: HashMap::new(),
        keys: HashMap::new(),
        last: None,
        count: 0,
        end: from,
        bad: None,
        last_seal: None,
    };
    let mut prev = prev_hash.to_string();
    let mut seq = first_seq;
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = r
            .by_ref()
            .take(MAX_EVENT_BYTES as u64 + 1)
            .read_until(b'\n', &mut line)?;
        if n == 0 {
            break;
        }
        let complete = line.last() == Some(&b'\n');
        let result = if !complete {
            Err(if n > MAX_EVENT_BYTES {
                "line longer than the event size limit".into()
            } else {
                "partial last line (no newline)".into()
            })
        } else {
            parse_line(&line[..line.len() - 1], seq, &prev, ctx)
        };
        match result {
            Ok(ev) => {
                if index {
                    s.offsets.push(s.end);
                    if ev.kind() == "turnCompleted" {
                        if let Some(t) = ev.payload.get("turnId").and_then(|v| v.as_str()) {
                            s.turns.entry(t.to_string()).or_insert(ev.seq);
                        }
                    }
                    if let Some(k) = &ev.idempotency_key {
                        s.keys.entry(k.clone()).or_insert(ev.seq);
                    }
                }
                if let Some(h) = fold.as_deref_mut() {
                    if ev.seq == 1 {
                        if let Ok(built) = Head::from_header(&ev) {
                            *h = built;
                        }
                    } else {
                        h.apply(&ev);
                    }
                }
                s.end += n as u64;
                prev.clone_from(&ev.hash);
                seq += 1;
                s.count += 1;
                if ev.kind() == "sealed" {
                    s.last_seal = Some((s.end, s.count, fold.as_deref().cloned()));
                }
                s.last = Some(ev);
            }
            Err(reason) => {
                let at_tail = !complete || r.fill_buf()?.is_empty();
                s.bad = Some(Bad {
                    seq,
                    offset: s.end,
                    reason,
                    at_tail,
                });
                break;
            }
        }
    }
    Ok(s)
}

fn log_name(id: &str) -> String {
    format!("{id}{}", layout::LOG_SUFFIX)
}

fn anchor_name(id: &str) -> String {
    format!("{id}{}", layout::ANCHOR_SUFFIX)
}

impl JsonlBackend {
    pub(crate) fn open(state: Dir, options: &StoreOptions) -> Result<Self, StoreError> {
        let (threads, anchors) = if options.read_only {
            (
                state.existing_subdir(layout::THREADS_DIR)?,
                state.existing_subdir(layout::ANCHORS_DIR)?,
            )
        } else {
            (
                state.subdir(layout::THREADS_DIR)?,
                state.subdir(layout::ANCHORS_DIR)?,
            )
        };
        Ok(JsonlBackend {
            threads,
            anchors,
            _state: state,
            key: options.key.clone(),
            accept_unanchored: options.accept_unanchored,
            read_only: options.read_only,
            catalog: Mutex::new(None),
            dirty_logs: Mutex::new(HashSet::new()),
            dirty_anchors: Mutex::new(HashSet::new()),
        })
    }

    fn ctx<'a>(&'a self, id: &'a str) -> ChainCtx<'a> {
        ChainCtx {
            thread_id: id,
            key: self.key.as_ref(),
        }
    }

    /// The state directory (where the store id lives).
    pub(crate) fn state_dir(&self) -> &Dir {
        &self._state
    }

    /// Whether any thread has a keyed head anchor (one carrying a MAC); stops at the first.
    pub(crate) fn holds_keyed_threads(&self) -> Result<bool, StoreError> {
        for name in self.anchors.names()? {
            let Some(name) = name.to_str().filter(|n| n.ends_with(layout::ANCHOR_SUFFIX)) else {
                continue;
            };
            let mut bytes = Vec::new();
            match self.anchors.open_file(name, Open::Read) {
                Ok(f) => {
                    f.take(2 * ANCHOR_SLOT as u64).read_to_end(&mut bytes)?;
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e.into()),
            }
            if memchr::memmem::find(&bytes, b" mac=").is_some() {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The key, bound to the store's id once that is settled (`open_jsonl`).
    pub(crate) fn bind_key(&mut self, key: Option<RolloutKey>) {
        self.key = key;
    }

    /// `<state>/threads/<id>.jsonl` as the state dir was named at open (for people and tests;
    /// the store itself reaches the file through its directory descriptor).
    pub fn log_path(&self, id: &str) -> PathBuf {
        self.threads.path().join(log_name(id))
    }

    /// `<state>/anchors/<id>.head`, as `log_path`.
    pub fn anchor_path(&self, id: &str) -> PathBuf {
        self.anchors.path().join(anchor_name(id))
    }

    fn open_log(&self, id: &str, how: Open) -> io::Result<File> {
        self.threads.open_file(&log_name(id), how)
    }

    /// Both slots (decoded, raw), or None if there is no anchor file.
    fn read_slots(&self, id: &str) -> io::Result<Option<Slots>> {
        let mut bytes = Vec::new();
        match self.anchors.open_file(&anchor_name(id), Open::Read) {
            Ok(mut f) => {
                Read::by_ref(&mut f)
                    .take(2 * ANCHOR_SLOT as u64)
                    .read_to_end(&mut bytes)?;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        }
        let slot = |i: usize| {
            let raw = bytes
                .get(i * ANCHOR_SLOT..((i + 1) * ANCHOR_SLOT).min(bytes.len()))
                .unwrap_or(&[])
                .to_vec();
            let s = if raw.is_empty() {
                Slot::Empty
            } else {
                decode_slot(&raw)
            };
            (s, raw)
        };
        Ok(Some([slot(0), slot(1)]))
    }

    /// The newest valid anchor slot, if any (without any keyed check).
    pub fn read_anchor(&self, id: &str) -> io::Result<Option<Anchor>> {
        Ok(self.read_slots(id)?.and_then(|slots| {
            slots
                .into_iter()
                .filter_map(|(s, _)| match s {
                    Slot::Valid(a) => Some(a),
                    _ => None,
                })
                .max_by_key(|a| a.gen)
        }))
    }

    /// Picks the anchor to open `id` by, applying identity and key checks. Errors are refusals.
    fn choose_anchor(&self, id: &str) -> Result<AnchorChoice, StoreError> {
        let mismatch = |reason: String| StoreError::AnchorMismatch {
            thread_id: id.to_string(),
            reason,
        };
        let Some(slots) = self.read_slots(id)? else {
            return Ok(AnchorChoice::Unanchored {
                why: "the head anchor file is missing".into(),
            });
        };
        let newest = (0..2)
            .filter_map(|i| match &slots[i].0 {
                Slot::Valid(a) => Some((i, a.clone())),
                _ => None,
            })
            .max_by_key(|(_, a)| a.gen);
        let Some((i, anchor)) = newest else {
            let what = |s: &Slot| match s {
                Slot::Empty => "empty",
                _ => "damaged",
            };
            return Ok(AnchorChoice::Unanchored {
                why: format!(
                    "neither head anchor slot is valid (slot 0 {}, slot 1 {})",
                    what(&slots[0].0),
                    what(&slots[1].0)
                ),
            });
        };
        if let Some(t) = &anchor.thread {
            if t != id {
                return Err(mismatch(format!(
                    "the head anchor belongs to thread {t:?}: it was copied or swapped from another thread; restore this thread's own anchor"
                )));
            }
        }
        // Would a crash explain the other slot? It holds gen-1 (intact) or a torn gen+1.
        let fallback = match &slots[1 - i].0 {
            // Either slot may be the one a torn write hit (writes alternate), so any damage to
            // the other slot may be a lost newer generation.
            Slot::Damaged { seq } => Some(Fallback {
                text: format!(
                    "the newest head anchor slot is damaged{}; fell back to the older slot (generation {}, seq {})",
                    seq.map_or(String::new(), |s| format!(" (it appears to record seq {s})")),
                    anchor.gen,
                    anchor.seq
                ),
                claimed_seq: *seq,
                anchored_seq: anchor.seq,
            }),
            Slot::Empty if anchor.gen >= 2 => Some(Fallback {
                text: format!(
                    "one head anchor slot was erased (it held generation {} or {}); relying on the other (generation {}, seq {})",
                    anchor.gen - 1,
                    anchor.gen + 1,
                    anchor.gen,
                    anchor.seq
                ),
                claimed_seq: None,
                anchored_seq: anchor.seq,
            }),
            _ => None,
        };
        match (&self.key, &anchor.mac) {
            (Some(key), Some(mac)) => {
                let kid = anchor.key_id.as_deref().unwrap_or("");
                if kid != key.key_id() {
                    return Err(mismatch(format!(
                        "the head anchor was written with another rollout key (key id {kid}); open the store with that key"
                    )));
                }
                let body = mac_body(&slots[i].1).unwrap_or("");
                if !mac_eq(mac, &key.anchor_mac(id, body)) {
                    return Err(mismatch(
                        "the head anchor's MAC does not verify under the rollout key: the anchor was forged or rewritten"
                            .into(),
                    ));
                }
                match judge_store(text_field(body, "store"), key.store_id(), "the head anchor") {
                    Err(why) => return Err(mismatch(why)),
                    Ok(Some(why)) => return Ok(AnchorChoice::Unbound { anchor, why }),
                    Ok(None) => {}
                }
                Ok(AnchorChoice::Anchored {
                    anchor,
                    fallback,
                    read_only: None,
                })
            }
            (Some(_), None) => Ok(AnchorChoice::Unkeyed { anchor }),
            (None, Some(_)) => Ok(AnchorChoice::Anchored {
                read_only: Some(format!(
                    "thread {id:?} is protected by a rollout key (key id {}); open the store with that key to write to it",
                    anchor.key_id.as_deref().unwrap_or("?")
                )),
                anchor,
                fallback,
            }),
            (None, None) => Ok(AnchorChoice::Anchored {
                anchor,
                fallback,
                read_only: None,
            }),
        }
    }

    /// Copies bytes cut from a log to `<id>.jsonl.broken[.N]` (durably) and returns the name.
    fn save_broken(&self, id: &str, bytes: &[u8]) -> io::Result<String> {
        for n in 0.. {
            let name = if n == 0 {
                format!("{id}{}", layout::BROKEN_SUFFIX)
            } else {
                format!("{id}{}.{n}", layout::BROKEN_SUFFIX)
            };
            match self.threads.open_file(&name, Open::CreateNew) {
                Ok(mut f) => {
                    f.write_all(bytes)?;
                    f.sync_all()?;
                    return Ok(name);
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
        unreachable!("the loop only ends by returning")
    }

    /// Moves the bytes from `offset` to the end of the log into a `.broken` file and truncates.
    fn cut(&self, id: &str, file: &File, offset: u64, len: u64) -> io::Result<String> {
        let mut cut = vec![0u8; (len - offset) as usize];
        file.read_exact_at(&mut cut, offset)?;
        let name = self.save_broken(id, &cut)?;
        file.set_len(offset)?;
        fdatasync(file)?;
        self.threads.sync()?;
        Ok(name)
    }

    /// Removes a thread whose creation never completed (nothing was ever acknowledged).
    fn discard_unborn(&self, id: &str, log: Option<&[u8]>) -> Result<(), StoreError> {
        if let Some(bytes) = log {
            if !bytes.is_empty() {
                self.save_broken(id, bytes)?;
            }
            self.threads.unlink(&log_name(id))?;
            self.threads.sync()?;
        }
        match self.anchors.unlink(&anchor_name(id)) {
            Ok(()) => self.anchors.sync()?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
        if let Some(c) = self
            .catalog
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
        {
            c.remove(id);
        }
        Ok(())
    }

    fn ensure_index(&self, id: &str, tx: &mut JsonlTx) -> Result<(), StoreError> {
        if tx.index.is_some() {
            return Ok(());
        }
        let file = self.open_log(id, Open::Read)?;
        let s = scan(&file, 0, tx.len, 1, ZERO_HASH, self.ctx(id), true, None)?;
        if let Some(b) = s.bad {
            return Err(StoreError::Corrupt {
                thread_id: id.to_string(),
                seq: b.seq,
                reason: b.reason,
            });
        }
        tx.index = Some(Index {
            offsets: s.offsets,
            turns: s.turns,
            keys: s.keys,
        });
        Ok(())
    }

    fn read_events(
        &self,
        id: &str,
        tx: &JsonlTx,
        first: u64,
        last: u64,
    ) -> Result<Vec<Sealed>, StoreError> {
        let idx = tx.index.as_ref().expect("index built");
        // Start one event early so the first returned event's prevHash is checked too.
        let from_seq = first.saturating_sub(1).max(1);
        let start = idx.offsets[(from_seq - 1) as usize];
        let end = if (last as usize) < idx.offsets.len() {
            idx.offsets[last as usize]
        } else {
            tx.len
        };
        let mut buf = vec![0u8; (end - start) as usize];
        self.open_log(id, Open::Read)?
            .read_exact_at(&mut buf, start)?;
        let corrupt = |seq, reason| StoreError::Corrupt {
            thread_id: id.to_string(),
            seq,
            reason,
        };
        let mut out = Vec::with_capacity((last - first + 1) as usize);
        let mut prev: Option<String> = None;
        let mut seq = from_seq;
        for line in buf
            .split(|b| *b == b'\n')
            .take((last - from_seq + 1) as usize)
        {
            let ev: StoredEvent = crate::from_json_bytes(line)
                .map_err(|e| corrupt(seq, format!("not a valid event line ({e})")))?;
            let p = prev.clone().unwrap_or_else(|| ev.prev_hash.clone());
            check_event(&ev, seq, &p, self.ctx(id)).map_err(|r| corrupt(seq, r))?;
            prev = Some(ev.hash.clone());
            if seq >= first {
                let text = std::str::from_utf8(line)
                    .map_err(|e| corrupt(seq, format!("not UTF-8 ({e})")))?;
                out.push(Sealed::read(ev, Arc::from(text)));
            }
            seq += 1;
        }
        if out.len() as u64 != last - first + 1 {
            return Err(corrupt(seq, "log ends early".into()));
        }
        Ok(out)
    }

    fn write_anchor(&self, id: &str, a: &Anchor, durable: bool, fresh: bool) -> io::Result<()> {
        let how = if fresh {
            Open::CreateNew
        } else {
            Open::ReadWrite
        };
        // CreateNew opens write-only; a positioned write needs no read access.
        let f = self.anchors.open_file(&anchor_name(id), how)?;
        f.write_all_at(
            &a.encode_checked(id, self.key.as_ref())?,
            (a.gen % 2) * ANCHOR_SLOT as u64,
        )?;
        if fresh {
            // A new anchor must exist durably before its log does (see the module docs).
            fdatasync(&f)?;
            self.anchors.sync()?;
        } else if durable {
            fdatasync(&f)?;
        } else {
            self.dirty_anchors
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(id.to_string());
        }
        Ok(())
    }
}

/// Reads the line that ends exactly at `end` (its '\n' is byte `end - 1`), scanning backwards
/// in doubling chunks so the cost is the line's length, not the event size limit.
fn line_ending_at(file: &File, end: u64) -> io::Result<Vec<u8>> {
    let mut last = [0u8; 1];
    if end == 0 || file.read_exact_at(&mut last, end - 1).is_err() || last[0] != b'\n' {
        return Err(io_other(
            "anchored offset is not at the end of a line".into(),
        ));
    }
    let body_end = end - 1;
    let mut window = 4096u64;
    loop {
        let start = body_end.saturating_sub(window);
        let mut buf = vec![0u8; (body_end - start) as usize];
        file.read_exact_at(&mut buf, start)?;
        if let Some(p) = buf.iter().rposition(|b| *b == b'\n') {
            return Ok(buf.split_off(p + 1));
        }
        if start == 0 {
            return Ok(buf);
        }
        if window > MAX_EVENT_BYTES as u64 {
            return Err(io_other(
                "the anchored line is longer than the event size limit".into(),
            ));
        }
        window *= 2;
    }
}

impl Backend for JsonlBackend {
    type Tx = JsonlTx;

    fn new_tx(&self) -> JsonlTx {
        JsonlTx {
            len: 0,
            anchor_gen: 0,
            anchor_deferred: false,
            index: Some(Index {
                offsets: Vec::new(),
                turns: HashMap::new(),
                keys: HashMap::new(),
            }),
            back: None,
        }
    }

    fn load(&self, id: &str) -> Result<Option<Loaded<JsonlTx>>, StoreError> {
        let choice = self.choose_anchor(id)?;
        let anchor_file = self.anchors.exists(&anchor_name(id))?;
        let how = if self.read_only {
            Open::Read
        } else {
            Open::ReadWrite
        };
        let file = match self.open_log(id, how) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return self.load_without_log(id, choice, anchor_file);
            }
            Err(e) => return Err(e.into()),
        };
        let at = Opening {
            id,
            ctx: self.ctx(id),
            file: &file,
            len: file.metadata()?.len(),
        };
        let seq0 = nothing_anchored(&choice, anchor_file);
        let Some((header, header_len, first)) = self.read_header(&at, seq0)? else {
            return Ok(None);
        };
        let mut head = Head::from_header(&header).map_err(|reason| at.corrupt(1, reason))?;
        let mut found = Findings::default();
        let from = self.tail_start(
            &at,
            choice,
            anchor_file,
            header_len,
            &header,
            &mut head,
            &mut found,
        )?;
        let base = head.clone();
        let tail = scan(
            &file,
            from.start,
            at.len,
            from.prev.seq + 1,
            &from.prev.hash,
            at.ctx,
            false,
            Some(&mut head),
        )?;
        if let Some(fb) = &from.fell_back {
            let w = fb
                .judge(from.prev.seq + tail.count, self.accept_unanchored)
                .map_err(|r| at.mismatch(r))?;
            adopted(w, &mut found.warnings, &mut found.repairs);
        }
        let writable = from.read_only.is_none();
        let mut committed = tail.end;
        let mut tail_count = tail.count;
        if let Some(b) = &tail.bad {
            committed = self.torn_tail(&at, b, writable, &mut found)?;
        }
        if from.keyed_tail {
            let last_seal = tail.last_seal;
            match self.keyed_tail(
                &at, &from, seq0, last_seal, base, committed, tail_count, &mut found,
            )? {
                KeyedTail::Unborn => return Ok(None),
                KeyedTail::AsScanned => {}
                KeyedTail::Trimmed {
                    end,
                    count,
                    head: h,
                } => {
                    committed = end;
                    tail_count = count;
                    head = *h;
                }
            }
        }
        let mut tx = JsonlTx {
            len: committed,
            anchor_gen: from.anchor_gen,
            anchor_deferred: from.deferred,
            index: None,
            back: None,
        };
        let mut repairs = found.repairs;
        if writable
            && !self.read_only
            && !from.deferred
            && (tail_count > 0 || seq0 || from.rebuild_anchor || !repairs.is_empty())
        {
            // The tail was written but maybe never synced (the crash came before its ack): make
            // it durable before the anchor may point at it.
            fdatasync(&file)?;
            if from.rebuild_anchor {
                self.replace_anchor(id, &mut tx, &head)?;
            } else {
                self.anchor(id, &mut tx, &head, true)?;
            }
        }
        if !writable || self.read_only {
            // Nothing may be written for this thread, not even a record of what was found.
            repairs.clear();
        }
        let header_line = std::str::from_utf8(&first[..first.len() - 1])
            .ok()
            .map(Arc::from);
        Ok(Some(Loaded {
            head,
            tx,
            repairs,
            notes: found.notes,
            warnings: found.warnings,
            read_only: from.read_only,
            header_line,
            damage: found.damage,
        }))
    }

    fn write(
        &self,
        sets: &mut [WriteSet<'_, JsonlTx>],
        durable: bool,
    ) -> Vec<Result<(), StoreError>> {
        if self.read_only {
            return super::refuse_read_only(sets);
        }
        let mut created = false;
        let out: Vec<Result<(), StoreError>> = sets
            .iter_mut()
            .map(|set| {
                let file = if set.create {
                    // The anchor (at seq 0) exists durably before anything past the header is
                    // in the log: a log without an anchor then always means the anchor was
                    // removed, or is a header alone (a created thread). A header alone, unkeyed,
                    // defers it: creation is then one durable point (the log's).
                    let defer = set.events.len() == 1 && self.key.is_none();
                    if defer {
                        if self.anchors.exists(&anchor_name(set.id))? {
                            return Err(StoreError::AlreadyExists(set.id.to_string()));
                        }
                    } else {
                        match self.write_anchor(
                            set.id,
                            &seq0_anchor(set.head.format_version),
                            true,
                            true,
                        ) {
                            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                                return Err(StoreError::AlreadyExists(set.id.to_string()))
                            }
                            r => r?,
                        }
                    }
                    set.tx.anchor_gen = 0;
                    set.tx.anchor_deferred = defer;
                    match self.open_log(set.id, Open::CreateNew) {
                        Ok(f) => f,
                        Err(e) => {
                            let _ = self.anchors.unlink(&anchor_name(set.id));
                            if e.kind() == io::ErrorKind::AlreadyExists {
                                return Err(StoreError::AlreadyExists(set.id.to_string()));
                            }
                            return Err(e.into());
                        }
                    }
                } else {
                    if set.tx.anchor_deferred {
                        // Created with its header alone: the anchor first, then the rest.
                        self.create_deferred_anchor(set.id, set.head.format_version)?;
                        set.tx.anchor_deferred = false;
                    }
                    self.open_log(set.id, Open::Append)?
                };
                let mut bytes: Vec<u8> =
                    Vec::with_capacity(set.events.iter().map(|s| s.line.len() + 1).sum());
                for s in set.events {
                    bytes.extend_from_slice(s.line.as_bytes());
                    bytes.push(b'\n');
                }
                let res = (&file).write_all(&bytes).and_then(|()| {
                    if durable {
                        fdatasync(&file)
                    } else {
                        Ok(())
                    }
                });
                if let Err(e) = res {
                    // Nothing of a failed batch may stay behind to be mistaken for a torn tail.
                    if set.create {
                        let _ = self.threads.unlink(&log_name(set.id));
                        let _ = self.anchors.unlink(&anchor_name(set.id));
                    } else {
                        let _ = file.set_len(set.tx.len);
                    }
                    return Err(e.into());
                }
                if !durable {
                    self.dirty_logs
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(set.id.to_string());
                }
                if let Some(idx) = set.tx.index.as_mut() {
                    let mut off = set.tx.len;
                    for s in set.events {
                        idx.offsets.push(off);
                        off += s.line.len() as u64 + 1;
                        if s.ev.kind() == "turnCompleted" {
                            if let Some(t) = s.ev.payload.get("turnId").and_then(|v| v.as_str()) {
                                idx.turns.entry(t.to_string()).or_insert(s.ev.seq);
                            }
                        }
                        if let Some(k) = &s.ev.idempotency_key {
                            idx.keys.entry(k.clone()).or_insert(s.ev.seq);
                        }
                    }
                }
                set.tx.len += bytes.len() as u64;
                if set.create {
                    created = true;
                    if let Some(c) = self
                        .catalog
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .as_mut()
                    {
                        c.insert(set.id.to_string());
                    }
                }
                Ok(())
            })
            .collect();
        if created && durable {
            if let Err(e) = self.threads.sync() {
                let msg = e.to_string();
                return out
                    .into_iter()
                    .map(|_| Err(StoreError::Io(io_other(msg.clone()))))
                    .collect();
            }
        }
        out
    }

    fn anchor(
        &self,
        id: &str,
        tx: &mut JsonlTx,
        head: &Head,
        durable: bool,
    ) -> Result<(), StoreError> {
        if tx.anchor_deferred || self.read_only {
            // A header alone: there is nothing to anchor, and the anchor is written before
            // anything more is (module docs).
            return Ok(());
        }
        let a = anchor_for(head, tx.len, tx.anchor_gen + 1);
        match self.write_anchor(id, &a, durable, false) {
            // Threads written before anchors were created first may have none yet.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.write_anchor(id, &a, durable, true)?
            }
            r => r?,
        }
        tx.anchor_gen = a.gen;
        Ok(())
    }

    fn sync(&self) -> Result<(), StoreError> {
        let logs: Vec<String> = self
            .dirty_logs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .collect();
        let any_logs = !logs.is_empty();
        for id in logs {
            if let Ok(f) = self.open_log(&id, Open::Read) {
                f.sync_data()?;
            }
        }
        if any_logs {
            self.threads.sync()?;
        }
        let anchors: Vec<String> = self
            .dirty_anchors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .collect();
        for id in anchors {
            if let Ok(f) = self.anchors.open_file(&anchor_name(&id), Open::Read) {
                f.sync_data()?;
            }
        }
        Ok(())
    }

    fn read(
        &self,
        id: &str,
        tx: &mut JsonlTx,
        written: u64,
        after: u64,
        n: usize,
    ) -> Result<Vec<Sealed>, StoreError> {
        self.ensure_index(id, tx)?;
        let last = written.min(after + n as u64);
        if last <= after {
            return Ok(Vec::new());
        }
        self.read_events(id, tx, after + 1, last)
    }

    fn read_back(
        &self,
        id: &str,
        tx: &mut JsonlTx,
        written: (u64, &str),
        before: u64,
        n: usize,
    ) -> Result<Vec<Sealed>, StoreError> {
        let before = before.min(written.0 + 1);
        if before <= 1 || n == 0 {
            return Ok(Vec::new());
        }
        let from = before.saturating_sub(n as u64).max(1);
        if tx.index.is_some() {
            return self.read_events(id, tx, from, before - 1);
        }
        // Where the event before `before` ends, and what it must hash to: the head, or the
        // oldest event an earlier backward read reached.
        let (end, expect) = if before == written.0 + 1 {
            (tx.len, written.1.to_string())
        } else {
            match &tx.back {
                Some(b) if b.seq == before => (b.offset, b.prev_hash.clone()),
                _ => {
                    self.ensure_index(id, tx)?;
                    return self.read_events(id, tx, from, before - 1);
                }
            }
        };
        let corrupt = |seq: u64, reason: String| StoreError::Corrupt {
            thread_id: id.to_string(),
            seq,
            reason,
        };
        let want = (before - from) as usize;
        let file = self.open_log(id, Open::Read)?;
        // Backwards in growing windows until the wanted lines and the newline before them (or
        // the start of the file) are in hand: the cost is those lines, not the history.
        let mut window: u64 = 64 * 1024;
        let (buf, start) = loop {
            let s0 = end.saturating_sub(window);
            let mut b = vec![0u8; (end - s0) as usize];
            file.read_exact_at(&mut b, s0)?;
            let newlines = b.iter().filter(|c| **c == b'\n').count();
            if newlines > want || s0 == 0 {
                break (b, s0);
            }
            if window > MAX_EVENT_BYTES as u64 * (want as u64 + 1) {
                return Err(corrupt(
                    before - 1,
                    "a line is longer than the event size limit".into(),
                ));
            }
            window *= 2;
        };
        if buf.last() != Some(&b'\n') {
            return Err(corrupt(
                before - 1,
                "the event does not end where the log's head says it does".into(),
            ));
        }
        let body = &buf[..buf.len() - 1];
        let mut out = Vec::with_capacity(want);
        let mut expect = expect;
        let mut seq = before - 1;
        let mut line_end = body.len();
        let mut back = None;
        while out.len() < want {
            let line_start = body[..line_end]
                .iter()
                .rposition(|c| *c == b'\n')
                .map_or(0, |p| p + 1);
            if line_start == 0 && start > 0 {
                return Err(corrupt(seq, "the line before it is missing".into()));
            }
            let line = &body[line_start..line_end];
            let ev: StoredEvent = crate::from_json_bytes(line)
                .map_err(|e| corrupt(seq, format!("not a valid event line ({e})")))?;
            check_event(&ev, seq, &ev.prev_hash, self.ctx(id)).map_err(|r| corrupt(seq, r))?;
            if ev.hash != expect {
                return Err(corrupt(
                    seq,
                    "its hash is not the prevHash of the event after it (the chain is broken)"
                        .into(),
                ));
            }
            if seq == 1 && ev.prev_hash != ZERO_HASH {
                return Err(corrupt(1, "the header's prevHash is not all zeros".into()));
            }
            expect.clone_from(&ev.prev_hash);
            let text =
                std::str::from_utf8(line).map_err(|e| corrupt(seq, format!("not UTF-8 ({e})")))?;
            back = Some(Back {
                seq,
                offset: start + line_start as u64,
                prev_hash: ev.prev_hash.clone(),
            });
            out.push(Sealed::read(ev, Arc::from(text)));
            if seq == 1 {
                break;
            }
            seq -= 1;
            line_end = line_start.saturating_sub(1);
        }
        let keep = match (&tx.back, &back) {
            (Some(old), Some(new)) => new.seq < old.seq,
            (None, Some(_)) => true,
            _ => false,
        };
        if keep {
            tx.back = back;
        }
        out.reverse();
        Ok(out)
    }

    fn read_header(&self, id: &str, _tx: &mut JsonlTx) -> Result<Sealed, StoreError> {
        let file = self.open_log(id, Open::Read)?;
        let mut first = Vec::new();
        BufReader::new(file.take(MAX_EVENT_BYTES as u64 + 1)).read_until(b'\n', &mut first)?;
        let corrupt = |reason: String| StoreError::Corrupt {
            thread_id: id.to_string(),
            seq: 1,
            reason,
        };
        if first.last() != Some(&b'\n') {
            return Err(corrupt("the header line is incomplete".into()));
        }
        let line = &first[..first.len() - 1];
        let ev = parse_line(line, 1, ZERO_HASH, self.ctx(id)).map_err(corrupt)?;
        let text = std::str::from_utf8(line).map_err(|e| corrupt(format!("not UTF-8 ({e})")))?;
        Ok(Sealed::read(ev, Arc::from(text)))
    }

    fn find_key(
        &self,
        id: &str,
        tx: &mut JsonlTx,
        written: u64,
        key: &str,
    ) -> Result<Option<StoredEvent>, StoreError> {
        self.ensure_index(id, tx)?;
        let seq = tx
            .index
            .as_ref()
            .and_then(|i| i.keys.get(key).copied())
            .filter(|s| *s <= written);
        match seq {
            None => Ok(None),
            Some(s) => Ok(self.read_events(id, tx, s, s)?.pop().map(|s| s.ev)),
        }
    }

    fn peek(&self, id: &str) -> Result<Option<Head>, StoreError> {
        let ctx = self.ctx(id);
        let AnchorChoice::Anchored {
            anchor: a,
            fallback: None,
            read_only: None,
        } = self.choose_anchor(id)?
        else {
            return Ok(None);
        };
        if a.seq == 0 {
            return Ok(None);
        }
        let file = match self.open_log(id, Open::Read) {
            Ok(f) => f,
            Err(_) => return Ok(None),
        };
        // Anything after the anchored event (a tail to check or cut) is a full load's to judge.
        if file.metadata()?.len() != a.offset {
            return Ok(None);
        }
        let mut first = Vec::new();
        BufReader::new((&file).take(MAX_EVENT_BYTES as u64 + 1)).read_until(b'\n', &mut first)?;
        if first.last() != Some(&b'\n') {
            return Ok(None);
        }
        let Ok(header) = parse_line(&first[..first.len() - 1], 1, ZERO_HASH, ctx) else {
            return Ok(None);
        };
        let Ok(mut head) = Head::from_header(&header) else {
            return Ok(None);
        };
        let Ok(line) = line_ending_at(&file, a.offset) else {
            return Ok(None);
        };
        let Ok(ev) = crate::from_json_bytes::<StoredEvent>(&line) else {
            return Ok(None);
        };
        if ev.seq != a.seq
            || ev.hash != a.hash
            || check_event(&ev, a.seq, &ev.prev_hash, ctx).is_err()
        {
            return Ok(None);
        }
        head.apply(&ev);
        head.archived = a.archived;
        head.format_version = a.format;
        head.compacted_through = a.compacted_through;
        head.last_compaction_seq = a.last_compaction_seq;
        Ok(Some(head))
    }

    fn all_ids(&self) -> Result<Vec<String>, StoreError> {
        let mut cat = self.catalog.lock().unwrap_or_else(|e| e.into_inner());
        let set = self.scan_ids()?;
        let ids = set.iter().cloned().collect();
        *cat = Some(set);
        Ok(ids)
    }

    fn turn_completed(
        &self,
        id: &str,
        tx: &mut JsonlTx,
        turn_id: &str,
    ) -> Result<Option<StoredEvent>, StoreError> {
        self.ensure_index(id, tx)?;
        let seq = tx
            .index
            .as_ref()
            .and_then(|i| i.turns.get(turn_id).copied());
        match seq {
            None => Ok(None),
            Some(s) => Ok(self.read_events(id, tx, s, s)?.pop().map(|s| s.ev)),
        }
    }

    fn verify(
        &self,
        id: &str,
        tx: &mut JsonlTx,
        written: (u64, &str),
    ) -> Result<VerifyReport, StoreError> {
        let file = self.open_log(id, Open::Read)?;
        let len = file.metadata()?.len();
        let mut folded = Head::placeholder();
        let s = scan(
            &file,
            0,
            len,
            1,
            ZERO_HASH,
            self.ctx(id),
            true,
            Some(&mut folded),
        )?;
        let mut report = VerifyReport {
            thread_id: id.to_string(),
            events: s.count,
            head_seq: written.0,
            head_hash: written.1.to_string(),
            first_bad_seq: None,
            reason: None,
            repairs: Vec::new(),
            warnings: Vec::new(),
            keyed: self.key.is_some(),
            authenticated_through: None,
        };
        let last_hash = s
            .last
            .as_ref()
            .map_or(ZERO_HASH.to_string(), |e| e.hash.clone());
        if let Some(b) = s.bad {
            report.first_bad_seq = Some(b.seq);
            report.reason = Some(if b.at_tail {
                format!(
                    "{} (the last {} byte(s) of the log, from byte offset {})",
                    b.reason,
                    len - b.offset,
                    b.offset
                )
            } else {
                format!("{} (the line at byte offset {})", b.reason, b.offset)
            });
        } else if s.count != written.0 || last_hash != written.1 {
            report.first_bad_seq = Some(s.count.min(written.0) + 1);
            report.reason = Some(format!(
                "the log ends at seq {} but the store's head is seq {} (events were removed or added behind its back)",
                s.count, written.0
            ));
        } else {
            let mut anchored = 0;
            match self.choose_anchor(id) {
                Err(e) => report.reason = Some(e.to_string()),
                Ok(AnchorChoice::Unanchored { .. })
                    if self.key.is_none()
                        && s.count == 1
                        && s.end == len
                        && !self.anchors.exists(&anchor_name(id))? =>
                {
                    // A thread created with its header alone: its anchor is deferred until
                    // something more is written (module docs).
                }
                // Accepted (read-only: a writable open re-anchors it when it loads): the load
                // recorded what that vouches for among the thread's warnings.
                Ok(
                    AnchorChoice::Unanchored { .. }
                    | AnchorChoice::Unkeyed { .. }
                    | AnchorChoice::Unbound { .. },
                ) if self.accept_unanchored => {}
                Ok(AnchorChoice::Unanchored { why }) => {
                    report.reason = Some(format!(
                        "{why}: nothing vouches that the log ends where it should"
                    ))
                }
                Ok(AnchorChoice::Unkeyed { .. }) => {
                    report.reason =
                        Some("the head anchor carries no MAC although the store is keyed".into())
                }
                Ok(AnchorChoice::Unbound { why, .. }) => report.reason = Some(why),
                Ok(AnchorChoice::Anchored {
                    anchor: a,
                    fallback,
                    read_only,
                }) => {
                    if let Some(fb) = fallback {
                        match fb.judge(s.count, self.accept_unanchored) {
                            Ok(w) => report.warnings.push(w),
                            Err(why) => report.reason = Some(why),
                        }
                    }
                    if read_only.is_some() {
                        report.keyed = false;
                    }
                    let at = a.seq as usize;
                    if a.seq == 0 {
                        // Created; nothing anchored yet (Buffered/Ephemeral before a flush).
                    } else if a.seq > s.count
                        || s.offsets.get(at).copied().unwrap_or(s.end) != a.offset
                    {
                        report.first_bad_seq = Some(a.seq.min(s.count + 1));
                        report.reason = Some(format!(
                            "the anchor records seq {} at byte {}, which the log does not have",
                            a.seq, a.offset
                        ));
                    } else {
                        let ev = self.event_at_offset(&file, &s.offsets, at, s.end)?;
                        let cached = (
                            a.archived,
                            a.format,
                            a.compacted_through,
                            a.last_compaction_seq,
                        );
                        if ev.hash != a.hash {
                            report.first_bad_seq = Some(a.seq);
                            report.reason = Some(format!(
                                "the anchor records hash {} for seq {}, the log has {}",
                                a.hash, a.seq, ev.hash
                            ));
                        } else if a.seq == s.count && folded.cached_state() != cached {
                            report.reason = Some(format!(
                                "the anchor caches (archived, format, compactedThrough, lastCompaction) = {cached:?}, the log says {:?}",
                                folded.cached_state()
                            ));
                        }
                        anchored = a.seq;
                    }
                }
            }
            if report.keyed {
                let sealed = s.last_seal.as_ref().map_or(0, |(_, count, _)| *count);
                report.authenticated_through = Some(anchored.max(sealed));
            }
        }
        if report.ok() {
            tx.index = Some(Index {
                offsets: s.offsets,
                turns: s.turns,
                keys: s.keys,
            });
        }
        Ok(report)
    }

    fn ids_after(&self, after: Option<&str>, n: usize) -> Result<Vec<String>, StoreError> {
        let mut cat = self.catalog.lock().unwrap_or_else(|e| e.into_inner());
        if cat.is_none() {
            *cat = Some(self.scan_ids()?);
        }
        let set = cat.as_ref().expect("filled above");
        let it: Box<dyn Iterator<Item = &String>> = match after {
            Some(a) => Box::new(
                set.range::<str, _>((std::ops::Bound::Excluded(a), std::ops::Bound::Unbounded)),
            ),
            None => Box::new(set.iter()),
        };
        Ok(it.take(n).cloned().collect())
    }

    fn strays(&self) -> Result<Vec<(String, String)>, StoreError> {
        let mut out = Vec::new();
        for name in self.threads.names()? {
            let shown = name.to_string_lossy().into_owned();
            let ok = name.to_str().is_some_and(|n| {
                let id = n.strip_suffix(layout::LOG_SUFFIX).or_else(|| {
                    let (base, num) = n.rsplit_once(layout::BROKEN_SUFFIX)?;
                    (num.is_empty()
                        || num.strip_prefix('.').is_some_and(|d| {
                            !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit())
                        }))
                    .then_some(base)
                });
                id.is_some_and(|id| validate_thread_id(id).is_ok())
            });
            if !ok {
                out.push((
                    format!("{}/{shown}", layout::THREADS_DIR),
                    "not a thread log: its name is not <thread id>.jsonl, so no thread can own it"
                        .into(),
                ));
            }
        }
        for name in self.anchors.names()? {
            let shown = name.to_string_lossy().into_owned();
            let ok = name.to_str().is_some_and(|n| {
                n.strip_suffix(layout::ANCHOR_SUFFIX)
                    .is_some_and(|id| validate_thread_id(id).is_ok())
            });
            if !ok {
                out.push((
                    format!("{}/{shown}", layout::ANCHORS_DIR),
                    "not a head anchor: its name is not <thread id>.head".into(),
                ));
            }
        }
        out.sort();
        Ok(out)
    }
}

/// The anchor of a thread that has nothing anchored yet (slot 0, generation 0).
fn seq0_anchor(format: u16) -> Anchor {
    Anchor {
        seq: 0,
        hash: ZERO_HASH.into(),
        offset: 0,
        gen: 0,
        archived: false,
        format,
        compacted_through: 0,
        last_compaction_seq: None,
        thread: None,
        key_id: None,
        mac: None,
    }
}

/// The anchor that records `head`, whose last event ends at byte `offset`.
fn anchor_for(head: &Head, offset: u64, gen: u64) -> Anchor {
    Anchor {
        seq: head.last_seq,
        hash: head.head_hash.clone(),
        offset,
        gen,
        archived: head.archived,
        format: head.format_version,
        compacted_through: head.compacted_through,
        last_compaction_seq: head.last_compaction_seq,
        thread: None,
        key_id: None,
        mac: None,
    }
}

impl JsonlBackend {
    /// Directory names are the catalog: no index file to drift from the logs. A thread is any
    /// id with a log or an anchor, so a log deleted behind its anchor still shows.
    fn scan_ids(&self) -> Result<BTreeSet<String>, StoreError> {
        let mut set = BTreeSet::new();
        for (dir, suffix) in [
            (&self.threads, layout::LOG_SUFFIX),
            (&self.anchors, layout::ANCHOR_SUFFIX),
        ] {
            for name in dir.names()? {
                if let Some(id) = name.to_str().and_then(|n| n.strip_suffix(suffix)) {
                    if validate_thread_id(id).is_ok() {
                        set.insert(id.to_string());
                    }
                }
            }
        }
        Ok(set)
    }

    /// Writes the seq-0 anchor of a thread created with its header alone, as a whole file
    /// (written, synced, renamed into place, directory synced): a crash leaves either no anchor,
    /// which with a header-only log is still a created thread, or a complete one.
    fn create_deferred_anchor(&self, id: &str, format: u16) -> io::Result<()> {
        let tmp = format!("{}.tmp", anchor_name(id));
        let _ = self.anchors.unlink(&tmp);
        {
            let f = self.anchors.open_file(&tmp, Open::CreateNew)?;
            f.write_all_at(
                &seq0_anchor(format).encode_checked(id, self.key.as_ref())?,
                0,
            )?;
            fdatasync(&f)?;
        }
        self.anchors.rename(&tmp, &anchor_name(id))?;
        self.anchors.sync()
    }

    /// Replaces a missing or unreadable anchor file as a whole (a new file renamed over it),
    /// so no damaged slot survives to be mistaken for a newer generation.
    fn replace_anchor(&self, id: &str, tx: &mut JsonlTx, head: &Head) -> Result<(), StoreError> {
        let tmp = format!("{}.tmp", anchor_name(id));
        let _ = self.anchors.unlink(&tmp);
        let a = anchor_for(head, tx.len, 1);
        {
            let f = self.anchors.open_file(&tmp, Open::CreateNew)?;
            f.write_all_at(
                &a.encode_checked(id, self.key.as_ref())?,
                ANCHOR_SLOT as u64,
            )?;
            fdatasync(&f)?;
        }
        self.anchors.rename(&tmp, &anchor_name(id))?;
        self.anchors.sync()?;
        tx.anchor_gen = 1;
        if let Some(c) = self
            .catalog
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
        {
            c.insert(id.to_string());
        }
        Ok(())
    }

    fn event_at_offset(
        &self,
        file: &File,
        offsets: &[u64],
        seq: usize,
        end: u64,
    ) -> Result<StoredEvent, StoreError> {
        let start = offsets[seq - 1];
        let stop = offsets.get(seq).copied().unwrap_or(end);
        let mut buf = vec![0u8; (stop - start) as usize];
        file.read_exact_at(&mut buf, start)?;
        crate::from_json_bytes(&buf[..buf.len() - 1])
            .map_err(|e| StoreError::Io(io_other(e.to_string())))
    }
}

/// One thread's log being opened by `load`: its id, chain context and file, for the steps.
struct Opening<'a> {
    id: &'a str,
    ctx: ChainCtx<'a>,
    file: &'a File,
    len: u64,
}

impl Opening<'_> {
    fn mismatch(&self, reason: String) -> StoreError {
        StoreError::AnchorMismatch {
            thread_id: self.id.to_string(),
            reason,
        }
    }

    fn corrupt(&self, seq: u64, reason: String) -> StoreError {
        StoreError::Corrupt {
            thread_id: self.id.to_string(),
            seq,
            reason,
        }
    }
}

/// What opening one thread found along the way, for its `Loaded`.
#[derive(Default)]
struct Findings {
    notes: Vec<String>,
    warnings: Vec<String>,
    repairs: Vec<Repair>,
    /// Read-only: what a writable open would cut, as (first seq, reason); the lowest wins.
    damage: Option<(u64, String)>,
}

/// Where the un-anchored tail starts, as the anchor decides it, and what the anchor implies.
struct TailStart {
    /// The byte offset the tail starts at.
    start: u64,
    /// The event the tail links to.
    prev: StoredEvent,
    /// The tail must be authenticated (keyed mode, anchored by a keyed anchor).
    keyed_tail: bool,
    anchor_gen: u64,
    read_only: Option<String>,
    rebuild_anchor: bool,
    deferred: bool,
    fell_back: Option<Fallback>,
}

/// What the keyed check of the tail leaves of it.
enum KeyedTail {
    /// Not even the header is vouched for: the thread never existed (discarded).
    Unborn,
    AsScanned,
    /// Only up to the last seal is served.
    Trimmed {
        end: u64,
        count: u64,
        head: Box<Head>,
    },
}

/// Nothing was ever anchored: an anchor at seq 0, or (written by an older version) none.
fn nothing_anchored(choice: &AnchorChoice, anchor_file: bool) -> bool {
    match choice {
        AnchorChoice::Anchored { anchor, .. }
        | AnchorChoice::Unkeyed { anchor }
        | AnchorChoice::Unbound { anchor, .. } => anchor.seq == 0,
        AnchorChoice::Unanchored { .. } => !anchor_file,
    }
}

/// The steps of `Backend::load`, in the order it takes them.
impl JsonlBackend {
    /// A thread whose log file is missing: gone for good, or a start that never completed.
    fn load_without_log(
        &self,
        id: &str,
        choice: AnchorChoice,
        anchor_file: bool,
    ) -> Result<Option<Loaded<JsonlTx>>, StoreError> {
        let mismatch = |reason: String| StoreError::AnchorMismatch {
            thread_id: id.to_string(),
            reason,
        };
        let corrupt = |seq: u64, reason: String| StoreError::Corrupt {
            thread_id: id.to_string(),
            seq,
            reason,
        };
        match choice {
            AnchorChoice::Anchored { anchor, .. }
            | AnchorChoice::Unkeyed { anchor }
            | AnchorChoice::Unbound { anchor, .. }
                if anchor.seq > 0 =>
            {
                Err(mismatch(format!(
                    "the log file is missing but the anchor records seq {}: restore the log from a backup",
                    anchor.seq
                )))
            }
            AnchorChoice::Anchored { .. }
            | AnchorChoice::Unkeyed { .. }
            | AnchorChoice::Unbound { .. }
                if self.read_only =>
            {
                Err(corrupt(
                    1,
                    "its start never completed: the head anchor records seq 0 and there is no log (nothing was acknowledged); a writable open removes the anchor".into(),
                ))
            }
            AnchorChoice::Anchored { .. }
            | AnchorChoice::Unkeyed { .. }
            | AnchorChoice::Unbound { .. } => {
                // Created at seq 0 and the log never followed: start() was never
                // acknowledged. The thread does not exist.
                self.discard_unborn(id, None)?;
                Ok(None)
            }
            AnchorChoice::Unanchored { why } if anchor_file => Err(mismatch(format!(
                "the log file is missing and {why}: restore both from a backup, or delete the anchor file"
            ))),
            AnchorChoice::Unanchored { .. } => Ok(None),
        }
    }

    /// Reads and checks the header line (seq 1): the header, its length and its bytes, or
    /// `None` for a torn header nothing ever anchored (a start never acknowledged, discarded).
    fn read_header(
        &self,
        at: &Opening<'_>,
        seq0: bool,
    ) -> Result<Option<(StoredEvent, u64, Vec<u8>)>, StoreError> {
        let (id, len) = (at.id, at.len);
        let mut first = Vec::new();
        let header_len = BufReader::new(at.file.try_clone()?.take(MAX_EVENT_BYTES as u64 + 1))
            .read_until(b'\n', &mut first)? as u64;
        let parsed = if first.last() == Some(&b'\n') {
            parse_line(&first[..first.len() - 1], 1, ZERO_HASH, at.ctx)
        } else {
            Err("the header line is incomplete".to_string())
        };
        match parsed {
            Ok(h) => Ok(Some((h, header_len, first))),
            Err(_) if seq0 && header_len == len && first.last() != Some(&b'\n') => {
                // Only a torn header, and nothing was ever anchored: a crash inside start()
                // before it was acknowledged. Keep the bytes for inspection.
                if self.read_only {
                    return Err(at.corrupt(
                        1,
                        format!(
                            "its start never completed: the log is a torn header ({len} bytes, no newline) and nothing was acknowledged; a writable open moves it to {id}{}",
                            layout::BROKEN_SUFFIX
                        ),
                    ));
                }
                self.discard_unborn(id, Some(&first))?;
                Ok(None)
            }
            Err(reason) => Err(at.corrupt(1, reason)),
        }
    }

    /// Where the tail to check starts, as the anchor choice decides it: after the anchored
    /// event (checked against the log), or after the header when nothing vouches for more
    /// (refused unless accepted, with what that acceptance means as a warning).
    #[allow(clippy::too_many_arguments)]
    fn tail_start(
        &self,
        at: &Opening<'_>,
        choice: AnchorChoice,
        anchor_file: bool,
        header_len: u64,
        header: &StoredEvent,
        head: &mut Head,
        found: &mut Findings,
    ) -> Result<TailStart, StoreError> {
        let (id, len) = (at.id, at.len);
        let mut from = TailStart {
            start: header_len,
            prev: header.clone(),
            keyed_tail: false,
            anchor_gen: 0,
            read_only: None,
            rebuild_anchor: false,
            deferred: false,
            fell_back: None,
        };
        let (warnings, repairs) = (&mut found.warnings, &mut found.repairs);
        match choice {
            AnchorChoice::Anchored {
                anchor: a,
                fallback,
                read_only: ro,
            } => {
                from.anchor_gen = a.gen;
                from.fell_back = fallback;
                if let Some(why) = ro {
                    warnings.push(format!(
                        "unkeyed: the thread is keyed but was opened without its key, so only the plain chain was checked ({why})"
                    ));
                    from.read_only = Some(why);
                }
                from.keyed_tail = self.key.is_some();
                if a.seq > 0 {
                    let ev = self.anchored_event(at, &a)?;
                    head.apply(&ev);
                    head.archived = a.archived;
                    head.format_version = a.format;
                    head.compacted_through = a.compacted_through;
                    head.last_compaction_seq = a.last_compaction_seq;
                    from.start = a.offset;
                    from.prev = ev;
                }
            }
            AnchorChoice::Unanchored { .. }
                if self.key.is_none() && !anchor_file && header_len == len =>
            {
                // Its header alone and no anchor: a thread created with its anchor deferred
                // (module docs). The anchor is written before anything more is.
                from.deferred = true;
                if from.read_only.is_none() && !self.read_only {
                    let _ = self.anchors.unlink(&format!("{}.tmp", anchor_name(id)));
                }
            }
            AnchorChoice::Unanchored { why } if self.accept_unanchored => {
                adopted(
                    format!(
                        "{why}; accepted (accept_unanchored): the chain was checked from seq 1, but nothing vouches that its last event is the last one acknowledged"
                    ),
                    warnings,
                    repairs,
                );
                from.rebuild_anchor = true;
            }
            AnchorChoice::Unanchored { why } => {
                return Err(at.mismatch(format!(
                    "{why}, so nothing vouches that the log still ends where it did (events may have been cut off); restore the anchor from a backup, or accept the log as it is with accept_unanchored (--accept-unanchored)"
                )));
            }
            AnchorChoice::Unkeyed { anchor } if self.accept_unanchored => {
                adopted(
                    format!(
                        "the head anchor carried no MAC (written without the rollout key); adopted under the key (accept_unanchored): seqs up to {} were not authenticated when written",
                        anchor.seq.max(1)
                    ),
                    warnings,
                    repairs,
                );
                from.anchor_gen = anchor.gen;
            }
            AnchorChoice::Unkeyed { .. } => {
                return Err(at.mismatch(
                    "the head anchor carries no MAC: the thread was written without the rollout key, or the MAC was stripped; open with accept_unanchored (--accept-unanchored) to adopt it under this key"
                        .into(),
                ));
            }
            AnchorChoice::Unbound { anchor, why } if self.accept_unanchored => {
                adopted(
                    format!(
                        "{why}; adopted into this store (accept_unanchored): seqs up to {} were not bound to it when written",
                        anchor.seq.max(1)
                    ),
                    warnings,
                    repairs,
                );
                from.anchor_gen = anchor.gen;
            }
            AnchorChoice::Unbound { why, .. } => {
                return Err(at.mismatch(format!(
                    "{why}; if it belongs here, open with accept_unanchored (--accept-unanchored) to adopt it into this store"
                )));
            }
        }
        Ok(from)
    }

    /// The event the anchor names, read where the anchor says it ends and checked against it.
    fn anchored_event(&self, at: &Opening<'_>, a: &Anchor) -> Result<StoredEvent, StoreError> {
        let len = at.len;
        if a.offset > len {
            return Err(at.mismatch(format!(
                "the log is {len} bytes but the anchor says seq {} ends at byte {}: acknowledged events were cut off",
                a.seq, a.offset
            )));
        }
        let line = line_ending_at(at.file, a.offset).map_err(|e| at.mismatch(e.to_string()))?;
        let ev: StoredEvent = crate::from_json_bytes(&line).map_err(|e| {
            at.mismatch(format!(
                "no event ends at the anchored offset {} ({e})",
                a.offset
            ))
        })?;
        if ev.seq != a.seq || ev.hash != a.hash {
            return Err(at.mismatch(format!(
                "the log has seq {} hash {} where the anchor records seq {} hash {}",
                ev.seq, ev.hash, a.seq, a.hash
            )));
        }
        check_event(&ev, a.seq, &ev.prev_hash, at.ctx).map_err(|r| at.corrupt(a.seq, r))?;
        Ok(ev)
    }

    /// A bad line in the tail: refused unless nothing complete follows it (a torn tail), which
    /// a writable open cuts off into a broken file and records; a read-only open reports what
    /// it would cut. Returns where the served log ends.
    fn torn_tail(
        &self,
        at: &Opening<'_>,
        b: &Bad,
        writable: bool,
        found: &mut Findings,
    ) -> Result<u64, StoreError> {
        let (id, len) = (at.id, at.len);
        if !b.at_tail {
            return Err(at.corrupt(b.seq, b.reason.clone()));
        }
        if self.read_only {
            found.damage = Some((
                b.seq,
                format!(
                    "torn tail at seq {} ({}): the {} byte(s) from byte offset {} to the end of the log are not a complete event; a writable open cuts them into {id}{} and records the repair",
                    b.seq,
                    b.reason,
                    len - b.offset,
                    b.offset,
                    layout::BROKEN_SUFFIX
                ),
            ));
        } else if !writable {
            return Err(at.mismatch(format!(
                "a torn tail at seq {} needs a repair, which needs the rollout key; open the store with it",
                b.seq
            )));
        } else {
            let name = self.cut(id, at.file, b.offset, len)?;
            found.notes.push(format!(
                "torn tail at seq {} ({}): cut {} bytes at offset {} into {name}",
                b.seq,
                b.reason,
                len - b.offset,
                b.offset
            ));
            found.repairs.push(Repair {
                reason: b.reason.clone(),
                truncated_bytes: len - b.offset,
                broken_file: Some(name),
            });
        }
        Ok(b.offset)
    }

    /// Keyed: events after the anchor are authentic only up to the last seal among them.
    /// Anything later was never acknowledged (a keyed anchor is durable before an
    /// acknowledgement) or was appended by someone without the key: it is not served.
    #[allow(clippy::too_many_arguments)]
    fn keyed_tail(
        &self,
        at: &Opening<'_>,
        from: &TailStart,
        seq0: bool,
        last_seal: Option<(u64, u64, Option<Head>)>,
        base: Head,
        committed: u64,
        tail_count: u64,
        found: &mut Findings,
    ) -> Result<KeyedTail, StoreError> {
        let (id, start, prev) = (at.id, from.start, &from.prev);
        let has_seal = last_seal.is_some();
        let (keep_end, keep_count, keep_head) = match last_seal {
            Some((end, count, h)) => (end, count, h.expect("folded")),
            None => (start, 0, base),
        };
        if seq0 && !has_seal && self.read_only {
            return Err(at.corrupt(
                1,
                "its start never completed: nothing in the log is authenticated by the key (the keyed anchor records seq 0 and no seal follows), so nothing was acknowledged; a writable open discards it".into(),
            ));
        }
        if seq0 && !has_seal {
            // Not even the header is vouched for: start() was never acknowledged.
            let mut bytes = vec![0u8; committed as usize];
            at.file.read_exact_at(&mut bytes, 0)?;
            self.discard_unborn(id, Some(&bytes))?;
            return Ok(KeyedTail::Unborn);
        }
        if keep_count >= tail_count {
            return Ok(KeyedTail::AsScanned);
        }
        let (first_bad, last_bad) = (prev.seq + keep_count + 1, prev.seq + tail_count);
        if self.read_only {
            found.damage = Some((
                first_bad,
                format!(
                    "{} event(s), seq {first_bad}..={last_bad} (bytes {keep_end}..{committed}), follow the keyed anchor (seq {}) without authentication: never acknowledged (a crash before the anchor moved) or appended without the key; a writable open moves them to {id}{}",
                    last_bad - first_bad + 1,
                    prev.seq,
                    layout::BROKEN_SUFFIX
                ),
            ));
        } else {
            let name = self.cut(id, at.file, keep_end, committed)?;
            let reason = format!(
                "{} event(s), seq {first_bad}..={last_bad}, followed the keyed anchor (seq {}) without authentication: never acknowledged (a crash before the anchor moved) or appended without the key; moved to {name}",
                last_bad - first_bad + 1,
                prev.seq
            );
            found.warnings.push(reason.clone());
            found.repairs.push(Repair {
                reason,
                truncated_bytes: committed - keep_end,
                broken_file: Some(name),
            });
        }
        Ok(KeyedTail::Trimmed {
            end: keep_end,
            count: keep_count,
            head: Box::new(keep_head),
        })
    }
}

/// A thread adopted as it is under accept_unanchored: warned about and recorded as a repair.
fn adopted(warning: String, warnings: &mut Vec<String>, repairs: &mut Vec<Repair>) {
    warnings.push(warning.clone());
    repairs.push(Repair {
        reason: warning,
        truncated_bytes: 0,
        broken_file: None,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bound_anchor_of_the_longest_id_fits_its_slot_up_to_its_documented_edge() {
        let id = "a".repeat(super::super::MAX_ID_LEN);
        let key = RolloutKey::from_bytes([3; 32]).bound_to(Some("0123456789abcdef"));
        let at = |n: u64| Anchor {
            seq: n,
            hash: "ab".repeat(32),
            offset: 10u64.pow(13) - 1,
            gen: n,
            archived: true,
            format: 1,
            compacted_through: n,
            last_compaction_seq: Some(n),
            thread: None,
            key_id: None,
            mac: None,
        };
        let edge = at(10u64.pow(10) - 1);
        let slot = edge.encode_checked(&id, Some(&key)).unwrap();
        assert_eq!(slot.len(), ANCHOR_SLOT);
        let back = Anchor::decode(&slot).expect("it decodes");
        assert_eq!((back.seq, back.offset), (edge.seq, edge.offset));
        assert!(String::from_utf8_lossy(&slot).contains(" store=0123456789abcdef kid="));
        // One digit more in each seq field: refused, never written truncated.
        let err = at(10u64.pow(10))
            .encode_checked(&id, Some(&key))
            .unwrap_err();
        assert!(
            err.to_string().contains("more than its 512 byte slot"),
            "{err}"
        );
    }
}
