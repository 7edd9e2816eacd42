//! A thread's conversation as a kernel needs it — user inputs, assistant messages, tool calls with
//! their results, in order — assembled from the rollout rather than kept in memory, so it is the
//! same after a restart and in a fork (whose log holds copies up to the fork point). The thread's
//! `agentOptions` live in its header for the same reason (see threads.rs).

use crate::protocol::{
    EventPayload, ItemContent, ItemDelta, ToolCall, ToolResult, TurnStatus, UserInput,
};
use crate::rollout::{RolloutStore, StoreError, MAX_READ_LIMIT};
use serde_json::Value;
use std::collections::HashMap;

/// The conversation before the running turn, oldest first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct History {
    /// The latest compaction's summary: what came before `turns` (they start after it).
    pub summary: Option<String>,
    pub turns: Vec<HistoryTurn>,
    /// Turns dropped from the front by [`History::retain_newest`].
    pub dropped_turns: usize,
}

/// One past turn.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryTurn {
    pub turn_id: String,
    pub input: Vec<UserInput>,
    pub entries: Vec<HistoryEntry>,
    /// How it ended (`None`: no terminal event seen, e.g. cut off by the fork point).
    pub status: Option<TurnStatus>,
}

/// What the agent produced in a past turn.
#[derive(Debug, Clone, PartialEq)]
pub enum HistoryEntry {
    /// `complete: false` — the item never completed (stream cut, interrupt): `text` is what its
    /// deltas delivered.
    AgentMessage {
        item_id: String,
        text: String,
        complete: bool,
    },
    Reasoning {
        item_id: String,
        text: String,
    },
    /// `result: None` — the tool was requested but no result was recorded.
    ToolCall {
        item_id: String,
        call: ToolCall,
        result: Option<ToolResult>,
    },
}

impl HistoryTurn {
    /// The turn's text inputs joined with newlines.
    pub fn user_text(&self) -> String {
        self.input
            .iter()
            .map(|i| match i {
                UserInput::Text(t) => t.text.as_str(),
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Bytes of text this turn carries (a cheap stand-in for its token cost).
    pub fn approx_bytes(&self) -> usize {
        let entries: usize =
            self.entries
                .iter()
                .map(|e| match e {
                    HistoryEntry::AgentMessage { text, .. }
                    | HistoryEntry::Reasoning { text, .. } => text.len(),
                    HistoryEntry::ToolCall { call, result, .. } => {
                        call.arguments.to_string().len()
                            + result
                                .as_ref()
                                .map(|r| serde_json::to_string(r).map(|s| s.len()).unwrap_or(0))
                                .unwrap_or(0)
                            + 64
                    }
                })
                .sum();
        self.user_text().len() + entries + 16
    }
}

impl History {
    /// The history as JSON, for hosts that run their own model through the FFI:
    /// `{"summary", "droppedTurns", "turns": [{"turnId", "input", "status", "entries": [...]}]}`
    /// where each entry is `{"type": "agentMessage", "itemId", "text", "complete"}`,
    /// `{"type": "reasoning", "itemId", "text"}` or `{"type": "toolCall", "itemId", "call",
    /// "result"}` (wire `ToolCall` / `ToolResult`; `result` null when none was recorded).
    pub fn to_json(&self) -> Value {
        let entry = |e: &HistoryEntry| match e {
            HistoryEntry::AgentMessage {
                item_id,
                text,
                complete,
            } => {
                serde_json::json!({"type": "agentMessage", "itemId": item_id, "text": text, "complete": complete})
            }
            HistoryEntry::Reasoning { item_id, text } => {
                serde_json::json!({"type": "reasoning", "itemId": item_id, "text": text})
            }
            HistoryEntry::ToolCall {
                item_id,
                call,
                result,
            } => {
                serde_json::json!({"type": "toolCall", "itemId": item_id, "call": call, "result": result})
            }
        };
        let turns: Vec<Value> = self
            .turns
            .iter()
            .map(|t| {
                serde_json::json!({
                    "turnId": t.turn_id,
                    "input": t.input,
                    "status": t.status,
                    "entries": t.entries.iter().map(entry).collect::<Vec<_>>(),
                })
            })
            .collect();
        serde_json::json!({"summary": self.summary, "droppedTurns": self.dropped_turns, "turns": turns})
    }

    pub fn is_empty(&self) -> bool {
        self.summary.is_none() && self.turns.is_empty()
    }

    /// Bytes of text the whole history carries.
    pub fn approx_bytes(&self) -> usize {
        self.summary.as_ref().map_or(0, String::len)
            + self
                .turns
                .iter()
                .map(HistoryTurn::approx_bytes)
                .sum::<usize>()
    }

    /// Cuts the oldest turns until the history fits in `budget_bytes`, keeping the newest; the
    /// summary is kept (it is the only trace of what came before). Returns the turns dropped.
    pub fn retain_newest(&mut self, budget_bytes: usize) -> usize {
        let mut total = self.approx_bytes();
        let mut drop = 0;
        while total > budget_bytes && drop < self.turns.len() {
            total -= self.turns[drop].approx_bytes();
            drop += 1;
        }
        self.turns.drain(..drop);
        self.dropped_turns += drop;
        drop
    }
}

/// Reads the thread's rollout from its latest compaction on and rebuilds the conversation,
/// stopping at the turn `before_turn` (the running one) when given.
pub fn assemble(
    store: &dyn RolloutStore,
    thread_id: &str,
    before_turn: Option<&str>,
) -> Result<History, StoreError> {
    let head = store.summary(thread_id)?;
    let mut history = History::default();
    if let Some(seq) = head.last_compaction_seq {
        let page = store.read(thread_id, seq - 1, 1)?;
        history.summary = page.events.first().and_then(|e| {
            e.payload
                .get("summary")
                .and_then(Value::as_str)
                .map(str::to_string)
        });
    }
    // item id → (turn index, entry index) of entries that later events complete.
    let mut open: HashMap<String, (usize, usize)> = HashMap::new();
    let mut after = head.compacted_through;
    'pages: loop {
        let page = store.read(thread_id, after, MAX_READ_LIMIT)?;
        for e in &page.events {
            after = e.seq;
            // Payloads this build cannot decode are left to verification, never guessed at.
            let Ok(payload) = serde_json::from_value::<EventPayload>(e.payload.clone()) else {
                continue;
            };
            if let EventPayload::TurnStarted(t) = &payload {
                if before_turn == Some(t.turn_id.as_str()) {
                    break 'pages;
                }
                history.turns.push(HistoryTurn {
                    turn_id: t.turn_id.clone(),
                    input: t.input.clone(),
                    entries: Vec::new(),
                    status: None,
                });
                continue;
            }
            let Some(ti) = history.turns.len().checked_sub(1) else {
                continue;
            };
            let turn = &mut history.turns[ti];
            match payload {
                EventPayload::ItemStarted(s) => {
                    if let ItemContent::AgentMessage(m) = s.item {
                        open.insert(m.id.clone(), (ti, turn.entries.len()));
                        turn.entries.push(HistoryEntry::AgentMessage {
                            item_id: m.id,
                            text: m.text,
                            complete: false,
                        });
                    }
                }
                EventPayload::ItemDelta(d) => {
                    if let (Some(&(t, i)), ItemDelta::Text(delta)) = (open.get(&d.item_id), d.delta)
                    {
                        if let Some(HistoryEntry::AgentMessage { text, .. }) =
                            history.turns[t].entries.get_mut(i)
                        {
                            text.push_str(&delta.text);
                        }
                    }
                }
                EventPayload::ItemCompleted(c) => match c.item {
                    ItemContent::AgentMessage(m) => match open.remove(&m.id) {
                        Some((t, i)) => {
                            history.turns[t].entries[i] = HistoryEntry::AgentMessage {
                                item_id: m.id,
                                text: m.text,
                                complete: true,
                            }
                        }
                        None => turn.entries.push(HistoryEntry::AgentMessage {
                            item_id: m.id,
                            text: m.text,
                            complete: true,
                        }),
                    },
                    ItemContent::Reasoning(r) => turn.entries.push(HistoryEntry::Reasoning {
                        item_id: r.id,
                        text: r.text,
                    }),
                    _ => {}
                },
                EventPayload::ToolRequested(r) => {
                    open.insert(r.item_id.clone(), (ti, turn.entries.len()));
                    turn.entries.push(HistoryEntry::ToolCall {
                        item_id: r.item_id,
                        call: r.call,
                        result: None,
                    });
                }
                EventPayload::ToolResult(r) => {
                    if let Some((t, i)) = open.remove(&r.item_id) {
                        if let Some(HistoryEntry::ToolCall { result, .. }) =
                            history.turns[t].entries.get_mut(i)
                        {
                            *result = Some(r.result);
                        }
                    }
                }
                EventPayload::TurnCompleted(c) => {
                    if let Some(t) = history
                        .turns
                        .iter_mut()
                        .rev()
                        .find(|t| t.turn_id == c.turn_id)
                    {
                        t.status = Some(c.status);
                    }
                }
                _ => {}
            }
        }
        if !page.has_more {
            break;
        }
    }
    Ok(history)
}
