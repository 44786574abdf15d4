//! Support for the test suites (the workspace's own tests, and the load
//! generator's): not part of the server.

use std::sync::OnceLock;

/// Whether io_uring can run here, or why not (an old kernel,
/// `kernel.io_uring_disabled`, or a seccomp profile such as Docker's
/// default, which refuses `io_uring_setup`): the prerequisite of the tests'
/// io_uring variants, which their harness (tests/common/harness.rs) reports
/// as ignored with this reason, e.g. `io_uring is unavailable:
/// io_uring_setup is not permitted (...)`. Probes once per process
/// ([`crate::io::uring::probe`]) and prints nothing.
pub fn uring() -> Result<(), String> {
    static PROBED: OnceLock<Result<(), String>> = OnceLock::new();
    PROBED
        .get_or_init(|| {
            crate::io::uring::probe().map_err(|why| format!("io_uring is unavailable: {why}"))
        })
        .clone()
}
