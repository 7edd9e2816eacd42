//! Turning our world into the Chat Completions dialect: the thread's history into `messages`,
//! our tool names (which may hold `.` and `:`) into the API's `^[a-zA-Z0-9_-]{1,64}$` and back,
//! and tool results into `role: tool` messages the model can read.

use crate::history::{History, HistoryEntry};
use crate::protocol::{ToolCall, ToolResult, UserInput};
use crate::ToolSpec;
use serde_json::{json, Value};
use std::collections::HashMap;

/// A bidirectional map between our tool names and names the API accepts.
#[derive(Debug, Default, Clone)]
pub struct ToolNames {
    to_api: HashMap<String, String>,
    from_api: HashMap<String, String>,
}

fn api_safe(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl ToolNames {
    pub fn new(specs: &[ToolSpec]) -> Self {
        let mut names = ToolNames::default();
        for spec in specs {
            let mut api = if api_safe(&spec.name) {
                spec.name.clone()
            } else {
                let cleaned: String = spec
                    .name
                    .chars()
                    .map(|c| {
                        if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                            c
                        } else {
                            '_'
                        }
                    })
                    .take(55)
                    .collect();
                // A short digest keeps `fs.write` and `fs:write` apart after cleaning.
                let digest = &cc_agent_protocol::sha256_hex(spec.name.as_bytes())[..8];
                format!("{cleaned}_{digest}")
            };
            while names.from_api.contains_key(&api) {
                let digest = cc_agent_protocol::sha256_hex(api.as_bytes());
                api = format!("{}_{}", &api[..api.len().min(55)], &digest[..8]);
            }
            names.to_api.insert(spec.name.clone(), api.clone());
            names.from_api.insert(api, spec.name.clone());
        }
        names
    }

    pub fn api_name(&self, ours: &str) -> Option<&str> {
        self.to_api.get(ours).map(String::as_str)
    }

    pub fn our_name(&self, api: &str) -> Option<&str> {
        self.from_api.get(api).map(String::as_str)
    }
}

/// The `tools` member of a request.
pub fn tools_json(specs: &[ToolSpec], names: &ToolNames) -> Vec<Value> {
    specs
        .iter()
        .filter_map(|s| {
            let name = names.api_name(&s.name)?;
            Some(json!({"type": "function", "function": {
                "name": name, "description": s.description, "parameters": s.parameters,
            }}))
        })
        .collect()
}

pub fn user_text(input: &[UserInput]) -> String {
    input
        .iter()
        .map(|i| match i {
            UserInput::Text(t) => t.text.as_str(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Cuts `text` to at most `max` bytes on a character boundary, saying so.
pub fn cap(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}\n[cut: {} of {} bytes shown]",
        &text[..end],
        end,
        text.len()
    )
}

/// What the model reads back for a tool's result.
pub fn tool_result_text(result: Option<&ToolResult>, max: usize) -> String {
    match result {
        Some(ToolResult::Ok(ok)) => match &ok.output {
            Value::String(s) => cap(s, max),
            other => cap(&other.to_string(), max),
        },
        Some(ToolResult::Error(e)) => format!("The tool failed: {}", e.message),
        Some(ToolResult::Denied(d)) => format!(
            "The user denied this tool call, so it did not run ({}). Do not retry it unchanged; \
             continue without it or ask the user.",
            d.reason
        ),
        None => "The tool did not run: the turn ended before it could.".into(),
    }
}

/// An assistant message carrying tool calls, in the API's shape.
pub fn assistant_with_calls(text: Option<&str>, calls: &[(String, String, String)]) -> Value {
    let calls: Vec<Value> = calls
        .iter()
        .map(|(id, name, args)| {
            json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}})
        })
        .collect();
    json!({"role": "assistant", "content": text.filter(|t| !t.is_empty()), "tool_calls": calls})
}

/// The history as messages, oldest first. Tool calls of tools no longer offered are still
/// shown (under a safe name) so the model sees what it did.
pub fn history_messages(history: &History, names: &ToolNames, max_tool_bytes: usize) -> Vec<Value> {
    let mut out = Vec::new();
    if let Some(summary) = &history.summary {
        out.push(json!({"role": "user", "content": format!(
            "Summary of the conversation so far (older messages were compacted):\n{summary}")}));
        out.push(json!({"role": "assistant", "content": "Understood; I will continue from that summary."}));
    }
    if history.dropped_turns > 0 {
        out.push(json!({"role": "user", "content": format!(
            "[{} older turns of this conversation were left out to fit the context window.]",
            history.dropped_turns)}));
        out.push(json!({"role": "assistant", "content": "Understood."}));
    }
    for turn in &history.turns {
        out.push(json!({"role": "user", "content": turn.user_text()}));
        let mut pending_text: Option<String> = None;
        let mut i = 0;
        let entries = &turn.entries;
        while i < entries.len() {
            match &entries[i] {
                HistoryEntry::Reasoning { .. } => {}
                HistoryEntry::AgentMessage { text, complete, .. } => {
                    if let Some(t) = pending_text.take() {
                        out.push(json!({"role": "assistant", "content": t}));
                    }
                    let text = if *complete {
                        text.clone()
                    } else {
                        format!("{text} [this answer was cut off]")
                    };
                    pending_text = Some(text);
                }
                HistoryEntry::ToolCall { .. } => {
                    // A run of consecutive tool calls is one assistant message, then the results.
                    let mut calls = Vec::new();
                    let mut results = Vec::new();
                    while let Some(HistoryEntry::ToolCall {
                        item_id,
                        call,
                        result,
                    }) = entries.get(i)
                    {
                        let name = names
                            .api_name(&call.tool)
                            .map(str::to_string)
                            .unwrap_or_else(|| {
                                ToolNames::new(&[spec_for(call)])
                                    .api_name(&call.tool)
                                    .unwrap_or("tool")
                                    .to_string()
                            });
                        calls.push((item_id.clone(), name, call.arguments.to_string()));
                        results.push(json!({"role": "tool", "tool_call_id": item_id,
                            "content": tool_result_text(result.as_ref(), max_tool_bytes)}));
                        i += 1;
                    }
                    out.push(assistant_with_calls(pending_text.take().as_deref(), &calls));
                    out.extend(results);
                    continue;
                }
            }
            i += 1;
        }
        if let Some(t) = pending_text.take() {
            out.push(json!({"role": "assistant", "content": t}));
        }
    }
    out
}

fn spec_for(call: &ToolCall) -> ToolSpec {
    ToolSpec {
        name: call.tool.clone(),
        description: String::new(),
        parameters: Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: String::new(),
            parameters: json!({"type": "object"}),
        }
    }

    #[test]
    fn tool_names_map_to_the_api_pattern_and_back() {
        let long = "a".repeat(100);
        let specs = [
            spec("read_file"),
            spec("fs.write"),
            spec("fs:write"),
            spec(&long),
        ];
        let names = ToolNames::new(&specs);
        assert_eq!(names.api_name("read_file"), Some("read_file"));
        let mut seen = std::collections::HashSet::new();
        for s in &specs {
            let api = names.api_name(&s.name).unwrap();
            assert!(api_safe(api), "{api}");
            assert!(seen.insert(api.to_string()), "collision on {api}");
            assert_eq!(names.our_name(api), Some(s.name.as_str()));
        }
        assert_eq!(names.our_name("nope"), None);
    }
}
