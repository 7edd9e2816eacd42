//! The small public error enums every host sees, mapped from the richer internal errors so a
//! Swift `catch`, a Kotlin `when` or a Python `except` can act on the variant, not on text.
//! Fields are named `reason`, never `message`, because Kotlin exceptions already own `message`.
//! Integers are signed (`i64`/`i32`) everywhere in the exported surface: Kotlin's unsigned types
//! reach Java callers with mangled names, and no value here needs the sign bit.

use cc_app_server::client::ClientError as CoreClientError;
use cc_app_server::engine::{
    OpenError as CoreOpenError, RecvError as CoreRecvError, SendError as CoreSendError,
};
use cc_app_server::protocol::error_code;
use cc_app_server::rollout::StoreError as CoreStoreError;

/// Why `AppServer.open` (or a call on a shut-down server) failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, uniffi::Error)]
pub enum ServerError {
    #[error("invalid server configuration: {reason}")]
    InvalidConfig { reason: String },
    /// `kind` says which of the store's failures it was, so a host can offer the right fix
    /// (wait for the other owner, fix the directory, restore from a backup) without reading text.
    #[error("cannot open the rollout store: {reason}")]
    Store { kind: StoreFailure, reason: String },
    #[error("the server is shut down; open a new one")]
    ShutDown,
    /// `connect` while the server's `max_connections` are open (8 under the compact profile):
    /// close one, or retry after `retry_after_ms`.
    #[error(
        "the server's connections are all in use; close one or retry after {retry_after_ms} ms"
    )]
    Overloaded { retry_after_ms: i64 },
}

impl From<CoreOpenError> for ServerError {
    fn from(e: CoreOpenError) -> Self {
        match e {
            CoreOpenError::Store(e) => ServerError::Store {
                kind: StoreFailure::of(&e),
                reason: e.to_string(),
            },
            CoreOpenError::Config(reason) => ServerError::InvalidConfig { reason },
        }
    }
}

/// Which failure of the rollout store stopped an open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, uniffi::Enum)]
pub enum StoreFailure {
    /// Another store, in this process or another, holds the state directory.
    Locked,
    /// The state directory is not a private directory (a file, a symlink, group/world access).
    Unsafe,
    /// A log is corrupt or does not match its head anchor: restore it from a backup.
    Damaged,
    /// Anything else: I/O, SQLite, an invalid argument.
    Io,
}

impl StoreFailure {
    pub(crate) fn of(e: &CoreStoreError) -> Self {
        match e {
            CoreStoreError::Locked(_) => StoreFailure::Locked,
            CoreStoreError::UnsafeStateDir(_) => StoreFailure::Unsafe,
            CoreStoreError::Corrupt { .. } | CoreStoreError::AnchorMismatch { .. } => {
                StoreFailure::Damaged
            }
            _ => StoreFailure::Io,
        }
    }
}

/// Why `Connection.send` refused a message. Nothing was queued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, uniffi::Error)]
pub enum SendError {
    #[error("server queue full; retry after {retry_after_ms} ms")]
    Overloaded { retry_after_ms: i64 },
    #[error("message of {size} bytes exceeds the {max}-byte limit")]
    LineTooLarge { size: i64, max: i64 },
    #[error("the connection is closed")]
    Closed,
}

/// A count or duration from the core (never near `i64::MAX`) as the surface's signed type.
pub(crate) fn signed(v: impl TryInto<i64>) -> i64 {
    v.try_into().unwrap_or(i64::MAX)
}

impl From<CoreSendError> for SendError {
    fn from(e: CoreSendError) -> Self {
        match e {
            CoreSendError::Overloaded { retry_after_ms } => SendError::Overloaded {
                retry_after_ms: signed(retry_after_ms),
            },
            CoreSendError::LineTooLarge { size, max } => SendError::LineTooLarge {
                size: signed(size),
                max: signed(max),
            },
            CoreSendError::Closed => SendError::Closed,
        }
    }
}

/// Why `Connection.recv` returned no message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, uniffi::Error)]
pub enum RecvError {
    #[error("no message within the timeout")]
    Timeout,
    #[error("the connection is closed and drained")]
    Closed,
}

impl From<CoreRecvError> for RecvError {
    fn from(e: CoreRecvError) -> Self {
        match e {
            CoreRecvError::Timeout => RecvError::Timeout,
            CoreRecvError::Closed => RecvError::Closed,
        }
    }
}

/// What a client request can end in besides a result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, uniffi::Error)]
pub enum ClientError {
    /// Too many requests in flight or the server's queue is full: wait and retry.
    #[error("overloaded; retry after {retry_after_ms} ms")]
    Overloaded { retry_after_ms: i64 },
    /// No answer within the request timeout (-32010); never read this as success.
    #[error("no answer within the request timeout")]
    Timeout,
    #[error("the client is closed")]
    Closed,
    #[error("request of {size} bytes exceeds the {max}-byte limit")]
    LineTooLarge { size: i64, max: i64 },
    /// The server answered with a JSON-RPC error. `data` is its JSON text, if any.
    #[error("server error {code}: {reason}")]
    Protocol {
        code: i64,
        reason: String,
        data: Option<String>,
    },
    /// The params or the result were not the JSON expected.
    #[error("invalid JSON: {reason}")]
    InvalidJson { reason: String },
    /// An argument was out of range (a negative timeout or count).
    #[error("invalid argument: {reason}")]
    InvalidArgument { reason: String },
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
            ClientError::InvalidJson { .. } => error_code::PARSE,
            ClientError::InvalidArgument { .. } => error_code::INVALID_PARAMS,
        }
    }
}

impl From<CoreClientError> for ClientError {
    fn from(e: CoreClientError) -> Self {
        match e {
            CoreClientError::Overloaded { retry_after_ms } => ClientError::Overloaded {
                retry_after_ms: signed(retry_after_ms),
            },
            CoreClientError::Timeout => ClientError::Timeout,
            CoreClientError::Closed => ClientError::Closed,
            CoreClientError::LineTooLarge { size, max } => ClientError::LineTooLarge {
                size: signed(size),
                max: signed(max),
            },
            CoreClientError::Protocol {
                code,
                message,
                data,
            } => ClientError::Protocol {
                code,
                reason: message,
                data: data.map(|d| d.to_string()),
            },
            CoreClientError::Decode(reason) => ClientError::InvalidJson { reason },
        }
    }
}

/// Why a kernel stopped, or why a `TurnContext` call was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, uniffi::Error)]
pub enum KernelError {
    /// The turn was cancelled (interrupt, shutdown, or the user cancelled at an approval): stop.
    #[error("the turn was cancelled")]
    Cancelled,
    /// The kernel failed; the reason is shown to the user (keep it free of secrets).
    #[error("kernel failed: {reason}")]
    Failed { reason: String },
    /// An item, delta or tool call was not valid wire JSON; nothing was recorded.
    #[error("invalid argument: {reason}")]
    Invalid { reason: String },
    /// The `TurnContext` was used after `run_turn` returned; it only lives for that call.
    #[error("this TurnContext belongs to a turn whose run_turn has returned")]
    Expired,
}

impl From<uniffi::UnexpectedUniFFICallbackError> for KernelError {
    fn from(e: uniffi::UnexpectedUniFFICallbackError) -> Self {
        KernelError::Failed { reason: e.reason }
    }
}

/// A host callback (tool executor, approval handler) failed. For approvals this is a decline.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, uniffi::Error)]
pub enum HandlerError {
    #[error("host callback failed: {reason}")]
    Failed { reason: String },
}

/// A listener callback (notifications, messages, logs) raised. Delivery goes on; the error is
/// logged and counted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, uniffi::Error)]
pub enum ListenerError {
    #[error("listener failed: {reason}")]
    Failed { reason: String },
}

impl From<uniffi::UnexpectedUniFFICallbackError> for ListenerError {
    fn from(e: uniffi::UnexpectedUniFFICallbackError) -> Self {
        ListenerError::Failed { reason: e.reason }
    }
}

impl From<uniffi::UnexpectedUniFFICallbackError> for HandlerError {
    fn from(e: uniffi::UnexpectedUniFFICallbackError) -> Self {
        HandlerError::Failed { reason: e.reason }
    }
}

/// What a rollout store refused, by kind; `reason` says what to do next.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, uniffi::Error)]
pub enum StoreError {
    #[error("{reason}")]
    NotFound { reason: String },
    #[error("{reason}")]
    AlreadyExists { reason: String },
    #[error("{reason}")]
    InvalidArgument { reason: String },
    /// Corruption in the middle of a log: refused at this exact seq, never skipped.
    #[error("{reason}")]
    Corrupt {
        thread_id: String,
        seq: i64,
        reason: String,
    },
    #[error("{reason}")]
    AnchorMismatch { thread_id: String, reason: String },
    #[error("{reason}")]
    UnsafeStateDir { reason: String },
    /// Another store (in this or another process) holds the directory.
    #[error("{reason}")]
    Locked { reason: String },
    #[error("{reason}")]
    Io { reason: String },
    #[error("the rollout store is closed; open it again")]
    Closed,
}

impl From<CoreStoreError> for StoreError {
    fn from(e: CoreStoreError) -> Self {
        let reason = e.to_string();
        match e {
            CoreStoreError::NotFound(_) => StoreError::NotFound { reason },
            CoreStoreError::AlreadyExists(_) => StoreError::AlreadyExists { reason },
            CoreStoreError::InvalidId { .. } | CoreStoreError::InvalidArgument(_) => {
                StoreError::InvalidArgument { reason }
            }
            CoreStoreError::Corrupt { thread_id, seq, .. } => StoreError::Corrupt {
                thread_id,
                seq: signed(seq),
                reason,
            },
            CoreStoreError::AnchorMismatch { thread_id, .. } => {
                StoreError::AnchorMismatch { thread_id, reason }
            }
            CoreStoreError::UnsafeStateDir(_) => StoreError::UnsafeStateDir { reason },
            CoreStoreError::Locked(_) => StoreError::Locked { reason },
            CoreStoreError::Io(_) | CoreStoreError::Sqlite(_) => StoreError::Io { reason },
            CoreStoreError::Closed => StoreError::Closed,
        }
    }
}

/// Why an approval binding does not match what the host expected, or could not be checked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, uniffi::Error)]
pub enum BindingError {
    #[error("invalid JSON: {reason}")]
    InvalidJson { reason: String },
    /// `field` is one of operationDigest, policyDigest, workspaceDigest.
    #[error("{field} mismatch: expected {expected}, the binding says {actual}; decline")]
    Mismatch {
        field: String,
        expected: String,
        actual: String,
    },
    #[error("the binding expired at {expires_at}; decline")]
    Expired { expires_at: String },
}
