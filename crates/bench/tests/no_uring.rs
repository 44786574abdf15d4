//! `no-uring` (src/bin/no-uring.rs) refuses io_uring to what it runs, as
//! Docker's default seccomp profile does, and under it: `ringlock serve
//! --io uring` fails with a clear reason, `--io auto` falls back to epoll,
//! and a test's io_uring variant skips with a visible line.

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
fn filter_works() -> bool {
    let out = Command::new(NO_URING)
        .arg("true")
        .output()
        .expect("run no-uring");
    if !out.status.success() {
        let why = String::from_utf8_lossy(&out.stderr);
        let line = format!("skipping the no-uring tests: {}\n", why.trim());
        let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
        return false;
    }
    true
}

#[test]
fn forced_uring_fails_with_the_reason() {
    if !filter_works() {
        return;
    }
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

#[test]
fn auto_falls_back_to_epoll() {
    if !filter_works() {
        return;
    }
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

/// Run by [`a_uring_variant_skips_visibly`] in a child under no-uring;
/// passes at once otherwise.
#[test]
fn uring_variant_child() {
    if std::env::var_os("RINGLOCK_NO_URING_CHILD").is_none() {
        return;
    }
    assert!(
        ringlock::testing::skip_uring(),
        "io_uring works under no-uring"
    );
    assert!(
        ringlock::testing::skip_uring(),
        "asked twice: still skipped"
    );
}

#[test]
fn a_uring_variant_skips_visibly() {
    if !filter_works() {
        return;
    }
    let me = std::env::current_exe().unwrap();
    // The child's harness captures its tests' output, as `cargo test` does.
    let out = Command::new(NO_URING)
        .arg(me)
        .args(["--exact", "uring_variant_child", "--test-threads", "1"])
        .env("RINGLOCK_NO_URING_CHILD", "1")
        .output()
        .expect("run this test binary under no-uring");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("1 passed"), "{stdout}");
    let skips: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("skipping the io_uring variants: "))
        .collect();
    assert_eq!(skips.len(), 1, "one visible line, once:\n{stderr}");
    assert!(
        skips[0].contains("io_uring_setup is not permitted"),
        "{}",
        skips[0]
    );
}
