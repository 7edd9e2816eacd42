//! The Graph IR compiler (`cc_app_server::graph::compile`) on hostile definitions: the input is
//! a GraphDefinition as JSON (a schema fixture's `{"definition", "value"}` wrapper is unwrapped,
//! so schema/fixtures seed it), or, when it is not JSON, bytes a small generator turns into a
//! definition that passes the schema — nodes of every kind, nested bodies, edges between random
//! ports, write scopes from a pool that overlap on purpose — so the rules behind the schema are
//! reached too. Invariants, beyond "never panics":
//! - at most `MAX_ERRORS` errors, each with a message of at most 1,024 characters and, for every
//!   rule past the schema, a pointer that resolves in the definition;
//! - the verdict is deterministic (a second compile gives the same errors or the same digest);
//! - an accepted plan is within its bounds: at most `MAX_NODES` nodes, every body's order a
//!   permutation of its members in which every edge goes forward, every edge index in range.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use cc_app_server::graph::plan::{End, MAX_NODES};
use cc_app_server::graph::{compile, grant, MAX_ERRORS};
use cc_app_server::protocol::GraphRunGrant;
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};

const PORTS: &[&str] = &["in", "out", "x", "y", "done", "result"];
const TYPES: &[&str] = &[
    "text", "json", "number", "integer", "boolean", "object", "array",
];
const SCOPES: &[&str] = &[
    "*",
    "/",
    "/etc",
    "src",
    "src/",
    "./src",
    "src/a",
    "src/a/b",
    "srcx",
    "db:users",
    "a//b",
    "..",
    "a/../b",
    "./",
    ".",
    "docs/graph.md",
];
const TOOLS: &[&str] = &["write_file", "run_command", "fs.read", "t"];
const GRANTS: &[&[&str]] = &[
    &["agent", "tool:*"],
    &["*"],
    &["agent"],
    &["tool:fs.*"],
    &[],
];

fn pick<'a>(u: &mut Unstructured, pool: &[&'a str]) -> arbitrary::Result<&'a str> {
    Ok(pool[u.choose_index(pool.len())?])
}

fn ports(u: &mut Unstructured) -> arbitrary::Result<Value> {
    let n = u.int_in_range(0..=3)?;
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(json!({"name": pick(u, PORTS)?, "type": pick(u, TYPES)?}));
    }
    Ok(Value::Array(out))
}

fn end(u: &mut Unstructured, ids: &[String]) -> arbitrary::Result<Value> {
    let port = pick(u, PORTS)?;
    Ok(if ids.is_empty() || u.ratio(1, 4)? {
        json!({"port": port})
    } else {
        json!({"node": ids[u.choose_index(ids.len())?], "port": port})
    })
}

/// A body: nodes (containers with bodies of their own, `depth` levels down) and edges.
fn body(u: &mut Unstructured, depth: u32) -> arbitrary::Result<Value> {
    let n = u.int_in_range(0..=if depth == 0 { 10 } else { 4 })?;
    let mut nodes = Vec::new();
    let mut ids = Vec::new();
    for i in 0..n {
        let id = if u.ratio(1, 12)? && i > 0 {
            format!("n{}", i - 1)
        } else {
            format!("n{i}")
        };
        let kind = u.int_in_range(0..=4u8)?;
        let mut node = json!({"id": id, "inputs": ports(u)?, "outputs": ports(u)?});
        match kind {
            0 | 1 => {
                node["kind"] = json!(if kind == 0 { "agent" } else { "tool" });
                if kind == 1 {
                    node["tool"] = json!(pick(u, TOOLS)?);
                }
                if u.arbitrary()? {
                    let k = u.int_in_range(0..=3)?;
                    let mut scope = Vec::new();
                    for _ in 0..k {
                        scope.push(pick(u, SCOPES)?);
                    }
                    node["writeScope"] = json!(scope);
                }
                if u.ratio(1, 4)? {
                    node["capabilities"] = json!([pick(u, &["agent", "tool:x", "net"])?]);
                }
                if u.ratio(1, 4)? {
                    node["budgets"] = json!({"maxSteps": u.int_in_range(1..=200u32)?});
                }
            }
            2 => node["kind"] = json!("join"),
            _ if depth < 3 => {
                node["kind"] = json!(if kind == 3 { "loop" } else { "subgraph" });
                node["body"] = body(u, depth + 1)?;
                if kind == 3 {
                    if u.ratio(3, 4)? {
                        node["maxIterations"] = json!(u.int_in_range(1..=10_000u32)?);
                    }
                    if u.arbitrary()? {
                        node["until"] = json!(pick(u, PORTS)?);
                    }
                }
            }
            _ => node["kind"] = json!("join"),
        }
        ids.push(id);
        nodes.push(node);
    }
    let mut edges = Vec::new();
    for _ in 0..u.int_in_range(0..=2 * n + 1)? {
        edges.push(json!({"from": end(u, &ids)?, "to": end(u, &ids)?}));
    }
    Ok(json!({"nodes": nodes, "edges": edges}))
}

fn generated(data: &[u8]) -> Option<(Value, GraphRunGrant)> {
    let mut u = Unstructured::new(data);
    let caps = GRANTS[u.choose_index(GRANTS.len()).ok()?];
    let mut g = grant(caps);
    if u.ratio(1, 4).ok()? {
        g.budgets = Some(cc_app_server::protocol::GraphBudgets {
            max_steps: Some(u.int_in_range(1..=100u64).ok()?),
            max_tokens: None,
            max_wall_time_ms: None,
            max_effects: None,
        });
    }
    let mut def = body(&mut u, 0).ok()?;
    def["graphVersion"] = json!(1);
    def["id"] = json!("fuzz");
    def["inputs"] = ports(&mut u).ok()?;
    def["outputs"] = ports(&mut u).ok()?;
    // Unused bytes pick nothing; a bool is cheap entropy for the definition's own budget.
    if bool::arbitrary(&mut u).unwrap_or(false) {
        def["budgets"] = json!({"maxSteps": 50});
    }
    Some((def, g))
}

fn check(definition: &Value, g: &GraphRunGrant) {
    let first = compile(definition, g);
    match &first {
        Err(errors) => {
            assert!(!errors.is_empty(), "refused without an error");
            assert!(errors.len() <= MAX_ERRORS, "{} errors", errors.len());
            for e in errors {
                assert!(
                    e.message.chars().count() <= 1024,
                    "a message of {} characters",
                    e.message.chars().count()
                );
                if e.code_name() != "schemaInvalid" {
                    assert!(
                        definition.pointer(&e.pointer).is_some(),
                        "pointer {:?} of {e} does not resolve in {definition}",
                        e.pointer
                    );
                }
            }
        }
        Ok(plan) => {
            assert!(plan.node_count() <= MAX_NODES);
            assert!(plan.digest.starts_with("sha256:") && plan.digest.len() == 71);
            for (s, scope) in plan.scopes.iter().enumerate() {
                let mut members: Vec<usize> = (0..plan.nodes.len())
                    .filter(|&n| plan.nodes[n].scope == s)
                    .collect();
                let mut order = scope.nodes.clone();
                let position = |n: usize| order.iter().position(|&m| m == n);
                for e in &scope.edges {
                    if let (End::Node(a, pa), End::Node(b, pb)) = (e.from, e.to) {
                        assert!(
                            pa < plan.nodes[a].outputs.len() && pb < plan.nodes[b].inputs.len()
                        );
                        assert!(
                            position(a) < position(b),
                            "an edge goes backwards in the topological order"
                        );
                    }
                }
                order.sort_unstable();
                members.sort_unstable();
                assert_eq!(order, members, "a body's order is not its members");
            }
        }
    }
    let second = compile(definition, g);
    match (&first, &second) {
        (Ok(a), Ok(b)) => assert_eq!(a.digest, b.digest),
        (Err(a), Err(b)) => assert_eq!(a, b, "the errors moved between two compiles"),
        _ => panic!("the verdict moved between two compiles"),
    }
}

fuzz_target!(|data: &[u8]| {
    let parsed = std::str::from_utf8(data)
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(t).ok());
    match parsed {
        Some(mut v) => {
            // A schema fixture: its value is the definition.
            if v.get("definition").and_then(Value::as_str) == Some("GraphDefinition") {
                if let Some(inner) = v.get_mut("value") {
                    v = inner.take();
                }
            }
            check(&v, &grant(&["agent", "tool:*"]));
        }
        None => {
            if let Some((def, g)) = generated(data) {
                check(&def, &g);
            }
        }
    }
});
