//! The C ABI driven from Rust as a C host would: a real server in a temp dir, buffers that are
//! too small (and the kept text), NULLs, config errors, a host kernel through a function pointer,
//! approvals through a callback, and the header freshness check.

use super::*;
use std::ffi::CString;
use std::ptr::{null, null_mut};
use std::sync::atomic::AtomicUsize;

#[test]
fn header_is_fresh() {
    let generated = include_str!(concat!(env!("OUT_DIR"), "/cc_app_server.h"));
    let checked_in = include_str!("../../include/cc_app_server.h");
    assert!(
        generated == checked_in,
        "ffi/include/cc_app_server.h is stale: run `CC_FFI_UPDATE_HEADER=1 cargo build -p cc-app-server-ffi` and commit it"
    );
}

fn c(s: &str) -> CString {
    CString::new(s).unwrap()
}

fn open(dir: &std::path::Path, extra: Value, kernel: Option<&cc_kernel>) -> *mut cc_server {
    let mut config = json!({"stateDir": dir.to_str().unwrap(), "durability": "buffered"});
    for (k, v) in extra.as_object().unwrap() {
        config[k] = v.clone();
    }
    let mut server = null_mut();
    let mut err = [0 as c_char; 256];
    let code = unsafe {
        cc_server_open(
            c(&config.to_string()).as_ptr(),
            kernel.map_or(null(), |k| k as *const _),
            &mut server,
            err.as_mut_ptr(),
            err.len(),
        )
    };
    let text = unsafe { CStr::from_ptr(err.as_ptr()) }.to_string_lossy();
    assert_eq!(code, CC_OK, "{text}");
    server
}

/// Receives into a growable buffer the way the header tells C hosts to.
unsafe fn recv(conn: *const cc_connection) -> Value {
    let mut needed = 0usize;
    let code = cc_connection_recv(conn, 20_000, null_mut(), 0, &mut needed);
    assert_eq!(code, CC_ERR_BUFFER_TOO_SMALL);
    let mut buf = vec![0 as c_char; needed];
    assert_eq!(
        cc_connection_recv(conn, 0, buf.as_mut_ptr(), buf.len(), &mut needed),
        CC_OK
    );
    serde_json::from_str(CStr::from_ptr(buf.as_ptr()).to_str().unwrap()).unwrap()
}

unsafe fn request(client: *const cc_client, method: &str, params: Value) -> (cc_result, Value) {
    let mut buf = vec![0 as c_char; 64 * 1024];
    let mut needed = 0;
    let code = cc_client_request(
        client,
        c(method).as_ptr(),
        c(&params.to_string()).as_ptr(),
        buf.as_mut_ptr(),
        buf.len(),
        &mut needed,
    );
    let text = CStr::from_ptr(buf.as_ptr()).to_str().unwrap();
    (code, serde_json::from_str(text).unwrap_or(Value::Null))
}

unsafe fn wait_notification(client: *const cc_client, method: &str) -> Value {
    let mut buf = vec![0 as c_char; 64 * 1024];
    for _ in 0..200 {
        let code =
            cc_client_next_notification(client, 100, buf.as_mut_ptr(), buf.len(), null_mut());
        if code == CC_OK {
            let v: Value =
                serde_json::from_str(CStr::from_ptr(buf.as_ptr()).to_str().unwrap()).unwrap();
            if v["method"] == method {
                return v;
            }
        } else {
            assert_eq!(code, CC_ERR_TIMEOUT);
        }
    }
    panic!("no {method} notification");
}

#[test]
fn config_errors_are_reported_and_nulls_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = null_mut();
    let mut err = [0 as c_char; 128];
    let bad = c(&json!({"stateDir": dir.path().to_str().unwrap(), "stor": "jsonl"}).to_string());
    let code = unsafe {
        cc_server_open(
            bad.as_ptr(),
            null(),
            &mut server,
            err.as_mut_ptr(),
            err.len(),
        )
    };
    assert_eq!(code, CC_ERR_INVALID_ARGUMENT);
    assert!(server.is_null());
    let text = unsafe { CStr::from_ptr(err.as_ptr()) }.to_str().unwrap();
    assert!(text.contains("unknown config key \"stor\""), "{text}");
    let code = unsafe { cc_server_open(null(), null(), &mut server, null_mut(), 0) };
    assert_eq!(code, CC_ERR_NULL_ARGUMENT);
    // A short error buffer is truncated and still NUL-terminated.
    let mut tiny = [1 as c_char; 8];
    let code =
        unsafe { cc_server_open(c("[]").as_ptr(), null(), &mut server, tiny.as_mut_ptr(), 8) };
    assert_eq!(code, CC_ERR_INVALID_ARGUMENT);
    assert_eq!(tiny[7], 0);
    unsafe {
        assert_eq!(
            cc_connection_send(null(), c("{}").as_ptr(), null_mut()),
            CC_ERR_NULL_ARGUMENT
        );
        cc_server_free(null_mut());
        cc_connection_free(null_mut());
        cc_client_free(null_mut());
        assert!(!cc_turn_is_cancelled(null()) || cc_turn_is_cancelled(null()));
        let name = CStr::from_ptr(cc_result_name(CC_ERR_BUFFER_TOO_SMALL as i32));
        assert_eq!(name.to_str().unwrap(), "CC_ERR_BUFFER_TOO_SMALL");
        let mut needed = 0;
        assert_eq!(
            cc_schema_digest(null_mut(), 0, &mut needed),
            CC_ERR_BUFFER_TOO_SMALL
        );
        assert_eq!(needed, "sha256:".len() + 64 + 1);
        assert_eq!(cc_protocol_version(), cc_agent_protocol::PROTOCOL_VERSION);
    }
}

#[test]
fn raw_connection_keeps_a_message_that_did_not_fit() {
    let dir = tempfile::tempdir().unwrap();
    let server = open(dir.path(), json!({"maxLineBytes": 4096}), None);
    unsafe {
        let mut conn = null_mut();
        assert_eq!(cc_server_connect(server, &mut conn), CC_OK);
        let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1, "minimumProtocolVersion": 1, "client": {"name": "c", "version": "1"}, "features": []}});
        assert_eq!(
            cc_connection_send(conn, c(&init.to_string()).as_ptr(), null_mut()),
            CC_OK
        );
        let answer = recv(conn);
        assert_eq!(answer["result"]["protocolVersion"], 1, "{answer}");
        assert_eq!(
            cc_connection_recv(conn, 10, null_mut(), 0, null_mut()),
            CC_ERR_TIMEOUT
        );
        let long = format!("\"{}\"", "x".repeat(5000));
        assert_eq!(
            cc_connection_send(conn, c(&long).as_ptr(), null_mut()),
            CC_ERR_LINE_TOO_LARGE
        );
        let mut needed = 0;
        assert_eq!(
            cc_connection_last_error(conn, null_mut(), 0, &mut needed),
            CC_ERR_BUFFER_TOO_SMALL
        );
        let mut buf = vec![0 as c_char; needed];
        assert_eq!(
            cc_connection_last_error(conn, buf.as_mut_ptr(), needed, null_mut()),
            CC_OK
        );
        assert!(CStr::from_ptr(buf.as_ptr())
            .to_str()
            .unwrap()
            .contains("4096"));
        assert!(cc_connection_is_open(conn));
        // Freeing the server first is allowed: the connection reports closed, then is freed.
        cc_server_free(server);
        assert!(!cc_connection_is_open(conn));
        assert_eq!(
            cc_connection_send(conn, c("{}").as_ptr(), null_mut()),
            CC_ERR_CLOSED
        );
        cc_connection_free(conn);
    }
}

unsafe extern "C" fn accept_once(user_data: *mut c_void, params_json: *const c_char) -> i32 {
    let seen = &*(user_data as *const AtomicUsize);
    let params: Value =
        serde_json::from_str(CStr::from_ptr(params_json).to_str().unwrap()).unwrap();
    assert!(params["binding"]["nonce"].is_string());
    seen.fetch_add(1, Ordering::SeqCst);
    CC_DECISION_ACCEPT_ONCE
}

#[test]
fn client_turn_with_an_approval_and_protocol_errors() {
    let dir = tempfile::tempdir().unwrap();
    let server = open(dir.path(), json!({}), None);
    let seen = AtomicUsize::new(0);
    unsafe {
        let mut client = null_mut();
        let code = cc_client_connect(
            server,
            Some(accept_once),
            &seen as *const _ as *mut c_void,
            0,
            &mut client,
        );
        assert_eq!(code, CC_OK);
        let script = json!({"steps": [{"type": "tool", "tool": "fs.write", "arguments": {"path": "a"}}, {"type": "message", "text": "done"}]});
        let (code, r) = request(
            client,
            "thread/start",
            json!({"threadId": "t1", "agentOptions": {"script": script}}),
        );
        assert_eq!(code, CC_OK, "{r}");
        let (code, r) = request(
            client,
            "turn/start",
            json!({"threadId": "t1", "input": [{"type": "text", "text": "go"}]}),
        );
        assert_eq!(code, CC_OK, "{r}");
        let done = wait_notification(client, "turn/completed");
        assert_eq!(done["params"]["turn"]["status"], "completed", "{done}");
        assert_eq!(seen.load(Ordering::SeqCst), 1);
        // A JSON-RPC error: the buffer holds the error object.
        let (code, e) = request(client, "thread/read", json!({"threadId": "nope"}));
        assert_eq!(code, CC_ERR_PROTOCOL);
        assert_eq!(e["code"], -32004);
        assert_eq!(cc_client_last_error_code(client), -32004);
        // A result that does not fit is kept, with its code.
        let mut needed = 0;
        let code = cc_client_request(
            client,
            c("thread/list").as_ptr(),
            null(),
            null_mut(),
            0,
            &mut needed,
        );
        assert_eq!(code, CC_ERR_BUFFER_TOO_SMALL);
        let mut buf = vec![0 as c_char; needed];
        assert_eq!(
            cc_client_last_result(client, buf.as_mut_ptr(), needed, null_mut()),
            CC_OK
        );
        let list: Value =
            serde_json::from_str(CStr::from_ptr(buf.as_ptr()).to_str().unwrap()).unwrap();
        assert_eq!(list["threads"][0]["id"], "t1");
        assert_eq!(
            cc_client_last_result(client, buf.as_mut_ptr(), needed, null_mut()),
            CC_ERR_FAILED
        );
        let (mut ok, mut events) = (false, 0u64);
        assert_eq!(
            cc_server_verify_thread(server, c("t1").as_ptr(), &mut ok, &mut events),
            CC_OK
        );
        assert!(ok && events > 5, "{events}");
        assert_eq!(
            cc_server_verify_thread(server, c("nope").as_ptr(), &mut ok, &mut events),
            CC_ERR_STORE
        );
        cc_client_free(client);
        cc_server_free(server);
    }
}

struct KernelState {
    turns: AtomicUsize,
    released: AtomicUsize,
}

unsafe extern "C" fn host_run_turn(
    user_data: *mut c_void,
    turn: *mut cc_turn,
    input: *const c_char,
) -> i32 {
    let state = &*(user_data as *const KernelState);
    state.turns.fetch_add(1, Ordering::SeqCst);
    let input: Value = serde_json::from_str(CStr::from_ptr(input).to_str().unwrap()).unwrap();
    let text = input[0]["text"].as_str().unwrap_or_default().to_string();
    let mut id = [0 as c_char; 64];
    if cc_turn_new_item_id(turn, id.as_mut_ptr(), id.len(), null_mut()) != CC_OK {
        return CC_ERR_FAILED as i32;
    }
    let item_id = CStr::from_ptr(id.as_ptr()).to_str().unwrap().to_string();
    if text == "fail" {
        cc_turn_fail(turn, c("the host said no").as_ptr());
        return CC_ERR_FAILED as i32;
    }
    // Invalid item JSON is refused and recorded as this handle's last error.
    if cc_turn_item_started(turn, c("{\"type\": \"bogus\"}").as_ptr()) != CC_ERR_INVALID_ARGUMENT {
        return CC_ERR_FAILED as i32;
    }
    let call = json!({"type": "toolCall", "id": item_id, "call": {"tool": "echo", "arguments": {"x": 1}}, "status": "inProgress", "result": null});
    if cc_turn_item_started(turn, c(&call.to_string()).as_ptr()) != CC_OK {
        // Pass the turn handle's last error on as the failure reason.
        let mut why = [0 as c_char; 512];
        cc_turn_last_error(turn, why.as_mut_ptr(), why.len(), null_mut());
        cc_turn_fail(turn, why.as_ptr());
        return CC_ERR_FAILED as i32;
    }
    let mut needed = 0;
    let code = cc_turn_request_tool(
        turn,
        c(&item_id).as_ptr(),
        c("echo").as_ptr(),
        c("{\"x\":1}").as_ptr(),
        null_mut(),
        0,
        &mut needed,
    );
    if code != CC_ERR_BUFFER_TOO_SMALL {
        return code as i32;
    }
    let mut result = vec![0 as c_char; needed];
    if cc_turn_last_result(turn, result.as_mut_ptr(), needed, null_mut()) != CC_OK {
        return CC_ERR_FAILED as i32;
    }
    let result: Value =
        serde_json::from_str(CStr::from_ptr(result.as_ptr()).to_str().unwrap()).unwrap();
    let done = json!({"type": "toolCall", "id": item_id, "call": {"tool": "echo", "arguments": {"x": 1}}, "status": "completed", "result": result});
    cc_turn_item_completed(turn, c(&done.to_string()).as_ptr()) as i32
}

unsafe extern "C" fn host_release(user_data: *mut c_void) {
    (*(user_data as *const KernelState))
        .released
        .fetch_add(1, Ordering::SeqCst);
}

#[test]
fn host_kernel_through_a_function_pointer() {
    let dir = tempfile::tempdir().unwrap();
    let state = KernelState {
        turns: AtomicUsize::new(0),
        released: AtomicUsize::new(0),
    };
    let kernel = cc_kernel {
        run_turn: Some(host_run_turn),
        user_data: &state as *const _ as *mut c_void,
        release: Some(host_release),
    };
    // A failed open does not take (or release) user_data.
    let mut none = null_mut();
    let code = unsafe { cc_server_open(c("{}").as_ptr(), &kernel, &mut none, null_mut(), 0) };
    assert_eq!(code, CC_ERR_INVALID_ARGUMENT);
    assert_eq!(state.released.load(Ordering::SeqCst), 0);

    let server = open(dir.path(), json!({"policy": "autoApprove"}), Some(&kernel));
    unsafe {
        let mut client = null_mut();
        assert_eq!(
            cc_client_connect(server, None, null_mut(), 0, &mut client),
            CC_OK
        );
        request(client, "thread/start", json!({"threadId": "k"}));
        request(
            client,
            "turn/start",
            json!({"threadId": "k", "input": [{"type": "text", "text": "hi"}]}),
        );
        let done = wait_notification(client, "turn/completed");
        assert_eq!(done["params"]["turn"]["status"], "completed", "{done}");
        let (_, r) = request(client, "thread/read", json!({"threadId": "k"}));
        let text = r.to_string();
        assert!(
            text.contains("\"echo\":{\"x\":1}"),
            "the echo tool ran: {text}"
        );
        request(
            client,
            "turn/start",
            json!({"threadId": "k", "input": [{"type": "text", "text": "fail"}]}),
        );
        let failed = wait_notification(client, "turn/completed");
        assert_eq!(failed["params"]["turn"]["status"], "failed", "{failed}");
        assert!(failed.to_string().contains("the host said no"), "{failed}");
        assert_eq!(state.turns.load(Ordering::SeqCst), 2);
        cc_client_free(client);
        cc_server_free(server);
    }
    // Released exactly once, after the server and everything made from it are gone.
    for _ in 0..100 {
        if state.released.load(Ordering::SeqCst) == 1 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(state.released.load(Ordering::SeqCst), 1);
}

#[test]
fn result_names_cover_every_code_and_refuse_out_of_range_values() {
    let mut names = std::collections::BTreeSet::new();
    for code in 0..=13 {
        let name = unsafe { CStr::from_ptr(cc_result_name(code)) };
        let name = name.to_str().unwrap();
        assert!(
            name.starts_with("CC_") && name != "CC_UNKNOWN_RESULT",
            "{code}: {name}"
        );
        names.insert(name.to_string());
    }
    assert_eq!(names.len(), 14, "every code has its own name");
    // Values no cc_result has: a name, not undefined behaviour.
    for code in [14, 999, -1, i32::MIN, i32::MAX] {
        let name = unsafe { CStr::from_ptr(cc_result_name(code)) };
        assert_eq!(name.to_str().unwrap(), "CC_UNKNOWN_RESULT", "{code}");
    }
}

/// The turn handle a kernel kept past its run_turn (what a careless C host might do).
static KEPT_TURN: AtomicUsize = AtomicUsize::new(0);

unsafe extern "C" fn keeping_run_turn(
    _user_data: *mut c_void,
    turn: *mut cc_turn,
    _input: *const c_char,
) -> i32 {
    KEPT_TURN.store(turn as usize, Ordering::SeqCst);
    let mut id = [0 as c_char; 64];
    cc_turn_new_item_id(turn, id.as_mut_ptr(), id.len(), null_mut()) as i32
}

#[test]
fn a_turn_handle_used_after_its_run_turn_is_expired_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let kernel = cc_kernel {
        run_turn: Some(keeping_run_turn),
        user_data: null_mut(),
        release: None,
    };
    let server = open(dir.path(), json!({}), Some(&kernel));
    unsafe {
        let mut client = null_mut();
        assert_eq!(
            cc_client_connect(server, None, null_mut(), 0, &mut client),
            CC_OK
        );
        request(client, "thread/start", json!({"threadId": "kept"}));
        request(
            client,
            "turn/start",
            json!({"threadId": "kept", "input": [{"type": "text", "text": "hi"}]}),
        );
        let done = wait_notification(client, "turn/completed");
        assert_eq!(done["params"]["turn"]["status"], "completed", "{done}");
        let kept = KEPT_TURN.load(Ordering::SeqCst) as *const cc_turn;
        assert!(!kept.is_null());
        let started = std::time::Instant::now();
        let mut buf = [0 as c_char; 64];
        assert_eq!(
            cc_turn_new_item_id(kept, buf.as_mut_ptr(), buf.len(), null_mut()),
            CC_ERR_EXPIRED
        );
        assert_eq!(cc_turn_item_started(kept, c("{}").as_ptr()), CC_ERR_EXPIRED);
        assert_eq!(
            cc_turn_last_error(kept, buf.as_mut_ptr(), buf.len(), null_mut()),
            CC_ERR_EXPIRED
        );
        assert!(
            cc_turn_is_cancelled(kept),
            "an expired turn reads as cancelled"
        );
        assert!(cc_turn_sleep(kept, 60_000), "and never sleeps");
        // A pointer the library never handed out is refused the same way.
        let made_up = 0xdead_beef_usize as *const cc_turn;
        assert_eq!(
            cc_turn_new_item_id(made_up, buf.as_mut_ptr(), buf.len(), null_mut()),
            CC_ERR_EXPIRED
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "expired handles answer at once"
        );
        cc_client_free(client);
        cc_server_free(server);
    }
}

/// Records the C log callback received: (level, target, message).
static LOGGED: Mutex<Vec<(i32, String, String)>> = Mutex::new(Vec::new());

unsafe extern "C" fn collect_log(
    user_data: *mut c_void,
    level: i32,
    target: *const c_char,
    message: *const c_char,
) {
    assert_eq!(user_data as usize, 0x5eed, "user_data is passed through");
    lock(&LOGGED).push((
        level,
        CStr::from_ptr(target).to_string_lossy().into_owned(),
        CStr::from_ptr(message).to_string_lossy().into_owned(),
    ));
}

fn logged_after(deadline: Duration, pred: impl Fn(&(i32, String, String)) -> bool) -> bool {
    let until = std::time::Instant::now() + deadline;
    while std::time::Instant::now() < until {
        if lock(&LOGGED).iter().any(&pred) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// The only test that touches the process-wide log destination.
#[test]
fn engine_diagnostics_reach_the_c_log_callback_at_the_chosen_level() {
    let user_data = 0x5eed as *mut c_void;
    unsafe {
        assert_eq!(
            cc_set_log_callback(Some(collect_log), user_data, 6),
            CC_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            cc_set_log_callback(Some(collect_log), user_data, -1),
            CC_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            cc_set_log_callback(Some(collect_log), user_data, CC_LOG_WARN),
            CC_OK
        );
    }
    // A thread whose log is damaged in the middle: opening the server reports it (a warning
    // from the engine's recovery, which an iOS or Android host could not see on stderr).
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let server = open(&state, json!({}), None);
    unsafe {
        let mut client = null_mut();
        assert_eq!(
            cc_client_connect(server, None, null_mut(), 0, &mut client),
            CC_OK
        );
        for id in ["good", "bad"] {
            request(client, "thread/start", json!({"threadId": id}));
            request(
                client,
                "turn/start",
                json!({"threadId": id, "input": [{"type": "text", "text": "hi"}]}),
            );
            wait_notification(client, "turn/completed");
        }
        cc_client_free(client);
        cc_server_free(server);
    }
    let log = cc_app_server::rollout::layout::thread_log(&state, "bad");
    let mut bytes = std::fs::read(&log).unwrap();
    let second_line = bytes.iter().position(|b| *b == b'\n').unwrap() + 10;
    bytes[second_line] ^= 0x01;
    std::fs::write(&log, bytes).unwrap();
    lock(&LOGGED).clear();
    let server = open(&state, json!({}), None);
    assert!(
        logged_after(Duration::from_secs(10), |(level, target, message)| {
            *level == CC_LOG_WARN && target.starts_with("cc_app_server") && message.contains("bad")
        }),
        "the recovery warning names the thread: {:?}",
        lock(&LOGGED)
    );
    // Below the chosen level nothing is delivered; after turning it off, nothing at all.
    tracing::info!(target: "cc_app_server::test", "not at warn level");
    unsafe {
        assert_eq!(cc_set_log_callback(None, null_mut(), CC_LOG_OFF), CC_OK);
    }
    tracing::error!(target: "cc_app_server::test", "after off");
    std::thread::sleep(Duration::from_millis(100));
    let seen = lock(&LOGGED).clone();
    assert!(
        !seen
            .iter()
            .any(|(_, _, m)| m.contains("not at warn level") || m.contains("after off")),
        "{seen:?}"
    );
    unsafe { cc_server_free(server) };
}

#[path = "../../../core/tests/openai_support/mod.rs"]
mod openai_support;

#[test]
fn config_selects_the_openai_kernel_and_the_workspace_tools() {
    let model = openai_support::MockModel::start(vec![
        openai_support::tool_calls(&[(
            "call_1",
            "write_file",
            r#"{"path":"hello.txt","content":"hi from the model"}"#,
        )]),
        openai_support::answer(&["Wrote ", "it."]),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let workspace = dir.path().join("ws");
    std::fs::create_dir(&workspace).unwrap();
    let server = open(
        &dir.path().join("state"),
        json!({
            "policy": "autoApprove",
            "openai": {"baseUrl": model.base_url, "model": "test-model", "apiKey": "sk-test", "maxSteps": 4},
            "workspaceToolsDir": workspace.to_str().unwrap(),
        }),
        None,
    );
    unsafe {
        let mut client = null_mut();
        assert_eq!(
            cc_client_connect(server, None, null_mut(), 0, &mut client),
            CC_OK
        );
        request(client, "thread/start", json!({"threadId": "ai"}));
        request(
            client,
            "turn/start",
            json!({"threadId": "ai", "input": [{"type": "text", "text": "write hello.txt"}]}),
        );
        let done = wait_notification(client, "turn/completed");
        assert_eq!(done["params"]["turn"]["status"], "completed", "{done}");
        cc_client_free(client);
        cc_server_free(server);
    }
    assert_eq!(
        std::fs::read_to_string(workspace.join("hello.txt")).unwrap(),
        "hi from the model",
        "the approved tool ran in the workspace"
    );
    let requests = model.requests();
    assert_eq!(requests.len(), 2, "one request per model step");
    assert_eq!(requests[0].body["model"], "test-model");
    assert_eq!(requests[0].header("authorization"), Some("Bearer sk-test"));
    let second = requests[1].body["messages"].to_string();
    assert!(
        second.contains("call_1"),
        "the tool result went back: {second}"
    );

    // Bad settings are refused with the setting named (and the key never echoed).
    for (extra, needle) in [
        (
            json!({"openai": {"baseUrl": "ftp://x", "model": "m", "apiKey": "sk-secret"}}),
            "base URL",
        ),
        (
            json!({"openai": {"baseUrl": "http://localhost:1/v1", "model": "m", "maxSteps": 0}}),
            "max_steps",
        ),
        (
            json!({"openai": {"baseUrl": "http://localhost:1/v1", "model": "m", "bogus": 1}}),
            "openai.\"bogus\"",
        ),
        (json!({"openai": "gpt"}), "must be a JSON object"),
        (
            json!({"workspaceToolsDir": dir.path().join("missing").to_str().unwrap()}),
            "workspace_tools_dir",
        ),
    ] {
        let mut config = json!({"stateDir": dir.path().join("other").to_str().unwrap()});
        for (k, v) in extra.as_object().unwrap() {
            config[k] = v.clone();
        }
        let mut s = null_mut();
        let mut err = [0 as c_char; 512];
        let code = unsafe {
            cc_server_open(
                c(&config.to_string()).as_ptr(),
                null(),
                &mut s,
                err.as_mut_ptr(),
                err.len(),
            )
        };
        let text = unsafe { CStr::from_ptr(err.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        assert_eq!(code, CC_ERR_INVALID_ARGUMENT, "{config}: {text}");
        assert!(text.contains(needle), "{config}: {text}");
        assert!(!text.contains("sk-secret"), "{text}");
        assert!(s.is_null());
    }
}

/// The history a host kernel saw on its last turn.
static SEEN_HISTORY: Mutex<String> = Mutex::new(String::new());

unsafe extern "C" fn history_run_turn(
    _user_data: *mut c_void,
    turn: *mut cc_turn,
    _input: *const c_char,
) -> i32 {
    let mut needed = 0;
    let code = cc_turn_history(turn, null_mut(), 0, &mut needed);
    if code != CC_ERR_BUFFER_TOO_SMALL {
        return code as i32;
    }
    let mut buf = vec![0 as c_char; needed];
    let code = cc_turn_history(turn, buf.as_mut_ptr(), buf.len(), null_mut());
    *lock(&SEEN_HISTORY) = CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned();
    code as i32
}

#[test]
fn a_host_kernel_reads_the_thread_history() {
    let dir = tempfile::tempdir().unwrap();
    let kernel = cc_kernel {
        run_turn: Some(history_run_turn),
        user_data: null_mut(),
        release: None,
    };
    let server = open(dir.path(), json!({}), Some(&kernel));
    unsafe {
        let mut client = null_mut();
        assert_eq!(
            cc_client_connect(server, None, null_mut(), 0, &mut client),
            CC_OK
        );
        request(client, "thread/start", json!({"threadId": "h"}));
        for text in ["first question", "second question"] {
            request(
                client,
                "turn/start",
                json!({"threadId": "h", "input": [{"type": "text", "text": text}]}),
            );
            let done = wait_notification(client, "turn/completed");
            assert_eq!(done["params"]["turn"]["status"], "completed", "{done}");
        }
        cc_client_free(client);
        cc_server_free(server);
    }
    let history: Value = serde_json::from_str(&lock(&SEEN_HISTORY)).unwrap();
    let turns = history["turns"].as_array().unwrap();
    assert_eq!(
        turns.len(),
        1,
        "the second turn sees the first, not itself: {history}"
    );
    assert_eq!(turns[0]["input"][0]["text"], "first question");
    assert_eq!(turns[0]["status"], "completed");
}

#[test]
fn the_rollout_key_comes_from_the_config_and_is_never_echoed() {
    let dir = tempfile::tempdir().unwrap();
    let key = "0f".repeat(32);
    let server = open(
        dir.path(),
        json!({"rolloutKeyHex": key, "outboundStallMs": 1000}),
        None,
    );
    unsafe { cc_server_free(server) };
    for (value, needle) in [
        (json!("abc"), "64 hex digits"),
        (json!("zz".repeat(32)), "64 hex digits"),
        (json!("0f".repeat(31)), "exactly 32 bytes"),
        (json!(7), "must be a string"),
    ] {
        let config =
            json!({"stateDir": dir.path().join("other").to_str().unwrap(), "rolloutKeyHex": value});
        let mut s = null_mut();
        let mut err = [0 as c_char; 512];
        let code = unsafe {
            cc_server_open(
                c(&config.to_string()).as_ptr(),
                null(),
                &mut s,
                err.as_mut_ptr(),
                err.len(),
            )
        };
        let text = unsafe { CStr::from_ptr(err.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        assert_eq!(code, CC_ERR_INVALID_ARGUMENT, "{text}");
        assert!(text.contains(needle), "{value}: {text}");
        assert!(!text.contains("0f0f0f"), "the key is never echoed: {text}");
    }
}
