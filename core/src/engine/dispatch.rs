//! Reading a connection's inbound queue: parse, validate against the schema, enforce the
//! handshake, then run the method. Also thread loading and restart recovery, which every method
//! that touches a thread goes through.

use super::turn::{self, rpc, turn_error, wire_turn, TurnShared};
use super::{
    deliver, emit, lock, ConnShared, Inner, ThreadData, ThreadState, IMPLEMENTED_FEATURES,
};
use crate::approval::digest_json;
use crate::protocol::{
    EventPayload, InitializeResult, ServerInfo, ServerNotification, Thread, ThreadArchiveResult,
    ThreadForkResult, ThreadListResult, ThreadStartResult, ThreadStatus, ThreadUpdatedNotification,
    ThreadUpdatedParams, Turn, TurnCompletedEvent, TurnInterruptResult, TurnStartResult,
    TurnStartedEvent, TurnStartedNotification, TurnStartedParams, TurnStatus, UnreadableThread,
    UserInput,
};
use crate::rollout::{ListQuery, StoreError, ThreadStart, ThreadSummary};
use cc_agent_protocol::{validate_protocol_message, MessageKind};
use serde::Serialize;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A JSON-RPC error on its way to the host.
pub(crate) struct RpcError {
    code: i64,
    message: String,
    data: Option<Value>,
}

impl RpcError {
    fn new(code: i64, message: impl Into<String>) -> Self {
        RpcError {
            code,
            message: message.into(),
            data: None,
        }
    }

    fn with_reason(mut self, reason: impl Into<String>) -> Self {
        self.data = Some(json!({"reason": cap(&reason.into(), 1024)}));
        self
    }
}

/// Caps a message at `max` bytes on a character boundary (the schema bounds every message).
fn cap(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max.saturating_sub(3);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

impl From<StoreError> for RpcError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound(id) => RpcError::new(-32004, format!("thread {id:?} not found")),
            StoreError::AlreadyExists(id) => RpcError::new(
                -32009,
                format!("thread {id:?} already exists; resume it or pick another id"),
            ),
            e @ (StoreError::InvalidId { .. } | StoreError::InvalidArgument(_)) => {
                RpcError::new(-32602, cap(&e.to_string(), 512))
            }
            // Damaged history is the data's fault, not the server's: say which thread and what
            // to do, in data.reason, without file paths (the store's messages carry none).
            StoreError::Corrupt {
                thread_id,
                seq,
                reason,
            } => RpcError::new(
                -32603,
                format!(
                    "thread {thread_id:?} is unreadable: its rollout fails verification; restore it from a backup (see `cc-app-server rollout verify`)"
                ),
            )
            .with_reason(format!("first bad event at seq {seq}: {reason}")),
            StoreError::AnchorMismatch { thread_id, reason } => RpcError::new(
                -32603,
                format!(
                    "thread {thread_id:?} is unreadable: its rollout does not match its head anchor; restore it from a backup or accept it as it is (see `cc-app-server rollout verify`)"
                ),
            )
            .with_reason(reason),
            other => {
                // Internals go to diagnostics, never to the wire.
                tracing::error!(target: "cc_app_server::rollout", "rollout store error: {other}");
                RpcError::new(
                    -32603,
                    "internal error: the rollout store failed; see the server's diagnostics",
                )
            }
        }
    }
}

type RpcResult = Result<Value, RpcError>;

/// A typed result on its way to the wire.
fn result(value: impl Serialize) -> RpcResult {
    serde_json::to_value(value)
        .map_err(|_| RpcError::new(-32603, "internal error: unencodable result"))
}

fn reply(inner: &Inner, conn: &ConnShared, id: Value, result: RpcResult) {
    let message = match result {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err(e) => {
            let mut error = json!({"code": e.code, "message": cap(&e.message, 512)});
            if let Some(data) = e.data {
                error["data"] = data;
            }
            json!({"jsonrpc": "2.0", "id": id, "error": error})
        }
    };
    deliver(inner, conn, message.to_string());
}

/// The connection's worker: one message at a time, in arrival order, until the queue closes.
pub(crate) fn connection_loop(inner: &Arc<Inner>, conn: &Arc<ConnShared>) {
    while let Ok(line) = conn.inbound.recv(None) {
        handle(inner, conn, &line);
    }
    lock(&conn.pending).clear();
}

/// A RequestId's value: an integer 0..=2^53-1, written with or without a zero fraction.
fn request_id(id: &Value) -> Option<u64> {
    const MAX: u64 = 9_007_199_254_740_991;
    match id.as_u64() {
        Some(n) => (n <= MAX).then_some(n),
        None => id
            .as_f64()
            .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f <= MAX as f64)
            .map(|f| f as u64),
    }
}

fn handle(inner: &Arc<Inner>, conn: &Arc<ConnShared>, line: &str) {
    let value: Value = match serde_json::from_str(line) {
        Ok(v) => v,
        Err(e) => {
            return reply(
                inner,
                conn,
                Value::Null,
                Err(RpcError::new(
                    -32700,
                    cap(&format!("parse error: {e}"), 512),
                )),
            )
        }
    };
    // The id is echoed exactly as sent when it is a wire v1 RequestId (`3.0` included: JSON
    // Schema reads it as the integer 3); otherwise the answer carries `id: null`.
    let id = value
        .get("id")
        .filter(|id| request_id(id).is_some())
        .cloned()
        .unwrap_or(Value::Null);
    // A host's answer to approval/decide goes to the waiting turn, which checks it and fails
    // closed on anything malformed; answers nobody waits for (late, duplicate, unknown id) are
    // counted and dropped — a response is never answered.
    if value.get("method").is_none()
        && (value.get("result").is_some() || value.get("error").is_some())
    {
        let waiting = request_id(&id).and_then(|n| lock(&conn.pending).remove(&n));
        match waiting {
            Some(tx) => {
                let _ = tx.try_send(value);
            }
            None => {
                inner
                    .stats
                    .ignored_responses
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        return;
    }
    let method = match validate_protocol_message(&value) {
        Err(e) => {
            let message = cap(&e.to_string(), 512);
            let mut err = RpcError::new(e.class.code(), message);
            err.data = Some(json!({"pointer": cap(e.pointer(), 1024)}));
            return reply(inner, conn, id, Err(err));
        }
        Ok(MessageKind::ClientRequest { method, .. }) => method,
        Ok(MessageKind::ServerRequest { method, .. }) => {
            return reply(
                inner,
                conn,
                id,
                Err(RpcError::new(
                    -32601,
                    format!("{method} is sent by the server, not to it"),
                )),
            )
        }
        Ok(MessageKind::Notification { .. }) | Ok(MessageKind::Response) => {
            return reply(
                inner,
                conn,
                id,
                Err(RpcError::new(
                    -32600,
                    "clients send requests and approval answers only in wire v1",
                )),
            )
        }
    };
    let params = value.get("params").cloned().unwrap_or_else(|| json!({}));
    let initialized = lock(&conn.state).initialized;
    let result = match (method.as_str(), initialized) {
        ("initialize", false) => initialize(inner, conn, &params),
        ("initialize", true) => Err(RpcError::new(
            -32009,
            "already initialized on this connection",
        )),
        (_, false) => Err(RpcError::new(
            -32002,
            "not initialized: send initialize first",
        )),
        ("thread/start", true) => idempotent(inner, "thread/start", &params, || {
            thread_start(inner, conn, &params)
        }),
        ("thread/read", true) => thread_read(inner, conn, &params, false),
        ("thread/resume", true) => thread_read(inner, conn, &params, true),
        ("thread/fork", true) => idempotent(inner, "thread/fork", &params, || {
            thread_fork(inner, conn, &params)
        }),
        ("thread/list", true) => thread_list(inner, &params),
        ("thread/archive", true) => thread_archive(inner, conn, &params),
        ("turn/start", true) => idempotent(inner, "turn/start", &params, || {
            turn_start(inner, conn, &params)
        }),
        ("turn/interrupt", true) => return turn_interrupt(inner, conn, id, &params),
        (other, true) => Err(RpcError::new(
            -32601,
            format!("method {other:?} is not served"),
        )),
    };
    reply(inner, conn, id, result);
}

fn initialize(inner: &Inner, conn: &ConnShared, params: &Value) -> RpcResult {
    let (server_lo, server_hi) = inner.config.protocol_versions;
    let client_hi = params["protocolVersion"].as_u64().unwrap_or(0) as u32;
    let client_lo = params["minimumProtocolVersion"].as_u64().unwrap_or(0) as u32;
    if client_lo > client_hi {
        return Err(RpcError::new(
            -32602,
            "minimumProtocolVersion is above protocolVersion",
        ));
    }
    let chosen = server_hi.min(client_hi);
    if chosen < server_lo.max(client_lo) {
        return Err(
            RpcError::new(-32602, "no common protocol version").with_reason(format!(
                "server speaks {server_lo}..={server_hi}, client {client_lo}..={client_hi}"
            )),
        );
    }
    let wanted: Vec<&str> = params["features"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let features: Vec<String> = IMPLEMENTED_FEATURES
        .iter()
        .filter(|f| wanted.contains(f))
        .map(|f| f.to_string())
        .collect();
    let mut state = lock(&conn.state);
    state.initialized = true;
    state.features = features.clone();
    result(InitializeResult {
        protocol_version: u64::from(chosen),
        downgraded: chosen < client_hi,
        features,
        server: ServerInfo {
            name: inner.config.server_name.clone(),
            version: inner.config.server_version.clone(),
            extra: Map::new(),
        },
        schema_digest: cc_agent_protocol::schema_digest().to_string(),
        extra: Map::new(),
    })
}

/// Runs `f` once per (method, idempotencyKey); a retry returns the first result, a reuse of the
/// key with other params is a conflict.
fn idempotent(
    inner: &Inner,
    method: &str,
    params: &Value,
    f: impl FnOnce() -> RpcResult,
) -> RpcResult {
    let Some(key) = params.get("idempotencyKey").and_then(Value::as_str) else {
        return f();
    };
    let digest = digest_json(params);
    let mut cache = lock(&inner.idempotency);
    if let Some((seen, result)) = cache.get(method, key) {
        return if *seen == digest {
            Ok(result.clone())
        } else {
            Err(RpcError::new(
                -32009,
                "idempotencyKey was already used with different params",
            ))
        };
    }
    let result = f()?;
    cache.put(
        method,
        key,
        digest,
        result.clone(),
        inner.config.limits.idempotency_entries,
    );
    Ok(result)
}

fn random_id(prefix: &str) -> String {
    format!("{prefix}-{}", &crate::approval::new_nonce()[..20])
}

fn wire_thread(id: &str, data: &ThreadData) -> Thread {
    let status = if data.archived {
        ThreadStatus::Archived
    } else if data.active.is_some() {
        ThreadStatus::Active
    } else {
        ThreadStatus::Idle
    };
    Thread {
        id: id.into(),
        title: data.title.clone(),
        status,
        archived: data.archived,
        created_at: data.created_at.clone(),
        updated_at: data.updated_at.clone(),
        last_event_seq: data.last_seq,
        forked_from: data.forked_from.clone(),
        metadata: data.metadata.clone(),
        extra: Map::new(),
    }
}

fn data_from_summary(summary: &ThreadSummary) -> ThreadData {
    ThreadData {
        title: summary.title.clone(),
        metadata: summary.metadata.clone(),
        created_at: summary.created_at.clone(),
        updated_at: summary.updated_at.clone(),
        archived: summary.archived,
        last_seq: summary.last_seq,
        forked_from: summary.forked_from.clone(),
        agent_options: Value::Null,
        active: None,
        turns: HashMap::new(),
        subscribers: Vec::new(),
    }
}

/// The thread's live state, loading it (and closing any turn a dead process left running) on
/// first use.
pub(crate) fn load_thread(inner: &Inner, id: &str) -> Result<Arc<ThreadState>, RpcError> {
    if let Some(t) = lock(&inner.threads).get(id) {
        return Ok(Arc::clone(t));
    }
    let summary = inner.store.summary(id)?;
    let state = Arc::new(ThreadState {
        id: id.to_string(),
        data: Mutex::new(data_from_summary(&summary)),
        emit_lock: Mutex::new(()),
    });
    recover_turns(inner, &state)?;
    let mut threads = lock(&inner.threads);
    Ok(Arc::clone(threads.entry(id.to_string()).or_insert(state)))
}

/// Rebuilds the thread's turns from its rollout; a turn with no terminal event was cut off by a
/// crash or a drop, and is closed now as failed, with that evidence recorded.
fn recover_turns(inner: &Inner, thread: &ThreadState) -> Result<(), RpcError> {
    let mut turns: Vec<Turn> = Vec::new();
    let mut after = 0;
    loop {
        let page = inner.store.read(&thread.id, after, 1000)?;
        for e in &page.events {
            // The store holds what the engine wrote; a payload it cannot decode is left alone
            // here and reported by verification, never guessed at.
            match serde_json::from_value::<EventPayload>(e.payload.clone()) {
                Ok(EventPayload::TurnStarted(p)) => turns.push(wire_turn(
                    &p.turn_id,
                    &thread.id,
                    TurnStatus::Queued,
                    &e.time,
                    None,
                    None,
                )),
                Ok(EventPayload::TurnStatusChanged(p)) => {
                    if let Some(t) = turns.iter_mut().rev().find(|t| t.id == p.turn_id) {
                        t.status = p.status;
                    }
                }
                Ok(EventPayload::TurnCompleted(p)) => {
                    if let Some(t) = turns.iter_mut().rev().find(|t| t.id == p.turn_id) {
                        t.status = p.status;
                        t.completed_at = Some(e.time.clone());
                        t.error = p.error;
                    }
                }
                _ => {}
            }
            after = e.seq;
        }
        if !page.has_more {
            break;
        }
    }
    for turn in turns.iter_mut().filter(|t| t.completed_at.is_none()) {
        let error = turn_error(
            "serverRestarted",
            "the server stopped while this turn was running; it was closed when the thread was next opened",
        );
        let payload = EventPayload::TurnCompleted(TurnCompletedEvent {
            turn_id: turn.id.clone(),
            status: TurnStatus::Failed,
            error: Some(error.clone()),
            physically_settled: true,
            extra: Map::new(),
        });
        let events = emit(inner, thread, vec![payload], |_| vec![])?;
        turn.status = TurnStatus::Failed;
        turn.completed_at = Some(events[0].time.clone());
        turn.error = Some(error);
    }
    lock(&thread.data).turns = turns.into_iter().map(|t| (t.id.clone(), t)).collect();
    Ok(())
}

/// Restart: every thread is loaded once so no turn stays dangling on disk.
pub(crate) fn recover_all(inner: &Inner) -> Result<(), StoreError> {
    let mut cursor = None;
    loop {
        let page = inner.store.list(&ListQuery {
            include_archived: true,
            cursor,
            limit: 1000,
        })?;
        for (id, reason) in &page.unreadable {
            tracing::warn!(target: "cc_app_server::recovery", "thread {id} cannot be read and was not recovered: {reason}");
        }
        for summary in &page.threads {
            if let Err(e) = load_thread(inner, &summary.thread_id) {
                tracing::warn!(
                    target: "cc_app_server::recovery",
                    "could not recover thread {}: {}",
                    summary.thread_id, e.message
                );
            }
        }
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => return Ok(()),
        }
    }
}

fn subscribe(thread: &ThreadState, conn: &Arc<ConnShared>) {
    let mut data = lock(&thread.data);
    if !data
        .subscribers
        .iter()
        .any(|w| w.upgrade().is_some_and(|c| c.id == conn.id))
    {
        data.subscribers.push(Arc::downgrade(conn));
    }
}

fn str_param<'a>(params: &'a Value, name: &str) -> Option<&'a str> {
    params.get(name).and_then(Value::as_str)
}

fn thread_start(inner: &Inner, conn: &Arc<ConnShared>, params: &Value) -> RpcResult {
    let thread_id = str_param(params, "threadId")
        .map(str::to_string)
        .unwrap_or_else(|| random_id("th"));
    let start = ThreadStart {
        thread_id: thread_id.clone(),
        title: str_param(params, "title").map(str::to_string),
        metadata: params
            .get("metadata")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default(),
        forked_from: None,
    };
    let (summary, _) = inner.store.start(start)?;
    let mut data = data_from_summary(&summary);
    data.agent_options = params.get("agentOptions").cloned().unwrap_or(Value::Null);
    let state = Arc::new(ThreadState {
        id: thread_id.clone(),
        data: Mutex::new(data),
        emit_lock: Mutex::new(()),
    });
    subscribe(&state, conn);
    let thread = wire_thread(&thread_id, &lock(&state.data));
    lock(&inner.threads).insert(thread_id, state);
    result(ThreadStartResult {
        thread,
        extra: Map::new(),
    })
}

fn thread_read(inner: &Inner, conn: &Arc<ConnShared>, params: &Value, resume: bool) -> RpcResult {
    let thread = load_thread(inner, str_param(params, "threadId").unwrap_or_default())?;
    let after = params
        .get("afterEventSeq")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let limit = params.get("limit").and_then(Value::as_u64).unwrap_or(100) as usize;
    let page = inner.store.read(&thread.id, after, limit)?;
    subscribe(&thread, conn);
    let events: Vec<Value> = page.events.iter().map(|e| e.to_json()).collect();
    let data = lock(&thread.data);
    // Events go out as the store's `RolloutEvent` JSON (checked against the schema by the
    // rollout tests) rather than through a second decode into the generated type.
    let mut answer = json!({"thread": wire_thread(&thread.id, &data), "events": events, "hasMore": page.has_more});
    if resume {
        answer["activeTurn"] = json!(data.active.as_ref().map(|t| t.to_wire()));
    }
    Ok(answer)
}

fn thread_fork(inner: &Inner, conn: &Arc<ConnShared>, params: &Value) -> RpcResult {
    let source = load_thread(inner, str_param(params, "threadId").unwrap_or_default())?;
    let new_id = str_param(params, "newThreadId")
        .map(str::to_string)
        .unwrap_or_else(|| random_id("th"));
    let at = params.get("atEventSeq").and_then(Value::as_u64);
    let (summary, _) = inner.store.fork(
        &source.id,
        at,
        &new_id,
        str_param(params, "title").map(str::to_string),
    )?;
    let mut data = data_from_summary(&summary);
    data.agent_options = lock(&source.data).agent_options.clone();
    let state = Arc::new(ThreadState {
        id: new_id.clone(),
        data: Mutex::new(data),
        emit_lock: Mutex::new(()),
    });
    recover_turns(inner, &state)?;
    subscribe(&state, conn);
    let thread = wire_thread(&new_id, &lock(&state.data));
    lock(&inner.threads).insert(new_id, state);
    result(ThreadForkResult {
        thread,
        extra: Map::new(),
    })
}

fn thread_list(inner: &Inner, params: &Value) -> RpcResult {
    let query = ListQuery {
        include_archived: params
            .get("includeArchived")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        cursor: str_param(params, "cursor").map(str::to_string),
        limit: params.get("limit").and_then(Value::as_u64).unwrap_or(100) as usize,
    };
    let page = inner.store.list(&query)?;
    let loaded = lock(&inner.threads);
    let threads: Vec<Thread> = page
        .threads
        .iter()
        .map(|s| match loaded.get(&s.thread_id) {
            Some(t) => wire_thread(&t.id, &lock(&t.data)),
            None => wire_thread(&s.thread_id, &data_from_summary(s)),
        })
        .collect();
    // Threads the disk holds but that cannot be read are reported, never hidden: the host
    // decides (restore them, or reopen with accept_unanchored).
    let unreadable: Vec<UnreadableThread> = page
        .unreadable
        .into_iter()
        .map(|(thread_id, reason)| UnreadableThread {
            thread_id,
            status: "unreadable".into(),
            reason: cap(&reason, 1024),
            extra: Map::new(),
        })
        .collect();
    result(ThreadListResult {
        threads,
        next_cursor: page.next_cursor,
        unreadable: (!unreadable.is_empty()).then_some(unreadable),
        extra: Map::new(),
    })
}

fn thread_archive(inner: &Inner, conn: &Arc<ConnShared>, params: &Value) -> RpcResult {
    let thread = load_thread(inner, str_param(params, "threadId").unwrap_or_default())?;
    subscribe(&thread, conn);
    let _guard = lock(&thread.emit_lock);
    {
        let data = lock(&thread.data);
        if data.active.is_some() {
            return Err(RpcError::new(
                -32009,
                "the thread has an active turn; interrupt it or wait for it to end",
            ));
        }
        if data.archived {
            return result(ThreadArchiveResult {
                thread: wire_thread(&thread.id, &data),
                extra: Map::new(),
            });
        }
    }
    let event = inner.store.set_archived(&thread.id, true)?;
    let (wire, subscribers) = {
        let mut data = lock(&thread.data);
        data.archived = true;
        data.last_seq = event.seq;
        data.updated_at = event.time.clone();
        (
            wire_thread(&thread.id, &data),
            data.subscribers
                .iter()
                .filter_map(|w| w.upgrade())
                .collect::<Vec<_>>(),
        )
    };
    let note = ServerNotification::ThreadUpdated(ThreadUpdatedNotification {
        jsonrpc: rpc(),
        params: ThreadUpdatedParams {
            thread_id: thread.id.clone(),
            event_seq: event.seq,
            thread: wire.clone(),
            extra: Map::new(),
        },
    });
    let note = serde_json::to_string(&note).expect("a notification is JSON");
    for c in subscribers {
        deliver(inner, &c, note.clone());
    }
    result(ThreadArchiveResult {
        thread: wire,
        extra: Map::new(),
    })
}

fn turn_start(inner: &Arc<Inner>, conn: &Arc<ConnShared>, params: &Value) -> RpcResult {
    let thread = load_thread(inner, str_param(params, "threadId").unwrap_or_default())?;
    let input: Vec<UserInput> = serde_json::from_value(params["input"].clone())
        .map_err(|e| RpcError::new(-32602, cap(&format!("input: {e}"), 512)))?;
    subscribe(&thread, conn);
    let turn = {
        let mut data = lock(&thread.data);
        if data.archived {
            return Err(RpcError::new(
                -32009,
                "the thread is archived; fork it to continue",
            ));
        }
        if let Some(active) = &data.active {
            return Err(RpcError::new(
                -32009,
                format!(
                    "turn {} is still active on this thread; one turn at a time",
                    active.id
                ),
            ));
        }
        let turn = TurnShared::new(random_id("tu"), thread.id.clone(), Arc::downgrade(conn));
        data.active = Some(Arc::clone(&turn));
        turn
    };
    let wire = turn.to_wire();
    let started = EventPayload::TurnStarted(TurnStartedEvent {
        turn_id: turn.id.clone(),
        input: input.clone(),
        extra: Map::new(),
    });
    let recorded = emit(inner, &thread, vec![started], |events| {
        vec![ServerNotification::TurnStarted(TurnStartedNotification {
            jsonrpc: rpc(),
            params: TurnStartedParams {
                thread_id: thread.id.clone(),
                event_seq: events[0].seq,
                turn: wire.clone(),
                extra: Map::new(),
            },
        })]
    });
    if let Err(e) = recorded {
        lock(&thread.data).active = None;
        return Err(e.into());
    }
    lock(&thread.data)
        .turns
        .insert(turn.id.clone(), wire.clone());
    let (inner2, thread2, turn2) = (Arc::clone(inner), Arc::clone(&thread), Arc::clone(&turn));
    let handle = std::thread::Builder::new()
        .name(format!("cc-turn-{}", turn.id))
        .spawn(move || turn::run(inner2, thread2, turn2, input))
        .map_err(|_| RpcError::new(-32603, "internal error: could not start the turn"))?;
    let mut handles = lock(&inner.turn_threads);
    handles.retain(|h| !h.is_finished());
    handles.push(handle);
    result(TurnStartResult {
        turn: wire,
        extra: Map::new(),
    })
}

/// Answers from a helper thread: waiting for the kernel to settle must not stall the connection.
fn turn_interrupt(inner: &Arc<Inner>, conn: &Arc<ConnShared>, id: Value, params: &Value) {
    let thread = match load_thread(inner, str_param(params, "threadId").unwrap_or_default()) {
        Ok(t) => t,
        Err(e) => return reply(inner, conn, id, Err(e)),
    };
    let turn_id = str_param(params, "turnId").unwrap_or_default().to_string();
    let (active, known) = {
        let data = lock(&thread.data);
        (
            data.active.clone().filter(|t| t.id == turn_id),
            data.turns.get(&turn_id).cloned(),
        )
    };
    let Some(turn) = active else {
        let result = match known {
            Some(turn) => settled(turn),
            None => Err(RpcError::new(
                -32004,
                format!("turn {turn_id:?} not found in this thread"),
            )),
        };
        return reply(inner, conn, id, result);
    };
    turn.cancel();
    let (inner, conn) = (Arc::clone(inner), Arc::clone(conn));
    let deadline = inner.config.settle_deadline;
    std::thread::spawn(move || {
        let result = match turn.wait_settled(deadline) {
            Some(turn) => settled(turn),
            None => Err(RpcError::new(-32010, "the kernel has not stopped yet")
                .with_reason("the turn stays live and ends as interrupted once the kernel stops; ask again or wait for turn/completed")),
        };
        reply(&inner, &conn, id, result);
    });
}

/// turn/interrupt's answer: only ever given once the kernel has returned.
fn settled(turn: Turn) -> RpcResult {
    result(TurnInterruptResult {
        turn,
        physically_settled: true,
        extra: Map::new(),
    })
}
