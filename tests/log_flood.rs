//! Log flooding at the default level from outside the cluster: a stranger
//! that holds a peer's address (the peer is down and something else
//! listens there) must not make the node log a line per dial.

#[macro_use]
mod common;

use std::io::Read;
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{free_addrs, loopback_ip, secret_file};

fn a_stranger_at_a_peer_address_does_not_flood_the_log(io: &str) {
    let ip = loopback_ip();
    let me = free_addrs(ip, 1)[0];
    // The stranger: takes each connection, reads what comes (the node's
    // HELLO) and closes it.
    let stranger = TcpListener::bind((ip, 0)).unwrap();
    let stranger_addr = stranger.local_addr().unwrap();
    stranger.set_nonblocking(true).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let taken = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let thread = {
        let (stop, taken) = (stop.clone(), taken.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match stranger.accept() {
                    Ok((mut s, _)) => {
                        taken.fetch_add(1, Ordering::Relaxed);
                        s.set_read_timeout(Some(Duration::from_millis(200)))
                            .unwrap();
                        let mut buf = [0u8; 512];
                        let _ = s.read(&mut buf);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        })
    };
    let log = std::env::temp_dir().join(format!(
        "ringlock-log-flood-{io}-{}.log",
        std::process::id()
    ));
    let file = std::fs::File::create(&log).unwrap();
    let peers = format!("{me},{stranger_addr}");
    let mut child = Command::new(env!("CARGO_BIN_EXE_ringlock"))
        .args(["serve", "--listen", &me.to_string(), "--io", io])
        .args(["--peers", &peers, "--cluster-secret-file", secret_file()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(file)
        .spawn()
        .expect("spawn ringlock serve");
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    let _ = child.kill();
    let _ = child.wait();
    stop.store(true, Ordering::Relaxed);
    thread.join().unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    let _ = std::fs::remove_file(&log);
    let shown = stranger_addr.to_string();
    let lines: Vec<&str> = text.lines().filter(|l| l.contains(&shown)).collect();
    let dials = taken.load(Ordering::Relaxed);
    eprintln!(
        "{io}: {dials} dials to the stranger in {:?}, {} log lines name it",
        started.elapsed(),
        lines.len()
    );
    // The node dials every 100 ms: the test means something only if it did.
    assert!(dials >= 10, "only {dials} dials:\n{text}");
    // The rate-limited peer link errors (5 per 10 s), and no line per dial.
    assert!(
        lines.len() <= 6,
        "{} lines:\n{}",
        lines.len(),
        lines.join("\n")
    );
}

fn main() -> std::process::ExitCode {
    common::harness::run(file!(), [both()])
}

fn both() -> Vec<common::harness::Test> {
    on_both! {
        a_stranger_at_a_peer_address_does_not_flood_the_log:
            a_stranger_at_a_peer_address_does_not_flood_the_log_uring, a_stranger_at_a_peer_address_does_not_flood_the_log_epoll;
    }
}
