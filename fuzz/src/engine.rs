//! A live in-process engine for the fuzz targets and the soak: a fresh server on a private temp
//! state directory (tmpfs when there is one), its connections, and the invariants every run must
//! end with — every request answered once, every output line parseable and valid, every turn
//! closed exactly once, every notification's event in the rollout, every chain verifying.

use cc_app_server::approval::ApprovalPolicy;
use cc_app_server::engine::{AppServer, Connection, SendError, ServerConfig};
use cc_app_server::rollout::{Durability, ListQuery, StoreKind};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;

/// A temp dir on tmpfs when the machine has one (fsync there is cheap), else the default.
pub fn temp_state_root() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(d) = tempfile::Builder::new().prefix("ccfuzz-").tempdir_in(shm) {
            return d;
        }
    }
    tempfile::Builder::new()
        .prefix("ccfuzz-")
        .tempdir()
        .expect("a temp dir")
}

/// The fuzz configuration: short approval, grace and settle times so every run ends quickly.
pub fn fuzz_config(state_dir: &Path, store: StoreKind, durability: Durability) -> ServerConfig {
    let mut config = ServerConfig::new(state_dir);
    config.store = store;
    config.store_options.durability = durability;
    config.policy = ApprovalPolicy::AskEveryTime;
    config.approval_timeout = Duration::from_millis(150);
    config.approval_grace = Duration::from_millis(20);
    config.settle_deadline = Duration::from_millis(100);
    config
}

/// What the engine will do with a line: the engine answers everything except a message without
/// `method` that carries `result` or `error` (an answer to its own request).
pub fn expects_reply(line: &str) -> bool {
    match serde_json::from_str::<Value>(line) {
        Err(_) => true,
        Ok(v) => {
            v.get("method").is_some() || !(v.get("result").is_some() || v.get("error").is_some())
        }
    }
}

/// Maps a notification method to the rollout event type it announces.
pub fn event_type_of(method: &str) -> Option<&'static str> {
    Some(match method {
        "turn/started" => "turnStarted",
        "turn/completed" => "turnCompleted",
        "item/started" => "itemStarted",
        "item/delta" => "itemDelta",
        "item/completed" => "itemCompleted",
        "tool/requested" => "toolRequested",
        "tool/result" => "toolResult",
        "approval/requested" => "approvalRequested",
        "approval/resolved" => "approvalResolved",
        _ => return None,
    })
}

/// One client connection and everything it has seen.
pub struct Peer {
    pub conn: Connection,
    pub expected_replies: u64,
    pub replies: u64,
    /// Answers seen per id the harness made unique (`own_id`), to catch a second answer.
    pub answered: HashMap<String, u32>,
    own_ids: std::collections::HashSet<String>,
    /// Pending approval/decide requests: (id, nonce).
    pub approvals: Vec<(Value, String)>,
    /// (thread, turn) from turn/start results.
    pub turns_started: Vec<(String, String)>,
    /// turn id → turn/completed count.
    pub turns_completed: HashMap<String, u32>,
    /// (thread, seq, method) of every notification with an eventSeq.
    pub notified: Vec<(String, u64, String)>,
    /// Output lines the parser refused (depth past its limit: the issue 10 finding).
    pub unparseable: Vec<String>,
    pub closed: bool,
}

impl Peer {
    pub fn new(conn: Connection) -> Peer {
        Peer {
            conn,
            expected_replies: 0,
            replies: 0,
            answered: HashMap::new(),
            own_ids: Default::default(),
            approvals: Vec::new(),
            turns_started: Vec::new(),
            turns_completed: HashMap::new(),
            notified: Vec::new(),
            unparseable: Vec::new(),
            closed: false,
        }
    }

    /// Declares `id` (as JSON text) unique to one request: it must be answered at most once.
    pub fn own_id(&mut self, id: &Value) {
        self.own_ids.insert(id.to_string());
    }

    /// Sends one line; counts the answer it must get. Returns the send error, if any.
    pub fn send(&mut self, line: &str) -> Result<(), SendError> {
        let r = self.conn.send(line);
        match &r {
            Ok(()) => {
                if expects_reply(line) {
                    self.expected_replies += 1;
                }
            }
            Err(SendError::Closed) => self.closed = true,
            Err(_) => {}
        }
        r
    }

    /// Takes everything the server has queued, waiting up to `wait` for the first message.
    pub fn pump(&mut self, wait: Duration) -> usize {
        let mut n = 0;
        let mut first = Some(wait);
        loop {
            let msg = match first.take() {
                Some(w) if !w.is_zero() => self.conn.recv(Some(w)).ok(),
                _ => self.conn.try_recv(),
            };
            let Some(msg) = msg else {
                if !self.conn.is_open() {
                    self.closed = true;
                }
                return n;
            };
            n += 1;
            self.observe(&msg);
        }
    }

    fn observe(&mut self, text: &str) {
        let v: Value = match serde_json::from_str(text) {
            Ok(v) => v,
            Err(e) => {
                if crate::strict() || !e.to_string().contains("recursion limit") {
                    panic!(
                        "the engine wrote a line its own parser refuses: {e}\n{}",
                        &text[..text.len().min(2000)]
                    );
                }
                // Known (issue 10, "outputs deeper than the parser"): count it, keep going.
                self.unparseable.push(text.chars().take(200).collect());
                // A refused output is a response when it does not start like a notification.
                if !text.contains("\"method\"") {
                    self.replies += 1;
                }
                return;
            }
        };
        if let Err(e) = cc_agent_protocol::validate_protocol_message(&v) {
            panic!("the engine wrote an invalid message: {e}\n{text}");
        }
        match v.get("method").and_then(Value::as_str) {
            None => {
                self.replies += 1;
                if self.own_ids.contains(&v["id"].to_string()) {
                    let n = self.answered.entry(v["id"].to_string()).or_default();
                    *n += 1;
                    assert_eq!(*n, 1, "request {} answered twice: {text}", v["id"]);
                }
                if let Some(turn) = v["result"].get("turn") {
                    if v["result"].get("physicallySettled").is_none() {
                        // turn/start's answer (interrupt answers carry physicallySettled).
                        if let (Some(th), Some(tu)) =
                            (turn["threadId"].as_str(), turn["id"].as_str())
                        {
                            self.turns_started.push((th.to_string(), tu.to_string()));
                        }
                    }
                }
            }
            Some("approval/decide") => {
                let nonce = v["params"]["binding"]["nonce"]
                    .as_str()
                    .unwrap_or("")
                    .to_string();
                self.approvals.push((v["id"].clone(), nonce));
            }
            Some(method) => {
                let p = &v["params"];
                if method == "turn/completed" {
                    let id = p["turn"]["id"].as_str().unwrap_or("").to_string();
                    let n = self.turns_completed.entry(id).or_default();
                    *n += 1;
                    assert_eq!(*n, 1, "turn/completed sent twice for one turn: {text}");
                }
                if let (Some(th), Some(seq)) = (p["threadId"].as_str(), p["eventSeq"].as_u64()) {
                    self.notified
                        .push((th.to_string(), seq, method.to_string()));
                }
            }
        }
    }

    /// True once every request has its answer and every turn this peer started has ended.
    pub fn settled(&self) -> bool {
        self.closed
            || (self.replies >= self.expected_replies
                && self
                    .turns_started
                    .iter()
                    .all(|(_, t)| self.turns_completed.contains_key(t)))
    }
}

/// Pumps every peer until all are settled or `deadline` passes; panics on a hang.
pub fn settle(peers: &mut [Peer], deadline: Duration, what: &str) {
    let until = std::time::Instant::now() + deadline;
    loop {
        for p in peers.iter_mut() {
            p.pump(Duration::from_millis(2));
        }
        if peers.iter().all(Peer::settled) {
            return;
        }
        if std::time::Instant::now() >= until {
            let state: Vec<String> = peers
                .iter()
                .map(|p| {
                    format!(
                        "replies {}/{} turns {}/{} closed {}",
                        p.replies,
                        p.expected_replies,
                        p.turns_completed.len(),
                        p.turns_started.len(),
                        p.closed
                    )
                })
                .collect();
            panic!("hang: {what} not settled within {deadline:?}: {state:?}");
        }
    }
}

/// After shutdown: every thread's chain verifies, every turn has exactly one terminal event,
/// every notification a peer received names an event of the right type in the rollout, and every
/// tool that ran had an approval that allowed it.
pub fn check_rollout(server: &AppServer, peers: &[Peer]) {
    let store = server.store();
    let mut cursor = None;
    let mut events_by_thread: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    loop {
        let page = store
            .list(&ListQuery {
                include_archived: true,
                cursor,
                limit: 1000,
            })
            .expect("list after shutdown");
        assert!(
            page.unreadable.is_empty(),
            "unreadable threads: {:?}",
            page.unreadable
        );
        for s in &page.threads {
            let report = store.verify(&s.thread_id).expect("verify");
            assert!(
                report.ok(),
                "thread {} does not verify: {report:?}",
                s.thread_id
            );
            let mut events = Vec::new();
            let mut after = 0;
            loop {
                let p = store.read(&s.thread_id, after, 1000).expect("read");
                for e in &p.events {
                    after = e.seq;
                    events.push(e.to_json());
                }
                if !p.has_more {
                    break;
                }
            }
            events_by_thread.insert(s.thread_id.clone(), events);
        }
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    let mut session_grant = false;
    for events in events_by_thread.values() {
        for e in events {
            let p = &e["payload"];
            if p["type"] == "approvalResolved" && p["decision"]["kind"] == "acceptForSession" {
                session_grant = true;
            }
        }
    }
    for (thread, events) in &events_by_thread {
        let mut started: HashMap<&str, u32> = HashMap::new();
        let mut completed: HashMap<&str, u32> = HashMap::new();
        let mut approved_items: Vec<(&str, &str)> = Vec::new();
        let mut turn_grants: Vec<&str> = Vec::new();
        for e in events {
            let p = &e["payload"];
            let turn = p["turnId"].as_str().unwrap_or("");
            match p["type"].as_str().unwrap_or("") {
                "turnStarted" => *started.entry(turn).or_default() += 1,
                "turnCompleted" => *completed.entry(turn).or_default() += 1,
                "approvalResolved" if p["outcome"] == "approved" => {
                    approved_items.push((turn, p["itemId"].as_str().unwrap_or("")));
                    if p["decision"]["kind"] == "acceptForTurn" {
                        turn_grants.push(turn);
                    }
                }
                "toolResult" if p["result"]["status"] == "ok" => {
                    let item = p["itemId"].as_str().unwrap_or("");
                    assert!(
                        approved_items.contains(&(turn, item))
                            || turn_grants.contains(&turn)
                            || session_grant,
                        "thread {thread}: tool of item {item} ran without an approval: {e}"
                    );
                }
                _ => {}
            }
        }
        for (turn, n) in &started {
            assert_eq!(*n, 1, "thread {thread}: turn {turn} started {n} times");
            assert_eq!(
                completed.get(turn).copied().unwrap_or(0),
                1,
                "thread {thread}: turn {turn} has no single terminal event"
            );
        }
        for turn in completed.keys() {
            assert!(
                started.contains_key(turn),
                "thread {thread}: turn {turn} completed without starting"
            );
        }
    }
    for peer in peers {
        for (thread, seq, method) in &peer.notified {
            let events = events_by_thread.get(thread).unwrap_or_else(|| {
                panic!("{method} names thread {thread}, which is not in the rollout")
            });
            let e = events
                .iter()
                .find(|e| e["seq"].as_u64() == Some(*seq))
                .unwrap_or_else(|| {
                    panic!("{method} names seq {seq} of {thread}, which is not in the rollout")
                });
            if let Some(kind) = event_type_of(method) {
                assert_eq!(
                    e["payload"]["type"], kind,
                    "{method} at {thread}#{seq} announces another event: {e}"
                );
            }
        }
    }
}
