//! Graph Kernel benchmarks: a 10,000-node run end to end (compile, schedule, reduce, append
//! durably) next to the raw append rate of the same store, measured in the same process on the
//! same events and batch count, so the difference is what the runtime adds. Shapes: a chain
//! (every node waits for the previous one: one durable batch per node) and a layered DAG (100
//! layers of 100: wide batches). Nodes are joins, so no kernel or tool time is in the figures:
//! what is measured is scheduling, messages, the reducer and the log.
//!
//! Run: `cargo bench -p cc-app-server --bench graph` (`-- quick` for 1,000 nodes, one round).

use cc_app_server::approval::ApprovalPolicy;
use cc_app_server::engine::{AppServer, ServerConfig};
use cc_app_server::graph::{grant, store::for_each_event, StartRequest};
use cc_app_server::rollout::{
    open_store, Durability, NewEvent, StoreKind, StoreOptions, ThreadStart,
};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn port(name: &str, ty: &str) -> Value {
    json!({"name": name, "type": ty})
}

fn join(id: &str) -> Value {
    json!({"kind": "join", "id": id, "inputs": [port("in", "json")], "outputs": [port("out", "object")]})
}

fn edge(from: (Option<&str>, &str), to: (Option<&str>, &str)) -> Value {
    let end = |(n, p): (Option<&str>, &str)| match n {
        Some(n) => json!({"node": n, "port": p}),
        None => json!({"port": p}),
    };
    json!({"from": end(from), "to": end(to)})
}

/// `width` chains of `depth` joins each, fed by the run's input (each join wraps its input
/// once, so `depth` stays under the 64 levels a value may nest).
fn layered(depth: usize, width: usize) -> Value {
    let mut nodes = Vec::new();
    let mut edges = Vec::new();
    for w in 0..width {
        for d in 0..depth {
            let id = format!("n{w}x{d}");
            nodes.push(join(&id));
            if d == 0 {
                edges.push(edge((None, "x"), (Some(&id), "in")));
            } else {
                edges.push(edge(
                    (Some(&format!("n{w}x{}", d - 1)), "out"),
                    (Some(&id), "in"),
                ));
            }
        }
    }
    json!({"graphVersion": 1, "id": "bench", "inputs": [port("x", "json")], "nodes": nodes, "edges": edges})
}

/// A chain of `n` subgraphs, each passing its input straight through its body's boundary to
/// its output while a join inside consumes a copy: 2n nodes that must run one after another,
/// with values that do not grow.
fn chain(n: usize) -> Value {
    let mut nodes = Vec::new();
    let mut edges = Vec::new();
    for i in 0..n {
        let id = format!("s{i}");
        nodes.push(json!({"kind": "subgraph", "id": id, "inputs": [port("in", "json")], "outputs": [port("out", "json")],
            "body": {"nodes": [join("j")], "edges": [edge((None, "in"), (None, "out")), edge((None, "in"), (Some("j"), "in"))]}}));
        if i == 0 {
            edges.push(edge((None, "x"), (Some(&id), "in")));
        } else {
            edges.push(edge(
                (Some(&format!("s{}", i - 1)), "out"),
                (Some(&id), "in"),
            ));
        }
    }
    json!({"graphVersion": 1, "id": "chain", "inputs": [port("x", "json")], "nodes": nodes, "edges": edges})
}

struct Figures {
    nodes: usize,
    run: Duration,
    start: Duration,
    events: u64,
    commits: u64,
    raw: Duration,
}

fn once(kind: StoreKind, durability: Durability, def: &Value, nodes: usize) -> Figures {
    let dir = tempfile::tempdir().unwrap();
    let mut config = ServerConfig::new(dir.path().join("server"));
    config.store = kind;
    config.store_options.durability = durability;
    config.policy = ApprovalPolicy::AutoApprove;
    let server = AppServer::open(config).unwrap();
    let graph = server.graph();
    let mut req = StartRequest::new(def.clone(), grant(&[]));
    req.run_id = Some("bench".into());
    req.inputs.insert("x".into(), json!({"seed": 1}));
    let t = Instant::now();
    graph.start(req).unwrap();
    let start = t.elapsed();
    let summary = graph.wait("bench", Duration::from_secs(3600)).unwrap();
    let run = t.elapsed();
    assert_eq!(serde_json::to_value(&summary.status).unwrap(), "succeeded");
    assert_eq!(summary.nodes.succeeded as usize, nodes);
    let stats = graph.run_stats("bench").unwrap();
    // The floor: the same payloads, appended to a fresh store of the same kind and durability
    // in the same number of batches.
    let mut payloads = Vec::new();
    for_each_event(&*graph.store().unwrap(), "bench", |e| {
        if e.seq > 1 {
            payloads.push(e.payload.clone());
        }
    })
    .unwrap();
    server.shutdown();
    drop(server);
    let options = StoreOptions {
        durability,
        ..StoreOptions::default()
    };
    let raw_store = open_store(kind, &dir.path().join("raw"), options).unwrap();
    raw_store
        .start(ThreadStart {
            thread_id: "raw".into(),
            ..Default::default()
        })
        .unwrap();
    let per = payloads
        .len()
        .div_ceil(stats.commits.max(1) as usize)
        .max(1);
    let batches: Vec<Vec<NewEvent>> = payloads
        .chunks(per)
        .map(|c| c.iter().cloned().map(NewEvent::new).collect())
        .collect();
    let t = Instant::now();
    for b in batches {
        raw_store.append("raw", b).unwrap();
    }
    raw_store.flush().unwrap();
    let raw = t.elapsed();
    Figures {
        nodes,
        run,
        start,
        events: stats.events_appended,
        commits: stats.commits,
        raw,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let quick = std::env::args().any(|a| a == "quick");
    // Other arguments (cargo's own flags aside) select cases by substring: `sqlite`, `chain`…
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "quick" && !a.starts_with('-'))
        .map(|a| a.to_lowercase())
        .collect();
    let (depth, width, rounds) = if quick { (50, 20, 1) } else { (50, 200, 3) };
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "graph bench: {} node(s) per run, {rounds} round(s) per case, load average {}",
        depth * width,
        load.split(' ').take(3).collect::<Vec<_>>().join(" ")
    );
    // The compiler alone on each definition (schema check, rules, plan, digest).
    for (name, def) in [
        ("chain", chain(depth * width / 2)),
        ("layered", layered(depth, width)),
    ] {
        let t: Vec<f64> = (0..rounds.max(3))
            .map(|_| {
                let t = Instant::now();
                cc_app_server::graph::compile(&def, &grant(&[])).unwrap();
                t.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        println!(
            "compile {name} ({} nodes): {:.0} ms",
            depth * width,
            median(t)
        );
    }
    let cases = [
        (
            format!("chain of {} subgraphs", depth * width / 2),
            chain(depth * width / 2),
        ),
        (format!("layered {depth}x{width}"), layered(depth, width)),
    ];
    for (store, durability) in [
        (StoreKind::Jsonl, Durability::Sync),
        (StoreKind::Jsonl, Durability::Buffered),
        (StoreKind::Sqlite, Durability::Sync),
    ] {
        for (name, def) in &cases {
            let label = format!("{store:?}/{durability:?} {name}").to_lowercase();
            if !filters.iter().all(|f| label.contains(f.as_str())) {
                continue;
            }
            let nodes = depth * width;
            let runs: Vec<Figures> = (0..rounds)
                .map(|_| once(store, durability, def, nodes))
                .collect();
            // The run after its start (compiling and recording the 10k-node definition) is
            // what is compared with the raw appends of the same events.
            let sched = |f: &Figures| (f.run - f.start).as_secs_f64();
            let ev_s = median(runs.iter().map(|f| f.events as f64 / sched(f)).collect());
            let raw_s = median(
                runs.iter()
                    .map(|f| f.events as f64 / f.raw.as_secs_f64())
                    .collect(),
            );
            let extra = median(
                runs.iter()
                    .map(|f| (sched(f) - f.raw.as_secs_f64()) / f.nodes as f64 * 1e6)
                    .collect(),
            );
            let all = median(
                runs.iter()
                    .map(|f| sched(f) / f.nodes as f64 * 1e6)
                    .collect(),
            );
            let start = median(runs.iter().map(|f| f.start.as_secs_f64() * 1e3).collect());
            let f = &runs[0];
            println!(
                "{store:?}/{durability:?} {name}: start {start:.0} ms; {} events in {} appends; graph {ev_s:.0} events/s, raw append {raw_s:.0} events/s (raw/graph x{:.2}); {all:.1} µs/node, of which {extra:.1} µs beyond the appends",
                f.events,
                f.commits,
                raw_s / ev_s
            );
        }
    }
}
