//! Validation cost per message, and parse + validate throughput over the shared valid fixtures.
//!
//! Run: `cargo bench -p cc-agent-protocol --bench validate -- --measurement-time 3 --warm-up-time 1`
//! (results are recorded in docs/bench/validation.md).

mod common;

use cc_agent_protocol::{validate_protocol_definition, validate_protocol_message};
use common::typical;
use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use serde_json::Value;
use std::path::Path;

fn check(value: &Value, definition: Option<&str>) -> bool {
    match definition {
        Some(name) => validate_protocol_definition(name, value).is_ok(),
        None => validate_protocol_message(value).is_ok(),
    }
}

/// Every valid fixture as compact JSON text: (text, definition name for definition fixtures).
fn valid_fixture_batch() -> Vec<(String, Option<String>)> {
    fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("fixtures folder") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "json") {
                out.push(path);
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/valid");
    let mut paths = Vec::new();
    walk(&root, &mut paths);
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).expect("fixture text");
            let value: Value = serde_json::from_str(&text).expect("valid fixtures parse");
            if path.parent().is_some_and(|p| p.ends_with("definitions")) {
                let name = value["definition"]
                    .as_str()
                    .expect("definition name")
                    .to_string();
                (value["value"].to_string(), Some(name))
            } else {
                (value.to_string(), None)
            }
        })
        .collect()
}

fn per_message(c: &mut Criterion) {
    let mut group = c.benchmark_group("validate");
    for (name, value, definition) in typical() {
        assert!(check(&value, definition), "{name} must be valid");
        group.throughput(Throughput::Elements(1));
        group.bench_function(name, |b| b.iter(|| check(black_box(&value), definition)));
    }
    group.finish();
}

fn batch(c: &mut Criterion) {
    let batch = valid_fixture_batch();
    let bytes: usize = batch.iter().map(|(text, _)| text.len()).sum();
    let run = |batch: &[(String, Option<String>)]| {
        let mut ok = 0usize;
        for (text, definition) in batch {
            let value: Value = serde_json::from_str(black_box(text)).expect("parses");
            ok += usize::from(check(&value, definition.as_deref()));
        }
        ok
    };
    assert_eq!(run(&batch), batch.len(), "every valid fixture validates");
    let mut group = c.benchmark_group("parse_validate_valid_fixtures");
    group.throughput(Throughput::Bytes(bytes as u64));
    group.bench_function("bytes", |b| b.iter(|| run(&batch)));
    group.throughput(Throughput::Elements(batch.len() as u64));
    group.bench_function("messages", |b| b.iter(|| run(&batch)));
    group.finish();
}

criterion_group!(benches, per_message, batch);
criterion_main!(benches);
