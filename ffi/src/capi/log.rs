//! The library's diagnostics to C: `cc_set_log_callback` and its `CC_LOG_*` levels (on the
//! log bridge of src/log.rs) and `cc_dropped_log_records`.

use super::*;
use std::ffi::c_void;

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
