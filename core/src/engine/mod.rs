//! The wire v1 engine: one `AppServer` per state directory, any number of in-process
//! `Connection`s, each with its own handshake and bounded queues. Every inbound message is
//! validated against the schema before dispatch; every notification is written to the rollout
//! before any host sees it.

mod compact;
mod config;
mod dispatch;
pub mod history;
pub mod queue;
mod turn;

pub use config::{Limits, ServerConfig};
pub use history::{History, HistoryEntry, HistoryTurn};
pub use queue::{PushError, RecvError, RecvFuture};

use crate::approval::{ApprovalPolicy, Grants};
use crate::protocol::{EventPayload, ServerNotification};
use crate::rollout::{open_store, NewEvent, RolloutStore, StoreError, StoredEvent};
use queue::BoundedQueue;
use serde_json::{Map, Value};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;
use turn::TurnShared;

/// Features this server implements (and so may advertise), in negotiation order.
pub const IMPLEMENTED_FEATURES: &[&str] = &[
    "thread_turn_item",
    "structured_approval",
    "bounded_transport",
    "thread_compact",
];

/// Why `open` failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("cannot open the rollout store: {0}")]
    Store(#[from] StoreError),
    #[error("invalid configuration: {0}")]
    Config(String),
}

/// Why `Connection::send` refused a message. Nothing was queued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    #[error("server queue full; retry after {retry_after_ms} ms")]
    Overloaded { retry_after_ms: u64 },
    #[error("message of {size} bytes exceeds the {max}-byte limit")]
    LineTooLarge { size: usize, max: usize },
    #[error("connection closed")]
    Closed,
}

/// Counters a host or test can read; they never go down.
#[derive(Debug, Default)]
pub struct Stats {
    /// Responses from a host that matched no pending server request (late, duplicate, unknown).
    pub ignored_responses: AtomicU64,
    /// Connections closed because their host stopped reading.
    pub closed_slow_consumers: AtomicU64,
    /// Tools actually executed.
    pub tools_executed: AtomicU64,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One thread's live state; the rollout is the truth, this is its cached head.
pub(crate) struct ThreadState {
    pub id: String,
    pub data: Mutex<ThreadData>,
    /// Serialises append-then-notify so hosts see events in seq order.
    pub emit_lock: Mutex<()>,
}

pub(crate) struct ThreadData {
    pub title: Option<String>,
    pub metadata: Map<String, Value>,
    pub created_at: String,
    pub updated_at: String,
    pub archived: bool,
    pub last_seq: u64,
    pub forked_from: Option<crate::protocol::ForkOrigin>,
    pub agent_options: Value,
    pub active: Option<Arc<TurnShared>>,
    /// Turns seen in this thread: id → last known wire Turn.
    pub turns: HashMap<String, crate::protocol::Turn>,
    pub subscribers: Vec<Weak<ConnShared>>,
}

pub(crate) struct ConnState {
    pub initialized: bool,
    pub features: Vec<String>,
}

/// The server side of one connection.
pub(crate) struct ConnShared {
    pub id: u64,
    pub inbound: Arc<BoundedQueue>,
    pub outbound: Arc<BoundedQueue>,
    pub state: Mutex<ConnState>,
    /// Server requests awaiting the host's answer: id → where the answer goes.
    pub pending: Mutex<HashMap<u64, SyncSender<Value>>>,
    pub next_request_id: AtomicU64,
    pub session_grants: Mutex<Grants>,
    pub max_line_bytes: usize,
}

impl ConnShared {
    pub fn is_open(&self) -> bool {
        !self.outbound.is_closed()
    }

    pub fn has_feature(&self, feature: &str) -> bool {
        lock(&self.state).features.iter().any(|f| f == feature)
    }
}

/// The idempotency cache: (method, key) → (params digest, result), bounded, oldest evicted first.
#[derive(Default)]
pub(crate) struct IdempotencyCache {
    entries: HashMap<(String, String), (String, Value)>,
    order: VecDeque<(String, String)>,
}

impl IdempotencyCache {
    pub fn get(&self, method: &str, key: &str) -> Option<&(String, Value)> {
        self.entries.get(&(method.to_string(), key.to_string()))
    }

    pub fn put(&mut self, method: &str, key: &str, digest: String, result: Value, capacity: usize) {
        let k = (method.to_string(), key.to_string());
        if self.entries.insert(k.clone(), (digest, result)).is_none() {
            self.order.push_back(k);
        }
        while self.order.len() > capacity {
            if let Some(old) = self.order.pop_front() {
                self.entries.remove(&old);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }
}

pub(crate) struct Inner {
    pub config: ServerConfig,
    pub store: Arc<dyn RolloutStore>,
    pub threads: Mutex<HashMap<String, Arc<ThreadState>>>,
    pub idempotency: Mutex<IdempotencyCache>,
    /// The policy and workspace in force now (hosts may change them; grants then lapse).
    pub policy: Mutex<(ApprovalPolicy, String)>,
    pub used_nonces: Mutex<std::collections::HashSet<String>>,
    pub next_conn: AtomicU64,
    pub shut_down: AtomicBool,
    pub connections: Mutex<Vec<Weak<ConnShared>>>,
    pub turn_threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    pub stats: Stats,
    /// Threads with a thread/compact in progress (one at a time per thread).
    pub compacting: Mutex<std::collections::HashSet<String>>,
}

/// An in-process app server over one state directory. Cheap to clone; shuts down on `shutdown`
/// or when the last clone is dropped.
#[derive(Clone)]
pub struct AppServer {
    inner: Arc<Inner>,
}

/// The host's end of one connection: a bounded, non-blocking `send` and a bounded receive.
pub struct Connection {
    shared: Arc<ConnShared>,
    worker: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl AppServer {
    /// Opens the store (repairing torn tails), closes every turn a previous process left running
    /// with failure evidence, and is ready for connections.
    pub fn open(config: ServerConfig) -> Result<AppServer, OpenError> {
        let (lo, hi) = config.protocol_versions;
        if lo == 0 || lo > hi {
            return Err(OpenError::Config(format!(
                "protocol_versions ({lo}, {hi}) is not a range"
            )));
        }
        let store = open_store(
            config.store,
            &config.state_dir,
            config.store_options.clone(),
        )?;
        let policy = (config.policy, config.workspace.clone());
        let inner = Arc::new(Inner {
            config,
            store,
            threads: Mutex::new(HashMap::new()),
            idempotency: Mutex::new(IdempotencyCache::default()),
            policy: Mutex::new(policy),
            used_nonces: Mutex::new(Default::default()),
            next_conn: AtomicU64::new(1),
            shut_down: AtomicBool::new(false),
            connections: Mutex::new(Vec::new()),
            turn_threads: Mutex::new(Vec::new()),
            stats: Stats::default(),
            compacting: Mutex::new(Default::default()),
        });
        dispatch::recover_all(&inner)?;
        Ok(AppServer { inner })
    }

    /// A new connection with its own handshake state.
    pub fn connect(&self) -> Result<Connection, SendError> {
        if self.inner.shut_down.load(Ordering::SeqCst) {
            return Err(SendError::Closed);
        }
        let limits = self.inner.config.limits;
        let shared = Arc::new(ConnShared {
            id: self.inner.next_conn.fetch_add(1, Ordering::SeqCst),
            inbound: BoundedQueue::new(limits.inbound_messages, limits.inbound_bytes),
            outbound: BoundedQueue::new(limits.outbound_messages, limits.outbound_bytes),
            state: Mutex::new(ConnState {
                initialized: false,
                features: Vec::new(),
            }),
            pending: Mutex::new(HashMap::new()),
            next_request_id: AtomicU64::new(1),
            session_grants: Mutex::new(Grants::default()),
            max_line_bytes: limits.max_line_bytes,
        });
        lock(&self.inner.connections).push(Arc::downgrade(&shared));
        let inner = Arc::clone(&self.inner);
        let conn = Arc::clone(&shared);
        let worker = std::thread::Builder::new()
            .name(format!("cc-conn-{}", shared.id))
            .spawn(move || dispatch::connection_loop(&inner, &conn))
            .map_err(|_| SendError::Closed)?;
        Ok(Connection {
            shared,
            worker: Mutex::new(Some(worker)),
        })
    }

    /// Changes the approval policy; grants made under the old one lapse.
    pub fn set_policy(&self, policy: ApprovalPolicy) {
        lock(&self.inner.policy).0 = policy;
    }

    /// Changes the workspace approvals are bound to; grants made for the old one lapse.
    pub fn set_workspace(&self, workspace: &str) {
        lock(&self.inner.policy).1 = workspace.to_string();
    }

    pub fn stats(&self) -> &Stats {
        &self.inner.stats
    }

    /// The rollout store this server writes (for verification and tools).
    pub fn store(&self) -> &Arc<dyn RolloutStore> {
        &self.inner.store
    }

    /// Entries in the idempotency cache now.
    pub fn idempotency_entries(&self) -> usize {
        lock(&self.inner.idempotency).len()
    }

    /// Stops accepting work, interrupts live turns (waiting up to the settle deadline for each),
    /// closes every connection and flushes the store. Idempotent.
    pub fn shutdown(&self) {
        if self.inner.shut_down.swap(true, Ordering::SeqCst) {
            return;
        }
        for conn in lock(&self.inner.connections)
            .drain(..)
            .filter_map(|w| w.upgrade())
        {
            conn.inbound.close();
            conn.outbound.close();
        }
        let live: Vec<Arc<TurnShared>> = lock(&self.inner.threads)
            .values()
            .filter_map(|t| lock(&t.data).active.clone())
            .collect();
        for t in &live {
            t.cancel();
        }
        let handles: Vec<_> = lock(&self.inner.turn_threads).drain(..).collect();
        for h in handles {
            let _ = h.join();
        }
        let _ = self.inner.store.flush();
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let _ = self.store.flush();
    }
}

impl Connection {
    /// Queues one message (a JSON-RPC object as UTF-8 text) without blocking.
    pub fn send(&self, message: &str) -> Result<(), SendError> {
        let max = self.shared.max_line_bytes;
        if message.len() > max {
            return Err(SendError::LineTooLarge {
                size: message.len(),
                max,
            });
        }
        match self.shared.inbound.try_push(message.to_string()) {
            Ok(()) => Ok(()),
            Err(PushError::Closed) => Err(SendError::Closed),
            Err(PushError::Full) => Err(SendError::Overloaded {
                retry_after_ms: retry_after_ms(&self.shared),
            }),
        }
    }

    /// The next message from the server, waiting up to `timeout` (`None`: until one arrives).
    pub fn recv(&self, timeout: Option<Duration>) -> Result<String, RecvError> {
        self.shared.outbound.recv(timeout)
    }

    /// The next message if one is ready.
    pub fn try_recv(&self) -> Option<String> {
        self.shared.outbound.try_recv()
    }

    /// A future resolving to the next message from the server.
    pub fn recv_async(&self) -> RecvFuture {
        self.shared.outbound.recv_async()
    }

    /// True until the connection is closed (by `close`, shutdown, or a host that stopped reading).
    pub fn is_open(&self) -> bool {
        self.shared.is_open()
    }

    /// Closes the connection: pending approvals fail closed, queued replies are dropped. Idempotent.
    pub fn close(&self) {
        self.shared.inbound.close();
        self.shared.outbound.close_and_clear();
        lock(&self.shared.pending).clear();
        let worker = lock(&self.worker).take();
        if let Some(worker) = worker {
            if worker.thread().id() != std::thread::current().id() {
                let _ = worker.join();
            }
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.close();
    }
}

/// How long a refused sender should wait: proportional to the backlog, at least 1 ms.
fn retry_after_ms(conn: &ConnShared) -> u64 {
    let (messages, _) = conn.inbound.usage();
    (messages as u64 / 16).clamp(1, 1000)
}

/// Appends events to a thread and then delivers the notifications built from them, under the
/// thread's emit lock so hosts see notifications in seq order.
pub(crate) fn emit(
    inner: &Inner,
    thread: &ThreadState,
    payloads: Vec<EventPayload>,
    notify: impl FnOnce(&[StoredEvent]) -> Vec<ServerNotification>,
) -> Result<Vec<StoredEvent>, StoreError> {
    let _guard = lock(&thread.emit_lock);
    let payloads = payloads
        .iter()
        .map(|p| NewEvent::new(serde_json::to_value(p).expect("an event payload is JSON")))
        .collect();
    let events = inner.store.append(&thread.id, payloads)?;
    let subscribers: Vec<Arc<ConnShared>> = {
        let mut data = lock(&thread.data);
        if let Some(last) = events.last() {
            data.last_seq = last.seq;
            data.updated_at = last.time.clone();
        }
        data.subscribers
            .retain(|w| w.upgrade().is_some_and(|c| c.is_open()));
        data.subscribers.iter().filter_map(Weak::upgrade).collect()
    };
    for message in notify(&events) {
        let text = serde_json::to_string(&message).expect("a notification is JSON");
        for conn in &subscribers {
            deliver(inner, conn, text.clone());
        }
    }
    Ok(events)
}

/// Puts one message on a connection's outbound queue; a host that stopped reading (queue over
/// its cap) has its connection closed — the engine and every other connection keep running.
pub(crate) fn deliver(inner: &Inner, conn: &ConnShared, text: String) {
    #[cfg(debug_assertions)]
    if let Ok(value) = serde_json::from_str::<Value>(&text) {
        if let Err(e) = cc_agent_protocol::validate_protocol_message(&value) {
            panic!("engine produced an invalid message: {e}\n{text}");
        }
    }
    if conn.outbound.try_push(text) == Err(PushError::Full) {
        inner
            .stats
            .closed_slow_consumers
            .fetch_add(1, Ordering::Relaxed);
        conn.outbound.close_and_clear();
        conn.inbound.close();
        lock(&conn.pending).clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn idempotency_cache_is_bounded_and_evicts_the_oldest() {
        let mut cache = IdempotencyCache::default();
        for i in 0..1024 {
            cache.put("turn/start", &format!("k{i}"), "d".into(), json!(i), 1024);
        }
        assert_eq!(cache.len(), 1024);
        assert!(cache.get("turn/start", "k0").is_some());
        cache.put("turn/start", "k1024", "d".into(), json!(1024), 1024);
        assert_eq!(cache.len(), 1024);
        assert!(
            cache.get("turn/start", "k0").is_none(),
            "the oldest went first"
        );
        assert_eq!(
            cache.get("turn/start", "k1024").map(|e| &e.1),
            Some(&json!(1024))
        );
        // Same key under another method is another entry.
        assert!(cache.get("thread/start", "k5").is_none());
    }
}
