//! What every delivery thread shares (the client's notification listener and the server-side
//! connection listener): the batch bound, and how a failing host listener is reported.

use crate::errors::ListenerError;
use std::sync::atomic::{AtomicU64, Ordering};

/// Most notifications handed to a listener in one call.
pub const MAX_BATCH: usize = 256;

/// Listener callbacks that failed, across the process (see `ServerStats::listener_errors`).
pub(crate) static LISTENER_ERRORS: AtomicU64 = AtomicU64::new(0);

/// Listener failures are the host's bug, not the stream's end: say so and go on.
pub(crate) fn listener_failed(kind: &str, e: &ListenerError) {
    LISTENER_ERRORS.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(
        target: "cc_app_server::ffi",
        "{kind} listener failed; delivery continues: {e}"
    );
}
