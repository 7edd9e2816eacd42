//! `WorkspaceTools`: the tool set a real agent needs — read, write and list files, run a command —
//! confined to one workspace directory, so that what the user approves is all that happens.
//!
//! Containment (unix): every path is resolved one component at a time with `openat(…,
//! O_NOFOLLOW)` from a directory descriptor opened on the workspace root when the executor was
//! built. `..` pops back to the parent descriptor and is refused at the root; a symlink is read
//! with `readlinkat` and its target resolved the same way (absolute targets must lie under the
//! root), with at most 40 hops. Because each step is relative to a descriptor already inside,
//! renaming or swapping a directory for a symlink mid-resolution cannot lead outside: a swapped
//! component is met by `O_NOFOLLOW` and resolved again. The walk notes the (st_dev, st_ino) of
//! every directory it passes and of the file it ends at: protected paths (`with_protected`) and
//! write scopes (`execute_scoped`) are judged on those, not on names. `write_file` replaces a
//! file atomically (temporary in the same directory, fsync, rename, fsync of the directory).
//! Residual risks, stated plainly: a hard link inside the workspace to a file outside it (same
//! file system) is indistinguishable from a local file unless that file is protected; a mount
//! point inside the workspace leads where it is mounted; and `run_command` is *not*
//! path-contained — it runs any program the user approves, with the workspace as its cwd. Its
//! processes are: on Linux every command runs under a warden (see `warden`) that kills everything
//! the command started when it exits, at the deadline, on `interrupt`, when the server dies, or
//! past `max_processes`. On non-unix targets resolution falls back to canonicalize + prefix
//! check, which has a window between the check and the open; documented in docs/kernels.md.

mod command;
#[cfg(unix)]
mod resolve;
#[cfg(target_os = "linux")]
mod warden;

use crate::protocol::{ToolCall, ToolResult, ToolResultError, ToolResultOk};
use crate::{ToolExecutor, ToolSpec};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The most `WorkspaceLimits::max_processes` may be.
#[cfg(target_os = "linux")]
pub const MAX_PROCESSES_CAP: usize = warden::MAX_PROCESSES_CAP;
#[cfg(not(target_os = "linux"))]
pub const MAX_PROCESSES_CAP: usize = 4096;

/// The bounds of the tool set, all enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkspaceLimits {
    /// Largest file `read_file` returns whole; larger files are cut (and say so).
    pub max_read_bytes: usize,
    /// Largest `content` `write_file` accepts.
    pub max_write_bytes: usize,
    /// Most entries `list_directory` returns (the rest are counted, not listed).
    pub max_entries: usize,
    /// Bytes of stdout and of stderr `run_command` keeps, each (the rest is counted, not kept).
    pub max_output_bytes: usize,
    /// `run_command`'s timeout when the call gives none, and the most a call may ask for.
    pub default_timeout: Duration,
    pub max_timeout: Duration,
    /// Most processes one `run_command` may have at once: the command and everything it
    /// started, still running or not yet reaped (1 to `MAX_PROCESSES_CAP`). Past it the whole tree
    /// is killed and the result says `processLimitExceeded`. Linux only, and a sample, not a
    /// fork-time check: the warden counts the tree every 20 ms (every 2 ms past half the bound),
    /// so a fork loop passes the bound by what it forks in that time before the tree dies (a
    /// shell loop of `sleep &` under a bound of 20 reached about 33). Not enforced elsewhere.
    pub max_processes: usize,
}

impl Default for WorkspaceLimits {
    fn default() -> Self {
        WorkspaceLimits {
            max_read_bytes: 256 * 1024,
            max_write_bytes: 512 * 1024,
            max_entries: 1000,
            max_output_bytes: 64 * 1024,
            default_timeout: Duration::from_secs(30),
            max_timeout: Duration::from_secs(600),
            max_processes: 256,
        }
    }
}

/// Environment variables `run_command` passes on; everything else (API keys included) is
/// scrubbed.
const KEPT_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TMPDIR",
    "SYSTEMROOT",
    "WINDIR",
    "TEMP",
    "TMP",
];

/// The workspace tool executor. See the module docs for the containment rules.
#[derive(Debug)]
pub struct WorkspaceTools {
    root: PathBuf,
    #[cfg(unix)]
    root_fd: std::os::fd::OwnedFd,
    limits: WorkspaceLimits,
    commands: command::Registry,
    protected: Vec<ProtectedPath>,
}

/// A path the server owns (its state directory, its rollout key): refused by every tool.
#[derive(Debug)]
struct ProtectedPath {
    /// Absolute; canonical as far as it exists.
    path: PathBuf,
    /// Its root-relative form when it lies under the workspace root.
    rel: Option<PathBuf>,
    /// What it was when it was protected (identity, is a directory), if it existed.
    #[cfg(unix)]
    first: Option<(resolve::Id, bool)>,
}

/// `path` made absolute and canonical as far as it exists (the missing rest appended as named).
fn canonical_as_far_as_exists(path: &Path) -> std::io::Result<PathBuf> {
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()?.join(path)
    };
    let mut rest = Vec::new();
    let mut cur = abs.as_path();
    loop {
        if let Ok(mut c) = std::fs::canonicalize(cur) {
            c.extend(rest.iter().rev());
            return Ok(c);
        }
        match (cur.parent(), cur.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name);
                cur = parent;
            }
            _ => return Ok(abs),
        }
    }
}

/// A refusal or failure, shown to the model and the user as the tool's error result.
type ToolError = String;

fn error(message: impl Into<String>) -> ToolResult {
    let mut message = message.into();
    if message.len() > 1000 {
        let mut end = 1000;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
    }
    ToolResult::Error(ToolResultError { message })
}

fn str_arg<'a>(call: &'a ToolCall, name: &str) -> Result<&'a str, ToolError> {
    call.arguments
        .get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("{} needs a string argument {name:?}", call.tool))
}

impl WorkspaceTools {
    /// Tools confined to `root`, which must be an existing directory.
    pub fn new(root: impl AsRef<Path>) -> std::io::Result<Self> {
        Self::with_limits(root, WorkspaceLimits::default())
    }

    pub fn with_limits(root: impl AsRef<Path>, limits: WorkspaceLimits) -> std::io::Result<Self> {
        if !(1..=MAX_PROCESSES_CAP).contains(&limits.max_processes) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "max_processes is {}; it must be from 1 to {MAX_PROCESSES_CAP}",
                    limits.max_processes
                ),
            ));
        }
        let root = std::fs::canonicalize(root.as_ref())?;
        if !root.is_dir() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("workspace {} is not a directory", root.display()),
            ));
        }
        Ok(WorkspaceTools {
            #[cfg(unix)]
            root_fd: resolve::open_dir(&root)?,
            root,
            limits,
            commands: command::Registry::default(),
            protected: Vec::new(),
        })
    }

    /// Protects the server's own paths — its state directory, its rollout key file, any other
    /// file it owns — from every tool, whatever the approval policy: a path that resolves into a
    /// protected directory or to a protected file is refused, whatever name, symlink or hard
    /// link leads there (compared by (st_dev, st_ino) along the resolution, so renaming a link
    /// in mid-call does not help). A path that does not exist yet is refused by name under the
    /// workspace until it exists, then by identity. Paths outside the workspace may be given:
    /// they cost one `stat` per call and stop hard links to them. Fails (InvalidInput) when the
    /// workspace itself lies inside a protected directory, since every path would be refused.
    pub fn with_protected(mut self, paths: Vec<PathBuf>) -> std::io::Result<Self> {
        for path in paths {
            let path = canonical_as_far_as_exists(&path)?;
            let meta = std::fs::metadata(&path).ok();
            if meta.as_ref().is_some_and(|m| m.is_dir()) && self.contains_root(&path) {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!(
                        "the workspace {} lies inside the protected directory {}; choose a workspace outside the server's state directory",
                        self.root.display(),
                        path.display()
                    ),
                ));
            }
            self.protected.push(ProtectedPath {
                rel: path.strip_prefix(&self.root).ok().map(Path::to_path_buf),
                #[cfg(unix)]
                first: meta.map(|m| {
                    use std::os::unix::fs::MetadataExt;
                    (
                        resolve::Id {
                            dev: m.dev(),
                            ino: m.ino(),
                        },
                        m.is_dir(),
                    )
                }),
                path,
            });
        }
        Ok(self)
    }

    /// Whether the directory `dir` is the root or one of its ancestors (by identity on unix).
    fn contains_root(&self, dir: &Path) -> bool {
        if self.root.starts_with(dir) {
            return true;
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            if let Ok(d) = std::fs::metadata(dir) {
                return self.root.ancestors().any(|a| {
                    std::fs::metadata(a).is_ok_and(|m| m.dev() == d.dev() && m.ino() == d.ino())
                });
            }
        }
        false
    }

    /// Stops every command running for `thread_id` (a turn interrupted): the warden kills each
    /// command's whole process tree and the call returns with `interrupted: true`. Returns how
    /// many commands were running.
    pub fn interrupt(&self, thread_id: &str) -> usize {
        self.commands.stop(Some(thread_id))
    }

    /// Stops every running command, whatever its thread (the server shutting down).
    pub fn interrupt_all(&self) -> usize {
        self.commands.stop(None)
    }

    /// The workspace root (canonical).
    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn limits(&self) -> WorkspaceLimits {
        self.limits
    }

    /// The workspace-relative form of a path the model gave: relative paths as they are,
    /// absolute ones only if they lie under the root. `..` is checked during resolution.
    fn relative(&self, path: &str) -> Result<PathBuf, ToolError> {
        if path.is_empty() {
            return Err("the path is empty; use \".\" for the workspace root".into());
        }
        if path.contains('\0') {
            return Err("the path contains a NUL byte".into());
        }
        let p = Path::new(path);
        if p.is_absolute() {
            return p
                .strip_prefix(&self.root)
                .map(Path::to_path_buf)
                .map_err(|_| format!("{path:?} is outside the workspace; use a path inside it"));
        }
        if p.components().any(|c| matches!(c, Component::Prefix(_))) {
            return Err(format!("{path:?} is outside the workspace"));
        }
        Ok(p.to_path_buf())
    }

    fn read_file(&self, call: &ToolCall) -> Result<Value, ToolError> {
        let path = str_arg(call, "path")?;
        let rel = self.relative(path)?;
        let file = self.open_read(&rel)?;
        let cap = self.limits.max_read_bytes;
        let mut bytes = Vec::new();
        file.take(cap as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| format!("cannot read {path:?}: {e}"))?;
        let truncated = bytes.len() > cap;
        bytes.truncate(cap);
        Ok(json!({
            "path": path,
            "content": String::from_utf8_lossy(&bytes),
            "truncated": truncated,
            "maxReadBytes": cap,
        }))
    }

    /// `write_file`; with a write scope (a graph node's), the resolved target must lie inside it.
    fn write_file(&self, call: &ToolCall, scope: Option<&[String]>) -> Result<Value, ToolError> {
        let path = str_arg(call, "path")?;
        let content = str_arg(call, "content")?;
        if content.len() > self.limits.max_write_bytes {
            return Err(format!(
                "content is {} bytes; write_file takes at most {}",
                content.len(),
                self.limits.max_write_bytes
            ));
        }
        let rel = self.relative(path)?;
        let (created, resolved) = self.write_whole(&rel, content.as_bytes(), scope)?;
        Ok(json!({
            "path": path,
            "resolvedPath": resolved.to_string_lossy(),
            "kind": if created { "add" } else { "update" },
            "bytes": content.len(),
        }))
    }

    fn list_directory(&self, call: &ToolCall) -> Result<Value, ToolError> {
        let path = call
            .arguments
            .get("path")
            .and_then(Value::as_str)
            .unwrap_or(".");
        let rel = self.relative(path)?;
        let mut entries = self.list(&rel)?;
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let total = entries.len();
        entries.truncate(self.limits.max_entries);
        let listed: Vec<Value> = entries
            .into_iter()
            .map(|(name, kind, size)| json!({"name": name, "type": kind, "size": size}))
            .collect();
        Ok(json!({
            "path": path,
            "entries": listed,
            "total": total,
            "truncated": total > self.limits.max_entries,
        }))
    }

    fn run_command(&self, thread_id: &str, call: &ToolCall) -> Result<Value, ToolError> {
        let argv: Vec<String> = match call.arguments.get("argv").and_then(Value::as_array) {
            Some(a) if !a.is_empty() && a.len() <= 256 => a
                .iter()
                .map(|v| {
                    v.as_str()
                        .filter(|s| s.len() <= 4096 && !s.contains('\0'))
                        .map(str::to_string)
                        .ok_or_else(|| {
                            "every argv element must be a string of at most 4096 bytes".to_string()
                        })
                })
                .collect::<Result<_, _>>()?,
            _ => return Err("run_command needs argv: an array of 1 to 256 strings (no shell: pass the program and its arguments)".into()),
        };
        if argv[0].is_empty() {
            return Err("argv[0] (the program) is empty".into());
        }
        let timeout = match call.arguments.get("timeout_ms") {
            None | Some(Value::Null) => self.limits.default_timeout,
            Some(v) => {
                let max = self.limits.max_timeout.as_millis() as u64;
                match v.as_u64() {
                    Some(ms) if (1..=max).contains(&ms) => Duration::from_millis(ms),
                    _ => return Err(format!("timeout_ms must be an integer from 1 to {max}")),
                }
            }
        };
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .current_dir(&self.root)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env_clear();
        for key in KEPT_ENV {
            if let Some(v) = std::env::var_os(key) {
                cmd.env(key, v);
            }
        }
        cmd.env("TERM", "dumb");
        let started = Instant::now();
        let cap = self.limits.max_output_bytes;
        let run = command::run(
            cmd,
            timeout,
            cap,
            self.limits.max_processes,
            &self.commands,
            thread_id,
        )
        .map_err(|e| format!("cannot start {:?}: {e}", argv[0]))?;
        let exit_code = run.status.and_then(|s| s.code());
        #[cfg(unix)]
        let signal = {
            use std::os::unix::process::ExitStatusExt;
            run.status.and_then(|s| s.signal())
        };
        #[cfg(not(unix))]
        let signal: Option<i32> = None;
        let (out, err) = (&run.stdout, &run.stderr);
        Ok(json!({
            "argv": argv,
            "cwd": self.root.to_string_lossy(),
            "exitCode": exit_code,
            "signal": signal,
            "timedOut": run.timed_out,
            "interrupted": run.interrupted,
            "processLimitExceeded": run.process_limit,
            "timeoutMs": timeout.as_millis() as u64,
            "durationMs": started.elapsed().as_millis() as u64,
            "stdout": String::from_utf8_lossy(&out.kept),
            "stderr": String::from_utf8_lossy(&err.kept),
            "stdoutBytes": out.total,
            "stderrBytes": err.total,
            "stdoutTruncated": out.total > cap as u64,
            "stderrTruncated": err.total > cap as u64,
            "outputCapBytes": cap,
            "maxProcesses": self.limits.max_processes,
        }))
    }
}

/// Dropping the executor stops whatever it still runs (the server dying does too: each warden
/// sees its control socket hang up).
impl Drop for WorkspaceTools {
    fn drop(&mut self) {
        self.commands.stop(None);
    }
}

impl ToolExecutor for WorkspaceTools {
    fn interrupt(&self, thread_id: &str) {
        WorkspaceTools::interrupt(self, thread_id);
    }

    fn execute(&self, thread_id: &str, call: &ToolCall) -> ToolResult {
        let result = match call.tool.as_str() {
            "read_file" => self.read_file(call),
            "write_file" => self.write_file(call, None),
            "list_directory" => self.list_directory(call),
            "run_command" => self.run_command(thread_id, call),
            other => Err(format!(
                "unknown tool {other:?}; this workspace offers read_file, write_file, list_directory and run_command"
            )),
        };
        match result {
            Ok(output) => ToolResult::Ok(ToolResultOk { output }),
            Err(message) => error(message),
        }
    }

    /// Scoped: `write_file` may write only where `write_scope` allows, judged on the path it
    /// resolves (symlinks followed, `..` applied) in the same walk that writes it. Entries are
    /// workspace-relative: a directory covers what is below it, a file exactly that file, a path
    /// not there yet what will be at or under it, `*` everything; an empty scope is no scope, as
    /// the graph treats it. Reading and listing are not scoped; `run_command` cannot be (it runs
    /// what the approval gate let through).
    fn execute_scoped(
        &self,
        thread_id: &str,
        call: &ToolCall,
        write_scope: &[String],
    ) -> ToolResult {
        if write_scope.is_empty()
            || write_scope.iter().any(|s| s == "*")
            || call.tool != "write_file"
        {
            return self.execute(thread_id, call);
        }
        match self.write_file(call, Some(write_scope)) {
            Ok(output) => ToolResult::Ok(ToolResultOk { output }),
            Err(message) => error(message),
        }
    }

    fn tool_specs(&self) -> Vec<ToolSpec> {
        let path = json!({"type": "string", "description": "A path relative to the workspace root (absolute paths must lie inside it)."});
        vec![
            ToolSpec {
                name: "read_file".into(),
                description: "Read a UTF-8 text file in the workspace.".into(),
                parameters: json!({"type": "object", "properties": {"path": path}, "required": ["path"], "additionalProperties": false}),
            },
            ToolSpec {
                name: "write_file".into(),
                description: "Create or overwrite a file in the workspace with the given content (parent directories are created).".into(),
                parameters: json!({"type": "object", "properties": {"path": path, "content": {"type": "string"}}, "required": ["path", "content"], "additionalProperties": false}),
            },
            ToolSpec {
                name: "list_directory".into(),
                description: "List a directory in the workspace: names, types and sizes.".into(),
                parameters: json!({"type": "object", "properties": {"path": path}, "required": ["path"], "additionalProperties": false}),
            },
            ToolSpec {
                name: "run_command".into(),
                description: "Run a program in the workspace directory without a shell (no pipes, globs or redirections): argv[0] is the program, the rest its arguments. Output is capped.".into(),
                parameters: json!({"type": "object", "properties": {
                    "argv": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                    "timeout_ms": {"type": "integer", "minimum": 1, "maximum": self.limits.max_timeout.as_millis() as u64}
                }, "required": ["argv"], "additionalProperties": false}),
            },
        ]
    }
}

#[cfg(unix)]
impl WorkspaceTools {
    /// The protected paths as this call sees them: the identity each had when protected and
    /// the one it has now (a path replaced since is protected as both), and by name those under
    /// the root that do not exist now.
    fn protect(&self) -> resolve::Protect {
        use std::os::unix::fs::MetadataExt;
        let mut p = resolve::Protect::default();
        for e in &self.protected {
            let mut add = |id: resolve::Id, dir: bool| {
                if dir {
                    p.dirs.push(id);
                } else {
                    p.files.push(id);
                }
            };
            if let Some((id, dir)) = e.first {
                add(id, dir);
            }
            match std::fs::metadata(&e.path) {
                Ok(m) => add(
                    resolve::Id {
                        dev: m.dev(),
                        ino: m.ino(),
                    },
                    m.is_dir(),
                ),
                Err(_) => {
                    if let Some(rel) = &e.rel {
                        p.missing
                            .push(rel.iter().map(|c| c.to_os_string()).collect());
                    }
                }
            }
        }
        p
    }

    fn resolve(&self, rel: &Path, mode: resolve::Mode) -> Result<resolve::Walk, ToolError> {
        self.resolve_scoped(rel, mode, None)
    }

    fn resolve_scoped(
        &self,
        rel: &Path,
        mode: resolve::Mode,
        scope: Option<&[String]>,
    ) -> Result<resolve::Walk, ToolError> {
        let protect = self.protect();
        let mut rules = resolve::Rules {
            root: &self.root,
            root_fd: &self.root_fd,
            protect: &protect,
            scope: None,
        };
        let Some(declared) = scope else {
            return resolve::resolve(&rules, rel, mode);
        };
        // The scope's entries as they resolve now, by the same rules as the write.
        let entries = declared
            .iter()
            .map(|entry| {
                if entry == "*" {
                    return resolve::ScopeEntry::All;
                }
                let mut e = entry.as_str();
                while let Some(rest) = e.strip_prefix("./") {
                    e = rest;
                }
                match self.relative(e) {
                    Ok(p) if !e.is_empty() => resolve::scope_entry(&rules, &p),
                    _ => resolve::ScopeEntry::Nothing,
                }
            })
            .collect();
        let scope = resolve::Scope {
            entries,
            declared: declared.to_vec(),
        };
        rules.scope = Some(&scope);
        resolve::resolve(&rules, rel, mode)
    }

    /// Opens a regular file beneath the root for reading.
    fn open_read(&self, rel: &Path) -> Result<std::fs::File, ToolError> {
        match self.resolve(rel, resolve::Mode::Read)?.found {
            resolve::Found::File(f) => Ok(f),
            _ => Err(format!("{:?} is a directory, not a file", rel.display())),
        }
    }

    /// Writes `content` as the whole of the file at `rel` (created with its parent directories
    /// if missing); whether it was created. Atomic: the bytes go to a new temporary file in the
    /// target's (resolved, descriptor-held) directory, are fsynced, and the temporary is renamed
    /// over the target, then the directory is fsynced; on any failure the temporary is removed
    /// and the target is as it was. The target's permission bits (and owner, where allowed) are
    /// kept.
    fn write_whole(
        &self,
        rel: &Path,
        content: &[u8],
        scope: Option<&[String]>,
    ) -> Result<(bool, PathBuf), ToolError> {
        use std::os::fd::AsRawFd;
        let walk = self.resolve_scoped(rel, resolve::Mode::Write, scope)?;
        let resolve::Found::Entry { name, existing } = &walk.found else {
            return Err(format!("{:?} is a directory, not a file", rel.display()));
        };
        let dir = walk
            .chain
            .last()
            .expect("the root stays on the chain")
            .fd
            .as_raw_fd();
        let shown = rel.display();
        #[allow(clippy::unnecessary_cast)] // st_mode is u16 on macOS
        let mode = existing.map_or(0o644, |st| st.st_mode as u32 & 0o7777);
        let (tmp, fd) = resolve::create_temporary(dir, mode)
            .map_err(|e| format!("cannot write {shown:?}: cannot create a temporary file: {e}"))?;
        let mut file = std::fs::File::from(fd);
        let written = (|| {
            if let Some(st) = existing {
                // Owner first: chown clears set-id bits, which the chmod then restores. Only root
                // may give a file away; for anyone else the new file is theirs, as any editor's.
                // SAFETY: fchown/fchmod on a descriptor we own.
                unsafe {
                    libc::fchown(file.as_raw_fd(), st.st_uid, st.st_gid);
                    if libc::fchmod(file.as_raw_fd(), mode as libc::mode_t) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
            }
            file.write_all(content)?;
            file.sync_all()?;
            resolve::renameat(dir, &tmp, name)
        })();
        if let Err(e) = written {
            resolve::unlinkat(dir, &tmp);
            return Err(format!(
                "cannot write {shown:?}: {e}; the file is unchanged"
            ));
        }
        resolve::fsync(dir).map_err(|e| {
            format!("{shown:?} was replaced, but its directory could not be synced ({e}): the change may not survive a crash")
        })?;
        Ok((existing.is_none(), walk.resolved()))
    }

    fn list(&self, rel: &Path) -> Result<Vec<(String, &'static str, u64)>, ToolError> {
        let mut walk = self.resolve(rel, resolve::Mode::List)?;
        let dir = walk.chain.pop().expect("the root stays on the chain");
        resolve::list(dir.fd)
    }
}

/// Non-unix fallback: canonicalize + prefix check. Between the check and the open another
/// process could swap a component for a link (a documented residual race).
#[cfg(not(unix))]
impl WorkspaceTools {
    fn contained(&self, rel: &Path, create_parents: bool) -> Result<PathBuf, ToolError> {
        let mut depth: i64 = 0;
        for c in rel.components() {
            match c {
                Component::ParentDir => depth -= 1,
                Component::Normal(_) => depth += 1,
                _ => {}
            }
            if depth < 0 {
                return Err(format!("{:?} leads outside the workspace", rel.display()));
            }
        }
        let full = self.root.join(rel);
        let parent = full.parent().unwrap_or(&self.root).to_path_buf();
        if create_parents {
            std::fs::create_dir_all(&parent).map_err(|e| e.to_string())?;
        }
        let check = if full.exists() {
            std::fs::canonicalize(&full)
        } else {
            std::fs::canonicalize(&parent).map(|p| p.join(full.file_name().unwrap_or_default()))
        }
        .map_err(|e| format!("{:?}: {e}", rel.display()))?;
        if !check.starts_with(&self.root) {
            return Err(format!("{:?} leads outside the workspace", rel.display()));
        }
        // Protected paths by canonical name only (no identities here: a hard link is not seen).
        for p in &self.protected {
            if check.starts_with(&p.path) {
                return Err(format!(
                    "{:?} is inside the server's state directory (or another path the server owns); refused",
                    rel.display()
                ));
            }
        }
        Ok(check)
    }

    fn open_read(&self, rel: &Path) -> Result<std::fs::File, ToolError> {
        let path = self.contained(rel, false)?;
        if path.is_dir() {
            return Err(format!("{:?} is a directory, not a file", rel.display()));
        }
        std::fs::File::open(&path).map_err(|e| e.to_string())
    }

    fn write_whole(
        &self,
        rel: &Path,
        content: &[u8],
        scope: Option<&[String]>,
    ) -> Result<(bool, PathBuf), ToolError> {
        let path = self.contained(rel, true)?;
        if path.is_dir() {
            return Err(format!("{:?} is a directory, not a file", rel.display()));
        }
        let resolved = path.strip_prefix(&self.root).unwrap_or(&path).to_path_buf();
        if let Some(declared) = scope {
            // By canonical names (no identities here).
            let inside = declared.iter().any(|e| {
                canonical_as_far_as_exists(&self.root.join(e.trim_start_matches("./")))
                    .is_ok_and(|c| c.starts_with(&self.root) && path.starts_with(&c))
            });
            if !inside {
                return Err(format!(
                    "write_file {:?} resolves to {:?}, outside the node's write scope {declared:?}; refused",
                    rel.display(),
                    resolved.display()
                ));
            }
        }
        let created = !path.exists();
        let mut file = std::fs::File::create(&path).map_err(|e| e.to_string())?;
        file.write_all(content)
            .and_then(|_| file.sync_all())
            .map_err(|e| format!("cannot write {:?}: {e}", rel.display()))?;
        Ok((created, resolved))
    }

    fn list(&self, rel: &Path) -> Result<Vec<(String, &'static str, u64)>, ToolError> {
        let path = self.contained(rel, false)?;
        let mut out = Vec::new();
        for e in std::fs::read_dir(&path).map_err(|e| e.to_string())? {
            let e = e.map_err(|e| e.to_string())?;
            let md = std::fs::symlink_metadata(e.path()).ok();
            let kind = match &md {
                Some(m) if m.file_type().is_symlink() => "symlink",
                Some(m) if m.is_dir() => "directory",
                Some(m) if m.is_file() => "file",
                Some(_) => "other",
                None => "unknown",
            };
            out.push((
                e.file_name().to_string_lossy().into_owned(),
                kind,
                md.map_or(0, |m| m.len()),
            ));
        }
        Ok(out)
    }
}
