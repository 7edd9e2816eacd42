//! `cc_connection`: a raw JSON-RPC connection on the engine's `Connection` (`cc_server_connect`,
//! send, receive with the kept message, open/close, free, last error).

use super::*;
use cc_app_server::engine::{Connection as CoreConnection, RecvError, SendError};
use std::time::Duration;

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

/// Opens a raw connection. `*out_conn` owns the new handle. `CC_ERR_OVERLOADED` when the
/// server's `max_connections` are open (8 under the compact profile): close one and retry.
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
        let conn = s.server.connect().map_err(|e| match e {
            SendError::Overloaded { retry_after_ms } => fail(
                CC_ERR_OVERLOADED,
                format!(
                    "the server's connections are all in use (max_connections); close one \
                         or retry after {retry_after_ms} ms"
                ),
            ),
            _ => fail(CC_ERR_CLOSED, "the server is shut down"),
        })?;
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
