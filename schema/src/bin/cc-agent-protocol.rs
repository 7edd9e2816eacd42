//! `cc-agent-protocol`: the schema's command line — validate messages, print the digest, generate
//! every language's types, and gate changes against the frozen v1 baseline.

use cc_agent_protocol::{schema_digest, validate_protocol_message};
use clap::{Parser, Subcommand};
use std::io::{BufRead, BufReader, Read};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "cc-agent-protocol",
    version,
    about = "The CC App Server wire v1 schema: validate, digest, generate, compat"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check one JSON-RPC message per line (FILE, or `-`/nothing for stdin); prints a verdict per
    /// line and exits 1 if any line is invalid.
    Validate {
        /// A file of JSON lines; `-` or nothing reads standard input.
        file: Option<String>,
    },
    /// Print the schema digest (`sha256:` + hex of the RFC 8785 form).
    Digest,
    /// Write every language's generated types; with --check, write nothing and fail if any
    /// checked-in file differs from what would be written.
    Generate {
        /// Compare instead of writing; exit 1 naming each stale file.
        #[arg(long)]
        check: bool,
        /// The workspace root (default: the current directory).
        #[arg(long, default_value = ".")]
        root: std::path::PathBuf,
    },
    /// Classify every difference from a frozen baseline; exit 1 on any breaking change.
    Compat {
        /// The frozen baseline schema.
        #[arg(long, default_value = "schema/baselines/v1.json")]
        baseline: std::path::PathBuf,
        /// The schema to check (default: the canonical schema).
        #[arg(long)]
        schema: Option<std::path::PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Digest => {
            println!("{}", schema_digest());
            ExitCode::SUCCESS
        }
        Command::Validate { file } => validate(file.as_deref()),
        Command::Generate { check, root } => generate(check, &root),
        Command::Compat { baseline, schema } => compat(&baseline, schema.as_deref()),
    }
}

fn read_json(path: &std::path::Path) -> Result<serde_json::Value, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{} is not JSON: {e}", path.display()))
}

fn compat(baseline: &std::path::Path, schema: Option<&std::path::Path>) -> ExitCode {
    let (old, new) = match (
        read_json(baseline),
        schema
            .map(read_json)
            .unwrap_or_else(|| Ok(cc_agent_protocol::schema().clone())),
    ) {
        (Ok(old), Ok(new)) => (old, new),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("cc-agent-protocol: {e}");
            return ExitCode::from(2);
        }
    };
    let findings = cc_agent_protocol::compat::compare(&old, &new);
    let breaking = findings.iter().filter(|f| f.breaking).count();
    for f in &findings {
        let verdict = if f.breaking { "BREAKING" } else { "allowed" };
        println!(
            "{verdict} {} [{}] {}",
            if f.pointer.is_empty() {
                "(root)"
            } else {
                &f.pointer
            },
            f.rule,
            f.detail
        );
    }
    println!("{} differences, {breaking} breaking", findings.len());
    if breaking > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn generate(check: bool, root: &std::path::Path) -> ExitCode {
    let files = cc_agent_protocol::codegen::generate_all(cc_agent_protocol::schema());
    if check {
        let stale = cc_agent_protocol::codegen::stale_files(root, &files);
        for path in &stale {
            eprintln!(
                "stale generated file: {} (run `cargo run -p cc-agent-protocol -- generate`)",
                path.display()
            );
        }
        if stale.is_empty() {
            println!("{} generated files are fresh", files.len());
            return ExitCode::SUCCESS;
        }
        return ExitCode::FAILURE;
    }
    for f in &files {
        let path = root.join(&f.path);
        if let Some(dir) = path.parent() {
            if let Err(e) = std::fs::create_dir_all(dir) {
                eprintln!("cc-agent-protocol: cannot create {}: {e}", dir.display());
                return ExitCode::from(2);
            }
        }
        if let Err(e) = std::fs::write(&path, &f.contents) {
            eprintln!("cc-agent-protocol: cannot write {}: {e}", path.display());
            return ExitCode::from(2);
        }
        println!("wrote {}", f.path.display());
    }
    ExitCode::SUCCESS
}

fn validate(file: Option<&str>) -> ExitCode {
    let reader: Box<dyn Read> = match file {
        None | Some("-") => Box::new(std::io::stdin()),
        Some(path) => match std::fs::File::open(path) {
            Ok(f) => Box::new(f),
            Err(e) => {
                eprintln!("cc-agent-protocol: cannot open {path}: {e}");
                return ExitCode::from(2);
            }
        },
    };
    let mut reader = BufReader::new(reader);
    let (mut ok, mut bad) = (0usize, 0usize);
    let mut buf = Vec::new();
    let mut line_no = 0usize;
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => {
                eprintln!("cc-agent-protocol: read error: {e}");
                return ExitCode::from(2);
            }
        }
        line_no += 1;
        let line = buf.strip_suffix(b"\n").unwrap_or(&buf);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let verdict = match std::str::from_utf8(line) {
            Err(e) => Err(format!("invalid UTF-8 at byte {}", e.valid_up_to())),
            Ok(text) => match serde_json::from_str(text) {
                Err(e) => Err(format!("parse error: {e}")),
                Ok(value) => validate_protocol_message(&value)
                    .map(|kind| format!("{kind:?}"))
                    .map_err(|e| format!("{} ({})", e, e.class.code())),
            },
        };
        match verdict {
            Ok(kind) => {
                ok += 1;
                println!("line {line_no}: valid {kind}");
            }
            Err(reason) => {
                bad += 1;
                println!("line {line_no}: INVALID {reason}");
            }
        }
    }
    println!("{ok} valid, {bad} invalid");
    if bad > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
