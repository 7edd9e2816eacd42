//! Graph runs end to end on a real server (scripted kernel, real stores, real approval gate):
//! a diamond, bounded loops, a subgraph, lease expiry and fencing with a manual clock, duplicate
//! delivery, cancellation with attempts in flight, effects and their receipts, budgets, the gate
//! failing closed, and restarts that resume a run from its log.

use cc_app_server::approval::ApprovalPolicy;
use cc_app_server::engine::{AppServer, ServerConfig};
use cc_app_server::graph::{grant, ManualClock, RunClock, RunState, StartRequest};
use cc_app_server::kernel::ToolExecutor;
use cc_app_server::protocol::{
    GraphRunOptions, GraphWorker, ToolCall, ToolResult, ToolResultError, ToolResultOk,
};
use cc_app_server::rollout::StoredEvent;
use cc_app_server::scripted::ScriptedKernel;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Test tools: `inc` counts ({n} → {n: n+1, done: n+1 >= limit}), `slow` takes 300 ms, `fail`
/// returns an error, anything else echoes. Every call is counted.
#[derive(Default)]
struct Tools {
    calls: Mutex<HashMap<String, usize>>,
}

impl Tools {
    fn calls(&self, tool: &str) -> usize {
        self.calls.lock().unwrap().get(tool).copied().unwrap_or(0)
    }
}

impl ToolExecutor for Tools {
    fn execute(&self, _thread: &str, call: &ToolCall) -> ToolResult {
        *self
            .calls
            .lock()
            .unwrap()
            .entry(call.tool.clone())
            .or_default() += 1;
        let ok = |output: Value| ToolResult::Ok(ToolResultOk { output });
        match call.tool.as_str() {
            "inc" => {
                let n = call.arguments["n"].as_i64().unwrap_or(0) + 1;
                let limit = call.arguments["limit"].as_i64().unwrap_or(3);
                ok(json!({"n": n, "done": n >= limit}))
            }
            "slow" => {
                std::thread::sleep(Duration::from_millis(300));
                ok(json!({"slow": true}))
            }
            "fail" => ToolResult::Error(ToolResultError {
                message: "it broke".into(),
            }),
            _ => ok(json!({"tool": call.tool, "echo": call.arguments})),
        }
    }
}

struct Server {
    server: AppServer,
    tools: Arc<Tools>,
    _dir: Option<tempfile::TempDir>,
}

fn open_at(
    dir: &std::path::Path,
    policy: ApprovalPolicy,
    kernel: Option<ScriptedKernel>,
) -> (AppServer, Arc<Tools>) {
    let tools = Arc::new(Tools::default());
    let mut config = ServerConfig::new(dir);
    config.policy = policy;
    config.tools = tools.clone();
    if let Some(k) = kernel {
        config.kernel = Arc::new(k);
    }
    (AppServer::open(config).unwrap(), tools)
}

fn open(policy: ApprovalPolicy) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let (server, tools) = open_at(dir.path(), policy, None);
    Server {
        server,
        tools,
        _dir: Some(dir),
    }
}

fn port(name: &str, ty: &str) -> Value {
    json!({"name": name, "type": ty})
}

fn edge(from: (Option<&str>, &str), to: (Option<&str>, &str)) -> Value {
    let end = |(n, p): (Option<&str>, &str)| match n {
        Some(n) => json!({"node": n, "port": p}),
        None => json!({"port": p}),
    };
    json!({"from": end(from), "to": end(to)})
}

fn agent(id: &str, inputs: Value, outputs: Value, steps: Value) -> Value {
    json!({"kind": "agent", "id": id, "inputs": inputs, "outputs": outputs,
           "agentOptions": {"script": {"steps": steps}}})
}

fn say(text: &str) -> Value {
    json!([{"type": "message", "text": text}])
}

fn diamond() -> Value {
    json!({
        "graphVersion": 1, "id": "diamond",
        "inputs": [port("topic", "text")],
        "outputs": [port("report", "object")],
        "nodes": [
            {"kind": "tool", "id": "fetch", "tool": "fetch",
             "inputs": [port("topic", "text")], "outputs": [port("result", "json")]},
            agent("left", json!([port("data", "json")]), json!([port("text", "text")]), say("left done")),
            agent("right", json!([port("data", "json")]), json!([port("text", "text")]), say("right done")),
            {"kind": "join", "id": "merge", "inputs": [port("l", "text"), port("r", "text")],
             "outputs": [port("both", "object")]}
        ],
        "edges": [
            edge((None, "topic"), (Some("fetch"), "topic")),
            edge((Some("fetch"), "result"), (Some("left"), "data")),
            edge((Some("fetch"), "result"), (Some("right"), "data")),
            edge((Some("left"), "text"), (Some("merge"), "l")),
            edge((Some("right"), "text"), (Some("merge"), "r")),
            edge((Some("merge"), "both"), (None, "report"))
        ]
    })
}

fn request(def: Value, run: &str, inputs: Value) -> StartRequest {
    let mut req = StartRequest::new(def, grant(&["agent", "tool:*"]));
    req.run_id = Some(run.into());
    req.inputs = inputs.as_object().cloned().unwrap_or_default();
    req
}

fn status(s: &impl serde::Serialize) -> String {
    serde_json::to_value(s).unwrap()["status"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn events(server: &AppServer, run: &str) -> Vec<StoredEvent> {
    let mut out = Vec::new();
    cc_app_server::graph::store::for_each_event(&*server.graph().store().unwrap(), run, |e| {
        out.push(e.clone())
    })
    .unwrap();
    out
}

fn of_kind<'a>(events: &'a [StoredEvent], kind: &str) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|e| e.kind() == kind)
        .map(|e| &e.payload)
        .collect()
}

/// The log replays to exactly the live state, with no anomaly.
#[track_caller]
fn replays(server: &AppServer, run: &str) -> RunState {
    let live = server.graph().state(run).unwrap();
    assert!(live.anomalies.is_empty(), "{:?}", live.anomalies);
    let replayed = RunState::replay(run, &events(server, run));
    assert!(replayed.anomalies.is_empty(), "{:?}", replayed.anomalies);
    assert_eq!(
        serde_json::to_value(replayed.summary(true)).unwrap(),
        serde_json::to_value(live.summary(true)).unwrap()
    );
    let nodes = |s: &RunState| -> Vec<Value> {
        s.node_order
            .iter()
            .map(|k| serde_json::to_value(s.node_state(&s.nodes[k])).unwrap())
            .collect()
    };
    assert_eq!(nodes(&replayed), nodes(&live));
    live
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_diamond_runs_to_completion_and_replays_to_the_same_state() {
    let s = open(ApprovalPolicy::AutoApprove);
    let graph = s.server.graph();
    graph
        .start(request(diamond(), "d1", json!({"topic": "rust"})))
        .unwrap();
    let summary = graph.wait("d1", Duration::from_secs(20)).unwrap();
    assert_eq!(status(&summary), "succeeded", "{summary:?}");
    assert_eq!(
        summary.outputs.unwrap()["report"],
        json!({"l": "left done", "r": "right done"})
    );
    let st = replays(&s.server, "d1");
    // Fences rise with every attempt; left and right ran on their own threads.
    let ev = events(&s.server, "d1");
    let fences: Vec<u64> = of_kind(&ev, "graphAttemptStarted")
        .iter()
        .map(|p| p["fence"].as_u64().unwrap())
        .collect();
    assert_eq!(fences, [1, 2, 3, 4]);
    assert!(st.nodes["left"]
        .thread_id
        .as_deref()
        .unwrap()
        .starts_with("graph-d1-a"));
    // Every message was consumed exactly once, in channel order.
    for m in st.messages.values() {
        assert_eq!(
            m.custody,
            cc_app_server::graph::state::Custody::Acked,
            "{m:?}"
        );
        assert_eq!(
            m.deliveries,
            if m.acked_by.as_deref() == Some("merge") || m.to.node.as_deref() == Some("merge") {
                1
            } else {
                m.deliveries
            }
        );
    }
    // The header names the graph and the plan.
    let header = &ev[0].payload;
    assert_eq!(header["metadata"]["graphId"], "diamond");
    assert_eq!(
        header["metadata"]["planDigest"],
        json!(st.plan().unwrap().digest)
    );
    // Attempt threads are hidden from the default thread list once their attempt ended.
    let page = s.server.store().list(&Default::default()).unwrap();
    assert!(
        page.threads.is_empty(),
        "{:?}",
        page.threads
            .iter()
            .map(|t| &t.thread_id)
            .collect::<Vec<_>>()
    );
    s.server.shutdown();
}

#[test]
fn a_tool_call_is_an_effect_with_a_receipt_that_matches_the_rollout() {
    let s = open(ApprovalPolicy::AutoApprove);
    let graph = s.server.graph();
    graph
        .start(request(diamond(), "fx", json!({"topic": "t"})))
        .unwrap();
    graph.wait("fx", Duration::from_secs(20)).unwrap();
    let ev = events(&s.server, "fx");
    let intended = of_kind(&ev, "graphEffectIntended");
    let succeeded = of_kind(&ev, "graphEffectSucceeded");
    assert_eq!((intended.len(), succeeded.len()), (1, 1));
    // Intended before the outcome, and the key is the same.
    let seq = |kind: &str| ev.iter().find(|e| e.kind() == kind).unwrap().seq;
    assert!(seq("graphEffectIntended") < seq("graphEffectSucceeded"));
    let key = intended[0]["idempotencyKey"].as_str().unwrap();
    let receipt = &succeeded[0]["receipt"];
    assert_eq!(receipt["idempotencyKey"], key);
    assert_eq!(receipt["source"], "executed");
    assert_eq!(receipt["operationDigest"], intended[0]["operationDigest"]);
    // The receipt points at the tool result the engine recorded on the attempt's thread, and
    // its digest is that result's.
    let thread = receipt["threadId"].as_str().unwrap();
    let page = s.server.store().read(thread, 0, 1000).unwrap();
    let result = page
        .events
        .iter()
        .find(|e| e.kind() == "toolResult" && e.payload["itemId"] == receipt["itemId"])
        .map(|e| e.payload["result"].clone())
        .unwrap();
    assert_eq!(
        receipt["resultDigest"],
        json!(cc_app_server::approval::digest_json(&result))
    );
    assert_eq!(receipt["result"], result);
    // The approval gate decided (auto) and the executor ran exactly once.
    assert_eq!(s.tools.calls("fetch"), 1);
    s.server.shutdown();
}

fn counting_loop(max: u64, limit: i64) -> Value {
    json!({
        "graphVersion": 1, "id": "count",
        "inputs": [port("n", "integer")], "outputs": [port("n", "integer")],
        "nodes": [{"kind": "loop", "id": "l", "maxIterations": max, "until": "done",
            "inputs": [port("n", "integer")], "outputs": [port("n", "integer"), port("done", "boolean")],
            "body": {
                "nodes": [{"kind": "tool", "id": "inc", "tool": "inc", "arguments": {"limit": limit},
                           "inputs": [port("n", "integer")], "outputs": [port("n", "integer"), port("done", "boolean")]}],
                "edges": [edge((None, "n"), (Some("inc"), "n")), edge((Some("inc"), "n"), (None, "n")),
                          edge((Some("inc"), "done"), (None, "done"))]}}],
        "edges": [edge((None, "n"), (Some("l"), "n")), edge((Some("l"), "n"), (None, "n"))]
    })
}

#[test]
fn a_bounded_loop_carries_its_state_and_stops_on_until() {
    let s = open(ApprovalPolicy::AutoApprove);
    let graph = s.server.graph();
    graph
        .start(request(counting_loop(10, 3), "loop1", json!({"n": 0})))
        .unwrap();
    let summary = graph.wait("loop1", Duration::from_secs(20)).unwrap();
    assert_eq!(status(&summary), "succeeded", "{summary:?}");
    assert_eq!(summary.outputs.unwrap()["n"], 3);
    let st = replays(&s.server, "loop1");
    for i in 0..3 {
        assert_eq!(
            status(&st.node_state(&st.nodes[&format!("l.{i}/inc")])),
            "succeeded"
        );
    }
    assert!(!st.nodes.contains_key("l.3/inc"));
    let ev = events(&s.server, "loop1");
    let reasons: Vec<&str> = of_kind(&ev, "graphScopeExited")
        .iter()
        .map(|p| p["reason"].as_str().unwrap())
        .collect();
    assert_eq!(reasons, ["continue", "continue", "until"]);
    // The body's edge is one channel across iterations, numbered and consumed in order.
    let seqs: Vec<u64> = of_kind(&ev, "graphMessageSent")
        .iter()
        .filter(|p| p["channel"] == "l:e0")
        .map(|p| p["channelSeq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, [1, 2, 3]);
    assert_eq!(s.tools.calls("inc"), 3);
    s.server.shutdown();
}

#[test]
fn a_loop_stops_at_its_bound() {
    let s = open(ApprovalPolicy::AutoApprove);
    let graph = s.server.graph();
    graph
        .start(request(counting_loop(2, 100), "loop2", json!({"n": 5})))
        .unwrap();
    let summary = graph.wait("loop2", Duration::from_secs(20)).unwrap();
    assert_eq!(status(&summary), "succeeded");
    assert_eq!(summary.outputs.unwrap()["n"], 7);
    let ev = events(&s.server, "loop2");
    let reasons: Vec<&str> = of_kind(&ev, "graphScopeExited")
        .iter()
        .map(|p| p["reason"].as_str().unwrap())
        .collect();
    assert_eq!(reasons, ["continue", "maxIterations"]);
    replays(&s.server, "loop2");
    s.server.shutdown();
}

#[test]
fn a_subgraph_runs_as_one_node() {
    let s = open(ApprovalPolicy::AutoApprove);
    let def = json!({
        "graphVersion": 1, "id": "sub",
        "inputs": [port("q", "text")], "outputs": [port("answer", "object")],
        "nodes": [
            {"kind": "subgraph", "id": "s", "inputs": [port("q", "text")], "outputs": [port("a", "json"), port("b", "text")],
             "body": {
                "nodes": [
                    {"kind": "tool", "id": "t", "tool": "lookup", "inputs": [port("q", "text")], "outputs": [port("r", "json")]},
                    agent("w", json!([port("r", "json")]), json!([port("b", "text")]), say("written"))],
                "edges": [edge((None, "q"), (Some("t"), "q")), edge((Some("t"), "r"), (Some("w"), "r")),
                          edge((Some("t"), "r"), (None, "a")), edge((Some("w"), "b"), (None, "b"))]}},
            {"kind": "join", "id": "j", "inputs": [port("a", "json"), port("b", "text")], "outputs": [port("o", "object")]}
        ],
        "edges": [edge((None, "q"), (Some("s"), "q")), edge((Some("s"), "a"), (Some("j"), "a")),
                  edge((Some("s"), "b"), (Some("j"), "b")), edge((Some("j"), "o"), (None, "answer"))]
    });
    let graph = s.server.graph();
    graph
        .start(request(def, "sub1", json!({"q": "why"})))
        .unwrap();
    let summary = graph.wait("sub1", Duration::from_secs(20)).unwrap();
    assert_eq!(status(&summary), "succeeded", "{summary:?}");
    let out = &summary.outputs.unwrap()["answer"];
    assert_eq!(out["b"], "written");
    assert_eq!(out["a"]["echo"]["q"], "why");
    let st = replays(&s.server, "sub1");
    assert_eq!(status(&st.node_state(&st.nodes["s.0/t"])), "succeeded");
    assert_eq!(status(&st.node_state(&st.nodes["s"])), "succeeded");
    s.server.shutdown();
}

#[test]
fn agents_with_several_outputs_answer_json() {
    let s = open(ApprovalPolicy::AutoApprove);
    let def = json!({"graphVersion": 1, "id": "multi", "outputs": [port("a", "integer"), port("b", "text")],
        "nodes": [agent("x", json!([]), json!([port("a", "integer"), port("b", "text")]), say("```json\n{\"a\": 2, \"b\": \"two\"}\n```"))],
        "edges": [edge((Some("x"), "a"), (None, "a")), edge((Some("x"), "b"), (None, "b"))]});
    let graph = s.server.graph();
    graph.start(request(def, "m1", json!({}))).unwrap();
    let summary = graph.wait("m1", Duration::from_secs(20)).unwrap();
    assert_eq!(
        summary.outputs.unwrap(),
        json!({"a": 2, "b": "two"}).as_object().unwrap().clone()
    );
    // An answer that does not fit fails the attempt, retried up to maxAttempts.
    let bad = json!({"graphVersion": 1, "id": "bad", "outputs": [port("a", "integer")],
        "nodes": [{"kind": "agent", "id": "x", "maxAttempts": 2, "outputs": [port("a", "integer")],
                   "agentOptions": {"script": {"steps": say("not json")}}}],
        "edges": [edge((Some("x"), "a"), (None, "a"))]});
    graph.start(request(bad, "m2", json!({}))).unwrap();
    let summary = graph.wait("m2", Duration::from_secs(20)).unwrap();
    assert_eq!(status(&summary), "failed");
    let st = replays(&s.server, "m2");
    assert_eq!(st.nodes["x"].attempts, 2);
    assert_eq!(
        st.nodes["x"].error.as_ref().unwrap().code,
        "attemptsExhausted"
    );
    s.server.shutdown();
}

fn one_agent(id: &str, lease_ms: u64, workers: u64) -> (Value, Option<GraphRunOptions>) {
    let def = json!({"graphVersion": 1, "id": id, "inputs": [port("x", "text")], "outputs": [port("y", "text")],
        "nodes": [agent("slow", json!([port("x", "text")]), json!([port("y", "text")]),
                        json!([{"type": "ignoreCancel", "ms": 400}, {"type": "message", "text": "late"}]))],
        "edges": [edge((None, "x"), (Some("slow"), "x")), edge((Some("slow"), "y"), (None, "y"))]});
    let options = GraphRunOptions {
        workers: Some(vec![GraphWorker {
            id: "w".into(),
            capacity: workers,
        }]),
        lease_ms: Some(lease_ms),
    };
    (def, Some(options))
}

#[test]
fn an_expired_lease_reassigns_the_node_and_the_stale_attempts_result_is_refused() {
    let s = open(ApprovalPolicy::AutoApprove);
    let graph = s.server.graph();
    let clock = ManualClock::new(1_000_000);
    graph.set_clock(RunClock::Manual(clock.clone()));
    let (def, options) = one_agent("lease", 1000, 2);
    let mut req = request(def, "lease1", json!({"x": "go"}));
    req.options = options;
    graph.start(req).unwrap();
    wait_until("the first attempt", || {
        graph.state("lease1").unwrap().running_attempts().count() == 1
    });
    // No time passes on the run's clock: nothing expires, however long we wait.
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(graph.state("lease1").unwrap().max_fence, 1);
    clock.advance(Duration::from_millis(1001));
    let summary = graph.wait("lease1", Duration::from_secs(20)).unwrap();
    assert_eq!(status(&summary), "succeeded", "{summary:?}");
    wait_until("the stale attempt to report", || {
        graph.state("lease1").unwrap().stale_refusals >= 1
    });
    let st = replays(&s.server, "lease1");
    let ev = events(&s.server, "lease1");
    let expired = of_kind(&ev, "graphLeaseExpired");
    assert_eq!(expired.len(), 1);
    assert_eq!(
        (
            expired[0]["attemptId"].as_u64(),
            expired[0]["fence"].as_u64()
        ),
        (Some(1), Some(1))
    );
    let started = of_kind(&ev, "graphAttemptStarted");
    assert_eq!(started.len(), 2);
    assert_eq!(started[1]["fence"], 2);
    // The input message was handed to both attempts (at least once) and consumed once.
    assert_eq!(started[0]["custody"], started[1]["custody"]);
    let m = started[0]["custody"][0].as_str().unwrap();
    assert_eq!(st.messages[m].deliveries, 2);
    let acks: Vec<&Value> = of_kind(&ev, "graphMessageAcked")
        .into_iter()
        .filter(|p| p["messageId"] == m)
        .collect();
    assert_eq!(acks.len(), 1);
    assert_eq!(acks[0]["attemptId"], 2);
    // Only attempt 2 settled the node; attempt 1's report was refused and recorded.
    let finished = of_kind(&ev, "graphAttemptFinished");
    assert_eq!(finished.len(), 1);
    assert_eq!(finished[0]["attemptId"], 2);
    let refused = of_kind(&ev, "graphStaleRefused");
    assert!(
        refused
            .iter()
            .any(|p| p["attemptId"] == 1 && p["fence"] == 1 && p["currentFence"] == 2),
        "{refused:?}"
    );
    s.server.shutdown();
}

#[test]
fn a_redelivered_message_is_acknowledged_once_and_processed_once() {
    let s = open(ApprovalPolicy::AutoApprove);
    let graph = s.server.graph();
    graph
        .start(request(diamond(), "dup", json!({"topic": "t"})))
        .unwrap();
    graph.wait("dup", Duration::from_secs(20)).unwrap();
    let before = graph.state("dup").unwrap();
    let m = before.nodes["fetch"].inputs[0].clone().unwrap();
    assert!(graph.redeliver("dup", &m).unwrap(), "already consumed");
    assert!(graph.redeliver("dup", &m).unwrap());
    let after = replays(&s.server, "dup");
    assert_eq!(after.messages[&m].duplicates, 2);
    assert_eq!(after.nodes["fetch"].attempts, 1);
    assert_eq!(s.tools.calls("fetch"), 1, "processed once");
    let ev = events(&s.server, "dup");
    let acks: Vec<bool> = of_kind(&ev, "graphMessageAcked")
        .iter()
        .filter(|p| p["messageId"] == json!(m))
        .map(|p| p["duplicate"].as_bool().unwrap())
        .collect();
    assert_eq!(acks, [false, true, true]);
    assert!(graph.redeliver("dup", "m999").is_err());
    s.server.shutdown();
}

#[test]
fn cancelling_fences_every_attempt_in_flight_and_late_results_are_refused() {
    let s = open(ApprovalPolicy::AutoApprove);
    let graph = s.server.graph();
    let sleeper = |id: &str| {
        agent(
            id,
            json!([]),
            json!([port("o", "text")]),
            json!([{"type": "sleep", "ms": 20000}, {"type": "message", "text": "never"}]),
        )
    };
    let def = json!({"graphVersion": 1, "id": "cancel",
        "nodes": [sleeper("a"), sleeper("b"),
                  {"kind": "tool", "id": "t", "tool": "slow", "outputs": [port("r", "json")]},
                  {"kind": "join", "id": "after", "inputs": [port("r", "json")], "outputs": [port("o", "object")]}],
        "edges": [edge((Some("t"), "r"), (Some("after"), "r"))]});
    graph.start(request(def, "c1", json!({}))).unwrap();
    // Cancel while the tool is executing (not merely intended: the gate's last check would
    // then stop it before it starts).
    wait_until("three attempts in flight, the tool executing", || {
        graph.state("c1").unwrap().running_attempts().count() == 3 && s.tools.calls("slow") == 1
    });
    let fenced = graph.cancel("c1", Some("changed my mind".into())).unwrap();
    assert_eq!(fenced.len(), 3);
    let summary = graph.summary("c1", false).unwrap();
    assert_eq!(status(&summary), "cancelled");
    // Every attempt reports late; every report is refused.
    wait_until("three refusals", || {
        graph.state("c1").unwrap().stale_refusals >= 3
    });
    let st = replays(&s.server, "c1");
    let ev = events(&s.server, "c1");
    assert!(
        of_kind(&ev, "graphAttemptFinished").is_empty(),
        "nothing settled after the fence"
    );
    for key in ["a", "b", "t"] {
        assert_eq!(status(&st.node_state(&st.nodes[key])), "cancelled");
    }
    assert_eq!(status(&st.node_state(&st.nodes["after"])), "skipped");
    // The slow tool did run: its effect's outcome is recorded with a receipt (a fact), but it
    // crossed no fence — the node stayed cancelled and nothing downstream ran.
    let outcome = of_kind(&ev, "graphEffectSucceeded");
    assert_eq!(outcome.len(), 1);
    assert_eq!(s.tools.calls("slow"), 1);
    let cancelled_at = ev
        .iter()
        .find(|e| e.kind() == "graphRunCancelled")
        .unwrap()
        .seq;
    let refusals: Vec<&StoredEvent> = ev
        .iter()
        .filter(|e| e.kind() == "graphStaleRefused")
        .collect();
    assert!(refusals.iter().all(|e| e.seq > cancelled_at));
    assert_eq!(of_kind(&ev, "graphRunCompleted").len(), 1);
    // A cancelled run stays cancelled.
    assert!(graph.cancel("c1", None).unwrap().is_empty());
    s.server.shutdown();
}

#[test]
fn without_an_approval_the_gate_fails_closed_and_the_tool_never_runs() {
    let s = open(ApprovalPolicy::AskEveryTime);
    let graph = s.server.graph();
    // Started from the Rust API: no connection to ask, so the gate fails closed.
    graph
        .start(request(diamond(), "gate", json!({"topic": "t"})))
        .unwrap();
    let summary = graph.wait("gate", Duration::from_secs(20)).unwrap();
    assert_eq!(status(&summary), "failed");
    assert_eq!(summary.error.as_ref().unwrap().code, "toolDenied");
    assert_eq!(s.tools.calls("fetch"), 0);
    let st = replays(&s.server, "gate");
    let effect = st.effects.values().next().unwrap();
    assert_eq!(effect.applied, Some(false));
    // The refusal is the engine's own approval record on the attempt's thread.
    let thread = st.nodes["fetch"].thread_id.clone().unwrap();
    let page = s.server.store().read(&thread, 0, 1000).unwrap();
    let resolved = page
        .events
        .iter()
        .find(|e| e.kind() == "approvalResolved")
        .unwrap();
    assert_eq!(resolved.payload["outcome"], "failedClosed");
    assert_eq!(resolved.payload["failure"], "transportClosed");
    assert_eq!(status(&st.node_state(&st.nodes["left"])), "skipped");
    s.server.shutdown();
}

#[test]
fn deny_all_and_a_failing_tool_fail_the_node_without_a_retry() {
    let s = open(ApprovalPolicy::DenyAll);
    let graph = s.server.graph();
    graph
        .start(request(diamond(), "deny", json!({"topic": "t"})))
        .unwrap();
    assert_eq!(
        status(&graph.wait("deny", Duration::from_secs(20)).unwrap()),
        "failed"
    );
    assert_eq!(s.tools.calls("fetch"), 0);
    s.server.set_policy(ApprovalPolicy::AutoApprove);
    let def = json!({"graphVersion": 1, "id": "f", "nodes": [{"kind": "tool", "id": "t", "tool": "fail"}]});
    graph.start(request(def, "fail", json!({}))).unwrap();
    let summary = graph.wait("fail", Duration::from_secs(20)).unwrap();
    assert_eq!(summary.error.as_ref().unwrap().code, "toolFailed");
    let st = replays(&s.server, "fail");
    assert_eq!(
        st.nodes["t"].attempts, 1,
        "a call that ran is never repeated"
    );
    assert_eq!(st.effects.values().next().unwrap().applied, Some(true));
    assert_eq!(s.tools.calls("fail"), 1);
    s.server.shutdown();
}

#[test]
fn a_write_outside_the_nodes_scope_is_refused_before_it_is_an_effect() {
    let s = open(ApprovalPolicy::AutoApprove);
    let def = json!({"graphVersion": 1, "id": "scope", "nodes": [{"kind": "tool", "id": "w", "tool": "write_file",
        "writeScope": ["docs"], "arguments": {"path": "src/main.rs", "content": "x"}}]});
    let graph = s.server.graph();
    graph.start(request(def, "scope", json!({}))).unwrap();
    let summary = graph.wait("scope", Duration::from_secs(20)).unwrap();
    assert_eq!(summary.error.as_ref().unwrap().code, "toolDenied");
    assert!(graph.state("scope").unwrap().effects.is_empty());
    assert_eq!(s.tools.calls("write_file"), 0);
    s.server.shutdown();
}

#[test]
fn budgets_stop_the_run() {
    let s = open(ApprovalPolicy::AutoApprove);
    let graph = s.server.graph();
    // Steps: the diamond takes four.
    let mut req = request(diamond(), "steps", json!({"topic": "t"}));
    req.grant.budgets = Some(cc_app_server::protocol::GraphBudgets {
        max_steps: Some(2),
        max_tokens: None,
        max_wall_time_ms: None,
        max_effects: None,
    });
    graph.start(req).unwrap();
    let summary = graph.wait("steps", Duration::from_secs(20)).unwrap();
    assert_eq!(status(&summary), "failed");
    assert_eq!(summary.error.as_ref().unwrap().code, "budgetExhausted");
    // It fails as soon as its ready nodes need more steps than it has left (left and right
    // would be the third and fourth).
    assert_eq!(summary.usage.steps, 1);
    // Effects: none allowed, so the tool call is refused before it is intended.
    let calls = s.tools.calls("fetch");
    let mut req = request(diamond(), "effects", json!({"topic": "t"}));
    req.grant.budgets = Some(cc_app_server::protocol::GraphBudgets {
        max_steps: None,
        max_tokens: None,
        max_wall_time_ms: None,
        max_effects: Some(0),
    });
    graph.start(req).unwrap();
    let summary = graph.wait("effects", Duration::from_secs(20)).unwrap();
    assert_eq!(summary.error.as_ref().unwrap().code, "budgetExhausted");
    assert_eq!(s.tools.calls("fetch"), calls);
    assert!(graph.state("effects").unwrap().effects.is_empty());
    // Wall time, on the run's clock.
    let clock = ManualClock::new(5_000);
    graph.set_clock(RunClock::Manual(clock.clone()));
    let (def, options) = one_agent("wall", 60_000, 1);
    let mut def = def;
    def["budgets"] = json!({"maxWallTimeMs": 500});
    let mut req = request(def, "wall", json!({"x": "x"}));
    req.options = options;
    graph.start(req).unwrap();
    wait_until("the attempt", || {
        graph.state("wall").unwrap().running_attempts().count() == 1
    });
    clock.advance(Duration::from_millis(500));
    let summary = graph.wait("wall", Duration::from_secs(20)).unwrap();
    assert_eq!(summary.error.as_ref().unwrap().code, "budgetExhausted");
    replays(&s.server, "wall");
    s.server.shutdown();
}

#[test]
fn starting_checks_inputs_and_is_idempotent_by_run_id_and_key() {
    let s = open(ApprovalPolicy::AutoApprove);
    let graph = s.server.graph();
    let missing = graph
        .start(request(diamond(), "in1", json!({})))
        .unwrap_err();
    assert_eq!(missing.code(), -32602);
    let wrong = graph
        .start(request(diamond(), "in1", json!({"topic": 3})))
        .unwrap_err();
    assert_eq!(wrong.code(), -32602);
    let extra = graph
        .start(request(diamond(), "in1", json!({"topic": "a", "more": 1})))
        .unwrap_err();
    assert_eq!(extra.code(), -32602);
    let bad = graph
        .start(request(
            json!({"graphVersion": 1, "id": "x", "nodes": []}),
            "in1",
            json!({}),
        ))
        .unwrap_err();
    assert_eq!(bad.code(), -32602);
    // Nothing was recorded for any of them.
    assert!(graph.list().unwrap().is_empty());
    let first = graph
        .start(request(diamond(), "same", json!({"topic": "a"})))
        .unwrap();
    let again = graph
        .start(request(diamond(), "same", json!({"topic": "a"})))
        .unwrap();
    assert_eq!(first.run_id, again.run_id);
    let other = graph
        .start(request(diamond(), "same", json!({"topic": "b"})))
        .unwrap_err();
    assert_eq!(other.code(), -32009);
    let mut keyed = request(diamond(), "k1", json!({"topic": "a"}));
    keyed.idempotency_key = Some("key-1".into());
    keyed.run_id = None;
    let a = graph.start(keyed.clone()).unwrap();
    let b = graph.start(keyed.clone()).unwrap();
    assert_eq!(a.run_id, b.run_id);
    keyed.inputs.insert("topic".into(), json!("z"));
    assert_eq!(graph.start(keyed).unwrap_err().code(), -32009);
    graph.wait(&a.run_id, Duration::from_secs(20)).unwrap();
    graph.wait("same", Duration::from_secs(20)).unwrap();
    s.server.shutdown();
}

#[test]
fn a_restart_resumes_a_run_from_its_log() {
    let dir = tempfile::tempdir().unwrap();
    // The first server's kernel never finishes by itself; the second one answers at once.
    let stuck = ScriptedKernel::new(json!({"steps": [{"type": "sleep", "ms": 60000}]}));
    let (server, _) = open_at(dir.path(), ApprovalPolicy::AutoApprove, Some(stuck));
    let def = json!({"graphVersion": 1, "id": "resume", "outputs": [port("y", "text")],
        "nodes": [{"kind": "agent", "id": "a", "outputs": [port("y", "text")]}],
        "edges": [edge((Some("a"), "y"), (None, "y"))]});
    server.graph().start(request(def, "r1", json!({}))).unwrap();
    wait_until("the attempt", || {
        server
            .graph()
            .state("r1")
            .unwrap()
            .running_attempts()
            .count()
            == 1
    });
    server.shutdown();
    drop(server);
    let answers = ScriptedKernel::new(json!({"steps": [{"type": "message", "text": "back"}]}));
    let (server, _) = open_at(dir.path(), ApprovalPolicy::AutoApprove, Some(answers));
    let summary = server.graph().wait("r1", Duration::from_secs(20)).unwrap();
    assert_eq!(status(&summary), "succeeded", "{summary:?}");
    assert_eq!(summary.outputs.unwrap()["y"], "back");
    let st = replays(&server, "r1");
    let ev = events(&server, "r1");
    let resumed = of_kind(&ev, "graphRunResumed");
    assert_eq!(resumed.len(), 1);
    assert_eq!(resumed[0]["fenced"][0]["attemptId"], 1);
    assert_eq!(st.nodes["a"].attempts, 2);
    assert_eq!(st.nodes["a"].fence, Some(2));
    // Finished runs are not replayed at the next open; their logs stay readable.
    server.shutdown();
    drop(server);
    let (server, _) = open_at(dir.path(), ApprovalPolicy::AutoApprove, None);
    assert_eq!(
        status(&server.graph().summary("r1", false).unwrap()),
        "succeeded"
    );
    assert_eq!(
        events(&server, "r1").len(),
        ev.len(),
        "nothing appended to a finished run"
    );
    server.shutdown();
}

#[test]
fn a_server_that_runs_no_graph_leaves_its_state_directory_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let (server, _) = open_at(dir.path(), ApprovalPolicy::AutoApprove, None);
    assert!(server.graph().list().unwrap().is_empty());
    assert!(server.graph().summary("nothing", false).is_err());
    server.shutdown();
    drop(server);
    assert!(!dir.path().join("graph-runs").exists());
    // The first run creates it, with the store's usual permissions.
    let (server, _) = open_at(dir.path(), ApprovalPolicy::AutoApprove, None);
    server
        .graph()
        .start(request(diamond(), "first", json!({"topic": "t"})))
        .unwrap();
    server
        .graph()
        .wait("first", Duration::from_secs(20))
        .unwrap();
    server.shutdown();
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir.path().join("graph-runs"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o700);
}

#[test]
fn values_never_nest_past_what_every_reader_parses() {
    let s = open(ApprovalPolicy::AutoApprove);
    let graph = s.server.graph();
    // Each join wraps its input once more: 70 of them in a row would pass 64 levels.
    let mut nodes = Vec::new();
    let mut edges = vec![edge((None, "x"), (Some("j0"), "in"))];
    for i in 0..70 {
        nodes.push(json!({"kind": "join", "id": format!("j{i}"), "inputs": [port("in", "json")], "outputs": [port("out", "object")]}));
        if i > 0 {
            edges.push(edge(
                (Some(&format!("j{}", i - 1)), "out"),
                (Some(&format!("j{i}")), "in"),
            ));
        }
    }
    let def = json!({"graphVersion": 1, "id": "deep", "inputs": [port("x", "json")], "nodes": nodes, "edges": edges});
    graph
        .start(request(def.clone(), "deep", json!({"x": 1})))
        .unwrap();
    let summary = graph.wait("deep", Duration::from_secs(20)).unwrap();
    assert_eq!(status(&summary), "failed");
    let error = summary.error.unwrap();
    assert_eq!(error.code, "outputTooDeep");
    // j0 wraps 1 once (1 level); j63 reaches 64 levels, j64 would be 65.
    assert_eq!(error.node.as_deref(), Some("j64"));
    // The log stays readable end to end (nothing past the bound was written).
    replays(&s.server, "deep");
    // A run input past the bound is refused before anything is recorded.
    let mut deep = json!(1);
    for _ in 0..70 {
        deep = json!([deep]);
    }
    let err = graph
        .start(request(def, "deep2", json!({"x": deep})))
        .unwrap_err();
    assert_eq!(err.code(), -32602);
    s.server.shutdown();
}

/// docs/rollout-format.md, "Trace and parent ids": a run's events are in the trace its caller
/// sent; an attempt's events name the attempt's start, which names the run's start; the
/// attempt's own thread names the run's event that started it, across logs, by hash.
#[test]
fn a_runs_events_and_its_attempts_turns_carry_its_trace() {
    let s = open(ApprovalPolicy::AutoApprove);
    let graph = s.server.graph();
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let mut req = request(diamond(), "tr1", json!({"topic": "rust"}));
    req.traceparent = Some(format!("00-{trace}-00f067aa0ba902b7-01"));
    graph.start(req).unwrap();
    let summary = graph.wait("tr1", Duration::from_secs(20)).unwrap();
    assert_eq!(status(&summary), "succeeded", "{summary:?}");
    let ev = events(&s.server, "tr1");
    let seq_of = |e: &StoredEvent| e.parent_id.as_deref().and_then(|p| p.parse::<u64>().ok());
    assert_eq!(ev[0].parent_id.as_deref(), Some("span:00f067aa0ba902b7"));
    let started = ev.iter().find(|e| e.kind() == "graphRunStarted").unwrap();
    assert_eq!(seq_of(started), Some(1), "the run's start names its header");
    let mut attempts = HashMap::new();
    // A finished run's log is archived: housekeeping, outside every trace.
    assert_eq!(ev.last().unwrap().kind(), "threadArchived");
    for e in &ev[..ev.len() - 1] {
        assert_eq!(e.trace_id.as_deref(), Some(trace), "{e:?}");
        if let Some(a) = e.payload["attemptId"].as_u64() {
            if e.kind() == "graphAttemptStarted" {
                assert_eq!(seq_of(e), Some(started.seq), "{e:?}");
                attempts.insert(a, e);
            } else {
                let of = attempts[&a];
                assert_eq!(seq_of(e), Some(of.seq), "{e:?} names its attempt's start");
            }
        } else if e.seq > started.seq {
            assert_eq!(seq_of(e), Some(started.seq), "{e:?}");
        }
    }
    assert_eq!(attempts.len(), 4);
    // The agent nodes' turns, on threads of their own, join the run's trace by its event.
    let st = s.server.graph().state("tr1").unwrap();
    for node in ["left", "right"] {
        let thread = st.nodes[node].thread_id.clone().unwrap();
        let turn = s.server.store().read(&thread, 0, 100).unwrap().events;
        let attempt = attempts
            .values()
            .find(|a| a.payload["node"] == node)
            .unwrap();
        let link = format!("event:{}", attempt.hash);
        assert_eq!(turn[0].parent_id.as_deref(), Some(link.as_str()));
        let turn_started = turn.iter().find(|e| e.kind() == "turnStarted").unwrap();
        assert_eq!(turn_started.parent_id.as_deref(), Some(link.as_str()));
        for e in turn.iter().filter(|e| e.kind() != "threadArchived") {
            assert_eq!(e.trace_id.as_deref(), Some(trace), "{e:?}");
        }
    }
}
