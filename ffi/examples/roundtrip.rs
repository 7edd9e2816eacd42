//! The pure-Rust baseline for the FFI round-trip benchmark (ffi/bench/run.sh): the same request
//! through `cc_app_server::client::Client` with no boundary in between. Prints one JSON line.

use cc_app_server::client::{Client, ClientConfig};
use cc_app_server::engine::{AppServer, ServerConfig};
use cc_app_server::rollout::Durability;
use serde_json::json;
use std::time::Instant;

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20_000);
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = ServerConfig::new(dir.path().join("state"));
    config.store_options.durability = Durability::Buffered;
    let server = AppServer::open(config).expect("server opens");
    let client = Client::connect(&server, None, ClientConfig::default()).expect("client");
    client
        .request("thread/start", json!({"threadId": "bench"}))
        .expect("thread/start");
    let params = json!({"limit": 1});
    let mut samples = Vec::with_capacity(n);
    for i in 0..n + n / 10 {
        let t = Instant::now();
        client
            .request("thread/list", params.clone())
            .expect("thread/list");
        if i >= n / 10 {
            samples.push(t.elapsed().as_nanos() as u64);
        }
    }
    samples.sort_unstable();
    let mean = samples.iter().sum::<u64>() / samples.len() as u64;
    println!(
        "{}",
        json!({"path": "rust Client::request", "n": n, "p50_ns": samples[n / 2], "p90_ns": samples[n * 9 / 10], "mean_ns": mean})
    );
    drop(client);
    server.shutdown();
}
