//! CC App Server host boundary: the uniffi surface (Swift, Kotlin, Python) and the stable C ABI,
//! both thin layers over the one engine and the one Rust client in `cc-app-server`.
//!
//! Layout: `errors` (the small public error enums), `server` (AppServer, raw Connection,
//! TaskHandle), `client` (the wrapped Rust client, approval handler, notification listener),
//! `kernel` (foreign AgentKernel / ToolExecutor and the call-scoped TurnContext), `store`
//! (RolloutStore), `approval` (digests and binding checks), `log` (the tracing → host log
//! bridge), `capi` (the C ABI; header in `ffi/include/cc_app_server.h`).

uniffi::setup_scaffolding!("cc_app_server");

pub mod approval;
pub mod capi;
pub mod client;
mod delivery;
pub mod errors;
#[cfg(feature = "jni")]
pub mod jni;
pub mod kernel;
pub mod log;
pub mod server;
pub mod store;
mod task;

pub use approval::{ApprovalBinding, ApprovalDecision, ApprovalPolicy, ApprovalRequest};
pub use client::{ApprovalHandler, Client, ClientOptions, NotificationListener};
pub use delivery::MAX_BATCH;
pub use errors::{
    BindingError, ClientError, HandlerError, KernelError, ListenerError, RecvError, SendError,
    ServerError, StoreError,
};
pub use kernel::{AgentKernel, ToolExecutor, TurnContext, TurnInput};
pub use log::{LogLevel, LogListener, LogRecord};
pub use server::{
    AppServer, Connection, FailedClosedStats, MessageListener, OpenAiOptions, ServerOptions,
    ServerProfile, ServerStats,
};
pub use store::{RolloutStore, StoreKind};
pub use task::TaskHandle;

/// The wire protocol version this library speaks (highest).
#[uniffi::export]
pub fn protocol_version() -> i32 {
    i32::try_from(cc_agent_protocol::PROTOCOL_VERSION).unwrap_or(i32::MAX)
}

/// `sha256:` + hex of the canonical schema this library was built against.
#[uniffi::export]
pub fn schema_digest() -> String {
    cc_app_server::protocol::SCHEMA_DIGEST.to_string()
}

/// Features the engine implements and a client may ask for in `initialize`.
#[uniffi::export]
pub fn implemented_features() -> Vec<String> {
    cc_app_server::engine::IMPLEMENTED_FEATURES
        .iter()
        .map(|f| f.to_string())
        .collect()
}

/// This library's version (the workspace version).
#[uniffi::export]
pub fn library_version() -> String {
    env!("CARGO_PKG_VERSION").to_string()
}
