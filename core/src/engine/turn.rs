//! One turn's life: the runner thread that drives the kernel, the `TurnContext` it is given, and
//! the approval gate every tool request passes through. The terminal event is appended (durably)
//! before `turn/completed` is sent, and exactly once per turn.

use super::{deliver, emit, lock, notification, ConnShared, Inner, ThreadState};
use crate::approval::{self, ApprovalPolicy};
use crate::kernel::{KernelError, TurnContext};
use crate::protocol::{
    Item, ItemDelta, ToolCall, ToolResult, ToolResultDenied, ToolResultError, UserInput,
};
use crate::time::{format_unix_millis, now_rfc3339, now_unix_millis};
use serde_json::{json, Value};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

/// A live turn, shared by its runner, the thread state and turn/interrupt.
pub(crate) struct TurnShared {
    pub id: String,
    pub thread_id: String,
    pub started_at: String,
    status: Mutex<&'static str>,
    cancelled: AtomicBool,
    wake: (Mutex<()>, Condvar),
    /// The terminal Turn once the runner has physically stopped.
    done: Mutex<Option<Value>>,
    done_cv: Condvar,
    pub conn: Weak<ConnShared>,
    grants: Mutex<approval::Grants>,
    next_item: AtomicU64,
}

impl TurnShared {
    pub fn new(id: String, thread_id: String, conn: Weak<ConnShared>) -> Arc<Self> {
        Arc::new(TurnShared {
            id,
            thread_id,
            started_at: now_rfc3339(),
            status: Mutex::new("queued"),
            cancelled: AtomicBool::new(false),
            wake: (Mutex::new(()), Condvar::new()),
            done: Mutex::new(None),
            done_cv: Condvar::new(),
            conn,
            grants: Mutex::new(Default::default()),
            next_item: AtomicU64::new(1),
        })
    }

    /// The wire Turn as it stands now.
    pub fn to_json(&self) -> Value {
        if let Some(done) = lock(&self.done).clone() {
            return done;
        }
        turn_json(
            &self.id,
            &self.thread_id,
            *lock(&self.status),
            &self.started_at,
            None,
            None,
        )
    }

    /// Asks the kernel to stop; wakes any cancellable sleep or approval wait.
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::SeqCst);
        let _g = lock(&self.wake.0);
        self.wake.1.notify_all();
    }

    /// Waits up to `timeout` for the runner to stop; the terminal Turn if it did.
    pub fn wait_settled(&self, timeout: Duration) -> Option<Value> {
        let deadline = Instant::now() + timeout;
        let mut done = lock(&self.done);
        while done.is_none() {
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            done = self
                .done_cv
                .wait_timeout(done, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        done.clone()
    }
}

pub(crate) fn turn_json(
    id: &str,
    thread_id: &str,
    status: &str,
    started_at: &str,
    completed_at: Option<&str>,
    error: Option<Value>,
) -> Value {
    json!({"id": id, "threadId": thread_id, "status": status, "startedAt": started_at,
           "completedAt": completed_at, "error": error})
}

fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// Drives one turn on its own thread, from running to its single terminal event.
pub(crate) fn run(
    inner: Arc<Inner>,
    thread: Arc<ThreadState>,
    turn: Arc<TurnShared>,
    input: Vec<UserInput>,
) {
    let ctx = Ctx {
        inner: &inner,
        thread: &thread,
        turn: &turn,
        agent_options: lock(&thread.data).agent_options.clone(),
    };
    let result = if ctx.set_status("running").is_err() {
        Ok(Err(KernelError::Failed(
            "could not record the turn's start".into(),
        )))
    } else {
        std::panic::catch_unwind(AssertUnwindSafe(|| {
            inner.config.kernel.run_turn(&ctx, &input)
        }))
    };
    let cancelled = turn.cancelled.load(Ordering::SeqCst);
    let (status, error) = match result {
        Ok(Err(KernelError::Failed(m))) => (
            "failed",
            Some(json!({"code": "kernelFailed", "message": truncate(&m, 1024)})),
        ),
        Err(_) => (
            "failed",
            Some(
                json!({"code": "kernelPanicked", "message": "the agent kernel crashed; the turn was closed"}),
            ),
        ),
        Ok(Err(KernelError::Cancelled)) => (
            "interrupted",
            Some(json!({"code": "interrupted", "message": "the turn was interrupted"})),
        ),
        Ok(Ok(())) if cancelled => (
            "interrupted",
            Some(json!({"code": "interrupted", "message": "the turn was interrupted"})),
        ),
        Ok(Ok(())) => ("completed", None),
    };
    finish(&inner, &thread, &turn, status, error);
}

/// Records the terminal event durably, then tells the hosts, then releases the thread.
fn finish(
    inner: &Inner,
    thread: &ThreadState,
    turn: &TurnShared,
    status: &'static str,
    error: Option<Value>,
) {
    let completed_at = now_rfc3339();
    let terminal = turn_json(
        &turn.id,
        &turn.thread_id,
        status,
        &turn.started_at,
        Some(&completed_at),
        error.clone(),
    );
    let payload = json!({"type": "turnCompleted", "turnId": turn.id, "status": status, "error": error, "physicallySettled": true});
    // The thread is released after the terminal event is durable but before any host hears of
    // it, so a host that starts the next turn on `turn/completed` never meets a stale -32009.
    let release = || {
        *lock(&turn.status) = status;
        let mut data = lock(&thread.data);
        data.turns.insert(turn.id.clone(), terminal.clone());
        if data.active.as_ref().is_some_and(|a| a.id == turn.id) {
            data.active = None;
        }
        drop(data);
        *lock(&turn.done) = Some(terminal.clone());
        turn.done_cv.notify_all();
    };
    let recorded = emit(inner, thread, vec![payload], |events| {
        release();
        vec![notification(
            "turn/completed",
            json!({"threadId": thread.id, "eventSeq": events[0].seq, "turn": terminal}),
        )]
    });
    if let Err(e) = recorded {
        // The terminal could not be made durable: the turn is closed in memory, and recovery
        // closes it (as failed) on the next open, so it is never left dangling on disk.
        eprintln!(
            "cc-app-server: could not record the end of turn {}: {e}",
            turn.id
        );
        release();
    }
}

struct Ctx<'a> {
    inner: &'a Arc<Inner>,
    thread: &'a Arc<ThreadState>,
    turn: &'a Arc<TurnShared>,
    agent_options: Value,
}

/// A kernel's output, checked against the schema before it is recorded: the generated types keep
/// unknown display values (`Item::Unknown`), which a kernel must not invent.
fn checked<T: serde::Serialize + ?Sized>(
    definition: &str,
    value: &T,
) -> Result<Value, KernelError> {
    let value = serde_json::to_value(value).map_err(|e| KernelError::Failed(e.to_string()))?;
    cc_agent_protocol::validate_protocol_definition(definition, &value).map_err(|e| {
        KernelError::Failed(format!("the kernel produced an invalid {definition}: {e}"))
    })?;
    Ok(value)
}

fn recording_failed(e: impl std::fmt::Display) -> KernelError {
    KernelError::Failed(format!("could not record an event durably: {e}"))
}

/// What the approval gate concluded for one tool request.
enum Verdict {
    Run,
    Deny(String),
    Cancel,
}

impl Ctx<'_> {
    fn set_status(&self, status: &'static str) -> Result<(), KernelError> {
        *lock(&self.turn.status) = status;
        emit(
            self.inner,
            self.thread,
            vec![json!({"type": "turnStatusChanged", "turnId": self.turn.id, "status": status})],
            |_| vec![],
        )
        .map(|_| ())
        .map_err(recording_failed)
    }

    fn record(&self, payload: Value, method: &str, params: Value) -> Result<u64, KernelError> {
        let events = emit(self.inner, self.thread, vec![payload], |events| {
            let mut params = params;
            params["threadId"] = json!(self.thread.id);
            params["eventSeq"] = json!(events[0].seq);
            vec![notification(method, params)]
        })
        .map_err(recording_failed)?;
        Ok(events[0].seq)
    }

    fn item_event(&self, kind: &str, method: &str, item: Item) -> Result<(), KernelError> {
        let item = checked("Item", &item)?;
        self.record(
            json!({"type": kind, "turnId": self.turn.id, "item": item}),
            method,
            json!({"turnId": self.turn.id, "item": item}),
        )
        .map(|_| ())
    }

    /// The approval gate. Every path that does not end in an explicit acceptance fails closed.
    fn gate(
        &self,
        item_id: &str,
        call: &ToolCall,
        call_json: &Value,
    ) -> Result<Verdict, KernelError> {
        let (policy, workspace) = lock(&self.inner.policy).clone();
        let op = approval::operation_digest(call);
        let pd = approval::policy_digest(policy);
        let wd = approval::workspace_digest(&workspace);
        match policy {
            ApprovalPolicy::DenyAll => {
                return Ok(Verdict::Deny(
                    "the approval policy denies every tool".into(),
                ))
            }
            ApprovalPolicy::AutoApprove => return Ok(Verdict::Run),
            ApprovalPolicy::AskEveryTime => {}
        }
        let conn = self.turn.conn.upgrade().filter(|c| c.is_open());
        if lock(&self.turn.grants).holds(&op, &pd, &wd)
            || conn
                .as_ref()
                .is_some_and(|c| lock(&c.session_grants).holds(&op, &pd, &wd))
        {
            return Ok(Verdict::Run);
        }
        let nonce = approval::new_nonce();
        let expires_ms = now_unix_millis() + self.inner.config.approval_timeout.as_millis() as i64;
        let binding = json!({
            "threadId": self.thread.id, "turnId": self.turn.id, "itemId": item_id,
            "operationDigest": op, "policyDigest": pd, "workspaceDigest": wd,
            "nonce": nonce, "expiresAt": format_unix_millis(expires_ms),
        });
        let failure = |failure: &str| ("failedClosed", Value::Null, Some(failure.to_string()));
        let (outcome, decision, failure) = match conn {
            None => failure("transportClosed"),
            Some(conn) if !conn.has_feature("structured_approval") => failure("noHandler"),
            Some(conn) => {
                self.record(
                    json!({"type": "approvalRequested", "turnId": self.turn.id, "itemId": item_id, "binding": binding}),
                    "approval/requested",
                    json!({"turnId": self.turn.id, "itemId": item_id, "binding": binding, "operation": call_json}),
                )?;
                self.set_status("waiting_approval")?;
                let answer = self.ask(&conn, &binding, call_json, expires_ms);
                self.classify(answer, &binding, &nonce, expires_ms, policy, &workspace)
            }
        };
        self.record(
            json!({"type": "approvalResolved", "turnId": self.turn.id, "itemId": item_id, "nonce": nonce,
                   "outcome": outcome, "decision": decision, "failure": failure}),
            "approval/resolved",
            json!({"turnId": self.turn.id, "itemId": item_id, "nonce": nonce, "outcome": outcome, "decision": decision, "failure": failure}),
        )?;
        if *lock(&self.turn.status) == "waiting_approval" {
            self.set_status("running")?;
        }
        Ok(match outcome {
            "approved" => {
                match decision.get("decision").and_then(Value::as_str) {
                    Some("acceptForTurn") => lock(&self.turn.grants).grant(&op, &pd, &wd),
                    Some("acceptForSession") => {
                        if let Some(c) = self.turn.conn.upgrade() {
                            lock(&c.session_grants).grant(&op, &pd, &wd)
                        }
                    }
                    _ => {}
                }
                Verdict::Run
            }
            "cancelled" => Verdict::Cancel,
            "declined" => Verdict::Deny("the user declined".into()),
            _ => Verdict::Deny(format!(
                "approval failed closed: {}",
                failure.unwrap_or_default()
            )),
        })
    }

    /// Sends approval/decide and waits for the answer, the expiry, cancellation or a closed
    /// connection — whichever comes first.
    fn ask(
        &self,
        conn: &Arc<ConnShared>,
        binding: &Value,
        call_json: &Value,
        expires_ms: i64,
    ) -> Answer {
        let id = conn.next_request_id.fetch_add(1, Ordering::SeqCst);
        let (tx, rx) = sync_channel(1);
        lock(&conn.pending).insert(id, tx);
        let request = json!({"jsonrpc": "2.0", "id": id, "method": "approval/decide", "params": {"binding": binding, "operation": call_json}});
        deliver(self.inner, conn, request.to_string());
        let answer = loop {
            match rx.recv_timeout(Duration::from_millis(20)) {
                Ok(v) => break Answer::Response(v),
                Err(RecvTimeoutError::Disconnected) => break Answer::Closed,
                Err(RecvTimeoutError::Timeout) => {
                    if self.turn.cancelled.load(Ordering::SeqCst) {
                        break Answer::Interrupted;
                    }
                    if now_unix_millis()
                        >= expires_ms + self.inner.config.approval_grace.as_millis() as i64
                    {
                        break Answer::TimedOut;
                    }
                    if !conn.is_open() {
                        break Answer::Closed;
                    }
                }
            }
        };
        lock(&conn.pending).remove(&id);
        answer
    }

    /// Turns the host's answer into (outcome, decision, failure). Anything but a well-formed,
    /// in-time, matching acceptance fails closed.
    fn classify(
        &self,
        answer: Answer,
        binding: &Value,
        nonce: &str,
        expires_ms: i64,
        policy: ApprovalPolicy,
        workspace: &str,
    ) -> (&'static str, Value, Option<String>) {
        let fail = |f: &str| ("failedClosed", Value::Null, Some(f.to_string()));
        let response = match answer {
            Answer::Response(v) => v,
            Answer::TimedOut => return fail("timeout"),
            Answer::Closed => return fail("transportClosed"),
            Answer::Interrupted => return ("cancelled", Value::Null, None),
        };
        let first_use = lock(&self.inner.used_nonces).insert(nonce.to_string());
        if response.get("error").is_some() {
            return fail("handlerError");
        }
        let result = response.get("result").cloned().unwrap_or(Value::Null);
        if cc_agent_protocol::validate_protocol_definition("ApprovalDecideResult", &result).is_err()
        {
            let decision_ok = result
                .get("decision")
                .is_some_and(|d| cc_agent_protocol::validate_approval_decision(d).is_ok());
            return fail(if decision_ok {
                "bindingMismatch"
            } else {
                "unknownDecision"
            });
        }
        let answered = result["nonce"].as_str().unwrap_or_default();
        if answered != nonce {
            let reused = lock(&self.inner.used_nonces).contains(answered);
            return fail(if reused {
                "nonceReused"
            } else {
                "bindingMismatch"
            });
        }
        if !first_use {
            return fail("nonceReused");
        }
        if now_unix_millis() > expires_ms {
            return fail("expired");
        }
        let (now_policy, now_workspace) = lock(&self.inner.policy).clone();
        if now_policy != policy
            || now_workspace != workspace
            || binding["policyDigest"] != json!(approval::policy_digest(now_policy))
            || binding["workspaceDigest"] != json!(approval::workspace_digest(&now_workspace))
        {
            return fail("bindingMismatch");
        }
        let decision = result["decision"].clone();
        let outcome = match decision["decision"].as_str() {
            Some("acceptOnce" | "acceptForTurn" | "acceptForSession") => "approved",
            Some("decline") => "declined",
            Some("cancel") => "cancelled",
            _ => return fail("unknownDecision"),
        };
        (outcome, decision, None)
    }
}

enum Answer {
    Response(Value),
    TimedOut,
    Closed,
    Interrupted,
}

impl TurnContext for Ctx<'_> {
    fn thread_id(&self) -> &str {
        &self.thread.id
    }

    fn turn_id(&self) -> &str {
        &self.turn.id
    }

    fn agent_options(&self) -> &Value {
        &self.agent_options
    }

    fn new_item_id(&self) -> String {
        format!(
            "{}-i{}",
            self.turn.id,
            self.turn.next_item.fetch_add(1, Ordering::SeqCst)
        )
    }

    fn item_started(&self, item: Item) -> Result<(), KernelError> {
        self.item_event("itemStarted", "item/started", item)
    }

    fn item_delta(&self, item_id: &str, delta: ItemDelta) -> Result<(), KernelError> {
        checked("Identifier", item_id)?;
        let delta = checked("ItemDelta", &delta)?;
        self.record(
            json!({"type": "itemDelta", "turnId": self.turn.id, "itemId": item_id, "delta": delta}),
            "item/delta",
            json!({"turnId": self.turn.id, "itemId": item_id, "delta": delta}),
        )
        .map(|_| ())
    }

    fn item_completed(&self, item: Item) -> Result<(), KernelError> {
        self.item_event("itemCompleted", "item/completed", item)
    }

    fn request_tool(&self, item_id: &str, call: ToolCall) -> Result<ToolResult, KernelError> {
        if self.is_cancelled() {
            return Err(KernelError::Cancelled);
        }
        checked("Identifier", item_id)?;
        let call_json = checked("ToolCall", &call)?;
        self.record(
            json!({"type": "toolRequested", "turnId": self.turn.id, "itemId": item_id, "call": call_json}),
            "tool/requested",
            json!({"turnId": self.turn.id, "itemId": item_id, "call": call_json}),
        )?;
        let verdict = self.gate(item_id, &call, &call_json)?;
        let result = match verdict {
            Verdict::Cancel => {
                self.turn.cancel();
                ToolResult::Denied(ToolResultDenied {
                    reason: "the user cancelled the turn".into(),
                })
            }
            Verdict::Deny(reason) => ToolResult::Denied(ToolResultDenied { reason }),
            Verdict::Run => {
                self.inner
                    .stats
                    .tools_executed
                    .fetch_add(1, Ordering::SeqCst);
                self.inner.config.tools.execute(&self.thread.id, &call)
            }
        };
        // A tool executor's result is checked like kernel output; an invalid one is recorded as a
        // tool error rather than sent on.
        let (result, result_json) = match checked("ToolResult", &result) {
            Ok(json) => (result, json),
            Err(_) => {
                let error = ToolResult::Error(ToolResultError {
                    message: "the tool returned a result outside wire v1".into(),
                });
                let json = checked("ToolResult", &error)?;
                (error, json)
            }
        };
        self.record(
            json!({"type": "toolResult", "turnId": self.turn.id, "itemId": item_id, "result": result_json}),
            "tool/result",
            json!({"turnId": self.turn.id, "itemId": item_id, "result": result_json}),
        )?;
        if self.is_cancelled() {
            return Err(KernelError::Cancelled);
        }
        Ok(result)
    }

    fn is_cancelled(&self) -> bool {
        self.turn.cancelled.load(Ordering::SeqCst)
    }

    fn sleep_cancellable(&self, duration: Duration) -> bool {
        let deadline = Instant::now() + duration;
        let mut guard = lock(&self.turn.wake.0);
        loop {
            if self.is_cancelled() {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            guard = self
                .turn
                .wake
                .1
                .wait_timeout(guard, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}
