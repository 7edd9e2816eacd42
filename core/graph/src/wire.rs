//! The graph methods on the wire (behind `typed_graph`): graph/validate, graph/run/start,
//! graph/run/read, graph/run/cancel. Params arrive already validated against the schema; the
//! answers are built from the generated types.

use super::compiler::compile;
use super::host::GraphHost;
use super::host::{self, GraphError, StartRequest};
use super::port::Follower;
use super::runtime::lock;
use crate::protocol::error_code;
use crate::protocol::{
    GraphRunCancelParams, GraphRunCancelResult, GraphRunGrant, GraphRunReadParams,
    GraphRunReadResult, GraphRunStartParams, GraphRunStartResult, GraphValidateParams,
    GraphValidateResult,
};
use serde_json::{json, Map, Value};
use std::sync::{Arc, Mutex};

/// The feature every graph method needs.
pub const TYPED_GRAPH: &str = "typed_graph";
/// Message state (ids, custody, causes) in graph/run/read.
pub const CAUSAL_MESSAGES: &str = "causal_messages";
/// Effects and their receipts in graph/run/read.
pub const EFFECT_RECEIPTS: &str = "graph_effect_receipts";

/// A definition with more nodes and edges than this (across its bodies) is compiled, for
/// graph/validate and graph/run/start, on a thread of its own rather than on the connection's,
/// so one connection's other requests are never held behind it. Its answer may then arrive
/// after the answers to requests sent after it (JSON-RPC matches answers by id).
pub const LARGE_COMPILE_ELEMENTS: usize = 1_000;

/// How the engine answers a request: once, from whichever thread.
pub type Answer = Box<dyn FnOnce(Result<Value, WireError>) + Send>;

/// Nodes and edges of a definition across its bodies, counted without decoding it; stops
/// counting at `limit`.
fn elements(definition: &Value, limit: usize) -> usize {
    let mut count = 0;
    let mut bodies = vec![definition];
    while let Some(body) = bodies.pop() {
        let nodes = body.get("nodes").and_then(Value::as_array);
        let edges = body.get("edges").and_then(Value::as_array);
        count += nodes.map_or(0, Vec::len) + edges.map_or(0, Vec::len);
        if count > limit {
            return count;
        }
        bodies.extend(nodes.into_iter().flatten().filter_map(|n| n.get("body")));
    }
    count
}

/// One graph/* request, as the engine's typed dispatch hands it over.
pub enum GraphCall {
    Validate(GraphValidateParams),
    RunStart(GraphRunStartParams),
    RunRead(GraphRunReadParams),
    RunCancel(GraphRunCancelParams),
}

impl GraphCall {
    fn method(&self) -> &'static str {
        match self {
            GraphCall::Validate(_) => "graph/validate",
            GraphCall::RunStart(_) => "graph/run/start",
            GraphCall::RunRead(_) => "graph/run/read",
            GraphCall::RunCancel(_) => "graph/run/cancel",
        }
    }

    /// The definition a graph/validate or graph/run/start compiles, as the JSON the compiler
    /// reads (and the run's digest is taken over).
    fn definition(&self) -> Option<Value> {
        let definition = match self {
            GraphCall::Validate(p) => &p.definition,
            GraphCall::RunStart(p) => &p.definition,
            _ => return None,
        };
        Some(serde_json::to_value(definition).expect("a definition is JSON"))
    }
}

/// Serves one graph/* request: inline, or — a large graph/validate or graph/run/start — on a
/// thread of its own holding one of the server's compile slots (none free: -32001 at once).
pub fn serve(host: &Arc<GraphHost>, conn: &Arc<dyn Follower>, call: GraphCall, answer: Answer) {
    let definition = call.definition();
    let large = conn.has_feature(TYPED_GRAPH)
        && definition
            .as_ref()
            .is_some_and(|d| elements(d, LARGE_COMPILE_ELEMENTS) > LARGE_COMPILE_ELEMENTS);
    if !large {
        return answer(handle(host, conn, call, definition));
    }
    let Some(slot) = host.compile_slot() else {
        return answer(Err(WireError {
            code: error_code::OVERLOADED,
            message: format!(
                "server busy: {} large graph compiles are running, the most this server runs at once; retry when one has answered",
                super::host::MAX_CONCURRENT_COMPILES
            ),
            data: Some(json!({"retry_after_ms": 500})),
        }));
    };
    let (host2, conn2) = (Arc::clone(host), Arc::clone(conn));
    // The answer is moved into the thread; if no thread can be started it comes back here.
    let pending = Arc::new(Mutex::new(Some(answer)));
    let mine = Arc::clone(&pending);
    let started = host.threads.spawn("cc-graph-compile", move || {
        let result = handle(&host2, &conn2, call, definition);
        drop(slot);
        if let Some(answer) = lock(&mine).take() {
            answer(result);
        }
    });
    if !started {
        if let Some(answer) = lock(&pending).take() {
            answer(Err(WireError {
                code: error_code::INTERNAL,
                message: "internal error: could not start a thread for the compile".into(),
                data: None,
            }));
        }
    }
}

/// A JSON-RPC error for the engine to send.
pub struct WireError {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

impl From<GraphError> for WireError {
    fn from(e: GraphError) -> Self {
        let data = match &e {
            GraphError::Invalid(c) => Some(json!({"pointer": c.pointer, "reason": c.code_name()})),
            // -32001 always says when to retry (the schema's OverloadedError).
            GraphError::Overloaded => Some(json!({"retry_after_ms": 1000})),
            _ => None,
        };
        let message = match &e {
            GraphError::Store(_) => {
                tracing::error!(target: "cc_app_server::graph", "{e}");
                "internal error: the graph run store failed; see the server's diagnostics"
                    .to_string()
            }
            other => other.to_string(),
        };
        WireError {
            code: e.code(),
            message,
            data,
        }
    }
}

fn params_error(message: impl Into<String>) -> WireError {
    WireError {
        code: error_code::INVALID_PARAMS,
        message: message.into(),
        data: None,
    }
}

fn no_grant() -> GraphRunGrant {
    GraphRunGrant {
        capabilities: Vec::new(),
        budgets: None,
    }
}

/// Answers one graph/* request (`definition`: the call's definition as JSON, when it has one).
fn handle(
    host: &Arc<GraphHost>,
    conn: &Arc<dyn Follower>,
    call: GraphCall,
    definition: Option<Value>,
) -> Result<Value, WireError> {
    if !conn.has_feature(TYPED_GRAPH) {
        return Err(WireError {
            code: error_code::METHOD_NOT_FOUND,
            message: format!(
                "{} needs the typed_graph feature: ask for it in initialize",
                call.method()
            ),
            data: None,
        });
    }
    let definition = definition.unwrap_or(Value::Null);
    match call {
        GraphCall::Validate(p) => validate(&definition, p.grant.unwrap_or_else(no_grant)),
        GraphCall::RunStart(p) => {
            let req = StartRequest {
                definition,
                run_id: p.run_id,
                inputs: p.inputs.unwrap_or_default(),
                grant: p.grant.unwrap_or_else(no_grant),
                options: p.options,
                idempotency_key: p.idempotency_key,
                traceparent: p.traceparent,
            };
            run_start(host, conn, req)
        }
        GraphCall::RunRead(p) => run_read(host, conn, &p),
        GraphCall::RunCancel(p) => run_cancel(host, conn, &p.run_id, p.reason),
    }
}

fn to_value(v: impl serde::Serialize) -> Result<Value, WireError> {
    serde_json::to_value(v).map_err(|_| WireError {
        code: error_code::INTERNAL,
        message: "internal error: unencodable result".into(),
        data: None,
    })
}

fn validate(definition: &Value, grant: GraphRunGrant) -> Result<Value, WireError> {
    let result = match compile(definition, &grant) {
        Ok(plan) => GraphValidateResult {
            valid: true,
            plan_digest: Some(plan.digest.clone()),
            node_count: plan.node_count() as u64,
            errors: Vec::new(),
            extra: Map::new(),
        },
        Err(errors) => GraphValidateResult {
            valid: false,
            plan_digest: None,
            node_count: 0,
            errors: errors.iter().map(|e| e.to_wire()).collect(),
            extra: Map::new(),
        },
    };
    to_value(result)
}

fn run_start(
    host: &Arc<GraphHost>,
    conn: &Arc<dyn Follower>,
    req: StartRequest,
) -> Result<Value, WireError> {
    let (run, summary) = host::start(host, req, Arc::downgrade(conn)).map_err(WireError::from)?;
    run.follow(conn);
    to_value(GraphRunStartResult {
        run: summary,
        extra: Map::new(),
    })
}

fn run_read(
    host: &Arc<GraphHost>,
    conn: &Arc<dyn Follower>,
    params: &GraphRunReadParams,
) -> Result<Value, WireError> {
    let run_id = params.run_id.as_str();
    let run = host::get(host, run_id).map_err(WireError::from)?;
    let include = params.include_content.unwrap_or(false);
    let after = params.after_event_seq;
    if after.is_some() && !include {
        return Err(params_error(
            "afterEventSeq returns the run's log, whose events carry content: pass includeContent: true",
        ));
    }
    run.follow(conn);
    let mut result = {
        let core = run.enter();
        let st = &core.state;
        GraphRunReadResult {
            run: st.summary(include),
            nodes: st
                .node_order
                .iter()
                .filter_map(|k| st.nodes.get(k))
                .map(|n| st.node_state(n))
                .collect(),
            messages: conn.has_feature(super::wire::CAUSAL_MESSAGES).then(|| {
                st.message_order
                    .iter()
                    .filter_map(|m| st.messages.get(m))
                    .map(|m| st.message_state(m, include))
                    .collect()
            }),
            effects: conn.has_feature(EFFECT_RECEIPTS).then(|| {
                st.effect_order
                    .iter()
                    .filter_map(|k| st.effects.get(k))
                    .map(|e| st.effect_state(e, include))
                    .collect()
            }),
            events: None,
            has_more: None,
            extra: Map::new(),
        }
    };
    let mut value = to_value(&result)?;
    if let Some(after) = after {
        let limit = params.limit.unwrap_or(100) as usize;
        let page = run
            .store
            .read(run_id, after, limit)
            .map_err(|e| WireError::from(GraphError::from(e)))?;
        // Events go out as the store's RolloutEvent JSON, like thread/read's.
        value["events"] = Value::Array(page.events.iter().map(|e| e.to_json()).collect());
        value["hasMore"] = Value::Bool(page.has_more);
        result.has_more = Some(page.has_more);
    }
    Ok(value)
}

fn run_cancel(
    host: &Arc<GraphHost>,
    conn: &Arc<dyn Follower>,
    run_id: &str,
    reason: Option<String>,
) -> Result<Value, WireError> {
    let run = host::get(host, run_id).map_err(WireError::from)?;
    run.follow(conn);
    let fenced = run
        .cancel(reason)
        .map_err(|e| WireError::from(GraphError::from(e)))?;
    let summary = run.enter().state.summary(false);
    to_value(GraphRunCancelResult {
        run: summary,
        fenced,
        extra: Map::new(),
    })
}
