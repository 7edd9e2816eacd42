//! `cc-app-server`: the command-line face of the embeddable engine — a stdio server for hosts
//! that want a child process, tools to inspect and verify rollouts, and the demo.

#[macro_use]
mod log;
mod agent_cmd;
mod chat;
mod demo;
mod framing;
mod graph_cmd;
mod render;
mod rollout_cmd;
mod serve;
mod stdio;
mod term;

use clap::parser::ValueSource;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// CC App Server: wire v1 JSON-RPC over stdio, durable hash-chained rollouts, and the demo.
#[derive(Parser)]
#[command(
    name = "cc-app-server",
    version,
    about,
    long_about = "CC App Server: an agent app server that speaks wire v1 JSON-RPC (Threads, Turns, \
Items, Tools, Approvals) and keeps every thread in a durable, hash-chained rollout.\n\n\
Start here:\n  cc-app-server demo                     run a scripted turn with an approval, end to end\n  \
cc-app-server serve --state-dir DIR    serve JSON-RPC lines on stdin/stdout\n  \
cc-app-server agent --input-format stream-json --output-format stream-json   the platform's agent stream\n  \
cc-app-server rollout verify --state-dir DIR   check every thread's hash chain",
    after_help = "Diagnostics go to stderr; set the level with --log-level or CC_APP_SERVER_LOG \
(off, error, warn, info, debug, trace). Docs: docs/cli.md"
)]
struct Cli {
    /// Diagnostics level on stderr (overrides CC_APP_SERVER_LOG; default warn).
    #[arg(long, global = true, value_enum, value_name = "LEVEL")]
    log_level: Option<log::Level>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve wire v1 over stdio: JSON-RPC, one object per line (UTF-8) on stdin and stdout.
    #[command(
        long_about = "Serve wire v1 over stdio: one JSON-RPC object per line, UTF-8, on \
stdin; responses, notifications and approval/decide requests on stdout (and nothing else). \
Diagnostics go to stderr.\n\n\
Bounds: a line over --max-line-bytes (1 MiB) is answered with -32600 and skipped; invalid UTF-8 \
with -32700. When the engine's inbound queue (--queue-cap) is full, stdin is simply read more \
slowly (backpressure); so is it when the client reads stdout slowly. A client that stops reading \
stdout for --stall-timeout-ms while --outbound-cap messages or 8 MiB are waiting loses the \
transport: the server says so on stderr and exits 3.\n\n\
EOF on stdin: in-flight requests and turns get up to --drain-timeout-ms to finish, then the \
server shuts down with everything durable and exits 0.\n\n\
The published platform clients launch `serve --app-server [--app-server-state-dir DIR] \
[--app-server-store jsonl|sqlite] [--app-server-queue-cap N] [--app-server-state-path PATH]`: \
the --app-server-* names are aliases of --state-dir, --store and --queue-cap; with --app-server \
the state directory may be omitted ($XDG_STATE_HOME/cc-app-server, else \
~/.local/state/cc-app-server). CC_APP_SERVER_SCRIPT=FILE stands for --script and \
CC_APP_SERVER_KERNEL=scripted|openai for --kernel when the flag is absent."
    )]
    Serve(ServeArgs),
    /// The platform's agent stream: NDJSON stream-json on stdin/stdout, turns on this engine.
    #[command(
        long_about = "The lightweight entry the platform's AgentSession drives: `agent \
--input-format stream-json --output-format stream-json [--include-partial-messages] \
[--interactive-approvals] [--resume ID | --session ID] [--fork-session] [--permission-mode MODE] \
[--model M] [--provider P]`. Each user message on stdin runs as a turn on the same engine `serve` \
runs, in-process, with a JSONL rollout in --state-dir; stdout carries only the platform's \
canonical stream events, one per line (system/init first, a result per turn, system/end at \
EOF). Approvals are asked on the stream (approval_request) with --interactive-approvals and \
fail closed otherwise. Kernel selection is serve's (--kernel, --script, CC_APP_SERVER_SCRIPT, \
CC_APP_SERVER_KERNEL, the model flags). See docs/agent-stream.md."
    )]
    Agent(agent_cmd::AgentArgs),
    /// Chat with the agent in this terminal: streamed answers, approval prompts, Ctrl-C interrupts.
    #[command(
        long_about = "An interactive session on the same engine `serve` runs, in-process: type a \
message, watch the answer stream, approve or decline each tool call with its binding shown. \
Ctrl-C interrupts the running turn; Ctrl-D (or /quit) ends the session. /compact has the model \
summarise the thread so far. The thread is kept in --state-dir; --thread resumes one.\n\n\
With --kernel openai (the default) it talks to any OpenAI-compatible server: --base-url \
http://localhost:11434/v1 for Ollama, http://localhost:8080/v1 for llama.cpp's server, or \
OpenAI itself with CC_APP_SERVER_API_KEY or OPENAI_API_KEY set. See docs/kernels.md."
    )]
    Chat(chat::ChatArgs),
    /// Inspect and verify rollouts (the durable per-thread logs) in a state directory.
    #[command(subcommand)]
    Rollout(RolloutCommand),
    /// Run the demo: an in-process server, one scripted turn with one approval, rollout verified.
    #[command(
        long_about = "Run the demo end to end, in-process: open a server on a fresh JSONL \
state directory, start a thread, run the scripted turn (reasoning, a tool that needs approval, a \
streamed answer), answer the approval through the Rust client's handler (printing the binding it \
decides on), print every notification as it arrives, then verify the rollout - with the store's \
own verifier and, when python3 is available, with the independent scripts/verify_rollout.py. \
Exits non-zero if any step fails."
    )]
    Demo(demo::DemoArgs),
    /// Facts about the wire schema this binary was built with.
    #[command(subcommand)]
    Schema(SchemaCommand),
    /// Graph Kernel: validate a graph, run it (same flags as serve), inspect or list runs.
    #[command(subcommand)]
    Graph(graph_cmd::GraphCommand),
}

#[derive(Subcommand)]
enum SchemaCommand {
    /// Print the schema digest (sha256 of the schema's RFC 8785 form), as `initialize` reports it.
    Digest,
}

/// Which rollout store a state directory uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StoreArg {
    /// One append-only JSON-lines file per thread (the default).
    Jsonl,
    /// One SQLite database per state directory.
    Sqlite,
}

/// Where the rollouts live.
#[derive(Args, Debug, Clone, Default)]
pub struct StateArgs {
    /// State directory (created 0700 by `serve` if missing; must not be group/world-writable).
    #[arg(long, value_name = "DIR")]
    pub state_dir: PathBuf,
    /// Rollout store [default: jsonl for serve; detected from the directory for rollout tools].
    #[arg(long, value_enum)]
    pub store: Option<StoreArg>,
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Where the rollouts live, as `serve.rs` reads it: filled from `location` by `resolve`.
    #[arg(skip)]
    pub state: StateArgs,
    #[command(flatten)]
    pub location: ServeLocation,
    #[command(flatten)]
    pub key: rollout_cmd::KeyArgs,
    /// Open threads whose head anchor is missing or damaged instead of refusing them; what nothing
    /// vouches for is recorded in the thread and reported by `rollout verify`.
    #[arg(long)]
    pub accept_unanchored: bool,
    /// When an append counts as done: sync (fdatasync before any host sees it), buffered (written
    /// to the OS, synced at shutdown) or ephemeral (memory until shutdown).
    #[arg(long, value_enum, default_value = "sync")]
    pub durability: DurabilityArg,
    /// Engine inbound queue, in messages; when full, stdin is read more slowly (backpressure).
    #[arg(long, visible_alias = "app-server-queue-cap", value_name = "N", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    pub queue_cap: u32,
    /// Outbound queue, in messages (also capped at 8 MiB). When it is full the engine waits for
    /// the client to read (and reads stdin more slowly meanwhile).
    #[arg(long, value_name = "N", default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..))]
    pub outbound_cap: u32,
    /// How long the outbound queue may stay full without the client reading a single message
    /// before the transport is closed (exit 3). A client that keeps reading, however slowly, is
    /// never cut off.
    #[arg(long, value_name = "MS", default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub stall_timeout_ms: u64,
    /// Memory for the tail cache of recent events (thread/read and thread/resume are served from
    /// it), in MiB over all threads; 0 turns it off. Bounded: the least recently used tails go.
    #[arg(long, value_name = "MIB", default_value_t = 32, value_parser = clap::value_parser!(u32).range(0..=4096))]
    pub tail_cache_mib: u32,
    /// Turns whose kernel runs at once (one thread each).
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_running_turns: u32,
    /// Turns waiting for a runner (status queued); one more is refused with -32001.
    #[arg(long, value_name = "N", default_value_t = 256)]
    pub max_queued_turns: u32,
    /// Bytes one turn may stream (answer, reasoning and tool output together); past it the
    /// stream is stopped and the turn fails as outputLimitExceeded.
    #[arg(long, value_name = "BYTES", default_value_t = 8 << 20, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_turn_output_bytes: u64,
    /// Longest input line in bytes, not counting the newline.
    #[arg(long, value_name = "BYTES", default_value_t = 1 << 20, value_parser = clap::value_parser!(u32).range(64..))]
    pub max_line_bytes: u32,
    /// The agent kernel that runs turns.
    #[arg(long, value_enum, default_value = "scripted")]
    pub kernel: KernelArg,
    #[command(flatten)]
    pub model: ModelArgs,
    /// The tool executor [default: workspace with --kernel openai, echo with scripted].
    #[arg(long, value_enum)]
    pub tools: Option<ToolsArg>,
    /// Script for the scripted kernel (JSON: {"steps": [...]}); a thread's agentOptions.script
    /// overrides it. Without one, the kernel echoes the user's text.
    #[arg(long, value_name = "FILE")]
    pub script: Option<PathBuf>,
    /// The workspace approvals are bound to (its path goes into every binding's workspace digest)
    /// [default: the current directory].
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// When tools need a human decision.
    #[arg(long, value_enum, default_value = "ask")]
    pub approval_policy: PolicyArg,
    /// How long an approval/decide request may stay unanswered (then it fails closed).
    #[arg(long, value_name = "MS", default_value_t = 60_000)]
    pub approval_timeout_ms: u64,
    /// After EOF on stdin, how long in-flight requests and turns may run before shutdown.
    #[arg(long, value_name = "MS", default_value_t = 10_000)]
    pub drain_timeout_ms: u64,
}

/// Where `serve` keeps its rollouts, in the names `serve` always had and the ones the published
/// platform clients pass (`serve --app-server --app-server-state-dir DIR …`).
#[derive(Args, Debug, Clone, Default)]
pub struct ServeLocation {
    /// Speak the CC App Server JSON-RPC on stdio (what serve always does); the flag the published
    /// clients launch with. With it the state directory may be omitted: it defaults to
    /// $XDG_STATE_HOME/cc-app-server, else ~/.local/state/cc-app-server (created 0700).
    #[arg(long)]
    pub app_server: bool,
    /// State directory (created 0700 if missing; must not be group/world-writable). Required
    /// unless --app-server or --app-server-state-path is given.
    #[arg(long, visible_alias = "app-server-state-dir", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Exactly where the rollouts live: with the jsonl store the state directory itself; with
    /// sqlite the database file, which this server names rollout.sqlite3 (its directory is the
    /// state directory). Exclusive with --state-dir.
    #[arg(
        long = "app-server-state-path",
        value_name = "PATH",
        conflicts_with = "state_dir"
    )]
    pub state_path: Option<PathBuf>,
    /// Rollout store [default: jsonl, or sqlite when --app-server-state-path names rollout.sqlite3].
    #[arg(long, visible_alias = "app-server-store", value_enum)]
    pub store: Option<StoreArg>,
}

/// Names the scripted kernel's script when `--script` is absent (same format), so a client that
/// cannot pass flags (the published `AppServerClient`, `AgentSession`) can still choose it.
pub const SCRIPT_ENV: &str = "CC_APP_SERVER_SCRIPT";
/// Chooses the kernel (`scripted` or `openai`) when `--kernel` is absent.
pub const KERNEL_ENV: &str = "CC_APP_SERVER_KERNEL";

/// Why a command line cannot be served: a usage error (exit 2, like the parser's own) or a
/// startup failure (exit 1).
pub enum ResolveError {
    Usage(String),
    Startup(String),
}

/// The per-user default state directory: `$XDG_STATE_HOME/cc-app-server` when that is an
/// absolute path, else `$HOME/.local/state/cc-app-server`.
pub fn default_state_dir() -> Result<PathBuf, String> {
    let from = |name: &str| {
        std::env::var_os(name)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    if let Some(xdg) = from("XDG_STATE_HOME") {
        return Ok(xdg.join("cc-app-server"));
    }
    match from("HOME") {
        Some(home) => Ok(home.join(".local").join("state").join("cc-app-server")),
        None => Err(
            "no state directory given and neither XDG_STATE_HOME nor HOME is set to an absolute \
             path; pass --state-dir (or --app-server-state-dir)"
                .into(),
        ),
    }
}

/// The kernel from `CC_APP_SERVER_KERNEL`, for a command whose `--kernel` was not given.
pub fn kernel_from_env() -> Result<Option<KernelArg>, String> {
    match std::env::var(KERNEL_ENV) {
        Err(_) => Ok(None),
        Ok(text) if text.trim().is_empty() => Ok(None),
        Ok(text) => KernelArg::from_str(text.trim(), true)
            .map(Some)
            .map_err(|_| format!("{KERNEL_ENV}={text:?} is not a kernel; use scripted or openai")),
    }
}

/// The script from `CC_APP_SERVER_SCRIPT` (a path; empty means unset).
pub fn script_from_env() -> Option<PathBuf> {
    std::env::var_os(SCRIPT_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

impl ServeLocation {
    /// The state directory and store these flags name.
    fn resolve(&self) -> Result<StateArgs, ResolveError> {
        if let Some(path) = &self.state_path {
            let names_db = path.file_name().and_then(|n| n.to_str())
                == Some(cc_app_server::rollout::layout::SQLITE_FILE);
            let store = self.store.unwrap_or(if names_db {
                StoreArg::Sqlite
            } else {
                StoreArg::Jsonl
            });
            let state_dir = match store {
                StoreArg::Jsonl => path.clone(),
                StoreArg::Sqlite if names_db => match path.parent() {
                    Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                    _ => PathBuf::from("."),
                },
                StoreArg::Sqlite => {
                    return Err(ResolveError::Startup(format!(
                        "--app-server-state-path {}: with the sqlite store this names the \
                         database file, which this server keeps as {} in its state directory; \
                         pass --app-server-state-path DIR/{} or --app-server-state-dir DIR",
                        path.display(),
                        cc_app_server::rollout::layout::SQLITE_FILE,
                        cc_app_server::rollout::layout::SQLITE_FILE,
                    )))
                }
            };
            return Ok(StateArgs {
                state_dir,
                store: Some(store),
            });
        }
        let state_dir =
            match (&self.state_dir, self.app_server) {
                (Some(dir), _) => dir.clone(),
                (None, true) => default_state_dir().map_err(ResolveError::Startup)?,
                (None, false) => return Err(ResolveError::Usage(
                    "the following required arguments were not provided:\n  --state-dir <DIR>\n\n\
                     (or --app-server, which defaults it to $XDG_STATE_HOME/cc-app-server, else \
                     ~/.local/state/cc-app-server)"
                        .into(),
                )),
            };
        Ok(StateArgs {
            state_dir,
            store: self.store,
        })
    }
}

impl ServeArgs {
    /// Fills `state` from the location flags, and the kernel and script from the environment
    /// where the command line left them open (`kernel_given`: --kernel was on the command line).
    pub fn resolve(&mut self, kernel_given: bool) -> Result<(), ResolveError> {
        self.state = self.location.resolve()?;
        if !kernel_given {
            if let Some(kernel) = kernel_from_env().map_err(ResolveError::Startup)? {
                self.kernel = kernel;
            }
        }
        if self.script.is_none() {
            self.script = script_from_env();
        }
        Ok(())
    }

    /// `serve`'s defaults for every flag, on `state_dir`: what an in-process host of the same
    /// engine (`agent`) starts from, so it chooses its kernel, tools and bounds exactly as
    /// `serve` would.
    pub fn defaults(state_dir: &Path) -> ServeArgs {
        let command = ServeArgs::augment_args(clap::Command::new("serve").no_binary_name(true));
        let matches = command
            .try_get_matches_from([std::ffi::OsStr::new("--state-dir"), state_dir.as_os_str()])
            .expect("serve's defaults parse");
        let mut args = ServeArgs::from_arg_matches(&matches).expect("serve's defaults parse");
        args.state = StateArgs {
            state_dir: state_dir.to_path_buf(),
            store: Some(StoreArg::Jsonl),
        };
        args
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DurabilityArg {
    Sync,
    Buffered,
    Ephemeral,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KernelArg {
    /// The deterministic scripted kernel (tests, demos, fixtures).
    Scripted,
    /// A model behind an OpenAI-compatible Chat Completions endpoint (OpenAI, Ollama, vLLM,
    /// llama.cpp, LM Studio, OpenRouter).
    Openai,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ToolsArg {
    /// read_file, write_file, list_directory, run_command, confined to --workspace.
    Workspace,
    /// Echoes each call's arguments (demos and fixtures).
    Echo,
}

/// Where the OpenAI-compatible kernel finds its model (used with --kernel openai).
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// The API root [default: CC_APP_SERVER_BASE_URL, else https://api.openai.com/v1].
    #[arg(long, value_name = "URL")]
    pub base_url: Option<String>,
    /// The model name [default: CC_APP_SERVER_MODEL]; a thread's agentOptions.model overrides it.
    #[arg(long, value_name = "NAME")]
    pub model: Option<String>,
    /// The system instructions; a thread's agentOptions.instructions overrides them.
    #[arg(long, value_name = "TEXT")]
    pub instructions: Option<String>,
    /// Model requests per turn before it fails with maxStepsExceeded.
    #[arg(long, value_name = "N", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_steps: u32,
    /// Seconds to wait for the model server to connect, answer, or send the next chunk.
    #[arg(long, value_name = "SECS", default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..))]
    pub request_timeout_secs: u64,
    /// Seconds the model may send nothing but keep-alives (SSE comments, empty chunks) before
    /// the turn fails with modelStalled.
    #[arg(long, value_name = "SECS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub model_idle_timeout_secs: u64,
    /// Seconds one model call may take in all, however steadily it streams (modelDeadlineExceeded).
    #[arg(long, value_name = "SECS", default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..))]
    pub model_call_deadline_secs: u64,
    /// Send the API key over plain http:// to a host that is not loopback (refused otherwise:
    /// anyone on the path reads it).
    #[arg(long)]
    pub allow_insecure_http: bool,
    /// Read the API key from this file (its first line; the file should be readable only by
    /// you) instead of the environment [env: CC_APP_SERVER_API_KEY_FILE].
    #[arg(long, value_name = "PATH")]
    pub api_key_file: Option<PathBuf>,
}

impl ModelArgs {
    /// The API key file named by `--api-key-file` or CC_APP_SERVER_API_KEY_FILE, if any.
    pub fn key_file_path(&self) -> Option<PathBuf> {
        self.api_key_file.clone().or_else(|| {
            std::env::var_os("CC_APP_SERVER_API_KEY_FILE")
                .filter(|p| !p.is_empty())
                .map(PathBuf::from)
        })
    }

    /// The API key from `--api-key-file` (or CC_APP_SERVER_API_KEY_FILE), if one is named.
    fn key_from_file(&self) -> Result<Option<String>, String> {
        let Some(path) = self.key_file_path() else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read the API key file {}: {e}", path.display()))?;
        let key = text.lines().next().unwrap_or("").trim().to_string();
        if key.is_empty() {
            return Err(format!("the API key file {} is empty", path.display()));
        }
        Ok(Some(key))
    }

    /// The kernel config: flags, then CC_APP_SERVER_* variables; the key from `--api-key-file`,
    /// else the environment (CC_APP_SERVER_API_KEY, else OPENAI_API_KEY), never from a flag.
    pub fn kernel(&self) -> Result<cc_app_server::openai::OpenAiCompatibleKernel, String> {
        let env = cc_app_server::openai::OpenAiConfig::from_env();
        let config = cc_app_server::openai::OpenAiConfig::new(
            self.base_url.clone().unwrap_or(env.base_url.clone()),
            self.model.clone().unwrap_or(env.model.clone()),
        )
        .with_api_key(self.key_from_file()?)
        .with_api_key_from_env()
        .with_instructions(self.instructions.clone())
        .with_max_steps(self.max_steps)
        .with_request_timeout(std::time::Duration::from_secs(self.request_timeout_secs))
        .with_idle_timeout(std::time::Duration::from_secs(self.model_idle_timeout_secs))
        .with_call_deadline(std::time::Duration::from_secs(
            self.model_call_deadline_secs,
        ))
        .allow_insecure_http(self.allow_insecure_http);
        cc_app_server::openai::OpenAiCompatibleKernel::new(config).map_err(|e| e.to_string())
    }
}

/// The workspace tools over `workspace`, refusing the server's own files whatever the approval
/// policy: the state directory, the key files, the server's binary (docs/security.md).
pub fn workspace_tools(
    workspace: &std::path::Path,
    state_dir: &std::path::Path,
    key_files: &[Option<PathBuf>],
) -> Result<cc_app_server::workspace_tools::WorkspaceTools, String> {
    let mut protected = vec![state_dir.to_path_buf()];
    protected.extend(key_files.iter().flatten().cloned());
    protected.extend(std::env::current_exe().ok());
    cc_app_server::workspace_tools::WorkspaceTools::new(workspace)
        .and_then(|t| t.with_protected(protected))
        .map_err(|e| format!("workspace {}: {e}", workspace.display()))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PolicyArg {
    /// Every tool call asks the client (approval/decide), unless a grant still holds.
    Ask,
    /// Tools run without asking (trusted automation only).
    Auto,
    /// No tool ever runs.
    Deny,
}

#[derive(Subcommand)]
enum RolloutCommand {
    /// List the threads in a state directory (archived ones included, marked).
    List(rollout_cmd::ListArgs),
    /// Print one thread's events, readably (or as the stored JSON lines with --json).
    Show(rollout_cmd::ShowArgs),
    /// Check hash chains and head anchors; exit 1 naming the first bad seq.
    #[command(
        long_about = "Check every event's seq, prevHash and hash, and each thread's head \
anchor, for the named threads or all of them. Exits 0 if all are intact, 1 naming the first bad \
seq otherwise, 2 if the store cannot be opened.\n\n\
The store is opened as a server would open it: a torn tail (a half-written last line after a \
crash) is cut and the repair recorded, and reported here. A server must not be running on the \
directory (the store's lock refuses a second opener)."
    )]
    Verify(rollout_cmd::VerifyArgs),
}

/// True when `--kernel` was given on the command line of subcommand `name`.
fn kernel_given(matches: &clap::ArgMatches, name: &str) -> bool {
    matches
        .subcommand_matches(name)
        .is_some_and(|m| m.value_source("kernel") == Some(ValueSource::CommandLine))
}

/// Exits as the parser does for a usage error (2), or with 1 for a startup failure.
fn resolve_failed(e: ResolveError) -> ExitCode {
    match e {
        ResolveError::Usage(message) => Cli::command()
            .error(clap::error::ErrorKind::MissingRequiredArgument, message)
            .exit(),
        ResolveError::Startup(message) => {
            error!("{message}");
            ExitCode::from(1)
        }
    }
}

/// Keeps this process's memory and environment (the API key, the rollout key) away from the
/// programs it runs: a non-dumpable process's `/proc/PID/environ`, `mem` and `maps` are not
/// readable by other processes of the same user (only by root or a ptrace-capable process), and
/// it cannot be attached to with ptrace or dump core. Children get their own setting back when
/// they exec, so the tools' commands run as usual.
fn protect_process() {
    #[cfg(target_os = "linux")]
    // SAFETY: prctl(PR_SET_DUMPABLE) only changes an attribute of this process.
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
    }
}

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    log::init(cli.log_level);
    protect_process();
    let resolved = match &mut cli.command {
        Command::Serve(args) => args.resolve(kernel_given(&matches, "serve")),
        Command::Graph(graph_cmd::GraphCommand::Run(args)) => args.serve.resolve(
            matches
                .subcommand_matches("graph")
                .is_some_and(|g| kernel_given(g, "run")),
        ),
        _ => Ok(()),
    };
    if let Err(e) = resolved {
        return resolve_failed(e);
    }
    if !matches!(cli.command, Command::Serve(_) | Command::Agent(_)) {
        // Report tools die quietly when their reader goes away (`rollout show X | head`), like
        // any Unix filter. `serve` and `agent` keep SIGPIPE ignored: they turn EPIPE into a
        // diagnostic.
        // SAFETY: resetting a signal disposition to its default, before any other thread exists.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    let code = match cli.command {
        Command::Serve(args) => serve::run(args),
        Command::Agent(args) => agent_cmd::run(args, kernel_given(&matches, "agent")),
        Command::Chat(args) => chat::run(args),
        Command::Rollout(RolloutCommand::List(args)) => rollout_cmd::list(args),
        Command::Rollout(RolloutCommand::Show(args)) => rollout_cmd::show(args),
        Command::Rollout(RolloutCommand::Verify(args)) => rollout_cmd::verify(args),
        Command::Demo(args) => demo::run(args),
        Command::Graph(graph_cmd::GraphCommand::Validate(args)) => graph_cmd::validate(args),
        Command::Graph(graph_cmd::GraphCommand::Run(args)) => graph_cmd::run(args),
        Command::Graph(graph_cmd::GraphCommand::Inspect(args)) => graph_cmd::inspect(args),
        Command::Graph(graph_cmd::GraphCommand::List(args)) => graph_cmd::list(args),
        Command::Schema(SchemaCommand::Digest) => {
            println!("{}", cc_agent_protocol::schema_digest());
            0
        }
    };
    ExitCode::from(code)
}
