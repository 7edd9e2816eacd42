//! `cc-app-server demo`: the whole product in one run, in-process — handshake, a thread, a turn
//! with a tool that needs approval, the approval answered through the Rust client's handler, every
//! notification as it arrives, and the rollout verified twice (by the store and, when python3 is
//! there, by the independent stdlib-only verifier). It exits non-zero if any of that fails.

use crate::render;
use cc_app_server::approval::operation_digest;
use cc_app_server::client::{ApprovalHandler, Client, ClientConfig};
use cc_app_server::engine::{AppServer, ServerConfig};
use cc_app_server::protocol::{
    AcceptForSession, AcceptForTurn, AcceptOnce, ApprovalDecision, ApprovalRequest, Cancel, Decline,
};
use cc_app_server::rollout::{layout, StoreKind};
use cc_app_server::scripted::ScriptedKernel;
use clap::{Args, ValueEnum};
use serde_json::json;
use std::collections::HashSet;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

const THREAD: &str = "demo";

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Where the demo's rollout goes; wiped and recreated (0700) at start. Only a directory that
    /// is empty or holds nothing but a rollout store is ever wiped.
    #[arg(long, value_name = "DIR", default_value = "demo-state")]
    state_dir: PathBuf,
    /// What the demo's approval handler answers (decline and cancel show the fail-closed paths).
    #[arg(long, value_enum, default_value = "accept-once")]
    decision: DecisionArg,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum DecisionArg {
    AcceptOnce,
    AcceptForTurn,
    AcceptForSession,
    Decline,
    Cancel,
}

impl DecisionArg {
    fn decision(self) -> ApprovalDecision {
        match self {
            DecisionArg::AcceptOnce => ApprovalDecision::AcceptOnce(AcceptOnce {}),
            DecisionArg::AcceptForTurn => {
                ApprovalDecision::AcceptForTurn(AcceptForTurn { permissions: None })
            }
            DecisionArg::AcceptForSession => {
                ApprovalDecision::AcceptForSession(AcceptForSession { permissions: None })
            }
            DecisionArg::Decline => ApprovalDecision::Decline(Decline {
                reason: Some("declined in the demo".into()),
            }),
            DecisionArg::Cancel => ApprovalDecision::Cancel(Cancel { reason: None }),
        }
    }

    fn accepts(self) -> bool {
        matches!(
            self,
            DecisionArg::AcceptOnce | DecisionArg::AcceptForTurn | DecisionArg::AcceptForSession
        )
    }

    /// The terminal status the turn must reach.
    fn expected_status(self) -> &'static str {
        if self == DecisionArg::Cancel {
            "interrupted"
        } else {
            "completed"
        }
    }
}

/// One lock for everything the demo prints, so the handler's block and the event stream (two
/// threads) never interleave mid-line.
static PRINT: Mutex<()> = Mutex::new(());

fn say(text: &str) {
    let _g = PRINT.lock().unwrap_or_else(|p| p.into_inner());
    println!("{text}");
}

/// The demo's approval handler: prints the binding it is asked to decide on, checks that the
/// operation digest really is the digest of the operation shown, then answers.
struct DemoApprover {
    decision: DecisionArg,
    /// Nonces whose approval/requested line the event stream has printed.
    announced: Arc<(Mutex<HashSet<String>>, Condvar)>,
    digest_mismatch: Mutex<bool>,
}

impl ApprovalHandler for DemoApprover {
    fn decide(&self, params: &ApprovalRequest) -> Result<ApprovalDecision, String> {
        let b = &params.binding;
        {
            // Print after the stream's approval/requested line, for a readable order.
            let (set, cv) = &*self.announced;
            let guard = set.lock().unwrap_or_else(|p| p.into_inner());
            let _ = cv.wait_timeout_while(guard, Duration::from_secs(2), |s| !s.contains(&b.nonce));
        }
        let recomputed = operation_digest(&params.operation);
        let matches = recomputed == b.operation_digest;
        if !matches {
            *self
                .digest_mismatch
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = true;
        }
        let decision = if matches {
            self.decision.decision()
        } else {
            DecisionArg::Decline.decision()
        };
        let name = serde_json::to_value(&decision)
            .ok()
            .and_then(|v| v["kind"].as_str().map(str::to_string))
            .unwrap_or_default();
        say(&format!(
            "        ┌ approval/decide — the client's ApprovalHandler decides on this binding:\n\
             \x20       │ tool       {} {}\n\
             \x20       │ operation  {} ({})\n\
             \x20       │ policy     {}\n\
             \x20       │ workspace  {}\n\
             \x20       │ item       {} in turn {}\n\
             \x20       │ nonce      {}\n\
             \x20       │ expires    {}\n\
             \x20       └ decision   {name}",
            params.operation.tool,
            render::compact(&params.operation.arguments),
            b.operation_digest,
            if matches {
                "recomputed from the operation: matches"
            } else {
                "DOES NOT match the operation: declining"
            },
            b.policy_digest,
            b.workspace_digest.as_deref().unwrap_or("(none)"),
            b.item_id,
            b.turn_id,
            b.nonce,
            b.expires_at,
        ));
        Ok(decision)
    }
}

/// Collects what went wrong; the demo keeps going so the user sees every failure at once.
#[derive(Default)]
struct Checks {
    failures: Vec<String>,
}

impl Checks {
    fn check(&mut self, ok: bool, what: &str) {
        if ok {
            say(&format!("  ok    {what}"));
        } else {
            say(&format!("  FAIL  {what}"));
            self.failures.push(what.to_string());
        }
    }
}

pub fn run(args: DemoArgs) -> u8 {
    match run_inner(&args) {
        Ok(checks) if checks.failures.is_empty() => {
            say(
                "\ndemo passed: every notification was durable first, the approval was bound to \
                 its operation, and the rollout verifies.",
            );
            say(&format!(
                "next: cc-app-server rollout show {THREAD} --state-dir {}",
                args.state_dir.display()
            ));
            0
        }
        Ok(checks) => {
            say(&format!(
                "\ndemo FAILED: {} check(s) failed: {}",
                checks.failures.len(),
                checks.failures.join("; ")
            ));
            1
        }
        Err(e) => {
            eprintln!("cc-app-server demo: {e}");
            1
        }
    }
}

fn run_inner(args: &DemoArgs) -> Result<Checks, String> {
    let dir = &args.state_dir;
    prepare_state_dir(dir)?;
    let workspace = std::env::current_dir()
        .map(|d| d.display().to_string())
        .unwrap_or_else(|_| "demo".into());
    let mut config = ServerConfig::new(dir);
    config.store = StoreKind::Jsonl;
    config.kernel = Arc::new(ScriptedKernel::new(ScriptedKernel::demo_script()));
    config.workspace = workspace.clone();
    config.approval_timeout = Duration::from_secs(30);
    let server = AppServer::open(config)
        .map_err(|e| format!("cannot open the server on {}: {e}", dir.display()))?;

    say(&format!(
        "CC App Server demo — in-process server, JSONL rollout in {}\n",
        dir.display()
    ));
    let announced = Arc::new((Mutex::new(HashSet::new()), Condvar::new()));
    let approver = Arc::new(DemoApprover {
        decision: args.decision,
        announced: Arc::clone(&announced),
        digest_mismatch: Mutex::new(false),
    });
    let handler: Arc<dyn ApprovalHandler> = approver.clone();
    let client = Client::connect(&server, Some(handler), ClientConfig::default())
        .map_err(|e| format!("the handshake failed: {e}"))?;
    let init = &client.initialize_result;
    say(&format!(
        "initialize: wire v{}{}, server {} {}\n  features {}\n  schema   {}",
        init["protocolVersion"],
        if init["downgraded"] == true {
            " (downgraded)"
        } else {
            ""
        },
        init["server"]["name"].as_str().unwrap_or("?"),
        init["server"]["version"].as_str().unwrap_or("?"),
        init["features"],
        init["schemaDigest"].as_str().unwrap_or("?"),
    ));
    let started = client
        .request(
            "thread/start",
            json!({"threadId": THREAD, "title": "Demo: write a note", "metadata": {"source": "cc-app-server demo"}}),
        )
        .map_err(|e| format!("thread/start failed: {e}"))?;
    say(&format!(
        "thread/start: {} {:?}",
        started["thread"]["id"].as_str().unwrap_or("?"),
        started["thread"]["title"].as_str().unwrap_or("")
    ));
    let prompt = "Please write a hello note to notes/hello.txt.";
    let turn = client
        .request(
            "turn/start",
            json!({"threadId": THREAD, "input": [{"type": "text", "text": prompt}]}),
        )
        .map_err(|e| format!("turn/start failed: {e}"))?;
    let turn_id = turn["turn"]["id"].as_str().unwrap_or_default().to_string();
    say(&format!(
        "turn/start:   {turn_id} {} (runs asynchronously) — user: {prompt:?}\n",
        turn["turn"]["status"].as_str().unwrap_or("?")
    ));
    say("   seq  notification       essentials (each was durable in the rollout before it was sent)");

    let mut checks = Checks::default();
    let mut last_seq = 0;
    let mut in_order = true;
    let mut durable_first = true;
    let mut answer = String::new();
    let terminal = loop {
        let Some(n) = client.next_notification(Duration::from_secs(30)) else {
            return Err(
                "no notification for 30 s; the turn is stuck (run with --log-level debug)".into(),
            );
        };
        let p = &n["params"];
        let seq = p["eventSeq"].as_u64().unwrap_or(0);
        in_order &= seq > last_seq;
        last_seq = seq;
        // Durable first: the event behind the notification is already readable from the store.
        durable_first &= server
            .store()
            .read(THREAD, seq.saturating_sub(1), 1)
            .is_ok_and(|page| page.events.first().is_some_and(|e| e.seq == seq));
        if n["method"] == "item/delta" {
            answer.push_str(p["delta"]["text"].as_str().unwrap_or_default());
        }
        say(&render::notification_line(&n));
        if n["method"] == "approval/requested" {
            if let Some(nonce) = p["binding"]["nonce"].as_str() {
                let (set, cv) = &*announced;
                set.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(nonce.to_string());
                cv.notify_all();
            }
        }
        if n["method"] == "turn/completed" {
            break n;
        }
    };
    if !answer.is_empty() {
        say(&format!("\nassistant (from the streamed deltas): {answer}"));
    }

    say("\nchecks:");
    let status = terminal["params"]["turn"]["status"].as_str().unwrap_or("?");
    let expected = args.decision.expected_status();
    checks.check(
        status == expected,
        &format!("the turn ended {status} (expected {expected})"),
    );
    checks.check(
        in_order,
        "notifications arrived in strictly increasing seq order",
    );
    checks.check(
        durable_first,
        "every notification's event was already in the rollout",
    );
    checks.check(
        !*approver
            .digest_mismatch
            .lock()
            .unwrap_or_else(|p| p.into_inner()),
        "the binding's operation digest is the digest of the operation shown",
    );
    let ran = server.stats().tools_executed.load(Ordering::SeqCst);
    let want = u64::from(args.decision.accepts());
    checks.check(
        ran == want,
        &format!("the tool ran {ran} time(s) (expected {want}: it runs only when approved)"),
    );
    match server.store().terminal_evidence(THREAD, &turn_id) {
        Ok(Some(ev)) => checks.check(
            ev.payload["status"] == status,
            &format!(
                "terminal evidence: seq {} turnCompleted {}",
                ev.seq,
                ev.payload["status"].as_str().unwrap_or("?")
            ),
        ),
        other => checks.check(false, &format!("terminal evidence recorded ({other:?})")),
    }
    client.close();
    server.shutdown();
    match server.store().verify(THREAD) {
        Ok(r) => checks.check(
            r.ok(),
            &format!(
                "store verify: {} events, hash chain and head anchor intact (head seq {} {})",
                r.events, r.head_seq, r.head_hash
            ),
        ),
        Err(e) => checks.check(false, &format!("store verify: {e}")),
    }
    let log = layout::thread_log(dir, THREAD);
    let anchor = layout::anchor(dir, THREAD);
    independent_verify(&log, &anchor, &mut checks);
    say(&format!("\nrollout: {}", log.display()));
    Ok(checks)
}

/// Runs scripts/verify_rollout.py (stdlib only) on the JSONL file when python3 and the script are
/// both there; says plainly when the check is skipped.
fn independent_verify(log: &Path, anchor: &Path, checks: &mut Checks) {
    let candidates = [
        PathBuf::from("scripts/verify_rollout.py"),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/verify_rollout.py"),
    ];
    let Some(script) = candidates.iter().find(|p| p.is_file()) else {
        say("  skip  independent verifier: scripts/verify_rollout.py not found (run from the repository root)");
        return;
    };
    let output = Command::new("python3")
        .arg(script)
        .arg(log)
        .arg(anchor)
        .output();
    match output {
        Err(e) => say(&format!(
            "  skip  independent verifier: python3 is not runnable ({e})"
        )),
        Ok(out) => {
            let text = String::from_utf8_lossy(if out.status.success() {
                &out.stdout
            } else {
                &out.stderr
            })
            .trim()
            .to_string();
            checks.check(
                out.status.success(),
                &format!("independent verifier (python3 scripts/verify_rollout.py): {text}"),
            );
        }
    }
}

/// What a rollout store leaves in its state directory; nothing else is ever deleted.
fn is_store_entry(name: &str) -> bool {
    name == layout::LOCK_FILE
        || name == layout::THREADS_DIR
        || name == layout::ANCHORS_DIR
        || name.starts_with(layout::SQLITE_FILE)
}

/// Wipes `dir` (only if it is a store's directory or empty) and recreates it 0700.
fn prepare_state_dir(dir: &Path) -> Result<(), String> {
    if dir.exists() {
        if !dir.is_dir() {
            return Err(format!(
                "{} exists and is not a directory; pass another --state-dir",
                dir.display()
            ));
        }
        let entries =
            std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            if !is_store_entry(&name) {
                return Err(format!(
                    "refusing to wipe {}: it holds {name:?}, which is not part of a rollout store; \
                     pass a new or earlier demo directory to --state-dir",
                    dir.display()
                ));
            }
        }
        std::fs::remove_dir_all(dir).map_err(|e| format!("cannot clear {}: {e}", dir.display()))?;
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .and_then(|()| std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)))
        .map_err(|e| format!("cannot create {}: {e}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_store_directories_are_wiped() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state");
        prepare_state_dir(&dir).unwrap();
        std::fs::create_dir(dir.join("threads")).unwrap();
        std::fs::write(dir.join("LOCK"), b"").unwrap();
        prepare_state_dir(&dir).unwrap();
        assert!(!dir.join("threads").exists());
        std::fs::write(dir.join("thesis.tex"), b"precious").unwrap();
        let err = prepare_state_dir(&dir).unwrap_err();
        assert!(err.contains("refusing to wipe"), "{err}");
        assert!(dir.join("thesis.tex").exists());
    }

    #[test]
    fn decisions_map_to_wire_names() {
        let v = serde_json::to_value(DecisionArg::AcceptForTurn.decision()).unwrap();
        assert_eq!(v, json!({"kind": "acceptForTurn"}));
    }
}
