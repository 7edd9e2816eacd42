//! Graphs written to hurt: tool calls a run does not grant (from a tool node or from an agent's
//! model), write scopes that must reach the tool executor (and its refusals recorded), and
//! definitions built to make the compiler quadratic — 10,000 parallel nodes that all write `*`,
//! a 10,000-node chain, 10,000 distinct scopes — which must compile with the right verdict
//! without holding a connection's other requests behind them.

use cc_app_server::approval::ApprovalPolicy;
use cc_app_server::engine::{AppServer, ServerConfig};
use cc_app_server::graph::{compile, grant, CompileError, StartRequest, MAX_ERRORS};
use cc_app_server::kernel::ToolExecutor;
use cc_app_server::protocol::{ToolCall, ToolResult, ToolResultDenied, ToolResultOk};
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One call as the executor saw it: tool, arguments, write scope (`None`: plain `execute`).
type Seen = (String, Value, Option<Vec<String>>);

/// Records every call with the write scope it arrived with (`None`: plain `execute`), and
/// refuses, as a symlink-resolving executor would, a path with a `link` segment.
#[derive(Default)]
struct Recording {
    calls: Mutex<Vec<Seen>>,
}

impl Recording {
    fn calls(&self) -> Vec<Seen> {
        self.calls.lock().unwrap().clone()
    }

    fn answer(&self, call: &ToolCall, scope: Option<&[String]>) -> ToolResult {
        self.calls.lock().unwrap().push((
            call.tool.clone(),
            call.arguments.clone(),
            scope.map(<[String]>::to_vec),
        ));
        let path = call.arguments["path"].as_str().unwrap_or("");
        if scope.is_some() && path.split('/').any(|s| s == "link") {
            return ToolResult::Denied(ToolResultDenied {
                reason: format!("{path} resolves outside the write scope"),
            });
        }
        ToolResult::Ok(ToolResultOk {
            output: json!({"tool": call.tool}),
        })
    }
}

impl ToolExecutor for Recording {
    fn execute(&self, _thread: &str, call: &ToolCall) -> ToolResult {
        self.answer(call, None)
    }

    fn execute_scoped(&self, _thread: &str, call: &ToolCall, scope: &[String]) -> ToolResult {
        self.answer(call, Some(scope))
    }
}

struct Server {
    server: AppServer,
    tools: Arc<Recording>,
    _dir: tempfile::TempDir,
}

fn open() -> Server {
    let dir = tempfile::tempdir().unwrap();
    let tools = Arc::new(Recording::default());
    let mut config = ServerConfig::new(dir.path());
    config.policy = ApprovalPolicy::AutoApprove;
    config.tools = tools.clone();
    Server {
        server: AppServer::open(config).unwrap(),
        tools,
        _dir: dir,
    }
}

fn port(name: &str, ty: &str) -> Value {
    json!({"name": name, "type": ty})
}

fn agent_calling(id: &str, tool: &str, args: Value) -> Value {
    json!({"kind": "agent", "id": id, "outputs": [port("text", "text")],
           "agentOptions": {"script": {"steps": [
               {"type": "tool", "tool": tool, "arguments": args},
               {"type": "message", "text": "done"}]}}})
}

fn run(
    s: &Server,
    id: &str,
    def: Value,
    caps: &[&str],
) -> cc_app_server::protocol::GraphRunSummary {
    let mut req = StartRequest::new(def, grant(caps));
    req.run_id = Some(id.into());
    let graph = s.server.graph();
    graph.start(req).unwrap();
    graph.wait(id, Duration::from_secs(30)).unwrap()
}

fn status(v: impl serde::Serialize) -> String {
    serde_json::to_value(v).unwrap()["status"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The items the attempt thread of `node` recorded as completed tool calls.
fn tool_items(s: &Server, run: &str, node: &str) -> Vec<Value> {
    let st = s.server.graph().state(run).unwrap();
    let thread = st.nodes[node].thread_id.clone().unwrap();
    let page = s.server.store().read(&thread, 0, 1000).unwrap();
    page.events
        .iter()
        .filter(|e| e.kind() == "itemCompleted" && e.payload["item"]["type"] == "toolCall")
        .map(|e| e.payload["item"].clone())
        .collect()
}

#[test]
fn an_agent_nodes_tool_calls_need_the_runs_tool_grant() {
    let s = open();
    let def = |tool: &str| {
        json!({"graphVersion": 1, "id": "g", "outputs": [port("o", "text")],
               "nodes": [agent_calling("a", tool, json!({"argv": ["id"]}))],
               "edges": [{"from": {"node": "a", "port": "text"}, "to": {"port": "o"}}]})
    };
    // `agent` only: the model's run_command is refused, recorded as declined, and the turn
    // goes on (the model saw the refusal as the call's result).
    let summary = run(&s, "agent-only", def("run_command"), &["agent"]);
    assert_eq!(status(&summary), "succeeded", "{summary:?}");
    assert!(s.tools.calls().is_empty(), "{:?}", s.tools.calls());
    let st = s.server.graph().state("agent-only").unwrap();
    assert!(st.effects.is_empty(), "a refused call is never an effect");
    let items = tool_items(&s, "agent-only", "a");
    assert_eq!(items.len(), 1, "{items:?}");
    assert_eq!(items[0]["status"], "declined");
    assert_eq!(items[0]["result"]["status"], "denied");
    let reason = items[0]["result"]["reason"].as_str().unwrap();
    assert!(reason.contains("tool:run_command"), "{reason}");
    // A prefix grant covers its tools and only them.
    let summary = run(&s, "fs-only", def("run_command"), &["agent", "tool:fs.*"]);
    assert_eq!(status(&summary), "succeeded");
    assert!(s.tools.calls().is_empty());
    let summary = run(&s, "fs-write", def("fs.write"), &["agent", "tool:fs.*"]);
    assert_eq!(status(&summary), "succeeded");
    assert_eq!(s.tools.calls().len(), 1);
    assert_eq!(s.tools.calls()[0].0, "fs.write");
    // The exact grant, `tool:*` and `*` all let it run.
    for (i, caps) in [
        &["agent", "tool:run_command"][..],
        &["agent", "tool:*"],
        &["*"],
    ]
    .iter()
    .enumerate()
    {
        let summary = run(&s, &format!("ok{i}"), def("run_command"), caps);
        assert_eq!(status(&summary), "succeeded");
        assert_eq!(s.tools.calls().len(), 2 + i, "{caps:?}");
    }
    s.server.shutdown();
}

#[test]
fn write_scopes_reach_the_executor_and_its_refusals_are_recorded() {
    let s = open();
    let tool = |id: &str, path: &str, scope: &[&str]| {
        json!({"kind": "tool", "id": id, "tool": "write_file", "writeScope": scope,
               "arguments": {"path": path, "content": "x"}})
    };
    // A tool node: its call arrives with the node's (normalised) scope.
    let def =
        json!({"graphVersion": 1, "id": "g", "nodes": [tool("w", "docs/a.md", &["./docs/"])]});
    let summary = run(&s, "tool-node", def, &["tool:*"]);
    assert_eq!(status(&summary), "succeeded", "{summary:?}");
    assert_eq!(
        s.tools.calls(),
        vec![(
            "write_file".to_string(),
            json!({"path": "docs/a.md", "content": "x"}),
            Some(vec!["docs".to_string()])
        )]
    );
    // An agent node: every call of its turn carries the node's scope.
    let mut a = agent_calling(
        "a",
        "write_file",
        json!({"path": "src/x.rs", "content": "y"}),
    );
    a["writeScope"] = json!(["src", "db:users"]);
    let def = json!({"graphVersion": 1, "id": "g", "nodes": [a]});
    let summary = run(&s, "agent-node", def, &["agent", "tool:*"]);
    assert_eq!(status(&summary), "succeeded", "{summary:?}");
    assert_eq!(
        s.tools.calls()[1].2,
        Some(vec!["src".to_string(), "db:users".to_string()])
    );
    // A node without a scope: the plain execute, as before.
    let def = json!({"graphVersion": 1, "id": "g", "nodes": [
        {"kind": "tool", "id": "free", "tool": "write_file", "arguments": {"path": "x", "content": "z"}}]});
    assert_eq!(status(run(&s, "unscoped", def, &["tool:*"])), "succeeded");
    assert_eq!(s.tools.calls()[2].2, None);
    // Inside the scope by name, outside once resolved: the executor refuses, and the refusal is
    // the effect's recorded outcome (not applied), the node fails toolDenied.
    let def =
        json!({"graphVersion": 1, "id": "g", "nodes": [tool("w", "docs/link/a.md", &["docs"])]});
    let summary = run(&s, "refused", def, &["tool:*"]);
    assert_eq!(status(&summary), "failed");
    assert_eq!(summary.error.as_ref().unwrap().code, "toolDenied");
    let st = s.server.graph().state("refused").unwrap();
    let effect = st.effects.values().next().expect("the call was an effect");
    assert_eq!(effect.applied, Some(false));
    let receipt = serde_json::to_value(st.effect_state(effect, true)).unwrap();
    assert_eq!(
        receipt["receipt"]["result"]["status"], "denied",
        "{receipt}"
    );
    assert_eq!(receipt["receipt"]["resultStatus"], "denied");
    assert!(receipt["receipt"]["result"]["reason"]
        .as_str()
        .unwrap()
        .contains("outside the write scope"));
    // The logical check stays the first line: a named path outside never reaches the executor.
    let n = s.tools.calls().len();
    let def = json!({"graphVersion": 1, "id": "g", "nodes": [tool("w", "src/a.rs", &["docs"])]});
    assert_eq!(status(run(&s, "outside", def, &["tool:*"])), "failed");
    assert_eq!(s.tools.calls().len(), n);
    s.server.shutdown();
}

// ------------------------------------------------------------------ compiler size and shape

fn tool_node(id: &str, scope: &[&str], inputs: &[&str], outputs: &[&str]) -> Value {
    let mut n = json!({"kind": "tool", "id": id, "tool": "t", "writeScope": scope});
    if !inputs.is_empty() {
        n["inputs"] = inputs.iter().map(|p| port(p, "json")).collect();
    }
    if !outputs.is_empty() {
        n["outputs"] = outputs.iter().map(|p| port(p, "json")).collect();
    }
    n
}

/// `n` joins, each fed by the run's input: a large definition whose run needs no tool.
fn joins(n: usize) -> Value {
    let nodes: Vec<Value> = (0..n)
        .map(|i| json!({"kind": "join", "id": format!("j{i}"), "inputs": [port("x", "json")], "outputs": [port("o", "object")]}))
        .collect();
    let edges: Vec<Value> = (0..n)
        .map(|i| json!({"from": {"port": "x"}, "to": {"node": format!("j{i}"), "port": "x"}}))
        .collect();
    json!({"graphVersion": 1, "id": "joins", "inputs": [port("x", "json")], "nodes": nodes, "edges": edges})
}

fn parallel(n: usize, scope: impl Fn(usize) -> String) -> Value {
    let nodes: Vec<Value> = (0..n)
        .map(|i| tool_node(&format!("n{i}"), &[&scope(i)], &[], &[]))
        .collect();
    json!({"graphVersion": 1, "id": "wide", "nodes": nodes})
}

fn chain(n: usize, scope: &str) -> Value {
    let mut nodes = Vec::new();
    let mut edges = Vec::new();
    for i in 0..n {
        let ins: &[&str] = if i == 0 { &[] } else { &["in"] };
        let outs: &[&str] = if i + 1 == n { &[] } else { &["out"] };
        nodes.push(tool_node(&format!("n{i}"), &[scope], ins, outs));
        if i > 0 {
            edges.push(
                json!({"from": {"node": format!("n{}", i - 1), "port": "out"},
                              "to": {"node": format!("n{i}"), "port": "in"}}),
            );
        }
    }
    json!({"graphVersion": 1, "id": "chain", "nodes": nodes, "edges": edges})
}

fn errors(def: &Value) -> Vec<CompileError> {
    match compile(def, &grant(&["tool:*"])) {
        Ok(_) => Vec::new(),
        Err(e) => e,
    }
}

#[test]
fn ten_thousand_parallel_nodes_writing_everything_are_refused_with_capped_errors() {
    let errs = errors(&parallel(10_000, |_| "*".into()));
    assert_eq!(errs.len(), MAX_ERRORS);
    assert!(errs.iter().all(|e| e.code_name() == "writeScopeOverlap"));
    // One error per node (the later of its clash), in definition order.
    assert_eq!(errs[0].pointer, "/nodes/1/writeScope");
    assert_eq!(errs[999].pointer, "/nodes/1000/writeScope");
    assert!(
        errs[0]
            .message
            .contains("\"n0\" (\"*\") and \"n1\" (\"*\")"),
        "{}",
        errs[0].message
    );
    // 9,999 nodes clash; the last reported error says how many were left out.
    assert!(
        errs[999]
            .message
            .ends_with("[8999 more error(s) found and not reported: at most 1000 are]"),
        "{}",
        errs[999].message
    );
    assert!(errs[998].message.ends_with("narrow their write scopes"));
}

#[test]
fn a_thousand_errors_are_all_reported_and_one_more_is_counted() {
    // 1,001 parallel "*" nodes: exactly 1,000 clashes, all reported, nothing said left out.
    let errs = errors(&parallel(1_001, |_| "*".into()));
    assert_eq!(errs.len(), MAX_ERRORS);
    assert!(!errs.iter().any(|e| e.message.contains("not reported")));
    // 1,002: one more, counted on the last.
    let errs = errors(&parallel(1_002, |_| "*".into()));
    assert_eq!(errs.len(), MAX_ERRORS);
    assert!(errs[999]
        .message
        .ends_with("[1 more error(s) found and not reported: at most 1000 are]"));
}

#[test]
fn a_ten_thousand_node_chain_writing_everything_compiles() {
    let plan = compile(&chain(10_000, "*"), &grant(&["tool:*"])).unwrap();
    assert_eq!(plan.node_count(), 10_000);
    // The same chain with one node off it that writes under a scope the chain writes: refused
    // once, at the extra node, whatever the chain's length.
    let mut def = chain(10_000, "src");
    def["nodes"][9_999] = tool_node("n9999", &["src/lib.rs"], &[], &[]);
    def["edges"].as_array_mut().unwrap().pop();
    let errs = errors(&def);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].pointer, "/nodes/9999/writeScope");
    assert!(errs[0]
        .message
        .contains("(\"src\") and \"n9999\" (\"src/lib.rs\")"));
}

#[test]
fn ten_thousand_distinct_scopes_compile_and_one_shared_prefix_is_found() {
    let plan = compile(
        &parallel(10_000, |i| format!("src/m{i}/lib.rs")),
        &grant(&["tool:*"]),
    );
    assert_eq!(plan.unwrap().node_count(), 10_000);
    // One node writing the parent of one of them clashes with that one only.
    let mut def = parallel(10_000, |i| format!("src/m{i}/lib.rs"));
    def["nodes"][5_000]["writeScope"] = json!(["src/m4242"]);
    let errs = errors(&def);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].pointer, "/nodes/5000/writeScope");
    assert!(errs[0].message.contains("\"n4242\" (\"src/m4242/lib.rs\")"));
    // Path boundaries: `src/m1` is not a prefix of `src/m10`.
    let mut def = parallel(100, |i| format!("src/m{i}"));
    def["nodes"][1]["writeScope"] = json!(["src/m1/x"]);
    assert_eq!(errors(&def).len(), 0);
}

/// The rule, pair by pair, as the old compiler checked it: what the fast check must agree with.
fn brute_force_clashes(nodes: &[(Vec<String>, Vec<usize>)]) -> usize {
    let overlaps = |a: &str, b: &str| {
        let under = |x: &str, y: &str| {
            x.len() > y.len() && x.starts_with(y) && (y == "/" || x.as_bytes()[y.len()] == b'/')
        };
        a == "*" || b == "*" || a == b || under(a, b) || under(b, a)
    };
    let n = nodes.len();
    let mut reach = vec![vec![false; n]; n];
    for i in (0..n).rev() {
        for &j in &nodes[i].1 {
            let below = reach[j].clone();
            reach[i][j] = true;
            for (r, b) in reach[i].iter_mut().zip(below) {
                *r |= b;
            }
        }
    }
    let mut clashing = vec![false; n];
    for i in 0..n {
        for j in i + 1..n {
            if reach[i][j] || reach[j][i] {
                continue;
            }
            if nodes[i]
                .0
                .iter()
                .any(|x| nodes[j].0.iter().any(|y| overlaps(x, y)))
            {
                clashing[j] = true;
            }
        }
    }
    clashing.iter().filter(|c| **c).count()
}

#[test]
fn the_fast_overlap_check_agrees_with_the_pairwise_rule() {
    let pool = [
        "*",
        "/",
        "/etc",
        "/etc/x",
        "src",
        "src/a",
        "src/a/b",
        "src/b",
        "srcx",
        "db:users",
        "db:users/1",
        "a//b",
        "a",
    ];
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for round in 0..300 {
        let n = 2 + (next() % 9) as usize;
        // Node i feeds only later nodes (so definition order is a topological order).
        let mut nodes: Vec<(Vec<String>, Vec<usize>)> = Vec::new();
        for i in 0..n {
            let scopes = (0..(next() % 3))
                .map(|_| pool[(next() % pool.len() as u64) as usize].to_string())
                .collect();
            let succ = (i + 1..n).filter(|_| next() % 4 == 0).collect();
            nodes.push((scopes, succ));
        }
        let mut defs = Vec::new();
        let mut edges = Vec::new();
        for (i, (scopes, succ)) in nodes.iter().enumerate() {
            let ins: Vec<String> = (0..i)
                .filter(|p| nodes[*p].1.contains(&i))
                .map(|p| format!("from{p}"))
                .collect();
            let scope: Vec<&str> = scopes.iter().map(String::as_str).collect();
            let ins_ref: Vec<&str> = ins.iter().map(String::as_str).collect();
            let outs: &[&str] = if succ.is_empty() { &[] } else { &["out"] };
            let mut node = tool_node(&format!("n{i}"), &scope, &ins_ref, outs);
            if scope.is_empty() {
                node.as_object_mut().unwrap().remove("writeScope");
            }
            defs.push(node);
            for &j in succ {
                edges.push(json!({"from": {"node": format!("n{i}"), "port": "out"},
                                  "to": {"node": format!("n{j}"), "port": format!("from{i}")}}));
            }
        }
        let def = json!({"graphVersion": 1, "id": "r", "nodes": defs, "edges": edges});
        let errs = errors(&def);
        assert!(
            errs.iter().all(|e| e.code_name() == "writeScopeOverlap"),
            "round {round}: {errs:?}"
        );
        let expected = brute_force_clashes(&nodes);
        assert_eq!(
            errs.is_empty(),
            expected == 0,
            "round {round}: {def} gave {errs:?}, the pairwise rule {expected} clashing node(s)"
        );
    }
}

// ------------------------------------------------------------------ the wire

fn send(conn: &cc_app_server::engine::Connection, id: u64, method: &str, params: Value) {
    conn.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string())
        .unwrap();
}

fn initialize(conn: &cc_app_server::engine::Connection) {
    send(
        conn,
        0,
        "initialize",
        json!({"protocolVersion": 1, "minimumProtocolVersion": 1,
               "client": {"name": "t", "version": "1"}, "features": ["typed_graph", "thread_turn_item"]}),
    );
    let answer: Value =
        serde_json::from_str(&conn.recv(Some(Duration::from_secs(10))).unwrap()).unwrap();
    assert!(answer.get("result").is_some(), "{answer}");
}

/// The answers that arrive, in order, until every id in `want` has been answered.
fn answers(conn: &cc_app_server::engine::Connection, want: &[u64]) -> Vec<(u64, Value)> {
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !want.iter().all(|w| out.iter().any(|(id, _)| id == w)) {
        assert!(Instant::now() < deadline, "answers missing: {out:?}");
        let Ok(text) = conn.recv(Some(Duration::from_secs(120))) else {
            continue;
        };
        let m: Value = serde_json::from_str(&text).unwrap();
        if let Some(id) = m["id"].as_u64() {
            if m.get("method").is_none() {
                out.push((id, m));
            }
        }
    }
    out
}

#[test]
fn a_large_compile_does_not_hold_the_connections_other_requests() {
    let s = open();
    let conn = s.server.connect().unwrap();
    initialize(&conn);
    let big = parallel(10_000, |_| "*".into());
    send(
        &conn,
        1,
        "graph/validate",
        json!({"definition": big, "grant": {"capabilities": ["tool:*"]}}),
    );
    send(&conn, 2, "thread/list", json!({}));
    let got = answers(&conn, &[1, 2]);
    // thread/list is answered first: the compile runs beside the connection, not on it.
    assert_eq!(
        got[0].0,
        2,
        "{:?}",
        got.iter().map(|g| g.0).collect::<Vec<_>>()
    );
    let validate = &got[1].1["result"];
    assert_eq!(validate["valid"], false);
    assert_eq!(validate["errors"].as_array().unwrap().len(), MAX_ERRORS);
    // A small one is answered in order, as before.
    send(
        &conn,
        3,
        "graph/validate",
        json!({"definition": chain(3, "*"), "grant": {"capabilities": ["tool:*"]}}),
    );
    send(&conn, 4, "thread/list", json!({}));
    let got = answers(&conn, &[3, 4]);
    assert_eq!(got[0].0, 3);
    assert_eq!(got[0].1["result"]["valid"], true);
    // A large graph/run/start: started off the connection too, and answered.
    send(
        &conn,
        5,
        "graph/run/start",
        json!({"definition": joins(1_000), "runId": "wide", "inputs": {"x": 1}}),
    );
    send(&conn, 6, "thread/list", json!({}));
    let got = answers(&conn, &[5, 6]);
    assert_eq!(got[0].0, 6);
    let start = &got[1].1;
    assert_eq!(start["result"]["run"]["runId"], "wide", "{start}");
    conn.close();
    s.server.shutdown();
}

#[test]
fn compiles_beyond_the_cap_are_refused_as_busy_and_accepted_again_after() {
    let s = open();
    let graph = s.server.graph();
    let conn = s.server.connect().unwrap();
    initialize(&conn);
    let big = json!({"definition": parallel(2_000, |i| format!("out/{i}")), "grant": {"capabilities": ["tool:*"]}});
    // Every slot taken (as by compiles in flight on other connections): the next is refused.
    let held: Vec<_> = (0..cc_app_server::graph::MAX_CONCURRENT_COMPILES)
        .map(|_| graph.compile_slot().expect("a free slot"))
        .collect();
    assert!(graph.compile_slot().is_none());
    send(&conn, 1, "graph/validate", big.clone());
    let got = answers(&conn, &[1]);
    let err = &got[0].1["error"];
    assert_eq!(err["code"], -32001, "{err}");
    assert_eq!(err["data"]["retry_after_ms"], 500, "{err}");
    assert!(
        err["message"].as_str().unwrap().contains("compiles"),
        "{err}"
    );
    // A small compile runs inline and needs no slot.
    send(
        &conn,
        2,
        "graph/validate",
        json!({"definition": chain(2, "*"), "grant": {"capabilities": ["tool:*"]}}),
    );
    assert_eq!(answers(&conn, &[2])[0].1["result"]["valid"], true);
    // One slot free again: the large one is served.
    drop(held);
    send(&conn, 3, "graph/validate", big);
    assert_eq!(answers(&conn, &[3])[0].1["result"]["valid"], true);
    conn.close();
    s.server.shutdown();
}
