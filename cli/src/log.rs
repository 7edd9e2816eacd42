//! Diagnostics on stderr, never stdout (stdout carries only the protocol in `serve`). A tiny
//! leveled logger: the level comes from `--log-level`, else `CC_APP_SERVER_LOG`, else `warn`.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

/// How much to say, from quiet to chatty.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Level {
    Off = 0,
    Error = 1,
    Warn = 2,
    Info = 3,
    Debug = 4,
    Trace = 5,
}

impl Level {
    fn label(self) -> &'static str {
        match self {
            Level::Off => "OFF",
            Level::Error => "ERROR",
            Level::Warn => "WARN",
            Level::Info => "INFO",
            Level::Debug => "DEBUG",
            Level::Trace => "TRACE",
        }
    }

    fn parse(text: &str) -> Option<Level> {
        Some(match text.trim().to_ascii_lowercase().as_str() {
            "off" | "none" => Level::Off,
            "error" => Level::Error,
            "warn" | "warning" => Level::Warn,
            "info" => Level::Info,
            "debug" => Level::Debug,
            "trace" => Level::Trace,
            _ => return None,
        })
    }
}

/// The environment variable that sets the level when `--log-level` is absent.
pub const ENV: &str = "CC_APP_SERVER_LOG";

static LEVEL: AtomicU8 = AtomicU8::new(Level::Warn as u8);
static START: OnceLock<Instant> = OnceLock::new();

/// Sets the level: the flag wins, then the environment, then `warn`. An unreadable environment
/// value is reported (once) rather than silently ignored.
pub fn init(flag: Option<Level>) {
    START.get_or_init(Instant::now);
    let from_env = std::env::var(ENV).ok();
    let level = match (flag, from_env.as_deref()) {
        (Some(level), _) => level,
        (None, Some(text)) => Level::parse(text).unwrap_or_else(|| {
            eprintln!(
                "cc-app-server: ignoring {ENV}={text:?}; use off, error, warn, info, debug or trace"
            );
            Level::Warn
        }),
        (None, None) => Level::Warn,
    };
    LEVEL.store(level as u8, Ordering::Relaxed);
}

pub fn enabled(level: Level) -> bool {
    level != Level::Off && level as u8 <= LEVEL.load(Ordering::Relaxed)
}

/// Writes one diagnostic line; use the macros.
pub fn write(level: Level, args: std::fmt::Arguments<'_>) {
    let elapsed = START.get_or_init(Instant::now).elapsed();
    eprintln!(
        "[{:>9.3}s {:<5} cc-app-server] {args}",
        elapsed.as_secs_f64(),
        level.label()
    );
}

macro_rules! log_at {
    ($level:expr, $($arg:tt)+) => {
        if $crate::log::enabled($level) {
            $crate::log::write($level, format_args!($($arg)+));
        }
    };
}

macro_rules! error {
    ($($arg:tt)+) => { log_at!($crate::log::Level::Error, $($arg)+) };
}

macro_rules! warn {
    ($($arg:tt)+) => { log_at!($crate::log::Level::Warn, $($arg)+) };
}

macro_rules! info {
    ($($arg:tt)+) => { log_at!($crate::log::Level::Info, $($arg)+) };
}

macro_rules! debug {
    ($($arg:tt)+) => { log_at!($crate::log::Level::Debug, $($arg)+) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_and_order() {
        assert_eq!(Level::parse(" WARNING "), Some(Level::Warn));
        assert_eq!(Level::parse("trace"), Some(Level::Trace));
        assert_eq!(Level::parse("loud"), None);
        assert!(Level::Error < Level::Debug);
    }
}
