//! The C ABI driven from Rust as a C host would: a real server in a temp dir, buffers that are
//! too small (and the kept text), NULLs, config errors, a host kernel through a function pointer,
//! approvals through a callback, and the header freshness check.

use super::*;
use cc_app_server::rollout::sync::lock;
use serde_json::{json, Value};
use std::ffi::{c_void, CString};
use std::ptr::{null, null_mut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

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
fn the_compact_profile_admits_eight_connections_and_refuses_the_ninth_as_overloaded() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = null_mut();
    let mut err = [0 as c_char; 128];
    let bad = c(&json!({"stateDir": dir.path().to_str().unwrap(), "profile": "tiny"}).to_string());
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
    let text = unsafe { CStr::from_ptr(err.as_ptr()) }.to_str().unwrap();
    assert!(text.contains("config.profile \"tiny\""), "{text}");
    assert!(server.is_null());

    let server = open(dir.path(), json!({"profile": "compact"}), None);
    unsafe {
        let mut conns = Vec::new();
        for _ in 0..8 {
            let mut conn = null_mut();
            assert_eq!(cc_server_connect(server, &mut conn), CC_OK);
            conns.push(conn);
        }
        let mut ninth = null_mut();
        assert_eq!(cc_server_connect(server, &mut ninth), CC_ERR_OVERLOADED);
        assert!(ninth.is_null());
        let mut buf = [0 as c_char; 256];
        assert_eq!(
            cc_server_last_error(server, buf.as_mut_ptr(), buf.len(), null_mut()),
            CC_OK
        );
        let text = CStr::from_ptr(buf.as_ptr()).to_str().unwrap();
        assert!(text.contains("max_connections"), "{text}");
        // One closes: the slot is free again.
        cc_connection_close(conns[0]);
        cc_connection_free(conns.remove(0));
        assert_eq!(cc_server_connect(server, &mut ninth), CC_OK);
        conns.push(ninth);
        for conn in conns {
            cc_connection_free(conn);
        }
        cc_server_free(server);
    }
    // The standard profile takes a ninth.
    let other = tempfile::tempdir().unwrap();
    let server = open(other.path(), json!({"profile": "standard"}), None);
    unsafe {
        let conns: Vec<_> = (0..9)
            .map(|_| {
                let mut conn = null_mut();
                assert_eq!(cc_server_connect(server, &mut conn), CC_OK);
                conn
            })
            .collect();
        for conn in conns {
            cc_connection_free(conn);
        }
        cc_server_free(server);
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
        // A JSON-RPC error: the buffer holds the error object, the code its class.
        let (code, e) = request(client, "thread/read", json!({"threadId": "nope"}));
        assert_eq!(code, CC_ERR_NOT_FOUND);
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
            CC_ERR_NOT_FOUND
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
    for code in 0..=20 {
        let name = unsafe { CStr::from_ptr(cc_result_name(code)) };
        let name = name.to_str().unwrap();
        assert!(
            name.starts_with("CC_") && name != "CC_UNKNOWN_RESULT",
            "{code}: {name}"
        );
        names.insert(name.to_string());
    }
    assert_eq!(names.len(), 21, "every code has its own name");
    // Values no cc_result has: a name, not undefined behaviour.
    for code in [21, 999, -1, i32::MIN, i32::MAX] {
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
    // A thread whose log is damaged in the middle: touching it reports it (a warning from the
    // store's check when the thread is loaded, which an iOS or Android host could not see on
    // stderr). Threads load lazily, so the server's open alone reads no history.
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
    unsafe {
        let mut client = null_mut();
        assert_eq!(
            cc_client_connect(server, None, null_mut(), 0, &mut client),
            CC_OK
        );
        let (code, answer) = request(client, "thread/read", json!({"threadId": "bad"}));
        assert_ne!(code, CC_OK, "a damaged thread is not served: {answer}");
        cc_client_free(client);
    }
    assert!(
        logged_after(Duration::from_secs(10), |(level, target, message)| {
            *level == CC_LOG_WARN && target.starts_with("cc_app_server") && message.contains("bad")
        }),
        "the warning names the thread: {:?}",
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
        (
            json!({"openai": {"baseUrl": "http://10.9.8.7/v1", "model": "m", "apiKey": "sk-secret"}}),
            "refusing to send the API key over plain http to 10.9.8.7",
        ),
        (
            json!({"openai": {"baseUrl": "http://localhost:1/v1", "model": "m", "idleTimeoutMs": 0}}),
            "idle_timeout_ms",
        ),
        (
            json!({"openai": {"baseUrl": "http://localhost:1/v1", "model": "m", "callDeadlineMs": -1}}),
            "call_deadline_ms",
        ),
        (
            json!({"openai": {"baseUrl": "http://localhost:1/v1", "model": "m", "allowInsecureHttp": "yes"}}),
            "allowInsecureHttp",
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
    // The host may opt in to plain http off loopback, and set the model deadlines.
    let server = open(
        &dir.path().join("opted-in"),
        json!({"openai": {"baseUrl": "http://10.9.8.7/v1", "model": "m", "apiKey": "sk-secret",
                          "allowInsecureHttp": true, "idleTimeoutMs": 1, "callDeadlineMs": 1000}}),
        None,
    );
    unsafe { cc_server_free(server) };
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

// ---------------------------------------------------------------------------------------------
// The panic path. A callback written in Rust cannot panic into the library (an `extern "C"`
// function aborts on panic), so this test-only hook is what makes a real panic happen inside an
// entry point: `catch` (the one boundary every entry point goes through) and `TextOut::write`
// (with a handle's kept-text lock held) call `panic_point`, which panics once where armed.

/// Where the next call on this thread panics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PanicAt {
    /// Inside the boundary, before the entry point's own logic runs.
    Entry,
    /// While writing text into the caller's buffer (mid-operation).
    TextOut,
}

thread_local! {
    static PANIC_AT: std::cell::Cell<Option<PanicAt>> = const { std::cell::Cell::new(None) };
}

pub(super) fn panic_point(here: PanicAt) {
    if PANIC_AT.with(|armed| armed.get()) == Some(here) {
        PANIC_AT.with(|armed| armed.set(None));
        panic!("provoked by a test at {here:?}");
    }
}

/// Arms a one-shot panic at `at` for the next call on this thread.
fn panic_next(at: PanicAt) {
    PANIC_AT.with(|armed| armed.set(Some(at)));
}

unsafe fn connect(server: *const cc_server) -> *mut cc_client {
    let mut client = null_mut();
    let code = cc_client_connect(server, None, null_mut(), 0, &mut client);
    assert_eq!(code, CC_OK);
    client
}

/// Starts `thread`, runs one turn on it to completion and returns the thread as read back.
unsafe fn one_completed_turn(client: *const cc_client, thread: &str) -> Value {
    request(client, "thread/start", json!({ "threadId": thread }));
    let input = json!([{"type": "text", "text": "hi"}]);
    request(
        client,
        "turn/start",
        json!({"threadId": thread, "input": input}),
    );
    let done = wait_notification(client, "turn/completed");
    assert_eq!(done["params"]["turn"]["status"], "completed", "{done}");
    let (code, read) = request(client, "thread/read", json!({ "threadId": thread }));
    assert_eq!(code, CC_OK, "{read}");
    read
}

const PANIC_TEXT: &str = "internal panic caught at the C boundary: provoked by a test at";

unsafe fn text_of(
    f: impl FnOnce(*mut c_char, usize, *mut usize) -> cc_result,
) -> (cc_result, String) {
    let mut buf = vec![0 as c_char; 4096];
    let code = f(buf.as_mut_ptr(), buf.len(), null_mut());
    let text = CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned();
    (code, text)
}

#[test]
fn a_panic_inside_an_entry_point_is_cc_err_panic_with_its_message_and_the_handle_stays_usable() {
    let dir = tempfile::tempdir().unwrap();
    let server = open(dir.path(), json!({}), None);
    unsafe {
        // On a client: the request panics, its text is the client's last error, and the same
        // handle answers the next request.
        let client = connect(server);
        panic_next(PanicAt::Entry);
        let (code, _) = request(client, "thread/start", json!({"threadId": "p"}));
        assert_eq!(code, CC_ERR_PANIC);
        let (code, last) = text_of(|b, l, n| cc_client_last_error(client, b, l, n));
        assert_eq!(code, CC_OK);
        assert!(last.starts_with(PANIC_TEXT), "{last}");
        assert!(last.ends_with("Entry"), "the panic's own message: {last}");
        let (code, started) = request(client, "thread/start", json!({"threadId": "p"}));
        assert_eq!(code, CC_OK, "{started}");
        assert_eq!(started["thread"]["id"], "p", "{started}");
        // A value-returning entry point answers its documented fallback and keeps the text
        // (replacing an ordinary failure's).
        let code = cc_client_request(client, null(), null(), null_mut(), 0, null_mut());
        assert_eq!(code, CC_ERR_NULL_ARGUMENT);
        let (_, last) = text_of(|b, l, n| cc_client_last_error(client, b, l, n));
        assert_eq!(last, "method is NULL");
        panic_next(PanicAt::Entry);
        assert_eq!(cc_client_last_error_code(client), 0);
        let (_, last) = text_of(|b, l, n| cc_client_last_error(client, b, l, n));
        assert!(last.starts_with(PANIC_TEXT), "{last}");

        // On a raw connection, mid-operation: a message kept because it did not fit; the panic
        // comes while it is being copied out, with the kept-text lock held. Nothing is lost:
        // the next receive hands out the same message.
        let mut conn = null_mut();
        assert_eq!(cc_server_connect(server, &mut conn), CC_OK);
        let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1, "minimumProtocolVersion": 1, "client": {"name": "c", "version": "1"}, "features": []}});
        assert_eq!(
            cc_connection_send(conn, c(&init.to_string()).as_ptr(), null_mut()),
            CC_OK
        );
        let mut needed = 0;
        assert_eq!(
            cc_connection_recv(conn, 20_000, null_mut(), 0, &mut needed),
            CC_ERR_BUFFER_TOO_SMALL
        );
        panic_next(PanicAt::TextOut);
        let (code, _) = text_of(|b, l, n| cc_connection_recv(conn, 0, b, l, n));
        assert_eq!(code, CC_ERR_PANIC);
        let (_, last) = text_of(|b, l, n| cc_connection_last_error(conn, b, l, n));
        assert!(
            last.starts_with(PANIC_TEXT) && last.ends_with("TextOut"),
            "{last}"
        );
        let answer = recv(conn);
        assert_eq!(answer["id"], 1, "{answer}");
        assert_eq!(answer["result"]["protocolVersion"], 1, "{answer}");
        panic_next(PanicAt::Entry);
        assert!(!cc_connection_is_open(conn), "a panic reads as not open");
        assert!(cc_connection_is_open(conn), "and the connection still is");
        cc_connection_free(conn);

        // No handle: the code alone, or (open) the text in error_buf.
        panic_next(PanicAt::Entry);
        let mut needed = 0;
        assert_eq!(cc_schema_digest(null_mut(), 0, &mut needed), CC_ERR_PANIC);
        assert_eq!(needed, 0, "the panic came before the digest was measured");
        panic_next(PanicAt::Entry);
        assert_eq!(
            cc_set_log_callback(None, null_mut(), CC_LOG_OFF),
            CC_ERR_PANIC
        );
        let other = tempfile::tempdir().unwrap();
        let config = json!({"stateDir": other.path().to_str().unwrap()}).to_string();
        let mut opened = null_mut();
        let mut err = [0 as c_char; 256];
        panic_next(PanicAt::Entry);
        let code = cc_server_open(
            c(&config).as_ptr(),
            null(),
            &mut opened,
            err.as_mut_ptr(),
            err.len(),
        );
        assert_eq!(code, CC_ERR_PANIC);
        assert!(opened.is_null());
        let reason = CStr::from_ptr(err.as_ptr()).to_str().unwrap();
        assert!(reason.starts_with(PANIC_TEXT), "{reason}");
        let code = cc_server_open(c(&config).as_ptr(), null(), &mut opened, null_mut(), 0);
        assert_eq!(code, CC_OK);
        cc_server_free(opened);

        cc_client_free(client);
        cc_server_free(server);
    }
}

/// What `panicking_run_turn` saw: (what, code or bool, last error text).
static PANIC_TURN: Mutex<Vec<(&'static str, i32, String)>> = Mutex::new(Vec::new());

unsafe extern "C" fn panicking_run_turn(
    _user_data: *mut c_void,
    turn: *mut cc_turn,
    _input: *const c_char,
) -> i32 {
    let mut seen = Vec::new();
    let mut id = [0 as c_char; 64];
    if cc_turn_new_item_id(turn, id.as_mut_ptr(), id.len(), null_mut()) != CC_OK {
        return CC_ERR_FAILED as i32;
    }
    let id = CStr::from_ptr(id.as_ptr()).to_str().unwrap().to_string();
    let item = c(&json!({"type": "agentMessage", "id": id, "text": "after a panic"}).to_string());
    // This runs on an engine thread: the hook is armed here, for this thread.
    panic_next(PanicAt::Entry);
    let code = cc_turn_item_started(turn, item.as_ptr());
    let (_, last) = text_of(|b, l, n| cc_turn_last_error(turn, b, l, n));
    seen.push(("item_started", code as i32, last));
    // An ordinary failure's text first, so the next one is seen to replace it.
    let code = cc_turn_item_delta(turn, null(), null());
    let (_, last) = text_of(|b, l, n| cc_turn_last_error(turn, b, l, n));
    seen.push(("item_delta(NULL)", code as i32, last));
    panic_next(PanicAt::Entry);
    let cancelled = cc_turn_is_cancelled(turn);
    let (_, last) = text_of(|b, l, n| cc_turn_last_error(turn, b, l, n));
    seen.push(("is_cancelled", i32::from(cancelled), last));
    // The same turn handle goes on: the item the panicking call never recorded, then done.
    let code = cc_turn_item_started(turn, item.as_ptr());
    seen.push(("item_started again", code as i32, String::new()));
    let code = cc_turn_item_completed(turn, item.as_ptr());
    *lock(&PANIC_TURN) = seen;
    code as i32
}

#[test]
fn a_panic_inside_a_turn_entry_point_is_reported_on_the_turn_handle_and_the_turn_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let kernel = cc_kernel {
        run_turn: Some(panicking_run_turn),
        user_data: null_mut(),
        release: None,
    };
    let server = open(dir.path(), json!({}), Some(&kernel));
    unsafe {
        let client = connect(server);
        let read = one_completed_turn(client, "pt");
        let started: Vec<&Value> = read["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["payload"]["type"] == "itemStarted")
            .collect();
        assert_eq!(started.len(), 1, "recorded once, after the panic: {read}");
        assert_eq!(started[0]["payload"]["item"]["text"], "after a panic");
        cc_client_free(client);
        cc_server_free(server);
    }
    let seen = lock(&PANIC_TURN).clone();
    assert_eq!(seen.len(), 4, "{seen:?}");
    assert_eq!(seen[0].0, "item_started");
    assert_eq!(seen[0].1, CC_ERR_PANIC as i32);
    assert!(seen[0].2.starts_with(PANIC_TEXT), "{seen:?}");
    assert_eq!(
        seen[1],
        (
            "item_delta(NULL)",
            CC_ERR_NULL_ARGUMENT as i32,
            "item_id is NULL".to_string()
        )
    );
    assert_eq!(seen[2].0, "is_cancelled");
    assert_eq!(seen[2].1, 1, "a panic reads as cancelled (the safe answer)");
    assert!(seen[2].2.starts_with(PANIC_TEXT), "{seen:?}");
    assert_eq!(seen[3], ("item_started again", CC_OK as i32, String::new()));
}
