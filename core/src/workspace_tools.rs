//! `WorkspaceTools`: the tool set a real agent needs — read, write and list files, run a command —
//! confined to one workspace directory, so that what the user approves is all that happens.
//!
//! Containment (unix): every path is resolved one component at a time with `openat(…,
//! O_NOFOLLOW)` from a directory descriptor opened on the workspace root when the executor was
//! built. `..` pops back to the parent descriptor and is refused at the root; a symlink is read
//! with `readlinkat` and its target resolved the same way (absolute targets must lie under the
//! root), with at most 40 hops. Because each step is relative to a descriptor already inside,
//! renaming or swapping a directory for a symlink mid-resolution cannot lead outside: a swapped
//! component is met by `O_NOFOLLOW` and resolved again. Residual risks, stated plainly: a hard
//! link inside the workspace to a file outside it (same file system) is indistinguishable from
//! a local file; a mount point inside the workspace leads where it is mounted; and `run_command`
//! is *not* path-contained — it runs any program the user approves, with the workspace as its
//! cwd. Its processes are: on Linux every command runs under a warden (see `warden`) that kills
//! everything the command started when it exits, at the deadline, on `interrupt`, when the server
//! dies, or past `max_processes`. On non-unix targets resolution falls back to canonicalize + prefix check, which has a window
//! between the check and the open; documented in docs/kernels.md.

mod command;
#[cfg(target_os = "linux")]
mod warden;

use crate::kernel::{ToolExecutor, ToolSpec};
use crate::protocol::{ToolCall, ToolResult, ToolResultError, ToolResultOk};
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
            root_fd: unix::open_dir(&root)?,
            root,
            limits,
            commands: command::Registry::default(),
        })
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
        let file = self.open_file(&rel, false)?.0;
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

    fn write_file(&self, call: &ToolCall) -> Result<Value, ToolError> {
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
        let (mut file, created) = self.open_file(&rel, true)?;
        file.write_all(content.as_bytes())
            .and_then(|_| file.sync_all())
            .map_err(|e| format!("cannot write {path:?}: {e}"))?;
        Ok(json!({
            "path": path,
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
    fn execute(&self, thread_id: &str, call: &ToolCall) -> ToolResult {
        let result = match call.tool.as_str() {
            "read_file" => self.read_file(call),
            "write_file" => self.write_file(call),
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
    /// Opens a file beneath the root: for reading, or for writing (created with its parent
    /// directories if missing; the bool says whether it was created).
    fn open_file(&self, rel: &Path, write: bool) -> Result<(std::fs::File, bool), ToolError> {
        let shown = rel.display().to_string();
        match unix::resolve(
            &self.root,
            &self.root_fd,
            rel,
            if write {
                unix::Final::Write
            } else {
                unix::Final::Read
            },
        )? {
            unix::Opened::File(f, created) => Ok((f, created)),
            unix::Opened::Dir(_) => Err(format!("{shown:?} is a directory, not a file")),
        }
    }

    fn list(&self, rel: &Path) -> Result<Vec<(String, &'static str, u64)>, ToolError> {
        match unix::resolve(&self.root, &self.root_fd, rel, unix::Final::Dir)? {
            unix::Opened::Dir(fd) => unix::list(fd),
            unix::Opened::File(..) => Err(format!("{:?} is not a directory", rel.display())),
        }
    }
}

#[cfg(unix)]
mod unix {
    use super::ToolError;
    use std::collections::VecDeque;
    use std::ffi::{CString, OsStr, OsString};
    use std::io;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    use std::path::{Component, Path};

    /// Most symlinks one resolution follows (Linux's own limit).
    const MAX_HOPS: usize = 40;

    pub(super) enum Final {
        Read,
        Write,
        Dir,
    }

    pub(super) enum Opened {
        File(std::fs::File, bool),
        Dir(OwnedFd),
    }

    fn cstr(name: &OsStr) -> io::Result<CString> {
        CString::new(name.as_bytes()).map_err(|_| io::ErrorKind::InvalidInput.into())
    }

    fn openat(dir: RawFd, name: &OsStr, flags: libc::c_int) -> io::Result<OwnedFd> {
        let c = cstr(name)?;
        // SAFETY: a valid NUL-terminated name and a directory fd we own; the result is checked.
        let fd = unsafe { libc::openat(dir, c.as_ptr(), flags | libc::O_CLOEXEC, 0o644) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by openat and is owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn readlinkat(dir: RawFd, name: &OsStr) -> io::Result<OsString> {
        let c = cstr(name)?;
        let mut buf = vec![0u8; 4096];
        // SAFETY: `buf` is writable for its length; the length returned is checked.
        let n = unsafe { libc::readlinkat(dir, c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        buf.truncate(n as usize);
        Ok(OsString::from_vec(buf))
    }

    fn mkdirat(dir: RawFd, name: &OsStr) -> io::Result<()> {
        let c = cstr(name)?;
        // SAFETY: as for openat.
        if unsafe { libc::mkdirat(dir, c.as_ptr(), 0o755) } < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::AlreadyExists {
                return Err(e);
            }
        }
        Ok(())
    }

    pub(super) fn open_dir(path: &Path) -> io::Result<OwnedFd> {
        let c = cstr(path.as_os_str())?;
        // SAFETY: as for openat.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: just opened, owned here.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn dup(fd: &OwnedFd) -> io::Result<OwnedFd> {
        fd.try_clone()
    }

    fn is_regular(fd: RawFd) -> io::Result<bool> {
        // SAFETY: `st` is fully written by fstat on success.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(fd, &mut st) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((st.st_mode & libc::S_IFMT) == libc::S_IFREG)
    }

    fn components(p: &Path) -> VecDeque<OsString> {
        p.components()
            .filter_map(|c| match c {
                Component::Normal(n) => Some(n.to_os_string()),
                Component::ParentDir => Some(OsString::from("..")),
                _ => None,
            })
            .collect()
    }

    fn escape(shown: &Path) -> ToolError {
        format!(
            "{:?} leads outside the workspace; only paths inside it are allowed",
            shown.display()
        )
    }

    /// Resolves `rel` beneath `root_fd` component by component (see the module docs).
    pub(super) fn resolve(
        root: &Path,
        root_fd: &OwnedFd,
        rel: &Path,
        last: Final,
    ) -> Result<Opened, ToolError> {
        let io = |e: io::Error| format!("{:?}: {e}", rel.display());
        let mut queue = components(rel);
        let mut stack: Vec<OwnedFd> = vec![dup(root_fd).map_err(io)?];
        let mut hops = 0;
        while let Some(name) = queue.pop_front() {
            if name == ".." {
                if stack.len() == 1 {
                    return Err(escape(rel));
                }
                stack.pop();
                continue;
            }
            let top = stack
                .last()
                .expect("the root stays on the stack")
                .as_raw_fd();
            let is_last = queue.is_empty();
            let opened = if !is_last || matches!(last, Final::Dir) {
                openat(
                    top,
                    &name,
                    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                )
                .map(Opened::Dir)
            } else {
                open_final(top, &name, matches!(last, Final::Write))
            };
            let err = match opened {
                Ok(Opened::Dir(fd)) if !is_last || matches!(last, Final::Dir) => {
                    stack.push(fd);
                    continue;
                }
                Ok(other) => return Ok(other),
                Err(e) => e,
            };
            let code = err.raw_os_error().unwrap_or(0);
            // ELOOP/ENOTDIR/EMLINK (FreeBSD) are what O_NOFOLLOW says about a symlink.
            if matches!(code, libc::ELOOP | libc::ENOTDIR | libc::EMLINK) {
                if let Ok(target) = readlinkat(top, &name) {
                    hops += 1;
                    if hops > MAX_HOPS {
                        return Err(format!("{:?}: too many symlinks", rel.display()));
                    }
                    let target = Path::new(&target);
                    let rest = if target.is_absolute() {
                        let inside = target.strip_prefix(root).map_err(|_| escape(rel))?;
                        stack.truncate(1);
                        components(inside)
                    } else {
                        components(target)
                    };
                    for c in rest.into_iter().rev() {
                        queue.push_front(c);
                    }
                    continue;
                }
            }
            if code == libc::ENOENT && matches!(last, Final::Write) && !is_last {
                mkdirat(top, &name).map_err(io)?;
                queue.push_front(name);
                continue;
            }
            return Err(io(err));
        }
        // The path named a directory (".", "a/..", or ended at one).
        match last {
            Final::Dir => Ok(Opened::Dir(stack.pop().expect("non-empty"))),
            _ => Err(format!("{:?} is a directory, not a file", rel.display())),
        }
    }

    fn open_final(dir: RawFd, name: &OsStr, write: bool) -> io::Result<Opened> {
        let nofollow = libc::O_NOFOLLOW | libc::O_NONBLOCK;
        let (fd, created) = if write {
            match openat(
                dir,
                name,
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | nofollow,
            ) {
                Ok(fd) => (fd, true),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    // Exists (O_EXCL never follows a symlink): open without creating; a symlink
                    // now fails with ELOOP and is resolved by the caller.
                    let fd = openat(dir, name, libc::O_WRONLY | nofollow)?;
                    if !is_regular(fd.as_raw_fd())? {
                        return Err(io::Error::other("not a regular file"));
                    }
                    // SAFETY: truncating our own open descriptor.
                    if unsafe { libc::ftruncate(fd.as_raw_fd(), 0) } < 0 {
                        return Err(io::Error::last_os_error());
                    }
                    (fd, false)
                }
                Err(e) => return Err(e),
            }
        } else {
            let fd = openat(dir, name, libc::O_RDONLY | nofollow)?;
            if !is_regular(fd.as_raw_fd())? {
                // A directory is told apart from a FIFO/device by the caller's message.
                return match openat(dir, name, libc::O_RDONLY | libc::O_DIRECTORY | nofollow) {
                    Ok(d) => Ok(Opened::Dir(d)),
                    Err(_) => Err(io::Error::other("not a regular file")),
                };
            }
            (fd, false)
        };
        // Regular files ignore O_NONBLOCK; it only kept a FIFO from blocking the open.
        Ok(Opened::File(std::fs::File::from(fd), created))
    }

    /// The entries of an open directory: (name, type, size).
    pub(super) fn list(fd: OwnedFd) -> Result<Vec<(String, &'static str, u64)>, ToolError> {
        let raw = fd.as_raw_fd();
        // A second descriptor for fstatat: fdopendir takes ownership of the first.
        let statfd = dup(&fd).map_err(|e| e.to_string())?;
        std::mem::forget(fd);
        // SAFETY: `raw` is an open directory descriptor whose ownership passes to the DIR.
        let dir = unsafe { libc::fdopendir(raw) };
        if dir.is_null() {
            // SAFETY: fdopendir failed, so `raw` is still ours to close.
            unsafe { libc::close(raw) };
            return Err(io::Error::last_os_error().to_string());
        }
        let mut out = Vec::new();
        loop {
            // SAFETY: `dir` is a valid DIR*; readdir returns null at the end.
            let ent = unsafe { libc::readdir(dir) };
            if ent.is_null() {
                break;
            }
            // SAFETY: d_name is NUL-terminated within the dirent.
            let name = unsafe { std::ffi::CStr::from_ptr((*ent).d_name.as_ptr()) };
            let bytes = name.to_bytes();
            if bytes == b"." || bytes == b".." {
                continue;
            }
            // SAFETY: as for fstat; AT_SYMLINK_NOFOLLOW describes the entry itself.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            let ok = unsafe {
                libc::fstatat(
                    statfd.as_raw_fd(),
                    name.as_ptr(),
                    &mut st,
                    libc::AT_SYMLINK_NOFOLLOW,
                )
            } == 0;
            let kind = match st.st_mode & libc::S_IFMT {
                _ if !ok => "unknown",
                libc::S_IFREG => "file",
                libc::S_IFDIR => "directory",
                libc::S_IFLNK => "symlink",
                _ => "other",
            };
            out.push((
                String::from_utf8_lossy(bytes).into_owned(),
                kind,
                if ok { st.st_size as u64 } else { 0 },
            ));
        }
        // SAFETY: closes the DIR and the descriptor it owns.
        unsafe { libc::closedir(dir) };
        Ok(out)
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
        Ok(check)
    }

    fn open_file(&self, rel: &Path, write: bool) -> Result<(std::fs::File, bool), ToolError> {
        let path = self.contained(rel, write)?;
        if path.is_dir() {
            return Err(format!("{:?} is a directory, not a file", rel.display()));
        }
        if write {
            let created = !path.exists();
            std::fs::File::create(&path)
                .map(|f| (f, created))
                .map_err(|e| e.to_string())
        } else {
            std::fs::File::open(&path)
                .map(|f| (f, false))
                .map_err(|e| e.to_string())
        }
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
