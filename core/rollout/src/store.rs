//! The store logic shared by every backend: per-thread head state, sealing (seq, prevHash, hash,
//! time), group commit and durability policy, so JSONL and SQLite differ only in how bytes reach
//! the disk and cannot drift apart in semantics.
//!
//! Reads are served from memory where they can be: a summary index of every thread in the state
//! directory (built when the store opens, kept in step with every commit; the directory's lock
//! means no other process writes it meanwhile), and a bounded tail cache of recent events. Loaded
//! thread slots are bounded too, least recently used first out.

use super::cache::{CacheLimits, TailCache};
use super::encode::{push_u64, EncodedPayload};
use super::*;
use crate::sync::lock;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::ops::Bound;
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
    /// The `idempotencyKey` of the request that created the thread (the header's), so a
    /// retried thread/start finds its thread without reading any history.
    pub start_key: Option<String>,
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
            start_key: ev.idempotency_key.clone(),
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
            start_key: None,
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

    /// A borrowed view for `list_with`.
    pub fn view(&self) -> SummaryRef<'_> {
        SummaryRef {
            thread_id: &self.thread_id,
            title: self.title.as_deref(),
            metadata: &self.metadata,
            created_at: &self.created_at,
            updated_at: &self.updated_at,
            archived: self.archived,
            last_seq: self.last_seq,
            forked_from: self.forked_from.as_ref(),
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

/// A payload of a kind that no head, index or backend looks into beyond its line (so its parsed
/// form may be let go once encoded): deltas, item and tool events, status changes. A payload
/// let go is `null`, which `kind` reads as "" — none of the kinds anything looks for.
pub(crate) fn is_hot_kind(payload: &Value) -> bool {
    matches!(
        payload.get("type").and_then(Value::as_str),
        Some(
            "itemDelta"
                | "itemStarted"
                | "itemCompleted"
                | "toolRequested"
                | "toolResult"
                | "turnStatusChanged"
        )
    )
}

/// An event with its serialised line (the JSON text, without the '\n'), ready for any backend,
/// the tail cache and the caller: serialised once, shared.
#[derive(Debug, Clone)]
pub struct Sealed {
    pub ev: StoredEvent,
    pub line: Arc<str>,
}

impl Sealed {
    /// An event read back from disk, with its line as found.
    pub fn read(ev: StoredEvent, line: Arc<str>) -> Sealed {
        Sealed { ev, line }
    }

    /// For Ephemeral memory: the parsed payload of a kind only readers look at is let go (its
    /// line keeps it; `event` parses it back), so events waiting for a flush cost their line
    /// and envelope, not a tree of a dozen allocations each. Kinds a backend, an index or a
    /// head looks into (headers, turn ends, compactions, …) keep theirs.
    fn slim(mut self) -> Sealed {
        if is_hot_kind(&self.ev.payload) {
            self.ev.payload = Value::Null;
        }
        self
    }

    /// The whole event (a slimmed one parsed back from its line).
    pub fn event(&self) -> StoredEvent {
        if self.ev.payload.is_null() {
            parse_cached(&self.line)
        } else {
            self.ev.clone()
        }
    }

    /// An event whose line must be made (the SQLite store keeps columns, not lines).
    pub fn from_event(ev: StoredEvent) -> Sealed {
        let line: Arc<str> =
            Arc::from(serde_json::to_string(&ev).expect("a StoredEvent always serialises"));
        Sealed { ev, line }
    }
}

/// Where the payload's JSON sits in an event line: every line is the envelope in schema order
/// with `payload` last, and `,"payload":` cannot occur inside an envelope string (its quote
/// would be escaped), so the first occurrence is the member itself.
pub fn payload_range(line: &str) -> std::ops::Range<usize> {
    const KEY: &[u8] = b",\"payload\":";
    // One finder for the process: `str::find` set up a two-way searcher on every call.
    static FINDER: std::sync::OnceLock<memchr::memmem::Finder<'static>> =
        std::sync::OnceLock::new();
    let finder = FINDER.get_or_init(|| memchr::memmem::Finder::new(KEY));
    match finder.find(line.as_bytes()) {
        Some(i) if line.ends_with('}') => i + KEY.len()..line.len() - 1,
        _ => 0..0,
    }
}

/// Writes a JSON string (serde's escaping, which RFC 8785 shares for strings).
fn push_json_str(out: &mut String, s: &str) {
    super::encode::write_string(s, out);
}

fn push_json_opt(out: &mut String, s: Option<&str>) {
    match s {
        Some(s) => push_json_str(out, s),
        None => out.push_str("null"),
    }
}

/// The RFC 8785 form of the sealed event (every member but `hash`, keys in order): what the
/// hash covers.
fn jcs_input(
    jcs: &mut String,
    head: &Head,
    ev: &NewEvent,
    payload: &EncodedPayload,
    seq: u64,
    time: &str,
) {
    jcs.push_str("{\"idempotencyKey\":");
    push_json_opt(jcs, ev.idempotency_key.as_deref());
    jcs.push_str(",\"parentId\":");
    push_json_opt(jcs, ev.parent_id.as_deref());
    jcs.push_str(",\"payload\":");
    payload.write_jcs(jcs);
    jcs.push_str(",\"prevHash\":");
    push_json_str(jcs, &head.head_hash);
    jcs.push_str(",\"seq\":");
    push_u64(jcs, seq);
    jcs.push_str(",\"time\":");
    push_json_str(jcs, time);
    jcs.push_str(",\"traceId\":");
    push_json_opt(jcs, ev.trace_id.as_deref());
    jcs.push('}');
}

/// Gives `ev` its seq, prevHash, time and hash on top of `head`, and advances `head`. The
/// payload is serialised once (its JCS members), and that text makes both the hash input and
/// the line.
fn seal(head: &mut Head, ev: Prepared, time: &str) -> Result<Sealed, StoreError> {
    let (ev, payload) = match ev {
        Prepared::Raw(ev) => {
            let encoded = EncodedPayload::new(&ev.payload);
            (ev, encoded)
        }
        Prepared::Encoded(ev, encoded) => (ev, encoded),
    };
    let seq = head.last_seq + 1;
    head.check(&ev.payload, seq)?;
    // The hash input is only hashed: one buffer per sealing thread, reused, not one per event.
    thread_local! {
        static JCS: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
    }
    let hash = JCS.with(|cell| {
        let mut jcs = cell.borrow_mut();
        jcs.clear();
        jcs_input(&mut jcs, head, &ev, &payload, seq, time);
        let hash = cc_agent_protocol::sha256_hex(jcs.as_bytes());
        if jcs.capacity() > 1 << 20 {
            // A rare huge event does not pin its buffer for the thread's life.
            *jcs = String::new();
        }
        hash
    });
    let mut line = String::with_capacity(payload.len_hint() + 300);
    line.push_str("{\"seq\":");
    push_u64(&mut line, seq);
    line.push_str(",\"prevHash\":");
    push_json_str(&mut line, &head.head_hash);
    line.push_str(",\"hash\":");
    push_json_str(&mut line, &hash);
    line.push_str(",\"time\":");
    push_json_str(&mut line, time);
    line.push_str(",\"traceId\":");
    push_json_opt(&mut line, ev.trace_id.as_deref());
    line.push_str(",\"parentId\":");
    push_json_opt(&mut line, ev.parent_id.as_deref());
    line.push_str(",\"idempotencyKey\":");
    push_json_opt(&mut line, ev.idempotency_key.as_deref());
    line.push_str(",\"payload\":");
    let mut bytes = line.into_bytes();
    payload.write_line(&mut bytes);
    bytes.push(b'}');
    if bytes.len() + 1 > MAX_EVENT_BYTES {
        return Err(StoreError::InvalidArgument(format!(
            "event is {} bytes serialised, the limit is {MAX_EVENT_BYTES}",
            bytes.len() + 1
        )));
    }
    let line = String::from_utf8(bytes).expect("JSON text is UTF-8");
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
    head.apply(&stored);
    Ok(Sealed {
        ev: stored,
        line: Arc::from(line),
    })
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
        crate::from_json_bytes(line).map_err(|e| format!("not a valid event line ({e})"))?;
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
    /// The header's line as read (seq 1), for the tail cache.
    pub header_line: Option<Arc<str>>,
    /// Read-only stores: what a writable open would have cut (first seq, what and where), which
    /// `verify` reports as the thread's first bad seq. The thread is served up to the seq before.
    pub damage: Option<(u64, String)>,
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
    ) -> Result<Vec<Sealed>, StoreError>;
    /// The `n` written events right before seq `before` (at most `written.0 + 1`), oldest first,
    /// each checked, and chained back from the head `written` (seq, hash) without reading the
    /// history before them.
    fn read_back(
        &self,
        id: &str,
        tx: &mut Self::Tx,
        written: (u64, &str),
        before: u64,
        n: usize,
    ) -> Result<Vec<Sealed>, StoreError>;
    /// The header (seq 1) alone.
    fn read_header(&self, id: &str, tx: &mut Self::Tx) -> Result<Sealed, StoreError>;
    /// The first written event carrying `idempotencyKey == key`, if any.
    fn find_key(
        &self,
        id: &str,
        tx: &mut Self::Tx,
        written: u64,
        key: &str,
    ) -> Result<Option<StoredEvent>, StoreError>;
    /// The head of a thread that needs nothing done to open (no repair, no acceptance, no
    /// warning), read without writing anything; `None` when a full `load` must decide.
    fn peek(&self, _id: &str) -> Result<Option<Head>, StoreError> {
        Ok(None)
    }
    /// Every id the disk holds evidence of, in no particular order (the index at open).
    fn all_ids(&self) -> Result<Vec<String>, StoreError>;
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
    damage: Option<(u64, String)>,
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
            damage: None,
        }
    }

    /// Whether dropping this slot loses nothing: no unwritten events, no anchor to move, and
    /// nothing opening found that `verify` must still report.
    fn evictable(&self) -> bool {
        self.mem.is_empty()
            && !self.needs_anchor
            && self.repairs.is_empty()
            && self.warnings.is_empty()
            && self.read_only.is_none()
            && self.damage.is_none()
    }
}

type SlotRef<Tx> = Arc<Mutex<Slot<Tx>>>;

struct Slot<Tx> {
    loaded: bool,
    live: Option<Live<Tx>>,
}

/// The loaded slots, least recently used out first beyond `cap`.
struct Slots<Tx> {
    map: HashMap<String, (SlotRef<Tx>, u64)>,
    clock: u64,
    cap: usize,
    evicted: u64,
}

/// What a caller wants back from a commit.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Want {
    Events,
    Lines,
}

/// An event on its way to being sealed: its payload serialised already (checked by whoever
/// queued it), or not yet.
enum Prepared {
    Raw(NewEvent),
    Encoded(NewEvent, EncodedPayload),
}

fn raw(events: Vec<NewEvent>) -> Vec<Prepared> {
    events.into_iter().map(Prepared::Raw).collect()
}

struct Request {
    id: String,
    create: bool,
    events: Vec<Prepared>,
    want: Want,
}

enum Reply {
    Events(Vec<StoredEvent>),
    Lines(Vec<AppendedEvent>),
}

type Outcome = Result<Reply, StoreError>;

impl Reply {
    fn events(self) -> Vec<StoredEvent> {
        match self {
            Reply::Events(e) => e,
            Reply::Lines(_) => unreachable!("asked for events"),
        }
    }
}

#[derive(Default)]
struct Queue {
    pending: VecDeque<(u64, Request)>,
    done: HashMap<u64, Outcome>,
    leader: bool,
    next_ticket: u64,
}

/// One thread in the summary index.
enum Entry {
    /// Known to exist on disk (a log, an anchor, a row); not summarised yet.
    Unknown,
    Ready(Box<Head>),
    /// Opening it failed verification (corrupt, or its anchor does not match): the reason.
    Unreadable(String),
}

/// The summary index: every thread of the state directory, by id.
#[derive(Default)]
struct Catalog {
    entries: BTreeMap<String, Entry>,
    /// thread/start idempotency keys (from headers) → thread id.
    start_keys: HashMap<String, String>,
    unknown: usize,
}

impl Catalog {
    fn set(&mut self, id: &str, entry: Entry) {
        if let Entry::Ready(h) = &entry {
            if let Some(k) = &h.start_key {
                self.start_keys.insert(k.clone(), id.to_string());
            }
        }
        let new_unknown = matches!(entry, Entry::Unknown);
        match self.entries.insert(id.to_string(), entry) {
            Some(Entry::Unknown) if !new_unknown => self.unknown -= 1,
            None | Some(Entry::Ready(_)) | Some(Entry::Unreadable(_)) if new_unknown => {
                self.unknown += 1
            }
            _ => {}
        }
    }

    /// Publishes a committed head without reallocating what did not change.
    fn publish(&mut self, head: &Head) {
        match self.entries.get_mut(&head.thread_id) {
            Some(Entry::Ready(h)) => (**h).clone_from(head),
            _ => self.set(
                &head.thread_id.clone(),
                Entry::Ready(Box::new(head.clone())),
            ),
        }
    }

    fn remove(&mut self, id: &str) {
        match self.entries.remove(id) {
            Some(Entry::Unknown) => self.unknown -= 1,
            Some(Entry::Ready(h)) => {
                if let Some(k) = &h.start_key {
                    if self.start_keys.get(k).is_some_and(|t| t == id) {
                        self.start_keys.remove(k);
                    }
                }
            }
            _ => {}
        }
    }
}

/// A page as read: the lines, the parsed events when they came from disk (a cache hit has
/// lines only), and whether more follow.
type SealedPage = (Vec<Arc<str>>, Option<Vec<StoredEvent>>, bool);

/// A rollout store over a backend.
pub struct BackedStore<B: Backend> {
    backend: B,
    options: StoreOptions,
    slots: Mutex<Slots<B::Tx>>,
    /// Threads known to exist, checked without the slot lock: the commit leader holds slot locks
    /// through its fdatasync, and callers must still be able to queue behind it meanwhile, or
    /// group commit would never group.
    ready: Mutex<HashSet<String>>,
    catalog: Mutex<Catalog>,
    cache: TailCache,
    queue: Mutex<Queue>,
    wake: Condvar,
    closed: AtomicBool,
    _lock: super::fsutil::DirLock,
}

/// Whether a load error is the thread's own (cached as unreadable) rather than the moment's.
fn is_verdict(e: &StoreError) -> bool {
    matches!(
        e,
        StoreError::Corrupt { .. } | StoreError::AnchorMismatch { .. }
    )
}

fn parse_cached(line: &str) -> StoredEvent {
    // Lines enter the cache only after a commit or a full check on the way in from disk.
    serde_json::from_str(line).expect("a cached line is a checked event")
}

/// One thread's share of a group commit, sealed and waiting to be written, its slot held.
struct Pending<'g, Tx> {
    id: String,
    guard: MutexGuard<'g, Slot<Tx>>,
    head: Head,
    create: bool,
    sealed: Vec<Sealed>,
    /// Each caller's share of `sealed`: (ticket, range, what it wants back).
    tickets: Vec<(u64, std::ops::Range<usize>, Want)>,
}

/// A round's requests (with their callers' tickets) for each thread.
type ByThread = HashMap<String, Vec<(u64, Request)>>;

/// A round's requests by thread, threads in the order they first appear (requests keep theirs).
fn group_by_thread(round: Vec<(u64, Request)>) -> (Vec<String>, ByThread) {
    let mut order: Vec<String> = Vec::new();
    let mut groups: ByThread = HashMap::new();
    for (t, r) in round {
        match groups.get_mut(&r.id) {
            Some(g) => g.push((t, r)),
            None => {
                order.push(r.id.clone());
                groups.insert(r.id.clone(), vec![(t, r)]);
            }
        }
    }
    (order, groups)
}

/// What each caller of a written thread gets back: its own events, as events or as lines.
fn replies<Tx>(p: &Pending<'_, Tx>) -> Vec<(u64, Reply)> {
    p.tickets
        .iter()
        .map(|(t, range, want)| {
            let mine = &p.sealed[range.clone()];
            let reply = match want {
                Want::Events => Reply::Events(mine.iter().map(|s| s.ev.clone()).collect()),
                Want::Lines => Reply::Lines(
                    mine.iter()
                        .map(|s| AppendedEvent {
                            seq: s.ev.seq,
                            time: s.ev.time.clone(),
                            line: Arc::clone(&s.line),
                        })
                        .collect(),
                ),
            };
            (*t, reply)
        })
        .collect()
}

impl<B: Backend> BackedStore<B> {
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
        // The index starts as the directory's catalog: every id the disk holds evidence of,
        // summarised on first use or by `warm`. Listing the directory is all opening costs.
        let mut catalog = Catalog::default();
        for id in backend.all_ids()? {
            if validate_thread_id(&id).is_ok() {
                catalog.set(&id, Entry::Unknown);
            }
        }
        let cache = TailCache::new(CacheLimits {
            events_per_thread: options.tail_cache_events,
            bytes_per_thread: options.tail_cache_thread_bytes,
            total_bytes: options.tail_cache_bytes,
        });
        Ok(BackedStore {
            backend,
            slots: Mutex::new(Slots {
                map: HashMap::new(),
                clock: 0,
                cap: options.max_loaded_threads.max(1),
                evicted: 0,
            }),
            options,
            ready: Mutex::new(HashSet::new()),
            catalog: Mutex::new(catalog),
            cache,
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
        let mut s = lock(&self.slots);
        s.clock += 1;
        let tick = s.clock;
        if let Some((arc, used)) = s.map.get_mut(id) {
            *used = tick;
            return Arc::clone(arc);
        }
        let arc: SlotRef<B::Tx> = Arc::new(Mutex::new(Slot {
            loaded: false,
            live: None,
        }));
        s.map.insert(id.to_string(), (Arc::clone(&arc), tick));
        if s.map.len() > s.cap {
            self.evict_slots(&mut s, id);
        }
        arc
    }

    /// Drops the least recently used slots nobody holds and that lose nothing by going (an
    /// eighth of the cap at once, so the sort is paid once per cap/8 loads). A dropped thread
    /// is loaded again (head and header only) when next used.
    fn evict_slots(&self, s: &mut Slots<B::Tx>, keep: &str) {
        let mut idle: Vec<(u64, String)> = s
            .map
            .iter()
            .filter(|(id, (arc, _))| id.as_str() != keep && Arc::strong_count(arc) == 1)
            .map(|(id, (_, used))| (*used, id.clone()))
            .collect();
        idle.sort_unstable();
        let excess = s.map.len() - s.cap + s.cap / 8;
        let mut gone = 0;
        let mut ready = lock(&self.ready);
        for (_, id) in idle {
            if gone >= excess {
                break;
            }
            let evictable = {
                let (arc, _) = &s.map[&id];
                match arc.try_lock() {
                    Ok(g) => g.live.as_ref().is_none_or(|l| l.evictable()),
                    Err(_) => false,
                }
            };
            if evictable {
                s.map.remove(&id);
                ready.remove(&id);
                gone += 1;
                s.evicted += 1;
            }
        }
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
            let loaded = match self.backend.load(id) {
                Ok(l) => l,
                Err(e) => {
                    if is_verdict(&e) {
                        lock(&self.catalog)
                            .set(id, Entry::Unreadable(cap_chars(&e.to_string(), 1000)));
                    }
                    return Err(e);
                }
            };
            match loaded {
                None => {
                    g.loaded = true;
                    lock(&self.catalog).remove(id);
                    self.cache.forget(id);
                    return Err(StoreError::NotFound(id.to_string()));
                }
                Some(l) => {
                    if let Some(h) = l.header_line {
                        self.cache.put_header(id, h, l.head.last_seq);
                    }
                    lock(&self.catalog).publish(&l.head);
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
                        damage: l.damage,
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
            let events = raw(events);
            self.submit(Request {
                id: id.to_string(),
                create: false,
                events,
                want: Want::Events,
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
        self.submit_many(vec![req])
            .pop()
            .expect("one request, one outcome")
    }

    /// Queues requests (in order) and returns once every one is committed, each with its own
    /// outcome; requests for different threads share the round's fsyncs.
    fn submit_many(&self, reqs: Vec<Request>) -> Vec<Outcome> {
        if self.options.read_only {
            // Every write enters here (start, append, fork, archive, repairs): none is made.
            return reqs
                .iter()
                .map(|r| {
                    Err(StoreError::InvalidArgument(format!(
                        "the rollout store was opened read-only (for inspection), so thread {:?} cannot be written; open it without read_only to write",
                        r.id
                    )))
                })
                .collect();
        }
        let mut q = lock(&self.queue);
        let first = q.next_ticket;
        let n = reqs.len() as u64;
        for req in reqs {
            let t = q.next_ticket;
            q.next_ticket += 1;
            q.pending.push_back((t, req));
        }
        let mut out: Vec<Option<Outcome>> = (0..n).map(|_| None).collect();
        let mut left = n;
        loop {
            for t in first..first + n {
                if out[(t - first) as usize].is_none() {
                    if let Some(o) = q.done.remove(&t) {
                        out[(t - first) as usize] = Some(o);
                        left -= 1;
                    }
                }
            }
            if left == 0 {
                return out.into_iter().map(|o| o.expect("filled")).collect();
            }
            if !q.leader {
                q.leader = true;
                let take = q.pending.len().min(self.options.max_batch_requests.max(1));
                let round: Vec<(u64, Request)> = q.pending.drain(..take).collect();
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
    /// once per thread (Sync), publish the new heads (slot, index, tail cache), then anchor them.
    fn commit_round(&self, round: Vec<(u64, Request)>) -> Vec<(u64, Outcome)> {
        let time = crate::time::now_rfc3339();
        let (order, mut groups) = group_by_thread(round);
        let mut results: Vec<(u64, Outcome)> = Vec::new();
        let arcs: Vec<(String, SlotRef<B::Tx>)> = order
            .iter()
            .map(|id| (id.clone(), self.slot_arc(id)))
            .collect();
        let mut pend: Vec<Pending<'_, B::Tx>> = Vec::new();
        for (id, arc) in &arcs {
            let requests = groups.remove(id).unwrap_or_default();
            if let Some(p) = self.seal_thread(id, lock(arc), requests, &time, &mut results) {
                pend.push(p);
            }
        }
        if pend.is_empty() {
            return results;
        }
        let outcomes = self.write_pending(&mut pend);
        for (p, outcome) in pend.into_iter().zip(outcomes) {
            match outcome {
                Err(e) => self.fail_pending(p, e, &mut results),
                Ok(()) => self.publish_pending(p, &mut results),
            }
        }
        results
    }

    /// Seals one thread's requests of the round in order, on a copy of its head: a request that
    /// fails is answered at once and leaves the head as it was for the next. Keyed, a seal
    /// follows when the round crosses a seal point. `None` when nothing is left to write.
    fn seal_thread<'g>(
        &self,
        id: &str,
        guard: MutexGuard<'g, Slot<B::Tx>>,
        requests: Vec<(u64, Request)>,
        time: &str,
        results: &mut Vec<(u64, Outcome)>,
    ) -> Option<Pending<'g, B::Tx>> {
        let mut head = guard.live.as_ref().map(|l| l.head.clone());
        let start_seq = head.as_ref().map_or(0, |h| h.last_seq);
        let read_only = guard.live.as_ref().and_then(|l| l.read_only.clone());
        let mut create = false;
        let mut sealed: Vec<Sealed> = Vec::new();
        let mut tickets = Vec::new();
        for (ticket, req) in requests {
            let mut h = head.clone();
            let mut out = Vec::with_capacity(req.events.len());
            let res = match &read_only {
                Some(why) => Err(StoreError::InvalidArgument(why.clone())),
                None => {
                    self.seal_request(id, &guard, &mut h, req.create, req.events, time, &mut out)
                }
            };
            match res {
                Ok(()) => {
                    create |= req.create;
                    head = h;
                    tickets.push((ticket, sealed.len()..sealed.len() + out.len(), req.want));
                    sealed.extend(out);
                }
                Err(e) => results.push((ticket, Err(e))),
            }
        }
        let mut head = head?;
        if let Some(key) = &self.options.key {
            // Keyed mode: a seal follows the commit that crosses each multiple of seal_every,
            // so the log alone vouches for its prefix. It belongs to no caller's batch.
            if !sealed.is_empty()
                && crosses_seal_point(start_seq, head.last_seq, self.options.seal_every)
            {
                let payload = seal_payload(key, id, head.last_seq, &head.head_hash);
                if let Ok(s) = seal(&mut head, Prepared::Raw(NewEvent::new(payload)), time) {
                    sealed.push(s);
                }
            }
        }
        if sealed.is_empty() {
            return None;
        }
        Some(Pending {
            id: id.to_string(),
            guard,
            head,
            create,
            sealed,
            tickets,
        })
    }

    /// Seals one request's events onto `h` (a create first builds the head from its header),
    /// into `out`.
    #[allow(clippy::too_many_arguments)]
    fn seal_request(
        &self,
        id: &str,
        guard: &Slot<B::Tx>,
        h: &mut Option<Head>,
        create: bool,
        events: Vec<Prepared>,
        time: &str,
        out: &mut Vec<Sealed>,
    ) -> Result<(), StoreError> {
        let mut events = events.into_iter();
        if create {
            if h.is_some() || !guard.loaded && self.backend.load(id)?.is_some() {
                return Err(StoreError::AlreadyExists(id.to_string()));
            }
            let first = events
                .next()
                .ok_or_else(|| StoreError::InvalidArgument("empty create".into()))?;
            let mut fresh = Head {
                thread_id: id.to_string(),
                title: None,
                metadata: Arc::default(),
                created_at: time.to_string(),
                forked_from: None,
                format_version: 1,
                archived: false,
                last_seq: 0,
                head_hash: ZERO_HASH.to_string(),
                updated_at: time.to_string(),
                compacted_through: 0,
                last_compaction_seq: None,
                start_key: None,
            };
            let s = seal(&mut fresh, first, time)?;
            let mut built = Head::from_header(&s.ev).map_err(StoreError::InvalidArgument)?;
            built.apply(&s.ev);
            out.push(s);
            *h = Some(built);
        }
        let hh = h
            .as_mut()
            .ok_or_else(|| StoreError::NotFound(id.to_string()))?;
        for ev in events {
            out.push(seal(hh, ev, time)?);
        }
        Ok(())
    }

    /// Writes every pending thread's sealed bytes in one backend call (one fdatasync per
    /// thread when Sync); a created thread gets its live slot here. Ephemeral writes nothing.
    fn write_pending(&self, pend: &mut [Pending<'_, B::Tx>]) -> Vec<Result<(), StoreError>> {
        let durability = self.options.durability;
        if durability == Durability::Ephemeral {
            return pend.iter().map(|_| Ok(())).collect();
        }
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
    }

    /// A thread whose write failed: every caller of the round on it gets the error (the first
    /// the error itself, the others its text), and a thread this round created is forgotten.
    fn fail_pending(
        &self,
        mut p: Pending<'_, B::Tx>,
        e: StoreError,
        results: &mut Vec<(u64, Outcome)>,
    ) {
        if p.create && self.options.durability != Durability::Ephemeral {
            p.guard.live = None;
        }
        let msg = e.to_string();
        let mut first = Some(e);
        for (t, _, _) in p.tickets {
            results.push((
                t,
                Err(first
                    .take()
                    .unwrap_or_else(|| StoreError::Io(std::io::Error::other(msg.clone())))),
            ));
        }
    }

    /// A thread whose write succeeded: its new head goes live (anchored now when Sync), is
    /// published to the index and the tail cache, and only then are its callers answered.
    fn publish_pending(&self, mut p: Pending<'_, B::Tx>, results: &mut Vec<(u64, Outcome)>) {
        let durability = self.options.durability;
        let first_seq = p.sealed[0].ev.seq;
        let lines: Vec<Arc<str>> = p.sealed.iter().map(|s| Arc::clone(&s.line)).collect();
        let replies = replies(&p);
        let g = &mut *p.guard;
        g.loaded = true;
        if durability == Durability::Ephemeral {
            let sealed = p.sealed.into_iter().map(Sealed::slim);
            match g.live.as_mut() {
                Some(l) if !p.create => {
                    l.head = p.head;
                    l.mem.extend(sealed);
                }
                _ => {
                    g.live = Some(Live::fresh(p.head, self.backend.new_tx(), sealed.collect()));
                }
            }
        } else {
            let l = g.live.as_mut().expect("set above");
            l.head = p.head;
            l.written_seq = l.head.last_seq;
            l.written_hash = l.head.head_hash.clone();
            l.persisted = true;
            if durability == Durability::Sync {
                // The log is durable: the anchor may now move up to it. Unkeyed, a failed anchor
                // write is retried at flush (the events are safe, the anchor may lag). Keyed,
                // the anchor is what vouches for the events after a crash, so it is made durable
                // before the acknowledgement, and a failure is the callers' failure.
                let keyed = self.options.key.is_some();
                match self.backend.anchor(&p.id, &mut l.tx, &l.head, keyed) {
                    Ok(()) => l.needs_anchor = false,
                    Err(e) if keyed => {
                        l.needs_anchor = true;
                        lock(&self.ready).insert(p.id.clone());
                        let msg = format!(
                            "the events were written but the keyed anchor could not be made durable ({e}); they are not acknowledged"
                        );
                        results.extend(replies.into_iter().map(|(t, _)| {
                            (t, Err(StoreError::Io(std::io::Error::other(msg.clone()))))
                        }));
                        return;
                    }
                    Err(_) => l.needs_anchor = true,
                }
            } else {
                l.needs_anchor = true;
            }
        }
        let live = g.live.as_ref().expect("set above");
        // Published before the callers hear back: a reader that sees the acknowledgement also
        // sees the events.
        lock(&self.catalog).publish(&live.head);
        self.cache.committed(&p.id, first_seq, &lines);
        lock(&self.ready).insert(p.id.clone());
        results.extend(replies.into_iter().map(|(t, r)| (t, Ok(r))));
    }

    fn append_internal(
        &self,
        id: &str,
        events: Vec<NewEvent>,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        self.slot(id)?;
        self.submit(Request {
            id: id.to_string(),
            create: false,
            events: raw(events),
            want: Want::Events,
        })
        .map(Reply::events)
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
        header.trace_id = recorded.trace_id;
        header.parent_id = recorded.parent_id;
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
        let out = self
            .submit(Request {
                id: start.thread_id.clone(),
                create: true,
                events: raw(events),
                want: Want::Events,
            })?
            .events();
        let header = out.into_iter().next().expect("header sealed");
        Ok((self.summary(&start.thread_id)?, header))
    }

    /// Events after `after` up to `n` (no clamp): from the tail cache when it holds them, else
    /// from the backend (then memory), joining what was read to the cache.
    fn read_sealed(&self, id: &str, after: u64, n: usize) -> Result<SealedPage, StoreError> {
        validate_thread_id(id)?;
        self.open_check()?;
        if let Some(hit) = self.cache.get(id, after, n) {
            let end = after + hit.lines.len() as u64;
            return Ok((hit.lines, None, end < hit.head));
        }
        self.with_live(id, |l| {
            let last = l.head.last_seq;
            if after >= last || n == 0 {
                return Ok((Vec::new(), Some(Vec::new()), false));
            }
            let end = last.min(after.saturating_add(n as u64));
            let mut lines = Vec::with_capacity((end - after) as usize);
            let mut events = Vec::with_capacity((end - after) as usize);
            if after < l.written_seq {
                let upto = end.min(l.written_seq);
                let read = self.backend.read(
                    id,
                    &mut l.tx,
                    l.written_seq,
                    after,
                    (upto - after) as usize,
                )?;
                for s in read {
                    lines.push(s.line);
                    events.push(s.ev);
                }
                if l.mem.is_empty() {
                    self.cache
                        .read_from_disk(id, after + 1, &lines, l.written_seq);
                }
            }
            for s in l.mem.iter().filter(|s| s.ev.seq > after && s.ev.seq <= end) {
                lines.push(Arc::clone(&s.line));
                events.push(s.event());
            }
            Ok((lines, Some(events), end < last))
        })
    }

    fn read_range(&self, id: &str, after: u64, n: usize) -> Result<ReadPage, StoreError> {
        let (lines, events, has_more) = self.read_sealed(id, after, n)?;
        let events = match events {
            Some(e) => e,
            None => lines.iter().map(|l| parse_cached(l)).collect(),
        };
        Ok(ReadPage { events, has_more })
    }

    fn event_at(&self, id: &str, seq: u64) -> Result<StoredEvent, StoreError> {
        let mut page = self.read_range(id, seq - 1, 1)?;
        page.events
            .pop()
            .ok_or_else(|| StoreError::InvalidArgument(format!("thread {id:?} has no seq {seq}")))
    }

    /// Summarises, then visits, the threads of one page in id order. Entries not summarised yet
    /// are loaded first (outside the index lock); a thread that cannot be read is reported, and
    /// only verification verdicts are remembered (an I/O error is tried again next time).
    fn list_inner(
        &self,
        query: &ListQuery,
        visit: &mut dyn FnMut(&Head),
    ) -> Result<ListRest, StoreError> {
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
        let after = |c: &Option<String>| match c {
            Some(a) => Bound::Excluded(a.clone()),
            None => Bound::Unbounded,
        };
        // Reasons for entries that failed to load this time but were not verdicts.
        let mut transient: HashMap<String, String> = HashMap::new();
        loop {
            // Phase 1: which entries of this page still need loading?
            let unknown: Vec<String> = {
                let cat = lock(&self.catalog);
                let mut seen = 0;
                let mut unknown = Vec::new();
                for (id, e) in cat.entries.range((after(&query.cursor), Bound::Unbounded)) {
                    match e {
                        Entry::Ready(h) if h.archived && !query.include_archived => continue,
                        Entry::Unknown if !transient.contains_key(id) => unknown.push(id.clone()),
                        _ => seen += 1,
                    }
                    if seen + unknown.len() > limit {
                        break;
                    }
                }
                unknown
            };
            if unknown.is_empty() {
                break;
            }
            for id in unknown {
                match self.summary_loaded(&id) {
                    Ok(_) | Err(StoreError::NotFound(_)) => {}
                    Err(StoreError::Closed) => return Err(StoreError::Closed),
                    Err(e) if is_verdict(&e) => {}
                    Err(e) => {
                        transient.insert(id, cap_chars(&e.to_string(), 1000));
                    }
                }
            }
        }
        // Phase 2: the page, under one lock.
        let cat = lock(&self.catalog);
        let mut unreadable = Vec::new();
        let mut taken = 0;
        let mut last: Option<&String> = None;
        let mut next_cursor = None;
        for (id, e) in cat.entries.range((after(&query.cursor), Bound::Unbounded)) {
            let visible = match e {
                Entry::Ready(h) => !h.archived || query.include_archived,
                _ => true,
            };
            if !visible {
                continue;
            }
            if taken == limit {
                // One more exists: the page ends at the last entry taken.
                next_cursor = last.cloned();
                break;
            }
            match e {
                Entry::Ready(h) => visit(h),
                Entry::Unreadable(reason) => unreadable.push((id.clone(), reason.clone())),
                Entry::Unknown => unreadable.push((
                    id.clone(),
                    transient
                        .get(id)
                        .cloned()
                        .unwrap_or_else(|| "the thread could not be opened".into()),
                )),
            }
            taken += 1;
            last = Some(id);
        }
        Ok(ListRest {
            next_cursor,
            unreadable,
        })
    }

    /// Summarises one thread the index knows by name only, from a read-only peek at its files;
    /// false when the peek cannot decide (a repair, an acceptance or a warning is due: only a
    /// full load may do that).
    fn warm_one(&self, id: &str) -> bool {
        match self.backend.peek(id) {
            Ok(Some(head)) => {
                let mut cat = lock(&self.catalog);
                if matches!(cat.entries.get(id), Some(Entry::Unknown)) {
                    cat.set(id, Entry::Ready(Box::new(head)));
                }
                true
            }
            _ => false,
        }
    }

    /// A thread's summary through its slot (loading it if needed), for the index.
    fn summary_loaded(&self, id: &str) -> Result<ThreadSummary, StoreError> {
        self.with_live(id, |l| Ok(l.head.summary()))
    }

    /// Writes Ephemeral events, syncs Buffered writes, then moves every anchor up.
    fn flush_inner(&self) -> Result<(), StoreError> {
        let arcs: Vec<(String, SlotRef<B::Tx>)> = lock(&self.slots)
            .map
            .iter()
            .map(|(k, (v, _))| (k.clone(), v.clone()))
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

impl<B: Backend> Drop for BackedStore<B> {
    fn drop(&mut self) {
        if !self.closed.load(Ordering::Acquire) {
            let _ = self.exclusive(|| self.flush_inner());
        }
    }
}

impl<B: Backend> RolloutStore for BackedStore<B> {
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

    fn append_batch(
        &self,
        batches: Vec<(String, Vec<CheckedEvent>)>,
    ) -> Vec<Result<Vec<AppendedEvent>, StoreError>> {
        let mut out: Vec<Option<Result<Vec<AppendedEvent>, StoreError>>> =
            batches.iter().map(|_| None).collect();
        let mut reqs = Vec::new();
        let mut at = Vec::new();
        for (i, (id, events)) in batches.into_iter().enumerate() {
            let checked = (|| {
                validate_thread_id(&id)?;
                if events.len() > MAX_BATCH_EVENTS {
                    return Err(StoreError::InvalidArgument(format!(
                        "{} events in one append, the limit is {MAX_BATCH_EVENTS}",
                        events.len()
                    )));
                }
                self.slot(&id)?;
                Ok(())
            })();
            match checked {
                Err(e) => out[i] = Some(Err(e)),
                Ok(()) if events.is_empty() => out[i] = Some(Ok(Vec::new())),
                Ok(()) => {
                    at.push(i);
                    reqs.push(Request {
                        id,
                        create: false,
                        events: events
                            .into_iter()
                            .map(|c| {
                                let (ev, enc) = c.into_parts();
                                Prepared::Encoded(ev, enc)
                            })
                            .collect(),
                        want: Want::Lines,
                    });
                }
            }
        }
        for (i, r) in at.into_iter().zip(self.submit_many(reqs)) {
            out[i] = Some(r.map(|reply| match reply {
                Reply::Lines(l) => l,
                Reply::Events(_) => unreachable!("asked for lines"),
            }));
        }
        out.into_iter().map(|o| o.expect("filled")).collect()
    }

    fn read_json(
        &self,
        thread_id: &str,
        after_seq: u64,
        limit: usize,
    ) -> Result<JsonPage, StoreError> {
        if limit == 0 {
            return Err(StoreError::InvalidArgument(
                "read limit must be at least 1".into(),
            ));
        }
        let (events, _, has_more) =
            self.read_sealed(thread_id, after_seq, limit.min(MAX_READ_LIMIT))?;
        Ok(JsonPage { events, has_more })
    }

    fn read_back(
        &self,
        thread_id: &str,
        before: Option<u64>,
        limit: usize,
    ) -> Result<ReadPage, StoreError> {
        validate_thread_id(thread_id)?;
        self.open_check()?;
        if limit == 0 {
            return Err(StoreError::InvalidArgument(
                "read limit must be at least 1".into(),
            ));
        }
        let limit = limit.min(MAX_READ_LIMIT);
        if let Some(b) = before {
            if let Some((first, lines)) = self.cache.before(thread_id, b, limit) {
                return Ok(ReadPage {
                    events: lines.iter().map(|l| parse_cached(l)).collect(),
                    has_more: first > 1,
                });
            }
        }
        self.with_live(thread_id, |l| {
            let head = l.head.last_seq;
            let before = before.unwrap_or(head + 1).min(head + 1);
            if let Some((first, lines)) = self.cache.before(thread_id, before, limit) {
                return Ok(ReadPage {
                    events: lines.iter().map(|l| parse_cached(l)).collect(),
                    has_more: first > 1,
                });
            }
            if before <= 1 {
                return Ok(ReadPage {
                    events: Vec::new(),
                    has_more: false,
                });
            }
            let from = before.saturating_sub(limit as u64).max(1);
            // Memory first (Ephemeral events not written yet), then the written part.
            let mut events: Vec<StoredEvent> = Vec::new();
            let written_end = before.min(l.written_seq + 1);
            if from < written_end {
                let read = self.backend.read_back(
                    thread_id,
                    &mut l.tx,
                    (l.written_seq, &l.written_hash),
                    written_end,
                    (written_end - from) as usize,
                )?;
                if l.mem.is_empty() && written_end == l.written_seq + 1 {
                    let lines: Vec<Arc<str>> = read.iter().map(|s| Arc::clone(&s.line)).collect();
                    if let Some(first) = read.first() {
                        self.cache
                            .read_from_disk(thread_id, first.ev.seq, &lines, l.written_seq);
                    }
                }
                events.extend(read.into_iter().map(|s| s.ev));
            }
            events.extend(
                l.mem
                    .iter()
                    .filter(|s| s.ev.seq >= from && s.ev.seq < before)
                    .map(Sealed::event),
            );
            Ok(ReadPage {
                events,
                has_more: from > 1,
            })
        })
    }

    fn header(&self, thread_id: &str) -> Result<StoredEvent, StoreError> {
        validate_thread_id(thread_id)?;
        self.open_check()?;
        if let Some(line) = self.cache.header(thread_id) {
            return Ok(parse_cached(&line));
        }
        self.with_live(thread_id, |l| {
            if let Some(s) = l.mem.first().filter(|s| s.ev.seq == 1) {
                return Ok(s.event());
            }
            let s = self.backend.read_header(thread_id, &mut l.tx)?;
            self.cache.put_header(thread_id, s.line, l.head.last_seq);
            Ok(s.ev)
        })
    }

    fn list_with(
        &self,
        query: &ListQuery,
        visit: &mut dyn FnMut(SummaryRef<'_>),
    ) -> Result<ListRest, StoreError> {
        self.list_inner(query, &mut |h| visit(h.view()))
    }

    fn find_by_idempotency_key(
        &self,
        thread_id: &str,
        key: &str,
    ) -> Result<Option<StoredEvent>, StoreError> {
        self.with_live(thread_id, |l| {
            if let Some(s) = l
                .mem
                .iter()
                .find(|s| s.ev.idempotency_key.as_deref() == Some(key))
            {
                return Ok(Some(s.event()));
            }
            if l.written_seq == 0 {
                return Ok(None);
            }
            self.backend
                .find_key(thread_id, &mut l.tx, l.written_seq, key)
        })
    }

    fn thread_by_start_key(&self, key: &str) -> Result<Option<String>, StoreError> {
        self.open_check()?;
        // Every thread must be summarised to answer "none has it".
        loop {
            let unknown: Vec<String> = {
                let cat = lock(&self.catalog);
                if let Some(id) = cat.start_keys.get(key) {
                    return Ok(Some(id.clone()));
                }
                if cat.unknown == 0 {
                    return Ok(None);
                }
                cat.entries
                    .iter()
                    .filter(|(_, e)| matches!(e, Entry::Unknown))
                    .map(|(id, _)| id.clone())
                    .take(1024)
                    .collect()
            };
            let mut progressed = false;
            for id in unknown {
                match self.warm_one(&id) {
                    true => progressed = true,
                    false => match self.summary_loaded(&id) {
                        Ok(_) | Err(StoreError::NotFound(_)) => progressed = true,
                        Err(StoreError::Closed) => return Err(StoreError::Closed),
                        Err(e) if is_verdict(&e) => progressed = true,
                        Err(e) => return Err(e),
                    },
                }
            }
            if !progressed {
                return Ok(None);
            }
        }
    }

    fn warm(&self, stop: &AtomicBool) {
        let mut after: Option<String> = None;
        while !stop.load(Ordering::Relaxed) && self.open_check().is_ok() {
            let ids: Vec<String> = {
                let cat = lock(&self.catalog);
                if cat.unknown == 0 {
                    return;
                }
                let range = match &after {
                    Some(a) => (Bound::Excluded(a.clone()), Bound::Unbounded),
                    None => (Bound::Unbounded, Bound::Unbounded),
                };
                cat.entries
                    .range(range)
                    .filter(|(_, e)| matches!(e, Entry::Unknown))
                    .map(|(id, _)| id.clone())
                    .take(256)
                    .collect()
            };
            let Some(last) = ids.last().cloned() else {
                return;
            };
            for id in ids {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                self.warm_one(&id);
            }
            after = Some(last);
        }
    }

    fn stats(&self) -> StoreStats {
        let (indexed, unknown) = {
            let c = lock(&self.catalog);
            (c.entries.len() as u64, c.unknown as u64)
        };
        let (loaded, unloaded) = {
            let s = lock(&self.slots);
            (s.map.len() as u64, s.evicted)
        };
        let (cached_threads, cached_bytes, cache_evictions) = self.cache.usage();
        StoreStats {
            indexed_threads: indexed,
            unsummarised_threads: unknown,
            loaded_threads: loaded,
            unloaded_threads: unloaded,
            cached_threads: cached_threads as u64,
            cached_bytes: cached_bytes as u64,
            cache_evictions,
        }
    }

    fn read(&self, thread_id: &str, after_seq: u64, limit: usize) -> Result<ReadPage, StoreError> {
        if limit == 0 {
            return Err(StoreError::InvalidArgument(
                "read limit must be at least 1".into(),
            ));
        }
        self.read_range(thread_id, after_seq, limit.min(MAX_READ_LIMIT))
    }

    fn summary(&self, thread_id: &str) -> Result<ThreadSummary, StoreError> {
        validate_thread_id(thread_id)?;
        self.open_check()?;
        // The index is exact for every thread it has summarised (this process is the only
        // writer); the slot is needed only for a thread not summarised yet.
        if let Some(Entry::Ready(h)) = lock(&self.catalog).entries.get(thread_id) {
            return Ok(h.summary());
        }
        self.summary_loaded(thread_id)
    }

    fn list(&self, query: &ListQuery) -> Result<ListPage, StoreError> {
        let mut threads = Vec::new();
        let rest = self.list_inner(query, &mut |h| threads.push(h.summary()))?;
        Ok(ListPage {
            threads,
            next_cursor: rest.next_cursor,
            unreadable: rest.unreadable,
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
        // The fork keeps its source's trace: its header carries the trace of the event it was
        // forked at and names that event (`trace::event_ref`) as its parent.
        let mut origin_trace = None;
        if at == 1 {
            let first = self.event_at(source, 1)?;
            origin_hash = first.hash;
            origin_trace = first.trace_id;
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
                    origin_trace.clone_from(&ev.trace_id);
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
                // A parent named by its seq is renumbered like the events are.
                let parent_id = match trace::parent_seq(ev.parent_id.as_deref()) {
                    Some(p) => Some(trace::seq_ref(map.get(p as usize).copied().unwrap_or(1))),
                    None => ev.parent_id,
                };
                copies.push(NewEvent {
                    payload,
                    trace_id: ev.trace_id,
                    parent_id,
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
                event_hash: origin_hash.clone(),
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
            parent_id: Some(trace::event_ref(&origin_hash)),
            trace_id: origin_trace,
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
                    if let Err(r) = check_event(&s.event(), report.events + 1, &prev, ctx) {
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
            if let Some((seq, why)) = &l.damage {
                // What a writable open would cut outranks what the chain check met there.
                if report.first_bad_seq.is_none_or(|s| *seq <= s) {
                    report.first_bad_seq = Some(*seq);
                    report.reason = Some(why.clone());
                }
            }
            if report.keyed {
                if let Some(key) = &self.options.key {
                    if key.store_id().is_none() {
                        report.warnings.push(format!(
                            "this store has no store id ({}: it was created before store ids), so its keyed threads are not bound to it: a copy of one from another store under the same key would verify too (docs/rollout-format.md, \"Store identity\", says how to bind it)",
                            super::identity::STORE_ID_FILE
                        ));
                    }
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
