//! Partitions of a real three-node cluster, in network namespaces: the
//! harness of `scripts/chaos.sh` (`examples/chaos/harness/`) on a short
//! fixed schedule, under both backends:
//!
//! - the active (node 0) isolated from its peers for 2 s (its clients still
//!   reach it: a split brain), then healed at once;
//! - silent loss both ways between node 0 and node 1 for 2 s, healed in two
//!   steps: 1 -> 0 first, 0 -> 1 two seconds later.
//!
//! Asserts, after each heal, exactly one active that every node names
//! within one peer timeout plus one heartbeat plus 1 s, and no two clients
//! holding one key at once outside the fault windows (each fault's span
//! plus the longest lease and 0.5 s). The full report is printed (shown on
//! failure, or with `--nocapture`), and the node logs are kept in the temp
//! directory it names when the test fails.
//!
//! Needs root, `ip` and `tc`; elsewhere the harness reports the tests as
//! ignored, with the reason. The lab's namespaces and processes are
//! removed when the run ends, also when it panics (the harness's `Lab` is
//! a drop guard).

#[macro_use]
mod common;
#[path = "../examples/chaos/harness/mod.rs"]
mod harness;

use std::path::PathBuf;

use harness::{Config, Fault, Kind};

fn partition(io: &str) {
    let pid = std::process::id();
    let out = std::env::temp_dir().join(format!("ringlock-partition-{io}-{pid}"));
    let _ = std::fs::remove_dir_all(&out);
    let prefix = format!("rlpt{}{pid}", &io[..1]);
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_ringlock"));
    let mut cfg = Config::new(bin, io, out.clone(), &prefix);
    cfg.verbose = false;
    cfg.seed = 1;
    cfg.faults = vec![
        Fault {
            id: 0,
            kind: Kind::Isolate { node: 0 },
            start_ms: 2000,
            len_ms: 2000,
            stagger_ms: 0,
            out_first: false,
        },
        Fault {
            id: 1,
            kind: Kind::LossPair { a: 0, b: 1 },
            start_ms: 9000,
            len_ms: 2000,
            stagger_ms: 2000,
            out_first: false,
        },
    ];
    cfg.total_ms = 18_000;
    let record = harness::run(&cfg).unwrap_or_else(|e| panic!("partition ({io}): {e}"));
    let report = harness::check::analyse(&cfg, &record);
    eprintln!("partition ({io}):\n{}", report.text);
    let _ = harness::check::write_raw(&out, &record);
    let kept = format!("node logs and records in {}", out.display());

    assert!(record.crashes.is_empty(), "{:?}; {kept}", record.crashes);
    assert_eq!(
        report.overlaps_outside, 0,
        "overlapping holders outside fault windows; {kept}"
    );
    let bound = cfg.one_active_bound_ms() as f64;
    assert_eq!(report.faults.len(), 2);
    for f in &report.faults {
        assert!(f.measured, "fault {} was not measured; {kept}", f.label);
        let took = f
            .one_active_ms
            .unwrap_or_else(|| panic!("{}: never back to one active; {kept}", f.label));
        assert!(
            took <= bound,
            "{}: one active {took:.0} ms after the heal, bound {bound:.0} ms; {kept}",
            f.label
        );
    }
    let _ = std::fs::remove_dir_all(&out);
}

/// The tests' prerequisite: network namespaces can be made here.
fn namespaces() -> Result<(), String> {
    harness::net::available().map_err(|why| {
        format!("cannot make network namespaces here ({why}): needs root, ip and tc")
    })
}

fn main() -> std::process::ExitCode {
    let tests = on_both! {
        partition: partition_uring, partition_epoll;
    };
    let tests = tests
        .into_iter()
        .map(|t| t.requires("namespaces", namespaces));
    common::harness::run(file!(), [tests.collect()])
}
