//! `cc_client_turn`: one turn's notifications (docs/ffi.md, "Per-turn calls"). Subscribed on the
//! client's router before `turn/start` is sent, so no event of the turn is missed; it hands out
//! only that turn's notifications (same threadId and turnId; thread-level ones go to the client's
//! poll queue or callback) and ends after its `turn/completed`, which it hands out too. The
//! assistant's text and the completion are gathered as the notifications pass.

use super::client::{deadline, ClientInner, Refused};
use super::hub::{route_of, Next, Who};
use super::*;
use serde_json::{json, Value};
use std::sync::Arc;

/// The events of one turn started by `cc_client_turn_start`. Freed by `cc_client_turn_free`
/// (which may come before or after `cc_client_free`).
pub struct cc_client_turn {
    inner: Arc<ClientInner>,
    sub: u64,
    turn_id: String,
    started: String,
    kept: OversizedText,
    /// The kept message is the turn's `turn/completed`.
    kept_is_last: Mutex<bool>,
    seen: Mutex<Seen>,
    last_error: LastError,
}

/// What passed through the handle so far.
#[derive(Default)]
struct Seen {
    /// The `text` of each `item/completed` whose content is an `agentMessage`, in order.
    texts: Vec<String>,
    /// The `turn/completed` params, once it came.
    completion: Option<Value>,
    /// Its `turn/completed` was handed out (by `cc_client_turn_next`).
    last_handed_out: bool,
}

impl Handle for cc_client_turn {
    fn last_error(&self) -> &LastError {
        &self.last_error
    }
}

impl Drop for cc_client_turn {
    fn drop(&mut self) {
        self.inner.hub.unsubscribe(self.sub);
    }
}

impl cc_client_turn {
    /// The next message of this turn, noting agent texts and the completion as it passes.
    /// `Ok(None)` after the end.
    fn pull(&self, until: Option<std::time::Instant>) -> Outcome<Option<String>> {
        match self
            .inner
            .hub
            .next(&self.inner.client, Who::Turn(self.sub), until)
        {
            Next::Message(text) => {
                if let Ok(v) = serde_json::from_str::<Value>(&text) {
                    self.note(&v);
                }
                Ok(Some(text))
            }
            Next::Timeout => Err(fail(
                CC_ERR_TIMEOUT,
                format!("turn {} sent nothing within the timeout", self.turn_id),
            )),
            Next::Ended | Next::Stopped => Ok(None),
            Next::Closed => Err(fail(
                CC_ERR_CLOSED,
                format!("the client closed before turn {} completed", self.turn_id),
            )),
        }
    }

    fn note(&self, v: &Value) {
        let mut seen = lock(&self.seen);
        match v.get("method").and_then(Value::as_str) {
            Some("item/completed") => {
                let content = v.pointer("/params/item/content");
                if content.and_then(|c| c.get("type")).and_then(Value::as_str)
                    == Some("agentMessage")
                {
                    let text = content.and_then(|c| c.get("text")).and_then(Value::as_str);
                    seen.texts.push(text.unwrap_or_default().to_string());
                }
            }
            Some("turn/completed") => {
                seen.completion = Some(v.get("params").cloned().unwrap_or(Value::Null));
            }
            _ => {}
        }
    }

    /// Reads the turn to its end (what was not handed out yet is dropped after noting it).
    fn finish(&self, timeout_ms: u32) -> Outcome<Value> {
        let until = deadline(timeout_ms);
        loop {
            if let Some(done) = lock(&self.seen).completion.clone() {
                return Ok(done);
            }
            if self.pull(until)?.is_none() {
                return Err(fail(
                    CC_ERR_CLOSED,
                    format!("turn {} ended without its turn/completed", self.turn_id),
                ));
            }
        }
    }
}

/// Starts a turn on `thread_id` with one text input and returns its events. Subscribes before it
/// sends `turn/start`, so every notification of the turn reaches the handle. On success
/// `*out_turn` owns a new handle (free it with `cc_client_turn_free`). Failures are those of
/// `cc_client_request` for `turn/start` (`CC_ERR_NOT_FOUND` for no such thread,
/// `CC_ERR_CONFLICT` for a thread busy with another turn, `CC_ERR_OVERLOADED`, …), with the text
/// as the client's last error (the server's error object as JSON for a server error) and
/// `cc_client_last_error_code` set.
///
/// # Safety
/// `client` valid; `thread_id`, `text` valid C strings; `out_turn` valid.
#[no_mangle]
pub unsafe extern "C" fn cc_client_turn_start(
    client: *const cc_client,
    thread_id: *const c_char,
    text: *const c_char,
    out_turn: *mut *mut cc_client_turn,
) -> cc_result {
    on_handle(handle(client), |c| {
        let thread_id = str_arg(thread_id, "thread_id")?;
        let text = str_arg(text, "text")?;
        let out = out_arg(out_turn, "out_turn")?;
        let params = json!({"threadId": thread_id, "input": [{"type": "text", "text": text}]});
        let hub = &c.inner.hub;
        let sub = hub.subscribe(thread_id);
        let (started, started_text) = match c.call("turn/start", params) {
            Ok(answer) => answer,
            Err(Refused { code, text, .. }) => {
                hub.unsubscribe(sub);
                return Err(fail(code, text));
            }
        };
        let Some(turn_id) = started.pointer("/turn/id").and_then(Value::as_str) else {
            hub.unsubscribe(sub);
            return Err(fail(CC_ERR_FAILED, "turn/start answered without a turn id"));
        };
        hub.resolve(sub, turn_id);
        *out = into_handle(cc_client_turn {
            inner: Arc::clone(&c.inner),
            sub,
            turn_id: turn_id.to_string(),
            started: started_text,
            kept: OversizedText::default(),
            kept_is_last: Mutex::new(false),
            seen: Mutex::new(Seen::default()),
            last_error: LastError::default(),
        });
        Ok(())
    })
}

/// The turn's next notification (a whole JSON-RPC message), waiting up to `timeout_ms`
/// (`CC_WAIT_FOREVER`: no deadline). `*out_last` (if not NULL) is set true for the turn's
/// `turn/completed`, the last one; a call after that returns `CC_ERR_CLOSED` ("completed").
/// `CC_ERR_TIMEOUT` when nothing came in time; `CC_ERR_CLOSED` also when the client closed first;
/// `CC_ERR_BUFFER_TOO_SMALL` keeps the message for the next call.
///
/// # Safety
/// `turn` valid; `buf` NULL or valid for `len`; `out_needed`, `out_last` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn cc_client_turn_next(
    turn: *const cc_client_turn,
    timeout_ms: u32,
    buf: *mut c_char,
    len: usize,
    out_needed: *mut usize,
    out_last: *mut bool,
) -> cc_result {
    let out = TextOut::new(buf, len, out_needed);
    on_handle(handle(turn), |t| {
        put(out_last, false);
        if t.kept.take_into(out)? {
            let last = std::mem::take(&mut *lock(&t.kept_is_last));
            lock(&t.seen).last_handed_out |= last;
            put(out_last, last);
            return Ok(());
        }
        if lock(&t.seen).last_handed_out {
            return Err(fail(
                CC_ERR_CLOSED,
                format!(
                    "turn {} has completed: its turn/completed was the last",
                    t.turn_id
                ),
            ));
        }
        let Some(text) = t.pull(deadline(timeout_ms))? else {
            return Err(fail(
                CC_ERR_CLOSED,
                format!("turn {} has completed", t.turn_id),
            ));
        };
        let last = serde_json::from_str::<Value>(&text).is_ok_and(|v| route_of(&v).2);
        match t.kept.write_or_keep(out, CC_OK, text) {
            Ok(()) => {
                lock(&t.seen).last_handed_out |= last;
                put(out_last, last);
                Ok(())
            }
            Err(e) => {
                *lock(&t.kept_is_last) = last;
                Err(e)
            }
        }
    })
}

/// Reads the turn to its end (up to `timeout_ms` in all; `CC_WAIT_FOREVER`: no deadline) and
/// writes the assistant's text: the `text` of the turn's `item/completed` items whose content is
/// an `agentMessage`, in order, joined with "\n" (also those already handed out by
/// `cc_client_turn_next`). A turn that ended `failed` returns `CC_ERR_KERNEL_FAILED` with
/// "REASON: MESSAGE" (REASON the TurnError code, e.g. `kernelFailed`) as the handle's last
/// error; `interrupted` returns `CC_ERR_CANCELLED`. Repeatable: a short buffer
/// (`CC_ERR_BUFFER_TOO_SMALL`) or a timeout loses nothing, call again.
///
/// # Safety
/// `turn` valid; `buf` NULL or valid for `len`; `out_needed` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn cc_client_turn_text(
    turn: *const cc_client_turn,
    timeout_ms: u32,
    buf: *mut c_char,
    len: usize,
    out_needed: *mut usize,
) -> cc_result {
    let out = TextOut::new(buf, len, out_needed);
    on_handle(handle(turn), |t| {
        let done = t.finish(timeout_ms)?;
        match done.pointer("/turn/status").and_then(Value::as_str) {
            Some("failed") => {
                let field = |name: &str| {
                    done.pointer(&format!("/error/{name}"))
                        .and_then(Value::as_str)
                        .unwrap_or("unknown")
                        .to_string()
                };
                Err(fail(
                    CC_ERR_KERNEL_FAILED,
                    format!("{}: {}", field("code"), field("message")),
                ))
            }
            Some("interrupted") => Err(fail(
                CC_ERR_CANCELLED,
                format!("turn {} was interrupted", t.turn_id),
            )),
            _ => out.write(&lock(&t.seen).texts.join("\n")),
        }
    })
}

/// Reads the turn to its end (as `cc_client_turn_text`) and writes its `turn/completed` params
/// as JSON (`/turn/status`, `/turn/id`, `/error/code`, `/error/message`… through
/// `cc_json_get_string`), whatever the turn's status. Repeatable.
///
/// # Safety
/// `turn` valid; `buf` NULL or valid for `len`; `out_needed` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn cc_client_turn_completion(
    turn: *const cc_client_turn,
    timeout_ms: u32,
    buf: *mut c_char,
    len: usize,
    out_needed: *mut usize,
) -> cc_result {
    let out = TextOut::new(buf, len, out_needed);
    on_handle(handle(turn), |t| {
        out.write(&t.finish(timeout_ms)?.to_string())
    })
}

/// The turn's id.
///
/// # Safety
/// `turn` valid; `buf` NULL or valid for `len`; `out_needed` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn cc_client_turn_id(
    turn: *const cc_client_turn,
    buf: *mut c_char,
    len: usize,
    out_needed: *mut usize,
) -> cc_result {
    on_handle(handle(turn), |t| {
        TextOut::new(buf, len, out_needed).write(&t.turn_id)
    })
}

/// The `turn/start` result (`{"turn":{…}}`) as JSON.
///
/// # Safety
/// `turn` valid; `buf` NULL or valid for `len`; `out_needed` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn cc_client_turn_started(
    turn: *const cc_client_turn,
    buf: *mut c_char,
    len: usize,
    out_needed: *mut usize,
) -> cc_result {
    on_handle(handle(turn), |t| {
        TextOut::new(buf, len, out_needed).write(&t.started)
    })
}

/// The turn handle's last error text.
///
/// # Safety
/// `turn` NULL or valid; `buf` NULL or valid for `len`; `out_needed` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn cc_client_turn_last_error(
    turn: *const cc_client_turn,
    buf: *mut c_char,
    len: usize,
    out_needed: *mut usize,
) -> cc_result {
    last_error_into(turn.as_ref(), TextOut::new(buf, len, out_needed))
}

/// Frees the turn handle: its notifications not yet handed out are dropped, and later ones of
/// that turn go to the client's poll queue or callback. NULL is a no-op.
///
/// # Safety
/// `turn` NULL or a handle from `cc_client_turn_start` not yet freed; not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn cc_client_turn_free(turn: *mut cc_client_turn) {
    free(turn)
}
