//! The one Rust client every host goes through (directly, or via uniffi and the C ABI): it owns
//! the pending-request map, the timeouts, the approval routing and the default decline, so no
//! language re-implements protocol state.

use crate::engine::{AppServer, Connection, RecvError, SendError};
use crate::protocol::error_code;
use crate::protocol::{ApprovalDecision, ApprovalRequest, Decline};
use crate::rollout::sync::lock;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Decides approval/decide requests for the host. Absent, failing or too slow: the client
/// declines, so the server fails closed. Runs on the client's approval threads (at most
/// `ClientConfig::approval_workers`), never on the thread that delivers notifications.
pub trait ApprovalHandler: Send + Sync {
    fn decide(&self, params: &ApprovalRequest) -> Result<ApprovalDecision, String>;
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
            ClientError::Overloaded { .. } => error_code::OVERLOADED,
            ClientError::Timeout => error_code::INTERRUPTED,
            ClientError::Closed => error_code::INTERNAL,
            ClientError::LineTooLarge { .. } => error_code::INVALID_REQUEST,
            ClientError::Protocol { code, .. } => *code,
            ClientError::Decode(_) => error_code::INTERNAL,
        }
    }
}

type Pending = Arc<Mutex<HashMap<u64, SyncSender<Result<Value, ClientError>>>>>;

/// A connected, initialized client.
pub struct Client {
    conn: Arc<Connection>,
    pending: Pending,
    next_id: AtomicU64,
    notifications: Arc<Inbox>,
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
        let conn = Arc::new(server.connect().map_err(|e| match e {
            // `max_connections` are open: the caller may retry once one closes.
            SendError::Overloaded { retry_after_ms } => ClientError::Overloaded { retry_after_ms },
            _ => ClientError::Closed,
        })?);
        let pending: Pending = Arc::default();
        let inbox = Inbox::new(config.notification_capacity);
        let pump = {
            let (conn, pending) = (Arc::clone(&conn), Arc::clone(&pending));
            let inbox = Arc::clone(&inbox);
            let approvals = Approvals::new(Arc::clone(&conn), handler, config);
            std::thread::Builder::new()
                .name("cc-client-pump".into())
                .spawn(move || {
                    pump(&conn, &pending, &inbox, approvals);
                    inbox.close();
                })
                .map_err(|_| ClientError::Closed)?
        };
        let mut client = Client {
            conn,
            pending,
            next_id: AtomicU64::new(1),
            notifications: inbox,
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
        loop {
            let text = self.notifications.recv(timeout)?;
            // The pump checked that it is one JSON object; parsed here, on the host's thread,
            // so the Value is built and dropped by one thread (no cross-thread frees).
            if let Ok(v) = serde_json::from_str(&text) {
                return Ok(v);
            }
        }
    }

    /// The next notification as the server's own JSON text (one object, no newline), for a
    /// host that forwards or parses it itself: no `Value` is built.
    pub fn recv_notification_text(&self, timeout: Duration) -> Result<String, RecvError> {
        self.notifications.recv(timeout)
    }

    /// A reader of this client's notifications that does not keep the client alive: a host's
    /// delivery thread holds it, waits with no timeout, and ends when the client closes (or when
    /// its own stop flag is set and [`NotificationReader::wake`] called).
    pub fn notification_reader(&self) -> NotificationReader {
        NotificationReader {
            inbox: Arc::clone(&self.notifications),
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
        // A pump waiting for room in a full inbox stops too (what is buffered stays readable).
        self.notifications.close();
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

/// See [`Client::notification_reader`]. Notifications are the server's own JSON text.
#[derive(Clone)]
pub struct NotificationReader {
    inbox: Arc<Inbox>,
}

impl NotificationReader {
    /// The next notification, waiting up to `timeout` (`Duration::ZERO`: only one ready now).
    pub fn recv_text(&self, timeout: Duration) -> Result<String, RecvError> {
        self.inbox.recv(timeout)
    }

    /// The next notification, waiting with no timeout until one arrives, the client closes
    /// (`Closed`, once drained), or `stop` is set and `wake` called (`Timeout`).
    pub fn recv_text_until(&self, stop: &AtomicBool) -> Result<String, RecvError> {
        self.inbox.recv_inner(None, Some(stop))
    }

    /// Wakes every thread blocked on this client's notifications.
    pub fn wake(&self) {
        self.inbox.wake();
    }
}

/// The most messages the pump takes off the connection per lock of the host's inbox.
const PUMP_BATCH: usize = 256;

fn pump(conn: &Connection, pending: &Pending, inbox: &Inbox, mut approvals: Approvals) {
    let mut batch: Vec<String> = Vec::with_capacity(PUMP_BATCH);
    'outer: loop {
        // Wake for the next approval deadline too, so a slow handler is declined on time.
        // With no approval outstanding it waits with no timeout: an idle client costs no
        // wake-up (docs/engine.md, "Idle").
        let wait = approvals
            .next_deadline()
            .map(|d| d.saturating_duration_since(Instant::now()));
        let received = conn.recv(wait);
        approvals.decline_expired();
        let mut text = match received {
            Ok(t) => t,
            Err(RecvError::Timeout) => continue,
            Err(RecvError::Closed) => break,
        };
        // What is already queued goes to the host in one hand-over (one lock, one wake-up).
        loop {
            match classify(&text) {
                Kind::Notification => batch.push(text),
                Kind::Other => {
                    // Keep the order the server sent: notifications before this message are
                    // the host's before its answer is.
                    if !inbox.push_all(&mut batch) {
                        break 'outer;
                    }
                    route(&text, pending, &mut approvals);
                }
                Kind::Invalid => {}
            }
            if batch.len() >= PUMP_BATCH {
                break;
            }
            match conn.try_recv() {
                Some(t) => text = t,
                None => break,
            }
        }
        if !inbox.push_all(&mut batch) {
            break;
        }
    }
    lock(pending).clear();
}

enum Kind {
    /// A method and no id.
    Notification,
    /// A response or a server request.
    Other,
    /// Not one JSON object: dropped, as before.
    Invalid,
}

/// Tells a notification from the rest with one validating pass over the text that keeps
/// nothing (no `Value`, no allocation); only responses and server requests are parsed fully.
fn classify(text: &str) -> Kind {
    /// A member that is present, whatever its value (`"id": null` included).
    #[derive(Default)]
    struct Present(bool);
    impl<'de> serde::Deserialize<'de> for Present {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            serde::de::IgnoredAny::deserialize(d).map(|_| Present(true))
        }
    }
    #[derive(serde::Deserialize)]
    struct Head {
        #[serde(default)]
        method: Present,
        #[serde(default)]
        id: Present,
    }
    // A derived struct also reads from an array; only an object is a message.
    if !text.trim_start().starts_with('{') {
        return Kind::Invalid;
    }
    match serde_json::from_str::<Head>(text) {
        Ok(Head {
            method: Present(true),
            id: Present(false),
        }) => Kind::Notification,
        Ok(_) => Kind::Other,
        Err(_) => Kind::Invalid,
    }
}

/// A response to its waiter, a server request to the approval machinery.
fn route(text: &str, pending: &Pending, approvals: &mut Approvals) {
    let Ok(message) = serde_json::from_str::<Value>(text) else {
        return;
    };
    match (message.get("method"), message.get("id")) {
        (Some(_), Some(id)) => approvals.route(id.clone(), &message["params"]),
        (None, Some(id)) => {
            let waiter = id.as_u64().and_then(|id| lock(pending).remove(&id));
            if let Some(tx) = waiter {
                let result = match message.get("error") {
                    Some(e) => Err(ClientError::Protocol {
                        code: e["code"].as_i64().unwrap_or(error_code::INTERNAL),
                        message: e["message"].as_str().unwrap_or_default().to_string(),
                        data: e.get("data").cloned(),
                    }),
                    None => Ok(message["result"].clone()),
                };
                let _ = tx.try_send(result);
            }
        }
        _ => {}
    }
}

/// The notifications waiting for the host: at most `capacity` (when full the pump waits, as
/// the server's outbound queue then does), handed over in batches with one wake-up each.
struct Inbox {
    state: Mutex<InboxState>,
    /// The host waits here for a notification.
    ready: Condvar,
    /// The pump waits here for room.
    space: Condvar,
    capacity: usize,
}

struct InboxState {
    items: VecDeque<String>,
    /// The pump is gone: what is left is drained, then `Closed`.
    closed: bool,
    /// Hosts blocked in `recv`; the pump signals only when one is (no futex call per batch).
    readers_waiting: usize,
    pump_waiting: bool,
}

impl Inbox {
    fn new(capacity: usize) -> Arc<Inbox> {
        Arc::new(Inbox {
            state: Mutex::new(InboxState {
                items: VecDeque::new(),
                closed: false,
                readers_waiting: 0,
                pump_waiting: false,
            }),
            ready: Condvar::new(),
            space: Condvar::new(),
            capacity: capacity.max(1),
        })
    }

    /// Moves every message of `batch` in, in order, waiting for room as needed. `false` once
    /// the inbox is closed (the client is going away).
    fn push_all(&self, batch: &mut Vec<String>) -> bool {
        if batch.is_empty() {
            return true;
        }
        let mut drain = batch.drain(..);
        let mut s = lock(&self.state);
        loop {
            if s.closed {
                return false;
            }
            let room = self.capacity.saturating_sub(s.items.len());
            s.items.extend(drain.by_ref().take(room));
            if s.readers_waiting > 0 {
                self.ready.notify_one();
            }
            if drain.len() == 0 {
                return true;
            }
            s.pump_waiting = true;
            s = self.space.wait(s).unwrap_or_else(|p| p.into_inner());
            s.pump_waiting = false;
        }
    }

    fn recv(&self, timeout: Duration) -> Result<String, RecvError> {
        self.recv_inner(Some(Instant::now() + timeout), None)
    }

    /// The next notification, waiting until `deadline` (`None`: no timeout) or until `stop` is
    /// set and [`Inbox::wake`] called; both end in `Timeout`.
    fn recv_inner(
        &self,
        deadline: Option<Instant>,
        stop: Option<&AtomicBool>,
    ) -> Result<String, RecvError> {
        let mut s = lock(&self.state);
        loop {
            if let Some(item) = s.items.pop_front() {
                if s.pump_waiting {
                    self.space.notify_one();
                }
                return Ok(item);
            }
            if s.closed {
                return Err(RecvError::Closed);
            }
            // Read under the lock, which `wake` takes after the flag is set: no lost signal.
            if stop.is_some_and(|f| f.load(Ordering::SeqCst)) {
                return Err(RecvError::Timeout);
            }
            s.readers_waiting += 1;
            s = match deadline {
                None => self.ready.wait(s).unwrap_or_else(|p| p.into_inner()),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        s.readers_waiting -= 1;
                        return Err(RecvError::Timeout);
                    }
                    self.ready
                        .wait_timeout(s, d - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
            };
            s.readers_waiting -= 1;
        }
    }

    /// Wakes every blocked reader, so one whose stop flag was just set returns.
    fn wake(&self) {
        drop(lock(&self.state));
        self.ready.notify_all();
    }

    fn close(&self) {
        lock(&self.state).closed = true;
        self.ready.notify_all();
        self.space.notify_all();
    }
}

/// One approval/decide request on its way to an answer: whoever flips `answered` first (the
/// handler thread with a decision, the pump at the deadline with a decline) sends it.
struct Asked {
    id: Value,
    deadline: Instant,
    answered: AtomicBool,
}

impl Asked {
    fn answer(&self, conn: &Connection, decision: ApprovalDecision) {
        if self.answered.swap(true, Ordering::SeqCst) {
            return;
        }
        // The answer is the bare published decision: the server holds the binding against the
        // request id.
        let response = json!({"jsonrpc": "2.0", "id": self.id, "result": decision});
        let _ = conn.send(&response.to_string());
    }
}

/// A decline that says why the client declined (the server records it and the tool result
/// carries it), never a bare "declined".
fn decline(why: &str) -> ApprovalDecision {
    ApprovalDecision::Decline(Decline {
        reason: Some(why.to_string()),
    })
}

const NO_HANDLER: &str = "no approval handler is configured on this client";
const NO_ROOM: &str = "the client's approval handlers are all busy and its queue is full";
const TOO_SLOW: &str = "the approval handler did not answer in time";

type ApprovalJob = (Arc<Asked>, ApprovalRequest);

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

    /// The deadline of the next approval still unanswered (one the handler answered is not
    /// waited for, so an idle pump has none).
    fn next_deadline(&self) -> Option<Instant> {
        self.outstanding
            .iter()
            .filter(|a| !a.answered.load(Ordering::SeqCst))
            .map(|a| a.deadline)
            .min()
    }

    fn decline_expired(&mut self) {
        let now = Instant::now();
        for a in &self.outstanding {
            if a.deadline <= now {
                a.answer(&self.conn, decline(TOO_SLOW));
            }
        }
        self.outstanding
            .retain(|a| !a.answered.load(Ordering::SeqCst));
    }

    fn route(&mut self, id: Value, params: &Value) {
        let asked = Arc::new(Asked {
            id,
            deadline: Instant::now() + self.timeout,
            answered: AtomicBool::new(false),
        });
        let Some(handler) = self.handler.clone() else {
            return asked.answer(&self.conn, decline(NO_HANDLER));
        };
        let Ok(params) = serde_json::from_value::<ApprovalRequest>(params.clone()) else {
            return asked.answer(
                &self.conn,
                decline("the approval request does not match the published ApprovalRequest"),
            );
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
            return asked.answer(&self.conn, decline(NO_ROOM));
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

/// A handler's error text as a decline reason: at most 1,900 characters (the published reason
/// holds 2,048).
fn cap_reason(text: &str) -> String {
    text.chars().take(1900).collect()
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
                Ok(Err(e)) => asked.answer(
                    conn,
                    decline(&format!("the approval handler failed: {}", cap_reason(&e))),
                ),
                Err(_) => asked.answer(conn, decline("the approval handler panicked")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::ServerConfig;
    use crate::rollout::Durability;

    #[test]
    fn classify_tells_notifications_from_the_rest() {
        assert!(matches!(
            classify(r#"{"jsonrpc":"2.0","method":"item/delta","params":{"a":[1,{"b":null}]}}"#),
            Kind::Notification
        ));
        assert!(matches!(
            classify(r#"{"jsonrpc":"2.0","id":3,"result":{}}"#),
            Kind::Other
        ));
        // A request, even with a null id, is not a notification.
        assert!(matches!(
            classify(r#"{"jsonrpc":"2.0","method":"approval/decide","id":null,"params":{}}"#),
            Kind::Other
        ));
        assert!(matches!(
            classify(r#"{"jsonrpc":"2.0","method":"x"} trailing"#),
            Kind::Invalid
        ));
        assert!(matches!(classify("[1,2]"), Kind::Invalid));
        assert!(matches!(classify(r#" ["x"]"#), Kind::Invalid));
        assert!(matches!(classify(r#"{"method":"x""#), Kind::Invalid));
    }

    #[test]
    fn the_inbox_holds_exactly_its_capacity_and_the_pump_waits_for_room() {
        let inbox = Inbox::new(3);
        let pusher = {
            let inbox = Arc::clone(&inbox);
            std::thread::spawn(move || {
                let mut batch: Vec<String> = (0..5).map(|i| i.to_string()).collect();
                inbox.push_all(&mut batch)
            })
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !lock(&inbox.state).pump_waiting {
            assert!(Instant::now() < deadline, "the pump never waited for room");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(lock(&inbox.state).items.len(), 3, "capacity, not one more");
        let got: Vec<String> = (0..5)
            .map(|_| inbox.recv(Duration::from_secs(10)).unwrap())
            .collect();
        assert_eq!(got, ["0", "1", "2", "3", "4"], "in order");
        assert!(pusher.join().unwrap());
        assert_eq!(
            inbox.recv(Duration::from_millis(10)),
            Err(RecvError::Timeout)
        );
        inbox.close();
        assert_eq!(inbox.recv(Duration::ZERO), Err(RecvError::Closed));
        assert!(!inbox.push_all(&mut vec!["late".into()]), "closed refuses");
    }

    /// A turn's notifications to a host that does not read fill the inbox to its capacity; the
    /// host then gets every one in order, as the server's own text or parsed; and `close`
    /// returns although the pump was waiting for room.
    #[test]
    fn notifications_keep_their_order_and_text_and_close_never_hangs_on_a_full_inbox() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = ServerConfig::new(dir.path());
        config.store_options.durability = Durability::Ephemeral;
        let server = AppServer::open(config).unwrap();
        let client = Client::connect(
            &server,
            None,
            ClientConfig {
                notification_capacity: 8,
                ..ClientConfig::default()
            },
        )
        .unwrap();
        let deltas = 200;
        let script =
            json!({"steps": [{"type": "message", "text": "y".repeat(deltas), "chunks": deltas}]});
        client
            .request(
                "thread/start",
                json!({"threadId": "c", "agentOptions": {"script": script}}),
            )
            .unwrap();
        client
            .request(
                "turn/start",
                json!({"threadId": "c", "input": [{"type": "text", "text": "go"}]}),
            )
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while lock(&client.notifications.state).items.len() < 8 {
            assert!(Instant::now() < deadline, "the inbox never filled");
            std::thread::sleep(Duration::from_millis(2));
        }
        let (mut last_seq, mut text, mut seen) = (0, String::new(), 0);
        loop {
            // Alternate the two ways of taking a notification.
            let n: Value = if seen % 2 == 0 {
                let raw = client
                    .recv_notification_text(Duration::from_secs(20))
                    .unwrap();
                assert!(raw.starts_with('{') && !raw.contains('\n'), "{raw}");
                serde_json::from_str(&raw).unwrap()
            } else {
                client.recv_notification(Duration::from_secs(20)).unwrap()
            };
            seen += 1;
            if let Some(seq) = n["params"]["eventSeq"].as_u64() {
                assert!(seq > last_seq, "in seq order: {seq} after {last_seq}");
                last_seq = seq;
            }
            if n["method"] == "item/delta" {
                text.push_str(n["params"]["delta"]["text"].as_str().unwrap());
            }
            if n["method"] == "turn/completed" {
                break;
            }
        }
        assert_eq!(text, "y".repeat(deltas));
        // A second turn fills the inbox again; close must not wait for the host to read.
        client
            .request(
                "turn/start",
                json!({"threadId": "c", "input": [{"type": "text", "text": "again"}]}),
            )
            .unwrap();
        while lock(&client.notifications.state).items.len() < 8 {
            assert!(Instant::now() < deadline, "the inbox never filled again");
            std::thread::sleep(Duration::from_millis(2));
        }
        let (tx, rx) = sync_channel(1);
        std::thread::spawn(move || {
            client.close();
            let _ = tx.send(client.recv_notification(Duration::ZERO).is_ok());
        });
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(20)),
            Ok(true),
            "close returned, what was buffered is still readable"
        );
        server.shutdown();
    }
}
