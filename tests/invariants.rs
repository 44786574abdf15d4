//! The invariant walkers run in a real server process: in a debug build
//! (the one `cargo test` builds) every loop turn ends with them
//! (`Node::check_after_turn`). A server told to corrupt its own lock table
//! (`RINGLOCK_TEST_BREAK_INVARIANT`, honoured by debug builds only) must
//! stop with the invariant's message as soon as a connection opens.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[macro_use]
mod common;

fn main() -> std::process::ExitCode {
    let tests = on_both! {
        a_broken_invariant_stops_the_server_with_its_message:
            broken_invariant_stops_uring, broken_invariant_stops_epoll;
    };
    let tests = tests
        .into_iter()
        .map(|t| t.requires("a debug build", debug_build))
        .collect();
    common::harness::run(file!(), [tests])
}

/// The hook exists in debug builds only (release builds ignore the
/// variable): a release build reports these tests ignored, with why.
fn debug_build() -> Result<(), String> {
    if cfg!(debug_assertions) {
        Ok(())
    } else {
        Err("a debug build (cargo test without --release): the \
             RINGLOCK_TEST_BREAK_INVARIANT hook exists in debug builds only"
            .into())
    }
}

/// Starts `ringlock serve` with the hook set, connects, and returns how it
/// ended and everything it wrote to stderr.
fn serve_broken(io: &str) -> (std::process::ExitStatus, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ringlock"))
        .args(["serve", "--listen", "127.0.0.1:0", "--io", io])
        .env("RINGLOCK_TEST_BREAK_INVARIANT", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ringlock serve");
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr piped"));
    let mut seen = String::new();
    let addr: SocketAddr = loop {
        let mut line = String::new();
        if stderr.read_line(&mut line).expect("read stderr") == 0 {
            let _ = child.kill();
            panic!("the server ended before listening:\n{seen}");
        }
        seen.push_str(&line);
        if let Some(rest) = line.split("listening on ").nth(1) {
            break rest
                .split_whitespace()
                .next()
                .and_then(|a| a.parse().ok())
                .unwrap_or_else(|| panic!("bad listening line: {line}"));
        }
    };
    // Still serving before any connection: the table is intact so far.
    assert!(
        child.try_wait().expect("try_wait").is_none(),
        "stopped before a connection:\n{seen}"
    );
    let mut conn = TcpStream::connect(addr).expect("connect");
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    // Written before or after the server stops: either is fine.
    let _ = conn.write_all(b"S\n");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the server did not stop within 20 s of a connection:\n{seen}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut rest = String::new();
    let _ = stderr.read_to_string(&mut rest);
    seen.push_str(&rest);
    (status, seen)
}

fn a_broken_invariant_stops_the_server_with_its_message(io: &str) {
    let (status, stderr) = serve_broken(io);
    assert!(!status.success(), "exited successfully:\n{stderr}");
    // A panic's exit status.
    assert_eq!(status.code(), Some(101), "{status}:\n{stderr}");
    assert!(
        stderr.contains("idle lock") && stderr.contains("kept"),
        "not the table walker's message:\n{stderr}"
    );
}
