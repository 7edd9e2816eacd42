//! `cc-app-server serve`: turns the command line into a `ServerConfig`, opens the engine and runs
//! the stdio transport on the process's own stdin and stdout.

use crate::stdio::{self, Outcome, StdioOptions};
use crate::{DurabilityArg, KernelArg, PolicyArg, ServeArgs, StoreArg, ToolsArg};
use cc_app_server::approval::ApprovalPolicy;
use cc_app_server::engine::{AppServer, Limits, ServerConfig};
use cc_app_server::rollout::{Durability, StoreKind};
use cc_app_server::scripted::ScriptedKernel;
use serde_json::Value;
use std::fs::File;
use std::io::IsTerminal;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

/// Exit code for configuration or startup failures (2 is clap's usage error).
const STARTUP_FAILED: u8 = 1;

pub fn run(args: ServeArgs) -> u8 {
    let config = match config(&args) {
        Ok(c) => c,
        Err(e) => {
            error!("{e}");
            return STARTUP_FAILED;
        }
    };
    let state_dir = config.state_dir.display().to_string();
    let server = match AppServer::open(config) {
        Ok(s) => s,
        Err(e) => {
            error!("cannot start on {state_dir}: {e}");
            return STARTUP_FAILED;
        }
    };
    // Own descriptors for the protocol streams: no std buffering or locking in between, and
    // nothing else in the process can interleave bytes into stdout through them.
    let streams = std::io::stdin().as_fd().try_clone_to_owned().and_then(|i| {
        Ok((
            File::from(i),
            File::from(std::io::stdout().as_fd().try_clone_to_owned()?),
        ))
    });
    let (input, output) = match streams {
        Ok(s) => s,
        Err(e) => {
            error!("cannot use stdin/stdout: {e}");
            return STARTUP_FAILED;
        }
    };
    if std::io::stdin().is_terminal() {
        eprintln!(
            "cc-app-server: reading JSON-RPC lines from the terminal. Send an initialize request \
             first; Ctrl-D ends the session."
        );
    }
    info!(
        "serving wire v1 on stdio; state dir {state_dir}, schema {}",
        cc_agent_protocol::schema_digest()
    );
    let options = StdioOptions {
        max_line_bytes: args.max_line_bytes as usize,
        drain_timeout: Duration::from_millis(args.drain_timeout_ms),
        ..StdioOptions::default()
    };
    let outcome = match stdio::serve(&server, input, output, options) {
        Ok(o) => o,
        Err(e) => {
            error!("cannot start the stdio transport: {e}");
            server.shutdown();
            return STARTUP_FAILED;
        }
    };
    match &outcome {
        Outcome::Clean {
            interrupted_in_flight: false,
        } => info!("stdin closed; everything is durable, exiting"),
        Outcome::Clean {
            interrupted_in_flight: true,
        } => info!("stdin closed; in-flight turns were interrupted at the drain deadline, durably"),
        Outcome::FlushTimedOut => error!(
            "the last messages could not be written to stdout within the flush timeout (the \
             client is not reading); everything is durable in the rollout"
        ),
        _ => {}
    }
    outcome.exit_code() as u8
}

pub(crate) fn config(args: &ServeArgs) -> Result<ServerConfig, String> {
    let mut config = ServerConfig::new(&args.state.state_dir);
    config.store = match args.state.store.unwrap_or(StoreArg::Jsonl) {
        StoreArg::Jsonl => StoreKind::Jsonl,
        StoreArg::Sqlite => StoreKind::Sqlite,
    };
    config.store_options.durability = match args.durability {
        DurabilityArg::Sync => Durability::Sync,
        DurabilityArg::Buffered => Durability::Buffered,
        DurabilityArg::Ephemeral => Durability::Ephemeral,
    };
    config.store_options.key = args.key.key()?;
    config.store_options.accept_unanchored = args.accept_unanchored;
    config.store_options.tail_cache_bytes = (args.tail_cache_mib as usize) << 20;
    let defaults = Limits::default();
    config.limits = Limits {
        max_line_bytes: args.max_line_bytes as usize,
        inbound_messages: args.queue_cap as usize,
        // A queue must hold at least one line of the largest size.
        inbound_bytes: defaults.inbound_bytes.max(args.max_line_bytes as usize),
        outbound_messages: args.outbound_cap as usize,
        outbound_stall: Duration::from_millis(args.stall_timeout_ms),
        max_running_turns: args.max_running_turns as usize,
        max_queued_turns: args.max_queued_turns as usize,
        max_turn_output_bytes: usize::try_from(args.max_turn_output_bytes).unwrap_or(usize::MAX),
        ..defaults
    };
    config.kernel = match args.kernel {
        KernelArg::Scripted => Arc::new(match &args.script {
            None => ScriptedKernel::default(),
            Some(path) => ScriptedKernel::new(load_script(path)?),
        }),
        KernelArg::Openai => Arc::new(args.model.kernel()?),
    };
    config.policy = match args.approval_policy {
        PolicyArg::Ask => ApprovalPolicy::AskEveryTime,
        PolicyArg::Auto => ApprovalPolicy::AutoApprove,
        PolicyArg::Deny => ApprovalPolicy::DenyAll,
    };
    config.approval_timeout = Duration::from_millis(args.approval_timeout_ms.max(1));
    let workspace = match &args.workspace {
        Some(w) => w.clone(),
        None => std::env::current_dir()
            .map_err(|e| format!("cannot read the current directory ({e}); pass --workspace"))?,
    };
    config.workspace = std::fs::canonicalize(&workspace)
        .map_err(|e| {
            format!(
                "workspace {}: {e}; pass an existing directory to --workspace",
                workspace.display()
            )
        })?
        .display()
        .to_string();
    let tools = args.tools.unwrap_or(match args.kernel {
        KernelArg::Openai => ToolsArg::Workspace,
        KernelArg::Scripted => ToolsArg::Echo,
    });
    if tools == ToolsArg::Workspace {
        config.tools = Arc::new(crate::workspace_tools(
            std::path::Path::new(&config.workspace),
            &args.state.state_dir,
            &[
                args.key.key_file().map(std::path::Path::to_path_buf),
                args.model.key_file_path(),
            ],
        )?);
    }
    Ok(config)
}

fn load_script(path: &std::path::Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the script {}: {e}", path.display()))?;
    let script: Value = serde_json::from_str(&text).map_err(|e| {
        format!(
            "the script {} is not JSON ({e}); see the format in docs/cli.md",
            path.display()
        )
    })?;
    if !script.get("steps").is_some_and(Value::is_array) {
        return Err(format!(
            "the script {} has no \"steps\" array; expected {{\"steps\": [{{\"type\": \"message\", \"text\": \"...\"}}, ...]}}",
            path.display()
        ));
    }
    ScriptedKernel::validate(&script).map_err(|e| {
        format!(
            "the script {}: {e}; see the format in docs/cli.md",
            path.display()
        )
    })?;
    Ok(script)
}
