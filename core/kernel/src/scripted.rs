//! `ScriptedKernel`: a deterministic kernel driven by a JSON script, so the demo, the tests and the
//! fixtures can exercise every path of the engine (deltas, approvals, sleeps, failures, a kernel
//! that ignores cancellation) without a model.
//!
//! Script: `{"steps": [step, …]}` where a step is one of
//! `{"type":"message","text":…,"chunks":N}`, `{"type":"reasoning","text":…}`,
//! `{"type":"tool","tool":…,"arguments":…}`, `{"type":"sleep","ms":N}`,
//! `{"type":"fail","message":…}`, `{"type":"ignoreCancel","ms":N}` (keeps running for N ms even
//! when cancelled), `{"type":"echo"}` (repeats the user's text). The script comes from the thread's
//! `agentOptions.script`, else the kernel's own.

use crate::protocol::{
    AgentMessageItem, ItemContent, ItemDelta, ReasoningItem, TextDelta, ToolCall, UserInput,
};
use crate::{AgentKernel, KernelError, TurnContext};
use serde_json::{json, Map, Value};
use std::time::{Duration, Instant};

/// See the module docs.
#[derive(Debug, Clone)]
pub struct ScriptedKernel {
    script: Value,
}

impl Default for ScriptedKernel {
    fn default() -> Self {
        ScriptedKernel {
            script: json!({"steps": [{"type": "echo"}]}),
        }
    }
}

impl ScriptedKernel {
    /// A kernel that runs `script` for threads that bring none of their own.
    pub fn new(script: Value) -> Self {
        ScriptedKernel { script }
    }

    /// The demo's script: reasoning, one tool that needs approval, then an answer in chunks.
    pub fn demo_script() -> Value {
        json!({"steps": [
            {"type": "reasoning", "text": "The user wants a file written; that needs approval."},
            {"type": "tool", "tool": "fs.write", "arguments": {"path": "notes/hello.txt", "text": "hello from the demo"}},
            {"type": "message", "text": "I wrote notes/hello.txt after you approved it.", "chunks": 4}
        ]})
    }
}

fn check(ctx: &dyn TurnContext) -> Result<(), KernelError> {
    if ctx.is_cancelled() {
        Err(KernelError::Cancelled)
    } else {
        Ok(())
    }
}

fn message(ctx: &dyn TurnContext, text: &str, chunks: usize) -> Result<(), KernelError> {
    let id = ctx.new_item_id();
    let item = |text: &str| {
        ItemContent::AgentMessage(AgentMessageItem {
            id: id.clone(),
            text: text.into(),
            extra: Map::new(),
        })
    };
    ctx.item_started(item(""))?;
    let chars: Vec<char> = text.chars().collect();
    let size = chars.len().div_ceil(chunks.max(1)).max(1);
    for piece in chars.chunks(size) {
        check(ctx)?;
        let delta = ItemDelta::Text(TextDelta {
            text: piece.iter().collect(),
            extra: Map::new(),
        });
        ctx.item_delta(&id, delta)?;
    }
    ctx.item_completed(item(text))
}

impl AgentKernel for ScriptedKernel {
    fn run_turn(&self, ctx: &dyn TurnContext, input: &[UserInput]) -> Result<(), KernelError> {
        let script = ctx
            .agent_options()
            .get("script")
            .filter(|s| !s.is_null())
            .unwrap_or(&self.script);
        let steps = script
            .get("steps")
            .and_then(Value::as_array)
            .ok_or_else(|| KernelError::Failed("script has no steps array".into()))?;
        let user_text: String = input
            .iter()
            .map(|i| match i {
                UserInput::Text(t) => t.text.as_str(),
            })
            .collect::<Vec<_>>()
            .join("\n");
        for step in steps {
            // An ignoreCancel step models a kernel already stuck in a blocking call: it does not
            // look at the cancel flag even on the way in.
            if step.get("type").and_then(Value::as_str) != Some("ignoreCancel") {
                check(ctx)?;
            }
            let text = step.get("text").and_then(Value::as_str).unwrap_or_default();
            let ms = step.get("ms").and_then(Value::as_u64).unwrap_or(0);
            match step.get("type").and_then(Value::as_str) {
                Some("echo") => message(ctx, &format!("You said: {user_text}"), 1)?,
                Some("message") => {
                    let chunks = step.get("chunks").and_then(Value::as_u64).unwrap_or(1) as usize;
                    message(ctx, text, chunks)?
                }
                Some("reasoning") => {
                    let item = ItemContent::Reasoning(ReasoningItem {
                        id: ctx.new_item_id(),
                        text: text.into(),
                        extra: Map::new(),
                    });
                    ctx.item_started(item.clone())?;
                    ctx.item_completed(item)?;
                }
                Some("tool") => {
                    let call: ToolCall = serde_json::from_value(json!({
                        "tool": step.get("tool").cloned().unwrap_or(Value::Null),
                        "arguments": step.get("arguments").cloned().unwrap_or(Value::Null),
                    }))
                    .map_err(|e| KernelError::Failed(format!("bad tool step: {e}")))?;
                    crate::run_tool_call(ctx, &call)?;
                }
                Some("sleep") => {
                    if ctx.sleep_cancellable(Duration::from_millis(ms)) {
                        return Err(KernelError::Cancelled);
                    }
                }
                Some("ignoreCancel") => {
                    // Deliberately deaf to cancellation: models a kernel stuck in a blocking call.
                    let until = Instant::now() + Duration::from_millis(ms);
                    while Instant::now() < until {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
                Some("fail") => {
                    let message = step
                        .get("message")
                        .and_then(Value::as_str)
                        .unwrap_or("scripted failure");
                    return Err(KernelError::Failed(message.into()));
                }
                other => {
                    return Err(KernelError::Failed(format!(
                        "unknown script step {:?}",
                        other.unwrap_or("(none)")
                    )))
                }
            }
        }
        Ok(())
    }
}
