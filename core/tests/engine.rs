//! The engine through its in-process API: handshake rules, every method, the approval failure
//! matrix, interrupt, bounds at their edges, and restart. Real stores in temp dirs, real threads.

use cc_app_server::approval::ApprovalPolicy;
use cc_app_server::client::{ApprovalHandler, Client, ClientConfig, ClientError};
use cc_app_server::engine::{AppServer, Connection, Limits, SendError, ServerConfig};
use cc_app_server::protocol::{AcceptForTurn, AcceptOnce, ApprovalDecision, ApprovalRequest};
use cc_app_server::rollout::StoreKind;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

const T: Option<Duration> = Some(Duration::from_secs(20));

fn server_with(dir: &std::path::Path, f: impl FnOnce(&mut ServerConfig)) -> AppServer {
    let mut config = ServerConfig::new(dir);
    f(&mut config);
    AppServer::open(config).expect("server opens")
}

fn state_dir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// A raw connection that speaks JSON lines, as a host without the Rust client would.
struct Raw {
    conn: Connection,
    next: u64,
    seen: Vec<Value>,
}

impl Raw {
    fn new(server: &AppServer) -> Raw {
        Raw {
            conn: server.connect().unwrap(),
            next: 100,
            seen: Vec::new(),
        }
    }

    fn init(server: &AppServer, features: &[&str]) -> Raw {
        let mut raw = Raw::new(server);
        let r = raw.req("initialize", json!({"protocolVersion": 1, "minimumProtocolVersion": 1, "client": {"name": "t", "version": "1"}, "features": features}));
        assert!(r.get("result").is_some(), "{r}");
        raw
    }

    fn recv(&mut self) -> Value {
        let text = self.conn.recv(T).expect("a message within the timeout");
        let v: Value = serde_json::from_str(&text).unwrap();
        cc_agent_protocol::validate_protocol_message(&v)
            .unwrap_or_else(|e| panic!("server sent an invalid message: {e}\n{v}"));
        v
    }

    /// Sends a request and returns its response, keeping notifications and server requests.
    fn req(&mut self, method: &str, params: Value) -> Value {
        self.next += 1;
        let id = self.next;
        self.conn
            .send(
                &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
                    .to_string(),
            )
            .unwrap();
        self.response_to(id)
    }

    fn response_to(&mut self, id: u64) -> Value {
        loop {
            let m = self.recv();
            if m.get("method").is_none() && m["id"] == json!(id) {
                return m;
            }
            self.seen.push(m);
        }
    }

    /// Waits for a message matching `pred` (looking at what was already seen first).
    fn wait(&mut self, pred: impl Fn(&Value) -> bool) -> Value {
        if let Some(i) = self.seen.iter().position(&pred) {
            return self.seen.remove(i);
        }
        loop {
            let m = self.recv();
            if pred(&m) {
                return m;
            }
            self.seen.push(m);
        }
    }

    fn wait_method(&mut self, method: &str) -> Value {
        self.wait(|m| m["method"] == json!(method))
    }

    fn answer(&self, id: &Value, result: Value) {
        self.conn
            .send(&json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string())
            .unwrap();
    }
}

fn code(resp: &Value) -> i64 {
    resp["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("expected an error, got {resp}"))
}

fn tool_script() -> Value {
    json!({"steps": [{"type": "tool", "tool": "fs.write", "arguments": {"path": "a.txt"}}, {"type": "message", "text": "done", "chunks": 2}]})
}

fn start_tool_turn(raw: &mut Raw, thread: &str) -> (Value, Value) {
    let r = raw.req(
        "thread/start",
        json!({"threadId": thread, "agentOptions": {"script": tool_script()}}),
    );
    assert!(r.get("result").is_some(), "{r}");
    let t = raw.req(
        "turn/start",
        json!({"threadId": thread, "input": [{"type": "text", "text": "go"}]}),
    );
    let turn_id = t["result"]["turn"]["id"].clone();
    let ask = raw.wait_method("approval/decide");
    (turn_id, ask)
}

fn resolved(raw: &mut Raw) -> Value {
    raw.wait_method("approval/resolved")["params"].clone()
}

/// The terminal Turn with its error beside it (`turn/completed` params `error`) folded in, for
/// assertions: the published Turn itself has no error member.
fn completed(raw: &mut Raw) -> Value {
    let params = raw.wait_method("turn/completed")["params"].clone();
    let mut turn = params["turn"].clone();
    turn["error"] = params["error"].clone();
    turn
}

#[test]
fn handshake_rules() {
    let dir = state_dir();
    let server = server_with(dir.path(), |_| {});
    let mut raw = Raw::new(&server);
    assert_eq!(code(&raw.req("thread/list", json!({}))), -32002);
    let r = raw.req("initialize", json!({"protocolVersion": 3, "minimumProtocolVersion": 1, "client": {"name": "t", "version": "1"}, "features": ["structured_approval", "from_the_future"]}));
    let result = &r["result"];
    assert_eq!(result["protocolVersion"], 1);
    assert_eq!(result["downgraded"], true);
    assert_eq!(result["features"], json!(["structured_approval"]));
    assert_eq!(result["schemaDigest"], cc_agent_protocol::schema_digest());
    assert_eq!(code(&raw.req("initialize", json!({"protocolVersion": 1, "minimumProtocolVersion": 1, "client": {"name": "t", "version": "1"}, "features": []}))), -32009);

    let mut other = Raw::new(&server);
    let r = other.req("initialize", json!({"protocolVersion": 5, "minimumProtocolVersion": 2, "client": {"name": "t", "version": "1"}, "features": []}));
    assert_eq!(code(&r), -32602);
    let r = other.req("initialize", json!({"protocolVersion": 1, "minimumProtocolVersion": 1, "client": {"name": "t", "version": "1"}, "features": []}));
    assert_eq!(r["result"]["downgraded"], false);
}

/// Dispatch reads every request into the generated types; JSON Schema counts `2.0` as an
/// integer, so an integral float where the schema says integer is read as that integer, and a
/// float in free-form metadata is kept as the host wrote it.
#[test]
fn integral_floats_are_integers_and_free_form_floats_are_kept() {
    let dir = state_dir();
    let server = server_with(dir.path(), |_| {});
    let mut raw = Raw::init(&server, &[]);
    let r = raw.req(
        "thread/start",
        json!({"threadId": "f", "metadata": {"ratio": 1.0, "half": 0.5}}),
    );
    assert_eq!(
        r["result"]["thread"]["metadata"],
        json!({"ratio": 1.0, "half": 0.5}),
        "{r}"
    );
    raw.req("thread/start", json!({"threadId": "g"}));
    raw.req("thread/start", json!({"threadId": "h"}));
    let r = raw.req("thread/list", json!({"limit": 2.0}));
    assert_eq!(
        r["result"]["threads"].as_array().map(Vec::len),
        Some(2),
        "{r}"
    );
    // A fractional number where the schema says integer is still refused by the schema.
    assert_eq!(code(&raw.req("thread/list", json!({"limit": 2.5}))), -32602);
    let r = raw.req("thread/read", json!({"threadId": "f", "limit": 1.0}));
    assert_eq!(
        r["result"]["events"].as_array().map(Vec::len),
        Some(1),
        "{r}"
    );
}

#[test]
fn malformed_input_gets_the_right_codes_and_loses_nothing() {
    let dir = state_dir();
    let server = server_with(dir.path(), |_| {});
    let mut raw = Raw::init(&server, &[]);
    raw.req("thread/start", json!({"threadId": "kept"}));
    raw.conn.send("{not json").unwrap();
    let r = raw.recv();
    assert_eq!((code(&r), r["id"].clone()), (-32700, Value::Null));
    assert_eq!(code(&raw.req("thread/explode", json!({}))), -32601);
    let r = raw.req("thread/start", json!({"threadId": "../etc"}));
    assert_eq!(code(&r), -32602);
    assert_eq!(r["error"]["data"]["pointer"], "/params/threadId");
    // A string id is a JSON-RPC 2.0 id (echoed); one past 128 characters is refused, id null.
    raw.conn
        .send(&json!({"jsonrpc": "2.0", "id": "s", "method": "thread/list"}).to_string())
        .unwrap();
    assert_eq!(raw.recv()["id"], "s");
    raw.conn
        .send(
            &json!({"jsonrpc": "2.0", "id": "s".repeat(129), "method": "thread/list"}).to_string(),
        )
        .unwrap();
    let r = raw.recv();
    assert_eq!((code(&r), r["id"].clone()), (-32600, Value::Null));
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    raw.conn.send(&deep).unwrap();
    assert_eq!(code(&raw.recv()), -32700);
    // An integral float id is an integer to the schema: answered, and echoed exactly.
    raw.conn
        .send(r#"{"jsonrpc":"2.0","id":3.0,"method":"thread/list"}"#)
        .unwrap();
    let r = raw.recv();
    assert!(r.get("result").is_some(), "{r}");
    assert_eq!(r["id"], json!(3.0));
    // A response nobody asked for is dropped, not answered.
    raw.answer(&json!(777), json!({}));
    let r = raw.req("thread/read", json!({"threadId": "kept"}));
    assert_eq!(r["result"]["thread"]["id"], "kept");
    assert_eq!(server.stats().ignored_responses.load(Ordering::SeqCst), 1);
    // Error messages are capped and carry no internals.
    let long = "x".repeat(5000);
    let r = raw.req(&long, json!({}));
    assert!(r["error"]["message"].as_str().unwrap().len() <= 512);
}

#[test]
fn thread_methods_and_conflicts() {
    let dir = state_dir();
    let server = server_with(dir.path(), |_| {});
    let mut raw = Raw::init(&server, &[]);
    let r = raw.req(
        "thread/start",
        json!({"threadId": "t1", "title": "First", "metadata": {"class": 1}}),
    );
    assert_eq!(r["result"]["thread"]["title"], "First");
    assert_eq!(
        code(&raw.req("thread/start", json!({"threadId": "t1"}))),
        -32009
    );
    let generated = raw.req("thread/start", json!({}));
    assert!(generated["result"]["thread"]["id"]
        .as_str()
        .unwrap()
        .starts_with("th-"));
    assert_eq!(
        code(&raw.req("thread/read", json!({"threadId": "missing"}))),
        -32004
    );

    let read = raw.req("thread/read", json!({"threadId": "t1", "limit": 1}));
    assert_eq!(read["result"]["events"].as_array().unwrap().len(), 1);
    assert_eq!(
        read["result"]["events"][0]["payload"]["type"],
        "threadStarted"
    );
    assert_eq!(
        code(&raw.req("thread/read", json!({"threadId": "t1", "limit": 1001}))),
        -32602
    );

    let fork = raw.req(
        "thread/fork",
        json!({"threadId": "t1", "newThreadId": "t1-fork", "idempotencyKey": "f1"}),
    );
    assert_eq!(fork["result"]["forkedFrom"]["threadId"], "t1");
    assert_eq!(fork["result"]["thread"]["parentThreadId"], "t1");
    let again = raw.req(
        "thread/fork",
        json!({"threadId": "t1", "newThreadId": "t1-fork", "idempotencyKey": "f1"}),
    );
    assert_eq!(
        again["result"], fork["result"],
        "a retry returns the same logical result"
    );
    assert_eq!(
        code(&raw.req(
            "thread/fork",
            json!({"threadId": "t1", "newThreadId": "other", "idempotencyKey": "f1"})
        )),
        -32009
    );

    let archived = raw.req("thread/archive", json!({"threadId": "t1"}));
    assert_eq!(archived["result"]["thread"]["status"], "archived");
    let updated = raw.wait_method("thread/updated");
    assert_eq!(updated["params"]["thread"]["status"], "archived");
    let list = raw.req("thread/list", json!({}));
    let ids: Vec<&str> = list["result"]["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert!(!ids.contains(&"t1") && ids.contains(&"t1-fork"), "{ids:?}");
    let all = raw.req("thread/list", json!({"includeArchived": true}));
    assert_eq!(all["result"]["threads"].as_array().unwrap().len(), 3);
    let r = raw.req(
        "turn/start",
        json!({"threadId": "t1", "input": [{"type": "text", "text": "hi"}]}),
    );
    assert_eq!(code(&r), -32009);
    let resume = raw.req("thread/resume", json!({"threadId": "t1"}));
    assert_eq!(resume["result"]["activeTurn"], Value::Null);
}

struct Decide(ApprovalDecision);
impl ApprovalHandler for Decide {
    fn decide(&self, _: &ApprovalRequest) -> Result<ApprovalDecision, String> {
        Ok(self.0.clone())
    }
}

#[test]
fn a_turn_with_an_approved_tool_through_the_rust_client() {
    for kind in [StoreKind::Jsonl, StoreKind::Sqlite] {
        let dir = state_dir();
        let server = server_with(dir.path(), |c| c.store = kind);
        let client = Client::connect(
            &server,
            Some(Arc::new(Decide(ApprovalDecision::AcceptOnce(
                AcceptOnce {},
            )))),
            ClientConfig::default(),
        )
        .unwrap();
        client
            .request(
                "thread/start",
                json!({"threadId": "c1", "agentOptions": {"script": tool_script()}}),
            )
            .unwrap();
        let turn = client
            .request(
                "turn/start",
                json!({"threadId": "c1", "input": [{"type": "text", "text": "go"}]}),
            )
            .unwrap();
        assert_eq!(turn["turn"]["status"], "queued");
        let mut methods = Vec::new();
        let mut last_seq = 0;
        loop {
            let n = client
                .next_notification(Duration::from_secs(20))
                .expect("notifications keep coming");
            let seq = n["params"]["eventSeq"].as_u64().unwrap();
            assert!(seq > last_seq, "notifications arrive in seq order");
            last_seq = seq;
            // Written to the rollout before the host saw it.
            let on_disk = server.store().read("c1", seq - 1, 1).unwrap();
            assert_eq!(on_disk.events[0].seq, seq);
            methods.push(n["method"].as_str().unwrap().to_string());
            if n["method"] == "turn/completed" {
                assert_eq!(n["params"]["turn"]["status"], "completed");
                break;
            }
        }
        assert_eq!(methods.iter().filter(|m| *m == "turn/completed").count(), 1);
        for expected in [
            "turn/started",
            "item/started",
            "tool/requested",
            "approval/requested",
            "approval/resolved",
            "tool/result",
            "item/delta",
            "item/completed",
        ] {
            assert!(
                methods.iter().any(|m| m == expected),
                "missing {expected} in {methods:?}"
            );
        }
        assert_eq!(server.stats().tools_executed.load(Ordering::SeqCst), 1);
        let report = server.store().verify("c1").unwrap();
        assert!(report.ok(), "{report:?}");
        let evidence = server
            .store()
            .terminal_evidence("c1", turn["turn"]["id"].as_str().unwrap())
            .unwrap();
        assert_eq!(evidence.unwrap().payload["status"], "completed");
    }
}

/// Each way an approval can go wrong: the tool never runs and the failure is recorded.
#[test]
fn approval_failure_matrix_fails_closed() {
    let dir = state_dir();
    let server = server_with(dir.path(), |c| {
        c.approval_timeout = Duration::from_millis(300)
    });

    // No handler: the connection did not negotiate structured_approval.
    let mut raw = Raw::init(&server, &[]);
    raw.req(
        "thread/start",
        json!({"threadId": "nh", "agentOptions": {"script": tool_script()}}),
    );
    raw.req(
        "turn/start",
        json!({"threadId": "nh", "input": [{"type": "text", "text": "go"}]}),
    );
    assert_eq!(resolved(&mut raw)["failure"], "noHandler");
    completed(&mut raw);

    let mut raw = Raw::init(&server, &["structured_approval"]);
    let mut case = |name: &str, answer: &dyn Fn(&mut Raw, &Value), expect: &str| {
        let (_, ask) = start_tool_turn(&mut raw, name);
        answer(&mut raw, &ask);
        let r = resolved(&mut raw);
        assert_eq!(r["outcome"], "failedClosed", "{name}");
        assert_eq!(r["failure"], expect, "{name}");
        let result = raw.wait_method("tool/result");
        assert_eq!(result["params"]["result"]["status"], "denied", "{name}");
        completed(&mut raw);
        ask
    };
    case(
        "handler-error",
        &|raw, ask| {
            raw.conn.send(&json!({"jsonrpc": "2.0", "id": ask["id"], "error": {"code": -32603, "message": "boom"}}).to_string()).unwrap()
        },
        "handlerError",
    );
    case("timeout", &|_, _| {}, "timeout");
    case(
        "unknown-decision",
        &|raw, ask| raw.answer(&ask["id"], json!({"kind": "acceptAlways"})),
        "unknownDecision",
    );
    // The pre-published answer shape (nonce echoed, decision tagged `decision`) is refused.
    case(
        "old-answer-shape",
        &|raw, ask| {
            raw.answer(
                &ask["id"],
                json!({"nonce": ask["params"]["binding"]["nonce"], "decision": {"decision": "acceptOnce"}}),
            )
        },
        "unknownDecision",
    );
    case(
        "workspace-changed",
        &|raw, ask| {
            server.set_workspace("another");
            raw.answer(&ask["id"], json!({"kind": "acceptOnce"}));
        },
        "bindingMismatch",
    );
    server.set_workspace("default");
    // A published decision with a member it does not define is refused: decisions are closed.
    case(
        "decision-extra-member",
        &|raw, ask| {
            raw.answer(
                &ask["id"],
                json!({"kind": "acceptOnce", "nonce": ask["params"]["binding"]["nonce"]}),
            )
        },
        "unknownDecision",
    );
    // The late answer to the timed-out request was dropped, never applied.
    let ignored_before = server.stats().ignored_responses.load(Ordering::SeqCst);
    raw.answer(&json!(1), json!({"kind": "acceptOnce"}));
    raw.req("thread/list", json!({}));
    assert!(server.stats().ignored_responses.load(Ordering::SeqCst) > ignored_before);
    assert_eq!(
        server.stats().tools_executed.load(Ordering::SeqCst),
        0,
        "no tool ran"
    );

    // A duplicate acceptance after a decline is ignored: still exactly one resolution, no tool.
    let (_, ask) = start_tool_turn(&mut raw, "duplicate");
    raw.answer(&ask["id"], json!({"kind": "decline"}));
    raw.answer(&ask["id"], json!({"kind": "acceptOnce"}));
    assert_eq!(resolved(&mut raw)["outcome"], "declined");
    completed(&mut raw);
    assert_eq!(server.stats().tools_executed.load(Ordering::SeqCst), 0);
    let events = server.store().read("duplicate", 0, 1000).unwrap().events;
    assert_eq!(
        events
            .iter()
            .filter(|e| e.kind() == "approvalResolved")
            .count(),
        1
    );
}

/// A host may start the next turn the moment it sees `turn/completed`: never a stale -32009.
#[test]
fn the_next_turn_can_start_on_turn_completed() {
    let dir = state_dir();
    let server = server_with(dir.path(), |_| {});
    let mut raw = Raw::init(&server, &[]);
    raw.req("thread/start", json!({"threadId": "seq"}));
    for i in 0..30 {
        let r = raw.req(
            "turn/start",
            json!({"threadId": "seq", "input": [{"type": "text", "text": format!("turn {i}")}]}),
        );
        assert!(r.get("result").is_some(), "turn {i}: {r}");
        assert_eq!(completed(&mut raw)["status"], "completed");
    }
}

/// An answer after the binding's expiry (but while the server still listens) is refused as expired.
#[test]
fn an_answer_after_expiry_is_refused_as_expired() {
    let dir = state_dir();
    let server = server_with(dir.path(), |c| {
        c.approval_timeout = Duration::from_millis(200);
        c.approval_grace = Duration::from_secs(30);
    });
    let mut raw = Raw::init(&server, &["structured_approval"]);
    let (_, ask) = start_tool_turn(&mut raw, "late");
    std::thread::sleep(Duration::from_millis(400));
    raw.answer(&ask["id"], json!({"kind": "acceptOnce"}));
    let r = resolved(&mut raw);
    assert_eq!(
        (r["outcome"].clone(), r["failure"].clone()),
        (json!("failedClosed"), json!("expired"))
    );
    completed(&mut raw);
    assert_eq!(server.stats().tools_executed.load(Ordering::SeqCst), 0);
}

#[test]
fn grants_cover_the_turn_and_lapse_with_the_policy() {
    let dir = state_dir();
    let server = server_with(dir.path(), |_| {});
    let mut raw = Raw::init(&server, &["structured_approval"]);
    let twice = json!({"steps": [
        {"type": "tool", "tool": "t", "arguments": {"n": 1}},
        {"type": "tool", "tool": "t", "arguments": {"n": 1}}]});
    raw.req(
        "thread/start",
        json!({"threadId": "g", "agentOptions": {"script": twice}}),
    );
    raw.req(
        "turn/start",
        json!({"threadId": "g", "input": [{"type": "text", "text": "go"}]}),
    );
    let ask = raw.wait_method("approval/decide");
    let decision = serde_json::to_value(ApprovalDecision::AcceptForTurn(AcceptForTurn {
        permissions: None,
    }))
    .unwrap();
    raw.answer(&ask["id"], decision);
    assert_eq!(completed(&mut raw)["status"], "completed");
    assert_eq!(
        server.stats().tools_executed.load(Ordering::SeqCst),
        2,
        "the grant covered the second call"
    );
    assert!(
        raw.seen
            .iter()
            .filter(|m| m["method"] == "approval/decide")
            .count()
            == 0
    );

    server.set_policy(ApprovalPolicy::DenyAll);
    raw.req(
        "turn/start",
        json!({"threadId": "g", "input": [{"type": "text", "text": "again"}]}),
    );
    assert_eq!(completed(&mut raw)["status"], "completed");
    assert_eq!(
        server.stats().tools_executed.load(Ordering::SeqCst),
        2,
        "deny-all runs nothing"
    );
}

#[test]
fn cancel_decision_interrupts_the_turn() {
    let dir = state_dir();
    let server = server_with(dir.path(), |_| {});
    let mut raw = Raw::init(&server, &["structured_approval"]);
    let (_, ask) = start_tool_turn(&mut raw, "cx");
    raw.answer(&ask["id"], json!({"kind": "cancel"}));
    assert_eq!(resolved(&mut raw)["outcome"], "cancelled");
    assert_eq!(completed(&mut raw)["status"], "interrupted");
    assert_eq!(server.stats().tools_executed.load(Ordering::SeqCst), 0);
}

#[test]
fn interrupt_answers_only_when_physically_settled() {
    let dir = state_dir();
    let server = server_with(dir.path(), |c| {
        c.settle_deadline = Duration::from_millis(200)
    });
    let mut raw = Raw::init(&server, &[]);
    raw.req("thread/start", json!({"threadId": "s", "agentOptions": {"script": {"steps": [{"type": "sleep", "ms": 30000}]}}}));
    let t = raw.req(
        "turn/start",
        json!({"threadId": "s", "input": [{"type": "text", "text": "go"}]}),
    );
    let turn_id = t["result"]["turn"]["id"].clone();
    assert_eq!(
        code(&raw.req(
            "turn/start",
            json!({"threadId": "s", "input": [{"type": "text", "text": "second"}]})
        )),
        -32009
    );
    assert_eq!(
        code(&raw.req("thread/archive", json!({"threadId": "s"}))),
        -32009
    );
    let r = raw.req(
        "turn/interrupt",
        json!({"threadId": "s", "turnId": turn_id}),
    );
    assert_eq!(r["result"]["physicallySettled"], true, "{r}");
    assert_eq!(r["result"]["turn"]["status"], "interrupted");
    assert_eq!(completed(&mut raw)["status"], "interrupted");
    assert_eq!(
        code(&raw.req("turn/interrupt", json!({"threadId": "s", "turnId": "nope"}))),
        -32004
    );

    // A kernel deaf to cancellation: -32010, the turn stays live, then ends interrupted.
    raw.req("thread/start", json!({"threadId": "deaf", "agentOptions": {"script": {"steps": [{"type": "message", "text": "in"}, {"type": "ignoreCancel", "ms": 1500}]}}}));
    let t = raw.req(
        "turn/start",
        json!({"threadId": "deaf", "input": [{"type": "text", "text": "go"}]}),
    );
    raw.wait(|m| m["method"] == "item/completed" && m["params"]["threadId"] == "deaf");
    let r = raw.req(
        "turn/interrupt",
        json!({"threadId": "deaf", "turnId": t["result"]["turn"]["id"]}),
    );
    assert_eq!(code(&r), -32010);
    let resume = raw.req("thread/resume", json!({"threadId": "deaf"}));
    assert_eq!(
        resume["result"]["activeTurn"]["id"],
        t["result"]["turn"]["id"]
    );
    let done = raw.wait(|m| m["method"] == "turn/completed" && m["params"]["threadId"] == "deaf");
    assert_eq!(done["params"]["turn"]["status"], "interrupted");
}

#[test]
fn inbound_queue_and_line_cap_at_their_edges() {
    let dir = state_dir();
    let server = server_with(dir.path(), |c| {
        c.limits = Limits {
            inbound_messages: 4,
            ..Limits::default()
        };
    });
    let conn = server.connect().unwrap();
    let exact = format!("{{\"pad\":\"{}\"}}", "x".repeat((1 << 20) - 10));
    assert_eq!(exact.len(), 1 << 20);
    let over = format!("{exact} ");
    assert_eq!(
        conn.send(&over),
        Err(SendError::LineTooLarge {
            size: (1 << 20) + 1,
            max: 1 << 20
        })
    );
    // Fill the inbound queue faster than the worker can drain it: at some point it refuses with
    // a retry hint, and every accepted message is still answered.
    let mut accepted = 0;
    let mut refused = None;
    for i in 0..10_000 {
        match conn.send(&exact) {
            Ok(()) => accepted += 1,
            Err(e) => {
                refused = Some((i, e));
                break;
            }
        }
    }
    let (_, err) = refused.expect("a 4-message queue refuses eventually");
    assert!(
        matches!(err, SendError::Overloaded { retry_after_ms } if retry_after_ms >= 1),
        "{err:?}"
    );
    for _ in 0..accepted {
        let m: Value = serde_json::from_str(&conn.recv(T).unwrap()).unwrap();
        assert_eq!(
            m["error"]["code"], -32600,
            "an object without jsonrpc is an invalid request"
        );
    }
}

#[test]
fn a_host_that_stops_reading_loses_its_connection_not_the_server() {
    let dir = state_dir();
    let server = server_with(dir.path(), |c| {
        c.limits = Limits {
            outbound_messages: 8,
            outbound_stall: Duration::from_millis(300),
            ..Limits::default()
        };
    });
    let mut slow = Raw::init(&server, &[]);
    slow.req("thread/start", json!({"threadId": "flood", "agentOptions": {"script": {"steps": [{"type": "message", "text": "x".repeat(100), "chunks": 100}]}}}));
    slow.conn.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "turn/start", "params": {"threadId": "flood", "input": [{"type": "text", "text": "go"}]}}).to_string()).unwrap();
    let mut waited = 0;
    while slow.conn.is_open() && waited < 2000 {
        std::thread::sleep(Duration::from_millis(10));
        waited += 1;
    }
    assert!(
        !slow.conn.is_open(),
        "the outbound cap closed the connection"
    );
    assert_eq!(
        server.stats().closed_slow_consumers.load(Ordering::SeqCst),
        1
    );
    // The engine kept going: the turn finished durably and a new connection works.
    let mut fresh = Raw::init(&server, &[]);
    let done = loop {
        // thread/list does not subscribe, so polling it cannot flood this connection too.
        let r = fresh.req("thread/list", json!({}));
        if r["result"]["threads"][0]["status"] == "idle" {
            break fresh.req("thread/read", json!({"threadId": "flood", "limit": 1000}));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let events = done["result"]["events"].as_array().unwrap();
    assert_eq!(events.last().unwrap()["payload"]["status"], "completed");
}

/// Not run on its own: the child half of the restart test, started by it as a separate process.
#[test]
#[ignore]
fn child_server_process() {
    let Ok(dir) = std::env::var("CC_CHILD_STATE_DIR") else {
        return;
    };
    let server = server_with(std::path::Path::new(&dir), |_| {});
    let mut raw = Raw::init(&server, &[]);
    raw.req("thread/start", json!({"threadId": "empty"}));
    raw.req("thread/start", json!({"threadId": "r", "agentOptions": {"script": {"steps": [{"type": "message", "text": "partial", "chunks": 1}, {"type": "sleep", "ms": 60000}]}}}));
    let t = raw.req(
        "turn/start",
        json!({"threadId": "r", "input": [{"type": "text", "text": "go"}]}),
    );
    let seq = raw.wait_method("item/completed")["params"]["eventSeq"].clone();
    println!(
        "READY {} {}",
        t["result"]["turn"]["id"].as_str().unwrap(),
        seq
    );
    std::thread::sleep(Duration::from_secs(60));
}

#[test]
fn restart_after_sigkill_closes_dangling_turns_with_evidence_and_keeps_every_event() {
    use std::io::BufRead;
    let dir = state_dir();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_server_process",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("CC_CHILD_STATE_DIR", dir.path())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    // libtest prints "test child_server_process ... " on the same line before the child's output.
    let ready = stdout
        .lines()
        .map_while(Result::ok)
        .find_map(|l| l.split_once("READY ").map(|(_, r)| r.to_string()))
        .expect("child reports READY");
    let parts: Vec<&str> = ready.split_whitespace().collect();
    let (turn_id, seen_seq) = (parts[0].to_string(), parts[1].parse::<u64>().unwrap());
    child.kill().unwrap(); // SIGKILL on Unix
    child.wait().unwrap();

    let server = server_with(dir.path(), |_| {});
    let mut raw = Raw::init(&server, &[]);
    let resume = raw.req("thread/resume", json!({"threadId": "r"}));
    let events = resume["result"]["events"].as_array().unwrap();
    assert!(
        events.iter().any(|e| e["seq"] == json!(seen_seq)),
        "every acknowledged event is there"
    );
    let terminals: Vec<&Value> = events
        .iter()
        .filter(|e| {
            e["payload"]["type"] == "turnCompleted" && e["payload"]["turnId"] == json!(turn_id)
        })
        .collect();
    assert_eq!(terminals.len(), 1, "exactly one terminal: {events:?}");
    assert_eq!(terminals[0]["payload"]["status"], "failed");
    assert_eq!(terminals[0]["payload"]["error"]["code"], "serverRestarted");
    assert!(resume["result"]["activeTurn"].is_null());
    let empty = raw.req("thread/resume", json!({"threadId": "empty"}));
    assert_eq!(
        empty["result"]["events"].as_array().unwrap().len(),
        1,
        "a thread with zero turns resumes"
    );
    let next = raw.req(
        "turn/start",
        json!({"threadId": "empty", "input": [{"type": "text", "text": "hello"}]}),
    );
    assert!(next.get("result").is_some(), "{next}");
    assert!(server.store().verify("r").unwrap().ok());
}

#[test]
fn client_bounds_and_timeouts() {
    let dir = state_dir();
    let server = server_with(dir.path(), |c| c.settle_deadline = Duration::from_secs(5));
    let config = ClientConfig {
        request_timeout: Duration::from_millis(100),
        max_pending: 1,
        ..ClientConfig::default()
    };
    let client = Arc::new(Client::connect(&server, None, config).unwrap());
    client.request("thread/start", json!({"threadId": "ct", "agentOptions": {"script": {"steps": [{"type": "message", "text": "running"}, {"type": "ignoreCancel", "ms": 1000}]}}})).unwrap();
    let turn = client
        .request(
            "turn/start",
            json!({"threadId": "ct", "input": [{"type": "text", "text": "go"}]}),
        )
        .unwrap();
    // The kernel is running (its message is out) before it is interrupted: an interrupt of a
    // turn still waiting for a runner settles at once, which is not what this measures.
    loop {
        let n = client
            .next_notification(Duration::from_secs(20))
            .expect("the turn's message");
        if n["method"] == "item/completed" {
            break;
        }
    }
    // turn/interrupt takes ~1 s to settle: the client times out at 100 ms with -32010, not success.
    let c2 = Arc::clone(&client);
    let tid = turn["turn"]["id"].clone();
    let slow = std::thread::spawn(move || {
        c2.request("turn/interrupt", json!({"threadId": "ct", "turnId": tid}))
    });
    // Wait until the interrupt is the pending request (a fixed sleep loses that race on a
    // loaded machine), well inside its 100 ms timeout's window of ~1 s of settling.
    let waiting = Instant::now();
    while client.pending_requests() == 0 && waiting.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let busy = client.request("thread/list", json!({}));
    assert_eq!(
        busy.as_ref().map_err(ClientError::code),
        Err(-32001),
        "one pending request is the cap"
    );
    let err = slow.join().unwrap().unwrap_err();
    assert_eq!((err.clone(), err.code()), (ClientError::Timeout, -32010));
    assert_eq!(client.pending_requests(), 0);
    // Timeout and closed are told apart; after close every request is refused.
    use cc_app_server::engine::RecvError;
    while client.recv_notification(Duration::from_millis(50)).is_ok() {}
    assert_eq!(
        client.recv_notification(Duration::from_millis(10)),
        Err(RecvError::Timeout)
    );
    client.close();
    client.close();
    assert!(client.is_closed());
    assert_eq!(
        client.request("thread/list", json!({})),
        Err(ClientError::Closed)
    );
    assert_eq!(
        client.recv_notification(Duration::from_millis(10)),
        Err(RecvError::Closed)
    );
}

/// A store failure is -32603 with no internals (no paths, no store text); other threads still work.
#[test]
fn a_corrupt_thread_is_an_internal_error_without_internals() {
    let dir = state_dir();
    {
        let server = server_with(dir.path(), |_| {});
        let mut raw = Raw::init(&server, &[]);
        raw.req(
            "thread/start",
            json!({"threadId": "bad", "title": "will be corrupted"}),
        );
        raw.req("thread/start", json!({"threadId": "good"}));
        raw.req(
            "turn/start",
            json!({"threadId": "bad", "input": [{"type": "text", "text": "hello"}]}),
        );
        completed(&mut raw);
        server.shutdown();
    }
    let path = dir.path().join("threads/bad.jsonl");
    let text = std::fs::read_to_string(&path).unwrap();
    let corrupted = text.replacen("will be corrupted", "WILL be corrupted", 1);
    assert_ne!(text, corrupted);
    std::fs::write(&path, corrupted).unwrap();

    let server = server_with(dir.path(), |_| {});
    let mut raw = Raw::init(&server, &[]);
    let r = raw.req("thread/read", json!({"threadId": "bad"}));
    assert_eq!(code(&r), -32603, "{r}");
    let message = r["error"]["message"].as_str().unwrap();
    assert!(
        !message.contains(dir.path().to_str().unwrap()) && !message.contains("seq"),
        "{message}"
    );
    let ok = raw.req("thread/read", json!({"threadId": "good"}));
    assert!(ok.get("result").is_some(), "{ok}");
}

/// A kernel cannot invent item types or send over-long text: its output is checked against the
/// schema before it is recorded, and the turn fails cleanly instead of emitting an invalid message.
#[test]
fn kernel_and_tool_output_is_checked_against_the_schema() {
    use cc_app_server::kernel::{AgentKernel, KernelError, ToolExecutor, TurnContext};
    use cc_app_server::protocol::{ItemContent, ToolCall, ToolResult, ToolResultError, UserInput};

    struct Inventive;
    impl AgentKernel for Inventive {
        fn run_turn(&self, ctx: &dyn TurnContext, _: &[UserInput]) -> Result<(), KernelError> {
            if ctx.agent_options()["tool"] == true {
                let call: ToolCall =
                    serde_json::from_value(json!({"tool": "t", "arguments": {}})).unwrap();
                let result = ctx.request_tool(&ctx.new_item_id(), call)?;
                assert!(matches!(result, ToolResult::Error(_)), "{result:?}");
                return Ok(());
            }
            ctx.item_started(ItemContent::Unknown(
                json!({"type": "hologram", "id": "h1"}),
            ))
        }
    }
    struct Verbose;
    impl ToolExecutor for Verbose {
        fn execute(&self, _: &str, _: &ToolCall) -> ToolResult {
            ToolResult::Error(ToolResultError {
                message: "x".repeat(5000),
            })
        }
    }
    let dir = state_dir();
    let server = server_with(dir.path(), |c| {
        c.kernel = Arc::new(Inventive);
        c.tools = Arc::new(Verbose);
        c.policy = ApprovalPolicy::AutoApprove;
    });
    let mut raw = Raw::init(&server, &[]);
    raw.req("thread/start", json!({"threadId": "inv"}));
    raw.req(
        "turn/start",
        json!({"threadId": "inv", "input": [{"type": "text", "text": "go"}]}),
    );
    let turn = completed(&mut raw);
    assert_eq!(turn["status"], "failed");
    assert_eq!(turn["error"]["code"], "kernelFailed");
    assert!(
        turn["error"]["message"]
            .as_str()
            .unwrap()
            .contains("invalid Item"),
        "{turn}"
    );

    raw.req(
        "thread/start",
        json!({"threadId": "verbose", "agentOptions": {"tool": true}}),
    );
    raw.req(
        "turn/start",
        json!({"threadId": "verbose", "input": [{"type": "text", "text": "go"}]}),
    );
    let result = raw.wait_method("tool/result");
    assert_eq!(
        result["params"]["result"]["message"],
        "the tool returned a result outside wire v1"
    );
    assert_eq!(completed(&mut raw)["status"], "completed");
}

/// The client's default pending cap at its edge: 256 requests in flight are fine, the 257th is
/// refused locally with -32001, and every one of the 256 is still answered.
#[test]
fn client_pending_cap_at_256_and_257() {
    let dir = state_dir();
    let server = server_with(dir.path(), |c| c.settle_deadline = Duration::from_secs(20));
    let client = Arc::new(Client::connect(&server, None, ClientConfig::default()).unwrap());
    let script =
        json!({"steps": [{"type": "message", "text": "in"}, {"type": "ignoreCancel", "ms": 5000}]});
    client
        .request(
            "thread/start",
            json!({"threadId": "cap", "agentOptions": {"script": script}}),
        )
        .unwrap();
    let turn = client
        .request(
            "turn/start",
            json!({"threadId": "cap", "input": [{"type": "text", "text": "go"}]}),
        )
        .unwrap();
    while client
        .next_notification(Duration::from_secs(20))
        .expect("notifications")["method"]
        != "item/completed"
    {}
    let tid = turn["turn"]["id"].clone();
    let waiters: Vec<_> = (0..256)
        .map(|_| {
            let (c, tid) = (Arc::clone(&client), tid.clone());
            std::thread::spawn(move || {
                c.request("turn/interrupt", json!({"threadId": "cap", "turnId": tid}))
            })
        })
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while client.pending_requests() < 256 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        client.pending_requests(),
        256,
        "256 requests in flight are allowed"
    );
    let refused = client.request("thread/list", json!({})).unwrap_err();
    assert_eq!(
        refused.code(),
        -32001,
        "the 257th is refused locally: {refused:?}"
    );
    for w in waiters {
        let r = w
            .join()
            .unwrap()
            .expect("every accepted request is answered");
        assert_eq!(r["physicallySettled"], true);
    }
    assert_eq!(client.pending_requests(), 0);
}

#[path = "rollout_util/mod.rs"]
mod rollout_util;

/// Issue 11: a hash-valid but schema-invalid stored event (a forged 300-character title, chain
/// and anchor recomputed) is never served and never takes a connection worker down, and
/// thread/list reports the thread as unreadable instead of hiding it.
#[test]
fn a_forged_schema_invalid_thread_is_listed_unreadable_and_never_kills_a_worker() {
    for store in [StoreKind::Jsonl, StoreKind::Sqlite] {
        let dir = state_dir();
        {
            let server = server_with(dir.path(), |c| c.store = store);
            let mut raw = Raw::init(&server, &[]);
            raw.req(
                "thread/start",
                json!({"threadId": "forged", "title": "short"}),
            );
            raw.req("thread/start", json!({"threadId": "good"}));
            server.shutdown();
        }
        let mut evs = rollout_util::events(store, dir.path(), "forged");
        evs[0].payload["title"] = json!("t".repeat(300));
        rollout_util::rechain(&mut evs);
        rollout_util::write_events(store, dir.path(), "forged", &evs);
        rollout_util::forge_anchor(store, dir.path(), "forged", &evs);

        let server = server_with(dir.path(), |c| c.store = store);
        let mut raw = Raw::init(&server, &[]);
        let list = raw.req("thread/list", json!({}));
        let ids: Vec<&str> = list["result"]["threads"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, vec!["good"], "{list}");
        let bad = &list["result"]["unreadable"][0];
        assert_eq!(
            (bad["threadId"].as_str(), bad["status"].as_str()),
            (Some("forged"), Some("unreadable")),
            "{list}"
        );
        assert!(bad["reason"].as_str().unwrap().contains("schema"), "{list}");
        for method in ["thread/archive", "thread/read", "thread/resume"] {
            let r = raw.req(method, json!({"threadId": "forged"}));
            assert_eq!(code(&r), -32603, "{method}: {r}");
            assert!(
                r["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("unreadable"),
                "{r}"
            );
        }
        // The same connection is still served.
        let again = raw.req("thread/read", json!({"threadId": "good"}));
        assert!(again.get("result").is_some(), "{again}");
        server.shutdown();
    }
}
