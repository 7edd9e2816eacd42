//! The C ABI (`ffi/include/cc_app_server.h`) driven through its exported symbols with the C
//! types of the header: configs, raw connection lines, client requests, approval callbacks that
//! answer anything, and a host kernel whose `run_turn` calls every `cc_turn_*` entry point with
//! fuzzed JSON and buffer sizes. Buffers are exact-size heap blocks, so AddressSanitizer sees any
//! write past `len`. Invariants: no crash, no panic escaping (`CC_ERR_PANIC` is a finding), every
//! `CC_OK` text is NUL-terminated UTF-8 of `*out_needed - 1` bytes, and text refused for a short
//! buffer is handed out whole by the next call.
#![no_main]

use arbitrary::Arbitrary;
use cc_app_server_fuzz::engine::temp_state_root;
use libfuzzer_sys::fuzz_target;
use serde_json::json;
use std::ffi::{c_char, c_void, CStr, CString};
use std::ptr::{null, null_mut};
use std::sync::Mutex;

// Linked from the ffi crate's rlib; declared here with the header's C types, as a C host sees them.
use cc_app_server_ffi as _;

#[repr(C)]
struct CKernel {
    run_turn: Option<unsafe extern "C" fn(*mut c_void, *mut c_void, *const c_char) -> i32>,
    user_data: *mut c_void,
    release: Option<unsafe extern "C" fn(*mut c_void)>,
}

type ApproveFn = Option<unsafe extern "C" fn(*mut c_void, *const c_char) -> i32>;

extern "C" {
    fn cc_result_name(result: i32) -> *const c_char;
    fn cc_protocol_version() -> u32;
    fn cc_library_version() -> *const c_char;
    fn cc_schema_digest(buf: *mut c_char, len: usize, out_needed: *mut usize) -> i32;
    fn cc_server_open(
        config: *const c_char,
        kernel: *const CKernel,
        out: *mut *mut c_void,
        err: *mut c_char,
        err_len: usize,
    ) -> i32;
    fn cc_server_free(server: *mut c_void);
    fn cc_server_last_error(
        server: *const c_void,
        buf: *mut c_char,
        len: usize,
        out_needed: *mut usize,
    ) -> i32;
    fn cc_server_verify_thread(
        server: *const c_void,
        thread: *const c_char,
        ok: *mut bool,
        events: *mut u64,
    ) -> i32;
    fn cc_server_connect(server: *const c_void, out: *mut *mut c_void) -> i32;
    fn cc_connection_send(conn: *const c_void, message: *const c_char, retry: *mut u64) -> i32;
    fn cc_connection_recv(
        conn: *const c_void,
        timeout_ms: i64,
        buf: *mut c_char,
        len: usize,
        out_needed: *mut usize,
    ) -> i32;
    fn cc_connection_is_open(conn: *const c_void) -> bool;
    fn cc_connection_close(conn: *const c_void) -> i32;
    fn cc_connection_free(conn: *mut c_void);
    fn cc_connection_last_error(
        conn: *const c_void,
        buf: *mut c_char,
        len: usize,
        out_needed: *mut usize,
    ) -> i32;
    fn cc_client_connect(
        server: *const c_void,
        approve: ApproveFn,
        user_data: *mut c_void,
        timeout_ms: u32,
        out: *mut *mut c_void,
    ) -> i32;
    fn cc_client_request(
        client: *const c_void,
        method: *const c_char,
        params: *const c_char,
        buf: *mut c_char,
        len: usize,
        out_needed: *mut usize,
    ) -> i32;
    fn cc_client_last_result(
        client: *const c_void,
        buf: *mut c_char,
        len: usize,
        out_needed: *mut usize,
    ) -> i32;
    fn cc_client_last_error_code(client: *const c_void) -> i64;
    fn cc_client_next_notification(
        client: *const c_void,
        timeout_ms: u32,
        buf: *mut c_char,
        len: usize,
        out_needed: *mut usize,
    ) -> i32;
    fn cc_client_last_error(
        client: *const c_void,
        buf: *mut c_char,
        len: usize,
        out_needed: *mut usize,
    ) -> i32;
    fn cc_client_free(client: *mut c_void);
    fn cc_turn_thread_id(
        turn: *const c_void,
        buf: *mut c_char,
        len: usize,
        out_needed: *mut usize,
    ) -> i32;
    fn cc_turn_turn_id(
        turn: *const c_void,
        buf: *mut c_char,
        len: usize,
        out_needed: *mut usize,
    ) -> i32;
    fn cc_turn_new_item_id(
        turn: *const c_void,
        buf: *mut c_char,
        len: usize,
        out_needed: *mut usize,
    ) -> i32;
    fn cc_turn_agent_options(
        turn: *const c_void,
        buf: *mut c_char,
        len: usize,
        out_needed: *mut usize,
    ) -> i32;
    fn cc_turn_item_started(turn: *const c_void, item: *const c_char) -> i32;
    fn cc_turn_item_delta(turn: *const c_void, item_id: *const c_char, delta: *const c_char)
        -> i32;
    fn cc_turn_item_completed(turn: *const c_void, item: *const c_char) -> i32;
    fn cc_turn_request_tool(
        turn: *const c_void,
        item_id: *const c_char,
        tool: *const c_char,
        args: *const c_char,
        buf: *mut c_char,
        len: usize,
        out_needed: *mut usize,
    ) -> i32;
    fn cc_turn_last_result(
        turn: *const c_void,
        buf: *mut c_char,
        len: usize,
        out_needed: *mut usize,
    ) -> i32;
    fn cc_turn_is_cancelled(turn: *const c_void) -> bool;
    fn cc_turn_sleep(turn: *const c_void, ms: u64) -> bool;
    fn cc_turn_fail(turn: *const c_void, reason: *const c_char) -> i32;
    fn cc_turn_last_error(
        turn: *const c_void,
        buf: *mut c_char,
        len: usize,
        out_needed: *mut usize,
    ) -> i32;
}

const OK: i32 = 0;
const TOO_SMALL: i32 = 3;
const PANIC: i32 = 12;

/// A text out-parameter call with an exact-size heap buffer (`len` 0 passes NULL).
type TextFn<'a> = dyn FnMut(*mut c_char, usize, *mut usize) -> i32 + 'a;

/// Calls `f` with a buffer of `len` bytes; checks the text contract; returns (code, text).
fn text_call(len: usize, f: &mut TextFn<'_>) -> (i32, Option<String>) {
    let mut buf: Vec<u8> = Vec::with_capacity(len);
    let ptr = if len == 0 {
        null_mut()
    } else {
        buf.as_mut_ptr().cast::<c_char>()
    };
    let mut needed = usize::MAX;
    let code = f(ptr, len, &mut needed);
    assert_ne!(code, PANIC, "a panic reached the C boundary");
    if code == OK || (code != TOO_SMALL && needed != usize::MAX && needed <= len && len > 0) {
        assert!(
            needed >= 1 && needed <= len,
            "CC_OK with needed {needed} and a buffer of {len}"
        );
        // SAFETY: the callee wrote `needed` bytes (text + NUL) into our `len`-byte block.
        unsafe { buf.set_len(needed) };
        assert_eq!(buf[needed - 1], 0, "text not NUL-terminated");
        let text = String::from_utf8(buf[..needed - 1].to_vec()).expect("text out is UTF-8");
        assert!(!text.contains('\0'), "interior NUL in text out");
        return (code, Some(text));
    }
    if code == TOO_SMALL {
        assert!(
            needed != usize::MAX && needed > len,
            "TOO_SMALL must report a larger size"
        );
    }
    (code, None)
}

/// Calls with a fuzzed size and, when refused as too small, again with the size it asked for
/// through `again` (the kept-text path).
fn text_call_retry(
    len: u16,
    f: &mut TextFn<'_>,
    again: Option<&mut TextFn<'_>>,
) -> (i32, Option<String>) {
    let mut needed = 0usize;
    let (code, text) = text_call(len as usize % 4096, &mut |b, l, n| {
        let c = f(b, l, n);
        // SAFETY: n is our own out-param.
        needed = unsafe { *n };
        c
    });
    if code == TOO_SMALL {
        if let Some(again) = again {
            let (code2, text2) = text_call(needed, again);
            assert_ne!(
                code2, TOO_SMALL,
                "kept text still too small for the size it asked for"
            );
            return (code2, text2);
        }
    }
    (code, text)
}

fn cstr(s: &str) -> CString {
    CString::new(s.replace('\0', "")).expect("no NUL left")
}

#[derive(Debug, Arbitrary, Clone)]
enum KernelOp {
    Ids {
        len: u16,
    },
    Options {
        len: u16,
    },
    Started(ItemJson),
    Delta {
        id: ItemId,
        delta: String,
    },
    Completed(ItemJson),
    Tool {
        id: ItemId,
        tool: String,
        args: String,
        len: u16,
    },
    LastResult {
        len: u16,
    },
    Cancelled,
    Sleep {
        ms: u8,
    },
    Fail(String),
    LastError {
        len: u16,
    },
}

#[derive(Debug, Arbitrary, Clone)]
enum ItemId {
    Fresh,
    Fixed,
    Raw(String),
}

#[derive(Debug, Arbitrary, Clone)]
enum ItemJson {
    Message { id: ItemId, text: String },
    Reasoning { id: ItemId },
    Raw(String),
}

#[derive(Debug, Arbitrary)]
struct Plan {
    ops: Vec<KernelOp>,
    ret: i8,
}

struct KernelData {
    plan: Mutex<Plan>,
}

unsafe fn item_id(turn: *const c_void, id: &ItemId) -> String {
    match id {
        ItemId::Fresh => {
            let (_, t) = text_call(256, &mut |b, l, n| cc_turn_new_item_id(turn, b, l, n));
            t.unwrap_or_default()
        }
        ItemId::Fixed => "item-1".into(),
        ItemId::Raw(s) => s.clone(),
    }
}

unsafe fn item_json(turn: *const c_void, item: &ItemJson) -> String {
    match item {
        ItemJson::Message { id, text } => {
            json!({"type": "agentMessage", "id": item_id(turn, id), "text": text}).to_string()
        }
        ItemJson::Reasoning { id } => {
            json!({"type": "reasoning", "id": item_id(turn, id), "text": "r"}).to_string()
        }
        ItemJson::Raw(s) => s.clone(),
    }
}

unsafe extern "C" fn run_turn(
    user_data: *mut c_void,
    turn: *mut c_void,
    input: *const c_char,
) -> i32 {
    let data = &*(user_data as *const KernelData);
    let input = CStr::from_ptr(input).to_str().expect("input_json is UTF-8");
    serde_json::from_str::<serde_json::Value>(input).expect("input_json is JSON");
    let turn = turn as *const c_void;
    let (ops, ret) = {
        let plan = data.plan.lock().unwrap();
        (plan.ops.clone(), plan.ret)
    };
    for op in ops.iter().take(24) {
        match op {
            KernelOp::Ids { len } => {
                text_call_retry(*len, &mut |b, l, n| cc_turn_thread_id(turn, b, l, n), None);
                text_call_retry(*len, &mut |b, l, n| cc_turn_turn_id(turn, b, l, n), None);
                text_call_retry(
                    *len,
                    &mut |b, l, n| cc_turn_new_item_id(turn, b, l, n),
                    None,
                );
            }
            KernelOp::Options { len } => {
                let (c, t) = text_call_retry(
                    *len,
                    &mut |b, l, n| cc_turn_agent_options(turn, b, l, n),
                    None,
                );
                if c == OK {
                    serde_json::from_str::<serde_json::Value>(&t.unwrap())
                        .expect("agent options are JSON");
                }
            }
            KernelOp::Started(item) => {
                let j = cstr(&item_json(turn, item));
                assert_ne!(cc_turn_item_started(turn, j.as_ptr()), PANIC);
            }
            KernelOp::Delta { id, delta } => {
                let (i, d) = (
                    cstr(&item_id(turn, id)),
                    cstr(&json!({"type": "text", "text": delta}).to_string()),
                );
                assert_ne!(cc_turn_item_delta(turn, i.as_ptr(), d.as_ptr()), PANIC);
            }
            KernelOp::Completed(item) => {
                let j = cstr(&item_json(turn, item));
                assert_ne!(cc_turn_item_completed(turn, j.as_ptr()), PANIC);
            }
            KernelOp::Tool {
                id,
                tool,
                args,
                len,
            } => {
                let (i, t, a) = (cstr(&item_id(turn, id)), cstr(tool), cstr(args));
                let (c, text) = text_call_retry(
                    *len,
                    &mut |b, l, n| {
                        cc_turn_request_tool(turn, i.as_ptr(), t.as_ptr(), a.as_ptr(), b, l, n)
                    },
                    Some(&mut |b, l, n| cc_turn_last_result(turn, b, l, n)),
                );
                if c == OK {
                    let v: serde_json::Value =
                        serde_json::from_str(&text.unwrap()).expect("a tool result is JSON");
                    assert!(
                        v.get("status").is_some(),
                        "a tool result without status: {v}"
                    );
                }
            }
            KernelOp::LastResult { len } => {
                text_call_retry(
                    *len,
                    &mut |b, l, n| cc_turn_last_result(turn, b, l, n),
                    None,
                );
            }
            KernelOp::Cancelled => {
                cc_turn_is_cancelled(turn);
            }
            KernelOp::Sleep { ms } => {
                cc_turn_sleep(turn, u64::from(*ms % 20));
            }
            KernelOp::Fail(reason) => {
                let r = cstr(reason);
                assert_eq!(cc_turn_fail(turn, r.as_ptr()), OK);
            }
            KernelOp::LastError { len } => {
                text_call_retry(*len, &mut |b, l, n| cc_turn_last_error(turn, b, l, n), None);
            }
        }
    }
    i32::from(ret) % 15
}

unsafe extern "C" fn release(user_data: *mut c_void) {
    drop(Box::from_raw(user_data as *mut KernelData));
}

unsafe extern "C" fn approve(user_data: *mut c_void, params: *const c_char) -> i32 {
    let params = CStr::from_ptr(params)
        .to_str()
        .expect("params_json is UTF-8");
    serde_json::from_str::<serde_json::Value>(params).expect("params_json is JSON");
    *(user_data as *const i32)
}

#[derive(Debug, Arbitrary)]
enum Config {
    Plain,
    Sqlite,
    Extra(String, String),
    Raw(String),
    NoStateDir,
}

#[derive(Debug, Arbitrary)]
enum Op {
    Connect,
    Send {
        conn: u8,
        line: Line,
    },
    Recv {
        conn: u8,
        len: u16,
        timeout: u8,
    },
    CloseConn {
        conn: u8,
    },
    FreeConn {
        conn: u8,
    },
    ConnError {
        conn: u8,
        len: u16,
    },
    Client {
        decision: i8,
    },
    Request {
        client: u8,
        method: Method,
        params: Option<String>,
        len: u16,
    },
    Notification {
        client: u8,
        len: u16,
    },
    ClientError {
        client: u8,
        len: u16,
    },
    FreeClient {
        client: u8,
    },
    Verify {
        thread: String,
    },
    ServerError {
        len: u16,
    },
    Digest {
        len: u16,
    },
    Name(i32),
    FreeServer,
}

#[derive(Debug, Arbitrary)]
enum Line {
    Init,
    Fixture(u16),
    Raw(String),
}

#[derive(Debug, Arbitrary)]
enum Method {
    ThreadStart,
    TurnStart,
    List,
    Read,
    Raw(String),
}

#[derive(Debug, Arbitrary)]
struct Input {
    config: Config,
    host_kernel: Option<Plan>,
    ops: Vec<Op>,
}

fuzz_target!(|input: Input| unsafe {
    let root = temp_state_root();
    let dir = root.path().join("state");
    let dir_s = dir.to_str().expect("utf-8 temp path");
    let config = match &input.config {
        Config::Plain => json!({"stateDir": dir_s, "approvalTimeoutMs": 300, "settleDeadlineMs": 150}).to_string(),
        Config::Sqlite => json!({"stateDir": dir_s, "store": "sqlite", "durability": "buffered", "approvalTimeoutMs": 300}).to_string(),
        Config::Extra(k, v) => {
            let mut c = json!({"stateDir": dir_s, "approvalTimeoutMs": 300});
            c[k.as_str()] = serde_json::from_str(v).unwrap_or(json!(v));
            c.to_string()
        }
        Config::Raw(s) => s.clone(),
        Config::NoStateDir => "{}".into(),
    };
    // Bounds that keep one run short whatever the config says (a fuzzed config may ask for
    // hour-long timeouts; those are honoured by design and are not findings).
    let sane = |c: &str| {
        let v: serde_json::Value = serde_json::from_str(c).unwrap_or_default();
        let small = |k: &str| v.get(k).and_then(|x| x.as_u64()).is_none_or(|n| n <= 2000);
        v.get("stateDir").and_then(|s| s.as_str()) == Some(dir_s)
            && small("approvalTimeoutMs")
            && small("settleDeadlineMs")
    };
    // Never let a fuzzed config point the server at another directory: it would create it.
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(&config) {
        if v.get("stateDir").is_some_and(|s| s.as_str() != Some(dir_s)) {
            return;
        }
    }
    let cfg = cstr(&config);
    let mut server: *mut c_void = null_mut();
    let mut err = vec![0u8; 64];
    let kernel = input.host_kernel.map(|plan| {
        let data = Box::into_raw(Box::new(KernelData {
            plan: Mutex::new(plan),
        }));
        CKernel {
            run_turn: Some(run_turn),
            user_data: data.cast(),
            release: Some(release),
        }
    });
    let kptr = kernel.as_ref().map_or(null(), |k| k as *const CKernel);
    let code = cc_server_open(
        cfg.as_ptr(),
        kptr,
        &mut server,
        err.as_mut_ptr().cast(),
        err.len(),
    );
    assert_ne!(code, PANIC);
    if code != OK {
        assert!(server.is_null());
        assert!(
            err.contains(&0),
            "error text not NUL-terminated within error_len"
        );
        if let Some(k) = kernel {
            release(k.user_data);
        }
        return;
    }
    if !sane(&config) {
        cc_server_free(server);
        return;
    }
    let decisions: Vec<Box<i32>> = Vec::new();
    let mut decisions = decisions;
    let mut conns: Vec<*mut c_void> = Vec::new();
    let mut clients: Vec<*mut c_void> = Vec::new();
    let fixtures = cc_app_server_fuzz::fixture_lines();
    let pick = |v: &Vec<*mut c_void>, i: u8| {
        if v.is_empty() {
            None
        } else {
            Some(v[i as usize % v.len()])
        }
    };
    for op in input.ops.iter().take(32) {
        let needs_server = matches!(
            op,
            Op::Connect | Op::Client { .. } | Op::Verify { .. } | Op::ServerError { .. }
        );
        if needs_server && server.is_null() {
            continue;
        }
        match op {
            Op::Connect => {
                let mut c = null_mut();
                if cc_server_connect(server, &mut c) == OK {
                    conns.push(c);
                }
            }
            Op::Send { conn, line } => {
                if let Some(c) = pick(&conns, *conn) {
                    let text = match line {
                        Line::Init => json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                            "protocolVersion": 1, "minimumProtocolVersion": 1, "client": {"name": "f", "version": "1"},
                            "features": ["thread_turn_item", "structured_approval"]}}).to_string(),
                        Line::Fixture(i) => fixtures[*i as usize % fixtures.len()].clone(),
                        Line::Raw(s) => s.clone(),
                    };
                    let t = cstr(&text);
                    let mut retry = 0u64;
                    assert_ne!(cc_connection_send(c, t.as_ptr(), &mut retry), PANIC);
                }
            }
            Op::Recv { conn, len, timeout } => {
                if let Some(c) = pick(&conns, *conn) {
                    let t = i64::from(*timeout % 30);
                    let (code, text) = text_call_retry(
                        *len,
                        &mut |b, l, n| cc_connection_recv(c, t, b, l, n),
                        Some(&mut |b, l, n| cc_connection_recv(c, 0, b, l, n)),
                    );
                    if code == OK {
                        let text = text.unwrap();
                        serde_json::from_str::<serde_json::Value>(&text).unwrap_or_else(|e| {
                            panic!("received a line that is not JSON: {e}: {text}")
                        });
                    }
                }
            }
            Op::CloseConn { conn } => {
                if let Some(c) = pick(&conns, *conn) {
                    assert_ne!(cc_connection_close(c), PANIC);
                    assert!(!cc_connection_is_open(c));
                }
            }
            Op::FreeConn { conn } => {
                if !conns.is_empty() {
                    let c = conns.remove(*conn as usize % conns.len());
                    cc_connection_free(c);
                }
            }
            Op::ConnError { conn, len } => {
                if let Some(c) = pick(&conns, *conn) {
                    text_call_retry(
                        *len,
                        &mut |b, l, n| cc_connection_last_error(c, b, l, n),
                        None,
                    );
                }
            }
            Op::Client { decision } => {
                let d = Box::new(i32::from(*decision) % 6);
                let mut c = null_mut();
                let code = cc_client_connect(
                    server,
                    Some(approve),
                    (&*d as *const i32).cast_mut().cast(),
                    3000,
                    &mut c,
                );
                assert_ne!(code, PANIC);
                if code == OK {
                    clients.push(c);
                    decisions.push(d);
                }
            }
            Op::Request {
                client,
                method,
                params,
                len,
            } => {
                if let Some(c) = pick(&clients, *client) {
                    let (m, p) = match method {
                        Method::ThreadStart => ("thread/start", json!({"threadId": "t1", "agentOptions": {"script": {"steps": [
                            {"type": "tool", "tool": "fs.write", "arguments": {}}, {"type": "echo"}]}}}).to_string()),
                        Method::TurnStart => ("turn/start", json!({"threadId": "t1", "input": [{"type": "text", "text": "hi"}]}).to_string()),
                        Method::List => ("thread/list", "{}".to_string()),
                        Method::Read => ("thread/read", json!({"threadId": "t1"}).to_string()),
                        Method::Raw(m) => (m.as_str(), String::new()),
                    };
                    let (m, p) = (cstr(m), cstr(params.as_deref().unwrap_or(&p)));
                    let (code, text) = text_call_retry(
                        *len,
                        &mut |b, l, n| cc_client_request(c, m.as_ptr(), p.as_ptr(), b, l, n),
                        Some(&mut |b, l, n| cc_client_last_result(c, b, l, n)),
                    );
                    if let (OK | 8, Some(text)) = (code, text) {
                        serde_json::from_str::<serde_json::Value>(&text).unwrap_or_else(|e| {
                            panic!("a request's answer is not JSON: {e}: {text}")
                        });
                    }
                    cc_client_last_error_code(c);
                }
            }
            Op::Notification { client, len } => {
                if let Some(c) = pick(&clients, *client) {
                    text_call_retry(
                        *len,
                        &mut |b, l, n| cc_client_next_notification(c, 5, b, l, n),
                        Some(&mut |b, l, n| cc_client_next_notification(c, 0, b, l, n)),
                    );
                }
            }
            Op::ClientError { client, len } => {
                if let Some(c) = pick(&clients, *client) {
                    text_call_retry(*len, &mut |b, l, n| cc_client_last_error(c, b, l, n), None);
                }
            }
            Op::FreeClient { client } => {
                if !clients.is_empty() {
                    let c = clients.remove(*client as usize % clients.len());
                    cc_client_free(c);
                }
            }
            Op::Verify { thread } => {
                let t = cstr(thread);
                let (mut ok, mut events) = (false, 0u64);
                assert_ne!(
                    cc_server_verify_thread(server, t.as_ptr(), &mut ok, &mut events),
                    PANIC
                );
            }
            Op::ServerError { len } => {
                text_call_retry(
                    *len,
                    &mut |b, l, n| cc_server_last_error(server, b, l, n),
                    None,
                );
            }
            Op::Digest { len } => {
                let (code, text) =
                    text_call_retry(*len, &mut |b, l, n| cc_schema_digest(b, l, n), None);
                if code == OK {
                    assert_eq!(text.as_deref(), Some(cc_agent_protocol::schema_digest()));
                }
            }
            Op::Name(r) => {
                // Out-of-range values are the issue 10 finding (an enum parameter); strict only.
                let r = if cc_app_server_fuzz::strict() {
                    *r
                } else {
                    r.rem_euclid(14)
                };
                let name = CStr::from_ptr(cc_result_name(r))
                    .to_str()
                    .expect("ASCII name");
                assert!(name.starts_with("CC_"));
                assert_eq!(cc_protocol_version(), cc_agent_protocol::PROTOCOL_VERSION);
                assert!(!CStr::from_ptr(cc_library_version()).to_bytes().is_empty());
            }
            Op::FreeServer => {
                // Freeing the server first is allowed: later calls on its handles say closed.
                if !server.is_null() {
                    cc_server_free(server);
                    server = null_mut();
                }
            }
        }
    }
    for c in clients.drain(..) {
        cc_client_free(c);
    }
    for c in conns.drain(..) {
        cc_connection_free(c);
    }
    cc_server_free(server);
    drop(decisions);
});
