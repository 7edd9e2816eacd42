//! Message sequences against a live in-process engine (`AppServer` + two `Connection`s, a fresh
//! private state dir, the scripted kernel). Structure-aware: most messages are well-formed wire
//! v1 requests and approval answers built from what the server said so far (thread and turn ids,
//! approval nonces), mixed with shared fixtures, mutated fixtures and raw bytes. After the
//! sequence the run must settle (every request answered once, every turn ended) and, after
//! shutdown, the rollout must back every notification and verify (see `engine::check_rollout`).
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use cc_app_server::engine::AppServer;
use cc_app_server::rollout::{Durability, StoreKind};
use cc_app_server_fuzz::engine::{check_rollout, fuzz_config, settle, temp_state_root, Peer};
use cc_app_server_fuzz::fixture_lines;
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};
use std::time::Duration;

#[derive(Debug, Arbitrary)]
enum Script {
    Echo,
    Message { chunks: u8 },
    Tool,
    TwoTools,
    Sleep { ms: u8 },
    Fail,
    Deaf { ms: u8 },
    Reasoning,
}

impl Script {
    fn json(&self) -> Value {
        let steps = match self {
            Script::Echo => json!([{"type": "echo"}]),
            Script::Message { chunks } => {
                json!([{"type": "message", "text": "héllo wörld, streamed", "chunks": chunks % 8}])
            }
            Script::Tool => {
                json!([{"type": "tool", "tool": "fs.write", "arguments": {"path": "a"}}, {"type": "echo"}])
            }
            Script::TwoTools => json!([
                {"type": "tool", "tool": "fs.write", "arguments": {"path": "a"}},
                {"type": "tool", "tool": "fs.write", "arguments": {"path": "a"}}]),
            Script::Sleep { ms } => json!([{"type": "sleep", "ms": ms % 60}, {"type": "echo"}]),
            Script::Fail => json!([{"type": "fail", "message": "scripted"}]),
            Script::Deaf { ms } => json!([{"type": "ignoreCancel", "ms": ms % 40}]),
            Script::Reasoning => json!([{"type": "reasoning", "text": "hmm"}, {"type": "echo"}]),
        };
        json!({"steps": steps})
    }
}

#[derive(Debug, Arbitrary)]
enum Decision {
    AcceptOnce,
    AcceptForTurn,
    AcceptForSession,
    Decline,
    Cancel,
    Unknown,
}

#[derive(Debug, Arbitrary)]
enum Nonce {
    Right,
    Other(u8),
    Made,
    Missing,
}

#[derive(Debug, Arbitrary)]
enum Op {
    Init {
        version: u8,
        min: u8,
        approvals: bool,
    },
    ThreadStart {
        slot: u8,
        title: Option<String>,
        meta: Option<(String, u8)>,
        script: Script,
        idem: Option<u8>,
    },
    ThreadRead {
        slot: u8,
        after: Option<u16>,
        limit: Option<u16>,
        resume: bool,
    },
    ThreadFork {
        slot: u8,
        new: Option<u8>,
        at: Option<u16>,
        idem: Option<u8>,
    },
    ThreadList {
        archived: bool,
        limit: Option<u16>,
    },
    Archive {
        slot: u8,
    },
    TurnStart {
        slot: u8,
        text: String,
        idem: Option<u8>,
    },
    Interrupt {
        slot: u8,
        turn: u8,
    },
    Answer {
        which: u8,
        nonce: Nonce,
        decision: Decision,
    },
    AnswerError {
        which: u8,
    },
    Fixture {
        index: u16,
        cut: Option<u16>,
    },
    Raw(String),
    Pump {
        ms: u8,
    },
    Close,
}

#[derive(Debug)]
struct Input {
    jsonl: bool,
    sync: bool,
    ops: Vec<(bool, Op)>,
}

impl<'a> Arbitrary<'a> for Input {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let jsonl = u.arbitrary::<u8>()? % 8 != 0;
        let sync = u.arbitrary()?;
        let mut ops = Vec::new();
        // Bounded: a run is a few dozen messages, so thousands of runs fit in a minute.
        while ops.len() < 48 && !u.is_empty() {
            ops.push((u.arbitrary()?, u.arbitrary()?));
        }
        Ok(Input { jsonl, sync, ops })
    }
}

fn thread_id(slot: u8) -> Value {
    match slot % 16 {
        0..=11 => json!(format!("t{}", slot % 4)),
        12 => json!("../escape"),
        13 => json!("x".repeat(129)),
        14 => json!(""),
        _ => json!(7),
    }
}

/// Nested metadata, never deeper than `depth` (well inside the parser's limit unless strict).
fn metadata(key: &str, depth: u8) -> Value {
    let limit = if cc_app_server_fuzz::strict() {
        130
    } else {
        64
    };
    let mut v = json!("leaf");
    for i in 0..(depth as usize % limit) {
        v = if i % 2 == 0 {
            json!([v])
        } else {
            json!({"k": v})
        };
    }
    let key = if key.is_empty() { "k" } else { key };
    json!({ key: v })
}

/// Request ids the harness makes, far from the small ids the fixtures use.
struct Run {
    next_id: u64,
    ids: Vec<Value>,
}

impl Run {
    fn request(&mut self, method: &str, params: Value) -> String {
        self.next_id += 1;
        // Now and then the integral-float form of the id, which wire v1 accepts.
        let id = if self.next_id % 7 == 0 {
            json!(self.next_id as f64)
        } else {
            json!(self.next_id)
        };
        self.ids.push(id.clone());
        json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string()
    }
}

fuzz_target!(|input: Input| {
    let root = temp_state_root();
    let dir = root.path().join("state");
    let store = if input.jsonl {
        StoreKind::Jsonl
    } else {
        StoreKind::Sqlite
    };
    let durability = if input.sync {
        Durability::Sync
    } else {
        Durability::Buffered
    };
    let server =
        AppServer::open(fuzz_config(&dir, store, durability)).expect("open a fresh state dir");
    let mut peers = vec![
        Peer::new(server.connect().expect("connect")),
        Peer::new(server.connect().expect("connect")),
    ];
    let mut run = Run {
        next_id: 1_000_000,
        ids: Vec::new(),
    };
    let fixtures = fixture_lines();
    for (second, op) in &input.ops {
        let p = &mut peers[*second as usize];
        let line = match op {
            Op::Init { version, min, approvals } => {
                let mut features = vec!["thread_turn_item", "bounded_transport"];
                if *approvals {
                    features.push("structured_approval");
                }
                Some(run.request("initialize", json!({
                    "protocolVersion": version % 4, "minimumProtocolVersion": min % 3,
                    "client": {"name": "fuzz", "version": "1"}, "features": features})))
            }
            Op::ThreadStart { slot, title, meta, script, idem } => {
                let mut params = json!({"threadId": thread_id(*slot), "agentOptions": {"script": script.json()}});
                if let Some(t) = title {
                    params["title"] = json!(t);
                }
                if let Some((k, d)) = meta {
                    params["metadata"] = metadata(k, *d);
                }
                if let Some(k) = idem {
                    params["idempotencyKey"] = json!(format!("k{}", k % 4));
                }
                Some(run.request("thread/start", params))
            }
            Op::ThreadRead { slot, after, limit, resume } => {
                let mut params = json!({"threadId": thread_id(*slot)});
                if let Some(a) = after {
                    params["afterEventSeq"] = json!(a);
                }
                if let Some(l) = limit {
                    params["limit"] = json!(l % 1002);
                }
                Some(run.request(if *resume { "thread/resume" } else { "thread/read" }, params))
            }
            Op::ThreadFork { slot, new, at, idem } => {
                let mut params = json!({"threadId": thread_id(*slot)});
                if let Some(n) = new {
                    params["newThreadId"] = thread_id(*n);
                }
                if let Some(a) = at {
                    params["atEventSeq"] = json!(a % 64);
                }
                if let Some(k) = idem {
                    params["idempotencyKey"] = json!(format!("f{}", k % 4));
                }
                Some(run.request("thread/fork", params))
            }
            Op::ThreadList { archived, limit } => {
                let mut params = json!({"includeArchived": archived});
                if let Some(l) = limit {
                    params["limit"] = json!(l % 1002);
                }
                Some(run.request("thread/list", params))
            }
            Op::Archive { slot } => Some(run.request("thread/archive", json!({"threadId": thread_id(*slot)}))),
            Op::TurnStart { slot, text, idem } => {
                let mut params = json!({"threadId": thread_id(*slot), "input": [{"type": "text", "text": text}]});
                if let Some(k) = idem {
                    params["idempotencyKey"] = json!(format!("u{}", k % 4));
                }
                Some(run.request("turn/start", params))
            }
            Op::Interrupt { slot, turn } => {
                let known = p.turns_started.get(*turn as usize % (p.turns_started.len() + 1)).cloned();
                let (th, tu) = match known {
                    Some((th, tu)) => (json!(th), json!(tu)),
                    None => (thread_id(*slot), json!("tu-none")),
                };
                Some(run.request("turn/interrupt", json!({"threadId": th, "turnId": tu})))
            }
            Op::Answer { which, nonce, decision } => {
                if p.approvals.is_empty() {
                    None
                } else {
                    let i = *which as usize % p.approvals.len();
                    let (id, right) = p.approvals[i].clone();
                    let nonce = match nonce {
                        Nonce::Right => json!(right),
                        Nonce::Other(j) => json!(p.approvals[*j as usize % p.approvals.len()].1),
                        Nonce::Made => json!("0123456789abcdef0123456789abcdef"),
                        Nonce::Missing => Value::Null,
                    };
                    let decision = match decision {
                        Decision::AcceptOnce => "acceptOnce",
                        Decision::AcceptForTurn => "acceptForTurn",
                        Decision::AcceptForSession => "acceptForSession",
                        Decision::Decline => "decline",
                        Decision::Cancel => "cancel",
                        Decision::Unknown => "acceptAlways",
                    };
                    let mut result = json!({"kind": decision});
                    if !nonce.is_null() {
                        result["nonce"] = nonce;
                    }
                    Some(json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string())
                }
            }
            Op::AnswerError { which } => p.approvals.get(*which as usize % (p.approvals.len() + 1)).map(|(id, _)| {
                json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32603, "message": "host failed"}}).to_string()
            }),
            Op::Fixture { index, cut } => {
                let f = &fixtures[*index as usize % fixtures.len()];
                Some(match cut {
                    // A cut on a char boundary keeps it UTF-8 (the in-process API takes &str).
                    Some(c) => {
                        let mut end = (*c as usize) % (f.len() + 1);
                        while !f.is_char_boundary(end) {
                            end -= 1;
                        }
                        f[..end].to_string()
                    }
                    None => f.clone(),
                })
            }
            Op::Raw(s) => Some(s.clone()),
            Op::Pump { ms } => {
                p.pump(Duration::from_millis(u64::from(*ms % 20)));
                None
            }
            Op::Close => {
                // Only the second connection may go away: the first keeps the oracle complete.
                if *second {
                    p.conn.close();
                    p.closed = true;
                }
                None
            }
        };
        for id in run.ids.drain(..) {
            p.own_id(&id);
        }
        if let Some(line) = line {
            // Overload is an answer too (the host retries); the line was not queued.
            let _ = p.send(&line);
        }
        p.pump(Duration::ZERO);
    }
    settle(&mut peers, Duration::from_secs(20), "the sequence");
    server.shutdown();
    check_rollout(&server, &peers);
});
