//! Fuzzes the peer-line parser (`cluster::wire::parse`) with arbitrary
//! bytes: no panic, bounded fields, and what parses re-encodes to a line
//! that parses to the same message. The checks are in
//! `harness/peer_line.rs`, shared with the stable twin in
//! tests/fuzz_node.rs.
//!
//! Run from the repository root with a nightly toolchain:
//! `cargo +nightly fuzz run peer_line -- -dict=fuzz/peer_line.dict`

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "harness/peer_line.rs"]
#[allow(dead_code)]
mod peer_line;

fuzz_target!(|data: &[u8]| {
    peer_line::check(data);
});
