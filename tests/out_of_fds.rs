//! A node whose open-file limit is below `--max-conns` (the defaults on
//! many systems: 1024 against 10000): clients that open more connections
//! than it has descriptors must not make it spin or flood its log.

#[macro_use]
mod common;

use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::Conn;

/// `ringlock serve` under `ulimit -n 64`, its log in a file.
struct Limited {
    child: Child,
    log: std::path::PathBuf,
    addr: SocketAddr,
}

impl Limited {
    fn start(io: &str) -> Limited {
        let log = std::env::temp_dir().join(format!(
            "ringlock-out-of-fds-{io}-{}.log",
            std::process::id()
        ));
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new("sh")
            .args(["-c", "ulimit -n 64 && exec \"$0\" \"$@\""])
            .arg(env!("CARGO_BIN_EXE_ringlock"))
            .args(["serve", "--listen", "127.0.0.1:0", "--io", io])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("spawn sh");
        let started = Instant::now();
        let addr = loop {
            let text = std::fs::read_to_string(&log).unwrap();
            if let Some(rest) = text.split("listening on ").nth(1) {
                assert!(rest.contains(&format!("(io: {io}")), "{text}");
                break rest.split_whitespace().next().unwrap().parse().unwrap();
            }
            assert!(started.elapsed() < Duration::from_secs(10), "{text}");
            std::thread::sleep(Duration::from_millis(10));
        };
        Limited { child, log, addr }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap()
    }

    fn cpu_time(&self) -> Duration {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap();
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
        let hz = rustix::param::clock_ticks_per_second().max(1);
        Duration::from_millis(ticks * 1000 / hz)
    }
}

impl Drop for Limited {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

fn out_of_descriptors_neither_spins_nor_floods_the_log(io: &str) {
    let server = Limited::start(io);
    let mut probe = Conn::new(server.addr);
    assert!(probe.call("S").starts_with("S active"));
    // 64 descriptors, a few of them the node's own: 100 connections run it
    // out; those beyond wait in the listen backlog.
    let conns: Vec<TcpStream> = (0..100)
        .map(|_| TcpStream::connect(server.addr).expect("connect"))
        .collect();
    let cpu_before = server.cpu_time();
    std::thread::sleep(Duration::from_secs(2));
    let cpu = server.cpu_time().saturating_sub(cpu_before);
    // The node still serves the connections it has.
    assert!(probe.call("S").starts_with("S active"));
    let log = server.log();
    let accept_lines = log.lines().filter(|l| l.contains("accept")).count();
    eprintln!("{io}: {accept_lines} accept lines, {cpu:?} of CPU in 2 s");
    assert!(
        accept_lines <= 10,
        "{accept_lines} accept lines in the log; the first: {:?}",
        log.lines().find(|l| l.contains("accept"))
    );
    // Idle but for the full backlog: well under a core.
    assert!(cpu < Duration::from_millis(500), "{cpu:?} of CPU in 2 s");
    // Once descriptors are free again, the node takes connections again.
    drop(conns);
    let started = Instant::now();
    let mut fresh = Conn::new(server.addr);
    fresh.set_timeout(Duration::from_secs(5));
    assert!(fresh.call("S").starts_with("S active"));
    eprintln!(
        "{io}: a new connection answered after {:?}",
        started.elapsed()
    );
}

fn main() -> std::process::ExitCode {
    common::harness::run(file!(), [both()])
}

fn both() -> Vec<common::harness::Test> {
    on_both! {
        out_of_descriptors_neither_spins_nor_floods_the_log:
            out_of_descriptors_neither_spins_nor_floods_the_log_uring, out_of_descriptors_neither_spins_nor_floods_the_log_epoll;
    }
}
