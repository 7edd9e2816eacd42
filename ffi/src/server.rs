//! `AppServer` and the raw `Connection`: a host opens one server per state directory and talks
//! JSON-RPC lines over bounded connections, or goes through `Client` (see `client`). Options are
//! one record shared with the C ABI's JSON config, so both boundaries configure the same things.

use crate::delivery::{listener_failed, LISTENER_ERRORS, MAX_BATCH};
use crate::errors::{signed, ListenerError, RecvError, SendError, ServerError};
use crate::kernel::{ForeignKernel, ForeignTools};
use crate::store::{apply_store_security, RolloutStore, StoreKind};
use crate::task::TaskHandle;
use crate::{AgentKernel, ApprovalPolicy, ToolExecutor};
use cc_app_server::engine::{
    AppServer as CoreServer, Connection as CoreConnection, RecvError as CoreRecvError,
    SendError as CoreSendError, ServerConfig,
};
use cc_app_server::rollout::Durability as CoreDurability;
use cc_app_server::scripted::ScriptedKernel;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// When a rollout append counts as done (see docs/rollout-format.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, uniffi::Enum)]
pub enum Durability {
    /// Group commit with fdatasync before any host sees the event (the default).
    Sync,
    /// Written to the OS, fsynced on flush/close: survives a process crash, not a power loss.
    Buffered,
    /// In memory until flush/close.
    Ephemeral,
}

impl From<Durability> for CoreDurability {
    fn from(d: Durability) -> Self {
        match d {
            Durability::Sync => CoreDurability::Sync,
            Durability::Buffered => CoreDurability::Buffered,
            Durability::Ephemeral => CoreDurability::Ephemeral,
        }
    }
}

/// Which set of bounds a server starts from (docs/engine.md, "Default bounds" and "Small
/// devices"); the options' own fields (`inbound_messages`, `max_line_bytes`, …) still win.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, uniffi::Enum)]
pub enum ServerProfile {
    /// The defaults: sized for a desktop or a server (256 connections, 64 running turns,
    /// 1,024 loaded threads, a 32 MiB tail cache).
    #[default]
    Standard,
    /// For phones and watches: 8 connections, 4 running turns, 16 loaded threads, a 512 KiB
    /// tail cache, queues of 64 in / 128 out. An open server with 1,000 threads on disk and 10 loaded
    /// stays within 8 MiB of the host's own memory (docs/bench/mobile.md).
    Compact,
}

/// How a server is opened. Every field but `state_dir` is optional; absent means the default of
/// docs/engine.md, "Default bounds" (JSONL, sync durability, ask for every tool, 1 MiB lines, …).
#[derive(Debug, Clone, Default, uniffi::Record)]
pub struct ServerOptions {
    /// Directory of the rollout store (created 0700; refused if others can write to it).
    pub state_dir: String,
    #[uniffi(default = None)]
    pub store: Option<StoreKind>,
    #[uniffi(default = None)]
    pub durability: Option<Durability>,
    #[uniffi(default = None)]
    pub policy: Option<ApprovalPolicy>,
    /// What approvals are bound to (the workspace digest), e.g. the workspace root.
    #[uniffi(default = None)]
    pub workspace: Option<String>,
    /// JSON script for the built-in scripted kernel (used when no host kernel is given; a thread's
    /// `agentOptions.script` still wins).
    #[uniffi(default = None)]
    pub script_json: Option<String>,
    #[uniffi(default = None)]
    pub approval_timeout_ms: Option<i64>,
    #[uniffi(default = None)]
    pub settle_deadline_ms: Option<i64>,
    #[uniffi(default = None)]
    pub max_line_bytes: Option<i64>,
    #[uniffi(default = None)]
    pub inbound_messages: Option<i32>,
    #[uniffi(default = None)]
    pub outbound_messages: Option<i32>,
    /// Run turns on an OpenAI-compatible model (OpenAI, Ollama, vLLM, llama.cpp, LM Studio…)
    /// instead of the scripted kernel. A host `kernel` passed to `open` still wins. Needs a
    /// library built with the `openai` feature (the wheel and the jar are; mobile builds may not
    /// be: `InvalidConfig` then).
    #[uniffi(default = None)]
    pub openai: Option<OpenAiOptions>,
    /// Run approved tools with the workspace tool set (`read_file`, `write_file`,
    /// `list_directory`, `run_command`) confined to this existing directory, instead of the echo
    /// executor. A host `tools` passed to `open` still wins.
    #[uniffi(default = None)]
    pub workspace_tools_dir: Option<String>,
    /// How long a full outbound queue may go without the host taking a message before the
    /// connection is closed as a slow consumer (default 30 s; a host that keeps reading, however
    /// slowly, is never cut off).
    #[uniffi(default = None)]
    pub outbound_stall_ms: Option<i64>,
    /// Keyed tamper evidence (docs/rollout-format.md): exactly 32 bytes from the host's key store
    /// (iOS Keychain, Android Keystore, an OS keyring). Anchors and periodic seals then carry an
    /// HMAC under it, so history rewritten without the key is detected even with every hash
    /// recomputed. Never written to the state dir or logs. Absent: unkeyed.
    #[uniffi(default = None)]
    pub rollout_key: Option<Vec<u8>>,
    /// Open threads whose head anchor is missing or damaged instead of refusing them; what
    /// nothing vouches for is recorded and reported by `verify` (default: refuse).
    #[uniffi(default = None)]
    pub accept_unanchored: Option<bool>,
    /// The bounds to start from (default `Standard`); `Compact` for small devices. Last, so
    /// positional constructors written before it still mean what they did.
    #[uniffi(default = None)]
    pub profile: Option<ServerProfile>,
}

/// The OpenAI-compatible kernel's settings (docs/kernels.md). A thread's `agentOptions.model` and
/// `agentOptions.instructions` override `model` and `instructions` for that thread.
#[derive(Debug, Clone, Default, uniffi::Record)]
pub struct OpenAiOptions {
    /// The API root, e.g. `https://api.openai.com/v1` or `http://localhost:11434/v1`.
    pub base_url: String,
    pub model: String,
    /// The API key (absent: `CC_APP_SERVER_API_KEY`, else `OPENAI_API_KEY`, else none — what local
    /// servers want). Never recorded, logged or put in an error.
    #[uniffi(default = None)]
    pub api_key: Option<String>,
    /// The system message.
    #[uniffi(default = None)]
    pub instructions: Option<String>,
    #[uniffi(default = None)]
    pub temperature: Option<f64>,
    #[uniffi(default = None)]
    pub max_output_tokens: Option<i32>,
    /// Model requests per turn (default 16); exceeded → the turn fails with `maxStepsExceeded`.
    #[uniffi(default = None)]
    pub max_steps: Option<i32>,
    /// Connect + first byte, and the longest silence mid-stream (default 120 s).
    #[uniffi(default = None)]
    pub request_timeout_ms: Option<i64>,
    /// How long the model may send nothing but keep-alives before the turn fails
    /// `modelStalled` (default 60 s).
    #[uniffi(default = None)]
    pub idle_timeout_ms: Option<i64>,
    /// How long one model call may take in all (default 600 s; `modelDeadlineExceeded`).
    #[uniffi(default = None)]
    pub call_deadline_ms: Option<i64>,
    /// Send the API key over plain http:// to a host that is not loopback (refused unless true).
    #[uniffi(default = None)]
    pub allow_insecure_http: Option<bool>,
}

#[cfg(feature = "openai")]
fn openai_kernel(
    o: &OpenAiOptions,
) -> Result<Arc<dyn cc_app_server::kernel::AgentKernel>, ServerError> {
    use cc_app_server::openai::{OpenAiCompatibleKernel, OpenAiConfig};
    let mut config = OpenAiConfig::new(&o.base_url, &o.model)
        .with_api_key(o.api_key.clone())
        .with_instructions(o.instructions.clone())
        .with_temperature(o.temperature);
    if o.api_key.is_none() {
        config = config.with_api_key_from_env();
    }
    if let Some(n) = o.max_output_tokens {
        let n = u32::try_from(n).ok().filter(|n| *n >= 1).ok_or_else(|| {
            invalid(format!(
                "openai.max_output_tokens must be at least 1 (got {n})"
            ))
        })?;
        config = config.with_max_output_tokens(Some(n));
    }
    if let Some(n) = o.max_steps {
        let n = u32::try_from(n)
            .ok()
            .filter(|n| *n >= 1)
            .ok_or_else(|| invalid(format!("openai.max_steps must be at least 1 (got {n})")))?;
        config = config.with_max_steps(n);
    }
    let positive_ms = |name: &str, ms: i64| {
        u64::try_from(ms)
            .ok()
            .filter(|ms| *ms >= 1)
            .map(Duration::from_millis)
            .ok_or_else(|| invalid(format!("openai.{name} must be at least 1 (got {ms})")))
    };
    if let Some(ms) = o.request_timeout_ms {
        config = config.with_request_timeout(positive_ms("request_timeout_ms", ms)?);
    }
    if let Some(ms) = o.idle_timeout_ms {
        config = config.with_idle_timeout(positive_ms("idle_timeout_ms", ms)?);
    }
    if let Some(ms) = o.call_deadline_ms {
        config = config.with_call_deadline(positive_ms("call_deadline_ms", ms)?);
    }
    config = config.allow_insecure_http(o.allow_insecure_http.unwrap_or(false));
    // The error's text names the setting, never the key.
    let kernel =
        OpenAiCompatibleKernel::new(config).map_err(|e| invalid(format!("openai: {e}")))?;
    Ok(Arc::new(kernel))
}

#[cfg(not(feature = "openai"))]
fn openai_kernel(
    _: &OpenAiOptions,
) -> Result<Arc<dyn cc_app_server::kernel::AgentKernel>, ServerError> {
    Err(invalid(
        "this build of the library has no OpenAI-compatible kernel (cargo feature `openai`); use a build with it or pass your own kernel",
    ))
}

fn invalid(reason: impl Into<String>) -> ServerError {
    ServerError::InvalidConfig {
        reason: reason.into(),
    }
}

impl ServerOptions {
    /// The engine's config for these options; `kernel` / `tools` replace the built-in ones.
    pub(crate) fn to_config(
        &self,
        kernel: Option<Arc<dyn cc_app_server::kernel::AgentKernel>>,
        tools: Option<Arc<dyn cc_app_server::kernel::ToolExecutor>>,
    ) -> Result<ServerConfig, ServerError> {
        if self.state_dir.is_empty() {
            return Err(invalid(
                "state_dir is empty; pass the directory for the rollout",
            ));
        }
        let mut config = match self.profile.unwrap_or_default() {
            ServerProfile::Standard => ServerConfig::new(&self.state_dir),
            ServerProfile::Compact => ServerConfig::compact(&self.state_dir),
        };
        if let Some(store) = self.store {
            config.store = store.into();
        }
        if let Some(d) = self.durability {
            config.store_options.durability = d.into();
        }
        if let Some(p) = self.policy {
            config.policy = p.into();
        }
        if let Some(w) = &self.workspace {
            config.workspace = w.clone();
        }
        if let Some(script) = &self.script_json {
            let script = serde_json::from_str(script)
                .map_err(|e| invalid(format!("script_json is not JSON: {e}")))?;
            // Checked now, so a mistyped step fails the open, not the first turn that runs it.
            let kernel = ScriptedKernel::checked(script)
                .map_err(|e| invalid(format!("script_json: {e}")))?;
            config.kernel = Arc::new(kernel);
        }
        if let Some(o) = &self.openai {
            config.kernel = openai_kernel(o)?;
        }
        if let Some(dir) = &self.workspace_tools_dir {
            // The store's own directory is never a tool's to read or write, wherever it lies.
            let tools = cc_app_server::workspace_tools::WorkspaceTools::new(dir)
                .and_then(|t| t.with_protected(vec![config.state_dir.clone()]))
                .map_err(|e| invalid(format!("workspace_tools_dir {dir:?}: {e}")))?;
            config.tools = Arc::new(tools);
        }
        if let Some(k) = kernel {
            config.kernel = k;
        }
        if let Some(t) = tools {
            config.tools = t;
        }
        let millis = |name: &str, v: i64| {
            u64::try_from(v)
                .map(Duration::from_millis)
                .map_err(|_| invalid(format!("{name} must not be negative (got {v})")))
        };
        if let Some(ms) = self.approval_timeout_ms {
            config.approval_timeout = millis("approval_timeout_ms", ms)?;
        }
        if let Some(ms) = self.settle_deadline_ms {
            config.settle_deadline = millis("settle_deadline_ms", ms)?;
        }
        let positive = |name: &str, v: i64| match usize::try_from(v) {
            Ok(0) | Err(_) => Err(invalid(format!("{name} must be at least 1 (got {v})"))),
            Ok(v) => Ok(v),
        };
        if let Some(v) = self.max_line_bytes {
            config.limits.max_line_bytes = positive("max_line_bytes", v)?;
        }
        if let Some(ms) = self.outbound_stall_ms {
            config.limits.outbound_stall = millis("outbound_stall_ms", ms)?;
        }
        apply_store_security(
            &mut config.store_options,
            self.rollout_key.as_deref(),
            self.accept_unanchored,
        )?;
        if let Some(v) = self.inbound_messages {
            config.limits.inbound_messages = positive("inbound_messages", v.into())?;
        }
        if let Some(v) = self.outbound_messages {
            config.limits.outbound_messages = positive("outbound_messages", v.into())?;
        }
        Ok(config)
    }
}

/// An in-process app server over one state directory.
#[derive(uniffi::Object)]
pub struct AppServer {
    pub(crate) inner: CoreServer,
}

#[uniffi::export]
impl AppServer {
    /// Opens (recovering torn tails and closing turns a previous process left running). `kernel`
    /// replaces the built-in scripted kernel; `tools` replaces the echo tool executor.
    #[uniffi::constructor(default(kernel = None, tools = None))]
    pub fn open(
        options: ServerOptions,
        kernel: Option<Arc<dyn AgentKernel>>,
        tools: Option<Arc<dyn ToolExecutor>>,
    ) -> Result<Arc<AppServer>, ServerError> {
        let kernel = kernel.map(|k| Arc::new(ForeignKernel(k)) as _);
        let tools = tools.map(|t| Arc::new(ForeignTools(t)) as _);
        let inner = CoreServer::open(options.to_config(kernel, tools)?)?;
        Ok(Arc::new(AppServer { inner }))
    }

    /// A raw connection: the host speaks JSON-RPC lines itself (handshake included).
    pub fn connect(&self) -> Result<Arc<Connection>, ServerError> {
        self.inner
            .connect()
            .map(|inner| Arc::new(Connection { inner }))
            .map_err(|e| match e {
                CoreSendError::Overloaded { retry_after_ms } => ServerError::Overloaded {
                    retry_after_ms: i64::try_from(retry_after_ms).unwrap_or(i64::MAX),
                },
                _ => ServerError::ShutDown,
            })
    }

    /// The rollout store this server writes, for listing, reading and verifying threads.
    pub fn store(&self) -> Arc<RolloutStore> {
        Arc::new(RolloutStore::shared(Arc::clone(self.inner.store())))
    }

    /// Changes the approval policy; grants made under the old one lapse.
    pub fn set_policy(&self, policy: ApprovalPolicy) {
        self.inner.set_policy(policy.into());
    }

    /// Changes the workspace approvals are bound to; grants for the old one lapse.
    pub fn set_workspace(&self, workspace: String) {
        self.inner.set_workspace(&workspace);
    }

    /// Tools actually executed since open.
    pub fn tools_executed(&self) -> i64 {
        signed(self.inner.stats().tools_executed.load(Ordering::Relaxed))
    }

    /// The engine's counters and gauges now (counters never go down).
    pub fn stats(&self) -> ServerStats {
        let s = self.inner.stats_snapshot();
        let f = &s.failed_closed;
        ServerStats {
            tools_executed: signed(s.tools_executed),
            ignored_responses: signed(s.ignored_responses),
            closed_slow_consumers: signed(s.closed_slow_consumers),
            listener_errors: signed(LISTENER_ERRORS.load(Ordering::Relaxed)),
            dropped_log_records: crate::log::dropped_log_records(),
            connections_open: signed(s.connections_open),
            connections_refused: signed(s.connections_refused),
            turns_running: signed(s.turns_running),
            turns_queued: signed(s.turns_queued),
            turns_refused_overloaded: signed(s.turns_refused_overloaded),
            runner_threads: signed(s.runner_threads),
            inbound_queued: signed(s.inbound_queued),
            outbound_queued: signed(s.outbound_queued),
            recording_failures: signed(s.recording_failures),
            threads_loaded: signed(s.threads_loaded),
            store_indexed_threads: signed(s.store_indexed_threads),
            store_loaded_threads: signed(s.store_loaded_threads),
            tail_cache_bytes: signed(s.tail_cache_bytes),
            pipeline_waits: signed(s.pipeline_waits),
            dangling_turns_closed: signed(s.dangling_turns_closed),
            failed_closed: FailedClosedStats {
                no_handler: signed(f.no_handler),
                handler_error: signed(f.handler_error),
                timeout: signed(f.timeout),
                expired: signed(f.expired),
                binding_mismatch: signed(f.binding_mismatch),
                nonce_reused: signed(f.nonce_reused),
                unknown_decision: signed(f.unknown_decision),
                transport_closed: signed(f.transport_closed),
            },
        }
    }

    /// Interrupts live turns (waiting for each to settle), closes every connection and flushes
    /// the store. Idempotent. Dropping the last reference does the same.
    pub fn shutdown(&self) {
        self.inner.shutdown();
    }
}

impl Drop for AppServer {
    fn drop(&mut self) {
        self.inner.shutdown();
    }
}

/// The engine's counters as a host sees them.
#[derive(Debug, Clone, PartialEq, Eq, uniffi::Record)]
pub struct ServerStats {
    /// Tools actually executed (only ever after a valid approval or an auto-approve policy).
    pub tools_executed: i64,
    /// Responses from a host that matched no pending server request (late, duplicate, unknown).
    pub ignored_responses: i64,
    /// Connections closed because their host stopped reading.
    pub closed_slow_consumers: i64,
    /// Listener callbacks (this process, every server) that raised; delivery went on.
    pub listener_errors: i64,
    /// Log records dropped because the log listener fell behind (this process).
    pub dropped_log_records: i64,
    pub connections_open: i64,
    /// Connections refused because `max_connections` were open.
    pub connections_refused: i64,
    pub turns_running: i64,
    /// Turns admitted and waiting for a runner.
    pub turns_queued: i64,
    /// turn/start answered -32001 because running and queued turns were at their bounds.
    pub turns_refused_overloaded: i64,
    pub runner_threads: i64,
    /// Messages waiting in every open connection's inbound / outbound queue.
    pub inbound_queued: i64,
    pub outbound_queued: i64,
    /// Events the store could not write (disk full, I/O error).
    pub recording_failures: i64,
    pub threads_loaded: i64,
    /// Threads in the store's in-memory summary index (every thread of the state directory).
    pub store_indexed_threads: i64,
    /// Threads whose store slot (head, anchor state, open files) is loaded; bounded.
    pub store_loaded_threads: i64,
    /// Bytes of event JSON the tail cache holds (bounded; docs/engine.md, "Memory").
    pub tail_cache_bytes: i64,
    /// Times a running turn waited because it had its bound of events in flight.
    pub pipeline_waits: i64,
    /// Turns a dead process left open, closed (`serverRestarted`) when their thread was touched.
    pub dangling_turns_closed: i64,
    /// Approvals that failed closed, by reason.
    pub failed_closed: FailedClosedStats,
}

/// Approvals that failed closed (the tool did not run), by reason.
#[derive(Debug, Clone, PartialEq, Eq, uniffi::Record)]
pub struct FailedClosedStats {
    pub no_handler: i64,
    pub handler_error: i64,
    pub timeout: i64,
    pub expired: i64,
    pub binding_mismatch: i64,
    pub nonce_reused: i64,
    pub unknown_decision: i64,
    pub transport_closed: i64,
}

/// Receives a connection's messages on a delivery thread (see `Connection.listen`).
#[uniffi::export(with_foreign)]
pub trait MessageListener: Send + Sync {
    /// The next JSON-RPC messages from the server (responses, notifications, server requests), in
    /// order, up to `MAX_BATCH` at a time. An error is logged and counted; delivery goes on.
    fn on_messages(&self, messages: Vec<String>) -> Result<(), ListenerError>;
    /// The connection closed; no more messages follow. Not called when the handle is cancelled.
    fn on_closed(&self) -> Result<(), ListenerError>;
}

/// The host's end of one connection: non-blocking bounded send, bounded receive.
#[derive(uniffi::Object)]
pub struct Connection {
    pub(crate) inner: CoreConnection,
}

#[uniffi::export]
impl Connection {
    /// Queues one JSON-RPC message without blocking. `Overloaded` carries how long to wait.
    pub fn send(&self, message: String) -> Result<(), SendError> {
        self.inner.send(&message).map_err(SendError::from)
    }

    /// The next message, waiting up to `timeout_ms` (absent: until one arrives or it closes; a
    /// negative timeout does not wait).
    #[uniffi::method(default(timeout_ms = None))]
    pub fn recv(&self, timeout_ms: Option<i64>) -> Result<String, RecvError> {
        let timeout = timeout_ms.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0)));
        self.inner.recv(timeout).map_err(RecvError::from)
    }

    /// The next message if one is ready.
    pub fn try_recv(&self) -> Option<String> {
        self.inner.try_recv()
    }

    pub fn is_open(&self) -> bool {
        self.inner.is_open()
    }

    /// Closes the connection; pending approvals fail closed. Idempotent.
    pub fn close(&self) {
        self.inner.close();
    }

    /// Delivers every message to `listener` on a background thread until the returned handle is
    /// cancelled or dropped, or the connection closes (then `on_closed` is called once). Do not
    /// mix with `recv` on the same connection: each message goes to exactly one of them.
    pub fn listen(
        self: Arc<Self>,
        listener: Arc<dyn MessageListener>,
    ) -> Result<Arc<TaskHandle>, RecvError> {
        let conn = Arc::clone(&self);
        let waker = Arc::clone(&self);
        TaskHandle::spawn(
            "cc-ffi-conn-listener",
            move || waker.inner.wake_receivers(),
            move |cancelled| {
                while !cancelled.load(Ordering::SeqCst) {
                    match conn.inner.recv_until(cancelled) {
                        Ok(first) => {
                            let mut batch = vec![first];
                            while batch.len() < MAX_BATCH {
                                match conn.inner.try_recv() {
                                    Some(next) => batch.push(next),
                                    None => break,
                                }
                            }
                            // Delivered even when `cancel` came while waiting: these messages are
                            // already taken, and dropping them would lose them for the next reader.
                            if let Err(e) = listener.on_messages(batch) {
                                listener_failed("message", &e);
                            }
                        }
                        Err(CoreRecvError::Timeout) => {}
                        Err(CoreRecvError::Closed) => {
                            if !cancelled.load(Ordering::SeqCst) {
                                if let Err(e) = listener.on_closed() {
                                    listener_failed("message", &e);
                                }
                            }
                            break;
                        }
                    }
                }
            },
        )
        .map_err(|_| RecvError::Closed)
    }
}
