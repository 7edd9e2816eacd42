//! `cc-app-server chat`: an interactive terminal session on the same engine `serve` runs, for
//! people who want to try the agent without writing a host. It is a wire v1 client like any
//! other (over an in-process connection): it prints streamed answers, shows each approval's
//! binding before asking, and turns Ctrl-C into turn/interrupt.

use crate::{KernelArg, ModelArgs, StateArgs, StoreArg};
use cc_app_server::approval::ApprovalPolicy;
use cc_app_server::engine::{AppServer, Connection, ServerConfig};
use cc_app_server::rollout::StoreKind;
use cc_app_server::scripted::ScriptedKernel;
use clap::Args;
use serde_json::{json, Value};
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Duration;

#[derive(Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub state: StateArgs,
    /// The agent kernel (scripted echoes, for trying the interface without a model).
    #[arg(long, value_enum, default_value = "openai")]
    pub kernel: KernelArg,
    #[command(flatten)]
    pub model: ModelArgs,
    /// The directory the tools may touch [default: the current directory].
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// Continue this thread instead of starting a new one.
    #[arg(long, value_name = "ID")]
    pub thread: Option<String>,
    /// Run every tool without asking (trusted workspaces only).
    #[arg(long)]
    pub auto_approve: bool,
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

struct Session {
    conn: Connection,
    next: u64,
    lines: Receiver<Option<String>>,
    out: std::io::Stdout,
}

enum Input {
    Line(String),
    Eof,
}

impl Session {
    fn send(&mut self, method: &str, params: Value) -> u64 {
        self.next += 1;
        let msg = json!({"jsonrpc": "2.0", "id": self.next, "method": method, "params": params});
        let _ = self.conn.send(&msg.to_string());
        self.next
    }

    fn recv(&self, wait: Duration) -> Option<Value> {
        let text = self.conn.recv(Some(wait)).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Waits for the answer to request `id`, handling whatever else arrives meanwhile.
    fn call(&mut self, method: &str, params: Value) -> Result<Value, String> {
        let id = self.send(method, params);
        loop {
            let Some(m) = self.recv(Duration::from_secs(600)) else {
                return Err(format!("no answer to {method}"));
            };
            if m.get("method").is_none() && m["id"] == json!(id) {
                return match m.get("error") {
                    Some(e) => Err(e["message"].as_str().unwrap_or("error").to_string()),
                    None => Ok(m["result"].clone()),
                };
            }
            self.show(&m);
        }
    }

    fn say(&mut self, text: &str) {
        let _ = self.out.write_all(text.as_bytes());
        let _ = self.out.flush();
    }

    fn input(&self) -> Input {
        match self.lines.recv() {
            Ok(Some(l)) => Input::Line(l),
            _ => Input::Eof,
        }
    }

    /// Writes text the model, a tool or the store controls: every character a terminal would
    /// interpret is shown instead (crate::term).
    fn say_untrusted(&mut self, text: &str) {
        let shown = crate::term::visible(text).into_owned();
        self.say(&shown);
    }

    /// Prints one notification the way a person wants to read it. Everything taken from the
    /// notification goes through `say_untrusted`; only the brackets are ours.
    fn show(&mut self, m: &Value) {
        let p = &m["params"];
        let text = |v: &Value| v.as_str().unwrap_or("").to_string();
        match m["method"].as_str().unwrap_or("") {
            "item/delta" => {
                if let Some(t) = p["delta"]["text"].as_str() {
                    self.say_untrusted(t);
                }
            }
            "item/started" => {
                let item = crate::render::item_body(&p["item"]);
                match item["type"].as_str().unwrap_or("") {
                    "reasoning" => self.say("\n[thinking] "),
                    "commandExecution" => {
                        let argv: Vec<String> = item["command"]
                            .as_array()
                            .map(|a| {
                                a.iter()
                                    .filter_map(Value::as_str)
                                    .map(|s| format!("{:?}", crate::term::one_line(s)))
                                    .collect()
                            })
                            .unwrap_or_default();
                        self.say(&format!("\n[run] {}\n", argv.join(" ")));
                    }
                    "fileChange" => self.say("\n[file change]\n"),
                    "toolCall" => {
                        let line = format!(
                            "{} {}",
                            crate::term::one_line(item["call"]["tool"].as_str().unwrap_or("?")),
                            crate::term::one_line(&item["call"]["arguments"].to_string())
                        );
                        self.say(&format!("\n[tool] {line}\n"));
                    }
                    _ => {}
                }
            }
            "item/completed" => {
                let item = crate::render::item_body(&p["item"]);
                match item["type"].as_str().unwrap_or("") {
                    "agentMessage" | "reasoning" => self.say("\n"),
                    "commandExecution" => {
                        let line = format!(
                            "[exit {}] {}\n",
                            crate::term::one_line(&item["exitCode"].to_string()),
                            crate::term::one_line(&text(&item["status"]))
                        );
                        self.say(&line);
                    }
                    "fileChange" => {
                        for c in item["changes"].as_array().into_iter().flatten() {
                            let line = format!(
                                "[{}] {}\n",
                                crate::term::one_line(c["kind"].as_str().unwrap_or("?")),
                                crate::term::one_line(c["path"].as_str().unwrap_or("?"))
                            );
                            self.say(&line);
                        }
                        if item["status"] != "completed" {
                            let line =
                                format!("[{}]\n", crate::term::one_line(&text(&item["status"])));
                            self.say(&line);
                        }
                    }
                    "error" => {
                        self.say("[note] ");
                        self.say_untrusted(&text(&item["message"]));
                        self.say("\n");
                    }
                    _ => {}
                }
            }
            "approval/decide" => self.approve(m),
            _ => {}
        }
    }

    /// Shows the request in a frame nothing printed before it can imitate (crate::term) and
    /// asks; anything but a clear yes declines.
    fn approve(&mut self, m: &Value) {
        // SAFETY: isatty only inspects the descriptor.
        let tty = unsafe { libc::isatty(1) } == 1;
        let prompt = crate::term::approval_prompt(&m["params"], tty);
        self.say(&prompt);
        let answer = match self.input() {
            Input::Line(l) => l.trim().to_ascii_lowercase(),
            Input::Eof => "c".into(),
        };
        let decision = match answer.as_str() {
            "y" | "yes" => json!({"kind": "acceptOnce"}),
            "t" => json!({"kind": "acceptForTurn"}),
            "s" => json!({"kind": "acceptForSession"}),
            "c" => json!({"kind": "cancel"}),
            _ => json!({"kind": "decline"}),
        };
        let reply = json!({"jsonrpc": "2.0", "id": m["id"], "result": decision});
        let _ = self.conn.send(&reply.to_string());
    }

    /// Runs one turn to its end; Ctrl-C interrupts it.
    fn turn(&mut self, thread: &str, text: &str) -> Result<(), String> {
        INTERRUPTED.store(false, Ordering::SeqCst);
        let started = self.call(
            "turn/start",
            json!({"threadId": thread, "input": [{"type": "text", "text": text}]}),
        )?;
        let turn_id = started["turn"]["id"].as_str().unwrap_or("").to_string();
        let mut asked = false;
        loop {
            if INTERRUPTED.swap(false, Ordering::SeqCst) && !asked {
                asked = true;
                self.say("\n[interrupting...]\n");
                self.send(
                    "turn/interrupt",
                    json!({"threadId": thread, "turnId": turn_id}),
                );
            }
            let Some(m) = self.recv(Duration::from_millis(50)) else {
                if !self.conn.is_open() {
                    return Err("the server closed the connection".into());
                }
                continue;
            };
            if m["method"] == "turn/completed" && m["params"]["turn"]["id"] == json!(turn_id) {
                let t = &m["params"]["turn"];
                match t["status"].as_str().unwrap_or("") {
                    "completed" => {}
                    "interrupted" => self.say("[turn interrupted]\n"),
                    other => {
                        // The error travels beside the turn (published wire).
                        let e = &m["params"]["error"];
                        let line = format!(
                            "[turn {}: {} ({})]\n",
                            crate::term::one_line(other),
                            crate::term::one_line(e["message"].as_str().unwrap_or("")),
                            crate::term::one_line(e["code"].as_str().unwrap_or(""))
                        );
                        self.say(&line);
                    }
                }
                return Ok(());
            }
            self.show(&m);
        }
    }
}

pub fn run(args: ChatArgs) -> u8 {
    match chat(args) {
        Ok(()) => 0,
        Err(e) => {
            error!("{e}");
            1
        }
    }
}

fn chat(args: ChatArgs) -> Result<(), String> {
    let workspace = match &args.workspace {
        Some(w) => w.clone(),
        None => std::env::current_dir().map_err(|e| format!("{e}; pass --workspace"))?,
    };
    let tools = crate::workspace_tools(
        &workspace,
        &args.state.state_dir,
        &[args.model.key_file_path()],
    )?;
    let mut config = ServerConfig::new(&args.state.state_dir);
    config.store = match args.state.store.unwrap_or(StoreArg::Jsonl) {
        StoreArg::Jsonl => StoreKind::Jsonl,
        StoreArg::Sqlite => StoreKind::Sqlite,
    };
    config.workspace = tools.root().display().to_string();
    config.tools = Arc::new(tools);
    config.kernel = match args.kernel {
        KernelArg::Openai => Arc::new(args.model.kernel()?),
        KernelArg::Scripted => Arc::new(ScriptedKernel::default()),
    };
    config.policy = if args.auto_approve {
        ApprovalPolicy::AutoApprove
    } else {
        ApprovalPolicy::AskEveryTime
    };
    // A person reads the prompt; give them time.
    config.approval_timeout = Duration::from_secs(600);
    let server = AppServer::open(config).map_err(|e| e.to_string())?;
    // SAFETY: installs an async-signal-safe handler that only stores to an atomic.
    unsafe {
        libc::signal(
            libc::SIGINT,
            on_sigint as extern "C" fn(libc::c_int) as libc::sighandler_t,
        );
    }
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        for line in stdin.lock().lines() {
            match line {
                Ok(l) => {
                    if tx.send(Some(l)).is_err() {
                        return;
                    }
                }
                Err(_) => break,
            }
        }
        let _ = tx.send(None);
    });
    let mut s = Session {
        conn: server.connect().map_err(|e| e.to_string())?,
        next: 0,
        lines,
        out: std::io::stdout(),
    };
    s.call(
        "initialize",
        json!({"protocolVersion": 1, "minimumProtocolVersion": 1,
        "client": {"name": "cc-app-server chat", "version": env!("CARGO_PKG_VERSION")},
        "features": ["thread_turn_item", "structured_approval", "thread_compact"]}),
    )?;
    let thread = match &args.thread {
        Some(id) => {
            s.call("thread/resume", json!({"threadId": id, "limit": 1}))?;
            id.clone()
        }
        None => s.call("thread/start", json!({"title": "chat"}))?["thread"]["id"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    };
    s.say(&format!(
        "cc-app-server chat - thread {thread}, workspace {}\nType a message; /compact summarises the thread, /quit or Ctrl-D ends, Ctrl-C interrupts a turn.\n",
        workspace.display()
    ));
    loop {
        s.say("\n> ");
        let line = match s.input() {
            Input::Line(l) => l,
            Input::Eof => break,
        };
        let text = line.trim();
        match text {
            "" => continue,
            "/quit" | "/exit" => break,
            "/compact" => match s.call("thread/compact", json!({"threadId": thread})) {
                Ok(r) => {
                    let summary = r["summary"].as_str().unwrap_or("").to_string();
                    s.say("[compacted]\n");
                    s.say_untrusted(&summary);
                    s.say("\n");
                }
                Err(e) => s.say(&format!(
                    "[compact failed: {}]\n",
                    crate::term::one_line(&e)
                )),
            },
            _ => {
                if let Err(e) = s.turn(&thread, text) {
                    s.say(&format!("[{}]\n", crate::term::one_line(&e)));
                }
            }
        }
    }
    s.say("\n");
    s.conn.close();
    server.shutdown();
    Ok(())
}
