//! Approval types a host sees (the request with its binding, the decision) and the pure helpers a
//! host uses to check a binding itself before it shows a prompt: the same digests the engine
//! computes, so a host can refuse a request that is not about the operation it displays.

use crate::errors::BindingError;
use cc_app_server::approval as core;
use cc_app_server::protocol::{
    AcceptForSession, AcceptForTurn, AcceptOnce, ApprovalDecision as WireDecision,
    ApprovalRequest as WireRequest, Cancel, Decline, ToolCall,
};
use serde_json::Value;

/// When a tool needs a human decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, uniffi::Enum)]
pub enum ApprovalPolicy {
    /// Every tool call asks, unless a grant for the same operation still holds (the default).
    AskEveryTime,
    /// Tools run without asking (trusted automation only).
    AutoApprove,
    /// No tool ever runs.
    DenyAll,
}

impl From<ApprovalPolicy> for core::ApprovalPolicy {
    fn from(p: ApprovalPolicy) -> Self {
        match p {
            ApprovalPolicy::AskEveryTime => core::ApprovalPolicy::AskEveryTime,
            ApprovalPolicy::AutoApprove => core::ApprovalPolicy::AutoApprove,
            ApprovalPolicy::DenyAll => core::ApprovalPolicy::DenyAll,
        }
    }
}

/// What a decision is bound to: exactly one operation, policy and workspace, once, until expiry.
#[derive(Debug, Clone, PartialEq, Eq, uniffi::Record)]
pub struct ApprovalBinding {
    pub thread_id: String,
    pub turn_id: String,
    pub item_id: String,
    pub operation_digest: String,
    pub policy_digest: String,
    pub workspace_digest: String,
    pub nonce: String,
    /// RFC 3339 UTC with milliseconds (`2026-01-02T03:04:05.678Z`).
    pub expires_at: String,
}

/// One `approval/decide` request as the host's handler sees it.
#[derive(Debug, Clone, PartialEq, Eq, uniffi::Record)]
pub struct ApprovalRequest {
    pub binding: ApprovalBinding,
    /// The tool to run.
    pub tool: String,
    /// Its arguments, as JSON text.
    pub arguments_json: String,
    /// Why the kernel wants it, if it said.
    pub reason: Option<String>,
    /// The whole request params as JSON text (what the binding was computed over).
    pub params_json: String,
}

impl ApprovalRequest {
    pub(crate) fn from_wire(params: &WireRequest) -> ApprovalRequest {
        let b = &params.binding;
        ApprovalRequest {
            binding: ApprovalBinding {
                thread_id: b.thread_id.clone(),
                turn_id: b.turn_id.clone(),
                item_id: b.item_id.clone(),
                operation_digest: b.operation_digest.clone(),
                policy_digest: b.policy_digest.clone(),
                workspace_digest: b.workspace_digest.clone().unwrap_or_default(),
                nonce: b.nonce.clone(),
                expires_at: b.expires_at.clone(),
            },
            tool: params.operation.tool.clone(),
            arguments_json: params.operation.arguments.to_string(),
            reason: Some(params.reason.clone()),
            params_json: serde_json::to_string(params).unwrap_or_default(),
        }
    }
}

/// The host's answer to an approval request.
#[derive(Debug, Clone, PartialEq, Eq, uniffi::Enum)]
pub enum ApprovalDecision {
    /// Run this one call.
    AcceptOnce,
    /// Run it, and the same operation again for the rest of this turn.
    AcceptForTurn,
    /// Run it, and the same operation again on this connection while policy and workspace hold.
    AcceptForSession,
    /// Do not run it; the turn goes on.
    Decline { reason: Option<String> },
    /// Do not run it and interrupt the turn.
    Cancel,
}

impl From<ApprovalDecision> for WireDecision {
    fn from(d: ApprovalDecision) -> Self {
        match d {
            ApprovalDecision::AcceptOnce => WireDecision::AcceptOnce(AcceptOnce {}),
            ApprovalDecision::AcceptForTurn => {
                WireDecision::AcceptForTurn(AcceptForTurn { permissions: None })
            }
            ApprovalDecision::AcceptForSession => {
                WireDecision::AcceptForSession(AcceptForSession { permissions: None })
            }
            ApprovalDecision::Decline { reason } => WireDecision::Decline(Decline { reason }),
            ApprovalDecision::Cancel => WireDecision::Cancel(Cancel { reason: None }),
        }
    }
}

fn parse(json: &str) -> Result<Value, BindingError> {
    serde_json::from_str(json).map_err(|e| BindingError::InvalidJson {
        reason: e.to_string(),
    })
}

/// The operation digest of a tool call (sha256 of its RFC 8785 form), as the engine binds it.
#[uniffi::export]
pub fn operation_digest(tool: String, arguments_json: String) -> Result<String, BindingError> {
    let arguments = parse(&arguments_json)?;
    Ok(core::operation_digest(&ToolCall { tool, arguments }))
}

/// The policy digest the engine binds approvals to under `policy`.
#[uniffi::export]
pub fn policy_digest(policy: ApprovalPolicy) -> String {
    core::policy_digest(policy.into())
}

/// The workspace digest the engine binds approvals to for `workspace`.
#[uniffi::export]
pub fn workspace_digest(workspace: String) -> String {
    core::workspace_digest(&workspace)
}

/// `sha256:` + hex of the RFC 8785 (JCS) form of any JSON value.
#[uniffi::export]
pub fn digest_json(json: String) -> Result<String, BindingError> {
    Ok(core::digest_json(&parse(&json)?))
}

/// Checks that `request` is about the operation it shows, under the policy and workspace the host
/// believes are in force, and has not expired. Any error means: decline.
#[uniffi::export]
pub fn verify_approval_binding(
    request: ApprovalRequest,
    policy: ApprovalPolicy,
    workspace: String,
) -> Result<(), BindingError> {
    let b = &request.binding;
    let checks = [
        (
            "operationDigest",
            operation_digest(request.tool.clone(), request.arguments_json.clone())?,
            &b.operation_digest,
        ),
        ("policyDigest", policy_digest(policy), &b.policy_digest),
        (
            "workspaceDigest",
            workspace_digest(workspace),
            &b.workspace_digest,
        ),
    ];
    for (field, expected, actual) in checks {
        if &expected != actual {
            return Err(BindingError::Mismatch {
                field: field.into(),
                expected,
                actual: actual.clone(),
            });
        }
    }
    // Both sides are the engine's fixed-width `YYYY-MM-DDTHH:MM:SS.mmmZ`, so text order is time
    // order; anything else is not a binding this engine made.
    let well_formed = b.expires_at.len() == 24 && b.expires_at.ends_with('Z');
    if !well_formed || b.expires_at.as_str() <= cc_app_server::time::now_rfc3339().as_str() {
        return Err(BindingError::Expired {
            expires_at: b.expires_at.clone(),
        });
    }
    Ok(())
}
