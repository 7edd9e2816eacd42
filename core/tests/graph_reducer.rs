//! The reducer alone: a run's state is a pure function of its log. Real logs (written by real
//! runs) are replayed whole and prefix by prefix, then tampered with in the ways a bug or an
//! attacker would, and the reducer must report each break of an invariant (stale fence, double
//! consumption, causal order, falling fences, foreign events) rather than act on it.

use cc_app_server::approval::ApprovalPolicy;
use cc_app_server::engine::{AppServer, ServerConfig};
use cc_app_server::graph::{grant, RunState, StartRequest};
use cc_app_server::rollout::StoredEvent;
use serde_json::{json, Value};
use std::time::Duration;

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

/// A loop whose body echoes three times: its edge into the body is one channel carrying three
/// messages.
fn looping() -> Value {
    json!({"graphVersion": 1, "id": "echo3", "inputs": [port("v", "json")], "outputs": [port("v", "json")],
        "nodes": [
            {"kind": "agent", "id": "first", "outputs": [port("o", "json")],
             "agentOptions": {"script": {"steps": [{"type": "message", "text": "{\"k\": 1}"}]}}},
            {"kind": "loop", "id": "l", "maxIterations": 3, "inputs": [port("v", "json")], "outputs": [port("v", "json")],
             "body": {"nodes": [{"kind": "join", "id": "j", "inputs": [port("v", "json")], "outputs": [port("v", "json")]}],
                      "edges": [edge((None, "v"), (Some("j"), "v")), edge((Some("j"), "v"), (None, "v"))]}},
            {"kind": "join", "id": "end", "inputs": [port("a", "json"), port("b", "json")], "outputs": [port("v", "json")]}],
        "edges": [edge((None, "v"), (Some("l"), "v")), edge((Some("l"), "v"), (Some("end"), "a")),
                  edge((Some("first"), "o"), (Some("end"), "b")), edge((Some("end"), "v"), (None, "v"))]})
}

fn run_log(def: Value, inputs: Value) -> Vec<StoredEvent> {
    let dir = tempfile::tempdir().unwrap();
    let mut config = ServerConfig::new(dir.path());
    config.policy = ApprovalPolicy::AutoApprove;
    let server = AppServer::open(config).unwrap();
    let mut req = StartRequest::new(def, grant(&["agent"]));
    req.run_id = Some("r".into());
    req.inputs = inputs.as_object().cloned().unwrap();
    server.graph().start(req).unwrap();
    let s = server.graph().wait("r", Duration::from_secs(20)).unwrap();
    assert_eq!(
        serde_json::to_value(&s.status).unwrap(),
        "succeeded",
        "{s:?}"
    );
    let mut out = Vec::new();
    cc_app_server::graph::store::for_each_event(&*server.graph().store().unwrap(), "r", |e| {
        out.push(e.clone())
    })
    .unwrap();
    server.shutdown();
    out
}

fn renumber(mut events: Vec<StoredEvent>) -> Vec<StoredEvent> {
    for (i, e) in events.iter_mut().enumerate() {
        e.seq = i as u64 + 1;
    }
    events
}

fn anomalies(events: &[StoredEvent]) -> Vec<String> {
    RunState::replay("r", events)
        .anomalies
        .into_iter()
        .map(|a| a.message)
        .collect()
}

fn summary(events: &[StoredEvent]) -> Value {
    let st = RunState::replay("r", events);
    let nodes: Vec<Value> = st
        .node_order
        .iter()
        .map(|k| serde_json::to_value(st.node_state(&st.nodes[k])).unwrap())
        .collect();
    json!({"run": st.summary(true), "nodes": nodes})
}

#[test]
fn replay_is_deterministic_and_every_prefix_is_a_consistent_state() {
    let log = run_log(looping(), json!({"v": {"start": true}}));
    assert_eq!(summary(&log), summary(&log));
    for k in 1..=log.len() {
        let a = anomalies(&log[..k]);
        assert!(a.is_empty(), "prefix {k}: {a:?}");
    }
    let st = RunState::replay("r", &log);
    assert_eq!(
        serde_json::to_value(st.summary(false).status).unwrap(),
        "succeeded"
    );
    // Each of the three iterations wrapped the carried value once more.
    assert_eq!(
        st.output_values()["v"],
        json!({"a": {"v": {"v": {"v": {"start": true}}}}, "b": {"k": 1}})
    );
}

#[test]
fn a_result_under_a_stale_fence_settles_nothing() {
    let log = run_log(looping(), json!({"v": 1}));
    let mut bad = log.clone();
    let i = bad
        .iter()
        .position(|e| e.kind() == "graphAttemptFinished" && e.payload["node"] == "first")
        .unwrap();
    bad[i].payload["fence"] = json!(99);
    let a = anomalies(&bad);
    assert!(a.iter().any(|m| m.contains("stale fence 99")), "{a:?}");
    let st = RunState::replay("r", &bad);
    assert_ne!(
        serde_json::to_value(st.node_state(&st.nodes["first"]).status).unwrap(),
        "succeeded"
    );
}

#[test]
fn a_second_consumption_is_reported_not_applied() {
    let log = run_log(looping(), json!({"v": 1}));
    let i = log
        .iter()
        .position(|e| e.kind() == "graphMessageAcked")
        .unwrap();
    let mut bad = log.clone();
    let mut again = bad[i].clone();
    again.payload["consumer"] = json!("end");
    bad.insert(i + 1, again);
    let bad = renumber(bad);
    let a = anomalies(&bad);
    assert!(a.iter().any(|m| m.contains("consumed twice")), "{a:?}");
    let m = bad[i].payload["messageId"].as_str().unwrap();
    let st = RunState::replay("r", &bad);
    assert_eq!(
        st.messages[m].acked_by.as_deref(),
        log[i].payload["consumer"].as_str()
    );
    // Marked as a duplicate, the same redelivery is fine.
    let mut ok = log.clone();
    let mut dup = ok[i].clone();
    dup.payload["duplicate"] = json!(true);
    ok.insert(i + 1, dup);
    assert!(anomalies(&renumber(ok)).is_empty());
}

#[test]
fn consumption_out_of_channel_order_is_reported() {
    let log = run_log(looping(), json!({"v": 1}));
    // The loop's body edge carries three messages on one channel; consume the second first.
    let on_channel: Vec<String> = log
        .iter()
        .filter(|e| e.kind() == "graphMessageSent" && e.payload["channel"] == "l:e0")
        .map(|e| e.payload["messageId"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(on_channel.len(), 3);
    let ack_of = |m: &str| {
        log.iter()
            .position(|e| e.kind() == "graphMessageAcked" && e.payload["messageId"] == m)
            .unwrap()
    };
    let (first, second) = (ack_of(&on_channel[0]), ack_of(&on_channel[1]));
    let mut bad = log.clone();
    let moved = bad.remove(second);
    bad.insert(first, moved);
    let a = anomalies(&renumber(bad));
    assert!(a.iter().any(|m| m.contains("causal order")), "{a:?}");
}

#[test]
fn fences_must_rise_and_custody_must_be_the_runs() {
    let log = run_log(looping(), json!({"v": 1}));
    let starts: Vec<usize> = log
        .iter()
        .enumerate()
        .filter(|(_, e)| e.kind() == "graphAttemptStarted")
        .map(|(i, _)| i)
        .collect();
    let mut bad = log.clone();
    bad[starts[1]].payload["fence"] = json!(1);
    let a = anomalies(&bad);
    assert!(a.iter().any(|m| m.contains("does not increase")), "{a:?}");
    // Handing an attempt a message that another already consumed.
    let consumed = log
        .iter()
        .find(|e| e.kind() == "graphMessageAcked")
        .unwrap()
        .payload["messageId"]
        .clone();
    let mut bad = log.clone();
    let last = *starts.last().unwrap();
    bad[last].payload["custody"] = json!([consumed]);
    let a = anomalies(&bad);
    assert!(
        a.iter().any(|m| m.contains("which the run does not hold")),
        "{a:?}"
    );
}

#[test]
fn causes_must_come_first_and_foreign_events_do_not_belong() {
    let log = run_log(looping(), json!({"v": 1}));
    let i = log
        .iter()
        .rposition(|e| e.kind() == "graphMessageSent")
        .unwrap();
    let mut bad = log.clone();
    bad[i].payload["causes"] = json!(["m9999"]);
    let a = anomalies(&bad);
    assert!(a.iter().any(|m| m.contains("unknown cause m9999")), "{a:?}");
    let mut bad = log.clone();
    let mut foreign = bad[1].clone();
    foreign.payload = json!({"type": "turnStarted", "turnId": "t", "input": []});
    bad.insert(2, foreign);
    let a = anomalies(&renumber(bad));
    assert!(
        a.iter().any(|m| m.contains("turnStarted does not belong")),
        "{a:?}"
    );
    // A gap in seqs is reported too.
    let mut gap = log.clone();
    gap.remove(3);
    let a = anomalies(&gap);
    assert!(a.iter().any(|m| m.contains("follows")), "{a:?}");
}
