//! Black-box conformance of `cc-app-server serve`: the real binary, real pipes, real private state
//! directories. Handshake rules, every method, approvals answered by the test as the client, the
//! line cap at its exact edge, malformed input of every kind, overload, a client that stops
//! reading stdout, and the end of stdin.

mod common;

use common::*;
use serde_json::{json, Value};
use std::io::Write;
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;

#[test]
fn handshake_rules() {
    let dir = state_dir();
    let mut p = Proc::serve(dir.path(), &[]);
    // Anything before initialize: -32002, and nothing runs.
    let r = p.req("thread/start", json!({"threadId": "early"}));
    assert_eq!(code(&r), -32002, "{r}");
    // No overlap of version ranges: -32602, and the connection can still initialize.
    let mut none = initialize_params(ALL_FEATURES);
    none["protocolVersion"] = json!(3);
    none["minimumProtocolVersion"] = json!(2);
    let r = p.req("initialize", none);
    assert_eq!(code(&r), -32602, "{r}");
    // A newer client: the server picks the highest common version and says it downgraded; only
    // features both sides support come back.
    let mut newer = initialize_params(&["thread_turn_item", "typed_graph", "durable_human_task"]);
    newer["protocolVersion"] = json!(2);
    let r = p.req("initialize", newer);
    let result = &r["result"];
    assert_eq!(result["protocolVersion"], 1, "{r}");
    assert_eq!(result["downgraded"], true);
    assert_eq!(
        result["features"],
        json!(["thread_turn_item", "typed_graph"])
    );
    assert_eq!(result["server"]["name"], "cc-app-server");
    assert!(result["server"]["version"].is_string());
    assert_eq!(result["schemaDigest"], cc_agent_protocol::schema_digest());
    // A second initialize on the same connection: -32009.
    let r = p.req("initialize", initialize_params(ALL_FEATURES));
    assert_eq!(code(&r), -32009, "{r}");
    let r = p.req("thread/read", json!({"threadId": "early"}));
    assert_eq!(
        code(&r),
        -32004,
        "the pre-initialize request did not run: {r}"
    );
    p.close_stdin();
    assert!(p.wait_exit(TIMEOUT).success());
    assert!(
        p.stderr().contains("serving wire v1"),
        "diagnostics go to stderr"
    );
}

#[test]
fn every_method_over_stdio() {
    let dir = state_dir();
    let mut p = Proc::serve(dir.path(), &[]);
    p.init();

    // thread/start, with an idempotency key retried: the same logical result.
    let start = json!({"threadId": "m1", "title": "Methods", "metadata": {"k": "v"}, "idempotencyKey": "start-m1"});
    let first = p.req("thread/start", start.clone());
    assert_eq!(first["result"]["thread"]["id"], "m1", "{first}");
    assert_eq!(first["result"]["thread"]["status"], "idle");
    let again = p.req("thread/start", start);
    assert_eq!(again["result"], first["result"]);
    let dup = p.req("thread/start", json!({"threadId": "m1"}));
    assert_eq!(code(&dup), -32009, "{dup}");

    // turn/start: returns at once, runs asynchronously, notifications in seq order.
    let turn = p.req(
        "turn/start",
        json!({"threadId": "m1", "input": [{"type": "text", "text": "hello"}]}),
    );
    assert_eq!(turn["result"]["turn"]["status"], "queued", "{turn}");
    let done = p.wait_method("turn/completed");
    assert_eq!(done["params"]["turn"]["status"], "completed");
    let mut methods: Vec<String> = p
        .seen
        .drain(..)
        .map(|m| m["method"].as_str().unwrap_or("").to_string())
        .collect();
    methods.push("turn/completed".into());
    for m in [
        "turn/started",
        "item/started",
        "item/delta",
        "item/completed",
    ] {
        assert!(methods.iter().any(|x| x == m), "missing {m}: {methods:?}");
    }

    // thread/read with a cursor and a limit.
    let read = p.req(
        "thread/read",
        json!({"threadId": "m1", "afterEventSeq": 1, "limit": 2}),
    );
    let events = read["result"]["events"].as_array().unwrap();
    assert_eq!(events.len(), 2);
    assert_eq!(events[0]["seq"], 2);
    assert_eq!(read["result"]["hasMore"], true);
    assert_eq!(events[1]["prevHash"], events[0]["hash"]);

    // thread/resume: events after a cursor and no active turn.
    let resume = p.req(
        "thread/resume",
        json!({"threadId": "m1", "afterEventSeq": 3}),
    );
    assert_eq!(resume["result"]["activeTurn"], Value::Null, "{resume}");
    assert_eq!(resume["result"]["events"][0]["seq"], 4);

    // thread/fork: a new identity that records its origin.
    let fork = p.req(
        "thread/fork",
        json!({"threadId": "m1", "newThreadId": "m1-fork", "atEventSeq": 3}),
    );
    assert_eq!(fork["result"]["thread"]["id"], "m1-fork", "{fork}");
    assert_eq!(fork["result"]["forkedFrom"]["threadId"], "m1");
    assert_eq!(fork["result"]["forkedFrom"]["eventSeq"], 3);
    assert_eq!(fork["result"]["thread"]["parentThreadId"], "m1");

    // One active turn per thread; archive is refused while it runs; interrupt settles physically.
    p.req("thread/start", json!({"threadId": "slow", "agentOptions": {"script": {"steps": [{"type": "sleep", "ms": 30000}]}}}));
    let t = p.req(
        "turn/start",
        json!({"threadId": "slow", "input": [{"type": "text", "text": "wait"}]}),
    );
    let turn_id = t["result"]["turn"]["id"].as_str().unwrap().to_string();
    let second = p.req(
        "turn/start",
        json!({"threadId": "slow", "input": [{"type": "text", "text": "again"}]}),
    );
    assert_eq!(code(&second), -32009, "{second}");
    let archive = p.req("thread/archive", json!({"threadId": "slow"}));
    assert_eq!(code(&archive), -32009, "{archive}");
    let stop = p.req(
        "turn/interrupt",
        json!({"threadId": "slow", "turnId": turn_id}),
    );
    assert_eq!(stop["result"]["physicallySettled"], true, "{stop}");
    assert_eq!(stop["result"]["turn"]["status"], "interrupted");

    // thread/archive, then list hides it unless asked, and it cannot start turns.
    let archived = p.req("thread/archive", json!({"threadId": "slow"}));
    assert_eq!(
        archived["result"]["thread"]["status"], "archived",
        "{archived}"
    );
    let list = p.req("thread/list", json!({}));
    let ids: Vec<&str> = list["result"]["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["m1", "m1-fork"], "{list}");
    let all = p.req("thread/list", json!({"includeArchived": true}));
    assert_eq!(all["result"]["threads"].as_array().unwrap().len(), 3);
    let refused = p.req(
        "turn/start",
        json!({"threadId": "slow", "input": [{"type": "text", "text": "no"}]}),
    );
    assert_eq!(code(&refused), -32009, "{refused}");

    // Unknown thread and unknown method.
    assert_eq!(
        code(&p.req("thread/read", json!({"threadId": "nope"}))),
        -32004
    );
    let unknown = p.req("thread/teleport", json!({}));
    assert!(
        [-32601, -32600].contains(&code(&unknown)),
        "unknown methods are refused: {unknown}"
    );
    p.close_stdin();
    assert!(p.wait_exit(TIMEOUT).success());
}

#[test]
fn approvals_answered_by_the_test_as_the_client() {
    let dir = state_dir();
    let mut p = Proc::serve(dir.path(), &["--workspace", "/"]);
    p.init();
    // One thread per run: core delivers turn/completed a moment before it releases the thread,
    // so a turn/start sent right after it can still meet -32009 (reported to core).
    let mut n = 0;
    let mut run = |p: &mut Proc, answer: &dyn Fn(&Value) -> Value| -> (Value, Value, Value) {
        n += 1;
        let thread = format!("ap{n}");
        p.req(
            "thread/start",
            json!({"threadId": thread, "agentOptions": {"script": tool_script()}}),
        );
        let started = p.req(
            "turn/start",
            json!({"threadId": thread, "input": [{"type": "text", "text": "go"}]}),
        );
        assert!(started.get("result").is_some(), "{started}");
        let ask = p.wait_method("approval/decide");
        assert!(ask["id"].is_u64(), "a server request carries an id: {ask}");
        let b = &ask["params"]["binding"];
        for field in [
            "threadId",
            "turnId",
            "itemId",
            "operationDigest",
            "policyDigest",
            "workspaceDigest",
            "nonce",
            "expiresAt",
        ] {
            assert!(b[field].is_string(), "binding.{field} missing: {ask}");
        }
        assert_eq!(b["threadId"], thread.as_str());
        assert_eq!(ask["params"]["operation"]["tool"], "fs.write");
        p.send(&json!({"jsonrpc": "2.0", "id": ask["id"], "result": answer(&ask)}));
        let resolved = p.wait_method("approval/resolved");
        let result = p.wait_method("tool/result");
        let done = p.wait_method("turn/completed");
        p.seen.clear();
        (resolved, result, done)
    };
    let nonce = |ask: &Value| ask["params"]["binding"]["nonce"].clone();

    let (resolved, result, done) = run(&mut p, &|_| json!({"kind": "acceptOnce"}));
    assert_eq!(resolved["params"]["outcome"], "approved", "{resolved}");
    assert_eq!(result["params"]["result"]["status"], "ok", "{result}");
    assert_eq!(done["params"]["turn"]["status"], "completed");

    let (resolved, result, _) = run(
        &mut p,
        &|_| json!({"kind": "decline", "reason": "not today"}),
    );
    assert_eq!(resolved["params"]["outcome"], "declined", "{resolved}");
    assert_eq!(result["params"]["result"]["status"], "denied", "{result}");
    assert_eq!(
        result["params"]["result"]["reason"], "approval declined: not today",
        "the tool result carries the user's reason"
    );

    // The pre-published answer (nonce echoed, tag `decision`) fails closed: the tool does not
    // run, and it is recorded.
    let (resolved, result, _) = run(
        &mut p,
        &|ask| json!({"nonce": nonce(ask), "decision": {"decision": "acceptOnce"}}),
    );
    assert_eq!(resolved["params"]["outcome"], "failedClosed", "{resolved}");
    assert_eq!(resolved["params"]["failure"], "unknownDecision");
    assert_eq!(result["params"]["result"]["status"], "denied");

    // An unknown decision fails closed too.
    let (resolved, _, _) = run(&mut p, &|_| json!({"kind": "acceptAlways"}));
    assert_eq!(resolved["params"]["outcome"], "failedClosed", "{resolved}");

    // The client answering with an error: fails closed.
    let (resolved, _, _) = run(&mut p, &|_| Value::Null);
    assert_eq!(resolved["params"]["outcome"], "failedClosed", "{resolved}");
    p.close_stdin();
    assert!(p.wait_exit(TIMEOUT).success());
}

/// A request line of exactly `len` bytes (padded with JSON whitespace inside the object).
fn padded_request(id: u64, method: &str, params: Value, len: usize) -> Vec<u8> {
    let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string();
    let mut line = body.as_bytes()[..body.len() - 1].to_vec();
    line.resize(len - 1, b' ');
    line.push(b'}');
    assert_eq!(line.len(), len);
    line
}

#[test]
fn line_cap_at_exactly_one_mib_and_one_byte_more() {
    let dir = state_dir();
    let mut p = Proc::serve(dir.path(), &[]);
    p.init();
    // Exactly 1 MiB before the newline: parsed and run.
    let mut exact = padded_request(7, "thread/start", json!({"threadId": "exact"}), MIB);
    exact.push(b'\n');
    p.send_raw(&exact);
    let r = p.response_to(&json!(7));
    assert_eq!(r["result"]["thread"]["id"], "exact", "{r}");
    // One byte more: -32600 with id null, not parsed, not run; the next line is served.
    let mut over = padded_request(8, "thread/start", json!({"threadId": "over"}), MIB + 1);
    over.push(b'\n');
    p.send_raw(&over);
    let refused = p.recv();
    assert_eq!(code(&refused), -32600, "{refused}");
    assert_eq!(refused["id"], Value::Null);
    assert!(refused["error"]["message"]
        .as_str()
        .unwrap()
        .contains("1048576-byte limit"));
    let r = p.req("thread/read", json!({"threadId": "over"}));
    assert_eq!(code(&r), -32004, "the over-long request never ran: {r}");
    // A 5 MiB line arriving in small pieces: one refusal, and the stream stays in sync.
    let mut stdin = p.take_stdin();
    let writer = std::thread::spawn(move || {
        let piece = vec![b'x'; 64 * 1024];
        for _ in 0..80 {
            stdin.write_all(&piece).unwrap();
        }
        stdin.write_all(b"\n").unwrap();
        stdin
            .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"thread/list\",\"params\":{}}\n")
            .unwrap();
        stdin
    });
    let refused = p.recv();
    assert_eq!(code(&refused), -32600, "{refused}");
    let r = p.recv();
    assert_eq!(
        r["id"], 9,
        "exactly one refusal, then the next request: {r}"
    );
    drop(writer.join().unwrap());
    assert!(p.wait_exit(TIMEOUT).success());
}

#[test]
fn malformed_input_of_every_kind() {
    let dir = state_dir();
    let mut p = Proc::serve(dir.path(), &[]);
    p.init();
    let deep = "[".repeat(10_000);
    // (what, bytes, expected error code, or None when the line gets no answer at all)
    let cases: Vec<(&str, Vec<u8>, Option<i64>)> = vec![
        ("not JSON", b"garbage".to_vec(), Some(-32700)),
        ("truncated object", br#"{"jsonrpc":"2.0","id":1,"method":"thread/list""#.to_vec(), Some(-32700)),
        ("trailing garbage", br#"{"jsonrpc":"2.0","id":1,"method":"thread/list","params":{}} x"#.to_vec(), Some(-32700)),
        ("invalid UTF-8", b"\xff\xfe{}".to_vec(), Some(-32700)),
        ("overlong UTF-8 encoding", b"{\"a\":\"\xc0\xaf\"}".to_vec(), Some(-32700)),
        ("UTF-8 encoded surrogate", b"{\"a\":\"\xed\xa0\x80\"}".to_vec(), Some(-32700)),
        ("truncated UTF-8 sequence", b"{\"a\":\"\xe2\x82\"}".to_vec(), Some(-32700)),
        (
            "invalid UTF-8 inside a valid request",
            b"{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"thread/start\",\"params\":{\"threadId\":\"u\",\"title\":\"\xff\"}}".to_vec(),
            Some(-32700),
        ),
        ("byte order mark", b"\xef\xbb\xbf{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"thread/list\"}".to_vec(), Some(-32700)),
        ("NUL byte", b"{\"a\":\x00}".to_vec(), Some(-32700)),
        ("nesting past the parser's depth limit", deep.into_bytes(), Some(-32700)),
        ("empty batch", b"[]".to_vec(), Some(-32600)),
        ("batch (not in wire v1)", br#"[{"jsonrpc":"2.0","id":1,"method":"thread/list"}]"#.to_vec(), Some(-32600)),
        ("number", b"42".to_vec(), Some(-32600)),
        ("string", br#""thread/list""#.to_vec(), Some(-32600)),
        ("null", b"null".to_vec(), Some(-32600)),
        ("empty object", b"{}".to_vec(), Some(-32600)),
        ("missing jsonrpc", br#"{"id":1,"method":"thread/list","params":{}}"#.to_vec(), Some(-32600)),
        ("wrong jsonrpc version", br#"{"jsonrpc":"1.0","id":1,"method":"thread/list","params":{}}"#.to_vec(), Some(-32600)),
        ("method not a string", br#"{"jsonrpc":"2.0","id":1,"method":5}"#.to_vec(), Some(-32600)),
        ("id an object", br#"{"jsonrpc":"2.0","id":{},"method":"thread/list","params":{}}"#.to_vec(), Some(-32600)),
        ("params of the wrong type", br#"{"jsonrpc":"2.0","id":1,"method":"thread/read","params":{"threadId":5}}"#.to_vec(), Some(-32602)),
        ("blank line", b"".to_vec(), None),
        ("whitespace line", b" \t \r".to_vec(), None),
        ("a response nobody asked for", br#"{"jsonrpc":"2.0","id":424242,"result":{}}"#.to_vec(), None),
    ];
    let mut sentinel = 1000;
    for (what, bytes, expected) in cases {
        sentinel += 1;
        let mut data = bytes.clone();
        data.push(b'\n');
        data.extend_from_slice(
            json!({"jsonrpc": "2.0", "id": sentinel, "method": "thread/list", "params": {}})
                .to_string()
                .as_bytes(),
        );
        data.push(b'\n');
        p.send_raw(&data);
        let mut replies = Vec::new();
        loop {
            let m = p.recv();
            if m["id"] == sentinel {
                assert!(
                    m.get("result").is_some(),
                    "{what}: the stream is in sync: {m}"
                );
                break;
            }
            replies.push(m);
        }
        match expected {
            None => assert!(
                replies.is_empty(),
                "{what}: expected no answer, got {replies:?}"
            ),
            Some(c) => {
                assert_eq!(replies.len(), 1, "{what}: exactly one answer: {replies:?}");
                let got = code(&replies[0]);
                // A request the validator rejects before dispatch may be -32600 or -32602.
                let ok = got == c || (c == -32602 && got == -32600);
                assert!(ok, "{what}: expected {c}, got {}", replies[0]);
                if c == -32700 {
                    assert_eq!(replies[0]["id"], Value::Null, "{what}: {}", replies[0]);
                }
            }
        }
    }
    // Nothing malformed ran.
    let list = p.req("thread/list", json!({"includeArchived": true}));
    assert_eq!(list["result"]["threads"], json!([]), "{list}");
    p.close_stdin();
    assert!(p.wait_exit(TIMEOUT).success());
    // A final line without a newline at EOF is still served.
    let mut p = Proc::serve(dir.path(), &[]);
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": initialize_params(ALL_FEATURES)});
    p.send_raw(init.to_string().as_bytes());
    p.close_stdin();
    assert_eq!(p.recv()["id"], 1);
    assert!(p.wait_exit(TIMEOUT).success());
}

#[test]
fn overload_becomes_backpressure_and_every_request_is_answered() {
    let dir = state_dir();
    let mut p = Proc::serve(dir.path(), &["--queue-cap", "1", "--log-level", "debug"]);
    p.init();
    p.req("thread/start", json!({"threadId": "busy"}));
    const N: u64 = 1500;
    let mut stdin = p.take_stdin();
    let writer = std::thread::spawn(move || {
        let mut all = Vec::new();
        for id in 0..N {
            let m = json!({"jsonrpc": "2.0", "id": 10_000 + id, "method": "thread/read", "params": {"threadId": "busy", "limit": 1}});
            all.extend_from_slice(m.to_string().as_bytes());
            all.push(b'\n');
        }
        stdin.write_all(&all).unwrap();
        stdin
    });
    for id in 0..N {
        let m = p.recv();
        assert_eq!(m["id"], 10_000 + id, "answered in order, none dropped: {m}");
        assert!(m.get("result").is_some(), "no -32001 through stdio: {m}");
    }
    drop(writer.join().unwrap());
    assert!(p.wait_exit(TIMEOUT).success());
    assert!(
        p.stderr().contains("inbound queue was full; held stdin"),
        "the queue did fill (the test exercised backpressure): {}",
        p.stderr()
    );
}

/// Waits for `pid` to exit and returns (exit code, peak RSS in KiB).
fn reap_with_peak_rss(pid: i32, timeout: Duration) -> (i32, i64) {
    let deadline = Instant::now() + timeout;
    loop {
        let mut status = 0;
        // SAFETY: zeroed rusage is a valid out-param; wait4 on our own child.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        let rc = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        if rc == pid {
            assert!(libc::WIFEXITED(status), "exited, not killed: {status}");
            return (libc::WEXITSTATUS(status), usage.ru_maxrss);
        }
        assert!(Instant::now() < deadline, "the server kept running");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_client_that_stops_reading_stdout_loses_the_transport_not_memory() {
    let dir = state_dir();
    let mut p = Proc::serve_unread(dir.path(), &["--stall-timeout-ms", "1000"]);
    let pid = p.pid();
    let mut stdin = p.take_stdin();
    // Never read a byte of stdout: the pipe fills, the 512-message queue fills, and nothing is
    // taken from it for the 1 s stall deadline.
    std::thread::spawn(move || {
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": initialize_params(ALL_FEATURES)});
        let _ = writeln!(stdin, "{init}");
        let _ = writeln!(
            stdin,
            "{}",
            json!({"jsonrpc": "2.0", "id": 1, "method": "thread/start", "params": {"threadId": "flood", "title": "x".repeat(200)}})
        );
        for id in 2..20_000 {
            let m = json!({"jsonrpc": "2.0", "id": id, "method": "thread/list", "params": {}});
            if writeln!(stdin, "{m}").is_err() {
                return; // the server is gone
            }
        }
    });
    let (code, peak_kib) = reap_with_peak_rss(pid, TIMEOUT);
    let stderr = p.stderr();
    assert_eq!(code, 3, "stderr:\n{stderr}");
    assert!(
        stderr.contains("client stopped reading stdout"),
        "a diagnostic names the cause: {stderr}"
    );
    assert!(
        peak_kib < 200 * 1024,
        "memory stayed bounded: peak {peak_kib} KiB"
    );
    // The work it acknowledged is durable.
    let (rc, out, err) = run(&[
        "rollout",
        "verify",
        "--state-dir",
        dir.path().to_str().unwrap(),
    ]);
    assert_eq!(rc, 0, "{out}{err}");
    assert!(out.contains("flood"), "{out}");
}

#[test]
fn eof_lets_in_flight_work_finish_then_exits_zero() {
    let dir = state_dir();
    let mut p = Proc::serve(dir.path(), &[]);
    p.init();
    p.req("thread/start", json!({"threadId": "tail", "agentOptions": {"script": {"steps": [{"type": "sleep", "ms": 300}, {"type": "message", "text": "finished after EOF"}]}}}));
    p.send(&json!({"jsonrpc": "2.0", "id": 50, "method": "turn/start", "params": {"threadId": "tail", "input": [{"type": "text", "text": "go"}]}}));
    p.close_stdin();
    assert_eq!(
        p.response_to(&json!(50))["result"]["turn"]["status"],
        "queued"
    );
    let done = p.wait_method("turn/completed");
    assert_eq!(done["params"]["turn"]["status"], "completed", "{done}");
    p.stdout_ends(TIMEOUT).unwrap();
    assert!(p.wait_exit(TIMEOUT).success(), "{}", p.stderr());
}

#[test]
fn eof_does_not_wait_past_the_drain_deadline_or_for_an_unanswerable_approval() {
    let dir = state_dir();
    let path = dir.path().to_str().unwrap().to_string();
    // A turn that would run for 60 s: interrupted at the 300 ms drain deadline, durably.
    let mut p = Proc::serve(dir.path(), &["--drain-timeout-ms", "300"]);
    p.init();
    p.req("thread/start", json!({"threadId": "long", "agentOptions": {"script": {"steps": [{"type": "sleep", "ms": 60000}]}}}));
    p.req(
        "turn/start",
        json!({"threadId": "long", "input": [{"type": "text", "text": "go"}]}),
    );
    // A turn waiting for an approval the closed stdin can never bring.
    p.req(
        "thread/start",
        json!({"threadId": "asks", "agentOptions": {"script": tool_script()}}),
    );
    p.req(
        "turn/start",
        json!({"threadId": "asks", "input": [{"type": "text", "text": "go"}]}),
    );
    p.wait_method("approval/decide");
    let started = Instant::now();
    p.close_stdin();
    assert!(p.wait_exit(TIMEOUT).success(), "{}", p.stderr());
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    for thread in ["long", "asks"] {
        let (rc, out, _) = run(&["rollout", "show", thread, "--json", "--state-dir", &path]);
        assert_eq!(rc, 0);
        let last: Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
        assert_eq!(last["payload"]["type"], "turnCompleted", "{thread}: {last}");
        assert_eq!(last["payload"]["status"], "interrupted", "{thread}: {last}");
        assert!(
            !out.contains("\"status\":\"ok\""),
            "{thread}: no tool ran without approval"
        );
    }
}

#[test]
fn sqlite_store_serves_the_same_protocol() {
    let dir = state_dir();
    let mut p = Proc::serve(
        dir.path(),
        &["--store", "sqlite", "--durability", "buffered"],
    );
    p.init();
    p.req("thread/start", json!({"threadId": "sq"}));
    p.req(
        "turn/start",
        json!({"threadId": "sq", "input": [{"type": "text", "text": "hi"}]}),
    );
    assert_eq!(
        p.wait_method("turn/completed")["params"]["turn"]["status"],
        "completed"
    );
    p.close_stdin();
    assert!(p.wait_exit(TIMEOUT).success());
    let (rc, out, err) = run(&[
        "rollout",
        "verify",
        "--state-dir",
        dir.path().to_str().unwrap(),
    ]);
    assert_eq!(rc, 0, "{out}{err}");
    assert!(out.contains("ok   sq"), "{out}");
}
