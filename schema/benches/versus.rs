//! The runtime validator against the general engine it replaced (`jsonschema` 0.61, now the test
//! oracle), side by side in one process: for each typical message, rounds alternate between the
//! two (the order flips every round), each round timing a block of calls, and the medians of the
//! rounds are compared. Both answer the bare schema question for the message's own definition
//! (`schema_verdict`, no report built), so the engines are compared, not the dispatch around them.
//!
//! Run: `cargo bench -p cc-agent-protocol --bench versus` (figures in docs/bench/validation.md).

mod common;

use cc_agent_protocol::validate::schema_verdict;
use cc_agent_protocol::{validate_protocol_message, MessageKind};
use serde_json::Value;
use std::hint::black_box;
use std::time::{Duration, Instant};

const ROUNDS: usize = 31;
const CALLS: u32 = 2_000;

fn per_call(f: &dyn Fn() -> bool) -> Duration {
    let t = Instant::now();
    for _ in 0..CALLS {
        assert!(black_box(f()));
    }
    t.elapsed() / CALLS
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let schema = cc_agent_protocol::schema();
    println!(
        "{:<26} {:>12} {:>12} {:>7}",
        "message", "ours", "jsonschema", "ratio"
    );
    for (name, value, definition) in common::typical() {
        let def = match definition {
            Some(d) => d.to_string(),
            None => match validate_protocol_message(&value).expect("a valid message") {
                MessageKind::ClientRequest { definition, .. }
                | MessageKind::ServerRequest { definition, .. }
                | MessageKind::Notification { definition, .. } => definition,
                MessageKind::Response => "ClientResponse".to_string(),
            },
        };
        let mut wrapper = schema.clone();
        let obj = wrapper.as_object_mut().expect("an object");
        obj.remove("oneOf");
        obj.insert("$ref".into(), Value::from(format!("#/$defs/{def}")));
        let oracle = jsonschema::draft202012::new(&wrapper).expect("the schema compiles");
        let ours = || schema_verdict(Some(&def), &value) == Some(true);
        let theirs = || oracle.is_valid(&value);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            if round % 2 == 0 {
                a.push(per_call(&ours));
                b.push(per_call(&theirs));
            } else {
                b.push(per_call(&theirs));
                a.push(per_call(&ours));
            }
        }
        let (a, b) = (median(&mut a), median(&mut b));
        println!(
            "{name:<26} {:>9.0} ns {:>9.0} ns {:>6.2}x",
            a.as_nanos() as f64,
            b.as_nanos() as f64,
            a.as_secs_f64() / b.as_secs_f64()
        );
    }
}
