//! Diagnostics for hosts whose stderr nobody reads (iOS, Android, IDE plugins, Python services):
//! the engine logs through `tracing`; this module installs one process-wide subscriber that hands
//! each record to the host's listener (uniffi) or callback (C ABI) on a delivery thread, through a
//! bounded queue. Logging therefore never blocks the engine and never grows without limit: when
//! the host falls behind, records are dropped and counted (`dropped_log_records`).

use crate::errors::{signed, ListenerError};
use std::ffi::{c_char, c_void, CString};

use cc_app_server::rollout::sync::lock;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// Records queued for the host at most; more are dropped (and counted) until it catches up.
pub(crate) const LOG_QUEUE_CAPACITY: usize = 1024;
/// Longest message handed to a host, in bytes (cut on a character boundary).
const MAX_MESSAGE_BYTES: usize = 4096;

/// How much the host wants to hear, from errors only to everything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, uniffi::Enum)]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

impl LogLevel {
    /// 1 (error) ..= 5 (trace); 0 means off.
    pub(crate) fn rank(self) -> u8 {
        match self {
            LogLevel::Error => 1,
            LogLevel::Warn => 2,
            LogLevel::Info => 3,
            LogLevel::Debug => 4,
            LogLevel::Trace => 5,
        }
    }

    pub(crate) fn from_rank(rank: u8) -> Option<LogLevel> {
        Some(match rank {
            1 => LogLevel::Error,
            2 => LogLevel::Warn,
            3 => LogLevel::Info,
            4 => LogLevel::Debug,
            5 => LogLevel::Trace,
            _ => return None,
        })
    }

    fn of(level: &tracing::Level) -> LogLevel {
        match *level {
            tracing::Level::ERROR => LogLevel::Error,
            tracing::Level::WARN => LogLevel::Warn,
            tracing::Level::INFO => LogLevel::Info,
            tracing::Level::DEBUG => LogLevel::Debug,
            _ => LogLevel::Trace,
        }
    }
}

/// One diagnostic record.
#[derive(Debug, Clone, PartialEq, Eq, uniffi::Record)]
pub struct LogRecord {
    pub level: LogLevel,
    /// Where it comes from, e.g. `cc_app_server::turn`.
    pub target: String,
    /// The message, with any structured fields appended as ` key=value`.
    pub message: String,
    /// When it was logged, in milliseconds since the Unix epoch.
    pub unix_ms: i64,
}

/// Receives the library's diagnostics on a delivery thread (see `set_log_listener`).
#[uniffi::export(with_foreign)]
pub trait LogListener: Send + Sync {
    /// One record. An error (or exception) is counted and delivery goes on.
    fn on_log(&self, record: LogRecord) -> Result<(), ListenerError>;
}

/// Where records go.
enum Sink {
    Foreign(Arc<dyn LogListener>),
    C { callback: CCallback },
}

/// A C callback and its user data. The host promises (cc_set_log_callback's contract) that the
/// user data may be used from the delivery thread.
#[derive(Clone, Copy)]
pub(crate) struct CCallback {
    pub(crate) f: unsafe extern "C" fn(*mut c_void, i32, *const c_char, *const c_char),
    pub(crate) user_data: *mut c_void,
}

// SAFETY: see `CCallback`: thread-safety of user_data is part of the C contract.
unsafe impl Send for CCallback {}

impl Sink {
    fn deliver(&self, record: LogRecord) {
        match self {
            Sink::Foreign(listener) => {
                if listener.on_log(record).is_err() {
                    LISTENER_ERRORS.fetch_add(1, Ordering::Relaxed);
                }
            }
            Sink::C { callback } => {
                let target = CString::new(record.target).unwrap_or_default();
                let message =
                    CString::new(record.message.replace('\0', "\u{FFFD}")).unwrap_or_default();
                // SAFETY: the C contract of cc_set_log_callback; both strings outlive the call.
                unsafe {
                    (callback.f)(
                        callback.user_data,
                        i32::from(record.level.rank()),
                        target.as_ptr(),
                        message.as_ptr(),
                    )
                };
            }
        }
    }
}

/// The running delivery: its queue and its thread.
struct Delivery {
    tx: SyncSender<LogRecord>,
    thread: JoinHandle<()>,
}

/// 0 = off, else the most verbose rank delivered.
static LEVEL: AtomicU8 = AtomicU8::new(0);
static DROPPED: AtomicU64 = AtomicU64::new(0);
static LISTENER_ERRORS: AtomicU64 = AtomicU64::new(0);
static DELIVERY: Mutex<Option<Delivery>> = Mutex::new(None);
/// Whether our subscriber became the process's global default (set once, on first use).
static INSTALLED: OnceLock<bool> = OnceLock::new();

/// Replaces the log destination (`None`: logging off). Returns false if another `tracing`
/// subscriber already owns this process (a Rust host that installed its own), in which case
/// records go there instead.
fn set_sink(sink: Option<Sink>, level: LogLevel) -> bool {
    let installed =
        *INSTALLED.get_or_init(|| tracing::subscriber::set_global_default(Bridge).is_ok());
    let old = {
        let mut delivery = lock(&DELIVERY);
        let old = delivery.take();
        match sink {
            None => LEVEL.store(0, Ordering::SeqCst),
            Some(sink) => {
                let (tx, rx) = sync_channel::<LogRecord>(LOG_QUEUE_CAPACITY);
                let thread = std::thread::Builder::new()
                    .name("cc-log-delivery".into())
                    .spawn(move || {
                        for record in rx {
                            sink.deliver(record);
                        }
                    });
                match thread {
                    Ok(thread) => {
                        *delivery = Some(Delivery { tx, thread });
                        LEVEL.store(level.rank(), Ordering::SeqCst);
                    }
                    // No thread, no delivery: logging stays off rather than blocking anyone.
                    Err(_) => LEVEL.store(0, Ordering::SeqCst),
                }
            }
        }
        old
    };
    tracing::callsite::rebuild_interest_cache();
    if let Some(old) = old {
        // Closing the queue ends the old thread once it has delivered what it holds. A listener
        // that replaces itself from inside its own callback must not wait for itself.
        drop(old.tx);
        if old.thread.thread().id() != std::thread::current().id() {
            let _ = old.thread.join();
        }
    }
    installed
}

pub(crate) fn set_c_callback(callback: Option<CCallback>, level: LogLevel) -> bool {
    set_sink(callback.map(|callback| Sink::C { callback }), level)
}

/// Sends the library's diagnostics at `level` and above to `listener`, on a delivery thread,
/// through a bounded queue (records the listener cannot keep up with are dropped and counted).
/// `None` turns logging off. Replaces any earlier listener or C callback. Returns false if another
/// `tracing` subscriber already owns the process (then records go there).
#[uniffi::export]
pub fn set_log_listener(listener: Option<Arc<dyn LogListener>>, level: LogLevel) -> bool {
    set_sink(listener.map(Sink::Foreign), level)
}

/// Records dropped because the host's listener fell more than the queue's capacity behind.
#[uniffi::export]
pub fn dropped_log_records() -> i64 {
    signed(DROPPED.load(Ordering::Relaxed))
}

/// Records whose listener call raised or returned an error.
#[uniffi::export]
pub fn log_listener_errors() -> i64 {
    signed(LISTENER_ERRORS.load(Ordering::Relaxed))
}

/// The process-wide subscriber: a level check that costs one atomic load, and a non-blocking
/// hand-off. Spans are kept only for their fields: a record logged inside the engine's `turn` or
/// `graph_run` span carries that span's fields (`trace_id=…`, the thread, turn or run), so a
/// host's log joins its rollouts on the trace id (docs/rollout-format.md).
struct Bridge;

/// Live spans' fields and how many handles each has (a span closes when the last goes).
static SPANS: Mutex<Vec<(u64, String, usize)>> = Mutex::new(Vec::new());
static NEXT_SPAN: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// The spans this thread is in, innermost last.
    static ENTERED: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Subscriber for Bridge {
    fn register_callsite(&self, _: &'static Metadata<'static>) -> tracing::subscriber::Interest {
        // The level can change at run time, so ask `enabled` every time.
        tracing::subscriber::Interest::sometimes()
    }

    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        let level = LEVEL.load(Ordering::Relaxed);
        level != 0 && LogLevel::of(metadata.level()).rank() <= level
    }

    fn new_span(&self, attributes: &Attributes<'_>) -> Id {
        let mut text = Text::default();
        attributes.record(&mut text);
        let id = NEXT_SPAN.fetch_add(1, Ordering::Relaxed);
        lock(&SPANS).push((id, text.fields, 1));
        Id::from_u64(id)
    }

    fn clone_span(&self, id: &Id) -> Id {
        if let Some(s) = lock(&SPANS).iter_mut().find(|s| s.0 == id.into_u64()) {
            s.2 += 1;
        }
        id.clone()
    }

    fn try_close(&self, id: Id) -> bool {
        let mut spans = lock(&SPANS);
        let Some(i) = spans.iter().position(|s| s.0 == id.into_u64()) else {
            return false;
        };
        spans[i].2 -= 1;
        let closed = spans[i].2 == 0;
        if closed {
            spans.swap_remove(i);
        }
        closed
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let tx = match lock(&DELIVERY).as_ref() {
            Some(d) => d.tx.clone(),
            None => return,
        };
        let metadata = event.metadata();
        let mut text = Text::default();
        event.record(&mut text);
        ENTERED.with(|entered| {
            let entered = entered.borrow();
            if !entered.is_empty() {
                let spans = lock(&SPANS);
                for id in entered.iter().rev() {
                    if let Some(s) = spans.iter().find(|s| s.0 == *id) {
                        text.fields.push_str(&s.1);
                    }
                }
            }
        });
        let record = LogRecord {
            level: LogLevel::of(metadata.level()),
            target: metadata.target().to_string(),
            message: text.finish(),
            unix_ms: cc_app_server::time::now_unix_millis(),
        };
        match tx.try_send(record) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                DROPPED.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn enter(&self, id: &Id) {
        ENTERED.with(|e| e.borrow_mut().push(id.into_u64()));
    }

    fn exit(&self, id: &Id) {
        ENTERED.with(|e| {
            let mut e = e.borrow_mut();
            if let Some(i) = e.iter().rposition(|x| *x == id.into_u64()) {
                e.remove(i);
            }
        });
    }
}

/// Collects an event's message and fields as text.
#[derive(Default)]
struct Text {
    message: String,
    fields: String,
}

impl Text {
    /// The message, then the fields (the span's `trace_id=…` among them): a long message is cut
    /// first, so the fields that join a record to its rollout always survive the length cap.
    fn finish(self) -> String {
        if self.fields.is_empty() {
            return cap(self.message, MAX_MESSAGE_BYTES);
        }
        let fields = cap(self.fields, MAX_MESSAGE_BYTES / 2);
        let mut text = cap(self.message, MAX_MESSAGE_BYTES - fields.len());
        text.push_str(&fields);
        text
    }
}

impl Visit for Text {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.fields, " {}={value}", field.name());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }
}

fn cap(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_message_is_cut_before_the_span_fields() {
        let fields = " trace_id=4bf92f3577b34da6a3ce929d0e0e4736 thread_id=t turn_id=u".to_string();
        let text = Text {
            message: "é".repeat(MAX_MESSAGE_BYTES),
            fields: fields.clone(),
        }
        .finish();
        assert!(text.len() <= MAX_MESSAGE_BYTES, "{}", text.len());
        assert!(text.ends_with(&fields) && text.starts_with('é'));
        let short = Text {
            message: "m".into(),
            fields: fields.clone(),
        };
        assert_eq!(short.finish(), format!("m{fields}"));
        let alone = Text {
            message: "x".repeat(MAX_MESSAGE_BYTES + 1),
            fields: String::new(),
        };
        assert_eq!(alone.finish().len(), MAX_MESSAGE_BYTES);
    }
}
