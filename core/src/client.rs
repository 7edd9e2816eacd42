//! The one Rust client every host goes through (directly, or via uniffi and the C ABI): it owns
//! the pending-request map, the timeouts, the approval routing and the default decline, so no
//! language re-implements protocol state.

use crate::engine::{AppServer, Connection, RecvError, SendError};
use crate::protocol::{ApprovalDecideParams, ApprovalDecision, Decline};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Decides approval/decide requests for the host. Absent, failing or too slow: the client
/// declines, so the server fails closed. Runs on the client's approval threads (at most
/// `ClientConfig::approval_workers`), never on the thread that delivers notifications.
pub trait ApprovalHandler: Send + Sync {
    fn decide(&self, params: &ApprovalDecideParams) -> Result<ApprovalDecision, String>;
}

/// Client-side bounds.
#[derive(Debug, Clone, Copy)]
pub struct ClientConfig {
    /// A request unanswered this long fails with -32010 (never read as success).
    pub request_timeout: Duration,
    /// Requests in flight at once; one more is refused locally with -32001.
    pub max_pending: usize,
    /// How long the approval handler may take before the client declines.
    pub approval_timeout: Duration,
    /// Notifications buffered for the host; when full the pump waits, and the server closes the
    /// connection if the host never reads.
    pub notification_capacity: usize,
    /// Threads that run the approval handler (created on first need); a handler that hangs holds
    /// one until it returns, and the approval it was deciding is declined at its deadline.
    pub approval_workers: usize,
    /// Approvals waiting for a free handler thread; one more is declined at once.
    pub approval_queue: usize,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            request_timeout: Duration::from_secs(120),
            max_pending: 256,
            approval_timeout: Duration::from_secs(30),
            notification_capacity: 4096,
            approval_workers: 2,
            approval_queue: 64,
        }
    }
}

/// What a request can end in besides a result.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ClientError {
    #[error("overloaded; retry after {retry_after_ms} ms")]
    Overloaded { retry_after_ms: u64 },
    #[error("no answer within the request timeout")]
    Timeout,
    #[error("the connection is closed")]
    Closed,
    #[error("message too large ({size} bytes, limit {max})")]
    LineTooLarge { size: usize, max: usize },
    #[error("server error {code}: {message}")]
    Protocol {
        code: i64,
        message: String,
        data: Option<Value>,
    },
    #[error("cannot decode the result: {0}")]
    Decode(String),
}

impl ClientError {
    /// The JSON-RPC code this error stands for.
    pub fn code(&self) -> i64 {
        match self {
            ClientError::Overloaded { .. } => -32001,
            ClientError::Timeout => -32010,
            ClientError::Closed => -32603,
            ClientError::LineTooLarge { .. } => -32600,
            ClientError::Protocol { code, .. } => *code,
            ClientError::Decode(_) => -32603,
        }
    }
}

type Pending = Arc<Mutex<HashMap<u64, SyncSender<Result<Value, ClientError>>>>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A connected, initialized client.
pub struct Client {
    conn: Arc<Connection>,
    pending: Pending,
    next_id: AtomicU64,
    notifications: Mutex<Receiver<Value>>,
    config: ClientConfig,
    pump: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The server's initialize result.
    pub initialize_result: Value,
}

impl Client {
    /// Connects to `server` and performs the handshake, asking for every v1 feature.
    pub fn connect(
        server: &AppServer,
        handler: Option<Arc<dyn ApprovalHandler>>,
        config: ClientConfig,
    ) -> Result<Client, ClientError> {
        let conn = Arc::new(server.connect().map_err(|_| ClientError::Closed)?);
        let pending: Pending = Arc::default();
        let (tx, rx) = sync_channel(config.notification_capacity);
        let pump = {
            let (conn, pending) = (Arc::clone(&conn), Arc::clone(&pending));
            let approvals = Approvals::new(Arc::clone(&conn), handler, config);
            std::thread::Builder::new()
                .name("cc-client-pump".into())
                .spawn(move || pump(&conn, &pending, &tx, approvals))
                .map_err(|_| ClientError::Closed)?
        };
        let mut client = Client {
            conn,
            pending,
            next_id: AtomicU64::new(1),
            notifications: Mutex::new(rx),
            config,
            pump: Mutex::new(Some(pump)),
            initialize_result: Value::Null,
        };
        client.initialize_result = client.request(
            "initialize",
            json!({
                "protocolVersion": cc_agent_protocol::PROTOCOL_VERSION,
                "minimumProtocolVersion": 1,
                "client": {"name": "cc-app-server-rust-client", "version": env!("CARGO_PKG_VERSION")},
                "features": crate::engine::IMPLEMENTED_FEATURES,
            }),
        )?;
        Ok(client)
    }

    /// Sends a request and waits for its result.
    pub fn request(&self, method: &str, params: Value) -> Result<Value, ClientError> {
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let (tx, rx) = sync_channel(1);
        {
            let mut pending = lock(&self.pending);
            if pending.len() >= self.config.max_pending {
                return Err(ClientError::Overloaded { retry_after_ms: 10 });
            }
            pending.insert(id, tx);
        }
        let message =
            json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string();
        if let Err(e) = self.conn.send(&message) {
            lock(&self.pending).remove(&id);
            return Err(match e {
                SendError::Overloaded { retry_after_ms } => {
                    ClientError::Overloaded { retry_after_ms }
                }
                SendError::LineTooLarge { size, max } => ClientError::LineTooLarge { size, max },
                SendError::Closed => ClientError::Closed,
            });
        }
        let answer = rx.recv_timeout(self.config.request_timeout);
        lock(&self.pending).remove(&id);
        match answer {
            Ok(result) => result,
            Err(RecvTimeoutError::Timeout) => Err(ClientError::Timeout),
            Err(RecvTimeoutError::Disconnected) => Err(ClientError::Closed),
        }
    }

    /// A request with typed params and result, using the generated protocol types.
    pub fn call<P: Serialize, R: DeserializeOwned>(
        &self,
        method: &str,
        params: &P,
    ) -> Result<R, ClientError> {
        let params =
            serde_json::to_value(params).map_err(|e| ClientError::Decode(e.to_string()))?;
        let result = self.request(method, params)?;
        serde_json::from_value(result).map_err(|e| ClientError::Decode(e.to_string()))
    }

    /// The next notification, waiting up to `timeout` (`None` on timeout or once closed).
    pub fn next_notification(&self, timeout: Duration) -> Option<Value> {
        self.recv_notification(timeout).ok()
    }

    /// The next notification, telling a timeout from a closed connection with nothing left.
    pub fn recv_notification(&self, timeout: Duration) -> Result<Value, RecvError> {
        match lock(&self.notifications).recv_timeout(timeout) {
            Ok(v) => Ok(v),
            Err(RecvTimeoutError::Timeout) => Err(RecvError::Timeout),
            Err(RecvTimeoutError::Disconnected) => Err(RecvError::Closed),
        }
    }

    /// True once the connection is closed (by `close`, the server, or a host that stopped reading).
    pub fn is_closed(&self) -> bool {
        !self.conn.is_open()
    }

    /// Requests now waiting for an answer.
    pub fn pending_requests(&self) -> usize {
        lock(&self.pending).len()
    }

    /// Closes the connection; pending requests end with `Closed`. Idempotent; callable from any
    /// thread that holds the client.
    pub fn close(&self) {
        self.conn.close();
        let pump = lock(&self.pump).take();
        if let Some(p) = pump {
            let _ = p.join();
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.close();
    }
}

fn pump(
    conn: &Connection,
    pending: &Pending,
    notifications: &SyncSender<Value>,
    mut approvals: Approvals,
) {
    loop {
        // Wake for the next approval deadline too, so a slow handler is declined on time.
        let wait = approvals
            .next_deadline()
            .map(|d| d.saturating_duration_since(Instant::now()))
            .unwrap_or(Duration::from_millis(200))
            .min(Duration::from_millis(200));
        let received = conn.recv(Some(wait));
        approvals.decline_expired();
        let text = match received {
            Ok(t) => t,
            Err(RecvError::Timeout) => continue,
            Err(RecvError::Closed) => break,
        };
        let Ok(message) = serde_json::from_str::<Value>(&text) else {
            continue;
        };
        match (message.get("method"), message.get("id")) {
            (Some(_), Some(id)) => approvals.route(id.clone(), &message["params"]),
            (Some(_), None) => {
                if notifications.send(message).is_err() {
                    break;
                }
            }
            (None, Some(id)) => {
                let waiter = id.as_u64().and_then(|id| lock(pending).remove(&id));
                if let Some(tx) = waiter {
                    let result = match message.get("error") {
                        Some(e) => Err(ClientError::Protocol {
                            code: e["code"].as_i64().unwrap_or(-32603),
                            message: e["message"].as_str().unwrap_or_default().to_string(),
                            data: e.get("data").cloned(),
                        }),
                        None => Ok(message["result"].clone()),
                    };
                    let _ = tx.try_send(result);
                }
            }
            (None, None) => {}
        }
    }
    lock(pending).clear();
}

/// One approval/decide request on its way to an answer: whoever flips `answered` first (the
/// handler thread with a decision, the pump at the deadline with a decline) sends it.
struct Asked {
    id: Value,
    nonce: Value,
    deadline: Instant,
    answered: AtomicBool,
}

impl Asked {
    fn answer(&self, conn: &Connection, decision: ApprovalDecision) {
        if self.answered.swap(true, Ordering::SeqCst) {
            return;
        }
        let response = json!({"jsonrpc": "2.0", "id": self.id, "result": {"nonce": self.nonce, "decision": decision}});
        let _ = conn.send(&response.to_string());
    }
}

fn decline() -> ApprovalDecision {
    ApprovalDecision::Decline(Decline { reason: None })
}

type ApprovalJob = (Arc<Asked>, ApprovalDecideParams);

/// Routes approval/decide to the host's handler on a small, bounded set of threads (created on
/// first need), off the pump so notifications keep flowing while a handler thinks. Anything but
/// a decision in time — no handler, a full queue, an error, a panic, the deadline — declines.
struct Approvals {
    conn: Arc<Connection>,
    handler: Option<Arc<dyn ApprovalHandler>>,
    timeout: Duration,
    max_workers: usize,
    jobs: Option<SyncSender<ApprovalJob>>,
    queue: Arc<Mutex<Receiver<ApprovalJob>>>,
    workers: usize,
    outstanding: Vec<Arc<Asked>>,
}

impl Approvals {
    fn new(
        conn: Arc<Connection>,
        handler: Option<Arc<dyn ApprovalHandler>>,
        config: ClientConfig,
    ) -> Approvals {
        let (tx, rx) = sync_channel(config.approval_queue.max(1));
        Approvals {
            conn,
            handler,
            timeout: config.approval_timeout,
            max_workers: config.approval_workers.max(1),
            jobs: Some(tx),
            queue: Arc::new(Mutex::new(rx)),
            workers: 0,
            outstanding: Vec::new(),
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.outstanding.iter().map(|a| a.deadline).min()
    }

    fn decline_expired(&mut self) {
        let now = Instant::now();
        for a in &self.outstanding {
            if a.deadline <= now {
                a.answer(&self.conn, decline());
            }
        }
        self.outstanding
            .retain(|a| !a.answered.load(Ordering::SeqCst));
    }

    fn route(&mut self, id: Value, params: &Value) {
        let asked = Arc::new(Asked {
            id,
            nonce: params["binding"]["nonce"].clone(),
            deadline: Instant::now() + self.timeout,
            answered: AtomicBool::new(false),
        });
        let (Some(handler), Ok(params)) = (
            self.handler.clone(),
            serde_json::from_value::<ApprovalDecideParams>(params.clone()),
        ) else {
            return asked.answer(&self.conn, decline());
        };
        if self.workers < self.max_workers {
            let (queue, conn) = (Arc::clone(&self.queue), Arc::clone(&self.conn));
            let handler = Arc::clone(&handler);
            let spawned = std::thread::Builder::new()
                .name("cc-client-approval".into())
                .spawn(move || approval_worker(&queue, &conn, &*handler));
            if spawned.is_ok() {
                self.workers += 1;
            }
        }
        let queued = self
            .jobs
            .as_ref()
            .is_some_and(|jobs| jobs.try_send((Arc::clone(&asked), params)).is_ok());
        if self.workers == 0 || !queued {
            // No thread to run the handler, or every one busy and the queue full: fail closed now.
            return asked.answer(&self.conn, decline());
        }
        self.outstanding.push(asked);
    }
}

impl Drop for Approvals {
    fn drop(&mut self) {
        // Workers see the queue close and end (one stuck in a handler ends when it returns).
        self.jobs.take();
        for a in &self.outstanding {
            a.answered.store(true, Ordering::SeqCst);
        }
    }
}

fn approval_worker(
    queue: &Mutex<Receiver<ApprovalJob>>,
    conn: &Connection,
    handler: &dyn ApprovalHandler,
) {
    loop {
        let job = lock(queue).recv();
        let Ok((asked, params)) = job else { return };
        if asked.answered.load(Ordering::SeqCst) || Instant::now() >= asked.deadline {
            continue; // declined while it waited
        }
        let decision =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler.decide(&params)));
        if Instant::now() < asked.deadline {
            match decision {
                Ok(Ok(d)) => asked.answer(conn, d),
                _ => asked.answer(conn, decline()),
            }
        }
    }
}
