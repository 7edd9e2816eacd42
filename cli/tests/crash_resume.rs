//! SIGKILL of the stdio server mid-turn, restart on the same state directory, resume: nothing the
//! client was told about (every notification it received) is lost, the cut-off turn is closed
//! with evidence, no tool ran without approval, and the rollout verifies — for both stores.

mod common;

use common::*;
use serde_json::{json, Value};
use std::path::Path;

/// Maps a notification to the rollout event type it announces.
fn event_type(method: &str) -> &'static str {
    match method {
        "turn/started" => "turnStarted",
        "item/started" => "itemStarted",
        "item/delta" => "itemDelta",
        "item/completed" => "itemCompleted",
        "tool/requested" => "toolRequested",
        "tool/result" => "toolResult",
        "approval/requested" => "approvalRequested",
        "approval/resolved" => "approvalResolved",
        "turn/completed" => "turnCompleted",
        other => panic!("unexpected notification {other}"),
    }
}

fn crash_and_resume(store: &str) {
    let dir = state_dir();
    let path = dir.path().to_str().unwrap().to_string();
    let args = ["--store", store];
    let mut p = Proc::serve(dir.path(), &args);
    p.init();
    // Thread "r": a turn that streams, then hangs; killed while running.
    p.req("thread/start", json!({"threadId": "r", "agentOptions": {"script": {"steps": [{"type": "message", "text": "partial answer", "chunks": 3}, {"type": "sleep", "ms": 60000}]}}}));
    let turn = p.req(
        "turn/start",
        json!({"threadId": "r", "input": [{"type": "text", "text": "go"}]}),
    );
    let turn_id = turn["result"]["turn"]["id"].as_str().unwrap().to_string();
    p.wait(|m| m["method"] == "item/completed" && m["params"]["threadId"] == "r");
    // Thread "a": killed while waiting for an approval nobody gave.
    p.req(
        "thread/start",
        json!({"threadId": "a", "agentOptions": {"script": tool_script()}}),
    );
    p.req(
        "turn/start",
        json!({"threadId": "a", "input": [{"type": "text", "text": "go"}]}),
    );
    p.wait_method("approval/decide");
    let acknowledged: Vec<Value> = p
        .seen
        .drain(..)
        .filter(|m| m["params"]["eventSeq"].is_u64())
        .collect();
    assert!(acknowledged.len() >= 8, "{acknowledged:?}");
    p.sigkill();

    let mut p = Proc::serve(dir.path(), &args);
    p.init();
    let mut resumed = std::collections::HashMap::new();
    for thread in ["r", "a"] {
        let r = p.req("thread/resume", json!({"threadId": thread, "limit": 1000}));
        assert_eq!(r["result"]["activeTurn"], Value::Null, "{r}");
        let events = r["result"]["events"].as_array().unwrap().clone();
        let last = events.last().unwrap();
        assert_eq!(last["payload"]["type"], "turnCompleted", "{last}");
        assert_eq!(last["payload"]["status"], "failed");
        assert_eq!(last["payload"]["error"]["code"], "serverRestarted");
        for pair in events.windows(2) {
            assert_eq!(pair[1]["prevHash"], pair[0]["hash"]);
            assert_eq!(pair[1]["seq"], pair[0]["seq"].as_u64().unwrap() + 1);
        }
        resumed.insert(thread, events);
    }
    for n in &acknowledged {
        let thread = n["params"]["threadId"].as_str().unwrap();
        let seq = n["params"]["eventSeq"].as_u64().unwrap();
        let event = resumed[thread]
            .iter()
            .find(|e| e["seq"] == seq)
            .unwrap_or_else(|| panic!("acknowledged {thread} seq {seq} was lost: {n}"));
        assert_eq!(
            event["payload"]["type"],
            event_type(n["method"].as_str().unwrap()),
            "{n} vs {event}"
        );
    }
    let r_events = &resumed["r"];
    assert!(r_events
        .iter()
        .any(|e| e["payload"]["turnId"] == turn_id.as_str()));
    // The unapproved tool never ran.
    assert!(!resumed["a"]
        .iter()
        .any(|e| e["payload"]["type"] == "toolResult" && e["payload"]["result"]["status"] == "ok"));
    // The thread goes on after the crash.
    let next = p.req(
        "turn/start",
        json!({"threadId": "a", "input": [{"type": "text", "text": "again"}]}),
    );
    assert!(next.get("result").is_some(), "{next}");
    p.close_stdin();
    assert!(p.wait_exit(TIMEOUT).success(), "{}", p.stderr());

    let (rc, out, err) = run(&["rollout", "verify", "--state-dir", &path]);
    assert_eq!(rc, 0, "{out}{err}");
    if store == "jsonl" {
        independent_verify(dir.path(), "r");
    }
}

/// The stdlib-only Python verifier agrees, when python3 and the script are available.
fn independent_verify(dir: &Path, thread: &str) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/verify_rollout.py");
    if !script.is_file() {
        return;
    }
    let Ok(out) = std::process::Command::new("python3")
        .arg(&script)
        .arg(dir.join("threads").join(format!("{thread}.jsonl")))
        .arg(dir.join("anchors").join(format!("{thread}.head")))
        .output()
    else {
        return;
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn sigkill_mid_turn_then_resume_loses_nothing_acknowledged_jsonl() {
    crash_and_resume("jsonl");
}

#[test]
fn sigkill_mid_turn_then_resume_loses_nothing_acknowledged_sqlite() {
    crash_and_resume("sqlite");
}
