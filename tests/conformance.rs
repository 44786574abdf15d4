//! The conformance suite of the official clients (clients/conformance):
//! every scenario against every registered client adapter, one table,
//! scenario x client. The runner is Python (standard library only); it
//! builds the adapters itself (the Rust one with `cargo build -p
//! ringlock-client --features tls --example conformance_adapter`) and fails
//! if any cell fails. clients/conformance/README.md says how it works.
//!
//! One test per client (`conformance_go`, ...), each running the runner for
//! that client alone, so that a client whose toolchain is missing is
//! reported by cargo test as ignored with the reason (the same check the
//! runner's adapters.json entry makes), never as passed.

#[macro_use]
mod common;

use std::path::PathBuf;
use std::process::Command;

/// The runner's own language: a Python 3.9+ on PATH, or why there is none.
fn python() -> Result<(), String> {
    let probe = "import sys; sys.exit(0 if sys.version_info >= (3, 9) else 1)";
    match Command::new("python3").args(["-c", probe]).status() {
        Ok(s) if s.success() => Ok(()),
        Ok(_) => Err("python3 is older than 3.9".to_string()),
        Err(e) => Err(format!("no python3 on PATH ({e})")),
    }
}

/// The Go adapter's toolchain (its script says what is missing).
fn go() -> Result<(), String> {
    let script = root().join("clients/go/conformance-adapter.sh");
    match Command::new(&script).arg("--check").output() {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(String::from_utf8_lossy(&out.stdout).trim().to_string()),
        Err(e) => Err(format!("cannot run {}: {e}", script.display())),
    }
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every scenario against the client `adapter` (its adapters.json name).
fn every_scenario(adapter: &str) {
    let out = Command::new("python3")
        .arg(root().join("clients/conformance/run.py"))
        .args(["--quiet", "-a", adapter])
        .current_dir(root())
        .output()
        .expect("run clients/conformance/run.py");
    let report = String::from_utf8_lossy(&out.stdout);
    print!("{report}");
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "{adapter} failed a conformance scenario ({}): see the table above",
        out.status
    );
    assert!(
        !report.contains("skipping the"),
        "the runner skipped {adapter}, whose prerequisite this test checked"
    );
    assert!(
        report.lines().any(|l| l.contains("| pass")),
        "no scenario passed for {adapter}: see the table above"
    );
}

fn conformance_rust() {
    every_scenario("rust");
}

fn conformance_python_sync() {
    every_scenario("python-sync");
}

fn conformance_python_async() {
    every_scenario("python-async");
}

fn conformance_go() {
    every_scenario("go");
}

fn conformance_node() {
    every_scenario("node");
}

/// A prerequisite of two checks: the runner's Python and the client's own.
fn python_and_go() -> Result<(), String> {
    python().and_then(|()| go())
}

fn python_and_node() -> Result<(), String> {
    python().and_then(|()| common::node_20())
}

fn main() -> std::process::ExitCode {
    common::harness::run(
        file!(),
        [tests![
            conformance_rust if python,
            conformance_python_sync if python,
            conformance_python_async if python,
            conformance_go if python_and_go,
            conformance_node if python_and_node,
        ]],
    )
}
