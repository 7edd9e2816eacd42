//! Crash-test child for graph runs: opens a server on a state directory, starts (or, after a
//! crash, re-joins) one run of a graph full of effects, and prints every node and run state it
//! is told about (each only after its event is durable), so a parent can SIGKILL it anywhere
//! and check that nothing acknowledged was lost and no effect ran twice.
//!
//! Its tool executor keeps a ledger file: one fsynced line per applied idempotency key (the
//! application itself), `DUP <key>` if it is ever asked to apply a key again, and it answers
//! reconciliation from the ledger.
//!
//! Usage: `graph-crash-child <jsonl|sqlite> <state-dir> <ledger-file> <run-id>`
//! Prints `ready`, then `N <seq> <node> <status>` / `R <seq> <status>` lines, then
//! `done <status>`.

use cc_app_server::approval::ApprovalPolicy;
use cc_app_server::client::{Client, ClientConfig};
use cc_app_server::engine::{AppServer, ServerConfig};
use cc_app_server::graph::{current_effect, EffectReconciler, Reconciliation};
use cc_app_server::kernel::ToolExecutor;
use cc_app_server::protocol::{ToolCall, ToolResult, ToolResultOk};
use cc_app_server::rollout::StoreKind;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

struct Ledger {
    file: Mutex<(std::fs::File, HashMap<String, Value>)>,
}

impl Ledger {
    fn open(path: &str) -> Ledger {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let mut applied = HashMap::new();
        for line in text.lines() {
            // A line cut by the kill was never applied.
            if let Some(rest) = line.strip_prefix("A ") {
                if let Some((key, json)) = rest.split_once(' ') {
                    if let Ok(v) = serde_json::from_str(json) {
                        applied.insert(key.to_string(), v);
                    }
                }
            }
        }
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .expect("open the ledger");
        // A line the kill cut short is ended here, so the next line starts on its own (it would
        // otherwise be glued to the torn one and read as that key's).
        if !text.is_empty() && !text.ends_with('\n') {
            file.write_all(b"\n").expect("end the torn ledger line");
        }
        Ledger {
            file: Mutex::new((file, applied)),
        }
    }
}

impl ToolExecutor for Ledger {
    fn execute(&self, _thread: &str, call: &ToolCall) -> ToolResult {
        let key = current_effect().map_or_else(|| "no-key".to_string(), |e| e.idempotency_key);
        let mut g = self.file.lock().unwrap();
        if let Some(v) = g.1.get(&key).cloned() {
            g.0.write_all(format!("DUP {key}\n").as_bytes()).unwrap();
            g.0.sync_data().unwrap();
            return ToolResult::Ok(ToolResultOk { output: v });
        }
        let output = json!({"tool": call.tool, "args": call.arguments});
        // The application: one whole line in one write (`writeln!` on a file is several writes,
        // and a kill between them leaves a torn line), made durable before the result is
        // returned.
        g.0.write_all(format!("A {key} {output}\n").as_bytes())
            .unwrap();
        g.0.sync_data().unwrap();
        g.1.insert(key, output.clone());
        ToolResult::Ok(ToolResultOk { output })
    }
}

impl EffectReconciler for Ledger {
    fn reconcile(&self, _run: &str, key: &str, _call: &ToolCall) -> Reconciliation {
        match self.file.lock().unwrap().1.get(key) {
            Some(v) => Reconciliation::Applied(ToolResult::Ok(ToolResultOk { output: v.clone() })),
            None => Reconciliation::NotApplied,
        }
    }
}

/// Seven effects: four tool nodes, a tool call inside an agent's turn, a loop of three.
fn definition() -> Value {
    let port = |n: &str, t: &str| json!({"name": n, "type": t});
    let edge = |f: (&str, &str), t: (&str, &str)| {
        let end = |(n, p): (&str, &str)| {
            if n.is_empty() {
                json!({"port": p})
            } else {
                json!({"node": n, "port": p})
            }
        };
        json!({"from": end(f), "to": end(t)})
    };
    let tool = |id: &str, input: (&str, &str), out: &str, scope: &str| {
        json!({"kind": "tool", "id": id, "tool": "step", "arguments": {"name": id},
               "inputs": [port(input.0, input.1)], "outputs": [port(out, "object")], "writeScope": [scope]})
    };
    json!({
        "graphVersion": 1, "id": "crash", "inputs": [port("seed", "integer")], "outputs": [port("out", "object")],
        "nodes": [
            tool("t1", ("seed", "integer"), "r", "a"),
            {"kind": "agent", "id": "a1", "inputs": [port("r", "object")], "outputs": [port("x", "text")],
             "agentOptions": {"script": {"steps": [
                 {"type": "tool", "tool": "step", "arguments": {"name": "a1-inner"}},
                 {"type": "message", "text": "agent done"}]}}},
            tool("t2", ("x", "text"), "r", "b"),
            tool("t3", ("x", "text"), "r", "c"),
            {"kind": "join", "id": "j", "inputs": [port("a", "object"), port("b", "object")], "outputs": [port("o", "object")]},
            {"kind": "loop", "id": "l", "maxIterations": 3, "inputs": [port("o", "object")], "outputs": [port("o", "object")],
             "body": {"nodes": [tool("t4", ("o", "object"), "o", "d")],
                      "edges": [edge(("", "o"), ("t4", "o")), edge(("t4", "o"), ("", "o"))]}}
        ],
        "edges": [
            edge(("", "seed"), ("t1", "seed")), edge(("t1", "r"), ("a1", "r")),
            edge(("a1", "x"), ("t2", "x")), edge(("a1", "x"), ("t3", "x")),
            edge(("t2", "r"), ("j", "a")), edge(("t3", "r"), ("j", "b")),
            edge(("j", "o"), ("l", "o")), edge(("l", "o"), ("", "out"))
        ]
    })
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 5 {
        eprintln!("usage: graph-crash-child <jsonl|sqlite> <state-dir> <ledger-file> <run-id>");
        std::process::exit(2);
    }
    let ledger = Arc::new(Ledger::open(&args[3]));
    let mut config = ServerConfig::new(&args[2]);
    config.store = if args[1] == "sqlite" {
        StoreKind::Sqlite
    } else {
        StoreKind::Jsonl
    };
    config.policy = ApprovalPolicy::AutoApprove;
    config.tools = ledger.clone();
    let server = AppServer::open(config).expect("open the server");
    server.graph().set_reconciler(ledger);
    let client = Client::connect(&server, None, ClientConfig::default()).expect("connect");
    // The same params every time: a run that exists already is joined, not started again.
    let started = client
        .request(
            "graph/run/start",
            json!({"runId": args[4], "definition": definition(), "inputs": {"seed": 1},
                   "grant": {"capabilities": ["agent", "tool:*"]},
                   "options": {"workers": [{"id": "w", "capacity": 2}], "leaseMs": 600000}}),
        )
        .expect("graph/run/start");
    let out = std::io::stdout();
    let mut out = out.lock();
    writeln!(out, "ready").unwrap();
    out.flush().unwrap();
    let mut status = started["run"]["status"]
        .as_str()
        .unwrap_or("running")
        .to_string();
    while status == "running" {
        let Some(n) = client.next_notification(Duration::from_secs(120)) else {
            eprintln!("graph-crash-child: no notification for 120 s");
            std::process::exit(3);
        };
        let p = &n["params"];
        match n["method"].as_str() {
            Some("graph/event") if p["type"] == "nodeUpdated" => writeln!(
                out,
                "N {} {} {}",
                p["eventSeq"],
                p["node"]["key"].as_str().unwrap_or(""),
                p["node"]["status"].as_str().unwrap_or("")
            )
            .unwrap(),
            Some("graph/event") if p["type"] == "runUpdated" => {
                status = p["run"]["status"].as_str().unwrap_or("").to_string();
                writeln!(out, "R {} {status}", p["eventSeq"]).unwrap();
            }
            _ => continue,
        }
        out.flush().unwrap();
    }
    writeln!(out, "done {status}").unwrap();
    out.flush().unwrap();
    drop(client);
    server.shutdown();
}
