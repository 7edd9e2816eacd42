//! Rollout stores: the durable, hash-chained, append-only log of every thread, so that a thread
//! survives crashes, can be resumed, forked and verified by a third party. See
//! `docs/rollout-format.md` for the exact on-disk format.

use cc_app_server_protocol as protocol;
use cc_app_server_protocol::time;

mod cache;
mod encode;
pub use encode::push_u64;
mod fsutil;
mod identity;
mod jsonl;
mod keyed;
mod sqlite;
mod store;
pub mod sync;
pub mod trace;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::path::Path;
use std::sync::Arc;

pub use identity::{is_store_id, STORE_ID_FILE};
pub use jsonl::{Anchor, JsonlBackend, ANCHOR_SLOT};
pub use keyed::RolloutKey;
pub use sqlite::SqliteBackend;

/// The rollout format this build writes in every `threadStarted` header.
pub const FORMAT_VERSION: u16 = 1;
/// The first event's `prevHash`.
pub const ZERO_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";
/// Longest thread id / idempotency key (the schema's `Identifier`).
pub const MAX_ID_LEN: usize = 160;
/// Longest `traceId` / `parentId`.
pub const MAX_TRACE_LEN: usize = 128;
/// Longest thread title, in characters (the schema's `Title`).
pub const MAX_TITLE_CHARS: usize = 256;
/// Longest checkpoint label, in characters (the schema's `ShortText`).
pub const MAX_LABEL_CHARS: usize = 1024;
/// Longest compaction summary, in characters (the schema's `CompactedEvent.summary`).
pub const MAX_SUMMARY_CHARS: usize = 1_000_000;
/// The schema's `Text` bound (`maxLength`, in characters); a test holds the two equal.
pub const MAX_TEXT_CHARS: usize = 1_000_000;
/// Most metadata keys (the schema's `Metadata`).
pub const MAX_METADATA_KEYS: usize = 64;
/// Largest serialised event line, so a single event can never exhaust memory on read.
pub const MAX_EVENT_BYTES: usize = 8 << 20;
/// Most events in one `append` call.
pub const MAX_BATCH_EVENTS: usize = 4096;
/// `read` returns at most this many events; larger limits are clamped.
pub const MAX_READ_LIMIT: usize = 1000;
/// `list` returns at most this many threads; larger limits are clamped.
pub const MAX_LIST_LIMIT: usize = 1000;
/// Largest `seq` the wire can carry (2^53 - 1).
pub const MAX_SEQ: u64 = 9_007_199_254_740_991;
/// In keyed mode, a `sealed` event follows the first commit that crosses each multiple of this
/// many events (StoreOptions::seal_every).
pub const DEFAULT_SEAL_EVERY: u64 = 256;
/// Longest `reason` the store writes into a `repaired` event (the schema's `ShortText`).
const MAX_REASON_CHARS: usize = 1024;

/// When `append` returns, relative to the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// Group commit: batch concurrent appends, write, fdatasync once, then acknowledge them all.
    #[default]
    Sync,
    /// Written to the OS (survives a process crash, not a power loss) but not fsynced until
    /// `flush`/close.
    Buffered,
    /// Kept in memory until `flush`/close; a crash loses everything since the last flush.
    Ephemeral,
}

/// How a store is opened.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    pub durability: Durability,
    /// Most requests one group commit takes from the queue (a round never grows unbounded).
    pub max_batch_requests: usize,
    /// The format version written in new headers and targeted by `migrate`. Only 1 exists; tests
    /// set 2 to exercise the migration path.
    pub format_version: u16,
    /// Keyed mode: head anchors and periodic `sealed` events carry an HMAC-SHA256 under this
    /// host-supplied key, so history rewritten by someone without it is detected even when every
    /// hash was recomputed. `None` (the default) is unkeyed mode. Never written anywhere.
    pub key: Option<RolloutKey>,
    /// Open threads whose head anchor is missing or unreadable (both slots damaged), or, in
    /// keyed mode, whose anchor carries no MAC, instead of refusing them. What this vouches for
    /// is recorded in a `repaired` event and reported by `verify`. Default: refuse.
    pub accept_unanchored: bool,
    /// Keyed mode only: events between two `sealed` events (at least 1).
    pub seal_every: u64,
    /// Threads whose head, anchor state and file handles stay loaded; beyond it the least
    /// recently used idle ones are dropped (their summary stays in the index, 1 is the least).
    pub max_loaded_threads: usize,
    /// Tail cache: events kept per thread (0 turns the cache off).
    pub tail_cache_events: usize,
    /// Tail cache: bytes kept per thread (its events' JSON text and its header).
    pub tail_cache_thread_bytes: usize,
    /// Tail cache: bytes kept over all threads; beyond it the least recently used tails go.
    pub tail_cache_bytes: usize,
    /// Open for inspection only (`rollout verify`, `graph inspect`, read-only snapshots): no
    /// byte of the state directory is created, changed or removed — files are opened read-only,
    /// no lock file is created (an existing one is share-locked), SQLite is opened read-only —
    /// and what a writable open would repair (a torn tail, unauthenticated keyed events, an
    /// unfinished `start`) is reported by `verify` as damage, with its seq and byte offset,
    /// instead of being cut. Every write is refused. Default: false.
    pub read_only: bool,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            durability: Durability::Sync,
            max_batch_requests: 1024,
            format_version: FORMAT_VERSION,
            key: None,
            accept_unanchored: false,
            seal_every: DEFAULT_SEAL_EVERY,
            max_loaded_threads: 1024,
            tail_cache_events: 512,
            tail_cache_thread_bytes: 1 << 20,
            tail_cache_bytes: 32 << 20,
            read_only: false,
        }
    }
}

impl StoreOptions {
    /// The small-device profile (`ServerConfig::compact`; docs/engine.md, "Small devices"): 16
    /// loaded store slots and a 512 KiB tail cache (32 events, 32 KiB per thread), group commits
    /// of at most 64 requests; everything else as `default()`.
    pub fn compact() -> Self {
        StoreOptions {
            max_batch_requests: 64,
            max_loaded_threads: 16,
            tail_cache_events: 32,
            tail_cache_thread_bytes: 32 << 10,
            tail_cache_bytes: 512 << 10,
            ..StoreOptions::default()
        }
    }
}

/// An event to append; the store adds seq, hashes and time.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    /// An object with a string `type` (one of the schema's `EventPayload` tags).
    pub payload: Value,
    pub trace_id: Option<String>,
    pub parent_id: Option<String>,
    pub idempotency_key: Option<String>,
}

impl NewEvent {
    /// An event with only a payload.
    pub fn new(payload: Value) -> Self {
        NewEvent {
            payload,
            trace_id: None,
            parent_id: None,
            idempotency_key: None,
        }
    }
}

/// An event the store's rules have already accepted (`CheckedEvent::new` runs the same checks
/// as `append`, the schema's `EventPayload` included), so `append_batch` does not check it again:
/// whoever must check an event first (to word the refusal itself) checks it once.
/// It also carries the payload already serialised (its RFC 8785 members), so the thread that
/// checked it did that work too, not the commit leader.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckedEvent {
    event: NewEvent,
    encoded: encode::EncodedPayload,
}

impl CheckedEvent {
    pub fn new(event: NewEvent) -> Result<CheckedEvent, StoreError> {
        Self::try_new(event).map_err(|(e, _)| e)
    }

    /// `new`, handing the event back with the refusal (so a caller can say what was wrong
    /// with it in its own terms without having cloned it first).
    pub fn try_new(event: NewEvent) -> Result<CheckedEvent, (StoreError, Box<NewEvent>)> {
        match validate_new_event(&event) {
            Ok(()) => {
                let encoded = encode::EncodedPayload::new(&event.payload);
                Ok(CheckedEvent { event, encoded })
            }
            Err(e) => Err((e, Box::new(event))),
        }
    }

    /// An `itemDelta` of a `text` delta with no other members, checked and encoded from its
    /// parts: what the schema asks of it is that both ids are Identifiers and the text is at
    /// most `MAX_TEXT_CHARS` characters, checked here directly (a test holds this to the schema
    /// check over the edge cases). The payload is shed from the start (`shed_payload`). `None`
    /// when a part fails, so the caller takes the generic path and its wording of the refusal.
    pub fn text_delta(turn_id: &str, item_id: &str, text: &str) -> Option<CheckedEvent> {
        let fits = text.len() <= MAX_TEXT_CHARS || text.chars().count() <= MAX_TEXT_CHARS;
        if !is_wire_identifier(turn_id) || !is_wire_identifier(item_id) || !fits {
            return None;
        }
        Some(CheckedEvent {
            event: NewEvent::new(Value::Null),
            encoded: encode::EncodedPayload::text_delta(turn_id, item_id, text),
        })
    }

    /// Sets the event's trace and parent ids (`trace`) after the check: the engine computes
    /// them (a trace id of 32 hex, a parent reference of at most 71 characters), so they are
    /// within the schema's 1–128 characters by construction.
    pub fn set_trace(&mut self, trace_id: Option<String>, parent_id: Option<String>) {
        debug_assert!(trace_id
            .as_ref()
            .is_none_or(|t| (1..=128).contains(&t.len())));
        debug_assert!(parent_id
            .as_ref()
            .is_none_or(|p| (1..=128).contains(&p.len())));
        self.event.trace_id = trace_id;
        self.event.parent_id = parent_id;
    }

    /// Bytes of the encoded payload (for the in-flight bound).
    pub fn encoded_len(&self) -> usize {
        self.encoded.len_hint()
    }

    pub fn event(&self) -> &NewEvent {
        &self.event
    }

    pub fn into_inner(self) -> NewEvent {
        let mut event = self.event;
        if event.payload.is_null() {
            // Shed (`shed_payload`): the encoded text is the payload, parsed back.
            let mut text = Vec::new();
            self.encoded.write_line(&mut text);
            event.payload = from_json_bytes(&text).expect("an encoded payload parses");
        }
        event
    }

    /// Lets the parsed payload of a kind the store only writes (deltas, item and tool events,
    /// status changes) go here, on the thread that built it: the store seals from the encoded
    /// text, and freeing a tree on the thread that allocated it is several times cheaper than on
    /// the committer's (glibc's arenas). `into_inner` parses it back for a store that needs it;
    /// `event().payload` is `null` from here on.
    pub fn shed_payload(&mut self) {
        if store::is_hot_kind(&self.event.payload) {
            self.event.payload = Value::Null;
        }
    }

    fn into_parts(self) -> (NewEvent, encode::EncodedPayload) {
        (self.event, self.encoded)
    }
}

/// Writes `s` as a JSON string (RFC 8785's escapes, which are serde_json's too).
pub fn write_json_string(s: &str, out: &mut String) {
    encode::write_string(s, out)
}

/// One event as stored: exactly the schema's `RolloutEvent`, fields in schema order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StoredEvent {
    pub seq: u64,
    pub prev_hash: String,
    pub hash: String,
    pub time: String,
    pub trace_id: Option<String>,
    pub parent_id: Option<String>,
    pub idempotency_key: Option<String>,
    pub payload: Value,
}

impl StoredEvent {
    /// The wire form (`RolloutEvent`).
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).expect("a StoredEvent always serialises")
    }

    /// The payload's `type` tag ("" if absent, which the store never writes).
    pub fn kind(&self) -> &str {
        self.payload
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("")
    }

    /// Recomputes this event's hash from its other fields.
    pub fn compute_hash(&self) -> String {
        event_hash(
            self.seq,
            &self.prev_hash,
            &self.time,
            self.trace_id.as_deref(),
            self.parent_id.as_deref(),
            self.idempotency_key.as_deref(),
            &self.payload,
        )
    }
}

/// Where each store keeps its files inside the state dir (docs/rollout-format.md), so tools that
/// read the files directly (the CLI, verifiers) name them the way the stores do.
/// Parses JSON bytes with the `&str` reader the rest of the library parses with. serde_json
/// instantiates its whole deserializer (every type's visitor) once per reader type, so reading
/// event lines through `from_slice` kept a second copy of it: 10s of KB of the mobile library
/// (docs/bench/size.md). Invalid UTF-8 is refused here, as `from_slice` refused it.
pub(crate) fn from_json_bytes<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
) -> serde_json::Result<T> {
    match std::str::from_utf8(bytes) {
        Ok(text) => serde_json::from_str(text),
        Err(e) => Err(<serde_json::Error as serde::de::Error>::custom(
            format_args!("invalid UTF-8 at byte {}", e.valid_up_to()),
        )),
    }
}

pub mod layout {
    use std::path::{Path, PathBuf};

    /// The JSONL logs: `<state>/threads/<id>.jsonl`.
    pub const THREADS_DIR: &str = "threads";
    /// The JSONL head anchors: `<state>/anchors/<id>.head`.
    pub const ANCHORS_DIR: &str = "anchors";
    /// A JSONL log's file name suffix.
    pub const LOG_SUFFIX: &str = ".jsonl";
    /// A JSONL anchor's file name suffix.
    pub const ANCHOR_SUFFIX: &str = ".head";
    /// Bytes cut from a log (torn tails, quarantined events): `<id>.jsonl.broken[.N]`.
    pub const BROKEN_SUFFIX: &str = ".jsonl.broken";
    /// The SQLite store's database file.
    pub const SQLITE_FILE: &str = super::sqlite::SQLITE_FILE;
    /// The state dir's lock file (one store per directory).
    pub const LOCK_FILE: &str = "LOCK";
    /// The store's id (`<state>/STORE_ID`), which keyed anchors are bound to.
    pub const STORE_ID_FILE: &str = super::identity::STORE_ID_FILE;

    /// A thread's JSONL log. `id` must already be a valid thread id.
    pub fn thread_log(state_dir: &Path, id: &str) -> PathBuf {
        state_dir.join(THREADS_DIR).join(format!("{id}.jsonl"))
    }

    /// A thread's head anchor. `id` must already be a valid thread id.
    pub fn anchor(state_dir: &Path, id: &str) -> PathBuf {
        state_dir.join(ANCHORS_DIR).join(format!("{id}.head"))
    }
}

/// Where a forked thread came from: the wire type itself (generated from the schema).
pub use crate::protocol::ForkOrigin;

/// What `start` needs.
#[derive(Debug, Clone, Default)]
pub struct ThreadStart {
    pub thread_id: String,
    pub title: Option<String>,
    pub metadata: Map<String, Value>,
    pub forked_from: Option<ForkOrigin>,
}

/// What `start_recorded` adds to a thread's header event, so that it survives restarts: the
/// host's `agentOptions` (a member of the header payload), the `idempotencyKey` of the request
/// that created the thread (the event's own `idempotencyKey`), and the request's trace (the
/// event's `traceId`, and `parentId` naming the caller's span; `trace`).
#[derive(Debug, Clone, Default)]
pub struct HeaderExtra {
    pub agent_options: Option<Value>,
    pub idempotency_key: Option<String>,
    pub trace_id: Option<String>,
    pub parent_id: Option<String>,
}

/// A thread's head and header, as `list`/`summary` report it.
#[derive(Debug, Clone, PartialEq)]
pub struct ThreadSummary {
    pub thread_id: String,
    pub title: Option<String>,
    pub metadata: Map<String, Value>,
    pub created_at: String,
    pub updated_at: String,
    pub archived: bool,
    pub last_seq: u64,
    pub head_hash: String,
    pub forked_from: Option<ForkOrigin>,
    /// Format version after migrations.
    pub format_version: u16,
    /// Seq of the latest `compacted` event, if any: a resumer reads the header (seq 1) and then
    /// from this seq on, instead of the whole history.
    pub last_compaction_seq: Option<u64>,
    /// `toSeq` of the latest compaction (0 if none).
    pub compacted_through: u64,
}

/// One page of `read`.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadPage {
    pub events: Vec<StoredEvent>,
    pub has_more: bool,
}

/// One page of `read_json`: each event as its exact JSON text (the schema's `RolloutEvent`,
/// the line the store keeps), so a server can answer with it without decoding it again.
#[derive(Debug, Clone, PartialEq)]
pub struct JsonPage {
    pub events: Vec<Arc<str>>,
    pub has_more: bool,
}

/// An event `append_batch` committed: its seq and time, and its JSON text (shared with the
/// store's tail cache: serialised once).
#[derive(Debug, Clone, PartialEq)]
pub struct AppendedEvent {
    pub seq: u64,
    pub time: String,
    pub line: Arc<str>,
}

impl AppendedEvent {
    /// The payload's JSON text inside the line (`{"type":…}`; the `type` member comes first).
    pub fn payload_json(&self) -> &str {
        &self.line[store::payload_range(&self.line)]
    }

    /// The event's chain hash (64 hex digits), read from its line: every sealed line starts
    /// `{"seq":N,"prevHash":"…","hash":"…"`.
    pub fn hash(&self) -> &str {
        const AT: &str = ",\"hash\":\"";
        self.line
            .find(AT)
            .and_then(|i| self.line.get(i + AT.len()..i + AT.len() + 64))
            .unwrap_or_default()
    }
}

/// A borrowed view of one thread's summary, as `list_with` visits it.
#[derive(Debug, Clone, Copy)]
pub struct SummaryRef<'a> {
    pub thread_id: &'a str,
    pub title: Option<&'a str>,
    pub metadata: &'a Map<String, Value>,
    pub created_at: &'a str,
    pub updated_at: &'a str,
    pub archived: bool,
    pub last_seq: u64,
    pub forked_from: Option<&'a ForkOrigin>,
}

/// What `list_with` returns besides the visited threads.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ListRest {
    pub next_cursor: Option<String>,
    pub unreadable: Vec<(String, String)>,
}

/// What the store holds in memory now (for `AppServer::stats_snapshot` and the benchmarks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StoreStats {
    /// Threads in the summary index (every thread of the state directory).
    pub indexed_threads: u64,
    /// Of those, not summarised yet (loaded on first use or by `warm`).
    pub unsummarised_threads: u64,
    /// Threads whose slot (head, anchor state, handles) is loaded.
    pub loaded_threads: u64,
    /// Slots dropped to stay under `max_loaded_threads`.
    pub unloaded_threads: u64,
    /// Threads with a cached tail, and the bytes the tail cache holds.
    pub cached_threads: u64,
    pub cached_bytes: u64,
    /// Tails dropped to stay under the cache's byte budget.
    pub cache_evictions: u64,
}

/// Parameters of `list`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListQuery {
    pub include_archived: bool,
    /// Opaque: pass back `next_cursor` from the previous page.
    pub cursor: Option<String>,
    /// 1..=MAX_LIST_LIMIT (larger is clamped, 0 is refused).
    pub limit: usize,
}

impl Default for ListQuery {
    fn default() -> Self {
        ListQuery {
            include_archived: false,
            cursor: None,
            limit: 100,
        }
    }
}

/// One page of `list`, ordered by thread id.
#[derive(Debug, Clone, PartialEq)]
pub struct ListPage {
    pub threads: Vec<ThreadSummary>,
    pub next_cursor: Option<String>,
    /// Threads met on the way that could not be opened or verified (id, reason): a damaged
    /// thread is reported, never silently skipped, and never stops the others from being listed.
    /// Every thread the disk holds evidence of counts (a log, an anchor, a row), whether or not
    /// it opens. They count towards the page's `limit` together with `threads`.
    pub unreadable: Vec<(String, String)>,
}

/// The result of checking a thread's whole chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyReport {
    pub thread_id: String,
    /// Events that checked out (the good prefix).
    pub events: u64,
    pub head_seq: u64,
    pub head_hash: String,
    pub first_bad_seq: Option<u64>,
    pub reason: Option<String>,
    /// Repairs this process made when it opened the thread (torn tails cut, anchors rebuilt).
    pub repairs: Vec<String>,
    /// What limits the proof without making the chain wrong: an anchor slot fallen back on (and
    /// the seqs that could have been lost), an accepted unanchored thread, a keyed thread checked
    /// without its key. Each names the seqs that cannot be vouched for.
    pub warnings: Vec<String>,
    /// True when a key checked the anchor and the seals (keyed mode); false means only the
    /// unkeyed chain was checked ("unkeyed"), which anyone can recompute.
    pub keyed: bool,
    /// Keyed mode: the highest seq the anchor's MAC or a seal vouches for.
    pub authenticated_through: Option<u64>,
}

impl VerifyReport {
    /// True if the whole chain checked out.
    pub fn ok(&self) -> bool {
        self.first_bad_seq.is_none() && self.reason.is_none()
    }
}

/// Everything a store can refuse. Messages say what to do next.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("thread {0:?} not found: check the id, or start it first")]
    NotFound(String),
    #[error("thread {0:?} already exists: pick another id, or resume it instead of starting it")]
    AlreadyExists(String),
    #[error("invalid id {id:?}: {reason}; thread ids are 1-160 ASCII letters, digits, '_' or '-', starting with a letter or digit (they become file names)")]
    InvalidId { id: String, reason: String },
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("thread {thread_id:?} is corrupt at seq {seq}: {reason}; the log was not modified - restore it from a backup or fork from an earlier seq")]
    Corrupt {
        thread_id: String,
        seq: u64,
        reason: String,
    },
    #[error("thread {thread_id:?} does not match its head anchor: {reason}; acknowledged events are missing or the log was replaced - restore the log from a backup")]
    AnchorMismatch { thread_id: String, reason: String },
    /// The state directory cannot be trusted: the text says what is wrong and what fixes it.
    #[error("unsafe state directory: {0}")]
    UnsafeStateDir(String),
    /// Another store holds the directory: the text says whether in this process or another.
    #[error("state directory {0}")]
    Locked(String),
    #[error("rollout I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("SQLite rollout store: {0}")]
    Sqlite(String),
    #[error("the rollout store is closed; open it again")]
    Closed,
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Sqlite(e.to_string())
    }
}

/// The durable rollout store. Shared across threads as `Arc<dyn RolloutStore>`.
pub trait RolloutStore: Send + Sync {
    /// Creates a thread; seq 1 is its `threadStarted` header.
    fn start(&self, start: ThreadStart) -> Result<(ThreadSummary, StoredEvent), StoreError>;
    /// `start`, recording `recorded` in the header event too.
    fn start_recorded(
        &self,
        start: ThreadStart,
        recorded: HeaderExtra,
    ) -> Result<(ThreadSummary, StoredEvent), StoreError>;
    /// Appends a batch atomically; returns once durable per the store's `Durability`.
    fn append(
        &self,
        thread_id: &str,
        events: Vec<NewEvent>,
    ) -> Result<Vec<StoredEvent>, StoreError>;
    /// Events with seq > `after_seq`, at most `limit` (clamped to MAX_READ_LIMIT, 0 refused).
    /// Always the full history: compaction never hides events (see `ThreadSummary::last_compaction_seq`).
    fn read(&self, thread_id: &str, after_seq: u64, limit: usize) -> Result<ReadPage, StoreError>;
    fn summary(&self, thread_id: &str) -> Result<ThreadSummary, StoreError>;
    fn list(&self, query: &ListQuery) -> Result<ListPage, StoreError>;
    fn checkpoint(&self, thread_id: &str, label: &str) -> Result<StoredEvent, StoreError>;
    /// Appends `{"type":"compacted"}` summarising fromSeq..=through_seq; old events are kept.
    fn compact(
        &self,
        thread_id: &str,
        summary: &str,
        through_seq: u64,
    ) -> Result<StoredEvent, StoreError>;
    /// A new thread whose header records where it came from, carrying copies of the source's
    /// events 2..=at_seq (default: the head) so it resumes on its own.
    fn fork(
        &self,
        source: &str,
        at_seq: Option<u64>,
        new_thread_id: &str,
        title: Option<String>,
    ) -> Result<(ThreadSummary, StoredEvent), StoreError>;
    fn set_archived(&self, thread_id: &str, archived: bool) -> Result<StoredEvent, StoreError>;
    /// Upgrades a thread to the store's format version; None if already current.
    fn migrate(&self, thread_id: &str) -> Result<Option<StoredEvent>, StoreError>;
    /// The `turnCompleted` event of that turn, if recorded.
    fn terminal_evidence(
        &self,
        thread_id: &str,
        turn_id: &str,
    ) -> Result<Option<StoredEvent>, StoreError>;
    /// Checks the whole chain and the anchor.
    fn verify(&self, thread_id: &str) -> Result<VerifyReport, StoreError>;
    /// Entries in the store that cannot belong to any thread (a log whose file name is not a
    /// thread id, a row whose key is not one): (name, reason). `list` cannot report them under
    /// an id, so a full verification asks for them here.
    fn stray_entries(&self) -> Result<Vec<(String, String)>, StoreError> {
        Ok(Vec::new())
    }
    /// Makes everything written so far durable (the only durability point for Buffered/Ephemeral).
    fn flush(&self) -> Result<(), StoreError>;
    /// Flushes and refuses every later call with `Closed`. Dropping the last handle also flushes.
    fn close(&self) -> Result<(), StoreError>;

    /// Appends to several threads in one commit round (their fsyncs shared), each batch atomic
    /// on its own; returns per batch, in order, once durable per the store's `Durability`. The
    /// events come back as their JSON text, so a caller never serialises them again.
    fn append_batch(
        &self,
        batches: Vec<(String, Vec<CheckedEvent>)>,
    ) -> Vec<Result<Vec<AppendedEvent>, StoreError>> {
        batches
            .into_iter()
            .map(|(id, events)| {
                let events = events.into_iter().map(CheckedEvent::into_inner).collect();
                self.append(&id, events).map(|evs| {
                    evs.into_iter()
                        .map(|e| AppendedEvent {
                            seq: e.seq,
                            time: e.time.clone(),
                            line: Arc::from(
                                serde_json::to_string(&e).expect("a StoredEvent serialises"),
                            ),
                        })
                        .collect()
                })
            })
            .collect()
    }
    /// `read`, each event as its JSON text.
    fn read_json(
        &self,
        thread_id: &str,
        after_seq: u64,
        limit: usize,
    ) -> Result<JsonPage, StoreError> {
        let page = self.read(thread_id, after_seq, limit)?;
        Ok(JsonPage {
            events: page
                .events
                .iter()
                .map(|e| Arc::from(serde_json::to_string(e).expect("a StoredEvent serialises")))
                .collect(),
            has_more: page.has_more,
        })
    }
    /// The newest `limit` events before seq `before` (`None`: the head), oldest first,
    /// without reading the history before them; `has_more` says whether older ones exist.
    fn read_back(
        &self,
        thread_id: &str,
        before: Option<u64>,
        limit: usize,
    ) -> Result<ReadPage, StoreError> {
        let head = self.summary(thread_id)?.last_seq;
        let before = before.unwrap_or(head + 1).min(head + 1);
        let from = before.saturating_sub(limit as u64).max(1);
        if before <= 1 {
            return Ok(ReadPage {
                events: Vec::new(),
                has_more: false,
            });
        }
        let page = self.read(thread_id, from - 1, (before - from) as usize)?;
        Ok(ReadPage {
            events: page.events,
            has_more: from > 1,
        })
    }
    /// The thread's header (seq 1), without reading anything else.
    fn header(&self, thread_id: &str) -> Result<StoredEvent, StoreError> {
        self.read(thread_id, 0, 1)?
            .events
            .pop()
            .ok_or_else(|| StoreError::NotFound(thread_id.to_string()))
    }
    /// `list`, visiting each thread's summary in place instead of copying it.
    fn list_with(
        &self,
        query: &ListQuery,
        visit: &mut dyn FnMut(SummaryRef<'_>),
    ) -> Result<ListRest, StoreError> {
        let page = self.list(query)?;
        for s in &page.threads {
            visit(SummaryRef {
                thread_id: &s.thread_id,
                title: s.title.as_deref(),
                metadata: &s.metadata,
                created_at: &s.created_at,
                updated_at: &s.updated_at,
                archived: s.archived,
                last_seq: s.last_seq,
                forked_from: s.forked_from.as_ref(),
            });
        }
        Ok(ListRest {
            next_cursor: page.next_cursor,
            unreadable: page.unreadable,
        })
    }
    /// The first event of the thread recorded with `idempotencyKey == key`, if any.
    fn find_by_idempotency_key(
        &self,
        thread_id: &str,
        key: &str,
    ) -> Result<Option<StoredEvent>, StoreError> {
        let mut after = 0;
        loop {
            let page = self.read(thread_id, after, MAX_READ_LIMIT)?;
            for e in page.events {
                after = e.seq;
                if e.idempotency_key.as_deref() == Some(key) {
                    return Ok(Some(e));
                }
            }
            if !page.has_more {
                return Ok(None);
            }
        }
    }
    /// The thread whose header records `idempotencyKey == key` (the request that created it).
    fn thread_by_start_key(&self, key: &str) -> Result<Option<String>, StoreError> {
        let mut cursor = None;
        loop {
            let page = self.list(&ListQuery {
                include_archived: true,
                cursor,
                limit: MAX_LIST_LIMIT,
            })?;
            for t in &page.threads {
                if self.header(&t.thread_id)?.idempotency_key.as_deref() == Some(key) {
                    return Ok(Some(t.thread_id.clone()));
                }
            }
            match page.next_cursor {
                Some(c) => cursor = Some(c),
                None => return Ok(None),
            }
        }
    }
    /// Summarises, in the background, the threads the index knows by name only, so `list`
    /// never has to open them; returns early when `stop` is set. Reads only, writes nothing.
    fn warm(&self, _stop: &std::sync::atomic::AtomicBool) {}
    /// What the store holds in memory now.
    fn stats(&self) -> StoreStats {
        StoreStats::default()
    }
}

/// Which store to open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    Jsonl,
    Sqlite,
}

/// Opens (creating if needed) a store in `state_dir`.
/// What a read-only store answers every write set with.
pub(crate) fn refuse_read_only<T>(sets: &[T]) -> Vec<Result<(), StoreError>> {
    sets.iter()
        .map(|_| {
            Err(StoreError::InvalidArgument(
                "the rollout store was opened read-only".into(),
            ))
        })
        .collect()
}

pub fn open_store(
    kind: StoreKind,
    state_dir: &Path,
    options: StoreOptions,
) -> Result<Arc<dyn RolloutStore>, StoreError> {
    Ok(match kind {
        StoreKind::Jsonl => Arc::new(open_jsonl(state_dir, options)?),
        StoreKind::Sqlite => Arc::new(open_sqlite(state_dir, options)?),
    })
}

/// The JSONL store (one file per thread).
pub type JsonlRolloutStore = store::BackedStore<JsonlBackend>;
/// The SQLite store (one database per state directory).
pub type SqliteRolloutStore = store::BackedStore<SqliteBackend>;

pub fn open_jsonl(
    state_dir: &Path,
    mut options: StoreOptions,
) -> Result<JsonlRolloutStore, StoreError> {
    check_options(&options)?;
    let (dir, lock) = lock_state_dir(state_dir, &options)?;
    let found = read_store_id(&dir, &options)?;
    let mut backend = JsonlBackend::open(dir, &options)?;
    let store_id = settle_store_id(found, &options, backend.state_dir(), || {
        backend.holds_keyed_threads()
    })?;
    options.key = options.key.map(|k| k.bound_to(store_id.as_deref()));
    backend.bind_key(options.key.clone());
    store::BackedStore::new(backend, lock, options)
}

pub fn open_sqlite(
    state_dir: &Path,
    mut options: StoreOptions,
) -> Result<SqliteRolloutStore, StoreError> {
    check_options(&options)?;
    let (dir, lock) = lock_state_dir(state_dir, &options)?;
    let found = read_store_id(&dir, &options)?;
    let mut backend = SqliteBackend::open(dir, &options)?;
    let store_id = settle_store_id(found, &options, backend.state_dir(), || {
        backend.holds_keyed_threads()
    })?;
    options.key = options.key.map(|k| k.bound_to(store_id.as_deref()));
    backend.bind_key(options.key.clone());
    store::BackedStore::new(backend, lock, options)
}

fn lock_state_dir(
    state_dir: &Path,
    options: &StoreOptions,
) -> Result<(fsutil::Dir, fsutil::DirLock), StoreError> {
    if options.read_only {
        fsutil::open_state_dir_read_only(state_dir)
    } else {
        fsutil::prepare_state_dir(state_dir)
    }
}

/// The state directory's store id, read only in keyed mode: unkeyed, nothing depends on it (a
/// damaged file cannot stop an unkeyed store from opening).
fn read_store_id(dir: &fsutil::Dir, options: &StoreOptions) -> Result<Option<String>, StoreError> {
    if options.key.is_none() {
        return Ok(None);
    }
    identity::read(dir)
}

/// The id keyed anchors are bound to: the directory's, or, for a keyed writable store without
/// one that holds no keyed thread yet, a new one. A directory already holding keyed threads
/// but no id was written before store ids and keeps none (module `identity`).
fn settle_store_id(
    found: Option<String>,
    options: &StoreOptions,
    dir: &fsutil::Dir,
    holds_keyed_threads: impl FnOnce() -> Result<bool, StoreError>,
) -> Result<Option<String>, StoreError> {
    if found.is_some() || options.key.is_none() || options.read_only || holds_keyed_threads()? {
        return Ok(found);
    }
    Ok(Some(identity::create(dir)?))
}

fn check_options(options: &StoreOptions) -> Result<(), StoreError> {
    if options.format_version == 0 {
        return Err(StoreError::InvalidArgument(
            "format_version must be at least 1".into(),
        ));
    }
    if options.seal_every == 0 {
        return Err(StoreError::InvalidArgument(
            "seal_every must be at least 1".into(),
        ));
    }
    Ok(())
}

/// Who is reading a chain: the thread the events must belong to, and the key (if any) that
/// checks `sealed` events.
#[derive(Clone, Copy)]
pub(crate) struct ChainCtx<'a> {
    pub thread_id: &'a str,
    pub key: Option<&'a RolloutKey>,
}

/// Checks a stored event against the schema's `RolloutEvent` (envelope and payload): what every
/// event read from disk must pass before it is served or folded into a thread's state.
pub fn validate_stored_event(ev: &StoredEvent) -> Result<(), String> {
    // The envelope is checked with a stand-in payload so the (possibly large) payload is never
    // cloned; the payload is then checked on its own.
    let envelope = serde_json::json!({
        "seq": ev.seq, "prevHash": ev.prev_hash, "hash": ev.hash, "time": ev.time,
        "traceId": ev.trace_id, "parentId": ev.parent_id, "idempotencyKey": ev.idempotency_key,
        "payload": {"type": "checkpoint", "label": ""},
    });
    cc_agent_protocol::validate_protocol_definition("RolloutEvent", &envelope).map_err(|e| {
        format!(
            "the event does not match the schema: {}",
            short(&e.to_string())
        )
    })?;
    cc_agent_protocol::validate_protocol_definition("EventPayload", &ev.payload).map_err(|e| {
        format!(
            "the payload does not match the schema: {}",
            short(&e.to_string())
        )
    })
}

/// Caps a message (a validator report can list many issues) for errors and `repaired` reasons.
fn short(text: &str) -> String {
    cap_chars(text, 300)
}

fn cap_chars(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut out: String = text.chars().take(max.saturating_sub(3)).collect();
    out.push_str("...");
    out
}

/// The schema's `Identifier` rule, checked before any id touches the file system.
pub fn validate_thread_id(id: &str) -> Result<(), StoreError> {
    validate_identifier(id)
}

fn validate_identifier(id: &str) -> Result<(), StoreError> {
    let bad = |reason: String| {
        Err(StoreError::InvalidId {
            id: id.chars().take(140).collect(),
            reason,
        })
    };
    if id.is_empty() {
        return bad("it is empty".into());
    }
    if id.len() > MAX_ID_LEN {
        return bad(format!(
            "it is {} bytes long, the limit is {MAX_ID_LEN}",
            id.len()
        ));
    }
    if let Some((i, c)) = id
        .char_indices()
        .find(|(_, c)| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
    {
        let what = match c {
            '/' | '\\' => "a path separator".to_string(),
            '.' => "a dot (ids are never paths)".to_string(),
            '\0' => "a NUL byte".to_string(),
            c if c.is_control() => format!("control character U+{:04X}", c as u32),
            c if !c.is_ascii() => format!("non-ASCII character {c:?} (U+{:04X})", c as u32),
            c => format!("character {c:?}"),
        };
        return bad(format!("{what} at byte {i}"));
    }
    if id.starts_with(['_', '-']) {
        return bad("it starts with '_' or '-'".into());
    }
    Ok(())
}

/// The schema's (the published) `Identifier`: 1 to 160 ASCII letters, digits, '.', '_', ':', '/'
/// and '-', starting with a letter or digit. Ids the engine only carries (turns, items) are held
/// to this; ids that become file names to `validate_thread_id`.
pub fn is_wire_identifier(id: &str) -> bool {
    let b = id.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_ID_LEN
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b':' | b'/' | b'-'))
}

/// `sha256(JCS(event without "hash"))`, built without cloning the payload. JCS orders the
/// envelope's keys as: idempotencyKey, parentId, payload, prevHash, seq, time, traceId.
pub fn event_hash(
    seq: u64,
    prev_hash: &str,
    time: &str,
    trace_id: Option<&str>,
    parent_id: Option<&str>,
    idempotency_key: Option<&str>,
    payload: &Value,
) -> String {
    use cc_agent_protocol::jcs::canonicalize;
    let opt = |s: Option<&str>| match s {
        Some(s) => canonicalize(&Value::String(s.to_string())),
        None => "null".to_string(),
    };
    let s = |s: &str| canonicalize(&Value::String(s.to_string()));
    let text = format!(
        "{{\"idempotencyKey\":{},\"parentId\":{},\"payload\":{},\"prevHash\":{},\"seq\":{},\"time\":{},\"traceId\":{}}}",
        opt(idempotency_key),
        opt(parent_id),
        canonicalize(payload),
        s(prev_hash),
        seq,
        s(time),
        opt(trace_id)
    );
    cc_agent_protocol::sha256_hex(text.as_bytes())
}

fn is_chain_hash(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Checks what the store requires of an event before it is sealed, including the schema: an
/// event the store would refuse to read back is never written.
fn validate_new_event(ev: &NewEvent) -> Result<(), StoreError> {
    let kind = ev
        .payload
        .as_object()
        .and_then(|o| o.get("type"))
        .and_then(Value::as_str)
        .ok_or_else(|| {
            StoreError::InvalidArgument("payload must be an object with a string \"type\"".into())
        })?;
    if kind.is_empty() {
        return Err(StoreError::InvalidArgument(
            "payload \"type\" is empty".into(),
        ));
    }
    if kind == "threadStarted" {
        return Err(StoreError::InvalidArgument(
            "threadStarted is written by start/fork only, never appended".into(),
        ));
    }
    if kind == "sealed" {
        return Err(StoreError::InvalidArgument(
            "sealed events are written by the store in keyed mode only, never appended".into(),
        ));
    }
    cc_agent_protocol::validate_protocol_definition("EventPayload", &ev.payload).map_err(|e| {
        StoreError::InvalidArgument(format!(
            "payload does not match the schema's EventPayload: {}",
            short(&e.to_string())
        ))
    })?;
    for (name, v) in [("traceId", &ev.trace_id), ("parentId", &ev.parent_id)] {
        if let Some(v) = v {
            let n = v.chars().count();
            if n == 0 || n > MAX_TRACE_LEN {
                return Err(StoreError::InvalidArgument(format!(
                    "{name} must be 1-{MAX_TRACE_LEN} characters, got {n}"
                )));
            }
        }
    }
    if let Some(k) = &ev.idempotency_key {
        if !is_wire_identifier(k) {
            return Err(StoreError::InvalidArgument(format!(
                "idempotencyKey {:?} is not an Identifier (1-160 of A-Z a-z 0-9 . _ : / -, starting with a letter or digit)",
                k.chars().take(40).collect::<String>()
            )));
        }
    }
    Ok(())
}

fn check_title(title: &Option<String>) -> Result<(), StoreError> {
    match title {
        Some(t) if t.chars().count() > MAX_TITLE_CHARS => Err(StoreError::InvalidArgument(
            format!("title is longer than {MAX_TITLE_CHARS} characters"),
        )),
        _ => Ok(()),
    }
}

fn check_metadata(m: &Map<String, Value>) -> Result<(), StoreError> {
    if m.len() > MAX_METADATA_KEYS {
        return Err(StoreError::InvalidArgument(format!(
            "metadata has {} keys, the limit is {MAX_METADATA_KEYS}",
            m.len()
        )));
    }
    if let Some(k) = m.keys().find(|k| k.is_empty() || k.chars().count() > 128) {
        return Err(StoreError::InvalidArgument(format!(
            "metadata key {:?} must be 1-128 characters",
            k
        )));
    }
    Ok(())
}

/// The header payload of a new thread.
fn header_payload(start: &ThreadStart, format_version: u16) -> Value {
    serde_json::json!({
        "type": "threadStarted",
        "formatVersion": format_version,
        "threadId": start.thread_id,
        "title": start.title,
        "metadata": start.metadata,
        "forkedFrom": start.forked_from,
    })
}
