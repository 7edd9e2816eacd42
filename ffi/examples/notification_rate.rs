//! The pure-Rust baseline for the Python notification benchmark (python/bench/run.sh): the same
//! stream of N `item/delta` notifications through `cc_app_server::client::Client`, with no boundary
//! in between — drained from the client's buffer after the turn completed, and read live while the
//! engine produces. Prints one JSON line per measurement.

use cc_app_server::client::{Client, ClientConfig};
use cc_app_server::engine::{AppServer, ServerConfig};
use cc_app_server::rollout::Durability;
use serde_json::json;
use std::time::{Duration, Instant};

fn stream(client: &Client, thread_id: &str, n: usize) {
    let script = json!({"steps": [{"type": "message", "text": "x".repeat(n), "chunks": n}]});
    client
        .request(
            "thread/start",
            json!({"threadId": thread_id, "agentOptions": {"script": script}}),
        )
        .expect("thread/start");
    client
        .request(
            "turn/start",
            json!({"threadId": thread_id, "input": [{"type": "text", "text": "go"}]}),
        )
        .expect("turn/start");
}

fn report(path: &str, mut runs: Vec<(usize, f64)>) {
    // The median of the repeated runs: the machine is shared and noisy.
    runs.sort_by(|a, b| (a.0 as f64 / a.1).total_cmp(&(b.0 as f64 / b.1)));
    let (n, seconds) = runs[runs.len() / 2];
    let per_s: Vec<f64> = runs.iter().map(|(c, t)| (*c as f64 / t).round()).collect();
    println!(
        "{}",
        json!({"path": path, "n": n, "seconds": (seconds * 1e4).round() / 1e4, "per_s": (n as f64 / seconds).round(), "runs_per_s": per_s})
    );
}

/// Reads notifications until `turn/completed`; how many.
fn read_turn(client: &Client) -> usize {
    let mut count = 0;
    while let Ok(message) = client.recv_notification(Duration::from_secs(10)) {
        count += 1;
        if message["method"] == "turn/completed" {
            break;
        }
    }
    count
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let repeat: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(3);
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = ServerConfig::new(dir.path().join("state"));
    config.store_options.durability = Durability::Ephemeral;
    config.limits.outbound_messages = n + 1000;
    let server = AppServer::open(config).expect("server opens");
    let client_config = ClientConfig {
        notification_capacity: n + 1000,
        ..ClientConfig::default()
    };

    let mut runs = Vec::new();
    for i in 0..repeat {
        let client = Client::connect(&server, None, client_config).expect("client");
        let thread_id = format!("drain{i}");
        stream(&client, &thread_id, n);
        loop {
            let resumed = client
                .request("thread/resume", json!({"threadId": thread_id, "limit": 1}))
                .expect("thread/resume");
            if resumed["activeTurn"].is_null() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let started = Instant::now();
        let count = read_turn(&client);
        runs.push((count, started.elapsed().as_secs_f64()));
    }
    report("drain: rust Client::recv_notification", runs);

    let mut runs = Vec::new();
    for i in 0..repeat {
        let client = Client::connect(&server, None, client_config).expect("client");
        let started = Instant::now();
        stream(&client, &format!("live{i}"), n);
        let count = read_turn(&client);
        runs.push((count, started.elapsed().as_secs_f64()));
    }
    report(
        "live: rust Client::recv_notification, engine producing",
        runs,
    );
    server.shutdown();
}
