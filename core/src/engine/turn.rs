//! One turn's life: the runner thread that drives the kernel, the `TurnContext` it is given, and
//! the approval gate every tool request passes through. The terminal event is appended (durably)
//! before `turn/completed` is sent, and exactly once per turn.

use super::{deliver, emit, lock, ConnShared, Inner, ThreadState};
use crate::approval::{self, ApprovalPolicy};
use crate::kernel::{KernelError, TurnContext};
use crate::protocol::{
    ApprovalBinding, ApprovalDecideParams, ApprovalDecideRequest, ApprovalDecision,
    ApprovalFailure, ApprovalOutcome, ApprovalRequestedEvent, ApprovalRequestedNotification,
    ApprovalRequestedParams, ApprovalResolvedEvent, ApprovalResolvedNotification,
    ApprovalResolvedParams, EventPayload, Item, ItemCompletedEvent, ItemCompletedNotification,
    ItemCompletedParams, ItemDelta, ItemDeltaEvent, ItemDeltaNotification, ItemDeltaParams,
    ItemStartedEvent, ItemStartedNotification, ItemStartedParams, ServerNotification,
    ServerRequest, ToolCall, ToolRequestedEvent, ToolRequestedNotification, ToolRequestedParams,
    ToolResult, ToolResultDenied, ToolResultError, ToolResultEvent, ToolResultNotification,
    ToolResultParams, Turn, TurnCompletedEvent, TurnCompletedNotification, TurnCompletedParams,
    TurnError, TurnStatus, TurnStatusChangedEvent, UserInput,
};
use crate::time::{format_unix_millis, now_rfc3339, now_unix_millis};
use serde_json::{Map, Value};
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
    status: Mutex<TurnStatus>,
    cancelled: AtomicBool,
    wake: (Mutex<()>, Condvar),
    /// The terminal Turn once the runner has physically stopped.
    done: Mutex<Option<Turn>>,
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
            status: Mutex::new(TurnStatus::Queued),
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
    pub fn to_wire(&self) -> Turn {
        if let Some(done) = lock(&self.done).clone() {
            return done;
        }
        wire_turn(
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
    pub fn wait_settled(&self, timeout: Duration) -> Option<Turn> {
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

pub(crate) fn wire_turn(
    id: &str,
    thread_id: &str,
    status: TurnStatus,
    started_at: &str,
    completed_at: Option<&str>,
    error: Option<TurnError>,
) -> Turn {
    Turn {
        id: id.into(),
        thread_id: thread_id.into(),
        status,
        started_at: started_at.into(),
        completed_at: completed_at.map(str::to_string),
        error,
        extra: Map::new(),
    }
}

pub(crate) fn turn_error(code: &str, message: &str) -> TurnError {
    TurnError {
        code: code.into(),
        message: message.into(),
        extra: Map::new(),
    }
}

/// The JSON-RPC version every envelope carries.
pub(crate) fn rpc() -> String {
    "2.0".into()
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
        error_code: Mutex::new(None),
    };
    let result = if ctx.set_status(TurnStatus::Running).is_err() {
        Ok(Err(KernelError::Failed(
            "could not record the turn's start".into(),
        )))
    } else {
        std::panic::catch_unwind(AssertUnwindSafe(|| {
            inner.config.kernel.run_turn(&ctx, &input)
        }))
    };
    let cancelled = turn.cancelled.load(Ordering::SeqCst);
    let interrupted = || Some(turn_error("interrupted", "the turn was interrupted"));
    let (status, error) = match result {
        Ok(Err(KernelError::Failed(m))) => (
            TurnStatus::Failed,
            Some(turn_error(
                lock(&ctx.error_code).as_deref().unwrap_or("kernelFailed"),
                &truncate(&m, 1024),
            )),
        ),
        Err(_) => (
            TurnStatus::Failed,
            Some(turn_error(
                "kernelPanicked",
                "the agent kernel crashed; the turn was closed",
            )),
        ),
        Ok(Err(KernelError::Cancelled)) => (TurnStatus::Interrupted, interrupted()),
        Ok(Ok(())) if cancelled => (TurnStatus::Interrupted, interrupted()),
        Ok(Ok(())) => (TurnStatus::Completed, None),
    };
    finish(&inner, &thread, &turn, status, error);
}

/// Records the terminal event durably, then tells the hosts, then releases the thread.
fn finish(
    inner: &Inner,
    thread: &ThreadState,
    turn: &TurnShared,
    status: TurnStatus,
    error: Option<TurnError>,
) {
    let completed_at = now_rfc3339();
    let terminal = wire_turn(
        &turn.id,
        &turn.thread_id,
        status,
        &turn.started_at,
        Some(&completed_at),
        error.clone(),
    );
    let payload = EventPayload::TurnCompleted(TurnCompletedEvent {
        turn_id: turn.id.clone(),
        status,
        error,
        physically_settled: true,
        extra: Map::new(),
    });
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
        vec![ServerNotification::TurnCompleted(
            TurnCompletedNotification {
                jsonrpc: rpc(),
                params: TurnCompletedParams {
                    thread_id: thread.id.clone(),
                    event_seq: events[0].seq,
                    turn: terminal.clone(),
                    extra: Map::new(),
                },
            },
        )]
    });
    if let Err(e) = recorded {
        // The terminal could not be made durable: the turn is closed in memory, and recovery
        // closes it (as failed) on the next open, so it is never left dangling on disk.
        tracing::error!(
            target: "cc_app_server::turn",
            "could not record the end of turn {}: {e}",
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
    /// The code a kernel named for its failure (`TurnContext::set_error_code`).
    error_code: Mutex<Option<String>>,
}

/// A kernel's output, checked against the schema before it is recorded: the generated types keep
/// unknown display values (`Item::Unknown`), which a kernel must not invent.
fn checked<T: serde::Serialize + ?Sized>(definition: &str, value: &T) -> Result<(), KernelError> {
    let value = serde_json::to_value(value).map_err(|e| KernelError::Failed(e.to_string()))?;
    cc_agent_protocol::validate_protocol_definition(definition, &value).map_err(|e| {
        KernelError::Failed(format!("the kernel produced an invalid {definition}: {e}"))
    })
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
    fn set_status(&self, status: TurnStatus) -> Result<(), KernelError> {
        *lock(&self.turn.status) = status;
        let payload = EventPayload::TurnStatusChanged(TurnStatusChangedEvent {
            turn_id: self.turn.id.clone(),
            status,
            extra: Map::new(),
        });
        emit(self.inner, self.thread, vec![payload], |_| vec![])
            .map(|_| ())
            .map_err(recording_failed)
    }

    /// Appends one event and sends the notification built from its seq.
    fn record(
        &self,
        payload: EventPayload,
        note: impl FnOnce(String, u64) -> ServerNotification,
    ) -> Result<u64, KernelError> {
        let events = emit(self.inner, self.thread, vec![payload], |events| {
            vec![note(self.thread.id.clone(), events[0].seq)]
        })
        .map_err(recording_failed)?;
        Ok(events[0].seq)
    }

    fn turn_id_owned(&self) -> String {
        self.turn.id.clone()
    }

    /// The approval gate. Every path that does not end in an explicit acceptance fails closed.
    fn gate(&self, item_id: &str, call: &ToolCall) -> Result<Verdict, KernelError> {
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
        let binding = ApprovalBinding {
            thread_id: self.thread.id.clone(),
            turn_id: self.turn_id_owned(),
            item_id: item_id.into(),
            operation_digest: op.clone(),
            policy_digest: pd.clone(),
            workspace_digest: wd.clone(),
            nonce: nonce.clone(),
            expires_at: format_unix_millis(expires_ms),
        };
        let fail = |f: ApprovalFailure| (ApprovalOutcome::FailedClosed, None, Some(f));
        let (outcome, decision, failure) = match conn {
            None => fail(ApprovalFailure::TransportClosed),
            Some(conn) if !conn.has_feature("structured_approval") => {
                fail(ApprovalFailure::NoHandler)
            }
            Some(conn) => {
                let requested = EventPayload::ApprovalRequested(ApprovalRequestedEvent {
                    turn_id: self.turn_id_owned(),
                    item_id: item_id.into(),
                    binding: binding.clone(),
                    extra: Map::new(),
                });
                self.record(requested, |thread_id, event_seq| {
                    ServerNotification::ApprovalRequested(ApprovalRequestedNotification {
                        jsonrpc: rpc(),
                        params: ApprovalRequestedParams {
                            thread_id,
                            event_seq,
                            turn_id: self.turn_id_owned(),
                            item_id: item_id.into(),
                            binding: binding.clone(),
                            operation: call.clone(),
                            extra: Map::new(),
                        },
                    })
                })?;
                self.set_status(TurnStatus::WaitingApproval)?;
                let answer = self.ask(&conn, &binding, call, expires_ms);
                self.classify(answer, &binding, expires_ms, policy, &workspace)
            }
        };
        let resolved = EventPayload::ApprovalResolved(ApprovalResolvedEvent {
            turn_id: self.turn_id_owned(),
            item_id: item_id.into(),
            nonce: nonce.clone(),
            outcome,
            decision: decision.clone(),
            failure,
            extra: Map::new(),
        });
        self.record(resolved, |thread_id, event_seq| {
            ServerNotification::ApprovalResolved(ApprovalResolvedNotification {
                jsonrpc: rpc(),
                params: ApprovalResolvedParams {
                    thread_id,
                    event_seq,
                    turn_id: self.turn_id_owned(),
                    item_id: item_id.into(),
                    nonce: nonce.clone(),
                    outcome,
                    decision: decision.clone(),
                    failure,
                    extra: Map::new(),
                },
            })
        })?;
        if *lock(&self.turn.status) == TurnStatus::WaitingApproval {
            self.set_status(TurnStatus::Running)?;
        }
        Ok(match (outcome, decision) {
            (ApprovalOutcome::Approved, Some(ApprovalDecision::AcceptForTurn(_))) => {
                lock(&self.turn.grants).grant(&op, &pd, &wd);
                Verdict::Run
            }
            (ApprovalOutcome::Approved, Some(ApprovalDecision::AcceptForSession(_))) => {
                if let Some(c) = self.turn.conn.upgrade() {
                    lock(&c.session_grants).grant(&op, &pd, &wd)
                }
                Verdict::Run
            }
            (ApprovalOutcome::Approved, _) => Verdict::Run,
            (ApprovalOutcome::Cancelled, _) => Verdict::Cancel,
            (ApprovalOutcome::Declined, _) => Verdict::Deny("the user declined".into()),
            (ApprovalOutcome::FailedClosed, _) => {
                let why = failure.map(|f| serde_json::to_value(f).unwrap_or_default());
                Verdict::Deny(format!(
                    "approval failed closed: {}",
                    why.as_ref().and_then(Value::as_str).unwrap_or("unknown")
                ))
            }
        })
    }

    /// Sends approval/decide and waits for the answer, the expiry, cancellation or a closed
    /// connection — whichever comes first.
    fn ask(
        &self,
        conn: &Arc<ConnShared>,
        binding: &ApprovalBinding,
        call: &ToolCall,
        expires_ms: i64,
    ) -> Answer {
        let id = conn.next_request_id.fetch_add(1, Ordering::SeqCst);
        let (tx, rx) = sync_channel(1);
        lock(&conn.pending).insert(id, tx);
        let request = ServerRequest::ApprovalDecide(ApprovalDecideRequest {
            jsonrpc: rpc(),
            id,
            params: ApprovalDecideParams {
                binding: binding.clone(),
                operation: call.clone(),
                reason: None,
            },
        });
        deliver(
            self.inner,
            conn,
            serde_json::to_string(&request).expect("a server request is JSON"),
        );
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
        binding: &ApprovalBinding,
        expires_ms: i64,
        policy: ApprovalPolicy,
        workspace: &str,
    ) -> (
        ApprovalOutcome,
        Option<ApprovalDecision>,
        Option<ApprovalFailure>,
    ) {
        let fail = |f: ApprovalFailure| (ApprovalOutcome::FailedClosed, None, Some(f));
        let response = match answer {
            Answer::Response(v) => v,
            Answer::TimedOut => return fail(ApprovalFailure::Timeout),
            Answer::Closed => return fail(ApprovalFailure::TransportClosed),
            Answer::Interrupted => return (ApprovalOutcome::Cancelled, None, None),
        };
        let first_use = lock(&self.inner.used_nonces).insert(binding.nonce.clone());
        if response.get("error").is_some() {
            return fail(ApprovalFailure::HandlerError);
        }
        let result = response.get("result").cloned().unwrap_or(Value::Null);
        if cc_agent_protocol::validate_protocol_definition("ApprovalDecideResult", &result).is_err()
        {
            let decision_ok = result
                .get("decision")
                .is_some_and(|d| cc_agent_protocol::validate_approval_decision(d).is_ok());
            return fail(if decision_ok {
                ApprovalFailure::BindingMismatch
            } else {
                ApprovalFailure::UnknownDecision
            });
        }
        let answered = result["nonce"].as_str().unwrap_or_default();
        if answered != binding.nonce {
            let reused = lock(&self.inner.used_nonces).contains(answered);
            return fail(if reused {
                ApprovalFailure::NonceReused
            } else {
                ApprovalFailure::BindingMismatch
            });
        }
        if !first_use {
            return fail(ApprovalFailure::NonceReused);
        }
        if now_unix_millis() > expires_ms {
            return fail(ApprovalFailure::Expired);
        }
        let (now_policy, now_workspace) = lock(&self.inner.policy).clone();
        if now_policy != policy
            || now_workspace != workspace
            || binding.policy_digest != approval::policy_digest(now_policy)
            || binding.workspace_digest != approval::workspace_digest(&now_workspace)
        {
            return fail(ApprovalFailure::BindingMismatch);
        }
        // Validated above, so it decodes; a decode failure would still fail closed.
        let Ok(decision) = serde_json::from_value::<ApprovalDecision>(result["decision"].clone())
        else {
            return fail(ApprovalFailure::UnknownDecision);
        };
        let outcome = match decision {
            ApprovalDecision::AcceptOnce(_)
            | ApprovalDecision::AcceptForTurn(_)
            | ApprovalDecision::AcceptForSession(_) => ApprovalOutcome::Approved,
            ApprovalDecision::Decline(_) => ApprovalOutcome::Declined,
            ApprovalDecision::Cancel(_) => ApprovalOutcome::Cancelled,
        };
        (outcome, Some(decision), None)
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
        checked("Item", &item)?;
        let payload = EventPayload::ItemStarted(ItemStartedEvent {
            turn_id: self.turn_id_owned(),
            item: item.clone(),
            extra: Map::new(),
        });
        self.record(payload, |thread_id, event_seq| {
            ServerNotification::ItemStarted(ItemStartedNotification {
                jsonrpc: rpc(),
                params: ItemStartedParams {
                    thread_id,
                    event_seq,
                    turn_id: self.turn_id_owned(),
                    item,
                    extra: Map::new(),
                },
            })
        })
        .map(|_| ())
    }

    fn item_delta(&self, item_id: &str, delta: ItemDelta) -> Result<(), KernelError> {
        checked("Identifier", item_id)?;
        checked("ItemDelta", &delta)?;
        let payload = EventPayload::ItemDelta(ItemDeltaEvent {
            turn_id: self.turn_id_owned(),
            item_id: item_id.into(),
            delta: delta.clone(),
            extra: Map::new(),
        });
        self.record(payload, |thread_id, event_seq| {
            ServerNotification::ItemDelta(ItemDeltaNotification {
                jsonrpc: rpc(),
                params: ItemDeltaParams {
                    thread_id,
                    event_seq,
                    turn_id: self.turn_id_owned(),
                    item_id: item_id.into(),
                    delta,
                    extra: Map::new(),
                },
            })
        })
        .map(|_| ())
    }

    fn item_completed(&self, item: Item) -> Result<(), KernelError> {
        checked("Item", &item)?;
        let payload = EventPayload::ItemCompleted(ItemCompletedEvent {
            turn_id: self.turn_id_owned(),
            item: item.clone(),
            extra: Map::new(),
        });
        self.record(payload, |thread_id, event_seq| {
            ServerNotification::ItemCompleted(ItemCompletedNotification {
                jsonrpc: rpc(),
                params: ItemCompletedParams {
                    thread_id,
                    event_seq,
                    turn_id: self.turn_id_owned(),
                    item,
                    extra: Map::new(),
                },
            })
        })
        .map(|_| ())
    }

    fn request_tool(&self, item_id: &str, call: ToolCall) -> Result<ToolResult, KernelError> {
        if self.is_cancelled() {
            return Err(KernelError::Cancelled);
        }
        checked("Identifier", item_id)?;
        checked("ToolCall", &call)?;
        let requested = EventPayload::ToolRequested(ToolRequestedEvent {
            turn_id: self.turn_id_owned(),
            item_id: item_id.into(),
            call: call.clone(),
            extra: Map::new(),
        });
        self.record(requested, |thread_id, event_seq| {
            ServerNotification::ToolRequested(ToolRequestedNotification {
                jsonrpc: rpc(),
                params: ToolRequestedParams {
                    thread_id,
                    event_seq,
                    turn_id: self.turn_id_owned(),
                    item_id: item_id.into(),
                    call: call.clone(),
                    extra: Map::new(),
                },
            })
        })?;
        let result = match self.gate(item_id, &call)? {
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
        let result = match checked("ToolResult", &result) {
            Ok(()) => result,
            Err(_) => ToolResult::Error(ToolResultError {
                message: "the tool returned a result outside wire v1".into(),
            }),
        };
        let recorded = EventPayload::ToolResult(ToolResultEvent {
            turn_id: self.turn_id_owned(),
            item_id: item_id.into(),
            result: result.clone(),
            extra: Map::new(),
        });
        self.record(recorded, |thread_id, event_seq| {
            ServerNotification::ToolResult(ToolResultNotification {
                jsonrpc: rpc(),
                params: ToolResultParams {
                    thread_id,
                    event_seq,
                    turn_id: self.turn_id_owned(),
                    item_id: item_id.into(),
                    result: result.clone(),
                    extra: Map::new(),
                },
            })
        })?;
        if self.is_cancelled() {
            return Err(KernelError::Cancelled);
        }
        Ok(result)
    }

    fn is_cancelled(&self) -> bool {
        self.turn.cancelled.load(Ordering::SeqCst)
    }

    fn history(&self) -> Result<super::History, KernelError> {
        super::history::assemble(&*self.inner.store, &self.thread.id, Some(&self.turn.id))
            .map_err(|e| KernelError::Failed(format!("could not read the thread's history: {e}")))
    }

    fn tool_specs(&self) -> Vec<crate::kernel::ToolSpec> {
        self.inner.config.tools.tool_specs()
    }

    fn set_error_code(&self, code: &str) {
        // TurnError.code is 1-64 characters; anything else keeps the default.
        if !code.is_empty() && code.len() <= 64 {
            *lock(&self.error_code) = Some(code.to_string());
        }
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
