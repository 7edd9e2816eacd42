//! The JSONL backend (the default store): one append-only file per thread plus a small head
//! anchor beside it, because a plain text log is what a third party can verify and repair by hand.
//!
//! Opening a thread reads its header line, its anchor and the bytes after the anchored event
//! only, so resume cost depends on the un-anchored tail, never on the history.

use super::engine::{check_event, parse_line, Backend, Head, Loaded, Repair, WriteSet};
use super::fsutil::{ensure_private_subdir, fdatasync, fsync_dir, open_private};
use super::{StoreError, StoredEvent, VerifyReport, MAX_EVENT_BYTES, ZERO_HASH};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Bytes per anchor slot; the anchor file holds two so a torn anchor write leaves the other.
pub const ANCHOR_SLOT: usize = 512;

/// The JSONL backend. Paths: `<state>/threads/<id>.jsonl`, `<state>/anchors/<id>.head`.
pub struct JsonlBackend {
    threads: PathBuf,
    anchors: PathBuf,
    catalog: Mutex<Option<BTreeSet<String>>>,
    dirty_logs: Mutex<HashSet<String>>,
    dirty_anchors: Mutex<HashSet<String>>,
}

/// Per-thread state: committed length, anchor generation and the lazily built offset index.
pub struct JsonlTx {
    len: u64,
    anchor_gen: u64,
    index: Option<Index>,
}

/// Built by one full scan on the first `read`/`terminal_evidence`; kept up to date by appends.
struct Index {
    /// `offsets[i]` is where seq `i + 1` starts.
    offsets: Vec<u64>,
    turns: HashMap<String, u64>,
}

/// The decoded anchor: the head the log must still contain, plus derived state so opening
/// does not need the history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Anchor {
    pub seq: u64,
    pub hash: String,
    /// Byte offset just after the anchored event's '\n'.
    pub offset: u64,
    pub gen: u64,
    pub archived: bool,
    pub format: u16,
    pub compacted_through: u64,
    pub last_compaction_seq: Option<u64>,
}

impl Anchor {
    /// `ccanchor1 k=v ... check=<16 hex of sha256 of the text before " check=">`.
    pub fn encode(&self) -> Vec<u8> {
        let body = format!(
            "ccanchor1 seq={} hash={} offset={} gen={} archived={} format={} compactedThrough={} lastCompaction={}",
            self.seq,
            self.hash,
            self.offset,
            self.gen,
            self.archived as u8,
            self.format,
            self.compacted_through,
            self.last_compaction_seq.map_or("-".to_string(), |s| s.to_string())
        );
        let check = &cc_agent_protocol::sha256_hex(body.as_bytes())[..16];
        let mut out = format!("{body} check={check}").into_bytes();
        out.resize(ANCHOR_SLOT - 1, b' ');
        out.push(b'\n');
        out
    }

    pub fn decode(slot: &[u8]) -> Option<Anchor> {
        let text = std::str::from_utf8(slot).ok()?.trim_end();
        let (body, check) = text.rsplit_once(" check=")?;
        if cc_agent_protocol::sha256_hex(body.as_bytes())[..16] != *check {
            return None;
        }
        let mut parts = body.split(' ');
        if parts.next()? != "ccanchor1" {
            return None;
        }
        let kv: HashMap<&str, &str> = parts.filter_map(|p| p.split_once('=')).collect();
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
        })
    }
}

/// What a forward scan over lines found.
struct Scan {
    offsets: Vec<u64>,
    turns: HashMap<String, u64>,
    last: Option<StoredEvent>,
    count: u64,
    end: u64,
    bad: Option<Bad>,
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
fn scan(
    file: &File,
    from: u64,
    upto: u64,
    first_seq: u64,
    prev_hash: &str,
    index: bool,
    mut fold: Option<&mut Head>,
) -> io::Result<Scan> {
    let mut f = file.try_clone()?;
    f.seek(SeekFrom::Start(from))?;
    let mut r = BufReader::with_capacity(1 << 16, f.take(upto - from));
    let mut s = Scan {
        offsets: Vec::new(),
        turns: HashMap::new(),
        last: None,
        count: 0,
        end: from,
        bad: None,
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
            parse_line(&line[..line.len() - 1], seq, &prev)
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
                }
                if let Some(h) = fold.as_deref_mut() {
                    h.apply(&ev);
                }
                s.end += n as u64;
                prev.clone_from(&ev.hash);
                seq += 1;
                s.count += 1;
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

impl JsonlBackend {
    pub(crate) fn open(state_dir: &Path) -> Result<Self, StoreError> {
        let threads = state_dir.join(super::layout::THREADS_DIR);
        let anchors = state_dir.join(super::layout::ANCHORS_DIR);
        ensure_private_subdir(&threads)?;
        ensure_private_subdir(&anchors)?;
        Ok(JsonlBackend {
            threads,
            anchors,
            catalog: Mutex::new(None),
            dirty_logs: Mutex::new(HashSet::new()),
            dirty_anchors: Mutex::new(HashSet::new()),
        })
    }

    /// `<state>/threads/<id>.jsonl` (the id is validated before it gets here).
    pub fn log_path(&self, id: &str) -> PathBuf {
        self.threads.join(format!("{id}.jsonl"))
    }

    /// `<state>/anchors/<id>.head`.
    pub fn anchor_path(&self, id: &str) -> PathBuf {
        self.anchors.join(format!("{id}.head"))
    }

    /// The newest valid anchor slot, if any.
    pub fn read_anchor(&self, id: &str) -> io::Result<Option<Anchor>> {
        let bytes = match fs::read(self.anchor_path(id)) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        Ok(bytes
            .chunks(ANCHOR_SLOT)
            .filter_map(Anchor::decode)
            .max_by_key(|a| a.gen))
    }

    fn save_broken(&self, id: &str, bytes: &[u8]) -> io::Result<String> {
        for n in 0.. {
            let name = if n == 0 {
                format!("{id}.jsonl.broken")
            } else {
                format!("{id}.jsonl.broken.{n}")
            };
            match open_private_new(&self.threads.join(&name)) {
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

    fn ensure_index(&self, id: &str, tx: &mut JsonlTx) -> Result<(), StoreError> {
        if tx.index.is_some() {
            return Ok(());
        }
        let file = File::open(self.log_path(id))?;
        let s = scan(&file, 0, tx.len, 1, ZERO_HASH, true, None)?;
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
        });
        Ok(())
    }

    fn read_events(
        &self,
        id: &str,
        tx: &JsonlTx,
        first: u64,
        last: u64,
    ) -> Result<Vec<StoredEvent>, StoreError> {
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
        File::open(self.log_path(id))?.read_exact_at(&mut buf, start)?;
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
            let ev: StoredEvent = serde_json::from_slice(line)
                .map_err(|e| corrupt(seq, format!("not a valid event line ({e})")))?;
            let p = prev.clone().unwrap_or_else(|| ev.prev_hash.clone());
            check_event(&ev, seq, &p).map_err(|r| corrupt(seq, r))?;
            prev = Some(ev.hash.clone());
            if seq >= first {
                out.push(ev);
            }
            seq += 1;
        }
        if out.len() as u64 != last - first + 1 {
            return Err(corrupt(seq, "log ends early".into()));
        }
        Ok(out)
    }
}

fn open_private_new(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
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
            index: Some(Index {
                offsets: Vec::new(),
                turns: HashMap::new(),
            }),
        }
    }

    fn load(&self, id: &str) -> Result<Option<Loaded<JsonlTx>>, StoreError> {
        let path = self.log_path(id);
        let anchor = self.read_anchor(id)?;
        let mismatch = |reason: String| StoreError::AnchorMismatch {
            thread_id: id.to_string(),
            reason,
        };
        let file = match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if let Some(a) = anchor {
                    return Err(mismatch(format!(
                        "the log file is missing but the anchor records seq {}",
                        a.seq
                    )));
                }
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        };
        let len = file.metadata()?.len();
        let mut notes = Vec::new();
        // The header gives title, metadata and creation time.
        let mut first = Vec::new();
        let header_len = BufReader::new(file.try_clone()?.take(MAX_EVENT_BYTES as u64 + 1))
            .read_until(b'\n', &mut first)? as u64;
        let parsed = if first.last() == Some(&b'\n') {
            parse_line(&first[..first.len() - 1], 1, ZERO_HASH)
        } else {
            Err("the header line is incomplete".to_string())
        };
        let header = match parsed {
            Ok(h) => h,
            Err(reason) if anchor.is_some() || header_len < len => {
                return Err(StoreError::Corrupt {
                    thread_id: id.to_string(),
                    seq: 1,
                    reason,
                });
            }
            Err(_) => {
                // Only a torn header and no anchor: a crash inside start() before it was
                // acknowledged. The thread never existed; keep the bytes for inspection.
                self.save_broken(id, &first)?;
                fs::remove_file(&path)?;
                fsync_dir(&self.threads)?;
                return Ok(None);
            }
        };
        let mut head = Head::from_header(&header).map_err(|reason| StoreError::Corrupt {
            thread_id: id.to_string(),
            seq: 1,
            reason,
        })?;
        let (start, prev) = match &anchor {
            Some(a) => {
                if a.offset > len {
                    return Err(mismatch(format!(
                        "the log is {len} bytes but the anchor says seq {} ends at byte {}: acknowledged events were cut off",
                        a.seq, a.offset
                    )));
                }
                let line = line_ending_at(&file, a.offset).map_err(|e| mismatch(e.to_string()))?;
                let ev: StoredEvent = serde_json::from_slice(&line).map_err(|e| {
                    mismatch(format!(
                        "no event ends at the anchored offset {} ({e})",
                        a.offset
                    ))
                })?;
                if ev.seq != a.seq || ev.hash != a.hash || ev.compute_hash() != ev.hash {
                    return Err(mismatch(format!(
                        "the log has seq {} hash {} where the anchor records seq {} hash {}",
                        ev.seq, ev.hash, a.seq, a.hash
                    )));
                }
                head.apply(&ev);
                head.archived = a.archived;
                head.format_version = a.format;
                head.compacted_through = a.compacted_through;
                head.last_compaction_seq = a.last_compaction_seq;
                (a.offset, ev)
            }
            None => {
                notes.push(
                    "no anchor found: the whole log was checked and a new anchor written"
                        .to_string(),
                );
                (header_len, header.clone())
            }
        };
        let tail = scan(
            &file,
            start,
            len,
            prev.seq + 1,
            &prev.hash,
            false,
            Some(&mut head),
        )?;
        let mut repair = None;
        let mut committed = tail.end;
        if let Some(b) = tail.bad {
            if !b.at_tail {
                return Err(StoreError::Corrupt {
                    thread_id: id.to_string(),
                    seq: b.seq,
                    reason: b.reason,
                });
            }
            let mut cut = vec![0u8; (len - b.offset) as usize];
            file.read_exact_at(&mut cut, b.offset)?;
            let name = self.save_broken(id, &cut)?;
            file.set_len(b.offset)?;
            fdatasync(&file)?;
            fsync_dir(&self.threads)?;
            notes.push(format!(
                "torn tail at seq {} ({}): cut {} bytes at offset {} into {name}",
                b.seq,
                b.reason,
                len - b.offset,
                b.offset
            ));
            repair = Some(Repair {
                reason: b.reason,
                truncated_bytes: len - b.offset,
                broken_file: Some(name),
            });
            committed = b.offset;
        }
        let mut tx = JsonlTx {
            len: committed,
            anchor_gen: anchor.as_ref().map_or(0, |a| a.gen),
            index: None,
        };
        if tail.count > 0 || anchor.is_none() {
            // The tail was written but maybe never synced (the crash came before its ack): make
            // it durable before the anchor may point at it.
            fdatasync(&file)?;
            self.anchor(id, &mut tx, &head)?;
        }
        Ok(Some(Loaded {
            head,
            tx,
            repair,
            notes,
        }))
    }

    fn write(
        &self,
        sets: &mut [WriteSet<'_, JsonlTx>],
        durable: bool,
    ) -> Vec<Result<(), StoreError>> {
        let mut created = false;
        let out: Vec<Result<(), StoreError>> = sets
            .iter_mut()
            .map(|set| {
                let path = self.log_path(set.id);
                let file = if set.create {
                    match open_private_new(&path) {
                        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                            return Err(StoreError::AlreadyExists(set.id.to_string()))
                        }
                        r => r?,
                    }
                } else {
                    OpenOptions::new().append(true).open(&path)?
                };
                let bytes: Vec<u8> = set
                    .events
                    .iter()
                    .flat_map(|s| s.line.iter().copied())
                    .collect();
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
                        let _ = fs::remove_file(&path);
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
                        off += s.line.len() as u64;
                        if s.ev.kind() == "turnCompleted" {
                            if let Some(t) = s.ev.payload.get("turnId").and_then(|v| v.as_str()) {
                                idx.turns.entry(t.to_string()).or_insert(s.ev.seq);
                            }
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
            if let Err(e) = fsync_dir(&self.threads) {
                let msg = e.to_string();
                return out
                    .into_iter()
                    .map(|_| Err(StoreError::Io(io_other(msg.clone()))))
                    .collect();
            }
        }
        out
    }

    fn anchor(&self, id: &str, tx: &mut JsonlTx, head: &Head) -> Result<(), StoreError> {
        let a = Anchor {
            seq: head.last_seq,
            hash: head.head_hash.clone(),
            offset: tx.len,
            gen: tx.anchor_gen + 1,
            archived: head.archived,
            format: head.format_version,
            compacted_through: head.compacted_through,
            last_compaction_seq: head.last_compaction_seq,
        };
        let path = self.anchor_path(id);
        let fresh = !path.exists();
        let f = open_private(&path, false)?;
        f.write_all_at(&a.encode(), (a.gen % 2) * ANCHOR_SLOT as u64)?;
        if fresh {
            // A new anchor must not be lost to a crash while its log survives.
            fdatasync(&f)?;
            fsync_dir(&self.anchors)?;
        } else {
            self.dirty_anchors
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(id.to_string());
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
            if let Ok(f) = File::open(self.log_path(&id)) {
                f.sync_data()?;
            }
        }
        if any_logs {
            fsync_dir(&self.threads)?;
        }
        let anchors: Vec<String> = self
            .dirty_anchors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .collect();
        for id in anchors {
            if let Ok(f) = File::open(self.anchor_path(&id)) {
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
    ) -> Result<Vec<StoredEvent>, StoreError> {
        self.ensure_index(id, tx)?;
        let last = written.min(after + n as u64);
        if last <= after {
            return Ok(Vec::new());
        }
        self.read_events(id, tx, after + 1, last)
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
            Some(s) => Ok(self.read_events(id, tx, s, s)?.pop()),
        }
    }

    fn verify(
        &self,
        id: &str,
        tx: &mut JsonlTx,
        written: (u64, &str),
    ) -> Result<VerifyReport, StoreError> {
        let file = File::open(self.log_path(id))?;
        let len = file.metadata()?.len();
        let s = scan(&file, 0, len, 1, ZERO_HASH, true, None)?;
        let mut report = VerifyReport {
            thread_id: id.to_string(),
            events: s.count,
            head_seq: written.0,
            head_hash: written.1.to_string(),
            first_bad_seq: None,
            reason: None,
            repairs: Vec::new(),
        };
        let last_hash = s
            .last
            .as_ref()
            .map_or(ZERO_HASH.to_string(), |e| e.hash.clone());
        if let Some(b) = s.bad {
            report.first_bad_seq = Some(b.seq);
            report.reason = Some(b.reason);
        } else if s.count != written.0 || last_hash != written.1 {
            report.first_bad_seq = Some(s.count.min(written.0) + 1);
            report.reason = Some(format!(
                "the log ends at seq {} but the store's head is seq {} (events were removed or added behind its back)",
                s.count, written.0
            ));
        } else if let Some(a) = self.read_anchor(id)? {
            let at = a.seq as usize;
            if a.seq > s.count || at == 0 || s.offsets.get(at).copied().unwrap_or(s.end) != a.offset
            {
                report.first_bad_seq = Some(a.seq.min(s.count + 1));
                report.reason = Some(format!(
                    "the anchor records seq {} at byte {}, which the log does not have",
                    a.seq, a.offset
                ));
            } else {
                let ev = self.read_events_from_scan(&file, &s.offsets, at, s.end)?;
                if ev.hash != a.hash {
                    report.first_bad_seq = Some(a.seq);
                    report.reason = Some(format!(
                        "the anchor records hash {} for seq {}, the log has {}",
                        a.hash, a.seq, ev.hash
                    ));
                }
            }
        }
        // No anchor yet is legitimate (Buffered/Ephemeral before their first flush); opening
        // without one re-checks the whole log and writes it.
        if report.ok() {
            tx.index = Some(Index {
                offsets: s.offsets,
                turns: s.turns,
            });
        }
        Ok(report)
    }

    fn ids_after(&self, after: Option<&str>, n: usize) -> Result<Vec<String>, StoreError> {
        let mut cat = self.catalog.lock().unwrap_or_else(|e| e.into_inner());
        if cat.is_none() {
            // Directory names are the catalog: no index file to drift from the logs.
            let mut set = BTreeSet::new();
            for entry in fs::read_dir(&self.threads)? {
                let name = entry?.file_name();
                if let Some(id) = name.to_str().and_then(|n| n.strip_suffix(".jsonl")) {
                    if super::validate_thread_id(id).is_ok() {
                        set.insert(id.to_string());
                    }
                }
            }
            *cat = Some(set);
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
}

impl JsonlBackend {
    fn read_events_from_scan(
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
        serde_json::from_slice(&buf[..buf.len() - 1])
            .map_err(|e| StoreError::Io(io_other(e.to_string())))
    }
}
