//! `RolloutStore`: read-only-minded access to the durable thread logs for hosts — list threads,
//! page through events, verify a whole hash chain — either from a running server (`AppServer.store`)
//! or opened on its own for a state directory no server is using.

use crate::errors::{signed, StoreError};
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

/// A page of `list`.
#[derive(Debug, Clone, PartialEq, Eq, uniffi::Record)]
pub struct ThreadPage {
    pub threads: Vec<ThreadSummary>,
    /// Pass back to get the next page; absent on the last one.
    pub next_cursor: Option<String>,
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
    inner: Arc<dyn CoreStore>,
    /// Opened by this handle (so `close` may close it), rather than borrowed from a server.
    owned: bool,
}

impl RolloutStore {
    pub(crate) fn shared(inner: Arc<dyn CoreStore>) -> RolloutStore {
        RolloutStore {
            inner,
            owned: false,
        }
    }
}

#[uniffi::export]
impl RolloutStore {
    /// Opens the store in `state_dir` (repairing torn tails). `Locked` if a server or another
    /// store holds the directory.
    #[uniffi::constructor(default(kind = None))]
    pub fn open(
        state_dir: String,
        kind: Option<StoreKind>,
    ) -> Result<Arc<RolloutStore>, StoreError> {
        let kind = kind.unwrap_or(StoreKind::Jsonl).into();
        let inner = rollout::open_store(kind, state_dir.as_ref(), StoreOptions::default())?;
        Ok(Arc::new(RolloutStore { inner, owned: true }))
    }

    /// Threads, oldest first; archived ones only when asked. `limit` is clamped to 1000.
    #[uniffi::method(default(include_archived = false, cursor = None, limit = 100))]
    pub fn list(
        &self,
        include_archived: bool,
        cursor: Option<String>,
        limit: i32,
    ) -> Result<ThreadPage, StoreError> {
        let page = self.inner.list(&ListQuery {
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
            .inner
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
        Ok(self.inner.verify(&thread_id)?.into())
    }

    /// Flushes and closes a store this handle opened (later calls fail with `Closed`). On a store
    /// borrowed from a running server this only flushes: the server owns it.
    pub fn close(&self) -> Result<(), StoreError> {
        if self.owned {
            self.inner.close()?;
        } else {
            self.inner.flush()?;
        }
        Ok(())
    }
}
