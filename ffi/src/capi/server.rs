//! `cc_server`: opening a server from a JSON config (its keys read into the `ServerOptions` both
//! ABIs validate with `to_config`), freeing (shutting down), its last error and thread
//! verification, on the engine's `AppServer`.

use super::turn::CKernel;
use super::*;
use crate::errors::{ServerError, StoreFailure};
use crate::server::{Durability, OpenAiOptions, ServerOptions, ServerProfile};
use crate::store::StoreKind;
use crate::ApprovalPolicy;
use cc_app_server::engine::AppServer as CoreServer;
use cc_app_server::kernel::AgentKernel as CoreKernel;
use serde_json::Value;
use std::sync::Arc;

/// An open app server. Created by `cc_server_open`, freed by `cc_server_free` (which shuts it
/// down). Connections and clients made from it stay valid handles after that, reporting closed.
pub struct cc_server {
    pub(super) server: CoreServer,
    last_error: LastError,
}

impl Drop for cc_server {
    fn drop(&mut self) {
        self.server.shutdown();
    }
}

impl Handle for cc_server {
    fn last_error(&self) -> &LastError {
        &self.last_error
    }
}

fn options_from_json(text: &str) -> Outcome<ServerOptions> {
    let bad = |t: String| fail(CC_ERR_INVALID_ARGUMENT, t);
    let value: Value =
        serde_json::from_str(text).map_err(|e| bad(format!("config is not JSON: {e}")))?;
    let Value::Object(map) = value else {
        return Err(bad("config must be a JSON object".into()));
    };
    let mut o = ServerOptions::default();
    for (key, v) in &map {
        let string = || {
            v.as_str()
                .map(str::to_string)
                .ok_or_else(|| bad(format!("config.{key} must be a string")))
        };
        let number = || {
            v.as_u64()
                .and_then(|n| i64::try_from(n).ok())
                .ok_or_else(|| bad(format!("config.{key} must be a non-negative integer")))
        };
        let small = || {
            number().and_then(|n| {
                i32::try_from(n).map_err(|_| bad(format!("config.{key} is too large")))
            })
        };
        match key.as_str() {
            "stateDir" => o.state_dir = string()?,
            "profile" => {
                o.profile = Some(match string()?.as_str() {
                    "standard" => ServerProfile::Standard,
                    "compact" => ServerProfile::Compact,
                    other => {
                        return Err(bad(format!(
                            "config.profile {other:?}: use standard or compact"
                        )))
                    }
                })
            }
            "store" => {
                o.store = Some(match string()?.as_str() {
                    "jsonl" => StoreKind::Jsonl,
                    "sqlite" => StoreKind::Sqlite,
                    other => {
                        return Err(bad(format!("config.store {other:?}: use jsonl or sqlite")))
                    }
                })
            }
            "durability" => {
                o.durability = Some(match string()?.as_str() {
                    "sync" => Durability::Sync,
                    "buffered" => Durability::Buffered,
                    "ephemeral" => Durability::Ephemeral,
                    other => {
                        return Err(bad(format!(
                            "config.durability {other:?}: use sync, buffered or ephemeral"
                        )))
                    }
                })
            }
            "policy" => {
                o.policy = Some(match string()?.as_str() {
                    "askEveryTime" => ApprovalPolicy::AskEveryTime,
                    "autoApprove" => ApprovalPolicy::AutoApprove,
                    "denyAll" => ApprovalPolicy::DenyAll,
                    other => {
                        return Err(bad(format!(
                            "config.policy {other:?}: use askEveryTime, autoApprove or denyAll"
                        )))
                    }
                })
            }
            "workspace" => o.workspace = Some(string()?),
            "script" => o.script_json = Some(v.to_string()),
            "approvalTimeoutMs" => o.approval_timeout_ms = Some(number()?),
            "settleDeadlineMs" => o.settle_deadline_ms = Some(number()?),
            "maxLineBytes" => o.max_line_bytes = Some(number()?),
            "inboundMessages" => o.inbound_messages = Some(small()?),
            "outboundMessages" => o.outbound_messages = Some(small()?),
            "workspaceToolsDir" => o.workspace_tools_dir = Some(string()?),
            "outboundStallMs" => o.outbound_stall_ms = Some(number()?),
            "rolloutKeyHex" => {
                let text = string()?;
                let bytes = hex::decode(text.trim()).map_err(|_| {
                    bad("config.rolloutKeyHex must be 64 hex digits (32 bytes)".into())
                })?;
                o.rollout_key = Some(bytes);
            }
            "acceptUnanchored" => {
                o.accept_unanchored =
                    Some(v.as_bool().ok_or_else(|| {
                        bad("config.acceptUnanchored must be true or false".into())
                    })?)
            }
            "openai" => o.openai = Some(openai_from_json(v)?),
            other => return Err(bad(format!("unknown config key {other:?}"))),
        }
    }
    Ok(o)
}

/// The `openai` config object: `baseUrl` and `model` (required), `apiKey`, `instructions`,
/// `temperature`, `maxOutputTokens`, `maxSteps`, `requestTimeoutMs`, `idleTimeoutMs`,
/// `callDeadlineMs`, `allowInsecureHttp`.
fn openai_from_json(v: &Value) -> Outcome<OpenAiOptions> {
    let bad = |t: String| fail(CC_ERR_INVALID_ARGUMENT, t);
    let Value::Object(map) = v else {
        return Err(bad("config.openai must be a JSON object".into()));
    };
    let mut o = OpenAiOptions::default();
    for (key, v) in map {
        let string = || {
            v.as_str()
                .map(str::to_string)
                .ok_or_else(|| bad(format!("config.openai.{key} must be a string")))
        };
        let int = || {
            v.as_i64()
                .ok_or_else(|| bad(format!("config.openai.{key} must be an integer")))
        };
        match key.as_str() {
            "baseUrl" => o.base_url = string()?,
            "model" => o.model = string()?,
            "apiKey" => o.api_key = Some(string()?),
            "instructions" => o.instructions = Some(string()?),
            "temperature" => {
                o.temperature =
                    Some(v.as_f64().ok_or_else(|| {
                        bad("config.openai.temperature must be a number".to_string())
                    })?)
            }
            "maxOutputTokens" => {
                o.max_output_tokens = Some(
                    i32::try_from(int()?)
                        .map_err(|_| bad("config.openai.maxOutputTokens is too large".into()))?,
                )
            }
            "maxSteps" => {
                o.max_steps = Some(
                    i32::try_from(int()?)
                        .map_err(|_| bad("config.openai.maxSteps is too large".into()))?,
                )
            }
            "requestTimeoutMs" => o.request_timeout_ms = Some(int()?),
            "idleTimeoutMs" => o.idle_timeout_ms = Some(int()?),
            "callDeadlineMs" => o.call_deadline_ms = Some(int()?),
            "allowInsecureHttp" => {
                o.allow_insecure_http = Some(v.as_bool().ok_or_else(|| {
                    bad("config.openai.allowInsecureHttp must be true or false".to_string())
                })?)
            }
            other => return Err(bad(format!("unknown config key openai.{other:?}"))),
        }
    }
    Ok(o)
}

/// Opens a server from a JSON config (keys: `stateDir` (required), `store` ("jsonl"|"sqlite"),
/// `durability` ("sync"|"buffered"|"ephemeral"), `policy` ("askEveryTime"|"autoApprove"|
/// "denyAll"), `workspace`, `script` (a scripted-kernel script object), `approvalTimeoutMs`,
/// `settleDeadlineMs`, `maxLineBytes`, `inboundMessages`, `outboundMessages`, `openai` (an object:
/// `baseUrl`, `model`, `apiKey`, `instructions`, `temperature`, `maxOutputTokens`, `maxSteps`,
/// `requestTimeoutMs`, `idleTimeoutMs`, `callDeadlineMs`, `allowInsecureHttp` — turns run on that
/// model), `workspaceToolsDir` (approved tools run with the
/// workspace tool set confined to that directory), `outboundStallMs`, `rolloutKeyHex` (64 hex
/// digits: keyed tamper evidence, never written anywhere), `acceptUnanchored` (true/false)). `kernel` (NULL:
/// the built-in scripted kernel) is copied. On success `*out_server` owns a new handle; free it
/// with `cc_server_free`. On failure the reason goes into `error_buf` (NULL allowed; truncated)
/// and the code says what failed: `CC_ERR_INVALID_ARGUMENT` (the config), `CC_ERR_STORE_LOCKED`
/// (another store holds `stateDir`), `CC_ERR_STORE_UNSAFE` (`stateDir` is not a private
/// directory), `CC_ERR_STORE_DAMAGED` (a corrupt or unanchored log), `CC_ERR_STORE` (I/O).
///
/// # Safety
/// `config_json` a valid C string; `kernel` NULL or valid; `out_server` valid;
/// `error_buf` NULL or valid for `error_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn cc_server_open(
    config_json: *const c_char,
    kernel: *const cc_kernel,
    out_server: *mut *mut cc_server,
    error_buf: *mut c_char,
    error_len: usize,
) -> cc_result {
    // No handle yet: the failure's text goes into `error_buf` instead of a last error.
    let opened = catch(|| {
        let out = out_arg(out_server, "out_server")?;
        let options = options_from_json(str_arg(config_json, "config_json")?)?;
        let kernel = match kernel.as_ref() {
            None => None,
            Some(k) if k.run_turn.is_none() => {
                return Err(fail(CC_ERR_NULL_ARGUMENT, "kernel->run_turn is NULL"))
            }
            Some(k) => Some(*k),
        };
        let mut config = options
            .to_config(None, None)
            .map_err(|e| fail(CC_ERR_INVALID_ARGUMENT, e.to_string()))?;
        // Ownership of user_data passes to the server only once open succeeds: until the
        // kernel is armed, dropping it (a failed open) does not release user_data.
        let host_kernel = kernel.map(|kernel| Arc::new(CKernel::new(kernel)));
        if let Some(k) = &host_kernel {
            config.kernel = Arc::clone(k) as Arc<dyn CoreKernel>;
        }
        let core = CoreServer::open(config).map_err(|e| {
            let e = ServerError::from(e);
            let code = match e {
                ServerError::Store { kind, .. } => store_code(kind),
                _ => CC_ERR_INVALID_ARGUMENT,
            };
            fail(code, e.to_string())
        })?;
        if let Some(k) = host_kernel {
            k.arm();
        }
        *out = into_handle(cc_server {
            server: core,
            last_error: LastError::default(),
        });
        Ok(())
    });
    let Err(Failure(code, reason)) = opened else {
        return CC_OK;
    };
    write_truncated(error_buf, error_len, &reason);
    code
}

/// Shuts the server down (interrupting live turns, closing connections, flushing the store)
/// and frees the handle. NULL is a no-op.
///
/// # Safety
/// `server` NULL or a handle from `cc_server_open` not yet freed; not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn cc_server_free(server: *mut cc_server) {
    free(server)
}

/// The server's last error text.
///
/// # Safety
/// `server` NULL or valid; `buf` NULL or valid for `len`; `out_needed` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn cc_server_last_error(
    server: *const cc_server,
    buf: *mut c_char,
    len: usize,
    out_needed: *mut usize,
) -> cc_result {
    last_error_into(server.as_ref(), TextOut::new(buf, len, out_needed))
}

/// The `cc_result` of a store failure.
fn store_code(kind: StoreFailure) -> cc_result {
    match kind {
        StoreFailure::Locked => CC_ERR_STORE_LOCKED,
        StoreFailure::Unsafe => CC_ERR_STORE_UNSAFE,
        StoreFailure::Damaged => CC_ERR_STORE_DAMAGED,
        StoreFailure::Io => CC_ERR_STORE,
    }
}

/// Checks one thread's whole hash chain and anchor in the server's store. `CC_ERR_NOT_FOUND` for
/// a thread the store does not have; a store failure as `cc_server_open` reports it.
///
/// # Safety
/// `server` valid; `thread_id` a valid C string; `out_ok` / `out_events` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn cc_server_verify_thread(
    server: *const cc_server,
    thread_id: *const c_char,
    out_ok: *mut bool,
    out_events: *mut u64,
) -> cc_result {
    on_handle(handle(server), |s| {
        let id = str_arg(thread_id, "thread_id")?;
        let report = s.server.store().verify(id).map_err(|e| {
            let code = match e {
                cc_app_server::rollout::StoreError::NotFound(_) => CC_ERR_NOT_FOUND,
                ref other => store_code(StoreFailure::of(other)),
            };
            fail(code, e.to_string())
        })?;
        put(out_ok, report.ok());
        put(out_events, report.events);
        Ok(())
    })
}
