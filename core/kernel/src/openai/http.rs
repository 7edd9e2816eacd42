//! One streamed Chat Completions request on the kernel's tokio runtime: retries with backoff
//! for 429 and 5xx (honouring `Retry-After`), then the SSE body decoded into chunks and sent to
//! the turn's thread over a bounded channel. Nothing here touches the engine: the turn thread
//! records what arrives and aborts this task the moment the turn is interrupted.

use super::sse::{excerpt, parse_chunk, ChunkDelta, SseDecoder};
use reqwest::header::{HeaderMap, ACCEPT, CONTENT_TYPE, LOCATION};
use std::time::Duration;
use tokio::sync::mpsc::Sender;

/// What the stream task tells the turn's thread.
#[derive(Debug)]
pub enum StreamEvent {
    Chunk(ChunkDelta),
    /// An attempt failed with a retryable answer; the next one starts after `delay`.
    Retrying {
        attempt: u32,
        max_attempts: u32,
        status: Option<u16>,
        delay: Duration,
        why: String,
    },
    /// The stream failed: a turn error code and a message safe to show (no key, no body dump).
    Failed {
        code: &'static str,
        message: String,
    },
    /// The answer is complete.
    Done,
}

/// Everything one request needs; the key lives only here and in the header it becomes.
pub struct StreamRequest {
    pub url: String,
    /// The endpoint as shown in messages (no credentials, no query).
    pub shown_url: String,
    pub api_key: Option<String>,
    pub body: Vec<u8>,
    pub timeout: Duration,
    /// The longest wait for progress once the response has started (`modelStalled`).
    pub idle_timeout: Duration,
    /// The whole call, retries included (`modelDeadlineExceeded`).
    pub call_deadline: Duration,
    pub max_attempts: u32,
    pub base_delay: Duration,
    pub max_delay: Duration,
}

type Failure = (&'static str, String);

/// The turn error code of a call whose stream made no progress for `idle_timeout`.
pub const STALLED: &str = "modelStalled";
/// The turn error code of a call that passed `call_deadline`.
pub const DEADLINE_EXCEEDED: &str = "modelDeadlineExceeded";

/// A duration as messages say it: tenths below 10 s, whole seconds above.
pub fn seconds(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 10.0 {
        format!("{s:.1} s")
    } else {
        format!("{s:.0} s")
    }
}

/// Runs the request to its end (or its call deadline) and reports it; never panics on what the
/// server sends.
pub async fn stream(client: reqwest::Client, req: StreamRequest, tx: Sender<StreamEvent>) {
    let outcome = match tokio::time::timeout(req.call_deadline, run(&client, &req, &tx)).await {
        Ok(outcome) => outcome,
        // Dropping `run` drops the response: the connection closes here.
        Err(_) => Err((
            DEADLINE_EXCEEDED,
            format!(
                "the model call did not finish within its deadline of {} (call_deadline); what streamed before it is kept",
                seconds(req.call_deadline)
            ),
        )),
    };
    let last = match outcome {
        Ok(()) => StreamEvent::Done,
        Err((code, message)) => StreamEvent::Failed {
            code,
            message: redact(&message, req.api_key.as_deref()),
        },
    };
    let _ = tx.send(last).await;
}

/// Removes the key from anything a server might echo back.
fn redact(text: &str, key: Option<&str>) -> String {
    match key {
        Some(k) if k.len() >= 4 => text.replace(k, "[redacted]"),
        _ => text.to_string(),
    }
}

/// `Retry-After` (seconds) or OpenAI's `retry-after-ms`.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(ms) = get("retry-after-ms").and_then(|v| v.trim().parse::<f64>().ok()) {
        return (ms.is_finite() && ms >= 0.0).then(|| Duration::from_millis(ms as u64));
    }
    get("retry-after")
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64)
}

/// Where a redirect points, as messages show it: resolved against the request's URL, without
/// credentials or query, cut to 120 characters.
fn redirect_target(from: &str, headers: &HeaderMap) -> String {
    let Some(location) = headers.get(LOCATION).and_then(|v| v.to_str().ok()) else {
        return "nowhere (no Location header)".into();
    };
    match reqwest::Url::parse(from).and_then(|base| base.join(location)) {
        Ok(mut url) => {
            let _ = url.set_username("");
            let _ = url.set_password(None);
            url.set_query(None);
            url.set_fragment(None);
            excerpt(url.as_str())
        }
        Err(_) => format!("{:?}", excerpt(location)),
    }
}

/// Reads at most 8 KiB of an error body and pulls out the server's message.
async fn error_message(mut resp: reqwest::Response) -> String {
    let mut body = Vec::new();
    while body.len() < 8192 {
        match tokio::time::timeout(Duration::from_secs(5), resp.chunk()).await {
            Ok(Ok(Some(b))) => body.extend_from_slice(&b),
            _ => break,
        }
    }
    let text = String::from_utf8_lossy(&body);
    let message = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| {
            v.get("error")
                .and_then(|e| e.get("message").or(Some(e)))
                .and_then(|m| m.as_str().map(str::to_string))
                .or_else(|| {
                    v.get("message")
                        .and_then(|m| m.as_str())
                        .map(str::to_string)
                })
        })
        .unwrap_or_else(|| text.into_owned());
    let message = excerpt(message.trim());
    if message.is_empty() {
        String::new()
    } else {
        format!(": {message}")
    }
}

async fn run(
    client: &reqwest::Client,
    req: &StreamRequest,
    tx: &Sender<StreamEvent>,
) -> Result<(), Failure> {
    let mut attempt = 1;
    let mut resp = loop {
        let mut builder = client
            .post(&req.url)
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "text/event-stream")
            .body(req.body.clone());
        if let Some(key) = &req.api_key {
            // bearer_auth marks the header sensitive, so it is never printed by reqwest either.
            builder = builder.bearer_auth(key);
        }
        let secs = req.timeout.as_secs_f64();
        let (status, hint, why) = match tokio::time::timeout(req.timeout, builder.send()).await {
            Err(_) => (None, None, format!("no answer within {secs:.0} s")),
            Ok(Err(e)) => {
                let what = if e.is_connect() {
                    "could not connect"
                } else if e.is_timeout() {
                    "timed out"
                } else {
                    "the request failed"
                };
                (None, None, what.to_string())
            }
            Ok(Ok(r)) => {
                let s = r.status();
                if s.is_success() {
                    break r;
                }
                let code = s.as_u16();
                if s.is_redirection() {
                    let to = redirect_target(&req.url, r.headers());
                    return Err(("modelRedirected", format!(
                        "the model server answered HTTP {code} redirecting to {to}; redirects are not followed, so the conversation and the key go only where the base URL says: set the base URL to the new address if you trust it")));
                }
                if code != 429 && !s.is_server_error() {
                    let detail = error_message(r).await;
                    return Err(match code {
                        401 => ("modelUnauthorized", format!(
                            "the model server refused the API key (HTTP 401){detail}; set CC_APP_SERVER_API_KEY or OPENAI_API_KEY to a valid key")),
                        403 => ("modelForbidden", format!(
                            "the model server refused access (HTTP 403){detail}; the key may not be allowed to use this model")),
                        404 => ("modelNotFound", format!(
                            "the model server answered 404 for {}{detail}; check the base URL (most servers want it to end in /v1) and the model name", req.shown_url)),
                        _ => ("modelRequestRejected", format!(
                            "the model server rejected the request (HTTP {code}){detail}")),
                    });
                }
                let hint = retry_after(r.headers());
                (Some(code), hint, format!("HTTP {code}"))
            }
        };
        if attempt >= req.max_attempts {
            return Err(match status {
                Some(code) => ("modelUnavailable", format!(
                    "the model server answered HTTP {code} on all {} attempts; try again later", req.max_attempts)),
                None => ("modelUnreachable", format!(
                    "{why} at {} on all {} attempts; check that the server is running and the base URL", req.shown_url, req.max_attempts)),
            });
        }
        let backoff = req
            .base_delay
            .saturating_mul(1 << (attempt - 1).min(16))
            .min(req.max_delay);
        let delay = match hint {
            Some(h) if h > req.max_delay => {
                return Err(("modelUnavailable", format!(
                    "the model server asked to retry after {:.1} s, longer than the {:.1} s this kernel waits; try again later",
                    h.as_secs_f64(), req.max_delay.as_secs_f64())))
            }
            Some(h) => h,
            None => backoff,
        };
        let _ = tx
            .send(StreamEvent::Retrying {
                attempt,
                max_attempts: req.max_attempts,
                status,
                delay,
                why,
            })
            .await;
        tokio::time::sleep(delay).await;
        attempt += 1;
    };
    let content_type = resp
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    if content_type.starts_with("application/json") {
        return Err(("modelStreamMalformed", "the model server answered with one JSON document instead of a stream; it may not support `stream: true`".into()));
    }
    let mut decoder = SseDecoder::default();
    let mut finished = false;
    let malformed = |m: String| {
        if m.starts_with("the server reported") {
            ("modelStreamError", m)
        } else {
            ("modelStreamMalformed", m)
        }
    };
    // Progress is a chunk that carries part of the answer: SSE comments, blank lines and empty
    // chunks keep a connection busy without moving the answer on, so they never reset this.
    let mut progress_at = tokio::time::Instant::now();
    let stalled = || {
        (
            STALLED,
            format!(
                "the model server sent no part of an answer for {} (only keep-alives or empty chunks, if anything); the idle deadline is idle_timeout",
                seconds(req.idle_timeout)
            ),
        )
    };
    loop {
        let idle_left =
            (progress_at + req.idle_timeout).saturating_duration_since(tokio::time::Instant::now());
        if idle_left.is_zero() {
            return Err(stalled());
        }
        let events = match tokio::time::timeout(req.timeout.min(idle_left), resp.chunk()).await {
            Err(_) if req.timeout >= idle_left => return Err(stalled()),
            Err(_) => {
                return Err((
                    "modelTimeout",
                    format!(
                        "the model server sent nothing for {:.0} s mid-answer",
                        req.timeout.as_secs_f64()
                    ),
                ))
            }
            Ok(Err(_)) => {
                return Err((
                    "modelStreamCut",
                    "the connection to the model server broke mid-answer".into(),
                ))
            }
            Ok(Ok(Some(bytes))) => decoder.feed(&bytes).map_err(malformed)?,
            Ok(Ok(None)) => {
                let events = decoder.finish().map_err(malformed)?;
                for super::sse::SseEvent::Data(data) in events {
                    match parse_chunk(&data).map_err(malformed)? {
                        None => return Ok(()),
                        Some(c) => {
                            finished |= c.finish_reason.is_some();
                            let _ = tx.send(StreamEvent::Chunk(c)).await;
                        }
                    }
                }
                return if finished {
                    Ok(())
                } else {
                    Err((
                        "modelStreamCut",
                        "the model server closed the stream before the answer was complete".into(),
                    ))
                };
            }
        };
        for super::sse::SseEvent::Data(data) in events {
            match parse_chunk(&data).map_err(malformed)? {
                None => return Ok(()),
                Some(c) => {
                    finished |= c.finish_reason.is_some();
                    if c.is_progress() {
                        progress_at = tokio::time::Instant::now();
                    }
                    if tx.send(StreamEvent::Chunk(c)).await.is_err() {
                        return Ok(()); // the turn went away
                    }
                }
            }
        }
    }
}
