//! `cc_kernel` and `cc_turn`: a host kernel given as C function pointers (`CKernel`, the engine's
//! `AgentKernel`) and the turn handle it is lent, whose entry points call the kernel's core
//! `TurnContext` through the same `Lease` and host-JSON checks as the uniffi `TurnContext`.

use super::*;
use crate::errors::KernelError;
use crate::kernel::{
    history_json, parse_delta, parse_item, parse_tool_call, tool_result_json, turn_input, Lease,
    Lent,
};
use cc_app_server::kernel::{
    AgentKernel as CoreKernel, KernelError as CoreKernelError, TurnContext as CoreContext,
};
use cc_app_server::protocol::UserInput;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Runs one turn. `turn` is valid only until this function returns. `input_json` is the wire
/// `UserInput` array, borrowed for the call. Return `CC_OK`, `CC_ERR_CANCELLED` once
/// `cc_turn_is_cancelled` says so, or any other code for a failure (the reason given to
/// `cc_turn_fail`, if any, is shown to the user). May be called concurrently for different turns.
pub type cc_kernel_run_turn_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        turn: *mut cc_turn,
        input_json: *const c_char,
    ) -> i32,
>;

/// Releases a kernel's `user_data`; called once, after the last turn has ended.
pub type cc_release_fn = Option<unsafe extern "C" fn(user_data: *mut c_void)>;

/// A host kernel: the server copies this struct and owns `user_data` from a successful
/// `cc_server_open` on (releasing it with `release`, if not NULL). On failure the caller keeps it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct cc_kernel {
    pub run_turn: cc_kernel_run_turn_fn,
    pub user_data: *mut c_void,
    pub release: cc_release_fn,
}

impl From<KernelError> for Failure {
    fn from(e: KernelError) -> Self {
        let code = match e {
            KernelError::Cancelled => CC_ERR_CANCELLED,
            KernelError::Failed { .. } => CC_ERR_FAILED,
            KernelError::Invalid { .. } => CC_ERR_INVALID_ARGUMENT,
            KernelError::Expired => CC_ERR_EXPIRED,
        };
        fail(code, e.to_string())
    }
}

/// The engine's context for one running turn, lent to `run_turn` for the duration of the call.
/// Never freed by the host. The pointer is a token, never dereferenced: a `cc_turn` kept past its
/// `run_turn` (or a made-up pointer) is looked up, not found, and refused with `CC_ERR_EXPIRED`.
pub struct cc_turn {
    _opaque: [u8; 0],
}

/// What a `cc_turn` token stands for while its `run_turn` runs.
struct TurnState {
    /// The engine's core context, lent for the `run_turn` call (`Expired` after it).
    ctx: Arc<Lent>,
    kept: OversizedText,
    failure: Mutex<Option<String>>,
    last_error: LastError,
}

impl Handle for TurnState {
    fn last_error(&self) -> &LastError {
        &self.last_error
    }
}

/// Live turns by token. Tokens come from a counter and are never reused (a 64-bit counter does
/// not wrap; a 32-bit one would after 2^32 turns), so a stale token cannot reach a newer turn.
struct TurnRegistry {
    next: usize,
    live: std::collections::BTreeMap<usize, Arc<TurnState>>,
}

static TURNS: Mutex<TurnRegistry> = Mutex::new(TurnRegistry {
    next: 1,
    live: std::collections::BTreeMap::new(),
});

/// A `cc_kernel` as the engine's `AgentKernel`: each turn lends the core context (`Lease`) under
/// a fresh `cc_turn` token for the duration of the host's `run_turn`.
pub(super) struct CKernel {
    kernel: cc_kernel,
    /// True once the server owns `user_data` (open succeeded): only then does drop release it.
    armed: AtomicBool,
}

impl CKernel {
    /// `kernel` as the engine's kernel, not yet owning its `user_data` (see `arm`).
    pub(super) fn new(kernel: cc_kernel) -> CKernel {
        CKernel {
            kernel,
            armed: AtomicBool::new(false),
        }
    }

    /// The server owns `user_data` from now on (`cc_server_open` succeeded): drop releases it.
    pub(super) fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }
}

// SAFETY: `cc_server_open` documents that `run_turn` and `release` may be called from engine
// threads, concurrently for different turns, so `user_data` must be thread-safe.
unsafe impl Send for CKernel {}
unsafe impl Sync for CKernel {}

impl Drop for CKernel {
    fn drop(&mut self) {
        if self.armed.load(Ordering::SeqCst) {
            if let Some(release) = self.kernel.release {
                // SAFETY: the server owns user_data (see cc_kernel) and this is the last use.
                unsafe { release(self.kernel.user_data) };
            }
        }
    }
}

impl CoreKernel for CKernel {
    fn run_turn(&self, ctx: &dyn CoreContext, input: &[UserInput]) -> Result<(), CoreKernelError> {
        let Some(run_turn) = self.kernel.run_turn else {
            return Err(CoreKernelError::Failed(
                "the host kernel has no run_turn".into(),
            ));
        };
        let lease = Lease::new(ctx);
        let state = Arc::new(TurnState {
            ctx: lease.lent(),
            kept: OversizedText::default(),
            failure: Mutex::new(None),
            last_error: LastError::default(),
        });
        let token = {
            let mut turns = lock(&TURNS);
            let token = turns.next;
            turns.next = turns.next.wrapping_add(1).max(1);
            turns.live.insert(token, Arc::clone(&state));
            token
        };
        // Unregisters the token on every way out (a panic in the host's callback included).
        struct Unregister(usize);
        impl Drop for Unregister {
            fn drop(&mut self) {
                lock(&TURNS).live.remove(&self.0);
            }
        }
        let registered = Unregister(token);
        let input = std::ffi::CString::new(turn_input(input).json).unwrap_or_default();
        // SAFETY: the cc_kernel contract; `input` outlives the call. The turn pointer is a token
        // (see `cc_turn`), valid to dereference for nobody.
        let code =
            unsafe { run_turn(self.kernel.user_data, token as *mut cc_turn, input.as_ptr()) };
        drop(registered);
        drop(lease);
        match code {
            0 => Ok(()),
            c if c == CC_ERR_CANCELLED as i32 => Err(CoreKernelError::Cancelled),
            c => Err(CoreKernelError::Failed(
                lock(&state.failure)
                    .take()
                    .unwrap_or_else(|| format!("the host kernel failed (code {c})")),
            )),
        }
    }
}

/// The live turn a token stands for (the `handle` of a `cc_turn`): `CC_ERR_NULL_ARGUMENT` for
/// NULL, `CC_ERR_EXPIRED` for a token whose `run_turn` has returned (or was never handed out).
fn turn_state(turn: *const cc_turn) -> Result<Arc<TurnState>, cc_result> {
    if turn.is_null() {
        return Err(CC_ERR_NULL_ARGUMENT);
    }
    lock(&TURNS)
        .live
        .get(&(turn as usize))
        .cloned()
        .ok_or(CC_ERR_EXPIRED)
}

/// The turn text getters: `text` of the live turn into the caller's buffer.
unsafe fn turn_text(
    turn: *const cc_turn,
    buf: *mut c_char,
    len: usize,
    out_needed: *mut usize,
    text: impl FnOnce(&Lent) -> Result<String, KernelError>,
) -> cc_result {
    on_handle(turn_state(turn), |t| {
        TextOut::new(buf, len, out_needed).write(&text(&t.ctx)?)
    })
}

/// The turn's thread id.
///
/// # Safety
/// `turn` the handle passed to `run_turn`, during that call; `buf` NULL or valid for `len`;
/// `out_needed` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn cc_turn_thread_id(
    turn: *const cc_turn,
    buf: *mut c_char,
    len: usize,
    out_needed: *mut usize,
) -> cc_result {
    turn_text(turn, buf, len, out_needed, |ctx| {
        ctx.with(|c| c.thread_id().to_string())
    })
}

/// The turn's id.
///
/// # Safety
/// `turn` the handle passed to `run_turn`, during that call; `buf` NULL or valid for `len`;
/// `out_needed` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn cc_turn_turn_id(
    turn: *const cc_turn,
    buf: *mut c_char,
    len: usize,
    out_needed: *mut usize,
) -> cc_result {
    turn_text(turn, buf, len, out_needed, |ctx| {
        ctx.with(|c| c.turn_id().to_string())
    })
}

/// A fresh item id, unique within the thread.
///
/// # Safety
/// `turn` the handle passed to `run_turn`, during that call; `buf` NULL or valid for `len`;
/// `out_needed` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn cc_turn_new_item_id(
    turn: *const cc_turn,
    buf: *mut c_char,
    len: usize,
    out_needed: *mut usize,
) -> cc_result {
    turn_text(turn, buf, len, out_needed, |ctx| {
        ctx.with(|c| c.new_item_id())
    })
}

/// The thread's conversation before this turn as JSON (see docs/kernels.md), for a host kernel
/// that runs its own model.
///
/// # Safety
/// `turn` the handle passed to `run_turn`, during that call; `buf` NULL or valid for `len`;
/// `out_needed` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn cc_turn_history(
    turn: *const cc_turn,
    buf: *mut c_char,
    len: usize,
    out_needed: *mut usize,
) -> cc_result {
    turn_text(turn, buf, len, out_needed, |ctx| ctx.call(history_json))
}

/// The thread's `agentOptions` as JSON (`null` when none were given).
///
/// # Safety
/// `turn` the handle passed to `run_turn`, during that call; `buf` NULL or valid for `len`;
/// `out_needed` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn cc_turn_agent_options(
    turn: *const cc_turn,
    buf: *mut c_char,
    len: usize,
    out_needed: *mut usize,
) -> cc_result {
    turn_text(turn, buf, len, out_needed, |ctx| {
        ctx.with(|c| c.agent_options().to_string())
    })
}

/// Records and announces `item/started`; `item_json` is an item body (`ItemContent`; the engine wraps it in the published `Item`).
///
/// # Safety
/// `turn` the handle passed to `run_turn`, during that call; `item_json` a valid C string.
#[no_mangle]
pub unsafe extern "C" fn cc_turn_item_started(
    turn: *const cc_turn,
    item_json: *const c_char,
) -> cc_result {
    on_handle(turn_state(turn), |t| {
        let item = parse_item(str_arg(item_json, "item_json")?)?;
        Ok(t.ctx.call(|c| c.item_started(item))?)
    })
}

/// Records and announces `item/delta`; `delta_json` is a wire `ItemDelta`.
///
/// # Safety
/// `turn` the handle passed to `run_turn`, during that call; strings valid C strings.
#[no_mangle]
pub unsafe extern "C" fn cc_turn_item_delta(
    turn: *const cc_turn,
    item_id: *const c_char,
    delta_json: *const c_char,
) -> cc_result {
    on_handle(turn_state(turn), |t| {
        let id = str_arg(item_id, "item_id")?;
        let delta = parse_delta(str_arg(delta_json, "delta_json")?)?;
        Ok(t.ctx.call(|c| c.item_delta(id, delta))?)
    })
}

/// Records and announces `item/completed`; `item_json` is an item body (`ItemContent`; the engine wraps it in the published `Item`).
///
/// # Safety
/// `turn` the handle passed to `run_turn`, during that call; `item_json` a valid C string.
#[no_mangle]
pub unsafe extern "C" fn cc_turn_item_completed(
    turn: *const cc_turn,
    item_json: *const c_char,
) -> cc_result {
    on_handle(turn_state(turn), |t| {
        let item = parse_item(str_arg(item_json, "item_json")?)?;
        Ok(t.ctx.call(|c| c.item_completed(item))?)
    })
}

/// Asks for a tool through the approval gate, blocking while it decides. `buf` receives the
/// wire `ToolResult` JSON (`{"status":"ok"|"error"|"denied",…}`); when it does not fit it is
/// kept for `cc_turn_last_result`. `CC_ERR_CANCELLED`: stop the turn.
///
/// # Safety
/// `turn` the handle passed to `run_turn`, during that call; strings valid C strings;
/// `buf` NULL or valid for `len`; `out_needed` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn cc_turn_request_tool(
    turn: *const cc_turn,
    item_id: *const c_char,
    tool: *const c_char,
    arguments_json: *const c_char,
    buf: *mut c_char,
    len: usize,
    out_needed: *mut usize,
) -> cc_result {
    on_handle(turn_state(turn), |t| {
        let id = str_arg(item_id, "item_id")?;
        let tool = str_arg(tool, "tool")?.to_string();
        let call = parse_tool_call(tool, str_arg(arguments_json, "arguments_json")?)?;
        let result = tool_result_json(&t.ctx.call(|c| c.request_tool(id, call))?)?;
        t.kept
            .write_or_keep(TextOut::new(buf, len, out_needed), CC_OK, result)
    })
}

/// The tool result kept by the last `cc_turn_request_tool` that returned
/// `CC_ERR_BUFFER_TOO_SMALL`. `CC_ERR_FAILED` when none is kept.
///
/// # Safety
/// `turn` the handle passed to `run_turn`, during that call; `buf` NULL or valid for `len`;
/// `out_needed` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn cc_turn_last_result(
    turn: *const cc_turn,
    buf: *mut c_char,
    len: usize,
    out_needed: *mut usize,
) -> cc_result {
    on_handle(turn_state(turn), |t| {
        t.kept
            .hand_out(TextOut::new(buf, len, out_needed), "tool result")
    })
}

/// True once the turn has been asked to stop: return `CC_ERR_CANCELLED` from `run_turn` soon.
///
/// # Safety
/// `turn` NULL or the handle passed to `run_turn`, during that call.
#[no_mangle]
pub unsafe extern "C" fn cc_turn_is_cancelled(turn: *const cc_turn) -> bool {
    query(turn_state(turn), true, |t| {
        t.ctx.with(|c| c.is_cancelled()).unwrap_or(true)
    })
}

/// Sleeps up to `ms`, waking early on cancellation; true when cancelled.
///
/// # Safety
/// `turn` NULL or the handle passed to `run_turn`, during that call.
#[no_mangle]
pub unsafe extern "C" fn cc_turn_sleep(turn: *const cc_turn, ms: u64) -> bool {
    query(turn_state(turn), true, |t| {
        t.ctx
            .with(|c| c.sleep_cancellable(Duration::from_millis(ms)))
            .unwrap_or(true)
    })
}

/// Sets the reason shown to the user when `run_turn` returns a failure code (copied).
///
/// # Safety
/// `turn` the handle passed to `run_turn`, during that call; `reason` a valid C string.
#[no_mangle]
pub unsafe extern "C" fn cc_turn_fail(turn: *const cc_turn, reason: *const c_char) -> cc_result {
    on_handle(turn_state(turn), |t| {
        let reason = str_arg(reason, "reason")?;
        *lock(&t.failure) = Some(reason.chars().take(1024).collect());
        Ok(())
    })
}

/// The turn handle's last error text.
///
/// # Safety
/// `turn` NULL or the handle passed to `run_turn`, during that call; `buf` NULL or valid for
/// `len`; `out_needed` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn cc_turn_last_error(
    turn: *const cc_turn,
    buf: *mut c_char,
    len: usize,
    out_needed: *mut usize,
) -> cc_result {
    match turn_state(turn) {
        Ok(t) => last_error_into(Some(&*t), TextOut::new(buf, len, out_needed)),
        Err(code) => code,
    }
}
