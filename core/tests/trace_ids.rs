//! Trace and parent ids on rollout events (docs/rollout-format.md, "Trace and parent ids"): a
//! host's W3C traceparent reaches every event its request caused, each event names the one that
//! caused it, so a turn's causal tree is rebuilt from the rollout alone; forks keep their
//! source's trace. Real stores in temp dirs, the real approval gate, the Rust client.

use cc_app_server::client::{ApprovalHandler, Client, ClientConfig, ClientError};
use cc_app_server::engine::{AppServer, ServerConfig};
use cc_app_server::protocol::{AcceptOnce, ApprovalDecision, ApprovalRequest};
use cc_app_server::rollout::{
    HeaderExtra, NewEvent, RolloutStore, StoreKind, StoredEvent, ThreadStart,
};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const SPAN: &str = "00f067aa0ba902b7";

fn traceparent(trace: &str, span: &str) -> String {
    format!("00-{trace}-{span}-01")
}

struct Accept;
impl ApprovalHandler for Accept {
    fn decide(&self, _: &ApprovalRequest) -> Result<ApprovalDecision, String> {
        Ok(ApprovalDecision::AcceptOnce(AcceptOnce {}))
    }
}

fn open(dir: &std::path::Path, kind: StoreKind) -> AppServer {
    let mut config = ServerConfig::new(dir);
    config.store = kind;
    AppServer::open(config).unwrap()
}

fn client(server: &AppServer) -> Client {
    Client::connect(server, Some(Arc::new(Accept)), ClientConfig::default()).unwrap()
}

fn tool_script() -> Value {
    json!({"steps": [{"type": "tool", "tool": "fs.write", "arguments": {"path": "a.txt"}},
                     {"type": "message", "text": "done", "chunks": 3}]})
}

fn until_completed(client: &Client) -> Value {
    loop {
        let n = client
            .next_notification(Duration::from_secs(20))
            .expect("notifications keep coming");
        if n["method"] == "turn/completed" {
            return n;
        }
    }
}

fn all_events(server: &AppServer, thread: &str) -> Vec<StoredEvent> {
    server.store().read(thread, 0, 4096).unwrap().events
}

fn parent_seq(e: &StoredEvent) -> Option<u64> {
    let p = e.parent_id.as_deref()?;
    p.bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| p.parse().unwrap())
}

/// Follows parent ids from `from` up to the first event whose parent is not a seq.
fn chain<'a>(events: &'a [StoredEvent], from: &'a StoredEvent) -> Vec<&'a StoredEvent> {
    let by_seq: HashMap<u64, &StoredEvent> = events.iter().map(|e| (e.seq, e)).collect();
    let mut out = vec![from];
    let mut at = from;
    while let Some(p) = parent_seq(at) {
        assert!(p < at.seq, "seq {} names a later parent {p}", at.seq);
        at = by_seq[&p];
        out.push(at);
    }
    out
}

#[test]
fn a_tool_turn_with_an_approval_chains_back_to_its_start() {
    for kind in [StoreKind::Jsonl, StoreKind::Sqlite] {
        let dir = tempfile::tempdir().unwrap();
        let server = open(dir.path(), kind);
        let c = client(&server);
        let thread_trace = "0af7651916cd43dd8448eb211c80319c";
        c.request(
            "thread/start",
            json!({"threadId": "t", "agentOptions": {"script": tool_script()},
                   "traceparent": traceparent(thread_trace, "b7ad6b7169203331")}),
        )
        .unwrap();
        let turn = c
            .request(
                "turn/start",
                json!({"threadId": "t", "input": [{"type": "text", "text": "go"}],
                       "traceparent": traceparent(TRACE, SPAN)}),
            )
            .unwrap();
        let done = until_completed(&c);
        assert_eq!(done["params"]["turn"]["status"], "completed", "{done}");
        let turn_id = turn["turn"]["id"].as_str().unwrap();
        let events = all_events(&server, "t");
        // The header is thread/start's: its trace, its caller's span.
        assert_eq!(events[0].trace_id.as_deref(), Some(thread_trace));
        assert_eq!(
            events[0].parent_id.as_deref(),
            Some("span:b7ad6b7169203331")
        );
        let started = events.iter().find(|e| e.kind() == "turnStarted").unwrap();
        assert_eq!(
            started.parent_id.as_deref(),
            Some(format!("span:{SPAN}").as_str())
        );
        // Every event of the turn is in its trace, and names an event of the same turn.
        let of_turn: Vec<&StoredEvent> = events.iter().filter(|e| e.seq >= started.seq).collect();
        assert!(of_turn.len() >= 10, "{of_turn:?}");
        for e in &of_turn {
            assert_eq!(e.trace_id.as_deref(), Some(TRACE), "{e:?}");
            if e.seq > started.seq {
                let p = parent_seq(e).unwrap_or_else(|| panic!("no seq parent: {e:?}"));
                assert!(p >= started.seq && p < e.seq, "{e:?}");
                assert_eq!(e.payload["turnId"], json!(turn_id), "{e:?}");
            }
        }
        // The tool's result reads back through the approval to the turn's start.
        let result = events.iter().find(|e| e.kind() == "toolResult").unwrap();
        let kinds: Vec<&str> = chain(&events, result).iter().map(|e| e.kind()).collect();
        assert_eq!(
            kinds,
            [
                "toolResult",
                "approvalResolved",
                "approvalRequested",
                "toolRequested",
                "itemStarted",
                "turnStarted"
            ],
        );
        // Deltas name their item's start; the item's completion its last step; the end the start.
        for e in events.iter().filter(|e| e.kind() == "itemDelta") {
            let p = &events[parent_seq(e).unwrap() as usize - 1];
            assert_eq!(
                (p.kind(), &p.payload["item"]["id"]),
                ("itemStarted", &e.payload["itemId"])
            );
        }
        let end = events.iter().find(|e| e.kind() == "turnCompleted").unwrap();
        assert_eq!(parent_seq(end), Some(started.seq));
        assert!(server.store().verify("t").unwrap().ok());

        // Reopened from disk, the ids are the same bytes (they are in the hash chain).
        drop(c);
        drop(server);
        let server = open(dir.path(), kind);
        let again = all_events(&server, "t");
        assert_eq!(again, events);
    }
}

#[test]
fn a_turn_without_a_traceparent_starts_a_trace_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let server = open(dir.path(), StoreKind::Jsonl);
    let c = client(&server);
    c.request("thread/start", json!({"threadId": "u"})).unwrap();
    let mut traces = Vec::new();
    for _ in 0..2 {
        c.request(
            "turn/start",
            json!({"threadId": "u", "input": [{"type": "text", "text": "hi"}]}),
        )
        .unwrap();
        until_completed(&c);
    }
    let events = all_events(&server, "u");
    // Nothing traced the thread's start, so its header carries nothing.
    assert_eq!((&events[0].trace_id, &events[0].parent_id), (&None, &None));
    for e in events.iter().filter(|e| e.kind() == "turnStarted") {
        let t = e.trace_id.clone().unwrap();
        assert!(
            t.len() == 32 && t.bytes().all(|b| b.is_ascii_hexdigit()),
            "{t}"
        );
        assert_eq!(e.parent_id, None, "nobody's span caused it");
        traces.push(t);
    }
    assert_eq!(traces.len(), 2);
    assert_ne!(traces[0], traces[1], "each turn is its own trace");
    for e in &events[1..] {
        assert!(traces.contains(e.trace_id.as_ref().unwrap()), "{e:?}");
    }
}

#[test]
fn a_malformed_traceparent_is_refused_and_records_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = open(dir.path(), StoreKind::Jsonl);
    let c = client(&server);
    c.request("thread/start", json!({"threadId": "m"})).unwrap();
    let head = all_events(&server, "m").len();
    for bad in [
        traceparent(&"0".repeat(32), SPAN),
        traceparent(TRACE, &"0".repeat(16)),
        traceparent(&TRACE.to_uppercase(), SPAN),
        format!("01-{TRACE}-{SPAN}-01"),
        format!("00-{TRACE}-{SPAN}"),
        format!("00-{TRACE}-{SPAN}-01-extra"),
    ] {
        let turn = c.request(
            "turn/start",
            json!({"threadId": "m", "input": [{"type": "text", "text": "x"}], "traceparent": bad}),
        );
        assert_eq!(
            turn.as_ref().map_err(ClientError::code).err(),
            Some(-32602),
            "{bad}: {turn:?}"
        );
        let thread = c.request(
            "thread/start",
            json!({"threadId": "m2", "traceparent": bad}),
        );
        assert_eq!(thread.map_err(|e| e.code()).err(), Some(-32602), "{bad}");
    }
    assert_eq!(all_events(&server, "m").len(), head, "nothing was recorded");
    assert!(
        server.store().read("m2", 0, 1).is_err(),
        "no thread was created"
    );
    // The same request with a good one goes through.
    c.request(
        "turn/start",
        json!({"threadId": "m", "input": [{"type": "text", "text": "x"}],
               "traceparent": traceparent(TRACE, SPAN)}),
    )
    .unwrap();
    until_completed(&c);
}

#[test]
fn a_fork_keeps_its_sources_trace_and_its_parents() {
    for kind in [StoreKind::Jsonl, StoreKind::Sqlite] {
        let dir = tempfile::tempdir().unwrap();
        let server = open(dir.path(), kind);
        let c = client(&server);
        c.request(
            "thread/start",
            json!({"threadId": "s", "agentOptions": {"script": tool_script()}}),
        )
        .unwrap();
        c.request(
            "turn/start",
            json!({"threadId": "s", "input": [{"type": "text", "text": "go"}],
                   "traceparent": traceparent(TRACE, SPAN)}),
        )
        .unwrap();
        until_completed(&c);
        let source = all_events(&server, "s");
        let at = source.iter().find(|e| e.kind() == "toolResult").unwrap();
        let forked = c
            .request(
                "thread/fork",
                json!({"threadId": "s", "newThreadId": "f", "atEventSeq": at.seq}),
            )
            .unwrap();
        assert_eq!(forked["thread"]["id"], "f");
        let fork = all_events(&server, "f");
        // The header is in the trace of the event it was forked at, and names that event.
        assert_eq!(fork[0].trace_id.as_deref(), Some(TRACE));
        assert_eq!(fork[0].parent_id, Some(format!("event:{}", at.hash)));
        // The copies keep their trace and name the copies of their parents.
        assert_eq!(fork.len() as u64, at.seq);
        for (copy, orig) in fork.iter().zip(&source).skip(1) {
            assert_eq!(
                (&copy.trace_id, &copy.payload),
                (&orig.trace_id, &orig.payload)
            );
            assert_eq!(parent_seq(copy), parent_seq(orig), "{copy:?}");
        }
        let last = fork.last().unwrap();
        let kinds: Vec<&str> = chain(&fork, last).iter().map(|e| e.kind()).collect();
        assert_eq!(kinds.last(), Some(&"turnStarted"), "{kinds:?}");
        assert!(server.store().verify("f").unwrap().ok());
    }
}

#[test]
fn a_fork_past_skipped_events_renumbers_the_parents_it_copies() {
    for kind in [StoreKind::Jsonl, StoreKind::Sqlite] {
        let dir = tempfile::tempdir().unwrap();
        let server = open(dir.path(), kind);
        let store = server.store();
        store
            .start_recorded(
                ThreadStart {
                    thread_id: "r".into(),
                    title: None,
                    metadata: Default::default(),
                    forked_from: None,
                },
                HeaderExtra::default(),
            )
            .unwrap();
        let ev = |turn: &str, parent: Option<&str>| NewEvent {
            payload: json!({"type": "turnStarted", "turnId": turn, "input": [{"type": "text", "text": "x"}]}),
            trace_id: Some(TRACE.into()),
            parent_id: parent.map(str::to_string),
            idempotency_key: None,
        };
        store
            .append("r", vec![ev("t2", Some("span:00f067aa0ba902b7"))])
            .unwrap();
        // Archived and back: neither event is inherited by a fork, so what follows moves up.
        store.set_archived("r", true).unwrap();
        store.set_archived("r", false).unwrap();
        store
            .append("r", vec![ev("t5", Some("2")), ev("t6", Some("5"))])
            .unwrap();
        store.append("r", vec![ev("t7", Some("event:ab"))]).unwrap();
        c_fork(store, "r", "r2");
        let fork = all_events(&server, "r2");
        let got: Vec<(Value, Option<String>)> = fork[1..]
            .iter()
            .map(|e| (e.payload["turnId"].clone(), e.parent_id.clone()))
            .collect();
        let want = [
            (json!("t2"), Some("span:00f067aa0ba902b7".to_string())),
            (json!("t5"), Some("2".to_string())),
            (json!("t6"), Some("3".to_string())),
            (json!("t7"), Some("event:ab".to_string())),
        ];
        assert_eq!(got, want);
        assert!(store.verify("r2").unwrap().ok());
    }
}

fn c_fork(store: &Arc<dyn RolloutStore>, from: &str, to: &str) {
    store.fork(from, None, to, None).unwrap();
}
