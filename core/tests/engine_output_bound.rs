//! The bound on what one turn may stream (`Limits::max_turn_output_bytes`, and an item's text
//! bound `MAX_TEXT_CHARS`): a kernel that streams without end is stopped at the bound, what it
//! streamed before is recorded and delivered, and the turn fails as `outputLimitExceeded` — also
//! when the kernel swallows the refusal. Tested at the edge: exactly the bound is accepted, one
//! byte more is refused.

use cc_app_server::client::{Client, ClientConfig};
use cc_app_server::engine::{AppServer, Limits, ServerConfig, EVENT_ENVELOPE_BYTES};
use cc_app_server::kernel::{AgentKernel, KernelError, TurnContext};
use cc_app_server::protocol::{
    AgentMessageItem, ItemContent, ItemDelta, TextDelta, ToolCall, ToolResult, UserInput,
};
use cc_app_server::rollout::{open_store, StoreKind, StoreOptions, MAX_TEXT_CHARS};
use serde_json::{json, Map, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Streams `chunk` repeatedly into one message item, at most `max_chunks` times; counts the
/// deltas the engine accepted. `swallow`: on a refusal, end the turn normally instead.
struct Streamer {
    chunk: String,
    max_chunks: usize,
    swallow: bool,
    accepted: Arc<AtomicUsize>,
    tool_first: bool,
}

impl AgentKernel for Streamer {
    fn run_turn(&self, ctx: &dyn TurnContext, _input: &[UserInput]) -> Result<(), KernelError> {
        if self.tool_first {
            let call = ToolCall {
                tool: "echo".into(),
                arguments: json!({"blob": "b".repeat(4000)}),
            };
            let item = ctx.new_item_id();
            match ctx.request_tool(&item, call) {
                Ok(ToolResult::Ok(_)) => {}
                Ok(other) => return Err(KernelError::Failed(format!("tool: {other:?}"))),
                Err(e) => return Err(e),
            }
        }
        let id = ctx.new_item_id();
        ctx.item_started(ItemContent::AgentMessage(AgentMessageItem {
            id: id.clone(),
            text: String::new(),
            extra: Map::new(),
        }))?;
        for _ in 0..self.max_chunks {
            let delta = ItemDelta::Text(TextDelta {
                text: self.chunk.clone(),
                extra: Map::new(),
            });
            match ctx.item_delta(&id, delta) {
                Ok(()) => {
                    self.accepted.fetch_add(1, Ordering::SeqCst);
                }
                Err(e) if self.swallow => {
                    let _ = e;
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

struct Run {
    error: Value,
    status: String,
    accepted: usize,
    /// Text of the item deltas recorded in the rollout.
    recorded: String,
    /// Text of the item deltas delivered to the host.
    delivered: String,
    /// What each recorded delta cost against the bound (text + envelope allowance).
    costs: Vec<usize>,
}

fn run(limit: usize, kernel: Streamer) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let accepted = Arc::clone(&kernel.accepted);
    let mut config = ServerConfig::new(dir.path());
    config.limits = Limits {
        max_turn_output_bytes: limit,
        ..Limits::default()
    };
    config.policy = cc_app_server::approval::ApprovalPolicy::AutoApprove;
    config.kernel = Arc::new(kernel);
    let server = AppServer::open(config).unwrap();
    let client = Client::connect(
        &server,
        None,
        ClientConfig {
            notification_capacity: 1 << 20,
            ..ClientConfig::default()
        },
    )
    .unwrap();
    let thread = client.request("thread/start", json!({})).unwrap();
    let thread_id = thread["thread"]["id"].as_str().unwrap().to_string();
    client
        .request(
            "turn/start",
            json!({"threadId": thread_id, "input": [{"type": "text", "text": "go"}]}),
        )
        .unwrap();
    let mut delivered = String::new();
    let done = loop {
        let n = client
            .next_notification(Duration::from_secs(60))
            .expect("the turn ends");
        match n["method"].as_str() {
            Some("item/delta") => {
                delivered.push_str(n["params"]["delta"]["text"].as_str().unwrap_or(""))
            }
            Some("turn/completed") => break n,
            _ => {}
        }
    };
    client.close();
    server.shutdown();
    drop(server);
    let store = open_store(StoreKind::Jsonl, dir.path(), StoreOptions::default()).unwrap();
    let mut recorded = String::new();
    let mut costs = Vec::new();
    for e in store.read(&thread_id, 0, usize::MAX).unwrap().events {
        if e.payload["type"] == "itemDelta" {
            recorded.push_str(e.payload["delta"]["text"].as_str().unwrap_or(""));
            let text = e.payload["delta"]["text"].as_str().unwrap_or("");
            costs.push(text.len() + EVENT_ENVELOPE_BYTES);
        }
    }
    Run {
        error: done["params"]["error"].clone(),
        status: done["params"]["turn"]["status"]
            .as_str()
            .unwrap()
            .to_string(),
        accepted: accepted.load(Ordering::SeqCst),
        recorded,
        delivered,
        costs,
    }
}

fn streamer(chunk: &str, max_chunks: usize) -> Streamer {
    Streamer {
        chunk: chunk.into(),
        max_chunks,
        swallow: false,
        accepted: Arc::default(),
        tool_first: false,
    }
}

#[test]
fn an_endless_stream_stops_at_the_bound_and_keeps_what_came_before() {
    let r = run(64 * 1024, streamer(&"x".repeat(1000), 1_000_000));
    assert_eq!(r.status, "failed");
    assert_eq!(r.error["code"], "outputLimitExceeded", "{}", r.error);
    assert!(
        r.error["message"].as_str().unwrap().contains("65536"),
        "{}",
        r.error
    );
    // Each 1000-byte delta costs its text plus the envelope allowance.
    let each = 1000 + EVENT_ENVELOPE_BYTES;
    assert_eq!(r.accepted, 64 * 1024 / each);
    assert_eq!(
        r.recorded.len(),
        r.accepted * 1000,
        "what was accepted is recorded"
    );
    assert_eq!(r.delivered, r.recorded, "and delivered");
}

#[test]
fn exactly_the_bound_is_accepted_one_byte_more_is_refused() {
    let probe = run(1 << 20, streamer(&"y".repeat(1000), 10));
    assert_eq!(probe.status, "completed", "{}", probe.error);
    let exact: usize = probe.costs.iter().sum();
    let ok = run(exact, streamer(&"y".repeat(1000), 10));
    assert_eq!(ok.status, "completed", "{}", ok.error);
    assert_eq!(ok.recorded.len(), 10_000);
    let over = run(exact - 1, streamer(&"y".repeat(1000), 10));
    assert_eq!(over.status, "failed");
    assert_eq!(over.error["code"], "outputLimitExceeded");
    assert_eq!(over.accepted, 9);
    assert_eq!(over.recorded.len(), 9_000);
}

/// Tiny deltas cost their envelope too: the bound holds the rollout's growth, not only the text.
#[test]
fn tiny_deltas_are_bounded_by_what_they_write() {
    let r = run(64 * 1024, streamer("t", 1_000_000));
    assert_eq!(r.error["code"], "outputLimitExceeded");
    assert!(
        r.accepted < 64 * 1024 / EVENT_ENVELOPE_BYTES,
        "{}",
        r.accepted
    );
}

#[test]
fn a_kernel_that_swallows_the_refusal_still_fails_as_over_the_bound() {
    let mut k = streamer(&"z".repeat(1000), 1000);
    k.swallow = true;
    let r = run(8_000, k);
    assert_eq!(r.status, "failed");
    assert_eq!(r.error["code"], "outputLimitExceeded");
    assert!(r.accepted > 0 && r.costs.iter().sum::<usize>() <= 8_000);
}

#[test]
fn tool_results_count_against_the_bound() {
    // The echo tool's result repeats its 4,000-byte argument: with a 4,000-byte bound the tool
    // runs, its result (over 4,000 bytes) is recorded, and the turn stops before streaming
    // anything.
    let mut k = streamer("w", 10);
    k.tool_first = true;
    let r = run(4_000, k);
    assert_eq!(r.status, "failed");
    assert_eq!(r.error["code"], "outputLimitExceeded");
    assert_eq!(r.accepted, 0);
    // With room for it, the same turn completes.
    let mut k = streamer("w", 10);
    k.tool_first = true;
    let r = run(64 * 1024, k);
    assert_eq!(r.status, "completed", "{}", r.error);
}

#[test]
fn one_item_may_not_stream_more_characters_than_the_rollout_keeps() {
    // Under a large byte bound, one item's text stops at MAX_TEXT_CHARS characters, so the
    // item can still be completed and recorded whole.
    let chunk = "é".repeat(100_000); // 200,000 bytes, 100,000 characters
    let r = run(64 << 20, streamer(&chunk, 100));
    assert_eq!(r.status, "failed");
    assert_eq!(r.error["code"], "outputLimitExceeded");
    assert_eq!(r.accepted, MAX_TEXT_CHARS / 100_000);
    assert_eq!(r.recorded.chars().count(), MAX_TEXT_CHARS);
}
