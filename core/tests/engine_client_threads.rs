//! The Rust client runs the host's approval handler on at most `approval_workers` threads: a
//! handler that hangs costs those threads, never one per approval (before the fix every
//! approval/decide spawned a thread, and a hung handler kept each one forever), and every
//! approval it cannot decide in time is declined at its deadline. Thread counts come from /proc;
//! one test per process so no other test's threads blur them.

use cc_app_server::client::{ApprovalHandler, Client, ClientConfig};
use cc_app_server::engine::{AppServer, Limits, ServerConfig};
use cc_app_server::protocol::{ApprovalDecision, ApprovalRequest};
use serde_json::json;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

fn os_threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// Blocks every decision until released.
struct Hung {
    released: Mutex<bool>,
    cv: Condvar,
}

impl ApprovalHandler for Hung {
    fn decide(&self, _params: &ApprovalRequest) -> Result<ApprovalDecision, String> {
        let mut r = self.released.lock().unwrap();
        while !*r {
            r = self.cv.wait(r).unwrap();
        }
        Err("released".into())
    }
}

#[test]
fn a_hung_approval_handler_costs_a_bounded_number_of_threads() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = ServerConfig::new(dir.path());
    config.limits = Limits {
        max_running_turns: 4,
        ..Limits::default()
    };
    config.store_options.durability = cc_app_server::rollout::Durability::Buffered;
    let server = AppServer::open(config).unwrap();
    let hung = Arc::new(Hung {
        released: Mutex::new(false),
        cv: Condvar::new(),
    });
    let client_config = ClientConfig {
        approval_timeout: Duration::from_millis(100),
        approval_workers: 2,
        ..ClientConfig::default()
    };
    let client = Client::connect(&server, Some(hung.clone()), client_config).unwrap();
    let baseline = os_threads();
    let script = json!({"steps": [{"type": "tool", "tool": "fs.write", "arguments": {"n": 1}}]});
    const TURNS: usize = 24;
    for i in 0..TURNS {
        let id = format!("t{i}");
        client
            .request(
                "thread/start",
                json!({"threadId": id, "agentOptions": {"script": script}}),
            )
            .unwrap();
        client
            .request(
                "turn/start",
                json!({"threadId": id, "input": [{"type": "text", "text": "go"}]}),
            )
            .unwrap();
    }
    let mut peak = os_threads();
    let (mut completed, mut declined) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(60);
    while completed < TURNS {
        assert!(
            Instant::now() < deadline,
            "{completed} of {TURNS} turns ended"
        );
        peak = peak.max(os_threads());
        let Some(n) = client.next_notification(Duration::from_millis(50)) else {
            continue;
        };
        match n["method"].as_str() {
            Some("approval/resolved") => {
                assert_eq!(n["params"]["outcome"], "declined", "{n}");
                declined += 1;
            }
            Some("turn/completed") => {
                assert_eq!(n["params"]["turn"]["status"], "completed", "{n}");
                completed += 1;
            }
            _ => {}
        }
    }
    assert_eq!(
        declined, TURNS,
        "each approval was declined at its deadline"
    );
    assert_eq!(server.stats_snapshot().tools_executed, 0);
    // 2 approval threads and at most 4 turn runners, whatever the number of approvals.
    assert!(
        peak <= baseline + 2 + 4,
        "threads grew with approvals: {baseline} before, peak {peak}"
    );
    *hung.released.lock().unwrap() = true;
    hung.cv.notify_all();
}
