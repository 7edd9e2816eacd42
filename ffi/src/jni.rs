//! A direct JNI entry (cargo feature `jni`, on in the JVM jar and the AAR), because uniffi over
//! JNA measured 3-10x slower per request round trip than a plain JNI crossing
//! (docs/bench/jvm.md). Two parts: the bench entry (raw connection send / recv / recv-batch /
//! close, plus Rust-timed loops so the Rust client is measured in the same JVM run;
//! `kotlin/bench/`, `scripts/bench-jvm.sh`) and the hot path the Kotlin SDK ships (requests and
//! the notification pump on the uniffi `Client`, see below). Every entry point runs behind a
//! panic boundary and throws a Java `IllegalStateException` instead of unwinding into the JVM.

use ::jni::objects::{JClass, JObject, JString};
use ::jni::sys::{jboolean, jint, jlong, jobjectArray, jstring};
use ::jni::JNIEnv;
use cc_app_server::client::{Client as CoreClient, ClientConfig};
use cc_app_server::engine::{AppServer as CoreServer, Connection as CoreConnection, ServerConfig};
use cc_app_server::rollout::Durability;
use serde_json::json;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

/// Runs `f`; an error or a panic becomes a Java exception and `fallback` is returned.
fn guard<'l, T>(
    env: &mut JNIEnv<'l>,
    fallback: T,
    f: impl FnOnce(&mut JNIEnv<'l>) -> Result<T, String>,
) -> T {
    let outcome = catch_unwind(AssertUnwindSafe(|| f(env)));
    let message = match outcome {
        Ok(Ok(v)) => return v,
        Ok(Err(message)) => message,
        Err(_) => "panic in the JNI bench entry".to_string(),
    };
    // If an exception is already pending (a failed JNI call), keep that one.
    if !env.exception_check().unwrap_or(true) {
        let _ = env.throw_new("java/lang/IllegalStateException", message);
    }
    fallback
}

fn text(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// # Safety
/// `handle` must come from the matching `open…`/`connect` and not have been closed.
unsafe fn server<'a>(handle: jlong) -> Result<&'a CoreServer, String> {
    (handle as *const CoreServer)
        .as_ref()
        .ok_or_else(|| "null server handle".to_string())
}

/// # Safety
/// As for `server`.
unsafe fn connection<'a>(handle: jlong) -> Result<&'a CoreConnection, String> {
    (handle as *const CoreConnection)
        .as_ref()
        .ok_or_else(|| "null connection handle".to_string())
}

/// Opens a server on `state_dir` with ephemeral durability and `outbound` queued messages per
/// connection (the bench pre-fills a queue), returning its handle.
#[no_mangle]
pub extern "system" fn Java_com_chainlesschain_appserver_bench_JniBench_openServer<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    state_dir: JString<'l>,
    outbound: jint,
) -> jlong {
    guard(&mut env, 0, |env| {
        let dir: String = env.get_string(&state_dir).map_err(text)?.into();
        let mut config = ServerConfig::new(dir);
        config.store_options.durability = Durability::Ephemeral;
        config.limits.outbound_messages = usize::try_from(outbound).map_err(text)?;
        config.limits.outbound_bytes = 256 << 20;
        let server = CoreServer::open(config).map_err(|e| format!("{e:?}"))?;
        Ok(Box::into_raw(Box::new(server)) as jlong)
    })
}

#[no_mangle]
pub extern "system" fn Java_com_chainlesschain_appserver_bench_JniBench_closeServer<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    handle: jlong,
) {
    guard(&mut env, (), |_| {
        if handle != 0 {
            // SAFETY: the handle came from openServer and the caller closes it once.
            let server = unsafe { Box::from_raw(handle as *mut CoreServer) };
            server.shutdown();
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "system" fn Java_com_chainlesschain_appserver_bench_JniBench_connect<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    server_handle: jlong,
) -> jlong {
    guard(&mut env, 0, |_| {
        // SAFETY: see `server`.
        let conn = unsafe { server(server_handle)? }
            .connect()
            .map_err(|e| format!("{e:?}"))?;
        Ok(Box::into_raw(Box::new(conn)) as jlong)
    })
}

#[no_mangle]
pub extern "system" fn Java_com_chainlesschain_appserver_bench_JniBench_closeConnection<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    handle: jlong,
) {
    guard(&mut env, (), |_| {
        if handle != 0 {
            // SAFETY: the handle came from connect and the caller closes it once.
            let conn = unsafe { Box::from_raw(handle as *mut CoreConnection) };
            conn.close();
        }
        Ok(())
    })
}

/// Queues one JSON-RPC line; 0 when queued, -1 when the connection refused it.
#[no_mangle]
pub extern "system" fn Java_com_chainlesschain_appserver_bench_JniBench_send<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    handle: jlong,
    line: JString<'l>,
) -> jint {
    guard(&mut env, -1, |env| {
        let line: String = env.get_string(&line).map_err(text)?.into();
        // SAFETY: see `connection`.
        let conn = unsafe { connection(handle)? };
        Ok(if conn.send(&line).is_ok() { 0 } else { -1 })
    })
}

/// The next message within `timeout_ms`, or null on timeout or close.
#[no_mangle]
pub extern "system" fn Java_com_chainlesschain_appserver_bench_JniBench_recv<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    handle: jlong,
    timeout_ms: jlong,
) -> jstring {
    guard(&mut env, std::ptr::null_mut(), |env| {
        // SAFETY: see `connection`.
        let conn = unsafe { connection(handle)? };
        let timeout = Duration::from_millis(u64::try_from(timeout_ms).unwrap_or(0));
        match conn.recv(Some(timeout)) {
            Ok(line) => Ok(env.new_string(line).map_err(text)?.into_raw()),
            Err(_) => Ok(std::ptr::null_mut()),
        }
    })
}

/// Waits up to `timeout_ms` for one message, then takes up to `max - 1` more that are ready:
/// one crossing per batch, like the uniffi listeners. Empty on timeout.
#[no_mangle]
pub extern "system" fn Java_com_chainlesschain_appserver_bench_JniBench_recvBatch<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    handle: jlong,
    max: jint,
    timeout_ms: jlong,
) -> jobjectArray {
    guard(&mut env, std::ptr::null_mut(), |env| {
        // SAFETY: see `connection`.
        let conn = unsafe { connection(handle)? };
        let timeout = Duration::from_millis(u64::try_from(timeout_ms).unwrap_or(0));
        let max = usize::try_from(max).unwrap_or(1).max(1);
        let mut batch = Vec::new();
        if let Ok(first) = conn.recv(Some(timeout)) {
            batch.push(first);
            while batch.len() < max {
                match conn.try_recv() {
                    Some(next) => batch.push(next),
                    None => break,
                }
            }
        }
        string_array(env, batch)
    })
}

/// The Rust side of the round-trip bench, timed in Rust: `n` `thread/list` requests through the
/// one Rust client (`cc_app_server::client::Client`) on a fresh connection. Returns nanoseconds.
#[no_mangle]
pub extern "system" fn Java_com_chainlesschain_appserver_bench_JniBench_rustClientRoundTrips<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    server_handle: jlong,
    n: jint,
) -> jlong {
    guard(&mut env, -1, |_| {
        // SAFETY: see `server`.
        let server = unsafe { server(server_handle)? };
        let client = CoreClient::connect(server, None, ClientConfig::default()).map_err(text)?;
        let started = Instant::now();
        for _ in 0..n {
            client
                .request("thread/list", json!({"limit": 1}))
                .map_err(text)?;
        }
        let elapsed = started.elapsed().as_nanos();
        client.close();
        Ok(i64::try_from(elapsed).unwrap_or(i64::MAX))
    })
}

/// The Rust side of the drain bench, timed in Rust: receives on the raw connection
/// until a `turn/completed` notification. Returns `messages << 40 | nanoseconds` (a count below
/// 2^23 and a drain under 18 minutes fit; the bench stays far below both).
#[no_mangle]
pub extern "system" fn Java_com_chainlesschain_appserver_bench_JniBench_rustDrain<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    handle: jlong,
) -> jlong {
    guard(&mut env, -1, |_| {
        // SAFETY: see `connection`.
        let conn = unsafe { connection(handle)? };
        let started = Instant::now();
        let mut count: i64 = 0;
        loop {
            let line = conn
                .recv(Some(Duration::from_secs(30)))
                .map_err(|e| format!("{e:?} after {count} messages"))?;
            count += 1;
            // The same end test as the JVM loops (no parse): this measures moving messages.
            if line.contains("\"turn/completed\"") {
                break;
            }
        }
        let nanos = i64::try_from(started.elapsed().as_nanos()).unwrap_or(i64::MAX);
        Ok((count << 40) | (nanos & ((1 << 40) - 1)))
    })
}

// ---------------------------------------------------------------------------------------------
// The JVM hot path (shipped in the jar; docs/bench/jvm.md has why): the Kotlin SDK's requests and
// notification pump call these instead of going through JNA, on the *same* uniffi `Client`
// object, so the pending map, approvals and notification queue stay the one Rust client's.
// The SDK clones the uniffi handle once per client (`clientHandle`) and gives it back once
// (`clientRelease`) after it has stopped calling; in between, calls borrow the client.

/// The address of this anchor, from uniffi and from JNI: equal only when JNA and the JVM's
/// `System.load` mapped the same copy of the library, which the hot path requires.
static ANCHOR: u8 = 0;

fn anchor() -> i64 {
    std::ptr::addr_of!(ANCHOR) as i64
}

/// The JNI hot path's anchor as seen through uniffi (see `ANCHOR`).
#[uniffi::export]
pub fn jni_anchor() -> i64 {
    anchor()
}

/// # Safety
/// `raw` must be a handle the SDK cloned from a uniffi `Client` and has not released.
unsafe fn client<'a>(raw: jlong) -> Result<&'a crate::Client, String> {
    uniffi::ffi::Handle::from_raw_unchecked(raw as u64)
        .as_pointer::<crate::Client>()
        .as_ref()
        .ok_or_else(|| "null client handle".to_string())
}

/// The anchor as seen through JNI.
#[no_mangle]
pub extern "system" fn Java_com_chainlesschain_appserver_JniTransport_anchor<'l>(
    _env: JNIEnv<'l>,
    _: JClass<'l>,
) -> jlong {
    anchor()
}

/// Gives back a handle from `Client.uniffiCloneHandle()`.
#[no_mangle]
pub extern "system" fn Java_com_chainlesschain_appserver_JniTransport_clientRelease<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    raw: jlong,
) {
    guard(&mut env, (), |_| {
        if raw != 0 {
            // SAFETY: the SDK releases each cloned handle once, after its last call.
            drop(unsafe {
                uniffi::ffi::Handle::from_raw_unchecked(raw as u64).into_arc::<crate::Client>()
            });
        }
        Ok(())
    })
}

/// An error of the hot path as the JSON the SDK turns into its typed exception.
fn error_json(e: &crate::ClientError) -> String {
    use crate::ClientError as E;
    let v = match e {
        E::Overloaded { retry_after_ms } => {
            json!({"kind": "overloaded", "retryAfterMs": retry_after_ms})
        }
        E::Timeout => json!({"kind": "timeout"}),
        E::Closed => json!({"kind": "closed"}),
        E::LineTooLarge { size, max } => json!({"kind": "lineTooLarge", "size": size, "max": max}),
        E::Protocol { code, reason, data } => {
            json!({"kind": "protocol", "code": code, "reason": reason, "data": data})
        }
        E::InvalidJson { reason } => json!({"kind": "invalidJson", "reason": reason}),
        E::InvalidArgument { reason } => json!({"kind": "invalidArgument", "reason": reason}),
    };
    v.to_string()
}

/// `Client.request_blocking` over JNI: `"R"` + the result JSON, or `"E"` + an error JSON
/// (`error_json`). Blocks the calling thread until the answer, the timeout or a close.
#[no_mangle]
pub extern "system" fn Java_com_chainlesschain_appserver_JniTransport_request<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    raw: jlong,
    method: JString<'l>,
    params: JString<'l>,
) -> jstring {
    guard(&mut env, std::ptr::null_mut(), |env| {
        let method: String = env.get_string(&method).map_err(text)?.into();
        let params: String = env.get_string(&params).map_err(text)?.into();
        // SAFETY: see `client`.
        let client = unsafe { client(raw)? };
        let answer = crate::client::parse_params(&params)
            .and_then(|p| client.request_value(&method, p))
            .map(|v| format!("R{v}"))
            .unwrap_or_else(|e| format!("E{}", error_json(&e)));
        Ok(env.new_string(answer).map_err(text)?.into_raw())
    })
}

/// Up to `max` notifications, waiting up to `timeout_ms` for the first: an empty array on
/// timeout, null once the client is closed and drained.
#[no_mangle]
pub extern "system" fn Java_com_chainlesschain_appserver_JniTransport_nextNotifications<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    raw: jlong,
    max: jint,
    timeout_ms: jlong,
) -> jobjectArray {
    guard(&mut env, std::ptr::null_mut(), |env| {
        // SAFETY: see `client`.
        let client = unsafe { client(raw)? };
        let timeout = Duration::from_millis(u64::try_from(timeout_ms).unwrap_or(0));
        let max = usize::try_from(max).unwrap_or(1).max(1);
        let batch = match client.current() {
            Ok(core) => match crate::client::recv_batch(&core, max, timeout) {
                Ok(batch) => batch,
                Err(_) => return Ok(std::ptr::null_mut()),
            },
            Err(_) => return Ok(std::ptr::null_mut()),
        };
        string_array(env, batch)
    })
}

/// The pump's wait: up to `max` notifications, waiting with no timeout for the first (an idle
/// client costs the JVM no wake-up). An empty array once `stopNotifications` was called, null
/// once the client is closed and drained.
#[no_mangle]
pub extern "system" fn Java_com_chainlesschain_appserver_JniTransport_waitNotifications<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    raw: jlong,
    max: jint,
) -> jobjectArray {
    guard(&mut env, std::ptr::null_mut(), |env| {
        // SAFETY: see `client`.
        let client = unsafe { client(raw)? };
        let max = usize::try_from(max).unwrap_or(1).max(1);
        let Ok(core) = client.current() else {
            return Ok(std::ptr::null_mut());
        };
        let reader = core.notification_reader();
        // Not holding the client itself while waiting: a close from another thread goes ahead.
        drop(core);
        match crate::client::reader_batch(&reader, max, &client.jni_pump_stop) {
            Ok(batch) => string_array(env, batch),
            Err(_) => Ok(std::ptr::null_mut()),
        }
    })
}

/// Arms (`stop` false, before a pump starts) or stops (`stop` true: the waiting pump returns an
/// empty batch) the JNI notification pump of one client.
#[no_mangle]
pub extern "system" fn Java_com_chainlesschain_appserver_JniTransport_stopNotifications<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    raw: jlong,
    stop: jboolean,
) {
    guard(&mut env, (), |_| {
        // SAFETY: see `client`.
        let client = unsafe { client(raw)? };
        client
            .jni_pump_stop
            .store(stop != 0, std::sync::atomic::Ordering::SeqCst);
        if stop != 0 {
            if let Ok(core) = client.current() {
                core.notification_reader().wake();
            }
        }
        Ok(())
    })
}

fn string_array(env: &mut JNIEnv<'_>, items: Vec<String>) -> Result<jobjectArray, String> {
    let len = i32::try_from(items.len()).map_err(text)?;
    let array = env
        .new_object_array(len, "java/lang/String", JObject::null())
        .map_err(text)?;
    for (i, item) in items.into_iter().enumerate() {
        let s = env.new_string(item).map_err(text)?;
        env.set_object_array_element(&array, i as i32, &s)
            .map_err(text)?;
        // Keep the local reference table small for large batches.
        env.delete_local_ref(s).map_err(text)?;
    }
    Ok(array.into_raw())
}
