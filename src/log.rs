//! The server's log: `tracing` events written to stderr by
//! `tracing-subscriber`, one line each, with an RFC 3339 UTC timestamp and a
//! level, as text or as JSON lines (`--log-format`), filtered by `RUST_LOG`
//! (default `info`).
//!
//! What is logged at `info` and above is what an operator acts on: start
//! and stop, role changes with their reason, peer links coming up and going
//! down with the reason, hand-offs and step-downs, configuration problems,
//! and a rate-limited summary of refused connections and protocol errors.
//! Nothing is logged per request at the default level; the events are
//! rare and never on the request path, so the loop pays one relaxed load
//! per disabled call site at most.

use std::io::Write as _;

use tracing_subscriber::EnvFilter;

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// `2026-12-01T01:33:32.123456Z  INFO ringlock::server: listening on ...`
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `fields`
    /// (with `message` and the event's fields).
    Json,
}

/// The filter: `RUST_LOG` if set (its syntax: `info`,
/// `ringlock::cluster=debug,warn`, ...), `info` otherwise. A `RUST_LOG`
/// that does not parse is reported and `info` used.
fn filter() -> EnvFilter {
    match std::env::var("RUST_LOG") {
        Ok(spec) if !spec.trim().is_empty() => match EnvFilter::try_new(&spec) {
            Ok(filter) => filter,
            Err(e) => {
                // (Not eprintln!: it panics if stderr cannot be written.)
                let _ = writeln!(
                    std::io::stderr(),
                    "ringlock: RUST_LOG={spec:?} does not parse ({e}); logging at info"
                );
                EnvFilter::new("info")
            }
        },
        _ => EnvFilter::new("info"),
    }
}

/// Installs the process's log subscriber (once; later calls do nothing).
pub fn init(format: LogFormat) {
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter())
        .with_ansi(false)
        .with_target(true)
        // A line that cannot be written (stderr on a full disk, or a pipe
        // whose reader died) is lost; by default tracing-subscriber reports
        // that with eprintln! on the same stderr, which panics and ends the
        // node.
        .log_internal_errors(false);
    // Errors only if a subscriber is already set (tests calling twice).
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(false).try_init(),
    };
}
