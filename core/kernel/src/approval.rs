//! The approval gate's pure parts: digests that bind a decision to exactly one operation, policy
//! and workspace, single-use nonces, and the grants that `acceptForTurn` / `acceptForSession` leave.

use crate::protocol::{ApprovalRisk, ToolCall};
use cc_agent_protocol::{jcs, sha256_hex};
use serde_json::Value;
use std::collections::{HashMap, HashSet, VecDeque};

/// When a tool needs a human decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ApprovalPolicy {
    /// Every tool call asks, unless a grant for the same operation still holds (the default).
    #[default]
    AskEveryTime,
    /// Tools run without asking (trusted automation only).
    AutoApprove,
    /// No tool ever runs.
    DenyAll,
}

impl ApprovalPolicy {
    /// The wire name used in the policy digest and in docs.
    pub fn name(self) -> &'static str {
        match self {
            ApprovalPolicy::AskEveryTime => "askEveryTime",
            ApprovalPolicy::AutoApprove => "autoApprove",
            ApprovalPolicy::DenyAll => "denyAll",
        }
    }
}

/// `sha256:` + hex of the RFC 8785 form of `value`.
pub fn digest_json(value: &Value) -> String {
    format!("sha256:{}", sha256_hex(&jcs::canonical_bytes(value)))
}

/// The operation digest: sha256 of the JCS form of the tool call.
pub fn operation_digest(call: &ToolCall) -> String {
    digest_json(&serde_json::to_value(call).expect("a tool call is JSON"))
}

/// The policy digest: what policy was in force, by name and version.
pub fn policy_digest(policy: ApprovalPolicy) -> String {
    digest_json(&serde_json::json!({"policy": policy.name(), "version": 1}))
}

/// The workspace digest: which workspace a tool would act on.
pub fn workspace_digest(workspace: &str) -> String {
    digest_json(&serde_json::json!({"workspace": workspace}))
}

/// How much harm a tool could do, for the published `ApprovalRequest.risk`: reading is low,
/// changing the workspace medium, running a command high; a tool we do not know is medium.
pub fn risk_of(tool: &str) -> ApprovalRisk {
    match tool {
        "read_file" | "list_directory" | "search" | "grep" | "glob" => ApprovalRisk::Low,
        "run_command" | "shell" | "exec" => ApprovalRisk::High,
        _ => ApprovalRisk::Medium,
    }
}

/// A fresh 128-bit nonce as 32 lowercase hex digits.
pub fn new_nonce() -> String {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("the OS random source is available");
    cc_agent_protocol::hex_lower(&bytes)
}

/// Grants left by `acceptForTurn` / `acceptForSession`: an operation digest is granted only
/// together with the policy and workspace digests it was granted under, so a change of either
/// makes the grant lapse.
#[derive(Debug, Default)]
pub struct Grants {
    granted: HashSet<(String, String, String)>,
}

impl Grants {
    pub fn grant(&mut self, operation: &str, policy: &str, workspace: &str) {
        self.granted.insert((
            operation.to_string(),
            policy.to_string(),
            workspace.to_string(),
        ));
    }

    pub fn holds(&self, operation: &str, policy: &str, workspace: &str) -> bool {
        self.granted.contains(&(
            operation.to_string(),
            policy.to_string(),
            workspace.to_string(),
        ))
    }
}

/// Nonces already answered, remembered only as long as they matter: until their binding's
/// expiry plus the grace (after that no request waits for them, so a replay matches nothing and
/// is ignored), and never more than `cap` of them (the oldest go first). Forgetting one only
/// changes how a late replay is classified (`bindingMismatch` instead of `nonceReused`); both
/// fail closed.
#[derive(Debug)]
pub struct UsedNonces {
    forget_at: HashMap<String, i64>,
    order: VecDeque<(i64, String)>,
    cap: usize,
}

impl UsedNonces {
    pub fn new(cap: usize) -> Self {
        UsedNonces {
            forget_at: HashMap::new(),
            order: VecDeque::new(),
            cap: cap.max(1),
        }
    }

    /// Records `nonce` as used until `forget_at_ms`; false if it was already recorded.
    pub fn insert(&mut self, nonce: &str, forget_at_ms: i64, now_ms: i64) -> bool {
        self.expire(now_ms);
        if self.forget_at.contains_key(nonce) {
            return false;
        }
        self.forget_at.insert(nonce.to_string(), forget_at_ms);
        self.order.push_back((forget_at_ms, nonce.to_string()));
        while self.order.len() > self.cap {
            if let Some((_, old)) = self.order.pop_front() {
                self.forget_at.remove(&old);
            }
        }
        true
    }

    pub fn contains(&self, nonce: &str) -> bool {
        self.forget_at.contains_key(nonce)
    }

    pub fn len(&self) -> usize {
        self.forget_at.len()
    }

    pub fn is_empty(&self) -> bool {
        self.forget_at.is_empty()
    }

    fn expire(&mut self, now_ms: i64) {
        // Bindings share one timeout, so the queue is (almost) in expiry order; an entry behind a
        // later one waits for it, which only keeps it a little longer.
        while self.order.front().is_some_and(|(at, _)| *at < now_ms) {
            if let Some((_, old)) = self.order.pop_front() {
                self.forget_at.remove(&old);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn operation_digest_ignores_key_order_but_not_values() {
        let a: ToolCall = serde_json::from_value(
            json!({"tool": "fs.write", "arguments": {"path": "a", "text": "x"}}),
        )
        .unwrap();
        let b: ToolCall = serde_json::from_value(
            json!({"arguments": {"text": "x", "path": "a"}, "tool": "fs.write"}),
        )
        .unwrap();
        let c: ToolCall = serde_json::from_value(
            json!({"tool": "fs.write", "arguments": {"path": "b", "text": "x"}}),
        )
        .unwrap();
        assert_eq!(operation_digest(&a), operation_digest(&b));
        assert_ne!(operation_digest(&a), operation_digest(&c));
        assert!(cc_agent_protocol::validate_protocol_definition(
            "Digest",
            &json!(operation_digest(&a))
        )
        .is_ok());
    }

    #[test]
    fn grants_lapse_when_policy_or_workspace_changes() {
        let mut g = Grants::default();
        g.grant("op", "p1", "w1");
        assert!(g.holds("op", "p1", "w1"));
        assert!(!g.holds("op", "p2", "w1"));
        assert!(!g.holds("op", "p1", "w2"));
        assert!(!g.holds("other", "p1", "w1"));
    }

    #[test]
    fn used_nonces_expire_with_their_binding_and_stay_under_the_cap() {
        let mut used = UsedNonces::new(3);
        assert!(used.insert("a", 100, 0));
        assert!(!used.insert("a", 100, 50), "a second use is refused");
        assert!(used.insert("b", 200, 60));
        // At t=150 the first binding is over: its nonce is forgotten.
        assert!(used.insert("c", 300, 150));
        assert!(!used.contains("a"));
        assert!(used.contains("b") && used.contains("c"));
        // The cap holds even when nothing has expired: the oldest goes first.
        assert!(used.insert("d", 400, 160));
        assert!(used.insert("e", 500, 170));
        assert_eq!(used.len(), 3);
        assert!(!used.contains("b"));
        assert!(used.contains("e"));
    }

    #[test]
    fn nonces_are_fresh_and_wire_shaped() {
        let (a, b) = (new_nonce(), new_nonce());
        assert_ne!(a, b);
        assert_eq!(a.len(), 32);
        assert!(a
            .bytes()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
    }
}
