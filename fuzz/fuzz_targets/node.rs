//! Fuzzes one cluster `Node` driven as the I/O loops drive it: connections,
//! client bytes and requests through `io::Session`, peer lines (a valid
//! handshake with the cluster's secret, then heartbeats and replication),
//! ticks and clock jumps, dials and their handshakes, output taken, links
//! given up. The steps and checks are in `harness/node.rs`, shared with the
//! stable twin in tests/fuzz_node.rs.
//!
//! Run from the repository root with a nightly toolchain:
//! `cargo +nightly fuzz run node -- -max_len=4096 -len_control=0 -close_fd_mask=2`
//! (`-close_fd_mask=2` silences the node's rate-limited log lines; leave it
//! out to see a crash's panic message when replaying it). The known
//! findings (fuzz/README.md) are tolerated unless `RINGLOCK_FUZZ_STRICT` is
//! set.

#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

#[path = "harness/peer_line.rs"]
#[allow(dead_code)]
mod peer_line;

#[path = "harness/node.rs"]
#[allow(dead_code)]
mod node;

fn lenience() -> node::Lenience {
    static STRICT: OnceLock<bool> = OnceLock::new();
    if *STRICT.get_or_init(|| std::env::var_os("RINGLOCK_FUZZ_STRICT").is_some()) {
        node::STRICT
    } else {
        node::KNOWN
    }
}

fuzz_target!(|data: &[u8]| {
    node::run_with(data, lenience());
});
