//! Reconciliation after a crash, from logs written exactly as a process that died between
//! `graphEffectIntended` and the tool's outcome leaves them: the effect is never run again
//! blindly. Its outcome comes from the attempt thread's rollout, from the tool executor, or from
//! the host; until then the node waits in `reconcile`.

use cc_app_server::approval::{digest_json, ApprovalPolicy};
use cc_app_server::engine::{AppServer, ServerConfig};
use cc_app_server::graph::effects::effect_key;
use cc_app_server::graph::store::{create_log, open_runs, RunHeader};
use cc_app_server::graph::{compile, grant, EffectReconciler, Reconciliation};
use cc_app_server::kernel::ToolExecutor;
use cc_app_server::protocol::{ToolCall, ToolResult, ToolResultOk};
use cc_app_server::rollout::{open_store, NewEvent, StoreKind, StoreOptions, ThreadStart};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const RUN: &str = "rc";
const THREAD: &str = "graph-rc-a1";
const ITEM: &str = "a1-turn-i1";

#[derive(Default)]
struct Counting(AtomicUsize);

impl ToolExecutor for Counting {
    fn execute(&self, _thread: &str, call: &ToolCall) -> ToolResult {
        self.0.fetch_add(1, Ordering::SeqCst);
        ToolResult::Ok(ToolResultOk {
            output: json!({"ran": call.arguments}),
        })
    }
}

struct Answer(Mutex<Reconciliation>, AtomicUsize);

impl EffectReconciler for Answer {
    fn reconcile(&self, run_id: &str, key: &str, call: &ToolCall) -> Reconciliation {
        assert_eq!(run_id, RUN);
        assert_eq!(key, effect_key(RUN, "t", &op_digest(), 0));
        assert_eq!(call.tool, "inc");
        self.1.fetch_add(1, Ordering::SeqCst);
        self.0.lock().unwrap().clone()
    }
}

fn definition() -> Value {
    json!({"graphVersion": 1, "id": "rec", "outputs": [{"name": "r", "type": "json"}],
        "nodes": [{"kind": "tool", "id": "t", "tool": "inc", "arguments": {"n": 1},
                   "outputs": [{"name": "r", "type": "json"}]}],
        "edges": [{"from": {"node": "t", "port": "r"}, "to": {"port": "r"}}]})
}

fn call() -> ToolCall {
    ToolCall {
        tool: "inc".into(),
        arguments: json!({"n": 1}),
    }
}

fn op_digest() -> String {
    digest_json(&serde_json::to_value(call()).unwrap())
}

fn applied_result() -> ToolResult {
    ToolResult::Ok(ToolResultOk {
        output: json!({"applied": "before the crash"}),
    })
}

/// The run log a process leaves when it dies right after `graphEffectIntended` became durable;
/// with `evidence`, the attempt's thread also holds the engine's tool result for the call.
fn crashed_state(dir: &std::path::Path, kind: StoreKind, evidence: bool) {
    let g = grant(&["tool:*"]);
    let plan = compile(&definition(), &g).unwrap();
    let store = open_runs(kind, dir, StoreOptions::default()).unwrap();
    let header = RunHeader {
        run_id: RUN.into(),
        graph_id: "rec".into(),
        plan_digest: plan.digest.clone(),
        params_digest: "sha256:crafted".into(),
        idempotency_key: None,
    };
    create_log(&*store, &header, None, None).unwrap();
    let now = cc_app_server::time::now_unix_millis() as u64;
    let events = vec![
        json!({"type": "graphRunStarted", "runId": RUN, "definition": definition(), "planDigest": plan.digest,
               "grant": g, "inputs": {}, "options": {"workers": [{"id": "w", "capacity": 1}], "leaseMs": 60000},
               "startedAtMs": now}),
        json!({"type": "graphAttemptStarted", "attemptId": 1, "fence": 1, "node": "t", "worker": "w",
               "leaseExpiresAtMs": now + 60000, "custody": [], "threadId": THREAD}),
        json!({"type": "graphEffectIntended", "idempotencyKey": effect_key(RUN, "t", &op_digest(), 0),
               "attemptId": 1, "fence": 1, "node": "t", "call": call(), "operationDigest": op_digest(),
               "threadId": THREAD, "turnId": "a1-turn", "itemId": ITEM}),
    ];
    // The crafted events are in the schema, like the runtime's own.
    for e in &events {
        cc_agent_protocol::validate_protocol_definition("EventPayload", e).unwrap();
    }
    store
        .append(RUN, events.into_iter().map(NewEvent::new).collect())
        .unwrap();
    drop(store);
    if evidence {
        let main = open_store(kind, dir, StoreOptions::default()).unwrap();
        main.start(ThreadStart {
            thread_id: THREAD.into(),
            ..Default::default()
        })
        .unwrap();
        main.append(
            THREAD,
            vec![
                NewEvent::new(json!({"type": "turnStarted", "turnId": "a1-turn", "input": [{"type": "text", "text": "go"}]})),
                NewEvent::new(json!({"type": "toolRequested", "turnId": "a1-turn", "itemId": ITEM, "call": call()})),
                NewEvent::new(json!({"type": "toolResult", "turnId": "a1-turn", "itemId": ITEM, "result": applied_result()})),
            ],
        )
        .unwrap();
    }
}

fn open(dir: &std::path::Path, kind: StoreKind) -> (AppServer, Arc<Counting>) {
    let tools = Arc::new(Counting::default());
    let mut config = ServerConfig::new(dir);
    config.store = kind;
    config.policy = ApprovalPolicy::AutoApprove;
    config.tools = tools.clone();
    (AppServer::open(config).unwrap(), tools)
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn kinds(server: &AppServer) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    cc_app_server::graph::store::for_each_event(&*server.graph().store().unwrap(), RUN, |e| {
        out.push((e.kind().to_string(), e.payload.clone()))
    })
    .unwrap();
    out
}

fn node_status(server: &AppServer) -> String {
    let st = server.graph().state(RUN).unwrap();
    serde_json::to_value(st.node_state(&st.nodes["t"]).status)
        .unwrap()
        .as_str()
        .unwrap()
        .to_string()
}

fn effect_sources(server: &AppServer) -> Vec<String> {
    kinds(server)
        .iter()
        .filter(|(k, _)| k == "graphEffectSucceeded")
        .map(|(_, p)| p["receipt"]["source"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn an_unknown_effect_waits_in_reconcile_until_the_executor_says_it_happened() {
    for kind in [StoreKind::Jsonl, StoreKind::Sqlite] {
        let dir = tempfile::tempdir().unwrap();
        crashed_state(dir.path(), kind, false);
        let (server, tools) = open(dir.path(), kind);
        wait_until("reconcile", || node_status(&server) == "reconcile");
        // Nothing runs while the outcome is unknown, however long we wait.
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(tools.0.load(Ordering::SeqCst), 0);
        let log = kinds(&server);
        let resumed = log.iter().find(|(k, _)| k == "graphRunResumed").unwrap();
        assert_eq!(
            resumed.1["fenced"],
            json!([{"attemptId": 1, "node": "t", "fence": 1}])
        );
        assert_eq!(
            log.iter()
                .filter(|(k, _)| k == "graphEffectReconcile")
                .count(),
            1
        );
        assert_eq!(node_status(&server), "reconcile");
        let summary = server.graph().summary(RUN, false).unwrap();
        assert_eq!(summary.nodes.reconcile, 1);
        // The executor knows the key was applied: the receipt is adopted, nothing runs again.
        let answer = Arc::new(Answer(
            Mutex::new(Reconciliation::Applied(applied_result())),
            AtomicUsize::new(0),
        ));
        server.graph().set_reconciler(answer.clone());
        let summary = server.graph().wait(RUN, Duration::from_secs(20)).unwrap();
        assert_eq!(
            serde_json::to_value(&summary.status).unwrap(),
            "succeeded",
            "{summary:?}"
        );
        assert_eq!(
            summary.outputs.unwrap()["r"],
            json!({"applied": "before the crash"})
        );
        assert_eq!(tools.0.load(Ordering::SeqCst), 0, "never run twice");
        assert_eq!(answer.1.load(Ordering::SeqCst), 1);
        assert_eq!(effect_sources(&server), ["executor"]);
        let st = server.graph().state(RUN).unwrap();
        assert!(st.anomalies.is_empty(), "{:?}", st.anomalies);
        assert_eq!(st.nodes["t"].attempts, 2);
        server.shutdown();
    }
}

#[test]
fn an_effect_the_executor_never_applied_runs_once_more() {
    let dir = tempfile::tempdir().unwrap();
    crashed_state(dir.path(), StoreKind::Jsonl, false);
    let (server, tools) = open(dir.path(), StoreKind::Jsonl);
    server.graph().set_reconciler(Arc::new(Answer(
        Mutex::new(Reconciliation::NotApplied),
        AtomicUsize::new(0),
    )));
    let summary = server.graph().wait(RUN, Duration::from_secs(20)).unwrap();
    assert_eq!(serde_json::to_value(&summary.status).unwrap(), "succeeded");
    assert_eq!(tools.0.load(Ordering::SeqCst), 1);
    let log = kinds(&server);
    let failed = log.iter().find(|(k, _)| k == "graphEffectFailed").unwrap();
    assert_eq!(failed.1["applied"], false);
    assert_eq!(failed.1["error"]["code"], "effectNotApplied");
    // The same key intended again, by the new attempt under a new fence.
    let intents: Vec<&Value> = log
        .iter()
        .filter(|(k, _)| k == "graphEffectIntended")
        .map(|(_, p)| p)
        .collect();
    assert_eq!(intents.len(), 2);
    assert_eq!(intents[0]["idempotencyKey"], intents[1]["idempotencyKey"]);
    assert_eq!(
        (
            intents[1]["attemptId"].as_u64(),
            intents[1]["fence"].as_u64()
        ),
        (Some(2), Some(2))
    );
    assert_eq!(effect_sources(&server), ["executed"]);
    server.shutdown();
}

#[test]
fn the_attempt_threads_rollout_settles_the_effect_without_asking_anyone() {
    for kind in [StoreKind::Jsonl, StoreKind::Sqlite] {
        let dir = tempfile::tempdir().unwrap();
        crashed_state(dir.path(), kind, true);
        let (server, tools) = open(dir.path(), kind);
        let summary = server.graph().wait(RUN, Duration::from_secs(20)).unwrap();
        assert_eq!(serde_json::to_value(&summary.status).unwrap(), "succeeded");
        assert_eq!(tools.0.load(Ordering::SeqCst), 0);
        assert_eq!(effect_sources(&server), ["rollout"]);
        let receipt = kinds(&server)
            .into_iter()
            .find(|(k, _)| k == "graphEffectSucceeded")
            .unwrap()
            .1["receipt"]
            .clone();
        assert_eq!(
            (receipt["threadId"].as_str(), receipt["itemId"].as_str()),
            (Some(THREAD), Some(ITEM))
        );
        server.shutdown();
    }
}

#[test]
fn the_host_can_decide_an_effect_in_reconcile() {
    let dir = tempfile::tempdir().unwrap();
    crashed_state(dir.path(), StoreKind::Jsonl, false);
    let (server, tools) = open(dir.path(), StoreKind::Jsonl);
    wait_until("reconcile", || node_status(&server) == "reconcile");
    let key = effect_key(RUN, "t", &op_digest(), 0);
    assert!(server
        .graph()
        .resolve_effect(RUN, "fx-unknown", None)
        .is_err());
    server
        .graph()
        .resolve_effect(RUN, &key, Some(applied_result()))
        .unwrap();
    let summary = server.graph().wait(RUN, Duration::from_secs(20)).unwrap();
    assert_eq!(serde_json::to_value(&summary.status).unwrap(), "succeeded");
    assert_eq!(tools.0.load(Ordering::SeqCst), 0);
    assert_eq!(effect_sources(&server), ["host"]);
    // Decided once: a second decision is refused.
    assert!(server.graph().resolve_effect(RUN, &key, None).is_err());
    server.shutdown();
}

#[test]
fn a_start_that_never_became_durable_is_closed_as_failed() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_runs(StoreKind::Jsonl, dir.path(), StoreOptions::default()).unwrap();
    let header = RunHeader {
        run_id: "half".into(),
        graph_id: "g".into(),
        plan_digest: "sha256:x".into(),
        params_digest: "sha256:y".into(),
        idempotency_key: None,
    };
    create_log(&*store, &header, None, None).unwrap();
    drop(store);
    let (server, _) = open(dir.path(), StoreKind::Jsonl);
    let summary = server
        .graph()
        .wait("half", Duration::from_secs(20))
        .unwrap();
    assert_eq!(serde_json::to_value(&summary.status).unwrap(), "failed");
    assert_eq!(summary.error.unwrap().code, "startNotRecorded");
    server.shutdown();
}
