//! Everything the engine sends goes out here: a request's one answer (`reply`, `reply_with`,
//! with the error shapes of `RpcError`), a notification to one connection (`deliver`, with its
//! backpressure and slow-consumer close) and to every connection following a thread
//! (`Connections`: the open connections, `followers`, `announce_thread_update`). Nothing here
//! needs the engine: a send needs the connection and the counters it bumps. Events reach followers only after they are durable:
//! `pipeline::emit` records them first, then calls `deliver`.

use super::{lock, ConnShared, PushError, Stats};
use crate::protocol::error_code;
use crate::protocol::{ServerNotification, Thread, ThreadUpdatedNotification, ThreadUpdatedParams};
use crate::rollout::StoreError;
use serde::Serialize;
use serde_json::{json, Map, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// A request id exactly as the host wrote it (JSON text), or `null` when it had none or an
/// unusable one.
pub(crate) type RawId = Arc<str>;

/// A JSON-RPC error on its way to the host.
pub(crate) struct RpcError {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

impl RpcError {
    pub(crate) fn new(code: i64, message: impl Into<String>) -> Self {
        RpcError {
            code,
            message: message.into(),
            data: None,
        }
    }

    pub(crate) fn with_reason(mut self, reason: impl Into<String>) -> Self {
        self.data = Some(json!({"reason": cap(&reason.into(), 1024)}));
        self
    }

    pub(crate) fn overloaded(message: impl Into<String>, retry_after_ms: u64) -> Self {
        RpcError {
            code: error_code::OVERLOADED,
            message: message.into(),
            data: Some(json!({"retry_after_ms": retry_after_ms.min(3_600_000)})),
        }
    }
}

/// Caps a message at `max` bytes on a character boundary (the schema bounds every message).
pub(crate) fn cap(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max.saturating_sub(3);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

impl From<StoreError> for RpcError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound(id) => {
                RpcError::new(error_code::NOT_FOUND, format!("thread {id:?} not found"))
            }
            StoreError::AlreadyExists(id) => RpcError::new(
                error_code::CONFLICT,
                format!("thread {id:?} already exists; resume it or pick another id"),
            ),
            e @ (StoreError::InvalidId { .. } | StoreError::InvalidArgument(_)) => {
                RpcError::new(error_code::INVALID_PARAMS, cap(&e.to_string(), 512))
            }
            // Damaged history is the data's fault, not the server's: say which thread and what
            // to do, in data.reason, without file paths (the store's messages carry none).
            StoreError::Corrupt {
                thread_id,
                seq,
                reason,
            } => {
                // The host's log hears of it too: threads load lazily, so this is where damage
                // is first seen (a mobile host cannot read stderr).
                tracing::warn!(target: "cc_app_server::engine", "thread {thread_id:?} is unreadable: first bad event at seq {seq}: {reason}");
                RpcError::new(
                error_code::INTERNAL,
                format!(
                    "thread {thread_id:?} is unreadable: its rollout fails verification; restore it from a backup (see `cc-app-server rollout verify`)"
                ),
            )
            .with_reason(format!("first bad event at seq {seq}: {reason}"))
            }
            StoreError::AnchorMismatch { thread_id, reason } => {
                tracing::warn!(target: "cc_app_server::engine", "thread {thread_id:?} is unreadable: {reason}");
                RpcError::new(
                error_code::INTERNAL,
                format!(
                    "thread {thread_id:?} is unreadable: its rollout does not match its head anchor; restore it from a backup or accept it as it is (see `cc-app-server rollout verify`)"
                ),
            )
            .with_reason(reason)
            }
            other => {
                // Internals go to diagnostics, never to the wire.
                tracing::error!(target: "cc_app_server::rollout", "rollout store error: {other}");
                RpcError::new(
                    error_code::INTERNAL,
                    "internal error: the rollout store failed; see the server's diagnostics",
                )
            }
        }
    }
}

pub(crate) type RpcResult = Result<Value, RpcError>;

/// A typed result on its way to the wire.
pub(crate) fn result(value: impl Serialize) -> RpcResult {
    serde_json::to_value(value)
        .map_err(|_| RpcError::new(error_code::INTERNAL, "internal error: unencodable result"))
}

/// Sends the one answer a request gets, echoing its id as written.
pub(crate) fn reply(stats: &Stats, conn: &ConnShared, id: &str, result: RpcResult) {
    reply_raw(stats, conn, id, result.map(|v| v.to_string()))
}

/// `reply` for a result already written as JSON text (thread/list, thread/read).
pub(crate) fn reply_raw(
    stats: &Stats,
    conn: &ConnShared,
    id: &str,
    result: Result<String, RpcError>,
) {
    reply_with(stats, conn, id, 0, |out| {
        out.push_str(&result?);
        Ok(())
    })
}

/// `reply` for a result written by `write` straight into the answer's text (no copy of it is
/// made); `size` is a guess of its length. An error discards what `write` wrote.
pub(crate) fn reply_with(
    stats: &Stats,
    conn: &ConnShared,
    id: &str,
    size: usize,
    write: impl FnOnce(&mut String) -> Result<(), RpcError>,
) {
    let mut out = String::with_capacity(size + id.len() + 48);
    out.push_str("{\"jsonrpc\":\"2.0\",\"id\":");
    out.push_str(id);
    let at = out.len();
    out.push_str(",\"result\":");
    match write(&mut out) {
        Ok(()) => out.push('}'),
        Err(e) => {
            out.truncate(at);
            let mut error = json!({"code": e.code, "message": cap(&e.message, 512)});
            if let Some(data) = e.data {
                error["data"] = data;
            }
            out.push_str(",\"error\":");
            out.push_str(&error.to_string());
            out.push('}');
        }
    }
    deliver(stats, conn, out);
    // Counted once the answer is queued (or dropped with a closed connection), so a drain that
    // sees nothing unanswered never shuts down ahead of an answer still being delivered.
    conn.answered
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
}

/// The server's open connections (held weakly: a connection goes when its host drops it) and
/// the ids they are given.
#[derive(Default)]
pub(crate) struct Connections {
    last_id: AtomicU64,
    open: Mutex<Vec<Weak<ConnShared>>>,
}

impl Connections {
    /// Admits one more connection, made by `make` with its id, unless `max` are open or `make`
    /// gives up. Under the lock, so two connects cannot both take the last place.
    pub fn admit<T>(
        &self,
        max: usize,
        make: impl FnOnce(u64) -> Option<(Arc<ConnShared>, T)>,
    ) -> Option<(Arc<ConnShared>, T)> {
        let mut open = lock(&self.open);
        open.retain(|w| w.upgrade().is_some_and(|c| c.is_open()));
        if open.len() >= max {
            return None;
        }
        let made = make(self.last_id.fetch_add(1, Ordering::SeqCst) + 1)?;
        open.push(Arc::downgrade(&made.0));
        Some(made)
    }

    /// The connections open now.
    pub fn open(&self) -> Vec<Arc<ConnShared>> {
        lock(&self.open)
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|c| c.is_open())
            .collect()
    }

    /// Every connection, forgotten here (shutdown closes them).
    pub fn take_all(&self) -> Vec<Arc<ConnShared>> {
        lock(&self.open)
            .drain(..)
            .filter_map(|w| w.upgrade())
            .collect()
    }

    /// The open connections that follow `thread_id`.
    pub fn followers(&self, thread_id: &str) -> Vec<Arc<ConnShared>> {
        lock(&self.open)
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|c| c.is_open() && lock(&c.follows).contains(thread_id))
            .collect()
    }

    /// Tells every connection that follows the thread that it changed (archive, compaction):
    /// the event at `event_seq` is already durable.
    pub fn announce_thread_update(
        &self,
        stats: &Stats,
        thread_id: &str,
        event_seq: u64,
        wire: &Thread,
    ) {
        let note = ServerNotification::ThreadUpdated(ThreadUpdatedNotification {
            jsonrpc: rpc(),
            params: ThreadUpdatedParams {
                thread_id: thread_id.to_string(),
                event_seq,
                thread: wire.clone(),
                extra: Map::new(),
            },
        });
        let note = serde_json::to_string(&note).expect("a notification is JSON");
        for c in self.followers(thread_id) {
            deliver(stats, &c, note.clone());
        }
    }
}

/// Puts one message on a connection's outbound queue, waiting while the host takes messages
/// (backpressure: a slow reader slows the engine's work for it down, it does not lose its
/// connection). A host that takes nothing for `outbound_stall` has its connection closed — the
/// engine and every other connection keep running.
pub(crate) fn deliver(stats: &Stats, conn: &ConnShared, text: String) {
    #[cfg(debug_assertions)]
    check_outbound(&text);
    if conn.outbound.push_waiting(text, conn.outbound_stall) == Err(PushError::Full) {
        Stats::bump(&stats.closed_slow_consumers);
        tracing::warn!(
            target: "cc_app_server::engine",
            "connection {} took no message for {:?} with its outbound queue full; closed as a slow consumer",
            conn.id, conn.outbound_stall
        );
        conn.close_all(true);
    }
}

/// Debug builds check every message the engine sends: against the schema, and that our own
/// parser (and so every client) can read it back.
#[cfg(debug_assertions)]
pub(crate) fn check_outbound(text: &str) {
    match serde_json::from_str::<Value>(text) {
        Ok(value) => {
            if let Err(e) = cc_agent_protocol::validate_protocol_message(&value) {
                panic!("engine produced an invalid message: {e}\n{text}");
            }
        }
        Err(e) => panic!("engine produced a message its own parser refuses: {e}"),
    }
}

/// The JSON-RPC version every envelope carries.
pub(crate) fn rpc() -> String {
    "2.0".into()
}
