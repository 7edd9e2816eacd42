//! Graph runs end to end on a real server (scripted kernel, real stores): diamond, loop,
//! subgraph, replay equals live state.

use cc_app_server::approval::ApprovalPolicy;
use cc_app_server::engine::{AppServer, ServerConfig};
use cc_app_server::graph::{grant, RunState, StartRequest};
use serde_json::{json, Value};
use std::time::Duration;

fn open(dir: &std::path::Path) -> AppServer {
    let mut config = ServerConfig::new(dir);
    config.policy = ApprovalPolicy::AutoApprove;
    AppServer::open(config).unwrap()
}

fn agent(id: &str, inputs: Value, outputs: Value, text: &str) -> Value {
    json!({"kind": "agent", "id": id, "inputs": inputs, "outputs": outputs,
           "agentOptions": {"script": {"steps": [{"type": "message", "text": text}]}}})
}

fn diamond() -> Value {
    json!({
        "graphVersion": 1, "id": "diamond",
        "inputs": [{"name": "topic", "type": "text"}],
        "outputs": [{"name": "report", "type": "object"}],
        "nodes": [
            {"kind": "tool", "id": "fetch", "tool": "fetch",
             "inputs": [{"name": "topic", "type": "text"}], "outputs": [{"name": "result", "type": "json"}]},
            agent("left", json!([{"name": "data", "type": "json"}]), json!([{"name": "text", "type": "text"}]), "left done"),
            agent("right", json!([{"name": "data", "type": "json"}]), json!([{"name": "text", "type": "text"}]), "right done"),
            {"kind": "join", "id": "merge", "inputs": [{"name": "l", "type": "text"}, {"name": "r", "type": "text"}],
             "outputs": [{"name": "both", "type": "object"}]}
        ],
        "edges": [
            {"from": {"port": "topic"}, "to": {"node": "fetch", "port": "topic"}},
            {"from": {"node": "fetch", "port": "result"}, "to": {"node": "left", "port": "data"}},
            {"from": {"node": "fetch", "port": "result"}, "to": {"node": "right", "port": "data"}},
            {"from": {"node": "left", "port": "text"}, "to": {"node": "merge", "port": "l"}},
            {"from": {"node": "right", "port": "text"}, "to": {"node": "merge", "port": "r"}},
            {"from": {"node": "merge", "port": "both"}, "to": {"port": "report"}}
        ]
    })
}

#[test]
fn a_diamond_runs_to_completion_and_replays_to_the_same_state() {
    let dir = tempfile::tempdir().unwrap();
    let server = open(dir.path());
    let graph = server.graph();
    let mut req = StartRequest::new(diamond(), grant(&["agent", "tool:*"]));
    req.inputs.insert("topic".into(), json!("rust"));
    req.run_id = Some("d1".into());
    graph.start(req).unwrap();
    let summary = graph.wait("d1", Duration::from_secs(20)).unwrap();
    assert_eq!(
        serde_json::to_value(&summary.status).unwrap(),
        "succeeded",
        "{summary:?}"
    );
    assert_eq!(
        summary.outputs.unwrap()["report"],
        json!({"l": "left done", "r": "right done"})
    );
    let live = graph.state("d1").unwrap();
    assert!(live.anomalies.is_empty(), "{:?}", live.anomalies);
    let mut events = Vec::new();
    cc_app_server::graph::store::for_each_event(&**graph.store(), "d1", |e| events.push(e.clone()))
        .unwrap();
    let replayed = RunState::replay("d1", &events);
    assert_eq!(
        serde_json::to_value(replayed.summary(true)).unwrap(),
        serde_json::to_value(live.summary(true)).unwrap()
    );
    server.shutdown();
}
