//! `cc-app-server agent --input-format stream-json --output-format stream-json`: the lightweight
//! entry the platform's `AgentSession` drives. Each user message read from stdin runs as a turn on
//! the same engine `serve` runs (in-process, through the Rust client), with the real JSONL rollout
//! store and the real approval gate; stdout carries the platform's canonical stream events, one
//! NDJSON line each. What is emitted, when, and what is not (and why): docs/agent-stream.md.
//!
//! Shape: one thread reads stdin, one moves the engine's notifications, the client's approval
//! worker asks through a channel; this (main) thread owns the session and is the only writer of
//! stdout, so events leave in one order: `tool_use`, `approval_request`, `approval_resolved`,
//! `tool_result`, … `result`.

use crate::render::item_body;
use crate::{KernelArg, ModelArgs, ServeArgs, ToolsArg};
use cc_app_server::approval::{digest_json, new_nonce, ApprovalPolicy};
use cc_app_server::client::{ApprovalHandler, Client, ClientConfig, ClientError};
use cc_app_server::engine::{AppServer, RecvError};
use cc_app_server::protocol::ApprovalDecision;
use clap::{Args, ValueEnum};
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{BufRead, Read, Write};
use std::path::PathBuf;
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The params type the client's `ApprovalHandler` is handed (the published `ApprovalRequest`).
/// Named once, here: the handler reads the params as JSON.
type DecideParams = cc_app_server::protocol::ApprovalRequest;

/// Exit codes: 0 stdin ended and every turn finished; 1 the session could not start or the engine
/// went away; 2 usage (the parser's); 3 stdout was closed under us.
const STARTUP_FAILED: u8 = 1;
const ENGINE_FAILED: u8 = 1;
const OUTPUT_CLOSED: u8 = 3;

/// The longest input line read (a longer one is reported and skipped).
const MAX_INPUT_LINE: usize = 8 << 20;
/// Inputs waiting behind the running turn; one more is refused with a `result` error.
const MAX_QUEUED: usize = 256;
/// How long an approval waits for the engine's approval/requested before it is asked anyway.
const ANNOUNCE_WAIT: Duration = Duration::from_secs(1);
/// The stream protocol this command speaks, and the additive fields it can stamp.
const STREAM_PROTOCOL_VERSION: u64 = 1;
const STREAM_FEATURES: [&str; 4] = [
    "event_seq",
    "tool_use_id",
    "permission_decision",
    "trace_id",
];
/// File-editing tools that `--permission-mode acceptEdits` approves without asking.
const EDIT_TOOLS: [&str; 4] = ["write_file", "fs.write", "edit_file", "apply_patch"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamFormat {
    StreamJson,
}

fn stream_format(text: &str) -> Result<StreamFormat, String> {
    match text {
        "stream-json" => Ok(StreamFormat::StreamJson),
        other => Err(format!(
            "{other:?} is not supported: this command speaks only stream-json (NDJSON, one event \
             per line); for JSON-RPC use `cc-app-server serve`"
        )),
    }
}

/// How tool approvals are decided (the platform's permission modes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PermissionMode {
    /// Ask the host (approval_request) with --interactive-approvals; otherwise fail closed.
    Default,
    /// Plan only: the approval gate runs no tool (the engine's deny-all policy).
    Plan,
    /// Approve file-editing tools (write_file, fs.write, edit_file, apply_patch) without asking;
    /// everything else as default.
    #[value(name = "acceptEdits")]
    AcceptEdits,
    /// Run every tool without asking (the engine's auto-approve policy; trusted hosts only).
    #[value(name = "bypassPermissions")]
    BypassPermissions,
    /// Accepted; this engine has no automatic classifier, so it behaves as default.
    Auto,
}

impl PermissionMode {
    fn name(self) -> &'static str {
        match self {
            PermissionMode::Default => "default",
            PermissionMode::Plan => "plan",
            PermissionMode::AcceptEdits => "acceptEdits",
            PermissionMode::BypassPermissions => "bypassPermissions",
            PermissionMode::Auto => "auto",
        }
    }
}

#[derive(Args, Debug)]
pub struct AgentArgs {
    /// What stdin carries: stream-json (NDJSON input messages), the only format.
    #[arg(long, value_name = "FORMAT", default_value = "stream-json", value_parser = stream_format)]
    pub input_format: StreamFormat,
    /// What stdout carries: stream-json (the canonical stream events), the only format.
    #[arg(long, value_name = "FORMAT", default_value = "stream-json", value_parser = stream_format)]
    pub output_format: StreamFormat,
    /// Stream the answer as it is produced (stream_event text/thinking deltas); without it the
    /// text arrives whole in each turn's result.
    #[arg(long)]
    pub include_partial_messages: bool,
    /// Ask the host about each tool (approval_request, answered by an approval input); without
    /// it nobody is there to answer, so approvals fail closed (declined) at once.
    #[arg(long)]
    pub interactive_approvals: bool,
    /// Echo each accepted user message as a `user` event.
    #[arg(long)]
    pub replay_user_messages: bool,
    /// Continue this session (thread) from its rollout.
    #[arg(long, value_name = "ID")]
    pub resume: Option<String>,
    /// The id of a new session (resumed instead if a thread of that id already exists).
    #[arg(long, value_name = "ID", conflicts_with = "resume")]
    pub session: Option<String>,
    /// With --resume (or --session of an existing thread): continue in a fork of it, a new
    /// session whose history is the original's.
    #[arg(long)]
    pub fork_session: bool,
    /// How tool approvals are decided.
    #[arg(long, value_enum, value_name = "MODE", default_value = "default")]
    pub permission_mode: PermissionMode,
    /// Accepted and reported as requested_provider in system/init; the kernel is chosen with
    /// --kernel (or CC_APP_SERVER_KERNEL).
    #[arg(long, value_name = "NAME")]
    pub provider: Option<String>,
    /// The run's trace id stamped on every line [default: CC_TRACE_ID, else a fresh one].
    #[arg(long, value_name = "ID")]
    pub trace_id: Option<String>,
    /// State directory for the JSONL rollouts [default: $XDG_STATE_HOME/cc-app-server, else
    /// ~/.local/state/cc-app-server] (created 0700).
    #[arg(long, visible_alias = "app-server-state-dir", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// The agent kernel that runs turns [default: CC_APP_SERVER_KERNEL, else scripted].
    #[arg(long, value_enum, default_value = "scripted")]
    pub kernel: KernelArg,
    #[command(flatten)]
    pub model: ModelArgs,
    /// The tool executor [default: workspace with --kernel openai, echo with scripted].
    #[arg(long, value_enum)]
    pub tools: Option<ToolsArg>,
    /// Script for the scripted kernel (JSON: {"steps": [...]}) [default: CC_APP_SERVER_SCRIPT].
    #[arg(long, value_name = "FILE")]
    pub script: Option<PathBuf>,
    /// The workspace approvals are bound to and workspace tools act in [default: the current
    /// directory].
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// How long an approval waits for the host's answer before it fails closed (declined)
    /// [default: CC_APPROVAL_TIMEOUT_MS, else 120000].
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..=86_400_000))]
    pub approval_timeout_ms: Option<u64>,
}

// ---------------------------------------------------------------------------------------------
// Reading the engine's messages.

/// Why a turn failed or was interrupted: beside the published Turn (`params.error`).
fn turn_error(params: &Value) -> Option<&Value> {
    params.get("error").filter(|e| e.is_object())
}

/// A decision's name (`acceptOnce`, `decline`, …): the published tag `kind`.
fn decision_kind(decision: &Value) -> Option<&str> {
    decision.get("kind").and_then(Value::as_str)
}

/// The typed decision for `kind` (and a decline's or cancel's reason), built through serde so it
/// follows the generated tagging; `None` when it cannot be built (the handler then errs and the
/// client declines: fail closed).
fn typed_decision(kind: &str, reason: Option<&str>) -> Option<ApprovalDecision> {
    let mut attempts = Vec::new();
    if let Some(r) = reason {
        attempts.push(json!({"kind": kind, "reason": clip(r, 1000)}));
    }
    attempts.push(json!({ "kind": kind }));
    attempts
        .into_iter()
        .find_map(|v| serde_json::from_value::<ApprovalDecision>(v).ok())
}

/// At most `max` characters of `text` (the published limits count characters).
fn clip(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => text[..at].to_string(),
        None => text.to_string(),
    }
}

/// A trace id as the stream allows it: `[A-Za-z0-9._:-]`, 1–128 characters.
fn sanitize_trace_id(text: &str) -> Option<String> {
    let kept: String = text
        .trim()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-'))
        .take(128)
        .collect();
    (!kept.is_empty()).then_some(kept)
}

// ---------------------------------------------------------------------------------------------
// The output stream.

/// The additive fields a `hello` may switch off (all on by default).
#[derive(Debug, Clone, Copy)]
struct Gates {
    seq: bool,
    trace_id: bool,
    tool_use_id: bool,
    permission_decision: bool,
}

/// The only writer of stdout: one event per line, stamped with `seq` and `trace_id`.
struct Out {
    stdout: std::io::Stdout,
    seq: u64,
    trace_id: String,
    gates: Gates,
    closed: bool,
}

impl Out {
    /// Writes one event; false (and nothing more is ever written) once stdout is gone.
    fn emit(&mut self, mut event: Value) -> bool {
        if self.closed {
            return false;
        }
        if let Some(obj) = event.as_object_mut() {
            if !self.gates.tool_use_id
                && matches!(obj["type"].as_str(), Some("tool_use" | "tool_result"))
            {
                obj.remove("id");
            }
            if !self.gates.permission_decision {
                obj.remove("permission_decision");
                obj.remove("permission_decision_id");
            }
            if self.gates.trace_id {
                obj.insert("trace_id".into(), Value::from(self.trace_id.clone()));
            }
            if self.gates.seq {
                self.seq += 1;
                obj.insert("seq".into(), Value::from(self.seq));
            }
        }
        let mut line = event.to_string();
        line.push('\n');
        let mut out = self.stdout.lock();
        if out
            .write_all(line.as_bytes())
            .and_then(|()| out.flush())
            .is_err()
        {
            self.closed = true;
            error!("stdout is closed; ending the session (everything recorded is durable)");
            return false;
        }
        true
    }
}

// ---------------------------------------------------------------------------------------------
// What the session's threads tell the main loop.

enum Msg {
    /// One stdin line (or why it could not be read as text).
    Input(Result<String, String>),
    InputEof,
    /// One engine notification.
    Note(Value),
    EngineClosed,
    /// The client's approval worker asks; the answer (or `None`: decline) goes back on `reply`.
    Ask {
        params: Value,
        reply: SyncSender<Option<ApprovalDecision>>,
    },
    /// A helper request finished (thread/compact, turn/interrupt).
    Done(Job, Result<Value, ClientError>),
}

enum Job {
    Compact { slash: Option<(String, String)> },
    Interrupt,
}

/// Routes approval/decide to the main loop and waits for its verdict; anything but a verdict in
/// time errs, and the client then declines.
struct StreamApprover {
    tx: SyncSender<Msg>,
    backstop: Duration,
}

impl ApprovalHandler for StreamApprover {
    fn decide(&self, params: &DecideParams) -> Result<ApprovalDecision, String> {
        let params = serde_json::to_value(params).map_err(|e| e.to_string())?;
        let (reply, answer) = sync_channel(1);
        self.tx
            .send(Msg::Ask { params, reply })
            .map_err(|_| "the session is gone".to_string())?;
        match answer.recv_timeout(self.backstop) {
            Ok(Some(decision)) => Ok(decision),
            Ok(None) => Err("declined (fail closed)".into()),
            Err(_) => Err("no verdict in time".into()),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Session state.

/// One input that needs the thread to itself, in arrival order.
enum Work {
    Turn(String),
    Compact {
        summary: Option<String>,
        slash: Option<(String, String)>,
    },
}

/// An approval the engine is waiting on.
struct Approval {
    id: String,
    nonce: String,
    binding: String,
    tool: String,
    reply: SyncSender<Option<ApprovalDecision>>,
    deadline: Instant,
    /// Asked on the stream (else waiting for the engine's approval/requested).
    asked: bool,
    announce_by: Instant,
    event: Value,
}

/// How an approval was settled on our side, for approval_resolved and the tool's result.
#[derive(Clone)]
struct Settled {
    via: &'static str,
    kind: String,
    reason: Option<String>,
}

/// The running turn.
struct TurnRun {
    id: String,
    number: u64,
    started: Instant,
    tool_calls: u64,
    denials: Vec<Value>,
    last_text: Option<String>,
    /// Text already streamed per item id, and which items are reasoning.
    streamed: HashMap<String, String>,
    reasoning: HashSet<String>,
    /// Tool items whose tool_use went out: item id → tool name; and those already settled.
    tools: HashMap<String, String>,
    tool_done: HashSet<String>,
    usage: Option<(u64, u64)>,
}

enum Running {
    Turn(Box<TurnRun>),
    Compact,
}

struct Session {
    args: AgentArgs,
    out: Out,
    client: Arc<Client>,
    tx: SyncSender<Msg>,
    thread: String,
    queue: VecDeque<Work>,
    running: Option<Running>,
    turns: u64,
    eof: bool,
    approval_timeout: Duration,
    approvals: Vec<Approval>,
    /// Nonces whose approval/requested the engine has announced.
    announced: HashSet<String>,
    /// Settlements by nonce (for approval_resolved) and by item id (for tool_result).
    settled: HashMap<String, Settled>,
    decisions: HashMap<String, Value>,
    /// Approval ids we settled ourselves (a late answer to one is ignored quietly).
    closed_ids: HashSet<String>,
    max_steps: u32,
}

pub fn run(mut args: AgentArgs, kernel_given: bool) -> u8 {
    let trace_id = args
        .trace_id
        .as_deref()
        .and_then(sanitize_trace_id)
        .or_else(|| {
            std::env::var("CC_TRACE_ID")
                .ok()
                .as_deref()
                .and_then(sanitize_trace_id)
        })
        .unwrap_or_else(|| format!("tr-{}", new_nonce()));
    let mut out = Out {
        stdout: std::io::stdout(),
        seq: 0,
        trace_id,
        gates: Gates {
            seq: true,
            trace_id: true,
            tool_use_id: true,
            permission_decision: true,
        },
        closed: false,
    };
    let startup_failed = |out: &mut Out, message: String| {
        error!("{message}");
        out.emit(json!({"type": "session_error", "error": "startup_failed", "message": clip(&message, 4096)}));
        STARTUP_FAILED
    };
    if !kernel_given {
        match crate::kernel_from_env() {
            Ok(Some(k)) => args.kernel = k,
            Ok(None) => {}
            Err(e) => return startup_failed(&mut out, e),
        }
    }
    if args.script.is_none() {
        args.script = crate::script_from_env();
    }
    let approval_timeout = Duration::from_millis(
        args.approval_timeout_ms
            .or_else(|| {
                std::env::var("CC_APPROVAL_TIMEOUT_MS")
                    .ok()
                    .and_then(|v| v.trim().parse().ok())
                    .filter(|ms| (1..=86_400_000).contains(ms))
            })
            .unwrap_or(120_000),
    );
    let state_dir = match args
        .state_dir
        .clone()
        .map_or_else(crate::default_state_dir, Ok)
    {
        Ok(d) => d,
        Err(e) => return startup_failed(&mut out, e),
    };
    let mut serve = ServeArgs::defaults(&state_dir);
    serve.kernel = args.kernel;
    serve.model = args.model.clone();
    serve.tools = args.tools;
    serve.script = args.script.clone();
    serve.workspace = args.workspace.clone();
    let mut config = match crate::serve::config(&serve) {
        Ok(c) => c,
        Err(e) => return startup_failed(&mut out, e),
    };
    config.policy = match args.permission_mode {
        PermissionMode::BypassPermissions => ApprovalPolicy::AutoApprove,
        PermissionMode::Plan => ApprovalPolicy::DenyAll,
        _ => ApprovalPolicy::AskEveryTime,
    };
    // Our own deadline declines first; the binding outlives it, so the decline is recorded as
    // a decline rather than as an expiry.
    config.approval_timeout = approval_timeout + Duration::from_secs(5);
    let tools: Vec<String> = config
        .tools
        .tool_specs()
        .into_iter()
        .map(|s| s.name)
        .collect();
    let server = match AppServer::open(config) {
        Ok(s) => s,
        Err(e) => {
            return startup_failed(
                &mut out,
                format!("cannot start on {}: {e}", state_dir.display()),
            )
        }
    };
    let (tx, rx) = sync_channel::<Msg>(1024);
    let handler: Arc<dyn ApprovalHandler> = Arc::new(StreamApprover {
        tx: tx.clone(),
        backstop: approval_timeout + Duration::from_secs(2),
    });
    let client_config = ClientConfig {
        approval_timeout: approval_timeout + Duration::from_secs(3),
        ..ClientConfig::default()
    };
    let client = match Client::connect(&server, Some(handler), client_config) {
        Ok(c) => Arc::new(c),
        Err(e) => {
            server.shutdown();
            return startup_failed(&mut out, format!("the in-process handshake failed: {e}"));
        }
    };
    let max_steps = args.model.max_steps;
    let (thread, resumed) = match open_thread(&args, &client, &server) {
        Ok(t) => t,
        Err(e) => {
            client.close();
            server.shutdown();
            return startup_failed(&mut out, e);
        }
    };
    info!(
        "agent session {thread} on {} (trace {})",
        state_dir.display(),
        out.trace_id
    );
    let (model, provider) = match args.kernel {
        KernelArg::Scripted => ("scripted".to_string(), "scripted"),
        KernelArg::Openai => (
            args.model.model.clone().unwrap_or_else(|| {
                cc_app_server::openai::OpenAiConfig::from_env()
                    .model
                    .clone()
            }),
            "openai-compatible",
        ),
    };
    let mut init = json!({
        "type": "system", "subtype": "init", "protocol_version": STREAM_PROTOCOL_VERSION,
        "session_id": thread, "model": clip(&model, 256), "provider": provider,
        "permission_mode": args.permission_mode.name(), "tools": tools,
        "slash_commands": ["compact"], "input_format": "stream-json",
        "resumed_messages": resumed,
    });
    if let Some(p) = &args.provider {
        init["requested_provider"] = Value::from(clip(p, 128));
    }
    if !out.emit(init) {
        client.close();
        server.shutdown();
        return OUTPUT_CLOSED;
    }
    spawn_stdin_reader(tx.clone());
    spawn_notification_pump(Arc::clone(&client), tx.clone());
    let mut session = Session {
        args,
        out,
        client,
        tx,
        thread,
        queue: VecDeque::new(),
        running: None,
        turns: 0,
        eof: false,
        approval_timeout,
        approvals: Vec::new(),
        announced: HashSet::new(),
        settled: HashMap::new(),
        decisions: HashMap::new(),
        closed_ids: HashSet::new(),
        max_steps,
    };
    let code = session.run(&rx);
    if code == 0 {
        session
            .out
            .emit(json!({"type": "system", "subtype": "end", "turns": session.turns}));
    }
    // Nothing may stay blocked on us: what is still waiting is declined.
    for a in session.approvals.drain(..) {
        let _ = a.reply.try_send(None);
    }
    session.client.close();
    server.shutdown();
    code
}

/// Starts, resumes or forks the session's thread: (thread id, messages it already holds).
fn open_thread(
    args: &AgentArgs,
    client: &Client,
    server: &AppServer,
) -> Result<(String, u64), String> {
    let resume = |id: &str| {
        client
            .request("thread/resume", json!({"threadId": id, "limit": 1}))
            .map_err(|e| format!("cannot resume session {id:?}: {e}"))
    };
    let (id, existing) = match (&args.resume, &args.session) {
        (Some(id), _) => {
            resume(id)?;
            (id.clone(), true)
        }
        (None, Some(id)) => {
            let started = client.request(
                "thread/start",
                json!({"threadId": id, "title": "agent session", "metadata": {"source": "cc-app-server agent"}}),
            );
            match started {
                Ok(_) => (id.clone(), false),
                // An existing thread of that id is resumed; anything else is the start's error.
                Err(start) => match resume(id) {
                    Ok(_) => (id.clone(), true),
                    Err(_) => return Err(format!("cannot start session {id:?}: {start}")),
                },
            }
        }
        (None, None) => {
            let started = client
                .request(
                    "thread/start",
                    json!({"title": "agent session", "metadata": {"source": "cc-app-server agent"}}),
                )
                .map_err(|e| format!("cannot start a session: {e}"))?;
            let id = started["thread"]["id"]
                .as_str()
                .ok_or("thread/start answered without a thread id")?
                .to_string();
            (id, false)
        }
    };
    if args.fork_session {
        if !existing {
            warn!("--fork-session needs an existing session (--resume ID); starting {id} fresh");
        } else {
            let forked = client
                .request("thread/fork", json!({"threadId": id}))
                .map_err(|e| format!("cannot fork session {id:?}: {e}"))?;
            let new_id = forked["thread"]["id"]
                .as_str()
                .ok_or("thread/fork answered without a thread id")?
                .to_string();
            return Ok((new_id.clone(), count_messages(server, &new_id)));
        }
    }
    let resumed = if existing {
        count_messages(server, &id)
    } else {
        0
    };
    Ok((id, resumed))
}

/// User and assistant messages already in a thread's rollout (`resumed_messages`).
fn count_messages(server: &AppServer, thread: &str) -> u64 {
    let (mut after, mut count) = (0, 0);
    loop {
        let Ok(page) = server.store().read(thread, after, 1000) else {
            return count;
        };
        for e in &page.events {
            after = e.seq;
            match e.payload["type"].as_str() {
                Some("turnStarted") => count += 1,
                Some("itemCompleted")
                    if item_body(&e.payload["item"])["type"] == "agentMessage" =>
                {
                    count += 1
                }
                _ => {}
            }
        }
        if !page.has_more || page.events.is_empty() {
            return count;
        }
    }
}

fn spawn_stdin_reader(tx: SyncSender<Msg>) {
    std::thread::Builder::new()
        .name("cc-agent-stdin".into())
        .spawn(move || {
            let stdin = std::io::stdin();
            let mut reader = stdin.lock();
            loop {
                let mut line = Vec::new();
                match reader
                    .by_ref()
                    .take(MAX_INPUT_LINE as u64 + 1)
                    .read_until(b'\n', &mut line)
                {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) => {
                        error!("reading stdin failed: {e}");
                        break;
                    }
                }
                let msg = if line.len() > MAX_INPUT_LINE && line.last() != Some(&b'\n') {
                    // Skip the rest of the over-long line.
                    let mut rest = Vec::new();
                    let _ = reader.read_until(b'\n', &mut rest);
                    Msg::Input(Err(format!(
                        "an input line is longer than {MAX_INPUT_LINE} bytes; it was skipped"
                    )))
                } else {
                    match String::from_utf8(line) {
                        Ok(text) => Msg::Input(Ok(text)),
                        Err(_) => {
                            Msg::Input(Err("an input line is not UTF-8; it was skipped".into()))
                        }
                    }
                };
                if tx.send(msg).is_err() {
                    return;
                }
            }
            let _ = tx.send(Msg::InputEof);
        })
        .expect("the stdin thread starts");
}

fn spawn_notification_pump(client: Arc<Client>, tx: SyncSender<Msg>) {
    std::thread::Builder::new()
        .name("cc-agent-notes".into())
        .spawn(move || loop {
            match client.recv_notification(Duration::from_millis(500)) {
                Ok(n) => {
                    if tx.send(Msg::Note(n)).is_err() {
                        return;
                    }
                }
                Err(RecvError::Timeout) => {}
                Err(RecvError::Closed) => {
                    let _ = tx.send(Msg::EngineClosed);
                    return;
                }
            }
        })
        .expect("the notification thread starts");
}

impl Session {
    fn run(&mut self, rx: &Receiver<Msg>) -> u8 {
        loop {
            if self.out.closed {
                return OUTPUT_CLOSED;
            }
            self.start_next();
            if self.eof && self.running.is_none() && self.queue.is_empty() {
                return 0;
            }
            let now = Instant::now();
            let wait = self
                .approvals
                .iter()
                .map(|a| if a.asked { a.deadline } else { a.announce_by })
                .min()
                .map(|d| d.saturating_duration_since(now))
                .unwrap_or(Duration::from_millis(500))
                .min(Duration::from_millis(500));
            match rx.recv_timeout(wait) {
                Ok(Msg::Input(Ok(line))) => self.input(&line),
                Ok(Msg::Input(Err(why))) => {
                    self.session_error("invalid_input", &why);
                }
                Ok(Msg::InputEof) => self.input_ended(),
                Ok(Msg::Note(n)) => self.note(&n),
                Ok(Msg::EngineClosed) => {
                    if self.eof && self.running.is_none() && self.queue.is_empty() {
                        return 0;
                    }
                    self.session_error(
                        "engine_closed",
                        "the engine closed the session's connection",
                    );
                    return ENGINE_FAILED;
                }
                Ok(Msg::Ask { params, reply }) => self.ask(params, reply),
                Ok(Msg::Done(job, result)) => self.done(job, result),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return ENGINE_FAILED,
            }
            self.approval_deadlines();
        }
    }

    fn session_error(&mut self, code: &str, message: &str) -> bool {
        warn!("{message}");
        self.out
            .emit(json!({"type": "session_error", "error": code, "message": clip(message, 4096)}))
    }

    // --- input --------------------------------------------------------------------------------

    fn input(&mut self, line: &str) {
        let line = line.trim();
        if line.is_empty() {
            return;
        }
        let v: Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(e) => {
                self.session_error(
                    "invalid_input",
                    &format!("an input line is not JSON ({e}); it was skipped"),
                );
                return;
            }
        };
        match v.get("type").and_then(Value::as_str) {
            Some("user") => self.user(&v),
            Some("approval") => self.approval_answer(&v),
            Some("interrupt") => self.interrupt(),
            Some("compact") => {
                let summary = v.get("summary").and_then(Value::as_str).map(str::to_string);
                self.enqueue(Work::Compact {
                    summary,
                    slash: None,
                });
            }
            Some("slash_command") => self.slash(&v),
            Some("answer") => {
                let id = v
                    .get("id")
                    .and_then(Value::as_str)
                    .filter(|id| !id.is_empty());
                match id {
                    Some(id) => {
                        self.out.emit(
                            json!({"type": "question_response_rejected", "id": clip(id, 160),
                            "reason": "no question is open: this engine never asks questions",
                            "session_id": self.thread}),
                        );
                    }
                    None => {
                        self.session_error(
                            "invalid_input",
                            "an answer input has no id; it was skipped",
                        );
                    }
                }
            }
            Some("hello") => self.hello(&v),
            Some(other @ ("plan" | "feedback" | "resume")) => {
                let msg =
                    format!("{other} inputs are not supported by this engine; it was ignored");
                self.session_error("unsupported_input", &msg);
            }
            Some(other) => {
                let msg = format!("unknown input type {:?}; it was ignored", clip(other, 64));
                self.session_error("unknown_input", &msg);
            }
            None => {
                self.session_error(
                    "invalid_input",
                    "an input has no string \"type\"; it was ignored",
                );
            }
        }
    }

    fn user(&mut self, v: &Value) {
        if v.get("images")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty())
        {
            self.out.emit(
                json!({"type": "result", "subtype": "error", "is_error": true,
                "error": "images are not supported by this engine; the message was not run",
                "session_id": self.thread}),
            );
            return;
        }
        if v.get("llm").is_some() {
            warn!("a user message's llm override is not supported; the session's kernel runs it");
        }
        let text = match (v.get("text"), v.get("message")) {
            (Some(Value::String(t)), _) => Some(t.clone()),
            (_, Some(m)) => match &m["content"] {
                Value::String(t) => Some(t.clone()),
                Value::Array(blocks) => Some(
                    blocks
                        .iter()
                        .filter(|b| b["type"] == "text")
                        .filter_map(|b| b["text"].as_str())
                        .collect::<Vec<_>>()
                        .join("\n"),
                ),
                _ => None,
            },
            _ => None,
        };
        match text {
            Some(t) => self.enqueue(Work::Turn(t)),
            None => {
                self.out.emit(
                    json!({"type": "result", "subtype": "error", "is_error": true,
                    "error": "the user message has no text", "session_id": self.thread}),
                );
            }
        }
    }

    fn enqueue(&mut self, work: Work) {
        if self.queue.len() >= MAX_QUEUED {
            let msg = format!("{MAX_QUEUED} inputs are already waiting; this one was refused");
            match work {
                Work::Turn(_) => {
                    self.out.emit(
                        json!({"type": "result", "subtype": "error", "is_error": true,
                        "error": msg, "session_id": self.thread}),
                    );
                }
                Work::Compact { .. } => {
                    self.out.emit(
                        json!({"type": "compaction-degraded", "reason": msg, "code": "queueFull"}),
                    );
                }
            }
            return;
        }
        self.queue.push_back(work);
    }

    fn slash(&mut self, v: &Value) {
        let request_id = v
            .get("request_id")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty());
        let command = v
            .get("command")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty());
        let (Some(request_id), Some(command)) = (request_id, command) else {
            self.session_error(
                "invalid_input",
                "a slash_command needs a request_id and a command",
            );
            return;
        };
        let (request_id, command) = (clip(request_id, 160), clip(command, 128));
        let name = command.trim_start_matches('/');
        if name == "compact" {
            let summary = v
                .get("args")
                .and_then(Value::as_str)
                .map(str::trim)
                .filter(|a| !a.is_empty())
                .map(str::to_string);
            self.enqueue(Work::Compact {
                summary,
                slash: Some((request_id, command)),
            });
        } else {
            self.out.emit(json!({"type": "slash_command_result", "request_id": request_id,
                "command": command, "ok": false, "session_id": self.thread,
                "error": {"code": "unknown_command",
                    "message": format!("/{name} is not a command of this engine; it knows /compact")}}));
        }
    }

    /// Capability negotiation (`hello`): the common protocol version and the additive fields the
    /// client accepts, answered once with system/negotiated and honoured from then on.
    fn hello(&mut self, v: &Value) {
        let client_max = v
            .get("protocol_version")
            .and_then(Value::as_u64)
            .unwrap_or(STREAM_PROTOCOL_VERSION);
        let client_min = v
            .get("min_protocol_version")
            .and_then(Value::as_u64)
            .unwrap_or(client_max);
        let agreed = client_max.min(STREAM_PROTOCOL_VERSION);
        if agreed < client_min.max(1) || agreed == 0 {
            self.out.emit(json!({"type": "system", "subtype": "negotiated", "session_id": self.thread,
                "protocol_version": null, "features": STREAM_FEATURES, "downgraded": false,
                "disabled_features": [], "ok": false,
                "reason": format!("no common protocol version: this server speaks {STREAM_PROTOCOL_VERSION}")}));
            return;
        }
        let accepted: Vec<&str> = match v.get("features").and_then(Value::as_array) {
            Some(list) => STREAM_FEATURES
                .into_iter()
                .filter(|f| list.iter().any(|x| x == f))
                .collect(),
            None => STREAM_FEATURES.to_vec(),
        };
        let disabled: Vec<&str> = STREAM_FEATURES
            .into_iter()
            .filter(|f| !accepted.contains(f))
            .collect();
        self.out.gates = Gates {
            seq: accepted.contains(&"event_seq"),
            trace_id: accepted.contains(&"trace_id"),
            tool_use_id: accepted.contains(&"tool_use_id"),
            permission_decision: accepted.contains(&"permission_decision"),
        };
        self.out.emit(
            json!({"type": "system", "subtype": "negotiated", "session_id": self.thread,
            "protocol_version": agreed, "features": accepted, "downgraded": !disabled.is_empty(),
            "disabled_features": disabled, "ok": true}),
        );
    }

    fn input_ended(&mut self) {
        self.eof = true;
        info!("stdin closed; finishing the queued inputs");
        // Nobody can answer any more: what waits is declined now, and so is what comes.
        let ids: Vec<String> = self.approvals.iter().map(|a| a.id.clone()).collect();
        for id in ids {
            self.settle(
                &id,
                "decline",
                Some("stdin closed: nobody can answer"),
                "stdin_closed",
            );
        }
    }

    fn interrupt(&mut self) {
        let Some(Running::Turn(turn)) = &self.running else {
            info!("interrupt with no turn running: nothing to do");
            return;
        };
        let turn_id = turn.id.clone();
        // A turn waiting for an approval is cancelled there (the engine then interrupts it).
        let ids: Vec<String> = self.approvals.iter().map(|a| a.id.clone()).collect();
        for id in ids {
            self.settle(&id, "cancel", None, "interrupt");
        }
        let (client, tx, thread) = (
            Arc::clone(&self.client),
            self.tx.clone(),
            self.thread.clone(),
        );
        std::thread::spawn(move || {
            let r = client.request(
                "turn/interrupt",
                json!({"threadId": thread, "turnId": turn_id}),
            );
            let _ = tx.send(Msg::Done(Job::Interrupt, r));
        });
    }

    // --- work ---------------------------------------------------------------------------------

    fn start_next(&mut self) {
        while self.running.is_none() && !self.out.closed {
            let Some(work) = self.queue.pop_front() else {
                return;
            };
            match work {
                Work::Turn(text) => self.start_turn(text),
                Work::Compact { summary, slash } => {
                    let mut params = json!({"threadId": self.thread});
                    if let Some(s) = summary {
                        params["summary"] = Value::from(s);
                    }
                    let (client, tx) = (Arc::clone(&self.client), self.tx.clone());
                    self.running = Some(Running::Compact);
                    std::thread::spawn(move || {
                        let r = client.request("thread/compact", params);
                        let _ = tx.send(Msg::Done(Job::Compact { slash }, r));
                    });
                }
            }
        }
    }

    fn start_turn(&mut self, text: String) {
        let started = self.client.request(
            "turn/start",
            json!({"threadId": self.thread, "input": [{"type": "text", "text": text}]}),
        );
        let id = match started {
            Ok(r) => r["turn"]["id"].as_str().unwrap_or_default().to_string(),
            Err(e) => {
                self.out.emit(json!({"type": "result", "subtype": "error", "is_error": true,
                    "error": clip(&format!("the turn could not start: {e}"), 4096), "session_id": self.thread}));
                return;
            }
        };
        self.turns += 1;
        if self.args.replay_user_messages {
            self.out.emit(
                json!({"type": "user", "session_id": self.thread, "turn_id": id,
                "message": {"role": "user", "content": [{"type": "text", "text": text}]}}),
            );
        }
        self.running = Some(Running::Turn(Box::new(TurnRun {
            id,
            number: self.turns,
            started: Instant::now(),
            tool_calls: 0,
            denials: Vec::new(),
            last_text: None,
            streamed: HashMap::new(),
            reasoning: HashSet::new(),
            tools: HashMap::new(),
            tool_done: HashSet::new(),
            usage: None,
        })));
    }

    fn done(&mut self, job: Job, result: Result<Value, ClientError>) {
        match job {
            Job::Interrupt => {
                if let Err(e) = result {
                    info!("turn/interrupt: {e}");
                }
            }
            Job::Compact { slash } => {
                self.running = None;
                match &result {
                    Ok(r) => {
                        let summary = r["summary"].as_str().unwrap_or_default();
                        self.out.emit(json!({"type": "compaction", "stats": {
                            "from_seq": r["fromSeq"], "to_seq": r["toSeq"], "event_seq": r["eventSeq"],
                            "summary_chars": summary.chars().count()}}));
                    }
                    Err(e) => {
                        let code = match e {
                            ClientError::Protocol { code, .. } => code.to_string(),
                            other => other.code().to_string(),
                        };
                        self.out.emit(json!({"type": "compaction-degraded",
                            "reason": clip(&format!("the thread was not compacted: {e}"), 1024), "code": code}));
                    }
                }
                if let Some((request_id, command)) = slash {
                    let mut event = json!({"type": "slash_command_result", "request_id": request_id,
                        "command": command, "ok": result.is_ok(), "session_id": self.thread});
                    match &result {
                        Ok(r) => {
                            event["text"] = Value::from(r["summary"].as_str().unwrap_or_default())
                        }
                        Err(e) => {
                            event["error"] =
                                json!({"code": "compact_failed", "message": e.to_string()})
                        }
                    }
                    self.out.emit(event);
                }
            }
        }
    }

    // --- engine notifications -----------------------------------------------------------------

    fn note(&mut self, n: &Value) {
        let p = &n["params"];
        let method = n["method"].as_str().unwrap_or_default();
        if method == "approval/requested" {
            let nonce = p["binding"]["nonce"]
                .as_str()
                .or_else(|| p["request"]["binding"]["nonce"].as_str());
            if let Some(nonce) = nonce {
                self.announced.insert(nonce.to_string());
                self.flush_asks();
            }
            return;
        }
        let Some(Running::Turn(turn)) = &mut self.running else {
            return;
        };
        let turn_id = p["turnId"].as_str().or_else(|| p["turn"]["id"].as_str());
        if turn_id != Some(turn.id.as_str()) {
            return;
        }
        match method {
            "item/started" => {
                let body = item_body(&p["item"]);
                if body["type"] == "reasoning" {
                    if let Some(id) = body["id"].as_str() {
                        turn.reasoning.insert(id.to_string());
                    }
                }
            }
            "item/delta" => {
                let item = p["itemId"].as_str().unwrap_or_default().to_string();
                if let Some(text) = p["delta"]["text"]
                    .as_str()
                    .filter(|_| p["delta"]["type"] == "text")
                {
                    let thinking = turn.reasoning.contains(&item);
                    turn.streamed.entry(item).or_default().push_str(text);
                    if self.args.include_partial_messages && !text.is_empty() {
                        let event = delta_event(thinking, text);
                        self.out.emit(event);
                    }
                }
            }
            "item/completed" => self.item_completed(item_body(&p["item"]).clone()),
            "tool/requested" => {
                let item = p["itemId"].as_str().unwrap_or_default().to_string();
                let tool = p["call"]["tool"].as_str().unwrap_or("unknown").to_string();
                let args = p["call"]["arguments"].clone();
                self.tool_use(&item, &tool, args);
            }
            "tool/result" => {
                let item = p["itemId"].as_str().unwrap_or_default().to_string();
                self.tool_result(&item, &p["result"], None);
            }
            "approval/resolved" => self.approval_resolved(p),
            "turn/completed" => self.turn_completed(p),
            _ => {}
        }
    }

    fn turn(&mut self) -> Option<&mut TurnRun> {
        match &mut self.running {
            Some(Running::Turn(t)) => Some(t),
            _ => None,
        }
    }

    fn item_completed(&mut self, body: Value) {
        let partial = self.args.include_partial_messages;
        let Some(turn) = self.turn() else { return };
        let id = body["id"].as_str().unwrap_or_default().to_string();
        let mut events = Vec::new();
        if let Some(usage) = body.get("usage").filter(|u| u.is_object()) {
            let (i, o) = (
                usage["promptTokens"].as_u64().unwrap_or(0),
                usage["completionTokens"].as_u64().unwrap_or(0),
            );
            let (ti, to) = turn.usage.unwrap_or((0, 0));
            turn.usage = Some((ti + i, to + o));
            events.push(
                json!({"type": "token_usage", "usage": {"input_tokens": i, "output_tokens": o}}),
            );
        }
        match body["type"].as_str().unwrap_or_default() {
            kind @ ("agentMessage" | "reasoning") => {
                let text = body["text"].as_str().unwrap_or_default();
                let streamed = turn.streamed.remove(&id).unwrap_or_default();
                if partial {
                    // What the kernel did not stream is sent now, so the deltas add up to the item.
                    if let Some(rest) = text
                        .strip_prefix(streamed.as_str())
                        .filter(|r| !r.is_empty())
                    {
                        events.insert(0, delta_event(kind == "reasoning", rest));
                    }
                }
                if kind == "agentMessage" {
                    turn.last_text = Some(text.to_string());
                }
            }
            "toolCall" | "commandExecution" | "fileChange" if !turn.tool_done.contains(&id) => {
                let tool = turn
                    .tools
                    .get(&id)
                    .cloned()
                    .or_else(|| body["call"]["tool"].as_str().map(str::to_string));
                self.emit_all(events);
                let tool = tool.unwrap_or_else(|| match body["type"].as_str() {
                    Some("commandExecution") => "run_command".into(),
                    Some("fileChange") => "write_file".into(),
                    _ => "unknown".into(),
                });
                if self.turn().is_some_and(|t| !t.tools.contains_key(&id)) {
                    self.tool_use(&id, &tool, body["call"]["arguments"].clone());
                }
                let result = body.get("result").filter(|r| r.is_object()).cloned();
                self.tool_result(&id, result.as_ref().unwrap_or(&Value::Null), Some(&body));
                return;
            }
            "error" => {
                let message = body["message"].as_str().unwrap_or_default();
                match body.get("retry").filter(|r| r.is_object()) {
                    Some(retry) => events.push(json!({"type": "stream_retry",
                        "attempt": retry["attempt"].as_u64().unwrap_or(0), "message": clip(message, 4096)})),
                    None => events.push(json!({"type": "raw", "subtype": "error_item", "text": message})),
                }
            }
            "plan" => {
                let items: Vec<Value> = body["steps"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .enumerate()
                    .map(|(i, s)| {
                        json!({"id": format!("{id}-{}", i + 1), "title": s["text"],
                            "status": s["status"]})
                    })
                    .collect();
                events.push(json!({"type": "plan_update", "active": true,
                    "plan_id": clip(&id, 160), "items": items}));
            }
            _ => {}
        }
        self.emit_all(events);
    }

    fn emit_all(&mut self, events: Vec<Value>) {
        for e in events {
            self.out.emit(e);
        }
    }

    fn tool_use(&mut self, item: &str, tool: &str, args: Value) {
        let Some(turn) = self.turn() else { return };
        if turn.tools.contains_key(item) {
            return;
        }
        turn.tools.insert(item.to_string(), tool.to_string());
        turn.tool_calls += 1;
        let number = turn.number;
        let tool = if tool.is_empty() { "unknown" } else { tool };
        self.out.emit(
            json!({"type": "tool_use", "id": clip(item, 160), "tool": clip(tool, 256),
            "args": args, "turn": number}),
        );
    }

    /// The tool's result, from tool/result (`result`) or, when none came, from its completed item.
    fn tool_result(&mut self, item: &str, result: &Value, body: Option<&Value>) {
        let settled = self.settled.get(item).cloned();
        let decision = self.decisions.get(item).cloned();
        let Some(turn) = self.turn() else { return };
        if !turn.tools.contains_key(item) || !turn.tool_done.insert(item.to_string()) {
            return;
        }
        let tool = turn.tools[item].clone();
        let (is_error, error, value) = match result["status"].as_str() {
            Some("ok") => (false, Value::Null, result["output"].clone()),
            Some("error") => (
                true,
                Value::from(result["message"].as_str().unwrap_or("the tool failed")),
                Value::Null,
            ),
            Some("denied") => {
                let reason = result["reason"]
                    .as_str()
                    .unwrap_or("the approval gate declined it");
                turn.denials
                    .push(json!({"tool": tool, "tool_use_id": item, "reason": reason}));
                (
                    true,
                    Value::from(format!("declined: {reason}")),
                    Value::Null,
                )
            }
            _ => {
                // No tool result: judge by the item's own status.
                let status = body.and_then(|b| b["status"].as_str()).unwrap_or("failed");
                match status {
                    "completed" => (
                        false,
                        Value::Null,
                        body.map_or(Value::Null, |b| {
                            json!({"exitCode": b.get("exitCode"), "output": b.get("output"),
                            "changes": b.get("changes")})
                        }),
                    ),
                    "declined" => {
                        turn.denials
                            .push(json!({"tool": tool, "tool_use_id": item}));
                        (true, Value::from("declined"), Value::Null)
                    }
                    other => (
                        true,
                        Value::from(format!("the tool did not complete ({other})")),
                        Value::Null,
                    ),
                }
            }
        };
        let number = turn.number;
        let mut event = json!({"type": "tool_result", "id": clip(item, 160), "tool": clip(&tool, 256),
            "is_error": is_error, "error": error, "result": value, "turn": number});
        if let Some((s, d)) = settled.zip(decision) {
            event["permission_decision_id"] = d["id"].clone();
            event["permission_decision"] =
                json!({"approved": d["approved"], "via": s.via, "kind": s.kind});
        }
        self.out.emit(event);
    }

    fn approval_resolved(&mut self, p: &Value) {
        let Some(nonce) = p["nonce"].as_str() else {
            return;
        };
        let id = format!("approval-{nonce}");
        let outcome = p["outcome"].as_str().unwrap_or_default();
        let approved = outcome == "approved";
        let mine = self.settled.get(nonce).cloned();
        let via = match (&mine, outcome) {
            (Some(s), _) => s.via,
            (None, "failedClosed") => "fail_closed",
            (None, _) => "engine",
        };
        let mut event = json!({"type": "approval_resolved", "id": id, "approved": approved,
            "via": via, "session_id": self.thread, "outcome": outcome});
        let kind = p
            .get("decision")
            .and_then(decision_kind)
            .map(str::to_string)
            .or_else(|| mine.as_ref().map(|s| s.kind.clone()));
        if let Some(kind) = kind.clone().filter(|k| {
            matches!(
                k.as_str(),
                "acceptOnce" | "acceptForTurn" | "acceptForSession" | "decline" | "cancel"
            )
        }) {
            let mut decision = json!({"kind": kind});
            if matches!(kind.as_str(), "decline" | "cancel") {
                let reason = p["decision"]["reason"]
                    .as_str()
                    .map(str::to_string)
                    .or_else(|| mine.as_ref().and_then(|s| s.reason.clone()));
                if let Some(r) = reason {
                    decision["reason"] = Value::from(clip(&r, 2048));
                }
            }
            event["decision"] = decision;
        }
        if let Some(item) = p["itemId"].as_str() {
            let settled = mine.unwrap_or(Settled {
                via,
                kind: kind.unwrap_or_else(|| outcome.to_string()),
                reason: None,
            });
            self.settled.insert(item.to_string(), settled);
            self.decisions
                .insert(item.to_string(), json!({"id": id, "approved": approved}));
        }
        self.out.emit(event);
    }

    fn turn_completed(&mut self, p: &Value) {
        let Some(Running::Turn(turn)) = self.running.take() else {
            return;
        };
        let status = p["turn"]["status"].as_str().unwrap_or("failed").to_string();
        // Tools the turn ended before: settled as not run.
        let open: Vec<String> = turn
            .tools
            .keys()
            .filter(|k| !turn.tool_done.contains(*k))
            .cloned()
            .collect();
        let mut turn = *turn;
        for item in open {
            turn.tool_done.insert(item.clone());
            let tool = turn.tools[&item].clone();
            self.out.emit(json!({"type": "tool_result", "id": clip(&item, 160), "tool": clip(&tool, 256),
                "is_error": true, "error": format!("the turn ended {status} before the tool finished"),
                "result": null, "turn": turn.number}));
        }
        let error = turn_error(p);
        let code = error
            .and_then(|e| e["code"].as_str())
            .unwrap_or_default()
            .to_string();
        let message = error
            .and_then(|e| e["message"].as_str())
            .unwrap_or_default()
            .to_string();
        if code == "maxStepsExceeded" {
            self.out
                .emit(json!({"type": "iteration_budget_exhausted", "budget": self.max_steps}));
        }
        let mut result = json!({
            "type": "result", "session_id": self.thread, "turn": turn.number, "turn_id": turn.id,
            "num_turns": self.turns, "duration_ms": turn.started.elapsed().as_millis() as u64,
            "tool_calls": turn.tool_calls, "denials": turn.denials,
        });
        match status.as_str() {
            "completed" => {
                result["subtype"] = "success".into();
                result["is_error"] = false.into();
            }
            "interrupted" => {
                result["subtype"] = "interrupted".into();
                result["is_error"] = false.into();
                result["interrupted"] = true.into();
            }
            _ => {
                result["subtype"] = "error".into();
                result["is_error"] = true.into();
                let why = match (code.is_empty(), message.is_empty()) {
                    (true, true) => format!("the turn ended {status}"),
                    (true, false) => message.clone(),
                    (false, true) => code.clone(),
                    (false, false) => format!("{message} ({code})"),
                };
                result["error"] = why.into();
                if !code.is_empty() {
                    result["error_code"] = code.into();
                }
            }
        }
        if let Some(text) = turn.last_text {
            result["result"] = text.into();
        }
        if let Some((i, o)) = turn.usage {
            result["usage"] = json!({"input_tokens": i, "output_tokens": o});
        }
        self.out.emit(result);
    }

    // --- approvals ----------------------------------------------------------------------------

    fn ask(&mut self, params: Value, reply: SyncSender<Option<ApprovalDecision>>) {
        let binding = &params["binding"];
        let Some(nonce) = binding["nonce"].as_str().map(str::to_string) else {
            let _ = reply.try_send(None);
            return;
        };
        let id = params["id"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| format!("approval-{nonce}"));
        let tool = params["operation"]["tool"]
            .as_str()
            .unwrap_or("unknown")
            .to_string();
        let item_id = binding["itemId"].clone();
        let binding_digest = digest_json(binding);
        let arguments = &params["operation"]["arguments"];
        let command = match arguments.get("argv").or_else(|| arguments.get("command")) {
            Some(Value::Array(argv)) => argv
                .iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(" "),
            Some(Value::String(c)) => c.clone(),
            _ => arguments.to_string(),
        };
        let reason = params["reason"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| format!("{tool} wants to run"));
        let mut event = json!({"type": "approval_request", "id": clip(&id, 160), "session_id": self.thread,
            "tool": clip(&tool, 256), "command": clip(&command, 4096), "reason": clip(&reason, 4096),
            "binding": binding_digest, "tool_use_id": item_id, "turn_id": binding["turnId"],
            "expires_at": binding["expiresAt"]});
        if let Some(risk) = params["risk"].as_str() {
            event["risk"] = Value::from(clip(risk, 64));
        }
        if let Some(perms) = params["requestedPermissions"].as_array() {
            let grants: Vec<Value> = perms
                .iter()
                .filter(|g| g["capability"].is_string() && g["scope"].is_string())
                .take(64)
                .cloned()
                .collect();
            if !grants.is_empty() {
                event["requested_permissions"] = Value::from(grants);
            }
        }
        let now = Instant::now();
        self.approvals.push(Approval {
            id: id.clone(),
            nonce,
            binding: binding_digest,
            tool: tool.clone(),
            reply,
            deadline: now + self.approval_timeout,
            asked: false,
            announce_by: now + ANNOUNCE_WAIT,
            event,
        });
        // Who decides without asking: the session's mode, a closed stdin, a host that asked not
        // to be asked.
        let mode = self.args.permission_mode;
        if self.eof {
            self.settle(
                &id,
                "decline",
                Some("stdin closed: nobody can answer"),
                "stdin_closed",
            );
        } else if mode == PermissionMode::BypassPermissions {
            self.settle(&id, "acceptOnce", None, "permission_mode");
        } else if mode == PermissionMode::Plan {
            self.settle(
                &id,
                "decline",
                Some("plan mode: tools do not run"),
                "permission_mode",
            );
        } else if mode == PermissionMode::AcceptEdits && EDIT_TOOLS.contains(&tool.as_str()) {
            self.settle(&id, "acceptOnce", None, "permission_mode");
        } else if !self.args.interactive_approvals {
            self.settle(
                &id,
                "decline",
                Some("approvals are not interactive (no --interactive-approvals)"),
                "non_interactive",
            );
        } else {
            self.flush_asks();
        }
    }

    /// Asks on the stream every approval whose approval/requested the engine has announced (or
    /// that waited long enough for it), so the host sees tool_use before approval_request.
    fn flush_asks(&mut self) {
        let now = Instant::now();
        let mut events = Vec::new();
        for a in &mut self.approvals {
            if !a.asked && (self.announced.contains(&a.nonce) || now >= a.announce_by) {
                a.asked = true;
                a.deadline = now + self.approval_timeout;
                events.push(a.event.clone());
            }
        }
        self.emit_all(events);
    }

    fn approval_deadlines(&mut self) {
        self.flush_asks();
        let now = Instant::now();
        let expired: Vec<String> = self
            .approvals
            .iter()
            .filter(|a| a.asked && now >= a.deadline)
            .map(|a| a.id.clone())
            .collect();
        for id in expired {
            self.settle(
                &id,
                "decline",
                Some("no answer before the approval timeout"),
                "timeout",
            );
        }
    }

    /// Answers approval `id` with `kind`; `via` is reported in approval_resolved.
    fn settle(&mut self, id: &str, kind: &str, reason: Option<&str>, via: &'static str) {
        let Some(at) = self.approvals.iter().position(|a| a.id == id) else {
            return;
        };
        let a = self.approvals.remove(at);
        info!("approval {id} ({}): {kind} via {via}", a.tool);
        self.settled.insert(
            a.nonce.clone(),
            Settled {
                via,
                kind: kind.to_string(),
                reason: reason.map(str::to_string),
            },
        );
        self.closed_ids.insert(a.id.clone());
        let _ = a.reply.try_send(typed_decision(kind, reason));
    }

    /// The host's answer to an approval_request: `{"type":"approval","id",…}` with `approve`
    /// and/or a published `decision`, and the `binding` it was shown. Anything unclear declines.
    fn approval_answer(&mut self, v: &Value) {
        let Some(id) = v.get("id").and_then(Value::as_str) else {
            self.session_error(
                "invalid_input",
                "an approval input has no id; it was ignored",
            );
            return;
        };
        let Some(a) = self.approvals.iter().find(|a| a.id == id) else {
            if self.closed_ids.contains(id) {
                info!("a late answer to approval {id}, which was already settled; ignored");
            } else {
                let msg = format!(
                    "no approval is waiting with id {:?}; the answer was ignored",
                    clip(id, 160)
                );
                self.session_error("unknown_approval", &msg);
            }
            return;
        };
        if let Some(b) = v.get("binding").filter(|b| !b.is_null()) {
            if b.as_str() != Some(a.binding.as_str()) {
                let id = id.to_string();
                self.settle(
                    &id,
                    "decline",
                    Some("the answer names another binding"),
                    "binding_mismatch",
                );
                return;
            }
        }
        let approve = v.get("approve").and_then(Value::as_bool);
        let verdict: Result<(String, Option<String>), &str> =
            match v.get("decision").filter(|d| !d.is_null()) {
                Some(d) => match published_decision(d) {
                    Some((kind, reason)) => {
                        let accepts = kind.starts_with("accept");
                        if approve.is_some_and(|ap| ap != accepts) {
                            Err("approve and decision disagree")
                        } else {
                            Ok((kind, reason))
                        }
                    }
                    None => Err("the decision is not a published ApprovalDecision"),
                },
                None => match approve {
                    Some(true) => Ok(("acceptOnce".into(), None)),
                    Some(false) => Ok(("decline".into(), None)),
                    None => Err("the answer has neither approve nor decision"),
                },
            };
        let id = id.to_string();
        match verdict {
            Ok((kind, reason)) => self.settle(&id, &kind, reason.as_deref(), "user"),
            Err(why) => {
                warn!("approval {id}: {why}; declined");
                self.settle(&id, "decline", Some(why), "invalid_response");
            }
        }
    }
}

/// A published `ApprovalDecision` (closed objects): its kind and a decline's or cancel's reason.
fn published_decision(d: &Value) -> Option<(String, Option<String>)> {
    let obj = d.as_object()?;
    let kind = obj.get("kind")?.as_str()?;
    let allowed: &[&str] = match kind {
        "acceptOnce" => &["kind"],
        "acceptForTurn" | "acceptForSession" => &["kind", "permissions"],
        "decline" | "cancel" => &["kind", "reason"],
        _ => return None,
    };
    if obj.keys().any(|k| !allowed.contains(&k.as_str())) {
        return None;
    }
    let reason = match obj.get("reason") {
        None => None,
        Some(Value::String(r)) if r.chars().count() <= 2048 => Some(r.clone()),
        Some(_) => return None,
    };
    if let Some(p) = obj.get("permissions") {
        let ok = p.as_array().is_some_and(|a| {
            a.len() <= 64
                && a.iter()
                    .all(|g| g["capability"].is_string() && g["scope"].is_string())
        });
        if !ok {
            return None;
        }
    }
    Some((kind.to_string(), reason))
}

fn delta_event(thinking: bool, text: &str) -> Value {
    let delta = if thinking {
        json!({"type": "thinking_delta", "thinking": text})
    } else {
        json!({"type": "text_delta", "text": text})
    };
    json!({"type": "stream_event", "event": {"type": "content_block_delta", "delta": delta}})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_item_accessor_reads_notifications_and_recorded_bodies() {
        let recorded = json!({"type": "agentMessage", "id": "i1", "text": "hi"});
        assert_eq!(item_body(&recorded)["text"], "hi");
        let new = json!({"id": "i1", "threadId": "t", "turnId": "u", "kind": "assistant_message",
            "status": "completed", "content": {"type": "agentMessage", "id": "i1", "text": "hi"}});
        assert_eq!(item_body(&new)["type"], "agentMessage");
        assert_eq!(item_body(&new)["text"], "hi");
    }

    #[test]
    fn turn_errors_are_read_beside_the_turn() {
        let beside = json!({"turn": {"status": "failed"}, "error": {"code": "x", "message": "m"}});
        assert_eq!(turn_error(&beside).unwrap()["code"], "x");
        assert!(turn_error(&json!({"turn": {"error": null}, "error": null})).is_none());
    }

    #[test]
    fn only_published_decisions_are_taken() {
        assert_eq!(
            published_decision(&json!({"kind": "acceptOnce"}))
                .unwrap()
                .0,
            "acceptOnce"
        );
        assert!(published_decision(&json!({"kind": "acceptOnce", "reason": "x"})).is_none());
        assert!(published_decision(&json!({"kind": "accept"})).is_none());
        assert!(published_decision(&json!({"decision": "acceptOnce"})).is_none());
        let (k, r) = published_decision(&json!({"kind": "decline", "reason": "no"})).unwrap();
        assert_eq!((k.as_str(), r.as_deref()), ("decline", Some("no")));
        assert!(typed_decision("acceptOnce", None).is_some());
        assert!(typed_decision("decline", Some("no")).is_some());
        assert!(typed_decision("maybe", None).is_none());
    }

    #[test]
    fn trace_ids_and_clips_stay_within_the_published_limits() {
        assert_eq!(sanitize_trace_id(" a b\nc:1 ").as_deref(), Some("abc:1"));
        assert_eq!(sanitize_trace_id("  \n"), None);
        assert_eq!(sanitize_trace_id(&"x".repeat(300)).unwrap().len(), 128);
        assert_eq!(clip("héllo", 2), "hé");
        assert_eq!(clip("hi", 5), "hi");
    }
}
