//! `Client`: the uniffi face of the one Rust client (`cc_app_server::client::Client`), which owns
//! the pending-request map, timeouts, approval routing and the default decline — nothing here
//! re-implements protocol state. Adds what foreign languages need: an async request that does not
//! block the caller's event loop, a foreign approval handler, and a notification listener.

use crate::approval::{ApprovalDecision, ApprovalRequest};
use crate::delivery::{listener_failed, MAX_BATCH};
use crate::errors::{signed, ClientError, HandlerError, ListenerError};
use crate::server::AppServer;
use crate::task::TaskHandle;
use cc_app_server::client::{
    ApprovalHandler as CoreHandler, Client as CoreClient, ClientConfig, NotificationReader,
};
use cc_app_server::protocol::{ApprovalDecision as WireDecision, ApprovalRequest as WireRequest};
use serde_json::Value;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// Decides `approval/decide` requests. Throwing, or taking longer than the client's approval
/// timeout, declines; with no handler at all the client declines every request.
#[uniffi::export(with_foreign)]
pub trait ApprovalHandler: Send + Sync {
    fn decide(&self, request: ApprovalRequest) -> Result<ApprovalDecision, HandlerError>;
}

/// Receives server notifications on a delivery thread (see `Client.listen`).
#[uniffi::export(with_foreign)]
pub trait NotificationListener: Send + Sync {
    /// The next notifications, in order: each a whole JSON-RPC notification message (decode it
    /// with the generated protocol types). Up to `MAX_BATCH` at a time, so a fast stream costs one
    /// foreign call per batch, not per message. An error (or exception) is logged and counted;
    /// delivery goes on with the next batch.
    fn on_notifications(&self, messages: Vec<String>) -> Result<(), ListenerError>;
    /// The client closed (by `close`, a server shutdown, or a connection the server dropped):
    /// no more notifications follow. Not called when the handle is cancelled.
    fn on_closed(&self) -> Result<(), ListenerError>;
}

/// Client-side bounds; absent fields keep the defaults of docs/engine.md ("Default bounds").
#[derive(Debug, Clone, Default, uniffi::Record)]
pub struct ClientOptions {
    /// A request unanswered this long fails with `Timeout` (default 120 s).
    #[uniffi(default = None)]
    pub request_timeout_ms: Option<i64>,
    /// Requests in flight at once; one more fails with `Overloaded` (default 256).
    #[uniffi(default = None)]
    pub max_pending: Option<i32>,
    /// How long the approval handler may take before the client declines (default 30 s).
    #[uniffi(default = None)]
    pub approval_timeout_ms: Option<i64>,
    /// Notifications buffered for the host (default 4096).
    #[uniffi(default = None)]
    pub notification_capacity: Option<i32>,
}

/// `v` as a duration in milliseconds; negative is refused.
pub(crate) fn millis(name: &str, v: i64) -> Result<Duration, ClientError> {
    u64::try_from(v)
        .map(Duration::from_millis)
        .map_err(|_| ClientError::InvalidArgument {
            reason: format!("{name} must not be negative (got {v})"),
        })
}

/// `v` as a count of at least 1; zero or negative is refused.
fn positive(name: &str, v: i32) -> Result<usize, ClientError> {
    usize::try_from(v)
        .ok()
        .filter(|n| *n >= 1)
        .ok_or_else(|| ClientError::InvalidArgument {
            reason: format!("{name} must be at least 1 (got {v})"),
        })
}

impl ClientOptions {
    pub(crate) fn to_config(&self) -> Result<ClientConfig, ClientError> {
        let mut c = ClientConfig::default();
        if let Some(ms) = self.request_timeout_ms {
            c.request_timeout = millis("request_timeout_ms", ms)?;
        }
        if let Some(n) = self.max_pending {
            c.max_pending = positive("max_pending", n)?;
        }
        if let Some(ms) = self.approval_timeout_ms {
            c.approval_timeout = millis("approval_timeout_ms", ms)?;
        }
        if let Some(n) = self.notification_capacity {
            c.notification_capacity = positive("notification_capacity", n)?;
        }
        Ok(c)
    }
}

/// A foreign `ApprovalHandler` as the core client's handler.
struct ForeignHandler(Arc<dyn ApprovalHandler>);

impl CoreHandler for ForeignHandler {
    fn decide(&self, params: &WireRequest) -> Result<WireDecision, String> {
        self.0
            .decide(ApprovalRequest::from_wire(params))
            .map(WireDecision::from)
            .map_err(|e| {
                // The client declines; the host learns why through its log listener.
                tracing::warn!(
                    target: "cc_app_server::approval",
                    "approval handler failed, declining {}: {e}",
                    params.binding.item_id
                );
                e.to_string()
            })
    }
}

/// A connected, initialized client.
#[derive(uniffi::Object)]
pub struct Client {
    /// `None` after `close`. Requests clone the `Arc` and run without the lock, so they proceed
    /// concurrently; the core client closes when the last clone goes.
    inner: RwLock<Option<Arc<CoreClient>>>,
    initialize_result: String,
    /// The JVM's JNI notification pump waits with no timeout; this is its stop flag (one pump
    /// at a time: the SDK joins the old pump before it arms a new one).
    #[cfg(feature = "jni")]
    pub(crate) jni_pump_stop: AtomicBool,
}

impl Client {
    pub(crate) fn current(&self) -> Result<Arc<CoreClient>, ClientError> {
        self.inner
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or(ClientError::Closed)
    }

    pub(crate) fn request_value(&self, method: &str, params: Value) -> Result<Value, ClientError> {
        Ok(self.current()?.request(method, params)?)
    }
}

impl Client {
    fn next_batch(&self, max: usize, timeout: Duration) -> Result<Vec<String>, ClientError> {
        // A closed handle may still hold notifications that arrived before the close.
        match self.current() {
            Ok(client) => recv_batch(&client, max, timeout),
            Err(e) => Err(e),
        }
    }
}

/// Waits up to `timeout` for one notification, then takes up to `max - 1` more that are ready.
/// Empty on timeout; `Closed` once the client's connection is gone and drained.
pub(crate) fn recv_batch(
    client: &CoreClient,
    max: usize,
    timeout: Duration,
) -> Result<Vec<String>, ClientError> {
    use cc_app_server::engine::RecvError as CoreRecv;
    let mut batch = Vec::new();
    // The server's own text: no parse and re-serialise per notification.
    match client.recv_notification_text(timeout) {
        Ok(first) => batch.push(first),
        Err(CoreRecv::Timeout) => return Ok(batch),
        Err(CoreRecv::Closed) => return Err(ClientError::Closed),
    }
    while batch.len() < max {
        match client.recv_notification_text(Duration::ZERO) {
            Ok(next) => batch.push(next),
            Err(_) => break,
        }
    }
    Ok(batch)
}

/// Up to `max` notifications: waits (untimed) for the first until one arrives, the client
/// closes (`Closed`) or `stop` is set (an empty batch), then takes what is ready.
pub(crate) fn reader_batch(
    reader: &NotificationReader,
    max: usize,
    stop: &AtomicBool,
) -> Result<Vec<String>, ClientError> {
    use cc_app_server::engine::RecvError as CoreRecv;
    let mut batch = Vec::new();
    match reader.recv_text_until(stop) {
        Ok(first) => batch.push(first),
        Err(CoreRecv::Timeout) => return Ok(batch),
        Err(CoreRecv::Closed) => return Err(ClientError::Closed),
    }
    while batch.len() < max {
        match reader.recv_text(Duration::ZERO) {
            Ok(next) => batch.push(next),
            Err(_) => break,
        }
    }
    Ok(batch)
}

/// `recv_batch` written straight into one newline-separated text.
fn recv_text(client: &CoreClient, max: usize, timeout: Duration) -> Result<String, ClientError> {
    use cc_app_server::engine::RecvError as CoreRecv;
    use std::fmt::Write as _;
    let mut text = String::new();
    match client.recv_notification_text(timeout) {
        Ok(first) => {
            let _ = write!(text, "{first}");
        }
        Err(CoreRecv::Timeout) => return Ok(text),
        Err(CoreRecv::Closed) => return Err(ClientError::Closed),
    }
    for _ in 1..max {
        match client.recv_notification_text(Duration::ZERO) {
            Ok(next) => {
                let _ = write!(text, "\n{next}");
            }
            Err(_) => break,
        }
    }
    Ok(text)
}

pub(crate) fn parse_params(params_json: &str) -> Result<Value, ClientError> {
    if params_json.trim().is_empty() {
        return Ok(Value::Object(Default::default()));
    }
    serde_json::from_str(params_json).map_err(|e| ClientError::InvalidJson {
        reason: format!("params: {e}"),
    })
}

#[uniffi::export]
impl Client {
    /// Connects to `server` and performs the `initialize` handshake (every v1 feature the engine
    /// implements). `handler` decides approvals; without one every approval is declined.
    #[uniffi::constructor(default(handler = None, options = None))]
    pub fn connect(
        server: Arc<AppServer>,
        handler: Option<Arc<dyn ApprovalHandler>>,
        options: Option<ClientOptions>,
    ) -> Result<Arc<Client>, ClientError> {
        let handler = handler.map(|h| Arc::new(ForeignHandler(h)) as Arc<dyn CoreHandler>);
        let config = options.unwrap_or_default().to_config()?;
        let core = CoreClient::connect(&server.inner, handler, config)?;
        Ok(Arc::new(Client {
            initialize_result: core.initialize_result.to_string(),
            inner: RwLock::new(Some(Arc::new(core))),
            #[cfg(feature = "jni")]
            jni_pump_stop: AtomicBool::new(false),
        }))
    }

    /// The server's `initialize` result as JSON text.
    pub fn initialize_result(&self) -> String {
        self.initialize_result.clone()
    }

    /// Sends a request (`params_json`: a JSON object, or empty for `{}`) and resolves to its
    /// result as JSON text. Runs on its own thread, so awaiting never blocks the caller's event
    /// loop. Cancelling the awaiting task does not cancel the request (uniffi does not propagate
    /// cancellation): it still completes, within the request timeout, and its result is dropped.
    pub async fn request(
        &self,
        method: String,
        params_json: String,
    ) -> Result<String, ClientError> {
        let client = self.current()?;
        let params = parse_params(&params_json)?;
        let (future, completer) = oneshot();
        std::thread::Builder::new()
            .name("cc-ffi-request".into())
            .spawn(move || {
                completer.complete(client.request(&method, params).map_err(ClientError::from))
            })
            .map_err(|_| ClientError::Closed)?;
        future.await.map(|v| v.to_string())
    }

    /// `request` without the async machinery: blocks the calling thread until the answer.
    pub fn request_blocking(
        &self,
        method: String,
        params_json: String,
    ) -> Result<String, ClientError> {
        let params = parse_params(&params_json)?;
        self.request_value(&method, params).map(|v| v.to_string())
    }

    /// The next notification as a whole JSON-RPC message, waiting up to `timeout_ms`; absent when
    /// none arrived in time. `Closed` once the client is closed (by `close`, a server shutdown or
    /// a dropped connection) and every notification before that has been taken — so a closed
    /// client never looks like an idle one. Do not mix with `listen`: each notification goes to
    /// exactly one of them.
    pub fn next_notification(&self, timeout_ms: i64) -> Result<Option<String>, ClientError> {
        let timeout = millis("timeout_ms", timeout_ms)?;
        Ok(self.next_batch(1, timeout)?.pop())
    }

    /// Up to `max` notifications: waits up to `timeout_ms` for the first, then takes what is
    /// already there without waiting. Empty when none arrived in time; `Closed` as for
    /// `next_notification`.
    pub fn next_notifications(
        &self,
        max: i32,
        timeout_ms: i64,
    ) -> Result<Vec<String>, ClientError> {
        let max = positive("max", max)?;
        let timeout = millis("timeout_ms", timeout_ms)?;
        self.next_batch(max, timeout)
    }

    /// `next_notifications` as one text: up to `max` whole messages, one per line (a serialised
    /// JSON message never contains a raw newline). A host splits it at native speed instead of
    /// lifting a list element by element, which is most of the per-notification cost in Python.
    /// Empty when none arrived in time; `Closed` as for `next_notification`.
    pub fn next_notifications_text(
        &self,
        max: i32,
        timeout_ms: i64,
    ) -> Result<String, ClientError> {
        let max = positive("max", max)?;
        let timeout = millis("timeout_ms", timeout_ms)?;
        recv_text(&*self.current()?, max, timeout)
    }

    /// Requests now waiting for an answer.
    pub fn pending_requests(&self) -> i64 {
        self.current().map_or(0, |c| signed(c.pending_requests()))
    }

    /// True once the client is closed: by `close`, by a server shutdown, or because the server
    /// dropped the connection (a host that stopped reading).
    pub fn is_closed(&self) -> bool {
        self.current().map_or(true, |c| c.is_closed())
    }

    /// Delivers every notification to `listener` on a background thread until the returned handle
    /// is cancelled or dropped, or the client is closed.
    pub fn listen(
        &self,
        listener: Arc<dyn NotificationListener>,
    ) -> Result<Arc<TaskHandle>, ClientError> {
        // Only the client's inbox: a listener must not keep a closed client alive. It waits with
        // no timeout; closing the client closes the inbox, cancelling wakes it.
        let reader = self.current()?.notification_reader();
        let waker = reader.clone();
        TaskHandle::spawn(
            "cc-ffi-notifications",
            move || waker.wake(),
            move |cancelled| {
                while !cancelled.load(Ordering::SeqCst) {
                    match reader_batch(&reader, MAX_BATCH, cancelled) {
                        Ok(batch) if batch.is_empty() => {}
                        // Delivered even when `cancel` came while waiting: these messages are already
                        // taken from the client, and dropping them would lose them for the next reader.
                        // `cancel` waits for this last call; the loop ends right after it.
                        Ok(batch) => {
                            if let Err(e) = listener.on_notifications(batch) {
                                listener_failed("notification", &e);
                            }
                        }
                        // The connection is gone (closed, or the server shut down): nothing more
                        // will arrive.
                        Err(_) => {
                            if !cancelled.load(Ordering::SeqCst) {
                                if let Err(e) = listener.on_closed() {
                                    listener_failed("notification", &e);
                                }
                            }
                            break;
                        }
                    }
                }
            },
        )
        .map_err(|_| ClientError::Closed)
    }

    /// Closes the client and its connection now: no new requests start and requests still in
    /// flight end with `Closed`. Idempotent.
    pub fn close(&self) {
        let taken = self.inner.write().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(core) = taken {
            core.close();
        }
    }
}

/// The sending half of a one-shot future. Dropping it without completing resolves the future
/// with `Closed`, so a panicking worker never leaves an awaiting host hanging.
struct Completer<T> {
    slot: Arc<Mutex<Slot<T>>>,
    done: bool,
}

struct Slot<T> {
    value: Option<Result<T, ClientError>>,
    waker: Option<Waker>,
}

struct Oneshot<T> {
    slot: Arc<Mutex<Slot<T>>>,
}

fn oneshot<T>() -> (Oneshot<T>, Completer<T>) {
    let slot = Arc::new(Mutex::new(Slot {
        value: None,
        waker: None,
    }));
    (
        Oneshot {
            slot: Arc::clone(&slot),
        },
        Completer { slot, done: false },
    )
}

impl<T> Completer<T> {
    fn complete(mut self, value: Result<T, ClientError>) {
        self.fill(value);
    }

    fn fill(&mut self, value: Result<T, ClientError>) {
        self.done = true;
        let waker = {
            let mut slot = self.slot.lock().unwrap_or_else(|p| p.into_inner());
            slot.value = Some(value);
            slot.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl<T> Drop for Completer<T> {
    fn drop(&mut self) {
        if !self.done {
            self.fill(Err(ClientError::Closed));
        }
    }
}

impl<T> Future for Oneshot<T> {
    type Output = Result<T, ClientError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut slot = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        match slot.value.take() {
            Some(v) => Poll::Ready(v),
            None => {
                slot.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}
