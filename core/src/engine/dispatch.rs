//! Reading a connection's inbound queue: parse, validate against the schema, enforce the
//! handshake, then run the method. Request ids are echoed byte for byte as the host wrote them.

use super::pool::{Job, SubmitError};
use super::threads::{data_from_summary, finished_turn, insert_thread, load_thread, new_state};
use super::turn::{self, event, rpc, EndedTurn, Unstarted};
use super::{
    emit_locked, lock, ConnShared, Inner, Stats, ThreadData, ThreadState, IMPLEMENTED_FEATURES,
};
use crate::approval::digest_json;
use crate::protocol::error_code;
use crate::protocol::{
    EventPayload, InitializeResult, ServerInfo, ServerNotification, Thread, ThreadArchiveResult,
    ThreadForkResult, ThreadStartResult, ThreadStatus, ThreadUpdatedNotification,
    ThreadUpdatedParams, TurnInterruptResult, TurnStartResult, TurnStartedEvent,
    TurnStartedNotification, TurnStartedParams, UserInput,
};
use crate::rollout::{HeaderExtra, StoreError, ThreadStart};
use cc_agent_protocol::{validate_protocol_message, MessageKind};
use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};
use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

/// A request id exactly as the host wrote it (JSON text), or `null` when it had none or an
/// unusable one.
pub(crate) type RawId = Arc<str>;

/// Longest string id, in characters (the schema's `RequestId`).
pub const MAX_STRING_ID_CHARS: usize = 128;
/// Largest integer id (2^53 - 1: every language holds it exactly).
const MAX_INTEGER_ID: u64 = 9_007_199_254_740_991;

/// A JSON-RPC error on its way to the host.
pub(crate) struct RpcError {
    code: i64,
    pub message: String,
    data: Option<Value>,
}

impl RpcError {
    pub(crate) fn new(code: i64, message: impl Into<String>) -> Self {
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

    fn overloaded(message: impl Into<String>, retry_after_ms: u64) -> Self {
        RpcError {
            code: error_code::OVERLOADED,
            message: message.into(),
            data: Some(json!({"retry_after_ms": retry_after_ms.min(3_600_000)})),
        }
    }
}

/// Caps a message at `max` bytes on a character boundary (the schema bounds every message).
pub(crate) fn cap(text: &str, max: usize) -> String {
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
            StoreError::NotFound(id) => {
                RpcError::new(error_code::NOT_FOUND, format!("thread {id:?} not found"))
            }
            StoreError::AlreadyExists(id) => RpcError::new(
                error_code::CONFLICT,
                format!("thread {id:?} already exists; resume it or pick another id"),
            ),
            e @ (StoreError::InvalidId { .. } | StoreError::InvalidArgument(_)) => {
                RpcError::new(error_code::INVALID_PARAMS, cap(&e.to_string(), 512))
            }
            // Damaged history is the data's fault, not the server's: say which thread and what
            // to do, in data.reason, without file paths (the store's messages carry none).
            StoreError::Corrupt {
                thread_id,
                seq,
                reason,
            } => {
                // The host's log hears of it too: threads load lazily, so this is where damage
                // is first seen (a mobile host cannot read stderr).
                tracing::warn!(target: "cc_app_server::engine", "thread {thread_id:?} is unreadable: first bad event at seq {seq}: {reason}");
                RpcError::new(
                error_code::INTERNAL,
                format!(
                    "thread {thread_id:?} is unreadable: its rollout fails verification; restore it from a backup (see `cc-app-server rollout verify`)"
                ),
            )
            .with_reason(format!("first bad event at seq {seq}: {reason}"))
            }
            StoreError::AnchorMismatch { thread_id, reason } => {
                tracing::warn!(target: "cc_app_server::engine", "thread {thread_id:?} is unreadable: {reason}");
                RpcError::new(
                error_code::INTERNAL,
                format!(
                    "thread {thread_id:?} is unreadable: its rollout does not match its head anchor; restore it from a backup or accept it as it is (see `cc-app-server rollout verify`)"
                ),
            )
            .with_reason(reason)
            }
            other => {
                // Internals go to diagnostics, never to the wire.
                tracing::error!(target: "cc_app_server::rollout", "rollout store error: {other}");
                RpcError::new(
                    error_code::INTERNAL,
                    "internal error: the rollout store failed; see the server's diagnostics",
                )
            }
        }
    }
}

pub(crate) type RpcResult = Result<Value, RpcError>;

/// A typed result on its way to the wire.
pub(crate) fn result(value: impl Serialize) -> RpcResult {
    serde_json::to_value(value)
        .map_err(|_| RpcError::new(error_code::INTERNAL, "internal error: unencodable result"))
}

/// Sends the one answer a request gets, echoing its id as written.
pub(crate) fn reply(inner: &Inner, conn: &ConnShared, id: &str, result: RpcResult) {
    reply_raw(inner, conn, id, result.map(|v| v.to_string()))
}

/// `reply` for a result already written as JSON text (thread/list, thread/read).
pub(crate) fn reply_raw(
    inner: &Inner,
    conn: &ConnShared,
    id: &str,
    result: Result<String, RpcError>,
) {
    reply_with(inner, conn, id, 0, |out| {
        out.push_str(&result?);
        Ok(())
    })
}

/// `reply` for a result written by `write` straight into the answer's text (no copy of it is
/// made); `size` is a guess of its length. An error discards what `write` wrote.
pub(crate) fn reply_with(
    inner: &Inner,
    conn: &ConnShared,
    id: &str,
    size: usize,
    write: impl FnOnce(&mut String) -> Result<(), RpcError>,
) {
    let mut out = String::with_capacity(size + id.len() + 48);
    out.push_str("{\"jsonrpc\":\"2.0\",\"id\":");
    out.push_str(id);
    let at = out.len();
    out.push_str(",\"result\":");
    match write(&mut out) {
        Ok(()) => out.push('}'),
        Err(e) => {
            out.truncate(at);
            let mut error = json!({"code": e.code, "message": cap(&e.message, 512)});
            if let Some(data) = e.data {
                error["data"] = data;
            }
            out.push_str(",\"error\":");
            out.push_str(&error.to_string());
            out.push('}');
        }
    }
    super::deliver(inner, conn, out);
    // Counted once the answer is queued (or dropped with a closed connection), so a drain that
    // sees nothing unanswered never shuts down ahead of an answer still being delivered.
    conn.answered
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
}

/// turn/interrupt's answer: only ever given once the kernel has returned.
pub(crate) fn reply_settled(inner: &Inner, conn: &ConnShared, id: &str, turn: EndedTurn) {
    reply(inner, conn, id, settled(turn));
}

/// The connection's worker: one message at a time, in arrival order, until the queue closes.
/// Between messages it answers the turn/interrupt requests whose settle deadline has passed, so
/// waiting for a kernel costs no thread.
pub(crate) fn connection_loop(inner: &Arc<Inner>, conn: &Arc<ConnShared>) {
    loop {
        let next = lock(&conn.interrupts).iter().map(|(d, _)| *d).min();
        let timeout = next.map(|d| d.saturating_duration_since(Instant::now()));
        match conn.inbound.recv(timeout) {
            Ok(line) => handle(inner, conn, &line),
            Err(super::RecvError::Timeout) => {}
            Err(super::RecvError::Closed) => break,
        }
        expire_interrupts(inner, conn);
    }
    conn.close_all(false);
}

fn expire_interrupts(inner: &Inner, conn: &ConnShared) {
    let now = Instant::now();
    let mut due = Vec::new();
    lock(&conn.interrupts).retain(|(deadline, turn)| {
        if *deadline <= now {
            due.push(Arc::clone(turn));
            false
        } else {
            // A settled turn answered its waiters itself.
            !turn.is_done()
        }
    });
    for turn in due {
        for w in turn.take_expired(conn.id, now) {
            let e = RpcError::new(error_code::INTERRUPTED, "the kernel has not stopped yet").with_reason(
                "the turn stays live and ends as interrupted once the kernel stops; ask again or wait for turn/completed",
            );
            reply(inner, conn, &w.request_id, Err(e));
        }
    }
}

/// The envelope's `id`, as written (the last one if repeated, as the parser keeps the last).
struct IdPeek<'a>(Option<&'a RawValue>);

impl<'de: 'a, 'a> serde::Deserialize<'de> for IdPeek<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = IdPeek<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON-RPC object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<IdPeek<'de>, A::Error> {
                let mut id = None;
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    if key == "id" {
                        id = Some(map.next_value::<&'de RawValue>()?);
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(IdPeek(id))
            }
        }
        d.deserialize_map(V)
    }
}

/// A usable id: a string of at most 128 characters, or a number whose exact value is an
/// integer in 0..=2^53-1 however it is spelled (`7`, `7.0`, `7e0`, `-0`). Decided on the text:
/// a float parser would read `1e-400` as 0.
pub(crate) fn id_is_usable(raw: &str) -> bool {
    match raw.as_bytes().first() {
        Some(b'"') => serde_json::from_str::<String>(raw)
            .is_ok_and(|s| s.chars().count() <= MAX_STRING_ID_CHARS),
        Some(b'-' | b'0'..=b'9') => integer_value(raw).is_some(),
        _ => false,
    }
}

/// The exact integer a JSON number's text denotes, if it is one in 0..=2^53-1.
pub(crate) fn integer_value(text: &str) -> Option<u64> {
    let (negative, rest) = match text.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, text),
    };
    let (mantissa, exponent) = match rest.find(['e', 'E']) {
        Some(i) => (&rest[..i], rest[i + 1..].parse::<i64>().ok()?),
        None => (rest, 0),
    };
    let (int_part, frac_part) = match mantissa.find('.') {
        Some(i) => (&mantissa[..i], &mantissa[i + 1..]),
        None => (mantissa, ""),
    };
    if int_part.is_empty()
        || !int_part
            .bytes()
            .chain(frac_part.bytes())
            .all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let digits: String = format!("{int_part}{frac_part}");
    let digits = digits.trim_start_matches('0');
    if digits.is_empty() {
        return Some(0); // 0, -0, 0.000, 0e-999
    }
    if negative {
        return None;
    }
    // value = digits × 10^(exponent - frac_len); strip trailing zeros into the exponent.
    let trimmed = digits.trim_end_matches('0');
    let mut exp = exponent
        .checked_sub(frac_part.len() as i64)?
        .checked_add((digits.len() - trimmed.len()) as i64)?;
    if exp < 0 || trimmed.len() as i64 + exp > 16 {
        return None; // not an integer, or more than 16 digits (past 2^53)
    }
    let mut value: u64 = trimmed.parse().ok()?;
    while exp > 0 {
        value = value.checked_mul(10)?;
        exp -= 1;
    }
    (value <= MAX_INTEGER_ID).then_some(value)
}

fn handle(inner: &Arc<Inner>, conn: &Arc<ConnShared>, line: &str) {
    let value: Value = match serde_json::from_str(line) {
        Ok(v) => v,
        Err(e) => {
            return reply(
                inner,
                conn,
                "null",
                Err(RpcError::new(
                    error_code::PARSE,
                    cap(&format!("parse error: {e}"), 512),
                )),
            )
        }
    };
    let raw_id = serde_json::from_str::<IdPeek>(line).ok().and_then(|p| p.0);
    // A host's answer to approval/decide goes to the waiting turn, which checks it and fails
    // closed on anything malformed; answers nobody waits for (late, duplicate, unknown id) are
    // counted and dropped — a response is never answered.
    if value.get("method").is_none()
        && (value.get("result").is_some() || value.get("error").is_some())
    {
        conn.unanswered_by_design
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let waiting = raw_id
            .filter(|r| !r.get().starts_with('"'))
            .and_then(|r| integer_value(r.get()))
            .and_then(|n| lock(&conn.pending).remove(&n).map(|t| (n, t)));
        let delivered = waiting.is_some_and(|(n, turn)| turn.answer(n, value));
        if !delivered {
            Stats::bump(&inner.stats.ignored_responses);
        }
        return;
    }
    // The id is echoed exactly as written when it is usable; otherwise the answer carries
    // `id: null` and, when an id was there, says why it was refused.
    let id: &str = match raw_id {
        Some(r) if id_is_usable(r.get()) => r.get(),
        Some(_) => {
            let e = RpcError::new(
                error_code::INVALID_REQUEST,
                format!("invalid request: the id must be a string of at most {MAX_STRING_ID_CHARS} characters or an integer from 0 to 2^53-1"),
            )
            .with_reason("the id was refused, so this answer carries id null");
            return reply(inner, conn, "null", Err(e));
        }
        None => "null",
    };
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
                    error_code::METHOD_NOT_FOUND,
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
                    error_code::INVALID_REQUEST,
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
            error_code::CONFLICT,
            "already initialized on this connection",
        )),
        (_, false) => Err(RpcError::new(
            error_code::NOT_INITIALIZED,
            "not initialized: send initialize first",
        )),
        ("thread/start", true) => idempotent(inner, "thread/start", &params, || {
            thread_start(inner, conn, &params)
        }),

        ("thread/read", true) => {
            return reply_with(inner, conn, id, 4096, |out| {
                thread_read(inner, conn, &params, false, out)
            })
        }
        ("thread/resume", true) => {
            return reply_with(inner, conn, id, 4096, |out| {
                thread_read(inner, conn, &params, true, out)
            })
        }
        ("thread/fork", true) => idempotent(inner, "thread/fork", &params, || {
            thread_fork(inner, conn, &params)
        }),
        ("thread/list", true) => {
            return reply_with(inner, conn, id, 24 * 1024, |out| {
                super::listing::thread_list(inner, &params, out)
            })
        }
        ("thread/archive", true) => thread_archive(inner, conn, &params),
        ("turn/start", true) => idempotent(inner, "turn/start", &params, || {
            turn_start(inner, conn, &params)
        }),
        ("turn/interrupt", true) => return turn_interrupt(inner, conn, id.into(), &params),
        ("thread/compact", true) => {
            match load_thread(inner, str_param(&params, "threadId").unwrap_or_default()) {
                Ok(thread) => {
                    return super::compact::thread_compact(inner, conn, thread, id.into(), &params)
                }
                Err(e) => Err(e),
            }
        }
        (graph, true) if graph.starts_with("graph/") => {
            // A large compile is answered from a thread of its own (possibly after later
            // requests of this connection); everything else in order, from here.
            let (inner2, conn2, id2): (_, _, RawId) =
                (Arc::clone(inner), Arc::clone(conn), id.into());
            let answer = move |r: Result<Value, crate::graph::wire::WireError>| {
                let r = r.map_err(|e| RpcError {
                    code: e.code,
                    message: e.message,
                    data: e.data,
                });
                reply(&inner2, &conn2, &id2, r)
            };
            let follower: Arc<dyn crate::graph::port::Follower> = Arc::<ConnShared>::clone(conn);
            return crate::graph::wire::serve(
                &inner.graph,
                &follower,
                graph,
                params,
                Box::new(answer),
            );
        }
        (other, true) => Err(RpcError::new(
            error_code::METHOD_NOT_FOUND,
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
            error_code::INVALID_PARAMS,
            "minimumProtocolVersion is above protocolVersion",
        ));
    }
    let chosen = server_hi.min(client_hi);
    if chosen < server_lo.max(client_lo) {
        return Err(
            RpcError::new(error_code::INVALID_PARAMS, "no common protocol version").with_reason(
                format!(
                    "server speaks {server_lo}..={server_hi}, client {client_lo}..={client_hi}"
                ),
            ),
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

/// What a thread/start retry must repeat to count as the same request: the members the header
/// records (so the check survives a restart).
pub(crate) fn thread_start_fingerprint(
    title: Option<&str>,
    metadata: &Map<String, Value>,
    agent_options: &Value,
) -> String {
    digest_json(&json!({"title": title, "metadata": metadata, "agentOptions": agent_options}))
}

/// What a turn/start retry must repeat: the thread and the input, as `turnStarted` records them.
pub(crate) fn turn_start_fingerprint(thread_id: &str, input: &[UserInput]) -> String {
    digest_json(&json!({"threadId": thread_id, "input": input}))
}

/// The fingerprint of a request's params for its idempotency entry.
fn fingerprint(method: &str, params: &Value) -> Result<String, RpcError> {
    Ok(match method {
        "thread/start" => thread_start_fingerprint(
            str_param(params, "title"),
            &params
                .get("metadata")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default(),
            params.get("agentOptions").unwrap_or(&Value::Null),
        ),
        "turn/start" => turn_start_fingerprint(
            str_param(params, "threadId").unwrap_or_default(),
            &user_input(params)?,
        ),
        _ => {
            let mut p = params.clone();
            if let Some(o) = p.as_object_mut() {
                o.remove("idempotencyKey");
            }
            digest_json(&p)
        }
    })
}

/// Runs `f` once per (method, idempotencyKey); a retry returns the first result, a reuse of the
/// key with other params is a conflict. Entries are rebuilt from the rollout at open, so a retry
/// after a restart gets the same answer too (thread/start and turn/start; see docs/engine.md).
fn idempotent(
    inner: &Inner,
    method: &str,
    params: &Value,
    f: impl FnOnce() -> RpcResult,
) -> RpcResult {
    let Some(key) = params.get("idempotencyKey").and_then(Value::as_str) else {
        return f();
    };
    let digest = fingerprint(method, params)?;
    let slot = (method.to_string(), key.to_string());
    let mut cache = lock(&inner.idempotency);
    // The same key still running (a retry sent before the first was answered): wait for it.
    while cache.in_flight.contains(&slot) {
        cache = inner
            .idempotency_done
            .wait(cache)
            .unwrap_or_else(|p| p.into_inner());
    }
    // A thread/start or thread/fork retry that names its new thread must name the same one.
    let same = |seen: &str, result: &Value| {
        let named = match method {
            "thread/start" => str_param(params, "threadId"),
            "thread/fork" => str_param(params, "newThreadId"),
            _ => None,
        };
        let same_thread = named.is_none_or(|n| result["thread"]["id"] == n);
        if seen == digest && same_thread {
            Ok(result.clone())
        } else {
            Err(RpcError::new(
                error_code::CONFLICT,
                "idempotencyKey was already used with different params",
            ))
        }
    };
    if let Some((seen, result)) = cache.get(method, key) {
        return same(seen, result);
    }
    cache.in_flight.insert(slot.clone());
    drop(cache);
    // Not in the cache (it is bounded, and starts empty after a restart): the rollout records
    // the keys of thread/start and turn/start, so the first request's answer is rebuilt from
    // there rather than running the request twice.
    let (outcome, entry) = match recorded_result(inner, method, key, params) {
        Err(e) => (Err(e), None),
        Ok(Some((seen, result))) => (same(&seen, &result), Some((seen, result))),
        Ok(None) => {
            let outcome = f();
            let entry = outcome.as_ref().ok().map(|r| (digest.clone(), r.clone()));
            (outcome, entry)
        }
    };
    let mut cache = lock(&inner.idempotency);
    cache.in_flight.remove(&slot);
    if let Some((seen, result)) = entry {
        cache.put(
            method,
            key,
            seen,
            result,
            inner.config.limits.idempotency_entries,
        );
    }
    drop(cache);
    inner.idempotency_done.notify_all();
    outcome
}

/// The (fingerprint, result) of the request that first used `key`, as the rollout recorded it:
/// a thread/start's key in its thread's header, a turn/start's in its `turnStarted` event.
fn recorded_result(
    inner: &Inner,
    method: &str,
    key: &str,
    params: &Value,
) -> Result<Option<(String, Value)>, RpcError> {
    match method {
        "thread/start" => {
            let Some(id) = inner.store.thread_by_start_key(key)? else {
                return Ok(None);
            };
            let summary = inner.store.summary(&id)?;
            let header = inner.store.header(&id)?;
            Ok(super::threads::rebuilt_thread_start(&summary, &header).map(|(_, _, f, r)| (f, r)))
        }
        "turn/start" => {
            let thread_id = str_param(params, "threadId").unwrap_or_default();
            match inner.store.find_by_idempotency_key(thread_id, key) {
                Ok(Some(ev)) if ev.kind() == "turnStarted" => {
                    Ok(super::threads::rebuilt_turn_start(thread_id, &ev)
                        .map(|(_, _, f, r)| (f, r)))
                }
                Ok(_) | Err(StoreError::NotFound(_)) | Err(StoreError::InvalidId { .. }) => {
                    Ok(None)
                }
                Err(e) => Err(e.into()),
            }
        }
        _ => Ok(None),
    }
}

fn random_id(prefix: &str) -> String {
    format!("{prefix}-{}", &crate::approval::new_nonce()[..20])
}

pub(crate) fn wire_thread(id: &str, data: &ThreadData) -> Thread {
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
        parent_thread_id: data.forked_from.as_ref().map(|f| f.thread_id.clone()),
        created_at: data.created_at.clone(),
        updated_at: data.updated_at.clone(),
        revision: data.last_seq,
        metadata: data.metadata.clone(),
    }
}

fn str_param<'a>(params: &'a Value, name: &str) -> Option<&'a str> {
    params.get(name).and_then(Value::as_str)
}

fn user_input(params: &Value) -> Result<Vec<UserInput>, RpcError> {
    serde_json::from_value(params["input"].clone())
        .map_err(|e| RpcError::new(error_code::INVALID_PARAMS, cap(&format!("input: {e}"), 512)))
}

/// Writes the terminal event of a turn the store refused to record (disk full) before anything
/// else happens on the thread. No notification: `turn/completed` already went out.
pub(crate) fn record_pending_terminal(inner: &Inner, thread: &ThreadState) -> Result<(), RpcError> {
    let guard = lock(&thread.emit_lock);
    let Some(pending) = lock(&thread.data).pending_terminal.clone() else {
        return Ok(());
    };
    match emit_locked(inner, thread, &guard, vec![event(&pending)], |_| vec![]) {
        Ok(_) => {
            lock(&thread.data).pending_terminal = None;
            Ok(())
        }
        Err(e) => {
            tracing::error!(target: "cc_app_server::turn", "thread {}: the end of the last turn still cannot be recorded: {e}", thread.id);
            Err(RpcError::new(
                error_code::INTERNAL,
                "internal error: the rollout store refuses writes (disk full?), so the previous turn's end is not recorded yet; free space and retry",
            ))
        }
    }
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
    let agent_options = params.get("agentOptions").cloned();
    let recorded = HeaderExtra {
        agent_options: agent_options.clone(),
        idempotency_key: str_param(params, "idempotencyKey").map(str::to_string),
    };
    let (summary, _) = inner.store.start_recorded(start, recorded)?;
    let mut data = data_from_summary(&summary);
    data.agent_options = agent_options.unwrap_or(Value::Null);
    data.recovered = true;
    let thread = wire_thread(&thread_id, &data);
    insert_thread(inner, new_state(inner, &thread_id, data));
    conn.follow(&thread_id);
    result(ThreadStartResult {
        thread,
        extra: Map::new(),
    })
}

fn thread_read(
    inner: &Inner,
    conn: &Arc<ConnShared>,
    params: &Value,
    resume: bool,
    out: &mut String,
) -> Result<(), RpcError> {
    let thread = load_thread(inner, str_param(params, "threadId").unwrap_or_default())?;
    let after = params
        .get("afterEventSeq")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let limit = params.get("limit").and_then(Value::as_u64).unwrap_or(100) as usize;
    super::listing::thread_read(inner, &thread, after, limit, resume, out)?;
    conn.follow(&thread.id);
    Ok(())
}

/// Forks only settled history: while a turn is live, everything up to the last event before it
/// (`base_seq`); an `atEventSeq` inside the live turn is a conflict.
fn thread_fork(inner: &Inner, conn: &Arc<ConnShared>, params: &Value) -> RpcResult {
    let source = load_thread(inner, str_param(params, "threadId").unwrap_or_default())?;
    record_pending_terminal(inner, &source)?;
    let new_id = str_param(params, "newThreadId")
        .map(str::to_string)
        .unwrap_or_else(|| random_id("th"));
    let requested = params.get("atEventSeq").and_then(Value::as_u64);
    let (settled, live) = {
        let _emitting = lock(&source.emit_lock);
        let data = lock(&source.data);
        match &data.active {
            Some(t) => (t.base_seq, Some(t.id.clone())),
            None => (data.last_seq, None),
        }
    };
    let at = match (requested, &live) {
        (Some(at), Some(turn)) if at > settled => {
            return Err(RpcError::new(
                error_code::CONFLICT,
                format!("atEventSeq {at} is inside turn {turn}, which is still running; fork at {settled} or earlier, or after the turn ends"),
            ))
        }
        (Some(at), _) => at,
        (None, _) => settled,
    };
    let (summary, _) = inner.store.fork(
        &source.id,
        Some(at),
        &new_id,
        str_param(params, "title").map(str::to_string),
    )?;
    let mut data = data_from_summary(&summary);
    data.agent_options = lock(&source.data).agent_options.clone();
    data.recovered = true;
    let thread = wire_thread(&new_id, &data);
    let forked_from = data.forked_from.clone().expect("a fork records its origin");
    insert_thread(inner, new_state(inner, &new_id, data));
    conn.follow(&new_id);
    result(ThreadForkResult {
        thread,
        forked_from,
        extra: Map::new(),
    })
}

fn thread_archive(inner: &Inner, conn: &Arc<ConnShared>, params: &Value) -> RpcResult {
    let thread = load_thread(inner, str_param(params, "threadId").unwrap_or_default())?;
    conn.follow(&thread.id);
    record_pending_terminal(inner, &thread)?;
    let _guard = lock(&thread.emit_lock);
    {
        let data = lock(&thread.data);
        if data.active.is_some() {
            return Err(RpcError::new(
                error_code::CONFLICT,
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
    let wire = {
        let mut data = lock(&thread.data);
        data.archived = true;
        data.last_seq = event.seq;
        data.updated_at = event.time.clone();
        wire_thread(&thread.id, &data)
    };
    announce_thread_update(inner, &thread.id, event.seq, &wire);
    result(ThreadArchiveResult {
        thread: wire,
        extra: Map::new(),
    })
}

/// Tells every connection that follows the thread that it changed (archive, compaction): the
/// event at `event_seq` is already durable.
pub(crate) fn announce_thread_update(
    inner: &Inner,
    thread_id: &str,
    event_seq: u64,
    wire: &Thread,
) {
    let note = ServerNotification::ThreadUpdated(ThreadUpdatedNotification {
        jsonrpc: rpc(),
        params: ThreadUpdatedParams {
            thread_id: thread_id.to_string(),
            event_seq,
            thread: wire.clone(),
            extra: Map::new(),
        },
    });
    let note = serde_json::to_string(&note).expect("a notification is JSON");
    for c in super::followers(inner, thread_id) {
        super::deliver(inner, &c, note.clone());
    }
}

/// Admits the turn (bounded: -32001 beyond the running and queued bounds), records
/// `turnStarted`, answers at once with the turn `queued`, and hands it to the runner pool.
fn turn_start(inner: &Arc<Inner>, conn: &Arc<ConnShared>, params: &Value) -> RpcResult {
    let thread = load_thread(inner, str_param(params, "threadId").unwrap_or_default())?;
    let input = user_input(params)?;
    conn.follow(&thread.id);
    record_pending_terminal(inner, &thread)?;
    if let Err(retry_after_ms) = inner.pool.admit() {
        Stats::bump(&inner.stats.turns_refused_overloaded);
        return Err(RpcError::overloaded(
            format!(
                "overloaded: {} turns are running and {} waiting, the most this server takes; retry later",
                inner.config.limits.max_running_turns, inner.config.limits.max_queued_turns
            ),
            retry_after_ms,
        ));
    }
    // Held while admitting so that an archive or an in-flight append on this thread finishes
    // first: `base_seq` is then exactly the settled history.
    let guard = lock(&thread.emit_lock);
    let admitted = {
        let mut data = lock(&thread.data);
        if data.archived {
            Err(RpcError::new(
                error_code::CONFLICT,
                "the thread is archived; fork it to continue",
            ))
        } else if let Some(active) = &data.active {
            Err(RpcError::new(
                error_code::CONFLICT,
                format!(
                    "turn {} is still active on this thread; one turn at a time",
                    active.id
                ),
            ))
        } else {
            let turn = turn::TurnShared::new(
                random_id("tu"),
                thread.id.clone(),
                Arc::downgrade(conn),
                data.last_seq,
            );
            data.active = Some(Arc::clone(&turn));
            Ok(turn)
        }
    };
    let turn = match admitted {
        Ok(t) => t,
        Err(e) => {
            inner.pool.release();
            return Err(e);
        }
    };
    let mut started = event(&EventPayload::TurnStarted(TurnStartedEvent {
        turn_id: turn.id.clone(),
        input: input.clone(),
        extra: Map::new(),
    }));
    started.idempotency_key = str_param(params, "idempotencyKey").map(str::to_string);
    let recorded = emit_locked(inner, &thread, &guard, vec![started], |events| {
        turn.set_started_at(&events[0].time);
        vec![ServerNotification::TurnStarted(TurnStartedNotification {
            jsonrpc: rpc(),
            params: TurnStartedParams {
                thread_id: thread.id.clone(),
                event_seq: events[0].seq,
                turn: turn.to_wire(),
                extra: Map::new(),
            },
        })]
    });
    drop(guard);
    if let Err(e) = recorded {
        lock(&thread.data).active = None;
        inner.pool.release();
        return Err(e.into());
    }
    let wire = turn.to_wire();
    let job = Job {
        inner: Arc::clone(inner),
        thread: Arc::clone(&thread),
        turn,
        input,
    };
    match inner.pool.submit(job) {
        Ok(()) => {}
        // The turn is recorded: it ends in exactly one terminal state, recorded, and the thread
        // is free for the next turn/start.
        Err(SubmitError::NoRunner(job)) => turn::close_unstarted(job, Unstarted::NoRunner),
        Err(SubmitError::ShuttingDown(job)) => turn::close_unstarted(job, Unstarted::Interrupted),
    }
    result(TurnStartResult {
        turn: wire,
        extra: Map::new(),
    })
}

/// Cancels the turn and answers once its kernel has stopped, or -32010 at the settle deadline.
/// Waiting costs no thread: the runner answers when the turn settles, the connection's worker at
/// the deadline.
fn turn_interrupt(inner: &Arc<Inner>, conn: &Arc<ConnShared>, id: RawId, params: &Value) {
    let thread = match load_thread(inner, str_param(params, "threadId").unwrap_or_default()) {
        Ok(t) => t,
        Err(e) => return reply(inner, conn, &id, Err(e)),
    };
    let turn_id = str_param(params, "turnId").unwrap_or_default().to_string();
    let active = lock(&thread.data)
        .active
        .clone()
        .filter(|t| t.id == turn_id);
    let Some(turn) = active else {
        let result = match finished_turn(inner, &thread, &turn_id) {
            Ok(Some(turn)) => settled(turn),
            Ok(None) => Err(RpcError::new(
                error_code::NOT_FOUND,
                format!("turn {turn_id:?} not found in this thread"),
            )),
            Err(e) => Err(e),
        };
        return reply(inner, conn, &id, result);
    };
    turn.cancel();
    inner.config.tools.interrupt(&thread.id);
    if let Some(job) = inner.pool.remove_queued(&turn.id) {
        // It never reached a runner: closed here, as interrupted.
        turn::close_unstarted(job, Unstarted::Interrupted);
    }
    if turn.is_done() {
        return reply_settled(inner, conn, &id, turn.to_ended());
    }
    {
        let mut waiting = lock(&conn.interrupts);
        waiting.retain(|(_, t)| !t.is_done());
        if waiting.len() >= inner.config.limits.max_pending_interrupts {
            drop(waiting);
            Stats::bump(&inner.stats.interrupts_refused_overloaded);
            let retry = inner.config.settle_deadline.as_millis() as u64;
            return reply(
                inner,
                conn,
                &id,
                Err(RpcError::overloaded(
                    "overloaded: too many turn/interrupt requests on this connection are waiting for kernels to stop; the turn is cancelled, retry later to learn when it settled",
                    retry,
                )),
            );
        }
    }
    let deadline = Instant::now() + inner.config.settle_deadline;
    let waiter = turn::InterruptWaiter {
        conn: Arc::downgrade(conn),
        conn_id: conn.id,
        request_id: id.clone(),
        deadline,
    };
    match turn.settled_or_wait(waiter) {
        Ok(t) => reply_settled(inner, conn, &id, t),
        Err(()) => lock(&conn.interrupts).push((deadline, turn)),
    }
}

/// turn/interrupt's answer: only ever given once the kernel has returned.
fn settled(ended: EndedTurn) -> RpcResult {
    result(TurnInterruptResult {
        turn: ended.turn,
        error: ended.error,
        physically_settled: true,
        extra: Map::new(),
    })
}
