//! The OpenAI-compatible kernel inside the real engine, against a real HTTP server on loopback
//! serving recorded streams: answers, parallel tool calls with their ids, declines, retries, every
//! failure mode, interrupt mid-stream, history across restart, fork and compaction.
#![cfg(feature = "openai")]

mod openai_support;

use cc_app_server::approval::ApprovalPolicy;
use cc_app_server::engine::{AppServer, Connection, ServerConfig};
use cc_app_server::openai::{OpenAiCompatibleKernel, OpenAiConfig};
use cc_app_server::protocol::{AcceptOnce, ApprovalDecision, Decline};
use cc_app_server::workspace_tools::WorkspaceTools;
use openai_support::*;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

const T: Option<Duration> = Some(Duration::from_secs(20));
const KEY: &str = "sk-test-0123456789abcdef";

struct Rig {
    _dir: tempfile::TempDir,
    state: std::path::PathBuf,
    ws: std::path::PathBuf,
    server: AppServer,
}

fn kernel_config(model: &MockModel) -> OpenAiConfig {
    OpenAiConfig::new(&model.base_url, "gpt-4o-mini")
        .with_api_key(Some(KEY.into()))
        .with_retries(3, Duration::from_millis(10))
        .with_request_timeout(Duration::from_secs(5))
}

fn open(state: &std::path::Path, ws: &std::path::Path, config: OpenAiConfig) -> AppServer {
    let mut c = ServerConfig::new(state);
    c.kernel = Arc::new(OpenAiCompatibleKernel::new(config).unwrap());
    c.tools = Arc::new(WorkspaceTools::new(ws).unwrap());
    c.policy = ApprovalPolicy::AskEveryTime;
    c.settle_deadline = Duration::from_secs(2);
    AppServer::open(c).unwrap()
}

fn rig_with(model: &MockModel, f: impl FnOnce(OpenAiConfig) -> OpenAiConfig) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let server = open(&state, &ws, f(kernel_config(model)));
    Rig {
        _dir: dir,
        state,
        ws,
        server,
    }
}

fn rig(model: &MockModel) -> Rig {
    rig_with(model, |c| c)
}

struct Raw {
    conn: Connection,
    next: u64,
    seen: Vec<Value>,
}

impl Raw {
    fn init(server: &AppServer) -> Raw {
        let mut raw = Raw {
            conn: server.connect().unwrap(),
            next: 0,
            seen: Vec::new(),
        };
        let r = raw.req(
            "initialize",
            json!({"protocolVersion": 1, "minimumProtocolVersion": 1,
            "client": {"name": "t", "version": "1"},
            "features": ["thread_turn_item", "structured_approval", "thread_compact"]}),
        );
        assert!(r.get("result").is_some(), "{r}");
        raw
    }

    fn recv(&mut self) -> Value {
        let v: Value =
            serde_json::from_str(&self.conn.recv(T).expect("a message in time")).unwrap();
        cc_agent_protocol::validate_protocol_message(&v).unwrap();
        v
    }

    fn send(&mut self, method: &str, params: Value) -> u64 {
        self.next += 1;
        self.conn
            .send(
                &json!({"jsonrpc": "2.0", "id": self.next, "method": method, "params": params})
                    .to_string(),
            )
            .unwrap();
        self.next
    }

    fn req(&mut self, method: &str, params: Value) -> Value {
        let id = self.send(method, params);
        self.response(id)
    }

    fn response(&mut self, id: u64) -> Value {
        loop {
            let m = self.recv();
            if m.get("method").is_none() && m["id"] == json!(id) {
                return m;
            }
            self.seen.push(m);
        }
    }

    fn wait(&mut self, method: &str) -> Value {
        if let Some(i) = self.seen.iter().position(|m| m["method"] == method) {
            return self.seen.remove(i);
        }
        loop {
            let m = self.recv();
            if m["method"] == method {
                return m;
            }
            self.seen.push(m);
        }
    }

    fn decide(&mut self, decision: ApprovalDecision) {
        let ask = self.wait("approval/decide");
        let d = serde_json::to_value(decision).unwrap();
        self.conn
            .send(
                &json!({"jsonrpc": "2.0", "id": ask["id"],
                "result": d})
                .to_string(),
            )
            .unwrap();
    }

    fn turn(&mut self, thread: &str, text: &str) -> String {
        let r = self.req(
            "turn/start",
            json!({"threadId": thread, "input": [{"type": "text", "text": text}]}),
        );
        r["result"]["turn"]["id"]
            .as_str()
            .unwrap_or_else(|| panic!("{r}"))
            .to_string()
    }

    /// The terminal Turn of the next turn/completed.
    fn completed(&mut self) -> Value {
        // The published Turn has no error member: it travels beside it; folded in here.
        let params = self.wait("turn/completed")["params"].clone();
        let mut turn = params["turn"].clone();
        turn["error"] = params["error"].clone();
        turn
    }

    fn items(&self, kind: &str) -> Vec<Value> {
        self.seen
            .iter()
            .filter(|m| {
                m["method"] == "item/completed" && m["params"]["item"]["content"]["type"] == kind
            })
            .map(|m| m["params"]["item"]["content"].clone())
            .collect()
    }
}

fn rollout_text(rig: &Rig, thread: &str) -> String {
    std::fs::read_to_string(rig.state.join("threads").join(format!("{thread}.jsonl"))).unwrap()
}

#[test]
fn a_plain_answer_streams_into_one_agent_message_with_usage() {
    let model = MockModel::start(vec![answer(&["Hel", "lo", " there"])]);
    let rig = rig(&model);
    let mut raw = Raw::init(&rig.server);
    raw.req("thread/start", json!({"threadId": "t1", "agentOptions": {"instructions": "Be terse.", "model": "gpt-4.1"}}));
    raw.turn("t1", "hi");
    assert_eq!(raw.completed()["status"], "completed");
    let answers = raw.items("agentMessage");
    assert_eq!(answers.len(), 1);
    assert_eq!(answers[0]["text"], "Hello there");
    assert_eq!(answers[0]["usage"]["totalTokens"], 23);
    assert_eq!(answers[0]["finishReason"], "stop");
    let deltas: String = raw
        .seen
        .iter()
        .filter(|m| m["method"] == "item/delta")
        .map(|m| m["params"]["delta"]["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(deltas, "Hello there");
    let req = &model.requests()[0];
    assert_eq!(req.path, "/v1/chat/completions");
    assert_eq!(
        req.header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
    assert_eq!(req.body["stream"], true);
    assert_eq!(req.body["model"], "gpt-4.1", "agentOptions.model wins");
    assert_eq!(
        req.body["messages"][0],
        json!({"role": "system", "content": "Be terse."})
    );
    assert_eq!(
        req.body["messages"][1],
        json!({"role": "user", "content": "hi"})
    );
    let names: Vec<&str> = req.body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["read_file", "write_file", "list_directory", "run_command"]
    );
    assert!(
        !rollout_text(&rig, "t1").contains(KEY),
        "the key reached the rollout"
    );
}

#[test]
fn two_parallel_tool_calls_run_through_the_gate_and_go_back_with_their_ids() {
    let model = MockModel::start(vec![
        tool_calls(&[
            (
                "call_A1",
                "write_file",
                r#"{"path":"notes/a.txt","content":"alpha"}"#,
            ),
            (
                "call_B2",
                "run_command",
                r#"{"argv":["cat","notes/a.txt"]}"#,
            ),
        ]),
        answer(&["Both done."]),
    ]);
    let rig = rig(&model);
    let mut raw = Raw::init(&rig.server);
    raw.req("thread/start", json!({"threadId": "t2"}));
    raw.turn("t2", "write then read");
    raw.decide(ApprovalDecision::AcceptOnce(AcceptOnce {}));
    raw.decide(ApprovalDecision::AcceptOnce(AcceptOnce {}));
    assert_eq!(raw.completed()["status"], "completed");
    assert_eq!(
        std::fs::read_to_string(rig.ws.join("notes/a.txt")).unwrap(),
        "alpha"
    );
    let file = &raw.items("fileChange")[0];
    assert_eq!(file["status"], "completed");
    assert_eq!(
        file["changes"][0],
        json!({"path": "notes/a.txt", "kind": "add"})
    );
    assert_eq!(file["modelCallId"], "call_A1");
    assert_eq!(
        file["usage"]["totalTokens"], 52,
        "the step's usage rides on its first item"
    );
    let cmd = &raw.items("commandExecution")[0];
    assert_eq!(cmd["command"], json!(["cat", "notes/a.txt"]));
    assert_eq!(
        (cmd["status"].as_str(), cmd["exitCode"].as_i64()),
        (Some("completed"), Some(0))
    );
    assert_eq!(cmd["output"], "alpha");
    let second = &model.requests()[1].body["messages"];
    let n = second.as_array().unwrap().len();
    let assistant = &second[n - 3];
    assert_eq!(assistant["role"], "assistant");
    assert_eq!(assistant["tool_calls"][0]["id"], "call_A1");
    assert_eq!(
        assistant["tool_calls"][1]["function"]["name"],
        "run_command"
    );
    assert_eq!(
        assistant["tool_calls"][1]["function"]["arguments"],
        r#"{"argv":["cat","notes/a.txt"]}"#
    );
    assert_eq!(second[n - 2]["role"], "tool");
    assert_eq!(second[n - 2]["tool_call_id"], "call_A1");
    assert_eq!(second[n - 1]["tool_call_id"], "call_B2");
    let out: Value = serde_json::from_str(second[n - 1]["content"].as_str().unwrap()).unwrap();
    assert_eq!(out["stdout"], "alpha");
    assert_eq!(raw.items("agentMessage")[0]["text"], "Both done.");
}

#[test]
fn a_declined_tool_does_not_run_and_the_model_is_told() {
    let model = MockModel::start(vec![
        tool_calls(&[("call_X", "write_file", r#"{"path":"x.txt","content":"x"}"#)]),
        answer(&["OK, I won't."]),
    ]);
    let rig = rig(&model);
    let mut raw = Raw::init(&rig.server);
    raw.req("thread/start", json!({"threadId": "t3"}));
    raw.turn("t3", "write x");
    raw.decide(ApprovalDecision::Decline(Decline { reason: None }));
    assert_eq!(raw.completed()["status"], "completed");
    assert!(!rig.ws.join("x.txt").exists());
    assert_eq!(raw.items("fileChange")[0]["status"], "declined");
    let msgs = &model.requests()[1].body["messages"];
    let tool = msgs.as_array().unwrap().last().unwrap();
    assert_eq!(tool["tool_call_id"], "call_X");
    assert!(
        tool["content"].as_str().unwrap().contains("denied"),
        "{tool}"
    );
}

#[test]
fn a_429_with_retry_after_is_waited_out_and_recorded() {
    let model = MockModel::start(vec![
        Reply::Status {
            code: 429,
            headers: vec![("Retry-After".into(), "0.3".into())],
            body: r#"{"error":{"message":"Rate limit reached","type":"requests"}}"#.into(),
        },
        answer(&["fine"]),
    ]);
    let rig = rig(&model);
    let mut raw = Raw::init(&rig.server);
    raw.req("thread/start", json!({"threadId": "t4"}));
    raw.turn("t4", "go");
    assert_eq!(raw.completed()["status"], "completed");
    let reqs = model.requests();
    assert_eq!(reqs.len(), 2);
    let waited = reqs[1].at - reqs[0].at;
    assert!(
        waited >= Duration::from_millis(300),
        "Retry-After ignored: {waited:?}"
    );
    let retry = &raw.items("error")[0];
    assert_eq!(retry["retry"]["status"], 429);
    assert_eq!(retry["retry"]["attempt"], 1);
    assert_eq!(retry["retry"]["delayMs"], 300);
    assert_eq!(raw.items("agentMessage")[0]["text"], "fine");
}

#[test]
fn repeated_500s_fail_after_the_bounded_attempts() {
    let five = || Reply::Status {
        code: 500,
        headers: vec![],
        body: "{}".into(),
    };
    let model = MockModel::start(vec![five(), five(), five(), answer(&["never"])]);
    let rig = rig(&model);
    let mut raw = Raw::init(&rig.server);
    raw.req("thread/start", json!({"threadId": "t5"}));
    raw.turn("t5", "go");
    let turn = raw.completed();
    assert_eq!(turn["status"], "failed");
    assert_eq!(turn["error"]["code"], "modelUnavailable");
    assert!(turn["error"]["message"]
        .as_str()
        .unwrap()
        .contains("3 attempts"));
    assert_eq!(model.requests().len(), 3, "exactly max_attempts requests");
    assert_eq!(
        raw.items("error").len(),
        2,
        "each retried attempt is recorded"
    );
}

#[test]
fn a_401_fails_with_a_safe_message_that_never_holds_the_key() {
    let model = MockModel::start(vec![Reply::Status {
        code: 401,
        headers: vec![],
        body: format!(
            r#"{{"error":{{"message":"Incorrect API key provided: {KEY}","code":"invalid_api_key"}}}}"#
        ),
    }]);
    let rig = rig(&model);
    let mut raw = Raw::init(&rig.server);
    raw.req("thread/start", json!({"threadId": "t6"}));
    raw.turn("t6", "go");
    let turn = raw.completed();
    assert_eq!(turn["status"], "failed");
    assert_eq!(turn["error"]["code"], "modelUnauthorized");
    let message = turn["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("401") && message.contains("API key"),
        "{message}"
    );
    assert!(!message.contains(KEY), "{message}");
    assert_eq!(model.requests().len(), 1, "401 is not retried");
    assert!(!rollout_text(&rig, "t6").contains(KEY));
}

#[test]
fn a_garbage_sse_line_fails_the_turn_as_malformed() {
    let model = MockModel::start(vec![Reply::Sse {
        pieces: vec![
            chunk(&json!({"role": "assistant", "content": "Par"}), None),
            "<html><body>502 Bad Gateway</body></html>\n\n".into(),
        ],
        gap: Duration::ZERO,
        end: End::Complete,
    }]);
    let rig = rig(&model);
    let mut raw = Raw::init(&rig.server);
    raw.req("thread/start", json!({"threadId": "t7"}));
    raw.turn("t7", "go");
    let turn = raw.completed();
    assert_eq!(turn["error"]["code"], "modelStreamMalformed", "{turn}");
    assert!(turn["error"]["message"]
        .as_str()
        .unwrap()
        .contains("502 Bad Gateway"));
    // Invalid JSON in a data line is malformed too.
    let model = MockModel::start(vec![Reply::Sse {
        pieces: vec!["data: {\"choices\": [\n\n".into()],
        gap: Duration::ZERO,
        end: End::Complete,
    }]);
    let rig = self::rig(&model);
    let mut raw = Raw::init(&rig.server);
    raw.req("thread/start", json!({"threadId": "t7b"}));
    raw.turn("t7b", "go");
    assert_eq!(raw.completed()["error"]["code"], "modelStreamMalformed");
}

#[test]
fn a_stream_cut_mid_answer_fails_and_keeps_what_was_delivered() {
    let model = MockModel::start(vec![Reply::Sse {
        pieces: vec![
            chunk(
                &json!({"role": "assistant", "content": "The answer is"}),
                None,
            ),
            chunk(&json!({"content": " forty"}), None),
        ],
        gap: Duration::from_millis(20),
        end: End::Drop,
    }]);
    let rig = rig(&model);
    let mut raw = Raw::init(&rig.server);
    raw.req("thread/start", json!({"threadId": "t8"}));
    raw.turn("t8", "go");
    let turn = raw.completed();
    assert_eq!(turn["status"], "failed");
    assert_eq!(turn["error"]["code"], "modelStreamCut");
    let text = rollout_text(&rig, "t8");
    assert!(
        text.contains("The answer is") && text.contains(" forty"),
        "deltas lost"
    );
    assert_eq!(model.requests().len(), 1, "a cut stream is never replayed");
}

#[test]
fn interrupt_during_a_long_stream_aborts_the_http_stream_at_once() {
    let model = MockModel::start(vec![Reply::Endless {
        gap: Duration::from_millis(10),
    }]);
    let rig = rig(&model);
    let mut raw = Raw::init(&rig.server);
    raw.req("thread/start", json!({"threadId": "t9"}));
    let turn = raw.turn("t9", "talk forever");
    // Wait until it is really streaming.
    while raw.wait("item/delta")["params"]["delta"]["text"] != "tick " {}
    let asked = Instant::now();
    let r = raw.req("turn/interrupt", json!({"threadId": "t9", "turnId": turn}));
    let settled = asked.elapsed();
    assert_eq!(r["result"]["physicallySettled"], true, "{r}");
    assert_eq!(r["result"]["turn"]["status"], "interrupted");
    assert!(
        settled < Duration::from_millis(100),
        "settled after {settled:?}"
    );
    // The server sees the connection go away right after.
    let deadline = Instant::now() + Duration::from_secs(2);
    while model.client_gone.lock().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let gone = model
        .client_gone
        .lock()
        .unwrap()
        .expect("the HTTP stream was not closed");
    assert!(
        gone.duration_since(asked) < Duration::from_millis(200),
        "{:?}",
        gone.duration_since(asked)
    );
}

#[test]
fn max_steps_exceeded_fails_with_its_code() {
    let call = || tool_calls(&[("c", "list_directory", r#"{"path":"."}"#)]);
    let model = MockModel::start(vec![call(), call(), call()]);
    let rig = rig_with(&model, |c| c.with_max_steps(2));
    rig.server.set_policy(ApprovalPolicy::AutoApprove);
    let mut raw = Raw::init(&rig.server);
    raw.req("thread/start", json!({"threadId": "t10"}));
    raw.turn("t10", "loop");
    let turn = raw.completed();
    assert_eq!(turn["error"]["code"], "maxStepsExceeded");
    assert_eq!(model.requests().len(), 2);
}

#[test]
fn reasoning_from_llama_cpp_and_ollama_streams_becomes_reasoning_items() {
    // llama.cpp's server: reasoning_content, usage and timings on the last chunk.
    let llama = [
        r#"data: {"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}],"created":1735689600,"id":"chatcmpl-Zq1","model":"qwen3","system_fingerprint":"b5000-0f1c6b8a","object":"chat.completion.chunk"}"#,
        r#"data: {"choices":[{"finish_reason":null,"index":0,"delta":{"reasoning_content":"The user greets me."}}],"created":1735689600,"id":"chatcmpl-Zq1","model":"qwen3","system_fingerprint":"b5000-0f1c6b8a","object":"chat.completion.chunk"}"#,
        r#"data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"Hi!"}}],"created":1735689600,"id":"chatcmpl-Zq1","model":"qwen3","system_fingerprint":"b5000-0f1c6b8a","object":"chat.completion.chunk"}"#,
        r#"data: {"choices":[{"finish_reason":"stop","index":0,"delta":{}}],"created":1735689600,"id":"chatcmpl-Zq1","model":"qwen3","system_fingerprint":"b5000-0f1c6b8a","object":"chat.completion.chunk","usage":{"completion_tokens":9,"prompt_tokens":11,"total_tokens":20},"timings":{"prompt_n":11,"predicted_n":9}}"#,
        "data: [DONE]",
    ];
    // Ollama's /v1: `reasoning`, fp_ollama, no usage unless asked.
    let ollama = [
        r#"data: {"id":"chatcmpl-527","object":"chat.completion.chunk","created":1735689600,"model":"qwen3:0.6b","system_fingerprint":"fp_ollama","choices":[{"index":0,"delta":{"role":"assistant","content":"","reasoning":"Short greeting."},"finish_reason":null}]}"#,
        r#"data: {"id":"chatcmpl-527","object":"chat.completion.chunk","created":1735689600,"model":"qwen3:0.6b","system_fingerprint":"fp_ollama","choices":[{"index":0,"delta":{"role":"assistant","content":"Hello"},"finish_reason":null}]}"#,
        r#"data: {"id":"chatcmpl-527","object":"chat.completion.chunk","created":1735689600,"model":"qwen3:0.6b","system_fingerprint":"fp_ollama","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":"stop"}]}"#,
        "data: [DONE]",
    ];
    let sse = |lines: &[&str]| Reply::Sse {
        pieces: lines.iter().map(|l| format!("{l}\n\n")).collect(),
        gap: Duration::ZERO,
        end: End::Complete,
    };
    let model = MockModel::start(vec![sse(&llama), sse(&ollama)]);
    let rig = rig(&model);
    let mut raw = Raw::init(&rig.server);
    raw.req("thread/start", json!({"threadId": "t11"}));
    raw.turn("t11", "hi");
    assert_eq!(raw.completed()["status"], "completed");
    raw.turn("t11", "hi again");
    assert_eq!(raw.completed()["status"], "completed");
    let thoughts: Vec<Value> = raw
        .items("reasoning")
        .into_iter()
        .map(|i| i["text"].clone())
        .collect();
    assert_eq!(
        thoughts,
        [json!("The user greets me."), json!("Short greeting.")]
    );
    let answers: Vec<Value> = raw
        .items("agentMessage")
        .into_iter()
        .map(|i| i["text"].clone())
        .collect();
    assert_eq!(answers, [json!("Hi!"), json!("Hello")]);
    assert_eq!(raw.items("agentMessage")[0]["usage"]["totalTokens"], 20);
    // The second request carries the first turn (reasoning is not sent back).
    let msgs = &model.requests()[1].body["messages"];
    assert_eq!(msgs[0], json!({"role": "user", "content": "hi"}));
    assert_eq!(msgs[1], json!({"role": "assistant", "content": "Hi!"}));
    assert_eq!(msgs[2], json!({"role": "user", "content": "hi again"}));
}

#[test]
fn history_survives_a_restart_and_a_fork_keeps_it_up_to_the_fork_point() {
    let model = MockModel::start(vec![
        tool_calls(&[("call_L", "list_directory", r#"{"path":"."}"#)]),
        answer(&["One."]),
        answer(&["Two."]),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let (state, ws) = (dir.path().join("s"), dir.path().join("w"));
    std::fs::create_dir_all(&ws).unwrap();
    {
        let server = open(&state, &ws, kernel_config(&model));
        server.set_policy(ApprovalPolicy::AutoApprove);
        let mut raw = Raw::init(&server);
        raw.req("thread/start", json!({"threadId": "h", "agentOptions": {"model": "llama3.2", "instructions": "Speak French."}}));
        raw.turn("h", "first");
        raw.completed();

        raw.turn("h", "second");
        raw.completed();
        server.shutdown();
    }
    // After a restart: the third turn sees both earlier turns, tools included, and the thread
    // still has its agentOptions.
    let server = open(&state, &ws, kernel_config(&model));
    server.set_policy(ApprovalPolicy::AutoApprove);
    let mut raw = Raw::init(&server);
    model.push(answer(&["Three."]));
    raw.turn("h", "third");
    assert_eq!(raw.completed()["status"], "completed");
    let req = model.requests().last().unwrap().clone();
    assert_eq!(req.body["model"], "llama3.2");
    let msgs = req.body["messages"].as_array().unwrap().clone();
    let roles: Vec<&str> = msgs.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(
        roles,
        [
            "system",
            "user",
            "assistant",
            "tool",
            "assistant",
            "user",
            "assistant",
            "user"
        ]
    );
    assert_eq!(msgs[0]["content"], "Speak French.");
    assert_eq!(
        msgs[2]["tool_calls"][0]["function"]["name"],
        "list_directory"
    );
    assert_eq!(msgs[3]["tool_call_id"], msgs[2]["tool_calls"][0]["id"]);
    assert_eq!(msgs[4]["content"], "One.");
    assert_eq!(msgs[5]["content"], "second");
    assert_eq!(msgs[6]["content"], "Two.");
    assert_eq!(msgs[7]["content"], "third");
    // A fork taken right after the first turn: its history stops there, its options stay.
    let events = raw.req("thread/read", json!({"threadId": "h", "limit": 1000}));
    let first_end = events["result"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["payload"]["type"] == "turnCompleted")
        .unwrap()["seq"]
        .clone();
    let f = raw.req(
        "thread/fork",
        json!({"threadId": "h", "newThreadId": "hf", "atEventSeq": first_end}),
    );
    assert!(f.get("result").is_some(), "{f}");
    model.push(answer(&["Forked."]));
    raw.turn("hf", "in the fork");
    assert_eq!(raw.completed()["status"], "completed");
    let req = model.requests().last().unwrap().clone();
    assert_eq!(
        req.body["model"], "llama3.2",
        "the fork keeps the source's options"
    );
    let contents: Vec<Value> = req.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].clone())
        .collect();
    assert!(contents.contains(&json!("first")) && contents.contains(&json!("One.")));
    assert!(
        !contents.contains(&json!("second")),
        "the fork saw past its fork point"
    );
    // And a fork cut before the options event still keeps them across a restart.
    let f = raw.req(
        "thread/fork",
        json!({"threadId": "h", "newThreadId": "h1", "atEventSeq": 1}),
    );
    assert!(f.get("result").is_some(), "{f}");
    server.shutdown();
    drop(raw);
    drop(server);
    let server = open(&state, &ws, kernel_config(&model));
    let mut raw = Raw::init(&server);
    model.push(answer(&["ok"]));
    raw.turn("h1", "hello");
    raw.completed();
    assert_eq!(model.requests().last().unwrap().body["model"], "llama3.2");
}

#[test]
fn an_over_long_history_is_cut_from_the_oldest_turns() {
    let model = MockModel::start(vec![answer(&["A"]), answer(&["B"]), answer(&["C"])]);
    // No tool specs (the echo executor), so the budget is history + input only: room for one
    // 700-byte turn, not two.
    let dir = tempfile::tempdir().unwrap();
    let mut c = ServerConfig::new(dir.path());
    c.kernel = Arc::new(
        OpenAiCompatibleKernel::new(kernel_config(&model).with_context_budget_bytes(1000)).unwrap(),
    );
    let server = AppServer::open(c).unwrap();
    let mut raw = Raw::init(&server);
    raw.req("thread/start", json!({"threadId": "long"}));
    let big = "x".repeat(700);
    raw.turn("long", &format!("one {big}"));
    raw.completed();
    raw.turn("long", &format!("two {big}"));
    raw.completed();
    raw.turn("long", "three");
    raw.completed();
    let msgs = model.requests()[2].body["messages"].clone();
    let text = msgs.to_string();
    assert!(
        !text.contains("one x"),
        "the oldest turn should be cut: {text}"
    );
    assert!(text.contains("two x"), "the newest turn should stay");
    assert!(text.contains("older turns of this conversation were left out"));
}

#[test]
fn thread_compact_has_the_model_write_the_summary_and_history_starts_from_it() {
    let model = MockModel::start(vec![
        answer(&["Paris."]),
        answer(&["The user asked for the capital of France; it is Paris."]),
        answer(&["Yes."]),
    ]);
    let rig = rig(&model);
    let mut raw = Raw::init(&rig.server);
    raw.req("thread/start", json!({"threadId": "c"}));
    raw.turn("c", "capital of France?");
    raw.completed();
    let r = raw.req("thread/compact", json!({"threadId": "c"}));
    assert_eq!(
        r["result"]["summary"], "The user asked for the capital of France; it is Paris.",
        "{r}"
    );
    cc_agent_protocol::validate_protocol_definition("ThreadCompactResult", &r["result"]).unwrap();
    let summary_req = &model.requests()[1].body;
    assert!(summary_req.get("tools").is_none());
    assert!(summary_req["messages"]
        .to_string()
        .contains("capital of France?"));
    raw.wait("thread/updated");
    raw.turn("c", "sure?");
    raw.completed();
    let msgs = model.requests()[2].body["messages"].clone();
    assert!(
        msgs[0]["content"].as_str().unwrap().contains("it is Paris"),
        "{msgs}"
    );
    assert!(
        !msgs.to_string().contains("capital of France?"),
        "compacted turns came back"
    );
    // Nothing new since: refused with -32602.
    // The caller may supply the summary; a second compaction with nothing new is refused.
    let r = raw.req(
        "thread/compact",
        json!({"threadId": "c", "summary": "again"}),
    );
    assert_eq!(r["result"]["summary"], "again", "{r}");
    let r = raw.req(
        "thread/compact",
        json!({"threadId": "c", "summary": "again"}),
    );
    assert_eq!(r["error"]["code"], -32602, "{r}");
}

#[test]
fn thread_compact_is_gated_by_its_feature_and_needs_a_summary_from_kernels_that_cannot_write_one() {
    let dir = tempfile::tempdir().unwrap();
    // The scripted kernel: it cannot write summaries.
    let server = AppServer::open(ServerConfig::new(dir.path())).unwrap();
    let mut raw = Raw::init(&server);
    raw.req("thread/start", json!({"threadId": "s"}));
    let r = raw.req("thread/compact", json!({"threadId": "s"}));
    assert_eq!(r["error"]["code"], -32602, "nothing to compact yet: {r}");
    raw.turn("s", "hello");
    raw.completed();
    let r = raw.req("thread/compact", json!({"threadId": "s"}));
    assert_eq!(r["error"]["code"], -32602, "{r}");
    assert!(r["error"]["message"]
        .as_str()
        .unwrap()
        .contains("params.summary"));
    let r = raw.req(
        "thread/compact",
        json!({"threadId": "nope", "summary": "x"}),
    );
    assert_eq!(r["error"]["code"], -32004, "{r}");
    let r = raw.req(
        "thread/compact",
        json!({"threadId": "s", "summary": "The user said hello."}),
    );
    assert_eq!(r["result"]["fromSeq"], 1, "{r}");
    let last = r["result"]["eventSeq"].as_u64().unwrap();
    let events = raw.req(
        "thread/read",
        json!({"threadId": "s", "afterEventSeq": last - 1}),
    );
    assert_eq!(
        events["result"]["events"][0]["payload"]["type"],
        "compacted"
    );
    assert_eq!(
        events["result"]["events"][0]["payload"]["summary"],
        "The user said hello."
    );
    // A turn in flight: refused with -32009.
    raw.req("thread/start", json!({"threadId": "busy", "agentOptions": {"script": {"steps": [{"type": "sleep", "ms": 3000}]}}}));
    let turn = raw.turn("busy", "wait");
    let r = raw.req(
        "thread/compact",
        json!({"threadId": "busy", "summary": "x"}),
    );
    assert_eq!(r["error"]["code"], -32009, "{r}");
    raw.req(
        "turn/interrupt",
        json!({"threadId": "busy", "turnId": turn}),
    );
    // A connection that did not negotiate the feature: -32601.
    let mut plain = Raw {
        conn: server.connect().unwrap(),
        next: 0,
        seen: Vec::new(),
    };
    plain.req(
        "initialize",
        json!({"protocolVersion": 1, "minimumProtocolVersion": 1,
        "client": {"name": "t", "version": "1"}, "features": ["thread_turn_item"]}),
    );
    let r = plain.req("thread/compact", json!({"threadId": "s", "summary": "x"}));
    assert_eq!(r["error"]["code"], -32601, "{r}");
}

/// A stream that sends nothing but SSE comments, `n` of them `gap` apart.
fn keep_alives(n: usize, gap: Duration) -> Reply {
    Reply::Sse {
        pieces: std::iter::repeat_n(": keep-alive\n\n".to_string(), n).collect(),
        gap,
        end: End::Complete,
    }
}

/// Waits until `model` saw `n` requests (the stream of the last has started).
fn await_requests(model: &MockModel, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while model.requests().len() < n {
        assert!(Instant::now() < deadline, "the model never got request {n}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits up to `within` for the mock's endless stream to notice its client went away.
fn client_gone_within(model: &MockModel, from: Instant, within: Duration) -> Duration {
    let deadline = from + within;
    loop {
        if let Some(gone) = *model.client_gone.lock().unwrap() {
            return gone.saturating_duration_since(from);
        }
        assert!(
            Instant::now() < deadline,
            "the model's connection was still open {within:?} later"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_stream_kept_alive_with_comments_fails_at_the_idle_deadline_and_so_does_compaction() {
    // 30 s of keep-alives 50 ms apart: far past the 1 s idle deadline, and every comment arrives
    // well inside the 20 s request_timeout, which is therefore never what trips.
    let model = MockModel::start(vec![
        keep_alives(600, Duration::from_millis(50)),
        keep_alives(600, Duration::from_millis(50)),
        answer(&["The user said hello; the model never answered."]),
    ]);
    let idle = Duration::from_secs(1);
    let rig = rig_with(&model, |c| {
        c.with_request_timeout(Duration::from_secs(20))
            .with_idle_timeout(idle)
    });
    let mut raw = Raw::init(&rig.server);
    raw.req("thread/start", json!({"threadId": "ka"}));
    let started = Instant::now();
    raw.turn("ka", "hello");
    let turn = raw.completed();
    let took = started.elapsed();
    assert_eq!(turn["status"], "failed", "{turn}");
    assert_eq!(turn["error"]["code"], "modelStalled", "{turn}");
    assert!(
        turn["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no part of an answer"),
        "{turn}"
    );
    assert!(took >= idle, "failed before the idle deadline: {took:?}");
    assert!(
        took < idle + Duration::from_secs(4),
        "failed after {took:?}"
    );
    assert_eq!(model.requests().len(), 1, "a stalled stream is not retried");
    // The summary call obeys the same deadline, answers with an error that says why, and frees
    // the thread's compaction slot: the next compaction runs and succeeds.
    let started = Instant::now();
    let r = raw.req("thread/compact", json!({"threadId": "ka"}));
    let took = started.elapsed();
    assert_eq!(r["error"]["code"], -32603, "{r}");
    let message = r["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("could not write the summary") && message.contains("modelStalled"),
        "{message}"
    );
    assert!(
        took >= idle && took < idle + Duration::from_secs(4),
        "{took:?}"
    );
    let r = raw.req("thread/compact", json!({"threadId": "ka"}));
    assert_eq!(
        r["result"]["summary"], "The user said hello; the model never answered.",
        "{r}"
    );
}

#[test]
fn chunks_that_carry_nothing_are_not_progress_but_tokens_slower_than_the_deadline_in_total_are() {
    // Empty deltas every 50 ms: data events, but no part of an answer.
    let empty = chunk(&json!({}), None);
    let model = MockModel::start(vec![
        Reply::Sse {
            pieces: std::iter::repeat_n(empty, 600).collect(),
            gap: Duration::from_millis(50),
            end: End::Complete,
        },
        // Eight tokens 250 ms apart: 2 s in all, twice the idle deadline, never 1 s idle.
        Reply::Sse {
            pieces: (0..8)
                .map(|i| chunk(&json!({"content": format!("{i} ")}), None))
                .chain([chunk(&json!({}), Some("stop")), DONE.to_string()])
                .collect(),
            gap: Duration::from_millis(250),
            end: End::Complete,
        },
    ]);
    let rig = rig_with(&model, |c| {
        c.with_request_timeout(Duration::from_secs(20))
            .with_idle_timeout(Duration::from_secs(1))
    });
    let mut raw = Raw::init(&rig.server);
    raw.req("thread/start", json!({"threadId": "e"}));
    raw.turn("e", "hello");
    assert_eq!(raw.completed()["error"]["code"], "modelStalled");
    raw.turn("e", "again");
    let turn = raw.completed();
    assert_eq!(turn["status"], "completed", "{turn}");
    assert_eq!(
        raw.items("agentMessage").last().unwrap()["text"],
        "0 1 2 3 4 5 6 7 "
    );
}

#[test]
fn a_stream_that_never_ends_fails_at_the_call_deadline_and_keeps_what_arrived() {
    let model = MockModel::start(vec![Reply::Endless {
        gap: Duration::from_millis(10),
    }]);
    let deadline = Duration::from_millis(1500);
    let rig = rig_with(&model, |c| c.with_call_deadline(deadline));
    let mut raw = Raw::init(&rig.server);
    raw.req("thread/start", json!({"threadId": "d"}));
    let started = Instant::now();
    raw.turn("d", "talk forever");
    let turn = raw.completed();
    let took = started.elapsed();
    assert_eq!(turn["status"], "failed", "{turn}");
    assert_eq!(turn["error"]["code"], "modelDeadlineExceeded", "{turn}");
    assert!(
        took >= deadline && took < deadline + Duration::from_secs(4),
        "{took:?}"
    );
    // The connection is closed at the deadline, and what streamed before it stays recorded.
    client_gone_within(&model, started, deadline + Duration::from_secs(4));
    assert!(rollout_text(&rig, "d").contains("tick"));
}

#[test]
fn compaction_stops_when_its_connection_closes_or_the_server_shuts_down_and_frees_the_slot() {
    let model = MockModel::start(vec![
        answer(&["Hi."]),
        Reply::Endless {
            gap: Duration::from_millis(10),
        },
        answer(&["The user greeted the model."]),
    ]);
    let rig = rig(&model);
    let mut raw = Raw::init(&rig.server);
    raw.req("thread/start", json!({"threadId": "ic"}));
    raw.turn("ic", "hello");
    raw.completed();
    // The summary streams forever (every tick is progress); the asker goes away mid-way.
    raw.send("thread/compact", json!({"threadId": "ic"}));
    await_requests(&model, 2);
    std::thread::sleep(Duration::from_millis(100));
    let closed = Instant::now();
    drop(raw);
    let after = client_gone_within(&model, closed, Duration::from_secs(2));
    assert!(after < Duration::from_secs(1), "{after:?}");
    // Nothing was recorded for it, and its slot is free: a new connection compacts.
    assert!(!rollout_text(&rig, "ic").contains("\"compacted\""));
    let mut raw = Raw::init(&rig.server);
    let r = raw.req("thread/compact", json!({"threadId": "ic"}));
    assert_eq!(r["result"]["summary"], "The user greeted the model.", "{r}");
    // The same on shutdown.
    model.push(answer(&["More."]));
    raw.turn("ic", "more");
    raw.completed();
    *model.client_gone.lock().unwrap() = None;
    model.push(Reply::Endless {
        gap: Duration::from_millis(10),
    });
    raw.send("thread/compact", json!({"threadId": "ic"}));
    await_requests(&model, 5);
    std::thread::sleep(Duration::from_millis(100));
    let stopped = Instant::now();
    rig.server.shutdown();
    let after = client_gone_within(&model, stopped, Duration::from_secs(2));
    assert!(after < Duration::from_secs(1), "{after:?}");
}

#[test]
fn a_zero_idle_timeout_or_call_deadline_is_refused_and_one_millisecond_is_not() {
    let base = || OpenAiConfig::new("http://127.0.0.1:9/v1", "m");
    let ms = Duration::from_millis(1);
    let refused = |c: OpenAiConfig| OpenAiCompatibleKernel::new(c).unwrap_err().to_string();
    assert_eq!(
        refused(base().with_idle_timeout(Duration::ZERO)),
        "idle_timeout must be longer than zero"
    );
    assert_eq!(
        refused(base().with_call_deadline(Duration::ZERO)),
        "call_deadline must be longer than zero"
    );
    let c = base().with_idle_timeout(ms).with_call_deadline(ms);
    let k = OpenAiCompatibleKernel::new(c).unwrap();
    assert_eq!(
        (k.config().idle_timeout, k.config().call_deadline),
        (ms, ms)
    );
    let d = OpenAiConfig::new("http://127.0.0.1:9/v1", "m");
    assert_eq!(
        (d.idle_timeout, d.call_deadline),
        (Duration::from_secs(60), Duration::from_secs(600))
    );
}

#[test]
fn an_api_key_over_plain_http_to_a_host_that_is_not_loopback_is_refused_unless_allowed() {
    let with_key = |url: &str| OpenAiConfig::new(url, "m").with_api_key(Some(KEY.into()));
    for url in [
        "http://api.example.com/v1",
        "http://10.0.0.5:8000/v1",
        "http://192.168.1.20:11434/v1",
        "http://[fe80::1]/v1",
        "http://0.0.0.0:8080/v1",
        "http://127.0.0.1.nip.io/v1",
        "http://localhost.example.com/v1",
    ] {
        let e = OpenAiCompatibleKernel::new(with_key(url))
            .expect_err(url)
            .to_string();
        assert!(
            e.contains("plain http") && e.contains("https://") && e.contains("allow_insecure_http"),
            "{url}: {e}"
        );
        assert!(!e.contains(KEY), "{e}");
        // Explicitly allowed; or no key to protect.
        OpenAiCompatibleKernel::new(with_key(url).allow_insecure_http(true)).expect(url);
        OpenAiCompatibleKernel::new(OpenAiConfig::new(url, "m")).expect(url);
    }
    for url in [
        "https://api.example.com/v1",
        "https://10.0.0.5:8000/v1",
        "http://127.0.0.1:11434/v1",
        "http://127.255.255.254/v1",
        "http://[::1]:8080/v1",
        "http://[::ffff:127.0.0.1]:8080/v1",
        "http://localhost:11434/v1",
        "http://LocalHost/v1",
    ] {
        OpenAiCompatibleKernel::new(with_key(url)).expect(url);
    }
    // 128.0.0.1 is the first address past 127.0.0.0/8.
    assert!(OpenAiCompatibleKernel::new(with_key("http://128.0.0.1/v1")).is_err());
}

#[test]
fn a_redirect_is_not_followed_so_neither_the_key_nor_the_conversation_goes_elsewhere() {
    let elsewhere = MockModel::start(vec![answer(&["stolen"]), answer(&["stolen"])]);
    let target = format!("{}/chat/completions?x=1", elsewhere.base_url);
    let redirect = |code: u16| Reply::Status {
        code,
        headers: vec![("Location".into(), target.clone())],
        body: String::new(),
    };
    let model = MockModel::start(vec![redirect(307), redirect(302)]);
    let rig = rig(&model);
    let mut raw = Raw::init(&rig.server);
    raw.req("thread/start", json!({"threadId": "r"}));
    for code in [307, 302] {
        raw.turn("r", "a secret plan");
        let turn = raw.completed();
        assert_eq!(turn["status"], "failed", "{turn}");
        assert_eq!(turn["error"]["code"], "modelRedirected", "{turn}");
        let message = turn["error"]["message"].as_str().unwrap();
        let shown = format!("{}/chat/completions", elsewhere.base_url);
        assert!(
            message.contains(&format!("HTTP {code}")) && message.contains(&shown),
            "{message}"
        );
        assert!(
            !message.contains("x=1"),
            "the query is not shown: {message}"
        );
    }
    assert_eq!(model.requests().len(), 2, "a redirect is not retried");
    assert!(
        elsewhere.requests().is_empty(),
        "the redirect was followed: {:?}",
        elsewhere.requests()
    );
}

/// list_directory arguments nesting `depth` levels of arrays and objects, the object itself the
/// first: `{"path": ".", "n": [[…]]}`.
fn nested_arguments(depth: usize) -> String {
    assert!(depth >= 2);
    format!(
        r#"{{"path":".","n":{}{}}}"#,
        "[".repeat(depth - 1),
        "]".repeat(depth - 1)
    )
}

/// The `role: tool` message answering `call_id` in a request's messages.
fn tool_reply(request: &Seen, call_id: &str) -> String {
    request.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool" && m["tool_call_id"] == call_id)
        .unwrap_or_else(|| panic!("no tool message for {call_id}"))["content"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn tool_arguments_nested_past_the_bound_are_a_tool_error_the_model_sees_and_the_turn_goes_on() {
    let (at, past, far) = (
        nested_arguments(62),
        nested_arguments(63),
        nested_arguments(200),
    );
    let model = MockModel::start(vec![
        tool_calls(&[
            ("call_at", "list_directory", &at),
            ("call_past", "list_directory", &past),
            ("call_far", "list_directory", &far),
        ]),
        answer(&["I will send flatter arguments."]),
    ]);
    let rig = rig(&model);
    rig.server.set_policy(ApprovalPolicy::AutoApprove);
    let mut raw = Raw::init(&rig.server);
    raw.req("thread/start", json!({"threadId": "deep"}));
    raw.turn("deep", "list with deep arguments");
    let turn = raw.completed();
    assert_eq!(turn["status"], "completed", "{turn}");
    assert_eq!(
        raw.items("agentMessage")[0]["text"],
        "I will send flatter arguments."
    );
    // At the bound: the call went through the gate to the tool, arguments intact.
    let requested: Vec<Value> = raw
        .seen
        .iter()
        .filter(|m| m["method"] == "tool/requested")
        .map(|m| m["params"]["call"]["arguments"].clone())
        .collect();
    assert_eq!(requested, [serde_json::from_str::<Value>(&at).unwrap()]);
    let second = &model.requests()[1];
    assert!(
        !tool_reply(second, "call_at").contains("levels"),
        "{}",
        tool_reply(second, "call_at")
    );
    // Past it (and far past serde's own 128): a tool error in the next request, recorded as an
    // error item, nothing run.
    for id in ["call_past", "call_far"] {
        let reply = tool_reply(second, id);
        assert!(
            reply.starts_with("Error: the arguments for list_directory nest")
                && reply.contains("62 levels"),
            "{id}: {reply}"
        );
    }
    let errors = raw.items("error");
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(errors[0]["message"].as_str().unwrap().contains("62 levels"));
}

#[test]
fn tool_arguments_longer_than_the_bound_are_a_tool_error_and_at_the_bound_they_run() {
    const MAX: usize = cc_app_server::openai::sse::MAX_ARGUMENT_BYTES;
    let sized = |n: usize| {
        let head = r#"{"path":".","pad":""#;
        format!("{head}{}\"}}", "x".repeat(n - head.len() - 2))
    };
    let (at, past) = (sized(MAX), sized(MAX + 1));
    assert_eq!((at.len(), past.len()), (MAX, MAX + 1));
    let model = MockModel::start(vec![
        tool_calls(&[
            ("call_at", "list_directory", &at),
            ("call_past", "list_directory", &past),
        ]),
        answer(&["Shorter next time."]),
    ]);
    let rig = rig(&model);
    rig.server.set_policy(ApprovalPolicy::AutoApprove);
    let mut raw = Raw::init(&rig.server);
    raw.req("thread/start", json!({"threadId": "long"}));
    raw.turn("long", "list with long arguments");
    let turn = raw.completed();
    assert_eq!(turn["status"], "completed", "{turn}");
    let requested = raw
        .seen
        .iter()
        .filter(|m| m["method"] == "tool/requested")
        .count();
    assert_eq!(requested, 1, "only the call at the bound runs");
    let second = &model.requests()[1];
    let reply = tool_reply(second, "call_past");
    assert!(
        reply.starts_with("Error: the arguments for list_directory are longer than 1048576 bytes"),
        "{reply}"
    );
    assert!(!tool_reply(second, "call_at").starts_with("Error: the arguments"));
    // What the model is shown of its own over-long call is small, valid JSON.
    let assistant = second.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "assistant" && m.get("tool_calls").is_some())
        .unwrap()
        .clone();
    assert_eq!(assistant["tool_calls"][1]["function"]["arguments"], "{}");
    assert_eq!(
        assistant["tool_calls"][0]["function"]["arguments"],
        at.as_str()
    );
}
