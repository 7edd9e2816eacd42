//! `cc_client`: the core Rust client (`cc_app_server::client::Client`: pending map, timeouts,
//! approval routing, default decline) behind a C handle, with the C approval callback and its
//! `CC_DECISION_*` values.

use super::hub::{Hub, Next, Who};
use super::*;
use crate::client::parse_params;
use crate::errors::ClientError;
use cc_app_server::client::{
    ApprovalHandler as CoreHandler, Client as CoreClient, ClientConfig,
    ClientError as CoreClientError,
};
use cc_app_server::protocol::{
    AcceptForSession, AcceptForTurn, AcceptOnce, ApprovalDecision, ApprovalRequest, Cancel, Decline,
};
use serde_json::{json, Map, Value};
use std::ffi::c_void;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Approval callback results: run this call once.
pub const CC_DECISION_ACCEPT_ONCE: i32 = 1;
/// Run it, and the same operation again for the rest of this turn.
pub const CC_DECISION_ACCEPT_FOR_TURN: i32 = 2;
/// Run it, and the same operation again on this connection while policy and workspace hold.
pub const CC_DECISION_ACCEPT_FOR_SESSION: i32 = 3;
/// Do not run it (also what any unknown value means).
pub const CC_DECISION_DECLINE: i32 = 0;
/// Do not run it and interrupt the turn.
pub const CC_DECISION_CANCEL: i32 = 4;

/// Decides one `approval/decide` request. `params_json` is the request's params (binding,
/// operation, reason), borrowed for the call. Returns a `CC_DECISION_*` value; anything else
/// declines. Called on a thread the client owns, never concurrently for one client.
pub type cc_approval_fn =
    Option<unsafe extern "C" fn(user_data: *mut c_void, params_json: *const c_char) -> i32>;

impl From<ClientError> for Failure {
    fn from(e: ClientError) -> Self {
        let code = match e {
            ClientError::Overloaded { .. } => CC_ERR_OVERLOADED,
            ClientError::Timeout => CC_ERR_TIMEOUT,
            ClientError::Closed => CC_ERR_CLOSED,
            ClientError::LineTooLarge { .. } => CC_ERR_LINE_TOO_LARGE,
            ClientError::Protocol { code, .. } => server_code(code),
            ClientError::InvalidJson { .. } | ClientError::InvalidArgument { .. } => {
                CC_ERR_INVALID_ARGUMENT
            }
        };
        fail(code, e.to_string())
    }
}

/// The `cc_result` for a server's JSON-RPC error `code` (docs/ffi.md, "Errors"): the protocol's
/// error classes get their own code; any other code stays `CC_ERR_PROTOCOL`.
pub(super) fn server_code(code: i64) -> cc_result {
    use cc_app_server::protocol::error_code as wire;
    match code {
        wire::NOT_FOUND => CC_ERR_NOT_FOUND,
        wire::CONFLICT => CC_ERR_CONFLICT,
        wire::INVALID_PARAMS => CC_ERR_INVALID_PARAMS,
        wire::OVERLOADED => CC_ERR_OVERLOADED,
        wire::INTERRUPTED => CC_ERR_TIMEOUT,
        _ => CC_ERR_PROTOCOL,
    }
}

/// What the last request on a client ended in.
#[derive(Default)]
struct LastAnswer {
    /// The JSON-RPC code (0 after a success).
    code: i64,
    /// The retry-after of an overloaded answer (0 otherwise).
    retry_after_ms: i64,
    /// The last successful result's JSON text, for the JSON-pointer accessors.
    result: Option<String>,
}

/// A request that did not succeed: the code, and the text (the server's error object as JSON
/// for a server error, else the reason).
pub(super) struct Refused {
    pub(super) code: cc_result,
    pub(super) text: String,
    /// The text is the server's `{"code","message","data"}` object.
    pub(super) server: bool,
}

/// What a client handle shares with its turn handles and its callback thread.
pub(super) struct ClientInner {
    pub(super) client: CoreClient,
    pub(super) hub: Hub,
}

/// The running notification callback: its registration and thread.
struct CallbackThread {
    thread: std::thread::JoinHandle<()>,
}

/// A connected, initialized client (the one Rust client: pending map, timeouts, approval routing,
/// default decline). Created by `cc_client_connect`, freed (and closed) by `cc_client_free`.
pub struct cc_client {
    pub(super) inner: Arc<ClientInner>,
    kept_result: OversizedText,
    kept_notification: OversizedText,
    pub(super) last_error: LastError,
    last: Mutex<LastAnswer>,
    callback: Mutex<Option<CallbackThread>>,
}

impl Handle for cc_client {
    fn last_error(&self) -> &LastError {
        &self.last_error
    }
}

impl cc_client {
    /// Sends a request and records its outcome (code, retry-after, result) on the handle.
    /// The result comes as its value and its JSON text (serialised once; the text is also kept).
    pub(super) fn call(&self, method: &str, params: Value) -> Result<(Value, String), Refused> {
        let answer = self.inner.client.request(method, params);
        let mut last = lock(&self.last);
        match answer {
            Ok(result) => {
                let text = result.to_string();
                *last = LastAnswer {
                    code: 0,
                    retry_after_ms: 0,
                    result: Some(text.clone()),
                };
                Ok((result, text))
            }
            Err(CoreClientError::Protocol {
                code,
                message,
                data,
            }) => {
                let data = data.unwrap_or(Value::Null);
                last.code = code;
                last.retry_after_ms = if code == cc_app_server::protocol::error_code::OVERLOADED {
                    data.get("retry_after_ms")
                        .and_then(Value::as_i64)
                        .unwrap_or(0)
                } else {
                    0
                };
                let error = json!({"code": code, "message": message, "data": data});
                Err(Refused {
                    code: server_code(code),
                    text: error.to_string(),
                    server: true,
                })
            }
            Err(e) => {
                let e = ClientError::from(e);
                last.code = e.code();
                last.retry_after_ms = match e {
                    ClientError::Overloaded { retry_after_ms } => retry_after_ms,
                    _ => 0,
                };
                let Failure(code, text) = e.into();
                Err(Refused {
                    code,
                    text,
                    server: false,
                })
            }
        }
    }

    /// Records that a request was refused before it was sent (its params).
    pub(super) fn refused_params(&self) {
        let mut last = lock(&self.last);
        last.code = cc_app_server::protocol::error_code::INVALID_PARAMS;
        last.retry_after_ms = 0;
    }

    /// Stops the callback's thread and waits for it, unless called on that thread (then it
    /// stops after the call in progress returns, and is joined later).
    fn stop_callback(&self) {
        self.inner.hub.stop_callback();
        let running = lock(&self.callback).take();
        if let Some(cb) = running {
            if cb.thread.thread().id() == std::thread::current().id() {
                // Inside the callback: it returns to a loop that sees the stop at once.
                drop(cb.thread);
            } else {
                let _ = cb.thread.join();
            }
        }
    }
}

impl Drop for cc_client {
    /// Stops the notification callback, then closes before the approval handler is dropped, so
    /// `cc_client_free` returning means no callback is called again: as the uniffi
    /// `Client::close` does, `close` on the core client closes its connection and notification
    /// inbox and joins its pump thread, which owns the approval routing and with it the handler.
    fn drop(&mut self) {
        self.stop_callback();
        self.inner.client.close();
    }
}

struct CApproval {
    decide: unsafe extern "C" fn(*mut c_void, *const c_char) -> i32,
    user_data: *mut c_void,
}

// SAFETY: the caller of `cc_client_connect` promises `user_data` may be used from the client's
// thread until `cc_client_free` returns (documented there).
unsafe impl Send for CApproval {}
unsafe impl Sync for CApproval {}

impl CoreHandler for CApproval {
    fn decide(&self, params: &ApprovalRequest) -> Result<ApprovalDecision, String> {
        let text = serde_json::to_string(params).map_err(|e| e.to_string())?;
        let text = std::ffi::CString::new(text).map_err(|e| e.to_string())?;
        // SAFETY: see the Send/Sync note; the string lives across the call.
        let decision = unsafe { (self.decide)(self.user_data, text.as_ptr()) };
        Ok(match decision {
            CC_DECISION_ACCEPT_ONCE => ApprovalDecision::AcceptOnce(AcceptOnce {}),
            CC_DECISION_ACCEPT_FOR_TURN => {
                ApprovalDecision::AcceptForTurn(AcceptForTurn { permissions: None })
            }
            CC_DECISION_ACCEPT_FOR_SESSION => {
                ApprovalDecision::AcceptForSession(AcceptForSession { permissions: None })
            }
            CC_DECISION_CANCEL => ApprovalDecision::Cancel(Cancel { reason: None }),
            _ => ApprovalDecision::Decline(Decline { reason: None }),
        })
    }
}

/// Connects and performs the `initialize` handshake. `approve` (NULL: decline every approval)
/// is called with `user_data`, which is borrowed: it must stay valid, and usable from another
/// thread, until `cc_client_free` returns. `request_timeout_ms` 0 means the default (120 s).
/// `*out_client` owns the new handle.
///
/// # Safety
/// `server` valid; `out_client` valid; `approve` NULL or a function safe to call as documented.
#[no_mangle]
pub unsafe extern "C" fn cc_client_connect(
    server: *const cc_server,
    approve: cc_approval_fn,
    user_data: *mut c_void,
    request_timeout_ms: u32,
    out_client: *mut *mut cc_client,
) -> cc_result {
    on_handle(handle(server), |s| {
        let out = out_arg(out_client, "out_client")?;
        let handler =
            approve.map(|decide| Arc::new(CApproval { decide, user_data }) as Arc<dyn CoreHandler>);
        let mut config = ClientConfig::default();
        if request_timeout_ms > 0 {
            config.request_timeout = Duration::from_millis(request_timeout_ms.into());
        }
        let client = CoreClient::connect(&s.server, handler, config).map_err(ClientError::from)?;
        *out = into_handle(cc_client {
            inner: Arc::new(ClientInner {
                client,
                hub: Hub::default(),
            }),
            kept_result: OversizedText::default(),
            kept_notification: OversizedText::default(),
            last_error: LastError::default(),
            last: Mutex::new(LastAnswer::default()),
            callback: Mutex::new(None),
        });
        Ok(())
    })
}

/// Sends a request and waits for its answer. `params_json` NULL means `{}`. `CC_OK`: `buf` holds
/// the result JSON (also kept for `cc_client_last_result_string`). A server error: `buf` holds
/// the error object `{"code","message","data"}` and the code says its class: `CC_ERR_NOT_FOUND`
/// (-32004), `CC_ERR_CONFLICT` (-32009), `CC_ERR_INVALID_PARAMS` (-32602), `CC_ERR_OVERLOADED`
/// (-32001; see `cc_client_last_retry_after_ms`), `CC_ERR_TIMEOUT` (-32010), `CC_ERR_PROTOCOL`
/// (any other code). `CC_ERR_INVALID_PARAMS` also when `params_json` is not JSON (nothing was
/// sent). `CC_ERR_BUFFER_TOO_SMALL`: the answer is kept; fetch it with `cc_client_last_result`.
/// Other codes (no answer from the server: `CC_ERR_TIMEOUT`, `CC_ERR_OVERLOADED` locally,
/// `CC_ERR_CLOSED`, `CC_ERR_LINE_TOO_LARGE`): see `cc_client_last_error`. In every case
/// `cc_client_last_error_code` gives the JSON-RPC code.
///
/// # Safety
/// `client` valid; `method` a valid C string; `params_json` NULL or a valid C string;
/// `buf` NULL or valid for `len`; `out_needed` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn cc_client_request(
    client: *const cc_client,
    method: *const c_char,
    params_json: *const c_char,
    buf: *mut c_char,
    len: usize,
    out_needed: *mut usize,
) -> cc_result {
    let out = TextOut::new(buf, len, out_needed);
    on_handle(handle(client), |c| {
        let method = str_arg(method, "method")?;
        let params = if params_json.is_null() {
            Value::Object(Map::new())
        } else {
            parse_params(str_arg(params_json, "params_json")?).map_err(|e| {
                c.refused_params();
                fail(CC_ERR_INVALID_PARAMS, e.to_string())
            })?
        };
        let (code, text) = match c.call(method, params) {
            Ok((_, text)) => (CC_OK, text),
            Err(Refused {
                code,
                text,
                server: true,
            }) => (code, text),
            Err(Refused { code, text, .. }) => return Err(fail(code, text)),
        };
        c.kept_result.write_or_keep(out, code, text)
    })
}

/// The answer kept by the last `cc_client_request` that returned `CC_ERR_BUFFER_TOO_SMALL`, with
/// the code that answer had (`CC_OK` or the server error's code). `CC_ERR_FAILED` when none is
/// kept.
///
/// # Safety
/// `client` valid; `buf` NULL or valid for `len`; `out_needed` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn cc_client_last_result(
    client: *const cc_client,
    buf: *mut c_char,
    len: usize,
    out_needed: *mut usize,
) -> cc_result {
    on_handle(handle(client), |c| {
        c.kept_result
            .hand_out(TextOut::new(buf, len, out_needed), "result")
    })
}

/// The JSON-RPC code of the last failed request on this client (0 after a success): e.g.
/// -32004 (not found), -32602 (invalid params), -32001 (overloaded), -32010 (timed out).
///
/// # Safety
/// `client` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn cc_client_last_error_code(client: *const cc_client) -> i64 {
    query(handle(client), 0, |c| lock(&c.last).code)
}

/// How long to wait before retrying, in milliseconds, after the last request on this client
/// ended in `CC_ERR_OVERLOADED` (the server's `data.retry_after_ms`, or the client's own when
/// too many requests were in flight or the server's queue was full); 0 after any other outcome.
///
/// # Safety
/// `client` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn cc_client_last_retry_after_ms(client: *const cc_client) -> i64 {
    query(handle(client), 0, |c| lock(&c.last).retry_after_ms)
}

/// One field of the last successful `cc_client_request` result, by JSON pointer (RFC 6901, e.g.
/// "/thread/id", "/turn/status", "/data/0/id"; "" is the whole result), as `cc_json_get_string`
/// gives it: a string's own text, any other value as JSON. `CC_ERR_NOT_FOUND` when the result
/// has no such field (or it is null), `CC_ERR_FAILED` when no request has succeeded yet.
///
/// # Safety
/// `client` valid; `pointer` a valid C string; `buf` NULL or valid for `len`; `out_needed` NULL
/// or valid.
#[no_mangle]
pub unsafe extern "C" fn cc_client_last_result_string(
    client: *const cc_client,
    pointer: *const c_char,
    buf: *mut c_char,
    len: usize,
    out_needed: *mut usize,
) -> cc_result {
    on_handle(handle(client), |c| {
        let pointer = str_arg(pointer, "pointer")?;
        let result = lock(&c.last).result.clone();
        let Some(result) = result else {
            return Err(fail(
                CC_ERR_FAILED,
                "no request has succeeded on this client",
            ));
        };
        json_field_into(&result, pointer, TextOut::new(buf, len, out_needed))
    })
}

/// One integer field of the last successful `cc_client_request` result, by JSON pointer (e.g.
/// "/thread/revision"). `CC_ERR_NOT_FOUND` when absent or null, `CC_ERR_INVALID_ARGUMENT` when
/// it is not an integer, `CC_ERR_FAILED` when no request has succeeded yet.
///
/// # Safety
/// `client` valid; `pointer` a valid C string; `out_value` valid.
#[no_mangle]
pub unsafe extern "C" fn cc_client_last_result_int(
    client: *const cc_client,
    pointer: *const c_char,
    out_value: *mut i64,
) -> cc_result {
    on_handle(handle(client), |c| {
        let pointer = str_arg(pointer, "pointer")?;
        let out = out_arg(out_value, "out_value")?;
        let result = lock(&c.last).result.clone();
        let Some(result) = result else {
            return Err(fail(
                CC_ERR_FAILED,
                "no request has succeeded on this client",
            ));
        };
        *out = json_int(&result, pointer)?;
        Ok(())
    })
}

/// Receives the next notification (a whole JSON-RPC message) into `buf`, waiting up to
/// `timeout_ms` (`CC_WAIT_FOREVER`, i.e. -1 converted to `uint32_t`: until one arrives or the
/// client closes). `CC_ERR_TIMEOUT` when none came; `CC_ERR_CLOSED` once the client is closed and
/// every earlier notification was taken; `CC_ERR_BUFFER_TOO_SMALL` keeps it for the next call.
/// Notifications of a turn started with `cc_client_turn_start` go to that turn's handle, not
/// here. `CC_ERR_INVALID_ARGUMENT` while a notification callback is set (the callback receives
/// them instead).
///
/// # Safety
/// `client` valid; `buf` NULL or valid for `len`; `out_needed` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn cc_client_next_notification(
    client: *const cc_client,
    timeout_ms: u32,
    buf: *mut c_char,
    len: usize,
    out_needed: *mut usize,
) -> cc_result {
    let out = TextOut::new(buf, len, out_needed);
    on_handle(handle(client), |c| {
        if c.kept_notification.take_into(out)? {
            return Ok(());
        }
        if c.inner.hub.callback_set() {
            return Err(fail(
                CC_ERR_INVALID_ARGUMENT,
                "a notification callback is set: notifications go to it, not to polls",
            ));
        }
        match c
            .inner
            .hub
            .next(&c.inner.client, Who::Poll, deadline(timeout_ms))
        {
            Next::Message(message) => c.kept_notification.write_or_keep(out, CC_OK, message),
            Next::Timeout => Err(fail(CC_ERR_TIMEOUT, "no notification within the timeout")),
            _ => Err(fail(CC_ERR_CLOSED, ClientError::Closed.to_string())),
        }
    })
}

/// The deadline of a `timeout_ms` argument (`None` for `CC_WAIT_FOREVER`).
pub(super) fn deadline(timeout_ms: u32) -> Option<Instant> {
    (timeout_ms != CC_WAIT_FOREVER)
        .then(|| Instant::now() + Duration::from_millis(timeout_ms.into()))
}

/// Receives the client's notifications, one whole JSON-RPC message per call (`message_json`,
/// NUL-terminated, borrowed for the call), or `message_json` NULL once when the client has closed
/// and everything before was delivered (no call follows that one).
pub type cc_notification_fn =
    Option<unsafe extern "C" fn(user_data: *mut c_void, message_json: *const c_char)>;

struct CNotify {
    f: unsafe extern "C" fn(*mut c_void, *const c_char),
    user_data: *mut c_void,
}

// SAFETY: the caller of `cc_client_set_notification_callback` promises `user_data` may be used
// from the library's thread until the callback is unregistered (documented there).
unsafe impl Send for CNotify {}

/// Sets (or with `callback` NULL, removes) the client's notification callback. It is called on
/// one library thread per client, in order, never concurrently nor re-entrantly, with every
/// notification that would otherwise go to `cc_client_next_notification` (those already waiting
/// there first); notifications of a live `cc_client_turn` still go to that handle. While it is
/// set, `cc_client_next_notification` returns `CC_ERR_INVALID_ARGUMENT`. Removing or replacing
/// it waits for a call in progress (up to ~0.1 s for the library thread to notice), and once
/// this returns the old callback is never called again and notifications queue for polling
/// again; called from inside the callback, it takes effect when that call returns.
/// `cc_client_free` removes it the same way (do not free the client from inside the callback).
/// `user_data` is borrowed until then and must be usable from the library's thread.
///
/// # Safety
/// `client` valid; `callback` NULL or a function safe to call as documented, with `user_data`.
#[no_mangle]
pub unsafe extern "C" fn cc_client_set_notification_callback(
    client: *const cc_client,
    callback: cc_notification_fn,
    user_data: *mut c_void,
) -> cc_result {
    on_handle(handle(client), |c| {
        c.stop_callback();
        let Some(f) = callback else { return Ok(()) };
        let notify = CNotify { f, user_data };
        let generation = c.inner.hub.start_callback();
        let inner = Arc::clone(&c.inner);
        let thread = std::thread::Builder::new()
            .name("cc-c-notifications".into())
            .spawn(move || deliver(&inner, generation, notify))
            .map_err(|e| {
                c.inner.hub.stop_callback();
                fail(
                    CC_ERR_FAILED,
                    format!("cannot start the callback thread: {e}"),
                )
            })?;
        *lock(&c.callback) = Some(CallbackThread { thread });
        Ok(())
    })
}

/// The callback thread: delivers until unregistered or closed.
fn deliver(inner: &ClientInner, generation: u64, notify: CNotify) {
    let who = Who::Callback { generation };
    loop {
        // Untimed: unregistering interrupts the wait, closing ends it.
        match inner.hub.next(&inner.client, who, None) {
            Next::Message(text) => {
                let Ok(text) = std::ffi::CString::new(text) else {
                    continue;
                };
                // SAFETY: see `CNotify`; the string lives across the call. A panic cannot come
                // out of a C function, and none is raised here.
                unsafe { (notify.f)(notify.user_data, text.as_ptr()) };
            }
            Next::Timeout => {}
            Next::Closed => {
                // SAFETY: as above; NULL says the client closed.
                unsafe { (notify.f)(notify.user_data, std::ptr::null()) };
                return;
            }
            Next::Stopped | Next::Ended => return,
        }
    }
}

/// The client's last error text.
///
/// # Safety
/// `client` NULL or valid; `buf` NULL or valid for `len`; `out_needed` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn cc_client_last_error(
    client: *const cc_client,
    buf: *mut c_char,
    len: usize,
    out_needed: *mut usize,
) -> cc_result {
    last_error_into(client.as_ref(), TextOut::new(buf, len, out_needed))
}

/// Closes the connection and frees the client; after it returns neither the approval callback
/// nor the notification callback is called again. Turn handles made from it stay valid handles
/// (to free) and report `CC_ERR_CLOSED`. NULL is a no-op.
///
/// # Safety
/// `client` NULL or a handle from `cc_client_connect` not yet freed; not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn cc_client_free(client: *mut cc_client) {
    free(client)
}
