//! Host-implemented kernels and tools. `AgentKernel` and `ToolExecutor` are foreign traits (Swift,
//! Kotlin, Python implement them); the adapters here plug them into the engine. The engine lends
//! a kernel its turn context only for the duration of `run_turn`, so the host gets a `TurnContext`
//! object that forwards to it during the call and refuses (`Expired`) once the call has returned.
//! The lending (`Lease`, `Lent`) and the checks of host JSON (`parse_item`, `parse_delta`,
//! `parse_tool_call`) are plain Rust, shared with the C ABI's `cc_turn` (src/capi/turn.rs).

use crate::errors::{HandlerError, KernelError};
use cc_app_server::kernel::{
    AgentKernel as CoreKernel, KernelError as CoreKernelError, ToolExecutor as CoreTools,
    TurnContext as CoreContext,
};
use cc_app_server::protocol::{
    ItemContent, ItemDelta, ToolCall, ToolResult, ToolResultError, ToolResultOk, UserInput,
};
use serde_json::Value;
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// What the user sent for this turn.
#[derive(Debug, Clone, PartialEq, Eq, uniffi::Record)]
pub struct TurnInput {
    /// Every text input joined with newlines.
    pub text: String,
    /// The wire `UserInput` array as JSON text.
    pub json: String,
}

/// Runs one turn: emit items through `ctx`, ask for tools through `ctx.request_tool` (which
/// passes the approval gate), return when done. Check `ctx.is_cancelled()` often; the engine
/// reports a turn interrupted only after `run_turn` returns. Called on an engine thread.
#[uniffi::export(with_foreign)]
pub trait AgentKernel: Send + Sync {
    fn run_turn(&self, ctx: Arc<TurnContext>, input: TurnInput) -> Result<(), KernelError>;
}

/// Runs an approved tool call and returns its output as JSON text. An error becomes the tool's
/// `error` result (the turn goes on). Called on an engine thread, only after approval.
#[uniffi::export(with_foreign)]
pub trait ToolExecutor: Send + Sync {
    fn execute(
        &self,
        thread_id: String,
        tool: String,
        arguments_json: String,
    ) -> Result<String, HandlerError>;
}

/// The engine's context for one running turn, usable only while that turn's `run_turn` runs.
#[derive(uniffi::Object)]
pub struct TurnContext {
    lent: Arc<Lent>,
    thread_id: String,
    turn_id: String,
}

/// An engine context lent for the duration of one `run_turn` call: plain Rust, held by the uniffi
/// `TurnContext` and by the C ABI's live turns alike, so both reach the core `TurnContext` the
/// same way and refuse (`Expired`) once the call has returned.
pub(crate) struct Lent {
    /// The borrowed engine context; `None` once `run_turn` has returned. Calls hold the read
    /// lock, so the lender waits for in-flight calls before the borrow ends.
    live: RwLock<Option<&'static dyn CoreContext>>,
}

impl Lent {
    /// `f` on the lent context, or `Expired` once the lending call has returned.
    pub(crate) fn with<T>(&self, f: impl FnOnce(&dyn CoreContext) -> T) -> Result<T, KernelError> {
        let live = self.live.read().unwrap_or_else(|p| p.into_inner());
        match *live {
            Some(ctx) => Ok(f(ctx)),
            None => Err(KernelError::Expired),
        }
    }

    /// `with` for a core call that can fail: its error as the surface's `KernelError`.
    pub(crate) fn call<T>(
        &self,
        f: impl FnOnce(&dyn CoreContext) -> Result<T, CoreKernelError>,
    ) -> Result<T, KernelError> {
        self.with(f)?.map_err(from_core)
    }
}

/// Ends a borrow when dropped (also on unwind), before the engine's borrow ends.
pub(crate) struct Lease(Arc<Lent>);

impl Lease {
    /// Lends `ctx` until the returned lease is dropped.
    pub(crate) fn new(ctx: &dyn CoreContext) -> Lease {
        // SAFETY: the 'static reference never outlives `ctx`: it is only reachable through
        // `live`, which `Lease::drop` clears (waiting for every reader) before this function's
        // caller returns — the lease is created and dropped inside the borrow of `ctx`.
        let extended: &'static dyn CoreContext =
            unsafe { std::mem::transmute::<&dyn CoreContext, &'static dyn CoreContext>(ctx) };
        Lease(Arc::new(Lent {
            live: RwLock::new(Some(extended)),
        }))
    }

    /// The lent context, for whoever serves calls during the borrow.
    pub(crate) fn lent(&self) -> Arc<Lent> {
        Arc::clone(&self.0)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        *self.0.live.write().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

fn invalid(what: &str, e: impl std::fmt::Display) -> KernelError {
    KernelError::Invalid {
        reason: format!("{what}: {e}"),
    }
}

/// Parses host-supplied wire JSON and checks it against the schema definition `def` first: the
/// engine trusts what a kernel hands it, so the boundary is where foreign input is checked.
fn wire<T: serde::de::DeserializeOwned>(def: &str, json: &str) -> Result<T, KernelError> {
    let value: Value = serde_json::from_str(json).map_err(|e| invalid(def, e))?;
    cc_agent_protocol::validate_protocol_definition(def, &value).map_err(|e| invalid(def, e))?;
    serde_json::from_value(value).map_err(|e| invalid(def, e))
}

/// A host's item body (`ItemContent`), checked against the schema.
pub(crate) fn parse_item(item_json: &str) -> Result<ItemContent, KernelError> {
    wire("ItemContent", item_json)
}

/// A host's `ItemDelta`, checked against the schema.
pub(crate) fn parse_delta(delta_json: &str) -> Result<ItemDelta, KernelError> {
    wire("ItemDelta", delta_json)
}

/// A host's tool request as a `ToolCall`, checked against the schema.
pub(crate) fn parse_tool_call(tool: String, arguments_json: &str) -> Result<ToolCall, KernelError> {
    let arguments: Value =
        serde_json::from_str(arguments_json).map_err(|e| invalid("arguments", e))?;
    let call = serde_json::json!({"tool": tool, "arguments": arguments});
    wire("ToolCall", &call.to_string())
}

/// A tool result as the wire `ToolResult` JSON handed to a host.
pub(crate) fn tool_result_json(result: &ToolResult) -> Result<String, KernelError> {
    serde_json::to_string(result).map_err(|e| invalid("tool result", e))
}

/// The thread's history as the JSON of docs/kernels.md.
pub(crate) fn history_json(ctx: &dyn CoreContext) -> Result<String, CoreKernelError> {
    ctx.history().map(|h| h.to_json().to_string())
}

fn from_core(e: CoreKernelError) -> KernelError {
    match e {
        CoreKernelError::Cancelled => KernelError::Cancelled,
        CoreKernelError::Failed(reason) => KernelError::Failed { reason },
    }
}

impl TurnContext {
    /// The uniffi face of `lent`, the context `ctx` lent for its `run_turn`.
    fn new(lent: Arc<Lent>, ctx: &dyn CoreContext) -> TurnContext {
        TurnContext {
            lent,
            thread_id: ctx.thread_id().to_string(),
            turn_id: ctx.turn_id().to_string(),
        }
    }
}

#[uniffi::export]
impl TurnContext {
    pub fn thread_id(&self) -> String {
        self.thread_id.clone()
    }

    pub fn turn_id(&self) -> String {
        self.turn_id.clone()
    }

    /// True while `run_turn` is still running (the context is usable).
    pub fn is_live(&self) -> bool {
        self.lent.with(|_| ()).is_ok()
    }

    /// The thread's `agentOptions` from thread/start as JSON text (`null` when none were given).
    pub fn agent_options_json(&self) -> Result<String, KernelError> {
        self.lent.with(|c| c.agent_options().to_string())
    }

    /// The thread's conversation before this turn, assembled from the rollout (from the latest
    /// compaction on; also after a restart and in a fork), as JSON — see docs/kernels.md:
    /// `{"summary", "droppedTurns", "turns": [{"turnId", "input", "status", "entries"}]}`.
    pub fn history_json(&self) -> Result<String, KernelError> {
        self.lent.call(history_json)
    }

    /// A fresh item id, unique within the thread.
    pub fn new_item_id(&self) -> Result<String, KernelError> {
        self.lent.with(|c| c.new_item_id())
    }

    /// Records and announces `item/started`; `item_json` is an item body (`ItemContent`; the engine wraps it in the published `Item`).
    pub fn item_started(&self, item_json: String) -> Result<(), KernelError> {
        let item = parse_item(&item_json)?;
        self.lent.call(|c| c.item_started(item))
    }

    /// Records and announces `item/delta`; `delta_json` is a wire `ItemDelta`.
    pub fn item_delta(&self, item_id: String, delta_json: String) -> Result<(), KernelError> {
        let delta = parse_delta(&delta_json)?;
        self.lent.call(|c| c.item_delta(&item_id, delta))
    }

    /// Records and announces `item/completed`; `item_json` is an item body (`ItemContent`; the engine wraps it in the published `Item`).
    pub fn item_completed(&self, item_json: String) -> Result<(), KernelError> {
        let item = parse_item(&item_json)?;
        self.lent.call(|c| c.item_completed(item))
    }

    /// Asks for a tool through the approval gate, blocking while it decides. Returns the wire
    /// `ToolResult` as JSON (`{"status":"denied",…}` when the gate failed closed). `Cancelled`
    /// when the user cancelled at the approval or the turn was interrupted.
    pub fn request_tool(
        &self,
        item_id: String,
        tool: String,
        arguments_json: String,
    ) -> Result<String, KernelError> {
        let call = parse_tool_call(tool, &arguments_json)?;
        let result = self.lent.call(|c| c.request_tool(&item_id, call))?;
        tool_result_json(&result)
    }

    /// True once the turn has been asked to stop (and always after `run_turn` returned).
    pub fn is_cancelled(&self) -> bool {
        self.lent.with(|c| c.is_cancelled()).unwrap_or(true)
    }

    /// Sleeps up to `ms` (negative: not at all), waking early on cancellation; true when
    /// cancelled.
    pub fn sleep_cancellable(&self, ms: i64) -> bool {
        let ms = u64::try_from(ms).unwrap_or(0);
        self.lent
            .with(|c| c.sleep_cancellable(Duration::from_millis(ms)))
            .unwrap_or(true)
    }
}

/// A foreign `AgentKernel` as the engine's kernel.
pub(crate) struct ForeignKernel(pub(crate) Arc<dyn AgentKernel>);

pub(crate) fn turn_input(input: &[UserInput]) -> TurnInput {
    TurnInput {
        text: input
            .iter()
            .map(|i| match i {
                UserInput::Text(t) => t.text.as_str(),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        json: serde_json::to_string(input).unwrap_or_else(|_| "[]".into()),
    }
}

impl CoreKernel for ForeignKernel {
    fn run_turn(&self, ctx: &dyn CoreContext, input: &[UserInput]) -> Result<(), CoreKernelError> {
        let lease = Lease::new(ctx);
        let turn = Arc::new(TurnContext::new(lease.lent(), ctx));
        let outcome = self.0.run_turn(turn, turn_input(input));
        drop(lease);
        match outcome {
            Ok(()) => Ok(()),
            Err(KernelError::Cancelled) => Err(CoreKernelError::Cancelled),
            Err(KernelError::Failed { reason }) | Err(KernelError::Invalid { reason }) => {
                Err(CoreKernelError::Failed(reason))
            }
            Err(KernelError::Expired) => Err(CoreKernelError::Failed(
                "the kernel used a TurnContext after its turn ended".into(),
            )),
        }
    }
}

/// A foreign `ToolExecutor` as the engine's tool executor.
pub(crate) struct ForeignTools(pub(crate) Arc<dyn ToolExecutor>);

/// The engine's `ShortText` bound for tool error messages.
const MAX_TOOL_ERROR_CHARS: usize = 1024;

pub(crate) fn tool_error(reason: &str) -> ToolResult {
    ToolResult::Error(ToolResultError {
        message: reason.chars().take(MAX_TOOL_ERROR_CHARS).collect(),
    })
}

impl CoreTools for ForeignTools {
    fn execute(&self, thread_id: &str, call: &ToolCall) -> ToolResult {
        match self.0.execute(
            thread_id.to_string(),
            call.tool.clone(),
            call.arguments.to_string(),
        ) {
            Ok(output) => match serde_json::from_str::<Value>(&output) {
                Ok(output) => ToolResult::Ok(ToolResultOk { output }),
                Err(e) => tool_error(&format!("the tool returned invalid JSON: {e}")),
            },
            Err(HandlerError::Failed { reason }) => tool_error(&reason),
        }
    }
}
