//! What the Graph Kernel's host needs of the engine it runs in, and nothing more: two traits the
//! engine implements (core/src/engine/attempt.rs). The graph modules name no engine type, so the
//! dependency runs one way: the engine calls the graph host (graph/* requests, `resume` at open,
//! `AppServer::graph()`), and the graph reaches back only through `GraphEngine` and `Follower`.
//! This module is the bottom of the graph host: it names nothing of the crate above the types.

use crate::kernel::AgentKernel;
use crate::protocol::{ToolResult, TurnError, TurnStatus};
use crate::rollout::{HeaderExtra, RolloutStore, ThreadStart, MAX_READ_LIMIT};
use serde_json::Value;
use std::any::Any;
use std::sync::{Arc, Weak};

/// The engine as the graph host sees it.
pub trait GraphEngine: Send + Sync {
    /// Whether the server has begun shutting down (no new run starts).
    fn is_shut_down(&self) -> bool;
    /// The server's kernel, which an agent node's attempt runs.
    fn kernel(&self) -> &dyn AgentKernel;
    /// The server's thread store, where each attempt's thread lives.
    fn thread_store(&self) -> &dyn RolloutStore;
    /// Runs one attempt as an ordinary turn on a thread of its own (created from `attempt`,
    /// archived when the turn ends), through the engine's approval gate, with `kernel`.
    fn run_attempt(
        self: Arc<Self>,
        attempt: AttemptTurn<'_>,
        kernel: &dyn AgentKernel,
    ) -> Result<AttemptEnd, String>;
    /// Sends one notification text to a follower; a follower that stopped reading is closed by
    /// the engine as any slow consumer is.
    fn deliver(&self, to: &dyn Follower, text: String);

    /// The tool result the engine recorded for `item_id` on `thread_id`, if it did: the
    /// evidence a restart (or an interrupted call) reconciles an effect from.
    fn recorded_tool_result(&self, thread_id: &str, item_id: &str) -> Option<ToolResult> {
        let mut after = 0;
        loop {
            let page = self
                .thread_store()
                .read(thread_id, after, MAX_READ_LIMIT)
                .ok()?;
            for e in &page.events {
                if e.kind() == "toolResult"
                    && e.payload.get("itemId").and_then(Value::as_str) == Some(item_id)
                {
                    return serde_json::from_value(e.payload.get("result")?.clone()).ok();
                }
            }
            match page.events.last() {
                Some(last) if page.has_more => after = last.seq,
                _ => return None,
            }
        }
    }
}

/// A connection following a run: where its notifications go and whose approvals its attempts ask.
pub trait Follower: Any + Send + Sync {
    fn is_open(&self) -> bool;
    /// Whether the connection negotiated `feature` at initialize.
    fn has_feature(&self, feature: &str) -> bool;
}

/// What stops a running attempt's turn (the engine's turn, seen from the graph).
pub trait TurnCancel: Send + Sync {
    fn cancel(&self);
}

/// One attempt's turn, as the graph asks the engine to run it.
pub struct AttemptTurn<'a> {
    /// The attempt's thread (its id is the attempt's, fixed by the run's log).
    pub thread: ThreadStart,
    pub extra: HeaderExtra,
    /// The agent options the thread runs with (`null`: the server's).
    pub agent_options: serde_json::Value,
    pub turn_id: String,
    pub text: String,
    /// The node's write scope, checked by the executor against the path a tool resolves.
    pub write_scope: &'a [String],
    /// The connection the attempt's approvals are asked of (none: the server's policy decides).
    pub owner: Weak<dyn Follower>,
    /// Told the turn's handle once the turn is recorded as started, before the kernel runs.
    pub started: &'a dyn Fn(Arc<dyn TurnCancel>),
}

/// How the attempt's turn ended.
pub struct AttemptEnd {
    pub status: TurnStatus,
    pub error: Option<TurnError>,
}

/// A follower that never was: the owner of a run nobody connected started (a restart, a Rust host).
struct Nobody;

impl Follower for Nobody {
    fn is_open(&self) -> bool {
        false
    }
    fn has_feature(&self, _: &str) -> bool {
        false
    }
}

/// No follower (`Weak::new()` needs a sized type).
pub fn nobody() -> Weak<dyn Follower> {
    Weak::<Nobody>::new()
}

/// Whether two followers are the same connection.
pub fn same_follower(a: &Weak<dyn Follower>, b: &Arc<dyn Follower>) -> bool {
    std::ptr::addr_eq(a.as_ptr(), Arc::as_ptr(b))
}
