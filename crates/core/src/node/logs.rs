//! The node's log: rate-limited lines for what strangers can cause, and
//! the periodic summary of refusals and protocol errors.

use super::{LOG_TARGET, Node};
use crate::engine::{ConnId, Now};

/// At most [`LogLimiter::BURST`] lines per [`LogLimiter::WINDOW_MS`]; the
/// rest are counted and the count is logged when the window ends, so that a
/// flood of bad links cannot fill the log.
#[derive(Debug, Default)]
pub(super) struct LogLimiter {
    window_start_ms: u64,
    logged: u32,
    pub(super) suppressed: u64,
}

impl LogLimiter {
    const BURST: u32 = 5;
    const WINDOW_MS: u64 = 10_000;

    pub(super) fn log(&mut self, now: Now, what: &str, line: impl FnOnce() -> String) {
        self.roll(now, what);
        if self.logged < Self::BURST {
            self.logged += 1;
            tracing::warn!(target: LOG_TARGET, "{}", line());
        } else {
            self.suppressed += 1;
        }
    }

    /// Ends the window if it is over, logging how many lines it held back.
    pub(super) fn roll(&mut self, now: Now, what: &str) {
        if now.ms >= self.window_start_ms + Self::WINDOW_MS {
            if self.suppressed > 0 {
                tracing::warn!(
                    target: LOG_TARGET, "{} more {what} in the last {} s not shown",
                    self.suppressed,
                    Self::WINDOW_MS / 1000
                );
            }
            self.window_start_ms = now.ms;
            self.logged = 0;
            self.suppressed = 0;
        }
    }
}

/// How often, at most, refused connections and protocol errors are summed
/// up in the log.
pub(crate) const SUMMARY_EVERY_MS: u64 = 10_000;

#[derive(Debug, Default)]
pub(super) struct Summary {
    /// When the current window started.
    pub(super) since_ms: u64,
    /// The counts logged so far.
    pub(super) refused: u64,
    pub(super) refused_requests: u64,
    pub(super) errors: u64,
    /// The last turn's time: what the summary owed at exit is dated by.
    pub(super) last_ms: u64,
}

impl Node {
    /// Logs how many connections were refused and how many broke the
    /// protocol since the last summary, once per [`SUMMARY_EVERY_MS`] at
    /// most, and only if there were any.
    #[cold]
    pub(super) fn summarize(&mut self, now: Now) {
        let s = &mut self.summary;
        let refused = self.stats.conns_refused.saturating_sub(s.refused);
        let refused_requests = self
            .stats
            .requests_refused
            .saturating_sub(s.refused_requests);
        let errors = self.stats.protocol_errors.saturating_sub(s.errors);
        let secs = now.ms.saturating_sub(s.since_ms).div_ceil(1000);
        if let Some(line) = summary_line(secs, refused, refused_requests, errors) {
            tracing::warn!(target: LOG_TARGET, "{line}");
        }
        s.since_ms = now.ms;
        s.refused = self.stats.conns_refused;
        s.refused_requests = self.stats.requests_refused;
        s.errors = self.stats.protocol_errors;
    }

    /// The loop failed to accept a connection (out of descriptors or
    /// memory): logged, rate-limited, since every client that connects
    /// meanwhile fails the same way.
    #[cold]
    pub fn accept_failed(&mut self, now: Now, error: &std::io::Error) {
        self.accept_log.log(now, "failed accepts", || {
            format!("accept: {error} (connections wait in the listen backlog; see ulimit -n and --max-conns)")
        });
    }

    /// What is owed to the summary (counts since the last one), at exit:
    /// errors just before a shutdown are summed up too.
    pub(super) fn summary_owed(&self) -> bool {
        self.stats.conns_refused != self.summary.refused
            || self.stats.requests_refused != self.summary.refused_requests
            || self.stats.protocol_errors != self.summary.errors
    }

    /// A socket accepted or dialed could not be set up (an option, its
    /// registration with the kernel, TLS): the loop dropped it. Counted,
    /// and logged rate-limited, since a client may cause it at the rate it
    /// connects.
    #[cold]
    pub fn setup_failed(&mut self, now: Now, what: &str, error: &dyn std::fmt::Display) {
        self.stats.conns_failed += 1;
        self.accept_log.log(now, "failed accepts", || {
            format!("a new connection was dropped: {what}: {error}")
        });
    }

    /// A line that broke the protocol: counted (and summed up in the log).
    pub(crate) fn protocol_error(&mut self) {
        self.stats.protocol_errors += 1;
    }

    /// Logs why a TLS connection failed, with its remote address
    /// (rate-limited, so a flood of bad handshakes cannot fill the log).
    pub(crate) fn tls_log(&mut self, now: Now, conn: ConnId, why: impl FnOnce() -> String) {
        let remote = self.remote(conn);
        self.tls_log.log(now, "TLS failures", || {
            format!("TLS connection with {remote} closed: {}", why())
        });
    }
}

/// The loop drops the node when it stops: what was refused or broke since
/// the last summary (say in the shutdown's last seconds) is logged then,
/// not lost.
impl Drop for Node {
    fn drop(&mut self) {
        if self.summary_owed() {
            let now = Now {
                ms: self.summary.last_ms.max(self.summary.since_ms),
                us: self.summary.last_ms.max(self.summary.since_ms) * 1000,
                unix_ns: 0,
            };
            self.summarize(now);
        }
    }
}

/// The summary's line: each count that is not zero, once, in words
/// ("1 connection refused (--max-conns), 2 requests refused"); `None` when
/// every count is zero.
fn summary_line(secs: u64, refused: u64, refused_requests: u64, errors: u64) -> Option<String> {
    let plural = |n: u64, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    let parts: Vec<String> = [
        (refused > 0)
            .then(|| plural(refused, "connection", "connections") + " refused (--max-conns)"),
        (refused_requests > 0)
            .then(|| plural(refused_requests, "request", "requests") + " refused"),
        (errors > 0).then(|| {
            plural(errors, "connection", "connections") + " broke the protocol (answered E, closed)"
        }),
    ]
    .into_iter()
    .flatten()
    .collect();
    (!parts.is_empty()).then(|| {
        let s = if secs == 1 { "" } else { "s" };
        format!("in the last {secs} second{s}: {}", parts.join(", "))
    })
}

#[cfg(test)]
mod tests {
    use super::summary_line;

    #[test]
    fn the_summary_says_each_count_once_in_words() {
        assert_eq!(summary_line(10, 0, 0, 0), None);
        assert_eq!(
            summary_line(10, 0, 0, 1).as_deref(),
            Some("in the last 10 seconds: 1 connection broke the protocol (answered E, closed)")
        );
        assert_eq!(
            summary_line(1, 2, 1, 3).as_deref(),
            Some(
                "in the last 1 second: 2 connections refused (--max-conns), 1 request refused, \
                 3 connections broke the protocol (answered E, closed)"
            )
        );
    }
}
