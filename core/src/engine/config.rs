//! What a host chooses when it opens a server: where state lives, which store, how durable, the
//! queue caps of the bounded transport, the kernel, the tools and the approval policy.

use crate::approval::ApprovalPolicy;
use crate::kernel::{AgentKernel, EchoToolExecutor, ToolExecutor};
use crate::rollout::{StoreKind, StoreOptions};
use crate::scripted::ScriptedKernel;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The bounds of docs/engine.md ("Default bounds"), all configurable. Every one is enforced and
/// counted (`AppServer::stats_snapshot`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest inbound message (one line on stdio), in bytes.
    pub max_line_bytes: usize,
    /// Inbound (host → server) queue: messages and bytes; full → -32001 with retry_after_ms.
    pub inbound_messages: usize,
    pub inbound_bytes: usize,
    /// Outbound (server → host) queue: messages and bytes. When full, the engine waits for the
    /// host to take messages; only a host that takes none for `outbound_stall` loses the
    /// connection.
    pub outbound_messages: usize,
    pub outbound_bytes: usize,
    /// How long a full outbound queue may go without the host taking a message before the
    /// connection is closed as a slow consumer.
    pub outbound_stall: Duration,
    /// Entries kept in the idempotency result cache.
    pub idempotency_entries: usize,
    /// Turns whose kernel runs at once (one OS thread each, from a pool).
    pub max_running_turns: usize,
    /// Turns admitted but waiting for a runner (`queued`); one more is -32001.
    pub max_queued_turns: usize,
    /// Open connections (one worker thread each); one more is refused as overloaded.
    pub max_connections: usize,
    /// turn/interrupt requests one connection may have waiting for a kernel to settle; one more
    /// is -32001.
    pub max_pending_interrupts: usize,
    /// Threads kept loaded in memory; idle ones beyond this are unloaded (least recently used
    /// first) and reloaded from the rollout on next use.
    pub max_loaded_threads: usize,
    /// Threads one connection follows (gets notifications for); following one more forgets the
    /// least recently used (`thread/resume` follows it again).
    pub max_followed_threads: usize,
    /// Finished turns each loaded thread remembers in memory (older ones are looked up in the
    /// rollout).
    pub recent_turns: usize,
    /// Approval nonces remembered after use (they also expire with their binding).
    pub max_used_nonces: usize,
    /// Events one running turn may have handed over for recording and not yet delivered; at
    /// the bound the kernel's next call waits (a fast kernel is slowed, never buffered without
    /// limit).
    pub max_inflight_events: usize,
    /// The same bound in bytes of event JSON (roughly counted); one event always fits.
    pub max_inflight_bytes: usize,
    /// Bytes one turn may stream into its rollout: the text of its item deltas (answer,
    /// reasoning, output; other deltas by their JSON) and its tool results' JSON, plus
    /// `EVENT_ENVELOPE_BYTES` for each of those events. The delta that would pass it is refused (not recorded), the
    /// kernel is told to stop, and the turn fails as `outputLimitExceeded`; what was accepted
    /// before stays recorded.
    pub max_turn_output_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_line_bytes: 1 << 20,
            inbound_messages: 256,
            inbound_bytes: 4 << 20,
            outbound_messages: 512,
            outbound_bytes: 8 << 20,
            outbound_stall: Duration::from_secs(30),
            idempotency_entries: 1024,
            max_running_turns: 64,
            max_queued_turns: 256,
            max_connections: 256,
            max_pending_interrupts: 256,
            max_loaded_threads: 1024,
            max_followed_threads: 4096,
            recent_turns: 64,
            max_used_nonces: 65_536,
            max_inflight_events: 1024,
            max_inflight_bytes: 1 << 20,
            max_turn_output_bytes: 8 << 20,
        }
    }
}

impl Limits {
    /// The small-device profile (`ServerConfig::compact`; docs/engine.md, "Small devices"):
    /// queues, caches and pools cut to what one app on a phone or a watch drives. The wire
    /// bounds a peer can see stay as `default()` (a 1 MiB message, 8 MiB of output per turn),
    /// so a thread recorded under one profile reads and resumes under the other.
    pub fn compact() -> Self {
        Limits {
            inbound_messages: 64,
            inbound_bytes: 2 << 20,
            outbound_messages: 128,
            outbound_bytes: 2 << 20,
            idempotency_entries: 128,
            max_running_turns: 4,
            max_queued_turns: 32,
            max_connections: 8,
            max_pending_interrupts: 16,
            max_loaded_threads: 16,
            max_followed_threads: 256,
            recent_turns: 16,
            max_used_nonces: 4096,
            max_inflight_events: 128,
            max_inflight_bytes: 256 << 10,
            ..Limits::default()
        }
    }
}

/// Everything `AppServer::open` needs.
#[derive(Clone)]
pub struct ServerConfig {
    pub state_dir: PathBuf,
    pub store: StoreKind,
    /// Durability, and keyed mode: `key` (a host-supplied `RolloutKey`, never written anywhere)
    /// and `accept_unanchored` (docs/rollout-format.md, "Keyed mode").
    pub store_options: StoreOptions,
    pub limits: Limits,
    pub kernel: Arc<dyn AgentKernel>,
    pub tools: Arc<dyn ToolExecutor>,
    pub policy: ApprovalPolicy,
    /// What the workspace digest binds approvals to (e.g. the workspace root path).
    pub workspace: String,
    /// How long an approval/decide request may stay unanswered (also the binding's expiry).
    pub approval_timeout: Duration,
    /// How long past the expiry the server still listens, so that an answer arriving just too
    /// late is recorded as `expired` (and refused) rather than going unexplained.
    pub approval_grace: Duration,
    /// How long turn/interrupt waits for the kernel to physically stop before answering -32010.
    pub settle_deadline: Duration,
    /// The wire versions this server speaks, lowest and highest.
    pub protocol_versions: (u32, u32),
    pub server_name: String,
    pub server_version: String,
}

impl ServerConfig {
    /// JSONL store, sync durability, default bounds, the scripted kernel (no script: it answers
    /// with one message) and the echo tool executor, asking for every tool.
    pub fn new(state_dir: impl Into<PathBuf>) -> Self {
        ServerConfig {
            state_dir: state_dir.into(),
            store: StoreKind::Jsonl,
            store_options: StoreOptions::default(),
            limits: Limits::default(),
            kernel: Arc::new(ScriptedKernel::default()),
            tools: Arc::new(EchoToolExecutor),
            policy: ApprovalPolicy::AskEveryTime,
            workspace: String::from("default"),
            approval_timeout: Duration::from_secs(60),
            approval_grace: Duration::from_secs(1),
            settle_deadline: Duration::from_secs(2),
            protocol_versions: (1, cc_agent_protocol::PROTOCOL_VERSION),
            server_name: "cc-app-server".into(),
            server_version: env!("CARGO_PKG_VERSION").into(),
        }
    }

    /// `new` with the small-device bounds: `Limits::compact()` and `StoreOptions::compact()`
    /// (docs/engine.md, "Small devices"). Durability, store kind and policy are as `new`.
    pub fn compact(state_dir: impl Into<PathBuf>) -> Self {
        ServerConfig {
            store_options: StoreOptions::compact(),
            limits: Limits::compact(),
            ..ServerConfig::new(state_dir)
        }
    }
}
