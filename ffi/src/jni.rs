//! A minimal direct JNI entry over the same core the uniffi surface wraps (cargo feature `jni`),
//! built only to answer a measured question: is a hand-written JNI path enough faster than
//! uniffi over JNA to be worth shipping as the JVM hot path? It exposes raw connection
//! send / recv / recv-batch / close, plus Rust-timed loops so the Rust client is measured in the
//! same JVM run (`kotlin/bench/`, `scripts/bench-jvm.sh`, figures in docs/bench/jvm.md). Not part
//! of the shipped jar; every entry point runs behind a panic boundary and throws a Java
//! `IllegalStateException` instead of unwinding into the JVM.

use ::jni::objects::{JClass, JObject, JString};
use ::jni::sys::{jint, jlong, jobjectArray, jstring};
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
        let len = i32::try_from(batch.len()).map_err(text)?;
        let array = env
            .new_object_array(len, "java/lang/String", JObject::null())
            .map_err(text)?;
        for (i, line) in batch.into_iter().enumerate() {
            let s = env.new_string(line).map_err(text)?;
            env.set_object_array_element(&array, i as i32, &s)
                .map_err(text)?;
            // Keep the local reference table small for large batches.
            env.delete_local_ref(s).map_err(text)?;
        }
        Ok(array.into_raw())
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
