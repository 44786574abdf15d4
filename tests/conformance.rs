//! The conformance suite of the official clients (clients/conformance):
//! every scenario against every registered client adapter, one table,
//! scenario x client. The runner is Python (standard library only); it
//! builds the adapters itself (the Rust one with `cargo build -p
//! ringlock-client --features tls --example conformance_adapter`), skips a
//! client whose toolchain is missing with one line naming it, and fails if
//! any cell fails. clients/conformance/README.md says how it works.

use std::path::PathBuf;
use std::process::Command;

/// The runner's own language: a Python 3.9+ on PATH, or why there is none.
/// (Each client's own prerequisite is in clients/conformance/adapters.json,
/// checked by the runner: a missing toolchain skips that column.)
fn prerequisite() -> Result<(), String> {
    let probe = "import sys; sys.exit(0 if sys.version_info >= (3, 9) else 1)";
    match Command::new("python3").args(["-c", probe]).status() {
        Ok(s) if s.success() => Ok(()),
        Ok(_) => Err("python3 is older than 3.9".to_string()),
        Err(e) => Err(format!("no python3 on PATH ({e})")),
    }
}

#[test]
fn every_client_passes_every_scenario() {
    if let Err(why) = prerequisite() {
        eprintln!("skipping the client conformance suite: {why}");
        return;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    // The runner prints what did not pass and the table on this test's
    // stdout and stderr (inherited: visible whether or not output is
    // captured).
    let status = Command::new("python3")
        .arg(root.join("clients/conformance/run.py"))
        .arg("--quiet")
        .current_dir(&root)
        .status()
        .expect("run clients/conformance/run.py");
    assert!(
        status.success(),
        "a client failed a conformance scenario ({status}): see the table above"
    );
}
