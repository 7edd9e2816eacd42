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

    /// `new`, refusing a script that could not run (see `validate`): hosts open with it, so a
    /// mistyped step is reported when the server opens, not when a turn first runs it.
    pub fn checked(script: Value) -> Result<Self, String> {
        Self::validate(&script)?;
        Ok(ScriptedKernel { script })
    }

    /// Checks a script's shape: `{"steps": [...]}` with every step of a known `type` and its
    /// members of the right types. The error names the step (by index) and what is wrong.
    pub fn validate(script: &Value) -> Result<(), String> {
        let steps = script
            .get("steps")
            .and_then(Value::as_array)
            .ok_or("a script is {\"steps\": [step, ...]}; this one has no \"steps\" array")?;
        for (i, step) in steps.iter().enumerate() {
            validate_step(step).map_err(|e| format!("script step {i}: {e}"))?;
        }
        Ok(())
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

/// The step types a script may use, as the module docs list them.
const STEP_TYPES: &[&str] = &[
    "message",
    "reasoning",
    "tool",
    "sleep",
    "fail",
    "ignoreCancel",
    "echo",
];

fn validate_step(step: &Value) -> Result<(), String> {
    let Some(obj) = step.as_object() else {
        return Err(format!("a step is an object with a \"type\", not {step}"));
    };
    let kind = match obj.get("type") {
        Some(Value::String(t)) if STEP_TYPES.contains(&t.as_str()) => t.as_str(),
        Some(Value::String(t)) => {
            return Err(format!(
                "unknown step type {t:?}; the types are {}",
                STEP_TYPES.join(", ")
            ))
        }
        _ => return Err("a step needs a \"type\" string".into()),
    };
    let string = |name: &str, required: bool| match obj.get(name) {
        None if !required => Ok(()),
        Some(Value::String(_)) => Ok(()),
        Some(_) => Err(format!("{name:?} of a {kind} step is a string")),
        None => Err(format!("a {kind} step needs {name:?} (a string)")),
    };
    let count = |name: &str| match obj.get(name) {
        None => Ok(()),
        Some(v) if v.as_u64().is_some() => Ok(()),
        Some(v) => Err(format!(
            "{name:?} of a {kind} step is a whole number of at least 0, not {v}"
        )),
    };
    match kind {
        "message" => {
            string("text", false)?;
            count("chunks")?;
        }
        "reasoning" => string("text", false)?,
        "tool" => {
            string("tool", true)?;
            if !obj.get("arguments").is_none_or(Value::is_object) {
                return Err("\"arguments\" of a tool step is an object".into());
            }
        }
        "sleep" | "ignoreCancel" => count("ms")?,
        "fail" => string("message", false)?,
        _ => {}
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_documented_step_validates_and_mistakes_are_named_by_index() {
        let good = json!({"steps": [
            {"type": "message", "text": "hi", "chunks": 3}, {"type": "reasoning", "text": "r"},
            {"type": "tool", "tool": "fs.write", "arguments": {"path": "a"}}, {"type": "sleep", "ms": 5},
            {"type": "fail"}, {"type": "fail", "message": "m"}, {"type": "ignoreCancel", "ms": 1},
            {"type": "echo"}
        ]});
        ScriptedKernel::validate(&good).unwrap();
        assert!(ScriptedKernel::checked(ScriptedKernel::demo_script()).is_ok());
        let bad = |steps: Value| ScriptedKernel::validate(&json!({ "steps": steps })).unwrap_err();
        let e = bad(json!([{"type": "echo"}, {"type": "mesage", "text": "x"}]));
        assert!(
            e.starts_with("script step 1: unknown step type \"mesage\""),
            "{e}"
        );
        assert!(e.contains("message, reasoning, tool"), "{e}");
        assert!(bad(json!([{"text": "no type"}])).contains("needs a \"type\""));
        assert!(bad(json!(["echo"])).contains("a step is an object"));
        assert!(bad(json!([{"type": "tool"}])).contains("needs \"tool\""));
        assert!(
            bad(json!([{"type": "tool", "tool": "t", "arguments": [1]}])).contains("is an object")
        );
        assert!(bad(json!([{"type": "sleep", "ms": -1}])).contains("whole number"));
        assert!(bad(json!([{"type": "sleep", "ms": "5"}])).contains("whole number"));
        assert!(bad(json!([{"type": "message", "text": 5}])).contains("is a string"));
        let e = ScriptedKernel::validate(&json!({"step": []})).unwrap_err();
        assert!(e.contains("no \"steps\" array"), "{e}");
    }
}
