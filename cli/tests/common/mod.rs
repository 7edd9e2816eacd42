//! A black-box client for the `cc-app-server` binary: spawns it with real pipes and a real private
//! state directory, speaks JSON lines, and checks every message it receives against the schema.

#![allow(dead_code)]

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_cc-app-server");
pub const TIMEOUT: Duration = Duration::from_secs(20);

/// A fresh private (0700) state directory.
pub fn state_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    dir
}

pub fn initialize_params(features: &[&str]) -> Value {
    json!({"protocolVersion": 1, "minimumProtocolVersion": 1, "client": {"name": "conformance", "version": "1"}, "features": features})
}

pub const ALL_FEATURES: &[&str] = &[
    "thread_turn_item",
    "structured_approval",
    "bounded_transport",
];

/// A running server process and its pipes.
pub struct Proc {
    pub child: Child,
    stdin: Option<ChildStdin>,
    lines: Option<Receiver<String>>,
    stderr: Arc<Mutex<String>>,
    next_id: u64,
    /// Messages received while waiting for something else.
    pub seen: Vec<Value>,
}

impl Proc {
    /// `serve --state-dir DIR` plus `extra`, stdout read by a thread.
    pub fn serve(dir: &Path, extra: &[&str]) -> Proc {
        Self::spawn(dir, extra, true)
    }

    /// As `serve`, but nobody ever reads stdout.
    pub fn serve_unread(dir: &Path, extra: &[&str]) -> Proc {
        Self::spawn(dir, extra, false)
    }

    /// As `serve`, with extra environment variables for the server.
    pub fn serve_with_env(dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Proc {
        let mut cmd = Self::command(dir, extra);
        for (k, v) in env {
            cmd.env(k, v);
        }
        Self::start(cmd, true)
    }

    /// A server started from `cmd` (which names the binary, `serve` and its flags), stdout read.
    pub fn from_command(cmd: Command) -> Proc {
        Self::start(cmd, true)
    }

    fn command(dir: &Path, extra: &[&str]) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.arg("serve").arg("--state-dir").arg(dir).args(extra);
        cmd
    }

    fn spawn(dir: &Path, extra: &[&str], read_stdout: bool) -> Proc {
        Self::start(Self::command(dir, extra), read_stdout)
    }

    fn start(mut cmd: Command, read_stdout: bool) -> Proc {
        let mut child = cmd
            .env("CC_APP_SERVER_LOG", "info")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the binary starts");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().unwrap();
        let lines = if read_stdout {
            let (tx, rx) = channel();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
            Some(rx)
        } else {
            // Keep the pipe open and unread for the life of the test.
            std::mem::forget(stdout);
            None
        };
        let stderr = capture_stderr(&mut child);
        Proc {
            child,
            stdin,
            lines,
            stderr,
            next_id: 0,
            seen: Vec::new(),
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Writes raw bytes to stdin.
    pub fn send_raw(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin is open");
        stdin.write_all(bytes).unwrap();
        stdin.flush().unwrap();
    }

    /// Takes stdin for a writer thread (pipelining without deadlock).
    pub fn take_stdin(&mut self) -> ChildStdin {
        self.stdin.take().expect("stdin is open")
    }

    pub fn send(&mut self, message: &Value) {
        let mut line = message.to_string();
        line.push('\n');
        self.send_raw(line.as_bytes());
    }

    pub fn close_stdin(&mut self) {
        self.stdin.take();
    }

    /// The next raw stdout line, or None on timeout / EOF.
    pub fn recv_line(&mut self, timeout: Duration) -> Option<String> {
        self.lines.as_ref().unwrap().recv_timeout(timeout).ok()
    }

    /// True once stdout reached EOF within `timeout`, with nothing else left on it.
    pub fn stdout_ends(&mut self, timeout: Duration) -> Result<(), String> {
        match self.lines.as_ref().unwrap().recv_timeout(timeout) {
            Err(RecvTimeoutError::Disconnected) => Ok(()),
            Err(RecvTimeoutError::Timeout) => Err("stdout still open".into()),
            Ok(line) => Err(format!("unexpected line: {line}")),
        }
    }

    /// The next message, checked against the wire schema.
    pub fn recv(&mut self) -> Value {
        let line = self
            .recv_line(TIMEOUT)
            .unwrap_or_else(|| panic!("no message within {TIMEOUT:?}; stderr:\n{}", self.stderr()));
        let v: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("stdout carried a non-JSON line ({e}): {line:?}"));
        cc_agent_protocol::validate_protocol_message(&v)
            .unwrap_or_else(|e| panic!("the server sent an invalid message: {e}\n{v}"));
        v
    }

    pub fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Sends a request; returns its response, keeping everything else in `seen`.
    pub fn req(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id();
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        self.response_to(&json!(id))
    }

    pub fn response_to(&mut self, id: &Value) -> Value {
        loop {
            let m = self.recv();
            if m.get("method").is_none() && m["id"] == *id {
                return m;
            }
            self.seen.push(m);
        }
    }

    /// The first message (already seen or new) matching `pred`; it is removed from `seen`.
    pub fn wait(&mut self, pred: impl Fn(&Value) -> bool) -> Value {
        if let Some(i) = self.seen.iter().position(&pred) {
            return self.seen.remove(i);
        }
        loop {
            let m = self.recv();
            if pred(&m) {
                return m;
            }
            self.seen.push(m);
        }
    }

    pub fn wait_method(&mut self, method: &str) -> Value {
        self.wait(|m| m["method"] == method)
    }

    pub fn init(&mut self) -> Value {
        let r = self.req("initialize", initialize_params(ALL_FEATURES));
        assert!(r.get("result").is_some(), "{r}");
        r
    }

    /// Waits for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                panic!(
                    "the server did not exit within {timeout:?}; stderr:\n{}",
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGKILL, no chance to flush anything.
    pub fn sigkill(&mut self) {
        // SAFETY: kill(2) on our own child's pid.
        let rc = unsafe { libc::kill(self.pid(), libc::SIGKILL) };
        assert_eq!(rc, 0);
        let status = self.child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The error code of a response.
pub fn code(resp: &Value) -> i64 {
    resp["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("expected an error: {resp}"))
}

/// Runs the binary with `args` to completion: (exit code, stdout, stderr).
pub fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN)
        .args(args)
        .output()
        .expect("the binary runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A scripted thread whose turn asks for one tool.
pub fn tool_script() -> Value {
    json!({"steps": [{"type": "tool", "tool": "fs.write", "arguments": {"path": "a.txt", "text": "x"}}, {"type": "message", "text": "done", "chunks": 2}]})
}

/// Collects a child's stderr on a thread of its own (so a chatty child never blocks on a full
/// pipe); the text so far is in the returned buffer.
pub fn capture_stderr(child: &mut std::process::Child) -> Arc<Mutex<String>> {
    let stderr = Arc::new(Mutex::new(String::new()));
    let mut err = child.stderr.take().expect("stderr is piped");
    let sink = Arc::clone(&stderr);
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = err.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    stderr
}
