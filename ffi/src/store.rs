//! `RolloutStore`: read-only-minded access to the durable thread logs for hosts — list threads,
//! page through events, verify a whole hash chain — either from a running server (`AppServer.store`)
//! or opened on its own for a state directory no server is using.

use crate::errors::{signed, ServerError, StoreError};
use cc_app_server::rollout::{self, ListQuery, RolloutStore as CoreStore, StoreOptions};
use std::sync::Arc;

/// Which store backs a state directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, uniffi::Enum)]
pub enum StoreKind {
    /// One JSONL file per thread (the default).
    Jsonl,
    /// One SQLite database.
    Sqlite,
}

impl From<StoreKind> for rollout::StoreKind {
    fn from(k: StoreKind) -> Self {
        match k {
            StoreKind::Jsonl => rollout::StoreKind::Jsonl,
            StoreKind::Sqlite => rollout::StoreKind::Sqlite,
        }
    }
}

/// One thread as listed.
#[derive(Debug, Clone, PartialEq, Eq, uniffi::Record)]
pub struct ThreadSummary {
    pub thread_id: String,
    pub title: Option<String>,
    pub created_at: String,
    pub updated_at: String,
    pub archived: bool,
    pub last_seq: i64,
    pub head_hash: String,
}

/// A thread the store holds evidence of (a log, an anchor, a row) but cannot open or verify.
#[derive(Debug, Clone, PartialEq, Eq, uniffi::Record)]
pub struct UnreadableThread {
    pub thread_id: String,
    /// Why, with the exact seq where one is known.
    pub reason: String,
}

/// A page of `list`.
#[derive(Debug, Clone, PartialEq, Eq, uniffi::Record)]
pub struct ThreadPage {
    pub threads: Vec<ThreadSummary>,
    /// Pass back to get the next page; absent on the last one.
    pub next_cursor: Option<String>,
    /// Threads on this page that could not be read: reported, never skipped silently.
    pub unreadable: Vec<UnreadableThread>,
}

/// One stored event: the indexing fields, plus the whole event (wire `RolloutEvent`) as JSON.
#[derive(Debug, Clone, PartialEq, Eq, uniffi::Record)]
pub struct RolloutEvent {
    pub seq: i64,
    pub hash: String,
    pub prev_hash: String,
    pub time: String,
    /// The payload's `type` tag.
    pub kind: String,
    pub json: String,
}

/// A page of `read`.
#[derive(Debug, Clone, PartialEq, Eq, uniffi::Record)]
pub struct EventPage {
    pub events: Vec<RolloutEvent>,
    pub has_more: bool,
}

/// The result of checking one thread's whole chain and its head anchor.
#[derive(Debug, Clone, PartialEq, Eq, uniffi::Record)]
pub struct VerifyReport {
    pub thread_id: String,
    pub ok: bool,
    /// Events that checked out (the good prefix).
    pub events: i64,
    pub head_seq: i64,
    pub head_hash: String,
    pub first_bad_seq: Option<i64>,
    pub reason: Option<String>,
    /// Repairs made when the store opened the thread (torn tails cut, anchors rebuilt).
    pub repairs: Vec<String>,
    /// What limits the proof without making the chain wrong (an anchor slot fallen back on, an
    /// accepted unanchored thread, a keyed thread checked without its key), naming the seqs
    /// nothing vouches for.
    pub warnings: Vec<String>,
    /// True when a key checked the anchor and the seals; false: only the unkeyed chain.
    pub keyed: bool,
    /// Keyed mode: the highest seq the anchor's MAC or a seal vouches for.
    pub authenticated_through: Option<i64>,
}

impl From<rollout::VerifyReport> for VerifyReport {
    fn from(r: rollout::VerifyReport) -> Self {
        VerifyReport {
            ok: r.ok(),
            thread_id: r.thread_id,
            events: signed(r.events),
            head_seq: signed(r.head_seq),
            head_hash: r.head_hash,
            first_bad_seq: r.first_bad_seq.map(signed),
            reason: r.reason,
            repairs: r.repairs,
            warnings: r.warnings,
            keyed: r.keyed,
            authenticated_through: r.authenticated_through.map(signed),
        }
    }
}

/// A non-negative argument as a count; negative values are refused, not wrapped.
fn count(name: &str, v: i64) -> Result<usize, StoreError> {
    usize::try_from(v).map_err(|_| StoreError::InvalidArgument {
        reason: format!("{name} must not be negative (got {v})"),
    })
}

/// A rollout store handle.
#[derive(uniffi::Object)]
pub struct RolloutStore {
    /// `None` once `close` released a store this handle opened: dropping the last reference is
    /// what gives up the state dir's lock, so a host can reopen the directory right away.
    inner: std::sync::RwLock<Option<Arc<dyn CoreStore>>>,
    /// Opened by this handle (so `close` may close it), rather than borrowed from a server.
    owned: bool,
}

impl RolloutStore {
    pub(crate) fn shared(inner: Arc<dyn CoreStore>) -> RolloutStore {
        RolloutStore {
            inner: std::sync::RwLock::new(Some(inner)),
            owned: false,
        }
    }

    fn store(&self) -> Result<Arc<dyn CoreStore>, StoreError> {
        self.inner
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or(StoreError::Closed)
    }
}

#[uniffi::export]
impl RolloutStore {
    /// Opens the store in `state_dir` (repairing torn tails). `Locked` if a server or another
    /// store holds the directory. `key` (32 bytes) checks keyed threads' anchors and seals;
    /// without it they are reported "unkeyed". `accept_unanchored` opens threads whose anchor is
    /// missing or damaged instead of refusing them.
    #[uniffi::constructor(default(kind = None, key = None, accept_unanchored = None))]
    pub fn open(
        state_dir: String,
        kind: Option<StoreKind>,
        key: Option<Vec<u8>>,
        accept_unanchored: Option<bool>,
    ) -> Result<Arc<RolloutStore>, StoreError> {
        let kind = kind.unwrap_or(StoreKind::Jsonl).into();
        let mut options = StoreOptions::default();
        apply_store_security(&mut options, key.as_deref(), accept_unanchored).map_err(|e| {
            StoreError::InvalidArgument {
                reason: e.to_string(),
            }
        })?;
        let inner = rollout::open_store(kind, state_dir.as_ref(), options)?;
        Ok(Arc::new(RolloutStore {
            inner: std::sync::RwLock::new(Some(inner)),
            owned: true,
        }))
    }

    /// Threads, oldest first; archived ones only when asked. `limit` is clamped to 1000.
    #[uniffi::method(default(include_archived = false, cursor = None, limit = 100))]
    pub fn list(
        &self,
        include_archived: bool,
        cursor: Option<String>,
        limit: i32,
    ) -> Result<ThreadPage, StoreError> {
        let page = self.store()?.list(&ListQuery {
            include_archived,
            cursor,
            limit: count("limit", limit.into())?,
        })?;
        Ok(ThreadPage {
            threads: page
                .threads
                .into_iter()
                .map(|t| ThreadSummary {
                    thread_id: t.thread_id,
                    title: t.title,
                    created_at: t.created_at,
                    updated_at: t.updated_at,
                    archived: t.archived,
                    last_seq: signed(t.last_seq),
                    head_hash: t.head_hash,
                })
                .collect(),
            next_cursor: page.next_cursor,
            unreadable: page
                .unreadable
                .into_iter()
                .map(|(thread_id, reason)| UnreadableThread { thread_id, reason })
                .collect(),
        })
    }

    /// Events with seq > `after_seq`, at most `limit` (clamped to 1000; 0 is refused).
    #[uniffi::method(default(after_seq = 0, limit = 100))]
    pub fn read(
        &self,
        thread_id: String,
        after_seq: i64,
        limit: i32,
    ) -> Result<EventPage, StoreError> {
        let after_seq = count("after_seq", after_seq)? as u64;
        let page = self
            .store()?
            .read(&thread_id, after_seq, count("limit", limit.into())?)?;
        Ok(EventPage {
            events: page
                .events
                .into_iter()
                .map(|e| RolloutEvent {
                    seq: signed(e.seq),
                    kind: e.kind().to_string(),
                    json: e.to_json().to_string(),
                    hash: e.hash,
                    prev_hash: e.prev_hash,
                    time: e.time,
                })
                .collect(),
            has_more: page.has_more,
        })
    }

    /// Checks the thread's whole hash chain and its anchor.
    pub fn verify(&self, thread_id: String) -> Result<VerifyReport, StoreError> {
        Ok(self.store()?.verify(&thread_id)?.into())
    }

    /// Flushes and closes a store this handle opened, releasing the state dir's lock (later
    /// calls fail with `Closed`; the directory can be opened again at once). On a store borrowed
    /// from a running server this only flushes: the server owns it.
    pub fn close(&self) -> Result<(), StoreError> {
        if !self.owned {
            return Ok(self.store()?.flush()?);
        }
        let taken = self.inner.write().unwrap_or_else(|p| p.into_inner()).take();
        match taken {
            Some(store) => Ok(store.close()?),
            None => Ok(()),
        }
    }
}

/// The rollout key and the unanchored policy, for a server's store or one opened on its own.
pub(crate) fn apply_store_security(
    options: &mut cc_app_server::rollout::StoreOptions,
    key: Option<&[u8]>,
    accept_unanchored: Option<bool>,
) -> Result<(), ServerError> {
    if let Some(bytes) = key {
        // The message names the length only, never the bytes.
        let key = cc_app_server::rollout::RolloutKey::from_slice(bytes).map_err(|reason| {
            ServerError::InvalidConfig {
                reason: reason.to_string(),
            }
        })?;
        options.key = Some(key);
    }
    if let Some(accept) = accept_unanchored {
        options.accept_unanchored = accept;
    }
    Ok(())
}
