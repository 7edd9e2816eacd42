//! `cc-app-server graph`: validate a Graph IR file, run it on an in-process server (the engine
//! and flags of `serve`, approvals asked here), and inspect or list runs from their logs.
//! docs/graph.md describes the IR, the rules and the run log.

use crate::{ServeArgs, StateArgs, StoreArg};
use cc_app_server::engine::AppServer;
use cc_app_server::graph::compile;
use cc_app_server::graph::state::{Custody, RunState};
use cc_app_server::graph::store::{for_each_event, list_runs, open_runs, RUNS_DIR};
use cc_app_server::protocol::error_code;
use cc_app_server::protocol::{GraphBudgets, GraphRunGrant};
use cc_app_server::rollout::{layout, RolloutStore, StoreKind, StoreOptions};
use clap::{Args, Subcommand};
use serde_json::{json, Map, Value};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Subcommand)]
pub enum GraphCommand {
    /// Compile a definition: every rule it breaks, with its code and JSON pointer (exit 1), or
    /// its plan digest (exit 0).
    Validate(ValidateArgs),
    /// Run a definition to its end on an in-process server, printing node states as they
    /// change; tool approvals are asked here (or decided by --approval-policy).
    #[command(
        long_about = "Run a definition to its end on an in-process server over --state-dir (the \
same engine, kernels, tools and flags as `serve`). Node and run states are printed as they \
become durable; a tool call needing approval is shown with its binding and asked on stdin \
([y] once, anything else declines; end of input declines). Ctrl-C cancels the run: every \
attempt in flight is fenced before the run ends as cancelled.\n\n\
The run is kept in <state-dir>/graph-runs; a run the server stopped (or crashed) in is resumed \
by running the same file again with the same --run-id. A tool call the dead process had \
intended but whose outcome nothing recorded waits for a decision (`reconcile`): the run stops \
with a message naming the node and the effect (exit 3); check whether the call happened and \
run again with --resolve NODE=applied[:JSON] or --resolve NODE=not-applied. Exit 0 when the \
run succeeded, 1 when it failed or was cancelled, 2 when the file does not compile or an \
argument is wrong, 3 when the run waits for a --resolve decision."
    )]
    Run(Box<RunArgs>),
    /// A run as its log reduces to: nodes, messages, effects and receipts. Message values and
    /// tool results are hidden unless --include-content.
    Inspect(InspectArgs),
    /// The runs in a state directory.
    List(ListArgs),
}

/// What the run may do.
#[derive(Args, Debug, Clone)]
pub struct GrantArgs {
    /// A capability the run grants (repeatable): `agent`, `tool:write_file`, `tool:*`, `*`
    /// [default: agent and tool:*, every tool still passing the approval policy].
    #[arg(long = "grant", value_name = "CAP")]
    pub grants: Vec<String>,
    /// Node attempts the run may start (the budget's maxSteps).
    #[arg(long, value_name = "N")]
    pub budget_steps: Option<u64>,
    /// Tool calls (effects) the run may make (maxEffects).
    #[arg(long, value_name = "N")]
    pub budget_effects: Option<u64>,
    /// Model tokens the run may use, as the kernel reports them (maxTokens).
    #[arg(long, value_name = "N")]
    pub budget_tokens: Option<u64>,
    /// Milliseconds the run may take (maxWallTimeMs).
    #[arg(long, value_name = "MS")]
    pub budget_wall_time_ms: Option<u64>,
}

impl GrantArgs {
    fn grant(&self) -> GraphRunGrant {
        let capabilities = if self.grants.is_empty() {
            vec!["agent".to_string(), "tool:*".to_string()]
        } else {
            self.grants.clone()
        };
        let any = self
            .budget_steps
            .or(self.budget_effects)
            .or(self.budget_tokens)
            .or(self.budget_wall_time_ms);
        GraphRunGrant {
            capabilities,
            budgets: any.map(|_| GraphBudgets {
                max_steps: self.budget_steps,
                max_tokens: self.budget_tokens,
                max_wall_time_ms: self.budget_wall_time_ms,
                max_effects: self.budget_effects,
            }),
        }
    }
}

#[derive(Args, Debug)]
pub struct ValidateArgs {
    /// The definition (a GraphDefinition as JSON).
    pub file: PathBuf,
    #[command(flatten)]
    pub grant: GrantArgs,
    /// Print the result as JSON (graph/validate's result).
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The definition (a GraphDefinition as JSON).
    pub file: PathBuf,
    #[command(flatten)]
    pub serve: ServeArgs,
    #[command(flatten)]
    pub grant: GrantArgs,
    /// A run input, NAME=VALUE (repeatable); VALUE is read as JSON, else taken as text.
    #[arg(long = "input", value_name = "NAME=VALUE")]
    pub inputs: Vec<String>,
    /// The run's id (to resume a run, run the same file with the same id) [default: a new one].
    #[arg(long, value_name = "ID")]
    pub run_id: Option<String>,
    /// Agent slots for agent and tool nodes.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub workers: u64,
    /// How long an attempt may go without progress before its node is assigned again.
    #[arg(long, value_name = "MS", default_value_t = 300_000, value_parser = clap::value_parser!(u64).range(100..=86_400_000))]
    pub lease_ms: u64,
    /// Decide an effect waiting in reconcile (a tool call a stopped process intended, with no
    /// recorded outcome): NODE=applied[:JSON] — it happened, JSON being the tool's output
    /// [default: null], which the node then gets without the call running again — or
    /// NODE=not-applied — it did not, and the node may make the call again. NODE is the node's
    /// key as printed (`t`, `loop.2/t`) or the effect's idempotency key (`fx-…`). Repeatable.
    #[arg(long = "resolve", value_name = "NODE=applied[:JSON]|not-applied")]
    pub resolve: Vec<String>,
}

/// Exit code of `graph run` when the run waits for a `--resolve` decision.
pub const EXIT_RECONCILE: u8 = 3;

/// One `--resolve` argument.
#[derive(Debug, Clone, PartialEq)]
struct Resolution {
    target: String,
    /// Some(output): it happened with this output; None: it did not.
    applied: Option<Value>,
}

fn parse_resolutions(args: &[String]) -> Result<Vec<Resolution>, String> {
    args.iter()
        .map(|a| {
            let bad = || {
                format!(
                    "--resolve {a:?}: expected NODE=applied, NODE=applied:JSON or NODE=not-applied"
                )
            };
            let (target, decision) = a.split_once('=').ok_or_else(bad)?;
            if target.is_empty() {
                return Err(bad());
            }
            let applied = match decision {
                "not-applied" => None,
                "applied" => Some(Value::Null),
                d => match d.strip_prefix("applied:") {
                    Some(json) => Some(serde_json::from_str(json).map_err(|e| {
                        format!(
                            "--resolve {a:?}: the tool output after \"applied:\" is not JSON ({e})"
                        )
                    })?),
                    None => return Err(bad()),
                },
            };
            Ok(Resolution {
                target: target.to_string(),
                applied,
            })
        })
        .collect()
}

#[derive(Args, Debug)]
pub struct InspectArgs {
    /// The run's id.
    pub run: String,
    #[command(flatten)]
    pub state: StateArgs,
    /// Show message values, tool results and run outputs.
    #[arg(long)]
    pub include_content: bool,
    /// Print graph/run/read's result as JSON (plus the chain check and anomalies).
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct ListArgs {
    #[command(flatten)]
    pub state: StateArgs,
}

fn fail(message: impl std::fmt::Display, code: u8) -> u8 {
    eprintln!("cc-app-server: {message}");
    code
}

fn read_definition(file: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    serde_json::from_str(&text).map_err(|e| {
        format!(
            "{} is not JSON ({e}); a graph is a GraphDefinition object, see docs/graph.md",
            file.display()
        )
    })
}

pub fn validate(args: ValidateArgs) -> u8 {
    let definition = match read_definition(&args.file) {
        Ok(d) => d,
        Err(e) => return fail(e, 2),
    };
    let result = compile(&definition, &args.grant.grant());
    if args.json {
        let value = match &result {
            Ok(plan) => {
                json!({"valid": true, "planDigest": plan.digest, "nodeCount": plan.node_count(), "errors": []})
            }
            Err(errors) => json!({"valid": false, "planDigest": null, "nodeCount": 0,
                                  "errors": errors.iter().map(|e| e.to_wire()).collect::<Vec<_>>()}),
        };
        println!(
            "{}",
            serde_json::to_string_pretty(&value).unwrap_or_default()
        );
    } else {
        match &result {
            Ok(plan) => println!(
                "valid: graph {} with {} node(s), plan {}",
                plan.graph_id,
                plan.node_count(),
                plan.digest
            ),
            Err(errors) => {
                for e in errors {
                    println!("{e}");
                }
                println!("invalid: {} error(s)", errors.len());
            }
        }
    }
    u8::from(result.is_err())
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

fn parse_inputs(inputs: &[String]) -> Result<Map<String, Value>, String> {
    let mut out = Map::new();
    for i in inputs {
        let Some((name, value)) = i.split_once('=') else {
            return Err(format!("--input {i:?}: expected NAME=VALUE"));
        };
        let value =
            serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.to_string()));
        out.insert(name.to_string(), value);
    }
    Ok(out)
}

/// One connection's view of the run: requests, notifications printed, approvals asked.
struct Session {
    conn: cc_app_server::engine::Connection,
    next: u64,
    lines: std::sync::mpsc::Receiver<Option<String>>,
    /// The last state printed per node, so only changes are printed.
    shown: std::collections::HashMap<String, String>,
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

    /// Shows a tool call's binding and asks; anything but a clear yes declines.
    fn approve(&mut self, m: &Value) {
        let p = &m["params"];
        let b = &p["binding"];
        print!(
            "--- approval needed ---\ntool:      {}\narguments: {}\nthread {} item {}\noperation {}\nexpires   {}\napprove? [y] once, anything else declines: ",
            p["operation"]["tool"].as_str().unwrap_or("?"),
            p["operation"]["arguments"],
            b["threadId"].as_str().unwrap_or(""),
            b["itemId"].as_str().unwrap_or(""),
            b["operationDigest"].as_str().unwrap_or(""),
            b["expiresAt"].as_str().unwrap_or(""),
        );
        let _ = std::io::stdout().flush();
        let answer = match self.lines.recv() {
            Ok(Some(l)) => l.trim().to_ascii_lowercase(),
            _ => String::new(),
        };
        let decision = if matches!(answer.as_str(), "y" | "yes") {
            "acceptOnce"
        } else {
            "decline"
        };
        println!("{decision}");
        let reply = json!({"jsonrpc": "2.0", "id": m["id"], "result": {"kind": decision}});
        let _ = self.conn.send(&reply.to_string());
    }

    /// Prints one notification as a line; returns the run's status when it changed.
    fn show(&mut self, m: &Value, run: &str) -> Option<String> {
        let p = &m["params"];
        if p["runId"].as_str().is_some_and(|r| r != run) {
            return None;
        }
        match m["method"].as_str().unwrap_or("") {
            "approval/decide" => self.approve(m),
            "graph/event" if p["type"] == "nodeUpdated" => {
                let n = &p["node"];
                let now = format!("{} {}", n["status"], n["attemptId"]);
                let key = n["key"].as_str().unwrap_or("").to_string();
                if self.shown.get(&key) == Some(&now) {
                    return None;
                }
                self.shown.insert(key, now);
                let mut line = format!(
                    "node {:<24} {}",
                    n["key"].as_str().unwrap_or(""),
                    n["status"].as_str().unwrap_or("")
                );
                if let (Some(a), Some(f)) = (n["attemptId"].as_u64(), n["fence"].as_u64()) {
                    if n["status"] == "running" {
                        line.push_str(&format!(" (attempt {a}, fence {f})"));
                    }
                }
                if let Some(code) = n["error"]["code"].as_str() {
                    line.push_str(&format!(
                        " [{code}: {}]",
                        n["error"]["message"].as_str().unwrap_or("")
                    ));
                }
                println!("{line}");
            }
            "graph/event" if p["type"] == "runUpdated" => {
                return p["run"]["status"].as_str().map(str::to_string)
            }
            _ => {}
        }
        None
    }

    /// Waits for the answer to request `id`, showing whatever else arrives meanwhile.
    fn call(
        &mut self,
        method: &str,
        params: Value,
        run: &str,
    ) -> Result<Value, (i64, String, Value)> {
        let id = self.send(method, params);
        loop {
            let Some(m) = self.recv(Duration::from_secs(600)) else {
                return Err((
                    error_code::INTERNAL,
                    format!("no answer to {method}"),
                    Value::Null,
                ));
            };
            if m.get("method").is_none() && m["id"] == json!(id) {
                return match m.get("error") {
                    Some(e) => Err((
                        e["code"].as_i64().unwrap_or(0),
                        e["message"].as_str().unwrap_or("error").to_string(),
                        e["data"].clone(),
                    )),
                    None => Ok(m["result"].clone()),
                };
            }
            self.show(&m, run);
        }
    }
}

pub fn run(args: Box<RunArgs>) -> u8 {
    let definition = match read_definition(&args.file) {
        Ok(d) => d,
        Err(e) => return fail(e, 2),
    };
    let inputs = match parse_inputs(&args.inputs) {
        Ok(i) => i,
        Err(e) => return fail(e, 2),
    };
    let resolutions = match parse_resolutions(&args.resolve) {
        Ok(r) => r,
        Err(e) => return fail(e, 2),
    };
    let grant = args.grant.grant();
    if let Err(errors) = compile(&definition, &grant) {
        for e in &errors {
            eprintln!("{e}");
        }
        return fail(
            format!(
                "{} does not compile ({} error(s)); `cc-app-server graph validate` explains each",
                args.file.display(),
                errors.len()
            ),
            2,
        );
    }
    let mut config = match crate::serve::config(&args.serve) {
        Ok(c) => c,
        Err(e) => return fail(e, 1),
    };
    // A person reads the approval prompt; give them time.
    config.approval_timeout = config.approval_timeout.max(Duration::from_secs(600));
    let state_dir = config.state_dir.display().to_string();
    let server = match AppServer::open(config) {
        Ok(s) => s,
        Err(e) => return fail(format!("cannot start on {state_dir}: {e}"), 1),
    };
    let code = drive(&server, &args, definition, inputs, grant, &resolutions);
    server.shutdown();
    code
}

/// Applies the `--resolve` decisions to the run's effects waiting for one.
fn resolve(server: &AppServer, run: &str, resolutions: &[Resolution]) -> Result<(), String> {
    use cc_app_server::graph::state::EffectStatus;
    use cc_app_server::protocol::{ToolResult, ToolResultOk};
    let graph = server.graph();
    for r in resolutions {
        let st = graph.state(run).map_err(|e| e.to_string())?;
        let waiting: Vec<&str> = st
            .effect_order
            .iter()
            .filter_map(|k| st.effects.get(k))
            .filter(|e| e.key == r.target || e.node == r.target)
            .filter(|e| matches!(e.status, EffectStatus::Reconcile | EffectStatus::Intended))
            .map(|e| e.key.as_str())
            .collect();
        let key = match waiting.as_slice() {
            [key] => key.to_string(),
            [] => {
                return Err(format!(
                    "--resolve {}: no effect of run {run} with that node or key waits for a decision",
                    r.target
                ))
            }
            keys => {
                return Err(format!(
                    "--resolve {}: {} effects of that node wait for a decision ({}); name each by its key",
                    r.target,
                    keys.len(),
                    keys.join(", ")
                ))
            }
        };
        let result = r
            .applied
            .clone()
            .map(|output| ToolResult::Ok(ToolResultOk { output }));
        let what = if result.is_some() {
            "applied"
        } else {
            "not applied"
        };
        graph
            .resolve_effect(run, &key, result)
            .map_err(|e| format!("--resolve {}: {e}", r.target))?;
        println!("effect {key} resolved: {what}");
    }
    Ok(())
}

/// The effects that stop the run: in reconcile (nothing could tell whether they happened), while
/// nothing else runs or is ready and no other effect is still being reconciled.
fn waiting_for_decision(server: &AppServer, run: &str) -> Option<(u64, Vec<String>)> {
    use cc_app_server::graph::state::EffectStatus;
    let st = server.graph().state(run).ok()?;
    let counts = st.counts();
    if counts.running > 0 || counts.ready > 0 || st.status.is_terminal() {
        return None;
    }
    let effects: Vec<_> = st
        .effect_order
        .iter()
        .filter_map(|k| st.effects.get(k))
        .collect();
    if effects.iter().any(|e| e.status == EffectStatus::Intended) {
        return None;
    }
    let waiting: Vec<String> = effects
        .iter()
        .filter(|e| e.status == EffectStatus::Reconcile)
        .map(|e| {
            format!(
                "node {} effect {} (tool {}, attempt {})",
                e.node, e.key, e.call.tool, e.attempt
            )
        })
        .collect();
    (!waiting.is_empty()).then_some((st.last_seq, waiting))
}

fn drive(
    server: &AppServer,
    args: &RunArgs,
    definition: Value,
    inputs: Map<String, Value>,
    grant: GraphRunGrant,
    resolutions: &[Resolution],
) -> u8 {
    // SAFETY: installs an async-signal-safe handler that only stores to an atomic.
    unsafe {
        libc::signal(
            libc::SIGINT,
            on_sigint as extern "C" fn(libc::c_int) as libc::sighandler_t,
        );
    }
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(l) = line else { break };
            if tx.send(Some(l)).is_err() {
                return;
            }
        }
        let _ = tx.send(None);
    });
    let conn = match server.connect() {
        Ok(c) => c,
        Err(e) => return fail(e, 1),
    };
    let mut s = Session {
        conn,
        next: 0,
        lines,
        shown: Default::default(),
    };
    let features = [
        "thread_turn_item",
        "structured_approval",
        "typed_graph",
        "causal_messages",
        "graph_effect_receipts",
    ];
    if let Err((_, m, _)) = s.call(
        "initialize",
        json!({"protocolVersion": 1, "minimumProtocolVersion": 1, "client": {"name": "cc-app-server graph run", "version": env!("CARGO_PKG_VERSION")}, "features": features}),
        "",
    ) {
        return fail(m, 1);
    }
    let mut params = json!({"definition": definition, "inputs": inputs, "grant": grant,
        "options": {"workers": [{"id": "local", "capacity": args.workers}], "leaseMs": args.lease_ms}});
    if let Some(id) = &args.run_id {
        params["runId"] = json!(id);
    }
    let t = Instant::now();
    let started = match s.call(
        "graph/run/start",
        params,
        args.run_id.as_deref().unwrap_or(""),
    ) {
        Ok(r) => r,
        Err((code, m, data)) => {
            let detail = data
                .get("reason")
                .and_then(Value::as_str)
                .map(|r| format!(" ({r} at {})", data["pointer"].as_str().unwrap_or("")))
                .unwrap_or_default();
            return fail(
                format!("graph/run/start refused ({code}): {m}{detail}"),
                if code == error_code::INVALID_PARAMS {
                    2
                } else {
                    1
                },
            );
        }
    };
    let run = started["run"]["runId"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    println!(
        "run {run} of graph {} (plan {}, {} node(s))",
        started["run"]["graphId"].as_str().unwrap_or(""),
        started["run"]["planDigest"].as_str().unwrap_or(""),
        started["run"]["nodes"]["total"]
    );
    let mut status = started["run"]["status"]
        .as_str()
        .unwrap_or("running")
        .to_string();
    if let Err(e) = resolve(server, &run, resolutions) {
        return fail(e, 2);
    }
    let mut cancelled = false;
    // A run that can go on only once the host decides an effect stops here (exit 3), once it
    // has stayed so, with nothing recorded, for a second.
    let mut waiting_since: Option<(u64, Instant)> = None;
    let mut last_check = Instant::now();
    while status == "running" {
        if INTERRUPTED.load(Ordering::SeqCst) && !cancelled {
            cancelled = true;
            println!("cancelling run {run} (Ctrl-C)");
            if let Ok(r) = s.call(
                "graph/run/cancel",
                json!({"runId": run, "reason": "cancelled from the terminal (Ctrl-C)"}),
                &run,
            ) {
                println!(
                    "{} attempt(s) in flight fenced",
                    r["fenced"].as_array().map_or(0, Vec::len)
                );
            }
        }
        if let Some(m) = s.recv(Duration::from_millis(100)) {
            if let Some(st) = s.show(&m, &run) {
                status = st;
            }
        }
        if status == "running" && !cancelled && last_check.elapsed() >= Duration::from_millis(250) {
            last_check = Instant::now();
            match (waiting_for_decision(server, &run), waiting_since) {
                (None, _) => waiting_since = None,
                (Some((seq, _)), Some((since_seq, _))) if seq != since_seq => {
                    waiting_since = Some((seq, Instant::now()))
                }
                (Some((seq, _)), None) => waiting_since = Some((seq, Instant::now())),
                (Some((_, effects)), Some((_, since))) => {
                    if since.elapsed() >= Duration::from_secs(1) {
                        let first = effects[0].split(' ').nth(1).unwrap_or("NODE").to_string();
                        return fail(
                            format!(
                                "run {run} cannot go on: it waits for a decision on {} — a tool call a stopped process intended, whose outcome nothing recorded. Check whether it happened, then run again with --resolve {first}=applied[:JSON] (it did; JSON is the tool's output) or --resolve {first}=not-applied (it did not; the node may make the call again)",
                                effects.join("; ")
                            ),
                            EXIT_RECONCILE,
                        );
                    }
                }
            }
        }
    }
    let read = s
        .call(
            "graph/run/read",
            json!({"runId": run, "includeContent": true}),
            &run,
        )
        .unwrap_or_default();
    let counts = &read["run"]["nodes"];
    println!(
        "run {run} {status} in {:.1} s: {} of {} node(s) succeeded, {} step(s), {} effect(s)",
        t.elapsed().as_secs_f64(),
        counts["succeeded"],
        counts["total"],
        read["run"]["usage"]["steps"],
        read["run"]["usage"]["effects"]
    );
    if let Some(e) = read["run"]["error"].as_object() {
        println!(
            "error: {}: {}",
            e["code"].as_str().unwrap_or(""),
            e["message"].as_str().unwrap_or("")
        );
    }
    if let Some(o) = read["run"]["outputs"].as_object().filter(|o| !o.is_empty()) {
        println!(
            "outputs: {}",
            serde_json::to_string_pretty(o).unwrap_or_default()
        );
    }
    u8::from(status != "succeeded")
}

/// The run store of a state directory, its kind detected from the files when not given.
fn open(state: &StateArgs) -> Result<Arc<dyn RolloutStore>, String> {
    let dir = state.state_dir.join(RUNS_DIR);
    if !dir.is_dir() {
        return Err(format!(
            "no graph runs in {}; pass the --state-dir a server ran graphs in",
            state.state_dir.display()
        ));
    }
    let kind = match state.store {
        Some(StoreArg::Jsonl) => StoreKind::Jsonl,
        Some(StoreArg::Sqlite) => StoreKind::Sqlite,
        None if !dir.join(layout::THREADS_DIR).exists()
            && dir.join(layout::SQLITE_FILE).exists() =>
        {
            StoreKind::Sqlite
        }
        None => StoreKind::Jsonl,
    };
    // Read-only: listing and inspecting change no byte of the state directory (they work on
    // read-only snapshots, and report what a server would repair as damage).
    let options = StoreOptions {
        read_only: true,
        ..StoreOptions::default()
    };
    open_runs(kind, &state.state_dir, options)
        .map_err(|e| format!("cannot open the graph runs in {}: {e}", dir.display()))
}

pub fn list(args: ListArgs) -> u8 {
    let store = match open(&args.state) {
        Ok(s) => s,
        Err(e) => return fail(e, 2),
    };
    let (runs, unreadable) = match list_runs(&*store) {
        Ok(r) => r,
        Err(e) => return fail(e, 2),
    };
    println!("{:<28} {:<24} {:<10} PLAN", "RUN", "GRAPH", "STATE");
    for (h, finished) in &runs {
        println!(
            "{:<28} {:<24} {:<10} {}",
            h.run_id,
            h.graph_id,
            if *finished { "finished" } else { "open" },
            h.plan_digest
        );
    }
    for (id, why) in &unreadable {
        println!("{id:<28} unreadable: {why}");
    }
    u8::from(!unreadable.is_empty())
}

fn status_of(v: impl serde::Serialize) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// Exit codes: 0 the run's log verifies and reduces without anomalies, 1 the log is damaged (its
/// first bad seq named) or the reduction met anomalies, 2 no such run / nothing to open.
pub fn inspect(args: InspectArgs) -> u8 {
    let store = match open(&args.state) {
        Ok(s) => s,
        Err(e) => return fail(e, 2),
    };
    let report = match store.verify(&args.run) {
        Ok(r) => r,
        Err(cc_app_server::rollout::StoreError::Corrupt { seq, reason, .. }) => {
            return fail(
                format!("run {}: log BROKEN at seq {seq}: {reason}", args.run),
                1,
            )
        }
        Err(e @ cc_app_server::rollout::StoreError::AnchorMismatch { .. }) => {
            return fail(format!("run {}: log BROKEN: {e}", args.run), 1)
        }
        Err(e) => return fail(format!("run {}: {e}", args.run), 2),
    };
    let mut st = RunState::new(&args.run);
    let mut events = 0u64;
    if let Err(e) = for_each_event(&*store, &args.run, |e| {
        st.apply(e);
        events += 1;
    }) {
        // A log damaged before its end cannot be reduced; the chain check says where.
        return match (report.first_bad_seq, report.reason.as_deref()) {
            (Some(seq), Some(why)) => fail(
                format!("run {}: log BROKEN at seq {seq}: {why}", args.run),
                1,
            ),
            _ => fail(format!("run {}: {e}", args.run), 2),
        };
    }
    let content = args.include_content;
    if args.json {
        let value = json!({
            "run": st.summary(content),
            "nodes": st.node_order.iter().map(|k| st.node_state(&st.nodes[k])).collect::<Vec<_>>(),
            "messages": st.message_order.iter().map(|m| st.message_state(&st.messages[m], content)).collect::<Vec<_>>(),
            "effects": st.effect_order.iter().map(|k| st.effect_state(&st.effects[k], content)).collect::<Vec<_>>(),
            "chain": {"ok": report.ok(), "events": report.events, "firstBadSeq": report.first_bad_seq, "reason": report.reason},
            "anomalies": st.anomalies.iter().map(|a| json!({"seq": a.seq, "message": a.message})).collect::<Vec<_>>(),
            "staleRefusals": st.stale_refusals,
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&value).unwrap_or_default()
        );
        return u8::from(!report.ok() || !st.anomalies.is_empty());
    }
    let summary = st.summary(content);
    println!(
        "run {} of graph {} ({}): {}",
        st.run_id,
        summary.graph_id,
        summary.plan_digest,
        status_of(&summary.status)
    );
    println!(
        "log: {events} events, chain {}; created {}, updated {}",
        if report.ok() {
            "intact".to_string()
        } else {
            format!(
                "BROKEN at seq {}: {}",
                report
                    .first_bad_seq
                    .map_or("-".to_string(), |s| s.to_string()),
                report.reason.clone().unwrap_or_default()
            )
        },
        summary.created_at,
        summary.updated_at
    );
    let c = &summary.nodes;
    println!(
        "nodes: {} total, {} succeeded, {} running, {} ready, {} pending, {} failed, {} skipped, {} cancelled, {} in reconcile",
        c.total, c.succeeded, c.running, c.ready, c.pending, c.failed, c.skipped, c.cancelled, c.reconcile
    );
    println!(
        "usage: {} step(s), {} effect(s), {} token(s); {} stale report(s) refused; {} anomaly(ies)",
        summary.usage.steps,
        summary.usage.effects,
        summary.usage.tokens,
        st.stale_refusals,
        st.anomalies.len()
    );
    if let Some(e) = &summary.error {
        println!("error: {}: {}", e.code, e.message);
    }
    println!(
        "\n{:<28} {:<9} {:<10} {:>8} {:>6}  THREAD",
        "NODE", "KIND", "STATUS", "ATTEMPTS", "FENCE"
    );
    for k in &st.node_order {
        let n = st.node_state(&st.nodes[k]);
        println!(
            "{:<28} {:<9} {:<10} {:>8} {:>6}  {}{}",
            n.key,
            status_of(&n.kind),
            status_of(&n.status),
            n.attempts,
            n.fence.map_or("-".into(), |f| f.to_string()),
            n.thread_id.unwrap_or_default(),
            n.error
                .map(|e| format!("  [{}: {}]", e.code, e.message))
                .unwrap_or_default()
        );
    }
    if !st.message_order.is_empty() {
        println!("\nMESSAGE  FROM -> TO  (CHANNEL#SEQ)  STATUS  DELIVERIES  VALUE");
        for id in &st.message_order {
            let m = &st.messages[id];
            let end = |r: &cc_app_server::protocol::GraphPortRef| {
                format!("{}:{}", r.node.as_deref().unwrap_or("(run)"), r.port)
            };
            let status = match m.custody {
                Custody::Run => "sent",
                Custody::Attempt(_) => "delivered",
                Custody::Acked => "acked",
            };
            let value = if content {
                m.value.to_string()
            } else {
                format!("{} (hidden; --include-content)", m.value_digest)
            };
            println!(
                "{id}  {} -> {}  ({}#{})  {status}  {}  {value}",
                end(&m.from),
                end(&m.to),
                m.channel,
                m.channel_seq,
                m.deliveries
            );
        }
    }
    if !st.effect_order.is_empty() {
        println!("\nEFFECT  NODE  TOOL  STATUS  APPLIED  RECEIPT");
        for k in &st.effect_order {
            let e = st.effect_state(&st.effects[k], content);
            let receipt = e.receipt.as_ref().map_or("none".to_string(), |r| {
                let result = match &r.result {
                    Some(res) => serde_json::to_string(res).unwrap_or_default(),
                    None => "(result hidden; --include-content)".into(),
                };
                format!(
                    "{} {} thread {} item {} {result}",
                    status_of(r.source),
                    r.result_digest,
                    r.thread_id.as_deref().unwrap_or("-"),
                    r.item_id.as_deref().unwrap_or("-")
                )
            });
            println!(
                "{}  {}  {}  {}  {}  {receipt}",
                e.idempotency_key,
                e.node,
                e.tool,
                status_of(&e.status),
                e.applied.map_or("unknown".into(), |a| a.to_string())
            );
        }
    }
    if content {
        if let Some(o) = summary.outputs.as_ref().filter(|o| !o.is_empty()) {
            println!(
                "\noutputs: {}",
                serde_json::to_string_pretty(o).unwrap_or_default()
            );
        }
    }
    for a in &st.anomalies {
        println!("ANOMALY at seq {}: {}", a.seq, a.message);
    }
    u8::from(!report.ok() || !st.anomalies.is_empty())
}
