//! The one Rust client every host goes through (directly, or via uniffi and the C ABI): it owns
//! the pending-request map, the timeouts, the approval routing and the default decline, so no
//! language re-implements protocol state.

use crate::engine::{AppServer, Connection, RecvError, SendError};
use crate::protocol::{ApprovalDecideParams, ApprovalDecision, Decline};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Decides approval/decide requests for the host. Absent, failing or too slow: the client
/// declines, so the server fails closed.
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
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            request_timeout: Duration::from_secs(120),
            max_pending: 256,
            approval_timeout: Duration::from_secs(30),
            notification_capacity: 4096,
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
            std::thread::Builder::new()
                .name("cc-client-pump".into())
                .spawn(move || pump(&conn, &pending, &tx, handler, config.approval_timeout))
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
    handler: Option<Arc<dyn ApprovalHandler>>,
    approval_timeout: Duration,
) {
    loop {
        let text = match conn.recv(Some(Duration::from_millis(200))) {
            Ok(t) => t,
            Err(RecvError::Timeout) => continue,
            Err(RecvError::Closed) => break,
        };
        let Ok(message) = serde_json::from_str::<Value>(&text) else {
            continue;
        };
        match (message.get("method"), message.get("id")) {
            (Some(_), Some(id)) => answer_approval(
                conn,
                id.clone(),
                &message["params"],
                handler.clone(),
                approval_timeout,
            ),
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

/// Runs the handler off the pump thread with a deadline; anything but a decision in time is a decline.
fn answer_approval(
    conn: &Connection,
    id: Value,
    params: &Value,
    handler: Option<Arc<dyn ApprovalHandler>>,
    timeout: Duration,
) {
    let decline = || ApprovalDecision::Decline(Decline { reason: None });
    let nonce = params["binding"]["nonce"].clone();
    let decision = match (
        handler,
        serde_json::from_value::<ApprovalDecideParams>(params.clone()),
    ) {
        (Some(handler), Ok(params)) => {
            let (tx, rx) = sync_channel(1);
            std::thread::spawn(move || {
                let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(
                    || handler.decide(&params),
                )));
            });
            match rx.recv_timeout(timeout) {
                Ok(Ok(Ok(decision))) => decision,
                _ => decline(),
            }
        }
        _ => decline(),
    };
    let response =
        json!({"jsonrpc": "2.0", "id": id, "result": {"nonce": nonce, "decision": decision}});
    let _ = conn.send(&response.to_string());
}
