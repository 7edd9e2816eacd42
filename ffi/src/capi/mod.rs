//! The stable C ABI, in the style of rustls-ffi: opaque handles, `cc_result` codes, out-params,
//! caller-owned buffers that report the size they need, last-error text per handle, and a panic
//! boundary (`catch_unwind`) at every entry point. `ffi/include/cc_app_server.h` is generated
//! from this file by cbindgen (see build.rs) and checked in.
//!
//! Conventions every function follows (repeated in the header's preamble):
//! - Strings in are NUL-terminated UTF-8, borrowed for the duration of the call.
//! - Text out goes into a caller buffer `(buf, len)`; `*out_needed` (if not NULL) is set to the
//!   bytes the text needs *including* its NUL. A NULL or short buffer returns
//!   `CC_ERR_BUFFER_TOO_SMALL`; where the text came from a one-shot operation (a received
//!   message, a request's result, a tool result) it is kept on the handle and handed out by the
//!   next receive / `*_last_result` call, so nothing is lost.
//! - Every `cc_X_free` accepts NULL. Handles are freed by their owner exactly once; the order of
//!   frees does not matter (a freed server shuts down; handles made from it then report
//!   `CC_ERR_CLOSED`).
//! - Handles may be used from any thread; per-handle "last" state (error text, kept text) is
//!   shared by all threads using that handle.

#![allow(non_camel_case_types)]

use crate::client::Client;
use crate::errors::{ClientError, KernelError};
use crate::kernel::{turn_input, Lease, TurnContext};
use crate::server::{Durability, ServerOptions};
use crate::store::StoreKind;
use crate::ApprovalPolicy;
use cc_app_server::client::{ApprovalHandler as CoreHandler, ClientConfig};
use cc_app_server::engine::{
    AppServer as CoreServer, Connection as CoreConnection, RecvError, SendError,
};
use cc_app_server::kernel::{
    AgentKernel as CoreKernel, KernelError as CoreKernelError, TurnContext as CoreContext,
};
use cc_app_server::protocol::{
    AcceptForSession, AcceptForTurn, AcceptOnce, ApprovalDecision, ApprovalRequest, Cancel,
    Decline, UserInput,
};
use serde_json::{json, Map, Value};
use std::ffi::{c_char, c_void, CStr};
use std::ops::Deref;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What every entry point returns.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum cc_result {
    CC_OK = 0,
    /// A required pointer argument was NULL.
    CC_ERR_NULL_ARGUMENT = 1,
    /// An argument was not valid (bad UTF-8, bad JSON, unknown config key, …); see last error.
    CC_ERR_INVALID_ARGUMENT = 2,
    /// The caller's buffer is NULL or shorter than `*out_needed`; the text is kept (see above).
    CC_ERR_BUFFER_TOO_SMALL = 3,
    /// A bounded queue is full; retry after the reported number of milliseconds.
    CC_ERR_OVERLOADED = 4,
    /// A message exceeds the configured line limit; it was not queued.
    CC_ERR_LINE_TOO_LARGE = 5,
    /// The connection, client or server is closed.
    CC_ERR_CLOSED = 6,
    /// Nothing arrived in time (receive), or no answer within the request timeout (-32010).
    CC_ERR_TIMEOUT = 7,
    /// The server answered with a JSON-RPC error; the buffer holds `{"code","message","data"}`.
    CC_ERR_PROTOCOL = 8,
    /// The rollout store refused (I/O, corruption, lock, not found); see last error.
    CC_ERR_STORE = 9,
    /// The turn was cancelled; a kernel should return this from `run_turn`.
    CC_ERR_CANCELLED = 10,
    /// A `cc_turn` was used outside its `run_turn` call.
    CC_ERR_EXPIRED = 11,
    /// Rust panicked inside the call; the panic was caught and the handle may be unusable.
    CC_ERR_PANIC = 12,
    /// Anything else (a kernel or callback failure); see last error.
    CC_ERR_FAILED = 13,
}

use cc_app_server::rollout::sync::lock;
use cc_result::*;

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

/// Runs one turn. `turn` is valid only until this function returns. `input_json` is the wire
/// `UserInput` array, borrowed for the call. Return `CC_OK`, `CC_ERR_CANCELLED` once
/// `cc_turn_is_cancelled` says so, or any other code for a failure (the reason given to
/// `cc_turn_fail`, if any, is shown to the user). May be called concurrently for different turns.
pub type cc_kernel_run_turn_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        turn: *mut cc_turn,
        input_json: *const c_char,
    ) -> i32,
>;

/// Releases a kernel's `user_data`; called once, after the last turn has ended.
pub type cc_release_fn = Option<unsafe extern "C" fn(user_data: *mut c_void)>;

/// A host kernel: the server copies this struct and owns `user_data` from a successful
/// `cc_server_open` on (releasing it with `release`, if not NULL). On failure the caller keeps it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct cc_kernel {
    pub run_turn: cc_kernel_run_turn_fn,
    pub user_data: *mut c_void,
    pub release: cc_release_fn,
}

// ---------------------------------------------------------------------------------------------
// The entry-point pattern (docs/ffi.md, "Entry-point pattern"). Every `extern "C"` function below
// is one call to `on` (a call on a handle), `guarded` (no handle), `query` (a plain value back,
// not a `cc_result`) or `free`, with its own logic as a closure returning `Outcome`
// (`cc_server_open`, with no handle to keep a last error on, calls `catch` and fills
// `error_buf`). Those and `catch` are the only places that catch panics, record last errors and
// turn failures into codes; the argument helpers (`handle`, `turn_state`, `str_arg`, `out_arg`,
// `put`, `TextOut`, `OversizedText`) are the only places that read or write a caller's pointers.

/// A failure: the code returned and the text kept as the handle's last error.
struct Failure(cc_result, String);

type Outcome<T = ()> = Result<T, Failure>;

fn fail(code: cc_result, text: impl Into<String>) -> Failure {
    Failure(code, text.into())
}

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

impl From<KernelError> for Failure {
    fn from(e: KernelError) -> Self {
        let code = match e {
            KernelError::Cancelled => CC_ERR_CANCELLED,
            KernelError::Failed { .. } => CC_ERR_FAILED,
            KernelError::Invalid { .. } => CC_ERR_INVALID_ARGUMENT,
            KernelError::Expired => CC_ERR_EXPIRED,
        };
        fail(code, e.to_string())
    }
}

/// Last error text, kept per handle.
#[derive(Default)]
struct LastError(Mutex<String>);

impl LastError {
    fn set(&self, text: String) {
        *lock(&self.0) = text;
    }
    fn get(&self) -> String {
        lock(&self.0).clone()
    }
}

/// What a handle argument stands for while a call runs: where that call's failure text goes.
trait Handle {
    fn last_error(&self) -> &LastError;
}

/// The panic boundary, the one `catch_unwind` of the C ABI: a panic in `body` becomes a
/// `CC_ERR_PANIC` failure that carries the panic's message, so the host can report it.
fn catch<T>(body: impl FnOnce() -> Outcome<T>) -> Outcome<T> {
    catch_unwind(AssertUnwindSafe(|| {
        #[cfg(test)]
        tests::panic_point(tests::PanicAt::Entry);
        body()
    }))
    .unwrap_or_else(|payload| {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".into());
        Err(fail(
            CC_ERR_PANIC,
            format!("internal panic caught at the C boundary: {message}"),
        ))
    })
}

/// An entry point without a handle: `body` behind the panic boundary, a failure's text recorded
/// in `last` (if any), the outcome as a code.
fn guarded(last: Option<&LastError>, body: impl FnOnce() -> Outcome) -> cc_result {
    match catch(body) {
        Ok(()) => CC_OK,
        Err(Failure(code, text)) => {
            if let Some(last) = last {
                last.set(text);
            }
            code
        }
    }
}

/// An entry point on a handle: `live` is the looked-up handle (`handle` or `turn_state`); a
/// missing one is its code with no text (there is no handle to keep it on), otherwise `body`
/// runs behind the panic boundary and a failure's text becomes that handle's last error.
fn on_handle<H: Handle + ?Sized>(
    live: Result<impl Deref<Target = H>, cc_result>,
    body: impl FnOnce(&H) -> Outcome,
) -> cc_result {
    match live {
        Ok(h) => guarded(Some(h.last_error()), || body(&h)),
        Err(code) => code,
    }
}

/// An entry point that answers with a value, not a code: `missing` for a missing handle or a
/// panic (whose text is still kept as the handle's last error).
fn query<H: Handle + ?Sized, T>(
    live: Result<impl Deref<Target = H>, cc_result>,
    missing: T,
    body: impl FnOnce(&H) -> T,
) -> T {
    let Ok(h) = live else { return missing };
    match catch(|| Ok(body(&h))) {
        Ok(value) => value,
        Err(Failure(_, text)) => {
            h.last_error().set(text);
            missing
        }
    }
}

/// An owned handle argument: `CC_ERR_NULL_ARGUMENT` for NULL.
///
/// # Safety
/// `p` NULL or valid for the (caller-chosen) lifetime `'a`, as each entry point documents.
unsafe fn handle<'a, T>(p: *const T) -> Result<&'a T, cc_result> {
    p.as_ref().ok_or(CC_ERR_NULL_ARGUMENT)
}

/// Frees a handle made by `into_handle`: NULL is a no-op, and a panic in its `Drop` stays here
/// (there is no handle left to report it on).
unsafe fn free<T>(p: *mut T) {
    if !p.is_null() {
        let _ = catch(|| {
            drop(Box::from_raw(p));
            Ok(())
        });
    }
}

/// Gives a new handle to the host.
fn into_handle<T>(value: T) -> *mut T {
    Box::into_raw(Box::new(value))
}

/// Borrows a C string argument.
unsafe fn str_arg<'a>(p: *const c_char, name: &str) -> Outcome<&'a str> {
    if p.is_null() {
        return Err(fail(CC_ERR_NULL_ARGUMENT, format!("{name} is NULL")));
    }
    CStr::from_ptr(p)
        .to_str()
        .map_err(|_| fail(CC_ERR_INVALID_ARGUMENT, format!("{name} is not UTF-8")))
}

/// A required out-parameter.
unsafe fn out_arg<'a, T>(p: *mut T, name: &str) -> Outcome<&'a mut T> {
    p.as_mut()
        .ok_or_else(|| fail(CC_ERR_NULL_ARGUMENT, format!("{name} is NULL")))
}

/// Sets an optional out-parameter (NULL: the caller does not want it).
unsafe fn put<T>(p: *mut T, value: T) {
    if !p.is_null() {
        *p = value;
    }
}

/// A caller's text buffer: `(buf, len)` and `out_needed`, as every text-out entry point takes them.
#[derive(Clone, Copy)]
struct TextOut {
    buf: *mut c_char,
    len: usize,
    needed: *mut usize,
}

impl TextOut {
    fn new(buf: *mut c_char, len: usize, needed: *mut usize) -> Self {
        TextOut { buf, len, needed }
    }

    /// Writes `text` + NUL, reporting the size it needs.
    ///
    /// # Safety
    /// `buf` NULL or valid for `len` bytes; `needed` NULL or valid.
    unsafe fn write(self, text: &str) -> Outcome {
        let needed = text.len() + 1;
        put(self.needed, needed);
        if self.buf.is_null() || self.len < needed {
            return Err(fail(
                CC_ERR_BUFFER_TOO_SMALL,
                format!(
                    "the text needs {needed} bytes including its NUL; the buffer has {}",
                    self.len
                ),
            ));
        }
        #[cfg(test)]
        tests::panic_point(tests::PanicAt::TextOut);
        std::ptr::copy_nonoverlapping(text.as_ptr(), self.buf.cast::<u8>(), text.len());
        *self.buf.add(text.len()) = 0;
        Ok(())
    }
}

/// Text from a one-shot operation that did not fit the caller's buffer, with the code it came
/// with, kept on the handle until a call hands it out.
#[derive(Default)]
struct OversizedText(Mutex<Option<(cc_result, String)>>);

impl OversizedText {
    /// Writes `text` (answering `code`); if it does not fit, keeps both.
    unsafe fn write_or_keep(&self, out: TextOut, code: cc_result, text: String) -> Outcome {
        match out.write(&text) {
            Ok(()) if code == CC_OK => Ok(()),
            Ok(()) => Err(fail(code, text)),
            Err(too_small) => {
                *lock(&self.0) = Some((code, text));
                Err(too_small)
            }
        }
    }

    /// Hands out kept text: its original code once it fits, `CC_ERR_BUFFER_TOO_SMALL` (still
    /// kept) while it does not, `Ok(false)` when nothing is kept.
    unsafe fn take_into(&self, out: TextOut) -> Outcome<bool> {
        let mut slot = lock(&self.0);
        let Some((_, text)) = slot.as_ref() else {
            return Ok(false);
        };
        out.write(text)?;
        let (code, text) = slot.take().unwrap_or((CC_OK, String::new()));
        if code == CC_OK {
            Ok(true)
        } else {
            Err(fail(code, text))
        }
    }

    /// What a `*_last_result` call does: the kept text, or `CC_ERR_FAILED` naming `what` when
    /// nothing is kept.
    unsafe fn hand_out(&self, out: TextOut, what: &str) -> Outcome {
        if self.take_into(out)? {
            Ok(())
        } else {
            Err(fail(CC_ERR_FAILED, format!("no {what} is kept")))
        }
    }
}

/// What a `*_last_error` call does (empty text for no handle). It does not record its own
/// failure (a short buffer) as the last error, so the text stays there to fetch with a larger
/// buffer.
unsafe fn last_error_into<H: Handle + ?Sized>(h: Option<&H>, out: TextOut) -> cc_result {
    guarded(None, || {
        out.write(&h.map(|h| h.last_error().get()).unwrap_or_default())
    })
}

/// Copies as much of `text` as fits into `(buf, len)`, NUL-terminated: the one-shot error buffer
/// of `cc_server_open`, which has no handle to keep the text on.
unsafe fn write_truncated(buf: *mut c_char, len: usize, text: &str) {
    if !buf.is_null() && len > 0 {
        let n = text.len().min(len - 1);
        std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
        *buf.add(n) = 0;
    }
}

// ---------------------------------------------------------------------------------------------
// Library information

/// A static, NUL-terminated name for `result` (e.g. "CC_ERR_CLOSED"; "CC_UNKNOWN_RESULT" for a
/// value that is no `cc_result`). Never free it.
#[no_mangle]
pub extern "C" fn cc_result_name(result: i32) -> *const c_char {
    // An int, not the enum: a C caller may pass any value, and an out-of-range enum is UB in Rust.
    const CODES: [cc_result; 14] = [
        CC_OK,
        CC_ERR_NULL_ARGUMENT,
        CC_ERR_INVALID_ARGUMENT,
        CC_ERR_BUFFER_TOO_SMALL,
        CC_ERR_OVERLOADED,
        CC_ERR_LINE_TOO_LARGE,
        CC_ERR_CLOSED,
        CC_ERR_TIMEOUT,
        CC_ERR_PROTOCOL,
        CC_ERR_STORE,
        CC_ERR_CANCELLED,
        CC_ERR_EXPIRED,
        CC_ERR_PANIC,
        CC_ERR_FAILED,
    ];
    let Some(&result) = CODES.iter().find(|c| **c as i32 == result) else {
        return c"CC_UNKNOWN_RESULT".as_ptr();
    };
    let name: &'static [u8] = match result {
        CC_OK => b"CC_OK\0",
        CC_ERR_NULL_ARGUMENT => b"CC_ERR_NULL_ARGUMENT\0",
        CC_ERR_INVALID_ARGUMENT => b"CC_ERR_INVALID_ARGUMENT\0",
        CC_ERR_BUFFER_TOO_SMALL => b"CC_ERR_BUFFER_TOO_SMALL\0",
        CC_ERR_OVERLOADED => b"CC_ERR_OVERLOADED\0",
        CC_ERR_LINE_TOO_LARGE => b"CC_ERR_LINE_TOO_LARGE\0",
        CC_ERR_CLOSED => b"CC_ERR_CLOSED\0",
        CC_ERR_TIMEOUT => b"CC_ERR_TIMEOUT\0",
        CC_ERR_PROTOCOL => b"CC_ERR_PROTOCOL\0",
        CC_ERR_STORE => b"CC_ERR_STORE\0",
        CC_ERR_CANCELLED => b"CC_ERR_CANCELLED\0",
        CC_ERR_EXPIRED => b"CC_ERR_EXPIRED\0",
        CC_ERR_PANIC => b"CC_ERR_PANIC\0",
        CC_ERR_FAILED => b"CC_ERR_FAILED\0",
    };
    name.as_ptr().cast()
}

/// The wire protocol version this library speaks (highest).
#[no_mangle]
pub extern "C" fn cc_protocol_version() -> u32 {
    cc_agent_protocol::PROTOCOL_VERSION
}

/// This library's version as a static NUL-terminated string. Never free it.
#[no_mangle]
pub extern "C" fn cc_library_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// Writes the schema digest (`sha256:` + 64 hex) into `buf`.
///
/// # Safety
/// `buf` must be valid for `len` bytes (or NULL); `out_needed` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn cc_schema_digest(
    buf: *mut c_char,
    len: usize,
    out_needed: *mut usize,
) -> cc_result {
    guarded(None, || {
        TextOut::new(buf, len, out_needed).write(cc_agent_protocol::schema_digest())
    })
}

// ---------------------------------------------------------------------------------------------
// Server

/// An open app server. Created by `cc_server_open`, freed by `cc_server_free` (which shuts it
/// down). Connections and clients made from it stay valid handles after that, reporting closed.
pub struct cc_server {
    server: CoreServer,
    last_error: LastError,
}

impl Drop for cc_server {
    fn drop(&mut self) {
        self.server.shutdown();
    }
}

impl Handle for cc_server {
    fn last_error(&self) -> &LastError {
        &self.last_error
    }
}

fn options_from_json(text: &str) -> Outcome<ServerOptions> {
    let bad = |t: String| fail(CC_ERR_INVALID_ARGUMENT, t);
    let value: Value =
        serde_json::from_str(text).map_err(|e| bad(format!("config is not JSON: {e}")))?;
    let Value::Object(map) = value else {
        return Err(bad("config must be a JSON object".into()));
    };
    let mut o = ServerOptions::default();
    for (key, v) in &map {
        let string = || {
            v.as_str()
                .map(str::to_string)
                .ok_or_else(|| bad(format!("config.{key} must be a string")))
        };
        let number = || {
            v.as_u64()
                .and_then(|n| i64::try_from(n).ok())
                .ok_or_else(|| bad(format!("config.{key} must be a non-negative integer")))
        };
        let small = || {
            number().and_then(|n| {
                i32::try_from(n).map_err(|_| bad(format!("config.{key} is too large")))
            })
        };
        match key.as_str() {
            "stateDir" => o.state_dir = string()?,
            "store" => {
                o.store = Some(match string()?.as_str() {
                    "jsonl" => StoreKind::Jsonl,
                    "sqlite" => StoreKind::Sqlite,
                    other => {
                        return Err(bad(format!("config.store {other:?}: use jsonl or sqlite")))
                    }
                })
            }
            "durability" => {
                o.durability = Some(match string()?.as_str() {
                    "sync" => Durability::Sync,
                    "buffered" => Durability::Buffered,
                    "ephemeral" => Durability::Ephemeral,
                    other => {
                        return Err(bad(format!(
                            "config.durability {other:?}: use sync, buffered or ephemeral"
                        )))
                    }
                })
            }
            "policy" => {
                o.policy = Some(match string()?.as_str() {
                    "askEveryTime" => ApprovalPolicy::AskEveryTime,
                    "autoApprove" => ApprovalPolicy::AutoApprove,
                    "denyAll" => ApprovalPolicy::DenyAll,
                    other => {
                        return Err(bad(format!(
                            "config.policy {other:?}: use askEveryTime, autoApprove or denyAll"
                        )))
                    }
                })
            }
            "workspace" => o.workspace = Some(string()?),
            "script" => o.script_json = Some(v.to_string()),
            "approvalTimeoutMs" => o.approval_timeout_ms = Some(number()?),
            "settleDeadlineMs" => o.settle_deadline_ms = Some(number()?),
            "maxLineBytes" => o.max_line_bytes = Some(number()?),
            "inboundMessages" => o.inbound_messages = Some(small()?),
            "outboundMessages" => o.outbound_messages = Some(small()?),
            "workspaceToolsDir" => o.workspace_tools_dir = Some(string()?),
            "outboundStallMs" => o.outbound_stall_ms = Some(number()?),
            "rolloutKeyHex" => {
                let text = string()?;
                let bytes = hex::decode(text.trim()).map_err(|_| {
                    bad("config.rolloutKeyHex must be 64 hex digits (32 bytes)".into())
                })?;
                o.rollout_key = Some(bytes);
            }
            "acceptUnanchored" => {
                o.accept_unanchored =
                    Some(v.as_bool().ok_or_else(|| {
                        bad("config.acceptUnanchored must be true or false".into())
                    })?)
            }
            "openai" => o.openai = Some(openai_from_json(v)?),
            other => return Err(bad(format!("unknown config key {other:?}"))),
        }
    }
    Ok(o)
}

/// The `openai` config object: `baseUrl` and `model` (required), `apiKey`, `instructions`,
/// `temperature`, `maxOutputTokens`, `maxSteps`, `requestTimeoutMs`, `idleTimeoutMs`,
/// `callDeadlineMs`, `allowInsecureHttp`.
fn openai_from_json(v: &Value) -> Outcome<crate::server::OpenAiOptions> {
    let bad = |t: String| fail(CC_ERR_INVALID_ARGUMENT, t);
    let Value::Object(map) = v else {
        return Err(bad("config.openai must be a JSON object".into()));
    };
    let mut o = crate::server::OpenAiOptions::default();
    for (key, v) in map {
        let string = || {
            v.as_str()
                .map(str::to_string)
                .ok_or_else(|| bad(format!("config.openai.{key} must be a string")))
        };
        let int = || {
            v.as_i64()
                .ok_or_else(|| bad(format!("config.openai.{key} must be an integer")))
        };
        match key.as_str() {
            "baseUrl" => o.base_url = string()?,
            "model" => o.model = string()?,
            "apiKey" => o.api_key = Some(string()?),
            "instructions" => o.instructions = Some(string()?),
            "temperature" => {
                o.temperature =
                    Some(v.as_f64().ok_or_else(|| {
                        bad("config.openai.temperature must be a number".to_string())
                    })?)
            }
            "maxOutputTokens" => {
                o.max_output_tokens = Some(
                    i32::try_from(int()?)
                        .map_err(|_| bad("config.openai.maxOutputTokens is too large".into()))?,
                )
            }
            "maxSteps" => {
                o.max_steps = Some(
                    i32::try_from(int()?)
                        .map_err(|_| bad("config.openai.maxSteps is too large".into()))?,
                )
            }
            "requestTimeoutMs" => o.request_timeout_ms = Some(int()?),
            "idleTimeoutMs" => o.idle_timeout_ms = Some(int()?),
            "callDeadlineMs" => o.call_deadline_ms = Some(int()?),
            "allowInsecureHttp" => {
                o.allow_insecure_http = Some(v.as_bool().ok_or_else(|| {
                    bad("config.openai.allowInsecureHttp must be true or false".to_string())
                })?)
            }
            other => return Err(bad(format!("unknown config key openai.{other:?}"))),
        }
    }
    Ok(o)
}

/// Opens a server from a JSON config (keys: `stateDir` (required), `store` ("jsonl"|"sqlite"),
/// `durability` ("sync"|"buffered"|"ephemeral"), `policy` ("askEveryTime"|"autoApprove"|
/// "denyAll"), `workspace`, `script` (a scripted-kernel script object), `approvalTimeoutMs`,
/// `settleDeadlineMs`, `maxLineBytes`, `inboundMessages`, `outboundMessages`, `openai` (an object:
/// `baseUrl`, `model`, `apiKey`, `instructions`, `temperature`, `maxOutputTokens`, `maxSteps`,
/// `requestTimeoutMs`, `idleTimeoutMs`, `callDeadlineMs`, `allowInsecureHttp` — turns run on that
/// model), `workspaceToolsDir` (approved tools run with the
/// workspace tool set confined to that directory), `outboundStallMs`, `rolloutKeyHex` (64 hex
/// digits: keyed tamper evidence, never written anywhere), `acceptUnanchored` (true/false)). `kernel` (NULL:
/// the built-in scripted kernel) is copied. On success `*out_server` owns a new handle; free it
/// with `cc_server_free`. On failure the reason goes into `error_buf` (NULL allowed; truncated).
///
/// # Safety
/// `config_json` a valid C string; `kernel` NULL or valid; `out_server` valid;
/// `error_buf` NULL or valid for `error_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn cc_server_open(
    config_json: *const c_char,
    kernel: *const cc_kernel,
    out_server: *mut *mut cc_server,
    error_buf: *mut c_char,
    error_len: usize,
) -> cc_result {
    // No handle yet: the failure's text goes into `error_buf` instead of a last error.
    let opened = catch(|| {
        let out = out_arg(out_server, "out_server")?;
        let options = options_from_json(str_arg(config_json, "config_json")?)?;
        let kernel = match kernel.as_ref() {
            None => None,
            Some(k) if k.run_turn.is_none() => {
                return Err(fail(CC_ERR_NULL_ARGUMENT, "kernel->run_turn is NULL"))
            }
            Some(k) => Some(*k),
        };
        let mut config = options
            .to_config(None, None)
            .map_err(|e| fail(CC_ERR_INVALID_ARGUMENT, e.to_string()))?;
        // Ownership of user_data passes to the server only once open succeeds: until the
        // kernel is armed, dropping it (a failed open) does not release user_data.
        let host_kernel = kernel.map(|kernel| {
            Arc::new(CKernel {
                kernel,
                armed: AtomicBool::new(false),
            })
        });
        if let Some(k) = &host_kernel {
            config.kernel = Arc::clone(k) as Arc<dyn CoreKernel>;
        }
        let core = crate::server::AppServer::open_core(config).map_err(|e| {
            let code = match e {
                crate::errors::ServerError::Store { .. } => CC_ERR_STORE,
                _ => CC_ERR_INVALID_ARGUMENT,
            };
            fail(code, e.to_string())
        })?;
        if let Some(k) = host_kernel {
            k.armed.store(true, Ordering::SeqCst);
        }
        *out = into_handle(cc_server {
            server: core,
            last_error: LastError::default(),
        });
        Ok(())
    });
    let Err(Failure(code, reason)) = opened else {
        return CC_OK;
    };
    write_truncated(error_buf, error_len, &reason);
    code
}

/// Shuts the server down (interrupting live turns, closing connections, flushing the store)
/// and frees the handle. NULL is a no-op.
///
/// # Safety
/// `server` NULL or a handle from `cc_server_open` not yet freed; not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn cc_server_free(server: *mut cc_server) {
    free(server)
}

/// The server's last error text.
///
/// # Safety
/// `server` NULL or valid; `buf` NULL or valid for `len`; `out_needed` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn cc_server_last_error(
    server: *const cc_server,
    buf: *mut c_char,
    len: usize,
    out_needed: *mut usize,
) -> cc_result {
    last_error_into(server.as_ref(), TextOut::new(buf, len, out_needed))
}

/// Checks one thread's whole hash chain and anchor in the server's store.
///
/// # Safety
/// `server` valid; `thread_id` a valid C string; `out_ok` / `out_events` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn cc_server_verify_thread(
    server: *const cc_server,
    thread_id: *const c_char,
    out_ok: *mut bool,
    out_events: *mut u64,
) -> cc_result {
    on_handle(handle(server), |s| {
        let id = str_arg(thread_id, "thread_id")?;
        let report = s
            .server
            .store()
            .verify(id)
            .map_err(|e| fail(CC_ERR_STORE, e.to_string()))?;
        put(out_ok, report.ok());
        put(out_events, report.events);
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------
// Raw connection

/// One raw connection: the host speaks JSON-RPC lines itself. Created by `cc_server_connect`,
/// freed (and closed) by `cc_connection_free`.
pub struct cc_connection {
    conn: CoreConnection,
    kept: OversizedText,
    last_error: LastError,
}

impl Handle for cc_connection {
    fn last_error(&self) -> &LastError {
        &self.last_error
    }
}

/// Opens a raw connection. `*out_conn` owns the new handle.
///
/// # Safety
/// `server` valid; `out_conn` valid.
#[no_mangle]
pub unsafe extern "C" fn cc_server_connect(
    server: *const cc_server,
    out_conn: *mut *mut cc_connection,
) -> cc_result {
    on_handle(handle(server), |s| {
        let out = out_arg(out_conn, "out_conn")?;
        let conn = s
            .server
            .connect()
            .map_err(|_| fail(CC_ERR_CLOSED, "the server is shut down"))?;
        *out = into_handle(cc_connection {
            conn,
            kept: OversizedText::default(),
            last_error: LastError::default(),
        });
        Ok(())
    })
}

/// Queues one JSON-RPC message without blocking. On `CC_ERR_OVERLOADED`, `*out_retry_after_ms`
/// (if not NULL) says how long to wait.
///
/// # Safety
/// `conn` valid; `message` a valid C string; `out_retry_after_ms` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn cc_connection_send(
    conn: *const cc_connection,
    message: *const c_char,
    out_retry_after_ms: *mut u64,
) -> cc_result {
    on_handle(handle(conn), |c| {
        let message = str_arg(message, "message")?;
        c.conn.send(message).map_err(|e| {
            let code = match e {
                SendError::Overloaded { retry_after_ms } => {
                    put(out_retry_after_ms, retry_after_ms);
                    CC_ERR_OVERLOADED
                }
                SendError::LineTooLarge { .. } => CC_ERR_LINE_TOO_LARGE,
                SendError::Closed => CC_ERR_CLOSED,
            };
            fail(code, e.to_string())
        })
    })
}

/// Receives the next message into `buf`, waiting up to `timeout_ms` (negative: until one
/// arrives or the connection closes). `CC_ERR_TIMEOUT` when nothing came; `CC_ERR_CLOSED` when
/// closed and drained; `CC_ERR_BUFFER_TOO_SMALL` keeps the message for the next call.
///
/// # Safety
/// `conn` valid; `buf` NULL or valid for `len`; `out_needed` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn cc_connection_recv(
    conn: *const cc_connection,
    timeout_ms: i64,
    buf: *mut c_char,
    len: usize,
    out_needed: *mut usize,
) -> cc_result {
    let out = TextOut::new(buf, len, out_needed);
    on_handle(handle(conn), |c| {
        if c.kept.take_into(out)? {
            return Ok(());
        }
        let timeout = u64::try_from(timeout_ms).ok().map(Duration::from_millis);
        let message = c.conn.recv(timeout).map_err(|e| match e {
            RecvError::Timeout => fail(CC_ERR_TIMEOUT, "no message within the timeout"),
            RecvError::Closed => fail(CC_ERR_CLOSED, "the connection is closed"),
        })?;
        c.kept.write_or_keep(out, CC_OK, message)
    })
}

/// True until the connection is closed (by the host, shutdown, or a host that stopped reading).
///
/// # Safety
/// `conn` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn cc_connection_is_open(conn: *const cc_connection) -> bool {
    query(handle(conn), false, |c| c.conn.is_open())
}

/// Closes the connection (pending approvals fail closed). The handle stays valid until freed.
///
/// # Safety
/// `conn` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn cc_connection_close(conn: *const cc_connection) -> cc_result {
    on_handle(handle(conn), |c| {
        c.conn.close();
        Ok(())
    })
}

/// Closes and frees the connection. NULL is a no-op.
///
/// # Safety
/// `conn` NULL or a handle from `cc_server_connect` not yet freed; not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn cc_connection_free(conn: *mut cc_connection) {
    free(conn)
}

/// The connection's last error text.
///
/// # Safety
/// `conn` NULL or valid; `buf` NULL or valid for `len`; `out_needed` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn cc_connection_last_error(
    conn: *const cc_connection,
    buf: *mut c_char,
    len: usize,
    out_needed: *mut usize,
) -> cc_result {
    last_error_into(conn.as_ref(), TextOut::new(buf, len, out_needed))
}

// ---------------------------------------------------------------------------------------------
// Client

/// A connected, initialized client (the one Rust client: pending map, timeouts, approval routing,
/// default decline). Created by `cc_client_connect`, freed (and closed) by `cc_client_free`.
pub struct cc_client {
    client: Client,
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
    /// callback is never called again.
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
            client: Client::connect_core(&s.server, handler, config)?,
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
            crate::client::parse_params(str_arg(params_json, "params_json")?)?
        };
        let (code, text) = match c.client.request_value(method, params) {
            Ok(result) => (CC_OK, result.to_string()),
            Err(ClientError::Protocol { code, reason, data }) => {
                *lock(&c.last_code) = code;
                let data = data
                    .and_then(|d| serde_json::from_str::<Value>(&d).ok())
                    .unwrap_or(Value::Null);
                let error = json!({"code": code, "message": reason, "data": data});
                (CC_ERR_PROTOCOL, error.to_string())
            }
            Err(e) => {
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
        match c.client.next_notification(timeout_ms.into())? {
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

// ---------------------------------------------------------------------------------------------
// Host kernel

/// The engine's context for one running turn, lent to `run_turn` for the duration of the call.
/// Never freed by the host. The pointer is a token, never dereferenced: a `cc_turn` kept past its
/// `run_turn` (or a made-up pointer) is looked up, not found, and refused with `CC_ERR_EXPIRED`.
pub struct cc_turn {
    _opaque: [u8; 0],
}

/// What a `cc_turn` token stands for while its `run_turn` runs.
struct TurnState {
    ctx: Arc<TurnContext>,
    kept: OversizedText,
    failure: Mutex<Option<String>>,
    last_error: LastError,
}

impl Handle for TurnState {
    fn last_error(&self) -> &LastError {
        &self.last_error
    }
}

/// Live turns by token. Tokens come from a counter and are never reused (a 64-bit counter does
/// not wrap; a 32-bit one would after 2^32 turns), so a stale token cannot reach a newer turn.
struct TurnRegistry {
    next: usize,
    live: std::collections::BTreeMap<usize, Arc<TurnState>>,
}

static TURNS: Mutex<TurnRegistry> = Mutex::new(TurnRegistry {
    next: 1,
    live: std::collections::BTreeMap::new(),
});

struct CKernel {
    kernel: cc_kernel,
    /// True once the server owns `user_data` (open succeeded): only then does drop release it.
    armed: AtomicBool,
}

// SAFETY: `cc_server_open` documents that `run_turn` and `release` may be called from engine
// threads, concurrently for different turns, so `user_data` must be thread-safe.
unsafe impl Send for CKernel {}
unsafe impl Sync for CKernel {}

impl Drop for CKernel {
    fn drop(&mut self) {
        if self.armed.load(Ordering::SeqCst) {
            if let Some(release) = self.kernel.release {
                // SAFETY: the server owns user_data (see cc_kernel) and this is the last use.
                unsafe { release(self.kernel.user_data) };
            }
        }
    }
}

impl CoreKernel for CKernel {
    fn run_turn(&self, ctx: &dyn CoreContext, input: &[UserInput]) -> Result<(), CoreKernelError> {
        let Some(run_turn) = self.kernel.run_turn else {
            return Err(CoreKernelError::Failed(
                "the host kernel has no run_turn".into(),
            ));
        };
        let lease = Lease::new(ctx);
        let state = Arc::new(TurnState {
            ctx: Arc::clone(&lease.0),
            kept: OversizedText::default(),
            failure: Mutex::new(None),
            last_error: LastError::default(),
        });
        let token = {
            let mut turns = lock(&TURNS);
            let token = turns.next;
            turns.next = turns.next.wrapping_add(1).max(1);
            turns.live.insert(token, Arc::clone(&state));
            token
        };
        // Unregisters the token on every way out (a panic in the host's callback included).
        struct Unregister(usize);
        impl Drop for Unregister {
            fn drop(&mut self) {
                lock(&TURNS).live.remove(&self.0);
            }
        }
        let registered = Unregister(token);
        let input = std::ffi::CString::new(turn_input(input).json).unwrap_or_default();
        // SAFETY: the cc_kernel contract; `input` outlives the call. The turn pointer is a token
        // (see `cc_turn`), valid to dereference for nobody.
        let code =
            unsafe { run_turn(self.kernel.user_data, token as *mut cc_turn, input.as_ptr()) };
        drop(registered);
        drop(lease);
        match code {
            0 => Ok(()),
            c if c == CC_ERR_CANCELLED as i32 => Err(CoreKernelError::Cancelled),
            c => Err(CoreKernelError::Failed(
                lock(&state.failure)
                    .take()
                    .unwrap_or_else(|| format!("the host kernel failed (code {c})")),
            )),
        }
    }
}

/// The live turn a token stands for (the `handle` of a `cc_turn`): `CC_ERR_NULL_ARGUMENT` for
/// NULL, `CC_ERR_EXPIRED` for a token whose `run_turn` has returned (or was never handed out).
fn turn_state(turn: *const cc_turn) -> Result<Arc<TurnState>, cc_result> {
    if turn.is_null() {
        return Err(CC_ERR_NULL_ARGUMENT);
    }
    lock(&TURNS)
        .live
        .get(&(turn as usize))
        .cloned()
        .ok_or(CC_ERR_EXPIRED)
}

/// The turn text getters: `text` of the live turn into the caller's buffer.
unsafe fn turn_text(
    turn: *const cc_turn,
    buf: *mut c_char,
    len: usize,
    out_needed: *mut usize,
    text: impl FnOnce(&TurnContext) -> Result<String, KernelError>,
) -> cc_result {
    on_handle(turn_state(turn), |t| {
        TextOut::new(buf, len, out_needed).write(&text(&t.ctx)?)
    })
}

/// The turn's thread id.
///
/// # Safety
/// `turn` the handle passed to `run_turn`, during that call; `buf` NULL or valid for `len`;
/// `out_needed` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn cc_turn_thread_id(
    turn: *const cc_turn,
    buf: *mut c_char,
    len: usize,
    out_needed: *mut usize,
) -> cc_result {
    turn_text(turn, buf, len, out_needed, |ctx| Ok(ctx.thread_id()))
}

/// The turn's id.
///
/// # Safety
/// `turn` the handle passed to `run_turn`, during that call; `buf` NULL or valid for `len`;
/// `out_needed` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn cc_turn_turn_id(
    turn: *const cc_turn,
    buf: *mut c_char,
    len: usize,
    out_needed: *mut usize,
) -> cc_result {
    turn_text(turn, buf, len, out_needed, |ctx| Ok(ctx.turn_id()))
}

/// A fresh item id, unique within the thread.
///
/// # Safety
/// `turn` the handle passed to `run_turn`, during that call; `buf` NULL or valid for `len`;
/// `out_needed` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn cc_turn_new_item_id(
    turn: *const cc_turn,
    buf: *mut c_char,
    len: usize,
    out_needed: *mut usize,
) -> cc_result {
    turn_text(turn, buf, len, out_needed, |ctx| ctx.new_item_id())
}

/// The thread's conversation before this turn as JSON (see docs/kernels.md), for a host kernel
/// that runs its own model.
///
/// # Safety
/// `turn` the handle passed to `run_turn`, during that call; `buf` NULL or valid for `len`;
/// `out_needed` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn cc_turn_history(
    turn: *const cc_turn,
    buf: *mut c_char,
    len: usize,
    out_needed: *mut usize,
) -> cc_result {
    turn_text(turn, buf, len, out_needed, |ctx| ctx.history_json())
}

/// The thread's `agentOptions` as JSON (`null` when none were given).
///
/// # Safety
/// `turn` the handle passed to `run_turn`, during that call; `buf` NULL or valid for `len`;
/// `out_needed` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn cc_turn_agent_options(
    turn: *const cc_turn,
    buf: *mut c_char,
    len: usize,
    out_needed: *mut usize,
) -> cc_result {
    turn_text(turn, buf, len, out_needed, |ctx| ctx.agent_options_json())
}

/// Records and announces `item/started`; `item_json` is an item body (`ItemContent`; the engine wraps it in the published `Item`).
///
/// # Safety
/// `turn` the handle passed to `run_turn`, during that call; `item_json` a valid C string.
#[no_mangle]
pub unsafe extern "C" fn cc_turn_item_started(
    turn: *const cc_turn,
    item_json: *const c_char,
) -> cc_result {
    on_handle(turn_state(turn), |t| {
        let item = str_arg(item_json, "item_json")?.to_string();
        Ok(t.ctx.item_started(item)?)
    })
}

/// Records and announces `item/delta`; `delta_json` is a wire `ItemDelta`.
///
/// # Safety
/// `turn` the handle passed to `run_turn`, during that call; strings valid C strings.
#[no_mangle]
pub unsafe extern "C" fn cc_turn_item_delta(
    turn: *const cc_turn,
    item_id: *const c_char,
    delta_json: *const c_char,
) -> cc_result {
    on_handle(turn_state(turn), |t| {
        let id = str_arg(item_id, "item_id")?.to_string();
        let delta = str_arg(delta_json, "delta_json")?.to_string();
        Ok(t.ctx.item_delta(id, delta)?)
    })
}

/// Records and announces `item/completed`; `item_json` is an item body (`ItemContent`; the engine wraps it in the published `Item`).
///
/// # Safety
/// `turn` the handle passed to `run_turn`, during that call; `item_json` a valid C string.
#[no_mangle]
pub unsafe extern "C" fn cc_turn_item_completed(
    turn: *const cc_turn,
    item_json: *const c_char,
) -> cc_result {
    on_handle(turn_state(turn), |t| {
        let item = str_arg(item_json, "item_json")?.to_string();
        Ok(t.ctx.item_completed(item)?)
    })
}

/// Asks for a tool through the approval gate, blocking while it decides. `buf` receives the
/// wire `ToolResult` JSON (`{"status":"ok"|"error"|"denied",…}`); when it does not fit it is
/// kept for `cc_turn_last_result`. `CC_ERR_CANCELLED`: stop the turn.
///
/// # Safety
/// `turn` the handle passed to `run_turn`, during that call; strings valid C strings;
/// `buf` NULL or valid for `len`; `out_needed` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn cc_turn_request_tool(
    turn: *const cc_turn,
    item_id: *const c_char,
    tool: *const c_char,
    arguments_json: *const c_char,
    buf: *mut c_char,
    len: usize,
    out_needed: *mut usize,
) -> cc_result {
    on_handle(turn_state(turn), |t| {
        let id = str_arg(item_id, "item_id")?.to_string();
        let tool = str_arg(tool, "tool")?.to_string();
        let args = str_arg(arguments_json, "arguments_json")?.to_string();
        let result = t.ctx.request_tool(id, tool, args)?;
        t.kept
            .write_or_keep(TextOut::new(buf, len, out_needed), CC_OK, result)
    })
}

/// The tool result kept by the last `cc_turn_request_tool` that returned
/// `CC_ERR_BUFFER_TOO_SMALL`. `CC_ERR_FAILED` when none is kept.
///
/// # Safety
/// `turn` the handle passed to `run_turn`, during that call; `buf` NULL or valid for `len`;
/// `out_needed` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn cc_turn_last_result(
    turn: *const cc_turn,
    buf: *mut c_char,
    len: usize,
    out_needed: *mut usize,
) -> cc_result {
    on_handle(turn_state(turn), |t| {
        t.kept
            .hand_out(TextOut::new(buf, len, out_needed), "tool result")
    })
}

/// True once the turn has been asked to stop: return `CC_ERR_CANCELLED` from `run_turn` soon.
///
/// # Safety
/// `turn` NULL or the handle passed to `run_turn`, during that call.
#[no_mangle]
pub unsafe extern "C" fn cc_turn_is_cancelled(turn: *const cc_turn) -> bool {
    query(turn_state(turn), true, |t| t.ctx.is_cancelled())
}

/// Sleeps up to `ms`, waking early on cancellation; true when cancelled.
///
/// # Safety
/// `turn` NULL or the handle passed to `run_turn`, during that call.
#[no_mangle]
pub unsafe extern "C" fn cc_turn_sleep(turn: *const cc_turn, ms: u64) -> bool {
    let ms = i64::try_from(ms).unwrap_or(i64::MAX);
    query(turn_state(turn), true, |t| t.ctx.sleep_cancellable(ms))
}

/// Sets the reason shown to the user when `run_turn` returns a failure code (copied).
///
/// # Safety
/// `turn` the handle passed to `run_turn`, during that call; `reason` a valid C string.
#[no_mangle]
pub unsafe extern "C" fn cc_turn_fail(turn: *const cc_turn, reason: *const c_char) -> cc_result {
    on_handle(turn_state(turn), |t| {
        let reason = str_arg(reason, "reason")?;
        *lock(&t.failure) = Some(reason.chars().take(1024).collect());
        Ok(())
    })
}

/// The turn handle's last error text.
///
/// # Safety
/// `turn` NULL or the handle passed to `run_turn`, during that call; `buf` NULL or valid for
/// `len`; `out_needed` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn cc_turn_last_error(
    turn: *const cc_turn,
    buf: *mut c_char,
    len: usize,
    out_needed: *mut usize,
) -> cc_result {
    match turn_state(turn) {
        Ok(t) => last_error_into(Some(&*t), TextOut::new(buf, len, out_needed)),
        Err(code) => code,
    }
}

// ---------------------------------------------------------------------------------------------
// Diagnostics

/// Log levels for `cc_set_log_callback`: 0 turns logging off.
pub const CC_LOG_OFF: i32 = 0;
pub const CC_LOG_ERROR: i32 = 1;
pub const CC_LOG_WARN: i32 = 2;
pub const CC_LOG_INFO: i32 = 3;
pub const CC_LOG_DEBUG: i32 = 4;
pub const CC_LOG_TRACE: i32 = 5;

/// Receives one diagnostic record: `level` a `CC_LOG_*` value; `target` (e.g.
/// "cc_app_server::turn") and `message` are NUL-terminated UTF-8 borrowed for the call.
pub type cc_log_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        level: i32,
        target: *const c_char,
        message: *const c_char,
    ),
>;

/// Sends the library's diagnostics at `level` and more severe to `callback`, called with
/// `user_data` on the library's log delivery thread (never on an engine thread, so a slow
/// callback never stalls a turn: records it cannot keep up with are dropped and counted).
/// `user_data` is borrowed until the callback is replaced or turned off and must be usable from
/// that thread. NULL `callback` or `CC_LOG_OFF` turns logging off; a new call replaces the old
/// callback (and waits until the old one is no longer being called, unless called from inside
/// it). `CC_ERR_INVALID_ARGUMENT` for a level outside 0..=5.
///
/// # Safety
/// `callback` NULL or a function safe to call as documented, with `user_data`.
#[no_mangle]
pub unsafe extern "C" fn cc_set_log_callback(
    callback: cc_log_fn,
    user_data: *mut c_void,
    level: i32,
) -> cc_result {
    guarded(None, || {
        use crate::log::{set_c_callback, CCallback, LogLevel};
        let level = match u8::try_from(level).map(LogLevel::from_rank) {
            Ok(Some(level)) => Some(level),
            _ if level == CC_LOG_OFF => None,
            _ => {
                return Err(fail(
                    CC_ERR_INVALID_ARGUMENT,
                    format!("log level {level}: use CC_LOG_OFF (0) to CC_LOG_TRACE (5)"),
                ))
            }
        };
        match (callback, level) {
            (Some(f), Some(level)) => set_c_callback(Some(CCallback { f, user_data }), level),
            _ => set_c_callback(None, LogLevel::Error),
        };
        Ok(())
    })
}

/// Log records dropped because the log callback fell behind (since the process started).
#[no_mangle]
pub extern "C" fn cc_dropped_log_records() -> u64 {
    u64::try_from(crate::log::dropped_log_records()).unwrap_or(0)
}

#[cfg(test)]
mod tests;
