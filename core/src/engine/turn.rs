//! One turn's life: what the runner does with the kernel, the `TurnContext` it is given, and the
//! approval gate every tool request passes through. The kernel's events are pipelined
//! (pipeline.rs): each call hands its event over and returns, and its notification goes out once
//! the event is durable. Before a tool runs, before the host is asked for an approval and before
//! the turn ends, everything handed over is made durable and delivered first. The terminal event
//! is appended (durably) before `turn/completed` is sent, and exactly once per turn; the one
//! exception, a store that refuses writes, is spelled out at `unrecorded_end`.

use super::causal::{self, Step};
use super::outbound::{deliver, reply, result, rpc, RawId, RpcResult};
use super::pipeline::emit;
use super::pipeline::{self, Note};
use super::{lock, ConnShared, Inner, Stats, ThreadState};
use crate::approval::{self, ApprovalPolicy};
use crate::kernel::{KernelError, TurnContext};
use crate::protocol::{
    ApprovalBinding, ApprovalDecideRequest, ApprovalDecision, ApprovalFailure, ApprovalOutcome,
    ApprovalRequest, ApprovalRequestedEvent, ApprovalRequestedNotification,
    ApprovalRequestedParams, ApprovalResolvedEvent, EventPayload, ItemCompletedEvent, ItemContent,
    ItemDelta, ItemStartedEvent, ServerNotification, ServerRequest, TerminalEvidence, TextDelta,
    ToolCall, ToolRequestedEvent, ToolResult, ToolResultDenied, ToolResultError, ToolResultEvent,
    Turn, TurnCompletedEvent, TurnCompletedNotification, TurnCompletedParams, TurnError,
    TurnStatus, TurnStatusChangedEvent, UserInput,
};
use crate::rollout::{CheckedEvent, NewEvent, StoreError, MAX_TEXT_CHARS};
use crate::time::{format_unix_millis, now_rfc3339, now_unix_millis};
use serde_json::{Map, Value};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

/// A `turn/interrupt` waiting for the kernel to stop: answered by the runner when the turn
/// settles, or by its connection's worker at the deadline (whichever removes it first).
pub(crate) struct InterruptWaiter {
    pub conn: Weak<ConnShared>,
    pub conn_id: u64,
    /// The request id exactly as the host wrote it.
    pub request_id: RawId,
    pub deadline: Instant,
}

/// What the approval wait and the tool gate decide under one lock, so that "cancelled" and
/// "an answer arrived" are never read apart.
#[derive(Default)]
struct Control {
    /// The approval/decide request id the runner is waiting on, and the answer once it came.
    awaiting: Option<u64>,
    answer: Option<Value>,
}

/// A turn as the wire shows it, with why it ended: the published `Turn` has no error member, so
/// the error travels beside it (`turn/completed`, `turn/interrupt`).
#[derive(Debug, Clone)]
pub(crate) struct EndedTurn {
    pub turn: Turn,
    pub error: Option<TurnError>,
}

struct Done {
    /// The terminal Turn once the runner has physically stopped.
    terminal: Option<EndedTurn>,
    waiters: Vec<InterruptWaiter>,
}

/// A live turn, shared by its runner, the thread state and turn/interrupt.
pub(crate) struct TurnShared {
    pub id: String,
    pub thread_id: String,
    /// The `turnStarted` event's time once recorded (the wire Turn's `startedAt`).
    started_at: Mutex<String>,
    /// The thread's last seq when the turn was admitted: everything up to it is settled
    /// history, which is all `thread/fork` copies while the turn is live.
    pub base_seq: u64,
    status: Mutex<TurnStatus>,
    /// Written only while holding `ctl`, so a check made under `ctl` is atomic with `cancel`.
    cancelled: AtomicBool,
    ctl: Mutex<Control>,
    /// Wakes the approval wait and cancellable sleeps: on cancel, on an answer, on a closed
    /// connection.
    wake: Condvar,
    done: Mutex<Done>,
    pub conn: Weak<ConnShared>,
    grants: Mutex<approval::Grants>,
    next_item: AtomicU64,
    /// The wire Turn's `revision`: how many state changes of this turn were recorded.
    changes: AtomicU64,
    /// Digest of the text of the turn's last completed assistant message (its terminal
    /// evidence's `outputDigest`).
    output_digest: Mutex<Option<String>>,
    /// When each item started (`item/started`'s time), for the published Item's `createdAt`
    /// on `item/completed`. Written and read on the committer, in seq order.
    pub item_times: Arc<Mutex<std::collections::HashMap<String, String>>>,
    /// The write scope a graph node's turn runs under: its tool calls go to
    /// `ToolExecutor::execute_scoped`, which checks the path the tool actually resolves.
    pub write_scope: std::sync::OnceLock<Vec<String>>,
    /// What the turn has streamed so far (`Limits::max_turn_output_bytes`).
    streamed: Mutex<Streamed>,
    /// The turn's trace id and which of its events caused which (causal.rs).
    pub trace: Mutex<super::causal::TurnTrace>,
}

/// The output a turn has streamed, counted before each delta or tool result is recorded.
#[derive(Default)]
struct Streamed {
    /// Delta text bytes (other deltas' and tool results' JSON bytes), plus
    /// `EVENT_ENVELOPE_BYTES` per event.
    bytes: usize,
    /// Characters of delta text per item: an item's text must still fit the rollout's bound
    /// (`MAX_TEXT_CHARS`) when it completes, so the stream is stopped before it cannot.
    chars: std::collections::HashMap<String, usize>,
    /// Set once a bound was passed: every later delta is refused too.
    exceeded: bool,
}

impl TurnShared {
    pub fn new(id: String, thread_id: String, conn: Weak<ConnShared>, base_seq: u64) -> Arc<Self> {
        Arc::new(TurnShared {
            id,
            thread_id,
            started_at: Mutex::new(now_rfc3339()),
            base_seq,
            status: Mutex::new(TurnStatus::Queued),
            cancelled: AtomicBool::new(false),
            ctl: Mutex::new(Control::default()),
            wake: Condvar::new(),
            done: Mutex::new(Done {
                terminal: None,
                waiters: Vec::new(),
            }),
            conn,
            grants: Mutex::new(Default::default()),
            next_item: AtomicU64::new(1),
            changes: AtomicU64::new(0),
            output_digest: Mutex::new(None),
            item_times: Arc::new(Mutex::new(std::collections::HashMap::new())),
            write_scope: std::sync::OnceLock::new(),
            streamed: Mutex::new(Streamed::default()),
            trace: Mutex::new(Default::default()),
        })
    }

    pub fn set_started_at(&self, time: &str) {
        *lock(&self.started_at) = time.to_string();
    }

    /// The wire Turn as it stands now.
    pub fn to_wire(&self) -> Turn {
        self.to_ended().turn
    }

    /// The wire Turn as it stands now, with its error once it ended.
    pub fn to_ended(&self) -> EndedTurn {
        if let Some(done) = lock(&self.done).terminal.clone() {
            return done;
        }
        EndedTurn {
            turn: wire_turn(
                &self.id,
                &self.thread_id,
                *lock(&self.status),
                &lock(&self.started_at),
                None,
                self.changes.load(Ordering::SeqCst),
                None,
            ),
            error: None,
        }
    }

    /// Remembers the digest of the latest assistant message (the turn's output).
    pub fn set_output(&self, text: &str) {
        *lock(&self.output_digest) = Some(approval::digest_json(&Value::String(text.into())));
    }

    /// Asks the kernel to stop and wakes the approval wait and any cancellable sleep. Once this
    /// returns, no tool of this turn starts (see `may_start_tool`).
    pub fn cancel(&self) {
        let _ctl = lock(&self.ctl);
        self.cancelled.store(true, Ordering::SeqCst);
        self.wake.notify_all();
    }

    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
    }

    /// Wakes the runner's waits so it re-checks the connection (it was closed).
    pub fn wake(&self) {
        let _ctl = lock(&self.ctl);
        self.wake.notify_all();
    }

    /// The host's answer to the approval/decide request `id`, if the runner still waits for it.
    pub fn answer(&self, id: u64, response: Value) -> bool {
        let mut ctl = lock(&self.ctl);
        if ctl.awaiting != Some(id) || ctl.answer.is_some() {
            return false;
        }
        ctl.answer = Some(response);
        self.wake.notify_all();
        true
    }

    /// The decision to run a tool, taken under the same lock as `cancel`: an interrupt accepted
    /// before this point always wins.
    fn may_start_tool(&self) -> bool {
        let _ctl = lock(&self.ctl);
        !self.cancelled.load(Ordering::SeqCst)
    }

    /// The terminal Turn if the runner has stopped; otherwise registers `waiter` to be answered
    /// when it does.
    pub fn settled_or_wait(&self, waiter: InterruptWaiter) -> Result<EndedTurn, ()> {
        let mut done = lock(&self.done);
        match &done.terminal {
            Some(t) => Ok(t.clone()),
            None => {
                done.waiters.push(waiter);
                Err(())
            }
        }
    }

    pub fn is_done(&self) -> bool {
        lock(&self.done).terminal.is_some()
    }

    /// Removes this connection's waiters whose deadline has passed (they are answered -32010).
    pub fn take_expired(&self, conn_id: u64, now: Instant) -> Vec<InterruptWaiter> {
        let mut done = lock(&self.done);
        let (expired, kept) = std::mem::take(&mut done.waiters)
            .into_iter()
            .partition(|w| w.conn_id == conn_id && w.deadline <= now);
        done.waiters = kept;
        expired
    }

    /// Marks the turn settled and hands back the interrupts waiting for that.
    fn settle(&self, terminal: EndedTurn, status: TurnStatus) -> Vec<InterruptWaiter> {
        *lock(&self.status) = status;
        let mut done = lock(&self.done);
        done.terminal = Some(terminal);
        std::mem::take(&mut done.waiters)
    }
}

pub(crate) fn wire_turn(
    id: &str,
    thread_id: &str,
    status: TurnStatus,
    created_at: &str,
    completed_at: Option<&str>,
    revision: u64,
    terminal_evidence: Option<TerminalEvidence>,
) -> Turn {
    Turn {
        id: id.into(),
        thread_id: thread_id.into(),
        status,
        created_at: created_at.into(),
        completed_at: completed_at.map(str::to_string),
        revision,
        terminal_evidence,
    }
}

/// The published terminal evidence of a turn that ended with `status`, whose terminal rollout
/// event has chain hash `event_hash`.
pub(crate) fn terminal_evidence(
    status: TurnStatus,
    event_hash: &str,
    output_digest: Option<String>,
) -> TerminalEvidence {
    let status = match status {
        TurnStatus::Completed => "succeeded",
        TurnStatus::Interrupted => "cancelled",
        _ => "failed",
    };
    TerminalEvidence {
        status: status.into(),
        event_digest: format!("sha256:{event_hash}"),
        output_digest: Some(output_digest),
        artifact_ids: None,
        commit: None,
        test_receipt_ids: None,
    }
}

pub(crate) fn turn_error(code: &str, message: &str) -> TurnError {
    TurnError {
        code: code.into(),
        message: message.into(),
        extra: Map::new(),
    }
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

/// Drives one turn on a runner thread, from running to its single terminal event.
pub(crate) fn run(job: Job) {
    let Job {
        inner,
        thread,
        turn,
        input,
    } = job;
    let kernel = Arc::clone(&inner.config.kernel);
    run_on(inner, thread, turn, input, &*kernel);
}

/// `run` with a given kernel: the graph runtime runs each node attempt as a turn this way
/// (core/graph/src/exec.rs, through core/src/engine/attempt.rs), so its tool calls pass this same approval gate.
pub(crate) fn run_on(
    inner: Arc<Inner>,
    thread: Arc<ThreadState>,
    turn: Arc<TurnShared>,
    input: Vec<UserInput>,
    kernel: &dyn crate::kernel::AgentKernel,
) {
    // Everything logged while the turn runs carries its trace id, so host logs and the rollout
    // join on it. At error level so it is there whenever anything is logged at all.
    let trace_id = lock(&turn.trace).id().unwrap_or_default().to_string();
    let _span = tracing::error_span!(
        "turn",
        trace_id = trace_id.as_str(),
        thread_id = thread.id.as_str(),
        turn_id = turn.id.as_str()
    )
    .entered();
    if turn.is_cancelled() {
        // Interrupted while it waited for a runner: the kernel never starts.
        let error = Some(turn_error("interrupted", "the turn was interrupted"));
        finish(&inner, &thread, &turn, TurnStatus::Interrupted, error);
        return;
    }
    let ctx = KernelContext {
        inner: &inner,
        thread: &thread,
        turn: &turn,
        agent_options: lock(&thread.data).agent_options.clone(),
        error_code: Mutex::new(None),
        recording_failed: AtomicBool::new(false),
    };
    lock(&thread.pipe).reset();
    let result = if ctx.set_status(TurnStatus::Running).is_err() {
        Ok(Err(KernelError::Failed(
            "could not record the turn's start".into(),
        )))
    } else {
        std::panic::catch_unwind(AssertUnwindSafe(|| kernel.run_turn(&ctx, &input)))
    };
    // Whatever the kernel handed over is durable and delivered before the turn is judged; a
    // commit that failed after the kernel's last call still fails the turn as unrecorded.
    if pipeline::flush(&thread).is_err() {
        ctx.recording_failed.store(true, Ordering::SeqCst);
    }
    let cancelled = turn.is_cancelled();
    let interrupted = || Some(turn_error("interrupted", "the turn was interrupted"));
    let (status, error) = match result {
        // The store refused an event: whatever the kernel made of that, the turn could not be
        // recorded, and the host is told so by code.
        _ if ctx.recording_failed.load(Ordering::SeqCst) => (
            TurnStatus::Failed,
            Some(turn_error(
                "recordingFailed",
                "an event of this turn could not be written to the rollout (disk full or I/O error); the turn was stopped",
            )),
        ),
        // Past its output bound the turn fails as such, whatever the kernel made of the refusal
        // (it may have swallowed it and ended normally).
        _ if lock(&turn.streamed).exceeded => (
            TurnStatus::Failed,
            Some(turn_error(
                OUTPUT_LIMIT_CODE,
                &format!(
                    "the turn passed its output bound ({} bytes, or {MAX_TEXT_CHARS} characters in one item) and was stopped; what it streamed before is recorded",
                    inner.config.limits.max_turn_output_bytes
                ),
            )),
        ),
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
    if let Some(e) = error.as_ref().filter(|_| status == TurnStatus::Failed) {
        // Inside the turn's span: the record carries its trace id.
        tracing::warn!(
            target: "cc_app_server::turn",
            "turn {} failed ({}): {}",
            turn.id,
            e.code,
            &*e.message
        );
    }
    finish(&inner, &thread, &turn, status, error);
}

/// Why a turn ends without its kernel ever starting.
pub(crate) enum Unstarted {
    /// Interrupted (or the server shut down) while it waited for a runner.
    Interrupted,
    /// No runner thread exists and the OS refused to create one.
    NoRunner,
}

/// Closes an admitted turn that never reached a runner, in exactly one recorded terminal state,
/// and gives its place in the pool back.
pub(crate) fn close_unstarted(job: Job, why: Unstarted) {
    let (status, error) = match why {
        Unstarted::Interrupted => (
            TurnStatus::Interrupted,
            turn_error("interrupted", "the turn was interrupted before it started"),
        ),
        Unstarted::NoRunner => (
            TurnStatus::Failed,
            turn_error(
                "runnerUnavailable",
                "the server could not start a thread to run this turn (the system refused to create one); retry later",
            ),
        ),
    };
    finish(&job.inner, &job.thread, &job.turn, status, Some(error));
    job.inner.pool.release();
}

/// Records the terminal event durably, then tells the hosts, then answers the interrupts that
/// waited for it. If the store refuses the terminal event too (disk full), the turn still ends
/// for everyone: see `unrecorded_end`.
pub(crate) fn finish(
    inner: &Inner,
    thread: &ThreadState,
    turn: &TurnShared,
    status: TurnStatus,
    error: Option<TurnError>,
) {
    let completed_at = now_rfc3339();
    let revision = turn.changes.fetch_add(1, Ordering::SeqCst) + 1;
    let mut terminal = EndedTurn {
        turn: wire_turn(
            &turn.id,
            &turn.thread_id,
            status,
            &lock(&turn.started_at),
            Some(&completed_at),
            revision,
            None,
        ),
        error: error.clone(),
    };
    let output = lock(&turn.output_digest).clone();
    let payload = EventPayload::TurnCompleted(TurnCompletedEvent {
        turn_id: turn.id.clone(),
        status,
        error,
        physically_settled: true,
        extra: Map::new(),
    });
    let mut waiters = Vec::new();
    // The thread is released after the terminal event is durable but before any host hears of
    // it, so a host that starts the next turn on `turn/completed` never meets a stale -32009.
    let mut release = |terminal: EndedTurn| {
        waiters = turn.settle(terminal.clone(), status);
        let mut data = lock(&thread.data);
        data.remember_turn(terminal, inner.config.limits.recent_turns);
        if data.active.as_ref().is_some_and(|a| a.id == turn.id) {
            data.active = None;
        }
    };
    let mut ended = event(&payload);
    (ended.trace_id, ended.parent_id) = lock(&turn.trace).ids(Step::OfTurn, None);
    let recorded = emit(inner, thread, vec![ended], |events| {
        terminal.turn.completed_at = Some(events[0].time.clone());
        terminal.turn.terminal_evidence =
            Some(terminal_evidence(status, &events[0].hash, output.clone()));
        release(terminal.clone());
        vec![ServerNotification::TurnCompleted(
            TurnCompletedNotification {
                jsonrpc: rpc(),
                params: TurnCompletedParams {
                    thread_id: thread.id.clone(),
                    event_seq: events[0].seq,
                    turn: terminal.turn.clone(),
                    error: terminal.error.clone(),
                    extra: Map::new(),
                },
            },
        )]
    });
    let terminal = match recorded {
        Ok(_) => turn.to_ended(),
        Err(e) => unrecorded_end(inner, thread, turn, &e, release),
    };
    for w in waiters {
        if let Some(conn) = w.conn.upgrade() {
            reply_settled(&inner.stats, &conn, &w.request_id, terminal.clone());
        }
    }
}

/// The terminal event could not be written (disk full, I/O error). The turn must still end in
/// one terminal state the host can see: it is closed in memory as `failed` with
/// `recordingFailed`, `turn/completed` goes out now carrying the thread's last durable seq, and
/// the terminal event is written before anything else on this thread once the store accepts
/// writes again (or by recovery on the next open). This is the one notification sent without its
/// event on disk; it announces exactly what the durable log will say once it can be written, so
/// a host never acts on something a crash could take back.
fn unrecorded_end(
    inner: &Inner,
    thread: &ThreadState,
    turn: &TurnShared,
    cause: &StoreError,
    mut release: impl FnMut(EndedTurn),
) -> EndedTurn {
    tracing::error!(
        target: "cc_app_server::turn",
        "could not record the end of turn {}: {cause}; it ends as failed/recordingFailed and is recorded when the store accepts writes again",
        turn.id
    );
    Stats::bump(&inner.stats.unrecorded_terminals);
    let error = turn_error(
        "recordingFailed",
        "the end of this turn could not be written to the rollout (disk full or I/O error); it is recorded as failed once the store accepts writes again",
    );
    // No terminal evidence: the terminal event is not durable yet.
    let terminal = EndedTurn {
        turn: wire_turn(
            &turn.id,
            &turn.thread_id,
            TurnStatus::Failed,
            &lock(&turn.started_at),
            Some(&now_rfc3339()),
            turn.changes.load(Ordering::SeqCst),
            None,
        ),
        error: Some(error.clone()),
    };
    let pending = EventPayload::TurnCompleted(TurnCompletedEvent {
        turn_id: turn.id.clone(),
        status: TurnStatus::Failed,
        error: Some(error),
        physically_settled: true,
        extra: Map::new(),
    });
    let _emitting = lock(&thread.emit_lock);
    let last_seq = {
        let mut data = lock(&thread.data);
        data.pending_terminal = Some(pending);
        data.last_seq
    };
    release(terminal.clone());
    let note = ServerNotification::TurnCompleted(TurnCompletedNotification {
        jsonrpc: rpc(),
        params: TurnCompletedParams {
            thread_id: thread.id.clone(),
            event_seq: last_seq,
            turn: terminal.turn.clone(),
            error: terminal.error.clone(),
            extra: Map::new(),
        },
    });
    let text = serde_json::to_string(&note).expect("a notification is JSON");
    for conn in inner.connections.followers(&thread.id) {
        deliver(&inner.stats, &conn, text.clone());
    }
    terminal
}

struct KernelContext<'a> {
    inner: &'a Arc<Inner>,
    thread: &'a Arc<ThreadState>,
    turn: &'a Arc<TurnShared>,
    agent_options: Value,
    /// The code a kernel named for its failure (`TurnContext::set_error_code`).
    error_code: Mutex<Option<String>>,
    /// Set when the store refused one of this turn's events.
    recording_failed: AtomicBool,
}

// How deep a kernel's output may nest: defined in the kernel layer, which builds within it.
use crate::kernel::MAX_OUTPUT_DEPTH;

/// What one event costs against `Limits::max_turn_output_bytes` beyond its text (or its delta's or
/// result's JSON): the rest of the event on disk (`seq`, `time`, `prevHash`, `hash`, type and
/// ids: about 250 bytes), so that the bound holds the rollout's growth too, however small the
/// deltas.
pub const EVENT_ENVELOPE_BYTES: usize = 256;

/// The turn error code of a turn stopped at `Limits::max_turn_output_bytes` (or at an item's
/// text bound).
pub const OUTPUT_LIMIT_CODE: &str = "outputLimitExceeded";

/// Arrays and objects nest at most `limit` levels in `v` (itself the first).
fn within_depth(v: &Value, limit: usize) -> bool {
    match v {
        Value::Array(a) => limit > 0 && a.iter().all(|x| within_depth(x, limit - 1)),
        Value::Object(o) => limit > 0 && o.values().all(|x| within_depth(x, limit - 1)),
        _ => true,
    }
}

/// A kernel's output, checked against the schema and the depth bound before it is recorded: the
/// generated types keep unknown display values (`ItemContent::Unknown`) and unknown members, which a
/// kernel must not invent nor nest past what every reader can parse.
fn checked<T: serde::Serialize + ?Sized>(definition: &str, value: &T) -> Result<(), KernelError> {
    let value = serde_json::to_value(value).map_err(|e| KernelError::Failed(e.to_string()))?;
    if !within_depth(&value, MAX_OUTPUT_DEPTH) {
        return Err(KernelError::Failed(format!(
            "the kernel produced a {definition} nested more than {MAX_OUTPUT_DEPTH} levels deep"
        )));
    }
    cc_agent_protocol::validate_protocol_definition(definition, &value).map_err(|e| {
        KernelError::Failed(format!("the kernel produced an invalid {definition}: {e}"))
    })
}

/// A store event from a typed payload.
pub(crate) fn event(payload: &EventPayload) -> NewEvent {
    NewEvent::new(serde_json::to_value(payload).expect("an event payload is JSON"))
}

fn to_payload(payload: &EventPayload) -> Result<Value, KernelError> {
    serde_json::to_value(payload).map_err(|e| KernelError::Failed(e.to_string()))
}

/// `to_payload(EventPayload::ItemDelta(..))`, member for member and in the same order, built
/// directly: the generated serialiser builds each tagged layer as a `Value` and copies it into the
/// next, several times the cost of the event itself on a turn's hottest path. The result is
/// checked against the schema all the same (`record_value`), and a test holds it equal to the
/// generic path's.
fn delta_payload(turn_id: String, item_id: &str, delta: ItemDelta) -> Result<Value, KernelError> {
    let delta = match delta {
        ItemDelta::Text(TextDelta { text, extra }) => {
            // Sized up front: growing a map member by member costs more than filling it.
            let mut m = Map::with_capacity(2 + extra.len());
            m.insert("type".into(), Value::from("text"));
            m.insert("text".into(), Value::String(text));
            m.extend(extra);
            Value::Object(m)
        }
        other => serde_json::to_value(&other).map_err(|e| KernelError::Failed(e.to_string()))?,
    };
    let mut m = Map::with_capacity(4);
    m.insert("type".into(), Value::from("itemDelta"));
    m.insert("turnId".into(), Value::String(turn_id));
    m.insert("itemId".into(), Value::from(item_id));
    m.insert("delta".into(), delta);
    Ok(Value::Object(m))
}

/// What the approval gate concluded for one tool request.
enum Verdict {
    Run,
    Deny(String),
    Cancel,
}

impl KernelContext<'_> {
    /// The store refused this turn's events (the committer has logged and counted it).
    /// Adds `bytes` (and `chars` of `item`'s text) to what the turn streamed; past a bound the
    /// turn's error code becomes `outputLimitExceeded` and the kernel gets an error to stop on.
    fn charge(&self, item: Option<&str>, bytes: usize, chars: usize) -> Result<(), KernelError> {
        let limit = self.inner.config.limits.max_turn_output_bytes;
        let mut s = lock(&self.turn.streamed);
        let total = s.bytes.saturating_add(bytes);
        let item_chars = item.map_or(0, |id| {
            s.chars.get(id).copied().unwrap_or(0).saturating_add(chars)
        });
        let why = if s.exceeded {
            Some("the turn already passed its output bound".to_string())
        } else if total > limit {
            Some(format!(
                "the turn streamed more than its bound of {limit} bytes of recorded output (max_turn_output_bytes); the stream was stopped and what came before it is recorded"
            ))
        } else if item_chars > MAX_TEXT_CHARS {
            Some(format!(
                "item {} streamed more than {MAX_TEXT_CHARS} characters of text; the stream was stopped and what came before it is recorded",
                item.unwrap_or_default()
            ))
        } else {
            None
        };
        if let Some(why) = why {
            s.exceeded = true;
            drop(s);
            *lock(&self.error_code) = Some(OUTPUT_LIMIT_CODE.to_string());
            return Err(KernelError::Failed(why));
        }
        s.bytes = total;
        if let Some(id) = item {
            if chars > 0 {
                s.chars.insert(id.to_string(), item_chars);
            }
        }
        Ok(())
    }

    fn failed_to_record(&self, message: String) -> KernelError {
        self.recording_failed.store(true, Ordering::SeqCst);
        KernelError::Failed(message)
    }

    fn set_status(&self, status: TurnStatus) -> Result<(), KernelError> {
        *lock(&self.turn.status) = status;
        self.turn.changes.fetch_add(1, Ordering::SeqCst);
        let payload = EventPayload::TurnStatusChanged(TurnStatusChangedEvent {
            turn_id: self.turn.id.clone(),
            status,
            extra: Map::new(),
        });
        self.record_value(to_payload(&payload)?, None, Note::None)
    }

    /// Hands one event over for recording; `note` goes to the followers once it is durable.
    /// The payload is checked against the schema once, here (the store does not check it
    /// again); `part` names the kernel's member of it, for the depth bound and the wording of
    /// a refusal.
    fn record_value(
        &self,
        payload: Value,
        part: Option<(&str, &str)>,
        note: Note,
    ) -> Result<(), KernelError> {
        if let Some((definition, member)) = part {
            if !within_depth(&payload[member], MAX_OUTPUT_DEPTH) {
                return Err(KernelError::Failed(format!(
                    "the kernel produced a {definition} nested more than {MAX_OUTPUT_DEPTH} levels deep"
                )));
            }
        }
        let bytes = pipeline::approx_json_len(&payload);
        let (step, item) = causal::step_of(&payload);
        let event = match CheckedEvent::try_new(NewEvent::new(payload)) {
            Ok(e) => e,
            Err((e, refused)) => {
                // Said in terms of what the kernel produced where that is what is wrong.
                if let Some((definition, member)) = part {
                    checked(definition, &refused.payload[member])?;
                }
                return Err(KernelError::Failed(format!(
                    "the kernel produced an invalid event: {e}"
                )));
            }
        };
        self.record_traced(event, step, item.as_deref(), bytes, note)
    }

    /// Hands a checked event over with its trace and parent ids (causal.rs), and remembers
    /// the seq it gets.
    fn record_traced(
        &self,
        mut event: CheckedEvent,
        step: Step,
        item: Option<&str>,
        bytes: usize,
        note: Note,
    ) -> Result<(), KernelError> {
        let (trace_id, parent_id) = lock(&self.turn.trace).ids(step, item);
        event.set_trace(trace_id, parent_id);
        let seq = pipeline::record(self.inner, self.thread, event, bytes, note)
            .map_err(|e| self.failed_to_record(e))?;
        lock(&self.turn.trace).recorded(step, item, seq);
        Ok(())
    }

    /// Everything handed over so far is durable and delivered (before a tool runs, before the
    /// host is asked for an approval).
    fn flush(&self) -> Result<(), KernelError> {
        pipeline::flush(self.thread).map_err(|e| self.failed_to_record(e))
    }

    /// Records an event whose notification is built from its seq (the rare kinds).
    fn record(
        &self,
        payload: EventPayload,
        note: impl FnOnce(String, u64) -> ServerNotification + Send + 'static,
    ) -> Result<(), KernelError> {
        let thread_id = self.thread.id.clone();
        let build = Box::new(move |seq: u64| {
            serde_json::to_string(&note(thread_id, seq)).expect("a notification is JSON")
        });
        self.record_value(to_payload(&payload)?, None, Note::Build(build))
    }

    fn turn_id_owned(&self) -> String {
        self.turn.id.clone()
    }

    /// The approval gate. Every path that does not end in an explicit acceptance fails closed.
    fn gate(&self, item_id: &str, call: &ToolCall) -> Result<Verdict, KernelError> {
        let (policy, workspace) = self.inner.approvals.current();
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
            workspace_digest: Some(wd.clone()),
            attempt_id: None,
            cwd: None,
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
                let (turn_id, item, bound, operation) = (
                    self.turn_id_owned(),
                    item_id.to_string(),
                    binding.clone(),
                    call.clone(),
                );
                self.record(requested, move |thread_id, event_seq| {
                    ServerNotification::ApprovalRequested(ApprovalRequestedNotification {
                        jsonrpc: rpc(),
                        params: ApprovalRequestedParams {
                            thread_id,
                            event_seq,
                            turn_id,
                            item_id: item,
                            binding: bound,
                            operation,
                            extra: Map::new(),
                        },
                    })
                })?;
                self.set_status(TurnStatus::WaitingApproval)?;
                // The host has heard approval/requested (durable) before it is asked.
                self.flush()?;
                let answer = self.ask(&conn, &binding, call, expires_ms);
                self.classify(answer, &binding, expires_ms, policy, &workspace)
            }
        };
        if let Some(reason) = failure {
            self.inner.stats.failed_closed(reason);
        }
        let resolved = EventPayload::ApprovalResolved(ApprovalResolvedEvent {
            turn_id: self.turn_id_owned(),
            item_id: item_id.into(),
            nonce: nonce.clone(),
            outcome,
            decision: decision.clone(),
            failure,
            extra: Map::new(),
        });
        self.record_value(
            to_payload(&resolved)?,
            None,
            Note::Mirror("approval/resolved"),
        )?;
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
            // A decline is not always a person's: a client with no handler, a handler that
            // failed or did not answer in time declines too, and says so in the reason. The
            // denied result carries that reason as it came, so the model and the host see the
            // real cause; only a decline without one is the user's bare "no".
            (ApprovalOutcome::Declined, Some(ApprovalDecision::Decline(d))) => {
                Verdict::Deny(match d.reason.as_deref().map(str::trim) {
                    Some(r) if !r.is_empty() => format!("approval declined: {r}"),
                    _ => "the user declined".into(),
                })
            }
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
        {
            let mut ctl = lock(&self.turn.ctl);
            ctl.awaiting = Some(id);
            ctl.answer = None;
        }
        lock(&conn.pending).insert(id, Arc::clone(self.turn));
        let request = ServerRequest::ApprovalDecide(ApprovalDecideRequest {
            jsonrpc: rpc(),
            id: id.into(),
            params: ApprovalRequest {
                id: format!("approval-{}", binding.nonce),
                binding: binding.clone(),
                operation: call.clone(),
                risk: approval::risk_of(&call.tool),
                reason: format!("{} wants to run", call.tool),
                requested_permissions: None,
            },
        });
        deliver(
            &self.inner.stats,
            conn,
            serde_json::to_string(&request).expect("a server request is JSON"),
        );
        let grace = self.inner.config.approval_grace.as_millis() as i64;
        let wait_ms = (expires_ms + grace - now_unix_millis()).max(0) as u64;
        let deadline = Instant::now() + Duration::from_millis(wait_ms);
        let mut ctl = lock(&self.turn.ctl);
        let answer = loop {
            // Cancellation first: an interrupt accepted before the answer was read wins, even
            // when both are there at once.
            if self.turn.is_cancelled() {
                break Answer::Interrupted;
            }
            if let Some(v) = ctl.answer.take() {
                break Answer::Response(v);
            }
            if !conn.is_open() {
                break Answer::Closed;
            }
            let now = Instant::now();
            if now >= deadline {
                break Answer::TimedOut;
            }
            // Woken by cancel, an answer or a closed connection; otherwise asleep to the
            // approval's own deadline (no periodic wake-up).
            ctl = self
                .turn
                .wake
                .wait_timeout(ctl, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        };
        ctl.awaiting = None;
        ctl.answer = None;
        drop(ctl);
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
        let forget_at = expires_ms + self.inner.config.approval_grace.as_millis() as i64;
        let first_use =
            self.inner
                .approvals
                .use_nonce(&binding.nonce, forget_at, now_unix_millis());
        if response.get("error").is_some() {
            return fail(ApprovalFailure::HandlerError);
        }
        // The answer is the bare published decision; the binding is the one this request carried,
        // held here against the request id, so nothing the host echoes can re-bind it.
        let result = response.get("result").cloned().unwrap_or(Value::Null);
        if cc_agent_protocol::validate_approval_decision(&result).is_err() {
            return fail(ApprovalFailure::UnknownDecision);
        }
        if !first_use {
            return fail(ApprovalFailure::NonceReused);
        }
        if now_unix_millis() > expires_ms {
            return fail(ApprovalFailure::Expired);
        }
        let (now_policy, now_workspace) = self.inner.approvals.current();
        if now_policy != policy
            || now_workspace != workspace
            || binding.policy_digest != approval::policy_digest(now_policy)
            || binding.workspace_digest.as_deref()
                != Some(approval::workspace_digest(&now_workspace).as_str())
        {
            return fail(ApprovalFailure::BindingMismatch);
        }
        // Validated above, so it decodes; a decode failure would still fail closed.
        let Ok(decision) = serde_json::from_value::<ApprovalDecision>(result) else {
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

impl TurnContext for KernelContext<'_> {
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

    fn item_started(&self, item: ItemContent) -> Result<(), KernelError> {
        let payload = EventPayload::ItemStarted(ItemStartedEvent {
            turn_id: self.turn_id_owned(),
            item,
            extra: Map::new(),
        });
        self.record_value(
            to_payload(&payload)?,
            Some(("ItemContent", "item")),
            Note::Item {
                completed: false,
                times: Arc::clone(&self.turn.item_times),
            },
        )
    }

    fn item_delta(&self, item_id: &str, delta: ItemDelta) -> Result<(), KernelError> {
        // The streaming hot path: a plain text delta is checked and encoded from its parts.
        if let ItemDelta::Text(TextDelta { text, extra }) = &delta {
            if extra.is_empty() {
                if let Some(event) = CheckedEvent::text_delta(&self.turn.id, item_id, text) {
                    let bytes = event.encoded_len();
                    self.charge(
                        Some(item_id),
                        text.len() + EVENT_ENVELOPE_BYTES,
                        text.chars().count(),
                    )?;
                    return self.record_traced(
                        event,
                        Step::Delta,
                        Some(item_id),
                        bytes,
                        Note::Mirror("item/delta"),
                    );
                }
            }
        }
        let (bytes, chars) = match &delta {
            ItemDelta::Text(t) => (t.text.len(), t.text.chars().count()),
            other => (serde_json::to_vec(other).map_or(0, |v| v.len()), 0),
        };
        let payload = delta_payload(self.turn_id_owned(), item_id, delta)?;
        let cost = bytes + EVENT_ENVELOPE_BYTES;
        self.charge(Some(item_id), cost, chars)?;
        self.record_value(
            payload,
            Some(("ItemDelta", "delta")),
            Note::Mirror("item/delta"),
        )
    }

    fn item_completed(&self, item: ItemContent) -> Result<(), KernelError> {
        if let ItemContent::AgentMessage(m) = &item {
            self.turn.set_output(&m.text);
        }
        let payload = EventPayload::ItemCompleted(ItemCompletedEvent {
            turn_id: self.turn_id_owned(),
            item,
            extra: Map::new(),
        });
        self.record_value(
            to_payload(&payload)?,
            Some(("ItemContent", "item")),
            Note::Item {
                completed: true,
                times: Arc::clone(&self.turn.item_times),
            },
        )
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
        self.record_value(
            to_payload(&requested)?,
            None,
            Note::Mirror("tool/requested"),
        )?;
        let verdict = self.gate(item_id, &call)?;
        // The request and the approval's outcome are durable (and announced) before any tool
        // runs: a tool result is an event, and recovery never runs a tool again.
        self.flush()?;
        let result = match verdict {
            Verdict::Cancel => {
                self.turn.cancel();
                ToolResult::Denied(ToolResultDenied {
                    reason: "the user cancelled the turn".into(),
                })
            }
            Verdict::Deny(reason) => ToolResult::Denied(ToolResultDenied { reason }),
            // The last check before the tool starts, under the lock `cancel` takes: after
            // turn/interrupt was accepted, no tool of this turn starts, whatever the approval said.
            Verdict::Run if !self.turn.may_start_tool() => ToolResult::Denied(ToolResultDenied {
                reason: "the turn was interrupted before the tool started".into(),
            }),
            Verdict::Run => {
                self.inner
                    .stats
                    .tools_executed
                    .fetch_add(1, Ordering::SeqCst);
                let tools = &self.inner.config.tools;
                match self.turn.write_scope.get() {
                    Some(scope) => tools.execute_scoped(&self.thread.id, &call, scope),
                    None => tools.execute(&self.thread.id, &call),
                }
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
        let cost = serde_json::to_vec(&result).map_or(0, |v| v.len()) + EVENT_ENVELOPE_BYTES;
        self.record_value(to_payload(&recorded)?, None, Note::Mirror("tool/result"))?;
        // The tool has run and its result is recorded; if it passed the turn's output bound, the
        // turn stops here rather than hand the model more.
        self.charge(None, cost, 0)?;
        if self.is_cancelled() {
            // The result is durable before the cancellation is reported, so a caller that
            // looks for it in the rollout (the graph's effect receipt) finds it.
            self.flush()?;
            return Err(KernelError::Cancelled);
        }
        Ok(result)
    }

    fn is_cancelled(&self) -> bool {
        self.turn.is_cancelled()
    }

    fn history(&self) -> Result<super::History, KernelError> {
        crate::kernel::history::assemble(&*self.inner.store, &self.thread.id, Some(&self.turn.id))
            .map_err(|e| KernelError::Failed(format!("could not read the thread's history: {e}")))
    }

    fn tool_specs(&self) -> Vec<crate::kernel::ToolSpec> {
        self.inner.config.tools.tool_specs()
    }

    fn set_error_code(&self, code: &str) {
        // TurnError.code is 1-64 characters; anything else keeps the default.
        // A turn stopped at its output bound keeps that code.
        if !code.is_empty() && code.len() <= 64 && !lock(&self.turn.streamed).exceeded {
            *lock(&self.error_code) = Some(code.to_string());
        }
    }

    fn sleep_cancellable(&self, duration: Duration) -> bool {
        let deadline = Instant::now() + duration;
        let mut guard = lock(&self.turn.ctl);
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
                .wait_timeout(guard, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// One admitted turn on its way to a runner.
pub(crate) struct Job {
    pub inner: Arc<Inner>,
    pub thread: Arc<ThreadState>,
    pub turn: Arc<TurnShared>,
    pub input: Vec<UserInput>,
}

/// turn/interrupt's answer: only ever given once the kernel has returned.
pub(crate) fn reply_settled(stats: &Stats, conn: &ConnShared, id: &str, turn: EndedTurn) {
    reply(stats, conn, id, settled(turn));
}

/// turn/interrupt's answer: only ever given once the kernel has returned.
pub(crate) fn settled(ended: EndedTurn) -> RpcResult {
    result(crate::protocol::TurnInterruptResult {
        turn: ended.turn,
        error: ended.error,
        physically_settled: true,
        extra: Map::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{ItemDeltaEvent, OutputDelta};

    /// The hand-built delta payload is the generic path's, member for member and in order
    /// (the stored line and the mirrored notification keep the order), extras included.
    #[test]
    fn delta_payload_is_the_generic_payload() {
        let mut extra = Map::new();
        extra.insert("future".into(), serde_json::json!({"a": [1, 2]}));
        // An extra that repeats a known member keeps the known member's place, as `insert` does.
        extra.insert("text".into(), Value::from("overridden"));
        let output: OutputDelta =
            serde_json::from_value(serde_json::json!({"stream": "stdout", "chunk": "ok"})).unwrap();
        let deltas = [
            ItemDelta::Text(TextDelta {
                text: "héllo \"x\"\n".into(),
                extra: Map::new(),
            }),
            ItemDelta::Text(TextDelta {
                text: String::new(),
                extra,
            }),
            ItemDelta::Output(output),
            ItemDelta::Unknown(serde_json::json!({"type": "diagram", "svg": "<svg/>"})),
        ];
        for delta in deltas {
            let generic = to_payload(&EventPayload::ItemDelta(ItemDeltaEvent {
                turn_id: "tu-1".into(),
                item_id: "tu-1-i1".into(),
                delta: delta.clone(),
                extra: Map::new(),
            }))
            .unwrap();
            let direct = delta_payload("tu-1".into(), "tu-1-i1", delta).unwrap();
            assert_eq!(
                serde_json::to_string(&direct).unwrap(),
                serde_json::to_string(&generic).unwrap()
            );
        }
    }
}
