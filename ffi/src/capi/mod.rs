//! The C ABI's shared boundary machinery: `cc_result`, the panic boundary and entry-point
//! helpers, last-error text, the argument and text-out helpers, and the library information
//! functions. Each handle's entry points live in a module of their own: `server` (`cc_server`),
//! `connection` (`cc_connection`), `client` (`cc_client` and the C approval callback), `turn`
//! (`cc_kernel`, `cc_turn` and the C kernel adapter) and `log` (the log callback). They are layered
//! on the core API of `cc-app-server` (the engine's `AppServer` and `Connection`, the core
//! `Client`, the kernel's `TurnContext`), not on the uniffi objects, sharing only plain helpers of
//! this crate with them (option validation, parsing and checks of host JSON, error conversions).
//!
//! In the style of rustls-ffi: opaque handles, `cc_result` codes, out-params, caller-owned
//! buffers that report the size they need, last-error text per handle, and a panic boundary
//! (`catch_unwind`) at every entry point. `ffi/include/cc_app_server.h` is generated from this
//! module and its submodules by cbindgen (see build.rs) and checked in.
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

// cbindgen parses these in this order, after this file's own items, and the header keeps that
// order (server, connection, client, turn, log); the blank lines keep rustfmt from sorting them.
mod server;

mod connection;

mod client;

mod client_turn;

mod turn;

mod hub;

mod log;

pub use client::*;
pub use client_turn::*;
pub use connection::*;
pub use log::*;
pub use server::*;
pub use turn::*;

use cc_app_server::rollout::sync::lock;
use std::ffi::{c_char, CStr};
use std::ops::Deref;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

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
    /// The server answered -32004 (no such thread, turn, item…), or the store has no such thread.
    CC_ERR_NOT_FOUND = 14,
    /// The server answered -32009: the thread is busy with another turn, archived, or an
    /// idempotency key was reused with other params.
    CC_ERR_CONFLICT = 15,
    /// The server answered -32602, or the params given were not JSON (nothing was sent).
    CC_ERR_INVALID_PARAMS = 16,
    /// The state directory is held by another store, in this process or another.
    CC_ERR_STORE_LOCKED = 17,
    /// The state directory is not a private directory (a regular file, a symlink, group/world
    /// access).
    CC_ERR_STORE_UNSAFE = 18,
    /// A log is corrupt or does not match its anchor: restore it from a backup.
    CC_ERR_STORE_DAMAGED = 19,
    /// A turn ended `failed` (`cc_client_turn_text`); its reason is the last error.
    CC_ERR_KERNEL_FAILED = 20,
}

/// A `timeout_ms` that waits without a deadline (until a notification comes or the client
/// closes): -1 converted to `uint32_t`.
pub const CC_WAIT_FOREVER: u32 = u32::MAX;

use cc_result::*;

// ---------------------------------------------------------------------------------------------
// The entry-point pattern (docs/ffi.md, "Entry-point pattern"). Every `extern "C"` function (here
// and in the handle modules) is one call to `on_handle` (a call on a handle), `guarded` (no handle), `query` (a plain value back,
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
    const CODES: [cc_result; 21] = [
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
        CC_ERR_NOT_FOUND,
        CC_ERR_CONFLICT,
        CC_ERR_INVALID_PARAMS,
        CC_ERR_STORE_LOCKED,
        CC_ERR_STORE_UNSAFE,
        CC_ERR_STORE_DAMAGED,
        CC_ERR_KERNEL_FAILED,
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
        CC_ERR_NOT_FOUND => b"CC_ERR_NOT_FOUND\0",
        CC_ERR_CONFLICT => b"CC_ERR_CONFLICT\0",
        CC_ERR_INVALID_PARAMS => b"CC_ERR_INVALID_PARAMS\0",
        CC_ERR_STORE_LOCKED => b"CC_ERR_STORE_LOCKED\0",
        CC_ERR_STORE_UNSAFE => b"CC_ERR_STORE_UNSAFE\0",
        CC_ERR_STORE_DAMAGED => b"CC_ERR_STORE_DAMAGED\0",
        CC_ERR_KERNEL_FAILED => b"CC_ERR_KERNEL_FAILED\0",
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
        TextOut::new(buf, len, out_needed).write(cc_app_server::protocol::SCHEMA_DIGEST)
    })
}

// ---------------------------------------------------------------------------------------------
// JSON field accessors

/// The value at `pointer` in the JSON text `json`: `CC_ERR_INVALID_ARGUMENT` when `json` is not
/// JSON, `CC_ERR_NOT_FOUND` when there is no such field or it is null.
fn json_at(json: &str, pointer: &str) -> Outcome<serde_json::Value> {
    let value: serde_json::Value = serde_json::from_str(json)
        .map_err(|e| fail(CC_ERR_INVALID_ARGUMENT, format!("not JSON: {e}")))?;
    match value.pointer(pointer) {
        None | Some(serde_json::Value::Null) => Err(fail(
            CC_ERR_NOT_FOUND,
            format!("no value at JSON pointer {pointer:?}"),
        )),
        Some(v) => Ok(v.clone()),
    }
}

/// Writes the field at `pointer`: a string's own text, any other value as JSON.
unsafe fn json_field_into(json: &str, pointer: &str, out: TextOut) -> Outcome {
    match json_at(json, pointer)? {
        serde_json::Value::String(s) => out.write(&s),
        other => out.write(&other.to_string()),
    }
}

/// The integer at `pointer`.
fn json_int(json: &str, pointer: &str) -> Outcome<i64> {
    json_at(json, pointer)?.as_i64().ok_or_else(|| {
        fail(
            CC_ERR_INVALID_ARGUMENT,
            format!("the value at {pointer:?} is not an integer"),
        )
    })
}

/// One field of any JSON text (a notification, a result, an error object), by JSON pointer
/// (RFC 6901: "/params/turn/status", "/params/item/content/text", "" for the whole value): a
/// string's own text (unescaped), any other value as JSON text. `CC_ERR_NOT_FOUND` when there is
/// no such field or it is null; `CC_ERR_INVALID_ARGUMENT` when `json` is not JSON. No handle,
/// so no last error: the code says it all.
///
/// # Safety
/// `json` and `pointer` valid C strings; `buf` NULL or valid for `len`; `out_needed` NULL or
/// valid.
#[no_mangle]
pub unsafe extern "C" fn cc_json_get_string(
    json: *const c_char,
    pointer: *const c_char,
    buf: *mut c_char,
    len: usize,
    out_needed: *mut usize,
) -> cc_result {
    guarded(None, || {
        let json = str_arg(json, "json")?;
        let pointer = str_arg(pointer, "pointer")?;
        json_field_into(json, pointer, TextOut::new(buf, len, out_needed))
    })
}

/// One integer field of any JSON text, by JSON pointer (e.g. "/params/eventSeq").
/// `CC_ERR_NOT_FOUND` when absent or null; `CC_ERR_INVALID_ARGUMENT` when `json` is not JSON or
/// the value is not an integer.
///
/// # Safety
/// `json` and `pointer` valid C strings; `out_value` valid.
#[no_mangle]
pub unsafe extern "C" fn cc_json_get_int(
    json: *const c_char,
    pointer: *const c_char,
    out_value: *mut i64,
) -> cc_result {
    guarded(None, || {
        let json = str_arg(json, "json")?;
        let pointer = str_arg(pointer, "pointer")?;
        let out = out_arg(out_value, "out_value")?;
        *out = json_int(json, pointer)?;
        Ok(())
    })
}

#[cfg(test)]
mod tests;
