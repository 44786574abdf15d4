//! The metrics listener under a slowloris: connections that open and send
//! nothing (or a byte now and then) must not keep `/health` and `/ready`
//! from answering, which an orchestrator's probes would take for a dead
//! node.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::{Server, StderrLog};

fn metrics_addr(log: &StderrLog) -> SocketAddr {
    log.metrics_addr()
}

/// `GET path`: the status line of the answer, within 2 s.
fn status_line(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\n\r\n").as_bytes())
        .unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    String::from_utf8_lossy(&raw)
        .lines()
        .next()
        .unwrap_or("")
        .to_string()
}

fn threads(server: &Server) -> usize {
    std::fs::read_dir(format!("/proc/{}/task", server.pid().unwrap()))
        .unwrap()
        .count()
}

#[test]
fn a_slowloris_does_not_keep_health_from_answering() {
    let (server, log) = Server::start_logged(&[
        "--listen",
        "127.0.0.1:0",
        "--io",
        "epoll",
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    let m = metrics_addr(&log);
    assert_eq!(status_line(m, "/health"), "HTTP/1.1 200 OK");
    let before = threads(&server);
    // 200 connections that each send the start of a head and nothing more,
    // as fast as they open: far more than the listener serves at once.
    let mut slow: Vec<TcpStream> = (0..200)
        .map(|_| {
            let mut s = TcpStream::connect(m).unwrap();
            s.write_all(b"GET /he").unwrap();
            s
        })
        .collect();
    let started = Instant::now();
    for path in ["/health", "/ready", "/metrics"] {
        assert_eq!(status_line(m, path), "HTTP/1.1 200 OK", "{path}");
    }
    assert!(started.elapsed() < Duration::from_secs(2));
    // The listener's threads stay bounded: 16 reading heads, those
    // answering, and those that gave way and are ending, at most
    // MAX_THREADS in all (how many are still ending when we count depends
    // on how the machine schedules them, not on the listener).
    let during = threads(&server);
    assert!(
        during <= before + ringlock::metrics::MAX_THREADS,
        "{before} threads before, {during} during (200 connections)"
    );
    // The lock server never noticed.
    let mut c = server.connect();
    assert!(c.call("S").starts_with("S active"));
    for s in &mut slow {
        let _ = s.write_all(b"a");
    }
    drop(slow);
}
