//! The wire v1 engine: one `AppServer` per state directory, any number of in-process
//! `Connection`s, each with its own handshake and bounded queues. Every inbound message is
//! validated against the schema before dispatch; every notification is written to the rollout
//! before any host sees it.

mod attempt;
mod causal;
mod compact;
mod config;
mod dispatch;
mod idempotency;
mod listing;
mod outbound;
mod pipeline;
mod pool;
pub mod queue;
mod stats;
pub(crate) mod threads;
pub(crate) mod turn;

pub use crate::kernel::history::{History, HistoryEntry, HistoryTurn};
pub use config::{Limits, ServerConfig};
pub use queue::{PushError, RecvError, RecvFuture};
pub use stats::{FailedClosedCounts, Stats, StatsSnapshot};
pub use turn::{EVENT_ENVELOPE_BYTES, OUTPUT_LIMIT_CODE};

use crate::approval::{ApprovalPolicy, Grants, UsedNonces};
use crate::protocol::EventPayload;
pub(crate) use crate::rollout::sync::lock;
use crate::rollout::{open_store, RolloutStore, StoreError};
use pool::TurnPool;
use queue::BoundedQueue;
use serde_json::{Map, Value};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use turn::TurnShared;

/// Features this server implements (and so may advertise), in negotiation order.
pub const IMPLEMENTED_FEATURES: &[&str] = &[
    "thread_turn_item",
    "structured_approval",
    "bounded_transport",
    "thread_compact",
    "typed_graph",
    "causal_messages",
    "graph_effect_receipts",
];

/// Why `open` failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("cannot open the rollout store: {0}")]
    Store(#[from] StoreError),
    #[error("invalid configuration: {0}")]
    Config(String),
}

/// Why `Connection::send` (or `AppServer::connect`) refused. Nothing was queued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    #[error("server queue full; retry after {retry_after_ms} ms")]
    Overloaded { retry_after_ms: u64 },
    #[error("message of {size} bytes exceeds the {max}-byte limit")]
    LineTooLarge { size: usize, max: usize },
    #[error("connection closed")]
    Closed,
}

/// One thread's live state; the rollout is the truth, this is its cached head.
pub(crate) struct ThreadState {
    pub id: String,
    pub data: Mutex<ThreadData>,
    /// Serialises append-then-notify so hosts see events in seq order.
    pub emit_lock: Mutex<()>,
    /// When it was last used (a tick of `Inner::clock`), for unloading the least recent.
    pub last_used: AtomicU64,
    /// The running turn's events on their way to the disk and the hosts (pipeline.rs).
    pub pipe: Mutex<pipeline::ThreadPipeline>,
    /// Signalled when the committer delivers or fails a batch of this thread.
    pub pipe_cv: std::sync::Condvar,
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
    /// The most recent finished turns, oldest first (bounded by `Limits::recent_turns`; older
    /// ones are looked up in the rollout).
    pub recent: VecDeque<turn::EndedTurn>,
    /// A terminal event the store refused (disk full): written before anything else on this
    /// thread once the store accepts writes again.
    pub pending_terminal: Option<EventPayload>,
    /// Whether this process has looked for a turn a dead process left open (done once, when
    /// the thread is first touched; threads this process created need no look).
    pub recovered: bool,
}

impl ThreadData {
    pub fn remember_turn(&mut self, turn: turn::EndedTurn, cap: usize) {
        if let Some(t) = self.recent.iter_mut().find(|t| t.turn.id == turn.turn.id) {
            *t = turn;
            return;
        }
        self.recent.push_back(turn);
        while self.recent.len() > cap.max(1) {
            self.recent.pop_front();
        }
    }

    pub fn recent_turn(&self, id: &str) -> Option<&turn::EndedTurn> {
        self.recent.iter().rev().find(|t| t.turn.id == id)
    }

    /// Whether unloading would lose something the rollout does not hold.
    pub fn is_busy(&self) -> bool {
        self.active.is_some() || self.pending_terminal.is_some()
    }
}

pub(crate) struct ConnState {
    pub initialized: bool,
    pub features: Vec<String>,
}

/// The threads one connection follows, bounded: following one more forgets the least recently
/// used.
pub(crate) struct Follows {
    ticks: HashMap<String, u64>,
    next: u64,
    cap: usize,
}

impl Follows {
    fn new(cap: usize) -> Self {
        Follows {
            ticks: HashMap::new(),
            next: 0,
            cap: cap.max(1),
        }
    }

    pub fn follow(&mut self, thread_id: &str) {
        self.next += 1;
        let tick = self.next;
        match self.ticks.get_mut(thread_id) {
            Some(t) => *t = tick,
            None => {
                self.ticks.insert(thread_id.to_string(), tick);
            }
        }
        if self.ticks.len() > self.cap {
            // Forget the oldest eighth at once, so the sort is paid once per cap/8 follows.
            let mut by_age: Vec<(u64, String)> =
                self.ticks.iter().map(|(k, t)| (*t, k.clone())).collect();
            by_age.sort_unstable();
            let excess = self.ticks.len() - self.cap + self.cap / 8;
            for (_, k) in by_age.into_iter().take(excess) {
                self.ticks.remove(&k);
            }
        }
    }

    pub fn contains(&self, thread_id: &str) -> bool {
        self.ticks.contains_key(thread_id)
    }
}

/// The server side of one connection.
pub(crate) struct ConnShared {
    pub id: u64,
    pub inbound: Arc<BoundedQueue>,
    pub outbound: Arc<BoundedQueue>,
    pub state: Mutex<ConnState>,
    /// Server requests awaiting the host's answer: id → the turn waiting for it.
    pub pending: Mutex<HashMap<u64, Arc<TurnShared>>>,
    pub next_request_id: AtomicU64,
    pub session_grants: Mutex<Grants>,
    pub max_line_bytes: usize,
    pub outbound_stall: Duration,
    pub follows: Mutex<Follows>,
    /// turn/interrupt requests waiting for a kernel to settle: (deadline, turn).
    pub interrupts: Mutex<Vec<(Instant, Arc<TurnShared>)>>,
    /// Lines `send` accepted, lines answered, and lines that get no answer (the host's own
    /// responses): the transport's drain counts on these instead of guessing from the text.
    pub accepted: AtomicU64,
    pub answered: AtomicU64,
    pub unanswered_by_design: AtomicU64,
    /// Set once the connection's worker has returned and dropped its hold on the engine (and so
    /// on the store and its lock): `shutdown` waits for it.
    pub worker_gone: Mutex<bool>,
    pub worker_exit: Condvar,
}

impl ConnShared {
    /// Waits until the worker has let go of the engine, at most until `deadline`.
    fn wait_worker_gone(&self, deadline: Instant) -> bool {
        let mut gone = lock(&self.worker_gone);
        while !*gone {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            gone = self
                .worker_exit
                .wait_timeout(gone, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }

    pub fn is_open(&self) -> bool {
        !self.outbound.is_closed()
    }

    pub fn has_feature(&self, feature: &str) -> bool {
        lock(&self.state).features.iter().any(|f| f == feature)
    }

    pub fn follow(&self, thread_id: &str) {
        lock(&self.follows).follow(thread_id);
    }

    /// Closes both queues and wakes every turn waiting on this connection's answers (their
    /// approvals fail closed as `transportClosed`).
    pub fn close_all(&self, drop_outbound: bool) {
        if drop_outbound {
            self.outbound.close_and_clear();
        } else {
            self.outbound.close();
        }
        self.inbound.close();
        let waiting: Vec<Arc<TurnShared>> = lock(&self.pending).drain().map(|(_, t)| t).collect();
        for t in waiting {
            t.wake();
        }
    }
}

pub(crate) struct Inner {
    pub config: ServerConfig,
    pub store: Arc<dyn RolloutStore>,
    pub threads: threads::ThreadTable,
    pub idempotency: idempotency::Idempotency,
    pub approvals: Approvals,
    pub connections: outbound::Connections,
    pub lifecycle: Lifecycle,
    pub pool: Arc<TurnPool>,
    pub stats: Stats,
    /// Commits running turns' events in rounds and releases their notifications.
    pub committer: Arc<pipeline::Committer>,
    /// The Graph Kernel: graph runs on `<state>/graph-runs/` (core/graph/).
    pub graph: Arc<crate::graph::GraphHost>,
}

/// What an approval is checked against: the policy and workspace in force now (hosts may
/// change them; grants made under the old ones then lapse), and the nonces already used.
pub(crate) struct Approvals {
    policy: Mutex<(ApprovalPolicy, String)>,
    used_nonces: Mutex<UsedNonces>,
}

impl Approvals {
    fn new(policy: ApprovalPolicy, workspace: String, max_used_nonces: usize) -> Approvals {
        Approvals {
            policy: Mutex::new((policy, workspace)),
            used_nonces: Mutex::new(UsedNonces::new(max_used_nonces)),
        }
    }

    /// The policy and the workspace in force now.
    pub fn current(&self) -> (ApprovalPolicy, String) {
        lock(&self.policy).clone()
    }

    /// Records a nonce as used until `forget_at_ms`; `false` when it was used before.
    pub fn use_nonce(&self, nonce: &str, forget_at_ms: i64, now_ms: i64) -> bool {
        lock(&self.used_nonces).insert(nonce, forget_at_ms, now_ms)
    }

    fn set(&self, change: impl FnOnce(&mut (ApprovalPolicy, String))) {
        change(&mut lock(&self.policy));
    }

    fn used_nonces(&self) -> usize {
        lock(&self.used_nonces).len()
    }
}

/// Whether the server is shutting down, and the background summary of the store's index
/// (`RolloutStore::warm`) that shutdown stops.
pub(crate) struct Lifecycle {
    shut_down: AtomicBool,
    warm_stop: Arc<AtomicBool>,
    warm_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Lifecycle {
    fn new() -> Lifecycle {
        Lifecycle {
            shut_down: AtomicBool::new(false),
            warm_stop: Arc::new(AtomicBool::new(false)),
            warm_thread: Mutex::new(None),
        }
    }

    pub fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::SeqCst)
    }

    /// `true` for the one caller that begins the shutdown.
    fn begin_shutdown(&self) -> bool {
        !self.shut_down.swap(true, Ordering::SeqCst)
    }

    /// Completes the store's index of thread summaries in the background, so `thread/list`
    /// never opens a thread's files; stopped by `stop_warming`.
    fn start_warming(&self, store: &Arc<dyn RolloutStore>) {
        let store = Arc::clone(store);
        let stop = Arc::clone(&self.warm_stop);
        let spawned = std::thread::Builder::new()
            .name("cc-index-warm".into())
            .spawn(move || store.warm(&stop));
        // Without the thread, list summarises on demand, as the store always can.
        if let Ok(h) = spawned {
            *lock(&self.warm_thread) = Some(h);
        }
    }

    fn stop_warming(&self) {
        self.warm_stop.store(true, Ordering::SeqCst);
        if let Some(h) = lock(&self.warm_thread).take() {
            let _ = h.join();
        }
    }
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
    /// Opens the store and is ready for connections. Opening reads the state directory's names
    /// only (docs/engine.md, "Restart"): a thread is loaded when first touched, and a turn a dead
    /// process left open is closed then, before anything else happens on that thread; retried
    /// requests find their idempotency keys in the rollout. The store's index of thread
    /// summaries is completed in the background.
    pub fn open(config: ServerConfig) -> Result<AppServer, OpenError> {
        let (lo, hi) = config.protocol_versions;
        if lo == 0 || lo > hi {
            return Err(OpenError::Config(format!(
                "protocol_versions ({lo}, {hi}) is not a range"
            )));
        }
        let limits = config.limits;
        if limits.max_running_turns == 0 || limits.max_connections == 0 {
            return Err(OpenError::Config(
                "max_running_turns and max_connections must be at least 1".into(),
            ));
        }
        let store = open_store(
            config.store,
            &config.state_dir,
            config.store_options.clone(),
        )?;
        let approvals = Approvals::new(
            config.policy,
            config.workspace.clone(),
            limits.max_used_nonces,
        );
        let runs = crate::graph::GraphHost::open(
            config.store,
            &config.state_dir,
            config.store_options.clone(),
        )?;
        // The graph host holds a weak of the engine it runs attempts on (core/src/engine/attempt.rs).
        let inner = Arc::new_cyclic(|me: &std::sync::Weak<Inner>| Inner {
            config,
            store,
            threads: threads::ThreadTable::new(limits.max_loaded_threads),
            idempotency: idempotency::Idempotency::new(limits.idempotency_entries),
            approvals,
            connections: outbound::Connections::default(),
            lifecycle: Lifecycle::new(),
            pool: TurnPool::new(limits.max_running_turns, limits.max_queued_turns),
            stats: Stats::default(),
            committer: pipeline::Committer::new(),
            graph: Arc::new(
                runs.attach(me.clone() as std::sync::Weak<dyn crate::graph::port::GraphEngine>),
            ),
        });
        inner.committer.start(&inner);
        inner.lifecycle.start_warming(&inner.store);
        crate::graph::host::resume(&inner.graph);
        Ok(AppServer { inner })
    }

    /// A new connection with its own handshake state. Refused as `Overloaded` when
    /// `max_connections` are open or the OS will not start its worker thread.
    pub fn connect(&self) -> Result<Connection, SendError> {
        if self.inner.lifecycle.is_shut_down() {
            return Err(SendError::Closed);
        }
        let limits = self.inner.config.limits;
        let admitted = self.inner.connections.admit(limits.max_connections, |id| {
            let shared = Arc::new(ConnShared {
                id,
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
                outbound_stall: limits.outbound_stall,
                follows: Mutex::new(Follows::new(limits.max_followed_threads)),
                interrupts: Mutex::new(Vec::new()),
                accepted: AtomicU64::new(0),
                answered: AtomicU64::new(0),
                unanswered_by_design: AtomicU64::new(0),
                worker_gone: Mutex::new(false),
                worker_exit: Condvar::new(),
            });
            let inner = Arc::clone(&self.inner);
            let conn = Arc::clone(&shared);
            let worker = std::thread::Builder::new()
                .name(format!("cc-conn-{id}"))
                .spawn(move || {
                    dispatch::connection_loop(&inner, &conn);
                    drop(inner);
                    *lock(&conn.worker_gone) = true;
                    conn.worker_exit.notify_all();
                });
            match worker {
                Ok(w) => Some((shared, w)),
                Err(e) => {
                    tracing::error!(target: "cc_app_server::engine", "could not start a connection worker thread: {e}");
                    None
                }
            }
        });
        let Some((shared, worker)) = admitted else {
            Stats::bump(&self.inner.stats.connections_refused);
            return Err(SendError::Overloaded {
                retry_after_ms: 1000,
            });
        };
        Stats::bump(&self.inner.stats.connections_opened);
        Ok(Connection {
            shared,
            worker: Mutex::new(Some(worker)),
        })
    }

    /// Changes the approval policy; grants made under the old one lapse.
    pub fn set_policy(&self, policy: ApprovalPolicy) {
        self.inner.approvals.set(|p| p.0 = policy);
    }

    /// Changes the workspace approvals are bound to; grants made for the old one lapse.
    pub fn set_workspace(&self, workspace: &str) {
        self.inner.approvals.set(|p| p.1 = workspace.to_string());
    }

    /// The counters themselves (cheap atomics; see `stats_snapshot` for gauges as well).
    pub fn stats(&self) -> &Stats {
        &self.inner.stats
    }

    /// Every counter and gauge at once: connections, turns running and queued, runner threads,
    /// queue depths, slow-consumer closes, ignored responses, failed-closed approvals by
    /// reason… Cheap enough to poll (a few locks, no I/O); meant for hosts' diagnostics.
    pub fn stats_snapshot(&self) -> StatsSnapshot {
        let inner = &self.inner;
        let mut s = inner.stats.counters();
        for c in inner.connections.open() {
            s.connections_open += 1;
            s.inbound_queued += c.inbound.usage().0 as u64;
            s.outbound_queued += c.outbound.usage().0 as u64;
            s.interrupts_waiting += lock(&c.interrupts).len() as u64;
        }
        let pool = inner.pool.usage();
        s.turns_running = pool.running as u64;
        s.turns_queued = pool.queued as u64;
        s.runner_threads = pool.workers as u64;
        s.runner_spawn_failures = inner.pool.spawn_failures.load(Ordering::Relaxed);
        s.threads_loaded = inner.threads.len() as u64;
        s.idempotency_entries = inner.idempotency.len() as u64;
        let store = inner.store.stats();
        s.store_indexed_threads = store.indexed_threads;
        s.store_unsummarised_threads = store.unsummarised_threads;
        s.store_loaded_threads = store.loaded_threads;
        s.tail_cache_threads = store.cached_threads;
        s.tail_cache_bytes = store.cached_bytes;
        s.used_nonces = inner.approvals.used_nonces() as u64;
        s
    }

    /// The Graph Kernel of this server (docs/graph.md).
    pub fn graph(&self) -> crate::graph::GraphHandle {
        crate::graph::GraphHandle::new(Arc::clone(&self.inner.graph), Arc::clone(&self.inner) as _)
    }

    /// The rollout store this server writes (for verification and tools).
    pub fn store(&self) -> &Arc<dyn RolloutStore> {
        &self.inner.store
    }

    /// Entries in the idempotency cache now.
    pub fn idempotency_entries(&self) -> usize {
        self.inner.idempotency.len()
    }

    /// Stops accepting work, interrupts live and queued turns (recording each as interrupted),
    /// waits for every runner to stop, closes every connection and flushes the store. Idempotent.
    pub fn shutdown(&self) {
        if !self.inner.lifecycle.begin_shutdown() {
            return;
        }
        self.inner.graph.shutdown();
        let conns: Vec<Arc<ConnShared>> = self.inner.connections.take_all();
        for conn in &conns {
            conn.close_all(false);
        }
        let live: Vec<Arc<TurnShared>> = self
            .inner
            .threads
            .all()
            .iter()
            .filter_map(|t| lock(&t.data).active.clone())
            .collect();
        for t in &live {
            t.cancel();
            self.inner.config.tools.interrupt(&t.thread_id);
        }
        let (queued, runners) = self.inner.pool.shutdown();
        for job in queued {
            turn::close_unstarted(job, turn::Unstarted::Interrupted);
        }
        for h in runners {
            let _ = h.join();
        }
        self.inner.lifecycle.stop_warming();
        // Last chance for terminal events the store refused earlier (the disk may have room
        // now); what still fails is closed by recovery at the next open.
        for t in self.inner.threads.all() {
            let _ = dispatch::record_pending_terminal(&self.inner, &t);
        }
        self.inner.committer.stop();
        let _ = self.inner.store.flush();
        // The connection workers hold the engine until their loops return: once they have, the
        // store (and its lock) goes with the last handle, so the directory can be reopened as
        // soon as the server is dropped. Bounded: a worker stuck in a host callback is left.
        let deadline = Instant::now() + self.inner.config.settle_deadline;
        let on_worker = conns.iter().any(|c| {
            std::thread::current()
                .name()
                .is_some_and(|n| n == format!("cc-conn-{}", c.id))
        });
        if !on_worker {
            for conn in &conns {
                conn.wait_worker_gone(deadline);
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.committer.signal_stop();
        self.lifecycle.warm_stop.store(true, Ordering::SeqCst);
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
        // Counted before the push so the worker can never answer a line before it is counted.
        self.shared.accepted.fetch_add(1, Ordering::SeqCst);
        match self.shared.inbound.try_push(message.to_string()) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.shared.accepted.fetch_sub(1, Ordering::SeqCst);
                Err(match e {
                    PushError::Closed => SendError::Closed,
                    PushError::Full => SendError::Overloaded {
                        retry_after_ms: retry_after_ms(&self.shared),
                    },
                })
            }
        }
    }

    /// The next message from the server, waiting up to `timeout` (`None`: until one arrives).
    pub fn recv(&self, timeout: Option<Duration>) -> Result<String, RecvError> {
        self.shared.outbound.recv(timeout)
    }

    /// The next message, waiting with no timeout until one arrives, the connection closes, or
    /// `stop` is set and [`Connection::wake_receivers`] called (then `Timeout`).
    pub fn recv_until(&self, stop: &AtomicBool) -> Result<String, RecvError> {
        self.shared.outbound.recv_until(stop)
    }

    /// Wakes every thread blocked in `recv` / `recv_until` on this connection.
    pub fn wake_receivers(&self) {
        self.shared.outbound.wake_readers();
    }

    /// Blocks until the connection is closed (by `close`, shutdown, or the stall rule).
    pub fn wait_closed(&self) {
        self.shared.outbound.wait_closed();
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

    /// Lines this connection accepted that the server has not answered yet. Every line gets
    /// exactly one answer — including lines that are not JSON at all (-32700) — except the
    /// host's own responses to server requests, so zero means everything sent was answered.
    /// (The answer may still be waiting in the outbound queue.)
    pub fn unanswered(&self) -> u64 {
        let s = &self.shared;
        let accepted = s.accepted.load(Ordering::SeqCst);
        let done =
            s.answered.load(Ordering::SeqCst) + s.unanswered_by_design.load(Ordering::SeqCst);
        accepted.saturating_sub(done)
    }

    /// Closes the connection: pending approvals fail closed, queued replies are dropped. Idempotent.
    pub fn close(&self) {
        self.shared.close_all(true);
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
