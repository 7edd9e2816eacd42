//! Issue 10's engine findings, each as a test that failed before the fix: the interrupt/approval
//! race, bounded running turns (limit and limit + 1), ids echoed byte for byte, outputs that stay
//! parseable at the depth bound, forks of settled history only, bounded memory structures,
//! idempotency across a restart, and the stats snapshot. Real stores in temp dirs, real threads.

use cc_app_server::approval::ApprovalPolicy;
use cc_app_server::client::{Client, ClientConfig};
use cc_app_server::engine::{AppServer, Connection, Limits, SendError, ServerConfig};
use cc_app_server::kernel::{AgentKernel, KernelError, ToolExecutor, TurnContext};
use cc_app_server::protocol::{
    AgentMessageItem, ItemContent, ToolCall, ToolResult, ToolResultOk, UserInput,
};
use serde_json::{json, Map, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

const T: Option<Duration> = Some(Duration::from_secs(20));

fn state_dir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

fn server_with(dir: &std::path::Path, f: impl FnOnce(&mut ServerConfig)) -> AppServer {
    let mut config = ServerConfig::new(dir);
    f(&mut config);
    AppServer::open(config).expect("server opens")
}

/// A raw connection that speaks JSON lines, as a host without the Rust client would.
struct Raw {
    conn: Connection,
    next: u64,
    seen: Vec<Value>,
}

impl Raw {
    fn init(server: &AppServer, features: &[&str]) -> Raw {
        let mut raw = Raw {
            conn: server.connect().unwrap(),
            next: 100,
            seen: Vec::new(),
        };
        let r = raw.req("initialize", json!({"protocolVersion": 1, "minimumProtocolVersion": 1, "client": {"name": "t", "version": "1"}, "features": features}));
        assert!(r.get("result").is_some(), "{r}");
        raw
    }

    /// Sends a line, retrying while the inbound queue is full (what a patient host does).
    fn send_text(&self, text: &str) {
        loop {
            match self.conn.send(text) {
                Ok(()) => return,
                Err(SendError::Overloaded { retry_after_ms }) => {
                    std::thread::sleep(Duration::from_millis(retry_after_ms.min(5)))
                }
                Err(e) => panic!("send failed: {e}"),
            }
        }
    }

    /// The next message as the raw text the server wrote, after checking that our own parser and
    /// validator accept it.
    fn recv_text(&mut self) -> String {
        let text = self.conn.recv(T).expect("a message within the timeout");
        let v: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("our parser refuses the server's message ({e})"));
        cc_agent_protocol::validate_protocol_message(&v)
            .unwrap_or_else(|e| panic!("server sent an invalid message: {e}\n{v}"));
        text
    }

    fn recv(&mut self) -> Value {
        let text = self.recv_text();
        serde_json::from_str(&text).unwrap()
    }

    fn req(&mut self, method: &str, params: Value) -> Value {
        self.next += 1;
        let id = self.next;
        self.send_text(
            &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string(),
        );
        self.response_to(&json!(id))
    }

    fn response_to(&mut self, id: &Value) -> Value {
        if let Some(i) = self
            .seen
            .iter()
            .position(|m| m.get("method").is_none() && m["id"] == *id)
        {
            return self.seen.remove(i);
        }
        loop {
            let m = self.recv();
            if m.get("method").is_none() && m["id"] == *id {
                return m;
            }
            self.seen.push(m);
        }
    }

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
}

fn code(resp: &Value) -> i64 {
    resp["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("expected an error, got {resp}"))
}

fn text(s: &str) -> Value {
    json!([{"type": "text", "text": s}])
}

fn completed_turn(raw: &mut Raw, turn_id: &Value) -> Value {
    let id = turn_id.clone();
    let params = raw
        .wait(move |m| m["method"] == "turn/completed" && m["params"]["turn"]["id"] == id)
        ["params"]
        .clone();
    // The published Turn has no error member: it travels beside it; folded in for assertions.
    let mut turn = params["turn"].clone();
    turn["error"] = params["error"].clone();
    turn
}

/// An `acceptOnce` that arrives right after `turn/interrupt` must never run the tool: the
/// approval wait wakes on the cancel, and the decision to execute re-checks it under the lock
/// `cancel` takes. Before the fix 8 of 8 such races ran the tool.
#[test]
fn an_accept_racing_an_interrupt_never_runs_the_tool() {
    let dir = state_dir();
    let server = server_with(dir.path(), |_| {});
    let mut raw = Raw::init(&server, &["structured_approval"]);
    let script = json!({"steps": [{"type": "tool", "tool": "fs.write", "arguments": {"path": "a.txt"}}, {"type": "message", "text": "after"}]});
    raw.req(
        "thread/start",
        json!({"threadId": "race", "agentOptions": {"script": script}}),
    );
    const ROUNDS: u64 = 60;
    for round in 0..ROUNDS {
        let t = raw.req(
            "turn/start",
            json!({"threadId": "race", "input": text("go")}),
        );
        let turn_id = t["result"]["turn"]["id"].clone();
        let ask = raw.wait_method("approval/decide");
        // The interrupt first, then the acceptance 0-10 ms later, without waiting for answers.
        raw.send_text(&json!({"jsonrpc": "2.0", "id": 10_000 + round, "method": "turn/interrupt", "params": {"threadId": "race", "turnId": turn_id}}).to_string());
        std::thread::sleep(Duration::from_micros((round % 11) * 1000));
        raw.send_text(
            &json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"kind": "acceptOnce"}})
                .to_string(),
        );
        let answer = raw.response_to(&json!(10_000 + round));
        assert_eq!(answer["result"]["physicallySettled"], true, "{answer}");
        let turn = completed_turn(&mut raw, &turn_id);
        assert_eq!(turn["status"], "interrupted", "round {round}: {turn}");
        let result = raw.wait(|m| m["method"] == "tool/result");
        assert_eq!(result["params"]["result"]["status"], "denied", "{result}");
    }
    assert_eq!(
        server.stats().tools_executed.load(Ordering::SeqCst),
        0,
        "no tool ran after an accepted interrupt"
    );
}

/// At most `max_running_turns` kernels run; `max_queued_turns` more wait as `queued`; one more is
/// -32001 with retry_after_ms. An interrupted queued turn closes without its kernel ever running,
/// and queued turns run as runners free up.
#[test]
fn running_turns_are_bounded_then_queued_then_refused() {
    let dir = state_dir();
    let server = server_with(dir.path(), |c| {
        c.limits = Limits {
            max_running_turns: 2,
            max_queued_turns: 1,
            ..Limits::default()
        };
    });
    let mut raw = Raw::init(&server, &[]);
    let slow =
        json!({"steps": [{"type": "sleep", "ms": 30_000}, {"type": "message", "text": "done"}]});
    for t in ["a", "b", "c", "d"] {
        raw.req(
            "thread/start",
            json!({"threadId": t, "agentOptions": {"script": slow}}),
        );
    }
    let mut turns = Vec::new();
    for t in ["a", "b"] {
        let r = raw.req("turn/start", json!({"threadId": t, "input": text("go")}));
        turns.push(r["result"]["turn"]["id"].clone());
    }
    // Both kernels are running (running is recorded before the kernel starts).
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.stats_snapshot().turns_running < 2 {
        assert!(Instant::now() < deadline, "{:?}", server.stats_snapshot());
        std::thread::sleep(Duration::from_millis(5));
    }
    // Limit + 0 queued: the third waits for a runner.
    let third = raw.req("turn/start", json!({"threadId": "c", "input": text("go")}));
    assert_eq!(third["result"]["turn"]["status"], "queued", "{third}");
    let third_id = third["result"]["turn"]["id"].clone();
    let s = server.stats_snapshot();
    assert_eq!(
        (s.turns_running, s.turns_queued, s.runner_threads),
        (2, 1, 2),
        "{s:?}"
    );
    // Limit + 1: refused, nothing recorded for it, the thread stays free.
    let fourth = raw.req("turn/start", json!({"threadId": "d", "input": text("go")}));
    assert_eq!(code(&fourth), -32001, "{fourth}");
    assert!(fourth["error"]["data"]["retry_after_ms"].as_u64().unwrap() > 0);
    assert_eq!(server.stats_snapshot().turns_refused_overloaded, 1);
    let d = raw.req("thread/read", json!({"threadId": "d"}));
    assert_eq!(d["result"]["events"].as_array().unwrap().len(), 1, "{d}");
    assert_eq!(d["result"]["thread"]["status"], "idle");
    // Interrupting the queued turn closes it at once; its kernel never ran.
    let r = raw.req(
        "turn/interrupt",
        json!({"threadId": "c", "turnId": third_id}),
    );
    assert_eq!(r["result"]["turn"]["status"], "interrupted", "{r}");
    let c = raw.req("thread/read", json!({"threadId": "c"}));
    let kinds: Vec<&str> = c["result"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["payload"]["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["threadStarted", "turnStarted", "turnCompleted"],
        "{c}"
    );
    // Room again: d queues behind the two running kernels, then runs when one ends.
    let fourth = raw.req("turn/start", json!({"threadId": "d", "input": text("go")}));
    assert_eq!(fourth["result"]["turn"]["status"], "queued", "{fourth}");
    let r = raw.req(
        "turn/interrupt",
        json!({"threadId": "a", "turnId": turns[0]}),
    );
    assert_eq!(r["result"]["turn"]["status"], "interrupted", "{r}");
    let d_turn = fourth["result"]["turn"]["id"].clone();
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.stats_snapshot().turns_queued > 0 {
        assert!(Instant::now() < deadline, "the queued turn got a runner");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(server.stats_snapshot().runner_threads <= 2);
    for (thread, turn) in [("b", &turns[1]), ("d", &d_turn)] {
        let r = raw.req(
            "turn/interrupt",
            json!({"threadId": thread, "turnId": turn}),
        );
        assert_eq!(r["result"]["turn"]["status"], "interrupted", "{r}");
    }
}

fn exact_reply(raw: &mut Raw, line: &str) -> String {
    raw.send_text(line);
    raw.recv_text()
}

/// Ids come back exactly as written (strings, integers, integral numbers in any spelling);
/// non-integral and out-of-range numbers, and any other type, are -32600 with id null.
#[test]
fn request_ids_are_echoed_byte_for_byte() {
    let dir = state_dir();
    let server = server_with(dir.path(), |_| {});
    let mut raw = Raw::init(&server, &[]);
    for id in [
        "7",
        "1e2",
        "100.0",
        "-0",
        "0.5e1",
        "9007199254740991",
        r#""1""#,
        r#""\u0031""#,
        r#""req \"7\" é""#,
        r#""""#,
    ] {
        let reply = exact_reply(
            &mut raw,
            &format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"thread/list","params":{{}}}}"#),
        );
        assert!(
            reply.starts_with(&format!(r#"{{"jsonrpc":"2.0","id":{id},"result":"#)),
            "id {id} echoed as written: {reply}"
        );
    }
    let long = format!("\"{}\"", "x".repeat(129));
    for id in [
        "1e-400",
        "1.5",
        "-1",
        "9007199254740992",
        "1e16",
        "null",
        "true",
        "[1]",
        "{}",
        long.as_str(),
    ] {
        let reply = exact_reply(
            &mut raw,
            &format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"thread/list","params":{{}}}}"#),
        );
        let v: Value = serde_json::from_str(&reply).unwrap();
        assert_eq!(
            (code(&v), &v["id"]),
            (-32600, &Value::Null),
            "id {id}: {reply}"
        );
    }
    // A repeated id: the last one counts, as the parser keeps the last member.
    let reply = exact_reply(
        &mut raw,
        r#"{"jsonrpc":"2.0","id":"first","id":"last","method":"thread/list"}"#,
    );
    assert!(
        reply.starts_with(r#"{"jsonrpc":"2.0","id":"last","#),
        "{reply}"
    );
    // Errors echo the id too (a method that does not exist).
    let reply = exact_reply(
        &mut raw,
        r#"{"jsonrpc":"2.0","id":"x-1","method":"thread/explode"}"#,
    );
    assert!(
        reply.starts_with(r#"{"jsonrpc":"2.0","id":"x-1","error":"#),
        "{reply}"
    );
    // The Rust client still sends integers and gets its answers.
    let client = Client::connect(&server, None, ClientConfig::default()).unwrap();
    assert!(client.request("thread/list", json!({})).is_ok());
}

fn nested(levels: usize) -> Value {
    let mut v = json!("leaf");
    for _ in 0..levels {
        v = json!([v]);
    }
    v
}

/// A kernel that produces what the test asks for through `agentOptions.emit`.
struct EmittingKernel;

impl AgentKernel for EmittingKernel {
    fn run_turn(&self, ctx: &dyn TurnContext, _input: &[UserInput]) -> Result<(), KernelError> {
        let depth = ctx.agent_options()["itemExtraDepth"].as_u64().unwrap_or(0) as usize;
        let mut extra = Map::new();
        extra.insert("deep".into(), nested(depth));
        let item = ItemContent::AgentMessage(AgentMessageItem {
            id: ctx.new_item_id(),
            text: "x".into(),
            extra,
        });
        ctx.item_started(item.clone())?;
        ctx.item_completed(item)?;
        if let Some(args) = ctx.agent_options().get("toolArguments") {
            let call: ToolCall =
                serde_json::from_value(json!({"tool": "deep.tool", "arguments": args})).unwrap();
            ctx.request_tool(&ctx.new_item_id(), call)?;
        }
        Ok(())
    }
}

/// A tool that answers with output nested `depth` levels.
struct DeepTool;

impl ToolExecutor for DeepTool {
    fn execute(&self, _thread_id: &str, call: &ToolCall) -> ToolResult {
        let depth = call.arguments["outputDepth"].as_u64().unwrap_or(0) as usize;
        ToolResult::Ok(ToolResultOk {
            output: nested(depth),
        })
    }
}

/// Whatever is accepted can be served back: a request at the 64-level bound is stored and every
/// answer that carries it (thread/list, thread/read, thread/fork, notifications) stays inside the
/// 127 levels our parser, the Rust client and every binding accept; one level more is refused
/// up front. Kernel and tool output past 64 levels is refused before it is recorded. Before the
/// fix a 127-level metadata value was accepted and every later thread/list nested past 127.
#[test]
fn answers_stay_parseable_at_the_depth_bound() {
    let dir = state_dir();
    let server = server_with(dir.path(), |c| {
        c.kernel = Arc::new(EmittingKernel);
        c.tools = Arc::new(DeepTool);
        c.policy = ApprovalPolicy::AutoApprove;
    });
    let mut raw = Raw::init(&server, &[]);
    // envelope (1) > params (2) > metadata (3) > 61 arrays: 64 levels, the bound.
    let at_bound = json!({"threadId": "deep", "metadata": {"k": nested(61)}});
    assert!(raw.req("thread/start", at_bound)["result"].is_object());
    let past = json!({"threadId": "deeper", "metadata": {"k": nested(62)}});
    let r = raw.req("thread/start", past);
    assert_eq!(code(&r), -32602, "{r}");
    assert!(r["error"]["data"]["pointer"]
        .as_str()
        .unwrap()
        .starts_with("/params/metadata/k"));
    // agentOptions at the bound too, through a second thread.
    let options =
        json!({"itemExtraDepth": 60, "toolArguments": {"outputDepth": 60, "pad": nested(55)}});
    let r = raw.req(
        "thread/start",
        json!({"threadId": "deep-turn", "agentOptions": options}),
    );
    assert!(r["result"].is_object(), "{r}");
    let t = raw.req(
        "turn/start",
        json!({"threadId": "deep-turn", "input": text("go")}),
    );
    let turn = completed_turn(&mut raw, &t["result"]["turn"]["id"]);
    assert_eq!(turn["status"], "completed", "{turn}");
    // Every answer that carries the stored data parses (Raw::recv checks each message with our
    // parser and validator); and through the Rust client.
    let client = Client::connect(&server, None, ClientConfig::default()).unwrap();
    for (method, params) in [
        ("thread/list", json!({})),
        ("thread/read", json!({"threadId": "deep"})),
        ("thread/read", json!({"threadId": "deep-turn"})),
        ("thread/resume", json!({"threadId": "deep-turn"})),
        (
            "thread/fork",
            json!({"threadId": "deep", "newThreadId": "deep-fork"}),
        ),
        (
            "thread/fork",
            json!({"threadId": "deep-turn", "newThreadId": "deep-turn-fork"}),
        ),
        ("thread/read", json!({"threadId": "deep-turn-fork"})),
    ] {
        let r = raw.req(method, params.clone());
        assert!(r.get("result").is_some(), "{method}: {r}");
        let mut params = params;
        if let Some(id) = params.get("newThreadId").and_then(Value::as_str) {
            params["newThreadId"] = json!(format!("{id}-c"));
        }
        let via_client = client.request(method, params);
        assert!(
            via_client.is_ok(),
            "{method} through the Rust client: {via_client:?}"
        );
    }
    // Kernel output past 64 levels (an item 2 + 62 deep) is refused: the turn fails, nothing
    // unservable is recorded; a tool's deep output becomes a tool error.
    let options = json!({"itemExtraDepth": 64});
    raw.req(
        "thread/start",
        json!({"threadId": "too-deep", "agentOptions": options}),
    );
    let t = raw.req(
        "turn/start",
        json!({"threadId": "too-deep", "input": text("go")}),
    );
    let turn = completed_turn(&mut raw, &t["result"]["turn"]["id"]);
    assert_eq!(
        (turn["status"].as_str(), turn["error"]["code"].as_str()),
        (Some("failed"), Some("kernelFailed")),
        "{turn}"
    );
    let options = json!({"itemExtraDepth": 1, "toolArguments": {"outputDepth": 100}});
    raw.req(
        "thread/start",
        json!({"threadId": "deep-tool", "agentOptions": options}),
    );
    let t = raw.req(
        "turn/start",
        json!({"threadId": "deep-tool", "input": text("go")}),
    );
    completed_turn(&mut raw, &t["result"]["turn"]["id"]);
    let read = raw.req("thread/read", json!({"threadId": "deep-tool"}));
    let result = read["result"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["payload"]["type"] == "toolResult")
        .expect("a tool result was recorded")
        .clone();
    assert_eq!(result["payload"]["result"]["status"], "error", "{result}");
    let listed = client.request("thread/list", json!({})).unwrap();
    assert!(listed["threads"].as_array().unwrap().len() >= 5);
}

/// A fork taken while a turn runs copies only settled history: nothing of the live turn (before
/// the fix it was copied and closed in the fork as failed/serverRestarted under the same id).
/// An atEventSeq inside the live turn is -32009; once the turn ends it can be forked whole.
#[test]
fn fork_mid_turn_copies_only_settled_history() {
    let dir = state_dir();
    let server = server_with(dir.path(), |_| {});
    let mut raw = Raw::init(&server, &[]);
    let script = json!({"steps": [{"type": "message", "text": "first part", "chunks": 3}, {"type": "sleep", "ms": 30_000}]});
    raw.req(
        "thread/start",
        json!({"threadId": "src", "agentOptions": {"script": {"steps": [{"type": "echo"}]}}}),
    );
    let t = raw.req(
        "turn/start",
        json!({"threadId": "src", "input": text("settled")}),
    );
    let settled_turn = t["result"]["turn"]["id"].clone();
    completed_turn(&mut raw, &settled_turn);
    let settled_seq = raw.req("thread/read", json!({"threadId": "src"}))["result"]["thread"]
        ["revision"]
        .as_u64()
        .unwrap();
    // A live turn that has already recorded events, on a thread whose settled part is its header.
    raw.req(
        "thread/start",
        json!({"threadId": "src2", "agentOptions": {"script": script}}),
    );
    let t = raw.req(
        "turn/start",
        json!({"threadId": "src2", "input": text("live")}),
    );
    let live = t["result"]["turn"]["id"].clone();
    raw.wait(|m| m["method"] == "item/completed" && m["params"]["threadId"] == "src2");
    let head = raw.req("thread/read", json!({"threadId": "src2"}))["result"]["thread"]["revision"]
        .as_u64()
        .unwrap();
    assert!(head >= 5, "the live turn recorded events: {head}");
    let f = raw.req(
        "thread/fork",
        json!({"threadId": "src2", "newThreadId": "fork-live"}),
    );
    assert!(f["result"].is_object(), "{f}");
    assert_eq!(f["result"]["forkedFrom"]["eventSeq"], 1, "{f}");
    let events =
        raw.req("thread/read", json!({"threadId": "fork-live"}))["result"]["events"].clone();
    for e in events.as_array().unwrap() {
        assert_ne!(
            e["payload"]["turnId"], live,
            "the fork carries nothing of the live turn: {e}"
        );
    }
    assert_eq!(events.as_array().unwrap().len(), 1, "{events}");
    // Inside the live turn: a conflict that names the turn and where to fork instead.
    let r = raw.req(
        "thread/fork",
        json!({"threadId": "src2", "newThreadId": "f2", "atEventSeq": 3}),
    );
    assert_eq!(code(&r), -32009, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains(live.as_str().unwrap()),
        "{r}"
    );
    // Before the live turn: fine.
    let r = raw.req(
        "thread/fork",
        json!({"threadId": "src2", "newThreadId": "f3", "atEventSeq": 1}),
    );
    assert!(r["result"].is_object(), "{r}");
    // A thread without a live turn forks whole.
    let r = raw.req(
        "thread/fork",
        json!({"threadId": "src", "newThreadId": "f4"}),
    );
    assert_eq!(r["result"]["forkedFrom"]["eventSeq"], settled_seq, "{r}");
    // After the live turn ends, its events can be forked, closed by its own terminal event.
    let r = raw.req(
        "turn/interrupt",
        json!({"threadId": "src2", "turnId": live}),
    );
    assert_eq!(r["result"]["turn"]["status"], "interrupted");
    let r = raw.req(
        "thread/fork",
        json!({"threadId": "src2", "newThreadId": "f5"}),
    );
    let fork_events = raw.req("thread/read", json!({"threadId": "f5"}))["result"]["events"].clone();
    let last = fork_events.as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["payload"]["type"], "turnCompleted", "{r} {last}");
    assert_eq!(last["payload"]["status"], "interrupted", "{last}");
}

/// Loaded threads, followed threads and recent turns are bounded; an unloaded thread reloads from
/// the rollout with its agentOptions; a thread with a live turn is never unloaded.
#[test]
fn loaded_threads_are_bounded_and_reload_intact() {
    let dir = state_dir();
    let server = server_with(dir.path(), |c| {
        c.limits = Limits {
            max_loaded_threads: 8,
            max_followed_threads: 8,
            recent_turns: 2,
            ..Limits::default()
        };
    });
    let mut raw = Raw::init(&server, &[]);
    let script = json!({"steps": [{"type": "message", "text": "scripted reply"}]});
    raw.req(
        "thread/start",
        json!({"threadId": "first", "agentOptions": {"script": script}}),
    );
    let mut first_turns = Vec::new();
    for i in 0..3 {
        let t = raw.req(
            "turn/start",
            json!({"threadId": "first", "input": text(&format!("turn {i}"))}),
        );
        first_turns.push(t["result"]["turn"]["id"].clone());
        completed_turn(&mut raw, &first_turns[i]);
    }
    for i in 0..60 {
        raw.req(
            "thread/start",
            json!({"threadId": format!("t{i}"), "metadata": {"i": i}}),
        );
    }
    let s = server.stats_snapshot();
    assert!(s.threads_loaded <= 8, "{s:?}");
    assert!(s.threads_unloaded >= 52, "{s:?}");
    // "first" was unloaded; it reloads with its script (now recorded in the header).
    let t = raw.req(
        "turn/start",
        json!({"threadId": "first", "input": text("again")}),
    );
    let turn = completed_turn(&mut raw, &t["result"]["turn"]["id"]);
    assert_eq!(turn["status"], "completed");
    let read = raw.req("thread/read", json!({"threadId": "first", "limit": 1000}));
    let texts: Vec<&str> = read["result"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["payload"]["type"] == "itemCompleted")
        .map(|e| e["payload"]["item"]["text"].as_str().unwrap())
        .collect();
    assert_eq!(
        texts, ["scripted reply"; 4],
        "the script survived unloading"
    );
    // An old turn no longer in memory is still found (from its terminal event).
    let r = raw.req(
        "turn/interrupt",
        json!({"threadId": "first", "turnId": first_turns[0]}),
    );
    assert_eq!(r["result"]["turn"]["status"], "completed", "{r}");
    assert_eq!(r["result"]["turn"]["id"], first_turns[0]);
    let r = raw.req(
        "turn/interrupt",
        json!({"threadId": "first", "turnId": "tu-never"}),
    );
    assert_eq!(code(&r), -32004);
    // A live turn pins its thread.
    raw.req("thread/start", json!({"threadId": "live", "agentOptions": {"script": {"steps": [{"type": "sleep", "ms": 30_000}]}}}));
    let t = raw.req(
        "turn/start",
        json!({"threadId": "live", "input": text("go")}),
    );
    for i in 60..90 {
        raw.req("thread/start", json!({"threadId": format!("t{i}")}));
    }
    assert!(server.stats_snapshot().threads_loaded <= 9);
    let r = raw.req(
        "turn/interrupt",
        json!({"threadId": "live", "turnId": t["result"]["turn"]["id"]}),
    );
    assert_eq!(r["result"]["turn"]["status"], "interrupted", "{r}");
}

/// A retried thread/start or turn/start after a restart returns the same result (rebuilt from the
/// idempotencyKey the rollout records), not -32009; other params with the same key still conflict.
#[test]
fn idempotency_survives_a_restart() {
    let dir = state_dir();
    let (thread_result, turn_result) = {
        let server = server_with(dir.path(), |_| {});
        let mut raw = Raw::init(&server, &[]);
        let a = raw.req("thread/start", json!({"threadId": "idem", "title": "T", "metadata": {"m": 1}, "agentOptions": {"model": "x"}, "idempotencyKey": "k-thread"}));
        let again = raw.req("thread/start", json!({"threadId": "idem", "title": "T", "metadata": {"m": 1}, "agentOptions": {"model": "x"}, "idempotencyKey": "k-thread"}));
        assert_eq!(a["result"], again["result"]);
        let t = raw.req(
            "turn/start",
            json!({"threadId": "idem", "input": text("once"), "idempotencyKey": "k-turn"}),
        );
        completed_turn(&mut raw, &t["result"]["turn"]["id"]);
        let anon = raw.req("thread/start", json!({"idempotencyKey": "k-anon"}));
        server.shutdown();
        (
            a["result"].clone(),
            (t["result"].clone(), anon["result"].clone()),
        )
    };
    let server = server_with(dir.path(), |_| {});
    // Opening reads no history: the keys are found in the rollout when a retry misses the
    // (empty) cache, and the answers rebuilt from what the rollout recorded.
    assert_eq!(server.idempotency_entries(), 0, "nothing replayed at open");
    let mut raw = Raw::init(&server, &[]);
    let retry = raw.req("thread/start", json!({"threadId": "idem", "title": "T", "metadata": {"m": 1}, "agentOptions": {"model": "x"}, "idempotencyKey": "k-thread"}));
    assert_eq!(retry["result"], thread_result, "{retry}");
    let retry = raw.req(
        "turn/start",
        json!({"threadId": "idem", "input": text("once"), "idempotencyKey": "k-turn"}),
    );
    assert_eq!(retry["result"], turn_result.0, "{retry}");
    let retry = raw.req("thread/start", json!({"idempotencyKey": "k-anon"}));
    assert_eq!(retry["result"], turn_result.1, "{retry}");
    // Same key, other params: still a conflict after the restart.
    let other = raw.req(
        "thread/start",
        json!({"threadId": "idem", "title": "Other", "idempotencyKey": "k-thread"}),
    );
    assert_eq!(code(&other), -32009, "{other}");
    let other = raw.req(
        "turn/start",
        json!({"threadId": "idem", "input": text("twice"), "idempotencyKey": "k-turn"}),
    );
    assert_eq!(code(&other), -32009, "{other}");
    let other = raw.req(
        "thread/start",
        json!({"threadId": "not-idem", "idempotencyKey": "k-anon"}),
    );
    assert_eq!(code(&other), -32009, "{other}");
    // Exactly one turn ran.
    let read = raw.req("thread/read", json!({"threadId": "idem"}));
    let started = read["result"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["payload"]["type"] == "turnStarted")
        .count();
    assert_eq!(started, 1);
}

/// The snapshot a host can poll: connections, turns, queues, slow-consumer closes, ignored
/// responses and failed-closed approvals by reason.
#[test]
fn the_stats_snapshot_counts_what_hosts_need() {
    let dir = state_dir();
    let server = server_with(dir.path(), |c| {
        c.limits = Limits {
            outbound_messages: 4,
            outbound_stall: Duration::from_millis(200),
            ..Limits::default()
        };
    });
    let before = server.stats_snapshot();
    assert_eq!((before.connections_open, before.turns_running), (0, 0));
    let mut raw = Raw::init(&server, &[]); // no structured_approval: tools fail closed
    let script = json!({"steps": [{"type": "tool", "tool": "fs.write", "arguments": {}}]});
    raw.req(
        "thread/start",
        json!({"threadId": "s", "agentOptions": {"script": script}}),
    );
    let t = raw.req("turn/start", json!({"threadId": "s", "input": text("go")}));
    completed_turn(&mut raw, &t["result"]["turn"]["id"]);
    raw.send_text(r#"{"jsonrpc":"2.0","id":4242,"result":{}}"#);
    raw.req("thread/list", json!({}));
    let s = server.stats_snapshot();
    assert_eq!(s.connections_open, 1, "{s:?}");
    assert_eq!(s.connections_opened, 1, "{s:?}");
    assert_eq!(s.failed_closed.no_handler, 1, "{s:?}");
    assert_eq!(s.failed_closed.total(), 1, "{s:?}");
    assert_eq!(s.ignored_responses, 1, "{s:?}");
    assert_eq!(s.tools_executed, 0);
    // A second connection that never reads is closed as a slow consumer after the stall.
    let lazy = server.connect().unwrap();
    lazy.send(r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"minimumProtocolVersion":1,"client":{"name":"t","version":"1"},"features":[]}}"#).unwrap();
    for i in 2..40 {
        let _ = lazy.send(&format!(
            r#"{{"jsonrpc":"2.0","id":{i},"method":"thread/list"}}"#
        ));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while lazy.is_open() {
        assert!(
            Instant::now() < deadline,
            "the stalled connection was closed"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let s = server.stats_snapshot();
    assert_eq!(
        (s.closed_slow_consumers, s.connections_open),
        (1, 1),
        "{s:?}"
    );
}
