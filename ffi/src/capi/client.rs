//! `cc_client`: the core Rust client (`cc_app_server::client::Client`: pending map, timeouts,
//! approval routing, default decline) behind a C handle, with the C approval callback and its
//! `CC_DECISION_*` values.

use super::*;
use crate::client::{parse_params, recv_batch};
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
use std::time::Duration;

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
            ClientError::Protocol { .. } => CC_ERR_PROTOCOL,
            ClientError::InvalidJson { .. } | ClientError::InvalidArgument { .. } => {
                CC_ERR_INVALID_ARGUMENT
            }
        };
        fail(code, e.to_string())
    }
}

/// A connected, initialized client (the one Rust client: pending map, timeouts, approval routing,
/// default decline). Created by `cc_client_connect`, freed (and closed) by `cc_client_free`.
pub struct cc_client {
    client: CoreClient,
    kept_result: OversizedText,
    kept_notification: OversizedText,
    last_error: LastError,
    last_code: Mutex<i64>,
}

impl Handle for cc_client {
    fn last_error(&self) -> &LastError {
        &self.last_error
    }
}

impl Drop for cc_client {
    /// Closes before the approval handler is dropped, so `cc_client_free` returning means the
    /// callback is never called again: as the uniffi `Client::close` does, `close` on the core
    /// client closes its connection and notification inbox and joins its pump thread, which owns
    /// the approval routing and with it the handler.
    fn drop(&mut self) {
        self.client.close();
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
        *out = into_handle(cc_client {
            client: CoreClient::connect(&s.server, handler, config).map_err(ClientError::from)?,
            kept_result: OversizedText::default(),
            kept_notification: OversizedText::default(),
            last_error: LastError::default(),
            last_code: Mutex::new(0),
        });
        Ok(())
    })
}

/// Sends a request and waits for its answer. `params_json` NULL means `{}`. `CC_OK`: `buf` holds
/// the result JSON. `CC_ERR_PROTOCOL`: `buf` holds the error object `{"code","message","data"}`.
/// `CC_ERR_BUFFER_TOO_SMALL`: the answer is kept; fetch it with `cc_client_last_result`.
/// Other codes: see `cc_client_last_error` / `cc_client_last_error_code`.
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
            parse_params(str_arg(params_json, "params_json")?)?
        };
        let (code, text) = match c.client.request(method, params) {
            Ok(result) => (CC_OK, result.to_string()),
            Err(CoreClientError::Protocol {
                code,
                message,
                data,
            }) => {
                *lock(&c.last_code) = code;
                let data = data.unwrap_or(Value::Null);
                let error = json!({"code": code, "message": message, "data": data});
                (CC_ERR_PROTOCOL, error.to_string())
            }
            Err(e) => {
                let e = ClientError::from(e);
                *lock(&c.last_code) = e.code();
                return Err(e.into());
            }
        };
        if code == CC_OK {
            *lock(&c.last_code) = 0;
        }
        c.kept_result.write_or_keep(out, code, text)
    })
}

/// The answer kept by the last `cc_client_request` that returned `CC_ERR_BUFFER_TOO_SMALL`, with
/// the code that answer had (`CC_OK` or `CC_ERR_PROTOCOL`). `CC_ERR_FAILED` when none is kept.
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
/// -32602, -32001 (overloaded), -32010 (timed out).
///
/// # Safety
/// `client` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn cc_client_last_error_code(client: *const cc_client) -> i64 {
    query(handle(client), 0, |c| *lock(&c.last_code))
}

/// Receives the next notification (a whole JSON-RPC message) into `buf`, waiting up to
/// `timeout_ms`. `CC_ERR_TIMEOUT` when none came; `CC_ERR_BUFFER_TOO_SMALL` keeps it for the
/// next call.
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
        let timeout = Duration::from_millis(timeout_ms.into());
        match recv_batch(&c.client, 1, timeout)?.pop() {
            Some(message) => c.kept_notification.write_or_keep(out, CC_OK, message),
            None => Err(fail(CC_ERR_TIMEOUT, "no notification within the timeout")),
        }
    })
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

/// Closes the connection and frees the client; after it returns the approval callback is never
/// called again. NULL is a no-op.
///
/// # Safety
/// `client` NULL or a handle from `cc_client_connect` not yet freed; not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn cc_client_free(client: *mut cc_client) {
    free(client)
}
