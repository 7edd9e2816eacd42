//! Pipelined recording for running turns. A kernel hands each event over and goes on; one
//! committer thread takes every queued event of every thread, commits them in one group-commit
//! round (one write and one fdatasync per touched log, not one per event), and only then
//! releases their notifications, in seq order. So the rule stays exact — a host hears of an
//! event only once it is durable — while the kernel never waits for a sync: it waits only when
//! its turn has `max_inflight_events`/`max_inflight_bytes` handed over and not yet delivered,
//! or when a host that follows the thread is not reading.
//!
//! Ordering: the committer is the only deliverer of pipelined events and handles one round at a
//! time; a synchronous emitter on the same thread (`emit`) first waits for the pipe to drain,
//! under the thread's emit lock, which `record` also takes to enqueue. `emit` and `emit_locked`
//! are here too: the two ways an event reaches the store, and only then (outbound.rs) a host.

use super::outbound::deliver;
use super::{lock, ConnShared, Inner, Stats, ThreadState};
use crate::protocol::ServerNotification;
use crate::rollout::{AppendedEvent, CheckedEvent, MAX_BATCH_EVENTS};
use crate::rollout::{NewEvent, StoreError, StoredEvent};
use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::MutexGuard;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;

/// What to tell the followers once an event is durable.
pub(crate) enum Note {
    /// Nothing (a status change).
    None,
    /// A notification whose params are the thread id, the seq and the payload's members but
    /// `type` (item/started, item/delta, item/completed, tool/requested, tool/result,
    /// approval/resolved): spliced from the event's own JSON, never serialised again.
    Mirror(&'static str),
    /// item/started or item/completed: the published Item around the recorded body, its
    /// `createdAt` taken from the item's start (remembered in `times`, on this thread, in seq
    /// order).
    Item {
        completed: bool,
        times: Arc<Mutex<HashMap<String, String>>>,
    },
    /// Anything else, built from the event's seq.
    Build(Box<dyn FnOnce(u64) -> String + Send>),
}

struct Pending {
    event: CheckedEvent,
    note: Note,
    bytes: usize,
    /// The seq `record` said it would get (the committer checks it).
    seq: u64,
}

/// A thread's events on their way to the disk and to its followers.
#[derive(Default)]
pub(crate) struct ThreadPipeline {
    queued: Vec<Pending>,
    /// Handed over (queued or being committed) and not yet delivered.
    inflight_events: usize,
    inflight_bytes: usize,
    /// In the committer's work list.
    scheduled: bool,
    /// A commit of this thread failed: what the store said. Later events are refused until the
    /// next turn starts.
    failed: Option<String>,
    /// Followers whose outbound queue went over its caps when the committer delivered: the
    /// producer waits for them to read (backpressure), as `deliver` would.
    congested: Vec<Weak<ConnShared>>,
    /// The seq the next handed-over event gets while events are in flight (with none in
    /// flight it is the thread's head + 1).
    next_seq: u64,
}

impl ThreadPipeline {
    /// Starts a turn's recording afresh (a failure belongs to the turn that met it).
    pub fn reset(&mut self) {
        self.failed = None;
    }
}

/// The committer's work list and the thread that serves it.
pub(crate) struct Committer {
    work: Mutex<Work>,
    ready: Condvar,
    thread: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Default)]
struct Work {
    threads: VecDeque<Arc<ThreadState>>,
    running: bool,
    stop: bool,
}

impl Committer {
    pub fn new() -> Arc<Committer> {
        Arc::new(Committer {
            work: Mutex::new(Work::default()),
            ready: Condvar::new(),
            thread: Mutex::new(None),
        })
    }

    /// Starts the committer thread. Without it (the OS refused a thread), recording runs on the
    /// caller's thread: correct, only slower.
    pub fn start(self: &Arc<Self>, inner: &Arc<Inner>) {
        let weak = Arc::downgrade(inner);
        let me = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("cc-committer".into())
            .spawn(move || me.serve(weak));
        match spawned {
            Ok(h) => {
                lock(&self.work).running = true;
                *lock(&self.thread) = Some(h);
            }
            Err(e) => tracing::error!(
                target: "cc_app_server::engine",
                "could not start the committer thread ({e}); turns record synchronously"
            ),
        }
    }

    /// Stops the thread once the work list is empty, and waits for it (never call it from the
    /// committer thread itself).
    pub fn stop(&self) {
        lock(&self.work).stop = true;
        self.ready.notify_all();
        if let Some(h) = lock(&self.thread).take() {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }

    /// Signals the thread to stop without waiting (from `Inner`'s drop, which may run on it).
    pub fn signal_stop(&self) {
        lock(&self.work).stop = true;
        self.ready.notify_all();
    }

    fn schedule(&self, inner: &Inner, thread: Arc<ThreadState>) {
        let mut w = lock(&self.work);
        if w.running && !w.stop {
            w.threads.push_back(thread);
            drop(w);
            self.ready.notify_one();
        } else {
            drop(w);
            commit(inner, self, vec![thread]);
        }
    }

    fn serve(&self, inner: Weak<Inner>) {
        loop {
            let batch: Vec<Arc<ThreadState>> = {
                let mut w = lock(&self.work);
                loop {
                    if !w.threads.is_empty() {
                        break w.threads.drain(..).collect();
                    }
                    if w.stop {
                        w.running = false;
                        return;
                    }
                    w = self.ready.wait(w).unwrap_or_else(|p| p.into_inner());
                }
            };
            let Some(inner) = inner.upgrade() else {
                lock(&self.work).running = false;
                return;
            };
            commit(&inner, self, batch);
        }
    }
}

/// Each event's notification, its in-flight bytes and the seq `record` promised it, in order.
type Notes = Vec<(Note, usize, u64)>;

/// One round: every queued event of these threads committed together, then delivered.
fn commit(inner: &Inner, committer: &Committer, threads: Vec<Arc<ThreadState>>) {
    let mut taken: Vec<(Arc<ThreadState>, Notes)> = Vec::with_capacity(threads.len());
    let mut batches = Vec::with_capacity(threads.len());
    let mut again = Vec::new();
    for t in threads {
        let mut p = lock(&t.pipe);
        p.scheduled = false;
        if p.queued.is_empty() {
            continue;
        }
        let n = p.queued.len().min(MAX_BATCH_EVENTS);
        let mut events = Vec::with_capacity(n);
        let mut notes = Vec::with_capacity(n);
        for item in p.queued.drain(..n) {
            events.push(item.event);
            notes.push((item.note, item.bytes, item.seq));
        }
        if !p.queued.is_empty() {
            p.scheduled = true;
            again.push(Arc::clone(&t));
        }
        drop(p);
        batches.push((t.id.clone(), events));
        taken.push((t, notes));
    }
    if !batches.is_empty() {
        let results = inner.store.append_batch(batches);
        for ((t, notes), result) in taken.into_iter().zip(results) {
            match result {
                Ok(appended) => deliver_round(inner, &t, &appended, notes),
                Err(e) => {
                    Stats::bump(&inner.stats.recording_failures);
                    tracing::error!(
                        target: "cc_app_server::turn",
                        "thread {}: could not record {} event(s) durably: {e}; the running turn stops here",
                        t.id,
                        notes.len()
                    );
                    let mut p = lock(&t.pipe);
                    // Nothing after a lost event may be recorded: the turn stops here.
                    let dropped: Vec<Pending> = p.queued.drain(..).collect();
                    let n = notes.len() + dropped.len();
                    let bytes = notes.iter().map(|(_, b, _)| b).sum::<usize>()
                        + dropped.iter().map(|d| d.bytes).sum::<usize>();
                    p.inflight_events -= n;
                    p.inflight_bytes -= bytes;
                    p.failed
                        .get_or_insert_with(|| format!("could not record an event durably: {e}"));
                    drop(p);
                    t.pipe_cv.notify_all();
                }
            }
        }
    }
    for t in again {
        committer.schedule(inner, t);
    }
}

/// Publishes a committed batch: the thread's head, then each notification to every follower,
/// in seq order, without ever waiting on a host.
fn deliver_round(inner: &Inner, thread: &ThreadState, appended: &[AppendedEvent], notes: Notes) {
    if let Some(last) = appended.last() {
        let mut d = lock(&thread.data);
        d.last_seq = last.seq;
        d.updated_at.clone_from(&last.time);
    }
    let subscribers = inner.connections.followers(&thread.id);
    let mut congested: Vec<Weak<ConnShared>> = Vec::new();
    let mut bytes = 0;
    let n = notes.len();
    for (event, (note, b, promised)) in appended.iter().zip(notes) {
        bytes += b;
        // Parent ids name events by the seq `record` promised: it must be the one they got.
        if event.seq != promised {
            debug_assert_eq!(event.seq, promised, "thread {}: a promised seq", thread.id);
            tracing::error!(
                target: "cc_app_server::turn",
                "thread {}: event {} was promised seq {promised}; a parentId after it may name the wrong event",
                thread.id,
                event.seq
            );
        }
        let text = match note {
            Note::None => continue,
            Note::Mirror(method) => mirror(method, &thread.id, event),
            Note::Item { completed, times } => item_note(completed, &times, &thread.id, event),
            Note::Build(f) => f(event.seq),
        };
        #[cfg(debug_assertions)]
        super::outbound::check_outbound(&text);
        for conn in &subscribers {
            if conn.outbound.force_push(text.clone()) == Ok(true)
                && !congested.iter().any(|w| w.as_ptr() == Arc::as_ptr(conn))
            {
                congested.push(Arc::downgrade(conn));
            }
        }
    }
    let mut p = lock(&thread.pipe);
    p.inflight_events -= n;
    p.inflight_bytes -= bytes;
    for c in congested {
        if !p.congested.iter().any(|w| w.ptr_eq(&c)) {
            p.congested.push(c);
        }
    }
    drop(p);
    thread.pipe_cv.notify_all();
}

/// `{"jsonrpc":"2.0","method":M,"params":{"threadId":T,"eventSeq":N,<payload members but type>}}`
/// from the event's line: the payload's `type` member is always first there.
fn mirror(method: &str, thread_id: &str, event: &AppendedEvent) -> String {
    let payload = event.payload_json();
    let rest = payload.find(',').map_or("}", |i| &payload[i + 1..]);
    let mut out = String::with_capacity(payload.len() + thread_id.len() + 96);
    out.push_str("{\"jsonrpc\":\"2.0\",\"method\":\"");
    out.push_str(method);
    out.push_str("\",\"params\":{\"threadId\":");
    crate::rollout::write_json_string(thread_id, &mut out);
    out.push_str(",\"eventSeq\":");
    out.push_str(&event.seq.to_string());
    if rest != "}" {
        out.push(',');
    }
    out.push_str(rest);
    out.push('}');
    out
}

/// `item/started` / `item/completed` with the published `Item`: `{id, threadId, turnId, parentId,
/// kind, status, content, dataPolicy, createdAt, completedAt}`, `content` being the recorded body.
/// Items are few next to deltas, so this one parses its payload back.
fn item_note(
    completed: bool,
    times: &Mutex<HashMap<String, String>>,
    thread_id: &str,
    event: &AppendedEvent,
) -> String {
    let payload: Value = serde_json::from_str(event.payload_json()).unwrap_or(Value::Null);
    let content = &payload["item"];
    let id = content["id"].as_str().unwrap_or_default().to_string();
    let created_at = if completed {
        lock(times).remove(&id)
    } else {
        lock(times).insert(id.clone(), event.time.clone());
        None
    }
    .unwrap_or_else(|| event.time.clone());
    let (kind, origin, trust) = item_kind(content);
    let status = match (completed, content["status"].as_str()) {
        (false, _) => "started",
        (true, Some("failed")) => "failed",
        (true, Some("declined")) => "cancelled",
        (true, _) => "completed",
    };
    let item = json!({
        "id": id,
        "threadId": thread_id,
        "turnId": payload["turnId"],
        "parentId": null,
        "kind": kind,
        "status": status,
        "content": content,
        "dataPolicy": {
            "origin": origin,
            "trust": trust,
            "sensitivity": "internal",
            "allowedSinks": ["host", "rollout"],
        },
        "createdAt": created_at,
        "completedAt": if completed { Value::from(event.time.clone()) } else { Value::Null },
    });
    let note = json!({
        "jsonrpc": "2.0",
        "method": if completed { "item/completed" } else { "item/started" },
        "params": {
            "threadId": thread_id,
            "eventSeq": event.seq,
            "turnId": payload["turnId"],
            "item": item,
        },
    });
    note.to_string()
}

/// The published kind of a recorded item body, and where its data came from (origin, trust).
pub(crate) fn item_kind(content: &Value) -> (&'static str, String, &'static str) {
    let untrusted = "untrusted_content";
    match content["type"].as_str().unwrap_or_default() {
        "userMessage" => ("user_message", "user".into(), "authenticated_user"),
        "agentMessage" => ("assistant_message", "kernel".into(), untrusted),
        "reasoning" => ("reasoning", "kernel".into(), untrusted),
        "toolCall" => {
            let tool = content["call"]["tool"].as_str().unwrap_or("unknown");
            ("tool", format!("tool:{}", cap_origin(tool)), untrusted)
        }
        "commandExecution" | "fileChange" => ("tool", "tool".into(), untrusted),
        "plan" => ("plan", "kernel".into(), untrusted),
        "error" => ("error", "kernel".into(), untrusted),
        _ => ("artifact", "kernel".into(), untrusted),
    }
}

fn cap_origin(tool: &str) -> String {
    tool.chars().take(200).collect()
}

/// Hands one checked event of a running turn over for recording. Waits only for room: the
/// turn's in-flight bound, and followers that are not reading (closed as slow consumers after
/// their stall deadline, as `deliver` does). `Err` once a commit of this thread failed; else
/// the seq the event gets (every append of a thread goes through its emit lock, held here, so
/// it is known before the commit: what a later event's `parentId` names).
pub(crate) fn record(
    inner: &Inner,
    thread: &Arc<ThreadState>,
    mut event: CheckedEvent,
    bytes: usize,
    note: Note,
) -> Result<u64, String> {
    // Freed here, on the thread that built it, not on the committer's.
    event.shed_payload();
    let limits = inner.config.limits;
    let max_events = limits.max_inflight_events.max(1);
    let mut waited = false;
    loop {
        let mut p = lock(&thread.pipe);
        if let Some(f) = &p.failed {
            return Err(f.clone());
        }
        if !p.congested.is_empty() {
            let conns = std::mem::take(&mut p.congested);
            drop(p);
            for conn in conns.iter().filter_map(Weak::upgrade) {
                wait_for_reader(&inner.stats, &conn);
            }
            continue;
        }
        // An empty pipe takes any one event, so an event larger than the byte bound still goes.
        if p.inflight_events == 0
            || (p.inflight_events < max_events
                && p.inflight_bytes + bytes <= limits.max_inflight_bytes)
        {
            break;
        }
        if !waited {
            waited = true;
            Stats::bump(&inner.stats.pipeline_waits);
        }
        drop(thread.pipe_cv.wait(p).unwrap_or_else(|e| e.into_inner()));
    }
    let _emitting = lock(&thread.emit_lock);
    let mut p = lock(&thread.pipe);
    if let Some(f) = &p.failed {
        return Err(f.clone());
    }
    if p.inflight_events == 0 {
        // Nothing in flight and no other append (the emit lock): the head is settled, and
        // only this thread adds to the pipe, so it stays empty while the lock is let go.
        drop(p);
        let head = lock(&thread.data).last_seq;
        p = lock(&thread.pipe);
        p.next_seq = head + 1;
    }
    let seq = p.next_seq;
    p.next_seq += 1;
    p.queued.push(Pending {
        event,
        note,
        bytes,
        seq,
    });
    p.inflight_events += 1;
    p.inflight_bytes += bytes;
    inner
        .stats
        .inflight_high_water
        .fetch_max(p.inflight_events as u64, Ordering::Relaxed);
    let schedule = !p.scheduled;
    p.scheduled = true;
    drop(p);
    if schedule {
        inner.committer.schedule(inner, Arc::clone(thread));
    }
    Ok(seq)
}

/// Waits until everything this thread handed over is committed and delivered (or failed);
/// `Err` with the store's message if a commit failed.
pub(crate) fn flush(thread: &ThreadState) -> Result<(), String> {
    let mut p = lock(&thread.pipe);
    while p.inflight_events > 0 {
        p = thread.pipe_cv.wait(p).unwrap_or_else(|e| e.into_inner());
    }
    match &p.failed {
        Some(f) => Err(f.clone()),
        None => Ok(()),
    }
}

fn wait_for_reader(stats: &Stats, conn: &ConnShared) {
    if conn.outbound.wait_for_room(conn.outbound_stall) == Err(super::PushError::Full) {
        Stats::bump(&stats.closed_slow_consumers);
        tracing::warn!(
            target: "cc_app_server::engine",
            "connection {} took no message for {:?} with its outbound queue full; closed as a slow consumer",
            conn.id, conn.outbound_stall
        );
        conn.close_all(true);
    }
}

/// Bytes a payload takes as JSON, roughly (for the in-flight byte bound; computed without
/// serialising it).
pub(crate) fn approx_json_len(v: &serde_json::Value) -> usize {
    use serde_json::Value;
    match v {
        Value::Null | Value::Bool(_) => 5,
        Value::Number(_) => 12,
        Value::String(s) => s.len() + 2,
        Value::Array(a) => 2 + a.iter().map(|x| approx_json_len(x) + 1).sum::<usize>(),
        Value::Object(o) => {
            2 + o
                .iter()
                .map(|(k, x)| k.len() + 4 + approx_json_len(x))
                .sum::<usize>()
        }
    }
}

/// Appends events to a thread and then delivers the notifications built from them, under the
/// thread's emit lock so hosts see notifications in seq order.
pub(crate) fn emit(
    inner: &Inner,
    thread: &ThreadState,
    events: Vec<NewEvent>,
    notify: impl FnOnce(&[StoredEvent]) -> Vec<ServerNotification>,
) -> Result<Vec<StoredEvent>, StoreError> {
    let guard = lock(&thread.emit_lock);
    emit_locked(inner, thread, &guard, events, notify)
}

/// `emit` for a caller that already holds the thread's emit lock (`_held` is the proof).
pub(crate) fn emit_locked(
    inner: &Inner,
    thread: &ThreadState,
    _held: &MutexGuard<'_, ()>,
    events: Vec<NewEvent>,
    notify: impl FnOnce(&[StoredEvent]) -> Vec<ServerNotification>,
) -> Result<Vec<StoredEvent>, StoreError> {
    // Pipelined events of this thread go first (the pipe enqueues under the same emit lock).
    let _ = flush(thread);
    let events = inner.store.append(&thread.id, events)?;
    {
        let mut data = lock(&thread.data);
        if let Some(last) = events.last() {
            data.last_seq = last.seq;
            data.updated_at = last.time.clone();
        }
    }
    let subscribers = inner.connections.followers(&thread.id);
    for message in notify(&events) {
        let text = serde_json::to_string(&message).expect("a notification is JSON");
        for conn in &subscribers {
            deliver(&inner.stats, conn, text.clone());
        }
    }
    Ok(events)
}
