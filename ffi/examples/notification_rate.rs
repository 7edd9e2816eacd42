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

fn rate(path: &str, n: usize, seconds: f64) {
    println!(
        "{}",
        json!({"path": path, "n": n, "seconds": (seconds * 1e4).round() / 1e4, "per_s": (n as f64 / seconds).round()})
    );
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(100_000);
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = ServerConfig::new(dir.path().join("state"));
    config.store_options.durability = Durability::Ephemeral;
    config.limits.outbound_messages = n + 1000;
    let server = AppServer::open(config).expect("server opens");
    let client_config = ClientConfig {
        notification_capacity: n + 1000,
        ..ClientConfig::default()
    };

    let client = Client::connect(&server, None, client_config).expect("client");
    stream(&client, "drain", n);
    loop {
        let resumed = client
            .request("thread/resume", json!({"threadId": "drain", "limit": 1}))
            .expect("thread/resume");
        if resumed["activeTurn"].is_null() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let idle = Duration::from_millis(200);
    let started = Instant::now();
    let mut count = 0;
    while client.recv_notification(idle).is_ok() {
        count += 1;
    }
    rate(
        "drain: rust Client::recv_notification",
        count,
        (started.elapsed() - idle).as_secs_f64(),
    );
    drop(client);

    let client = Client::connect(&server, None, client_config).expect("client");
    let started = Instant::now();
    stream(&client, "live", n);
    let mut count = 0;
    while let Ok(message) = client.recv_notification(Duration::from_secs(10)) {
        count += 1;
        if message["method"] == "turn/completed" {
            break;
        }
    }
    rate(
        "live: rust Client::recv_notification, engine producing",
        count,
        started.elapsed().as_secs_f64(),
    );
    drop(client);
    server.shutdown();
}
