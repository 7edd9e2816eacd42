//! The stdio transport: one in-process `Connection` between a reader thread (stdin → engine) and a
//! writer thread (engine → stdout), in the style of rust-analyzer's lsp-server `stdio.rs`. It adds
//! what a pipe needs and the engine cannot see: the line cap enforced while reading (never
//! buffering more than one cap), UTF-8 checking, backpressure both ways (a full inbound queue
//! stops reading stdin; a slow stdout slows the engine, which stops taking lines, which stops
//! reading stdin), and an orderly end (drain on EOF, a diagnostic when the client stops reading
//! stdout).

use crate::framing::{Frame, LineFramer};
use cc_app_server::engine::{AppServer, Connection, RecvError, SendError};
use cc_app_server::protocol::error_code;
use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::{json, Value};
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How the transport behaves at its edges.
#[derive(Debug, Clone, Copy)]
pub struct StdioOptions {
    /// Longest line accepted, in bytes, not counting the `\n`.
    pub max_line_bytes: usize,
    /// After stdin ends: how long in-flight requests and running turns may take before the
    /// server shuts down (and interrupts what is left).
    pub drain_timeout: Duration,
    /// After shutdown: how long the writer may take to hand the last messages to stdout.
    pub flush_timeout: Duration,
}

impl Default for StdioOptions {
    fn default() -> Self {
        StdioOptions {
            max_line_bytes: 1 << 20,
            drain_timeout: Duration::from_secs(10),
            flush_timeout: Duration::from_secs(5),
        }
    }
}

/// How the transport ended.
#[derive(Debug)]
pub enum Outcome {
    /// stdin reached EOF; in-flight work finished (or hit the drain deadline); all flushed.
    Clean { interrupted_in_flight: bool },
    /// stdin failed with an I/O error; shut down as for EOF.
    InputFailed,
    /// The client stopped reading stdout and the outbound bound closed the connection.
    ReaderStopped,
    /// Writing stdout failed (the client closed its end).
    OutputFailed,
    /// The last messages could not be written within the flush timeout after shutdown.
    FlushTimedOut,
}

impl Outcome {
    /// The process exit code for this outcome (documented in docs/cli.md).
    pub fn exit_code(&self) -> i32 {
        match self {
            Outcome::Clean { .. } => 0,
            Outcome::InputFailed => 1,
            Outcome::ReaderStopped | Outcome::OutputFailed | Outcome::FlushTimedOut => 3,
        }
    }
}

/// Counters shared by the two threads and the supervisor. With the engine's own count of
/// unanswered lines (`Connection::unanswered`), they decide when a drain is done.
#[derive(Default)]
struct Flow {
    /// turn/started seen minus turn/completed seen.
    active_turns: AtomicI64,
    /// approval/requested seen minus approval/resolved seen.
    waiting_approvals: AtomicI64,
    /// Messages and bytes written to stdout.
    written: AtomicU64,
    written_bytes: AtomicU64,
}

struct Shared {
    conn: Connection,
    out: Mutex<Box<dyn Write + Send>>,
    flow: Flow,
    max_line_bytes: usize,
}

impl Shared {
    fn out(&self) -> MutexGuard<'_, Box<dyn Write + Send>> {
        self.out.lock().unwrap_or_else(|p| p.into_inner())
    }
}

enum Event {
    InputEnded,
    InputFailed(io::Error),
    OutputFailed(io::Error),
    ConnectionClosed,
}

/// Serves one connection of `server` over `input`/`output` until stdin ends or the transport
/// fails, then shuts the server down (making everything durable) and reports how it ended.
pub fn serve(
    server: &AppServer,
    input: impl Read + Send + 'static,
    output: impl Write + Send + 'static,
    options: StdioOptions,
) -> io::Result<Outcome> {
    let conn = server
        .connect()
        .map_err(|e| io::Error::other(format!("cannot connect to the engine: {e}")))?;
    let shared = Arc::new(Shared {
        conn,
        out: Mutex::new(Box::new(io::BufWriter::with_capacity(64 * 1024, output))),
        flow: Flow::default(),
        max_line_bytes: options.max_line_bytes,
    });
    let (tx, rx) = mpsc::channel();
    {
        let (shared, tx) = (Arc::clone(&shared), tx.clone());
        std::thread::Builder::new()
            .name("cc-stdio-reader".into())
            .spawn(move || read_loop(&shared, input, &tx))?;
    }
    {
        // The stall rule can close the connection while the writer is stuck in a write the
        // client never reads: this thread sees the close without polling (no idle wake-up).
        let (shared, tx) = (Arc::clone(&shared), tx.clone());
        std::thread::Builder::new()
            .name("cc-stdio-watch".into())
            .spawn(move || {
                shared.conn.wait_closed();
                let _ = tx.send(Event::ConnectionClosed);
            })?;
    }
    let writer = {
        let shared = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("cc-stdio-writer".into())
            .spawn(move || write_loop(&shared, &tx))?
    };
    let outcome = supervise(server, &shared, &rx, options);
    // Everything the engine acknowledged is durable once shutdown returns (it flushes the store).
    server.shutdown();
    let outcome = match outcome {
        Outcome::Clean { .. } | Outcome::InputFailed => {
            if wait_finished(&writer, options.flush_timeout) {
                outcome
            } else {
                Outcome::FlushTimedOut
            }
        }
        other => other,
    };
    debug!(
        "transport ended: {} messages ({} bytes) written to stdout",
        shared.flow.written.load(Ordering::Relaxed),
        shared.flow.written_bytes.load(Ordering::Relaxed)
    );
    Ok(outcome)
}

fn wait_finished(handle: &JoinHandle<()>, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while !handle.is_finished() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
}

/// Watches both threads and the connection; returns once the transport is over.
fn supervise(
    server: &AppServer,
    shared: &Shared,
    rx: &mpsc::Receiver<Event>,
    options: StdioOptions,
) -> Outcome {
    let closed_by_bound = || {
        error!(
            "the client stopped reading stdout: the outbound queue stayed full and the client \
             read nothing for the stall deadline, so the transport was closed (the engine \
             finished its durable work). Keep reading stdout, or raise --stall-timeout-ms"
        );
        Outcome::ReaderStopped
    };
    loop {
        // Every end arrives as an event (the watch thread reports a close), so this waits with
        // no timeout.
        match rx.recv() {
            Ok(Event::InputEnded) => {
                info!("stdin closed; finishing in-flight work");
                let drained = drain(shared, options.drain_timeout);
                if !shared.conn.is_open()
                    && server.stats().closed_slow_consumers.load(Ordering::Relaxed) > 0
                {
                    return closed_by_bound();
                }
                return Outcome::Clean {
                    interrupted_in_flight: !drained,
                };
            }
            Ok(Event::InputFailed(e)) => {
                error!("reading stdin failed: {e}; shutting down");
                drain(shared, options.drain_timeout);
                return Outcome::InputFailed;
            }
            Ok(Event::OutputFailed(e)) => {
                error!("writing stdout failed: {e}; the client closed its end, shutting down");
                return Outcome::OutputFailed;
            }
            Ok(Event::ConnectionClosed) => {
                if !shared.conn.is_open() {
                    let slow = server.stats().closed_slow_consumers.load(Ordering::Relaxed);
                    if slow == 0 {
                        warn!("the engine closed the connection");
                    }
                    return closed_by_bound();
                }
            }
            Err(mpsc::RecvError) => return closed_by_bound(),
        }
    }
}

/// Waits until every forwarded request is answered and no turn is running (a turn waiting for an
/// approval the closed stdin can never deliver does not count), or the deadline. True if drained.
fn drain(shared: &Shared, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    let flow = &shared.flow;
    loop {
        // The engine counts what it accepted and answered itself: no guessing from the text
        // which lines it will answer (a response-shaped line it cannot parse gets -32700 too).
        let pending = shared.conn.unanswered();
        let turns = flow.active_turns.load(Ordering::SeqCst);
        let approvals = flow.waiting_approvals.load(Ordering::SeqCst);
        // A turn has at most one approval outstanding, so `turns - approvals` are the turns
        // that can still make progress without the client.
        if !shared.conn.is_open() || (pending == 0 && turns - approvals <= 0) {
            return true;
        }
        if Instant::now() >= deadline {
            warn!(
                "stdin closed {:.1}s ago and {pending} request(s) and {turns} turn(s) are still in \
                 flight; shutting down now (running turns end as interrupted, durably). Raise \
                 --drain-timeout-ms to wait longer",
                timeout.as_secs_f64()
            );
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn read_loop(shared: &Shared, input: impl Read, tx: &Sender<Event>) {
    let mut framer = LineFramer::new(input, shared.max_line_bytes);
    loop {
        match framer.next_frame() {
            Ok(Frame::Line(bytes)) => {
                // Blank lines (a trailing "\r\n" pair, an interactive Enter) are not messages.
                if bytes.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                match String::from_utf8(bytes) {
                    Ok(text) => {
                        if !forward(shared, text) {
                            let _ = tx.send(Event::ConnectionClosed);
                            return;
                        }
                    }
                    Err(e) => {
                        let at = e.utf8_error().valid_up_to();
                        debug!("refused a line with invalid UTF-8 at byte {at}");
                        let message = format!(
                            "parse error: the line is not valid UTF-8 (first bad byte at offset {at}); send UTF-8 JSON"
                        );
                        if let Err(e) = transport_error(shared, error_code::PARSE, &message) {
                            let _ = tx.send(Event::OutputFailed(e));
                            return;
                        }
                    }
                }
            }
            Ok(Frame::TooLong { seen }) => {
                debug!("refused a line of more than {seen} bytes");
                let message = format!(
                    "invalid request: the line exceeds the {}-byte limit; it was not parsed or run (split large inputs or raise the server's --max-line-bytes)",
                    shared.max_line_bytes
                );
                if let Err(e) = transport_error(shared, error_code::INVALID_REQUEST, &message) {
                    let _ = tx.send(Event::OutputFailed(e));
                    return;
                }
            }
            Ok(Frame::Eof) => {
                let _ = tx.send(Event::InputEnded);
                return;
            }
            Err(e) => {
                let _ = tx.send(Event::InputFailed(e));
                return;
            }
        }
    }
}

/// Hands one line to the engine. A full inbound queue is never answered with a drop: the reader
/// waits `retry_after_ms` and tries again, so the pressure reaches the client as a pipe that
/// accepts no more bytes. False once the connection is closed.
fn forward(shared: &Shared, text: String) -> bool {
    let mut waited = 0u64;
    loop {
        match shared.conn.send(&text) {
            Ok(()) => {
                if waited > 0 {
                    debug!("engine inbound queue was full; held stdin for {waited} ms");
                }
                return true;
            }
            Err(SendError::Overloaded { retry_after_ms }) => {
                let pause = retry_after_ms.clamp(1, 50);
                std::thread::sleep(Duration::from_millis(pause));
                waited += pause;
            }
            Err(SendError::LineTooLarge { max, .. }) => {
                let message = format!(
                    "invalid request: the line exceeds the {max}-byte limit; it was not parsed or run"
                );
                return transport_error(shared, error_code::INVALID_REQUEST, &message).is_ok();
            }
            Err(SendError::Closed) => return false,
        }
    }
}

/// An error the transport answers itself (the line never reached the engine): id null.
fn transport_error(shared: &Shared, code: i64, message: &str) -> io::Result<()> {
    let text = json!({"jsonrpc": "2.0", "id": null, "error": {"code": code, "message": message}})
        .to_string();
    let mut out = shared.out();
    out.write_all(text.as_bytes())?;
    out.write_all(b"\n")?;
    out.flush()
}

fn write_loop(shared: &Shared, tx: &Sender<Event>) {
    const BATCH: usize = 256;
    loop {
        let first = match shared.conn.recv(None) {
            Ok(m) => m,
            Err(RecvError::Timeout) => continue,
            Err(RecvError::Closed) => break,
        };
        let mut out = shared.out();
        let mut result = write_message(shared, &mut **out, &first);
        let mut n = 1;
        while result.is_ok() && n < BATCH {
            match shared.conn.try_recv() {
                Some(m) => result = write_message(shared, &mut **out, &m),
                None => break,
            }
            n += 1;
        }
        if let Err(e) = result.and_then(|()| out.flush()) {
            let _ = tx.send(Event::OutputFailed(e));
            return;
        }
    }
    let _ = shared.out().flush();
    let _ = tx.send(Event::ConnectionClosed);
}

fn write_message(shared: &Shared, out: &mut dyn Write, message: &str) -> io::Result<()> {
    account(&shared.flow, message);
    out.write_all(message.as_bytes())?;
    out.write_all(b"\n")?;
    shared.flow.written.fetch_add(1, Ordering::Relaxed);
    shared
        .flow
        .written_bytes
        .fetch_add(message.len() as u64 + 1, Ordering::Relaxed);
    Ok(())
}

/// Updates the drain counters from one outbound message.
fn account(flow: &Flow, message: &str) {
    let Ok(peek) = serde_json::from_str::<Peek>(message) else {
        return;
    };
    let delta = |counter: &AtomicI64, d: i64| {
        counter.fetch_add(d, Ordering::SeqCst);
    };
    match peek.method.as_deref() {
        Some("turn/started") => delta(&flow.active_turns, 1),
        Some("turn/completed") => delta(&flow.active_turns, -1),
        Some("approval/requested") => delta(&flow.waiting_approvals, 1),
        Some("approval/resolved") => delta(&flow.waiting_approvals, -1),
        _ => {}
    }
}

/// The `method` of an outbound message, read without building it (the engine's own output).
#[derive(Default)]
struct Peek {
    method: Option<String>,
}

impl<'de> serde::Deserialize<'de> for Peek {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct PeekVisitor;
        impl<'de> Visitor<'de> for PeekVisitor {
            type Value = Peek;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON-RPC object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Peek, A::Error> {
                let mut peek = Peek::default();
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "method" => {
                            peek.method = match map.next_value::<Value>()? {
                                Value::String(s) => Some(s),
                                _ => None,
                            };
                        }
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(peek)
            }
        }
        d.deserialize_map(PeekVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outbound_accounting_tracks_turns_and_approvals() {
        let flow = Flow::default();
        account(&flow, r#"{"jsonrpc":"2.0","id":1,"result":{}}"#);
        account(
            &flow,
            r#"{"jsonrpc":"2.0","method":"turn/started","params":{}}"#,
        );
        account(
            &flow,
            r#"{"jsonrpc":"2.0","method":"approval/requested","params":{}}"#,
        );
        account(
            &flow,
            r#"{"jsonrpc":"2.0","id":1,"method":"approval/decide","params":{}}"#,
        );
        assert_eq!(flow.active_turns.load(Ordering::SeqCst), 1);
        assert_eq!(flow.waiting_approvals.load(Ordering::SeqCst), 1);
        account(
            &flow,
            r#"{"jsonrpc":"2.0","method":"approval/resolved","params":{}}"#,
        );
        account(
            &flow,
            r#"{"jsonrpc":"2.0","method":"turn/completed","params":{}}"#,
        );
        assert_eq!(flow.active_turns.load(Ordering::SeqCst), 0);
        assert_eq!(flow.waiting_approvals.load(Ordering::SeqCst), 0);
    }
}
