//! The store logic shared by every backend: per-thread head state, sealing (seq, prevHash, hash,
//! time), group commit and durability policy, so JSONL and SQLite differ only in how bytes reach
//! the disk and cannot drift apart in semantics.

use super::*;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

/// A thread's state as far as the store needs it without reading history.
#[derive(Debug, Clone, PartialEq)]
pub struct Head {
    pub thread_id: String,
    pub title: Option<String>,
    pub metadata: Arc<Map<String, Value>>,
    pub created_at: String,
    pub forked_from: Option<ForkOrigin>,
    pub format_version: u16,
    pub archived: bool,
    pub last_seq: u64,
    pub head_hash: String,
    pub updated_at: String,
    pub compacted_through: u64,
    pub last_compaction_seq: Option<u64>,
}

impl Head {
    /// Builds the head from a `threadStarted` event (seq 1).
    pub fn from_header(ev: &StoredEvent) -> Result<Head, String> {
        let p = &ev.payload;
        if ev.seq != 1 || ev.kind() != "threadStarted" {
            return Err(format!(
                "seq 1 must be a threadStarted header, found seq {} type {:?}",
                ev.seq,
                ev.kind()
            ));
        }
        let thread_id = p
            .get("threadId")
            .and_then(Value::as_str)
            .ok_or("header has no threadId")?
            .to_string();
        let format_version = p
            .get("formatVersion")
            .and_then(Value::as_u64)
            .filter(|v| (1..=u16::MAX as u64).contains(v))
            .ok_or("header has no valid formatVersion")? as u16;
        let title = p.get("title").and_then(Value::as_str).map(str::to_string);
        let metadata = p
            .get("metadata")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let forked_from = match p.get("forkedFrom") {
            None | Some(Value::Null) => None,
            Some(v) => Some(
                serde_json::from_value(v.clone()).map_err(|e| format!("header forkedFrom: {e}"))?,
            ),
        };
        Ok(Head {
            thread_id,
            title,
            metadata: Arc::new(metadata),
            created_at: ev.time.clone(),
            forked_from,
            format_version,
            archived: false,
            last_seq: 1,
            head_hash: ev.hash.clone(),
            updated_at: ev.time.clone(),
            compacted_through: 0,
            last_compaction_seq: None,
        })
    }

    /// Refuses payloads that would make the head inconsistent (checked again at commit time so two
    /// racing compactions cannot both land).
    fn check(&self, payload: &Value, seq: u64) -> Result<(), StoreError> {
        if payload.get("type").and_then(Value::as_str) == Some("compacted") {
            let to = payload.get("toSeq").and_then(Value::as_u64).unwrap_or(0);
            let from = payload.get("fromSeq").and_then(Value::as_u64).unwrap_or(0);
            if to <= self.compacted_through || to >= seq || from == 0 || from > to {
                return Err(StoreError::InvalidArgument(format!(
                    "compaction {from}..={to} must end after the previous compaction (seq {}) and before seq {seq}",
                    self.compacted_through
                )));
            }
        }
        if seq > MAX_SEQ {
            return Err(StoreError::InvalidArgument(
                "thread reached the largest seq the wire can carry".into(),
            ));
        }
        Ok(())
    }

    /// Folds one event into the head.
    pub fn apply(&mut self, ev: &StoredEvent) {
        self.last_seq = ev.seq;
        self.head_hash.clone_from(&ev.hash);
        self.updated_at.clone_from(&ev.time);
        let p = &ev.payload;
        match ev.kind() {
            "threadArchived" => {
                self.archived = p
                    .get("archived")
                    .and_then(Value::as_bool)
                    .unwrap_or(self.archived)
            }
            "compacted" => {
                self.compacted_through = p
                    .get("toSeq")
                    .and_then(Value::as_u64)
                    .unwrap_or(self.compacted_through);
                self.last_compaction_seq = Some(ev.seq);
            }
            "migrated" => {
                if let Some(v) = p.get("toFormat").and_then(Value::as_u64) {
                    self.format_version = v.min(u16::MAX as u64) as u16;
                }
            }
            _ => {}
        }
    }

    /// The state an anchor caches (archived, format, compactions), as text for comparisons.
    pub fn cached_state(&self) -> (bool, u16, u64, Option<u64>) {
        (
            self.archived,
            self.format_version,
            self.compacted_through,
            self.last_compaction_seq,
        )
    }

    /// A head to fold a whole log into (the header replaces it).
    pub fn placeholder() -> Head {
        Head {
            thread_id: String::new(),
            title: None,
            metadata: Arc::default(),
            created_at: String::new(),
            forked_from: None,
            format_version: 1,
            archived: false,
            last_seq: 0,
            head_hash: ZERO_HASH.to_string(),
            updated_at: String::new(),
            compacted_through: 0,
            last_compaction_seq: None,
        }
    }

    /// Folds one event read from the start of a log: the header builds the head, the rest
    /// apply to it.
    pub fn fold(head: &mut Option<Head>, ev: &StoredEvent) {
        match head {
            None => *head = Head::from_header(ev).ok(),
            Some(h) => h.apply(ev),
        }
    }

    pub fn summary(&self) -> ThreadSummary {
        ThreadSummary {
            thread_id: self.thread_id.clone(),
            title: self.title.clone(),
            metadata: (*self.metadata).clone(),
            created_at: self.created_at.clone(),
            updated_at: self.updated_at.clone(),
            archived: self.archived,
            last_seq: self.last_seq,
            head_hash: self.head_hash.clone(),
            forked_from: self.forked_from.clone(),
            format_version: self.format_version,
            last_compaction_seq: self.last_compaction_seq,
            compacted_through: self.compacted_through,
        }
    }
}

/// An event with its serialised line (JSON + '\n'), ready for any backend.
#[derive(Debug, Clone)]
pub struct Sealed {
    pub ev: StoredEvent,
    pub line: Vec<u8>,
}

/// Gives `ev` its seq, prevHash, time and hash on top of `head`, and advances `head`.
fn seal(head: &mut Head, ev: NewEvent, time: &str) -> Result<Sealed, StoreError> {
    let seq = head.last_seq + 1;
    head.check(&ev.payload, seq)?;
    let hash = event_hash(
        seq,
        &head.head_hash,
        time,
        ev.trace_id.as_deref(),
        ev.parent_id.as_deref(),
        ev.idempotency_key.as_deref(),
        &ev.payload,
    );
    let stored = StoredEvent {
        seq,
        prev_hash: head.head_hash.clone(),
        hash,
        time: time.to_string(),
        trace_id: ev.trace_id,
        parent_id: ev.parent_id,
        idempotency_key: ev.idempotency_key,
        payload: ev.payload,
    };
    let mut line = serde_json::to_vec(&stored)
        .map_err(|e| StoreError::InvalidArgument(format!("payload: {e}")))?;
    if line.len() + 1 > MAX_EVENT_BYTES {
        return Err(StoreError::InvalidArgument(format!(
            "event is {} bytes serialised, the limit is {MAX_EVENT_BYTES}",
            line.len() + 1
        )));
    }
    line.push(b'\n');
    head.apply(&stored);
    Ok(Sealed { ev: stored, line })
}

/// Checks one stored event against its expected position, the schema, the thread it must belong
/// to and (keyed mode) its seal; the reason names what is wrong.
pub fn check_event(
    ev: &StoredEvent,
    expected_seq: u64,
    prev_hash: &str,
    ctx: ChainCtx<'_>,
) -> Result<(), String> {
    if ev.seq != expected_seq {
        return Err(format!("seq is {}, expected {expected_seq}", ev.seq));
    }
    if ev.prev_hash != prev_hash {
        return Err(format!(
            "prevHash {} does not match the hash of seq {}",
            ev.prev_hash,
            expected_seq - 1
        ));
    }
    if !is_chain_hash(&ev.hash) {
        return Err("hash is not 64 lowercase hex digits".into());
    }
    if ev.compute_hash() != ev.hash {
        return Err("hash does not match the event's content".into());
    }
    validate_stored_event(ev)?;
    match ev.kind() {
        "threadStarted" if ev.seq != 1 => {
            return Err("a threadStarted header in the middle of the log".into())
        }
        "threadStarted" => {
            let named = ev.payload.get("threadId").and_then(Value::as_str);
            if named != Some(ctx.thread_id) {
                return Err(format!(
                    "the header names thread {:?}, but this is the log of {:?}: it is another \
                     thread's history (copied or swapped); move it back under its own id or remove it",
                    named.unwrap_or(""),
                    ctx.thread_id
                ));
            }
        }
        _ if ev.seq == 1 => return Err("seq 1 is not a threadStarted header".into()),
        "sealed" => check_seal(ev, ctx)?,
        _ => {}
    }
    Ok(())
}

/// A `sealed` event must name the event before it; with a key its MAC must verify.
fn check_seal(ev: &StoredEvent, ctx: ChainCtx<'_>) -> Result<(), String> {
    let p = &ev.payload;
    let sealed_seq = p.get("sealedSeq").and_then(Value::as_u64);
    let sealed_hash = p.get("sealedHash").and_then(Value::as_str);
    if sealed_seq != Some(ev.seq - 1) || sealed_hash != Some(ev.prev_hash.as_str()) {
        return Err("the seal does not name the event before it".into());
    }
    let Some(key) = ctx.key else { return Ok(()) };
    let key_id = p.get("keyId").and_then(Value::as_str).unwrap_or("");
    if key_id != key.key_id() {
        return Err(format!(
            "the seal was made with another rollout key (keyId {key_id}); open the store with the key it was written with"
        ));
    }
    let mac = p.get("mac").and_then(Value::as_str).unwrap_or("");
    if !super::keyed::mac_eq(mac, &key.seal_mac(ctx.thread_id, ev.seq - 1, &ev.prev_hash)) {
        return Err(
            "the seal's MAC does not verify under the rollout key: the history before it was rewritten or the seal forged"
                .into(),
        );
    }
    Ok(())
}

/// Parses and checks one line (without its '\n').
pub fn parse_line(
    line: &[u8],
    expected_seq: u64,
    prev_hash: &str,
    ctx: ChainCtx<'_>,
) -> Result<StoredEvent, String> {
    let ev: StoredEvent =
        serde_json::from_slice(line).map_err(|e| format!("not a valid event line ({e})"))?;
    check_event(&ev, expected_seq, prev_hash, ctx)?;
    Ok(ev)
}

/// Whether a commit that took the thread from `before` to `after` events crossed a multiple of
/// `every` (keyed mode then appends a seal).
pub fn crosses_seal_point(before: u64, after: u64, every: u64) -> bool {
    after / every > before / every
}

/// The payload of a seal of the event (`seq`, `hash`).
pub fn seal_payload(key: &RolloutKey, thread_id: &str, seq: u64, hash: &str) -> Value {
    serde_json::json!({
        "type": "sealed",
        "sealedSeq": seq,
        "sealedHash": hash,
        "keyId": key.key_id(),
        "mac": key.seal_mac(thread_id, seq, hash),
    })
}

/// Something a backend's `load` had to do or accept (a torn tail cut, unauthenticated events
/// quarantined, an anchor slot fallen back on, an unanchored thread accepted): recorded in the
/// log as a `repaired` event so the evidence outlives this process.
#[derive(Debug, Clone)]
pub struct Repair {
    pub reason: String,
    pub truncated_bytes: u64,
    pub broken_file: Option<String>,
}

/// A thread as a backend found it on disk.
pub struct Loaded<Tx> {
    pub head: Head,
    pub tx: Tx,
    pub repairs: Vec<Repair>,
    /// What opening did, for `VerifyReport::repairs`.
    pub notes: Vec<String>,
    /// What limits the proof, for `VerifyReport::warnings`.
    pub warnings: Vec<String>,
    /// Set when the thread may be read but not written (a keyed thread opened without its key).
    pub read_only: Option<String>,
}

/// One thread's share of a commit round.
pub struct WriteSet<'a, Tx> {
    pub id: &'a str,
    pub create: bool,
    pub events: &'a [Sealed],
    pub head: &'a Head,
    pub tx: &'a mut Tx,
}

/// How bytes reach the disk. Every method is called with the thread's slot locked, so a backend
/// never sees two calls for the same thread at once; `write` is only called by the commit leader.
pub trait Backend: Send + Sync + 'static {
    /// Per-thread state the backend keeps (offsets, lengths).
    type Tx: Send + 'static;
    fn load(&self, id: &str) -> Result<Option<Loaded<Self::Tx>>, StoreError>;
    fn new_tx(&self) -> Self::Tx;
    /// Writes every set; `durable` means fdatasync before returning. A failed set leaves nothing
    /// behind. Returns one result per set.
    fn write(
        &self,
        sets: &mut [WriteSet<'_, Self::Tx>],
        durable: bool,
    ) -> Vec<Result<(), StoreError>>;
    /// Records `head` (already durable) as the thread's anchor; `durable` makes the anchor
    /// itself durable before returning (keyed Sync mode: an acknowledged event is never left
    /// outside what the key vouches for).
    fn anchor(
        &self,
        id: &str,
        tx: &mut Self::Tx,
        head: &Head,
        durable: bool,
    ) -> Result<(), StoreError>;
    /// Makes every earlier write and anchor durable.
    fn sync(&self) -> Result<(), StoreError>;
    /// Events `after+1 ..= after+n` of those written (all of them have seq <= `written`).
    fn read(
        &self,
        id: &str,
        tx: &mut Self::Tx,
        written: u64,
        after: u64,
        n: usize,
    ) -> Result<Vec<StoredEvent>, StoreError>;
    fn turn_completed(
        &self,
        id: &str,
        tx: &mut Self::Tx,
        turn_id: &str,
    ) -> Result<Option<StoredEvent>, StoreError>;
    /// Full check of the written chain against `written` (seq, hash).
    fn verify(
        &self,
        id: &str,
        tx: &mut Self::Tx,
        written: (u64, &str),
    ) -> Result<VerifyReport, StoreError>;
    /// Up to `n` thread ids greater than `after`, ascending: every id the disk holds any
    /// evidence of (a log, an anchor, a row), whether or not it opens.
    fn ids_after(&self, after: Option<&str>, n: usize) -> Result<Vec<String>, StoreError>;
    /// Entries that cannot belong to any thread: (name, reason).
    fn strays(&self) -> Result<Vec<(String, String)>, StoreError>;
}

struct Live<Tx> {
    head: Head,
    written_seq: u64,
    written_hash: String,
    /// Ephemeral events not yet handed to the backend (seq > written_seq).
    mem: Vec<Sealed>,
    persisted: bool,
    needs_anchor: bool,
    tx: Tx,
    repairs: Vec<String>,
    warnings: Vec<String>,
    read_only: Option<String>,
}

impl<Tx> Live<Tx> {
    fn fresh(head: Head, tx: Tx, mem: Vec<Sealed>) -> Self {
        Live {
            head,
            written_seq: 0,
            written_hash: ZERO_HASH.into(),
            mem,
            persisted: false,
            needs_anchor: false,
            tx,
            repairs: Vec::new(),
            warnings: Vec::new(),
            read_only: None,
        }
    }
}

type SlotRef<Tx> = Arc<Mutex<Slot<Tx>>>;

struct Slot<Tx> {
    loaded: bool,
    live: Option<Live<Tx>>,
}

struct Request {
    id: String,
    create: bool,
    events: Vec<NewEvent>,
}

type Outcome = Result<Vec<StoredEvent>, StoreError>;

#[derive(Default)]
struct Queue {
    pending: VecDeque<(u64, Request)>,
    done: HashMap<u64, Outcome>,
    leader: bool,
    next_ticket: u64,
}

/// A rollout store over a backend.
pub struct Engine<B: Backend> {
    backend: B,
    options: StoreOptions,
    slots: Mutex<HashMap<String, SlotRef<B::Tx>>>,
    /// Threads known to exist, checked without the slot lock: the commit leader holds slot locks
    /// through its fdatasync, and callers must still be able to queue behind it meanwhile, or
    /// group commit would never group.
    ready: Mutex<std::collections::HashSet<String>>,
    /// Ephemeral threads not yet in the backend, so `list` still sees them.
    unpersisted: Mutex<BTreeSet<String>>,
    queue: Mutex<Queue>,
    wake: Condvar,
    closed: AtomicBool,
    _lock: super::fsutil::DirLock,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking thread must not take the whole store down with it; the state it guarded is
    // only ever updated after the I/O it describes succeeded.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<B: Backend> Engine<B> {
    pub(crate) fn new(
        backend: B,
        lock_file: super::fsutil::DirLock,
        options: StoreOptions,
    ) -> Result<Self, StoreError> {
        if options.format_version == 0 {
            return Err(StoreError::InvalidArgument(
                "format_version must be at least 1".into(),
            ));
        }
        Ok(Engine {
            backend,
            options,
            slots: Mutex::new(HashMap::new()),
            ready: Mutex::new(std::collections::HashSet::new()),
            unpersisted: Mutex::new(BTreeSet::new()),
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            closed: AtomicBool::new(false),
            _lock: lock_file,
        })
    }

    /// The backend (tests and tools reach its paths through it).
    pub fn backend(&self) -> &B {
        &self.backend
    }

    fn open_check(&self) -> Result<(), StoreError> {
        if self.closed.load(Ordering::Acquire) {
            Err(StoreError::Closed)
        } else {
            Ok(())
        }
    }

    fn slot_arc(&self, id: &str) -> SlotRef<B::Tx> {
        lock(&self.slots)
            .entry(id.to_string())
            .or_insert_with(|| {
                Arc::new(Mutex::new(Slot {
                    loaded: false,
                    live: None,
                }))
            })
            .clone()
    }

    /// The thread's slot, loaded from disk on first use (repairing a torn tail if needed).
    fn slot(&self, id: &str) -> Result<SlotRef<B::Tx>, StoreError> {
        validate_thread_id(id)?;
        self.open_check()?;
        let arc = self.slot_arc(id);
        if lock(&self.ready).contains(id) {
            return Ok(arc);
        }
        let repair: Vec<Repair> = {
            let mut g = lock(&arc);
            if g.loaded {
                if g.live.is_none() {
                    return Err(StoreError::NotFound(id.to_string()));
                }
                return Ok(arc.clone());
            }
            match self.backend.load(id)? {
                None => {
                    g.loaded = true;
                    return Err(StoreError::NotFound(id.to_string()));
                }
                Some(l) => {
                    g.live = Some(Live {
                        written_seq: l.head.last_seq,
                        written_hash: l.head.head_hash.clone(),
                        head: l.head,
                        mem: Vec::new(),
                        persisted: true,
                        needs_anchor: false,
                        tx: l.tx,
                        repairs: l.notes,
                        warnings: l.warnings,
                        read_only: l.read_only,
                    });
                    g.loaded = true;
                    lock(&self.ready).insert(id.to_string());
                    l.repairs
                }
            }
        };
        if !repair.is_empty() {
            // Recorded through the normal commit path, after the slot lock is released (the
            // leader needs it).
            let events = repair
                .into_iter()
                .map(|r| {
                    NewEvent::new(serde_json::json!({
                        "type": "repaired",
                        "reason": cap_chars(&r.reason, MAX_REASON_CHARS),
                        "truncatedBytes": r.truncated_bytes,
                        "brokenFile": r.broken_file,
                    }))
                })
                .collect();
            self.submit(Request {
                id: id.to_string(),
                create: false,
                events,
            })?;
        }
        Ok(arc)
    }

    fn with_live<T>(
        &self,
        id: &str,
        f: impl FnOnce(&mut Live<B::Tx>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let arc = self.slot(id)?;
        let mut g = lock(&arc);
        let live = g
            .live
            .as_mut()
            .ok_or_else(|| StoreError::NotFound(id.to_string()))?;
        f(live)
    }

    /// Queues a request and returns once a leader (possibly this caller) has committed it.
    fn submit(&self, req: Request) -> Outcome {
        let mut q = lock(&self.queue);
        let ticket = q.next_ticket;
        q.next_ticket += 1;
        q.pending.push_back((ticket, req));
        loop {
            if let Some(out) = q.done.remove(&ticket) {
                return out;
            }
            if !q.leader {
                q.leader = true;
                let n = q.pending.len().min(self.options.max_batch_requests.max(1));
                let round: Vec<(u64, Request)> = q.pending.drain(..n).collect();
                drop(q);
                let results = self.commit_round(round);
                q = lock(&self.queue);
                q.done.extend(results);
                q.leader = false;
                self.wake.notify_all();
                continue;
            }
            q = self.wake.wait(q).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Runs `f` as the only leader (no commit round runs meanwhile).
    fn exclusive<T>(&self, f: impl FnOnce() -> T) -> T {
        let mut q = lock(&self.queue);
        while q.leader {
            q = self.wake.wait(q).unwrap_or_else(|e| e.into_inner());
        }
        q.leader = true;
        drop(q);
        let out = f();
        let mut q = lock(&self.queue);
        q.leader = false;
        self.wake.notify_all();
        out
    }

    /// One group commit: seal every request in order, write each thread's bytes once, fdatasync
    /// once per thread (Sync), publish the new heads, then anchor them.
    fn commit_round(&self, round: Vec<(u64, Request)>) -> Vec<(u64, Outcome)> {
        let time = crate::time::now_rfc3339();
        let mut order: Vec<String> = Vec::new();
        let mut groups: HashMap<String, Vec<(u64, Request)>> = HashMap::new();
        for (t, r) in round {
            if !groups.contains_key(&r.id) {
                order.push(r.id.clone());
            }
            groups.entry(r.id.clone()).or_default().push((t, r));
        }
        let mut results: Vec<(u64, Outcome)> = Vec::new();
        struct Pending<'g, Tx> {
            id: String,
            guard: MutexGuard<'g, Slot<Tx>>,
            head: Head,
            create: bool,
            sealed: Vec<Sealed>,
            tickets: Vec<(u64, Vec<StoredEvent>)>,
        }
        let arcs: Vec<(String, SlotRef<B::Tx>)> = order
            .iter()
            .map(|id| (id.clone(), self.slot_arc(id)))
            .collect();
        let mut pend: Vec<Pending<'_, B::Tx>> = Vec::new();
        for (id, arc) in &arcs {
            let guard = lock(arc);
            let mut head = guard.live.as_ref().map(|l| l.head.clone());
            let start_seq = head.as_ref().map_or(0, |h| h.last_seq);
            let read_only = guard.live.as_ref().and_then(|l| l.read_only.clone());
            let mut create = false;
            let mut sealed = Vec::new();
            let mut tickets = Vec::new();
            for (ticket, req) in groups.remove(id).unwrap_or_default() {
                let mut h = head.clone();
                let mut out = Vec::with_capacity(req.events.len());
                let res = (|| {
                    if let Some(why) = &read_only {
                        return Err(StoreError::InvalidArgument(why.clone()));
                    }
                    let mut events = req.events.into_iter();
                    if req.create {
                        if h.is_some() || !guard.loaded && self.backend.load(id)?.is_some() {
                            return Err(StoreError::AlreadyExists(id.clone()));
                        }
                        let first = events
                            .next()
                            .ok_or_else(|| StoreError::InvalidArgument("empty create".into()))?;
                        let mut fresh = Head {
                            thread_id: id.clone(),
                            title: None,
                            metadata: Arc::default(),
                            created_at: time.clone(),
                            forked_from: None,
                            format_version: 1,
                            archived: false,
                            last_seq: 0,
                            head_hash: ZERO_HASH.to_string(),
                            updated_at: time.clone(),
                            compacted_through: 0,
                            last_compaction_seq: None,
                        };
                        let s = seal(&mut fresh, first, &time)?;
                        let mut built =
                            Head::from_header(&s.ev).map_err(StoreError::InvalidArgument)?;
                        built.apply(&s.ev);
                        out.push(s);
                        h = Some(built);
                    }
                    let hh = h.as_mut().ok_or_else(|| StoreError::NotFound(id.clone()))?;
                    for ev in events {
                        out.push(seal(hh, ev, &time)?);
                    }
                    Ok(())
                })();
                match res {
                    Ok(()) => {
                        create |= req.create;
                        head = h;
                        tickets.push((ticket, out.iter().map(|s| s.ev.clone()).collect()));
                        sealed.extend(out);
                    }
                    Err(e) => results.push((ticket, Err(e))),
                }
            }
            if let Some(mut head) = head {
                if let Some(key) = &self.options.key {
                    // Keyed mode: a seal follows the commit that crosses each multiple of
                    // seal_every, so the log alone vouches for its prefix. It belongs to no
                    // caller's batch.
                    if !sealed.is_empty()
                        && crosses_seal_point(start_seq, head.last_seq, self.options.seal_every)
                    {
                        let payload = seal_payload(key, id, head.last_seq, &head.head_hash);
                        if let Ok(s) = seal(&mut head, NewEvent::new(payload), &time) {
                            sealed.push(s);
                        }
                    }
                }
                if !sealed.is_empty() {
                    pend.push(Pending {
                        id: id.clone(),
                        guard,
                        head,
                        create,
                        sealed,
                        tickets,
                    });
                }
            }
        }
        if pend.is_empty() {
            return results;
        }
        let durability = self.options.durability;
        let outcomes: Vec<Result<(), StoreError>> = if durability == Durability::Ephemeral {
            pend.iter().map(|_| Ok(())).collect()
        } else {
            let mut sets: Vec<WriteSet<'_, B::Tx>> = Vec::with_capacity(pend.len());
            let mut fresh_txs: Vec<Option<B::Tx>> = pend
                .iter()
                .map(|p| {
                    if p.create {
                        Some(self.backend.new_tx())
                    } else {
                        None
                    }
                })
                .collect();
            let mut fresh_iter = fresh_txs.iter_mut();
            for p in pend.iter_mut() {
                let fresh = fresh_iter.next().expect("one per pending");
                let tx = match (p.guard.live.as_mut(), fresh.as_mut()) {
                    (_, Some(t)) => t,
                    (Some(l), None) => &mut l.tx,
                    (None, None) => unreachable!("an append to a missing thread was refused above"),
                };
                sets.push(WriteSet {
                    id: &p.id,
                    create: p.create,
                    events: &p.sealed,
                    head: &p.head,
                    tx,
                });
            }
            let out = self
                .backend
                .write(&mut sets, durability == Durability::Sync);
            drop(sets);
            for (p, fresh) in pend.iter_mut().zip(fresh_txs) {
                if let Some(tx) = fresh {
                    p.guard.live = Some(Live::fresh(p.head.clone(), tx, Vec::new()));
                    p.guard.loaded = true;
                }
            }
            out
        };
        for (mut p, outcome) in pend.into_iter().zip(outcomes) {
            match outcome {
                Err(e) => {
                    if p.create && durability != Durability::Ephemeral {
                        p.guard.live = None;
                    }
                    let msg = e.to_string();
                    let mut first = Some(e);
                    for (t, _) in p.tickets {
                        results.push((
                            t,
                            Err(first.take().unwrap_or_else(|| {
                                StoreError::Io(std::io::Error::other(msg.clone()))
                            })),
                        ));
                    }
                }
                Ok(()) => {
                    let g = &mut *p.guard;
                    g.loaded = true;
                    if durability == Durability::Ephemeral {
                        match g.live.as_mut() {
                            Some(l) if !p.create => {
                                l.head = p.head;
                                l.mem.extend(p.sealed);
                            }
                            _ => {
                                lock(&self.unpersisted).insert(p.id.clone());
                                g.live = Some(Live::fresh(p.head, self.backend.new_tx(), p.sealed));
                            }
                        }
                    } else {
                        let l = g.live.as_mut().expect("set above");
                        l.head = p.head;
                        l.written_seq = l.head.last_seq;
                        l.written_hash = l.head.head_hash.clone();
                        l.persisted = true;
                        if durability == Durability::Sync {
                            // The log is durable: the anchor may now move up to it. Unkeyed, a
                            // failed anchor write is retried at flush (the events are safe, the
                            // anchor may lag). Keyed, the anchor is what vouches for the events
                            // after a crash, so it is made durable before the acknowledgement,
                            // and a failure is the callers' failure.
                            let keyed = self.options.key.is_some();
                            match self.backend.anchor(&p.id, &mut l.tx, &l.head, keyed) {
                                Ok(()) => l.needs_anchor = false,
                                Err(e) if keyed => {
                                    l.needs_anchor = true;
                                    lock(&self.ready).insert(p.id.clone());
                                    let msg = format!(
                                        "the events were written but the keyed anchor could not be made durable ({e}); they are not acknowledged"
                                    );
                                    results.extend(p.tickets.into_iter().map(|(t, _)| {
                                        (t, Err(StoreError::Io(std::io::Error::other(msg.clone()))))
                                    }));
                                    continue;
                                }
                                Err(_) => l.needs_anchor = true,
                            }
                        } else {
                            l.needs_anchor = true;
                        }
                    }
                    lock(&self.ready).insert(p.id.clone());
                    results.extend(p.tickets.into_iter().map(|(t, evs)| (t, Ok(evs))));
                }
            }
        }
        results
    }

    fn append_internal(&self, id: &str, events: Vec<NewEvent>) -> Outcome {
        self.slot(id)?;
        self.submit(Request {
            id: id.to_string(),
            create: false,
            events,
        })
    }

    fn append_one(&self, id: &str, payload: Value) -> Result<StoredEvent, StoreError> {
        let mut v = self.append_internal(id, vec![NewEvent::new(payload)])?;
        Ok(v.pop().expect("one event in, one out"))
    }

    fn create(
        &self,
        start: ThreadStart,
        recorded: HeaderExtra,
        extra: Vec<NewEvent>,
    ) -> Result<(ThreadSummary, StoredEvent), StoreError> {
        validate_thread_id(&start.thread_id)?;
        if let Some(k) = &recorded.idempotency_key {
            validate_thread_id(k)?;
        }
        if let Some(f) = &start.forked_from {
            validate_thread_id(&f.thread_id)?;
            if !is_chain_hash(&f.event_hash) {
                return Err(StoreError::InvalidArgument(
                    "forkedFrom.eventHash must be 64 lowercase hex digits".into(),
                ));
            }
        }
        check_title(&start.title)?;
        check_metadata(&start.metadata)?;
        self.open_check()?;
        match self.slot(&start.thread_id) {
            Ok(_) => return Err(StoreError::AlreadyExists(start.thread_id)),
            Err(StoreError::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
        let mut header = NewEvent::new(header_payload(&start, self.options.format_version));
        if let Some(options) = recorded.agent_options {
            header.payload["agentOptions"] = options;
        }
        header.idempotency_key = recorded.idempotency_key;
        cc_agent_protocol::validate_protocol_definition("EventPayload", &header.payload).map_err(
            |e| {
                StoreError::InvalidArgument(format!(
                    "the thread header does not match the schema: {}",
                    cap_chars(&e.to_string(), 300)
                ))
            },
        )?;
        let mut events = vec![header];
        events.extend(extra);
        let out = self.submit(Request {
            id: start.thread_id.clone(),
            create: true,
            events,
        })?;
        let header = out.into_iter().next().expect("header sealed");
        Ok((self.summary(&start.thread_id)?, header))
    }

    /// Events after `after` up to `n` (no clamp), from the backend then memory.
    fn read_range(&self, id: &str, after: u64, n: usize) -> Result<ReadPage, StoreError> {
        self.with_live(id, |l| {
            let last = l.head.last_seq;
            if after >= last || n == 0 {
                return Ok(ReadPage {
                    events: Vec::new(),
                    has_more: false,
                });
            }
            let end = last.min(after.saturating_add(n as u64));
            let mut events = Vec::with_capacity((end - after) as usize);
            if after < l.written_seq {
                let upto = end.min(l.written_seq);
                events = self.backend.read(
                    id,
                    &mut l.tx,
                    l.written_seq,
                    after,
                    (upto - after) as usize,
                )?;
            }
            events.extend(
                l.mem
                    .iter()
                    .filter(|s| s.ev.seq > after && s.ev.seq <= end)
                    .map(|s| s.ev.clone()),
            );
            Ok(ReadPage {
                events,
                has_more: end < last,
            })
        })
    }

    fn event_at(&self, id: &str, seq: u64) -> Result<StoredEvent, StoreError> {
        let mut page = self.read_range(id, seq - 1, 1)?;
        page.events
            .pop()
            .ok_or_else(|| StoreError::InvalidArgument(format!("thread {id:?} has no seq {seq}")))
    }

    /// Writes Ephemeral events, syncs Buffered writes, then moves every anchor up.
    fn flush_inner(&self) -> Result<(), StoreError> {
        let arcs: Vec<(String, SlotRef<B::Tx>)> = lock(&self.slots)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut first_err: Option<StoreError> = None;
        for (id, arc) in &arcs {
            let mut g = lock(arc);
            let Some(l) = g.live.as_mut() else { continue };
            if l.mem.is_empty() {
                continue;
            }
            let mem = std::mem::take(&mut l.mem);
            let head = l.head.clone();
            let mut sets = [WriteSet {
                id,
                create: !l.persisted,
                events: &mem,
                head: &head,
                tx: &mut l.tx,
            }];
            match self.backend.write(&mut sets, true).pop().expect("one set") {
                Ok(()) => {
                    l.written_seq = head.last_seq;
                    l.written_hash = head.head_hash.clone();
                    l.persisted = true;
                    l.needs_anchor = true;
                    lock(&self.unpersisted).remove(id);
                }
                Err(e) => {
                    l.mem = mem;
                    first_err.get_or_insert(e);
                }
            }
        }
        self.backend.sync()?;
        for (id, arc) in &arcs {
            let mut g = lock(arc);
            let Some(l) = g.live.as_mut() else { continue };
            if l.needs_anchor && l.mem.is_empty() {
                let head = l.head.clone();
                match self.backend.anchor(id, &mut l.tx, &head, false) {
                    Ok(()) => l.needs_anchor = false,
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
        }
        self.backend.sync()?;
        first_err.map_or(Ok(()), Err)
    }
}

impl<B: Backend> Drop for Engine<B> {
    fn drop(&mut self) {
        if !self.closed.load(Ordering::Acquire) {
            let _ = self.exclusive(|| self.flush_inner());
        }
    }
}

impl<B: Backend> RolloutStore for Engine<B> {
    fn start(&self, start: ThreadStart) -> Result<(ThreadSummary, StoredEvent), StoreError> {
        self.create(start, HeaderExtra::default(), Vec::new())
    }

    fn start_recorded(
        &self,
        start: ThreadStart,
        recorded: HeaderExtra,
    ) -> Result<(ThreadSummary, StoredEvent), StoreError> {
        self.create(start, recorded, Vec::new())
    }

    fn append(
        &self,
        thread_id: &str,
        events: Vec<NewEvent>,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        validate_thread_id(thread_id)?;
        if events.len() > MAX_BATCH_EVENTS {
            return Err(StoreError::InvalidArgument(format!(
                "{} events in one append, the limit is {MAX_BATCH_EVENTS}",
                events.len()
            )));
        }
        for ev in &events {
            validate_new_event(ev)?;
        }
        if events.is_empty() {
            self.slot(thread_id)?;
            return Ok(Vec::new());
        }
        self.append_internal(thread_id, events)
    }

    fn read(&self, thread_id: &str, after_seq: u64, limit: usize) -> Result<ReadPage, StoreError> {
        validate_thread_id(thread_id)?;
        if limit == 0 {
            return Err(StoreError::InvalidArgument(
                "read limit must be at least 1".into(),
            ));
        }
        self.read_range(thread_id, after_seq, limit.min(MAX_READ_LIMIT))
    }

    fn summary(&self, thread_id: &str) -> Result<ThreadSummary, StoreError> {
        self.with_live(thread_id, |l| Ok(l.head.summary()))
    }

    fn list(&self, query: &ListQuery) -> Result<ListPage, StoreError> {
        self.open_check()?;
        if query.limit == 0 {
            return Err(StoreError::InvalidArgument(
                "list limit must be at least 1".into(),
            ));
        }
        let limit = query.limit.min(MAX_LIST_LIMIT);
        if let Some(c) = &query.cursor {
            validate_thread_id(c)
                .map_err(|_| StoreError::InvalidArgument(format!("invalid list cursor {c:?}")))?;
        }
        let mut after = query.cursor.clone();
        let mut out: Vec<ThreadSummary> = Vec::with_capacity(limit + 1);
        let mut unreadable = Vec::new();
        'outer: loop {
            let chunk = (limit + 1).max(64);
            let mut ids = self.backend.ids_after(after.as_deref(), chunk)?;
            {
                let un = lock(&self.unpersisted);
                let range: Box<dyn Iterator<Item = &String>> = match &after {
                    Some(a) => Box::new(un.range::<String, _>((
                        std::ops::Bound::Excluded(a),
                        std::ops::Bound::Unbounded,
                    ))),
                    None => Box::new(un.iter()),
                };
                ids.extend(range.take(chunk).cloned());
            }
            ids.sort();
            ids.dedup();
            ids.truncate(chunk);
            if ids.is_empty() {
                break;
            }
            for id in ids {
                after = Some(id.clone());
                match self.summary(&id) {
                    Ok(s) if s.archived && !query.include_archived => continue,
                    Ok(s) => out.push(s),
                    // Evidence that turned out to be nothing (an anchor left by a start that
                    // never completed, cleaned up on load).
                    Err(StoreError::NotFound(_)) => continue,
                    Err(StoreError::Closed) => return Err(StoreError::Closed),
                    Err(e) => unreadable.push((id, cap_chars(&e.to_string(), 1000))),
                }
                if out.len() + unreadable.len() > limit {
                    break 'outer;
                }
            }
        }
        // One entry too many was taken to learn whether another page exists; drop it (whichever
        // list it went to) and resume after the last entry kept.
        let next_cursor = if out.len() + unreadable.len() > limit {
            let last_out = out.last().map(|s| s.thread_id.clone());
            let last_bad = unreadable.last().map(|(id, _)| id.clone());
            if last_out > last_bad {
                out.pop();
            } else {
                unreadable.pop();
            }
            let a = out.last().map(|s| s.thread_id.clone());
            let b = unreadable.last().map(|(id, _)| id.clone());
            a.max(b)
        } else {
            None
        };
        Ok(ListPage {
            threads: out,
            next_cursor,
            unreadable,
        })
    }

    fn checkpoint(&self, thread_id: &str, label: &str) -> Result<StoredEvent, StoreError> {
        if label.chars().count() > MAX_LABEL_CHARS {
            return Err(StoreError::InvalidArgument(format!(
                "checkpoint label is longer than {MAX_LABEL_CHARS} characters"
            )));
        }
        self.append_one(
            thread_id,
            serde_json::json!({"type": "checkpoint", "label": label}),
        )
    }

    fn compact(
        &self,
        thread_id: &str,
        summary: &str,
        through_seq: u64,
    ) -> Result<StoredEvent, StoreError> {
        if summary.is_empty() {
            return Err(StoreError::InvalidArgument(
                "a compaction needs a non-empty summary".into(),
            ));
        }
        if summary.chars().count() > MAX_SUMMARY_CHARS {
            return Err(StoreError::InvalidArgument(format!(
                "compaction summary is longer than {MAX_SUMMARY_CHARS} characters"
            )));
        }
        let head = self.summary(thread_id)?;
        if through_seq <= head.compacted_through || through_seq > head.last_seq {
            return Err(StoreError::InvalidArgument(format!(
                "through_seq {through_seq} must be in {}..={}",
                head.compacted_through + 1,
                head.last_seq
            )));
        }
        let to = self.event_at(thread_id, through_seq)?;
        self.append_one(
            thread_id,
            serde_json::json!({
                "type": "compacted",
                "summary": summary,
                "fromSeq": head.compacted_through + 1,
                "toSeq": through_seq,
                "toHash": to.hash,
            }),
        )
    }

    fn fork(
        &self,
        source: &str,
        at_seq: Option<u64>,
        new_thread_id: &str,
        title: Option<String>,
    ) -> Result<(ThreadSummary, StoredEvent), StoreError> {
        validate_thread_id(new_thread_id)?;
        let src = self.summary(source)?;
        let at = at_seq.unwrap_or(src.last_seq);
        if at == 0 || at > src.last_seq {
            return Err(StoreError::InvalidArgument(format!(
                "fork point {at} must be in 1..={}",
                src.last_seq
            )));
        }
        // The copies get new seqs in the fork's chain; `map[s]` is the fork seq holding the
        // source's seq `s` (or the last copy before it), so copied compactions still point at
        // the right events.
        let mut map: Vec<u64> = vec![0, 1];
        let mut copies: Vec<NewEvent> = Vec::new();
        let mut hashes_needed: Vec<(usize, u64)> = Vec::new();
        let mut after = 1;
        let mut origin_hash = src.head_hash.clone();
        if at == 1 {
            origin_hash = self.event_at(source, 1)?.hash;
        }
        while after < at {
            let page = self.read_range(
                source,
                after,
                (at - after).min(MAX_READ_LIMIT as u64) as usize,
            )?;
            if page.events.is_empty() {
                break;
            }
            for ev in page.events {
                after = ev.seq;
                if ev.seq == at {
                    origin_hash = ev.hash.clone();
                }
                // Archiving is not inherited; a seal vouches for the source's chain only.
                if matches!(ev.kind(), "threadArchived" | "sealed") {
                    map.push(*map.last().expect("non-empty"));
                    continue;
                }
                let mut payload = ev.payload;
                if payload.get("type").and_then(Value::as_str) == Some("compacted") {
                    let f = payload.get("fromSeq").and_then(Value::as_u64).unwrap_or(1) as usize;
                    let t = payload.get("toSeq").and_then(Value::as_u64).unwrap_or(1) as usize;
                    let nf = if f <= 1 {
                        1
                    } else {
                        map.get(f - 1).copied().unwrap_or(0) + 1
                    };
                    let nt = map.get(t).copied().unwrap_or(1);
                    payload["fromSeq"] = Value::from(nf.min(nt));
                    payload["toSeq"] = Value::from(nt);
                    hashes_needed.push((copies.len(), nt));
                }
                copies.push(NewEvent {
                    payload,
                    trace_id: ev.trace_id,
                    parent_id: ev.parent_id,
                    idempotency_key: ev.idempotency_key,
                });
                map.push(copies.len() as u64 + 1);
            }
        }
        let start = ThreadStart {
            thread_id: new_thread_id.to_string(),
            title: title.or(src.title.clone()),
            metadata: src.metadata.clone(),
            forked_from: Some(ForkOrigin {
                thread_id: source.to_string(),
                event_seq: at,
                event_hash: origin_hash,
            }),
        };
        // The host's agentOptions travel with the thread into its forks.
        let recorded = HeaderExtra {
            agent_options: self
                .event_at(source, 1)?
                .payload
                .get("agentOptions")
                .cloned(),
            idempotency_key: None,
        };
        if hashes_needed.is_empty() {
            return self.create(start, recorded, copies);
        }
        // A copied compaction's toHash is the fork's own hash at the mapped seq, known only once
        // that prefix is sealed: commit up to each compaction, then fill it in.
        let (_, header) = self.create(start, recorded, Vec::new())?;
        let mut chunk = Vec::new();
        for (i, mut ev) in copies.into_iter().enumerate() {
            if let Some(&(_, nt)) = hashes_needed.iter().find(|(ci, _)| *ci == i) {
                if !chunk.is_empty() {
                    self.append_internal(new_thread_id, std::mem::take(&mut chunk))?;
                }
                ev.payload["toHash"] = Value::from(self.event_at(new_thread_id, nt)?.hash);
            }
            chunk.push(ev);
        }
        if !chunk.is_empty() {
            self.append_internal(new_thread_id, chunk)?;
        }
        Ok((self.summary(new_thread_id)?, header))
    }

    fn set_archived(&self, thread_id: &str, archived: bool) -> Result<StoredEvent, StoreError> {
        self.append_one(
            thread_id,
            serde_json::json!({"type": "threadArchived", "archived": archived}),
        )
    }

    fn migrate(&self, thread_id: &str) -> Result<Option<StoredEvent>, StoreError> {
        let head = self.summary(thread_id)?;
        let target = self.options.format_version;
        if head.format_version >= target {
            return Ok(None);
        }
        let ev = self.append_one(
            thread_id,
            serde_json::json!({"type": "migrated", "fromFormat": head.format_version, "toFormat": target}),
        )?;
        Ok(Some(ev))
    }

    fn terminal_evidence(
        &self,
        thread_id: &str,
        turn_id: &str,
    ) -> Result<Option<StoredEvent>, StoreError> {
        self.with_live(thread_id, |l| {
            if l.written_seq > 0 {
                if let Some(ev) = self.backend.turn_completed(thread_id, &mut l.tx, turn_id)? {
                    return Ok(Some(ev));
                }
            }
            Ok(l.mem
                .iter()
                .find(|s| {
                    s.ev.kind() == "turnCompleted"
                        && s.ev.payload.get("turnId").and_then(Value::as_str) == Some(turn_id)
                })
                .map(|s| s.ev.clone()))
        })
    }

    fn verify(&self, thread_id: &str) -> Result<VerifyReport, StoreError> {
        let ctx = ChainCtx {
            thread_id,
            key: self.options.key.as_ref(),
        };
        self.with_live(thread_id, |l| {
            let mut report = if l.written_seq > 0 {
                self.backend
                    .verify(thread_id, &mut l.tx, (l.written_seq, &l.written_hash))?
            } else {
                VerifyReport {
                    thread_id: thread_id.to_string(),
                    events: 0,
                    head_seq: 0,
                    head_hash: ZERO_HASH.into(),
                    first_bad_seq: None,
                    reason: None,
                    repairs: Vec::new(),
                    warnings: Vec::new(),
                    keyed: self.options.key.is_some(),
                    authenticated_through: self.options.key.as_ref().map(|_| 0),
                }
            };
            if report.ok() {
                let mut prev = l.written_hash.clone();
                for s in &l.mem {
                    if let Err(r) = check_event(&s.ev, report.events + 1, &prev, ctx) {
                        report.first_bad_seq = Some(s.ev.seq);
                        report.reason = Some(r);
                        break;
                    }
                    prev.clone_from(&s.ev.hash);
                    report.events += 1;
                }
            }
            if let Some(through) = report.authenticated_through {
                if report.ok() && through < l.head.last_seq {
                    // Written by this process since the anchor last moved (Buffered/Ephemeral
                    // until flush); anchored at flush/close. Said, not failed.
                    report.warnings.push(format!(
                        "seqs {}..={} were written by this process since the anchor last moved; they are authenticated at the next flush or close",
                        through + 1,
                        l.head.last_seq
                    ));
                }
            }
            report.head_seq = l.head.last_seq;
            report.head_hash = l.head.head_hash.clone();
            report.repairs = l.repairs.clone();
            let mut warnings = l.warnings.clone();
            for w in report.warnings.drain(..) {
                if !warnings.contains(&w) {
                    warnings.push(w);
                }
            }
            report.warnings = warnings;
            Ok(report)
        })
    }

    fn stray_entries(&self) -> Result<Vec<(String, String)>, StoreError> {
        self.open_check()?;
        self.backend.strays()
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.open_check()?;
        self.exclusive(|| self.flush_inner())
    }

    fn close(&self) -> Result<(), StoreError> {
        self.open_check()?;
        let r = self.exclusive(|| self.flush_inner());
        self.closed.store(true, Ordering::Release);
        r
    }
}
