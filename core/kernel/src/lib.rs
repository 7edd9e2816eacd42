//! Kernels and tools, the layer above the rollout store. It owns the kernel boundary — what runs a
//! turn (`AgentKernel`) and what runs a tool (`ToolExecutor`) — the approval binding (`approval`:
//! operation digests, nonces, grants), a turn's history as a kernel sees it (`history`), and the
//! implementations: the scripted kernel, the OpenAI-compatible kernel (feature `openai`) and the
//! workspace tools. It may use the protocol types and read the rollout store; it may not reach the
//! engine, its connections or the Graph Kernel (cargo refuses the dependency).
//!
//! A kernel never touches a tool directly — it asks its `TurnContext`, which passes every request
//! through the approval gate — so no kernel, scripted or host-written, can run a tool unapproved.

use cc_app_server_protocol as protocol;
use cc_app_server_rollout as rollout;

pub mod approval;
pub mod history;
#[cfg(feature = "openai")]
pub mod openai;
pub mod scripted;
pub mod workspace_tools;

pub use history::{History, HistoryEntry, HistoryTurn};

/// Levels of arrays and objects a kernel's item, delta or tool call, or a tool's result, may
/// nest (the value itself being the first); the engine refuses to record deeper ones. Recorded
/// values are served back at most 6 levels deeper (thread/read: envelope, result, events, event,
/// payload, item), so every answer stays far inside the 127 levels a wire parser accepts. Stated
/// in the schema (`JsonValue`).
pub const MAX_OUTPUT_DEPTH: usize = 64;

use crate::protocol::{
    ItemContent, ItemDelta, ItemStatus, ToolCall, ToolCallItem, ToolResult, UserInput,
};
use serde_json::{Map, Value};
use std::time::Duration;

/// One tool call as the user sees it: a `toolCall` item started, the call passed through the
/// approval gate (`request_tool`), and the item completed with the status its result implies
/// (declined when it was denied). The result is returned for the kernel to go on with.
pub fn run_tool_call(ctx: &dyn TurnContext, call: &ToolCall) -> Result<ToolResult, KernelError> {
    let id = ctx.new_item_id();
    let item = |status: ItemStatus, result: Option<ToolResult>| {
        ItemContent::ToolCall(ToolCallItem {
            id: id.clone(),
            call: call.clone(),
            status,
            result,
            extra: Map::new(),
        })
    };
    ctx.item_started(item(ItemStatus::InProgress, None))?;
    let result = ctx.request_tool(&id, call.clone())?;
    let status = match &result {
        ToolResult::Ok(_) => ItemStatus::Completed,
        ToolResult::Error(_) => ItemStatus::Failed,
        ToolResult::Denied(_) => ItemStatus::Declined,
    };
    ctx.item_completed(item(status, Some(result.clone())))?;
    Ok(result)
}

/// Why a kernel stopped early.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelError {
    /// The turn was cancelled and the kernel stopped.
    Cancelled,
    /// The kernel failed; the message is shown to the user (keep it free of secrets).
    Failed(String),
}

/// What a running turn can do. Every call records an event durably before it returns.
pub trait TurnContext: Send + Sync {
    fn thread_id(&self) -> &str;
    fn turn_id(&self) -> &str;
    /// The thread's `agentOptions` from thread/start (`Null` when none were given).
    fn agent_options(&self) -> &Value;
    /// A fresh item id, unique within the thread.
    fn new_item_id(&self) -> String;
    fn item_started(&self, item: ItemContent) -> Result<(), KernelError>;
    fn item_delta(&self, item_id: &str, delta: ItemDelta) -> Result<(), KernelError>;
    fn item_completed(&self, item: ItemContent) -> Result<(), KernelError>;
    /// Asks for a tool. Blocks while the approval gate decides; returns `Denied` when it fails
    /// closed. `Err(Cancelled)` when the user cancelled at the approval or the turn was interrupted.
    fn request_tool(&self, item_id: &str, call: ToolCall) -> Result<ToolResult, KernelError>;
    /// True once the turn has been asked to stop.
    fn is_cancelled(&self) -> bool;
    /// Sleeps up to `duration`, waking early on cancellation; true when cancelled.
    fn sleep_cancellable(&self, duration: Duration) -> bool;

    /// The thread's conversation before this turn, assembled from the rollout from the latest
    /// compaction on (also after a restart, and in a fork up to its fork point). Contexts that
    /// keep no history return an empty one.
    fn history(&self) -> Result<crate::history::History, KernelError> {
        Ok(crate::history::History::default())
    }
    /// The tools the engine's executor offers, so a model can be told about them.
    fn tool_specs(&self) -> Vec<ToolSpec> {
        Vec::new()
    }
    /// The machine-readable code of the turn's error if `run_turn` then returns `Failed`
    /// (otherwise `kernelFailed`): a short camelCase word such as `modelUnauthorized`.
    fn set_error_code(&self, _code: &str) {}
}

/// Runs one turn. Implementations must observe `is_cancelled` promptly; the engine only reports a
/// turn as interrupted once `run_turn` has returned.
pub trait AgentKernel: Send + Sync {
    fn run_turn(&self, ctx: &dyn TurnContext, input: &[UserInput]) -> Result<(), KernelError>;

    /// Writes the summary `thread/compact` records when the caller supplies none. `Ok(None)`:
    /// this kernel cannot (the caller must pass one). Runs off the connection's thread.
    fn summarize(
        &self,
        _thread_id: &str,
        _agent_options: &Value,
        _history: &crate::history::History,
    ) -> Result<Option<String>, KernelError> {
        Ok(None)
    }
}

/// Runs an approved tool call.
pub trait ToolExecutor: Send + Sync {
    fn execute(&self, thread_id: &str, call: &ToolCall) -> ToolResult;

    /// `execute` for a call that may write only inside `write_scope` (workspace-relative paths,
    /// `*` for all): a graph node's declared scope. An executor that writes files must check the
    /// path it actually resolves (symlinks followed), in the same step that opens it. The default
    /// runs `execute`: the graph has already refused a call whose named path lies outside.
    fn execute_scoped(
        &self,
        thread_id: &str,
        call: &ToolCall,
        write_scope: &[String],
    ) -> ToolResult {
        let _ = write_scope;
        self.execute(thread_id, call)
    }

    /// The turn on `thread_id` was interrupted (or the server is stopping): stop what runs for
    /// it now — a command, say — instead of at its own deadline. The call that was running
    /// still returns its result. Nothing to stop by default.
    fn interrupt(&self, thread_id: &str) {
        let _ = thread_id;
    }

    /// The tools this executor runs, for kernels that tell a model about them (none by default).
    fn tool_specs(&self) -> Vec<ToolSpec> {
        Vec::new()
    }
}

/// One tool as a model is told about it: the engine's tool name, what it does, and a JSON Schema
/// of its arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub parameters: Value,
}

/// A tool executor that echoes its arguments: what the demo and the fixtures use.
#[derive(Debug, Default)]
pub struct EchoToolExecutor;

impl ToolExecutor for EchoToolExecutor {
    fn execute(&self, _thread_id: &str, call: &ToolCall) -> ToolResult {
        ToolResult::Ok(crate::protocol::ToolResultOk {
            output: serde_json::json!({"tool": call.tool, "echo": call.arguments}),
        })
    }
}

thread_local! {
    /// What a `summarize` on this thread may ask to know whether to give up.
    static SUMMARY_CANCEL: std::cell::RefCell<Option<Box<dyn Fn() -> bool>>> =
        const { std::cell::RefCell::new(None) };
}

/// Whether the `thread/compact` this thread is writing a summary for was given up (the server
/// is shutting down or the asking connection closed). `AgentKernel::summarize` has no cancel
/// flag of its own: a kernel whose summary call may take long polls this and returns
/// `KernelError::Cancelled` (the OpenAI-compatible kernel does, every 5 ms, and closes the
/// model's connection). False outside a compaction.
pub fn summary_cancelled() -> bool {
    SUMMARY_CANCEL.with(|c| c.borrow().as_ref().is_some_and(|f| f()))
}

/// Runs `f` (a call into `AgentKernel::summarize`) with `cancelled` answering
/// `summary_cancelled` on this thread meanwhile.
pub fn with_summary_cancel<R>(cancelled: impl Fn() -> bool + 'static, f: impl FnOnce() -> R) -> R {
    struct Reset(Option<Box<dyn Fn() -> bool>>);
    impl Drop for Reset {
        fn drop(&mut self) {
            let previous = self.0.take();
            SUMMARY_CANCEL.with(|c| *c.borrow_mut() = previous);
        }
    }
    let previous = SUMMARY_CANCEL.with(|c| c.borrow_mut().replace(Box::new(cancelled)));
    let _reset = Reset(previous);
    f()
}
