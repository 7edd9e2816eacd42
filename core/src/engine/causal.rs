//! A turn's trace (docs/rollout-format.md, "Trace and parent ids"): the trace id every event of
//! the turn carries, and which recorded event caused each one, so a host rebuilds the turn's
//! causal tree from the rollout alone:
//!
//! - `turnStarted` names the caller's span (`span:…`), or for a graph attempt's turn its run's
//!   event (`event:…`);
//! - `itemStarted`, status changes and `turnCompleted` name `turnStarted`;
//! - an item's deltas name its `itemStarted`;
//! - every other event of an item (its completion, `toolRequested`, `approvalRequested`,
//!   `approvalResolved`, `toolResult`) names the item's previous such event, so a tool call reads
//!   itemStarted ← toolRequested ← approvalRequested ← approvalResolved ← toolResult.

use crate::rollout::trace::{seq_ref, Trace};
use serde_json::Value;
use std::collections::HashMap;

/// What an event is to the causal tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    TurnStarted,
    ItemStarted,
    Delta,
    /// Any other event of one item.
    OfItem,
    /// Any other event of the turn (status changes, the terminal event).
    OfTurn,
}

/// Where `payload` sits in the tree, and the item it belongs to.
pub(crate) fn step_of(payload: &Value) -> (Step, Option<String>) {
    let kind = payload.get("type").and_then(Value::as_str).unwrap_or("");
    let item = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
    match kind {
        "turnStarted" => (Step::TurnStarted, None),
        "itemStarted" => (Step::ItemStarted, item(payload.pointer("/item/id"))),
        "itemCompleted" => (Step::OfItem, item(payload.pointer("/item/id"))),
        "itemDelta" => (Step::Delta, item(payload.get("itemId"))),
        _ => match item(payload.get("itemId")) {
            Some(id) => (Step::OfItem, Some(id)),
            None => (Step::OfTurn, None),
        },
    }
}

#[derive(Debug, Default)]
pub(crate) struct TurnTrace {
    /// The trace id (set before `turnStarted` is recorded).
    id: Option<String>,
    /// `turnStarted`'s parent.
    caller: Option<String>,
    /// `turnStarted`'s seq (0 until recorded).
    start: u64,
    /// Per item: its `itemStarted`'s seq (0 if none) and its latest event's but deltas.
    items: HashMap<String, (u64, u64)>,
}

impl TurnTrace {
    pub fn begin(&mut self, trace: Trace) {
        self.id = Some(trace.id);
        self.caller = trace.caller;
    }

    pub fn id(&self) -> Option<&str> {
        self.id.as_deref()
    }

    /// `(traceId, parentId)` of the next event of `step` on `item`.
    pub fn ids(&self, step: Step, item: Option<&str>) -> (Option<String>, Option<String>) {
        let start = (self.start > 0).then_some(self.start);
        let of_item = item.and_then(|i| self.items.get(i));
        let parent = match step {
            Step::TurnStarted => return (self.id.clone(), self.caller.clone()),
            Step::ItemStarted | Step::OfTurn => start,
            Step::Delta => of_item.map(|s| s.0).filter(|s| *s > 0).or(start),
            Step::OfItem => of_item.map(|s| s.1).or(start),
        };
        (self.id.clone(), parent.map(seq_ref))
    }

    /// Remembers that the event of `step` on `item` got `seq`.
    pub fn recorded(&mut self, step: Step, item: Option<&str>, seq: u64) {
        match (step, item) {
            (Step::TurnStarted, _) => self.start = seq,
            (Step::ItemStarted, Some(i)) => {
                self.items.insert(i.to_string(), (seq, seq));
            }
            (Step::OfItem, Some(i)) => match self.items.get_mut(i) {
                Some(s) => s.1 = seq,
                None => {
                    self.items.insert(i.to_string(), (0, seq));
                }
            },
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_tool_call_chains_back_to_the_turn_start() {
        let mut t = TurnTrace::default();
        t.begin(Trace {
            id: "ab".repeat(16),
            caller: Some("span:00f067aa0ba902b7".into()),
        });
        assert_eq!(
            t.ids(Step::TurnStarted, None).1.as_deref(),
            Some("span:00f067aa0ba902b7")
        );
        t.recorded(Step::TurnStarted, None, 5);
        let steps = [
            (json!({"type": "itemStarted", "item": {"id": "i1"}}), "5"),
            (json!({"type": "itemDelta", "itemId": "i1"}), "6"),
            (json!({"type": "toolRequested", "itemId": "i1"}), "6"),
            (json!({"type": "itemDelta", "itemId": "i1"}), "6"),
            (json!({"type": "approvalRequested", "itemId": "i1"}), "8"),
            (json!({"type": "turnStatusChanged"}), "5"),
            (json!({"type": "approvalResolved", "itemId": "i1"}), "10"),
            (json!({"type": "toolResult", "itemId": "i1"}), "12"),
            (json!({"type": "itemCompleted", "item": {"id": "i1"}}), "13"),
            (json!({"type": "toolRequested", "itemId": "lone"}), "5"),
            (json!({"type": "toolResult", "itemId": "lone"}), "15"),
            (json!({"type": "itemDelta", "itemId": "lone"}), "5"),
            (json!({"type": "turnCompleted"}), "5"),
        ];
        for (seq, (payload, parent)) in (6..).zip(steps) {
            let (step, item) = step_of(&payload);
            let (trace, got) = t.ids(step, item.as_deref());
            assert_eq!(trace.as_deref(), Some("ab".repeat(16).as_str()));
            assert_eq!(got.as_deref(), Some(parent), "{payload} at seq {seq}");
            t.recorded(step, item.as_deref(), seq);
        }
    }
}
