//! Effects: every tool call a graph makes is an effect with an idempotency key. The key is
//! recorded as intended (durably) before the call reaches the approval gate and the executor,
//! and the outcome after it, with a receipt. After a crash an intended effect without an outcome
//! is never run again blindly: its outcome is found in the attempt thread's rollout, or asked of
//! the tool executor (`EffectReconciler`), or left to the host.

use crate::protocol::{
    GraphEffectReceipt, GraphReceiptSource, GraphResultStatus, ToolCall, ToolResult,
};
use std::cell::RefCell;

/// The effect a tool executor is running right now on this thread, so an executor that keeps
/// its own ledger can apply each key at most once (`current_effect`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectContext {
    pub run_id: String,
    pub node: String,
    pub idempotency_key: String,
    pub attempt_id: u64,
    pub fence: u64,
}

thread_local! {
    static CURRENT: RefCell<Option<EffectContext>> = const { RefCell::new(None) };
}

/// The graph effect whose tool call is executing on the calling thread, if any. The engine calls
/// `ToolExecutor::execute` synchronously on the thread that asked for the tool, so an executor
/// sees the key of the effect it is applying.
pub fn current_effect() -> Option<EffectContext> {
    CURRENT.with(|c| c.borrow().clone())
}

/// Sets the current effect for the duration of `f`.
pub fn with_effect<T>(ctx: EffectContext, f: impl FnOnce() -> T) -> T {
    struct Reset(Option<EffectContext>);
    impl Drop for Reset {
        fn drop(&mut self) {
            let prev = self.0.take();
            CURRENT.with(|c| *c.borrow_mut() = prev);
        }
    }
    let prev = CURRENT.with(|c| c.borrow_mut().replace(ctx));
    let _reset = Reset(prev);
    f()
}

/// What a tool executor knows about an idempotency key.
#[derive(Debug, Clone, PartialEq)]
pub enum Reconciliation {
    /// The effect happened; this is what the call returned.
    Applied(ToolResult),
    /// The effect did not happen: the key may be attempted again.
    NotApplied,
    /// Cannot tell; the effect stays in reconcile until the host decides.
    Unknown,
}

/// Answers, for an intended effect without a recorded outcome, whether it happened. Hosts whose
/// tool executor keeps a ledger of applied keys implement it (`GraphHandle::set_reconciler`).
pub trait EffectReconciler: Send + Sync {
    fn reconcile(&self, run_id: &str, idempotency_key: &str, call: &ToolCall) -> Reconciliation;
}

/// The idempotency key of the `occurrence`-th request (from 0) for the same operation by one
/// attempt of node `node`: the same on every attempt of that node instance, so a retry that asks
/// for the same call finds the first call's receipt instead of running it again.
pub fn effect_key(run_id: &str, node: &str, operation_digest: &str, occurrence: u32) -> String {
    let text = format!("{run_id}\n{node}\n{operation_digest}\n{occurrence}");
    format!(
        "fx-{}",
        &cc_agent_protocol::sha256_hex(text.as_bytes())[..40]
    )
}

pub fn result_status(result: &ToolResult) -> GraphResultStatus {
    match result {
        ToolResult::Ok(_) => GraphResultStatus::Ok,
        ToolResult::Error(_) => GraphResultStatus::Error,
        ToolResult::Denied(_) => GraphResultStatus::Denied,
    }
}

/// A receipt for `result` of the effect `key`.
pub fn receipt(
    key: &str,
    operation_digest: &str,
    result: &ToolResult,
    source: GraphReceiptSource,
    evidence: Option<(&str, &str, &str)>,
) -> GraphEffectReceipt {
    let value = serde_json::to_value(result).expect("a tool result is JSON");
    GraphEffectReceipt {
        idempotency_key: key.to_string(),
        operation_digest: operation_digest.to_string(),
        result_status: result_status(result),
        result_digest: crate::approval::digest_json(&value),
        source,
        thread_id: evidence.map(|e| e.0.to_string()),
        turn_id: evidence.map(|e| e.1.to_string()),
        item_id: evidence.map(|e| e.2.to_string()),
        result: Some(result.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_stable_per_node_and_operation_and_differ_otherwise() {
        let a = effect_key("r", "n", "sha256:aa", 0);
        assert_eq!(a, effect_key("r", "n", "sha256:aa", 0));
        assert_ne!(a, effect_key("r", "n", "sha256:aa", 1));
        assert_ne!(a, effect_key("r", "m", "sha256:aa", 0));
        assert_ne!(a, effect_key("r2", "n", "sha256:aa", 0));
        assert!(
            crate::rollout::validate_thread_id(&a).is_ok(),
            "keys are Identifiers"
        );
    }

    #[test]
    fn the_current_effect_is_scoped_to_the_call() {
        assert_eq!(current_effect(), None);
        let ctx = EffectContext {
            run_id: "r".into(),
            node: "n".into(),
            idempotency_key: "k".into(),
            attempt_id: 1,
            fence: 1,
        };
        let seen = with_effect(ctx.clone(), current_effect);
        assert_eq!(seen, Some(ctx));
        assert_eq!(current_effect(), None);
    }
}
