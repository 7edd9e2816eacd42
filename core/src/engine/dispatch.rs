//! Reading a connection's inbound queue: parse, validate against the schema, enforce the
//! handshake, then run the method. Request ids are echoed byte for byte as the host wrote them.

use super::causal::Step;
use super::idempotency::{thread_start_fingerprint, turn_start_fingerprint, Keyed, Recorded};
use super::outbound::{cap, reply, reply_with, result, rpc, RawId, RpcError, RpcResult};
use super::pipeline::emit_locked;
use super::pool::SubmitError;
use super::threads::{data_from_summary, finished_turn, load_thread, wire_thread};
use super::turn::{self, event, reply_settled, Job, Unstarted};
use super::{lock, ConnShared, Inner, ServerConfig, Stats, ThreadState, IMPLEMENTED_FEATURES};
use crate::approval::digest_json;
use crate::graph::wire::GraphCall;
use crate::protocol::error_code;
use crate::protocol::{
    AgentOptions, ClientRequest, InitializeParams, ThreadForkParams, ThreadStartParams,
    TurnStartParams,
};
use crate::protocol::{
    EventPayload, InitializeResult, ServerInfo, ServerNotification, ThreadArchiveResult,
    ThreadForkResult, ThreadStartResult, TurnStartResult, TurnStartedEvent,
    TurnStartedNotification, TurnStartedParams,
};
use crate::rollout::trace::{parse_traceparent, Trace};
use crate::rollout::{HeaderExtra, StoreError, ThreadStart};
use cc_agent_protocol::{validate_protocol_message, MessageKind};
use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};
use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

/// Longest string id, in characters (the schema's `RequestId`).
pub const MAX_STRING_ID_CHARS: usize = 128;
/// Largest integer id (2^53 - 1: every language holds it exactly).
const MAX_INTEGER_ID: u64 = 9_007_199_254_740_991;

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
        expire_interrupts(&inner.stats, conn);
    }
    conn.close_all(false);
}

fn expire_interrupts(stats: &Stats, conn: &ConnShared) {
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
            reply(stats, conn, &w.request_id, Err(e));
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
                &inner.stats,
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
            return reply(&inner.stats, conn, "null", Err(e));
        }
        None => "null",
    };
    let method = match validate_protocol_message(&value) {
        Err(e) => {
            let message = cap(&e.to_string(), 512);
            let mut err = RpcError::new(e.class.code(), message);
            err.data = Some(json!({"pointer": cap(e.pointer(), 1024)}));
            return reply(&inner.stats, conn, id, Err(err));
        }
        Ok(MessageKind::ClientRequest { method, .. }) => method,
        Ok(MessageKind::ServerRequest { method, .. }) => {
            return reply(
                &inner.stats,
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
                &inner.stats,
                conn,
                id,
                Err(RpcError::new(
                    error_code::INVALID_REQUEST,
                    "clients send requests and approval answers only in wire v1",
                )),
            )
        }
    };
    if method == "initialize" && lock(&conn.state).initialized {
        let e = RpcError::new(
            error_code::CONFLICT,
            "already initialized on this connection",
        );
        return reply(&inner.stats, conn, id, Err(e));
    }
    if method != "initialize" && !lock(&conn.state).initialized {
        let e = RpcError::new(
            error_code::NOT_INITIALIZED,
            "not initialized: send initialize first",
        );
        return reply(&inner.stats, conn, id, Err(e));
    }
    // Valid against the schema, so the generated type reads it; a disagreement between the two
    // would be ours, and is refused rather than guessed at.
    // Both tries read by reference: one instantiation of the request types' visitors (a
    // by-value `from_value` beside it was a second copy, ~20 KB of the mobile library).
    let request = match ClientRequest::deserialize(&value) {
        Ok(r) => Ok(r),
        Err(_) => {
            let mut value = value;
            integral_floats_as_integers(&mut value);
            ClientRequest::deserialize(&value)
        }
    };
    let request = match request {
        Ok(r) => r,
        Err(e) => {
            let message = cap(&format!("invalid params: {e}"), 512);
            return reply(
                &inner.stats,
                conn,
                id,
                Err(RpcError::new(error_code::INVALID_PARAMS, message)),
            );
        }
    };
    route(inner, conn, id, request);
}

/// One handler per method of the generated `ClientRequest`. A handler that answers later (from
/// another thread, or straight into the answer's text) replies itself; the rest return.
fn route(inner: &Arc<Inner>, conn: &Arc<ConnShared>, id: &str, request: ClientRequest) {
    let result = match request {
        ClientRequest::Initialize(r) => initialize(&inner.config, conn, &r.params),
        ClientRequest::ThreadStart(r) => {
            let params = r.params.unwrap_or_else(no_params);
            let keyed = params.idempotency_key.as_deref().map(|key| Keyed {
                method: "thread/start",
                key,
                fingerprint: thread_start_fingerprint(
                    params.title.as_deref(),
                    params.metadata.as_ref().unwrap_or(&Map::new()),
                    &agent_options(params.agent_options.as_ref()).unwrap_or(Value::Null),
                ),
                names: params.thread_id.as_deref(),
                thread_id: None,
            });
            inner.idempotency.once(
                keyed,
                |k| recorded_result(inner, k),
                || thread_start(inner, conn, &params),
            )
        }
        ClientRequest::ThreadRead(r) => {
            let p = r.params;
            return reply_with(&inner.stats, conn, id, 4096, |out| {
                thread_read(
                    inner,
                    conn,
                    &p.thread_id,
                    p.after_event_seq,
                    p.limit,
                    false,
                    out,
                )
            });
        }
        ClientRequest::ThreadResume(r) => {
            let p = r.params;
            return reply_with(&inner.stats, conn, id, 4096, |out| {
                thread_read(
                    inner,
                    conn,
                    &p.thread_id,
                    p.after_event_seq,
                    p.limit,
                    true,
                    out,
                )
            });
        }
        ClientRequest::ThreadFork(r) => {
            let params = r.params;
            let keyed = params
                .idempotency_key
                .as_deref()
                .map(|key| {
                    Ok(Keyed {
                        method: "thread/fork",
                        key,
                        fingerprint: params_fingerprint(&params)?,
                        names: params.new_thread_id.as_deref(),
                        thread_id: None,
                    })
                })
                .transpose();
            match keyed {
                Ok(keyed) => inner.idempotency.once(
                    keyed,
                    |k| recorded_result(inner, k),
                    || thread_fork(inner, conn, &params),
                ),
                Err(e) => Err(e),
            }
        }
        ClientRequest::ThreadList(r) => {
            return reply_with(&inner.stats, conn, id, 24 * 1024, |out| {
                super::listing::thread_list(inner, r.params, out)
            });
        }
        ClientRequest::ThreadArchive(r) => thread_archive(inner, conn, &r.params.thread_id),
        ClientRequest::TurnStart(r) => {
            let params = r.params;
            let keyed = params.idempotency_key.as_deref().map(|key| Keyed {
                method: "turn/start",
                key,
                fingerprint: turn_start_fingerprint(&params.thread_id, &params.input),
                names: None,
                thread_id: Some(&params.thread_id),
            });
            inner.idempotency.once(
                keyed,
                |k| recorded_result(inner, k),
                || turn_start(inner, conn, &params),
            )
        }
        ClientRequest::TurnInterrupt(r) => {
            let p = r.params;
            return turn_interrupt(inner, conn, id.into(), &p.thread_id, &p.turn_id);
        }
        ClientRequest::ThreadCompact(r) => match load_thread(inner, &r.params.thread_id) {
            Ok(thread) => {
                let (id, summary) = (id.into(), r.params.summary);
                return super::compact::thread_compact(inner, conn, thread, id, summary);
            }
            Err(e) => Err(e),
        },
        ClientRequest::GraphValidate(r) => {
            return graph(inner, conn, id, GraphCall::Validate(r.params))
        }
        ClientRequest::GraphRunStart(r) => {
            return graph(inner, conn, id, GraphCall::RunStart(r.params))
        }
        ClientRequest::GraphRunRead(r) => {
            return graph(inner, conn, id, GraphCall::RunRead(r.params))
        }
        ClientRequest::GraphRunCancel(r) => {
            return graph(inner, conn, id, GraphCall::RunCancel(r.params))
        }
    };
    reply(&inner.stats, conn, id, result);
}

/// The graph methods, served by the Graph Kernel's host. A large compile is answered from a
/// thread of its own (possibly after later requests of this connection); everything else in
/// order, from here.
fn graph(inner: &Arc<Inner>, conn: &Arc<ConnShared>, id: &str, call: GraphCall) {
    let (inner2, conn2, id2): (_, _, RawId) = (Arc::clone(inner), Arc::clone(conn), id.into());
    let answer = move |r: Result<Value, crate::graph::wire::WireError>| {
        let r = r.map_err(|e| RpcError {
            code: e.code,
            message: e.message,
            data: e.data,
        });
        reply(&inner2.stats, &conn2, &id2, r)
    };
    let follower: Arc<dyn crate::graph::port::Follower> = Arc::<ConnShared>::clone(conn);
    crate::graph::wire::serve(&inner.graph, &follower, call, Box::new(answer));
}

/// JSON Schema counts `3.0` as an integer, so the validator accepts it where the schema says
/// `integer`; the generated types read integers only. A message the typed read refuses is read
/// again with its integral floats as integers (the id is still echoed exactly as written: it
/// was taken from the text; free-form values such as metadata keep their floats otherwise).
fn integral_floats_as_integers(value: &mut Value) {
    let mut stack = vec![value];
    while let Some(v) = stack.pop() {
        match v {
            Value::Number(n) if n.is_f64() => {
                let f = n.as_f64().unwrap_or(f64::NAN);
                if f.fract() == 0.0 && f >= 0.0 && f <= u64::MAX as f64 {
                    *v = Value::from(f as u64);
                } else if f.fract() == 0.0 && f < 0.0 && f >= i64::MIN as f64 {
                    *v = Value::from(f as i64);
                }
            }
            Value::Array(items) => stack.extend(items.iter_mut()),
            Value::Object(members) => stack.extend(members.values_mut()),
            _ => {}
        }
    }
}

/// A request whose params are all optional, sent without params.
fn no_params<T: serde::de::DeserializeOwned>() -> T {
    serde_json::from_value(json!({})).expect("every member of these params is optional")
}

/// The agent options as the header records them (JSON).
fn agent_options(options: Option<&AgentOptions>) -> Option<Value> {
    options.map(|o| serde_json::to_value(o).expect("agent options are JSON"))
}

fn initialize(config: &ServerConfig, conn: &ConnShared, params: &InitializeParams) -> RpcResult {
    let (server_lo, server_hi) = config.protocol_versions;
    let client_hi = u32::try_from(params.protocol_version).unwrap_or(u32::MAX);
    let client_lo = u32::try_from(params.minimum_protocol_version).unwrap_or(u32::MAX);
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
    let wanted: Vec<&str> = params
        .features
        .iter()
        .flatten()
        .map(String::as_str)
        .collect();
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
            name: config.server_name.clone(),
            version: config.server_version.clone(),
            extra: Map::new(),
        },
        schema_digest: cc_app_server_protocol::SCHEMA_DIGEST.to_string(),
        extra: Map::new(),
    })
}

/// The fingerprint of params that are remembered only by this process (thread/fork): all of
/// them but the key.
fn params_fingerprint(params: &impl serde::Serialize) -> Result<String, RpcError> {
    let mut p = result(params)?;
    if let Some(o) = p.as_object_mut() {
        o.remove("idempotencyKey");
    }
    Ok(digest_json(&p))
}

/// The (fingerprint, result) of the request that first used the key, as the rollout recorded
/// it: a thread/start's key in its thread's header, a turn/start's in its `turnStarted` event.
fn recorded_result(inner: &Inner, keyed: &Keyed<'_>) -> Recorded {
    match (keyed.method, keyed.thread_id) {
        ("thread/start", _) => {
            let Some(id) = inner.store.thread_by_start_key(keyed.key)? else {
                return Ok(None);
            };
            let summary = inner.store.summary(&id)?;
            let header = inner.store.header(&id)?;
            Ok(super::threads::rebuilt_thread_start(&summary, &header).map(|(_, _, f, r)| (f, r)))
        }
        ("turn/start", Some(thread_id)) => {
            match inner.store.find_by_idempotency_key(thread_id, keyed.key) {
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

fn thread_start(inner: &Inner, conn: &Arc<ConnShared>, params: &ThreadStartParams) -> RpcResult {
    let thread_id = params.thread_id.clone().unwrap_or_else(|| random_id("th"));
    let start = ThreadStart {
        thread_id: thread_id.clone(),
        title: params.title.clone(),
        metadata: params.metadata.clone().unwrap_or_default(),
        forked_from: None,
    };
    let agent_options = agent_options(params.agent_options.as_ref());
    let trace = request_trace(params.traceparent.as_deref(), false)?;
    let recorded = HeaderExtra {
        agent_options: agent_options.clone(),
        idempotency_key: params.idempotency_key.clone(),
        trace_id: trace.as_ref().map(|t| t.id.clone()),
        parent_id: trace.and_then(|t| t.caller),
    };
    let (summary, _) = inner.store.start_recorded(start, recorded)?;
    let mut data = data_from_summary(&summary);
    data.agent_options = agent_options.unwrap_or(Value::Null);
    data.recovered = true;
    let thread = wire_thread(&thread_id, &data);
    inner.threads.add(&thread_id, data, &inner.stats);
    conn.follow(&thread_id);
    result(ThreadStartResult {
        thread,
        extra: Map::new(),
    })
}

fn thread_read(
    inner: &Inner,
    conn: &Arc<ConnShared>,
    thread_id: &str,
    after: Option<u64>,
    limit: Option<u64>,
    resume: bool,
    out: &mut String,
) -> Result<(), RpcError> {
    let thread = load_thread(inner, thread_id)?;
    let (after, limit) = (after.unwrap_or(0), limit.unwrap_or(100) as usize);
    super::listing::thread_read(inner, &thread, after, limit, resume, out)?;
    conn.follow(&thread.id);
    Ok(())
}

/// Forks only settled history: while a turn is live, everything up to the last event before it
/// (`base_seq`); an `atEventSeq` inside the live turn is a conflict.
fn thread_fork(inner: &Inner, conn: &Arc<ConnShared>, params: &ThreadForkParams) -> RpcResult {
    let source = load_thread(inner, &params.thread_id)?;
    record_pending_terminal(inner, &source)?;
    let new_id = params
        .new_thread_id
        .clone()
        .unwrap_or_else(|| random_id("th"));
    let requested = params.at_event_seq;
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
    let (summary, _) = inner
        .store
        .fork(&source.id, Some(at), &new_id, params.title.clone())?;
    let mut data = data_from_summary(&summary);
    data.agent_options = lock(&source.data).agent_options.clone();
    data.recovered = true;
    let thread = wire_thread(&new_id, &data);
    let forked_from = data.forked_from.clone().expect("a fork records its origin");
    inner.threads.add(&new_id, data, &inner.stats);
    conn.follow(&new_id);
    result(ThreadForkResult {
        thread,
        forked_from,
        extra: Map::new(),
    })
}

fn thread_archive(inner: &Inner, conn: &Arc<ConnShared>, thread_id: &str) -> RpcResult {
    let thread = load_thread(inner, thread_id)?;
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
    inner
        .connections
        .announce_thread_update(&inner.stats, &thread.id, event.seq, &wire);
    result(ThreadArchiveResult {
        thread: wire,
        extra: Map::new(),
    })
}

/// Admits the turn (bounded: -32001 beyond the running and queued bounds), records
/// `turnStarted`, answers at once with the turn `queued`, and hands it to the runner pool.
/// The request's trace (docs/rollout-format.md, "Trace and parent ids"): the caller's
/// `traceparent`, or a fresh trace where `fresh` (a turn, a run); -32602 for a malformed one.
pub(crate) fn request_trace(
    traceparent: Option<&str>,
    fresh: bool,
) -> Result<Option<Trace>, RpcError> {
    match traceparent {
        Some(t) => parse_traceparent(t)
            .map(Some)
            .map_err(|why| RpcError::new(error_code::INVALID_PARAMS, why)),
        None => Ok(fresh.then(Trace::fresh)),
    }
}

fn turn_start(inner: &Arc<Inner>, conn: &Arc<ConnShared>, params: &TurnStartParams) -> RpcResult {
    let trace = request_trace(params.traceparent.as_deref(), true)?.unwrap_or_else(Trace::fresh);
    let thread = load_thread(inner, &params.thread_id)?;
    let input = params.input.clone();
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
    started.idempotency_key = params.idempotency_key.clone();
    {
        let mut t = lock(&turn.trace);
        t.begin(trace);
        (started.trace_id, started.parent_id) = t.ids(Step::TurnStarted, None);
    }
    let recorded = emit_locked(inner, &thread, &guard, vec![started], |events| {
        turn.set_started_at(&events[0].time);
        lock(&turn.trace).recorded(Step::TurnStarted, None, events[0].seq);
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
fn turn_interrupt(
    inner: &Arc<Inner>,
    conn: &Arc<ConnShared>,
    id: RawId,
    thread_id: &str,
    turn_id: &str,
) {
    let thread = match load_thread(inner, thread_id) {
        Ok(t) => t,
        Err(e) => return reply(&inner.stats, conn, &id, Err(e)),
    };
    let active = lock(&thread.data)
        .active
        .clone()
        .filter(|t| t.id == turn_id);
    let Some(turn) = active else {
        let result = match finished_turn(inner, &thread, turn_id) {
            Ok(Some(turn)) => turn::settled(turn),
            Ok(None) => Err(RpcError::new(
                error_code::NOT_FOUND,
                format!("turn {turn_id:?} not found in this thread"),
            )),
            Err(e) => Err(e),
        };
        return reply(&inner.stats, conn, &id, result);
    };
    turn.cancel();
    inner.config.tools.interrupt(&thread.id);
    if let Some(job) = inner.pool.remove_queued(&turn.id) {
        // It never reached a runner: closed here, as interrupted.
        turn::close_unstarted(job, Unstarted::Interrupted);
    }
    if turn.is_done() {
        return reply_settled(&inner.stats, conn, &id, turn.to_ended());
    }
    {
        let mut waiting = lock(&conn.interrupts);
        waiting.retain(|(_, t)| !t.is_done());
        if waiting.len() >= inner.config.limits.max_pending_interrupts {
            drop(waiting);
            Stats::bump(&inner.stats.interrupts_refused_overloaded);
            let retry = inner.config.settle_deadline.as_millis() as u64;
            return reply(
                &inner.stats,
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
        Ok(t) => reply_settled(&inner.stats, conn, &id, t),
        Err(()) => lock(&conn.interrupts).push((deadline, turn)),
    }
}
