//! Support for the test suites (the workspace's own tests, and the load
//! generator's): not part of the server.

use std::io::Write;
use std::sync::OnceLock;

/// Whether the io_uring variants of tests must be skipped here, because
/// io_uring cannot run (an old kernel, `kernel.io_uring_disabled`, or a
/// seccomp profile such as Docker's default, which refuses `io_uring_setup`).
///
/// The first call in a process probes ([`crate::io::uring::probe`]) and,
/// when io_uring is unavailable, prints one line saying so, e.g.
/// `skipping the io_uring variants: io_uring_setup is not permitted (...)`.
/// The line goes to the process's stderr directly, not through `eprintln!`,
/// which the test harness captures and hides for passing tests: a skip is
/// never silent.
pub fn skip_uring() -> bool {
    static PROBED: OnceLock<Option<String>> = OnceLock::new();
    PROBED
        .get_or_init(|| {
            let why = crate::io::uring::probe().err()?;
            let line = format!("skipping the io_uring variants: {why}\n");
            let _ = std::io::stderr().write_all(line.as_bytes());
            Some(why)
        })
        .is_some()
}
