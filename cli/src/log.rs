//! Diagnostics on stderr, never stdout (stdout carries only the protocol in `serve`), through
//! `tracing-subscriber`: the core logs through the `tracing` facade, so the engine's own
//! diagnostics and the CLI's land in the same stream. The level comes from `--log-level`, else
//! `CC_APP_SERVER_LOG`, else `warn`.

use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::time::Uptime;

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

    fn filter(self) -> LevelFilter {
        match self {
            Level::Off => LevelFilter::OFF,
            Level::Error => LevelFilter::ERROR,
            Level::Warn => LevelFilter::WARN,
            Level::Info => LevelFilter::INFO,
            Level::Debug => LevelFilter::DEBUG,
            Level::Trace => LevelFilter::TRACE,
        }
    }
}

/// The environment variable that sets the level when `--log-level` is absent.
pub const ENV: &str = "CC_APP_SERVER_LOG";

/// The level in force: the flag wins, then the environment, then `warn`. An unreadable
/// environment value is reported (once, on stderr) rather than silently ignored.
fn level(flag: Option<Level>, from_env: Option<&str>) -> (Level, Option<String>) {
    match (flag, from_env) {
        (Some(level), _) => (level, None),
        (None, Some(text)) => match Level::parse(text) {
            Some(level) => (level, None),
            None => (
                Level::Warn,
                Some(format!(
                    "ignoring {ENV}={text:?}; use off, error, warn, info, debug or trace"
                )),
            ),
        },
        (None, None) => (Level::Warn, None),
    }
}

/// Installs the stderr subscriber. Each line reads `   0.012s  INFO cc_app_server::stdio: …`
/// (time since start, level, where, message).
pub fn init(flag: Option<Level>) {
    let from_env = std::env::var(ENV).ok();
    let (level, complaint) = level(flag, from_env.as_deref());
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(level.filter())
        .with_ansi(false)
        .with_timer(Uptime::default())
        .try_init();
    if let Some(c) = complaint {
        eprintln!("cc-app-server: {c}");
    }
}

macro_rules! error {
    ($($arg:tt)+) => { tracing::error!($($arg)+) };
}

macro_rules! warn {
    ($($arg:tt)+) => { tracing::warn!($($arg)+) };
}

macro_rules! info {
    ($($arg:tt)+) => { tracing::info!($($arg)+) };
}

macro_rules! debug {
    ($($arg:tt)+) => { tracing::debug!($($arg)+) };
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

    #[test]
    fn the_flag_wins_then_the_environment_then_warn() {
        assert_eq!(level(Some(Level::Debug), Some("error")).0, Level::Debug);
        assert_eq!(level(None, Some("error")).0, Level::Error);
        assert_eq!(level(None, None).0, Level::Warn);
        let (l, complaint) = level(None, Some("loud"));
        assert_eq!(l, Level::Warn);
        assert!(complaint.unwrap().contains("CC_APP_SERVER_LOG"));
    }
}
