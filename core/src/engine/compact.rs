//! `thread/compact`: the store's `compact(summary)` made reachable from the wire. The history a
//! kernel gets then starts from the summary; every event stays in the rollout. With a kernel that
//! can write summaries (the OpenAI-compatible one) the model writes it off the connection's
//! thread, so a slow model never stalls the connection; otherwise the caller supplies it. The
//! model's summary call is bounded like a turn's model call (the kernel's idle timeout and call
//! deadline), stops when the server shuts down or the asking connection closes, and whatever way
//! it ends the request is answered (when someone is left to read it) and the thread's
//! compaction slot is freed.

use super::outbound::{reply, result, RawId, RpcError, RpcResult};
use super::threads::wire_thread;
use super::{lock, ConnShared, Inner, Lifecycle, ThreadState};
use crate::protocol::error_code;
use crate::protocol::ThreadCompactResult;
use serde_json::Map;
use std::sync::Arc;

/// The feature a connection must negotiate before it may call thread/compact.
pub(crate) const FEATURE: &str = "thread_compact";

/// Releases the thread's compaction slot however the compaction ends (also when its thread
/// could not be started and the work was dropped unrun).
struct Slot {
    inner: Arc<Inner>,
    thread_id: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.inner.threads.end_compaction(&self.thread_id);
    }
}

/// Answers thread/compact, from a helper thread when the kernel writes the summary.
pub(crate) fn thread_compact(
    inner: &Arc<Inner>,
    conn: &Arc<ConnShared>,
    thread: Arc<ThreadState>,
    id: RawId,
    summary: Option<String>,
) {
    if !conn.has_feature(FEATURE) {
        return reply(
            &inner.stats,
            conn,
            &id,
            Err(RpcError::new(
                error_code::METHOD_NOT_FOUND,
                "thread/compact needs the thread_compact feature: ask for it in initialize",
            )),
        );
    }
    if lock(&thread.data).active.is_some() {
        return reply(
            &inner.stats,
            conn,
            &id,
            Err(RpcError::new(
                error_code::CONFLICT,
                "the thread has an active turn; interrupt it or wait for it to end, then compact",
            )),
        );
    }
    if !inner.threads.begin_compaction(&thread.id) {
        return reply(
            &inner.stats,
            conn,
            &id,
            Err(RpcError::new(
                error_code::CONFLICT,
                "a compaction of this thread is already running; wait for its answer",
            )),
        );
    }
    let slot = Slot {
        inner: Arc::clone(inner),
        thread_id: thread.id.clone(),
    };
    let (inner2, conn2, id2) = (Arc::clone(inner), Arc::clone(conn), id.clone());
    let given = summary.is_some();
    let work = move || {
        let result = compact(&slot.inner, &conn2, &thread, summary);
        drop(slot);
        reply(&inner2.stats, &conn2, &id2, result);
    };
    if given {
        work();
    } else if std::thread::Builder::new()
        .name("cc-compact".into())
        .spawn(work)
        .is_err()
    {
        reply(
            &inner.stats,
            conn,
            &id,
            Err(RpcError::new(
                error_code::INTERNAL,
                "internal error: could not start the compaction",
            )),
        );
    }
}

/// Why a compaction stops before it records anything: the server began shutting down, or the
/// connection that asked for it closed (nobody is left to get the answer).
fn interrupted(lifecycle: &Lifecycle, conn: &ConnShared) -> Option<&'static str> {
    if lifecycle.is_shut_down() {
        Some("the server is shutting down")
    } else if !conn.is_open() {
        Some("the connection that asked for it closed")
    } else {
        None
    }
}

/// The kernel's summary, stopped (for a kernel that watches for it: the OpenAI-compatible one
/// checks every 5 ms and closes the model's connection) as soon as the compaction is
/// `interrupted`. How long it may take otherwise is the kernel's own bound (the OpenAI-compatible
/// kernel's idle timeout and call deadline).
fn summarize(
    inner: &Arc<Inner>,
    conn: &Arc<ConnShared>,
    thread: &ThreadState,
    history: &super::History,
) -> Result<Option<String>, crate::kernel::KernelError> {
    let options = lock(&thread.data).agent_options.clone();
    let call = || inner.config.kernel.summarize(&thread.id, &options, history);
    let (inner, conn) = (Arc::clone(inner), Arc::clone(conn));
    crate::kernel::with_summary_cancel(move || interrupted(&inner.lifecycle, &conn).is_some(), call)
}

fn stopped(why: &str) -> RpcError {
    RpcError::new(
        error_code::INTERNAL,
        format!("the compaction was interrupted: {why}; nothing was recorded"),
    )
}

fn compact(
    inner: &Arc<Inner>,
    conn: &Arc<ConnShared>,
    thread: &ThreadState,
    summary: Option<String>,
) -> RpcResult {
    let head = inner.store.summary(&thread.id)?;
    let through = head.last_seq;
    // The newest event being a compaction means nothing happened since.
    if through <= head.compacted_through || head.last_compaction_seq == Some(through) {
        return Err(RpcError::new(
            error_code::INVALID_PARAMS,
            "nothing to compact: no event since the last compaction",
        ));
    }
    let summary = match summary {
        Some(s) => s,
        None => {
            let history = crate::kernel::history::assemble(&*inner.store, &thread.id, None)?;
            if history.turns.is_empty() {
                return Err(RpcError::new(
                    error_code::INVALID_PARAMS,
                    "nothing to compact: no turn since the last compaction",
                ));
            }
            let outcome = summarize(inner, conn, thread, &history);
            if let Some(why) = interrupted(&inner.lifecycle, conn) {
                return Err(stopped(why));
            }
            match outcome {
                Ok(Some(s)) if !s.trim().is_empty() => s,
                Ok(Some(_)) => {
                    return Err(RpcError::new(
                        error_code::INTERNAL,
                        "the kernel wrote an empty summary; try again or pass params.summary",
                    ))
                }
                Ok(None) => {
                    return Err(RpcError::new(
                        error_code::INVALID_PARAMS,
                        "this server's kernel cannot write summaries: pass params.summary",
                    ))
                }
                Err(e) => {
                    let why = match e {
                        crate::kernel::KernelError::Cancelled => "it was cancelled".to_string(),
                        crate::kernel::KernelError::Failed(m) => m,
                    };
                    return Err(RpcError::new(
                        error_code::INTERNAL,
                        format!("the kernel could not write the summary: {why}"),
                    ));
                }
            }
        }
    };
    let _guard = lock(&thread.emit_lock);
    // A turn may have started while the summary was written: its events are on their way to
    // the store (pipeline.rs), numbered in order, and nothing may be appended between them.
    if lock(&thread.data).active.is_some() {
        return Err(RpcError::new(
            error_code::CONFLICT,
            "a turn started on the thread while it was being compacted; compact again when it ends",
        ));
    }
    let event = inner.store.compact(&thread.id, &summary, through)?;
    let wire = {
        let mut data = lock(&thread.data);
        data.last_seq = event.seq;
        data.updated_at = event.time.clone();
        wire_thread(&thread.id, &data)
    };
    inner
        .connections
        .announce_thread_update(&inner.stats, &thread.id, event.seq, &wire);
    let from_seq = event.payload["fromSeq"].as_u64().unwrap_or(1);
    result(ThreadCompactResult {
        thread: wire,
        event_seq: event.seq,
        from_seq,
        to_seq: through,
        summary,
        extra: Map::new(),
    })
}
