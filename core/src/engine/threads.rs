//! Threads in memory: loading one from the rollout on first use, keeping at most
//! `max_loaded_threads` of them (unloading the least recently used idle ones), and restart
//! recovery — closing turns a dead process left open and rebuilding the idempotency cache from
//! the `idempotencyKey`s the rollout already records.

use super::dispatch::{thread_start_fingerprint, turn_start_fingerprint, RpcError};
use super::turn::{event, turn_error, wire_turn};
use super::{emit, lock, Inner, Stats, ThreadData, ThreadState};
use crate::protocol::{
    EventPayload, Thread, ThreadStartResult, ThreadStatus, Turn, TurnCompletedEvent,
    TurnStartResult, TurnStatus,
};
use crate::rollout::{ListQuery, StoreError, StoredEvent, ThreadSummary};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub(crate) fn data_from_summary(summary: &ThreadSummary) -> ThreadData {
    ThreadData {
        title: summary.title.clone(),
        metadata: summary.metadata.clone(),
        created_at: summary.created_at.clone(),
        updated_at: summary.updated_at.clone(),
        archived: summary.archived,
        last_seq: summary.last_seq,
        forked_from: summary.forked_from.clone(),
        agent_options: Value::Null,
        active: None,
        recent: VecDeque::new(),
        pending_terminal: None,
    }
}

pub(crate) fn new_state(inner: &Inner, id: &str, data: ThreadData) -> Arc<ThreadState> {
    Arc::new(ThreadState {
        id: id.to_string(),
        data: Mutex::new(data),
        emit_lock: Mutex::new(()),
        last_used: AtomicU64::new(inner.clock.fetch_add(1, Ordering::Relaxed)),
    })
}

/// The host's `agentOptions`, as the thread's header records them (`Null` when none).
fn recorded_agent_options(inner: &Inner, id: &str) -> Result<Value, StoreError> {
    let page = inner.store.read(id, 0, 1)?;
    Ok(page
        .events
        .first()
        .and_then(|h| h.payload.get("agentOptions").cloned())
        .unwrap_or(Value::Null))
}

/// The thread's live state, loading it from the rollout on first use. Recovery at open has
/// already closed every turn a dead process left open, so loading reads only the head and the
/// header.
pub(crate) fn load_thread(inner: &Inner, id: &str) -> Result<Arc<ThreadState>, RpcError> {
    if let Some(t) = lock(&inner.threads).get(id) {
        t.last_used.store(
            inner.clock.fetch_add(1, Ordering::Relaxed),
            Ordering::Relaxed,
        );
        return Ok(Arc::clone(t));
    }
    let summary = inner.store.summary(id)?;
    let mut data = data_from_summary(&summary);
    data.agent_options = recorded_agent_options(inner, id)?;
    Ok(insert_thread(inner, new_state(inner, id, data)))
}

/// Adds a loaded thread (keeping one that another caller loaded meanwhile), then unloads the
/// least recently used idle threads if there are more than `max_loaded_threads`.
pub(crate) fn insert_thread(inner: &Inner, state: Arc<ThreadState>) -> Arc<ThreadState> {
    let cap = inner.config.limits.max_loaded_threads.max(1);
    let mut threads = lock(&inner.threads);
    let kept = Arc::clone(threads.entry(state.id.clone()).or_insert(state));
    if threads.len() > cap {
        // Unload an eighth of the cap at once, so the sort is paid once per cap/8 loads. A
        // thread is idle when no turn runs on it, nothing waits to be recorded, and nobody holds
        // it right now (the map's reference is the only one).
        let mut idle: Vec<(u64, String)> = threads
            .iter()
            .filter(|(id, t)| {
                **id != kept.id && Arc::strong_count(t) == 1 && !lock(&t.data).is_busy()
            })
            .map(|(id, t)| (t.last_used.load(Ordering::Relaxed), id.clone()))
            .collect();
        idle.sort_unstable();
        let excess = threads.len() - cap + cap / 8;
        for (_, id) in idle.into_iter().take(excess) {
            threads.remove(&id);
            Stats::bump(&inner.stats.threads_unloaded);
        }
    }
    kept
}

/// A finished turn of this thread: from memory if recent, else from its terminal event in the
/// rollout (a rare path: interrupting an old turn).
pub(crate) fn finished_turn(
    inner: &Inner,
    thread: &ThreadState,
    turn_id: &str,
) -> Result<Option<Turn>, RpcError> {
    if let Some(t) = lock(&thread.data).recent_turn(turn_id) {
        return Ok(Some(t.clone()));
    }
    if crate::rollout::validate_thread_id(turn_id).is_err() {
        return Ok(None);
    }
    let Some(end) = inner.store.terminal_evidence(&thread.id, turn_id)? else {
        return Ok(None);
    };
    let Ok(EventPayload::TurnCompleted(p)) = serde_json::from_value(end.payload.clone()) else {
        return Ok(None);
    };
    // The start time is in the turnStarted event, somewhere before the end.
    let mut started_at = None;
    let mut after = 0;
    'scan: while after < end.seq {
        let page = inner.store.read(&thread.id, after, 1000)?;
        for e in &page.events {
            after = e.seq;
            if e.kind() == "turnStarted"
                && e.payload.get("turnId").and_then(Value::as_str) == Some(turn_id)
            {
                started_at = Some(e.time.clone());
                break 'scan;
            }
        }
        if !page.has_more {
            break;
        }
    }
    Ok(Some(wire_turn(
        turn_id,
        &thread.id,
        p.status,
        started_at.as_deref().unwrap_or(&end.time),
        Some(&end.time),
        p.error,
    )))
}

/// An idempotency entry rebuilt from the rollout: (event time, method, key, fingerprint,
/// result).
type Rebuilt = (String, &'static str, String, String, Value);

/// Restart: every thread is read once, so no turn stays dangling on disk and every recorded
/// `idempotencyKey` is known again. Threads are not kept loaded.
pub(crate) fn recover_all(inner: &Inner) -> Result<(), StoreError> {
    let mut cursor = None;
    // The newest entries win, up to the cache's capacity: a BTreeMap ordered by event time.
    let cap = inner.config.limits.idempotency_entries;
    let mut rebuilt: BTreeMap<(String, u64), Rebuilt> = BTreeMap::new();
    let mut n = 0u64;
    loop {
        let page = inner.store.list(&ListQuery {
            include_archived: true,
            cursor,
            limit: 1000,
        })?;
        for (id, reason) in &page.unreadable {
            tracing::warn!(target: "cc_app_server::recovery", "thread {id} cannot be read and was not recovered: {reason}");
        }
        for summary in &page.threads {
            let keyed = match recover_thread(inner, summary) {
                Ok(k) => k,
                Err(e) => {
                    tracing::warn!(
                        target: "cc_app_server::recovery",
                        "could not recover thread {}: {}",
                        summary.thread_id, e.message
                    );
                    continue;
                }
            };
            for entry in keyed {
                n += 1;
                rebuilt.insert((entry.0.clone(), n), entry);
                if rebuilt.len() > cap {
                    rebuilt.pop_first();
                }
            }
        }
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    let mut cache = lock(&inner.idempotency);
    for (_, (_, method, key, fingerprint, result)) in rebuilt {
        cache.put(method, &key, fingerprint, result, cap);
    }
    Ok(())
}

/// Reads one thread's whole history: closes turns without a terminal event (a dead process was
/// running them) as failed with `serverRestarted` evidence, and returns the idempotency entries
/// its events record.
fn recover_thread(inner: &Inner, summary: &ThreadSummary) -> Result<Vec<Rebuilt>, RpcError> {
    let id = &summary.thread_id;
    let mut open: Vec<String> = Vec::new();
    let mut keyed = Vec::new();
    let mut after = 0;
    loop {
        let page = inner.store.read(id, after, 1000)?;
        for e in &page.events {
            after = e.seq;
            // The store holds what the engine wrote; a payload it cannot decode is left alone
            // here and reported by verification, never guessed at.
            match serde_json::from_value::<EventPayload>(e.payload.clone()) {
                Ok(EventPayload::ThreadStarted(_)) if e.seq == 1 => {
                    if let Some(entry) = rebuilt_thread_start(summary, e) {
                        keyed.push(entry);
                    }
                }
                Ok(EventPayload::TurnStarted(p)) => {
                    if let Some(key) = &e.idempotency_key {
                        let turn =
                            wire_turn(&p.turn_id, id, TurnStatus::Queued, &e.time, None, None);
                        if let Ok(result) = serde_json::to_value(TurnStartResult {
                            turn,
                            extra: Map::new(),
                        }) {
                            let fingerprint = turn_start_fingerprint(id, &p.input);
                            keyed.push((
                                e.time.clone(),
                                "turn/start",
                                key.clone(),
                                fingerprint,
                                result,
                            ));
                        }
                    }
                    open.push(p.turn_id);
                }
                Ok(EventPayload::TurnCompleted(p)) => open.retain(|t| *t != p.turn_id),
                _ => {}
            }
        }
        if !page.has_more {
            break;
        }
    }
    if !open.is_empty() {
        let thread = Arc::new(ThreadState {
            id: id.clone(),
            data: Mutex::new(data_from_summary(summary)),
            emit_lock: Mutex::new(()),
            last_used: AtomicU64::new(0),
        });
        let error = turn_error(
            "serverRestarted",
            "the server stopped while this turn was running; it was closed when the thread was next opened",
        );
        let events = open
            .iter()
            .map(|turn_id| {
                event(&EventPayload::TurnCompleted(TurnCompletedEvent {
                    turn_id: turn_id.clone(),
                    status: TurnStatus::Failed,
                    error: Some(error.clone()),
                    physically_settled: true,
                    extra: Map::new(),
                }))
            })
            .collect();
        emit(inner, &thread, events, |_| vec![])?;
    }
    Ok(keyed)
}

/// A thread/start retry's answer, as the header records the thread's creation.
fn rebuilt_thread_start(summary: &ThreadSummary, header: &StoredEvent) -> Option<Rebuilt> {
    let key = header.idempotency_key.clone()?;
    if summary.forked_from.is_some() {
        return None;
    }
    let p = &header.payload;
    let title = p.get("title").and_then(Value::as_str).map(str::to_string);
    let metadata = p
        .get("metadata")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let agent_options = p.get("agentOptions").cloned().unwrap_or(Value::Null);
    let fingerprint = thread_start_fingerprint(title.as_deref(), &metadata, &agent_options);
    let thread = Thread {
        id: summary.thread_id.clone(),
        title,
        status: ThreadStatus::Idle,
        archived: false,
        created_at: header.time.clone(),
        updated_at: header.time.clone(),
        last_event_seq: 1,
        forked_from: None,
        metadata,
        extra: Map::new(),
    };
    let result = serde_json::to_value(ThreadStartResult {
        thread,
        extra: Map::new(),
    })
    .ok()?;
    Some((
        header.time.clone(),
        "thread/start",
        key,
        fingerprint,
        result,
    ))
}
