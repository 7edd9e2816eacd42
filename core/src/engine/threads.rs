//! Threads in memory: loading one from the rollout on first use, keeping at most
//! `max_loaded_threads` of them (unloading the least recently used idle ones), and restart
//! recovery without a replay — a turn a dead process left open is found by reading back from
//! the thread's head to its last turn boundary when the thread is first touched, and closed
//! then; a retried request's idempotency key is looked up in the rollout when it misses the
//! cache.

use super::idempotency::{thread_start_fingerprint, turn_start_fingerprint};
use super::outbound::RpcError;
use super::turn::{event, terminal_evidence, turn_error, wire_turn, EndedTurn};
use super::{lock, Inner, Stats, ThreadData, ThreadState};
use crate::protocol::{
    EventPayload, Thread, ThreadStartResult, ThreadStatus, TurnCompletedEvent, TurnStartResult,
    TurnStatus,
};
use crate::rollout::{StoreError, StoredEvent, ThreadSummary};
use serde_json::{Map, Value};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

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
        recovered: false,
    }
}

/// The threads in memory: at most `cap` of them (the least recently used idle ones unloaded
/// beyond that), the clock their `last_used` ticks on, and which of them are being compacted
/// (one compaction at a time per thread).
pub(crate) struct ThreadTable {
    loaded: Mutex<HashMap<String, Arc<ThreadState>>>,
    clock: AtomicU64,
    cap: usize,
    compacting: Mutex<HashSet<String>>,
}

impl ThreadTable {
    pub fn new(cap: usize) -> ThreadTable {
        ThreadTable {
            loaded: Mutex::new(HashMap::new()),
            clock: AtomicU64::new(0),
            cap: cap.max(1),
            compacting: Mutex::new(HashSet::new()),
        }
    }

    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed)
    }

    /// A loaded thread, marked as just used.
    pub fn get(&self, id: &str) -> Option<Arc<ThreadState>> {
        let found = lock(&self.loaded).get(id).cloned()?;
        found.last_used.store(self.tick(), Ordering::Relaxed);
        Some(found)
    }

    /// Adds a thread made from `data` (keeping one that another caller loaded meanwhile), then
    /// unloads the least recently used idle threads if there are more than `cap`.
    pub fn add(&self, id: &str, data: ThreadData, stats: &Stats) -> Arc<ThreadState> {
        let state = Arc::new(ThreadState {
            id: id.to_string(),
            data: Mutex::new(data),
            emit_lock: Mutex::new(()),
            last_used: AtomicU64::new(self.tick()),
            pipe: Mutex::new(Default::default()),
            pipe_cv: std::sync::Condvar::new(),
        });
        let cap = self.cap;
        let mut threads = lock(&self.loaded);
        let kept = Arc::clone(threads.entry(state.id.clone()).or_insert(state));
        if threads.len() > cap {
            // Unload an eighth of the cap at once, so the sort is paid once per cap/8 loads. A
            // thread is idle when no turn runs on it, nothing waits to be recorded, and nobody
            // holds it right now (the map's reference is the only one).
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
                Stats::bump(&stats.threads_unloaded);
            }
        }
        kept
    }

    /// How many threads are loaded.
    pub fn len(&self) -> usize {
        lock(&self.loaded).len()
    }

    /// Every loaded thread, at this moment.
    pub fn all(&self) -> Vec<Arc<ThreadState>> {
        lock(&self.loaded).values().cloned().collect()
    }

    /// The table itself, held (for a listing page that looks up many threads under one lock).
    pub fn hold(&self) -> MutexGuard<'_, HashMap<String, Arc<ThreadState>>> {
        lock(&self.loaded)
    }

    /// Marks the thread as being compacted; `false` when it already is.
    pub fn begin_compaction(&self, id: &str) -> bool {
        lock(&self.compacting).insert(id.to_string())
    }

    pub fn end_compaction(&self, id: &str) {
        lock(&self.compacting).remove(id);
    }
}

/// The host's `agentOptions`, as the thread's header records them (`Null` when none).
fn recorded_agent_options(inner: &Inner, id: &str) -> Result<Value, StoreError> {
    Ok(inner
        .store
        .header(id)?
        .payload
        .get("agentOptions")
        .cloned()
        .unwrap_or(Value::Null))
}

/// The thread's live state, loading it from the rollout on first use: its head (from the
/// store's index) and its header (for the agent options), nothing else. A thread this process
/// has not touched before is also checked for a turn a dead process left open, which is closed
/// before the caller does anything with the thread.
pub(crate) fn load_thread(inner: &Inner, id: &str) -> Result<Arc<ThreadState>, RpcError> {
    let thread = match inner.threads.get(id) {
        Some(t) => t,
        None => {
            let summary = inner.store.summary(id)?;
            let mut data = data_from_summary(&summary);
            data.agent_options = recorded_agent_options(inner, id)?;
            inner.threads.add(id, data, &inner.stats)
        }
    };
    if !lock(&thread.data).recovered {
        close_dangling_turn(inner, &thread)?;
    }
    Ok(thread)
}

/// How many events one step of the backward scan reads.
const BACK_PAGE: usize = 256;

/// Closes, as `failed` with `serverRestarted` evidence, the turn a dead process left running on
/// this thread, if any. One turn runs at a time on a thread and its terminal event is its last,
/// so reading back from the head to the first turn boundary finds it: a `turnCompleted` first
/// means none is open, a `turnStarted` first is the open one. The cost is the events since the
/// last turn ended (usually a handful, from the tail cache), never the history.
fn close_dangling_turn(inner: &Inner, thread: &ThreadState) -> Result<(), RpcError> {
    let _emitting = lock(&thread.emit_lock);
    if lock(&thread.data).recovered {
        return Ok(());
    }
    let mut open: Option<String> = None;
    let mut before: Option<u64> = None;
    'scan: loop {
        let page = inner.store.read_back(&thread.id, before, BACK_PAGE)?;
        for e in page.events.iter().rev() {
            match e.kind() {
                "turnCompleted" | "threadStarted" => break 'scan,
                "turnStarted" => {
                    open = e
                        .payload
                        .get("turnId")
                        .and_then(Value::as_str)
                        .map(str::to_string);
                    break 'scan;
                }
                _ => {}
            }
        }
        match page.events.first() {
            Some(first) if page.has_more => before = Some(first.seq),
            _ => break,
        }
    }
    if let Some(turn_id) = open {
        let error = turn_error(
            "serverRestarted",
            "the server stopped while this turn was running; it was closed when the thread was next opened",
        );
        let ev = event(&EventPayload::TurnCompleted(TurnCompletedEvent {
            turn_id,
            status: TurnStatus::Failed,
            error: Some(error),
            physically_settled: true,
            extra: Map::new(),
        }));
        super::pipeline::emit_locked(inner, thread, &_emitting, vec![ev], |_| vec![])?;
        Stats::bump(&inner.stats.dangling_turns_closed);
    }
    lock(&thread.data).recovered = true;
    Ok(())
}

/// A finished turn of this thread: from memory if recent, else from its terminal event in the
/// rollout (a rare path: interrupting an old turn).
pub(crate) fn finished_turn(
    inner: &Inner,
    thread: &ThreadState,
    turn_id: &str,
) -> Result<Option<EndedTurn>, RpcError> {
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
    // The start time is in the turnStarted event, somewhere before the end; the changes and the
    // last assistant message between the two.
    let mut started_at = None;
    let mut changes = 1;
    let mut output = None;
    let mut after = 0;
    'scan: while after < end.seq {
        let page = inner.store.read(&thread.id, after, 1000)?;
        for e in &page.events {
            after = e.seq;
            if e.seq >= end.seq {
                break 'scan;
            }
            let of_turn = e.payload.get("turnId").and_then(Value::as_str) == Some(turn_id);
            match e.kind() {
                "turnStarted" if of_turn => started_at = Some(e.time.clone()),
                "turnStatusChanged" if of_turn => changes += 1,
                "itemCompleted" if of_turn => {
                    let item = &e.payload["item"];
                    if item["type"] == "agentMessage" {
                        if let Some(text) = item["text"].as_str() {
                            output = Some(crate::approval::digest_json(&Value::from(text)));
                        }
                    }
                }
                _ => {}
            }
        }
        if !page.has_more {
            break;
        }
    }
    let evidence = terminal_evidence(p.status, &end.hash, output);
    Ok(Some(EndedTurn {
        turn: wire_turn(
            turn_id,
            &thread.id,
            p.status,
            started_at.as_deref().unwrap_or(&end.time),
            Some(&end.time),
            changes,
            Some(evidence),
        ),
        error: p.error,
    }))
}

/// An idempotency entry found in the rollout: (method, key, fingerprint, result).
pub(crate) type Rebuilt = (&'static str, String, String, Value);

/// A retried turn/start's answer, from the `turnStarted` event that recorded its key.
pub(crate) fn rebuilt_turn_start(thread_id: &str, started: &StoredEvent) -> Option<Rebuilt> {
    let key = started.idempotency_key.clone()?;
    let Ok(EventPayload::TurnStarted(p)) = serde_json::from_value(started.payload.clone()) else {
        return None;
    };
    let turn = wire_turn(
        &p.turn_id,
        thread_id,
        TurnStatus::Queued,
        &started.time,
        None,
        0,
        None,
    );
    let result = serde_json::to_value(TurnStartResult {
        turn,
        extra: Map::new(),
    })
    .ok()?;
    Some((
        "turn/start",
        key,
        turn_start_fingerprint(thread_id, &p.input),
        result,
    ))
}

/// A thread/start retry's answer, as the header records the thread's creation.
pub(crate) fn rebuilt_thread_start(
    summary: &ThreadSummary,
    header: &StoredEvent,
) -> Option<Rebuilt> {
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
        parent_thread_id: None,
        created_at: header.time.clone(),
        updated_at: header.time.clone(),
        revision: 1,
        metadata,
    };
    let result = serde_json::to_value(ThreadStartResult {
        thread,
        extra: Map::new(),
    })
    .ok()?;
    Some(("thread/start", key, fingerprint, result))
}

pub(crate) fn wire_thread(id: &str, data: &ThreadData) -> Thread {
    let status = if data.archived {
        ThreadStatus::Archived
    } else if data.active.is_some() {
        ThreadStatus::Active
    } else {
        ThreadStatus::Idle
    };
    Thread {
        id: id.into(),
        title: data.title.clone(),
        status,
        parent_thread_id: data.forked_from.as_ref().map(|f| f.thread_id.clone()),
        created_at: data.created_at.clone(),
        updated_at: data.updated_at.clone(),
        revision: data.last_seq,
        metadata: data.metadata.clone(),
    }
}
