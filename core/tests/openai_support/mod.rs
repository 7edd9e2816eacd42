//! A real HTTP/1.1 server on loopback, started by each test, that serves scripted answers to
//! `POST …/chat/completions`: recorded SSE streams in the providers' wire format, error
//! statuses with headers, streams cut mid-answer or kept open forever. It records every request
//! (headers and JSON body) so tests can check what the kernel sent.
#![allow(dead_code)]

use serde_json::Value;
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How a streamed answer ends.
#[derive(Clone, Debug)]
pub enum End {
    /// Everything was sent; close normally.
    Complete,
    /// Close the socket abruptly after the given pieces (no `[DONE]`).
    Drop,
}

#[derive(Clone, Debug)]
pub enum Reply {
    /// `200 text/event-stream`, `pieces` written one by one `gap` apart.
    Sse {
        pieces: Vec<String>,
        gap: Duration,
        end: End,
    },
    /// An error status with extra headers and a body.
    Status {
        code: u16,
        headers: Vec<(String, String)>,
        body: String,
    },
    /// A stream that sends a content chunk every `gap` until the client goes away (or 20 s).
    Endless { gap: Duration },
}

/// One request the server saw.
#[derive(Clone, Debug)]
pub struct Seen {
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Value,
    pub at: Instant,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

pub struct MockModel {
    pub base_url: String,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    script: Arc<Mutex<VecDeque<Reply>>>,
    /// When an endless stream noticed that its client had gone.
    pub client_gone: Arc<Mutex<Option<Instant>>>,
}

impl MockModel {
    pub fn start(replies: Vec<Reply>) -> MockModel {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base_url = format!("http://{}/v1", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let script = Arc::new(Mutex::new(VecDeque::from(replies)));
        let client_gone = Arc::new(Mutex::new(None));
        let (s, q, g) = (seen.clone(), script.clone(), client_gone.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { break };
                let (s, q, g) = (s.clone(), q.clone(), g.clone());
                std::thread::spawn(move || serve(stream, &s, &q, &g));
            }
        });
        MockModel {
            base_url,
            seen,
            script,
            client_gone,
        }
    }

    pub fn push(&self, reply: Reply) {
        self.script.lock().unwrap().push_back(reply);
    }

    pub fn requests(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

fn serve(
    mut stream: TcpStream,
    seen: &Mutex<Vec<Seen>>,
    script: &Mutex<VecDeque<Reply>>,
    gone: &Mutex<Option<Instant>>,
) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
    let mut headers = Vec::new();
    let mut length = 0usize;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 {
            return;
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse().unwrap_or(0);
            }
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body).unwrap();
    seen.lock().unwrap().push(Seen {
        path,
        headers,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        at: Instant::now(),
    });
    let reply = script.lock().unwrap().pop_front().unwrap_or(Reply::Status {
        code: 500,
        headers: vec![],
        body: "{\"error\":{\"message\":\"the test script has no more replies\"}}".into(),
    });
    let sse_head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n";
    match reply {
        Reply::Status {
            code,
            headers,
            body,
        } => {
            let mut head = format!(
                "HTTP/1.1 {code} Status\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
                body.len()
            );
            for (k, v) in headers {
                head.push_str(&format!("{k}: {v}\r\n"));
            }
            head.push_str("\r\n");
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(body.as_bytes());
        }
        Reply::Sse { pieces, gap, end } => {
            let _ = stream.write_all(sse_head.as_bytes());
            for p in pieces {
                if stream.write_all(p.as_bytes()).is_err() || stream.flush().is_err() {
                    return;
                }
                std::thread::sleep(gap);
            }
            if let End::Drop = end {
                let _ = stream.shutdown(std::net::Shutdown::Both);
            }
        }
        Reply::Endless { gap } => {
            let _ = stream.write_all(sse_head.as_bytes());
            let until = Instant::now() + Duration::from_secs(20);
            while Instant::now() < until {
                let piece = chunk(&serde_json::json!({"content": "tick "}), None);
                if stream.write_all(piece.as_bytes()).is_err() || stream.flush().is_err() {
                    *gone.lock().unwrap() = Some(Instant::now());
                    return;
                }
                std::thread::sleep(gap);
            }
        }
    }
    let _ = stream.flush();
}

/// One `chat.completion.chunk` event exactly as OpenAI sends it.
pub fn chunk(delta: &Value, finish: Option<&str>) -> String {
    format!(
        "data: {}\n\n",
        serde_json::json!({
            "id": "chatcmpl-AbC123", "object": "chat.completion.chunk", "created": 1735689600,
            "model": "gpt-4o-mini-2024-07-18", "system_fingerprint": "fp_0aa8d3e20b",
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]
        })
    )
}

/// OpenAI's final usage chunk (`stream_options.include_usage`): no choices.
pub fn usage_chunk(prompt: u64, completion: u64) -> String {
    format!(
        "data: {}\n\n",
        serde_json::json!({
            "id": "chatcmpl-AbC123", "object": "chat.completion.chunk", "created": 1735689600,
            "model": "gpt-4o-mini-2024-07-18", "system_fingerprint": "fp_0aa8d3e20b", "choices": [],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        })
    )
}

pub const DONE: &str = "data: [DONE]\n\n";

/// A complete streamed answer in OpenAI's format, in `parts`.
pub fn answer(parts: &[&str]) -> Reply {
    let mut pieces = vec![chunk(
        &serde_json::json!({"role": "assistant", "content": "", "refusal": null}),
        None,
    )];
    for p in parts {
        pieces.push(chunk(&serde_json::json!({"content": p}), None));
    }
    pieces.push(chunk(&serde_json::json!({}), Some("stop")));
    pieces.push(usage_chunk(20, parts.len() as u64));
    pieces.push(DONE.into());
    Reply::Sse {
        pieces,
        gap: Duration::ZERO,
        end: End::Complete,
    }
}

/// A streamed response asking for tools, each call's arguments split in two fragments the way
/// OpenAI splits them: `(id, name, arguments)`.
pub fn tool_calls(calls: &[(&str, &str, &str)]) -> Reply {
    let mut pieces = vec![chunk(
        &serde_json::json!({"role": "assistant", "content": null, "refusal": null}),
        None,
    )];
    for (i, (id, name, args)) in calls.iter().enumerate() {
        pieces.push(chunk(&serde_json::json!({"tool_calls": [{"index": i, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}]}), None));
        let mid = args.len() / 2;
        for part in [&args[..mid], &args[mid..]] {
            pieces.push(chunk(
                &serde_json::json!({"tool_calls": [{"index": i, "function": {"arguments": part}}]}),
                None,
            ));
        }
    }
    pieces.push(chunk(&serde_json::json!({}), Some("tool_calls")));
    pieces.push(usage_chunk(40, 12));
    pieces.push(DONE.into());
    Reply::Sse {
        pieces,
        gap: Duration::ZERO,
        end: End::Complete,
    }
}
