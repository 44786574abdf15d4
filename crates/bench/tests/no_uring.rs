//! `no-uring` (src/bin/no-uring.rs) refuses io_uring to what it runs, as
//! Docker's default seccomp profile does, and under it: `ringlock serve
//! --io uring` fails with a clear reason, `--io auto` falls back to epoll,
//! and the harness reports a test's io_uring variant as ignored, with the
//! reason.

#[macro_use]
mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

const NO_URING: &str = env!("CARGO_BIN_EXE_no-uring");

fn server() -> PathBuf {
    common::server(NO_URING)
}

/// `no-uring` cannot install its filter where seccomp is unavailable
/// (a kernel without it): then there is nothing to show.
fn filter_works() -> Result<(), String> {
    let out = Command::new(NO_URING)
        .arg("true")
        .output()
        .map_err(|e| format!("cannot run no-uring: {e}"))?;
    match out.status.success() {
        true => Ok(()),
        false => Err(format!(
            "no-uring cannot refuse io_uring here: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    }
}

/// The test's io_uring needs: what the io_uring variants require.
fn uring() -> Result<(), String> {
    ringlock::testing::uring()
}

fn main() -> std::process::ExitCode {
    common::harness::run(
        file!(),
        [tests![
            forced_uring_fails_with_the_reason if filter_works,
            auto_falls_back_to_epoll if filter_works,
            uring_variant_child if uring,
            a_uring_variant_skips_visibly if filter_works,
        ]],
    )
}

fn forced_uring_fails_with_the_reason() {
    let out = Command::new(NO_URING)
        .arg(server())
        .args(["serve", "--listen", "127.0.0.1:0", "--io", "uring"])
        .stdin(Stdio::null())
        .output()
        .expect("run ringlock serve under no-uring");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "served without io_uring: {stderr}");
    assert!(
        stderr.contains("--io uring: io_uring is not available: io_uring_setup is not permitted"),
        "{stderr}"
    );
}

fn auto_falls_back_to_epoll() {
    let mut child = Command::new(NO_URING)
        .arg(server())
        .args(["serve", "--listen", "127.0.0.1:0", "--io", "auto"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run ringlock serve under no-uring");
    let mut lines = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    let listening = loop {
        let mut line = String::new();
        if lines.read_line(&mut line).unwrap() == 0 {
            break None;
        }
        seen.push_str(&line);
        if line.contains("listening on ") {
            break Some(line);
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    let line = listening.unwrap_or_else(|| panic!("never listened:\n{seen}"));
    assert!(
        line.contains("(io: epoll; io_uring unavailable: io_uring_setup is not permitted"),
        "{line}"
    );
}

/// Run by [`a_uring_variant_skips_visibly`] under no-uring, where the
/// harness must report it ignored; elsewhere it checks io_uring works in
/// the test's own process as its prerequisite said.
fn uring_variant_child() {
    ringlock::testing::uring().expect("the prerequisite said io_uring works");
}

fn a_uring_variant_skips_visibly() {
    let me = std::env::current_exe().unwrap();
    let out = Command::new(NO_URING)
        .arg(me)
        .args(["--exact", "uring_variant_child"])
        .output()
        .expect("run this test binary under no-uring");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    let line = stdout
        .lines()
        .find(|l| l.starts_with("test uring_variant_child "))
        .unwrap_or_else(|| panic!("no line for the test:\n{stdout}"));
    assert!(
        line.contains(" ... ignored (prerequisite missing: io_uring is unavailable: io_uring_setup is not permitted"),
        "{line}"
    );
    assert!(
        stdout.contains("test result: ok. 0 passed; 0 failed; 1 ignored;"),
        "{stdout}"
    );
}
