//! Generation time: building the model from the schema and writing each language's files.
//! Run: `cargo bench -p cc-agent-protocol --bench generate -- --measurement-time 3 --warm-up-time 1`

use cc_agent_protocol::codegen::{generate_all, kotlin, model, python, rust, swift, typescript};
use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;

fn generation(c: &mut Criterion) {
    let schema = cc_agent_protocol::schema();
    let m = model::build(schema);
    let mut g = c.benchmark_group("generate");
    g.bench_function("model", |b| b.iter(|| model::build(black_box(schema))));
    g.bench_function("rust", |b| b.iter(|| rust::generate(black_box(&m))));
    g.bench_function("typescript", |b| {
        b.iter(|| typescript::generate(black_box(&m)))
    });
    g.bench_function("python", |b| b.iter(|| python::generate(black_box(&m))));
    g.bench_function("kotlin", |b| b.iter(|| kotlin::generate(black_box(&m))));
    g.bench_function("swift", |b| b.iter(|| swift::generate(black_box(&m))));
    g.bench_function("all", |b| b.iter(|| generate_all(black_box(schema))));
    g.finish();
}

criterion_group!(benches, generation);
criterion_main!(benches);
