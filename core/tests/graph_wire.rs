//! The graph methods over a real in-process connection: feature negotiation, graph/validate,
//! graph/run/start|read|cancel, node and run notifications (each checked against the schema by
//! the engine in debug builds), approvals of a graph's tool calls by the connection that started
//! it, content hidden unless asked for, and the error codes.

use cc_app_server::approval::ApprovalPolicy;
use cc_app_server::engine::{AppServer, Connection, ServerConfig};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

struct Conn {
    conn: Connection,
    next: u64,
    /// Notifications and server requests seen while waiting for answers.
    seen: Vec<Value>,
}

impl Conn {
    fn open(server: &AppServer, features: &[&str]) -> (Conn, Value) {
        let mut c = Conn {
            conn: server.connect().unwrap(),
            next: 1,
            seen: Vec::new(),
        };
        let init = c.request(
            "initialize",
            json!({"protocolVersion": 1, "minimumProtocolVersion": 1, "client": {"name": "t", "version": "1"}, "features": features}),
        );
        (c, init)
    }

    fn recv(&mut self) -> Value {
        let text = self
            .conn
            .recv(Some(Duration::from_secs(20)))
            .unwrap_or_else(|e| panic!("{e:?}; seen {:#?}", self.seen));
        serde_json::from_str(&text).unwrap()
    }

    /// The whole response (result or error) to one request.
    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next;
        self.next += 1;
        self.conn
            .send(
                &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
                    .to_string(),
            )
            .unwrap();
        loop {
            let m = self.recv();
            if m.get("method").is_none() && m["id"] == json!(id) {
                return m;
            }
            self.seen.push(m);
        }
    }

    fn result(&mut self, method: &str, params: Value) -> Value {
        let r = self.request(method, params);
        assert!(r.get("error").is_none(), "{method}: {r}");
        r["result"].clone()
    }

    /// Waits for a message matching `f` (answering approvals with `decision` meanwhile).
    fn until(&mut self, decision: &str, mut f: impl FnMut(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut answered = 0;
        loop {
            // Approval requests that arrived while waiting for an answer are decided first.
            let asks: Vec<Value> = self
                .seen
                .iter()
                .filter(|m| m["method"] == "approval/decide")
                .cloned()
                .collect();
            for m in asks.iter().skip(answered) {
                let answer = json!({"jsonrpc": "2.0", "id": m["id"], "result": {"kind": decision}});
                self.conn.send(&answer.to_string()).unwrap();
            }
            answered = asks.len();
            if let Some(i) = self.seen.iter().position(&mut f) {
                return self.seen.remove(i);
            }
            assert!(Instant::now() < deadline, "timed out; seen {:?}", self.seen);
            let m = self.recv();
            self.seen.push(m);
        }
    }
}

const ALL: &[&str] = &[
    "thread_turn_item",
    "structured_approval",
    "typed_graph",
    "causal_messages",
    "graph_effect_receipts",
];

fn server(policy: ApprovalPolicy) -> (AppServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = ServerConfig::new(dir.path());
    config.policy = policy;
    (AppServer::open(config).unwrap(), dir)
}

fn port(name: &str, ty: &str) -> Value {
    json!({"name": name, "type": ty})
}

fn diamond() -> Value {
    let agent = |id: &str, text: &str| {
        json!({"kind": "agent", "id": id, "inputs": [port("data", "json")], "outputs": [port("text", "text")],
               "agentOptions": {"script": {"steps": [{"type": "message", "text": text}]}}})
    };
    let e = |f: Value, t: Value| json!({"from": f, "to": t});
    json!({"graphVersion": 1, "id": "diamond", "inputs": [port("topic", "text")], "outputs": [port("report", "object")],
        "nodes": [
            {"kind": "tool", "id": "fetch", "tool": "fetch", "inputs": [port("topic", "text")], "outputs": [port("result", "json")]},
            agent("left", "L"), agent("right", "R"),
            {"kind": "join", "id": "merge", "inputs": [port("l", "text"), port("r", "text")], "outputs": [port("both", "object")]}],
        "edges": [
            e(json!({"port": "topic"}), json!({"node": "fetch", "port": "topic"})),
            e(json!({"node": "fetch", "port": "result"}), json!({"node": "left", "port": "data"})),
            e(json!({"node": "fetch", "port": "result"}), json!({"node": "right", "port": "data"})),
            e(json!({"node": "left", "port": "text"}), json!({"node": "merge", "port": "l"})),
            e(json!({"node": "right", "port": "text"}), json!({"node": "merge", "port": "r"})),
            e(json!({"node": "merge", "port": "both"}), json!({"port": "report"}))]})
}

fn grant() -> Value {
    json!({"capabilities": ["agent", "tool:*"]})
}

#[test]
fn the_graph_features_are_advertised_and_the_methods_need_typed_graph() {
    let (server, _dir) = server(ApprovalPolicy::AutoApprove);
    let (mut c, init) = Conn::open(&server, ALL);
    let features = init["result"]["features"].as_array().unwrap();
    for f in ["typed_graph", "causal_messages", "graph_effect_receipts"] {
        assert!(features.contains(&json!(f)), "{init}");
    }
    assert!(
        !features.contains(&json!("durable_human_task"))
            && !features.contains(&json!("deterministic_trace"))
    );
    assert_eq!(
        c.result("graph/validate", json!({"definition": diamond()}))["valid"],
        false
    );
    let (mut plain, _) = Conn::open(&server, &["thread_turn_item"]);
    for (method, params) in [
        ("graph/validate", json!({"definition": diamond()})),
        ("graph/run/start", json!({"definition": diamond()})),
        ("graph/run/read", json!({"runId": "x"})),
        ("graph/run/cancel", json!({"runId": "x"})),
    ] {
        let r = plain.request(method, params);
        assert_eq!(r["error"]["code"], -32601, "{method}: {r}");
    }
    server.shutdown();
}

#[test]
fn graph_validate_reports_each_rule_with_its_code_and_pointer() {
    let (server, _dir) = server(ApprovalPolicy::AutoApprove);
    let (mut c, _) = Conn::open(&server, ALL);
    let ok = c.result(
        "graph/validate",
        json!({"definition": diamond(), "grant": grant()}),
    );
    assert_eq!(ok["valid"], true);
    assert_eq!(ok["nodeCount"], 4);
    assert!(ok["planDigest"].as_str().unwrap().starts_with("sha256:"));
    assert_eq!(ok["errors"], json!([]));
    // Nothing is granted unless listed.
    let none = c.result("graph/validate", json!({"definition": diamond()}));
    let codes: Vec<&str> = none["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["code"].as_str().unwrap())
        .collect();
    assert_eq!(codes, ["capabilityNotGranted"; 3]);
    assert_eq!(none["planDigest"], Value::Null);
    let mut bad = diamond();
    bad["edges"][1]["to"]["node"] = json!("nowhere");
    let r = c.result(
        "graph/validate",
        json!({"definition": bad, "grant": grant()}),
    );
    assert_eq!(
        r["errors"][0],
        json!({"code": "danglingNode", "pointer": "/edges/1/to/node", "message": "no node \"nowhere\" in this body"})
    );
    // A definition outside the schema never reaches the compiler: -32602 with the pointer.
    let mut shape = diamond();
    shape["nodes"][0]["kind"] = json!("robot");
    let r = c.request("graph/validate", json!({"definition": shape}));
    assert_eq!(r["error"]["code"], -32602);
    assert_eq!(
        r["error"]["data"]["pointer"],
        "/params/definition/nodes/0/kind"
    );
    server.shutdown();
}

#[test]
fn a_run_over_the_wire_asks_its_starter_for_approval_and_reports_every_state() {
    let (server, _dir) = server(ApprovalPolicy::AskEveryTime);
    let (mut c, _) = Conn::open(&server, ALL);
    let started = c.result(
        "graph/run/start",
        json!({"runId": "w1", "definition": diamond(), "inputs": {"topic": "t"}, "grant": grant()}),
    );
    assert_eq!(started["run"]["runId"], "w1");
    assert_eq!(started["run"]["status"], "running");
    assert!(
        started["run"].get("outputs").is_none(),
        "content is not in notifications or start"
    );
    let done = c.until("acceptOnce", |m| {
        (m["method"] == "graph/event" && m["params"]["type"] == "runUpdated")
            && m["params"]["run"]["status"] == "succeeded"
    });
    assert_eq!(done["params"]["run"]["nodes"]["succeeded"], 4);
    // The approval went to this connection, bound to the attempt's thread.
    let ask = c.seen.iter().find(|m| m["method"] == "approval/decide");
    let ask = ask.expect("an approval/decide for the tool node");
    assert!(ask["params"]["binding"]["threadId"]
        .as_str()
        .unwrap()
        .starts_with("graph-w1-a"));
    assert_eq!(ask["params"]["operation"]["tool"], "fetch");
    // Node notifications arrive in seq order, and each node's last one says succeeded.
    let nodes: Vec<&Value> = c
        .seen
        .iter()
        .filter(|m| m["method"] == "graph/event" && m["params"]["type"] == "nodeUpdated")
        .collect();
    let seqs: Vec<u64> = nodes
        .iter()
        .map(|m| m["params"]["eventSeq"].as_u64().unwrap())
        .collect();
    assert!(seqs.windows(2).all(|w| w[0] <= w[1]), "{seqs:?}");
    for key in ["fetch", "left", "right", "merge"] {
        let last = nodes
            .iter()
            .rev()
            .find(|m| m["params"]["node"]["key"] == key)
            .unwrap();
        assert_eq!(last["params"]["node"]["status"], "succeeded", "{key}");
    }
    // Read: state without content by default…
    let read = c.result("graph/run/read", json!({"runId": "w1"}));
    assert_eq!(read["nodes"].as_array().unwrap().len(), 4);
    assert!(read["run"].get("outputs").is_none());
    let messages = read["messages"].as_array().unwrap();
    assert!(messages
        .iter()
        .all(|m| m.get("value").is_none() && m["status"] == "acked"));
    assert!(messages
        .iter()
        .all(|m| m["valueDigest"].as_str().unwrap().starts_with("sha256:")));
    let effect = &read["effects"][0];
    assert_eq!(effect["status"], "succeeded");
    assert!(effect["receipt"].get("result").is_none());
    // …and with it when asked.
    let full = c.result(
        "graph/run/read",
        json!({"runId": "w1", "includeContent": true}),
    );
    assert_eq!(
        full["run"]["outputs"]["report"],
        json!({"l": "L", "r": "R"})
    );
    assert!(full["messages"]
        .as_array()
        .unwrap()
        .iter()
        .all(|m| m.get("value").is_some()));
    assert_eq!(full["effects"][0]["receipt"]["result"]["status"], "ok");
    // The log itself, paged; it carries content, so it needs includeContent.
    let r = c.request("graph/run/read", json!({"runId": "w1", "afterEventSeq": 0}));
    assert_eq!(r["error"]["code"], -32602);
    let page = c.result(
        "graph/run/read",
        json!({"runId": "w1", "includeContent": true, "afterEventSeq": 0, "limit": 5}),
    );
    let events = page["events"].as_array().unwrap();
    assert_eq!(events.len(), 5);
    assert_eq!(events[0]["payload"]["type"], "threadStarted");
    assert_eq!(events[1]["payload"]["type"], "graphRunStarted");
    assert_eq!(page["hasMore"], true);
    server.shutdown();
}

#[test]
fn without_the_message_and_receipt_features_read_leaves_them_out() {
    let (server, _dir) = server(ApprovalPolicy::AutoApprove);
    let (mut c, _) = Conn::open(&server, &["typed_graph"]);
    c.result(
        "graph/run/start",
        json!({"runId": "f1", "definition": diamond(), "inputs": {"topic": "t"}, "grant": grant()}),
    );
    c.until("decline", |m| {
        (m["method"] == "graph/event" && m["params"]["type"] == "runUpdated")
            && m["params"]["run"]["status"] == "succeeded"
    });
    let read = c.result("graph/run/read", json!({"runId": "f1"}));
    assert!(
        read.get("messages").is_none() && read.get("effects").is_none(),
        "{read}"
    );
    server.shutdown();
}

#[test]
fn a_declined_tool_call_fails_its_node_and_the_run() {
    let (server, _dir) = server(ApprovalPolicy::AskEveryTime);
    let (mut c, _) = Conn::open(&server, ALL);
    c.result(
        "graph/run/start",
        json!({"runId": "no", "definition": diamond(), "inputs": {"topic": "t"}, "grant": grant()}),
    );
    let done = c.until("decline", |m| {
        (m["method"] == "graph/event" && m["params"]["type"] == "runUpdated")
            && m["params"]["run"]["status"] == "failed"
    });
    assert_eq!(done["params"]["run"]["error"]["code"], "toolDenied");
    let read = c.result("graph/run/read", json!({"runId": "no"}));
    assert_eq!(read["effects"][0]["applied"], false);
    assert_eq!(read["effects"][0]["receipt"]["resultStatus"], "denied");
    server.shutdown();
}

#[test]
fn errors_have_the_right_codes() {
    let (server, _dir) = server(ApprovalPolicy::AutoApprove);
    let (mut c, _) = Conn::open(&server, ALL);
    let mut bad = diamond();
    bad["edges"][0]["to"]["port"] = json!("nope");
    let r = c.request(
        "graph/run/start",
        json!({"definition": bad, "inputs": {"topic": "t"}, "grant": grant()}),
    );
    assert_eq!(r["error"]["code"], -32602);
    assert_eq!(
        r["error"]["data"],
        json!({"pointer": "/edges/0/to/port", "reason": "danglingPort"})
    );
    let r = c.request(
        "graph/run/start",
        json!({"definition": diamond(), "grant": grant()}),
    );
    assert_eq!(r["error"]["code"], -32602, "a missing input: {r}");
    let r = c.request(
        "graph/run/start",
        json!({"definition": diamond(), "inputs": {"topic": "t"}}),
    );
    assert_eq!(r["error"]["code"], -32602, "no grant");
    assert_eq!(r["error"]["data"]["reason"], "capabilityNotGranted");
    assert_eq!(
        c.request("graph/run/read", json!({"runId": "missing"}))["error"]["code"],
        -32004
    );
    assert_eq!(
        c.request("graph/run/cancel", json!({"runId": "missing"}))["error"]["code"],
        -32004
    );
    let r = c.request("graph/run/read", json!({"runId": "../etc"}));
    assert_eq!(
        r["error"]["code"], -32602,
        "ids are checked against the schema first: {r}"
    );
    c.result("graph/run/start", json!({"runId": "dup", "definition": diamond(), "inputs": {"topic": "a"}, "grant": grant()}));
    let r = c.request("graph/run/start", json!({"runId": "dup", "definition": diamond(), "inputs": {"topic": "b"}, "grant": grant()}));
    assert_eq!(r["error"]["code"], -32009);
    server.shutdown();
}

#[test]
fn cancel_over_the_wire_fences_the_attempts_before_it_answers() {
    let (server, _dir) = server(ApprovalPolicy::AutoApprove);
    let (mut c, _) = Conn::open(&server, ALL);
    let def = json!({"graphVersion": 1, "id": "sleepy", "nodes": [{"kind": "agent", "id": "s",
        "agentOptions": {"script": {"steps": [{"type": "sleep", "ms": 20000}]}}}]});
    c.result(
        "graph/run/start",
        json!({"runId": "cx", "definition": def, "grant": grant()}),
    );
    c.until("decline", |m| {
        (m["method"] == "graph/event" && m["params"]["type"] == "nodeUpdated")
            && m["params"]["node"]["status"] == "running"
    });
    let r = c.result(
        "graph/run/cancel",
        json!({"runId": "cx", "reason": "enough"}),
    );
    assert_eq!(r["run"]["status"], "cancelled");
    assert_eq!(
        r["fenced"],
        json!([{"attemptId": 1, "node": "s", "fence": 1}])
    );
    assert_eq!(r["run"]["error"]["message"], "enough");
    c.until("decline", |m| {
        (m["method"] == "graph/event" && m["params"]["type"] == "runUpdated")
            && m["params"]["run"]["status"] == "cancelled"
    });
    // Cancelling again answers the same, and fences nothing more.
    let again = c.result("graph/run/cancel", json!({"runId": "cx"}));
    assert_eq!(
        (again["run"]["status"].as_str(), again["fenced"].clone()),
        (Some("cancelled"), json!([]))
    );
    server.shutdown();
}

#[test]
fn joining_a_run_whose_starter_left_makes_the_joiner_its_approver() {
    let (server, _dir) = server(ApprovalPolicy::AskEveryTime);
    let def = json!({"graphVersion": 1, "id": "join-later", "nodes": [
        {"kind": "agent", "id": "think", "outputs": [port("o", "text")],
         "agentOptions": {"script": {"steps": [{"type": "sleep", "ms": 300}, {"type": "message", "text": "go"}]}}},
        {"kind": "tool", "id": "act", "tool": "act", "inputs": [port("o", "text")]}],
        "edges": [{"from": {"node": "think", "port": "o"}, "to": {"node": "act", "port": "o"}}]});
    let params = json!({"runId": "jl", "definition": def, "grant": grant()});
    let (mut first, _) = Conn::open(&server, ALL);
    first.result("graph/run/start", params.clone());
    first.conn.close();
    drop(first);
    // The same params again: the same run, now followed (and approved) by this connection.
    let (mut second, _) = Conn::open(&server, ALL);
    let joined = second.result("graph/run/start", params);
    assert_eq!(joined["run"]["runId"], "jl");
    let done = second.until("acceptOnce", |m| {
        (m["method"] == "graph/event" && m["params"]["type"] == "runUpdated")
            && m["params"]["run"]["status"] != "running"
    });
    assert_eq!(done["params"]["run"]["status"], "succeeded", "{done}");
    assert!(second.seen.iter().any(|m| m["method"] == "approval/decide"));
    server.shutdown();
}
