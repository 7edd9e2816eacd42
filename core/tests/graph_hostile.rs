//! Graphs written to hurt: tool calls a run does not grant (from a tool node or from an agent's
//! model), write scopes that must reach the tool executor (and its refusals recorded), and
//! definitions built to make the compiler quadratic — 10,000 parallel nodes that all write `*`,
//! a 10,000-node chain, 10,000 distinct scopes — which must compile with the right verdict
//! without holding a connection's other requests behind them.

use cc_app_server::approval::ApprovalPolicy;
use cc_app_server::engine::{AppServer, ServerConfig};
use cc_app_server::graph::{grant, StartRequest};
use cc_app_server::kernel::ToolExecutor;
use cc_app_server::protocol::{ToolCall, ToolResult, ToolResultDenied, ToolResultOk};
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Records every call with the write scope it arrived with (`None`: plain `execute`), and
/// refuses, as a symlink-resolving executor would, a path with a `link` segment.
#[derive(Default)]
struct Recording {
    calls: Mutex<Vec<(String, Value, Option<Vec<String>>)>>,
}

impl Recording {
    fn calls(&self) -> Vec<(String, Value, Option<Vec<String>>)> {
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

fn run(s: &Server, id: &str, def: Value, caps: &[&str]) -> cc_app_server::protocol::GraphRunSummary {
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
    let def = json!({"graphVersion": 1, "id": "g", "nodes": [tool("w", "docs/a.md", &["./docs/"])]});
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
    let mut a = agent_calling("a", "write_file", json!({"path": "src/x.rs", "content": "y"}));
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
    let def = json!({"graphVersion": 1, "id": "g", "nodes": [tool("w", "docs/link/a.md", &["docs"])]});
    let summary = run(&s, "refused", def, &["tool:*"]);
    assert_eq!(status(&summary), "failed");
    assert_eq!(summary.error.as_ref().unwrap().code, "toolDenied");
    let st = s.server.graph().state("refused").unwrap();
    let effect = st.effects.values().next().expect("the call was an effect");
    assert_eq!(effect.applied, Some(false));
    let receipt = serde_json::to_value(st.effect_state(effect, true)).unwrap();
    assert_eq!(receipt["receipt"]["result"]["status"], "denied", "{receipt}");
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
