//! Every compiler rule, each with a definition it refuses (code and JSON pointer checked) and a
//! near neighbour it accepts; plus the plan digest.

use cc_app_server::graph::{compile, grant, CompileError};
use cc_app_server::protocol::{GraphBudgets, GraphRunGrant};
use serde_json::{json, Value};

fn all() -> GraphRunGrant {
    grant(&["agent", "tool:*"])
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

fn agent(id: &str, inputs: &[(&str, &str)], outputs: &[(&str, &str)]) -> Value {
    json!({"kind": "agent", "id": id,
           "inputs": inputs.iter().map(|(n, t)| port(n, t)).collect::<Vec<_>>(),
           "outputs": outputs.iter().map(|(n, t)| port(n, t)).collect::<Vec<_>>()})
}

fn tool(id: &str, inputs: &[(&str, &str)], outputs: &[(&str, &str)], scope: &[&str]) -> Value {
    let mut t = agent(id, inputs, outputs);
    t["kind"] = json!("tool");
    t["tool"] = json!("write_file");
    if !scope.is_empty() {
        t["writeScope"] = json!(scope);
    }
    t
}

/// x → a → y.
fn base() -> Value {
    json!({
        "graphVersion": 1, "id": "g",
        "inputs": [port("x", "text")], "outputs": [port("y", "text")],
        "nodes": [agent("a", &[("in", "text")], &[("out", "text")])],
        "edges": [edge((None, "x"), (Some("a"), "in")), edge((Some("a"), "out"), (None, "y"))]
    })
}

fn errors(def: &Value, grant: &GraphRunGrant) -> Vec<CompileError> {
    match compile(def, grant) {
        Ok(_) => Vec::new(),
        Err(e) => e,
    }
}

/// Refused with `code` at `pointer` (among possibly other errors).
#[track_caller]
fn refused(def: &Value, grant: &GraphRunGrant, code: &str, pointer: &str) {
    let errs = errors(def, grant);
    assert!(
        errs.iter()
            .any(|e| e.code_name() == code && e.pointer == pointer),
        "expected {code} at {pointer:?}, got {errs:#?}"
    );
    for e in &errs {
        assert!(!e.message.is_empty() && e.message.len() <= 1024);
        if !e.pointer.is_empty() {
            assert!(
                def.pointer(&e.pointer).is_some(),
                "pointer {:?} does not resolve",
                e.pointer
            );
        }
    }
}

#[track_caller]
fn accepted(def: &Value, grant: &GraphRunGrant) {
    let errs = errors(def, grant);
    assert!(errs.is_empty(), "expected to compile, got {errs:#?}");
}

#[test]
fn the_base_graph_compiles() {
    let plan = compile(&base(), &all()).unwrap();
    assert_eq!(plan.node_count(), 1);
    assert!(plan.digest.starts_with("sha256:") && plan.digest.len() == 71);
}

#[test]
fn schema_invalid() {
    let mut d = base();
    d["graphVersion"] = json!(2);
    refused(&d, &all(), "schemaInvalid", "/graphVersion");
    let mut d = base();
    d["nodes"][0]["maxIteration"] = json!(3); // a typo on a strict object
    refused(&d, &all(), "schemaInvalid", "/nodes/0");
    let mut d = base();
    d["nodes"][0]["id"] = json!("../etc");
    refused(&d, &all(), "schemaInvalid", "/nodes/0/id");
    accepted(&base(), &all());
}

#[test]
fn duplicate_ids_and_ports() {
    let mut d = base();
    d["nodes"]
        .as_array_mut()
        .unwrap()
        .push(agent("a", &[], &[]));
    refused(&d, &all(), "duplicateId", "/nodes/1/id");
    let mut d = base();
    d["nodes"][0]["inputs"]
        .as_array_mut()
        .unwrap()
        .push(port("in", "json"));
    refused(&d, &all(), "duplicateId", "/nodes/0/inputs/1/name");
    let mut d = base();
    d["outputs"].as_array_mut().unwrap().push(port("y", "text"));
    refused(&d, &all(), "duplicateId", "/outputs/1/name");
    // The same id in two different bodies is fine.
    let mut d = base();
    d["nodes"]
        .as_array_mut()
        .unwrap()
        .push(json!({"kind": "subgraph", "id": "s",
        "body": {"nodes": [agent("a", &[], &[])]}}));
    accepted(&d, &all());
}

#[test]
fn dangling_node_refs() {
    let mut d = base();
    d["edges"][1]["from"]["node"] = json!("zz");
    refused(&d, &all(), "danglingNode", "/edges/1/from/node");
    // Inside a body, the pointer goes into the body.
    let d = json!({"graphVersion": 1, "id": "g", "nodes": [{"kind": "subgraph", "id": "s", "body": {
        "nodes": [agent("a", &[], &[("o", "text")])],
        "edges": [edge((Some("a"), "o"), (Some("b"), "i"))]}}]});
    refused(&d, &all(), "danglingNode", "/nodes/0/body/edges/0/to/node");
    accepted(&base(), &all());
}

#[test]
fn dangling_port_refs() {
    let mut d = base();
    d["edges"][0]["to"]["port"] = json!("nope");
    refused(&d, &all(), "danglingPort", "/edges/0/to/port");
    let mut d = base();
    d["edges"][0]["from"]["port"] = json!("nope");
    refused(&d, &all(), "danglingPort", "/edges/0/from/port");
    let d = json!({"graphVersion": 1, "id": "g", "nodes": [{"kind": "loop", "id": "l", "maxIterations": 3,
        "until": "stop", "outputs": [port("done", "boolean")],
        "body": {"nodes": [agent("a", &[], &[("d", "boolean")])], "edges": [edge((Some("a"), "d"), (None, "done"))]}}]});
    refused(&d, &all(), "danglingPort", "/nodes/0/until");
    let mut ok = d.clone();
    ok["nodes"][0]["until"] = json!("done");
    accepted(&ok, &all());
}

#[test]
fn port_type_mismatches() {
    let mut d = base();
    d["nodes"][0]["inputs"][0]["type"] = json!("integer");
    refused(&d, &all(), "portTypeMismatch", "/edges/0");
    // integer → number and anything → json are fine.
    let ok = json!({"graphVersion": 1, "id": "g", "nodes": [
        agent("a", &[], &[("n", "integer"), ("t", "text")]),
        agent("b", &[("n", "number"), ("t", "json")], &[])],
        "edges": [edge((Some("a"), "n"), (Some("b"), "n")), edge((Some("a"), "t"), (Some("b"), "t"))]});
    accepted(&ok, &all());
    let mut bad = ok.clone();
    bad["nodes"][1]["inputs"][0]["type"] = json!("integer");
    bad["nodes"][0]["outputs"][0]["type"] = json!("number");
    refused(&bad, &all(), "portTypeMismatch", "/edges/0");
    // A loop's until must be boolean, and what it carries must fit its inputs.
    let lp = json!({"graphVersion": 1, "id": "g", "nodes": [{"kind": "loop", "id": "l", "maxIterations": 3,
        "until": "done", "inputs": [port("n", "integer")], "outputs": [port("done", "text"), port("n", "text")],
        "body": {"nodes": [agent("a", &[("n", "integer")], &[("d", "text"), ("n", "text")])],
                 "edges": [edge((None, "n"), (Some("a"), "n")), edge((Some("a"), "d"), (None, "done")), edge((Some("a"), "n"), (None, "n"))]}}]});
    refused(&lp, &all(), "portTypeMismatch", "/nodes/0/until");
    refused(&lp, &all(), "portTypeMismatch", "/nodes/0/outputs/1");
}

#[test]
fn an_input_takes_one_edge() {
    let mut d = base();
    d["edges"]
        .as_array_mut()
        .unwrap()
        .push(edge((None, "x"), (Some("a"), "in")));
    refused(&d, &all(), "inputMultiplyFed", "/edges/2/to");
    // One output may feed many inputs.
    let ok = json!({"graphVersion": 1, "id": "g", "inputs": [port("x", "text")], "nodes": [
        agent("a", &[("i", "text")], &[]), agent("b", &[("i", "text")], &[])],
        "edges": [edge((None, "x"), (Some("a"), "i")), edge((None, "x"), (Some("b"), "i"))]});
    accepted(&ok, &all());
}

#[test]
fn cycles_only_through_loops() {
    let cyclic = json!({"graphVersion": 1, "id": "g", "nodes": [
        agent("a", &[("i", "text")], &[("o", "text")]), agent("b", &[("i", "text")], &[("o", "text")])],
        "edges": [edge((Some("a"), "o"), (Some("b"), "i")), edge((Some("b"), "o"), (Some("a"), "i"))]});
    refused(&cyclic, &all(), "cycleOutsideLoop", "/edges/0");
    // The same repetition as a bounded loop compiles.
    let looped = json!({"graphVersion": 1, "id": "g", "nodes": [{"kind": "loop", "id": "l", "maxIterations": 5,
        "inputs": [port("v", "text")], "outputs": [port("v", "text")],
        "body": {"nodes": [agent("a", &[("i", "text")], &[("o", "text")]), agent("b", &[("i", "text")], &[("o", "text")])],
                 "edges": [edge((None, "v"), (Some("a"), "i")), edge((Some("a"), "o"), (Some("b"), "i")), edge((Some("b"), "o"), (None, "v"))]}}],
        "inputs": [port("v", "text")], "edges": [edge((None, "v"), (Some("l"), "v"))]});
    accepted(&looped, &all());
}

#[test]
fn loops_need_a_bound() {
    let mut d = json!({"graphVersion": 1, "id": "g", "nodes": [{"kind": "loop", "id": "l",
        "body": {"nodes": [agent("a", &[], &[])]}}]});
    refused(&d, &all(), "loopUnbounded", "/nodes/0");
    d["nodes"][0]["maxIterations"] = json!(10000);
    accepted(&d, &all());
    d["nodes"][0]["maxIterations"] = json!(10001);
    refused(&d, &all(), "schemaInvalid", "/nodes/0/maxIterations");
}

#[test]
fn capabilities_must_be_granted() {
    refused(
        &base(),
        &grant(&["tool:*"]),
        "capabilityNotGranted",
        "/nodes/0",
    );
    let mut d = base();
    d["nodes"][0]["capabilities"] = json!(["net:example.com"]);
    refused(
        &d,
        &all(),
        "capabilityNotGranted",
        "/nodes/0/capabilities/0",
    );
    accepted(&d, &grant(&["agent", "net:*"]));
    accepted(&d, &grant(&["*"]));
    let t = json!({"graphVersion": 1, "id": "g", "nodes": [tool("w", &[], &[], &[])]});
    refused(
        &t,
        &grant(&["tool:read_file"]),
        "capabilityNotGranted",
        "/nodes/0",
    );
    accepted(&t, &grant(&["tool:write_file"]));
    // Nothing is granted unless listed.
    refused(&t, &grant(&[]), "capabilityNotGranted", "/nodes/0");
}

#[test]
fn budgets_may_not_exceed_the_runs() {
    let budgets = |steps: u64| GraphBudgets {
        max_steps: Some(steps),
        max_tokens: None,
        max_wall_time_ms: None,
        max_effects: None,
    };
    let run = GraphRunGrant {
        capabilities: vec!["agent".into()],
        budgets: Some(budgets(5)),
    };
    let mut d = base();
    d["nodes"][0]["budgets"] = json!({"maxSteps": 6});
    refused(&d, &run, "budgetExceedsRun", "/nodes/0/budgets/maxSteps");
    d["nodes"][0]["budgets"] = json!({"maxSteps": 5});
    accepted(&d, &run);
    // The definition's own budgets are bounded by the grant's too…
    let mut d = base();
    d["budgets"] = json!({"maxSteps": 50});
    refused(&d, &run, "budgetExceedsRun", "/budgets/maxSteps");
    // …and are the run's budgets when the grant says nothing.
    d["nodes"][0]["budgets"] = json!({"maxSteps": 51});
    refused(&d, &all(), "budgetExceedsRun", "/nodes/0/budgets/maxSteps");
    d["nodes"][0]["budgets"] = json!({"maxSteps": 50});
    accepted(&d, &all());
}

#[test]
fn concurrent_write_scopes_may_not_overlap() {
    let parallel = |a: &str, b: &str| json!({"graphVersion": 1, "id": "g", "nodes": [tool("w1", &[], &[], &[a]), tool("w2", &[], &[], &[b])]});
    refused(
        &parallel("src", "src/a.rs"),
        &all(),
        "writeScopeOverlap",
        "/nodes/1/writeScope",
    );
    refused(
        &parallel("db:users", "db:users"),
        &all(),
        "writeScopeOverlap",
        "/nodes/1/writeScope",
    );
    accepted(&parallel("src", "docs"), &all());
    accepted(&parallel("src", "srcx"), &all());
    // Ordered by an edge, they never run at the same time.
    let ordered = json!({"graphVersion": 1, "id": "g", "nodes": [
        tool("w1", &[], &[("r", "json")], &["src"]), tool("w2", &[("r", "json")], &[], &["src/a.rs"])],
        "edges": [edge((Some("w1"), "r"), (Some("w2"), "r"))]});
    accepted(&ordered, &all());
    // A container counts with everything inside it.
    let nested = json!({"graphVersion": 1, "id": "g", "nodes": [
        tool("w1", &[], &[], &["src"]),
        {"kind": "subgraph", "id": "s", "body": {"nodes": [tool("w2", &[], &[], &["src/lib.rs"])]}}]});
    refused(&nested, &all(), "writeScopeOverlap", "/nodes/1");
}

#[test]
fn write_scope_entries_must_name_something() {
    let d = json!({"graphVersion": 1, "id": "g", "nodes": [tool("w", &[], &[], &["src/../etc"])]});
    refused(&d, &all(), "writeScopeInvalid", "/nodes/0/writeScope/0");
    let d = json!({"graphVersion": 1, "id": "g", "nodes": [tool("w", &[], &[], &["./"])]});
    refused(&d, &all(), "writeScopeInvalid", "/nodes/0/writeScope/0");
    let d = json!({"graphVersion": 1, "id": "g", "nodes": [tool("w", &[], &[], &["./src/"])]});
    accepted(&d, &all());
}

#[test]
fn unreachable_nodes() {
    let mut d = base();
    d["nodes"]
        .as_array_mut()
        .unwrap()
        .push(agent("b", &[("i", "text")], &[("o", "text")]));
    d["nodes"]
        .as_array_mut()
        .unwrap()
        .push(agent("c", &[("i", "text")], &[]));
    d["edges"]
        .as_array_mut()
        .unwrap()
        .push(edge((Some("b"), "o"), (Some("c"), "i")));
    refused(&d, &all(), "unreachableNode", "/nodes/1");
    refused(&d, &all(), "unreachableNode", "/nodes/2");
    d["edges"]
        .as_array_mut()
        .unwrap()
        .push(edge((Some("a"), "out"), (Some("b"), "i")));
    accepted(&d, &all());
}

#[test]
fn outputs_must_be_filled() {
    let mut d = base();
    d["outputs"].as_array_mut().unwrap().push(port("z", "json"));
    refused(&d, &all(), "outputNotConnected", "/outputs/1");
    d["edges"]
        .as_array_mut()
        .unwrap()
        .push(edge((Some("a"), "out"), (None, "z")));
    accepted(&d, &all());
    // A container's body must fill the container's outputs.
    let s = json!({"graphVersion": 1, "id": "g", "nodes": [{"kind": "subgraph", "id": "s",
        "outputs": [port("o", "text")], "body": {"nodes": [agent("a", &[], &[])]}}]});
    refused(&s, &all(), "outputNotConnected", "/nodes/0/outputs/0");
}

#[test]
fn kind_specific_ports() {
    let join = |outputs: Value| {
        json!({"graphVersion": 1, "id": "g", "inputs": [port("x", "text")], "nodes": [
            {"kind": "join", "id": "j", "inputs": [port("a", "text")], "outputs": outputs}],
            "edges": [edge((None, "x"), (Some("j"), "a"))]})
    };
    refused(
        &join(json!([port("o", "text")])),
        &all(),
        "invalidPorts",
        "/nodes/0",
    );
    refused(
        &join(json!([port("o", "object"), port("p", "object")])),
        &all(),
        "invalidPorts",
        "/nodes/0",
    );
    accepted(&join(json!([port("o", "object")])), &all());
    accepted(&join(json!([port("o", "array")])), &all());
    let j = json!({"graphVersion": 1, "id": "g", "nodes": [{"kind": "join", "id": "j", "outputs": [port("o", "object")]}]});
    refused(&j, &all(), "invalidPorts", "/nodes/0");
    // A tool's several outputs take members of its result.
    let t = json!({"graphVersion": 1, "id": "g", "nodes": [tool("t", &[], &[("a", "json"), ("b", "json")], &[])]});
    accepted(&t, &all());
}

fn nested(depth: usize) -> Value {
    let mut body = json!({"nodes": [agent("leaf", &[], &[])]});
    for i in 0..depth {
        body = json!({"nodes": [{"kind": "subgraph", "id": format!("s{i}"), "body": body}]});
    }
    json!({"graphVersion": 1, "id": "g", "nodes": body["nodes"]})
}

#[test]
fn too_large() {
    accepted(&nested(8), &all());
    let d = nested(9);
    let errs = errors(&d, &all());
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert_eq!(errs[0].code_name(), "tooLarge");
    assert!(errs[0].pointer.ends_with("/body"), "{errs:?}");
    // 10,000 nodes across bodies compile; one more is refused.
    let many = |n: usize| {
        (0..n)
            .map(|i| agent(&format!("n{i}"), &[], &[]))
            .collect::<Vec<_>>()
    };
    let ok = json!({"graphVersion": 1, "id": "g", "nodes": [
        {"kind": "subgraph", "id": "s1", "body": {"nodes": many(5000)}},
        {"kind": "subgraph", "id": "s2", "body": {"nodes": many(4998)}}]});
    assert_eq!(compile(&ok, &all()).unwrap().node_count(), 10_000);
    let mut over = ok.clone();
    over["nodes"][1]["body"]["nodes"] = json!(many(4999));
    refused(&over, &all(), "tooLarge", "/nodes/1/body/nodes/4998");
}

#[test]
fn the_digest_is_of_the_canonical_form() {
    let a = compile(&base(), &all()).unwrap().digest;
    // Same definition, members in another order and pretty-printed: same digest.
    let text = serde_json::to_string_pretty(&base()).unwrap();
    let reordered: Value = serde_json::from_str(&text.replace("\"graphVersion\": 1,", "")).unwrap();
    let mut reordered = reordered;
    reordered["graphVersion"] = json!(1);
    assert_eq!(compile(&reordered, &all()).unwrap().digest, a);
    // Any semantic change moves it; the grant does not.
    let mut changed = base();
    changed["nodes"][0]["prompt"] = json!("hi");
    assert_ne!(compile(&changed, &all()).unwrap().digest, a);
    assert_eq!(compile(&base(), &grant(&["*"])).unwrap().digest, a);
}

#[test]
fn every_rule_reports_all_its_errors_in_order() {
    let mut d = base();
    d["edges"][0]["to"]["node"] = json!("zz");
    d["edges"][1]["from"]["node"] = json!("yy");
    let errs = errors(&d, &all());
    let ptrs: Vec<&str> = errs.iter().map(|e| e.pointer.as_str()).collect();
    assert_eq!(ptrs, ["/edges/0/to/node", "/edges/1/from/node"]);
}

#[test]
fn a_definition_nests_at_most_62_levels() {
    let nest = |levels: usize| {
        let mut v = json!(1);
        for _ in 0..levels {
            v = json!([v]);
        }
        v
    };
    // The definition (1) → nodes (2) → node (3) → agentOptions (4) → script (5…).
    let at = |levels: usize| {
        let mut d = base();
        d["nodes"][0]["agentOptions"] = json!({"script": nest(levels)});
        d
    };
    accepted(&at(58), &all());
    let errs = errors(&at(59), &all());
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert_eq!(
        (errs[0].code_name().as_str(), errs[0].pointer.as_str()),
        ("tooLarge", "")
    );
}
